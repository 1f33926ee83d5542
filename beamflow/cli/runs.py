"""`beamflow runs list|show|start|retry|cancel`: the run store, and runs started, followed,
retried and cancelled through the shared run path (beamflow.runs.lifecycle) on the configured
backend."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from beamflow.cli.common import (
    HELP,
    App,
    ConfigOption,
    JsonOption,
    RunProgress,
    console,
    data_table,
    duration,
    err_console,
    fail,
    open_run_backend,
    open_store,
    settings_from,
    warn,
)
from beamflow.config import Settings
from beamflow.console import styled, styled_status, verdict_text
from beamflow.error_kinds import ErrorKind
from beamflow.runs.backend import RunBackend, RunBackendError
from beamflow.runs.failures import Failure
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store

app = App(help="List, inspect, start, retry and cancel runs.", **HELP)


@app.command("list")
def runs_list(
    status: Annotated[
        str | None, typer.Option(help="Only runs with this status (e.g. FAILED).")
    ] = None,
    scan: Annotated[
        str | None, typer.Option(help="Only scans whose name or path contains this.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 50,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Runs, newest first."""
    if status is not None and status.upper() not in RunStatus.__members__:
        fail(f"--status must be one of {', '.join(RunStatus)}, not {status!r}", code=2)
    store = open_store(settings_from(config, workspace=True))
    runs = store.list_runs(status=status, scan=scan, limit=limit)
    names = store.display_names(runs)
    if as_json:
        print(json.dumps([{**r.model_dump(mode="json"), "display_name": names[r.id]}
                          for r in runs]))  # fmt: skip
        return
    table = data_table(f"runs ({store.count_runs(status=status, scan=scan)} in all)")
    for column in ("id", "scan", "status", "verdict", "step", "created", "duration", "scan path",
                   "error"):
        table.add_column(column, overflow="fold")
    for r in runs:
        table.add_row(
            r.id[:8],
            names[r.id],
            styled_status(r.status),
            verdict_text(r.verdict),
            r.current_step or "-",
            _clock(r.created_at),
            duration(r.duration),
            r.scan_path,
            r.error or "",
        )
    console.print(table)


def _find_run(store: Store, run_id: str) -> Run:
    run = store.get_run(run_id)
    if run is None:  # accept the short id the table shows
        matches = [r for r in store.list_runs(limit=None) if r.id.startswith(run_id)]
        if len(matches) == 1:
            run = matches[0]
        elif len(matches) > 1:
            fail(f"run id {run_id!r} is ambiguous ({len(matches)} runs start with it)")
    if run is None:
        fail(f"no run {run_id!r} in {store.path}")
    return run


def _refreshed(settings: Settings, store: Store, run: Run) -> Run:
    """``run`` brought up to date from its backend; as it was, with a warning, where the
    backend cannot say."""
    from beamflow.run_backends import get_run_backend
    from beamflow.runs.lifecycle import sync_run

    try:
        backend = get_run_backend(settings)
        try:
            return sync_run(store, backend, run)
        finally:
            backend.close()
    except RunBackendError as exc:
        warn(f"could not refresh from {run.backend}: {exc}")
        return run


@app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """One run: status, steps with timings, error, previews, product.

    An unfinished run is brought up to date from its backend first (nobody else may be
    following it, e.g. a Globus run started with `runs start` without --wait)."""
    settings = settings_from(config, workspace=True)
    store = open_store(settings)
    run = _find_run(store, run_id)
    if not run.status.finished and run.backend_run_id and run.backend == settings.backend:
        run = _refreshed(settings, store, run)
    steps = store.steps(run.id)
    attempts = store.attempts(run)
    name = store.display_names([run])[run.id]
    if as_json:
        data = {**run.model_dump(mode="json"), "display_name": name}
        data["steps"] = [s.model_dump(mode="json") for s in steps]
        data["attempts"] = [a.model_dump(mode="json") for a in attempts]
        print(json.dumps(data))
        return
    out = {"highlight": False, "soft_wrap": True}  # names and paths stay whole
    console.print(Text.assemble((name, "bold"), f"  run {run.id}"), **out)
    console.print(f"  scan      {run.scan_path}", **out)
    console.print(Text.assemble("  status    ", styled_status(run.status)), **out)
    _print_verdict(run, every_reason=True)
    console.print(f"  flow      {run.flow} on {run.backend}", **out)
    console.print(f"  duration  {duration(run.duration)}", **out)
    if run.iteration is not None:
        console.print(f"  progress  iteration {run.iteration} of {run.iterations_total or '?'}",
                      **out)
    if run.truth_nrmse is not None:
        truth = run.result.get("truth") or {}
        console.print(f"  vs truth  NRMSE {run.truth_nrmse:.3f} (complex, against "
                      f"{truth.get('ground_truth', 'the ground truth')})", **out)
    if run.error:
        console.print(Text.assemble("  error     ", styled(run.error, "red")), **out)
        kind = run.error_kind or "unknown kind"
        console.print(f"  failed in {run.error_step or 'an unknown step'} ({kind})", **out)
        if "failure" in run.result:  # the whole chain, as the backend told it
            failure = Failure.model_validate(run.result["failure"])
            console.print(f"  chain     {failure.chain}", **out)
        if run.retried_by:
            console.print(f"  retried   as run {run.retried_by}", **out)
        elif run.error_kind == ErrorKind.BAD_INPUT:
            console.print("  retry     would not help: the input is at fault", **out)
    if run.product:
        console.print(f"  product   {run.product}", **out)
    for p in run.previews:
        console.print(f"  preview   {p}", **out)
    if steps:
        table = data_table("steps")
        for column in ("step", "status", "duration"):
            table.add_column(column, overflow="fold")
        for s in steps:
            table.add_row(s.name, s.status, duration(s.duration))
        console.print(table)
    if len(attempts) > 1:  # retried in its own record: how each attempt ended
        table = data_table("attempts")
        for column in ("#", "started", "ended", "status", "step", "kind", "error"):
            table.add_column(column, overflow="fold")
        for a in attempts:
            table.add_row(str(a.attempt), _clock(a.started_at), _clock(a.finished_at),
                          styled_status(a.status), a.error_step or "-", a.error_kind or "-",
                          a.error or "")  # fmt: skip
        console.print(table)


def _clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _print_verdict(run: Run, *, every_reason: bool) -> None:
    """The verdict line of a run that has one: ``trusted``, or ``SUSPECT`` and its first
    reason (``every_reason``: each on a line of its own; else how to see the others)."""
    if run.verdict is None:
        return
    out = {"highlight": False, "soft_wrap": True}
    reasons = run.verdict_reasons
    line = Text.assemble("  verdict   ", verdict_text(run.verdict))
    if run.verdict == "suspect" and reasons:
        line.append(f": {reasons[0]}")
    console.print(line, **out)
    if every_reason:
        for reason in reasons[1:]:
            console.print(f"            {reason}", **out)
    elif len(reasons) > 1:
        more = len(reasons) - 1
        console.print(f"            ({more} more reason{'s' if more > 1 else ''}: "
                      f"`beamflow runs show {run.id[:8]}`)", **out)


ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param", "-p", help="Reconstruction parameter KEY=VALUE (repeatable), e.g. iterations=50."
    ),
]
WaitOption = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Follow the run until it ends; exit 1 if it fails.")
]
_STRICT_NEEDS_WAIT = "--strict needs --wait: the verdict comes when the run has ended"
StrictOption = Annotated[
    bool,
    typer.Option("--strict", help="With --wait: exit with status 2 when the run succeeded but "
                                  "its result is suspect (as `beamflow reconstruct --strict`)."),
]


def _follow(settings: Settings, store: Store, backend: RunBackend, run: Run) -> Run:
    """Follow ``run`` with its progress on stderr until it ends; Ctrl-C cancels it."""
    from beamflow.runs.lifecycle import cancel_run, follow_run

    with RunProgress(run) as progress:
        try:
            return follow_run(store, backend, run, poll_seconds=0.5, max_poll_seconds=5.0,
                              on_update=progress.update)  # fmt: skip
        except KeyboardInterrupt:
            progress.stop()
            err_console.print(f"interrupted: cancelling run {run.id}")
            run = cancel_run(settings, run.id, store=store, backend=backend)
            follow_run(store, backend, run, poll_seconds=0.5, timeout=30)
            raise typer.Exit(130) from None


def _started(start: Callable[[], Run]) -> Run:
    """The run ``start`` makes; input it refuses ends the command (exit 1, the reason)."""
    from beamflow.runs.request import RunInputError

    try:
        return start()
    except RunInputError as exc:
        fail(str(exc))


def _follow_and_report(settings: Settings, store: Store, backend: RunBackend, run: Run, *,
                       wait: bool, as_json: bool, strict: bool) -> None:
    """The end of `runs start` and `runs retry`: a run that started is followed until it ends
    when asked (``wait``) or when it is local, then reported (see :func:`_report`)."""
    if run.status != RunStatus.FAILED and (wait or backend.name == "local"):
        if not wait:  # a local run lives in the process that started it: leaving would lose it
            err_console.print("the local backend runs flows inside this process: following "
                              "the run (Ctrl-C cancels it)")
        run = _follow(settings, store, backend, run)
    _report(store, run, as_json, strict)


def _report(store: Store, run: Run, as_json: bool, strict: bool = False) -> None:
    """Print how the run ended (or stands); exit 1 if it failed, 2 if ``strict`` and its
    result is suspect."""
    if as_json:
        data = run.model_dump(mode="json")
        data["steps"] = [s.model_dump(mode="json") for s in store.steps(run.id)]
        print(json.dumps(data))
    else:
        out = {"highlight": False, "soft_wrap": True}  # paths stay whole, one per line
        console.print(Text.assemble(f"run {run.id}  ", styled_status(run.status),
                                    f"  {run.scan_name}"), **out)
        _print_verdict(run, every_reason=False)
        if run.backend_run_id:
            console.print(f"  {run.backend} run  {run.backend_run_id}", **out)
        for s in store.steps(run.id):
            console.print(f"  step      {s.name}: {s.status} ({duration(s.duration)})", **out)
        if run.product:
            console.print(f"  product   {run.product}", **out)
        for p in run.previews:
            console.print(f"  preview   {p}", **out)
    if run.status == RunStatus.FAILED:
        fail(f"{run.error} (run {run.id} failed in {run.error_step or 'an unknown step'}; "
             f"`beamflow runs show {run.id[:8]}` has the details)")
    if strict and run.verdict == "suspect":
        raise typer.Exit(2)


@app.command("start")
def runs_start(
    scan: Annotated[Path, typer.Argument(help="Scan directory, *_master.h5 or .cxi file.")],
    wait: WaitOption = False,
    strict: StrictOption = False,
    param: ParamOption = None,
    flow: Annotated[
        str, typer.Option(help="ptycho_reconstruct, or ptycho_shared_fs (no transfers).")
    ] = "ptycho_reconstruct",
    label: Annotated[str | None, typer.Option(help="Run label (default: scan and run).")] = None,
    direct: Annotated[
        bool,
        typer.Option(
            "--direct",
            help="Globus: submit the reconstruct function to the compute endpoint without a "
            "flow or transfers (shared file system) and wait for it.",
        ),
    ] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Start one flow run of SCAN through the configured backend and record it."""
    from beamflow.runs.lifecycle import run_direct, start_scan_run
    from beamflow.runs.request import RunInputError, RunRequest, parse_param

    settings = settings_from(config, workspace=True)
    try:
        params = dict(parse_param(p) for p in param or [])
    except RunInputError as exc:
        fail(str(exc), code=2)
    if direct and settings.backend != "globus":
        fail("--direct submits to a Globus Compute endpoint: it needs backend = \"globus\" "
             "(the local backend runs the function in-process anyway)", code=2)  # fmt: skip
    if strict and not (wait or direct or settings.backend == "local"):
        fail(_STRICT_NEEDS_WAIT, code=2)
    request = RunRequest(scan_path=scan, params=params, label=label, flow=flow)
    store = open_store(settings)
    with closing(open_run_backend(settings)) as backend:
        if direct:  # submitted and waited for: the run has ended
            _report(store, _started(lambda: run_direct(settings, store, backend, request)),
                    as_json, strict)
        else:
            run = _started(lambda: start_scan_run(settings, store, backend, request))
            _follow_and_report(settings, store, backend, run, wait=wait, as_json=as_json,
                               strict=strict)  # fmt: skip


@app.command("retry")
def runs_retry(
    run_id: Annotated[str, typer.Argument(help="A failed or cancelled run (id or prefix).")],
    wait: WaitOption = False,
    strict: StrictOption = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Start a new attempt of a failed run (same scan, flow and parameters; it continues from
    the scan's checkpoints)."""
    from beamflow.runs.lifecycle import retry_run

    settings = settings_from(config, workspace=True)
    if strict and not (wait or settings.backend == "local"):
        fail(_STRICT_NEEDS_WAIT, code=2)
    store = open_store(settings)
    old = _find_run(store, run_id)
    with closing(open_run_backend(settings)) as backend:
        run = _started(lambda: retry_run(settings, old.id, store=store, backend=backend))
        err_console.print(f"run {run.id} retries {old.id} (attempt {run.attempt})")
        _follow_and_report(settings, store, backend, run, wait=wait, as_json=as_json,
                           strict=strict)  # fmt: skip


@app.command("cancel")
def runs_cancel(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the backend to stop it.")
    ] = 30.0,
    config: ConfigOption = None,
) -> None:
    """Cancel a queued or running run."""
    from beamflow.runs.lifecycle import cancel_run, follow_run

    settings = settings_from(config, workspace=True)
    store = open_store(settings)
    run = _find_run(store, run_id)
    if run.status.finished:
        console.print(f"run {run.id} already ended: {run.status}")
        return
    backend = open_run_backend(settings)
    try:
        run = cancel_run(settings, run.id, store=store, backend=backend)
        if not run.status.finished:
            run = follow_run(store, backend, run, poll_seconds=0.5, timeout=timeout)
    except RunBackendError as exc:
        fail(f"cannot cancel run {run.id}: {exc}")
    finally:
        backend.close()
    if run.status.finished:
        console.print(f"run {run.id}: {run.status}")
    else:
        console.print(f"run {run.id}: cancel requested; the backend has not stopped it yet")

