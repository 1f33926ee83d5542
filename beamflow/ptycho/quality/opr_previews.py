"""The variable probe's preview: the OPR weights along the scan (``probe_variation.png``).

A fly scan's beam varies slowly in time, so the weights of the eigen-probes
(:mod:`beamflow.ptycho.algorithms.opr`) plotted against acquisition order should be smooth curves: a
drift reads as a slow wave, a vibration as a fast one, and weights that look like noise say
the eigen-probes describe noise rather than the beam. Top panel: w_j0, the weight of the
mean probe (the beam's relative amplitude); bottom: w_jk of each eigen-probe U_k, each
relative to the mean probe's norm (so 0.1 means a 10 % change of the probe).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from .figures import PreviewError, _new_figure, _png_bytes
from .previews import write_png_atomic

__all__ = ["PROBE_VARIATION_NAME", "render_opr_weights", "write_opr_preview"]

PROBE_VARIATION_NAME = "probe_variation"


def render_opr_weights(weights: ArrayLike, probe_norm: float = 1.0, *, title: str = "") -> bytes:
    """PNG bytes of the (N, K) weights against acquisition index.

    ``probe_norm``: ‖U_0‖, so the eigen-probes' weights (of unit-norm U_k) are shown as a
    fraction of the mean probe."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] < 1 or w.shape[0] < 1:
        raise PreviewError(f"OPR weights: expected [N, K], got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise PreviewError(f"OPR weights: {int(np.sum(~np.isfinite(w)))} non-finite values")
    n, k = w.shape
    idx = np.arange(n)
    fig = _new_figure((5.4, 4.2))
    top = fig.add_axes((0.15, 0.56, 0.8, 0.3))
    bottom = fig.add_axes((0.15, 0.11, 0.8, 0.33), sharex=top)
    top.set_title(f"{title}\nProbe variation along the scan ({k} OPR modes)".strip(),
                  fontsize=10)
    top.plot(idx, w[:, 0], color="tab:blue", lw=1.2)
    top.set_ylabel("mean probe")
    top.grid(True, alpha=0.3)
    scale = 1.0 / max(float(probe_norm), 1e-30)
    for j in range(1, k):
        bottom.plot(idx, w[:, j] * scale, lw=1.2, label=f"U{j}")
    if k > 1:
        bottom.legend(fontsize=8, loc="upper right", ncol=min(k - 1, 4))
    else:
        bottom.text(0.5, 0.5, "no eigen-probes (opr_modes = 1)", transform=bottom.transAxes,
                    ha="center", va="center")
    bottom.set_xlabel("position (acquisition order)")
    bottom.set_ylabel("eigen-probes / |U0|")
    bottom.grid(True, alpha=0.3)
    return _png_bytes(fig)


def write_opr_preview(out_dir: str | Path, weights: ArrayLike, probe: ArrayLike, *,
                      title: str = "") -> Path:
    """Write ``probe_variation.png`` into ``out_dir``; ``probe`` the (K, M, M) modes (its
    first mode is U_0)."""
    p = np.asarray(probe)
    u0 = p if p.ndim == 2 else p.reshape(-1, *p.shape[-2:])[0]
    data = render_opr_weights(weights, float(np.linalg.norm(u0)), title=title)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_png_atomic(out / f"{PROBE_VARIATION_NAME}.png", data)
