"""Crash safety of beamflow.checkpoint: kill -9 at every commit step and at random moments,
SIGTERM flush, and a reader polling while another process commits."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from beamflow.checkpoint import COMMIT_STEPS, list_checkpoints, load_latest, read_latest_record

# The child process: commits checkpoints of deterministic content (arrays_for(iteration)),
# and in "step" mode freezes at one commit step of one iteration so the parent can kill it
# exactly there.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
from beamflow.checkpoint import Checkpointer, CheckpointPolicy, LevelConfig, install_sigterm_flush

def arrays_for(it):
    rng = np.random.default_rng(it)
    obj = (rng.standard_normal((256, 256)) + 1j * rng.standard_normal((256, 256)))
    return {"object": obj.astype(np.complex64), "probe": rng.random((2, 32, 32)).astype(np.float32),
            "counter": np.array([it], dtype=np.int64)}

mode, root = sys.argv[1], Path(sys.argv[2])
marker = root / "marker.json"

def say(**kw):
    tmp = root / "marker.tmp"
    tmp.write_text(json.dumps(kw))
    os.replace(tmp, marker)

if mode == "step":
    pause_step, pause_it = sys.argv[3], int(sys.argv[4])
    def hook(level, step, path):
        if step == pause_step and int(path.name[5:14] if path.name.startswith("ckpt") else
                                      cur[0]) == pause_it:
            say(step=step, iteration=pause_it, path=str(path))
            time.sleep(600)
    cur = [0]
    pol = CheckpointPolicy(l2=LevelConfig(dir=root / "ck", keep=2))
    ck = Checkpointer(pol, hook=hook)
    for it in range(1, pause_it + 1):
        cur[0] = it
        ck.save(it, arrays_for(it), {"iteration": it})
        ck.flush()
    say(step="done")
    time.sleep(600)
elif mode == "writer":
    n = int(sys.argv[3])
    pol = CheckpointPolicy(l2=LevelConfig(dir=root / "ck", keep=2))
    with Checkpointer(pol) as ck:
        for it in range(1, n + 1):
            ck.save(it, arrays_for(it), {"iteration": it})
            ck.flush()
elif mode == "sigterm":
    gate = root / "release"
    def hook(level, step, path):
        if step == "temp_written":
            say(step="writing")
            while not gate.exists():  # the write is slow; SIGTERM arrives meanwhile
                time.sleep(0.01)
    ck = Checkpointer(CheckpointPolicy(l2=LevelConfig(dir=root / "ck")), hook=hook)
    install_sigterm_flush(ck)
    ck.save(5, arrays_for(5), {"iteration": 5})
    while True:
        time.sleep(0.05)
"""


def arrays_for(it: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(it)
    obj = rng.standard_normal((256, 256)) + 1j * rng.standard_normal((256, 256))
    return {"object": obj.astype(np.complex64),
            "probe": rng.random((2, 32, 32)).astype(np.float32),
            "counter": np.array([it], dtype=np.int64)}


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def wait_marker(root: Path, proc: subprocess.Popen, want: str | None = None,
                timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    marker = root / "marker.json"
    while time.monotonic() < deadline:
        if marker.exists():
            m = json.loads(marker.read_text())
            if want is None or m["step"] == want:
                return m
        if proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read().decode()}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("child never reached its marker")


def kill9(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()


def writers_of(parent: int) -> list[int]:
    """Checkpoint writer processes started by `parent` that still exist."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 3 and b"beamflow.checkpoint.worker" in argv[2]
                and argv[3] == str(parent).encode()):
            try:
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if state != "Z":
                found.append(int(entry.name))
    return found


def assert_no_writer_left(parent: int) -> None:
    """A kill -9 of the job takes its writer process with it (PR_SET_PDEATHSIG)."""
    deadline = time.monotonic() + 10
    while writers_of(parent):
        assert time.monotonic() < deadline, f"writer processes outlived {parent}"
        time.sleep(0.01)


def assert_verified(dirs, it_min: int, it_max: int) -> int:
    ck = load_latest(dirs)
    assert ck is not None
    assert not ck.path.name.startswith(".")  # never a temp file
    assert it_min <= ck.iteration <= it_max, ck.iteration
    assert ck.meta == {"iteration": ck.iteration}
    for k, a in arrays_for(ck.iteration).items():
        np.testing.assert_array_equal(ck.arrays[k], a, err_msg=k)
    return ck.iteration


# Kill while iteration 3 is being committed (1 and 2 are done): before LATEST moves the
# restart gets 2, after it gets 3.
@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_kill9_at_each_commit_step(tmp_path: Path, step: str) -> None:
    proc = start("step", str(tmp_path), step, "3")
    wait_marker(tmp_path, proc)
    assert writers_of(proc.pid)  # the write is in a writer process, paused at `step`
    kill9(proc)
    assert_no_writer_left(proc.pid)
    committed = COMMIT_STEPS.index(step) >= COMMIT_STEPS.index("latest_renamed")
    got = assert_verified(tmp_path / "ck", 2, 3)
    assert got == (3 if committed else 2)
    # a restarted writer removes the dead one's temp files and carries on
    from beamflow.checkpoint import Checkpointer, CheckpointPolicy, LevelConfig

    with Checkpointer(CheckpointPolicy(l2=LevelConfig(dir=tmp_path / "ck", keep=2))) as ck:
        assert not [n for n in os.listdir(tmp_path / "ck") if n.startswith(".tmp")]
        ck.save(4, arrays_for(4), {"iteration": 4})
    assert_verified(tmp_path / "ck", 4, 4)


# The very first commit, killed before LATEST exists: either nothing or the renamed file.
@pytest.mark.parametrize("step", ["temp_fsynced", "renamed", "latest_temp_written"])
def test_kill9_during_first_commit(tmp_path: Path, step: str) -> None:
    proc = start("step", str(tmp_path), step, "1")
    wait_marker(tmp_path, proc)
    kill9(proc)
    if COMMIT_STEPS.index(step) < COMMIT_STEPS.index("renamed"):
        assert load_latest(tmp_path / "ck") is None
    else:  # the file is complete and verifies on its own (sha in its name) though LATEST is not
        assert read_latest_record(tmp_path / "ck") is None
        assert assert_verified(tmp_path / "ck", 1, 1) == 1


def _random_writer(root: Path) -> None:
    """Forked child: commit to L1 (every iteration) and L2 (every 3) as fast as it can."""
    from beamflow.checkpoint import Checkpointer, CheckpointPolicy, LevelConfig

    pol = CheckpointPolicy(l1=LevelConfig(dir=root / "l1", every_iterations=1, keep=2),
                           l2=LevelConfig(dir=root / "l2", every_iterations=3, keep=2),
                           max_overhead=None)
    ck = Checkpointer(pol, priority="normal")
    it = 0
    while True:
        it += 1
        ck.maybe_save(it, lambda it=it: arrays_for(it), {"iteration": it})
        if it == 3:
            ck.flush()
            (root / "ready").touch()
        time.sleep(0.002)


def test_kill9_at_random_moments(tmp_path: Path) -> None:
    import multiprocessing

    # fork: the child is ready in milliseconds (no interpreter start), so many kills are cheap
    ctx = multiprocessing.get_context("fork")
    rnd = random.Random(20240601)
    for trial in range(16):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        child = ctx.Process(target=_random_writer, args=(root,), daemon=True)
        child.start()
        deadline = time.monotonic() + 30
        while not (root / "ready").exists():
            assert child.is_alive() and time.monotonic() < deadline, "writer never got ready"
            time.sleep(0.002)
        time.sleep(rnd.uniform(0.0, 0.2))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert_no_writer_left(child.pid)
        assert_verified([root / "l1", root / "l2"], 3, 10**6)
        for level in ("l1", "l2"):  # each level on its own is consistent too
            if list_checkpoints(root / level):
                assert_verified(root / level, 1, 10**6)


def test_reader_polling_during_commits_never_sees_a_partial_file(tmp_path: Path) -> None:
    proc = start("writer", str(tmp_path), "40")
    seen: list[int] = []
    try:
        while proc.poll() is None:
            ck = load_latest(tmp_path / "ck")
            if ck is None:
                assert not seen, "a checkpoint existed, then none verified"
                continue
            for k, a in arrays_for(ck.iteration).items():
                np.testing.assert_array_equal(ck.arrays[k], a, err_msg=k)
            seen.append(ck.iteration)
            time.sleep(0.002)  # poll like a status page would, leaving the writer some CPU
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert len(set(seen)) > 5  # the reader really overlapped many commits
    assert seen == sorted(seen)
    assert_verified(tmp_path / "ck", 40, 40)


def test_sigterm_flushes_the_pending_write_then_exits(tmp_path: Path) -> None:
    proc = start("sigterm", str(tmp_path))
    wait_marker(tmp_path, proc, "writing")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)  # the handler is now waiting for the slow write
    assert proc.poll() is None
    (tmp_path / "release").touch()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert_verified(tmp_path / "ck", 5, 5)
