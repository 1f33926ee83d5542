"""Tests for beamflow.ptycho.quality.previews: PNG files, atomic writes, scale bars, bad input."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamflow.ptycho.quality import figures as F
from beamflow.ptycho.quality import object_view as OV
from beamflow.ptycho.quality import previews as V

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


def _scan(n: int = 96, m: int = 32, step: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """A probe and a raster of corners that illuminate a square well inside an n×n object."""
    probe = _probe(1, m)
    c = np.arange(n // 8, 7 * n // 8 - m + 1, step)
    corners = np.stack(np.meshgrid(c, c, indexing="ij"), -1).reshape(-1, 2).astype(float)
    return probe, corners


def test_preview_names_are_the_files_the_page_knows():
    assert V.PREVIEW_NAMES == (
        "object_phase", "object_phase_full", "object_amplitude", "probe", "convergence")


def test_write_previews_writes_all_valid_pngs(tmp_path):
    loss = np.exp(-np.arange(30) / 10.0)
    out = V.write_previews(
        tmp_path / "previews",
        _object(),
        _probe(),
        PX,
        loss,
        scan_extent_px=(8, 88, 8, 88),
        title="scan_0001 · it 30",
        positions_px=_scan()[1],
    )
    assert tuple(out) == V.PREVIEW_NAMES
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
    assert F.nice_length(value) == pytest.approx(expected, rel=1e-12)


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
    got_px, got_label = F.scale_bar(width, pixel)
    assert got_px == pytest.approx(length_px)
    assert got_label == label
    assert got_px <= 0.2 * width + 1e-9


def test_nice_length_and_scale_bar_reject_nonsense():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            F.nice_length(bad)
    with pytest.raises(ValueError, match="pixel size"):
        F.scale_bar(100, 0.0)


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
    with pytest.raises(F.PreviewError, match=rf"{which}: 1 of \d+ values are NaN or infinite"):
        V.write_previews(out_dir, obj, probe, PX, [1.0, 0.5])
    # ... and with positions, whose illuminated region is summed from the probe
    corners = np.array([[10.0, 10.0], [20.0, 30.0]])
    with pytest.raises(F.PreviewError, match=rf"{which}: 1 of \d+ values are NaN or infinite"):
        V.write_previews(out_dir, obj, probe, PX, [1.0, 0.5], positions_px=corners)
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
    un = F.unwrap_phase(wrapped)
    assert np.allclose(un - un.mean(), true - true.mean(), atol=1e-6)


def test_complex_to_rgb_hue_is_phase_and_value_is_amplitude():
    z = np.array([[1.0, -1.0, 0.5j, 0.0]])
    rgb = F.complex_to_rgb(z)
    assert np.allclose(rgb[0, 0], [0, 1, 1])  # phase 0 → hue 0.5 (cyan)
    assert np.allclose(rgb[0, 1], [1, 0, 0])  # phase π → hue 1 ≡ 0 (red)
    assert np.allclose(rgb[0, 2].max(), 0.5)  # half amplitude → half brightness
    assert np.allclose(rgb[0, 3], 0)


def test_previews_do_not_touch_pyplot_state(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from beamflow.ptycho.quality import previews as V\n"
        f"V.write_previews({str(tmp_path)!r}, np.ones((32, 32), complex), np.ones((8, 8), complex),"
        " 1e-8, [1.0, 0.5])\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert len(list(tmp_path.glob("*.png"))) == len(V.PREVIEW_NAMES)


# --------------------------------------------------------------------------- readable previews


def _noisy_outside(n: int = 96) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An object with a 0.8 rad square on a flat background where the probe goes, and wild
    amplitude and uniformly random phase where it never goes; the probe and its corners."""
    probe, corners = _scan(n)
    inside = OV.illuminated_region((n, n), probe, corners)
    rng = np.random.default_rng(3)
    obj = np.exp(1j * rng.uniform(-np.pi, np.pi, (n, n))) * rng.uniform(0.05, 3.0, (n, n))
    y, x = np.indices((n, n))
    feature = (np.abs(y - n / 2) < 10) & (np.abs(x - n / 2) < 10)
    obj[inside] = np.exp(1j * 0.8 * feature[inside])
    return obj.astype(np.complex64), probe, corners


def test_illuminated_region_is_where_the_probe_went():
    probe, corners = _scan(96)
    inside = OV.illuminated_region((96, 96), probe, corners)
    assert inside[48, 48] and not inside[2, 2] and not inside[93, 50]
    assert 0.1 < inside.mean() < 0.6
    # A refined position half a pixel past the edge is clipped, not refused.
    edge = OV.illuminated_region((96, 96), probe, [[-0.6, 64.7], [10.0, 10.0]])
    assert edge[26, 26] and edge[16, 80]


def test_phase_window_comes_from_the_illuminated_region():
    obj, probe, corners = _noisy_outside()
    inside = OV.illuminated_region(obj.shape, probe, corners)
    img = OV.phase_image(obj, illuminated=inside)
    lo, hi = img.window
    # The background is the reference (0) and the square tops the window: 0 … 0.8 rad.
    assert lo == pytest.approx(0.0, abs=0.05) and hi == pytest.approx(0.8, abs=0.05)
    assert np.array_equal(img.view.inside, inside)
    # Without the region, the wild border sets the window: nearly the whole circle.
    lo_all, hi_all = OV.phase_image(obj).window
    assert hi_all - lo_all > 5.0


def test_ramp_and_global_phase_are_removed_before_windowing():
    n = 64
    y, x = np.indices((n, n))
    # centred on the array (31.5), so it cannot tilt the fitted plane; ~10 % of the object
    feature = (np.abs(y - 31.5) < 10) & (np.abs(x - 31.5) < 10)
    obj = np.exp(1j * (2.0 + 0.35 * x - 0.2 * y + 1.0 * feature))  # wraps many times
    img = OV.phase_image(obj, illuminated=np.ones((n, n), bool))
    assert np.allclose(img.phase[~feature], 0.0, atol=1e-6)
    assert np.allclose(img.phase[feature], 1.0, atol=1e-6)
    assert img.window == pytest.approx((0.0, 1.0), abs=1e-6)
    # Not removing the ramp leaves the window spanning the wraps.
    kept = OV.phase_image(obj, illuminated=np.ones((n, n), bool), remove_ramp=False)
    assert kept.window[1] - kept.window[0] > 5.0


def test_amplitude_and_unwrapped_windows_follow_the_region():
    obj, probe, corners = _noisy_outside()
    inside = OV.illuminated_region(obj.shape, probe, corners)
    amp = np.abs(OV.object_view(obj, illuminated=inside).values)
    assert OV.robust_window(amp, inside) == pytest.approx((1.0, 1.0), abs=1e-5)
    assert OV.robust_window(amp)[1] > 2.5  # the border's amplitude, had it counted
    lo, hi = OV.phase_image(obj, illuminated=inside, mode="unwrapped").window
    assert hi - lo < 1.5


def test_border_is_dimmed_and_inside_unchanged():
    obj, probe, corners = _noisy_outside()
    inside = OV.illuminated_region(obj.shape, probe, corners)
    values = np.angle(obj)
    plain = OV.object_rgb(values, (-1.0, 1.0), "viridis")
    dimmed = OV.object_rgb(values, (-1.0, 1.0), "viridis", inside)
    assert np.array_equal(dimmed[inside], plain[inside])
    assert np.all(np.any(dimmed[~inside] != plain[~inside], axis=-1))
    # dimmed toward the outside colour: closer to it than the plain render, everywhere
    target = np.asarray(F.OUTSIDE_COLOUR)
    assert np.all(np.linalg.norm(dimmed[~inside] - target, axis=-1)
                  < np.linalg.norm(plain[~inside] - target, axis=-1) + 1e-12)
    assert np.array_equal(OV.shade_outside(plain, None), plain)


def test_positions_change_the_object_images_and_nothing_else(tmp_path):
    obj, probe, corners = _noisy_outside()
    without = V.write_previews(tmp_path / "a", obj, probe, PX, [1.0, 0.5])
    with_ = V.write_previews(tmp_path / "b", obj, probe, PX, [1.0, 0.5], positions_px=corners)
    for name in V.PREVIEW_NAMES:
        same = without[name].read_bytes() == with_[name].read_bytes()
        assert same == (name in ("probe", "convergence")), name
    # No positions, or none at all: the whole crop counts (today's behaviour).
    empty = V.write_previews(tmp_path / "c", obj, probe, PX, [1.0, 0.5],
                             positions_px=np.zeros((0, 2)))
    assert all(empty[n].read_bytes() == without[n].read_bytes() for n in V.PREVIEW_NAMES)


def test_illuminated_mask_follows_crop_and_block_averaging():
    n = 2 * F.MAX_DISPLAY_PX + 40  # block-averaged by 3 after the crop below
    obj = np.ones((n, n), np.complex64)
    inside = np.zeros((n, n), bool)
    inside[:, : n // 2] = True
    view = OV.object_view(obj, scan_extent_px=(10, n - 10, 10, n - 10), illuminated=inside)
    assert view.factor == 3 and view.inside.shape == view.values.shape
    cols = np.flatnonzero(view.inside[0])
    assert cols[0] == 0 and abs((cols[-1] + 1) * 3 + 10 - n // 2) <= 3
    with pytest.raises(F.PreviewError, match="illuminated"):
        OV.object_view(obj, illuminated=inside[:-1])


def test_full_range_is_the_wrapped_circle():
    obj, probe, corners = _noisy_outside()
    inside = OV.illuminated_region(obj.shape, probe, corners)
    img = OV.phase_image(obj, illuminated=inside, full_range=True)
    assert img.window == (-np.pi, np.pi)
    assert img.phase.min() >= -np.pi and img.phase.max() < np.pi
    windowed = OV.phase_image(obj, illuminated=inside)
    assert np.allclose(np.exp(1j * img.phase), np.exp(1j * windowed.phase))


# --------------------------------------------------------------------------- readable previews


def _text_chunks(path: Path) -> dict[str, str]:
    from PIL import Image

    with Image.open(path) as img:
        return dict(img.text)


@pytest.fixture
def figures(monkeypatch) -> list:
    """The matplotlib figures the renderers draw (captured as they are saved)."""
    drawn = []
    real = F._png_bytes

    def capture(fig, *args, **kwargs):
        data = real(fig, *args, **kwargs)  # saving draws it: tick labels are set now
        drawn.append(fig)
        return data

    monkeypatch.setattr(V, "_png_bytes", capture)
    return drawn


def _texts(fig) -> list[str]:
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


@pytest.mark.parametrize("losses", [
    np.linspace(0.02, 0.016, 25),            # less than a decade: no power of ten inside
    np.exp(-np.arange(200) / 20.0) + 1e-4,   # four decades
])
def test_convergence_has_labelled_ticks_and_a_dashed_noise_floor(figures, losses, tmp_path):
    data = V.render_convergence(losses, title="s · rpie", noise_floor=2.5e-4)
    (tmp_path / "c.png").write_bytes(data)
    [fig] = figures
    [ax] = fig.axes
    lo, hi = ax.get_ylim()
    labelled = [t.get_text() for t in ax.get_yticklabels()
                if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert len(labelled) >= 3, labelled
    assert all(float(v) > 0 for v in labelled)
    xs = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(xs) >= 3 and all(v.lstrip("−-").isdigit() for v in xs), xs
    assert ax.get_xlabel() == "iteration" and "loss" in ax.get_ylabel()
    floors = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(floors) == 1 and np.allclose(floors[0].get_ydata(), 2.5e-4)
    assert lo < 2.5e-4 < hi  # the floor is in view, even far below the losses
    assert any("Poisson noise floor 0.00025" in t for t in _texts(fig))
    assert "noise floor 0.00025" in _text_chunks(tmp_path / "c.png")["Description"]


def test_convergence_without_a_floor_draws_no_dashed_line(figures):
    V.render_convergence(np.linspace(1, 0.1, 10))
    assert not [ln for ln in figures[0].axes[0].get_lines() if ln.get_linestyle() == "--"]


def test_a_suspect_result_says_so_in_every_preview_title(tmp_path, figures):
    probe, corners = _scan()
    loss = np.exp(-np.arange(30) / 10.0)
    out = V.write_previews(tmp_path / "bad", _object(), probe, PX, loss, title="s · it 30",
                           positions_px=corners, suspect=True)
    assert len(figures) == len(V.PREVIEW_NAMES)
    for name, path in out.items():
        title = _text_chunks(path)["Title"]
        assert title.startswith("SUSPECT"), (name, title)
        assert "s · it 30" in title
    for fig in figures:
        assert any(t.startswith("SUSPECT") for t in _texts(fig))
    figures.clear()
    good = V.write_previews(tmp_path / "good", _object(), probe, PX, loss, title="s · it 30",
                            positions_px=corners)
    for path in good.values():
        assert "SUSPECT" not in _text_chunks(path)["Title"]
    assert not any("SUSPECT" in t for fig in figures for t in _texts(fig))


def _sample_in_empty_space(n: int = 128, scale: float = 0.6) -> np.ndarray:
    """A few absorbing, phase-shifting discs in empty space, the whole scaled by ``scale``
    (the scale a reconstruction may trade with its probe)."""
    y, x = np.indices((n, n))
    t = np.zeros((n, n))
    for cy, cx, r in ((40, 40, 12), (80, 70, 16), (50, 95, 9)):
        t += np.hypot(y - cy, x - cx) < r
    return (scale * np.exp(t * (1.0j - 0.4))).astype(np.complex64)


def test_the_amplitude_is_one_in_the_unscattered_region(tmp_path, figures):
    obj = _sample_in_empty_space(scale=0.6)
    view = OV.object_view(obj)
    level = V.unscattered_level(view)
    assert level.value == pytest.approx(0.6, rel=1e-3)
    assert level.share > 0.3
    path = V.write_png_atomic(tmp_path / "a.png", V.render_object_amplitude(obj, PX))
    chunks = _text_chunks(path)
    assert "unscattered region = 1" in chunks["Title"]
    assert "divided by 0.6" in chunks["Description"]
    texts = _texts(figures[0])
    assert "amplitude (unscattered = 1)" in texts
    # The colour bar now spans the sample's transmission: its top is 1, not 0.6.
    cbar = figures[0].axes[1]
    assert cbar.get_ylim()[1] == pytest.approx(1.0, abs=0.02)


def test_a_sample_that_fills_the_field_is_not_normalised_and_says_why(tmp_path, figures):
    rng = np.random.default_rng(0)
    texture = np.exp((0.5j - 0.3) * rng.random((128, 128)))  # no flat area anywhere
    level = V.unscattered_level(OV.object_view(texture))
    assert level.value is None
    data = V.render_object_amplitude(texture.astype(np.complex64), PX)
    path = V.write_png_atomic(tmp_path / "t.png", data)
    title = _text_chunks(path)["Title"]
    assert "not normalised: " in title
    assert level.reason in title
    assert "amplitude" in _texts(figures[0])


# -- long titles -------------------------------------------------------------------------------
LONG_TITLE = "petra_nearfield_siemens_star_000121 · lsqml · iteration 1000"
RENDERERS = {
    "object_phase": lambda title: V.render_object_phase(_object(), PX, title=title, suspect=True),
    "object_amplitude": lambda title: V.render_object_amplitude(_object(), PX, title=title,
                                                                suspect=True),
    "probe": lambda title: V.render_probe(_probe(1), PX, title=title, suspect=True),
    "convergence": lambda title: V.render_convergence(np.geomspace(1, 0.01, 30), title=title,
                                                      suspect=True),
}


def _rgb(png: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


@pytest.mark.parametrize("name", RENDERERS)
def test_a_long_suspect_title_wraps_inside_the_figure_above_the_image(name: str) -> None:
    from PIL import Image

    short, long = (RENDERERS[name](t) for t in ("s1 · rpie · iteration 10", LONG_TITLE))
    # The whole title is in the file's text chunk, however it is drawn.
    import io

    assert LONG_TITLE in Image.open(io.BytesIO(long)).text["Title"]
    a, b = _rgb(short), _rgb(long)
    # Never cut at the edges: no title-red ink in the outermost columns ...
    red = (b[..., 0] > b[..., 1] + 60) & (b[..., 0] > b[..., 2] + 60)
    assert not red[:, :4].any() and not red[:, -4:].any(), name
    # ... the figure grew by the lines the wrapping added, at the top only ...
    assert b.shape[1] == a.shape[1] and b.shape[0] > a.shape[0], (a.shape, b.shape)
    # ... and everything under the title is drawn as with a short one (not overdrawn).
    below = int(a.shape[0] * 0.8)
    assert np.abs(a[-below:] - b[-below:]).max() <= 2, name


def test_layers_are_drawn_each_and_their_projection_in_the_others(tmp_path):
    """A thick sample's (S, H, W) layers: object_layers.png shows each layer (titled with its
    depth), and the object images are the projection's — as if the product had been given."""
    rng = np.random.default_rng(4)
    layers = np.exp(0.4j * rng.standard_normal((3, 80, 90))).astype(np.complex64)
    probe = np.exp(-((np.mgrid[:24, :24] - 12) ** 2).sum(0) / 40).astype(np.complex64)
    pos = rng.uniform(0, 50, (30, 2))
    layered = V.write_previews(tmp_path / "l", layers, probe, 5e-8, [0.1, 0.05],
                                      positions_px=pos, spacings_m=[4e-4, 4e-4])
    product = V.write_previews(tmp_path / "p", np.prod(layers, axis=0), probe, 5e-8,
                                      [0.1, 0.05], positions_px=pos)
    assert set(layered) == set(product) | {"object_layers"}
    for name in V.PREVIEW_NAMES:
        assert layered[name].read_bytes() == product[name].read_bytes(), name
    text = layered["object_layers"].read_bytes()
    assert b"Object layers" in text
    with pytest.raises(F.PreviewError):
        V.render_object_layers(layers[:1], 5e-8)
