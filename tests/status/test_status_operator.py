"""The status page for an operator: speed and ETA of running runs, the runs list by time
(filter and sort), a run's logs, and steps named in words."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from page_kit import LOOPBACK, TOKEN

from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app


@pytest.fixture
def client(store: Store) -> TestClient:
    return TestClient(create_app(store, StatusOptions()), base_url=LOOPBACK)


def make_run(store: Store, scan: str, status: RunStatus = RunStatus.QUEUED, **fields) -> Run:
    run = store.create_run(scan_name=scan, scan_path=f"/data/{scan}", flow="ptycho_reconstruct",
                           backend="local", status=status)
    return store.update_run(run.id, **fields) if fields else run


def ids(page: dict) -> list[str]:
    return [r["id"] for r in page["runs"]]


# -- speed and ETA -------------------------------------------------------------------------
def test_a_running_run_shows_iterations_per_second_and_eta(
    store: Store, client: TestClient
) -> None:
    run = make_run(store, "scan_live", RunStatus.ACTIVE, current_step="ReconstructOnHPC",
                   iteration=10, iterations_total=110)
    first = client.get(f"/api/runs/{run.id}").json()["extras"]
    assert first["iterations_per_second"] is None and first["rate_text"] == ""  # one sample
    time.sleep(0.3)
    later = store.update_run(run.id, iteration=40)
    extras = client.get(f"/api/runs/{run.id}").json()["extras"]
    rate = 30 / (later.updated_at - run.updated_at)  # from the times the store wrote
    assert extras["iterations_per_second"] == pytest.approx(rate, rel=1e-6)
    assert extras["eta_seconds"] == pytest.approx(70 / rate, rel=1e-6)
    assert "it/s" in extras["rate_text"] and "left" in extras["rate_text"]
    # The list and both pages show the same.
    listed = client.get("/api/runs").json()["extras"][run.id]
    assert listed["iterations_per_second"] == pytest.approx(rate, rel=1e-6)
    assert extras["rate_text"] in client.get(f"/runs/{run.id}").text
    assert extras["rate_text"] in client.get("/").text


def test_no_speed_without_progress_or_once_finished(store: Store, client: TestClient) -> None:
    run = make_run(store, "scan_slow", RunStatus.ACTIVE, iteration=5, iterations_total=50)
    client.get(f"/api/runs/{run.id}")
    time.sleep(0.05)
    store.update_run(run.id, current_step="ReconstructOnHPC")  # written, but no iteration
    assert client.get(f"/api/runs/{run.id}").json()["extras"]["iterations_per_second"] is None
    store.update_run(run.id, status=RunStatus.SUCCEEDED, iteration=50)
    done = client.get(f"/api/runs/{run.id}").json()["extras"]
    assert done["iterations_per_second"] is None and done["eta_seconds"] is None


# -- the runs list by time -----------------------------------------------------------------
def test_failed_in_the_last_hour(store: Store, client: TestClient) -> None:
    now = time.time()
    old = make_run(store, "scan_old", RunStatus.FAILED, finished_at=now - 7200, error="x")
    recent = make_run(store, "scan_recent", RunStatus.FAILED, finished_at=now - 600, error="y")
    running = make_run(store, "scan_running", RunStatus.ACTIVE)
    done_long_ago = make_run(store, "scan_done", RunStatus.SUCCEEDED, finished_at=now - 90000)

    page = client.get("/api/runs?status=FAILED&since=1h").json()
    assert ids(page) == [recent.id] and page["total"] == 1 and page["since"] == "1h"
    # Without the status filter: what ended in the window, and what has not ended.
    page = client.get("/api/runs?since=1h").json()
    assert set(ids(page)) == {recent.id, running.id}
    assert page["counts"]["FAILED"] == 1 and page["counts"]["SUCCEEDED"] == 0
    assert set(ids(client.get("/api/runs?since=2d").json())) == {
        old.id, recent.id, running.id, done_long_ago.id}
    assert set(ids(client.get("/api/runs?since=90m").json())) == {recent.id, running.id}

    html = client.get("/?status=FAILED&since=1h").text
    assert "scan_recent" in html and "scan_old" not in html
    assert re.search(r'<option value="1h" selected>', html)
    # The status chips keep the time window.
    assert 'href="/?status=SUCCEEDED&amp;since=1h"' in html


@pytest.mark.parametrize("since", ["1 hour", "-1h", "1w", "h"])
def test_a_bad_time_window_is_refused_with_the_form_to_use(client: TestClient, since: str) -> None:
    r = client.get("/api/runs", params={"since": since})
    assert r.status_code == 400 and "1h, 30m, 7d" in r.json()["detail"]


def test_sorting_by_time(store: Store, client: TestClient) -> None:
    now = time.time()
    a = make_run(store, "scan_a", RunStatus.SUCCEEDED, started_at=now - 100, finished_at=now - 90)
    b = make_run(store, "scan_b", RunStatus.FAILED, started_at=now - 500, finished_at=now - 10)
    c = make_run(store, "scan_c", RunStatus.ACTIVE, started_at=now - 50)
    d = make_run(store, "scan_d")  # queued: never started, never ended

    assert ids(client.get("/api/runs").json()) == [d.id, c.id, b.id, a.id]
    assert ids(client.get("/api/runs?sort=oldest").json()) == [a.id, b.id, c.id, d.id]
    # Most recently ended first; runs that have not ended after them.
    assert ids(client.get("/api/runs?sort=finished").json())[:2] == [b.id, a.id]
    # Longest first (a running run counts until now); never started last.
    assert ids(client.get("/api/runs?sort=longest").json()) == [b.id, c.id, a.id, d.id]
    r = client.get("/api/runs?sort=alphabetical")
    assert r.status_code == 400 and "newest, oldest, finished, longest" in r.json()["detail"]
    html = client.get("/?sort=longest").text
    assert '<option value="longest" selected>' in html
    assert html.index("scan_b") < html.index("scan_c") < html.index("scan_a")


# -- logs ----------------------------------------------------------------------------------
def test_a_run_links_to_its_logs(store: Store, client: TestClient) -> None:
    run = make_run(store, "scan_bad", RunStatus.FAILED, error="scan_bad.cxi is not an HDF5 file",
                   error_step="ReconstructOnHPC")
    for i in range(60):  # more than the run page's recent events
        store.add_event(run.id, "AgentNote", f"agent line {i}")
    store.record_step(run.id, "TransferScanToHPC", "SUCCEEDED", started_at=1.0, finished_at=2.0,
                      details={"action": {"details": {"files_transferred": 3}}})
    store.record_step(run.id, "ReconstructOnHPC", "FAILED", started_at=2.0, finished_at=3.0,
                      details={"error": {"cause": "Traceback ... ScanFormatError: not HDF5"}})

    page = client.get(f"/runs/{run.id}").text
    assert f'href="/runs/{run.id}/logs"' in page

    logs = client.get(f"/runs/{run.id}/logs")
    assert logs.status_code == 200
    assert "agent line 0" in logs.text and "agent line 59" in logs.text  # all of them
    assert "Reconstruct on HPC" in logs.text and "files_transferred" in logs.text
    assert "Traceback ... ScanFormatError: not HDF5" in logs.text

    api = client.get(f"/api/runs/{run.id}/logs").json()
    assert len(api["events"]) == 60 and [s["name"] for s in api["steps"]] == [
        "TransferScanToHPC", "ReconstructOnHPC"]
    text = client.get(f"/runs/{run.id}/logs.txt")
    assert text.headers["content-type"].startswith("text/plain")
    assert "agent line 59" in text.text and "## step Reconstruct on HPC" in text.text
    # Only runs in the store have logs; nothing is read from a path the request names.
    for url in ("/runs/nope/logs", "/api/runs/nope/logs", "/runs/..%2F..%2Fetc/logs.txt"):
        assert client.get(url).status_code == 404, url


def test_logs_need_the_token_where_viewing_does(store: Store) -> None:
    run = make_run(store, "scan_private", RunStatus.FAILED)
    store.add_event(run.id, "AgentNote", "private line")
    app = create_app(store, StatusOptions(host="0.0.0.0", token=TOKEN))
    client = TestClient(app, base_url="http://10.0.0.5:8765")
    for url in (f"/runs/{run.id}/logs", f"/runs/{run.id}/logs.txt", f"/api/runs/{run.id}/logs"):
        denied = client.get(url)
        assert denied.status_code == 401 and "private line" not in denied.text, url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert "private line" in client.get(f"/runs/{run.id}/logs.txt", headers=auth).text


# -- step words ----------------------------------------------------------------------------
def test_steps_are_named_in_the_words_of_the_steps_card(store: Store, client: TestClient) -> None:
    run = make_run(store, "scan_words", RunStatus.ACTIVE, current_step="TransferScanToHPC")
    store.record_step(run.id, "TransferScanToHPC", "ACTIVE", started_at=time.time())
    failed = make_run(store, "scan_failed", RunStatus.FAILED, error="boom",
                      error_step="ReconstructOnHPC")

    listing = client.get("/").text
    cells = re.findall(r'<td class="c-step" data-label="Step">([^<]*)</td>', listing)
    assert "Transfer scan to HPC" in cells and "TransferScanToHPC" not in cells
    assert "Reconstruct on HPC: boom" in listing
    page = client.get(f"/runs/{run.id}").text
    assert '<dd data-extra="step_text">Transfer scan to HPC</dd>' in page
    # The header and the Steps card use the same words.
    assert re.search(r'class="step-name"[^>]*>Transfer scan to HPC<', page)
    assert " in step Reconstruct on HPC" in client.get(f"/runs/{failed.id}").text
    api = client.get("/api/runs").json()["extras"]
    assert api[run.id]["step_text"] == "Transfer scan to HPC"
    assert api[failed.id]["error_step_text"] == "Reconstruct on HPC"


def test_a_local_run_shows_its_flow_run_log_and_nothing_else(
    store: Store, tmp_path: Path
) -> None:
    import json
    import uuid

    local_runs = tmp_path / "state" / "local_runs"
    local_runs.mkdir(parents=True)
    flow_run = str(uuid.uuid4())
    (local_runs / f"{flow_run}.json").write_text(json.dumps({"run_id": flow_run, "log": [
        {"time": "2026-11-25T18:00:00+00:00", "code": "ActionStarted",
         "description": "state ReconstructOnHPC", "details": {"state_name": "ReconstructOnHPC"}},
        {"time": "2026-11-25T18:01:00+00:00", "code": "ActionFailed",
         "description": "compute task failed",
         "details": {"error": {"cause": "Traceback (most recent call last): ... not HDF5"}}},
    ]}))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"log": [{"code": "SECRET", "description": "leaked"}]}))
    run = make_run(store, "scan_local", RunStatus.FAILED, backend_run_id=flow_run)
    sneaky = make_run(store, "scan_sneaky", RunStatus.FAILED,
                      backend_run_id="../../secret")  # a record that names a path
    client = TestClient(create_app(store, StatusOptions(local_runs=local_runs)),
                        base_url=LOOPBACK)

    api = client.get(f"/api/runs/{run.id}/logs").json()
    assert [e["code"] for e in api["flow_log"]] == ["ActionStarted", "ActionFailed"]
    assert "Traceback (most recent call last)" in client.get(f"/runs/{run.id}/logs").text
    assert "ActionFailed" in client.get(f"/runs/{run.id}/logs.txt").text

    refused = client.get(f"/api/runs/{sneaky.id}/logs").json()
    assert refused["flow_log"] == [] and "not a local run id" in refused["flow_log_note"]
    assert "leaked" not in client.get(f"/runs/{sneaky.id}/logs").text
    gone = make_run(store, "scan_pruned", RunStatus.FAILED, backend_run_id=str(uuid.uuid4()))
    assert "no flow run record" in client.get(f"/api/runs/{gone.id}/logs").json()["flow_log_note"]


def test_serve_reads_the_local_backends_run_records(tmp_path: Path) -> None:
    from beamflow.config import Settings
    from beamflow.status.server import options_for

    settings = Settings(state_dir=tmp_path / "state")
    assert options_for(settings).local_runs == tmp_path / "state" / "local_runs"
