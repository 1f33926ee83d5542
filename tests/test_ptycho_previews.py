"""Tests for beamflow.ptycho.previews: PNG files, atomic writes, scale bars, bad input."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamflow.ptycho import previews as V

PX = 12.5e-9


def _object(n: int = 96) -> np.ndarray:
    y, x = np.indices((n, n))
    phase = 1.5 * np.exp(-((y - n / 2) ** 2 + (x - n / 3) ** 2) / (2 * (n / 8) ** 2))
    amp = 1 - 0.2 * ((x // 8) % 2)
    return (amp * np.exp(1j * (phase + 0.05 * x))).astype(np.complex64)


def _probe(k: int = 2, m: int = 32) -> np.ndarray:
    y, x = np.indices((m, m)) - m / 2
    base = np.exp(-(x**2 + y**2) / 40.0) * np.exp(1j * 0.02 * (x**2 + y**2))
    return np.stack([base * (0.3**i) * (x if i else 1) for i in range(k)]).astype(np.complex64)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_previews_writes_four_valid_pngs(tmp_path):
    loss = np.exp(-np.arange(30) / 10.0)
    out = V.write_previews(
        tmp_path / "previews",
        _object(),
        _probe(),
        PX,
        loss,
        scan_extent_px=(8, 88, 8, 88),
        title="scan_0001 · it 30",
    )
    assert set(out) == {"object_phase", "object_amplitude", "probe", "convergence"}
    for name, path in out.items():
        assert path == tmp_path / "previews" / f"{name}.png"
        w, h = _png_size(path)
        assert 300 <= w <= 1200 and 250 <= h <= 1000, (name, w, h)
        assert 5_000 < path.stat().st_size < 1_000_000
        # Not a blank canvas: decode and look for structure.
        import matplotlib.image

        img = matplotlib.image.imread(path)
        assert img[..., :3].std() > 0.05
    assert sorted(p.name for p in (tmp_path / "previews").iterdir()) == sorted(
        f"{n}.png" for n in out
    )  # no temporary files left behind


def test_previews_accept_product_layouts_and_unwrapped_phase(tmp_path):
    obj = _object()[None]  # [1, H, W]
    probe = _probe(3)[None]  # [1, K, M, M]
    history = np.array([[1, 1.0], [5, 0.5], [10, 0.2]])  # (iteration, loss) rows
    out = V.write_previews(tmp_path, obj, probe, PX, history, phase_mode="unwrapped")
    assert all(p.is_file() for p in out.values())


@pytest.mark.parametrize(
    "value,expected",
    [
        (0.8, 0.5),
        (1.0, 1.0),
        (1.9, 1.0),
        (2.0, 2.0),
        (4.99, 2.0),
        (5.0, 5.0),
        (9.99, 5.0),
        (10.0, 10.0),
        (3e-7, 2e-7),
        (5e-7, 5e-7),
        (7.3e-6, 5e-6),
        (0.0012, 0.001),
    ],
)
def test_nice_length_picks_round_value_below(value, expected):
    assert V.nice_length(value) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "width,pixel,length_px,label",
    [
        (256, 12.5e-9, 40.0, "0.5 µm"),  # 20 % of 3.2 µm = 0.64 µm → 0.5 µm
        (500, 100e-9, 100.0, "10 µm"),  # 10 µm exactly
        (100, 1e-9, 20.0, "20 nm"),
        (184, 58.7e-9, 2e-6 / 58.7e-9, "2 µm"),
    ],
)
def test_scale_bar_length_and_label(width, pixel, length_px, label):
    got_px, got_label = V.scale_bar(width, pixel)
    assert got_px == pytest.approx(length_px)
    assert got_label == label
    assert got_px <= 0.2 * width + 1e-9


def test_nice_length_and_scale_bar_reject_nonsense():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            V.nice_length(bad)
    with pytest.raises(ValueError, match="pixel size"):
        V.scale_bar(100, 0.0)


@pytest.mark.parametrize("which", ["object", "probe"])
def test_non_finite_input_raises_and_writes_nothing(tmp_path, which):
    obj, probe = _object(), _probe()
    if which == "object":
        obj[3, 4] = np.nan
    else:
        probe[0, 1, 1] = np.inf
    out_dir = tmp_path / "previews"
    out_dir.mkdir()
    (out_dir / "object_phase.png").write_bytes(b"old")
    with pytest.raises(V.PreviewError, match=rf"{which}: 1 of \d+ values are NaN or infinite"):
        V.write_previews(out_dir, obj, probe, PX, [1.0, 0.5])
    assert [p.name for p in out_dir.iterdir()] == ["object_phase.png"]
    assert (out_dir / "object_phase.png").read_bytes() == b"old"


def test_non_finite_losses_are_left_out(tmp_path):
    out = V.write_previews(tmp_path, _object(), _probe(), PX, [1.0, np.nan, 0.5, 0.0, 0.2])
    assert _png_size(out["convergence"])[0] > 0
    assert _png_size(V.write_png_atomic(tmp_path / "empty.png", V.render_convergence([])))


def test_atomic_write_keeps_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "probe.png"
    target.write_bytes(b"previous complete image")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        V.write_png_atomic(target, b"\x89PNG new image")
    assert target.read_bytes() == b"previous complete image"
    assert [p.name for p in tmp_path.iterdir()] == ["probe.png"]  # temp file removed


def test_atomic_write_goes_through_a_temporary_name(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        # At the moment of the rename the data is complete under another name.
        seen.append((Path(src).name, Path(dst).name, Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    V.write_png_atomic(tmp_path / "x.png", b"data")
    ((src, dst, data),) = seen
    assert src != dst and src.startswith(".x.png.") and data == b"data"
    assert (tmp_path / "x.png").read_bytes() == b"data"


def test_crop_extent_is_validated():
    with pytest.raises(ValueError, match="scan_extent_px"):
        V.render_object_amplitude(_object(), PX, scan_extent_px=(50, 50, 0, 10))
    with pytest.raises(ValueError, match="row0, row1, col0, col1"):
        V.render_object_amplitude(_object(), PX, scan_extent_px=(1, 2, 3))


def test_unwrap_phase_recovers_a_steep_ramp():
    y, x = np.indices((40, 50))
    true = 0.4 * x + 0.25 * y  # 20 + 10 rad across: wraps many times
    wrapped = np.angle(np.exp(1j * true))
    un = V.unwrap_phase(wrapped)
    assert np.allclose(un - un.mean(), true - true.mean(), atol=1e-6)


def test_complex_to_rgb_hue_is_phase_and_value_is_amplitude():
    z = np.array([[1.0, -1.0, 0.5j, 0.0]])
    rgb = V.complex_to_rgb(z)
    assert np.allclose(rgb[0, 0], [0, 1, 1])  # phase 0 → hue 0.5 (cyan)
    assert np.allclose(rgb[0, 1], [1, 0, 0])  # phase π → hue 1 ≡ 0 (red)
    assert np.allclose(rgb[0, 2].max(), 0.5)  # half amplitude → half brightness
    assert np.allclose(rgb[0, 3], 0)


def test_previews_do_not_touch_pyplot_state(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from beamflow.ptycho import previews as V\n"
        f"V.write_previews({str(tmp_path)!r}, np.ones((32, 32), complex), np.ones((8, 8), complex),"
        " 1e-8, [1.0, 0.5])\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert len(list(tmp_path.glob("*.png"))) == 4
