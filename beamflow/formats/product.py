"""The reconstruction product file, in the Ptychodus HDF5 product layout (ptychodus 1.7).

File attributes: ``name``, ``comments``, ``detector_object_distance_m``, ``photon_energy_eV``,
``probe_photon_count``, ``exposure_time_s`` (+ the other Ptychodus metadata with defaults).
Datasets: ``probe_position_indexes`` (N,) int, ``probe_position_x_m``, ``probe_position_y_m``
(N,) float64; ``probe`` (1, K, M, M) complex64 with attrs ``pixel_width_m``,
``pixel_height_m``; ``object`` (1, H, W) complex64 with attrs ``center_x_m``, ``center_y_m``,
``pixel_width_m``, ``pixel_height_m``; ``object_layer_spacing_m`` (0,); ``loss_epochs``,
``loss_values``. A multislice (thick-sample) reconstruction of S layers stores ``object`` as
(S, H, W), entrance layer first, and the S−1 distances between consecutive layers in
``object_layer_spacing_m`` (metres), as Ptychodus's ``Object`` holds them. beamflow adds
``propagation`` ("far-field" / "near-field", beside Ptychodus's own ``far_field`` and
``focus_object_distance_m``), and ``verdict`` ("trusted" / "suspect") with
``verdict_reasons`` (a JSON list of sentences). Array ranks are those Ptychodus's own
``save_product`` writes; the reader also takes a 2-D object and a 2-/3-D probe. In memory,
one layer is an (H, W) ``object`` and S ≥ 2 layers an (S, H, W) one; :attr:`Product.layers`
is always (S, H, W) and :attr:`Product.projection` the product of the layers (what a thin
model sees).

Coordinates: probe positions and the object centre share one frame, metres (x = columns,
y = rows); ``center_*_m`` is the position of the object array's centre in that frame.

A variable probe (orthogonal probe relaxation, :mod:`beamflow.ptycho.algorithms.opr`) is stored as
Ptychodus's ``ProbeSequence`` reads it: ``probe`` is (C, K, M, M) with [0] the shared modes
and [c, 0] the eigen-probes of the first mode (the rest zero), and ``opr_weights`` (N, C)
float64 makes position j's first mode Σ_c w_jc·probe[c, 0].
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from beamflow.validation_text import field_path

from ._h5 import atomic_h5, dataset, open_h5, read_array
from .errors import ScanFormatError


def _array(value: Any, dtype: type, ndim: int) -> np.ndarray:
    a = np.asarray(value)
    if dtype is np.complex64 and not (np.iscomplexobj(a) or np.issubdtype(a.dtype, np.number)):
        raise ValueError(f"expected numbers, got {a.dtype}")
    a = np.ascontiguousarray(a, dtype=dtype)
    if a.ndim != ndim:
        raise ValueError(f"expected rank {ndim}, got shape {a.shape}")
    return a


class ObjectLayers:
    """An object of one layer (H, W) or of a thick sample's S layers (S, H, W), entrance
    layer first: what a product and a ground truth both hold (as ``object``) and are scored
    by."""

    @property
    def n_layers(self) -> int:
        """Object layers (1 for a thin sample)."""
        return 1 if self.object.ndim == 2 else int(self.object.shape[0])

    @property
    def layers(self) -> np.ndarray:
        """The object as (S, H, W), entrance layer first (a view; S = 1 for a thin sample)."""
        return self.object if self.object.ndim == 3 else self.object[None]

    @property
    def projection(self) -> np.ndarray:
        """(H, W): the product of the layers, the transmission a thin model would see (the
        object itself for one layer)."""
        if self.object.ndim == 2:
            return self.object
        return np.prod(self.object, axis=0, dtype=np.complex64)


class Product(ObjectLayers, BaseModel):
    """A reconstruction: object, probe modes, positions, losses and the metadata to use them."""

    model_config = ConfigDict(arbitrary_types_allowed=True, validate_assignment=True)

    name: str
    comments: str = ""
    detector_object_distance_m: float = Field(gt=0)
    photon_energy_eV: float = Field(gt=0)
    probe_photon_count: float = 0.0
    exposure_time_s: float = 0.0
    probe: np.ndarray  # (K, M, M) complex64 incoherent modes
    probe_pixel_width_m: float = Field(gt=0)
    probe_pixel_height_m: float = Field(gt=0)
    object: np.ndarray  # (H, W) complex64, one layer; (S, H, W) for S ≥ 2 layers
    object_center_x_m: float = 0.0
    object_center_y_m: float = 0.0
    object_pixel_width_m: float = Field(gt=0)
    object_pixel_height_m: float = Field(gt=0)
    probe_position_indexes: np.ndarray  # (N,) int64
    probe_position_x_m: np.ndarray  # (N,) float64
    probe_position_y_m: np.ndarray  # (N,) float64
    object_layer_spacing_m: np.ndarray = Field(default_factory=lambda: np.zeros(0))
    loss_epochs: np.ndarray = Field(default_factory=lambda: np.zeros(0, np.int64))
    loss_values: np.ndarray = Field(default_factory=lambda: np.zeros(0))
    #: the propagation model of the reconstruction and a cone beam's focus distance z1 (m)
    propagation: Literal["far-field", "near-field"] = "far-field"
    focus_distance_m: float | None = Field(default=None, gt=0)
    #: trust in the result (beamflow.ptycho.quality.verdict): "trusted" / "suspect", and why
    verdict: Literal["trusted", "suspect"] | None = None
    verdict_reasons: list[str] = Field(default_factory=list)
    #: a variable probe (orthogonal probe relaxation): eigen-probes U_1.. (K−1, M, M) of the
    #: first mode and the weights (N, K) of U_0 = probe[0], U_1, ... at each position;
    #: stored as Ptychodus does (``probe`` (K, modes, M, M), ``opr_weights`` (N, K))
    opr_eigen_probes: np.ndarray | None = None
    opr_weights: np.ndarray | None = None

    @field_validator("probe", mode="before")
    @classmethod
    def _probe(cls, v: Any) -> np.ndarray:
        a = np.asarray(v)
        if a.ndim == 2:
            a = a[None]
        return _array(a, np.complex64, 3)

    @field_validator("object", mode="before")
    @classmethod
    def _object(cls, v: Any) -> np.ndarray:
        a = np.asarray(v)
        if a.ndim == 3 and a.shape[0] == 1:  # one layer is (H, W), however it came
            a = a[0]
        return _array(a, np.complex64, 3 if a.ndim == 3 else 2)

    @field_validator("probe_position_indexes", "loss_epochs", mode="before")
    @classmethod
    def _ints(cls, v: Any) -> np.ndarray:
        return _array(v, np.int64, 1)

    @field_validator(
        "probe_position_x_m",
        "probe_position_y_m",
        "object_layer_spacing_m",
        "loss_values",
        mode="before",
    )
    @classmethod
    def _floats(cls, v: Any) -> np.ndarray:
        return _array(v, np.float64, 1)

    @model_validator(mode="after")
    def _consistent(self) -> Product:
        n = self.probe_position_indexes.shape[0]
        if not (self.probe_position_x_m.shape[0] == self.probe_position_y_m.shape[0] == n):
            raise ValueError(
                "probe_position_indexes, probe_position_x_m, probe_position_y_m differ in length"
            )
        if self.loss_epochs.shape != self.loss_values.shape:
            raise ValueError("loss_epochs and loss_values differ in length")
        if (self.opr_weights is None) != (self.opr_eigen_probes is None):
            raise ValueError("opr_weights and opr_eigen_probes come together")
        if self.opr_weights is not None:
            w, u = np.asarray(self.opr_weights), np.asarray(self.opr_eigen_probes)
            if w.ndim != 2 or w.shape != (n, u.shape[0] + 1):
                raise ValueError(
                    f"opr_weights has shape {w.shape}, expected ({n}, {u.shape[0] + 1}): one "
                    "row per position, one column per OPR mode")
            if u.shape[1:] != self.probe.shape[1:]:
                raise ValueError(
                    f"opr_eigen_probes are {u.shape[1:]}, the probe {self.probe.shape[1:]}")
        gaps = self.n_layers - 1
        spacing = self.object_layer_spacing_m
        if spacing.shape[0] != gaps:
            raise ValueError(
                f"object_layer_spacing_m has {spacing.shape[0]} values for {self.n_layers} "
                f"object layer{'s' if gaps else ''}: expected {gaps} (one per gap)")
        if not np.all(np.isfinite(spacing) & (spacing > 0)):
            raise ValueError("object_layer_spacing_m must be finite and > 0 metres")
        return self


_ATTRS = {  # Ptychodus metadata written with neutral defaults (its reader tolerates them)
    "mass_attenuation_m2_per_kg": 0.0,
    "tomography_angle_deg": 0.0,
    "tilt_angle_deg": 0.0,
}


def write_product(path: Path, product: Product) -> Path:
    """Write ``product`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    with atomic_h5(path) as f:
        f.attrs["name"] = product.name
        f.attrs["comments"] = product.comments
        f.attrs["detector_object_distance_m"] = product.detector_object_distance_m
        f.attrs["photon_energy_eV"] = product.photon_energy_eV
        f.attrs["probe_photon_count"] = product.probe_photon_count
        f.attrs["exposure_time_s"] = product.exposure_time_s
        for k, v in _ATTRS.items():
            f.attrs[k] = v
        # Ptychodus's own names for the regime and the cone beam's focus distance
        f.attrs["far_field"] = product.propagation == "far-field"
        f.attrs["focus_object_distance_m"] = product.focus_distance_m or 0.0
        f.attrs["propagation"] = product.propagation
        if product.verdict is not None:
            f.attrs["verdict"] = product.verdict
            f.attrs["verdict_reasons"] = json.dumps(product.verdict_reasons)
        f["probe_position_indexes"] = product.probe_position_indexes
        f["probe_position_x_m"] = product.probe_position_x_m
        f["probe_position_y_m"] = product.probe_position_y_m
        stack = product.probe[None]
        if product.opr_weights is not None:  # Ptychodus: [k, 0] the eigen-probes, rest zero
            eigen = np.asarray(product.opr_eigen_probes, np.complex64)
            stack = np.zeros((1 + len(eigen),) + product.probe.shape, np.complex64)
            stack[0] = product.probe
            stack[1:, 0] = eigen
            f["opr_weights"] = np.asarray(product.opr_weights, np.float64)
        probe = f.create_dataset("probe", data=stack)
        probe.attrs["pixel_width_m"] = product.probe_pixel_width_m
        probe.attrs["pixel_height_m"] = product.probe_pixel_height_m
        obj = f.create_dataset("object", data=product.layers)
        obj.attrs["center_x_m"] = product.object_center_x_m
        obj.attrs["center_y_m"] = product.object_center_y_m
        obj.attrs["pixel_width_m"] = product.object_pixel_width_m
        obj.attrs["pixel_height_m"] = product.object_pixel_height_m
        f["object_layer_spacing_m"] = product.object_layer_spacing_m
        f["loss_epochs"] = product.loss_epochs
        f["loss_values"] = product.loss_values
    return path


def _attr(obj: Any, path: Path, where: str, key: str, default: float | None = None) -> Any:
    if key in obj.attrs:
        v = obj.attrs[key]
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    if default is None:
        raise ScanFormatError(path, f"{where}@{key}", "missing attribute")
    return default


def read_product(path: Path) -> Product:
    """Read a product file (ours or one Ptychodus wrote) into a Product."""
    path = Path(path)
    with open_h5(path) as f:
        obj = dataset(f, path, "object")
        probe = dataset(f, path, "probe")
        o = read_array(f, path, "object")
        if o.ndim == 3 and o.shape[0] == 1:
            o = o[0]
        p = read_array(f, path, "probe")
        opr_eigen = opr_weights = None
        if p.ndim == 4:
            if p.shape[0] != 1:
                if "opr_weights" not in f:
                    raise ScanFormatError(
                        path, "probe", f"{p.shape[0]} OPR modes but no opr_weights dataset")
                opr_weights = read_array(f, path, "opr_weights", ndim=2)
                opr_eigen = p[1:, 0]
            p = p[0]
        if p.ndim not in (2, 3) or o.ndim not in (2, 3):
            raise ScanFormatError(
                path, "probe", f"unexpected ranks: probe {p.shape}, object {o.shape}"
            )
        spacing = np.asarray(
            read_array(f, path, "object_layer_spacing_m")
            if "object_layer_spacing_m" in f
            else np.zeros(0)
        ).reshape(-1)
        layers = o.shape[0] if o.ndim == 3 else 1
        if spacing.shape[0] != layers - 1:
            raise ScanFormatError(
                path, "object_layer_spacing_m",
                f"{spacing.shape[0]} values for an object of {layers} layer"
                f"{'s' if layers > 1 else ''} {o.shape}: expected {layers - 1}")
        has_loss = "loss_epochs" in f and "loss_values" in f
        far = bool(f.attrs.get("far_field", True))
        focus = float(_attr(f, path, "/", "focus_object_distance_m", 0.0))
        verdict = f.attrs.get("verdict")
        reasons = f.attrs.get("verdict_reasons")
        try:
            reasons = json.loads(reasons) if reasons is not None else []
        except (TypeError, ValueError) as exc:
            raise ScanFormatError(path, "/@verdict_reasons", f"not a JSON list ({exc})") from exc
        values = dict(
            name=str(_attr(f, path, "/", "name", "")),
            comments=str(_attr(f, path, "/", "comments", "")),
            detector_object_distance_m=float(_attr(f, path, "/", "detector_object_distance_m")),
            photon_energy_eV=float(_attr(f, path, "/", "photon_energy_eV")),
            probe_photon_count=float(_attr(f, path, "/", "probe_photon_count", 0.0)),
            exposure_time_s=float(_attr(f, path, "/", "exposure_time_s", 0.0)),
            probe=p,
            probe_pixel_width_m=float(
                _attr(
                    probe,
                    path,
                    "probe",
                    "pixel_width_m",
                    float(_attr(obj, path, "object", "pixel_width_m")),
                )
            ),
            probe_pixel_height_m=float(
                _attr(
                    probe,
                    path,
                    "probe",
                    "pixel_height_m",
                    float(_attr(obj, path, "object", "pixel_height_m")),
                )
            ),
            object=o,
            object_center_x_m=float(_attr(obj, path, "object", "center_x_m")),
            object_center_y_m=float(_attr(obj, path, "object", "center_y_m")),
            object_pixel_width_m=float(_attr(obj, path, "object", "pixel_width_m")),
            object_pixel_height_m=float(_attr(obj, path, "object", "pixel_height_m")),
            probe_position_indexes=read_array(f, path, "probe_position_indexes", ndim=1),
            probe_position_x_m=read_array(f, path, "probe_position_x_m", ndim=1),
            probe_position_y_m=read_array(f, path, "probe_position_y_m", ndim=1),
            object_layer_spacing_m=spacing,
            loss_epochs=read_array(f, path, "loss_epochs", ndim=1)
            if has_loss
            else np.zeros(0, np.int64),
            loss_values=read_array(f, path, "loss_values", ndim=1) if has_loss else np.zeros(0),
            propagation="far-field" if far else "near-field",
            focus_distance_m=focus if focus > 0 else None,
            verdict=verdict.decode() if isinstance(verdict, bytes) else verdict,
            verdict_reasons=reasons,
            opr_eigen_probes=opr_eigen,
            opr_weights=opr_weights,
        )
    try:
        return Product(**values)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ScanFormatError(path, field_path(e, root="/"), e["msg"]) from exc
