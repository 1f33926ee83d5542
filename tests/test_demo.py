"""`beamflow demo --exit`: the main job end to end on the embedded backend."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from beamflow.config import load_config
from beamflow.store import Store


def test_demo_runs_every_scan_to_success(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    result = subprocess.run(
        [sys.executable, "-m", "beamflow.cli", "demo", "--workspace", str(ws), "--scans", "2",
         "--positions", "60", "--probe-size", "32", "--iterations", "20", "--rate", "200",
         "--exit"],
        capture_output=True, text=True, timeout=280,
        # Into a pipe at 80 columns, as a log gets it: nothing may be cut.
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    # The live table's status line ends the line; the summary's title is a line of its own.
    assert any(re.fullmatch(r"status page: http://127\.0\.0\.1:\d+", line) for line in lines)
    assert "summary" in lines and "…" not in result.stdout
    settings = load_config(ws / "beamflow.toml")
    store = Store(settings.store_path)
    finals = [r for r in store.list_runs(limit=None) if r.fraction == 1.0]
    assert sorted(r.scan for r in finals) == ["demo_scan_001", "demo_scan_002"]
    for run in finals:
        assert run.status == "SUCCEEDED", run.error
        (row,) = [line for line in lines if run.product in line]  # whole, on its row
        # The score against the simulator's truth is kept with the run (for its page).
        truth = run.result["truth"]
        assert 0 < truth["nrmse"] < 0.5 and f"{truth['nrmse']:.3f}" in row
        assert truth["ground_truth"] == str(settings.beamline.detector_dir / run.scan
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
