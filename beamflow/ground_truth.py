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
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from beamflow.formats import Geometry, Product, ZonePlateOptics
from beamflow.formats._h5 import atomic_h5
from beamflow.formats.eiger import MASTER_SUFFIX
from beamflow.ptycho.forward.propagation import Propagation, near_field_geometry
from beamflow.ptycho.metrics import Comparison, compare, illumination_mask

GROUND_TRUTH = "ground_truth.h5"


@dataclass(eq=False)
class GroundTruth:
    """What the simulator knows and a reconstruction should recover.

    ``positions_px`` are the true top-left corners (y, x) of each probe window in the object
    array (floats: the integer part selects the patch, the fraction shifts the probe).
    ``positions_m`` are the true positions in the metres frame of the scan file, and
    ``nominal_positions_m`` what the master file records; ``positions_px = positions_m /
    object_pixel_size_m + origin_px``. Its noise-free frames are
    :func:`beamflow.simulate.model_intensities`.
    """

    object: np.ndarray  # (H, W) complex64
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
            object=f["object"][()],
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
        )


def score_product(product: Product, gt: GroundTruth) -> Comparison:
    """Score a reconstruction against the simulator's ground truth (complex NRMSE etc.).

    The product follows the Ptychodus convention: a probe position ``p`` (metres) is the
    probe centre, at object pixel ``(p − centre)/Δx + shape/2``. The simulator's truth puts the
    top-left corner of position j at ``positions_px[j]``. The mean offset between the two
    frames maps the truth onto the reconstruction's grid (whole pixels; the sub-pixel rest and
    the ambiguities of ptychography are removed by :func:`beamflow.ptycho.metrics.compare`),
    and only the well-illuminated region counts.
    """
    obj = np.asarray(product.object)
    dx = product.object_pixel_width_m
    if not math.isclose(dx, gt.object_pixel_size_m, rel_tol=1e-3):
        raise ValueError(
            f"object pixel {dx:.4g} m differs from the truth's {gt.object_pixel_size_m:.4g} m"
        )
    n = min(len(product.probe_position_x_m), gt.n_positions)
    m = gt.probe_size
    centre = np.array([product.object_center_y_m, product.object_center_x_m])
    positions = np.stack([product.probe_position_y_m[:n], product.probe_position_x_m[:n]], 1)
    corners = (positions - centre) / dx + np.array(obj.shape) / 2 - m / 2
    offset = np.rint(np.mean(gt.positions_px[:n] - corners, axis=0)).astype(int)
    # The truth, cut to the reconstruction's grid (ones outside the simulated object).
    truth = np.ones(obj.shape, np.complex64)
    h, w = obj.shape
    ys = slice(max(0, -offset[0]), min(h, gt.object.shape[0] - offset[0]))
    xs = slice(max(0, -offset[1]), min(w, gt.object.shape[1] - offset[1]))
    truth[ys, xs] = gt.object[ys.start + offset[0] : ys.stop + offset[0],
                              xs.start + offset[1] : xs.stop + offset[1]]  # fmt: skip
    inside = (corners >= 0).all(axis=1) & (corners + m <= np.array(obj.shape)).all(axis=1)
    region = illumination_mask(obj.shape, gt.probe, corners[inside], fraction=0.3)
    return compare(obj, truth, region)
