"""Images for the status page's tests: a tiny real PNG, and previews drawn as the
reconstruction draws them."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

# The page as a client on loopback sees it, and the token a remote client must bring.
LOOPBACK = "http://127.0.0.1:8765"
TOKEN = "s3cret-token-for-tests-0123456789"


def write_png(path: Path, width: int = 8, height: int = 6, shade: int = 128) -> Path:
    """A real (tiny, grey) PNG, so browsers and content sniffers see an image."""
    raw = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return path


def draw_previews(directory: Path, seed: int, iterations: int = 100) -> list[Path]:
    """Previews like the reconstruction writes: phase, amplitude, probe, convergence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(seed)
    n = 160
    y, x = np.mgrid[-1 : 1 : n * 1j, -1 : 1 : n * 1j]
    r, theta = np.hypot(x, y), np.arctan2(y, x)
    spokes = 18 + 4 * seed
    star = (np.sin(spokes * theta) > 0) & (r < 0.82)
    phase = 1.4 * star + 0.15 * rng.standard_normal((n, n)) * (r < 0.95)
    amplitude = 1.0 - 0.35 * star + 0.05 * rng.standard_normal((n, n))
    directory.mkdir(parents=True, exist_ok=True)
    out = [directory / "object_phase.png", directory / "object_amplitude.png"]
    plt.imsave(out[0], phase, cmap="bone")
    plt.imsave(out[1], amplitude, cmap="gray")
    py, px = np.mgrid[-1 : 1 : 64j, -1 : 1 : 64j]
    probe = np.exp(-(px**2 + py**2) / 0.18) * (1 + 0.3 * np.cos(9 * np.hypot(px, py)))
    out.append(directory / "probe.png")
    plt.imsave(out[2], probe, cmap="magma")
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100)
    its = np.arange(1, iterations + 1)
    ax.semilogy(its, 1e3 * its ** -1.2 * (1 + 0.05 * rng.standard_normal(its.size)), lw=1.8)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.append(directory / "convergence.png")
    fig.savefig(out[3])
    plt.close(fig)
    return out
