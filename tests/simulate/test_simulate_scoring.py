"""score_product maps a product onto the simulator's truth: the truth itself scores ~0; a
multislice reconstruction is scored by its projection and layer by layer above the frequency
its spacing separates."""

from __future__ import annotations

import numpy as np
import pytest

from beamflow.formats import Product
from beamflow.ground_truth import LayerScores, score_layers, score_product, score_product_layers
from beamflow.ptycho.forward.slices import separation_frequency
from beamflow.ptycho.quality.metrics import illumination_mask
from beamflow.simulate import make_ground_truth


def product_from_truth(gt, obj: np.ndarray, pad: int) -> Product:
    """A product holding ``obj`` on the truth's grid padded by ``pad`` pixels, positions
    written in the Ptychodus convention (probe centres, object centre)."""
    dx = gt.object_pixel_size_m
    m = gt.probe_size
    *layers, h, w = obj.shape
    padded = np.ones((*layers, h + 2 * pad, w + 2 * pad), np.complex64)
    padded[..., pad : pad + h, pad : pad + w] = obj
    # a probe whose corner is at truth pixel c sits at padded pixel c + pad; its centre is
    # (c + pad + m/2); choose the object centre so that (p - centre)/dx + shape/2 = that.
    corners = gt.positions_px + pad
    centres_px = corners + m / 2
    positions = gt.positions_m
    centre = np.mean(positions - (centres_px - np.array(padded.shape[-2:]) / 2) * dx, axis=0)
    return Product(
        name="truth", detector_object_distance_m=2.0, photon_energy_eV=8800.0,
        probe=gt.probe, probe_pixel_width_m=dx, probe_pixel_height_m=dx,
        object=padded, object_center_y_m=centre[0], object_center_x_m=centre[1],
        object_pixel_width_m=dx, object_pixel_height_m=dx,
        object_layer_spacing_m=gt.object_layer_spacing_m if padded.ndim == 3 else [],
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


# ----------------------------------------------------------------------------- layers


@pytest.fixture(scope="module")
def thick():
    return make_ground_truth(120, 32, 1e6, seed=5, slices=2, slice_spacing_m=4e-4)


def scores(gt, layers: np.ndarray) -> LayerScores:
    region = illumination_mask(gt.object.shape[1:], gt.probe, gt.positions_px, fraction=0.3)
    return score_layers(layers, gt.layers, gt.object_layer_spacing_m, gt.geometry.wavelength_m,
                        gt.object_pixel_size_m, region)


def test_perfect_layers_score_zero_whatever_their_global_factors(thick):
    t = thick.layers
    perfect = scores(thick, t)
    assert perfect.projection_nrmse < 1e-6 and max(perfect.layer_nrmse) < 1e-6
    cut = separation_frequency(thick.geometry.wavelength_m, 4e-4) * thick.object_pixel_size_m
    assert perfect.cutoff_cycles_per_px == pytest.approx((cut, cut))
    # each layer's own complex factor and phase ramp are not errors
    y, x = np.indices(t.shape[1:])
    ramp = np.exp(1j * (0.01 * y - 0.02 * x))
    factors = scores(thick, np.stack([2j * t[0] * ramp, 0.5 * np.exp(0.3j) * t[1]]))
    assert factors.projection_nrmse < 1e-4 and max(factors.layer_nrmse) < 1e-3
    # nor is a shift of the whole stack (the projection's registration moves every layer)
    shifted = scores(thick, np.roll(t, (2, -3), axis=(1, 2)))
    assert shifted.projection_nrmse < 1e-3 and max(shifted.layer_nrmse) < 1e-2


def test_wrong_layers_score_badly_though_their_projection_is_right(thick):
    t = thick.layers
    swapped = scores(thick, t[::-1])
    assert swapped.projection_nrmse < 1e-6
    assert min(swapped.layer_nrmse) > 0.9
    # the whole projection in one layer: the empty layer misses all its detail (1), the full
    # one carries the other layer's detail as error (about 1: the ratio of the layers' detail)
    for full in (0, 1):
        layers = np.ones_like(t)
        layers[full] = t[0] * t[1]
        one = scores(thick, layers)
        assert one.projection_nrmse < 1e-6
        assert one.layer_nrmse[1 - full] == pytest.approx(1.0, abs=0.02)
        assert 0.7 < one.layer_nrmse[full] < 1.5
        assert np.mean(one.layer_nrmse) > 0.85
    # noise is worse the more there is; the measure sees only detail above the cutoff
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 1, t.shape)
    small, large = (scores(thick, t * np.exp(1j * a * noise)) for a in (0.02, 0.1))
    assert 0 < max(small.layer_nrmse) < max(large.layer_nrmse)
    assert small.projection_nrmse < large.projection_nrmse < 0.3


def test_score_a_layered_product_against_the_truth(thick):
    t = thick.layers
    product = product_from_truth(thick, t, pad=4)
    assert product.n_layers == 2
    layered = score_product_layers(product, thick)
    assert layered.projection_nrmse < 1e-3 and max(layered.layer_nrmse) < 1e-2
    assert score_product(product, thick).nrmse < 1e-3  # the projection, as for a thin product
    swapped = score_product_layers(product_from_truth(thick, t[::-1], pad=4), thick)
    assert min(swapped.layer_nrmse) > 0.9
    # a one-layer reconstruction of a thick sample is scored by its projection
    thin = product_from_truth(thick, thick.projection, pad=2)
    assert score_product(thin, thick).nrmse < 1e-3
    with pytest.raises(ValueError, match="1 object layer.*truth 2"):
        score_product_layers(thin, thick)


def test_score_layers_refuses_mismatched_input(thick):
    t = thick.layers
    with pytest.raises(ValueError, match="expected the same"):
        score_layers(t[:1], t, [4e-4], 1e-10, 5e-8)
    with pytest.raises(ValueError, match="2 layers need 1 spacings"):
        score_layers(t, t, [], 1e-10, 5e-8)
