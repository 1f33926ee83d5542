"""PNG previews of a reconstruction, for the status page and the product directory.

Five images a beamline scientist reads at a glance (:data:`PREVIEW_NAMES`):

* ``object_phase.png`` — the object phase with the global phase offset and (by default) the
  linear phase ramp removed, both fitted over the *reference region* (the illuminated region
  where the amplitude is appreciable: near-zero amplitude carries no phase), and shown with
  ``viridis`` in a **colour window from the 1–99 percentiles of the reference region**: a
  weak phase object fills the colour scale, and a wild border or a few hot pixels cannot
  squeeze it. Values beyond the window clip (arrows on the colour bar, in radians). The
  phase is the wrapped one (the default) or least-squares **unwrapped** (Ghiglia & Romero,
  JOSA A 11, 107, 1994), unwrapped with the never-illuminated border held flat so its
  residues cannot spread into the sample. The title says which, and where the window came
  from.
* ``object_phase_full.png`` — the same phase, **wrapped explicitly to [−π, π)** with the
  cyclic ``twilight`` colormap (so a wrap is not mistaken for an edge): the full range, for
  when the window hides something. The status page links it from the phase figure.
* ``object_amplitude.png`` — ``|O|`` in gray, window from the 1–99 percentiles of the
  illuminated region, divided by the amplitude of the unscattered region (empty space reads
  1, :func:`unscattered_level`), or, where there is none, titled with why not.
* ``probe.png`` — one panel per probe mode, complex shown as colour (hue = phase, brightness
  = amplitude, each mode normalised to its own maximum) and titled with its share of the
  total power in %.
* ``convergence.png`` — the loss against iteration, logarithmic y with labelled ticks, and
  the data's Poisson noise floor as a dashed line when it is given.

A thick sample's layers add ``object_layers.png`` (each layer's phase, with its depth; the
five above show their product, the projection, which the data determine on their own).

A suspect result's previews (``write_previews(suspect=True)``) say SUSPECT at the start of
every title, in red. Every PNG carries its title (and what else the reader should know of
it) in its ``Title``/``Description`` text chunks.

The illuminated region (:func:`illuminated_region`) is where the summed probe intensity over
all scan positions reaches 10 % of its maximum; it needs the positions (top-left corners of
the probe windows in object pixels, ``positions_px``). On the three object images the
never-illuminated border is blended 70 % toward a dark slate (its structure stays faintly
visible, but it does not read as sample) and the region's outline is drawn as a thin line.
Nothing here assumes a propagation model: the region comes from the probe and the positions
alone. Without positions the whole (cropped) object stands for the region (for the phase,
where its amplitude is appreciable), nothing is dimmed and no outline is drawn.

Object and probe images carry a scale bar in µm (nm below 0.1 µm) from the object pixel
size, of a round length (1, 2 or 5 × 10ⁿ) near a fifth of the image width
(:func:`nice_length`). The object is cropped to the scanned region when its extent is given.

Rendering uses ``matplotlib.figure.Figure`` with the Agg canvas directly: no pyplot global
state (safe from threads and servers), no display, no network, only the bundled DejaVu font.
Files are written atomically (temporary file in the same directory, then ``os.replace``) so
that a status page polling the directory never serves a half-written PNG.

Bad input: a non-finite object or probe raises :class:`PreviewError` (a ``ValueError``)
naming the array and the count of bad values *before any file is written* — a diverged
reconstruction must be reported, not drawn as a plausible picture. Non-finite or
non-positive loss values are left out of the (log) convergence plot, and the title says how
many were left out.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colorbar import Colorbar
from matplotlib.colors import hsv_to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, NullFormatter
from numpy.typing import ArrayLike, NDArray

from beamflow.atomic import atomic_write_bytes

from ..arrays import dct2
from .metrics import fit_phase_ramp, illumination_mask

__all__ = [
    "LAYERS_NAME",
    "PREVIEW_NAMES",
    "SUSPECT_MARK",
    "ObjectView",
    "PhaseImage",
    "PreviewError",
    "UnscatteredLevel",
    "complex_to_rgb",
    "flatten_phase",
    "headline",
    "illuminated_region",
    "nice_length",
    "object_rgb",
    "object_view",
    "phase_image",
    "render_object_layers",
    "render_convergence",
    "render_object_amplitude",
    "render_object_phase",
    "render_probe",
    "robust_window",
    "scale_bar",
    "shade_outside",
    "unscattered_level",
    "unwrap_phase",
    "write_png_atomic",
    "write_previews",
]

#: The files :func:`write_previews` writes (``NAME.png``), in the order the page shows them.
PREVIEW_NAMES = ("object_phase", "object_phase_full", "object_amplitude", "probe", "convergence")

#: Larger crops are block-averaged (complex mean) down to about this many pixels a side:
#: a preview is ~500 px wide, and rendering cost must not grow with the object.
MAX_DISPLAY_PX = 512
_DPI = 100
#: Colour windows span these percentiles of the illuminated region: robust to hot pixels.
WINDOW_PERCENTILES = (1.0, 99.0)
#: The illuminated region: summed probe intensity ≥ this fraction of its maximum.
ILLUMINATION_FRACTION = 0.1
#: Outside the illuminated region, pixels are blended this far toward a dark slate: the
#: structure stays faintly visible, but nobody reads the border as sample.
OUTSIDE_BLEND = 0.7
OUTSIDE_COLOUR = (0.16, 0.18, 0.24)
#: The illuminated region's outline (absent from gray, viridis and twilight).
OUTLINE_COLOUR = "#ff2d55"
#: Fewer illuminated display pixels than this: treated as unknown (no window, no dimming).
_MIN_REGION_PX = 16
_FIGSIZE = (5.4, 4.6)


class PreviewError(ValueError):
    """Input that cannot be rendered honestly (e.g. NaN in the object)."""


# --------------------------------------------------------------------------- helpers


def nice_length(max_length: float) -> float:
    """The largest 1, 2 or 5 × 10ⁿ not exceeding ``max_length`` (> 0)."""
    if not (max_length > 0 and math.isfinite(max_length)):
        raise ValueError(f"length must be positive and finite, got {max_length}")
    exponent = math.floor(math.log10(max_length))
    for mantissa in (5.0, 2.0, 1.0):
        value = mantissa * 10.0**exponent
        # Tolerate rounding in log10 (e.g. 5e-7 must give 5e-7, not 2e-7).
        if value <= max_length * (1 + 1e-9):
            return value
    return 10.0 ** (exponent - 1) * 5.0  # unreachable; keeps type checkers calm


def scale_bar(width_px: int, pixel_size_m: float, fraction: float = 0.2) -> tuple[float, str]:
    """Scale-bar length in pixels and its label for an image ``width_px`` pixels wide.

    The bar is the round length (:func:`nice_length`) closest below ``fraction`` of the
    image width; the label is in µm, or nm below 0.1 µm (``"2 µm"``, ``"0.5 µm"``,
    ``"50 nm"``).
    """
    if width_px < 1:
        raise ValueError(f"image width must be at least 1 px, got {width_px}")
    if not (pixel_size_m > 0 and math.isfinite(pixel_size_m)):
        raise ValueError(f"pixel size must be positive and finite, got {pixel_size_m} m")
    length_m = nice_length(fraction * width_px * pixel_size_m)
    if length_m >= 0.1e-6:
        label = f"{length_m * 1e6:g} µm"
    else:
        label = f"{length_m * 1e9:g} nm"
    return length_m / pixel_size_m, label


def _check_finite(a: np.ndarray, name: str) -> None:
    bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    if bad:
        raise PreviewError(
            f"{name}: {bad} of {np.size(a)} values are NaN or infinite "
            "(has the reconstruction diverged?); no preview written"
        )


def _block_mean(a: np.ndarray, max_px: int) -> tuple[np.ndarray, int]:
    """Complex block average by an integer factor so that no side exceeds ``max_px``."""
    factor = max(1, math.ceil(max(a.shape) / max_px))
    if factor == 1:
        return a, 1
    h, w = (a.shape[0] // factor) * factor, (a.shape[1] // factor) * factor
    b = a[:h, :w].reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))
    return b, factor


def _crop(obj: np.ndarray, extent: Sequence[int] | None) -> np.ndarray:
    if extent is None:
        return obj
    if len(extent) != 4:
        raise ValueError(f"scan_extent_px must be (row0, row1, col0, col1), got {extent!r}")
    r0, r1, c0, c1 = (int(v) for v in extent)
    r0, c0 = max(r0, 0), max(c0, 0)
    r1, c1 = min(r1, obj.shape[0]), min(c1, obj.shape[1])
    if r1 - r0 < 2 or c1 - c0 < 2:
        raise ValueError(f"scan_extent_px {tuple(extent)} leaves no image of {obj.shape}")
    return obj[r0:r1, c0:c1]


def unwrap_phase(wrapped: ArrayLike) -> NDArray[np.float64]:
    """Least-squares 2-D phase unwrapping (Ghiglia & Romero 1994), unweighted, via DCT.

    Solves the Poisson equation whose source is the divergence of the wrapped phase
    differences, with Neumann boundaries. Smooth and robust to noise; where the phase has
    residues (true discontinuities) it is not congruent with the wrapped input.
    """
    p = np.asarray(wrapped, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"phase: expected a 2-D array, got shape {p.shape}")
    h, w = p.shape

    def wrap(a: np.ndarray) -> np.ndarray:
        return (a + np.pi) % (2 * np.pi) - np.pi

    dy = np.zeros_like(p)
    dx = np.zeros_like(p)
    dy[:-1] = wrap(np.diff(p, axis=0))
    dx[:, :-1] = wrap(np.diff(p, axis=1))
    rho = dy.copy()
    rho[1:] -= dy[:-1]
    rho += dx
    rho[:, 1:] -= dx[:, :-1]
    rho_hat = dct2(rho)
    i = np.arange(h)[:, None]
    j = np.arange(w)[None, :]
    denom = 2 * (np.cos(np.pi * i / h) + np.cos(np.pi * j / w) - 2)
    denom[0, 0] = 1.0
    phi_hat = rho_hat / denom
    phi_hat[0, 0] = 0.0
    return dct2(phi_hat, inverse=True)


def complex_to_rgb(z: ArrayLike, vmax: float | None = None) -> NDArray[np.float64]:
    """RGB image of a complex array: hue = phase, saturation 1, value = |z| / vmax."""
    zz = np.asarray(z)
    amp = np.abs(zz)
    top = float(vmax) if vmax else float(amp.max())
    value = np.clip(amp / top, 0, 1) if top > 0 else np.zeros_like(amp)
    hue = (np.angle(zz) + np.pi) / (2 * np.pi)
    return hsv_to_rgb(np.stack([hue, np.ones_like(hue), value], axis=-1))


def _new_figure(size: tuple[float, float] = _FIGSIZE) -> Figure:
    # Fixed axes positions, no layout engine: constrained layout measures every text
    # extent in an extra draw pass and would cost more than the rendering itself.
    fig = Figure(figsize=size, dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Figure, title: str = "", description: str = "") -> bytes:
    """The figure as PNG, with its title (and what the reader should know of the image) in
    the file's text chunks, for tools that read them without looking at the picture."""
    buf = io.BytesIO()
    metadata = {"Title": title, "Description": description}
    # zlib level 1: ~3× faster than the default 6 for ~20 % larger files.
    fig.savefig(buf, format="png", dpi=_DPI, pil_kwargs={"compress_level": 1},
                metadata={k: v for k, v in metadata.items() if v})
    return buf.getvalue()


#: The mark a suspect result's previews carry in their titles (see :func:`write_previews`).
SUSPECT_MARK = "SUSPECT"
_SUSPECT_COLOUR = "#c0392b"


def headline(title: str, suspect: bool = False) -> str:
    """``title`` as a preview shows it: a suspect result's starts with ``SUSPECT``."""
    if not suspect:
        return title
    return f"{SUSPECT_MARK} result · {title}" if title else f"{SUSPECT_MARK} result"


def _title_colour(suspect: bool) -> str:
    return _SUSPECT_COLOUR if suspect else "black"


_TITLE_SIZE = 10  # points
_TITLE_WIDTH = 0.96  # of the figure's width: a title line never reaches its edges


def _wrapped(text: str, width_px: float, measure, separators=(" · ", " ")) -> list[str]:  # noqa: ANN001
    """The lines of ``text``, each at most ``width_px`` wide as ``measure`` (text -> pixels)
    finds it: broken between the parts of a title (``scan · algorithm · iteration``) where
    that is enough, else between words, else between characters."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        if measure(paragraph) <= width_px or len(paragraph) <= 1:
            lines.append(paragraph)
        elif separators:
            sep, finer = separators[0], separators[1:]
            line = ""
            for part in paragraph.split(sep):
                joined = f"{line}{sep}{part}" if line else part
                if line and measure(joined) > width_px:
                    # The line so far, broken finer where it must be; its last piece
                    # carries on with this part if they fit together.
                    *full, tail = _wrapped(line + sep.rstrip(), width_px, measure, finer)
                    lines += full
                    joined = f"{tail} {part.lstrip()}"
                    if measure(joined) > width_px:
                        lines.append(tail)
                        joined = part
                line = joined
            lines += _wrapped(line, width_px, measure, finer)
        else:  # one word wider than the figure: cut it
            cut = len(paragraph) - 1
            while cut > 1 and measure(paragraph[:cut]) > width_px:
                cut -= 1
            lines += [paragraph[:cut], *_wrapped(paragraph[cut:], width_px, measure, ())]
    return lines


def _place_title(fig: Figure, text: str, suspect: bool, ax=None) -> None:  # noqa: ANN001
    """Title the figure (or ``ax``, when given) with ``text``, each line wrapped to the
    figure's width. Call it once the axes are placed: the figure grows at the top by the
    lines the wrapping added, the axes keeping their place in inches, so a long title (a
    long scan name, a suspect result's mark) is never cut at the edges nor drawn over the
    image."""
    from matplotlib.font_manager import FontProperties

    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=_TITLE_SIZE)

    def measure(line: str) -> float:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0]

    # Centred on the figure, or on the axes: as wide as the nearer edge allows.
    centre = 0.5 if ax is None else ax.get_position().x0 + ax.get_position().width / 2
    room = 2 * min(centre, 1 - centre) * _TITLE_WIDTH * fig.get_figwidth() * fig.dpi
    lines = _wrapped(text, room, measure)
    added = len(lines) - len(text.split("\n"))
    if added > 0:
        width, height = fig.get_size_inches()
        grown = height + added * _TITLE_SIZE * 1.2 / 72  # matplotlib's line spacing: 1.2
        for axes in fig.axes:
            x0, y0, w, h = axes.get_position().bounds
            axes.set_position((x0, y0 * height / grown, w, h * height / grown))
        fig.set_size_inches(width, grown)
    shown = "\n".join(lines)
    if ax is None:
        fig.suptitle(shown, fontsize=_TITLE_SIZE, y=1 - 0.07 / fig.get_figheight(),
                     color=_title_colour(suspect))
    else:
        ax.set_title(shown, fontsize=_TITLE_SIZE, color=_title_colour(suspect))


def _draw_scale_bar(ax, shape: tuple[int, int], pixel_size_m: float) -> None:
    """White bar with a dark outline and label in the lower right corner of an image axis."""
    from matplotlib import patheffects

    h, w = shape
    length_px, label = scale_bar(w, pixel_size_m)
    pad = 0.05 * w
    thick = max(0.02 * h, 1.0)
    x0, y0 = w - pad - length_px - 0.5, h - pad - thick - 0.5
    outline = [patheffects.withStroke(linewidth=2.5, foreground="black")]
    ax.add_patch(
        Rectangle((x0, y0), length_px, thick, facecolor="white", edgecolor="black", lw=0.8)
    )
    ax.text(  # right-aligned with the bar so it stays inside narrow images
        x0 + length_px,
        y0 - 0.015 * h,
        label,
        color="white",
        ha="right",
        va="bottom",
        fontsize=10,
        path_effects=outline,
    )


def _image_axes(fig: Figure, title: str, shape: tuple[int, int], suspect: bool = False):
    """Image axes and a colorbar axes beside it, placed by hand (see :func:`_new_figure`)."""
    fw, fh = fig.get_size_inches()
    # Box for the image: leave room for the title (top) and the colorbar (right).
    box_w, box_h = 0.76, 0.80
    aspect = shape[1] / shape[0]
    w, h = box_w, box_w * fw / fh / aspect
    if h > box_h:
        w, h = box_h * fh / fw * aspect, box_h
    left, bottom = 0.03 + (box_w - w) / 2, 0.04 + (box_h - h) / 2
    ax = fig.add_axes((left, bottom, w, h))
    ax.set_xticks([])
    ax.set_yticks([])
    cax = fig.add_axes((left + w + 0.02, bottom, 0.03, h))
    # Centred on the figure, not the axes: the colorbar makes the axes sit left of centre
    # and a long title would be clipped at the left edge.
    _place_title(fig, title, suspect)
    return ax, cax


# --------------------------------------------------------------------------- object view


@dataclass(frozen=True)
class ObjectView:
    """The object as the previews show it.

    Attributes:
        values: complex image at display resolution (cropped to the scanned region, block
            averaged down to at most :data:`MAX_DISPLAY_PX` a side).
        factor: the block-averaging factor (display pixel = ``factor`` object pixels).
        inside: the illuminated region at display resolution, or ``None`` when unknown
            (no probe positions given): nothing is dimmed and no outline is drawn then.
    """

    values: NDArray[np.complex128]
    factor: int
    inside: NDArray[np.bool_] | None


def illuminated_region(
    object_shape: tuple[int, int], probe: ArrayLike, corners: ArrayLike
) -> NDArray[np.bool_]:
    """Where the summed probe intensity reaches :data:`ILLUMINATION_FRACTION` of its peak.

    ``corners`` are the top-left ``(y, x)`` of each probe window in object pixels. They are
    clipped into the object first: a refined position that rounds half a pixel past the
    edge must not cost the previews. Cost: one ``M×M`` addition per position, a small
    fraction of one iteration of the engine.
    """
    p = _probe_modes(probe)
    c = np.asarray(corners, dtype=np.float64).reshape(-1, 2)
    limit = np.array(object_shape, np.float64) - np.array(p.shape[1:], np.float64)
    if np.any(limit < 0):
        raise PreviewError(f"probe {p.shape[1:]} is larger than the object {object_shape}")
    return illumination_mask(object_shape, p, np.clip(c, 0, limit), ILLUMINATION_FRACTION)


def object_view(
    obj: ArrayLike,
    *,
    scan_extent_px: Sequence[int] | None = None,
    illuminated: ArrayLike | None = None,
) -> ObjectView:
    """Crop, block-average and check the object (and its illuminated region) for display.

    Raises:
        PreviewError: not a 2-D complex array (``[1, H, W]`` is accepted), non-finite
            values, or an ``illuminated`` mask of another shape.
    """
    o = np.asarray(obj)
    if o.ndim == 3 and o.shape[0] == 1:  # product layout [layers, H, W] with one layer
        o = o[0]
    if o.ndim != 2:
        raise PreviewError(f"object: expected a 2-D complex array, got shape {o.shape}")
    _check_finite(o, "object")
    values, factor = _block_mean(_crop(o, scan_extent_px).astype(np.complex128), MAX_DISPLAY_PX)
    if illuminated is None:
        return ObjectView(values, factor, None)
    m = np.asarray(illuminated, dtype=bool)
    if m.shape != o.shape:
        raise PreviewError(f"illuminated: shape {m.shape} is not the object's {o.shape}")
    # A display pixel counts as illuminated when most of its block is.
    frac, _ = _block_mean(_crop(m, scan_extent_px).astype(np.float64), MAX_DISPLAY_PX)
    inside = frac >= 0.5
    # A region of a few pixels cannot anchor a colour window: show the object undimmed.
    return ObjectView(values, factor, inside if inside.sum() >= _MIN_REGION_PX else None)


def flatten_phase(
    o: NDArray[np.complex128], region: NDArray[np.bool_], remove_ramp: bool = True
) -> NDArray[np.complex128]:
    """``o`` with the linear phase ramp (optional) and the global phase over ``region`` removed.

    Both are fitted over ``region`` only: outside the illuminated area the phase is
    unconstrained and would tilt the plane. The median phase of the region (the background,
    for a sparse sample) becomes 0.
    """
    if remove_ramp and min(o.shape) >= 3:
        _, gy, gx = fit_phase_ramp(o, region)
        y, x = np.indices(o.shape, dtype=np.float64)
        o = o * np.exp(-1j * (gy * y + gx * x))
    # Measured about the mean phasor first so that the median never straddles the wrap.
    o = o * np.exp(-1j * np.angle(np.sum(o[region])))
    return o * np.exp(-1j * np.median(np.angle(o[region])))


def robust_window(values: ArrayLike, region: ArrayLike | None = None) -> tuple[float, float]:
    """Colour window ``(lo, hi)``: the :data:`WINDOW_PERCENTILES` of ``values`` in ``region``.

    A few hot pixels or a wild border cannot squeeze the contrast of the sample; values
    outside the window clip. A flat region gets a small window around its value.
    """
    v = np.asarray(values, dtype=np.float64)
    sel = v if region is None else v[np.asarray(region, dtype=bool)]
    if sel.size == 0:
        sel = v.ravel()
    lo, hi = (float(q) for q in np.percentile(sel, WINDOW_PERCENTILES))
    if hi - lo <= 1e-9 * max(abs(lo), abs(hi), 1.0):
        lo, hi = lo - 1e-6, hi + 1e-6
    return lo, hi


def shade_outside(rgb: ArrayLike, inside: ArrayLike | None) -> NDArray[np.float64]:
    """``rgb`` (``[H, W, 3]``, 0…1) with the pixels outside ``inside`` blended toward
    :data:`OUTSIDE_COLOUR`, so a never-illuminated border does not read as sample."""
    out = np.array(rgb, dtype=np.float64)
    if inside is None:
        return out
    outside = ~np.asarray(inside, dtype=bool)
    out[outside] = (1 - OUTSIDE_BLEND) * out[outside] + OUTSIDE_BLEND * np.asarray(OUTSIDE_COLOUR)
    return out


def _reference_region(view: ObjectView) -> NDArray[np.bool_]:
    """Pixels the phase is referred to: illuminated ones of appreciable amplitude.

    Near-zero amplitude carries no phase (strong absorbers, empty corners); without a known
    illuminated region every pixel of appreciable amplitude counts.
    """
    amp = np.abs(view.values)
    # (never empty: object_view drops a region of fewer than _MIN_REGION_PX pixels)
    base = view.inside if view.inside is not None else np.ones(amp.shape, bool)
    if amp[base].max() <= 0:
        return base
    region = base & (amp > 0.1 * np.percentile(amp[base], 99))
    return region if region.sum() >= _MIN_REGION_PX else base


def object_rgb(
    values: ArrayLike,
    window: tuple[float, float],
    cmap_name: str,
    inside: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """``[H, W, 3]`` colours of ``values`` in ``window`` (beyond it: clipped to the ends of
    the colour map), dimmed outside ``inside`` (:func:`shade_outside`)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    rgba = colormaps[cmap_name](Normalize(*window, clip=True)(np.asarray(values)))
    return shade_outside(rgba[..., :3], inside)


def _draw_image(
    fig: Figure,
    view: ObjectView,
    values: np.ndarray,
    window: tuple[float, float],
    cmap_name: str,
    title: str,
    pixel_size_m: float,
    extend: Literal["both", "neither"] = "both",
    suspect: bool = False,
) -> Colorbar:
    """Draw :func:`object_rgb`, outline the illuminated region, add the scale bar; returns
    the colour bar of ``window`` (its arrows: values beyond it clip)."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    ax, cax = _image_axes(fig, title, values.shape, suspect)
    ax.imshow(object_rgb(values, window, cmap_name, view.inside), interpolation="nearest")
    if view.inside is not None and not view.inside.all():
        ax.contour(view.inside.astype(np.float32), levels=[0.5], colors=[OUTLINE_COLOUR],
                   linewidths=0.9)
    _draw_scale_bar(ax, values.shape, pixel_size_m * view.factor)
    mappable = ScalarMappable(norm=Normalize(*window), cmap=colormaps[cmap_name])
    return fig.colorbar(mappable, cax=cax, extend=extend)


@dataclass(frozen=True)
class PhaseImage:
    """The phase as :func:`render_object_phase` draws it.

    Attributes:
        view: the object shown (:func:`object_view`).
        phase: radians at display resolution, ramp (optionally) and global phase removed.
        window: the colour window: :func:`robust_window` over the reference region, or
            ``(−π, π)`` for the full-range view.
        region: the reference region the ramp, global phase and window were measured on.
    """

    view: ObjectView
    phase: NDArray[np.float64]
    window: tuple[float, float]
    region: NDArray[np.bool_]


def phase_image(
    obj: ArrayLike,
    *,
    scan_extent_px: Sequence[int] | None = None,
    illuminated: ArrayLike | None = None,
    mode: Literal["wrapped", "unwrapped"] = "wrapped",
    remove_ramp: bool = True,
    full_range: bool = False,
) -> PhaseImage:
    """The phase to draw and its colour window (arguments as :func:`render_object_phase`)."""
    if mode not in ("wrapped", "unwrapped"):
        raise ValueError(f"mode must be 'wrapped' or 'unwrapped', got {mode!r}")
    view = object_view(obj, scan_extent_px=scan_extent_px, illuminated=illuminated)
    region = _reference_region(view)
    o = flatten_phase(view.values, region, remove_ramp)
    if full_range:
        phase = (np.angle(o) + np.pi) % (2 * np.pi) - np.pi
        return PhaseImage(view, phase, (-np.pi, np.pi), region)
    if mode == "wrapped":
        phase = np.angle(o)
    else:
        # The least-squares solve is global: the residues of the unconstrained phase outside
        # the illuminated region would spread into the sample. Unwrap a flat outside instead.
        wrapped = np.angle(o) if view.inside is None else np.where(view.inside, np.angle(o), 0)
        phase = unwrap_phase(wrapped)
        phase -= np.median(phase[region])
    return PhaseImage(view, phase, robust_window(phase, region), region)


# --------------------------------------------------------------------------- renderers


def render_object_phase(
    obj: ArrayLike,
    pixel_size_m: float,
    *,
    scan_extent_px: Sequence[int] | None = None,
    title: str = "",
    mode: Literal["wrapped", "unwrapped"] = "wrapped",
    remove_ramp: bool = True,
    illuminated: ArrayLike | None = None,
    full_range: bool = False,
    suspect: bool = False,
) -> bytes:
    """PNG bytes of the object phase (see the module docstring for the conventions).

    ``illuminated`` (bool, the object's shape; e.g. from :func:`illuminated_region`) is where
    the ramp, the global phase and the colour window are measured, and what stays undimmed.
    ``full_range=True`` draws the whole wrapped [−π, π) with a cyclic colour map instead of
    the robust window (``mode`` is then ignored).
    """
    img = phase_image(obj, scan_extent_px=scan_extent_px, illuminated=illuminated, mode=mode,
                      remove_ramp=remove_ramp, full_range=full_range)
    what = "ramp removed" if remove_ramp else "global phase removed"
    fig = _new_figure()
    title = headline(title, suspect)
    if full_range:
        label = f"Object phase, full range [−π, π) ({what})"
        text = f"{title}\n{label}".strip()
        # Nothing clips on a cyclic scale: no arrows on its colour bar.
        cb = _draw_image(fig, img.view, img.phase, img.window, "twilight", text,
                         pixel_size_m, extend="neither", suspect=suspect)
        cb.set_ticks([-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi])
        cb.ax.set_yticklabels(["−π", "−π/2", "0", "π/2", "π"])
    else:
        lo_p, hi_p = WINDOW_PERCENTILES
        where = "illuminated region" if img.view.inside is not None else "object"
        label = (f"Object phase{', unwrapped' if mode == 'unwrapped' else ''} ({what})\n"
                 f"colour window: {lo_p:g}–{hi_p:g} % of the {where}")
        text = f"{title}\n{label}".strip()
        cb = _draw_image(fig, img.view, img.phase, img.window, "viridis", text, pixel_size_m,
                         suspect=suspect)
    cb.set_label("phase [rad]")
    return _png_bytes(fig, text)


def render_object_amplitude(
    obj: ArrayLike,
    pixel_size_m: float,
    *,
    scan_extent_px: Sequence[int] | None = None,
    title: str = "",
    illuminated: ArrayLike | None = None,
    suspect: bool = False,
) -> bytes:
    """PNG bytes of the object amplitude ``|O|`` (gray; window from robust percentiles of
    the illuminated region when ``illuminated`` is given, of the whole crop otherwise),
    divided by the amplitude of the unscattered region (:func:`unscattered_level`) so that
    empty space reads 1; where there is none the title says why it is not normalised."""
    view = object_view(obj, scan_extent_px=scan_extent_px, illuminated=illuminated)
    amp = np.abs(view.values)
    level = unscattered_level(view)
    if level.value is not None:
        amp = amp / level.value
        label, bar = "Object amplitude |O|, unscattered region = 1", "amplitude (unscattered = 1)"
    else:
        label, bar = f"Object amplitude |O|, not normalised: {level.reason}", "amplitude"
    fig = _new_figure()
    text = f"{headline(title, suspect)}\n{label}".strip()
    cb = _draw_image(fig, view, amp, robust_window(amp, view.inside), "gray", text,
                     pixel_size_m, suspect=suspect)
    cb.set_label(bar)
    return _png_bytes(fig, text, level.reason)


@dataclass(frozen=True)
class UnscatteredLevel:
    """The amplitude of the object where nothing scatters (empty space: transmission 1).

    Attributes:
        value: that amplitude, or ``None`` when no such region was found.
        share: the share of the illuminated region it was measured on.
        reason: how it was found, or why there is none.
    """

    value: float | None
    share: float
    reason: str


#: Unscattered candidates: the flattest and the brightest of the illuminated pixels, by these
#: percentiles of the local relative variation (at most) and of the amplitude (at least) ...
FLAT_PERCENTILE, BRIGHT_PERCENTILE = 40.0, 50.0
#: ... covering at least this share of the illuminated region ...
MIN_UNSCATTERED_SHARE = 0.05
#: ... much flatter than the sample: their median variation at most this fraction of the
#: region's 90th percentile (calibrated: simulated far-field reconstructions 0.03, the PETRA
#: III near-field Siemens star 0.22; textures without empty space 0.31 and 0.42) ...
MAX_FLATNESS_RATIO = 0.25
#: ... and no more than this share of the region may be brighter than 1.1 × their level
#: (a transmission above 1 is no sample: free space must be the brightest).
MAX_BRIGHTER_SHARE = 0.05


def unscattered_level(view: ObjectView) -> UnscatteredLevel:
    """Where the object is flat (much flatter than the sample) and bright, and nothing is
    much brighter, it is empty space: its median amplitude (``value``) is what a
    transmission of 1 came out as.

    Ptychography recovers the object only up to a scale traded with the probe; dividing by
    this level undoes it. A sample that fills the field leaves no such area (``value``
    None, ``reason`` says so)."""
    z = view.values
    region = view.inside if view.inside is not None else np.ones(z.shape, bool)
    amp = np.abs(z)
    if min(z.shape) < 3 or region.sum() < _MIN_REGION_PX:
        return UnscatteredLevel(None, 0.0, "the object is too small to find empty space in")
    # Relative variation of the complex object to its neighbours: 0 where it is flat.
    step = np.zeros(z.shape)
    step[:-1] += np.abs(np.diff(z, axis=0))
    step[1:] += np.abs(np.diff(z, axis=0))
    step[:, :-1] += np.abs(np.diff(z, axis=1))
    step[:, 1:] += np.abs(np.diff(z, axis=1))
    variation = step / np.maximum(amp, 1e-30)
    flat = variation <= np.percentile(variation[region], FLAT_PERCENTILE)
    bright = amp >= np.percentile(amp[region], BRIGHT_PERCENTILE)
    empty = region & flat & bright
    share = float(empty.sum()) / float(region.sum())
    if share < MIN_UNSCATTERED_SHARE or not empty.any():
        return UnscatteredLevel(None, share, "no flat, bright area (the sample may fill the "
                                "field of view)")
    flatness = float(np.median(variation[empty]) /
                     max(np.percentile(variation[region], 90), 1e-30))
    if flatness > MAX_FLATNESS_RATIO:
        return UnscatteredLevel(None, share, "no area is much flatter than the rest (the "
                                "sample may fill the field of view)")
    level = float(np.median(amp[empty]))
    brighter = float(np.mean(amp[region] > 1.1 * level))
    if level <= 0 or brighter > MAX_BRIGHTER_SHARE:
        return UnscatteredLevel(None, share, f"{brighter:.0%} of the illuminated area is "
                                "brighter than its flattest bright part, so that is no empty "
                                "space")
    return UnscatteredLevel(level, share, f"divided by {level:.4g}, the median |O| of the "
                            f"flat, bright {share:.0%} of the illuminated area (empty space)")


def _probe_modes(probe: ArrayLike) -> np.ndarray:
    """The probe as ``[K, M, M]`` (accepts ``[M, M]`` and the product's ``[1, K, M, M]``)."""
    p = np.asarray(probe)
    while p.ndim > 3 and p.shape[0] == 1:
        p = p[0]
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3:
        raise PreviewError(f"probe: expected [M, M] or [K, M, M], got shape {p.shape}")
    return p


def render_probe(
    probe: ArrayLike, pixel_size_m: float, *, title: str = "", max_modes: int = 8,
    suspect: bool = False,
) -> bytes:
    """PNG bytes of the probe modes: colour = phase, brightness = amplitude, power in %."""
    p = _probe_modes(probe)
    _check_finite(p, "probe")
    power = np.sum(np.abs(p) ** 2, axis=(1, 2))
    total = float(power.sum())
    k = min(p.shape[0], max_modes)
    cols = min(k, 4)
    rows = math.ceil(k / cols)
    size = (max(2.6 * cols, 4.0), 2.6 * rows + 0.7)
    fig = _new_figure(size)
    axes = fig.subplots(rows, cols, squeeze=False)
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.75 / size[1], wspace=0.05)
    for i, ax in enumerate(axes.ravel()):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= k:
            ax.set_axis_off()
            continue
        ax.imshow(complex_to_rgb(p[i]), interpolation="nearest")
        share = 100 * float(power[i]) / total if total > 0 else 0.0
        ax.set_title(f"mode {i}: {share:.1f} %", fontsize=9)
        if i == 0:
            _draw_scale_bar(ax, p.shape[1:], pixel_size_m)
    more = f" (first {k} of {p.shape[0]})" if p.shape[0] > k else ""
    text = (f"{headline(title, suspect)}\nProbe modes{more}: hue = phase, brightness = "
            "amplitude").strip()
    _place_title(fig, text, suspect)
    return _png_bytes(fig, text)


def render_convergence(
    loss_history: ArrayLike, *, title: str = "", noise_floor: float | None = None,
    suspect: bool = False,
) -> bytes:
    """PNG bytes of the loss against iteration (log y), with labelled ticks on both axes and,
    given the data's Poisson ``noise_floor`` (the misfit a perfect model scores,
    :func:`beamflow.ptycho.quality.verdict.noise_floor`), a dashed line at it.

    ``loss_history`` is 1-D (the loss of iterations 1, 2, …) or ``[N, 2]`` rows of
    ``(iteration, loss)``.
    """
    from matplotlib.ticker import LogLocator, MaxNLocator

    h = np.asarray(loss_history, dtype=np.float64)
    if h.ndim == 1:
        its, vals = np.arange(1, h.size + 1, dtype=np.float64), h
    elif h.ndim == 2 and h.shape[1] == 2:
        its, vals = h[:, 0], h[:, 1]
    else:
        raise PreviewError(f"loss history: expected [N] or [N, 2], got shape {h.shape}")
    ok = np.isfinite(its) & np.isfinite(vals) & (vals > 0)
    dropped = int(ok.size - ok.sum())
    floor = noise_floor if noise_floor is not None and math.isfinite(noise_floor) and \
        noise_floor > 0 else None
    fig = _new_figure((5.4, 3.6))
    ax = fig.add_axes((0.15, 0.14, 0.8, 0.72))
    label = f"{headline(title, suspect)}\nConvergence".strip()
    if dropped:
        label += f" ({dropped} non-finite/non-positive values not shown)"
    _place_title(fig, label, suspect, ax)
    ax.set_xlabel("iteration")
    ax.set_ylabel("amplitude misfit (loss)")
    description = ""
    if ok.any():
        ax.semilogy(
            its[ok], vals[ok], "-", color="tab:blue", lw=1.5, marker="." if ok.sum() < 40 else None,
            label=f"loss (last {vals[ok][-1]:.3g}, iteration {its[ok][-1]:g})",
        )
        shown = vals[ok]
        if floor is not None:
            ax.axhline(floor, color="0.35", ls="--", lw=1.2,
                       label=f"Poisson noise floor {floor:.3g}")
            shown = np.append(shown, floor)
            description = (f"noise floor {floor:.4g}; last loss "
                           f"{vals[ok][-1] / floor:.3g}× the floor")
        lo, hi = float(shown.min()), float(shown.max())
        ax.set_ylim(lo / 1.3, hi * 1.3)
        ax.grid(True, alpha=0.3)
        # Ticks at 1, 2 and 5 × 10ⁿ over a narrow range, decades over a wide one: every
        # plot has labelled values on its y axis. Plain tick labels: the default log
        # formatter typesets 10^n with mathtext, whose parser costs more than the figure.
        subs = (1.0, 2.0, 5.0) if hi / lo < 1e3 else (1.0,)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="best", fontsize=8, framealpha=0.8)
    else:
        ax.text(0.5, 0.5, "no iterations yet", transform=ax.transAxes, ha="center", va="center")
        ax.set_yticks([])
    return _png_bytes(fig, label, description)


# --------------------------------------------------------------------------- writing


# --------------------------------------------------------------------------- layers

#: A thick sample's preview: each layer's phase (the other previews show their product).
LAYERS_NAME = "object_layers"


def render_object_layers(layers: ArrayLike, pixel_size_m: float, *,
                         spacings_m: Sequence[float] = (),
                         scan_extent_px: Sequence[int] | None = None,
                         illuminated: ArrayLike | None = None, title: str = "",
                         suspect: bool = False) -> bytes:
    """PNG bytes of each layer's phase, entrance layer first, in one row (two for more than
    four layers); ``spacings_m`` label the panels with each layer's depth."""
    stack = np.asarray(layers)
    if stack.ndim != 3 or stack.shape[0] < 2:
        raise PreviewError(f"object layers: expected [S ≥ 2, H, W], got shape {stack.shape}")
    s = stack.shape[0]
    depths = np.concatenate([[0.0], np.cumsum(spacings_m)]) if len(spacings_m) == s - 1 \
        else None
    cols = s if s <= 4 else -(-s // 2)
    rows = -(-s // cols)
    fig = _new_figure((2.6 * cols + 0.4, 2.7 * rows + 0.7))
    top = 1.0 - 0.7 / fig.get_size_inches()[1]
    for k in range(s):
        img = phase_image(stack[k], scan_extent_px=scan_extent_px, illuminated=illuminated)
        r, c = divmod(k, cols)
        w, h = 0.9 / cols, 0.86 * top / rows
        ax = fig.add_axes((0.05 + c / cols * 0.95, top - (r + 1) * top / rows + 0.04,
                           w * 0.9, h * 0.85))
        ax.imshow(object_rgb(img.phase, img.window, "viridis", img.view.inside),
                  interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        depth = "" if depths is None else f", z = {depths[k] * 1e6:.4g} µm"
        ax.set_title(f"layer {k + 1}{depth}\nphase {img.window[0]:.2f}…{img.window[1]:.2f} rad",
                     fontsize=8)
        _draw_scale_bar(ax, img.phase.shape, pixel_size_m * img.view.factor)
    text = f"{headline(title, suspect)}\nObject layers: phase of each (ramp removed)".strip()
    _place_title(fig, text, suspect)
    return _png_bytes(fig, text, "the phase of each object layer of a multislice "
                                 "reconstruction; the other previews show their product")


def write_png_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then rename.

    Readers see the old file or the complete new one, never a partial file. (No fsync:
    previews are regenerated, so after a crash a stale file is fine; a torn one is not.)
    """
    return atomic_write_bytes(path, data, durable=False)


def write_previews(
    out_dir: str | Path,
    obj: ArrayLike,
    probe: ArrayLike,
    pixel_size_m: float,
    loss_history: ArrayLike,
    scan_extent_px: Sequence[int] | None = None,
    title: str = "",
    *,
    positions_px: ArrayLike | None = None,
    phase_mode: Literal["wrapped", "unwrapped"] = "wrapped",
    noise_floor: float | None = None,
    suspect: bool = False,
    spacings_m: Sequence[float] = (),
) -> dict[str, Path]:
    """Render and atomically write the previews (:data:`PREVIEW_NAMES`) into ``out_dir``.

    Args:
        out_dir: directory for ``object_phase.png``, ``object_phase_full.png``,
            ``object_amplitude.png``, ``probe.png`` and ``convergence.png`` (created if
            needed).
        obj: complex object ``[H, W]`` (or ``[1, H, W]``), or ``[S, H, W]`` layers of a
            thick sample: the images show their projection (product), and
            ``object_layers.png`` each layer (:func:`render_object_layers`).
        probe: complex probe ``[M, M]``, ``[K, M, M]`` (or ``[1, K, M, M]``).
        pixel_size_m: object pixel size, for the scale bars.
        loss_history: 1-D losses per iteration, or ``[N, 2]`` rows of (iteration, loss).
        scan_extent_px: ``(row0, row1, col0, col1)`` of the scanned region in object
            pixels, to crop the object images to it.
        title: shown above every image (e.g. the scan name and iteration).
        positions_px: ``[N, 2]`` top-left ``(y, x)`` of each probe window in object pixels.
            With them the object images are referred to, windowed on and outlined around
            the illuminated region, and the border outside it is dimmed; without them (or
            with none) the whole crop counts.
        phase_mode: ``"wrapped"`` (default) or ``"unwrapped"``, for ``object_phase.png``.
        noise_floor: the data's Poisson noise floor, drawn dashed on the convergence plot.
        suspect: the verdict on the result is *suspect*: every title starts with SUSPECT
            (in red).
        spacings_m: the layers' spacings, for the layers' depths in their preview.

    Returns:
        ``{name: Path}`` for every name in :data:`PREVIEW_NAMES` (and ``object_layers``
        for layers).

    Raises:
        PreviewError: non-finite object or probe, or arrays of the wrong rank; nothing is
            written then (all images are rendered before the first file is replaced).
    """
    # Checked before the illuminated region is summed from it: a NaN probe must be reported
    # as such, not as an empty region.
    _check_finite(_probe_modes(probe), "probe")
    layers = np.asarray(obj)
    if layers.ndim == 3 and layers.shape[0] > 1:
        _check_finite(layers, "object")
        obj = np.prod(layers, axis=0)
    illuminated = None
    shape = np.shape(obj)[-2:]
    if positions_px is not None and np.size(positions_px) > 0 and len(shape) == 2:
        illuminated = illuminated_region(shape, probe, positions_px)
    common = {"scan_extent_px": scan_extent_px, "title": title, "illuminated": illuminated,
              "suspect": suspect}
    images = {
        "object_phase": render_object_phase(obj, pixel_size_m, mode=phase_mode, **common),
        "object_phase_full": render_object_phase(obj, pixel_size_m, full_range=True, **common),
        "object_amplitude": render_object_amplitude(obj, pixel_size_m, **common),
        "probe": render_probe(probe, pixel_size_m, title=title, suspect=suspect),
        "convergence": render_convergence(loss_history, title=title, noise_floor=noise_floor,
                                          suspect=suspect),
    }
    if layers.ndim == 3 and layers.shape[0] > 1:
        images[LAYERS_NAME] = render_object_layers(
            layers, pixel_size_m, spacings_m=spacings_m, scan_extent_px=scan_extent_px,
            illuminated=illuminated, title=title, suspect=suspect)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {name: write_png_atomic(out / f"{name}.png", data) for name, data in images.items()}
