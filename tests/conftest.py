"""Shared pytest fixtures."""

from __future__ import annotations

import pytest
import responses


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
