"""The Globus backend against globus-sdk's recorded responses: registration of flows and
functions through the shared registry, runs (label, tags, body), status and log parsing,
transfer task status, cancel and resume, and the login/consent failures."""

from __future__ import annotations

import json

import globus_sdk
import pytest
from globus_sdk.testing import get_last_request, load_response
from globus_testkit import IDENTITY, NO_RETRY, make_settings, register, store_tokens, transfer_task
from responses.matchers import query_param_matcher

import flows
from beamflow.globus.auth import flow_run_scope
from beamflow.globus.backend import GlobusRunBackend, deployed_flow_checksum
from beamflow.globus.errors import LoginRequired
from beamflow.globus.flows import run_status, steps_from_logs
from beamflow.globus.transfer import transfer_states
from beamflow.registry import Registry, flow_checksum, function_checksum
from beamflow.runs.records import Run, RunStatus

FLOW = "ptycho_reconstruct"
FLOW_ID = "24bc4997-b483-4c25-a19c-64b0afc00743"  # the SDK fixtures' flow
RUN_ID = "36ad9f9a-ad29-488f-beb4-c22ab729643a"
TASK_ID = "9a1b2c3d-0000-4000-8000-0000000000aa"


# Every request goes to `responses` (the `mocked` fixture in conftest.py), never the network.
pytestmark = pytest.mark.usefixtures("mocked")


@pytest.fixture
def settings(tmp_path):
    return make_settings(tmp_path)


def backend_for(settings) -> GlobusRunBackend:
    return GlobusRunBackend(settings, network=NO_RETRY)


def registry(settings) -> Registry:
    return Registry(settings.registry_path, "globus")


def bodies(mocked, method: str, path_end: str) -> list[dict]:
    return [
        json.loads(c.request.body)
        for c in mocked.calls
        if c.request.method == method and c.request.url.split("?")[0].endswith(path_end)
    ]


# -- flow registration -----------------------------------------------------------------------
def test_flows_are_created_with_definition_and_schema_unchanged(settings, mocked):
    store_tokens(settings)
    names = flows.flow_names()
    ids = [f"0000000{i}-0000-4000-8000-000000000000" for i in range(len(names))]
    for fid in ids:  # responses answers same-URL registrations in order
        register("flows", "/flows", {"id": fid, "title": "x"}, method="POST")
    register("flows", "/flows/validate", {"scopes": {}}, method="POST")
    with backend_for(settings) as backend:
        results = backend.register_flows()
    assert [r.action for r in results] == ["created"] * len(names)
    assert len(bodies(mocked, "POST", "/flows/validate")) == len(names)  # validated first
    sent = bodies(mocked, "POST", "/flows")
    for name, body, fid in zip(names, sent, ids, strict=True):
        assert body["definition"] == flows.load_definition(name)
        assert body["input_schema"] == flows.load_schema(name)
        assert registry(settings).require_id("flow", name) == fid


def test_flow_registration_unchanged_then_updated_on_content_change(settings, mocked):
    store_tokens(settings)
    reg = registry(settings)
    for name in flows.flow_names():
        reg.record("flow", name, FLOW_ID if name == FLOW else f"{FLOW_ID[:-1]}0",
                   deployed_flow_checksum(settings, name))  # fmt: skip
    for fid in (FLOW_ID, f"{FLOW_ID[:-1]}0"):
        register("flows", f"/flows/{fid}", {"id": fid})
    with backend_for(settings) as backend:
        assert {r.action for r in backend.register_flows()} == {"unchanged"}
        assert bodies(mocked, "PUT", FLOW_ID) == [] and bodies(mocked, "POST", "/flows") == []
        reg.record("flow", FLOW, FLOW_ID, "an older checksum")
        load_response(globus_sdk.FlowsClient.update_flow)  # PUT /flows/FLOW_ID
        register("flows", "/flows/validate", {"scopes": {}}, method="POST")
        results = {r.name: r for r in backend.register_flows()}
    assert results[FLOW].action == "updated" and results[FLOW].id == FLOW_ID
    (put,) = bodies(mocked, "PUT", f"/flows/{FLOW_ID}")
    assert put["definition"] == flows.load_definition(FLOW)
    assert put["input_schema"] == flows.load_schema(FLOW)
    assert reg.get("flow", FLOW).checksum == deployed_flow_checksum(settings, FLOW)


def test_flow_deleted_on_the_service_is_created_again(settings):
    store_tokens(settings)
    reg = registry(settings)
    gone = "99999999-9999-4999-8999-999999999999"
    for i, name in enumerate(flows.flow_names()):
        fid = gone if name == FLOW else f"{FLOW_ID[:-1]}{i}"
        reg.record("flow", name, fid, deployed_flow_checksum(settings, name))
        if name != FLOW:
            register("flows", f"/flows/{fid}", {"id": fid})
    register("flows", f"/flows/{gone}", {"error": {"code": "NOT_FOUND"}}, status=404)
    register("flows", "/flows", {"id": FLOW_ID}, method="POST")
    register("flows", "/flows/validate", {"scopes": {}}, method="POST")
    with backend_for(settings) as backend:
        results = {r.name: r for r in backend.register_flows()}
    assert results[FLOW].action == "created" and reg.require_id("flow", FLOW) == FLOW_ID
    assert {r.action for n, r in results.items() if n != FLOW} <= {"unchanged"}


def test_register_dry_run_needs_no_login_and_no_network(settings, mocked):
    with backend_for(settings) as backend:
        results = backend.register_flows(dry_run=True)
    assert {r.action for r in results} == {"created"}
    assert len(mocked.calls) == 0


# -- function registration -------------------------------------------------------------------
def test_function_registered_on_source_change_only(settings, mocked):
    store_tokens(settings)
    meta = load_response(globus_sdk.ComputeClientV3.register_function).metadata
    with backend_for(settings) as backend:
        first = {r.name: r for r in backend.register_functions()}
        assert first["reconstruct"].action == "created"
        assert first["reconstruct"].id == meta["function_id"]
        sent = bodies(mocked, "POST", "/v3/functions")
        assert sorted(s["function_name"] for s in sent) == ["cleanup", "reconstruct"]
        fid = first["reconstruct"].id
        register("compute", f"/v2/functions/{fid}", {"function_uuid": fid})
        assert {r.action for r in backend.register_functions()} == {"unchanged"}
        assert len(bodies(mocked, "POST", "/v3/functions")) == 2
        registry(settings).record("function", "reconstruct", fid, "older source")
        changed = {r.name: r for r in backend.register_functions()}
    assert changed["reconstruct"].action == "updated"
    assert changed["cleanup"].action == "unchanged"
    assert len(bodies(mocked, "POST", "/v3/functions")) == 3
    assert registry(settings).get("function", "reconstruct").checksum == function_checksum(
        "reconstruct"
    )


def test_registered_function_is_rebuilt_from_source_as_the_endpoint_does(settings, mocked):
    from globus_compute_sdk.serialize import ComputeSerializer

    store_tokens(settings)
    load_response(globus_sdk.ComputeClientV3.register_function)
    with backend_for(settings) as backend:
        backend.register_functions()
    sent = {b["function_name"]: b for b in bodies(mocked, "POST", "/v3/functions")}
    serde = ComputeSerializer()
    (buffer,) = serde.unpack_buffers(sent["reconstruct"]["function_code"])
    assert buffer.startswith("st\n")  # source text, not a pickled reference to functions/
    function = serde.deserialize(buffer)  # exec of the source in an empty namespace
    assert callable(function) and function.__name__ == "reconstruct"
    (buffer,) = serde.unpack_buffers(sent["cleanup"]["function_code"])
    cleanup = serde.deserialize(buffer)  # the retention flow's function, likewise
    report = cleanup(roots=[str(settings.hpc.scratch_dir)], raw_days=1, dry_run=True)
    assert report["items"] == [] and report["dry_run"] is True
    with pytest.raises(ValueError, match="not a directory"):  # it runs, and checks its input
        function(scan_path="/x", output_dir="/x", allowed_roots=["/nonexistent-root"])


# -- runs ------------------------------------------------------------------------------------
def _registered(settings, flow_id: str = FLOW_ID) -> None:
    registry(settings).record("flow", FLOW, flow_id, flow_checksum(FLOW))


def _transfer_action(status: str, **details) -> dict:
    """A transfer action's status document, as the flow's log gives it."""
    return {"action_id": TASK_ID, "status": status,
            "details": {"task_id": TASK_ID, "status": status, **details}}


def test_start_run_sends_body_label_and_tags(settings):
    flow_id = load_response(globus_sdk.SpecificFlowClient.run_flow).metadata["flow_id"]
    _registered(settings, flow_id)
    store_tokens(settings, flow_ids=(flow_id,))
    body = {"run_name": "scan_017", "raw_is_directory": True}
    with backend_for(settings) as backend:
        run_id = backend.start_run(FLOW, body, label="scan_017 (50%)", tags=["beamflow", "s17"])
    assert run_id == RUN_ID
    request = get_last_request()
    sent = json.loads(request.body)
    assert sent["body"] == body
    assert sent["label"] == "scan_017 (50%)" and sent["tags"] == ["beamflow", "s17"]
    assert request.headers["Authorization"] == f"Bearer access-{flow_id}"


def test_start_run_not_logged_in_is_a_login_error_without_network(settings, mocked):
    _registered(settings)
    with backend_for(settings) as backend, pytest.raises(LoginRequired, match="beamflow login"):
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert len(mocked.calls) == 0


def test_start_run_of_a_flow_registered_after_login_asks_for_consent(settings, mocked):
    _registered(settings)
    store_tokens(settings)  # logged in before the flow existed: no token for the flow
    with backend_for(settings) as backend, pytest.raises(LoginRequired, match="no consent yet"):
        backend.start_run(FLOW, {}, label="x", tags=[])
    assert len(mocked.calls) == 0


def test_missing_data_access_consent_is_found_before_starting(settings):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,), identity_id=IDENTITY)
    user = flow_run_scope(FLOW_ID, []).scope_string
    consent = {
        "id": 1,
        "scope_name": user,
        "dependency_path": [1],
        "status": "approved",
        "allows_refresh": True,
        "atomically_revocable": False,
        "effective_identity": IDENTITY,
        "auto_approved": False,
        "created": "2026-01-01T00:00:00+00:00",
        "updated": "2026-01-01T00:00:00+00:00",
        "last_used": "2026-01-01T00:00:00+00:00",
        "scope": "a",
        "client": "b",
    }
    register("auth", f"/v2/api/identities/{IDENTITY}/consents", {"consents": [consent]})
    with backend_for(settings) as backend, pytest.raises(LoginRequired, match="consent"):
        backend.start_run(FLOW, {}, label="x", tags=[])


@pytest.mark.parametrize(
    "error",
    [
        {"code": "ConsentRequired", "required_scopes": ["https://auth.globus.org/scopes/x/y"]},
        None,  # the SDK's recorded MISSING_SCOPE answer
    ],
)
def test_service_consent_errors_become_login_errors(settings, error):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    if error is None:
        load_response(globus_sdk.SpecificFlowClient.run_flow, case="missing_scope_error")
    else:
        register("flows", f"/flows/{FLOW_ID}/run", error, method="POST", status=403)
    with backend_for(settings) as backend, pytest.raises(LoginRequired, match="beamflow login"):
        backend.start_run(FLOW, {}, label="x", tags=[])


def _entry(t: str, code: str, state: str | None = None, **details) -> dict:
    if state is not None:
        details = {"state_name": state, **details}
    return {
        "time": f"2026-01-05T10:{t}+00:00",
        "code": code,
        "description": code,
        "details": details,
    }


def _logs(*pages: list[dict]) -> None:
    marker = None
    for i, entries in enumerate(pages):
        last = i == len(pages) - 1
        params = {"limit": "100", **({"marker": marker} if marker else {})}
        doc = {"limit": 100, "has_next_page": not last, "entries": entries}
        if not last:
            marker = doc["marker"] = f"m{i}"
        register("flows", f"/runs/{RUN_ID}/log", doc, match=[query_param_matcher(params)])


def _run_doc(status: str, **details) -> dict:
    return {
        "run_id": RUN_ID,
        "flow_id": FLOW_ID,
        "status": status,
        "display_status": status,
        "label": "scan_017",
        "tags": ["beamflow"],
        "start_time": "2026-01-05T10:00:00+00:00",
        "details": details,
    }


def test_run_status_and_steps_with_timings_from_paged_logs(settings):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    register("flows", f"/runs/{RUN_ID}", _run_doc("ACTIVE", code="ActionStarted"))
    transfer_done = _transfer_action("SUCCEEDED", files_transferred=12)
    _logs(
        [
            _entry("00:00", "FlowStarted", input={}),
            _entry("00:01", "ActionStarted", "TransferScanToHPC", state_type="Action"),
            _entry("02:01", "ActionCompleted", "TransferScanToHPC", output=transfer_done),
        ],
        [_entry("02:02", "ActionStarted", "Reconstruct", state_type="Action")],
    )
    with backend_for(settings) as backend:
        info = backend.get_run(RUN_ID)
    assert info.status == RunStatus.ACTIVE and info.error is None
    transfer, recon = info.steps
    assert (transfer.name, transfer.status) == ("TransferScanToHPC", "SUCCEEDED")
    assert transfer.finished_at - transfer.started_at == pytest.approx(120)
    assert transfer.details["task_id"] == TASK_ID
    assert transfer.details["transfer_files_transferred"] == 12
    assert (recon.name, recon.status, recon.finished_at) == ("Reconstruct", "ACTIVE", None)


def test_failed_run_names_the_step_the_cause_and_the_transfer_fault(settings):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    register("flows", f"/runs/{RUN_ID}", _run_doc("FAILED", code="FlowFailed"))
    failed = _transfer_action("FAILED", nice_status="PERMISSION_DENIED")
    cause = json.dumps({"details": {"description": "permission denied on /detector/scan_017"}})
    failure = {
        "step": "TransferScanToHPC",
        "description": "transfer of the raw scan from the beamline to the HPC failed",
        "error": {"Error": "ActionFailedException", "Cause": cause},
    }
    _logs(
        [
            _entry("00:01", "ActionStarted", "TransferScanToHPC"),
            _entry("00:09", "ActionFailed", "TransferScanToHPC", output=failed),
            _entry("00:10", "PassStarted", "RecordTransferScanFailure"),
            _entry(
                "00:10", "PassCompleted", "RecordTransferScanFailure", output={"failure": failure}
            ),
            _entry("00:11", "FailStarted", "TransferScanToHPCFailed"),
            _entry("00:11", "FlowFailed", cause="TransferScanToHPCFailed"),
        ]
    )
    transfer_task(TASK_ID, status="FAILED", nice_status="PERMISSION_DENIED", faults=3)
    with backend_for(settings) as backend:
        info = backend.get_run(RUN_ID)
    assert info.status == RunStatus.FAILED
    assert info.error_step == "TransferScanToHPC"
    assert "raw scan" in info.error and "permission denied on /detector/scan_017" in info.error
    # The run path reads the fault's kind and its cause from the flow's failure record.
    assert info.output["failure"] == failure
    from beamflow.runs.failures import failure_of

    run = Run(id="r", scan_name="scan_017", scan_path="/bl/detector/scan_017",
              flow="ptycho_reconstruct", backend="globus", status=RunStatus.ACTIVE,
              created_at=0, updated_at=0)  # fmt: skip
    told = failure_of(run, info)
    assert (told.step, told.kind) == ("TransferScanToHPC", "transient")
    assert told.message == "permission denied on /detector/scan_017"
    step = info.steps[0]
    assert step.status == "FAILED"
    assert step.details["transfer"]["nice_status"] == "PERMISSION_DENIED"
    assert step.details["transfer"]["faults"] == 3


@pytest.mark.parametrize(
    ("globus", "ours"),
    [
        ("ACTIVE", RunStatus.ACTIVE),
        ("INACTIVE", RunStatus.INACTIVE),
        ("SUCCEEDED", RunStatus.SUCCEEDED),
        ("FAILED", RunStatus.FAILED),
        ("ENDED", RunStatus.CANCELLED),
    ],
)
def test_globus_run_statuses_map_to_the_store(globus, ours):
    assert run_status(globus) == ours


def test_inactive_run_says_how_to_continue(settings):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    register(
        "flows",
        f"/runs/{RUN_ID}",
        _run_doc("INACTIVE", code="ActionInactive", description="consent required for a scope"),
    )
    _logs([_entry("00:01", "ActionStarted", "TransferScanToHPC")])
    with backend_for(settings) as backend:
        info = backend.get_run(RUN_ID)
    assert info.status == RunStatus.INACTIVE
    assert "consent required" in info.error and "beamflow login" in info.error


def test_cancel_and_resume(settings, mocked):
    _registered(settings)
    store_tokens(settings, flow_ids=(FLOW_ID,))
    run_id = load_response(globus_sdk.FlowsClient.cancel_run).metadata["run_id"]
    resume = load_response(globus_sdk.SpecificFlowClient.resume_run).metadata
    register("flows", f"/runs/{resume['run_id']}", {"run_id": resume["run_id"], "flow_id": FLOW_ID})
    with backend_for(settings) as backend:
        backend.cancel_run(run_id)
        assert get_last_request().url.endswith(f"/runs/{run_id}/cancel")
        backend.resume_run(resume["run_id"])
    assert get_last_request().url.endswith(f"/runs/{resume['run_id']}/resume")


def test_loop_visits_and_unknown_codes_in_logs():
    steps = steps_from_logs(
        [
            _entry("00:00", "WaitStarted", "Pause"),
            _entry("00:05", "WaitCompleted", "Pause"),
            _entry("00:06", "SomethingNew", "Pause"),
            _entry("00:10", "WaitStarted", "Pause"),
        ]
    )
    (pause,) = steps
    assert pause.status == "ACTIVE" and pause.finished_at is None
    assert pause.details["type"] == "Wait"


def test_transfer_states_of_the_shipped_flow():
    assert transfer_states(flows.load_definition(FLOW)) == {
        "TransferScanToHPC",
        "TransferResultsToBeamline",
    }


# -- the shared run path (beamflow.runs.lifecycle) on the Globus backend -----------------------
def test_shared_run_path_starts_and_follows_a_globus_run(settings, tmp_path):
    import jsonschema

    from beamflow.runs.lifecycle import start_scan_run, sync_run
    from beamflow.runs.request import RunRequest
    from beamflow.runs.store import Store

    scan = tmp_path / "beamline" / "detector" / "scan_017"
    scan.mkdir(parents=True)
    (scan / "scan_017_master.h5").write_bytes(b"")
    flow_id = load_response(globus_sdk.SpecificFlowClient.run_flow).metadata["flow_id"]
    _registered(settings, flow_id)
    function_id = "11111111-1111-4111-8111-111111111111"
    registry(settings).record("function", "reconstruct", function_id, "x")
    store_tokens(settings, flow_ids=(flow_id,))
    store = Store(settings.store_path)
    with backend_for(settings) as backend:
        run = start_scan_run(settings, store, backend,
                             RunRequest(scan_path=scan / "scan_017_master.h5"))
        sent = json.loads(get_last_request().body)
        assert run.status == RunStatus.ACTIVE and run.backend_run_id == RUN_ID
        # What the shared path builds is what the flow's schema accepts, sent unchanged.
        jsonschema.validate(sent["body"], flows.load_schema(FLOW))
        assert sent["body"]["compute"]["function_id"] == function_id
        assert sent["body"]["beamline"]["raw_path"] == "/detector/scan_017"
        assert "beamflow" in sent["tags"] and sent["label"]

        summary = {"iterations": 100, "product_relative": "product.h5", "previews_relative": []}
        output = {"reconstruct": {"status": "SUCCEEDED", "details": {"result": [summary]}}}
        doc = {**_run_doc("SUCCEEDED", code="FlowSucceeded", output=output), "flow_id": flow_id}
        register("flows", f"/runs/{RUN_ID}", doc)
        _logs(
            [
                _entry("00:00", "ActionStarted", "TransferScanToHPC"),
                _entry(
                    "01:00", "ActionCompleted", "TransferScanToHPC", output={"status": "SUCCEEDED"}
                ),
                _entry("01:01", "ActionStarted", "Reconstruct"),
                _entry("05:01", "ActionCompleted", "Reconstruct", output={"status": "SUCCEEDED"}),
            ]
        )
        run = sync_run(store, backend, run)
    assert run.status == RunStatus.SUCCEEDED and run.iteration == 100
    steps = {s.name: s for s in store.steps(run.id)}
    assert steps["Reconstruct"].duration == pytest.approx(240)
    assert steps["TransferScanToHPC"].status == "SUCCEEDED"
