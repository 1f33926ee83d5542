"""The suite's own scheduling: the slow modules suite_order.py names exist and go first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from suite_order import SLOW_MODULES, slow_modules_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_module_named_exists():
    missing = [m for m in SLOW_MODULES if not (ROOT / m).is_file()]
    assert not missing, f"suite_order.SLOW_MODULES names modules that are gone: {missing}"
    assert len(set(SLOW_MODULES)) == len(SLOW_MODULES)


def test_slow_modules_go_first_and_every_module_keeps_its_order():
    names = ["tests/a/test_a.py::one", "tests/a/test_a.py::two",
             f"{SLOW_MODULES[1]}::x", "tests/b/test_b.py::one", f"{SLOW_MODULES[0]}::y",
             f"{SLOW_MODULES[1]}::z", "tests/a/test_a.py::three"]
    items = [SimpleNamespace(nodeid=n) for n in names]
    slow_modules_first(items)
    assert [i.nodeid for i in items] == [
        f"{SLOW_MODULES[0]}::y", f"{SLOW_MODULES[1]}::x", f"{SLOW_MODULES[1]}::z",
        "tests/a/test_a.py::one", "tests/a/test_a.py::two", "tests/b/test_b.py::one",
        "tests/a/test_a.py::three"]
