"""`beamflow demo --exit`: the main job end to end on the embedded backend."""

from __future__ import annotations

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
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "summary" in result.stdout and "http://127.0.0.1:" in result.stdout
    settings = load_config(ws / "beamflow.toml")
    store = Store(settings.store_path)
    finals = [r for r in store.list_runs(limit=None) if r.fraction == 1.0]
    assert sorted(r.scan for r in finals) == ["demo_scan_001", "demo_scan_002"]
    for run in finals:
        assert run.status == "SUCCEEDED", run.error
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
