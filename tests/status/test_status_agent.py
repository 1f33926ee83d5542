"""The status page's "Edge agent" panel and /api/agent, from the agent.json a real agent
writes: what it watches, waits for and skips; an agent that stopped, hung or never ran."""

from __future__ import annotations

import time
from pathlib import Path

from agent_kit import Clock, ScriptedBackend, make_agent, settings, step, write_scan
from fastapi.testclient import TestClient

from beamflow.agent_state import read_state, state_path, write_state
from beamflow.config import Settings
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import options_for

__all__ = ["settings"]  # the fixture, imported


def client_for(settings: Settings, **options) -> TestClient:
    opts = StatusOptions(agent_state=state_path(settings.state_dir), **options)
    return TestClient(create_app(Store(settings.store_path), opts),
                      base_url="http://127.0.0.1:8765")


def test_no_agent_yet_is_said_plainly(settings: Settings) -> None:
    client = client_for(settings)
    agent = client.get("/api/agent").json()
    assert agent["available"] is False and agent["state"] == "none"
    assert str(state_path(settings.state_dir)) in agent["headline"]
    assert "No edge agent has reported here yet" in client.get("/").text


def test_what_the_agent_waits_for_and_skips_is_served(settings: Settings) -> None:
    assert options_for(settings).agent_state == state_path(settings.state_dir)
    agent = make_agent(settings, ScriptedBackend(), Clock())
    write_scan(settings.beamline.detector_dir, "s1", n=8, files=2)
    (settings.beamline.detector_dir / "zero.h5").write_bytes(b"")
    step(agent, agent.clock, passes=2)
    client = client_for(settings)
    served = client.get("/api/agent").json()
    assert served["available"] and served["state"] == "running"
    assert served["headline"] == (
        f"Watching {settings.beamline.detector_dir} (local backend)")
    (waiting,) = served["waiting"]
    assert waiting["name"] == "s1" and waiting["wait"] == "not quiet"
    assert waiting["reason"].startswith("not quiet yet")
    assert waiting["path"].endswith("s1/s1_master.h5")
    (skipped,) = served["skipped"]
    assert skipped["name"] == "zero.h5" and skipped["reason"].startswith("not a scan master")
    page = client.get("/").text
    assert 'id="agent" data-state="running"' in page
    assert waiting["reason"] in page and skipped["reason"] in page


def test_a_stopped_a_hung_and_a_garbled_agent(settings: Settings) -> None:
    agent = make_agent(settings, ScriptedBackend(), Clock())
    step(agent, agent.clock)
    path = state_path(settings.state_dir)
    client = client_for(settings)
    state = read_state(path)
    write_state(path, state.model_copy(update={"updated_at": time.time() - 300}))
    hung = client.get("/api/agent").json()
    assert hung["state"] == "stale" and hung["headline"].startswith("Not responding")
    assert f"pid {state.pid}" in hung["headline"]
    write_state(path, state.model_copy(update={"running": False, "mode": "once",
                                               "summary": "agent --once: 1 processed"}))
    stopped = client.get("/api/agent").json()
    assert stopped["state"] == "stopped"
    # Plain words (the panel shows text, not Markdown): no backticks, the summary once.
    assert stopped["headline"].startswith("beamflow agent --once ended at ")
    assert stopped["headline"].endswith(": 1 processed") and "`" not in stopped["headline"]
    Path(path).write_text("{not json")
    garbled = client.get("/api/agent").json()
    assert garbled["state"] == "unreadable" and str(path) in garbled["headline"]
    assert client.get("/").status_code == 200  # the runs page still works
