"""`beamflow cleanup`: apply [retention] now, or say what it would delete (--dry-run)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from beamflow.cli import common
from beamflow.cli.common import ConfigOption, JsonOption, console, fail, settings_from
from beamflow.runs.backend import RunBackendError


def cleanup(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what is due and its size; delete nothing.")
    ] = False,
    older_than: Annotated[
        float | None,
        typer.Option("--older-than", metavar="DAYS", min=0,
                     help="Take DAYS for every kind [retention] does not keep for ever."),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for the retention flow's run.")
    ] = 3600.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Delete what [retention] says is due now: the cluster's raw copies and checkpoints of
    scans untouched for long enough (through the retention flow, on the compute endpoint),
    and the previews of old runs here. Products and run records stay, and say what went."""
    from beamflow.runs.retention import WHAT, size_text
    from beamflow.runs.retention import cleanup as apply

    settings = settings_from(config, workspace=True)
    store = common.open_store(settings)
    backend = common.open_run_backend(settings)
    try:
        report = apply(settings, store, backend, dry_run=dry_run, older_than=older_than,
                       timeout=timeout)  # fmt: skip
    except RunBackendError as exc:
        fail(str(exc))
    finally:
        backend.close()
    if as_json:
        print(json.dumps({**report.model_dump(), "bytes": report.bytes}))
        return
    if dry_run:
        console.print("dry run: nothing deleted; each line is what would go")
    for item in report.items:
        console.print(f"  {item.kind:<12} {size_text(item.bytes):>9}  {item.age_days:>6.1f} d  "
                      f"{item.path}", highlight=False)  # fmt: skip
    for skipped in report.skipped:
        console.print(f"  [yellow]kept[/]         {skipped.path}: {skipped.reason}",
                      highlight=False)  # fmt: skip
    if not report.items:
        console.print("nothing is due")
        return
    kinds = ", ".join(sorted({WHAT[i.kind] for i in report.items}))
    verb = "would free" if dry_run else "freed"
    told = (f"; {report.runs_told} run record(s) say so (`beamflow runs show ID`)"
            if report.runs_told else "")
    console.print(f"[green]{verb} {size_text(report.bytes)}[/] ({len(report.items)} "
                  f"directories: {kinds}){told}")  # fmt: skip
