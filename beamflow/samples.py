"""The samples the simulator images: a resolution target with stars, bars and text
(:func:`make_object`), and the layers of a thick sample — chip wiring and particles
(:func:`make_layers`). Complex transmission functions on the object grid, drawn finer and
averaged down so edges are not pixel-sharp."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: Each object pixel is drawn as this many sub-pixels a side, then averaged.
_SUPERSAMPLE = 3


def _paint(
    t: np.ndarray,
    fn: Callable[[np.ndarray, np.ndarray], np.ndarray],
    centre: tuple[float, float],
    half: float,
    weight: float = 1.0,
) -> None:
    """Add ``weight`` × the area coverage of the shape predicate fn(y, x) (object pixel
    coordinates, supersampled) to ``t``, within ``half`` pixels of ``centre`` only."""
    s = _SUPERSAMPLE
    y0, y1 = (max(0, int(centre[0] - half) - 1), min(t.shape[0], int(centre[0] + half) + 2))
    x0, x1 = (max(0, int(centre[1] - half) - 1), min(t.shape[1], int(centre[1] + half) + 2))
    if y0 >= y1 or x0 >= x1:
        return
    y = y0 + (np.arange((y1 - y0) * s) + 0.5) / s - 0.5
    x = x0 + (np.arange((x1 - x0) * s) + 0.5) / s - 0.5
    inside = np.broadcast_to(fn(y[:, None], x[None, :]), (y.size, x.size)).astype(np.float32)
    t[y0:y1, x0:x1] += weight * inside.reshape(y1 - y0, s, x1 - x0, s).mean(axis=(1, 3))


def make_object(
    shape: tuple[int, int], rng: np.random.Generator, centre: tuple[float, float], radius: float,
    *, strength: float = 1.0,
) -> np.ndarray:
    """Structured complex object; features within ``radius`` px of ``centre`` (the scanned
    field), a Siemens star in the middle. ``strength`` scales its phase and absorption (0.5:
    one layer of a thick sample, |O| ≥ 0.84 and phase ≤ ~1 rad)."""
    h, w = shape
    cy, cx = centre
    ta = np.zeros(shape, np.float32)  # strongly phase-shifting, absorbing material (e.g. Au)
    tb = np.zeros(shape, np.float32)  # weakly absorbing material (e.g. resin)

    # Siemens star: 36 spokes, a small solid centre, a ring around it.
    rs = 0.42 * radius

    def star(y, x):
        r = np.hypot(y - cy, x - cx)
        th = np.arctan2(y - cy, x - cx)
        spokes = np.mod(th * 36 / (2 * np.pi), 1.0) < 0.5
        return ((r < rs) & (spokes | (r < 0.06 * rs))) | ((r >= rs * 1.04) & (r < rs * 1.12))

    _paint(ta, star, (cy, cx), rs * 1.12)

    def free_spot(size: float) -> tuple[float, float]:
        for _ in range(200):
            r = radius * math.sqrt(rng.uniform(0.3, 0.9))
            t = rng.uniform(0, 2 * math.pi)
            y, x = cy + r * math.sin(t), cx + r * math.cos(t)
            if math.hypot(y - cy, x - cx) > rs * 1.2 + size:
                return y, x
        return cy + radius * 0.8, cx

    # Resolution bar groups: 3 bars of width w, alternating orientation.
    for i, bw in enumerate([1.0, 1.5, 2.0, 3.0, 4.0]):
        gy, gx = free_spot(6 * bw)
        length = 5.0 * bw
        vertical = i % 2 == 0

        def bars(y, x, gy=gy, gx=gx, bw=bw, length=length, vertical=vertical):
            u, v = (x - gx, y - gy) if vertical else (y - gy, x - gx)
            return (
                (np.abs(v) < length / 2)
                & (np.abs(u) < 2.5 * bw)
                & (np.mod(u / bw + 2.5, 2.0) < 1.0)
            )

        _paint(ta, bars, (gy, gx), max(length / 2, 2.5 * bw), 0.8)

    # Discs of the weak material, some overlapping the rest.
    for _ in range(14):
        r0 = rng.uniform(1.5, 0.12 * radius + 2)
        dy, dx = free_spot(r0)
        thick = rng.uniform(0.3, 1.0)
        _paint(
            tb, lambda y, x, dy=dy, dx=dx, r0=r0: np.hypot(y - dy, x - dx) < r0, (dy, dx), r0, thick
        )

    # Text-like blocks: lines of 5×7 glyphs of random bits.
    for _ in range(3):
        cell = rng.choice([1.0, 1.5, 2.0])
        n_glyphs = int(rng.integers(3, 6))
        ty, tx = free_spot(n_glyphs * 6 * cell / 2)
        bits = rng.random((n_glyphs, 7, 5)) < 0.45
        y0, x0 = ty - 3.5 * cell, tx - n_glyphs * 3 * cell

        def text(y, x, y0=y0, x0=x0, cell=cell, bits=bits, n_glyphs=n_glyphs):
            row = np.floor((y - y0) / cell).astype(np.int64)
            colf = (x - x0) / cell
            glyph = np.floor(colf / 6).astype(np.int64)
            col = np.floor(colf - 6 * glyph).astype(np.int64)
            ok = (row >= 0) & (row < 7) & (glyph >= 0) & (glyph < n_glyphs) & (col < 5)
            out = np.zeros(np.broadcast(row, col).shape, dtype=bool)
            rr, cc, gg = np.broadcast_arrays(row, col, glyph)
            out[ok] = bits[gg[ok], rr[ok], cc[ok]]
            return out

        _paint(ta, text, (ty, tx), n_glyphs * 3 * cell + 4 * cell, 0.6)

    smooth = _smooth_film(shape, rng)  # the background phase

    ta = np.clip(ta, 0, 1)
    tb = np.clip(tb, 0, 1)
    phase = 1.2 * ta + 0.6 * tb + 0.15 * smooth
    absorption = 0.29 * ta + 0.05 * tb
    if strength != 1.0:
        phase, absorption = strength * phase, strength * absorption
    return np.exp(-absorption + 1j * phase).astype(np.complex64)


def _smooth_film(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Low-pass filtered noise in [0, 1]: a thin, uneven support film."""
    noise = rng.standard_normal(shape)
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.fftfreq(shape[1])[None, :]
    smooth = np.real(np.fft.ifft2(np.fft.fft2(noise) * np.exp(-((ky**2 + kx**2) / 0.012**2))))
    return (smooth - smooth.min()) / max(np.ptp(smooth), 1e-12)


def make_wiring_layer(shape: tuple[int, int], rng: np.random.Generator,
                      centre: tuple[float, float], radius: float) -> np.ndarray:
    """A layer of chip wiring (|O| ≥ 0.86, phase ≤ ~1 rad): Manhattan wires 1–4 px wide on a
    few routing tracks, square vias, over a smooth film — an integrated circuit's metal
    layer. Features within ``radius`` px of ``centre``."""
    t = np.zeros(shape, np.float32)
    cy, cx = centre
    area = math.pi * radius**2
    for _ in range(max(6, round(area / 450))):
        width = float(rng.choice([1.0, 1.5, 2.0, 3.0, 4.0]))
        length = rng.uniform(0.2, 0.9) * radius
        r = radius * math.sqrt(rng.uniform(0.0, 1.0))
        a = rng.uniform(0, 2 * math.pi)
        y0, x0 = cy + r * math.sin(a), cx + r * math.cos(a)
        horizontal = rng.random() < 0.5
        hy, hx = (width / 2, length / 2) if horizontal else (length / 2, width / 2)

        def wire(y, x, y0=y0, x0=x0, hy=hy, hx=hx):
            return (np.abs(y - y0) < hy) & (np.abs(x - x0) < hx)

        _paint(t, wire, (y0, x0), max(hy, hx))
    for _ in range(max(4, round(area / 500))):
        side = float(rng.choice([2.0, 3.0]))
        r = radius * math.sqrt(rng.uniform(0.0, 1.0))
        a = rng.uniform(0, 2 * math.pi)
        y0, x0 = cy + r * math.sin(a), cx + r * math.cos(a)

        def via(y, x, y0=y0, x0=x0, h=side / 2):
            return (np.abs(y - y0) < h) & (np.abs(x - x0) < h)

        _paint(t, via, (y0, x0), side / 2, 0.6)
    t = np.clip(t, 0, 1)
    phase = 0.7 * t + 0.12 * _smooth_film(shape, rng)
    return np.exp(-0.12 * t + 1j * phase).astype(np.complex64)


def make_particle_layer(shape: tuple[int, int], rng: np.random.Generator,
                        centre: tuple[float, float], radius: float) -> np.ndarray:
    """A layer of particles (|O| ≥ 0.85, phase ≤ ~1 rad): overlapping ellipses from 1.5 px
    to a tenth of the field, and specks of a denser material, over a smooth film — catalyst
    or battery particles, or cells. Features within ``radius`` px of ``centre``."""
    t = np.zeros(shape, np.float32)
    cy, cx = centre
    area = math.pi * radius**2
    for _ in range(max(8, round(area / 250))):
        a_ax = rng.uniform(1.5, 0.1 * radius + 2)
        b_ax = a_ax * rng.uniform(0.4, 1.0)
        th = rng.uniform(0, math.pi)
        r = radius * math.sqrt(rng.uniform(0.0, 1.0))
        a = rng.uniform(0, 2 * math.pi)
        y0, x0 = cy + r * math.sin(a), cx + r * math.cos(a)
        density = rng.uniform(0.5, 1.0)

        def ellipse(y, x, y0=y0, x0=x0, a_ax=a_ax, b_ax=b_ax, c=math.cos(th), s=math.sin(th)):
            u, v = (x - x0) * c + (y - y0) * s, (y - y0) * c - (x - x0) * s
            return (u / a_ax) ** 2 + (v / b_ax) ** 2 < 1

        _paint(t, ellipse, (y0, x0), a_ax, density)
    specks = np.zeros(shape, np.float32)
    for _ in range(max(8, round(area / 40))):
        r0 = rng.uniform(0.6, 1.5)
        r = radius * math.sqrt(rng.uniform(0.0, 1.0))
        a = rng.uniform(0, 2 * math.pi)
        y0, x0 = cy + r * math.sin(a), cx + r * math.cos(a)
        _paint(specks, lambda y, x, y0=y0, x0=x0, r0=r0: np.hypot(y - y0, x - x0) < r0,
               (y0, x0), r0)
    t, specks = np.clip(t, 0, 1), np.clip(specks, 0, 1)
    phase = 0.7 * t + 0.3 * specks + 0.1 * _smooth_film(shape, rng)
    return np.exp(-(0.08 * t + 0.1 * specks) + 1j * phase).astype(np.complex64)


def make_layers(shape: tuple[int, int], slices: int, rng: np.random.Generator,
                seed: int, centre: tuple[float, float], radius: float) -> np.ndarray:
    """S distinct layers (S, H, W) of a thick sample: the resolution sample of
    :func:`make_object` at half strength first, then wiring and particle layers in turn, each
    from a random stream of its own (``seed``)."""
    layers = [make_object(shape, rng, centre, radius, strength=0.5)]
    streams = np.random.SeedSequence(seed).spawn(4 + slices)[4:]
    for s in range(1, slices):
        make = make_wiring_layer if s % 2 == 1 else make_particle_layer
        layers.append(make(shape, np.random.default_rng(streams[s]), centre, radius))
    return np.stack(layers)
