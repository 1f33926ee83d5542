"""Retention on Globus: the agent makes a Globus Timer (the SDK's TimersClient) that runs the
retention flow every [retention] every_hours as the agent, made again when what it runs
changes; the agent reads what the Timer's runs deleted and the run records say so, once.
Against globus-sdk's registered responses."""

from __future__ import annotations

import json
import time
from pathlib import Path

import globus_sdk
import pytest
from globus_sdk.testing import load_response
from globus_sdk.token_storage import SQLiteTokenStorage, TokenStorageData
from globus_testkit import NO_RETRY, make_settings, register, store_tokens

from beamflow.globus.backend import GlobusRunBackend
from beamflow.registry import Registry
from beamflow.runs.naming import scan_key
from beamflow.runs.records import RunStatus
from beamflow.runs.retention import FLOW, RetentionPass, flow_input
from beamflow.runs.store import Store

pytestmark = pytest.mark.usefixtures("mocked")

FLOW_ID = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
FUNCTION_ID = "44444444-4444-4444-8444-444444444444"
TIMERS = globus_sdk.TimersClient.scopes.resource_server


@pytest.fixture
def settings(tmp_path):
    settings = make_settings(tmp_path)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    storage = SQLiteTokenStorage(settings.token_path)  # as a login that consented to Timers
    storage.store_token_data_by_resource_server({TIMERS: TokenStorageData(
        resource_server=TIMERS, identity_id=None,
        scope=globus_sdk.TimersClient.scopes.timer.scope_string,
        access_token="access-timers", refresh_token="refresh-timers",
        expires_at_seconds=int(time.time() + 3600), token_type="Bearer")})  # fmt: skip
    storage.close()
    registry = Registry(settings.registry_path, "globus")
    registry.record("flow", FLOW, FLOW_ID, "x")
    registry.record("function", "cleanup", FUNCTION_ID, "x")
    return settings


def calls(mocked, method: str, path_end: str) -> list:
    return [c for c in mocked.calls
            if c.request.method == method and c.request.url.split("?")[0].endswith(path_end)]


def test_the_timer_runs_the_retention_flow_and_is_made_again_when_it_changes(settings, mocked):
    made = load_response(globus_sdk.TimersClient.create_timer, case="flow_timer_success")
    first_id = made.metadata["timer_id"]
    body = flow_input(settings, [], dry_run=False)
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        result = backend.ensure_timer(FLOW, body, every_seconds=86400, name="retention")
        assert result.action == "created" and result.id == first_id
        (post,) = calls(mocked, "POST", "/v2/timer")
        timer = json.loads(post.request.body)["timer"]
        assert timer["timer_type"] == "flow" and timer["flow_id"] == FLOW_ID
        assert timer["schedule"] == {"type": "recurring", "interval_seconds": 86400}
        assert timer["body"]["body"] == body and "retention" in timer["body"]["tags"]
        assert post.request.headers["Authorization"] == "Bearer access-timers"
        # Unchanged, and still on the service: nothing made.
        register("timer", f"/jobs/{first_id}", {"job_id": first_id})
        again = backend.ensure_timer(FLOW, body, every_seconds=86400, name="retention")
        assert again.action == "unchanged" and len(calls(mocked, "POST", "/v2/timer")) == 1
        # Every 12 hours instead: a new timer, the old one deleted.
        second = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
        register("timer", "/v2/timer", {"timer": {"job_id": second}}, method="POST",
                 status=201)
        register("timer", f"/jobs/{first_id}", {"job_id": first_id}, method="DELETE")
        changed = backend.ensure_timer(FLOW, body, every_seconds=43200, name="retention")
    assert changed.action == "updated" and changed.id == second
    assert calls(mocked, "DELETE", f"/jobs/{first_id}")
    assert Registry(settings.registry_path, "globus").require_id("timer", "retention") == second


def _run_doc(run_id: str, status: str, started: str) -> dict:
    return {"run_id": run_id, "action_id": run_id, "flow_id": FLOW_ID, "status": status,
            "start_time": started, "label": "beamflow retention", "details": {}}


def test_the_agent_records_what_the_timers_runs_deleted_once(settings, mocked):
    store = Store(settings.store_path)
    scan = Path(settings.beamline.detector_dir) / "s1"
    scan.mkdir(parents=True)
    run = store.create_run(scan_name="s1", scan_path=str(scan.resolve()), flow="ptycho_reconstruct",
                           backend="globus", parameters={})
    store.update_run(run.id, status=RunStatus.SUCCEEDED)
    key = scan_key(scan.resolve())
    done, busy = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-8999-aaaaaaaaaaaa"
    register("flows", "/runs", {"runs": [
        _run_doc(busy, "ACTIVE", "2026-01-06T00:00:00+00:00"),
        _run_doc(done, "SUCCEEDED", "2026-01-05T00:00:00+00:00")],
        "has_next_page": False, "marker": None})  # fmt: skip
    report = {"dry_run": False, "bytes": 7 * 10**9, "skipped": [], "items": [
        {"kind": "raw", "path": f"/lus/beamflow/{key}/raw", "scan_key": key,
         "bytes": 7 * 10**9, "age_days": 8.0}]}  # fmt: skip
    register("flows", f"/runs/{done}", {**_run_doc(done, "SUCCEEDED", "2026-01-05T00:00:00"),
                                        "details": {"output": {"cleaned": {
                                            "status": "SUCCEEDED",
                                            "details": {"result": [report]}}}}})  # fmt: skip
    register("flows", f"/runs/{done}/log", {"entries": [], "has_next_page": False})
    now = [0.0]
    with GlobusRunBackend(settings, network=NO_RETRY) as backend:
        agent_pass = RetentionPass(settings, store, backend, clock=lambda: now[0])
        agent_pass.tick()
        assert agent_pass.running is None  # on Globus the Timer runs the flow, not the agent
        (cleaned,) = store.require_run(run.id).result["cleaned"]
        assert cleaned["kind"] == "raw" and cleaned["bytes"] == 7 * 10**9
        (event,) = [e for e in store.events(run.id) if e.code == "Cleaned"]
        assert "7.0 GB" in event.message
        saved = json.loads((Path(settings.state_dir) / "retention.json").read_text())
        assert saved == {"last_run": done}
        now[0] += settings.retention.every_hours * 3600
        agent_pass.tick()  # the same runs listed again: nothing recorded twice
    assert len(store.require_run(run.id).result["cleaned"]) == 1
    listed = calls(mocked, "GET", "/runs")
    assert len(listed) == 2 and f"filter_flow_id={FLOW_ID}" in listed[0].request.url
    assert not calls(mocked, "POST", f"/flows/{FLOW_ID}/run")  # never started by the agent
