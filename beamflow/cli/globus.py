"""The Globus account tools: `beamflow login`, `logout`, `whoami` and `doctor` (whose
`--probe` runs on the local backend's engine when that backend is configured).

They use the Globus package's public API (``beamflow.globus``), imported inside each command:
the SDKs are not loaded for the commands that never talk to Globus.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from beamflow.cli.common import ConfigOption, JsonOption, console, fail, settings_from, warn
from beamflow.config import Settings
from beamflow.console import styled
from beamflow.runs.backend import RunBackendError

if TYPE_CHECKING:
    from beamflow.globus import GlobusAuth


def _auth(settings: Settings) -> GlobusAuth:
    from beamflow.globus import interactive_auth

    try:
        return interactive_auth(settings)
    except RunBackendError as exc:
        fail(str(exc))


def login(
    force: Annotated[
        bool, typer.Option("--force", help="Log in again even if the stored tokens suffice.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Log in to Globus: prints a URL, reads the code back. Grants Transfer, Flows, Compute
    and every registered flow (run it again after `register flows`)."""
    settings = settings_from(config, workspace=True)
    with _auth(settings) as auth:
        try:
            ran = auth.login(force=force)
        except RunBackendError as exc:
            fail(str(exc))
        if auth.is_service:
            console.print(Text.assemble(styled("tokens obtained", "green"),
                                        f" for client {settings.globus.client_id}"))
        elif not ran:
            console.print("already logged in with every consent needed (--force to redo)")
        else:
            console.print(Text.assemble(styled("logged in", "green"),
                                        f"; tokens stored in {auth.token_path}"))


def logout(config: ConfigOption = None) -> None:
    """Revoke the stored Globus tokens and delete them from the token file."""
    settings = settings_from(config, workspace=True)
    with _auth(settings) as auth:
        removed, problems = auth.logout()
    if not removed:
        console.print("not logged in: no tokens to remove")
        return
    console.print(f"logged out: tokens for {removed} services removed from {auth.token_path}")
    if problems:
        warn(f"could not revoke them with Globus Auth ({problems[0]}); they are deleted "
             "here, and can be revoked at https://app.globus.org/account/consents")


def whoami(as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Who is logged in to Globus, and until when the tokens are good."""
    from beamflow.globus import expiry_warnings

    settings = settings_from(config, workspace=True)
    with _auth(settings) as auth:
        try:
            info = auth.userinfo()
        except RunBackendError as exc:
            fail(str(exc))
        tokens = auth.tokens()
    if as_json:
        print(json.dumps({**info, "tokens": [t.__dict__ for t in tokens]}))
        return
    console.print(styled(str(info.get("name") or info.get("preferred_username")), "bold"))
    console.print(f"  username  {info.get('preferred_username', '-')}")
    console.print(f"  email     {info.get('email') or '-'}")
    console.print(f"  identity  {info.get('sub')}")
    linked = [i.get("username") for i in info.get("identity_set", []) if i.get("username")]
    if len(linked) > 1:
        console.print(f"  linked    {', '.join(linked)}")
    for t in tokens:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.expires_at))
        renew = "renews itself" if t.refreshable else f"expires {until}"
        console.print(f"  token     {t.resource_server}: {renew}")
    for warning in expiry_warnings(tokens):
        warn(warning)


def doctor(
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Also run a small task on a compute worker (Globus Compute, or the local "
            "engine) and check its Python, Parsl, globus-compute-endpoint and beamflow "
            "versions, user, GPUs and scratch directory.",
        ),
    ] = False,
    probe_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for the probe (batch queues).")
    ] = 600.0,
    as_agent: Annotated[
        bool,
        typer.Option(
            "--as-agent",
            help="With --probe (Globus): probe as the agent's final runs go: its client "
            "credentials (run it as `sudo beamflow-as-agent doctor --probe --as-agent`), the "
            "[cluster.final] resources, and the worker must run as the mapped service account "
            "and see the GPUs.",
        ),
    ] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Check the setup and say what to fix: on Globus the ids, the agent's identity, login
    and consents, collections, endpoint (and its files), flows; on the local backend the
    workspace. With --probe, a task on a compute worker too."""
    settings = settings_from(config)
    if as_agent and not probe:
        fail("--as-agent goes with --probe: `beamflow doctor --probe --as-agent`", code=2)
    if settings.backend == "local":
        if as_agent:
            fail("--as-agent probes as the Globus agent; this workspace uses the local "
                 "backend", code=2)  # fmt: skip
        from beamflow.local import check_local, check_local_workers

        checks = check_local(settings)
        if probe:
            checks += check_local_workers(settings, timeout=probe_timeout)
    else:
        from beamflow.globus import check_endpoint_workers, run_checks

        checks = run_checks(settings)
        if probe:
            checks += check_endpoint_workers(settings, timeout=probe_timeout, as_agent=as_agent)
    failed = [c for c in checks if c.outcome == "fail"]
    if as_json:
        print(json.dumps([c.model_dump() for c in checks]))
    else:
        mark = {
            "ok": styled("  ok", "green"),
            "warn": styled("warn", "yellow"),
            "fail": styled("FAIL", "red"),
            "skip": styled("skip", "dim"),
        }
        for c in checks:
            console.print(Text.assemble(mark[c.outcome], f"  {c.name}: {c.detail}"),
                          highlight=False)
            if c.fix and c.outcome in ("fail", "warn"):
                console.print(f"      fix: {c.fix}", highlight=False)
        summary = f"{len(failed)} problem(s)" if failed else "everything needed is in place"
        console.print(styled(summary, "red" if failed else "green"))
    if failed:
        raise typer.Exit(1)
