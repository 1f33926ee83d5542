"""The object as the previews show it: cropped to the scan, averaged down for display, its
illuminated region, the phase with its ramp removed, and the colour windows measured there
(see :mod:`.previews`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure
from numpy.typing import ArrayLike, NDArray

from .figures import (
    _MIN_REGION_PX,
    ILLUMINATION_FRACTION,
    MAX_DISPLAY_PX,
    OUTLINE_COLOUR,
    OUTSIDE_BLEND,
    OUTSIDE_COLOUR,
    WINDOW_PERCENTILES,
    PreviewError,
    _block_mean,
    _check_finite,
    _crop,
    _draw_scale_bar,
    _image_axes,
    unwrap_phase,
)
from .metrics import fit_phase_ramp, illumination_mask

__all__ = [
    "ObjectView",
    "PhaseImage",
    "flatten_phase",
    "illuminated_region",
    "object_rgb",
    "object_view",
    "phase_image",
    "robust_window",
    "shade_outside",
]

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
