"""What every real-browser test shares: Debian's Chromium, its headless flags, the marks that
skip cleanly without it (the module-wide ``browser`` fixture is in conftest.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]

BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` "
        "(`make test` runs `make browser`, which does when it can)",
    ),
]


def until(page, script: str, timeout: float = 10.0) -> None:  # noqa: ANN001 - Page
    """Wait until ``script`` is true in the page. (Playwright's wait_for_function evaluates a
    string, which this page's CSP rightly forbids; evaluate() runs outside the page's CSP.)"""
    deadline = time.monotonic() + timeout
    while not page.evaluate(script):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {script}")
        page.wait_for_timeout(100)


def shot(page, tmp_path: Path, name: str, full: bool = True) -> Path:  # noqa: ANN001 - Page
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=full)
    assert path.stat().st_size > 10_000
    extra = os.environ.get("BEAMFLOW_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(extra) / name)
    return path
