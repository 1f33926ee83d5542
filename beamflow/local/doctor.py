"""`beamflow doctor` on the local backend: what the embedded backend needs, checked without
running anything (``--probe`` adds the worker probe, :mod:`beamflow.local.worker_check`).

The same checks open ``doctor`` and ``doctor --probe``, so the two agree: no Globus id is
asked of a workspace that never talks to Globus.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from beamflow import registry as reg
from beamflow.config import Settings
from beamflow.worker_check import Check


def check_local(settings: Settings) -> list[Check]:
    """Every check of a local workspace; never raises for a failed check."""
    where = str(settings.source or "beamflow.toml")
    checks: list[Check] = []
    if settings.source is None:
        checks.append(Check(
            name="config", outcome="fail",
            detail="no beamflow.toml found (./beamflow.toml, ~/.config/beamflow/beamflow.toml)",
            fix="run doctor where the workspace's beamflow.toml is, pass --config FILE, or "
            "create one with `beamflow init DIR`",
        ))  # fmt: skip
    else:
        checks.append(Check(name="config", outcome="ok",
                            detail=f"{where}: backend = local (embedded: no Globus)"))
    checks.append(_state_dir(settings.state_dir))
    for label, path in (("detector directory", settings.beamline.detector_dir),
                        ("preview directory", settings.beamline.preview_dir),
                        ("scratch directory", settings.hpc.scratch_dir)):  # fmt: skip
        checks.append(_directory(label, Path(path)))
    engine = settings.compute.engine_config
    if engine is not None and not Path(engine).is_file():
        checks.append(Check(name="compute engine", outcome="fail",
                            detail=f"compute.engine_config {engine}: no such file",
                            fix=f"fix compute.engine_config in {where}, or remove it"))
    else:
        detail = (f"the engine of {engine}" if engine else
                  f"{settings.compute.workers} worker(s) of the local engine")
        checks.append(Check(name="compute engine", outcome="ok", detail=detail))
    checks += _registered(settings)
    return checks


def _state_dir(path: Path) -> Check:
    name = "state directory"
    if not path.exists():
        return Check(name=name, outcome="ok", detail=f"{path} (created on first use)")
    if not os.access(path, os.W_OK | os.X_OK):
        return Check(name=name, outcome="fail", detail=f"{path} is not writable by this user",
                     fix="chown it to the user beamflow runs as, or set state_dir")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check(name=name, outcome="warn",
                     detail=f"{path} is mode {mode:o}: others may read the run store",
                     fix=f"chmod 700 {path}")
    return Check(name=name, outcome="ok", detail=f"{path} (mode 700)")


def _directory(name: str, path: Path) -> Check:
    if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
        return Check(name=name, outcome="ok", detail=str(path))
    what = "is not writable" if path.is_dir() else "does not exist"
    return Check(name=name, outcome="fail", detail=f"{path} {what}",
                 fix=f"mkdir -p {path} (as the user beamflow runs as), or fix beamflow.toml")


def _registered(settings: Settings) -> list[Check]:
    """The shipped function and flows, registered for the local backend and current. The
    agent registers them itself when it starts; `runs start` needs them registered."""
    registry = reg.Registry(settings.registry_path, "local")
    fix = "`beamflow register functions && beamflow register flows` (the agent does it itself)"
    try:
        kinds = (("function", reg.function_names(), registry.entries("function"),
                  reg.function_checksum),
                 ("flow", reg.flow_names(), registry.entries("flow"), reg.flow_checksum))
    except reg.RegistryError as exc:
        return [Check(name="registry", outcome="fail", detail=str(exc))]
    checks = []
    for kind, names, entries, checksum in kinds:
        for name in names:
            entry = entries.get(name)
            if entry is None:
                checks.append(Check(name=f"{kind} {name}", outcome="warn",
                                    detail="not registered yet", fix=fix))
            elif entry.checksum != checksum(name):
                checks.append(Check(name=f"{kind} {name}", outcome="warn",
                                    detail=f"{entry.id}: changed since it was registered",
                                    fix=fix))  # fmt: skip
            else:
                checks.append(Check(name=f"{kind} {name}", outcome="ok",
                                    detail=f"registered: {entry.id}"))
    return checks
