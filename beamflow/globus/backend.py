"""The Globus backend: the same flows and functions as the local backend, on Globus.

Registration goes through the shared :mod:`beamflow.registry` (it decides created / updated /
unchanged from content checksums; this module only supplies the service calls). Runs are
Globus Flows runs; their status and steps come from the run document and log, with the
state of the flow's Transfer tasks attached to the transfer steps.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

import globus_sdk

import flows as flow_files
from beamflow import registry as reg
from beamflow.config import Settings, agent_client_id
from beamflow.globus import compute, transfer
from beamflow.globus import flows as gflows
from beamflow.globus.auth import (
    AGENT,
    INTERACTIVE,
    GlobusAuth,
    NetworkPolicy,
    data_access_collections,
    registered_flow_ids,
)
from beamflow.globus.errors import exists_on_service, globus_errors
from beamflow.globus.roles import flow_roles, run_roles
from beamflow.registry import RegistrationResult
from beamflow.runs.backend import FlowRunInfo, RunBackendError

log = logging.getLogger(__name__)


def refusal(name: str, check: gflows.ServiceValidation) -> str:
    """Globus Flows' refusal of flows/NAME.json, every reason on its own line."""
    reasons = "\n  ".join(check.problems)
    return f"flows/{name}.json: Globus Flows refuses the definition:\n  {reasons}"

BACKEND_NAME = "globus"


def deployed_flow_checksum(settings: Settings, name: str) -> str:
    """What decides whether a flow on Globus is up to date: its content (definition and
    schema) and its roles, so a role changed in beamflow.toml updates the flow."""
    roles = json.dumps(flow_roles(settings).model_dump(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{reg.flow_checksum(name)}\0{roles}".encode()).hexdigest()


class GlobusRunBackend:
    """:class:`beamflow.runs.backend.RunBackend` on Globus Flows, Transfer, Compute and Auth."""

    name = BACKEND_NAME

    def __init__(
        self,
        settings: Settings,
        *,
        network: NetworkPolicy = AGENT,
        auth: GlobusAuth | None = None,
    ) -> None:
        self.settings = settings
        self.registry = reg.Registry(settings.registry_path, BACKEND_NAME)
        # The run scope of every registered flow is required up front, so one login
        # consents to all of them.
        self.auth = auth or GlobusAuth(
            settings, flow_ids=registered_flow_ids(settings), network=network
        )
        self._flows: globus_sdk.FlowsClient | None = None
        self._transfer: globus_sdk.TransferClient | None = None
        self._task_cache: dict[str, dict[str, Any]] = {}
        self._transfer_states: dict[str, set[str]] = {}
        self._checked_login = False

    # -- clients -------------------------------------------------------------------------
    @property
    def flows_client(self) -> globus_sdk.FlowsClient:
        if self._flows is None:
            self._flows = self.auth.client(globus_sdk.FlowsClient)
        return self._flows

    @property
    def transfer_client(self) -> globus_sdk.TransferClient:
        if self._transfer is None:
            self._transfer = self.auth.client(globus_sdk.TransferClient)
        return self._transfer

    def _flow_client(self, flow_id: str) -> globus_sdk.SpecificFlowClient:
        client = self.auth.client(globus_sdk.SpecificFlowClient, flow_id)
        collections = data_access_collections(self.settings)
        if collections:
            # GCS v5 mapped collections: the run needs data_access consent for each.
            client.add_app_transfer_data_access_scope(collections)
        return client

    def _require_login(self) -> None:
        self.auth.require_login()  # logs expiry warnings; raises LoginRequired
        self._checked_login = True

    # -- registration --------------------------------------------------------------------
    def register_functions(self, *, dry_run: bool = False) -> list[RegistrationResult]:
        """Register each ``functions/NAME.py`` whose source (or beamflow version) changed.

        Globus Compute gives every registration a new id, so an update is a new
        registration. A dry run compares checksums only (no network)."""
        if not dry_run:
            self._require_login()

        def create(name: str) -> str:
            function = reg.load_function(name)
            return compute.register_function(
                self.auth,
                function,
                description=f"beamflow {name} ({reg.function_checksum(name)[:12]})",
            )

        def update(name: str, _old_id: str) -> str:
            return create(name)

        def exists(function_id: str) -> bool:
            return compute.function_exists(self.auth, function_id)

        return self._register("function", create, update, exists, dry_run)

    def register_flows(self, *, dry_run: bool = False) -> list[RegistrationResult]:
        """Deploy each ``flows/NAME.json`` (with its schema) whose content changed, or that
        was deleted on the service. A dry run compares checksums only (no network).

        A newly created flow has a run scope nobody has consented to yet: run
        `beamflow login` once more before starting runs of it."""
        if not dry_run:
            self._require_login()
        client = self.flows_client if not dry_run else None

        def accepted(name: str) -> globus_sdk.FlowsClient:
            """The service's own validation first: its refusal, with its reasons, is
            clearer than the one create/update would give."""
            assert client is not None
            check = gflows.validate_flow(
                client, name, flow_files.load_definition(name), flow_files.load_schema(name)
            )
            if not check.valid:
                raise RunBackendError(refusal(name, check), step="register")
            return client

        roles = flow_roles(self.settings)
        if agent_client_id(self.settings) is None:
            log.warning("no agent client among the flows' starters (globus.agent_client_id is "
                        "not set): the agent will not be able to start these flows")

        def create(name: str) -> str:
            flow_id = gflows.create_flow(accepted(name), name, flow_files.load_definition(name),
                                         flow_files.load_schema(name), roles)  # fmt: skip
            self.auth.add_flow(flow_id)
            return flow_id

        def update(name: str, flow_id: str) -> str:
            return gflows.update_flow(
                accepted(name),
                flow_id,
                name,
                flow_files.load_definition(name),
                flow_files.load_schema(name),
                roles,
            )

        def exists(flow_id: str) -> bool:
            assert client is not None
            return gflows.flow_exists(client, flow_id)

        def checksum(name: str) -> str:
            return deployed_flow_checksum(self.settings, name)

        results = self._register("flow", create, update, exists, dry_run, checksum=checksum)
        return [r.model_copy(update={"roles": roles.model_dump()}) for r in results]

    def _register(
        self,
        kind: reg.Kind,
        create: Callable[[str], str],
        update: Callable[[str, str], str | None],
        exists: Callable[[str], bool],
        dry_run: bool,
        checksum: Callable[[str], str] | None = None,
    ) -> list[RegistrationResult]:
        """The shared registry's decision for every shipped ``kind``, with this service's
        calls; a dry run asks the service nothing (not even whether the items still exist)."""
        try:
            return reg.register_shipped(
                self.registry, kind, create=create, update=update,
                exists=None if dry_run else exists, dry_run=dry_run, checksum=checksum,
            )  # fmt: skip
        except reg.RegistryError as exc:
            raise RunBackendError(str(exc), step="register") from None

    def validate_flow(
        self, name: str, definition: dict[str, Any], input_schema: dict[str, Any] | None
    ) -> gflows.ServiceValidation:
        """What Globus Flows says of a definition (and schema), without deploying it."""
        self._require_login()
        return gflows.validate_flow(self.flows_client, name, definition, input_schema)

    # -- runs ----------------------------------------------------------------------------
    def flow_id(self, flow: str) -> str:
        try:
            return self.registry.require_id("flow", flow)
        except reg.RegistryError as exc:
            raise RunBackendError(str(exc), step="start") from None

    def start_run(self, flow: str, body: dict[str, Any], *, label: str, tags: list[str]) -> str:
        flow_id = self.flow_id(flow)
        self._require_login()
        return gflows.start_run(self._flow_client(flow_id), body, label=label, tags=tags,
                                roles=run_roles(self.settings))  # fmt: skip

    def get_run(self, backend_run_id: str) -> FlowRunInfo:
        if not self._checked_login:
            self._require_login()
        client = self.flows_client
        with globus_errors(f"read the status of run {backend_run_id}"):
            run = client.get_run(backend_run_id).data
        entries = gflows.get_logs(client, backend_run_id)
        info = gflows.run_info(run, entries)
        names = self._transfer_state_names(str(run.get("flow_id", "")))
        if names and any(s.name in names and s.details.get("task_id") for s in info.steps):
            transfer.attach_task_status(self.transfer_client, info.steps, names, self._task_cache)
        return info

    def _transfer_state_names(self, flow_id: str) -> set[str]:
        if flow_id not in self._transfer_states:
            name = self.registry.name_of("flow", flow_id) if flow_id else None
            states: set[str] = set()
            if name is not None:
                try:
                    states = transfer.transfer_states(flow_files.load_definition(name))
                except (flow_files.FlowNotFound, ValueError):
                    states = set()
            self._transfer_states[flow_id] = states
        return self._transfer_states[flow_id]

    def cancel_run(self, backend_run_id: str) -> None:
        self._require_login()
        gflows.cancel_run(self.flows_client, backend_run_id)

    def resume_run(self, backend_run_id: str) -> None:
        """Resume an INACTIVE run (e.g. after `beamflow login` granted a missing consent)."""
        self._require_login()
        with globus_errors(f"read run {backend_run_id}"):
            flow_id = str(self.flows_client.get_run(backend_run_id)["flow_id"])
        gflows.resume_run(self._flow_client(flow_id), backend_run_id)

    def run_direct(
        self,
        function: str,
        kwargs: dict[str, Any],
        *,
        timeout: float | None = None,
        user_endpoint_config: dict[str, Any] | None = None,
    ) -> Any:
        """Run a registered function on the configured endpoint without a flow (with the
        run's resources as the endpoint template's variables)."""
        self._require_login()
        try:
            function_id = self.registry.require_id("function", function)
        except reg.RegistryError as exc:
            raise RunBackendError(str(exc), step="compute") from None
        endpoint = self.settings.compute.endpoint_id
        if not endpoint:
            raise RunBackendError("compute.endpoint_id is not set in beamflow.toml", step="compute")
        return compute.run_direct(self.auth, endpoint, function_id, kwargs, timeout=timeout,
                                  user_endpoint_config=user_endpoint_config)  # fmt: skip

    # -- timers --------------------------------------------------------------------------
    def ensure_timer(self, flow: str, body: dict[str, Any], *, every_seconds: int,
                     name: str) -> RegistrationResult:  # fmt: skip
        """A Globus Timer that runs the registered ``flow`` with ``body`` every
        ``every_seconds``, as this identity (the agent: its client). Recorded in the registry
        under ``name``; made again when the flow, body or interval changed, or the timer is
        gone from the service; the one it replaces is deleted."""
        self._require_login()
        flow_id = self.flow_id(flow)
        request = {"flow_id": flow_id, "body": body, "every_seconds": every_seconds,
                   "run_roles": run_roles(self.settings).model_dump()}  # fmt: skip
        checksum = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        timers = self.auth.client(globus_sdk.TimersClient)
        timers.add_app_flow_user_scope(flow_id)  # the Timer starts the flow for us

        def create(_name: str) -> str:
            timer = globus_sdk.FlowTimer(
                flow_id=flow_id, name=f"beamflow {name}",
                schedule=globus_sdk.RecurringTimerSchedule(every_seconds),
                body={"body": body, "label": f"beamflow {name}",
                      "tags": ["beamflow", name], **run_roles(self.settings).model_dump()},
            )  # fmt: skip
            with globus_errors(f"create the Globus Timer {name!r}", step="register"):
                made = timers.create_timer(timer)
            return str(made["timer"]["job_id"])

        def update(_name: str, old_id: str) -> str:
            new_id = create(_name)
            with globus_errors(f"delete the Globus Timer {old_id} it replaces"):
                try:
                    timers.delete_job(old_id)
                except globus_sdk.GlobusAPIError as exc:
                    if exc.http_status != 404:
                        raise
            return new_id

        def exists(timer_id: str) -> bool:
            return exists_on_service(f"look up Globus Timer {timer_id}",
                                     lambda: timers.get_job(timer_id))  # fmt: skip

        try:
            return self.registry.ensure("timer", name, checksum, create=create, update=update,
                                        exists=exists)  # fmt: skip
        except reg.RegistryError as exc:
            raise RunBackendError(str(exc), step="register") from None

    def finished_runs(self, flow: str, *, after: str | None = None) -> list[FlowRunInfo]:
        """The ended runs of the registered ``flow`` (a Timer's), oldest first, those
        started after the run ``after`` only (the last one already read)."""
        self._require_login()
        flow_id = self.flow_id(flow)
        found: list[dict[str, Any]] = []
        with globus_errors(f"list the runs of flow {flow_id}"):
            for page in self.flows_client.paginated.list_runs(filter_flow_id=flow_id):
                found.extend(page["runs"])
        found.sort(key=lambda r: str(r.get("start_time") or ""))
        if after is not None:
            ids = [str(r.get("run_id")) for r in found]
            found = found[ids.index(after) + 1:] if after in ids else found
        return [self.get_run(str(r["run_id"])) for r in found
                if gflows.run_status(str(r.get("status", ""))).finished]

    def close(self) -> None:
        self.auth.close()

    def __enter__(self) -> GlobusRunBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def validate_with_service(
    settings: Settings,
    name: str,
    definition: dict[str, Any],
    input_schema: dict[str, Any] | None,
    *,
    network: NetworkPolicy = INTERACTIVE,
) -> gflows.ServiceValidation:
    """Globus Flows' verdict on a definition (`beamflow flows validate --remote`), as the
    configured identity; raises :class:`LoginRequired` when nobody is logged in."""
    with GlobusRunBackend(settings, network=network) as backend:
        return backend.validate_flow(name, definition, input_schema)
