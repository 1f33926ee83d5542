"""The simulator's ground truth: what it knows about a scan, the file that keeps it beside
the scan, and the score of a reconstruction against it.

The simulator (:mod:`beamflow.simulate`) writes ``ground_truth.h5`` next to the master file;
whoever judges a reconstruction (the demo, tests, benchmarks) reads it back and scores the
product with :func:`score_product`. Kept apart from the simulator so that scoring a product
needs neither the physics nor the detector writer, and so that the file's layout is written
and read in one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from beamflow.formats import Geometry, Product, ZonePlateOptics
from beamflow.formats._h5 import atomic_h5
from beamflow.formats.eiger import MASTER_SUFFIX
from beamflow.formats.product import ObjectLayers
from beamflow.ptycho.forward.propagation import Propagation, near_field_geometry
from beamflow.ptycho.forward.slices import separation_frequency
from beamflow.ptycho.quality.metrics import Comparison, compare, fourier_shift, illumination_mask

GROUND_TRUTH = "ground_truth.h5"


@dataclass(eq=False)
class GroundTruth(ObjectLayers):
    """What the simulator knows and a reconstruction should recover.

    ``positions_px`` are the true top-left corners (y, x) of each probe window in the object
    array (floats: the integer part selects the patch, the fraction shifts the probe).
    ``positions_m`` are the true positions in the metres frame of the scan file, and
    ``nominal_positions_m`` what the master file records; ``positions_px = positions_m /
    object_pixel_size_m + origin_px``. Its noise-free frames are
    :func:`beamflow.simulate.model_intensities`.
    """

    #: (H, W) complex64; a thick sample of S ≥ 2 layers: (S, H, W), entrance layer first
    object: np.ndarray
    probe: np.ndarray  # (M, M) complex64, scaled to the photon count
    positions_px: np.ndarray  # (N, 2) float64
    positions_m: np.ndarray  # (N, 2) float64
    nominal_positions_m: np.ndarray  # (N, 2) float64
    origin_px: np.ndarray  # (2,) float64
    object_pixel_size_m: float
    geometry: Geometry
    photons: float
    pixel_mask: np.ndarray  # (M, M) uint32, Eiger bits, non-zero = bad
    hot_rate: np.ndarray  # (M, M) float64 mean counts of hot pixels (0 elsewhere)
    seed: int
    defocus_m: float = 0.0  # make_probe's Δz (magnitude); optics.defocus_m is the signed one
    optics: ZonePlateOptics | None = None
    #: far field, or near field with the effective (Fresnel-scaled) geometry
    propagation: Propagation = Propagation()
    focus_distance_m: float | None = None  # z1 of a near-field cone beam
    #: (N, 2) lateral beam drift of each frame in object pixels (a varying probe), or None
    probe_drift_px: np.ndarray | None = None
    #: the S−1 distances (m) between consecutive layers of a thick sample (empty: one layer)
    object_layer_spacing_m: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.object_layer_spacing_m = np.asarray(self.object_layer_spacing_m,
                                                 np.float64).reshape(-1)
        if self.object.ndim not in (2, 3) or (self.object.ndim == 3 and self.object.shape[0] < 2):
            raise ValueError(f"the truth's object is (H, W) or (S ≥ 2, H, W), not "
                             f"{self.object.shape}")
        if len(self.object_layer_spacing_m) != self.n_layers - 1:
            raise ValueError(f"{self.n_layers} object layers need {self.n_layers - 1} "
                             f"spacings, got {len(self.object_layer_spacing_m)}")

    @property
    def probe_size(self) -> int:
        return int(self.probe.shape[-1])

    @property
    def n_positions(self) -> int:
        return int(self.positions_px.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """True on valid detector pixels."""
        return self.pixel_mask == 0


def write_ground_truth(path: Path, gt: GroundTruth) -> Path:
    with atomic_h5(Path(path)) as f:
        for key in (
            "object", "probe", "positions_px", "positions_m", "nominal_positions_m",
            "origin_px", "pixel_mask", "hot_rate",
        ):  # fmt: skip
            f[key] = getattr(gt, key)
        f.attrs["object_pixel_size_m"] = gt.object_pixel_size_m
        f.attrs["energy_eV"] = gt.geometry.energy_eV
        f.attrs["distance_m"] = gt.geometry.distance_m
        f.attrs["detector_pixel_size_m"] = gt.geometry.detector_pixel_size_m
        f.attrs["photons"] = gt.photons
        f.attrs["seed"] = gt.seed
        f.attrs["defocus_m"] = gt.defocus_m
        f.attrs["propagation"] = gt.propagation.model
        if gt.focus_distance_m is not None:
            f.attrs["focus_distance_m"] = gt.focus_distance_m
        if gt.probe_drift_px is not None:
            f["probe_drift_px"] = gt.probe_drift_px
        if gt.n_layers > 1:
            f["object_layer_spacing_m"] = gt.object_layer_spacing_m
        if gt.optics is not None:  # as in the master file (NXfresnel_zone_plate, metres)
            zp = f.create_group("zone_plate")
            zp.attrs["NX_class"] = "NXfresnel_zone_plate"
            for key, value in (
                ("outer_diameter", gt.optics.diameter_m),
                ("outermost_zone_width", gt.optics.outer_zone_width_m),
                ("central_stop_diameter", gt.optics.central_stop_fraction * gt.optics.diameter_m),
                ("defocus", gt.optics.defocus_m),
            ):
                zp[key] = float(value)
                zp[key].attrs["units"] = "m"
        f.attrs["description"] = (
            "beamflow simulator ground truth: positions_px = top-left corners (y, x) of the "
            "probe window in the object; positions_px = positions_m / object_pixel_size_m "
            "+ origin_px"
            + ("; object (S, H, W): the layers of a thick sample, entrance first, "
               "object_layer_spacing_m apart (metres)" if gt.n_layers > 1 else "")
        )
    return Path(path)


def read_ground_truth(path: str | Path) -> GroundTruth:
    """Read ``ground_truth.h5`` (or find it from a scan directory or master file)."""
    path = Path(path)
    if path.is_dir():
        path = path / GROUND_TRUTH
    elif path.name.endswith(MASTER_SUFFIX):
        path = path.parent / GROUND_TRUTH
    with h5py.File(path, "r") as f:
        a = f.attrs
        obj = f["object"][()]
        spacing = (f["object_layer_spacing_m"][()] if "object_layer_spacing_m" in f
                   else np.zeros(0))
        layers = obj.shape[0] if obj.ndim == 3 else 1
        if obj.ndim not in (2, 3) or np.size(spacing) != layers - 1:
            raise ValueError(f"{path}: object {obj.shape} with {np.size(spacing)} layer "
                             f"spacings: expected (H, W), or (S, H, W) and S−1 spacings")
        optics = None
        if "zone_plate" in f:
            zp = f["zone_plate"]
            optics = ZonePlateOptics(
                diameter_m=float(zp["outer_diameter"][()]),
                outer_zone_width_m=float(zp["outermost_zone_width"][()]),
                central_stop_fraction=float(zp["central_stop_diameter"][()])
                / float(zp["outer_diameter"][()]),
                defocus_m=float(zp["defocus"][()]),
            )
        geometry = Geometry(
            energy_eV=float(a["energy_eV"]),
            distance_m=float(a["distance_m"]),
            detector_pixel_size_m=float(a["detector_pixel_size_m"]),
        )
        focus = float(a["focus_distance_m"]) if "focus_distance_m" in a else None
        propagation = Propagation()
        if a.get("propagation", "far-field") == "near-field":
            dx, z_eff, _ = near_field_geometry(geometry.detector_pixel_size_m,
                                               geometry.distance_m, focus)
            propagation = Propagation(model="near-field", wavelength_m=geometry.wavelength_m,
                                      distance_m=z_eff, pixel_size_m=dx)
        return GroundTruth(
            object=obj,
            probe=f["probe"][()],
            positions_px=f["positions_px"][()],
            positions_m=f["positions_m"][()],
            nominal_positions_m=f["nominal_positions_m"][()],
            origin_px=f["origin_px"][()],
            object_pixel_size_m=float(a["object_pixel_size_m"]),
            geometry=geometry,
            photons=float(a["photons"]),
            pixel_mask=f["pixel_mask"][()],
            hot_rate=f["hot_rate"][()],
            seed=int(a["seed"]),
            defocus_m=float(a.get("defocus_m", 0.0)),
            optics=optics,
            propagation=propagation,
            focus_distance_m=focus,
            probe_drift_px=f["probe_drift_px"][()] if "probe_drift_px" in f else None,
            object_layer_spacing_m=np.asarray(spacing, np.float64).reshape(-1),
        )


def _truth_on_grid(product: Product, gt: GroundTruth) -> tuple[np.ndarray, np.ndarray]:
    """The truth's layers (S, H, W) cut to the product's object grid (ones outside the
    simulated object), and the well-illuminated region there.

    The product follows the Ptychodus convention: a probe position ``p`` (metres) is the
    probe centre, at object pixel ``(p − centre)/Δx + shape/2``. The simulator's truth puts the
    top-left corner of position j at ``positions_px[j]``. The mean offset between the two
    frames maps the truth onto the reconstruction's grid (whole pixels; the sub-pixel rest and
    the ambiguities of ptychography are removed by :func:`beamflow.ptycho.quality.metrics.compare`).
    """
    dx = product.object_pixel_width_m
    if not math.isclose(dx, gt.object_pixel_size_m, rel_tol=1e-3):
        raise ValueError(
            f"object pixel {dx:.4g} m differs from the truth's {gt.object_pixel_size_m:.4g} m"
        )
    shape = product.layers.shape[1:]
    n = min(len(product.probe_position_x_m), gt.n_positions)
    m = gt.probe_size
    centre = np.array([product.object_center_y_m, product.object_center_x_m])
    positions = np.stack([product.probe_position_y_m[:n], product.probe_position_x_m[:n]], 1)
    corners = (positions - centre) / dx + np.array(shape) / 2 - m / 2
    offset = np.rint(np.mean(gt.positions_px[:n] - corners, axis=0)).astype(int)
    truth = np.ones((gt.n_layers, *shape), np.complex64)
    h, w = shape
    th, tw = gt.layers.shape[1:]
    ys = slice(max(0, -offset[0]), min(h, th - offset[0]))
    xs = slice(max(0, -offset[1]), min(w, tw - offset[1]))
    truth[:, ys, xs] = gt.layers[:, ys.start + offset[0] : ys.stop + offset[0],
                                 xs.start + offset[1] : xs.stop + offset[1]]  # fmt: skip
    inside = (corners >= 0).all(axis=1) & (corners + m <= np.array(shape)).all(axis=1)
    region = illumination_mask(shape, gt.probe, corners[inside], fraction=0.3)
    return truth, region


def score_product(product: Product, gt: GroundTruth) -> Comparison:
    """Score a reconstruction against the simulator's ground truth (complex NRMSE etc.).

    The truth is mapped onto the product's grid (:func:`_truth_on_grid`) and only the
    well-illuminated region counts. A thick sample (either side with layers) is scored by its
    projection, the product of its layers: what a one-layer model can recover; its layers one
    by one are :func:`score_product_layers`.
    """
    truth, region = _truth_on_grid(product, gt)
    return compare(product.projection, np.prod(truth, axis=0), region)


@dataclass(frozen=True)
class LayerScores:
    """Result of :func:`score_layers`.

    Attributes:
        projection_nrmse: complex NRMSE of the product of the layers against the truth's
            (:func:`beamflow.ptycho.quality.metrics.compare`).
        layer_nrmse: per layer, the NRMSE above the frequency its spacing separates (NaN
            where no sampled frequency lies above it).
        cutoff_cycles_per_px: per layer, that frequency f_s in cycles per pixel.
        projection: the projection's :class:`~beamflow.ptycho.quality.metrics.Comparison`.
    """

    projection_nrmse: float
    layer_nrmse: tuple[float, ...]
    cutoff_cycles_per_px: tuple[float, ...]
    projection: Comparison

    def as_dict(self) -> dict[str, float | list[float]]:
        """Rounded figures for one JSON line."""
        return {
            "projection_nrmse": round(self.projection_nrmse, 5),
            "layer_nrmse": [round(v, 5) for v in self.layer_nrmse],
            "cutoff_cycles_per_px": [round(v, 5) for v in self.cutoff_cycles_per_px],
        }


def _gaussian_blur(a: np.ndarray, sigma_px: float) -> np.ndarray:
    ky = np.fft.fftfreq(a.shape[0])[:, None]
    kx = np.fft.fftfreq(a.shape[1])[None, :]
    g = np.exp(-2 * (np.pi * sigma_px) ** 2 * (ky**2 + kx**2))
    return np.fft.ifft2(np.fft.fft2(a) * g).real


def score_layers(
    reconstruction: np.ndarray,
    truth: np.ndarray,
    spacing_m: Sequence[float],
    wavelength_m: float,
    pixel_size_m: float,
    mask: np.ndarray | None = None,
) -> LayerScores:
    """Score the layers of a multislice reconstruction (S, H, W) against the truth's.

    (a) **Projection**: complex NRMSE of ``Π_s R_s`` against ``Π_s T_s`` after registration,
    ramp and global-factor removal (:func:`beamflow.ptycho.quality.metrics.compare`).

    (b) **Each layer above the frequency its spacing separates.** Content at spatial frequency
    f can move from one layer to the next without changing the data unless propagation over
    the spacing turns its phase by a radian or more, ``π·λ·Δz·f² ≥ 1``, i.e. above
    ``f_s = 1/√(π λ Δz)`` (:func:`beamflow.ptycho.forward.slices.separation_frequency`); for a layer
    between two gaps the smaller gap counts. Each layer is first put on its truth: the
    truth's layers are moved by the projection's registration (the layers of a
    reconstruction share one grid), and each layer gets its own phase ramp and complex
    factor (``compare`` without registration, fitted on the whole layer over the region),
    then the difference ``d = c·R_s − T_s`` and the
    truth (each less its mean over the region) are tapered to zero outside the region (a
    Gaussian-smoothed mask, σ = 0.5/f_s pixels, so that the taper itself puts almost nothing
    above f_s) and high-passed, keeping only ``|f| ≥ f_s``:

        layer NRMSE_s = ‖HP[w·(d − ⟨d⟩)]‖ / ‖HP[w·(T_s − ⟨T_s⟩)]‖.

    A perfect layer scores 0; a layer holding nothing above f_s (a constant) scores 1, and so
    does a layer that holds another layer's content (its own is missing); a layer holding
    the whole projection scores about 1 or more (the other layers' content is error).

    Args:
        reconstruction, truth: (S, H, W) complex layers on the same grid, entrance first.
        spacing_m: the S−1 distances between consecutive layers (metres).
        wavelength_m, pixel_size_m: the geometry (metres).
        mask: boolean (H, W), the well-illuminated region (None: everywhere).
    """
    rec = np.asarray(reconstruction)
    tru = np.asarray(truth)
    if rec.ndim != 3 or tru.ndim != 3 or rec.shape != tru.shape:
        raise ValueError(f"reconstruction {rec.shape} and truth {tru.shape}: expected the same "
                         "(S, H, W) layers")
    layers = rec.shape[0]
    spacing = [float(v) for v in spacing_m]
    if len(spacing) != layers - 1 or layers < 2:
        raise ValueError(f"{layers} layers need {layers - 1} spacings (at least two layers), "
                         f"got {len(spacing)}")
    mask = np.ones(rec.shape[1:], bool) if mask is None else np.asarray(mask, bool)
    projection = compare(np.prod(rec, axis=0), np.prod(tru, axis=0), mask)
    ky = np.fft.fftfreq(rec.shape[1])[:, None]
    kx = np.fft.fftfreq(rec.shape[2])[None, :]
    radius = np.hypot(ky, kx)  # cycles per pixel
    scores, cutoffs = [], []
    for s in range(layers):
        gaps = spacing[max(0, s - 1) : s + 1]
        cut = separation_frequency(wavelength_m, min(gaps)) * pixel_size_m
        cutoffs.append(cut)
        high = radius >= cut
        if not high.any():
            scores.append(float("nan"))
            continue
        # in the projection's frame: the layers of a reconstruction share one grid
        c = compare(rec[s], fourier_shift(tru[s], (-projection.shift[0], -projection.shift[1])),
                    projection.mask, register=False)
        w = np.clip(2.0 * _gaussian_blur(c.mask.astype(np.float64), 0.5 / cut) - 1.0, 0.0, 1.0)
        region = w > 0

        def high_pass(z: np.ndarray, w=w, region=region, high=high) -> np.ndarray:
            return np.fft.ifft2(np.fft.fft2(w * (z - z[region].mean())) * high)

        num = np.linalg.norm(high_pass(c.reconstruction - c.truth))
        den = np.linalg.norm(high_pass(c.truth))
        scores.append(float(num / den) if den > 0 else float("nan"))
    return LayerScores(projection_nrmse=projection.nrmse, layer_nrmse=tuple(scores),
                       cutoff_cycles_per_px=tuple(cutoffs), projection=projection)


def score_product_layers(product: Product, gt: GroundTruth) -> LayerScores:
    """Score a multislice product layer by layer against a thick sample's truth
    (:func:`score_layers` on the truth mapped onto the product's grid)."""
    if gt.n_layers < 2 or product.n_layers != gt.n_layers:
        raise ValueError(f"the product has {product.n_layers} object layer(s) and the truth "
                         f"{gt.n_layers}: per-layer scores need the same number, at least two")
    truth, region = _truth_on_grid(product, gt)
    return score_layers(product.layers, truth, gt.object_layer_spacing_m,
                        gt.geometry.wavelength_m, gt.object_pixel_size_m, region)
