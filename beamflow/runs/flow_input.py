"""The flow-input recipe: the input of a flow for one run of a scan, and where its files go.

The same layout on the local backend and at a facility:

- beamline side: the scan is read where the detector wrote it (inside
  ``beamline.collection_root``); product and previews come back to
  ``beamline.preview_dir/<run name>/`` (``product.h5``, ``previews/*.png``);
- HPC side, under ``hpc.scratch_dir/<scan key>/``: ``raw/`` (the transferred scan: a later
  run of the same scan copies only new files), ``checkpoints/`` (shared by the scan's runs,
  so a retry or a run with more frames continues from the last one) and
  ``runs/<run name>/`` (what the function writes).

The ``<scan key>`` and ``<run name>`` are :mod:`beamflow.runs.naming`'s.

One name per meaning, the same from the agent to the compute function:

- ``scan_path``: the scan's file (its master file, or its ``.cxi`` file) on the machine that
  reads it: the run's on the beamline (``Run.scan_path``), and ``compute.scan_path`` on the
  compute nodes, passed to the ``reconstruct`` function as its argument ``scan_path``;
- ``raw_path``: the scan's raw data as a path in a Globus collection, what the first
  transfer moves: the master file's directory (with its data files) or the one scan file,
  ``beamline.raw_path`` copied to ``hpc.raw_path`` (``raw_is_directory``: moved recursively);
- ``results_path``: the run's results directory in a collection, ``hpc.results_path`` (the
  function's ``output_dir``) copied back to ``beamline.results_path``.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from beamflow.config import Settings
from beamflow.registry import Registry, RegistryError
from beamflow.runs.naming import MASTER_SUFFIX, scan_key
from beamflow.runs.request import (
    DEFAULT_FLOW,
    FLOWS,
    SHARED_FS_FLOW,
    RunInputError,
    reconstruction_params,
    scan_location,
)

FUNCTION = "reconstruct"


def _collection_path(path: PurePosixPath, root: PurePosixPath, what: str) -> str:
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise RunInputError(f"{what} {path} is not inside its collection root {root}") from None
    return "/" + rel.as_posix() if rel.parts else "/"


def transferred(scan: Path) -> Path:
    """What a run of ``scan`` (its :func:`scan_location`) moves to the cluster: a master
    file's directory (its data files sit beside it), else the file itself."""
    return scan.parent if scan.is_file() and scan.name.endswith(MASTER_SUFFIX) else scan


def flow_input_for(
    settings: Settings,
    scan_path: str | Path,
    params: dict[str, Any] | None,
    run_name: str,
    *,
    flow: str = DEFAULT_FLOW,
    function_id: str | None = None,
    fraction: float | None = None,
) -> dict[str, Any]:
    """The input of ``flow`` for one run of the scan at ``scan_path`` (a local path on the
    beamline machine: a scan directory, a ``*_master.h5`` file or a ``.cxi`` file).

    ``function_id`` defaults to the ``reconstruct`` function registered for the configured
    backend (raises :class:`RunInputError` saying how to register it when it is not).
    ``fraction`` below 1 marks a progressive run: its batch job gets ``cluster.preview``'s
    resources, a run of the whole scan ``cluster.final``'s."""
    if flow not in FLOWS:
        raise RunInputError(f"no input recipe for flow {flow!r} (known: {', '.join(FLOWS)})")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}", run_name):
        raise RunInputError(f"run name {run_name!r}: letters, digits, '_' and '-' only")
    scan = scan_location(settings, scan_path)
    beamline_root = Path(settings.beamline.collection_root).resolve()
    moved = transferred(scan)
    key = scan_key(scan)

    preview_dir = Path(settings.beamline.preview_dir).resolve()
    results_local = preview_dir / run_name
    if not results_local.is_relative_to(beamline_root):
        raise RunInputError(
            f"beamline.preview_dir {preview_dir} is outside beamline.collection_root "
            f"{beamline_root}: results could not come back"
        )

    # HPC paths are paths on another machine: pure path arithmetic, nothing resolved here.
    hpc_root = PurePosixPath(str(settings.hpc.collection_root))
    scratch = PurePosixPath(str(settings.hpc.scratch_dir))
    work = scratch / key
    raw = work / "raw" / moved.name  # the copy of what was moved
    run_dir = work / "runs" / run_name
    allowed = [str(scratch)]
    if settings.hpc.node_local_dir:
        allowed.append(str(settings.hpc.node_local_dir))

    if function_id is None:
        try:
            function_id = Registry(settings.registry_path, settings.backend).require_id(
                "function", FUNCTION
            )
        except RegistryError as exc:
            raise RunInputError(str(exc)) from None
    endpoint = settings.compute.endpoint_id
    if not endpoint:
        raise RunInputError("compute.endpoint_id is not set in beamflow.toml")

    reconstruction = reconstruction_params(settings, params)
    compute: dict[str, Any] = {
        "endpoint_id": endpoint,
        "function_id": function_id,
        "checkpoint_dir": str(work / "checkpoints"),
        "node_local_dir": str(settings.hpc.node_local_dir) if settings.hpc.node_local_dir else None,
        "allowed_roots": allowed,
        "user_endpoint_config": run_resources(settings, fraction),
    }
    if flow == SHARED_FS_FLOW:
        # One file system: the function reads the scan in place and writes the results
        # where the beamline reads them.
        compute.update(
            scan_path=str(scan),
            output_dir=str(results_local),
            allowed_roots=[str(beamline_root), *allowed],
        )
        return {"run_name": run_name, "compute": compute, "reconstruction": reconstruction}

    compute.update(
        scan_path=str(raw / scan.name) if moved != scan else str(raw),
        output_dir=str(run_dir),
    )
    return {
        "run_name": run_name,
        "raw_is_directory": moved.is_dir(),
        "beamline": {
            "collection_id": settings.beamline.collection_id,
            "raw_path": _collection_path(
                PurePosixPath(str(moved)), PurePosixPath(str(beamline_root)), "scan"
            ),
            "results_path": _collection_path(
                PurePosixPath(str(results_local)),
                PurePosixPath(str(beamline_root)),
                "results directory",
            ),
        },
        "hpc": {
            "collection_id": settings.hpc.collection_id,
            "raw_path": _collection_path(raw, hpc_root, "hpc.scratch_dir"),
            "results_path": _collection_path(run_dir, hpc_root, "hpc.scratch_dir"),
        },
        "compute": compute,
        "reconstruction": reconstruction,
    }


def run_resources(settings: Settings, fraction: float | None) -> dict[str, str]:
    """The Reconstruct step's ``user_endpoint_config``: the preview resources for a part of
    a scan, the final ones for all of it (a short queue for early images, a long one for
    the full reconstruction)."""
    progressive = fraction is not None and fraction < 1.0
    cluster = settings.cluster
    return (cluster.preview if progressive else cluster.final).endpoint_config()
