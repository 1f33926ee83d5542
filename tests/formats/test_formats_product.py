"""The product file: round trip, atomic write, clear errors, and Ptychodus's own reader opens it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from product_kit import make_product

from beamflow.formats import Product, ScanFormatError, read_product, write_product


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
        Product.model_validate({**dict(make_product()), "object": np.zeros((2, 3, 4, 5), complex)})
    with pytest.raises(ValueError, match="0 values for 2 object layers: expected 1"):
        Product.model_validate({**dict(make_product()), "object": np.zeros((2, 3, 4), complex)})
    with pytest.raises(ValueError, match="1 values for 1 object layer: expected 0"):
        Product.model_validate({**dict(make_product()), "object_layer_spacing_m": [1e-4]})
    with pytest.raises(ValueError, match="finite and > 0"):
        Product.model_validate({**dict(make_layered_product()),
                                "object_layer_spacing_m": [1e-4, -1e-4]})
    single = Product.model_validate({**dict(make_product()), "probe": np.ones((8, 8), complex)})
    assert single.probe.shape == (1, 8, 8)


def make_layered_product(layers: int = 3) -> Product:
    rng = np.random.default_rng(8)
    h, w = 40, 48
    obj = np.exp(1j * rng.uniform(0, 1, (layers, h, w))).astype(np.complex64)
    return Product.model_validate({**dict(make_product(h=h, w=w)), "object": obj,
                                   "object_layer_spacing_m": np.geomspace(1e-4, 4e-4, layers - 1)})


def test_layers_in_memory():
    """One layer is (H, W) however it is given; S layers are (S, H, W); `layers` is always
    (S, H, W) and `projection` the product of the layers."""
    thin = make_product()
    assert thin.n_layers == 1 and thin.object.ndim == 2
    assert thin.layers.shape == (1,) + thin.object.shape
    np.testing.assert_array_equal(thin.projection, thin.object)
    again = Product.model_validate({**dict(thin), "object": thin.object[None]})
    assert again.object.shape == thin.object.shape
    thick = make_layered_product(3)
    assert thick.n_layers == 3 and thick.object.shape == thick.layers.shape == (3, 40, 48)
    np.testing.assert_allclose(thick.projection, thick.object[0] * thick.object[1]
                               * thick.object[2], rtol=1e-6)
    assert thick.projection.dtype == np.complex64


def test_layered_round_trip_and_layout(tmp_path: Path):
    p = make_layered_product(3)
    path = write_product(tmp_path / "product.h5", p)
    with h5py.File(path) as f:
        assert f["object"].shape == (3, 40, 48) and f["object"].dtype == np.complex64
        np.testing.assert_array_equal(f["object_layer_spacing_m"][()], p.object_layer_spacing_m)
    back = read_product(path)
    assert_same(p, back)
    assert back.n_layers == 3


def test_layer_spacing_that_does_not_fit_the_layers_is_named(tmp_path: Path):
    path = write_product(tmp_path / "product.h5", make_layered_product(3))
    with h5py.File(path, "r+") as f:
        del f["object_layer_spacing_m"]
        f["object_layer_spacing_m"] = [1e-4]
    with pytest.raises(ScanFormatError,
                       match="object_layer_spacing_m: 1 values for an object of 3 layers"):
        read_product(path)
    with h5py.File(path, "r+") as f:
        del f["object_layer_spacing_m"]
        f["object_layer_spacing_m"] = [1e-4, np.nan]
    with pytest.raises(ScanFormatError, match="object_layer_spacing_m.*finite and > 0"):
        read_product(path)


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


def test_ptychodus_reads_and_writes_our_layers(tmp_path: Path):
    """A 3-layer product as Ptychodus 1.7 holds it: its reader sees three layers and their
    spacings, its product of layers is ours, and what its own writer makes of it we read back."""
    io = pytest.importorskip(
        "ptychodus.api.io", reason="ptychodus (and scikit-image) not installed"
    )
    p = make_layered_product(3)
    path = write_product(tmp_path / "product.h5", p)
    theirs = io.load_product(path)
    obj = theirs.object_
    assert obj.num_layers == 3
    np.testing.assert_array_equal(obj.get_array(), p.object)
    for i in range(3):
        np.testing.assert_array_equal(obj.get_layer(i), p.object[i])
    np.testing.assert_array_equal(np.asarray(obj.layer_spacing_m), p.object_layer_spacing_m)
    assert obj.get_total_thickness_m() == pytest.approx(p.object_layer_spacing_m.sum())
    np.testing.assert_allclose(obj.get_layers_flattened(), p.projection, rtol=1e-6)

    io.save_product(tmp_path / "theirs.h5", theirs)
    with h5py.File(tmp_path / "theirs.h5") as f:  # the layout Ptychodus itself writes
        assert f["object"].shape == (3, 40, 48)
        assert f["object_layer_spacing_m"].shape == (2,)
    assert_same(p, read_product(tmp_path / "theirs.h5"))
