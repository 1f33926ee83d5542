"""The engine's small test scans and their scores, shared by the engine's tests (CPU, device
paths, GPU, sweep, mPIE, FFTW, device memory).

The scans are small (32x32 px frames, 50-80 positions) and simulated with an independent
forward model: each object window is Fourier-shifted by the position's sub-pixel fraction
(with a margin) — the engine instead shifts the probe.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from beamflow.ptycho import PtychoData, ReconParams, ReconState, Reconstructor, initial_state
from beamflow.ptycho.arrays import array_backend
from beamflow.ptycho.forward.propagation import Propagation

M = 32


def _smooth(rng, shape, sigma):
    f = np.fft.fft2(rng.standard_normal(shape))
    k2 = np.fft.fftfreq(shape[0])[:, None] ** 2 + np.fft.fftfreq(shape[1])[None] ** 2
    r = np.real(np.fft.ifft2(f * np.exp(-2 * (np.pi * sigma) ** 2 * k2)))
    return (r - r.mean()) / r.std()


def make_probe(m=M, defocus=12.0, width=5.0):
    k = np.fft.fftshift(np.fft.fftfreq(m))
    k2 = k[:, None] ** 2 + k[None] ** 2
    pupil = (np.sqrt(k2) < 0.2) * np.exp(1j * defocus * m * k2)
    p = np.fft.fftshift(np.fft.ifft2(np.fft.ifftshift(pupil)))
    r2 = (np.arange(m) - m / 2 + 0.5) ** 2
    p = p * np.exp(-(r2[:, None] + r2[None]) / (2 * width**2))
    return (p / np.abs(p).max()).astype(np.complex64)


def simulate(n=60, photons=1e6, modes=None, seed=0, poisson=True, step=3.2):
    """A Fermat-spiral scan with sub-pixel positions; returns a dict of arrays."""
    rng = np.random.default_rng(seed)
    probes = make_probe()[None] if modes is None else np.asarray(modes)
    i = np.arange(n)
    pos = np.stack([np.sin(i * 2.39996), np.cos(i * 2.39996)], 1) * (step * np.sqrt(i))[:, None]
    q = 6
    pos = pos - pos.min(0) + q + 1.5 + rng.uniform(-0.5, 0.5, (n, 2))
    h = int(np.ceil(pos[:, 0].max())) + M + q + 2
    w = int(np.ceil(pos[:, 1].max())) + M + q + 2
    obj = ((0.8 + 0.15 * np.tanh(_smooth(rng, (h, w), 1.5)))
           * np.exp(0.7j * np.tanh(_smooth(rng, (h, w), 1.2)))).astype(np.complex64)
    kf = np.fft.fftfreq(M + 2 * q)
    inten = np.zeros((n, M, M))
    for j, (py, px) in enumerate(pos):
        ny, nx = int(np.rint(py)), int(np.rint(px))
        win = obj[ny - q : ny + M + q, nx - q : nx + M + q].astype(np.complex128)
        ramp = np.exp(2j * np.pi * (kf[:, None] * (py - ny) + kf[None] * (px - nx)))
        sub = np.fft.ifft2(np.fft.fft2(win) * ramp)[q : q + M, q : q + M]
        for p in probes:
            inten[j] += np.abs(np.fft.fft2(p * sub)) ** 2
    scale = photons / inten.sum(axis=(1, 2)).mean()
    inten *= scale
    if poisson:
        inten = rng.poisson(inten).astype(np.float64)
    return {
        "intensities": np.fft.fftshift(inten, axes=(-2, -1)).astype(np.float32),
        "positions": pos,
        "object": obj,
        "probe": (probes * np.sqrt(scale)).astype(np.complex64),
        "shape": (h, w),
    }


# A thick sample's settings: layers 400 µm apart at 8.8 keV and 58.7 nm pixels (many depths of
# field), for the device tests (the thin scan's frames do: they compare devices, not truths).
LAYERS = {"slices": 2, "slice_spacing_m": 400e-6,
          "propagation": Propagation(wavelength_m=1.239842e-6 / 8800, pixel_size_m=58.7e-9)}
# Algorithm set-ups the device tests (test_ptycho_engine_gpu, test_ptycho_device_paths) run.
DEVICE_SETUPS = [
    {"algorithm": "rpie"},
    {"algorithm": "rpie", "probe_modes": 2, "position_correction": True,
     "position_correction_start": 1},
    {"algorithm": "epie"},
    {"algorithm": "dm"},
    {"algorithm": "lsqml", "noise_model": "poisson"},
    {"algorithm": "mpie", "momentum_every": 2},
    {"algorithm": "rpie", "opr_modes": 3},
    {"algorithm": "lsqml", "opr_modes": 2, "probe_modes": 2},
    {"algorithm": "rpie", **LAYERS},
    {"algorithm": "lsqml", "probe_modes": 2, "layer_regularization": 0.5, **LAYERS,
     "slices": 3},
]
DEVICE_SETUP_IDS = ["rpie", "rpie-modes-poscorr", "epie", "dm", "lsqml", "mpie", "rpie-opr",
                    "lsqml-opr-modes", "rpie-2-layers", "lsqml-3-layers-modes"]


def data_of(sim, positions=None, mask=None, intensities=None):
    return PtychoData(sim["intensities"] if intensities is None else intensities,
                      sim["positions"] if positions is None else positions, sim["shape"],
                      mask)


def region(sim, frac=0.4):
    """Where the scan's summed illumination is above ``frac`` of its maximum."""
    m = sim["probe"].shape[-1]
    ill = np.zeros(sim["shape"])
    pint = (np.abs(sim["probe"]) ** 2).sum(axis=0)
    for py, px in sim["positions"]:
        ny, nx = int(round(py)), int(round(px))
        ill[ny : ny + m, nx : nx + m] += pint
    return ill > frac * ill.max()


def nrmse(rec, true, where):
    """Complex NRMSE after the optimal complex scalar (global phase and scale)."""
    a, b = rec[where].astype(np.complex128), true[where].astype(np.complex128)
    c = np.vdot(a, b) / np.vdot(a, a)
    return float(np.linalg.norm(c * a - b) / np.linalg.norm(b))


def reconstruct(data, iterations, **kw):
    params = ReconParams(iterations=iterations, **kw)
    state = initial_state(data, params)
    with Reconstructor(data, state, array_backend("cpu")) as rec:
        return rec.run()


def through_a_checkpoint(state: ReconState) -> ReconState:
    """``state`` as a checkpoint gives it back: its host arrays copied, its metadata through
    JSON."""
    arrays = {k: np.array(v, copy=True) for k, v in state.to_host_arrays().items()}
    return ReconState.from_arrays(arrays, json.loads(json.dumps(state.meta())))


def straight_part_resumed(data: PtychoData, params: ReconParams, stop: int,
                          backend: Any = "cpu", **start: Any
                          ) -> tuple[ReconState, ReconState, ReconState]:
    """``params`` run in one go; the same stopped at iteration ``stop``; and that state,
    through a checkpoint, run on to the end. ``start``: :func:`initial_state`'s keywords."""
    with Reconstructor(data, initial_state(data, params, **start), backend) as rec:
        straight = rec.run()
    with Reconstructor(data, initial_state(data, params, **start), backend) as rec:
        part = rec.run(stop)
    with Reconstructor(data, through_a_checkpoint(part), backend) as rec:
        resumed = rec.run()
    return straight, part, resumed
