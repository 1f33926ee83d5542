"""What the agent tells the operator: one log line per scan and change of what it waits for,
the files it skips and why, the closing line of `agent --once`, and agent.json."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_kit import Clock, ScriptedBackend, age, make_agent, settings, step, write_scan
from typer.testing import CliRunner

from beamflow.agent_state import read_state, state_path
from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.formats.eiger import data_file_name

__all__ = ["settings"]  # the fixture, imported


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def said(self, message: str) -> list[dict]:
        """The fields of each record with this message, with its level."""
        return [{**getattr(r, "fields", {}), "level": r.levelname} for r in self.records
                if r.getMessage() == message]


@pytest.fixture
def agent_log() -> Iterator[Records]:
    # Its own handler: `beamflow agent` in another test may have turned propagation off.
    logger = logging.getLogger("beamflow.agent")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_scan_not_quiet_yet_is_said_once(settings: Settings, agent_log: Records) -> None:
    agent = make_agent(settings, ScriptedBackend(), Clock())
    write_scan(settings.beamline.detector_dir, "s1")  # all files, written just now
    step(agent, agent.clock)
    step(agent, agent.clock, 0.2, passes=3)  # looked at again: nothing new to say
    (said,) = agent_log.said("scan waiting")
    assert said["wait"] == "not quiet" and said["scan"] == "s1"
    assert said["reason"].startswith("not quiet yet: files changed")
    assert said["path"].endswith("s1/s1_master.h5") and said["level"] == "INFO"


def test_a_short_scan_says_how_many_frames_it_waits_for(
    settings: Settings, agent_log: Records
) -> None:
    agent = make_agent(settings, ScriptedBackend(), Clock())
    master = write_scan(settings.beamline.detector_dir, "s1", n=8, files=2)  # 4 of 8
    age(master, 5)
    step(agent, agent.clock, passes=3)
    waits = [s for s in agent_log.said("scan waiting") if s["wait"] == "frames"]
    assert len(waits) == 1
    assert waits[0]["reason"].startswith("waiting for 4 more frame(s): 4 of 8 readable")
    assert "processed as aborted if nothing new comes" in waits[0]["reason"]
    write_scan(settings.beamline.detector_dir, "s1", n=8, files=3)  # a new data file: 6 of 8
    age(master, 5)
    step(agent, agent.clock, passes=2)
    waits = [s for s in agent_log.said("scan waiting") if s["wait"] == "frames"]
    assert [w["frames"] for w in waits] == [4, 6]
    assert waits[1]["reason"].startswith("waiting for 2 more frame(s): 6 of 8")


def test_an_unreadable_data_file_is_named_at_once_then_reported_broken(
    settings: Settings, agent_log: Records
) -> None:
    agent = make_agent(settings, ScriptedBackend(), Clock())
    master = write_scan(settings.beamline.detector_dir, "s1", n=8, files=4)
    bad = master.parent / data_file_name("s1", 2)
    bad.write_bytes(bad.read_bytes()[:400])  # truncated under its final name
    age(master, 5)
    step(agent, agent.clock, passes=2)
    (said,) = agent_log.said("scan waiting")
    assert said["wait"] == "unreadable" and said["level"] == "WARNING"
    assert str(bad) in said["reason"] and "2 of 8 frames readable" in said["reason"]
    assert agent.store.list_runs() == []  # not yet: a network file system may catch up
    step(agent, agent.clock, settings.agent.stall_timeout)
    (broken,) = agent_log.said("scan unreadable")
    assert bad.name in broken["error"] and broken["level"] == "ERROR"


def test_files_that_are_not_scans_are_skipped_once_with_why(
    settings: Settings, agent_log: Records
) -> None:
    root = settings.beamline.detector_dir
    agent = make_agent(settings, ScriptedBackend(), Clock())
    master = write_scan(root, "s1")
    (master.parent / "ground_truth.h5").write_bytes(b"beside a scan: its own business")
    (root / "zero.h5").write_bytes(b"")
    (root / "day2").mkdir()
    (root / "day2" / "scan.h5").write_bytes(b"\x89HDF")
    (root / "notes.txt").write_text("not HDF5-looking: not worth a word")
    orphan = root / "day3" / data_file_name("s9", 1)
    orphan.parent.mkdir()
    orphan.write_bytes(b"")
    step(agent, agent.clock, passes=2)
    step(agent, agent.clock, 1.0, passes=2)  # rescans: nothing new to say
    skipped = {Path(s["path"]).name: s["reason"] for s in agent_log.said("file skipped")}
    assert len(agent_log.said("file skipped")) == 3
    assert skipped["zero.h5"].startswith("not a scan master")
    assert skipped["scan.h5"].startswith("not a scan master")
    assert skipped[orphan.name] == (
        "a data file without its master file: s9_master.h5 is not there (yet)")
    # The master arrives: the data file is no longer skipped, and agent.json says so.
    (root / "day3" / "s9_master.h5").write_bytes(b"")
    step(agent, agent.clock, 1.0, passes=2)
    state = read_state(state_path(settings.state_dir))
    assert sorted(Path(f.path).name for f in state.skipped) == ["scan.h5", "zero.h5"]


def test_agent_json_says_what_the_agent_watches_and_waits_for(settings: Settings) -> None:
    agent = make_agent(settings, ScriptedBackend(), Clock())
    write_scan(settings.beamline.detector_dir, "s1", n=8, files=1)
    (settings.beamline.detector_dir / "zero.h5").write_bytes(b"")
    step(agent, agent.clock, passes=2)
    path = state_path(settings.state_dir)
    state = read_state(path)
    assert state.running and state.mode == "watch" and state.pid == os.getpid()
    assert state.watching == str(settings.beamline.detector_dir)
    (waiting,) = state.waiting
    assert waiting.name == "s1" and waiting.wait == "not quiet" and state.waiting_total == 1
    assert [Path(f.path).name for f in state.skipped] == ["zero.h5"]
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".agent")] == []
    json.loads(path.read_text())  # plain JSON for other tools too
    agent.stop()
    agent._publish(running=False)
    assert read_state(path).running is False


# -- `beamflow agent --once` ------------------------------------------------------------------
@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for key in [k for k in os.environ if k.startswith("BEAMFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no user config
    ws = tmp_path / "ws"
    assert CliRunner().invoke(app, ["init", str(ws)]).exit_code == 0
    # `beamflow agent` sets up its JSON logging on the "beamflow" logger: undone afterwards,
    # so later tests' log capture works as before.
    logger = logging.getLogger("beamflow")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    yield ws
    logger.handlers[:], logger.propagate, logger.level = saved


def test_once_right_after_a_scan_lands_says_it_is_waiting(workspace: Path) -> None:
    settings = load_config(workspace / "beamflow.toml")
    write_scan(settings.beamline.detector_dir, "fresh")
    (settings.beamline.detector_dir / "zero.h5").write_bytes(b"")
    result = CliRunner().invoke(app, ["agent", "--once", "-c", str(workspace / "beamflow.toml")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "agent --once: 0 processed, 1 waiting, 1 skipped, 0 failed"
    logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (waiting,) = [entry for entry in logs if entry["message"] == "scan waiting"]
    assert waiting["scan"] == "fresh" and waiting["reason"].startswith("not quiet yet")
    state = read_state(state_path(settings.state_dir))
    assert state.mode == "once" and not state.running and state.summary == lines[-1]
    # Nothing to run: no compute engine was started, so none is torn down mid-warm-up
    # (which once logged a false "compute engine warm-up failed").
    assert not [entry for entry in logs if "warm" in entry["message"]]
    assert not (settings.state_dir / "compute-engine").exists()


def test_once_counts_processed_failed_and_done_before(workspace: Path) -> None:
    config = workspace / "beamflow.toml"
    settings = load_config(config)
    root = settings.beamline.detector_dir
    runner = CliRunner()
    made = runner.invoke(app, ["simulate", str(root), "--name", "good", "--positions", "24",
                               "--probe-size", "16", "-c", str(config)])
    assert made.exit_code == 0, made.output
    (root / "bad").mkdir()
    (root / "bad" / "bad_master.h5").write_bytes(b"not HDF5")
    then = time.time() - 10
    for path in root.rglob("*"):
        os.utime(path, (then, then))
    first = runner.invoke(app, ["agent", "--once", "--timeout", "240", "-c", str(config)])
    assert first.exit_code == 1, first.output  # the broken scan's run failed
    assert first.stdout.strip().splitlines()[-1] == (
        "agent --once: 1 processed, 0 waiting, 0 skipped, 1 failed")
    again = runner.invoke(app, ["agent", "--once", "-c", str(config)])
    assert again.exit_code == 0, again.output
    assert again.stdout.strip().splitlines()[-1] == (
        "agent --once: 0 processed, 0 waiting, 0 skipped, 0 failed (2 done before)")


class Opened:
    """The files h5py opened (the agent reads HDF5 through h5py only)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import h5py

        self.paths: list[Path] = []
        original = h5py.File.__init__

        def spy(file, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.paths.append(Path(os.path.realpath(os.fspath(name))))
            return original(file, name, *args, **kwargs)

        monkeypatch.setattr(h5py.File, "__init__", spy)


@pytest.mark.parametrize("elsewhere", ["outside the collection", "inside the collection"])
def test_a_symlinked_master_out_of_the_detector_directory_is_refused_unopened(
    settings: Settings, agent_log: Records, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    elsewhere: str,
) -> None:
    root = settings.beamline.detector_dir
    base = tmp_path / "other" if elsewhere.startswith("outside") else (
        settings.beamline.collection_root / "private")
    target = write_scan(base, "s1")
    age(target, 60)
    (root / "s1").mkdir()
    link = root / "s1" / target.name
    link.symlink_to(target)
    opened = Opened(monkeypatch)
    backend = ScriptedBackend()
    agent = make_agent(settings, backend, Clock())
    step(agent, agent.clock, passes=2)
    step(agent, agent.clock, settings.agent.stall_timeout + 1, passes=2)
    assert not [p for p in opened.paths if p.is_relative_to(base)], opened.paths
    (run,) = agent.store.list_runs()
    assert run.status.value == "FAILED" and backend.runs == {}
    if elsewhere.startswith("outside"):  # the run path's own refusal, kept as it said it
        assert run.error.startswith(f"scan {target} is outside the beamline collection root")
    else:
        assert run.error == (
            f"{link}: a symbolic link to {target}, outside the detector directory {root}: "
            "refused without being read (move or copy the scan into the detector directory)")
    assert "aborted before any frame" not in run.error
    assert agent.stats.failed == 1  # counted once


def test_a_symlinked_scan_directory_is_skipped_with_why(
    settings: Settings, agent_log: Records, tmp_path: Path
) -> None:
    root = settings.beamline.detector_dir
    write_scan(tmp_path / "day9", "s9")
    (root / "day9").symlink_to(tmp_path / "day9")
    agent = make_agent(settings, ScriptedBackend(), Clock())
    step(agent, agent.clock, passes=2)
    step(agent, agent.clock, 1.0, passes=2)
    (said,) = agent_log.said("file skipped")
    assert said["path"] == str(root / "day9")
    assert said["reason"] == (
        f"a symbolic link to the directory {tmp_path / 'day9'}: not followed; the agent reads "
        "scans inside the detector directory only (move or copy the scan here)")
    assert agent.store.list_runs() == []
    state = read_state(state_path(settings.state_dir))
    assert [f.path for f in state.skipped] == [str(root / "day9")]


def test_nan_frames_fail_at_readiness_before_any_transfer(settings: Settings) -> None:
    import h5py
    import numpy as np

    root = settings.beamline.detector_dir
    master = write_scan(root, "s1", n=8)
    data = master.parent / data_file_name("s1", 3)  # frames 5 and 6 of the scan
    with h5py.File(data, "a") as f:
        frames = f["entry/data/data"][...].astype(np.float32)
        attrs = dict(f["entry/data/data"].attrs)
        del f["entry/data/data"]
        frames[:] = np.nan  # a detector that wrote garbage for a whole file
        f.create_dataset("entry/data/data", data=frames).attrs.update(attrs)
    age(master, 60)
    backend = ScriptedBackend()
    agent = make_agent(settings, backend, Clock())
    step(agent, agent.clock, passes=2)
    (run,) = agent.store.list_runs()
    assert run.status.value == "FAILED" and run.error_step == "Readiness"
    assert run.error.startswith(f"{data}: /entry/data/data: frame 1 of 2 in this file (image 5")
    assert "a NaN or infinite value on a valid detector pixel" in run.error
    assert backend.runs == {}  # nothing was sent anywhere
