"""`beamflow init` (a workspace) and `beamflow simulate` (a scan written as a detector would)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from beamflow.cli.common import ConfigOption, console, err_console, fail, settings_from
from beamflow.config import CONFIG_NAME
from beamflow.console import styled
from beamflow.workspace_toml import globus_workspace_toml, local_workspace_toml

# `simulate --probe-drift` at most --probe-size / this: the beam stays well inside its window.
DRIFT_PER_PROBE = 8


#: What `beamflow init` suggests next: the first steps of docs/quickstart.md, in its order
#: (tests/test_docs.py holds them to it).
FIRST_STEPS = [
    ("beamflow simulate --name scan_001 --positions 200", "# a scan, as a detector writes it"),
    ("beamflow agent --once", "# reconstructs every scan that is ready"),
    ("beamflow runs list", "# the runs, with their verdict"),
    ("beamflow serve", "# the status page, http://127.0.0.1:8765/"),
]


def init(
    directory: Annotated[Path, typer.Argument(help="Workspace directory to create.")],
    backend: Annotated[
        str, typer.Option(help="local (works now, offline) or globus (a template to fill in).")
    ] = "local",
    force: Annotated[bool, typer.Option(help="Overwrite an existing beamflow.toml.")] = False,
    config: ConfigOption = None,
) -> None:
    """Create a workspace: beamflow.toml, beamline/{detector,previews}, hpc/, state/ (mode
    0700: tokens and the run store live there)."""
    if backend not in ("local", "globus"):
        fail(f"--backend must be 'local' or 'globus', not {backend!r}", code=2)
    target = directory / CONFIG_NAME
    if target.exists() and not force:
        fail(f"{target} exists already (use --force to overwrite)")
    for sub in ("beamline/detector", "beamline/previews", "hpc", "state"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    # The state directory holds the Globus tokens and the run store: its owner's alone
    # (mkdir's mode would be filtered by the umask; an existing one is tightened too).
    (directory / "state").chmod(0o700)
    text = local_workspace_toml() if backend == "local" else globus_workspace_toml()
    target.write_text(text)
    if backend == "local":
        settings_from(target)  # what init writes must load
    console.print(Text.assemble(styled("workspace ready:", "green"), f" {directory.resolve()}"))
    console.print(f"  config      {target}")
    console.print(f"  detector    {directory / 'beamline/detector'}  (the agent watches this)")
    console.print(f"  previews    {directory / 'beamline/previews'}")
    if backend == "globus":
        console.print("  next: fill in the ids marked FILL, then `beamflow login`.")
    else:
        console.print("  next (docs/quickstart.md, \"Step by step\"):")
        for command, why in [(f"cd {directory}", ""), *FIRST_STEPS]:
            console.print(f"    {command:<52}{why}".rstrip(), highlight=False, soft_wrap=True)


def render_endpoint(
    source: Annotated[Path, typer.Argument(
        help="The kind's shipped files: deploy/compute-endpoint/slurm-gpu, pbspro-gpu or "
        "workstation.", file_okay=False)],
    out: Annotated[Path, typer.Argument(help="Directory to write the site's files into.",
                                        file_okay=False)],
    force: Annotated[bool, typer.Option(help="Overwrite files already in OUT.")] = False,
    config: ConfigOption = None,
) -> None:
    """Write the Compute endpoint's files with this site's values from beamflow.toml: the
    template's defaults ([cluster] worker_env, modules; [cluster.final]) and the identity
    mapping (the agent's client runs as cluster.service_account). Then configure the
    endpoint from OUT, and point cluster.endpoint_dir at a copy for `beamflow doctor`."""
    from beamflow.endpoint_files import RenderError
    from beamflow.endpoint_files import render_endpoint as render

    settings = settings_from(config)
    try:
        rendered = render(settings, source, out, force=force)
    except (RenderError, OSError) as exc:
        fail(str(exc))
    for path in rendered.written:
        console.print(f"[green]wrote[/] {path}", highlight=False)
    for whom, command in rendered.configure:
        console.print(f"next, on the endpoint's host, {whom}:")
        console.print(f"  {command}", highlight=False, soft_wrap=True)


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
    probe_drift: Annotated[
        float, typer.Option(
            "--probe-drift", metavar="PX", min=0.0,
            help="A fly scan whose beam drifts: one slow loop of this radius in pixels over "
                 "the scan (far field; reconstruct it with --opr-modes).")
    ] = 0.0,
    slices: Annotated[
        int, typer.Option(min=1, help="Layers of a thick sample (1: a thin sample).")
    ] = 1,
    slice_spacing: Annotated[
        str | None, typer.Option(
            "--slice-spacing", metavar="M",
            help="Distance between the layers in metres: one value, or --slices − 1 "
                 "comma-separated values (e.g. 4e-4 or 1e-4,2e-4).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Simulate a ptychography scan and write it as the detector would, file by file.

    Writes OUT_DIR/NAME/ground_truth.h5 and NAME_master.h5 first,
    then NAME_data_NNNNNN.h5 files as the frames are acquired at --rate.
    With --slices S ≥ 2 the sample is S distinct layers --slice-spacing apart (the
    ground truth keeps each layer).
    """
    from beamflow.ptycho.forward.slices import slice_spacings
    from beamflow.simulate import simulate_scan

    if pattern not in ("spiral", "raster"):
        fail(f"--pattern must be 'spiral' or 'raster', not {pattern!r}", code=2)
    if propagation not in ("far-field", "near-field"):
        fail(f"--propagation must be 'far-field' or 'near-field', not {propagation!r}", code=2)
    if probe_drift and propagation == "near-field":
        fail("--probe-drift simulates a far-field fly scan; it does not apply to "
             "--propagation near-field", code=2)
    if probe_drift > probe_size / DRIFT_PER_PROBE:
        # The loop moves the beam by up to twice its radius, circularly within its window.
        fail(f"--probe-drift {probe_drift:g} px moves the beam up to {2 * probe_drift:g} px in "
             f"its {probe_size}-px window: at most {probe_size / DRIFT_PER_PROBE:g} "
             f"(--probe-size / {DRIFT_PER_PROBE})", code=2)
    if slice_spacing is not None and slices == 1:
        fail("--slice-spacing needs --slices 2 or more (a thin sample has no layers to "
             "space)", code=2)
    try:
        spacings = slice_spacings(slices, slice_spacing)
    except ValueError as exc:
        fail(f"--slices {slices} --slice-spacing: {exc}", code=2)
    if out_dir is None:
        out_dir = settings_from(config).beamline.detector_dir
    with Progress(
        TextColumn("{task.description}", markup=False, style="progress.description"),
        BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=err_console, transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task(f"simulating {name}", total=positions)
        try:
            master = simulate_scan(
                out_dir, name, positions=positions, probe_size=probe_size, photons=photons,
                seed=seed, frames_per_file=frames_per_file, rate_hz=rate, overlap=overlap,
                pattern=pattern, stop_after=stop_after, overwrite=overwrite,
                propagation=propagation, probe_drift_px=probe_drift, slices=slices,
                slice_spacing_m=spacings,
                progress=lambda done, total: bar.update(task, completed=done),
            )  # fmt: skip
        except (FileExistsError, ValueError, OSError) as exc:
            fail(str(exc))
    console.print(Text.assemble(styled("scan written:", "green"), f" {master}"))
    console.print(f"  ground truth  {master.parent / 'ground_truth.h5'}")
    if probe_drift:
        console.print(f"  probe drift   a {probe_drift:g} px loop along the scan: reconstruct "
                      "with --opr-modes 3 to 5")
    if slices > 1:
        console.print(_layers_line(master, spacings))


def _layers_line(master: Path, spacings: tuple[float, ...]) -> str:
    """The layers of a thick sample in depths of field, and the frequency they separate."""
    from beamflow.ground_truth import read_ground_truth
    from beamflow.ptycho.forward.slices import depth_of_field, separation_frequency

    gt = read_ground_truth(master.parent)
    wavelength, dx = gt.geometry.wavelength_m, gt.object_pixel_size_m
    dof = depth_of_field(wavelength, dx)
    gaps = ", ".join(f"{dz * 1e6:g}" for dz in spacings)
    cut = separation_frequency(wavelength, min(spacings)) * dx
    return (f"  layers        {len(spacings) + 1}, {gaps} µm apart ({min(spacings) / dof:.3g}× "
            f"the depth of field, {dof * 1e6:.3g} µm), told apart above {cut:.2g} cycles/pixel\n"
            f"  reconstruct   --slices {len(spacings) + 1} --slice-spacing "
            f"{','.join(f'{d:g}' for d in spacings)}")

