"""The `beamflow` command line.

Exit codes: 0 ok, 1 the work failed (bad input, a failed run, bad configuration), 2 usage.
Every command takes ``--config FILE`` (default ./beamflow.toml, then
~/.config/beamflow/beamflow.toml); BEAMFLOW_* environment variables override the file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from beamflow import __version__
from beamflow.config import (
    CONFIG_NAME,
    RECONSTRUCTION_DEFAULTS,
    ConfigError,
    Settings,
    globus_workspace_toml,
    load_config,
    local_workspace_toml,
)
from beamflow.console import styled_status
from beamflow.store import RunStatus, Store

# Plain (click) help, not rich panels: rich cuts option names ("--checkpoint-e…") to fit
# its table at 80 columns; click prints them whole and wraps the descriptions.
_HELP = {"no_args_is_help": True, "rich_markup_mode": None}
app = typer.Typer(
    name="beamflow",
    help="Turn a ptychography beamline into a live analysis instrument.",
    add_completion=False,
    pretty_exceptions_enable=False,
    **_HELP,
)
runs_app = typer.Typer(help="List, inspect, start, retry and cancel runs.", **_HELP)
flows_app = typer.Typer(help="Validate and try flow definitions offline.", **_HELP)
register_app = typer.Typer(help="Register compute functions and flows (idempotent).", **_HELP)
app.add_typer(runs_app, name="runs")
app.add_typer(flows_app, name="flows")
app.add_typer(register_app, name="register")

# Where the output is not a terminal (a pipe, a log file, a CI job) lines are never
# wrapped or cut at 80 columns: names and paths stay whole, one per line, for grep and for
# people reading logs. A terminal wraps what does not fit (tables fold, never "…").
_WIDE = 10_000


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, width=_WIDE, soft_wrap=True)


def data_table(title: str | None = None) -> Table:
    """A table whose cells wrap (fold) instead of ending in "…"."""
    return Table(title=title, title_justify="left")


console = make_console()
err_console = make_console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"Config file (default ./{CONFIG_NAME}, then ~/.config/beamflow/{CONFIG_NAME}).",
        dir_okay=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a clear error (no traceback) and leave with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def settings_from(config: Path | None) -> Settings:
    try:
        return load_config(config)
    except ConfigError as exc:
        fail(str(exc))


def open_store(settings: Settings) -> Store:
    return Store(settings.store_path)


def _version(value: bool) -> None:
    if value:
        console.print(f"beamflow {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
) -> None:
    """beamflow: edge agent, flows, GPU ptychography and a status page."""


# -- init ------------------------------------------------------------------------------------
@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Workspace directory to create.")],
    backend: Annotated[
        str, typer.Option(help="local (works now, offline) or globus (a template to fill in).")
    ] = "local",
    force: Annotated[bool, typer.Option(help="Overwrite an existing beamflow.toml.")] = False,
    config: ConfigOption = None,
) -> None:
    """Create a workspace: beamflow.toml, beamline/{detector,previews}, hpc/, state/."""
    if backend not in ("local", "globus"):
        fail(f"--backend must be 'local' or 'globus', not {backend!r}", code=2)
    target = directory / CONFIG_NAME
    if target.exists() and not force:
        fail(f"{target} exists already (use --force to overwrite)")
    for sub in ("beamline/detector", "beamline/previews", "hpc", "state"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    text = local_workspace_toml() if backend == "local" else globus_workspace_toml()
    target.write_text(text)
    if backend == "local":
        settings_from(target)  # what init writes must load
    console.print(f"[green]workspace ready:[/] {directory.resolve()}")
    console.print(f"  config      {target}")
    console.print(f"  detector    {directory / 'beamline/detector'}  (the agent watches this)")
    console.print(f"  previews    {directory / 'beamline/previews'}")
    if backend == "globus":
        console.print("  next: fill in the ids marked FILL, then `beamflow login`.")
    else:
        console.print(
            f"  next: cd {directory} && beamflow register functions && beamflow register flows"
        )


# -- simulate --------------------------------------------------------------------------------
@app.command()
def simulate(
    out_dir: Annotated[
        Path | None,
        typer.Argument(
            help="Directory the detector writes into (default: config beamline.detector_dir).",
            file_okay=False,
        ),
    ] = None,
    name: Annotated[
        str, typer.Option(help="Scan name: writes OUT_DIR/NAME/NAME_master.h5, data files.")
    ] = ...,  # type: ignore[assignment]
    positions: Annotated[int, typer.Option(min=1, help="Scan positions (frames).")] = 200,
    probe_size: Annotated[int, typer.Option(min=8, help="Frame / probe size in pixels.")] = 64,
    photons: Annotated[float, typer.Option(min=1, help="Mean photons per frame.")] = 1e6,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same files).")] = 0,
    frames_per_file: Annotated[int, typer.Option(min=1, help="Frames per data file.")] = 50,
    rate: Annotated[
        float | None, typer.Option(min=0.001, help="Frames per second (default: at once).")
    ] = None,
    overlap: Annotated[
        float, typer.Option(min=0.0, max=0.95, help="Linear probe overlap of neighbours.")
    ] = 0.75,
    pattern: Annotated[str, typer.Option(help="spiral (Fermat) or raster.")] = "spiral",
    stop_after: Annotated[
        int | None, typer.Option(min=0, help="Abort the scan after this many frames.")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing scan of that name.")] = False,
    propagation: Annotated[
        str, typer.Option(help="far-field, or near-field (a PETRA-like cone beam: holograms).")
    ] = "far-field",
    config: ConfigOption = None,
) -> None:
    """Simulate a ptychography scan and write it as the detector would, file by file.

    Writes OUT_DIR/NAME/ground_truth.h5 and NAME_master.h5 first,
    then NAME_data_NNNNNN.h5 files as the frames are acquired at --rate.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from beamflow.simulate import simulate_scan

    if pattern not in ("spiral", "raster"):
        fail(f"--pattern must be 'spiral' or 'raster', not {pattern!r}", code=2)
    if propagation not in ("far-field", "near-field"):
        fail(f"--propagation must be 'far-field' or 'near-field', not {propagation!r}", code=2)
    if out_dir is None:
        out_dir = settings_from(config).beamline.detector_dir
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=err_console, transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task(f"simulating {name}", total=positions)
        try:
            master = simulate_scan(
                out_dir, name, positions=positions, probe_size=probe_size, photons=photons,
                seed=seed, frames_per_file=frames_per_file, rate_hz=rate, overlap=overlap,
                pattern=pattern, stop_after=stop_after, overwrite=overwrite,
                propagation=propagation,
                progress=lambda done, total: bar.update(task, completed=done),
            )  # fmt: skip
        except (FileExistsError, ValueError, OSError) as exc:
            fail(str(exc))
    console.print(f"[green]scan written:[/] {master}")
    console.print(f"  ground truth  {master.parent / 'ground_truth.h5'}")


# -- reconstruct -----------------------------------------------------------------------------
@app.command()
def reconstruct(
    scan: Annotated[
        Path, typer.Argument(help="Detector master file, scan directory or .cxi file.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory (product, previews, checkpoints).")
    ] = ...,  # type: ignore[assignment]
    algorithm: Annotated[
        str | None, typer.Option(help="rpie, epie, dm or lsqml (default: config).")
    ] = None,
    iterations: Annotated[
        int | None,
        typer.Option(min=0, help="Iterations over the current frames (default: config)."),
    ] = None,
    batch: Annotated[int | None, typer.Option(min=1, help="Positions per mini-batch.")] = None,
    probe_modes: Annotated[int | None, typer.Option(min=1, help="Incoherent probe modes.")] = None,
    probe: Annotated[
        Path | None, typer.Option(help="Initial probe: .npy (complex) or a product .h5.")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (default: config).")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the batch order.")] = 0,
    propagation: Annotated[
        str | None,
        typer.Option(help="far-field or near-field (default: the scan file's, else config, "
                          "else far-field)."),
    ] = None,
    focus_distance: Annotated[
        float | None,
        typer.Option(min=0.0, help="Near field, cone beam: focus-to-sample distance z1 in "
                                   "metres (Fresnel scaling; default: scan file, config)."),
    ] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(min=0, help="Checkpoint to DIR/checkpoints every N iterations.")
    ] = None,
    checkpoint_seconds: Annotated[
        float | None, typer.Option(min=0.001, help="... and/or every S seconds.")
    ] = None,
    l1_dir: Annotated[
        Path | None,
        typer.Option(help="Node-local dir for frequent L1 checkpoints (or hpc.node_local_dir, "
                          "$BEAMFLOW_CHECKPOINT_L1_DIR)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from a compatible checkpoint in DIR if there is one.")
    ] = True,
    max_frames: Annotated[int | None, typer.Option(min=1, help="Use at most N frames.")] = None,
    allow_partial: Annotated[
        bool, typer.Option(help="Use the frames written so far of a scan still being acquired.")
    ] = False,
    preview_every: Annotated[
        int | None, typer.Option(min=0, help="Refresh previews every N iterations (0: at end).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line (summary).")] = False,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "WARNING",
    config: ConfigOption = None,
) -> None:
    """Reconstruct a scan: DIR/product.h5, DIR/previews/*.png, DIR/checkpoints/.

    A compatible checkpoint in DIR is resumed (also with more frames of the same scan); an
    incompatible one is refused unless --no-resume. SIGTERM saves a checkpoint and exits.
    """
    import logging

    from pydantic import ValidationError
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from beamflow.checkpoint import IncompatibleCheckpoint
    from beamflow.formats import ScanFormatError
    from beamflow.ptycho.backend import BackendError
    from beamflow.reconstruct import (
        ReconstructError,
        ReconstructJob,
        plain_words,
        run_reconstruction,
    )

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    rc = settings_from(config).reconstruction
    node_local = settings_from(config).hpc.node_local_dir
    try:
        job = ReconstructJob(
            scan=scan, out=out, algorithm=algorithm or rc.algorithm,
            iterations=rc.iterations if iterations is None else iterations,
            batch=batch if batch is not None else rc.batch,
            probe_modes=probe_modes or rc.probe_modes, seed=seed, probe=probe,
            device=device or rc.device,
            checkpoint_every=rc.checkpoint_every if checkpoint_every is None else checkpoint_every,
            checkpoint_seconds=checkpoint_seconds, l1_dir=l1_dir or node_local, resume=resume,
            max_frames=max_frames, allow_partial=allow_partial,
            preview_every=rc.preview_every if preview_every is None else preview_every,
            propagation=propagation or rc.propagation,
            focus_distance_m=focus_distance if focus_distance is not None
            else rc.focus_distance_m,
        )  # fmt: skip
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'] if x != 'params') or 'value'}: {e['msg']}"
            for e in exc.errors()
        )
        fail(f"invalid reconstruction settings: {details}", code=2)

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=err_console, disable=as_json, transient=False,
    )  # fmt: skip
    task = bar.add_task(f"{job.params.algorithm} {scan.name}", total=None, loss="-")

    def progress(done: int, total: int, loss: float | None) -> None:
        if not bar.live.is_started:  # only once the scan has loaded: errors print cleanly
            bar.start()
        bar.update(task, completed=done, total=total,
                   loss="-" if loss is None else f"{loss:.4g}")

    try:
        summary = run_reconstruction(job, progress=progress)
    except (ScanFormatError, IncompatibleCheckpoint, ReconstructError, BackendError) as exc:
        fail(str(exc))
    except OSError as exc:  # name the file the system refused, not the scan
        where = exc.filename if exc.filename is not None else out
        fail(f"{where}: {exc.strerror or exc}")
    except (ValueError, FloatingPointError) as exc:
        fail(f"{scan}: {plain_words(str(exc))}")
    finally:
        if bar.live.is_started:  # a bar never shown would still print an empty line
            bar.stop()
    if as_json:
        print(json.dumps(summary.model_dump(mode="json")))
        return
    spi = summary.seconds_per_iteration
    resumed = summary.resumed_from_iteration
    console.print(f"[green]reconstructed[/] {scan} ({summary.n_frames} frames) on {summary.device}")
    console.print(f"  iterations  {summary.iterations}"
                  + (f" (resumed from {resumed})" if resumed is not None else "")
                  + (f", {spi * 1e3:.1f} ms each" if spi else ""))
    if summary.final_loss is not None:
        console.print(f"  final loss  {summary.final_loss:.4g}")
    console.print(f"  model       {summary.propagation}, object pixel "
                  f"{summary.object_pixel_size_m * 1e9:.4g} nm")
    if summary.verdict == "trusted":
        console.print("  verdict     [green]trusted[/]")
    else:
        console.print("  verdict     [bold red]SUSPECT[/]")
        for reason in summary.verdict_reasons:
            console.print(f"    - {reason}", highlight=False)
    console.print(f"  product     {summary.product}")
    for p in summary.previews:
        console.print(f"  preview     {p}")
    for e in summary.checkpoint_errors[:3]:
        err_console.print(f"[yellow]warning:[/] {e}", highlight=False)


@app.command()
def previews(
    checkpoints: Annotated[
        list[Path],
        typer.Argument(help="Checkpoint directories (e.g. RUN/checkpoints and the L1 dir)."),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the PNGs.")] = ...,  # type: ignore[assignment]
) -> None:
    """Previews of the newest verified checkpoint, while a reconstruction runs or after it.

    Safe at any moment: a checkpoint is read only once its sha256 verifies, never a file
    being written. Exit 1 with a message when no checkpoint verifies yet.
    """
    from beamflow.checkpoint import CorruptCheckpoint
    from beamflow.reconstruct import ReconstructError, previews_from_checkpoint

    missing = [str(d) for d in checkpoints if not d.is_dir()]
    if missing:
        fail(f"not a directory: {', '.join(missing)}")
    try:
        files = previews_from_checkpoint(list(checkpoints), out)
    except (ReconstructError, CorruptCheckpoint, OSError, ValueError) as exc:
        fail(str(exc))
    if files is None:
        fail(f"no verified checkpoint yet in {', '.join(str(d) for d in checkpoints)}")
    for p in files.values():
        console.print(f"  preview     {p}")


# -- runs ------------------------------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


@runs_app.command("list")
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
    store = open_store(settings_from(config))
    runs = store.list_runs(status=status, scan=scan, limit=limit)
    names = store.display_names(runs)
    if as_json:
        print(json.dumps([{**r.model_dump(mode="json"), "display_name": names[r.id]}
                          for r in runs]))  # fmt: skip
        return
    table = data_table(f"runs ({store.count_runs(status=status, scan=scan)} in all)")
    for column in ("id", "scan", "status", "step", "created", "duration", "scan path", "error"):
        table.add_column(column, overflow="fold")
    for r in runs:
        table.add_row(
            r.id[:8],
            names[r.id],
            styled_status(r.status),
            r.current_step or "-",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at)),
            _duration(r.duration),
            r.scan_path or "-",
            r.error or "",
        )
    console.print(table)


def _find_run(store: Store, run_id: str):  # noqa: ANN202 - Run
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


@runs_app.command("show")
def runs_show(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """One run: status, steps with timings, error, previews, product.

    An unfinished run is brought up to date from its backend first (nobody else may be
    following it, e.g. a Globus run started with `runs start` without --wait)."""
    settings = settings_from(config)
    store = open_store(settings)
    run = _find_run(store, run_id)
    if not run.status.finished and run.backend_run_id and run.backend == settings.backend:
        from beamflow.backend import BackendError
        from beamflow.runs import get_backend, sync_run

        backend = get_backend(settings)
        try:
            run = sync_run(store, backend, run)
        except BackendError as exc:
            err_console.print(f"[yellow]warning:[/] could not refresh from {run.backend}: {exc}")
        finally:
            backend.close()
    steps = store.steps(run.id)
    name = store.display_names([run])[run.id]
    if as_json:
        data = {**run.model_dump(mode="json"), "display_name": name}
        data["steps"] = [s.model_dump(mode="json") for s in steps]
        print(json.dumps(data))
        return
    out = {"highlight": False, "soft_wrap": True}  # names and paths stay whole
    console.print(f"[bold]{escape(name)}[/]  run {run.id}", **out)
    console.print(f"  scan      {escape(run.scan_path or run.scan)}", **out)
    console.print(f"  status    {styled_status(run.status)}", **out)
    console.print(f"  flow      {run.flow} on {run.backend}", **out)
    console.print(f"  duration  {_duration(run.duration)}", **out)
    if run.iteration is not None:
        console.print(f"  progress  iteration {run.iteration} of {run.iterations_total or '?'}",
                      **out)
    truth = run.result.get("truth") if isinstance(run.result, dict) else None
    if isinstance(truth, dict) and truth.get("nrmse") is not None:
        console.print(f"  vs truth  NRMSE {truth['nrmse']:.3f} (complex, against "
                      f"{escape(str(truth.get('ground_truth', 'the ground truth')))})", **out)
    if run.error:
        console.print(f"  error     [red]{escape(run.error_step or '')}: {escape(run.error)}[/]",
                      **out)
    if run.product:
        console.print(f"  product   {escape(run.product)}", **out)
    for p in run.previews:
        console.print(f"  preview   {escape(p)}", **out)
    if steps:
        table = data_table("steps")
        for column in ("step", "status", "duration"):
            table.add_column(column, overflow="fold")
        for s in steps:
            table.add_row(s.name, s.status, _duration(s.duration))
        console.print(table)


# -- runs start | retry | cancel (the shared run path: beamflow.runs) --------------------------
ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param", "-p", help="Reconstruction parameter KEY=VALUE (repeatable), e.g. iterations=50."
    ),
]
WaitOption = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Follow the run until it ends; exit 1 if it fails.")
]


def _backend(settings: Settings, name: str | None = None):  # noqa: ANN202 - Backend
    from beamflow.backend import BackendError
    from beamflow.runs import get_backend

    if name is not None and name != settings.backend:
        settings = settings.model_copy(update={"backend": name})
    try:
        return get_backend(settings)
    except BackendError as exc:
        fail(str(exc))


def _follow(settings: Settings, store: Store, backend, run):  # noqa: ANN001, ANN202 - Run
    """Follow ``run`` with a progress bar (stderr) until it ends; Ctrl-C cancels it."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from beamflow.runs import cancel_run, follow_run

    def describe(r) -> str:  # noqa: ANN001
        return f"{r.scan}: {r.current_step or r.status.value}"

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("iteration {task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        task = progress.add_task(describe(run), total=run.iterations_total or 1)

        def show(r) -> None:  # noqa: ANN001
            progress.update(
                task,
                description=describe(r),
                completed=r.iteration or 0,
                total=r.iterations_total or progress.tasks[0].total,
            )

        try:
            return follow_run(store, backend, run, poll_seconds=0.5, max_poll_seconds=5.0,
                              on_update=show)  # fmt: skip
        except KeyboardInterrupt:
            progress.stop()
            err_console.print(f"interrupted: cancelling run {run.id}")
            run = cancel_run(settings, run.id, store=store, backend=backend)
            follow_run(store, backend, run, poll_seconds=0.5, timeout=30)
            raise typer.Exit(130) from None


def _report(store: Store, run, as_json: bool) -> None:  # noqa: ANN001
    """Print how the run ended (or stands); exit 1 if it failed."""
    if as_json:
        data = run.model_dump(mode="json")
        data["steps"] = [s.model_dump(mode="json") for s in store.steps(run.id)]
        print(json.dumps(data))
    else:
        out = {"highlight": False, "soft_wrap": True}  # paths stay whole, one per line
        console.print(f"run {run.id}  {styled_status(run.status)}  {run.scan}", **out)
        if run.backend_run_id:
            console.print(f"  {run.backend} run  {run.backend_run_id}", **out)
        for s in store.steps(run.id):
            console.print(f"  step      {s.name}: {s.status} ({_duration(s.duration)})", **out)
        if run.product:
            console.print(f"  product   {run.product}", **out)
        for p in run.previews:
            console.print(f"  preview   {p}", **out)
    if run.status == RunStatus.FAILED:
        fail(f"run {run.id} failed in {run.error_step or 'an unknown step'}: {run.error}")


@runs_app.command("start")
def runs_start(
    scan: Annotated[Path, typer.Argument(help="Scan directory, *_master.h5 or .cxi file.")],
    wait: WaitOption = False,
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
    from beamflow.runs import RunInputError, parse_param, run_direct, start_scan_run

    settings = settings_from(config)
    try:
        params = dict(parse_param(p) for p in param or [])
    except RunInputError as exc:
        fail(str(exc), code=2)
    if direct and settings.backend != "globus":
        fail("--direct submits to a Globus Compute endpoint: it needs backend = \"globus\" "
             "(the local backend runs the function in-process anyway)", code=2)  # fmt: skip
    store = open_store(settings)
    backend = _backend(settings)
    try:
        if direct:
            try:
                run = run_direct(settings, store, backend, scan, params=params, label=label)
            except RunInputError as exc:
                fail(str(exc))
            _report(store, run, as_json)
            return
        try:
            run = start_scan_run(settings, store, backend, scan, params=params, label=label,
                                 flow=flow)  # fmt: skip
        except RunInputError as exc:
            fail(str(exc))
        if run.status == RunStatus.FAILED:
            _report(store, run, as_json)
        if backend.name == "local" and not wait:
            # A local run lives in the process that started it: leaving would lose it.
            err_console.print(
                "the local backend runs flows inside this process: following the run "
                "(Ctrl-C cancels it)"
            )
            wait = True
        if wait:
            run = _follow(settings, store, backend, run)
        _report(store, run, as_json)
    finally:
        backend.close()


@runs_app.command("retry")
def runs_retry(
    run_id: Annotated[str, typer.Argument(help="A failed or cancelled run (id or prefix).")],
    wait: WaitOption = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Start a new attempt of a failed run (same scan, flow and parameters; it continues from
    the scan's checkpoints)."""
    from beamflow.runs import RunInputError, retry_run

    settings = settings_from(config)
    store = open_store(settings)
    old = _find_run(store, run_id)
    backend = _backend(settings)
    try:
        try:
            run = retry_run(settings, old.id, store=store, backend=backend)
        except RunInputError as exc:
            fail(str(exc))
        err_console.print(f"run {run.id} retries {old.id} (attempt {run.attempt})")
        if run.status != RunStatus.FAILED and (wait or backend.name == "local"):
            run = _follow(settings, store, backend, run)
        _report(store, run, as_json)
    finally:
        backend.close()


@runs_app.command("cancel")
def runs_cancel(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the backend to stop it.")
    ] = 30.0,
    config: ConfigOption = None,
) -> None:
    """Cancel a queued or running run."""
    from beamflow.backend import BackendError
    from beamflow.runs import cancel_run, follow_run

    settings = settings_from(config)
    store = open_store(settings)
    run = _find_run(store, run_id)
    if run.status.finished:
        console.print(f"run {run.id} already ended: {run.status}")
        return
    backend = _backend(settings)
    try:
        run = cancel_run(settings, run.id, store=store, backend=backend)
        if not run.status.finished:
            run = follow_run(store, backend, run, poll_seconds=0.5, timeout=timeout)
    except BackendError as exc:
        fail(f"cannot cancel run {run.id}: {exc}")
    finally:
        backend.close()
    if run.status.finished:
        console.print(f"run {run.id}: {run.status}")
    else:
        console.print(f"run {run.id}: cancel requested; the backend has not stopped it yet")


# -- register --------------------------------------------------------------------------------
BackendChoice = Annotated[
    str | None, typer.Option("--backend", help="local or globus (default: the configured one).")
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say what would change; register nothing.")
]


def _register(kind: str, backend_name: str | None, dry_run: bool, config: Path | None) -> None:
    from beamflow.backend import BackendError

    if backend_name not in (None, "local", "globus"):
        fail(f"--backend must be 'local' or 'globus', not {backend_name!r}", code=2)
    settings = settings_from(config)
    backend = _backend(settings, backend_name)
    try:
        register = backend.register_functions if kind == "functions" else backend.register_flows
        results = register(dry_run=dry_run)
    except BackendError as exc:
        fail(str(exc))
    finally:
        backend.close()
    if dry_run:
        err_console.print(f"dry run on {backend.name}: nothing registered; each line says what "
                          "registering would do")  # fmt: skip
    for r in results:
        print(f"{r.action} {r.name} {r.id or '-'}")


@register_app.command("functions")
def register_functions(
    backend: BackendChoice = None, dry_run: DryRunOption = False, config: ConfigOption = None
) -> None:
    """Register the compute functions (functions/*.py) whose content changed."""
    _register("functions", backend, dry_run, config)


@register_app.command("flows")
def register_flows(
    backend: BackendChoice = None, dry_run: DryRunOption = False, config: ConfigOption = None
) -> None:
    """Register the flows (flows/*.json + schema) whose content changed."""
    _register("flows", backend, dry_run, config)


# -- agent -----------------------------------------------------------------------------------
@app.command()
def agent(
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Process every scan ready now, wait for those runs, then exit."
        ),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --once: give up after this many seconds.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    config: ConfigOption = None,
) -> None:
    """The edge agent: watch the detector directory and start a flow run per scan.

    Runs in the foreground (systemd runs it; see deploy/systemd). Logs are JSON lines on
    stderr. SIGTERM stops it cleanly; runs already started are re-attached at the next start.
    """
    import signal

    from edge_agent.agent import EdgeAgent
    from edge_agent.logs import setup_logging

    settings = settings_from(config)
    setup_logging(log_level.upper())
    edge = EdgeAgent(settings)
    # SIGTERM (systemd) and Ctrl-C both stop it cleanly, between passes.
    signal.signal(signal.SIGTERM, lambda *_: edge.stop())
    signal.signal(signal.SIGINT, lambda *_: edge.stop())
    try:
        if once:
            try:
                ok = edge.run_once(timeout=timeout)
            finally:
                if edge.once_summary is not None:
                    print(edge.once_summary.line(), flush=True)
            raise typer.Exit(0 if ok else 1)
        edge.run_forever()
    except KeyboardInterrupt:
        edge.stop()
    finally:
        edge.backend.close()


# -- serve -----------------------------------------------------------------------------------
@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option(help="Address to bind (default status.host: 127.0.0.1). Anything but "
                     "loopback needs status.token (or BEAMFLOW_STATUS__TOKEN), to view too "
                     "unless status.public_viewing."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Port (default status.port: 8765).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Status page and JSON API (/api/runs, /api/runs/{id}, /healthz): live runs, previews."""
    from functools import partial

    from beamflow.runs import retry_run
    from beamflow.status.security import is_loopback
    from beamflow.status.server import StatusConfigError, build_app, make_server

    settings = settings_from(config)
    host = host or settings.status.host
    port = port or settings.status.port
    try:
        status_app = build_app(settings, host=host, retry=partial(retry_run, settings))
    except StatusConfigError as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    console.print(f"[green]status page:[/] http://{shown}:{port}/  (store {settings.store_path})")
    if not is_loopback(host):
        console.print(
            "  anyone who reaches it may view runs (status.public_viewing); actions need the "
            "status token" if settings.status.public_viewing else
            "  every page, preview, API call and download needs the status token (log in on "
            "the page)"
        )
    try:
        make_server(status_app, host, port).run()
    except OSError as exc:
        fail(f"cannot serve on {host}:{port}: {exc}")


# -- flows -----------------------------------------------------------------------------------
FlowFile = Annotated[
    Path, typer.Argument(help="A flow definition (Globus Flows JSON).", dir_okay=False)
]


@flows_app.command("validate")
def flows_validate(file: FlowFile) -> None:
    """Check a definition as Globus Flows would: exit 0 and 'valid', or 1 and the reasons."""
    from beamflow.local.flowtool import FlowToolError, load_flow
    from beamflow.local.validation import definition_warnings, validate_definition

    try:
        definition, _ = load_flow(file)
    except FlowToolError as exc:
        fail(str(exc))
    problems = validate_definition(definition)
    for warning in definition_warnings(definition) if not problems else []:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if problems:
        for problem in problems:
            print(problem)
        raise typer.Exit(1)
    print("valid")


@flows_app.command("run")
def flows_run(
    file: FlowFile,
    input_: Annotated[
        str | None,
        typer.Option("--input", "-i", help="The run input: a JSON object, or @file.json."),
    ] = None,
    schema: Annotated[
        Path | None,
        typer.Option(help="Input schema (default: NAME.schema.json next to FILE, if any)."),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(min=1e-6, help="Run Wait states and polls this much faster (<1).")
    ] = 1.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Run any definition on the local interpreter and print its final status and output."""
    from beamflow.local.clock import SystemClock
    from beamflow.local.flowtool import FlowToolError, action_urls, load_flow, parse_input
    from beamflow.local.interpreter import FlowRunner
    from beamflow.local.validation import FlowDefinitionError, FlowInputError

    try:
        definition, input_schema = load_flow(file, schema)
        body = parse_input(input_)
    except FlowToolError as exc:
        fail(str(exc))
    providers = {}
    why_none = ""
    if isinstance(definition, dict) and action_urls(definition):
        from beamflow.local.flowtool import local_providers

        try:
            providers = local_providers(load_config(config))
        except ConfigError as exc:
            why_none = f"; the configuration did not load: {exc}"
    try:
        runner = FlowRunner(
            definition,
            providers,
            flow_id=f"local:{file.stem}",
            input_schema=input_schema,
            clock=SystemClock(time_scale=time_scale),
            poll_interval=min(1.0, 10.0 * time_scale),
        )
    except FlowDefinitionError as exc:
        fail(f"{file}: " + "; ".join(exc.problems))
    if runner.missing_providers:
        fail(
            "no local action provider for "
            + ", ".join(runner.missing_providers)
            + " (the local backend provides the Transfer and Compute action providers)"
            + why_none
        )
    try:
        handle = runner.start(body, label=f"flows run {file.name}")
    except FlowInputError as exc:
        fail(f"{file}: " + "; ".join(exc.problems))
    try:
        result = handle.wait()
    except KeyboardInterrupt:
        handle.cancel()
        result = handle.wait()
    assert result is not None
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
    else:
        style = {"SUCCEEDED": "green", "FAILED": "red"}.get(result.status, "yellow")
        console.print(f"status  [{style}]{result.status}[/]  run {result.run_id}")
        if result.error:
            console.print(
                f"error   {result.error['state_name']}: {result.error['Error']}: "
                f"{result.error['Cause']}",
                highlight=False,
                soft_wrap=True,
            )
        print(json.dumps(result.output, indent=2))
    raise typer.Exit(0 if result.status == "SUCCEEDED" else 1)


# -- Globus: login, logout, whoami, doctor ----------------------------------------------------
# beamflow.globus is imported inside the commands: the local backend never needs it.
def _globus_auth(settings: Settings):  # noqa: ANN202 - beamflow.globus.auth.GlobusAuth
    from beamflow.backend import BackendError
    from beamflow.globus.auth import INTERACTIVE, GlobusAuth, registered_flow_ids

    try:
        return GlobusAuth(settings, flow_ids=registered_flow_ids(settings), network=INTERACTIVE)
    except BackendError as exc:
        fail(str(exc))


@app.command()
def login(
    force: Annotated[
        bool, typer.Option("--force", help="Log in again even if the stored tokens suffice.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Log in to Globus: prints a URL, reads the code back. Grants Transfer, Flows, Compute
    and every registered flow (run it again after `register flows`)."""
    from beamflow.backend import BackendError

    settings = settings_from(config)
    with _globus_auth(settings) as auth:
        try:
            ran = auth.login(force=force)
        except BackendError as exc:
            fail(str(exc))
        if auth.is_service:
            console.print(f"[green]tokens obtained[/] for client {settings.globus.client_id}")
        elif not ran:
            console.print("already logged in with every consent needed (--force to redo)")
        else:
            console.print(f"[green]logged in[/]; tokens stored in {auth.token_path}")


@app.command()
def logout(config: ConfigOption = None) -> None:
    """Revoke the stored Globus tokens and delete them from the token file."""
    settings = settings_from(config)
    with _globus_auth(settings) as auth:
        removed, problems = auth.logout()
    if not removed:
        console.print("not logged in: no tokens to remove")
        return
    console.print(f"logged out: tokens for {removed} services removed from {auth.token_path}")
    if problems:
        err_console.print(
            f"[yellow]warning:[/] could not revoke them with Globus Auth ({problems[0]}); "
            "they are deleted here, and can be revoked at https://app.globus.org/account/consents",
            highlight=False,
            soft_wrap=True,
        )


@app.command()
def whoami(as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Who is logged in to Globus, and until when the tokens are good."""
    from beamflow.backend import BackendError
    from beamflow.globus.auth import expiry_warnings

    settings = settings_from(config)
    with _globus_auth(settings) as auth:
        try:
            info = auth.userinfo()
        except BackendError as exc:
            fail(str(exc))
        tokens = auth.tokens()
    if as_json:
        print(json.dumps({**info, "tokens": [t.__dict__ for t in tokens]}))
        return
    console.print(f"[bold]{info.get('name') or info.get('preferred_username')}[/]")
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
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


@app.command()
def doctor(as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Check the Globus setup (ids, login, collections, endpoint, flows) and say what to fix."""
    from beamflow.globus.doctor import run_checks

    settings = settings_from(config)
    checks = run_checks(settings)
    failed = [c for c in checks if c.outcome == "fail"]
    if as_json:
        print(json.dumps([c.model_dump() for c in checks]))
    else:
        mark = {
            "ok": "[green]  ok[/]",
            "warn": "[yellow]warn[/]",
            "fail": "[red]FAIL[/]",
            "skip": "[dim]skip[/]",
        }
        for c in checks:
            console.print(f"{mark[c.outcome]}  {c.name}: {c.detail}", highlight=False)
            if c.fix and c.outcome in ("fail", "warn"):
                console.print(f"      fix: {c.fix}", highlight=False)
        summary = f"{len(failed)} problem(s)" if failed else "everything needed is in place"
        console.print(("[red]" if failed else "[green]") + summary + "[/]")
    if failed:
        raise typer.Exit(1)


# -- demo ------------------------------------------------------------------------------------
@app.command()
def demo(
    workspace: Annotated[
        Path, typer.Option(help="Workspace to create or reuse.")
    ] = Path("demo-workspace"),
    scans: Annotated[int, typer.Option(min=1, max=50, help="Scans to simulate.")] = 3,
    positions: Annotated[int, typer.Option(min=10, help="Scan positions per scan.")] = 200,
    probe_size: Annotated[int, typer.Option(min=16, help="Detector frame size (px).")] = 64,
    iterations: Annotated[
        int, typer.Option(min=1, help="Reconstruction iterations.")
    ] = RECONSTRUCTION_DEFAULTS.iterations,
    rate: Annotated[float, typer.Option(min=0.1, help="Simulated frames per second.")] = 60.0,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Status page port (default: free).")
    ] = None,
    exit_when_done: Annotated[
        bool, typer.Option("--exit", help="Return when the runs are done (exit 1 if any failed).")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """The main job on the embedded backend: simulated beamline, agent, flows,
    reconstruction, previews and the status page, live."""
    import signal

    from beamflow.demo import DemoOptions, run_demo

    # SIGTERM (kill, a CI runner's timeout) stops the demo as Ctrl-C does: through its
    # cleanup, which shuts the compute engine down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    options = DemoOptions(
        workspace=workspace, scans=scans, positions=positions, probe_size=probe_size,
        iterations=iterations, rate_hz=rate, port=port, exit_when_done=exit_when_done,
    )
    try:
        ok = run_demo(options, console)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
