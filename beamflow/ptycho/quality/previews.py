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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter
from numpy.typing import ArrayLike

from beamflow.atomic import atomic_write_bytes

from .figures import (
    _MIN_REGION_PX,
    WINDOW_PERCENTILES,
    PreviewError,
    _check_finite,
    _draw_scale_bar,
    _new_figure,
    _place_title,
    _png_bytes,
    complex_to_rgb,
    headline,
)
from .object_view import (
    ObjectView,
    _draw_image,
    _probe_modes,
    illuminated_region,
    object_rgb,
    object_view,
    phase_image,
    robust_window,
)

__all__ = [
    "LAYERS_NAME",
    "PREVIEW_NAMES",
    "UnscatteredLevel",
    "render_convergence",
    "render_object_amplitude",
    "render_object_layers",
    "render_object_phase",
    "render_probe",
    "unscattered_level",
    "write_png_atomic",
    "write_previews",
]

#: The files :func:`write_previews` writes (``NAME.png``), in the order the page shows them.
PREVIEW_NAMES = ("object_phase", "object_phase_full", "object_amplitude", "probe", "convergence")

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
