"""`beamflow flows validate|run`: the offline flow tool, on the local backend's interpreter
(its public API, ``beamflow.local``, imported inside the commands: it loads jsonschema and the
interpreter, which no other command needs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from beamflow.cli.common import HELP, ConfigOption, JsonOption, console, fail, warn

app = typer.Typer(help="Validate and try flow definitions offline.", **HELP)

FlowFile = Annotated[
    Path, typer.Argument(help="A flow definition (Globus Flows JSON).", dir_okay=False)
]


@app.command("validate")
def flows_validate(file: FlowFile) -> None:
    """Check a definition as Globus Flows would: exit 0 and 'valid', or 1 and the reasons."""
    from beamflow.local import FlowToolError, check_flow

    try:
        check = check_flow(file)
    except FlowToolError as exc:
        fail(str(exc))
    for warning in check.warnings:
        warn(warning)
    if check.problems:
        for problem in check.problems:
            print(problem)
        raise typer.Exit(1)
    print("valid")


@app.command("run")
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
    from beamflow.local import FlowToolError, run_flow

    try:
        with run_flow(
            file, input_, schema_path=schema, time_scale=time_scale, config=config
        ) as handle:
            try:
                result = handle.wait()
            except KeyboardInterrupt:
                handle.cancel()
                result = handle.wait()
    except FlowToolError as exc:
        fail(str(exc))
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
