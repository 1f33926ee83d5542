"""`beamflow demo --exit`: the main job end to end on the embedded backend, its compute on
the Parsl worker pool of a GlobusComputeEngine, and no process of it left behind when the
demo ends, is stopped with SIGTERM or with Ctrl-C at its terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beamflow.config import load_config
from beamflow.local.engine import engine_processes
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store

DEMO = [sys.executable, "-m", "beamflow.cli", "demo", "--probe-size", "32", "--rate", "200"]


ROOT = Path(__file__).resolve().parents[1]


def demo_env(tmp_path: Path, columns: int = 200) -> dict[str, str]:
    # PYTHONPATH: the beamflow of this checkout, whichever copy the venv has installed.
    return {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT)}


def engine_leftovers(ws: Path) -> list[int]:
    base = ws / "state" / "compute-engine"
    return [pid for d in base.iterdir() for pid in engine_processes(d)] if base.is_dir() else []


def test_demo_runs_every_scan_to_success(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    result = subprocess.run(
        [*DEMO, "--workspace", str(ws), "--scans", "2", "--positions", "60", "--iterations",
         "20", "--exit"],
        capture_output=True, text=True, timeout=280,
        # Into a pipe at 80 columns, as a log gets it: nothing may be cut.
        env=demo_env(tmp_path, columns=80),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert engine_leftovers(ws) == []
    assert (ws / "state" / "compute-engine").is_dir()  # it did run on the engine
    lines = result.stdout.splitlines()
    # The live table's status line ends the line; the summary's title is a line of its own.
    served = [i for i, line in enumerate(lines)
              if re.fullmatch(r"status page: http://127\.0\.0\.1:\d+", line)]
    assert served and "summary" in lines and "…" not in result.stdout
    # The address as soon as the page listens: before the runs (the live table) ...
    table = next(i for i, line in enumerate(lines) if "beamflow demo: beamline" in line)
    assert served[0] < table
    # ... and, the page stopped with --exit, the last line is how to see the runs again.
    assert lines[-1] == ("the status page has stopped; to see these runs again: beamflow serve "
                         f"--config {ws / 'beamflow.toml'}")
    header = next(line for line in lines[lines.index("summary"):] if "verdict" in line)
    assert header.index("status") < header.index("verdict") < header.index("iterations")
    settings = load_config(ws / "beamflow.toml")
    store = Store(settings.store_path)
    finals = [r for r in store.list_runs(limit=None) if r.fraction == 1.0]
    assert sorted(r.scan_name for r in finals) == ["demo_scan_001", "demo_scan_002"]
    for run in finals:
        assert run.status == "SUCCEEDED", run.error
        (row,) = [line for line in lines if run.product in line]  # whole, on its row
        assert run.verdict in ("trusted", "suspect")
        assert {"trusted": " trusted ", "suspect": " SUSPECT "}[run.verdict] in row
        # The score against the simulator's truth is kept with the run (for its page).
        truth = run.result["truth"]
        assert 0 < truth["nrmse"] < 0.5 and f"{truth['nrmse']:.3f}" in row
        assert truth["ground_truth"] == str(settings.beamline.detector_dir / run.scan_name
                                            / "ground_truth.h5")
        assert run.product and Path(run.product).is_file()
        assert Path(run.product).is_relative_to(settings.beamline.preview_dir)
        assert {Path(p).name for p in run.previews} >= {"object_phase.png", "convergence.png"}
        assert [s.name for s in store.steps(run.id)][-1].startswith("Transfer")


def test_a_second_demo_in_the_same_workspace_adds_new_scans(tmp_path: Path) -> None:
    from beamflow.config import Settings
    from beamflow.demo import _new_scan_names

    settings = Settings(beamline={"detector_dir": tmp_path / "detector"})
    assert _new_scan_names(settings, 2) == ["demo_scan_001", "demo_scan_002"]
    for name in ("demo_scan_001", "demo_scan_002"):
        (tmp_path / "detector" / name).mkdir(parents=True)
    assert _new_scan_names(settings, 2) == ["demo_scan_003", "demo_scan_004"]


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_demo_leaves_no_process_behind(tmp_path: Path, stop: str) -> None:
    """Stopped mid-reconstruction: with SIGTERM to the demo, or with SIGINT to its whole
    process group as a terminal's Ctrl-C is. The demo shuts its compute engine down."""
    ws = tmp_path / "ws"
    log = (tmp_path / "demo.log").open("w")
    demo = subprocess.Popen(
        [*DEMO, "--workspace", str(ws), "--scans", "1", "--positions", "40", "--iterations",
         "100000"],
        stdout=log, stderr=subprocess.STDOUT, env=demo_env(tmp_path), start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            runs = Store(ws / "state" / "runs.sqlite").list_runs() if (ws / "state").is_dir() \
                else []  # fmt: skip
            if any(r.status == RunStatus.ACTIVE and (r.iteration or 0) >= 1 for r in runs):
                break
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no reconstruction under way"
            time.sleep(0.2)
        engine = engine_leftovers(ws)
        assert engine  # the interchange, the pool and its worker are running
        if stop == "SIGTERM":
            demo.send_signal(signal.SIGTERM)
        else:
            os.killpg(demo.pid, signal.SIGINT)
        demo.wait(90)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(30)
        log.close()
    assert demo.returncode == 1, demo.returncode  # handled (not killed by the signal)
    assert engine_leftovers(ws) == [], (tmp_path / "demo.log").read_text()[-3000:]
