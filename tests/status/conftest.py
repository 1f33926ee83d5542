"""What the status page's tests share: an empty run store where the workspace keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from beamflow.runs.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state" / "runs.sqlite")
