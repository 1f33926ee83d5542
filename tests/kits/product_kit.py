"""A small product with every field set (two probe modes, seven positions, a loss history),
for the tests of the product file and of what reads it."""

from __future__ import annotations

import numpy as np

from beamflow.formats.product import Product


def make_product(k: int = 2, m: int = 16, h: int = 40, w: int = 48, n: int = 7) -> Product:
    rng = np.random.default_rng(5)
    cplx = lambda *s: (rng.normal(size=s) + 1j * rng.normal(size=s)).astype(np.complex64)  # noqa: E731
    return Product(
        name="scan_0007",
        comments="rpie, 50 iterations",
        detector_object_distance_m=2.0,
        photon_energy_eV=8800.0,
        probe_photon_count=1e6,
        probe=cplx(k, m, m),
        probe_pixel_width_m=5.9e-8,
        probe_pixel_height_m=5.9e-8,
        object=cplx(h, w),
        object_center_x_m=1.5e-7,
        object_center_y_m=-2.5e-7,
        object_pixel_width_m=5.9e-8,
        object_pixel_height_m=5.9e-8,
        probe_position_indexes=np.arange(n),
        probe_position_x_m=rng.normal(0, 1e-6, n),
        probe_position_y_m=rng.normal(0, 1e-6, n),
        loss_epochs=np.arange(1, 11),
        loss_values=np.geomspace(1, 0.01, 10),
    )
