"""The product file: round trip, atomic write, clear errors, and Ptychodus's own reader opens it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from beamflow.formats import Product, ScanFormatError, read_product, write_product


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


def assert_same(a: Product, b: Product) -> None:
    for name, value in a:
        other = getattr(b, name)
        if isinstance(value, np.ndarray):
            assert other.dtype == value.dtype and other.shape == value.shape, name
            np.testing.assert_array_equal(other, value, err_msg=name)
        else:
            assert other == value, name


def test_round_trip(tmp_path: Path):
    p = make_product()
    path = write_product(tmp_path / "product.h5", p)
    assert_same(p, read_product(path))
    assert [x.name for x in tmp_path.iterdir()] == ["product.h5"]  # no temporary left


def test_overwrite_is_atomic_replace(tmp_path: Path):
    path = tmp_path / "product.h5"
    write_product(path, make_product(n=3))
    write_product(path, make_product(n=9))
    assert read_product(path).probe_position_indexes.shape == (9,)
    assert len(list(tmp_path.iterdir())) == 1


def test_layout_is_ptychodus_product_layout(tmp_path: Path):
    path = write_product(tmp_path / "product.h5", make_product(k=3, m=8, h=20, w=24))
    with h5py.File(path) as f:
        assert f.attrs["photon_energy_eV"] == 8800.0
        assert f.attrs["detector_object_distance_m"] == 2.0
        assert f["probe"].shape == (1, 3, 8, 8) and f["probe"].dtype == np.complex64
        assert f["object"].shape == (1, 20, 24) and f["object"].dtype == np.complex64
        assert set(f["object"].attrs) >= {
            "center_x_m",
            "center_y_m",
            "pixel_width_m",
            "pixel_height_m",
        }
        assert set(f["probe"].attrs) >= {"pixel_width_m", "pixel_height_m"}
        for key in ("probe_position_indexes", "probe_position_x_m", "probe_position_y_m",
                    "object_layer_spacing_m", "loss_epochs", "loss_values"):  # fmt: skip
            assert key in f


def test_model_validates_shapes():
    with pytest.raises(ValueError, match="differ in length"):
        Product.model_validate({**dict(make_product()), "probe_position_x_m": np.zeros(2)})
    with pytest.raises(ValueError, match="rank 2"):
        Product.model_validate({**dict(make_product()), "object": np.zeros((2, 3, 4), complex)})
    single = Product.model_validate({**dict(make_product()), "probe": np.ones((8, 8), complex)})
    assert single.probe.shape == (1, 8, 8)


def test_bad_product_files_raise_naming_the_problem(tmp_path: Path):
    path = write_product(tmp_path / "product.h5", make_product())
    with h5py.File(path, "r+") as f:
        del f.attrs["photon_energy_eV"]
    with pytest.raises(ScanFormatError, match="photon_energy_eV.*missing attribute") as info:
        read_product(path)
    assert info.value.file == str(path)
    with h5py.File(path, "r+") as f:
        f.attrs["photon_energy_eV"] = 8800.0
        del f["object"]
    with pytest.raises(ScanFormatError, match="object: missing"):
        read_product(path)
    (tmp_path / "bad.h5").write_text("not hdf5")
    with pytest.raises(ScanFormatError, match="not an HDF5 file"):
        read_product(tmp_path / "bad.h5")


def test_ptychodus_reads_our_product(tmp_path: Path):
    io = pytest.importorskip(
        "ptychodus.api.io", reason="ptychodus (and scikit-image) not installed"
    )
    p = make_product()
    path = write_product(tmp_path / "product.h5", p)
    theirs = io.load_product(path)
    md = theirs.metadata
    assert (md.name, md.comments) == (p.name, p.comments)
    assert md.detector_distance_m == p.detector_object_distance_m
    assert md.photon_energy_eV == p.photon_energy_eV
    assert md.probe_photon_count == p.probe_photon_count
    np.testing.assert_array_equal(theirs.object_.get_array()[0], p.object)
    g = theirs.object_.get_geometry()
    assert (g.center_x_m, g.center_y_m) == (p.object_center_x_m, p.object_center_y_m)
    assert (g.pixel_width_m, g.pixel_height_m) == (p.object_pixel_width_m, p.object_pixel_height_m)
    np.testing.assert_array_equal(theirs.probes.get_array()[0], p.probe)
    pg = theirs.probes.get_pixel_geometry()
    assert (pg.width_m, pg.height_m) == (p.probe_pixel_width_m, p.probe_pixel_height_m)
    pos = theirs.probe_positions
    np.testing.assert_array_equal(pos.get_indexes(), p.probe_position_indexes)
    np.testing.assert_array_equal(pos.get_coordinates_x_m(), p.probe_position_x_m)
    np.testing.assert_array_equal(pos.get_coordinates_y_m(), p.probe_position_y_m)
    assert [(x.epoch, x.value) for x in theirs.losses] == list(
        zip(p.loss_epochs.tolist(), p.loss_values.tolist(), strict=True)
    )

    # and the other way: what Ptychodus writes, we read
    io.save_product(tmp_path / "theirs.h5", theirs)
    assert_same(p, read_product(tmp_path / "theirs.h5"))
