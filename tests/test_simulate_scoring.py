"""score_product maps a product onto the simulator's truth: the truth itself scores ~0."""

from __future__ import annotations

import numpy as np

from beamflow.formats import Product
from beamflow.ground_truth import score_product
from beamflow.simulate import make_ground_truth


def product_from_truth(gt, obj: np.ndarray, pad: int) -> Product:
    """A product holding ``obj`` on the truth's grid padded by ``pad`` pixels, positions
    written in the Ptychodus convention (probe centres, object centre)."""
    dx = gt.object_pixel_size_m
    m = gt.probe_size
    h, w = obj.shape
    padded = np.ones((h + 2 * pad, w + 2 * pad), np.complex64)
    padded[pad : pad + h, pad : pad + w] = obj
    # a probe whose corner is at truth pixel c sits at padded pixel c + pad; its centre is
    # (c + pad + m/2); choose the object centre so that (p - centre)/dx + shape/2 = that.
    corners = gt.positions_px + pad
    centres_px = corners + m / 2
    positions = gt.positions_m
    centre = np.mean(positions - (centres_px - np.array(padded.shape) / 2) * dx, axis=0)
    return Product(
        name="truth", detector_object_distance_m=2.0, photon_energy_eV=8800.0,
        probe=gt.probe, probe_pixel_width_m=dx, probe_pixel_height_m=dx,
        object=padded, object_center_y_m=centre[0], object_center_x_m=centre[1],
        object_pixel_width_m=dx, object_pixel_height_m=dx,
        probe_position_indexes=np.arange(gt.n_positions),
        probe_position_y_m=positions[:, 0], probe_position_x_m=positions[:, 1],
    )


def test_truth_scores_zero_and_noise_scores_worse() -> None:
    gt = make_ground_truth(40, 32, 1e5, seed=2)
    perfect = score_product(product_from_truth(gt, gt.object, pad=5), gt)
    assert perfect.nrmse < 1e-3
    rng = np.random.default_rng(0)
    noisy_obj = gt.object * np.exp(1j * rng.normal(0, 0.2, gt.object.shape)).astype(np.complex64)
    noisy = score_product(product_from_truth(gt, noisy_obj, pad=3), gt)
    assert 0.1 < noisy.nrmse < 0.3
    # a global phase and amplitude factor is not an error
    scaled = score_product(product_from_truth(gt, 2j * gt.object, pad=0), gt)
    assert scaled.nrmse < 1e-3
