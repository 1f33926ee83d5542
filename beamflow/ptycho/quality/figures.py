"""The drawing of the previews: figures placed by hand, titles that wrap to the figure, scale
bars, colour maps of complex values, PNG bytes with their text chunks (see
:mod:`.previews` for what the images show)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import hsv_to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from numpy.typing import ArrayLike, NDArray

from ..arrays import dct2

__all__ = [
    "SUSPECT_MARK",
    "PreviewError",
    "complex_to_rgb",
    "headline",
    "nice_length",
    "scale_bar",
    "unwrap_phase",
]

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
