"""`beamflow reconstruct` (a scan, on this machine) and `beamflow previews` (of the newest
verified checkpoint)."""

from __future__ import annotations

import enum
import inspect
import json
import logging
import types
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args, get_origin

import annotated_types
import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from beamflow.cli.common import ConfigOption, console, err_console, fail, settings_from, warn
from beamflow.config import (
    ENGINE_SETTINGS,
    NO_ITERATIONS,
    RECONSTRUCTION_DEFAULTS,
    RENAMED_SETTINGS,
    Reconstruction,
)
from beamflow.console import styled, verdict_text
from beamflow.validation_text import validation_text

if TYPE_CHECKING:
    from beamflow.job.models import ReconstructSummary


# The sections of `beamflow reconstruct --help` (beamflow.cli.common.HELP_PANELS).
INPUT, ALGORITHM, PROBE, OUTPUT = "Input and geometry", "Algorithm", "Probe", "Output"
#: The engine settings outside the Algorithm section.
ENGINE_PANELS = {
    "position_correction": INPUT, "position_correction_start": INPUT,
    "position_step_limit_px": INPUT, "slices": INPUT, "slice_spacing_m": INPUT,
    "probe_modes": PROBE, "probe_update_start": PROBE, "orthogonalize_every": PROBE,
    "center_probe": PROBE, "opr_modes": PROBE, "opr_weight_smoothing": PROBE,
    "layer_regularization": INPUT,
}
#: Engine settings whose option is not ``--NAME``: the layers' spacing is given as one value
#: or a comma-separated list of metres (``--slice-spacing 4e-4``, ``--slice-spacing 1e-4,2e-4``).
ENGINE_FLAGS = {"slice_spacing_m": "--slice-spacing"}


def _config_default(name: str) -> str:
    """Where an option's value comes from when it is not given: ``[reconstruction]`` of
    beamflow.toml, else the built-in default."""
    value = getattr(RECONSTRUCTION_DEFAULTS, name)
    if isinstance(value, bool):
        value = "on" if value else "off"
    shown = "unset" if value is None else value
    return f"[default: config {name}, else {shown}]"


def reconstruct(
    scan: Annotated[
        Path, typer.Argument(help="Detector master file, scan directory or .cxi file.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory (product, previews, checkpoints).",
                           rich_help_panel=OUTPUT)
    ] = ...,  # type: ignore[assignment]
    probe: Annotated[
        Path | None, typer.Option(help="Initial probe: .npy (complex) or a product .h5 "
                                       "[default: from the scan's optics, else its data].",
                                  rich_help_panel=PROBE)
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help=f"auto, cpu or cuda {_config_default('device')}.",
                     rich_help_panel=ALGORITHM),
    ] = None,
    propagation: Annotated[
        str | None,
        typer.Option(help="far-field or near-field [default: the scan file's, else config "
                          "propagation, else far-field].", rich_help_panel=INPUT),
    ] = None,
    focus_distance: Annotated[
        float | None,
        typer.Option(min=0.0, help="Near field, cone beam: focus-to-sample distance z1 in "
                                   "metres, for the Fresnel scaling [default: the scan file's, "
                                   "else config focus_distance_m, else a parallel beam].",
                     rich_help_panel=INPUT),
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(min=0, help="Checkpoint to DIR/checkpoints every N iterations (0: at the "
                                 f"end) {_config_default('checkpoint_every')}.",
                     rich_help_panel=OUTPUT),
    ] = None,
    checkpoint_seconds: Annotated[
        float | None, typer.Option(min=0.001, help="... and/or every S seconds.",
                                   rich_help_panel=OUTPUT)
    ] = None,
    l1_dir: Annotated[
        Path | None,
        typer.Option(help="Node-local dir for frequent L1 checkpoints [default: "
                          "hpc.node_local_dir, else $BEAMFLOW_CHECKPOINT_L1_DIR, else none].",
                     rich_help_panel=OUTPUT),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue from a compatible checkpoint in DIR if there is one.",
                           rich_help_panel=OUTPUT)
    ] = True,
    max_frames: Annotated[
        int | None, typer.Option(min=1, help="Use at most N frames [default: all].",
                                 rich_help_panel=INPUT)
    ] = None,
    allow_partial: Annotated[
        bool, typer.Option(help="Use the frames written so far of a scan still being acquired.",
                           rich_help_panel=INPUT)
    ] = False,
    preview_every: Annotated[
        int | None,
        typer.Option(min=0, help="Refresh previews every N iterations (0: at the end) "
                                 f"{_config_default('preview_every')}.", rich_help_panel=OUTPUT),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with status 2 when the result is suspect "
                                            "(the product is still written).",
                           rich_help_panel=OUTPUT)
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON line (summary).", rich_help_panel=OUTPUT)
    ] = False,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "WARNING",
    config: ConfigOption = None,
    **engine: Any,
) -> None:
    """Reconstruct a scan: DIR/product.h5, DIR/previews/*.png, DIR/checkpoints/.

    A compatible checkpoint in DIR is resumed (also with more frames of the same scan); an
    incompatible one is refused unless --no-resume. SIGTERM saves a checkpoint and exits.
    The engine's settings default to [reconstruction] in beamflow.toml (same names).
    """
    from beamflow.checkpoint import IncompatibleCheckpoint
    from beamflow.formats import ScanFormatError
    from beamflow.job.models import ReconstructError, ReconstructJob, plain_words
    from beamflow.job.run import run_reconstruction
    from beamflow.ptycho.arrays import ArrayBackendError

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from(config)
    rc = settings.reconstruction
    node_local = settings.hpc.node_local_dir
    # The engine's settings: those given here, else [reconstruction]'s.
    given = {name: value.value if isinstance(value, enum.Enum) else value
             for name, value in engine.items() if value is not None}
    if given.get("iterations") == 0:  # the engine's limit is 0; a job's is 1
        fail(f"--iterations 0: {NO_ITERATIONS}", code=2)
    try:
        job = ReconstructJob(
            scan=scan, out=out, **{**rc.engine_settings(), **given}, probe=probe,
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
        fail(f"invalid reconstruction settings: {validation_text(exc, skip=['params'])}", code=2)

    bar = Progress(
        TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=err_console, disable=as_json, transient=False,
    )  # fmt: skip
    task = bar.add_task(f"{job.params.algorithm} {scan.name}", total=None, loss="-")

    def progress(iteration: int, stop_iteration: int, loss: float | None) -> None:
        if not bar.live.is_started:  # only once the scan has loaded: errors print cleanly
            bar.start()
        bar.update(task, completed=iteration, total=stop_iteration,
                   loss="-" if loss is None else f"{loss:.4g}")

    try:
        summary = run_reconstruction(job, progress=progress)
    except (ScanFormatError, IncompatibleCheckpoint, ReconstructError, ArrayBackendError) as exc:
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
    else:
        _print_summary(scan, summary)
    if strict and summary.verdict == "suspect":
        raise typer.Exit(2)


def _print_summary(scan: Path, summary: ReconstructSummary) -> None:
    from beamflow.job.models import length_text

    spi = summary.seconds_per_iteration
    resumed = summary.resumed_from_iteration
    console.print(Text.assemble(styled("reconstructed", "green"),
                                f" {scan} ({summary.n_frames} frames) on {summary.device}"))
    console.print(f"  iterations  {summary.iterations}"
                  + (f" (resumed from {resumed})" if resumed is not None else "")
                  + (f", {spi * 1e3:.1f} ms each" if spi else ""))
    if summary.final_loss is not None:
        console.print(f"  final loss  {summary.final_loss:.4g}")
    console.print(f"  model       {summary.propagation}, object pixel "
                  f"{length_text(summary.object_pixel_size_m)}")
    for note in summary.notes:
        if note not in summary.verdict_reasons:  # a suspect result lists it below
            console.print(Text.assemble("  ", styled("note", "yellow"), f"        {note}"),
                          highlight=False)
    if summary.verdict == "trusted":
        console.print(Text.assemble("  verdict     ", verdict_text("trusted")))
    else:
        console.print(Text.assemble("  verdict     ", verdict_text("suspect")))
        for reason in summary.verdict_reasons:
            console.print(f"    - {reason}", highlight=False)
    console.print(f"  product     {summary.product}")
    for p in summary.previews:
        console.print(f"  preview     {p}")
    for e in summary.checkpoint_errors[:3]:
        warn(e)


# --------------------------------------------------------------------------- engine options


def _engine_option(name: str, field: FieldInfo) -> inspect.Parameter:
    """``--NAME`` for one engine setting, from its field: the type, the choices, the limits
    and the help; None (the default) leaves it to [reconstruction]."""
    flag = ENGINE_FLAGS.get(name, "--" + name.replace("_", "-"))
    kind = field.annotation
    if isinstance(kind, types.UnionType) or get_origin(kind) is not None and \
            get_origin(kind) is not Literal:
        kind = next(a for a in get_args(kind) if a is not type(None))
    if name in ENGINE_FLAGS:  # read by the engine's own parser (ReconParams)
        kind = str
    about = (field.description or "").replace("None:", "unset:")
    options: dict[str, Any] = {"help": f"{about} {_config_default(name)}",
                               "rich_help_panel": ENGINE_PANELS.get(name, ALGORITHM)}
    if name in ENGINE_FLAGS:
        options["metavar"] = "METRES[,METRES...]"
    decls = [flag, *(f"--{old}" for old, new in RENAMED_SETTINGS.items() if new == name)]
    if get_origin(kind) is Literal:  # typer's choices are an Enum's values
        kind = enum.Enum(name, [(str(v), str(v)) for v in get_args(kind)], type=str)
    elif kind is bool:
        decls = [f"{flag}/--no-{flag[2:]}"]
    for limit in field.metadata:
        if isinstance(limit, annotated_types.Ge):
            options["min"] = limit.ge
        elif isinstance(limit, annotated_types.Le):
            options["max"] = limit.le
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, typer.Option(*decls, **options)])


def _with_engine_options(command: Any) -> Any:
    """``command`` with one option per engine setting (:data:`ENGINE_SETTINGS`), placed
    after --out; they arrive in its ``**engine``."""
    signature = inspect.signature(command, eval_str=True)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = [p.name for p in fixed].index("out") + 1
    fields = Reconstruction.model_fields
    added = [_engine_option(name, fields[name]) for name in ENGINE_SETTINGS]
    keyword = [p.replace(kind=p.KEYWORD_ONLY) for p in fixed]
    command.__signature__ = signature.replace(parameters=[*keyword[:at], *added, *keyword[at:]])
    return command


reconstruct = _with_engine_options(reconstruct)

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
    from beamflow.job.checkpoints import previews_from_checkpoint
    from beamflow.job.models import ReconstructError

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

