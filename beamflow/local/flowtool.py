"""What `beamflow flows validate` and `beamflow flows run` do, kept out of the CLI module.

``flows run`` uses the local action providers through ``beamflow.local.providers_for(settings)``
(a mapping of ActionUrl → provider, written alongside the local transfer and compute
providers); where that is not available, definitions without Action states still run and an
Action state whose URL has no provider is reported before anything starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from beamflow.local.actions import ActionProvider


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


def local_providers(settings: Any) -> Mapping[str, ActionProvider]:
    """The local action providers for ``settings`` (empty if none are available)."""
    import beamflow.local as local

    factory: Callable[[Any], Mapping[str, ActionProvider]] | None = getattr(
        local, "providers_for", None
    )
    if factory is None:
        return {}
    return dict(factory(settings))
