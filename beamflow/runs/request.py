"""What a new run of a scan is asked, checked before anything is recorded: the scan's one path
(:func:`scan_location`), the flow, and the reconstruction parameters (the configured defaults
overridden by the request's, or by ``KEY=VALUE`` from the command line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from beamflow.config import Settings
from beamflow.formats import ScanFormatError, find_scan_file
from beamflow.job.models import RunParameters
from beamflow.validation_text import field_path

DEFAULT_FLOW = "ptycho_reconstruct"
SHARED_FS_FLOW = "ptycho_shared_fs"
FLOWS = (DEFAULT_FLOW, SHARED_FS_FLOW)


class RunInputError(ValueError):
    """A run cannot be built from what was given (scan path, parameters, configuration)."""


class RunRequest(BaseModel):
    """What a new run of a scan is asked: where the scan is, how to reconstruct it (the
    configured defaults overridden by ``params``), and how the run is found again."""

    model_config = ConfigDict(extra="forbid")

    scan_path: Path = Field(description="a scan directory, *_master.h5 or .cxi file")
    params: dict[str, Any] = Field(default_factory=dict)
    dedupe_key: str | None = Field(default=None, description="at most one run per key")
    fraction: float | None = Field(default=None, gt=0, le=1, description="of the frames")
    label: str | None = None
    flow: str = DEFAULT_FLOW


def reconstruction_params(settings: Settings, params: dict[str, Any] | None = None) -> dict:
    """The configured defaults overridden by ``params``; unknown keys and bad values raise
    :class:`RunInputError` naming them."""
    merged = {**settings.reconstruction.model_dump(), **(params or {})}
    try:
        return RunParameters.model_validate(merged).model_dump()
    except ValidationError as exc:
        known = ", ".join(RunParameters.model_fields)
        problems = []
        for err in exc.errors():
            key = field_path(err)
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown parameter {key!r} (known: {known})")
            else:
                problems.append(f"parameter {key}={err.get('input')!r}: {err['msg']}")
        raise RunInputError("; ".join(problems)) from None


def parse_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line; VALUE is JSON when it parses (50, true, null),
    else a string."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise RunInputError(f"--param {text!r}: expected KEY=VALUE (e.g. iterations=50)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def scan_location(settings: Settings, scan_path: str | Path) -> Path:
    """The scan's one path, as every part names it (``scan_path``): its master (or CXI)
    file, absolute, symlinks resolved, checked to exist inside the beamline collection (or
    it could not be transferred). A scan directory stands for the one scan file in it, so a
    scan started as its directory and the same scan found by the agent (as its master file)
    are one scan. Checked when a run is created and again when it starts (the files may have
    gone in between)."""
    scan = Path(scan_path).expanduser().resolve()
    if not scan.exists():
        raise RunInputError(f"scan {scan} does not exist")
    beamline_root = Path(settings.beamline.collection_root).resolve()
    if not scan.is_relative_to(beamline_root):
        raise RunInputError(
            f"scan {scan} is outside the beamline collection root {beamline_root} "
            "(beamline.collection_root in beamflow.toml): it cannot be transferred"
        )
    if scan.is_dir():
        try:
            scan = find_scan_file(scan).resolve()
        except ScanFormatError as exc:  # none, or several: say so before anything is recorded
            raise RunInputError(str(exc)) from None
        if not scan.is_relative_to(beamline_root):  # a link out of the collection
            raise RunInputError(
                f"scan {scan_path}: its scan file is {scan}, outside the beamline collection "
                f"root {beamline_root}: it cannot be transferred"
            )
    return scan
