"""Shared pytest fixtures, the parallel workers' count and the suite's time budget."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import responses
from browser_kit import CHROMIUM, FLAGS
from suite_order import slow_modules_first

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


# -- parallel workers ----------------------------------------------------------------------------
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`pytest -n auto` (what `make test` runs): two workers per CPU, as most tests wait on
    processes, engines and servers rather than compute; at most 8 (each worker holds a few
    hundred MB and its own engines)."""
    return min(8, 2 * len(os.sched_getaffinity(0)))


# -- the order modules are handed out -----------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow modules first (suite_order.py says why)."""
    slow_modules_first(items)


# -- the time budget -----------------------------------------------------------------------------
# `make test` passes --suite-budget: the whole suite, in parallel, must end within that many
# seconds on a machine where it is the only work. A machine shared with other work (another
# developer's tests, a benchmark) slows it by an amount nobody controls, so there the time is
# reported but not judged: "other work" is the CPU time the machine spent (/proc/stat) beyond
# what this run's processes used (their resource usage, children included). Processes the
# run left to init (the engines' worker pools) count as other work: the estimate errs
# towards "not judged", never towards blaming the suite for another's load.
_BUDGET = pytest.StashKey[dict]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-budget", type=float, default=None, metavar="SECONDS",
        help="fail a passing run that took longer than SECONDS while no other work ran on "
             "the machine (the time and the other work are reported either way)")


def _cpu_seconds(*, children: bool = True) -> float:
    """CPU seconds of this process, and of its children that have ended if ``children``."""
    usages = [resource.getrusage(resource.RUSAGE_SELF)]
    if children:
        usages.append(resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usages)


def _machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs spent not idle since boot (None where there is no /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait
    ticks = [int(f) for f in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BUDGET] = {"start": time.monotonic(), "busy": _machine_busy_seconds(),
                                     "workers": []}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):  # a parallel worker: report to the controller
        config.workeroutput["cpu_s"] = _cpu_seconds()
        return
    budget = config.getoption("suite_budget")
    if budget is None:
        return
    state = config.stash[_BUDGET]
    wall = time.monotonic() - state["start"]
    # With parallel workers, the controller's only children are the workers (which may or
    # may not have ended by now): their own reports count them, with their children.
    workers = state["workers"]
    ours = _cpu_seconds(children=not workers) + sum(workers)
    busy_now = _machine_busy_seconds()
    cpus = len(os.sched_getaffinity(0))
    if busy_now is None or state["busy"] is None:
        other = None
        verdict = "not judged: no /proc/stat to tell other work"
    elif cpus < 2:
        other = None
        verdict = "not judged: the budget is for 2 CPUs or more"
    else:
        other = max(0.0, busy_now - state["busy"] - ours)
        # Other work worth a tenth of the machine or more: the time says little of the suite.
        if other / wall > 0.1 * (os.cpu_count() or 1):
            verdict = "not judged: the machine ran other work"
        elif wall > budget:
            verdict = "OVER BUDGET"
        else:
            verdict = "within budget"
    line = (f"suite time: {wall:.0f} s wall (budget {budget:.0f} s), {cpus} CPUs, "
            f"{len(state['workers']) or 1} process(es) ran tests using {ours:.0f} CPU s; "
            + ("" if other is None else f"other work on the machine: {other:.0f} CPU s; ")
            + verdict)
    state["line"] = line
    if verdict == "OVER BUDGET" and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - xdist's hook
    cpu = getattr(node, "workeroutput", {}).get("cpu_s")
    if cpu is not None:
        node.config.stash[_BUDGET]["workers"].append(cpu)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    line = config.stash.get(_BUDGET, {}).get("line")
    if line:
        terminalreporter.write_sep("-", line, red="OVER" in line, bold=True)

