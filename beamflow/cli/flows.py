"""`beamflow flows validate|run`: the offline flow tool, on the local backend's interpreter
(its public API, ``beamflow.local``, imported inside the commands: it loads jsonschema and the
interpreter, which no other command needs). `validate --remote` also asks Globus Flows (the
public API of ``beamflow.globus``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from beamflow.cli.common import (
    HELP,
    App,
    ConfigOption,
    JsonOption,
    console,
    fail,
    settings_from,
    warn,
)
from beamflow.console import styled
from beamflow.runs.backend import RunBackendError

app = App(help="Validate and try flow definitions (offline; --remote asks Globus).",
                  **HELP)

FlowFile = Annotated[
    Path, typer.Argument(help="A flow definition (Globus Flows JSON).", dir_okay=False)
]


@app.command("validate")
def flows_validate(
    file: FlowFile,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote",
            help="Also ask Globus Flows (needs `beamflow login`) and print what it says.",
        ),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Check a definition as Globus Flows would: exit 0 and 'valid', or 1 and the reasons.
    With --remote the Flows service checks it too (definition and sibling schema)."""
    from beamflow.local import FlowToolError, check_flow, load_flow

    try:
        check = check_flow(file)
        definition, schema = load_flow(file) if remote else (None, None)
    except FlowToolError as exc:
        fail(str(exc))
    for warning in check.warnings:
        warn(warning)
    for problem in check.problems:
        print(problem)
    refused = bool(check.problems)
    if remote:
        refused = not _service_accepts(file, definition, schema, config) or refused
    if refused:
        raise typer.Exit(1)
    print("valid")


def _service_accepts(file: Path, definition: Any, schema: Any, config: Path | None) -> bool:
    """Globus Flows' own validation of the definition; prints its messages."""
    from beamflow.globus import validate_with_service

    try:
        check = validate_with_service(settings_from(config), file.name, definition, schema)
    except RunBackendError as exc:
        fail(str(exc))
    for problem in check.problems:
        print(f"Globus Flows: {problem}")
    if check.valid:
        scopes = sorted({s for group in check.scopes.values() for s in group})
        console.print(f"Globus Flows accepts it; runs will need: {', '.join(scopes) or '-'}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    return check.valid


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
        console.print(Text.assemble("status  ", styled(result.status, style),
                                    f"  run {result.run_id}"))
        if result.error:
            console.print(
                f"error   {result.error['state_name']}: {result.error['Error']}: "
                f"{result.error['Cause']}",
                highlight=False,
                soft_wrap=True,
            )
        print(json.dumps(result.output, indent=2))
    raise typer.Exit(0 if result.status == "SUCCEEDED" else 1)
