"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import responses
from browser_kit import CHROMIUM, FLAGS

# Developer knobs of the test suite itself, not beamflow configuration.
_TEST_KNOBS = {"BEAMFLOW_SCREENSHOT_DIR"}


@pytest.fixture(autouse=True, scope="session")
def isolated_environment(tmp_path_factory):
    """No test sees the developer's beamflow configuration: BEAMFLOW_* variables are
    dropped, HOME points at an empty directory (so ~/.config/beamflow and stored Globus
    tokens are not read) and the working directory is that directory (so a beamflow.toml
    in the checkout is not read either). Subprocesses inherit the same clean environment."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("BEAMFLOW_") and key not in _TEST_KNOBS:
                mp.delenv(key)
        mp.setenv("HOME", str(home))
        mp.delenv("XDG_CONFIG_HOME", raising=False)
        mp.chdir(home)
        yield home


@pytest.fixture
def mocked():
    """The `responses` library in control of every HTTP request (Globus tests): an
    unmatched request fails at once instead of reaching the network."""
    responses.start()
    try:
        yield responses
    finally:
        responses.stop()
        responses.reset()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium per test module (the real-browser tests)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()
