"""The suite passes for a developer whose own beamflow configuration is set: BEAMFLOW_*
variables, ~/.config/beamflow/beamflow.toml and a beamflow.toml in the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_suite_ignores_the_developers_configuration(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "beamflow").mkdir(parents=True)
    hostile = '[status]\nport = 1\n[globus]\nclient_id = "00000000-0000-0000-0000-00000000beef"\n'
    (home / ".config" / "beamflow" / "beamflow.toml").write_text(hostile)
    work = tmp_path / "work"
    work.mkdir()
    (work / "beamflow.toml").write_text(hostile)
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        BEAMFLOW_GLOBUS__CLIENT_ID="11111111-1111-1111-1111-111111111111",
        BEAMFLOW_BACKEND="globus",
        BEAMFLOW_STATUS__PORT="1",
        BEAMFLOW_RECONSTRUCTION__ITERATIONS="1",
    )
    tests = ["test_config.py", "globus/test_globus_auth.py", "cli/test_cli_foundation.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         *(str(ROOT / "tests" / t) for t in tests)],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
