"""`beamflow reconstruct` as a user runs it: kill -9 and resume, SIGTERM, errors, --json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from job_kit import scan_with_its_probe

from beamflow.checkpoint import load_latest, read_latest_record

BEAMFLOW = [sys.executable, "-m", "beamflow.cli"]


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("detector")
    return scan_with_its_probe(root, "k", positions=40, probe_size=32, photons=2e5, seed=5,
                               frames_per_file=20)


def args(scan: Path, out: Path, *extra: str) -> list[str]:
    return [*BEAMFLOW, "reconstruct", str(scan), "--out", str(out), "--device", "cpu",
            "--batch", "8", "--probe", str(scan.parent.parent / "probe.npy"),
            "--preview-every", "0", *extra]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(proc: subprocess.Popen, ckdir: Path, at_least: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rec = read_latest_record(ckdir, quiet=True)
        if rec is not None and rec.iteration >= at_least:
            return rec.iteration
        if proc.poll() is not None:
            raise AssertionError(f"finished before a checkpoint: {proc.communicate()}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("no checkpoint appeared")


def test_kill9_then_the_same_command_resumes(scan: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = args(scan, out, "--iterations", "120", "--checkpoint-every", "1", "--json")
    proc = start(cmd)
    wait_for_checkpoint(proc, out / "checkpoints", 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "product.h5").exists()
    last = load_latest(out / "checkpoints")
    assert last is not None and last.iteration >= 3

    done = run(cmd)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["resumed_from_iteration"] == last.iteration
    assert summary["iterations"] == 120
    assert summary["iterations_this_run"] == 120 - last.iteration
    for key in ("seconds_per_iteration", "final_loss", "device", "product", "previews"):
        assert key in summary
    assert Path(summary["product"]).exists()


def test_sigterm_saves_at_the_iteration_boundary_and_exits(scan: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # L2 rarely: the checkpoint SIGTERM leaves behind is the one the handler wrote
    cmd = args(scan, out, "--iterations", "300", "--checkpoint-every", "1000", "--json")
    proc = start(cmd)
    deadline = time.monotonic() + 60
    while not (out / "checkpoints").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # well into the iterations
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    ck = load_latest(out / "checkpoints")
    assert ck is not None and 0 < ck.iteration < 300
    assert ck.meta["state"]["iteration"] == ck.iteration

    done = run(args(scan, out, "--iterations", str(ck.iteration + 2), "--json"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["resumed_from_iteration"] == ck.iteration


def test_errors_are_one_clear_line_and_exit_1(scan: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beamflow.cli import app

    def invoke(*argv: str):
        result = CliRunner().invoke(app, [str(a) for a in argv[len(BEAMFLOW):]])
        # a clean exit, never an exception escaping the command (which would also give 1)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            result.exception)
        return result

    missing = invoke(*args(tmp_path / "nothing_master.h5", tmp_path / "o1"))
    assert missing.exit_code == 1
    assert "nothing_master.h5" in missing.stderr

    out = tmp_path / "o2"
    first = invoke(*args(scan, out, "--iterations", "2", "--json"))
    assert first.exit_code == 0, first.stderr
    assert json.loads(first.stdout)["iterations"] == 2
    refused = invoke(*args(scan, out, "--iterations", "2", "--algorithm", "epie"))
    assert refused.exit_code == 1
    assert "algorithm: stored 'rpie' vs current 'epie'" in refused.stderr
    assert "--no-resume" in refused.stderr and "Traceback" not in refused.stderr

    bad = invoke(*args(scan, out, "--algorithm", "nope"))
    assert bad.exit_code == 2 and "algorithm" in bad.stderr
