"""What `beamflow flows validate` and `beamflow flows run` do, kept out of the CLI module:
read a definition (and its input schema and input), check it as Globus Flows would, and run
it on the local interpreter against the local Transfer and Compute action providers.

Every failure the user can fix is a :class:`FlowToolError` naming the file and the reason,
raised before anything runs, in the order the user meets them: the files, the definition,
the action providers it needs, the input.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamflow.config import ConfigError, Settings, load_config
from beamflow.local.clock import SystemClock
from beamflow.local.compute import LocalComputeProvider
from beamflow.local.interpreter import FlowRunner, RunHandle
from beamflow.local.transfer import LocalTransferProvider
from beamflow.local.validation import (
    FlowDefinitionError,
    FlowInputError,
    definition_warnings,
    validate_definition,
)


class FlowToolError(Exception):
    """A flow file or an input that cannot be used, with the file and the reason."""


def load_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise FlowToolError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlowToolError(
            f"{path}: the {what} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None


def load_flow(path: Path, schema_path: Path | None = None) -> tuple[Any, dict[str, Any] | None]:
    """(definition, input schema) from a definition file.

    The file is either a bare definition or a flow document with ``definition`` (and
    ``input_schema``), as the Flows API returns it. Without ``schema_path``, a sibling
    ``NAME.schema.json`` (the convention in ``flows/``) is the input schema when present.
    """
    data = load_json(path, "flow definition")
    schema = None
    if isinstance(data, dict) and "definition" in data and "States" not in data:
        schema = data.get("input_schema")
        data = data["definition"]
    if schema_path is not None:
        schema = load_json(schema_path, "input schema")
    elif schema is None and path.name.endswith(".json"):
        sibling = path.with_name(path.name[: -len(".json")] + ".schema.json")
        if sibling.exists() and sibling != path:
            schema = load_json(sibling, "input schema")
    if schema is not None and not isinstance(schema, dict):
        raise FlowToolError(f"{schema_path or path}: the input schema must be a JSON object")
    return data, schema


def parse_input(text: str | None) -> dict[str, Any]:
    """The run input from ``--input``: inline JSON, or ``@file.json``."""
    if text is None:
        return {}
    if text.startswith("@"):
        body = load_json(Path(text[1:]).expanduser(), "input")
        where = text[1:]
    else:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FlowToolError(
                f"--input is not valid JSON ({exc.msg} at column {exc.colno}); "
                "give a JSON object or @file.json"
            ) from None
        where = "--input"
    if not isinstance(body, dict):
        raise FlowToolError(f"{where}: the flow input must be a JSON object")
    return body


def action_urls(definition: dict[str, Any]) -> list[str]:
    return sorted(
        {
            s["ActionUrl"]
            for s in definition.get("States", {}).values()
            if isinstance(s, dict) and s.get("Type") == "Action" and "ActionUrl" in s
        }
    )


def providers_for(settings: Settings) -> dict[str, LocalTransferProvider | LocalComputeProvider]:
    """The local action providers by ActionUrl, configured from ``settings`` (collections
    mapped to their roots, the compute endpoint to a GlobusComputeEngine). Close them
    (``.close()``) when done. Raises :class:`ConfigError` for a compute configuration that
    does not load."""
    transfer = LocalTransferProvider.from_settings(settings)
    compute = LocalComputeProvider.from_settings(settings)
    return {transfer.url: transfer, compute.url: compute}


@dataclass(frozen=True)
class FlowCheck:
    """What Globus Flows would say of a definition: ``problems`` (it would refuse it) and,
    for one it would accept, ``warnings`` (things that are probably mistakes)."""

    problems: list[str]
    warnings: list[str]


def check_flow(path: Path) -> FlowCheck:
    """Check the definition in ``path``; :class:`FlowToolError` if it cannot be read."""
    definition, _ = load_flow(path)
    problems = validate_definition(definition)
    return FlowCheck(problems, [] if problems else definition_warnings(definition))


@contextmanager
def run_flow(
    path: Path,
    input_text: str | None = None,
    *,
    schema_path: Path | None = None,
    time_scale: float = 1.0,
    config: Path | None = None,
) -> Iterator[RunHandle]:
    """Start the definition in ``path`` on the local interpreter with the input
    ``input_text`` (JSON, or ``@file.json``); yields the running flow's handle and closes the
    action providers on the way out.

    The providers come from the configuration (``config``, or the usual search), loaded only
    when the definition has Action states; when it does not load, the error says so next to
    the Action URLs left without a provider. ``time_scale`` < 1 runs Wait states and polls
    faster.
    """
    definition, input_schema = load_flow(path, schema_path)
    body = parse_input(input_text)
    providers: Mapping[str, LocalTransferProvider | LocalComputeProvider] = {}
    why_none = ""
    if isinstance(definition, dict) and action_urls(definition):
        try:
            providers = providers_for(load_config(config))
        except ConfigError as exc:
            why_none = f"; the configuration did not load: {exc}"
    try:
        try:
            runner = FlowRunner(
                definition,
                providers,
                flow_id=f"local:{path.stem}",
                input_schema=input_schema,
                clock=SystemClock(time_scale=time_scale),
                poll_interval=min(1.0, 10.0 * time_scale),
            )
        except FlowDefinitionError as exc:
            raise FlowToolError(f"{path}: " + "; ".join(exc.problems)) from None
        if runner.missing_providers:
            raise FlowToolError(
                "no local action provider for "
                + ", ".join(runner.missing_providers)
                + " (the local backend provides the Transfer and Compute action providers)"
                + why_none
            )
        try:
            handle = runner.start(body, label=f"flows run {path.name}")
        except FlowInputError as exc:
            raise FlowToolError(f"{path}: " + "; ".join(exc.problems)) from None
        yield handle
    finally:
        for provider in providers.values():
            provider.close()
