"""A thick sample's preview: the phase of each object layer side by side
(``object_layers.png``).

The other previews (:func:`beamflow.ptycho.previews.write_previews`) show the layers'
projection, their product: the image the data determine on their own. Content that the layers'
spacing cannot tell apart (below the frequency πλΔz f² = 1) may sit in either layer, so a
layer's smooth background says little; its fine detail is what the layers separate. Each
panel has its own colour window (the layers' contrasts differ) over the illuminated region,
with the ramp and global phase removed as in the other previews.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from .previews import (
    PreviewError,
    _draw_scale_bar,
    _new_figure,
    _place_title,
    _png_bytes,
    headline,
    object_rgb,
    phase_image,
    write_png_atomic,
)

__all__ = ["LAYERS_NAME", "render_object_layers", "write_layers_preview"]

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


def write_layers_preview(out_dir: str | Path, layers: ArrayLike, pixel_size_m: float,
                         **kwargs: object) -> Path:
    """Write ``object_layers.png`` into ``out_dir`` (keywords as
    :func:`render_object_layers`)."""
    data = render_object_layers(layers, pixel_size_m, **kwargs)  # type: ignore[arg-type]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_png_atomic(out / f"{LAYERS_NAME}.png", data)
