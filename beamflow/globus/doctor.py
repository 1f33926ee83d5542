"""`beamflow doctor`: is this installation ready to run flows on Globus, and if not, what to fix.

Checks, in order: configuration (every id filled in), the token file, login and consents,
who is logged in, each collection (looked up and its root listed), the Compute endpoint
(online?), the functions and flows (registered and still on the service). Each check says
what it found and, when it fails, what to do. Interactive network settings (one retry, 10 s
timeout) keep it quick; after the first "cannot reach Globus", the remaining network checks
are skipped rather than each waiting for the same timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import globus_sdk

from beamflow import endpoint_files as ef
from beamflow import registry as reg
from beamflow.config import Settings, agent_client_id, environ_overrides, is_uuid
from beamflow.globus import compute, transfer
from beamflow.globus import flows as gflows
from beamflow.globus import identity_mapping as idmap
from beamflow.globus.auth import (
    CLIENT_DOMAIN,
    INTERACTIVE,
    GlobusAuth,
    NetworkPolicy,
    client_identity_urn,
    data_access_collections,
    expiry_warnings,
)
from beamflow.globus.errors import ClientSecretRejected, LoginRequired, globus_errors
from beamflow.runs.backend import RunBackendError
from beamflow.worker_check import Check


def config_checks(settings: Settings) -> list[Check]:
    where = str(settings.source or "beamflow.toml")
    checks: list[Check] = []
    if settings.source is None:  # every id below would read "not set", for want of a file
        checks.append(Check(
            name="config", outcome="fail",
            detail="no beamflow.toml found (./beamflow.toml, ~/.config/beamflow/beamflow.toml): "
            "checking the built-in defaults",
            fix="run doctor where the workspace's beamflow.toml is, pass --config FILE, or "
            "create one with `beamflow init --backend globus DIR`",
        ))  # fmt: skip
    if settings.backend != "globus":
        checks.append(
            Check(
                name="backend",
                outcome="warn",
                detail=f"backend = {settings.backend!r} in {where}; Globus is not in use",
                fix='set backend = "globus" (or BEAMFLOW_BACKEND=globus) to run flows on Globus',
            )
        )
    ids = {
        "globus.client_id": settings.globus.client_id,
        "beamline.collection_id": settings.beamline.collection_id,
        "hpc.collection_id": settings.hpc.collection_id,
        "compute.endpoint_id": settings.compute.endpoint_id,
    }
    for key, value in ids.items():
        if is_uuid(value):
            checks.append(Check(name=key, outcome="ok", detail=value))
        else:
            env = "BEAMFLOW_" + key.replace(".", "__").upper()
            checks.append(
                Check(
                    name=key,
                    outcome="fail",
                    detail=f"not a UUID: {value!r}" if value else "not set",
                    fix=f"fill in {key} in {where} (or set {env}); see deploy/README.md",
                )
            )
    mode = "service (client secret)" if settings.globus.client_secret else "person (native app)"
    overridden = ", ".join(sorted(environ_overrides())) or "none"
    checks.append(
        Check(name="identity kind", outcome="ok", detail=f"{mode}; env overrides: {overridden}")
    )
    checks.append(identity_mapping_check(settings))
    checks += endpoint_files_checks(settings)
    return checks


RENDER = "`beamflow render-endpoint deploy/compute-endpoint/<kind> DIR`"


def mapping_path(settings: Settings) -> Path | None:
    """The identity mapping to check: ``cluster.identity_mapping``, else the one in
    ``cluster.endpoint_dir``."""
    cluster = settings.cluster
    if cluster.identity_mapping is not None:
        return cluster.identity_mapping
    if cluster.endpoint_dir is not None and (cluster.endpoint_dir / ef.MAPPING).is_file():
        return cluster.endpoint_dir / ef.MAPPING
    return None


def endpoint_files_checks(settings: Settings) -> list[Check]:
    """The endpoint's files as written for this site (``cluster.endpoint_dir``): nothing
    left to fill in, no module failure hidden, a worker environment the mapped account can
    reach."""
    directory = settings.cluster.endpoint_dir
    if directory is None:
        return [Check(name="endpoint files", outcome="skip",
                      detail="cluster.endpoint_dir not set: the endpoint's files are not checked",
                      fix=f"write them with {RENDER}, configure the endpoint from DIR, and set "
                      "cluster.endpoint_dir to (a copy of) DIR")]  # fmt: skip
    template = directory / ef.TEMPLATE
    if not template.is_file():
        return [Check(name="endpoint files", outcome="fail",
                      detail=f"{template}: no such file (cluster.endpoint_dir)",
                      fix=f"write the files with {RENDER}")]  # fmt: skip
    problems = [f"placeholder left: {p}" for p in ef.placeholders(directory)]
    problems += [f"a module command whose failure is hidden: {h}"
                 for h in ef.hidden_failures(template)]  # fmt: skip
    checks = [Check(name="endpoint files", outcome="fail", detail="; ".join(problems),
                    fix="set what is missing in beamflow.toml ([cluster], [cluster.final], "
                    f"globus.agent_client_id), write the files again ({RENDER} --force) and "
                    "configure the endpoint from them") if problems else
              Check(name="endpoint files", outcome="ok",
                    detail=f"{directory}: no placeholder; every module load fails the job "
                    "loudly")]  # fmt: skip
    checks.append(worker_env_check(settings, template))
    return checks


def worker_env_check(settings: Settings, template: Path) -> Check:
    """Can the account the agent's tasks run as activate the template's environment?"""
    name = "worker environment"
    env = ef.worker_env_of(template)
    if env is None:
        return Check(name=name, outcome="fail", detail=f"{template}: no `source .../bin/"
                     "activate` in worker_init", fix=f"write the files with {RENDER}")
    account = settings.cluster.service_account
    client = agent_client_id(settings)
    path = mapping_path(settings)
    if path is not None and client:
        try:
            mapped = idmap.mapped_accounts(path, idmap.client_identity(client), client)
        except idmap.MappingError:
            mapped = []  # the identity mapping check says why
        account = mapped[0] if mapped else account
    if not account:
        return Check(name=name, outcome="skip", detail=f"{env}: no account known to check it "
                     "for", fix="set cluster.service_account (the account the agent runs as)")
    reach = ef.account_reaches(env, account)
    if reach.ok is None:
        return Check(name=name, outcome="skip", detail=reach.detail,
                     fix="run `beamflow doctor` on the endpoint's host, or prove it with "
                     "`beamflow doctor --probe --as-agent`")  # fmt: skip
    if not reach.ok:
        return Check(name=name, outcome="fail",
                     detail=f"the workers of {account} could not start: {reach.detail}",
                     fix="set cluster.worker_env to an environment every mapped account can "
                     f"read (not in a home), then {RENDER} --force")  # fmt: skip
    return Check(name=name, outcome="ok", detail=reach.detail)


def identity_mapping_check(settings: Settings) -> Check:
    """Does the endpoint's identity mapping (a readable copy, ``cluster.identity_mapping``)
    map the agent's client identity to a local account? Without it, every Reconstruct step
    the agent starts is refused on a multi-user endpoint."""
    name = "identity mapping"
    path = mapping_path(settings)
    client_id = agent_client_id(settings)
    if path is None:
        return Check(
            name=name,
            outcome="skip",
            detail="cluster.identity_mapping not set: the endpoint's mapping is not checked",
            fix="point cluster.endpoint_dir at the files " + RENDER + " wrote (or "
            "cluster.identity_mapping at a readable copy of the endpoint's identity_mapping.json)",
        )
    if client_id is None:
        return Check(
            name=name,
            outcome="skip",
            detail="the agent's client is not known (set globus.agent_client_id, or run doctor "
            "with the agent's environment: `sudo beamflow-as-agent doctor`)",
        )
    username = idmap.client_identity(client_id)
    try:
        accounts = idmap.mapped_accounts(path, username, client_id)
    except idmap.MappingError as exc:
        fix = "fix the file as the endpoint reads it (docs/deployment.md §4c)"
        return Check(name=name, outcome="fail", detail=str(exc), fix=fix)
    wanted = settings.cluster.service_account
    rule = json.dumps(idmap.client_rule(client_id, wanted or "<service account>"))
    if not accounts:
        return Check(
            name=name,
            outcome="fail",
            detail=f"{path} maps no local account to the agent's identity {username}: "
            "the endpoint would refuse every run the agent starts",
            fix=f"add the rule {rule} to the mappings in {path} (and on the endpoint)",
        )
    if wanted and accounts[0] != wanted:
        return Check(
            name=name,
            outcome="fail",
            detail=f"{path} maps {username} to {accounts[0]!r}, not the service account "
            f"{wanted!r} (cluster.service_account)",
            fix=f"put the rule {rule} first in the mappings of {path}",
        )
    return Check(name=name, outcome="ok", detail=f"{username} runs as {accounts[0]!r} ({path})")


def run_checks(settings: Settings, *, network: NetworkPolicy = INTERACTIVE) -> list[Check]:
    """Every check; never raises for a failed check."""
    checks = config_checks(settings)
    if not is_uuid(settings.globus.client_id):
        checks.append(
            Check(
                name="login",
                outcome="skip",
                detail="needs globus.client_id",
                fix="fill in globus.client_id first",
            )
        )
        return checks
    registry = reg.Registry(settings.registry_path, "globus")
    try:
        flow_entries = registry.entries("flow")
        function_entries = registry.entries("function")
    except reg.RegistryError as exc:
        checks.append(Check(name="registry", outcome="fail", detail=str(exc)))
        flow_entries, function_entries = {}, {}
    try:
        auth = GlobusAuth(settings, flow_ids=[e.id for e in flow_entries.values()], network=network)
    except RunBackendError as exc:
        checks.append(Check(name="token file", outcome="fail", detail=str(exc)))
        return checks
    with auth:
        checks.append(
            Check(name="token file", outcome="ok", detail=f"{auth.token_path} (mode 600)")
        )
        if not _login_checks(auth, checks):
            return checks
        offline = False

        def network_check(name: str, call: Callable[[], Check]) -> None:
            nonlocal offline
            if offline:
                checks.append(
                    Check(name=name, outcome="skip", detail="skipped: Globus is not reachable")
                )
                return
            try:
                checks.append(call())
            except LoginRequired as exc:
                checks.append(
                    Check(name=name, outcome="fail", detail=str(exc), fix="run `beamflow login`")
                )
            except RunBackendError as exc:
                if "cannot reach Globus" in str(exc):
                    offline = True
                checks.append(
                    Check(name=name, outcome="fail", detail=str(exc), fix=_network_fix(exc))
                )

        network_check("identity", lambda: _identity(auth))
        for side in ("beamline", "hpc"):
            coll = getattr(settings, side).collection_id
            if is_uuid(coll):
                network_check(f"{side} collection", lambda c=coll, s=side: _collection(auth, s, c))
        if is_uuid(settings.compute.endpoint_id):
            network_check("compute endpoint", lambda: _endpoint(auth, settings.compute.endpoint_id))
        _registered_checks(auth, checks, network_check, flow_entries, function_entries)
    return checks


def _network_fix(exc: RunBackendError) -> str:
    if "cannot reach Globus" in str(exc):
        return "check the network (DNS, proxy, firewall: HTTPS to *.globus.org)"
    return "see the message; `beamflow doctor` again once fixed"


def _login_checks(auth: GlobusAuth, checks: list[Check]) -> bool:
    if auth.is_service:
        checks.append(_client_login(auth))
        return checks[-1].outcome != "fail"
    tokens = auth.tokens()
    if not tokens:
        checks.append(
            Check(
                name="login",
                outcome="fail",
                detail=f"not logged in (no tokens in {auth.token_path})",
                fix="run `beamflow login`",
            )
        )
        return False
    warnings = expiry_warnings(tokens)
    stored = {t.resource_server: set(t.scopes) for t in tokens}
    missing = [
        rs
        for rs, scopes in auth.app.scope_requirements.items()
        if not {s.scope_string for s in scopes} <= stored.get(rs, set())
    ]
    if missing:
        checks.append(
            Check(
                name="login",
                outcome="fail",
                detail=f"logged in, but without consent for {', '.join(sorted(missing))}",
                fix="run `beamflow login` (new flows need a consent of their own)",
            )
        )
        return True
    refreshable = all(t.refreshable for t in tokens)
    soonest = min(t.expires_at for t in tokens)
    detail = (
        "logged in; tokens renew themselves (refresh tokens)"
        if refreshable
        else f"logged in; tokens expire {time.strftime('%Y-%m-%d %H:%M', time.localtime(soonest))}"
    )
    checks.append(
        Check(
            name="login",
            outcome="warn" if warnings else "ok",
            detail="; ".join([detail, *warnings]),
            fix="run `beamflow login`" if warnings else None,
        )
    )
    return True


def _client_login(auth: GlobusAuth) -> Check:
    """The agent's confidential client: the client-credentials grant, then the consents
    Globus Auth holds for the client identity (each flow's Transfer data access)."""
    who = f"{auth.client_id}@{CLIENT_DOMAIN}"
    try:
        with globus_errors("get the agent's tokens (client-credentials grant)"):
            auth.app.login(force=True)
        missing = auth.consent_gaps()
    except ClientSecretRejected as exc:
        return Check(name="login", outcome="fail", detail=str(exc), fix=ROTATION_FIX)
    except RunBackendError as exc:
        return Check(name="login", outcome="fail", detail=str(exc), fix=_network_fix(exc))
    if missing:
        return Check(name="login", outcome="fail", detail=auth.consent_gap_text(missing),
                     fix="an admin's task (logging in cannot help a client): see the detail; "
                     "docs/deployment.md, \"The agent's identity\"")  # fmt: skip
    trees = sum(1 for scopes in auth.app.scope_requirements.values() for s in scopes
                if s.dependencies)  # fmt: skip
    return Check(name="login", outcome="ok",
                 detail=f"confidential client {who}: tokens from the client secret; Auth "
                 f"holds its consents to all {trees} scope(s) with dependencies")  # fmt: skip


ROTATION_FIX = (
    "add a second secret to the client (app.globus.org/settings/developers), put it into "
    "/etc/beamflow/agent.env, restart beamflow-agent and beamflow-status, check with "
    "`sudo beamflow-as-agent doctor`, then delete the old secret (docs/deployment.md, "
    "\"Rotating the client secret\")"
)


def _identity(auth: GlobusAuth) -> Check:
    info = auth.userinfo()
    who = info.get("preferred_username") or info.get("sub")
    return Check(name="identity", outcome="ok", detail=f"{who} ({info.get('sub')})")


def _collection(auth: GlobusAuth, side: str, collection_id: str) -> Check:
    client = auth.client(globus_sdk.TransferClient)
    detail, kind = transfer.check_collection(client, collection_id)
    asked = collection_id in data_access_collections(auth.settings)
    if "guest" in kind.lower() and asked:
        return Check(
            name=f"{side} collection",
            outcome="warn",
            detail=f"{detail}; beamflow asks a data_access consent for it, which guest "
            "collections do not have (login may fail with 'unknown scope')",
            fix="list only mapped collections in globus.data_access_collections",
        )
    return Check(name=f"{side} collection", outcome="ok", detail=detail)


def _endpoint(auth: GlobusAuth, endpoint_id: str) -> Check:
    status = compute.endpoint_status(auth, endpoint_id)
    state = str(status.get("status", "unknown"))
    details = status.get("details") or {}
    workers = details.get("total_workers")
    extra = f", {workers} workers" if workers is not None else ""
    if state.lower() == "online":
        return Check(name="compute endpoint", outcome="ok", detail=f"online{extra}")
    return Check(
        name="compute endpoint",
        outcome="fail",
        detail=f"endpoint {endpoint_id} is {state}",
        fix="start it on the cluster's login node: `globus-compute-endpoint start <name>` "
        "(see deploy/README.md)",
    )


class _Words(NamedTuple):
    """What the doctor says of one kind of registered item."""

    missing: str
    present: str
    gone: str
    fix: str


_REGISTERED = {
    "function": _Words(
        missing="not registered with Globus Compute",
        present="{id}",
        gone="{id} is not known to Globus Compute",
        fix="run `beamflow register functions --backend globus`",
    ),
    "flow": _Words(
        missing="not deployed to Globus Flows",
        present="deployed: {id}",
        gone="{id} is gone from Globus Flows (or not shared with you)",
        fix="run `beamflow register flows --backend globus`, then `beamflow login`",
    ),
}


def _registered_checks(
    auth: GlobusAuth,
    checks: list[Check],
    network_check: Callable[[str, Callable[[], Check]], None],
    flow_entries: dict[str, reg.Entry],
    function_entries: dict[str, reg.Entry],
) -> None:
    """Every shipped function and flow: registered here, and still on the service."""
    flows_client = auth.client(globus_sdk.FlowsClient)
    kinds: list[tuple[str, list[str], dict[str, reg.Entry], Callable[[str], bool]]] = [
        ("function", reg.function_names(), function_entries,
         lambda fid: compute.function_exists(auth, fid)),
        ("flow", reg.flow_names(), flow_entries,
         lambda fid: gflows.flow_exists(flows_client, fid)),
    ]  # fmt: skip
    for kind, names, entries, exists in kinds:
        words = _REGISTERED[kind]
        for name in names:
            label = f"{kind} {name}"
            entry = entries.get(name)
            if entry is None:
                checks.append(Check(name=label, outcome="fail", detail=words.missing,
                                    fix=words.fix))  # fmt: skip
                continue

            def on_service(label: str = label, fid: str = entry.id, exists=exists,  # noqa: ANN001
                           words: _Words = words, kind: str = kind) -> Check:  # fmt: skip
                if kind == "flow":
                    return _flow_on_service(auth, flows_client, label, fid)
                if exists(fid):
                    return Check(name=label, outcome="ok", detail=words.present.format(id=fid))
                return Check(name=label, outcome="fail", detail=words.gone.format(id=fid),
                             fix=words.fix)  # fmt: skip

            network_check(label, on_service)


def _flow_on_service(
    auth: GlobusAuth, client: globus_sdk.FlowsClient, label: str, flow_id: str
) -> Check:
    """A deployed flow: still on the service, and startable by the agent's client."""
    words = _REGISTERED["flow"]
    doc = gflows.deployed_flow(client, flow_id)
    if doc is None:
        return Check(name=label, outcome="fail", detail=words.gone.format(id=flow_id),
                     fix=words.fix)  # fmt: skip
    present = words.present.format(id=flow_id)
    agent = agent_client_id(auth.settings)
    if agent is None:
        return Check(
            name=label, outcome="warn",
            detail=f"{present}; no agent client is known, so none is among its starters",
            fix="set globus.agent_client_id to the agent's confidential client id, then "
            "`beamflow register flows --backend globus`",
        )  # fmt: skip
    starters = doc.get("flow_starters")
    if isinstance(starters, list) and client_identity_urn(agent) not in starters:
        return Check(
            name=label, outcome="fail",
            detail=f"{present}, but the agent's client {agent} may not start it (its "
            f"starters: {', '.join(starters) or 'none but the owner'})",
            fix="`beamflow register flows --backend globus` (it sets the starters from "
            "[globus]); `--dry-run` first shows them",
        )  # fmt: skip
    return Check(name=label, outcome="ok", detail=f"{present}; the agent's client may start it")
