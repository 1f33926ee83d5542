"""Flow definitions in the Globus Flows language, shipped as package data.

Each flow is a pair of files in this package: ``NAME.json`` (the definition, deployable to
Globus Flows unchanged) and ``NAME.schema.json`` (its strict JSON Schema input schema). They
are read through :mod:`importlib.resources`, so the loader works from a source checkout, an
installed wheel or a zip alike.

- ``ptycho_reconstruct``: Transfer raw scan beamline → HPC, Compute ``reconstruct``,
  Transfer product and previews HPC → beamline.
- ``ptycho_shared_fs``: Compute ``reconstruct`` only, for facilities whose beamline and
  cluster share a file system.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

__all__ = ["FlowNotFound", "flow_names", "load_definition", "load_schema"]

_SCHEMA_SUFFIX = ".schema.json"


class FlowNotFound(LookupError):
    """No flow of that name ships with beamflow; the message lists the ones that do."""


def _files() -> Traversable:
    return resources.files(__name__)


def flow_names() -> list[str]:
    """The names of the shipped flows (file stems), sorted."""
    names = [
        entry.name[: -len(".json")]
        for entry in _files().iterdir()
        if entry.name.endswith(".json") and not entry.name.endswith(_SCHEMA_SUFFIX)
    ]
    return sorted(names)


def _read(name: str, suffix: str) -> dict[str, Any]:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise FlowNotFound(f"{name!r} is not a flow name (known: {', '.join(flow_names())})")
    entry = _files() / f"{name}{suffix}"
    if not entry.is_file():
        raise FlowNotFound(
            f"no flow {name!r}: {name}{suffix} is not in the flows package "
            f"(known: {', '.join(flow_names())})"
        )
    try:
        value = json.loads(entry.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"flows/{name}{suffix}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"flows/{name}{suffix}: must hold a JSON object")
    return value


def load_definition(name: str) -> dict[str, Any]:
    """The flow definition ``NAME.json`` (a fresh copy each call)."""
    return _read(name, ".json")


def load_schema(name: str) -> dict[str, Any]:
    """The flow's input schema ``NAME.schema.json`` (a fresh copy each call)."""
    return _read(name, _SCHEMA_SUFFIX)
