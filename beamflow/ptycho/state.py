"""Parameters, measured data and reconstruction state of the ptychography engine.

* :class:`ReconParams` — the algorithm and its settings (a pydantic model; bad values raise
  ``pydantic.ValidationError`` with a message naming the field).
* :class:`PtychoData` — the measurement on the host: intensities in detector view, valid-pixel
  mask, scan positions in object pixels, object shape.
* :class:`ReconState` — everything needed to continue a reconstruction bit-identically:
  object, probe modes, (corrected) positions, iteration, loss history, parameters, the
  counter-based RNG's seed and counter, and per-algorithm memory (``extras``, e.g. the
  difference map's exit waves). ``to_host_arrays()`` + ``meta()`` is what checkpoints store;
  ``ReconState.from_arrays(arrays, meta)`` restores it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .algorithms.catalog import AUTO, CATALOG, AlgorithmChoice, AlgorithmTraits, algorithm_for
from .forward.propagation import Propagation
from .forward.slices import slice_spacings, spacing_from_text

__all__ = ["ReconParams", "settings_that_apply", "PtychoData", "ReconState",
           "STATE_FORMAT"]

STATE_FORMAT = "beamflow.ptycho.state/1"

#: Probe modes of a near-field scan unless set: from the probe guessed from the data a single
#: mode stagnates in a local minimum on holograms of aberrated optics, and a second mode
#: leads the iterations out of it (18 independent near-field scans: NRMSE ×0.41–0.92 of one
#: mode's after 200 mPIE iterations, geometric mean ×0.68; this project's own simulator
#: 5–10 % higher; docs/reconstruction.md, Unseen scans).
NEAR_FIELD_PROBE_MODES = 2

# A far-field scan of at least this many batches of an algorithm's ``large_scan_batch``
# takes that batch by default (ReconParams.batch_size_for).
LARGE_SCAN_BATCHES = 12


class ReconParams(BaseModel):
    """Settings of one reconstruction.

    ``alpha``/``beta`` mean different things per algorithm (``None`` = the default):

    ========  ============================================  =====================================
    algo      alpha                                         beta
    ========  ============================================  =====================================
    epie      object step (0, 2], default 1                 probe step (0, 2], default 1
    rpie      object regularisation (0, 1], default 0.1     probe regularisation (0, 1], 0.1
    mpie      as rpie                                       as rpie
    dm        object Tikhonov weight (x max) (0, 1], 1e-2   probe Tikhonov weight (0, 1], 1e-2
    lsqml     preconditioner regularisation (0, 1], 0.1     step-length damping (0, 1], 0.9
    ========  ============================================  =====================================

    ``batch_size`` (``None`` = the algorithm's default, see :meth:`batch_size_for`) is the
    number of positions whose updates are applied together. ``batch_selection``:
    ``"random"`` (a fresh random partition every iteration), ``"compact"`` (spatially
    clustered batches at a random offset, in random order: cheap object updates on large
    objects), ``"sparse"`` (random sets of mutually non-overlapping positions, which
    reproduces one-position-at-a-time PIE semantics exactly), ``"all"`` (one batch of every
    position), or ``"auto"`` (ePIE: sparse; rPIE/LSQ-ML: random, or compact when the object
    is larger than twice the batch's windows; DM: all — DM is a global algorithm).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    algorithm: AlgorithmChoice = Field(
        AUTO, description="The algorithm: auto (rpie in the far field, mpie in the near "
        "field), rpie, epie, mpie, dm or lsqml.")
    iterations: int = Field(100, ge=0, le=1_000_000, description="Target total iteration count.")
    batch_size: int | None = Field(
        None, ge=1, description="Positions whose updates are applied together (None: the "
        "algorithm's default for the scan's size).")
    batch_selection: Literal["auto", "random", "compact", "sparse", "all"] = Field(
        "auto", description="How positions are grouped into batches: auto, random, compact, "
        "sparse or all (auto: sparse for epie, all for dm, random or compact otherwise).")
    probe_modes: int | None = Field(
        None, ge=1, le=64, description="Incoherent (mixed-state) probe modes (None: 1, or 2 "
        "for a near-field scan).")
    alpha: float | None = Field(
        None, description="Object step (epie) or regularisation (rpie, dm, lsqml); range and "
        "default per algorithm (None: the algorithm's default).")
    beta: float | None = Field(
        None, description="Probe step (epie), probe regularisation (rpie, dm) or step "
        "damping (lsqml); range and default per algorithm (None: the algorithm's default).")
    probe_update_start: int = Field(0, ge=0, description="First iteration that updates the probe.")
    object_update_start: int = Field(0, ge=0,
                                     description="First iteration that updates the object.")
    position_correction: bool = Field(False, description="Refine the scan positions.")
    position_correction_start: int = Field(
        10, ge=0, description="First iteration that refines the positions.")
    position_step_limit_px: float = Field(
        0.5, gt=0, le=8, description="Largest position change per update, in object pixels."
    )
    noise_model: Literal["gaussian", "poisson"] = Field(
        "gaussian", description="The data's noise model: gaussian, or poisson (lsqml only).")
    orthogonalize_every: int = Field(
        1, ge=1, description="Orthogonalise probe modes every N iterations (K > 1)."
    )
    center_probe: bool | None = Field(
        None,
        description="Re-centre the probe in its window after each iteration, moving the "
        "object with it (None: on for far-field dm, whose probe and object otherwise drift "
        "together once it reaches the noise floor; off for the others).",
    )
    momentum: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="mpie: the object's momentum η (friction of the heavy-ball velocity); "
        "None: 0.9, or 0.7 with several layers.")
    # The probe's η as the object's: with less, a probe guess far from the beam lags the
    # accelerated object (docs/reconstruction.md, mPIE; tests/ptycho/test_unseen_scans.py).
    probe_momentum: float = Field(0.9, ge=0.0, lt=1.0, description="mpie: the probe's η.")
    momentum_every: int = Field(
        8, ge=1, le=1024, description="mpie: apply the momentum every N batches.")
    opr_modes: int = Field(
        0, ge=0, le=16,
        description="Variable probe (orthogonal probe relaxation): the first probe mode at "
        "position j is Σ_k w_jk U_k over K eigen-probes (U_0 the mean probe); 0 = off. "
        "rpie, mpie and lsqml.")
    opr_weight_smoothing: float = Field(
        0.5, ge=0.0, le=1.0,
        description="Variable probe: pull each position's weights towards the mean of its "
        "neighbours in acquisition order by this fraction per iteration (0 = off). A beam "
        "varies slowly in time; unsmoothed weights also absorb object errors.")
    slices: int = Field(
        1, ge=1, le=64,
        description="Object layers (multislice, for samples thicker than the depth of field "
        "Δx²/λ); 1 = a thin sample. Needs slice_spacing_m and the wavelength and object pixel "
        "size in the propagation geometry (a reconstruction job takes them from the scan).")
    slice_spacing_m: float | list[float] | None = Field(
        None, description="Distance between the layers in metres: one value for every gap, or "
        "slices−1 values.")
    layer_regularization: float = Field(
        0.0, ge=0.0, le=100.0,
        description="Multislice: the strength β of the regulariser along depth (the kz filter "
        "of fold_slice and Pty-Chi), applied once per iteration; 0 = off.")
    seed: int = Field(0, ge=0, lt=2**63, description="Seed of the batch order.")
    propagation: Propagation = Field(
        default_factory=Propagation,
        description="far field (default) or near field with its effective geometry")

    @model_validator(mode="after")
    def _check_algorithm_values(self) -> ReconParams:
        d = self.traits
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if value is None:
                continue
            lo, hi = getattr(d, f"{name}_range")
            if not (math.isfinite(value) and lo < value <= hi):
                raise ValueError(
                    f"{name}={value} is out of range for algorithm '{self.algorithm_name}': "
                    f"expected {lo} < {name} <= {hi}"
                )
        if self.noise_model == "poisson" and not d.poisson:
            raise ValueError(
                f"noise_model='poisson' is only implemented by algorithm "
                f"{_names(lambda t: t.poisson)}, not '{self.algorithm_name}'"
            )
        if self.propagation.near_field and self.center_probe:
            raise ValueError(
                "center_probe=True does not apply to near-field propagation: the probe's "
                "place relative to the detector is part of the hologram"
            )
        if self.opr_modes and not d.variable_probe:
            raise ValueError(
                f"opr_modes={self.opr_modes} (variable probe) is implemented by "
                f"{_names(lambda t: t.variable_probe)}, not '{self.algorithm_name}'"
            )
        if self.slices > 1:
            self._check_multislice()
        elif isinstance(self.slice_spacing_m, list) and len(self.slice_spacing_m) > 0:
            raise ValueError(f"slice_spacing_m has {len(self.slice_spacing_m)} values but "
                             "slices=1 has no gaps between layers")
        if d.global_update and self.batch_selection not in ("auto", "all"):
            raise ValueError(
                f"batch_selection='{self.batch_selection}' does not apply to "
                f"'{self.algorithm_name}': it updates from all positions at once (use 'auto' or "
                "'all')"
            )
        return self

    @field_validator("slice_spacing_m", mode="before")
    @classmethod
    def _spacing_from_text(cls, value: Any) -> Any:
        """``"4e-4"`` or ``"1e-4,2e-4"`` (a command line's or a KEY=VALUE's form) as numbers."""
        return spacing_from_text(value) if isinstance(value, str) else value

    def _check_multislice(self) -> None:
        if not self.traits.layers:
            raise ValueError(
                f"algorithm '{self.algorithm_name}' does not model thick samples "
                f"(slices={self.slices}): use {_names(lambda t: t.layers)}")
        slice_spacings(self.slices, self.slice_spacing_m)  # raises with the reason

    # -- resolved values ------------------------------------------------------------------
    @property
    def algorithm_name(self) -> str:
        """The algorithm that runs: ``algorithm``, with ``auto`` resolved for the
        propagation (:func:`~.algorithms.catalog.algorithm_for`)."""
        return algorithm_for(self.algorithm, self.propagation.near_field)

    @property
    def traits(self) -> AlgorithmTraits:
        """What the catalog knows of the algorithm that runs."""
        return CATALOG[self.algorithm_name]

    @property
    def probe_modes_value(self) -> int:
        """``probe_modes``, or its default for the propagation: 1, and
        :data:`NEAR_FIELD_PROBE_MODES` in the near field."""
        if self.probe_modes is not None:
            return self.probe_modes
        return NEAR_FIELD_PROBE_MODES if self.propagation.near_field else 1

    def for_propagation(self, propagation: Propagation) -> ReconParams:
        """These settings for a scan of ``propagation`` (a job learns it from the scan's
        file), ``auto`` and the probe modes' default resolved: what runs, is recorded and is
        checkpointed names the algorithm and the modes."""
        moved = self.model_copy(update={"propagation": propagation})
        return moved.model_copy(update={"algorithm": moved.algorithm_name,
                                        "probe_modes": moved.probe_modes_value})

    @property
    def slice_spacings(self) -> tuple[float, ...]:
        """The S−1 distances between the layers (metres); () for a thin sample."""
        if self.slices == 1:
            return ()
        return slice_spacings(self.slices, self.slice_spacing_m)

    @property
    def alpha_value(self) -> float:
        """``alpha`` or the algorithm's default."""
        return float(self.traits.alpha if self.alpha is None
                     else self.alpha)

    @property
    def beta_value(self) -> float:
        """``beta`` or the algorithm's default."""
        return float(self.traits.beta if self.beta is None
                     else self.beta)

    @property
    def momentum_value(self) -> float:
        """``momentum`` or its default: 0.9 (Maiden et al. 2017), 0.7 with several layers —
        measured on a two-layer scan of 81 positions, 0.9 diverged after 20 iterations while
        0.5–0.8 converged, and 0.7 kept a margin on three layers
        (tests/ptycho/forward/test_multislice.py).
        The exchange of content between layers that the data cannot see is where a fast
        heavy ball runs away."""
        if self.momentum is not None:
            return float(self.momentum)
        return 0.9 if self.slices == 1 else 0.7

    @property
    def centering(self) -> bool:
        """``center_probe`` with ``None`` resolved for the algorithm."""
        if self.center_probe is None:
            return self.traits.centres_probe and not self.propagation.near_field
        return bool(self.center_probe)

    @property
    def selection(self) -> str:
        """Batch selection with ``"auto"`` resolved for the algorithm."""
        if self.batch_selection != "auto":
            return self.batch_selection
        return self.traits.batch_selection

    def batch_size_for(self, n_positions: int) -> int:
        """Batch size with ``None`` resolved (DM and 'all': every position).

        The default for random/compact batches is a power of two near N/3 (N >= 256) or N/8
        (smaller scans, which need more updates per iteration to converge in tens of
        iterations), within 4..128: 128 for 400 positions (four batches of 100). On the
        400-position benchmark scan that reaches object NRMSE 0.034 after 100 rPIE
        iterations (0.036 with 32 or 64) at ~10% less CPU per iteration than 64, since
        every batch pays fixed costs (object-sized and probe updates).

        Far-field LSQ-ML takes batches of 256 on scans of at least 12 of them (3072
        positions): its step lengths are the batch's own least-squares optimum, and there
        256 reconstructs better than 128 per iteration — object NRMSE 0.0278 against 0.0289
        after 100 iterations at 4000 × 128² (CPU and H100 alike), 0.0798 against 0.0832
        after 20 at 10000 × 256² (H100), while 512 is worse than 128 on both (0.0341,
        0.0852; docs/performance.md, sixth session) — at half the batches' fixed cost. rPIE
        is best at 128 there (0.0398 against 0.0482 at 256), and so is the near field
        (LSQ-ML at 4000 × 128²: 0.168 at 128, 0.197 at 256).
        """
        if self.selection == "all":
            return max(1, n_positions)
        b = self.batch_size
        if b is None:
            b = self.traits.batch_size
            large = self.traits.large_scan_batch
            if (large is not None and n_positions >= LARGE_SCAN_BATCHES * large
                    and not self.propagation.near_field):
                b = large
            elif b is not None:
                target = n_positions / (3 if n_positions >= 256 else 8)
                b = int(min(128, max(4, 2 ** round(math.log2(max(target, 1.0))))))
        return max(1, min(int(b or n_positions), n_positions))


def _names(has: Any) -> str:
    """The algorithms with a trait, for a message: ``'rpie', 'mpie' or 'lsqml'``."""
    names = [f"'{n}'" for n, t in CATALOG.items() if has(t)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def settings_that_apply(settings: dict[str, Any]) -> set[str]:
    """The names in ``settings`` (ReconParams' fields as a plain dict, e.g. a run's recorded
    parameters) that change what the engine does with the others as given: mPIE's momenta
    only for mpie, the variable probe's smoothing only with opr_modes, the position
    correction's start and step limit only with it on, the noise model only for lsqml,
    orthogonalisation only with several probe modes, the layers' spacing and regulariser only
    with several layers."""
    choice = str(settings.get("algorithm", AUTO))
    traits = CATALOG.get(choice)
    # auto: mPIE's momenta apply to a near-field scan, which its settings do not tell
    momentum = choice == AUTO or (traits is not None and traits.momentum)
    needs = {
        "momentum": momentum,
        "probe_momentum": momentum,
        "momentum_every": momentum,
        "opr_weight_smoothing": bool(settings.get("opr_modes")),
        "position_correction_start": bool(settings.get("position_correction")),
        "position_step_limit_px": bool(settings.get("position_correction")),
        "noise_model": traits is not None and traits.poisson,
        # None: the near field's default of two modes may apply
        "orthogonalize_every": settings.get("probe_modes") is None
        or settings["probe_modes"] > 1,
        "slice_spacing_m": (settings.get("slices") or 1) > 1,
        "layer_regularization": (settings.get("slices") or 1) > 1,
    }
    return {name for name in settings if needs.get(name, True)}


def _as_float_array(
    name: str, a: Any, ndim: int, dtype: Any, check_finite: bool = True
) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"PtychoData.{name}: cannot convert to an array ({exc})") from exc
    if arr.ndim != ndim:
        raise ValueError(f"PtychoData.{name}: expected {ndim} dimensions, got shape {arr.shape}")
    if np.iscomplexobj(arr):
        raise ValueError(f"PtychoData.{name}: expected real values, got {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=dtype)
    if check_finite and not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"PtychoData.{name}: {bad} non-finite value(s) (NaN or inf)")
    return arr


def _check_valid_pixels(what: str, inten: np.ndarray, mask: np.ndarray) -> None:
    """Valid pixels must be finite and >= 0; invalid ones may hold anything (NaN included).

    Checked in blocks of frames so a large scan needs no full-size temporary.
    """
    for start in range(0, inten.shape[0], 64):
        block = inten[start : start + 64][:, mask]
        finite = np.isfinite(block)
        if not finite.all():
            j = start + int(np.flatnonzero(~finite.all(axis=1))[0])
            raise ValueError(
                f"{what}: non-finite value (NaN or inf) on a valid pixel of frame {j}; "
                "mark such pixels invalid in the mask"
            )
        lo = float(block.min()) if block.size else 0.0
        if lo < 0:
            j = start + int(np.flatnonzero((block < 0).any(axis=1))[0])
            raise ValueError(
                f"{what}: negative value {lo:g} on a valid pixel (frame {j}); clip the data "
                "or mark those pixels invalid in the mask"
            )


class _Consumed:
    """Stands in for intensities an engine took over: keeps their shape, refuses their values."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(
            "PtychoData: the intensities were consumed by a Reconstructor "
            "(consume_data=True) and now hold its amplitudes; build a new PtychoData"
        )

    __getitem__ = __array__ = _refuse


@dataclass
class PtychoData:
    """The measured data of one scan, on the host.

    intensities: (N, M, M) float32 counts in detector view (zero frequency in the centre,
        as a detector records it; the engine ``ifftshift``s once when moving to the device).
    mask: (M, M) bool, True where a pixel is valid (default: all); invalid pixels carry no
        constraint and may hold anything, NaN included (their values are never used). Valid
        pixels must be finite and >= 0.
    positions_px: (N, 2) float64 (y, x) of each probe window's top-left corner in object
        pixels, sub-pixel. The window of position j covers object rows
        ``round(y_j) .. round(y_j)+M-1`` (and likewise columns); the fractional remainder is
        applied exactly by Fourier-shifting the probe.
    object_shape: (H, W) of the object array; every window must lie inside it.
    """

    intensities: np.ndarray
    positions_px: np.ndarray
    object_shape: tuple[int, int]
    mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        inten = _as_float_array("intensities", self.intensities, 3, np.float32, False)
        n, m1, m2 = inten.shape
        if m1 != m2:
            raise ValueError(f"PtychoData.intensities: frames must be square, got {m1}x{m2}")
        if m1 < 2:
            raise ValueError(f"PtychoData.intensities: frames of {m1}x{m2} px are too small")
        if n == 0:
            raise ValueError("PtychoData.intensities: no frames")
        pos = _as_float_array("positions_px", self.positions_px, 2, np.float64)
        if pos.shape != (n, 2):
            raise ValueError(
                f"PtychoData.positions_px: expected shape ({n}, 2) for {n} frames, got {pos.shape}"
            )
        if self.mask is None:
            mask = np.ones((m1, m1), dtype=bool)
        else:
            mask = np.asarray(self.mask)
            if mask.shape != (m1, m1):
                raise ValueError(
                    f"PtychoData.mask: expected shape ({m1}, {m1}) like the frames, "
                    f"got {mask.shape}"
                )
            mask = np.ascontiguousarray(mask, dtype=bool)
        if not mask.any():
            raise ValueError("PtychoData.mask: no valid pixel")
        _check_valid_pixels("PtychoData.intensities", inten, mask)
        try:
            h, w = (int(v) for v in self.object_shape)
        except Exception as exc:
            raise ValueError(
                f"PtychoData.object_shape: expected (H, W), got {self.object_shape!r}"
            ) from exc
        self.intensities, self.positions_px, self.mask = inten, pos, mask
        self.object_shape = (h, w)
        self._check_positions(pos)

    def _check_positions(self, pos: np.ndarray) -> None:
        h, w = self.object_shape
        m = self.frame_size
        if h < m or w < m:
            raise ValueError(
                f"PtychoData.object_shape: {h}x{w} is smaller than the {m}x{m} probe window"
            )
        corner = np.rint(pos)
        bad = (corner[:, 0] < 0) | (corner[:, 1] < 0) | (corner[:, 0] + m > h) | (
            corner[:, 1] + m > w
        )
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"PtychoData.positions_px: {int(bad.sum())} probe window(s) fall outside the "
                f"{h}x{w} object (first: frame {j} at (y, x) = ({pos[j, 0]:.2f}, "
                f"{pos[j, 1]:.2f}) with a {m} px window); enlarge object_shape or shift the "
                "positions"
            )

    def consume(self) -> None:
        """Mark the data used up: an engine took over (and overwrote) the intensities."""
        self.intensities = _Consumed(self.intensities.shape)  # type: ignore[assignment]

    @property
    def n_positions(self) -> int:
        return int(self.intensities.shape[0])

    @property
    def frame_size(self) -> int:
        return int(self.intensities.shape[-1])

    def append(self, intensities: np.ndarray, positions_px: np.ndarray) -> PtychoData:
        """A new PtychoData with more frames (and their positions) of the same scan appended.

        The mask and object shape are kept; the new windows must fit in the object.
        """
        inten = _as_float_array("intensities", intensities, 3, np.float32, False)
        if inten.shape[1:] != self.intensities.shape[1:]:
            raise ValueError(
                f"PtychoData.append: new frames are {inten.shape[1:]}, expected "
                f"{self.intensities.shape[1:]}"
            )
        _check_valid_pixels("PtychoData.append intensities", inten, self.mask)
        pos = _as_float_array("positions_px", positions_px, 2, np.float64)
        if pos.shape != (inten.shape[0], 2):
            raise ValueError(
                f"PtychoData.append: expected positions of shape ({inten.shape[0]}, 2), "
                f"got {pos.shape}"
            )
        return PtychoData(
            intensities=np.concatenate([self.intensities, inten]),
            positions_px=np.concatenate([self.positions_px, pos]),
            object_shape=self.object_shape,
            mask=self.mask,
        )

    def fingerprint(self, n_frames: int | None = None) -> str:
        """sha256 (hex) of the first ``n_frames`` frames (default: all), their positions and
        the mask — to check that a checkpoint belongs to (a prefix of) this data."""
        n = self.n_positions if n_frames is None else int(n_frames)
        if not 0 <= n <= self.n_positions:
            raise ValueError(f"fingerprint: n_frames={n_frames} not in 0..{self.n_positions}")
        h = hashlib.sha256()
        h.update(f"{n}:{self.frame_size}:{self.object_shape}".encode())
        h.update(self.mask.tobytes())
        h.update(self.positions_px[:n].tobytes())
        h.update(memoryview(self.intensities[:n]).cast("B"))
        return h.hexdigest()


@dataclass
class ReconState:
    """The complete state of a reconstruction (host numpy arrays).

    object: (H, W) complex64 for a thin sample; (S, H, W) for S > 1 layers (multislice,
    the first layer the one the probe meets first). probe: (K, M, M) complex64 (K
    incoherent modes, by power).
    positions_px: (N, 2) float64, the current (possibly corrected) positions.
    iteration: iterations completed. loss_history: one normalised amplitude loss per
    iteration. params: the ReconParams. rng_seed / rng_counter: the counter-based RNG
    (batch order of iteration i comes from (seed, counter)). extras: per-algorithm memory
    (e.g. ``dm_exit_waves``) needed to continue bit-identically.
    """

    object: np.ndarray
    probe: np.ndarray
    positions_px: np.ndarray
    params: ReconParams
    iteration: int = 0
    loss_history: list[float] = field(default_factory=list)
    rng_seed: int = 0
    rng_counter: int = 0
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.object = np.ascontiguousarray(self.object, dtype=np.complex64)
        if self.object.ndim == 3 and self.object.shape[0] == 1:
            self.object = self.object[0]  # one layer is a thin sample: (H, W)
        probe = np.asarray(self.probe)
        if probe.ndim == 2:
            probe = probe[None]
        self.probe = np.ascontiguousarray(probe, dtype=np.complex64)
        self.positions_px = np.ascontiguousarray(self.positions_px, dtype=np.float64)
        if self.object.ndim not in (2, 3):
            raise ValueError(f"ReconState.object: expected (H, W) or (layers, H, W), got shape "
                             f"{self.object.shape}")
        if self.probe.ndim != 3 or self.probe.shape[1] != self.probe.shape[2]:
            raise ValueError(
                f"ReconState.probe: expected (K, M, M), got shape {self.probe.shape}"
            )
        if self.positions_px.ndim != 2 or self.positions_px.shape[1] != 2:
            raise ValueError(
                f"ReconState.positions_px: expected (N, 2), got shape {self.positions_px.shape}"
            )
        self.loss_history = [float(v) for v in self.loss_history]

    @property
    def n_modes(self) -> int:
        return int(self.probe.shape[0])

    @property
    def layers(self) -> int:
        """Object layers S (1: a thin sample)."""
        return 1 if self.object.ndim == 2 else int(self.object.shape[0])

    @property
    def object_layers(self) -> np.ndarray:
        """The object as (S, H, W), a view."""
        return self.object[None] if self.object.ndim == 2 else self.object

    def to_host_arrays(self) -> dict[str, np.ndarray]:
        """Named arrays for a checkpoint (object, probe, positions, loss history, extras)."""
        arrays = {
            "object": self.object,
            "probe": self.probe,
            "positions_px": self.positions_px,
            "loss_history": np.asarray(self.loss_history, dtype=np.float64),
        }
        for k, v in self.extras.items():
            arrays[f"extra_{k}"] = np.asarray(v)
        return arrays

    def meta(self) -> dict[str, Any]:
        """JSON-able metadata for a checkpoint (everything that is not an array)."""
        return {
            "format": STATE_FORMAT,
            "iteration": int(self.iteration),
            "rng_seed": int(self.rng_seed),
            "rng_counter": int(self.rng_counter),
            "params": self.params.model_dump(mode="json"),
            "n_positions": int(self.positions_px.shape[0]),
            "object_shape": [int(v) for v in self.object.shape],
            "probe_shape": [int(v) for v in self.probe.shape],
            "extras": sorted(self.extras),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> ReconState:
        """Rebuild a state from ``to_host_arrays()`` + ``meta()`` (e.g. a checkpoint)."""
        fmt = meta.get("format")
        if fmt != STATE_FORMAT:
            raise ValueError(f"ReconState.from_arrays: meta 'format' is {fmt!r}, "
                             f"expected {STATE_FORMAT!r}")
        for key in ("object", "probe", "positions_px"):
            if key not in arrays:
                raise ValueError(f"ReconState.from_arrays: array {key!r} is missing")
        for key in ("iteration", "rng_seed", "rng_counter", "params"):
            if key not in meta:
                raise ValueError(f"ReconState.from_arrays: meta key {key!r} is missing")
        params = ReconParams.model_validate(meta["params"])
        extras = {}
        for name in meta.get("extras", []):
            key = f"extra_{name}"
            if key not in arrays:
                raise ValueError(f"ReconState.from_arrays: array {key!r} is missing")
            extras[name] = np.asarray(arrays[key])
        state = cls(
            object=np.asarray(arrays["object"]),
            probe=np.asarray(arrays["probe"]),
            positions_px=np.asarray(arrays["positions_px"]),
            params=params,
            iteration=int(meta["iteration"]),
            loss_history=list(np.asarray(arrays.get("loss_history", []), dtype=np.float64)),
            rng_seed=int(meta["rng_seed"]),
            rng_counter=int(meta["rng_counter"]),
            extras=extras,
        )
        expect = meta.get("object_shape")
        if expect is not None and list(state.object.shape) != list(expect):
            raise ValueError(
                f"ReconState.from_arrays: 'object' has shape {state.object.shape}, "
                f"meta says {expect}"
            )
        return state

    def extend_positions(self, new_positions_px: np.ndarray) -> ReconState:
        """Append positions for frames appended to the data (they start at nominal).

        Algorithm memory that is per position (DM exit waves) is extended by the engine
        when it next starts. Returns ``self``.
        """
        new = np.asarray(new_positions_px, dtype=np.float64).reshape(-1, 2)
        if not np.all(np.isfinite(new)):
            raise ValueError("ReconState.extend_positions: non-finite positions")
        self.positions_px = np.concatenate([self.positions_px, new])
        return self

    def copy(self) -> ReconState:
        return ReconState(
            object=self.object.copy(),
            probe=self.probe.copy(),
            positions_px=self.positions_px.copy(),
            params=self.params.model_copy(),
            iteration=self.iteration,
            loss_history=list(self.loss_history),
            rng_seed=self.rng_seed,
            rng_counter=self.rng_counter,
            extras={k: v.copy() for k, v in self.extras.items()},
        )
