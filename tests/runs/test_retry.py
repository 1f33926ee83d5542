"""One failed run, at most one retry: through the run path (two at once make one run), the
CLI (exit 1 with the id of the first) and the status page's API (409); a run that failed on
bad input is not retried at all, and the page says why instead of offering the button."""

from __future__ import annotations

import threading
import uuid
from functools import partial
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from runs_kit import QuietRunBackend, at_once
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.config import Settings, load_config
from beamflow.error_kinds import ErrorKind
from beamflow.registry import Registry, register_functions
from beamflow.runs.backend import FlowRunInfo
from beamflow.runs.lifecycle import RetryRefused, create_scan_run, retry_run
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.request import RunRequest
from beamflow.runs.store import Store
from beamflow.status.app import StatusOptions, create_app


class StartingBackend(QuietRunBackend):
    """Starts every run it is given (and nothing else): the run path is what is tested."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.lock = threading.Lock()

    def start_run(self, flow: str, body: dict, *, label: str, tags: list[str]) -> str:
        with self.lock:
            self.started.append(body["run_name"])
        return str(uuid.uuid4())

    def get_run(self, backend_run_id: str) -> FlowRunInfo:
        return FlowRunInfo(backend_run_id=backend_run_id, status=RunStatus.ACTIVE)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    result = CliRunner().invoke(app, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    settings = load_config(tmp_path / "ws" / "beamflow.toml")
    register_functions(Registry(settings.registry_path, "local"),
                       create=lambda name: str(uuid.uuid4()),
                       update=lambda name, function_id: function_id)  # fmt: skip
    return settings


def failed_run(settings: Settings, store: Store, kind: ErrorKind, name: str = "s1") -> Run:
    scan = Path(settings.beamline.detector_dir) / name
    scan.mkdir(parents=True)
    (scan / f"{name}_master.h5").write_bytes(b"")  # a scan directory (never read here)
    run = create_scan_run(settings, store, RunRequest(scan_path=scan))
    return store.update_run(run.id, status=RunStatus.FAILED, error_step="Reconstruct",
                            error="the worker ended", error_kind=kind)  # fmt: skip


def test_two_retries_at_once_start_one_run(settings: Settings) -> None:
    store = Store(settings.store_path)
    old = failed_run(settings, store, ErrorKind.LOST)
    backend = StartingBackend()
    outcomes = at_once(lambda: retry_run(settings, old.id, store=Store(settings.store_path),
                                         backend=backend), 4, RetryRefused)  # fmt: skip
    (new,) = [o for o in outcomes if isinstance(o, Run)]
    refusals = [o for o in outcomes if isinstance(o, RetryRefused)]
    assert len(refusals) == 3 and {r.retry_id for r in refusals} == {new.id}
    assert all(f"retried already, as run {new.id}" in str(r) for r in refusals)
    assert len(backend.started) == 1 and new.status == RunStatus.ACTIVE
    assert (new.parent_run_id, new.attempt, new.scan_path) == (old.id, 2, old.scan_path)
    assert store.count_runs() == 2
    # Its retry, once it fails too, may be retried in turn (a chain, never a fan).
    store.update_run(new.id, status=RunStatus.FAILED, error="lost", error_kind=ErrorKind.LOST)
    third = retry_run(settings, new.id, store=store, backend=backend)
    assert (third.parent_run_id, third.attempt) == (new.id, 3)


def test_a_run_that_failed_on_bad_input_is_not_retried(settings: Settings) -> None:
    store = Store(settings.store_path)
    old = failed_run(settings, store, ErrorKind.BAD_INPUT)
    with pytest.raises(RetryRefused, match="bad input: a retry would not help") as info:
        retry_run(settings, old.id, store=store, backend=StartingBackend())
    assert info.value.retry_id is None and store.count_runs() == 1


def test_the_cli_refuses_a_second_retry_with_the_id_of_the_first(settings: Settings) -> None:
    store = Store(settings.store_path)
    old = failed_run(settings, store, ErrorKind.TRANSIENT)
    config = ["--config", str(settings.source)]
    # The first retry is made (the workspace's flows are not registered: it cannot start,
    # and says so), the second is refused.
    first = CliRunner().invoke(app, ["runs", "retry", old.id[:8], *config])
    (new,) = [r for r in store.list_runs() if r.parent_run_id == old.id]
    assert f"run {new.id} retries {old.id}" in first.output
    second = CliRunner().invoke(app, ["runs", "retry", old.id[:8], *config])
    assert second.exit_code == 1
    assert f"was retried already, as run {new.id}" in second.output
    assert store.count_runs() == 2
    bad = failed_run(settings, store, ErrorKind.BAD_INPUT, "s2")
    refused = CliRunner().invoke(app, ["runs", "retry", bad.id, *config])
    assert refused.exit_code == 1 and "a retry would not help" in refused.output
    shown = CliRunner().invoke(app, ["runs", "show", old.id, *config])
    assert f"retried   as run {new.id}" in shown.output


def test_the_api_answers_409_and_the_page_hides_the_button(settings: Settings) -> None:
    store = Store(settings.store_path)
    old = failed_run(settings, store, ErrorKind.LOST)
    bad = failed_run(settings, store, ErrorKind.BAD_INPUT, "s2")
    retry = partial(retry_run, settings, store=store, backend=StartingBackend())
    client = TestClient(create_app(store, StatusOptions(), retry=retry),
                        base_url="http://127.0.0.1:8765")  # fmt: skip
    page = client.get(f"/runs/{old.id}").text
    csrf = page.split('name="csrf-token" content="')[1].split('"')[0]
    headers = {"X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:8765"}

    assert 'id="retry-form" hidden' not in page
    first = client.post(f"/api/runs/{old.id}/retry", headers=headers)
    assert first.status_code == 200, first.text
    second = client.post(f"/api/runs/{old.id}/retry", headers=headers)
    assert second.status_code == 409
    assert f"retried already, as run {first.json()['id']}" in second.json()["detail"]
    retried = client.get(f"/runs/{old.id}").text
    assert 'id="retry-form" hidden' in retried and f"/runs/{first.json()['id']}" in retried

    assert client.post(f"/api/runs/{bad.id}/retry", headers=headers).status_code == 409
    page = client.get(f"/runs/{bad.id}").text
    assert 'id="retry-form" hidden' in page and "A retry would not help" in page
    detail = client.get(f"/api/runs/{bad.id}").json()
    assert detail["run"]["retry_refusal"].endswith("fix the scan or the parameters and start "
                                                   "a new run")
    assert store.count_runs() == 3
