"""What a reconstruction is asked and what it answers: the job, the parameters of one flow
run, the summary, and the errors told in the words of whoever gave the scan.

These are the models the run path, the CLI and the compute function build and check before
any work; running a job is :mod:`beamflow.job.run`. What is asked is kept apart from how
it is done, so that each reads on its own.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from beamflow.checkpoint import CheckpointPolicy, LevelConfig
from beamflow.config import (
    ENGINE_SETTINGS,
    RECONSTRUCTION_DEFAULTS,
    Reconstruction,
    current_names,
)
from beamflow.error_kinds import ErrorKind
from beamflow.ptycho.forward.propagation import PropagationModel
from beamflow.ptycho.state import ReconParams

#: environment variable naming a node-local directory for the L1 checkpoint level
L1_ENV = "BEAMFLOW_CHECKPOINT_L1_DIR"


class ReconstructError(Exception):
    """The job cannot run (bad scan data, bad probe file, ...); the message says why.
    ``kind``: what kind of fault it is, for whoever decides on a retry (beamflow.error_kinds)."""

    kind = ErrorKind.BAD_INPUT


# The engine's checks name its own classes (PtychoData.intensities, ...): right for a
# programmer, meaningless to the person who gave a scan file. Their words instead.
_ENGINE_WORDS = [
    (re.compile(r"PtychoData\.append intensities|PtychoData\.append"), "the new frames"),
    (re.compile(r"PtychoData\.intensities"), "the diffraction frames"),
    (re.compile(r"PtychoData\.positions_px"), "the scan positions"),
    (re.compile(r"PtychoData\.mask"), "the detector pixel mask"),
    (re.compile(r"PtychoData\.object_shape"), "the object size"),
    (re.compile(r"ReconState\.from_arrays"), "the checkpoint's state"),
    (re.compile(r"ReconState\.extend_positions"), "the new positions"),
    (re.compile(r"ReconState\.(\w+)"), r"the \1"),
    (re.compile(r"\b(PtychoData|ReconState|ReconParams|Reconstructor)\b(\.\w+)*"),
     "the reconstruction"),
]


def plain_words(message: str) -> str:
    """An engine message in the words of someone who gave a scan file, not a class name."""
    for pattern, words in _ENGINE_WORDS:
        message = pattern.sub(words, message)
    return message


def length_text(metres: float) -> str:
    """A length in the unit a person reads it in: ``12 nm``, ``55 µm``, ``3.65 mm``, ``1.12 m``."""
    for unit, scale in (("nm", 1e-9), ("µm", 1e-6), ("mm", 1e-3)):
        shown = f"{metres / scale:.3g}"
        if abs(float(shown)) < 1000:  # as shown: 999.7 nm reads "1 µm", not "1e+03 nm"
            return f"{shown} {unit}"
    return f"{metres:.3g} m"


def check_out_dir(out: Path) -> None:
    """Refuse an output path that cannot become a directory, naming it, before any work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReconstructError(
            f"{out}: the output directory is an existing file; give a directory "
            "(it is created if missing)"
        )
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ReconstructError(
            f"{out}: the output directory cannot be created: {parent} is a file"
        )
    if not out.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ReconstructError(
            f"{out}: the output directory cannot be created: no permission to write in "
            f"{parent}"
        )


#: flat keys accepted as shorthands for `params` fields (CLI, compute function kwargs): the
#: engine's settings by their names (the old names of renamed ones: config.current_names)
_PARAM_SHORTHANDS = {name: name for name in ENGINE_SETTINGS}


class RunParameters(Reconstruction):
    """What one flow run asks of a reconstruction: the ``[reconstruction]`` defaults of
    beamflow.toml plus the choices that belong to a single run. The run path validates them
    when a run is created, and the compute function again on the endpoint."""

    resume: bool = Field(default=True, description="continue from the scan's latest "
                         "checkpoint when one fits")
    max_frames: int | None = Field(default=None, ge=1, description="read only the first N "
                                   "frames (progressive runs)")
    aborted: bool = Field(default=False, description="the scan stopped early: reconstruct "
                          "the frames there are")


#: The run parameters a flow's input must carry (the rest take their defaults).
FLOW_REQUIRED_PARAMETERS = ("algorithm", "iterations")


def flow_parameters_schema() -> dict[str, Any]:
    """The ``reconstruction`` part of the flows' input schemas (``flows/*.schema.json``),
    derived from :class:`RunParameters`: the same names, limits and descriptions as the
    engine and ``[reconstruction]``. tests/flows/test_flows_defs.py checks that the shipped
    schemas hold exactly this; ``python -m beamflow.job.models`` prints it."""
    source = RunParameters.model_json_schema()
    properties = {}
    for name, spec in source["properties"].items():
        branches = spec.get("anyOf", [spec])
        types = [b["type"] for b in branches]
        out: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
        enum = [v for b in branches for v in b.get("enum", [])]
        if enum:
            out["enum"] = enum + ([None] if "null" in types else [])
        for b in branches:
            out.update({k: v for k, v in b.items()
                        if k not in ("type", "enum", "title", "default", "description")})
        out["default"] = spec.get("default")
        out["description"] = spec.get("description", "").replace("None", "null")
        properties[name] = out
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": list(FLOW_REQUIRED_PARAMETERS), "title": "Reconstruction parameters"}


class ReconstructJob(BaseModel):
    """One reconstruction: which scan, where to, how, and how to checkpoint.

    The engine's settings (``ENGINE_SETTINGS``: `algorithm`, `iterations`, `batch_size`, ...)
    may be given flat (they go into `params`; a flat None means the configured default);
    `node_local_dir` is `l1_dir`; `aborted` (the scan stopped early) implies `allow_partial`.
    """

    model_config = ConfigDict(extra="forbid")

    scan: Path
    out: Path
    name: str | None = Field(default=None, description="product name (default: the scan's)")
    params: ReconParams = Field(default_factory=ReconParams)
    device: str = RECONSTRUCTION_DEFAULTS.device
    probe: Path | None = Field(default=None, description="initial probe (.npy or product .h5)")
    max_frames: int | None = Field(default=None, ge=1, description="use at most this many frames")
    allow_partial: bool = Field(default=False, description="use the frames written so far")
    resume: bool = True
    # checkpoint policy: L2 = DIR/checkpoints; L1 = node-local (off unless a dir is given)
    checkpoint_dir: Path | None = Field(default=None, description="L2 (default DIR/checkpoints)")
    checkpoint_every: int | None = Field(
        default=RECONSTRUCTION_DEFAULTS.checkpoint_every, ge=0,
        description="0/None: only at the end")
    checkpoint_seconds: float | None = Field(default=None, gt=0)
    checkpoint_keep: int = Field(default=3, ge=1)
    l1_dir: Path | None = Field(default=None, description=f"node-local base dir (or ${L1_ENV})")
    l1_every: int | None = Field(default=1, ge=1)
    l1_seconds: float | None = Field(default=None, gt=0)
    checkpoint_max_overhead: float | None = Field(
        default=0.04, gt=0, le=1, description="CPU budget of the checkpoint writers per level "
        "(fraction of elapsed time); a due checkpoint waits until it fits. None: no limit")
    preview_every: int = Field(
        default=RECONSTRUCTION_DEFAULTS.preview_every, ge=0,
        description="0: previews only at the end")
    preview_min_seconds: float = Field(
        default=2.0, ge=0, description="at most one preview refresh per this many seconds")
    propagation: PropagationModel | None = Field(
        default=None, description="far-field or near-field (None: as the scan file says, "
        "else far-field)")
    focus_distance_m: float | None = Field(
        default=None, gt=0, description="near field, cone beam: focus-to-sample distance z1 "
        "(None: as the scan file says, else a parallel beam)")
    object_margin_px: int = Field(default=8, ge=0)
    threads: int | None = Field(default=None, ge=1, description="CPU threads (default: all)")
    handle_sigterm: bool = Field(
        default=True, description="on SIGTERM: save at the iteration boundary, then exit 143")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, values: Any) -> Any:
        values = current_names(values)
        if not isinstance(values, dict):
            return values
        params = values.get("params", {})
        params = params.model_dump() if isinstance(params, ReconParams) else dict(params)
        for field in ENGINE_SETTINGS:
            params.setdefault(field, getattr(RECONSTRUCTION_DEFAULTS, field))
        for key, field in _PARAM_SHORTHANDS.items():
            if key in values:
                value = values.pop(key)
                if value is not None:
                    params[field] = value
        values["params"] = params
        if "node_local_dir" in values:
            values.setdefault("l1_dir", values.pop("node_local_dir"))
        if values.pop("aborted", False):
            values["allow_partial"] = True
        return values

    @property
    def l2_dir(self) -> Path:
        return self.checkpoint_dir or self.out / "checkpoints"

    def l1_path(self) -> Path | None:
        base = self.l1_dir or (Path(os.environ[L1_ENV]) if os.environ.get(L1_ENV) else None)
        if base is None:
            return None
        # one node-local directory per output directory, so runs never share checkpoints
        key = hashlib.sha256(str(self.out.resolve()).encode()).hexdigest()[:12]
        return Path(base) / f"beamflow-{self.out.name}-{key}"

    def policy(self) -> CheckpointPolicy:
        l1 = self.l1_path()
        return CheckpointPolicy(
            max_overhead=self.checkpoint_max_overhead,
            l1=None if l1 is None else LevelConfig(
                dir=l1, every_iterations=self.l1_every, every_seconds=self.l1_seconds, keep=2),
            l2=LevelConfig(dir=self.l2_dir, every_iterations=self.checkpoint_every or None,
                           every_seconds=self.checkpoint_seconds, keep=self.checkpoint_keep),
        )


#: The starting probe, as recorded in the summary, the product comments and the job's log.
PROBE_FROM_FILE, PROBE_FROM_OPTICS, PROBE_FROM_DATA = "file", "optics", "data"


class ReconstructSummary(BaseModel):
    """What `beamflow reconstruct --json` prints (one line)."""

    iterations: int = Field(description="iterations completed in total")
    iterations_this_run: int
    seconds_per_iteration: float | None = Field(description="median, excluding the first")
    final_loss: float | None
    device: str
    fft: str = Field(description="the FFT library: fftw or pocketfft (CPU), cufft (GPU)")
    product: str
    previews: list[str]
    resumed_from_iteration: int | None
    continuation: bool = Field(description="resumed with more frames than the checkpoint")
    checkpoint: str | None = Field(description="the last checkpoint written (L2)")
    checkpoint_errors: list[str]
    n_frames: int
    algorithm: str
    seconds: float
    initial_probe: str = Field(
        default=PROBE_FROM_DATA,
        description="starting probe: file (--probe), optics (the scan's zone plate), "
        "data (mean diffraction)")
    propagation: PropagationModel = "far-field"
    focus_distance_m: float | None = None
    object_pixel_size_m: float
    verdict: Literal["trusted", "suspect"]
    verdict_reasons: list[str] = Field(description="why the result is suspect (empty when "
                                       "trusted)")
    verdict_metrics: dict[str, float | None] = Field(
        description="the numbers the verdict was computed from")
    notes: list[str] = Field(
        default_factory=list, description="what the geometry asks the user to check (e.g. "
        "near field without a focus distance)")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="the engine's settings this run used, the "
        "algorithm and its defaults resolved (alpha, beta, batch_size, center_probe)")


def settings_used(params: ReconParams, n_positions: int) -> dict[str, Any]:
    """The engine's settings (``ENGINE_SETTINGS``) of ``params`` as the engine applies them
    to ``n_positions`` positions: ``auto`` is the algorithm it chose, and an unset alpha,
    beta, batch size or probe centring is replaced by the algorithm's value."""
    used = params.model_dump(mode="json", include=set(ENGINE_SETTINGS))
    used.update(algorithm=params.algorithm_name, probe_modes=params.probe_modes_value,
                alpha=params.alpha_value, beta=params.beta_value,
                batch_size=params.batch_size_for(n_positions), center_probe=params.centering)
    return used


class FunctionSummary(BaseModel):
    """What the reconstruct function (functions/reconstruct.py) returns through the flow: the
    main numbers of the job's :class:`ReconstructSummary` and where its files are, absolute
    on the cluster and relative to its output directory (the flow brings that directory
    back). Fields a function of another version adds are kept."""

    model_config = ConfigDict(extra="allow")

    run_name: str | None = None
    algorithm: str | None = None
    iterations: int | None = None
    iterations_this_run: int | None = None
    n_frames: int | None = None
    seconds_per_iteration: float | None = None
    final_loss: float | None = None
    resumed_from_iteration: int | None = None
    device: str | None = None
    product: str | None = None
    previews: list[str] = Field(default_factory=list)
    product_relative: str = "product.h5"
    previews_relative: list[str] = Field(default_factory=list)
    verdict: Literal["trusted", "suspect"] | None = None
    verdict_reasons: list[str] = Field(default_factory=list)


#: progress(iteration, stop_iteration, loss): the iterations done in total, the iteration the
#: run stops at, the last loss
ProgressCallback = Callable[[int, int, float | None], None]


if __name__ == "__main__":  # the flows' schemas' "reconstruction" part, for flows/*.schema.json
    import json

    print(json.dumps(flow_parameters_schema(), indent=2, ensure_ascii=False))
