"""The fused GPU kernels' CUDA source, checked without a GPU.

:mod:`beamflow.ptycho.gpu.kernels` holds raw CUDA C for the heaviest steps of a sweep. A card is
lent to few sessions, so the source is checked here on every machine:

* run on the CPU: the kernel compiled as C++ by the machine's compiler beside a small
  prelude that stands in for CUDA's built-ins (``blockIdx``/``threadIdx``, ``float2``,
  ``atomicAdd``), every thread of the grid run in turn, and its result compared with the
  engine's array code (the kernel's specification) on the same inputs — the index
  arithmetic, the strides and the sums are the kernel's own;
* compiled by NVRTC, CUDA's own compiler: the ``nvidia-cuda-nvrtc-cu12`` wheel of the
  ``[dev]`` extra (or a CUDA install), and for the element-wise kernels CuPy's headers (the
  Makefile puts them beside the venv, not importable). On Linux, where the wheel exists, a
  missing NVRTC fails these tests rather than skipping them: a kernel that does not compile
  must fail CI on a machine without a card.

On a card, ``tests/ptycho/gpu/test_ptycho_engine_gpu.py`` runs the kernels themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamflow.ptycho.gpu.kernels import (
    APPLY_STEP_SOURCE,
    EXIT_WAVE_SOURCE,
    INTENSITY_SUM_SOURCE,
    MAX_GRID_Y,
    OBJECT_TERMS_SOURCE,
    POSITION_SUM_SOURCE,
    RAMP_PRODUCT_SOURCE,
    STEP_LENGTHS_SOURCE,
    STEP_SYSTEMS_SOURCE,
    SUM_POSITIONS,
    THREADS,
    modulus_source,
    position_grid,
    system_grid,
)

PRELUDE = r"""
#define BEAMFLOW_ONE_THREAD
#include <cstdint>
#include <cmath>
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct uint3 { unsigned x, y, z; };
static uint3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float atomicAdd(float* a, float v) { float o = *a; *a += v; return o; }
static inline double atomicAdd(double* a, double v) { double o = *a; *a += v; return o; }
"""

# Run every thread of a 1-D grid (or of a 2-D grid_x × grid_y one) in turn: threads of the
# kernel share nothing but atomics, so any order is one a GPU may take.
def _driver(kernel: str, params: str) -> str:
    """C that runs the kernel ``beamflow_<kernel>(<params>)`` as a card would, each block and
    thread in turn: ``run_<kernel>(grid_x, grid_y, block, <params>)``."""
    args = ", ".join(p.split()[-1].lstrip("*") for p in params.split(","))
    return f"""
extern "C" void run_{kernel}(int grid_x, int grid_y, int block, {params})
{{
    blockDim.x = block; gridDim.x = grid_x; gridDim.y = grid_y;
    for (int gy = 0; gy < grid_y; ++gy)
        for (int g = 0; g < grid_x; ++g)
            for (int t = 0; t < block; ++t) {{
                blockIdx.x = g; blockIdx.y = gy; threadIdx.x = t;
                beamflow_{kernel}({args});
            }}
}}
"""


OBJECT_TERMS_DRIVER = _driver("object_terms", (
    "const float2* pd, long long pd_stride, const float2* chi, const float* inten, "
    "const long long* flat, float* acc, float* most, int b, int K, int M, long long W, "
    "long long HW, int exact"))
APPLY_STEP_DRIVER = _driver("apply_step", (
    "float2* obj, float* acc, const float* top, const float* step, float c_den, "
    "float c_max, long long W, long long HW, int y0, int rows, int x0, int cols"))
POSITION_SUM_DRIVER = _driver("position_sum", (
    "const float2* e, const float2* a, float* out, int b, int K, int M, int per"))


STEP_SYSTEMS_DRIVER = _driver("step_systems", (
    "const float2* pd, long long pd_stride, const float* acc, const float* top, "
    "float alpha, const long long* flat, const float2* oj, const float2* sp, "
    "long long sp_stride, const float2* chi, double* out, int b, int K, int M, "
    "long long W, long long HW, int upd_obj, int upd_probe"))
EXIT_WAVE_DRIVER = _driver("exit_wave", (
    "const float2* obj, const long long* flat, const float2* pd, long long pd_stride, "
    "float2* oj, float2* psi, int b, int K, int M, long long W"))
RAMP_PRODUCT_DRIVER = _driver("ramp_product", (
    "const float2* e, const float2* a, long long a_stride, float2* out, int b, int K, "
    "int M, int conj"))
MODULUS_DRIVER = r"""
extern "C" void run_modulus(int counts, int grid_x, int grid_y, int block, float2* psi,
                            const void* frames, const long long* rows, const float* mask,
                            float eps, float scale, double* loss, int b, int M)
{
    blockDim.x = block; gridDim.x = grid_x; gridDim.y = grid_y;
    for (int gy = 0; gy < grid_y; ++gy)
        for (int g = 0; g < grid_x; ++g)
            for (int t = 0; t < block; ++t) {
                blockIdx.x = g; blockIdx.y = gy; threadIdx.x = t;
                if (counts)
                    beamflow_modulus_counts(psi, (const unsigned short*)frames, rows, mask,
                                            eps, scale, loss, b, M);
                else
                    beamflow_modulus_amplitudes(psi, (const float*)frames, rows, mask, eps,
                                                scale, loss, b, M);
            }
}
"""
STEP_LENGTHS_DRIVER = r"""
extern "C" void run_step_lengths(const double* t, float* out, int both, float damping)
{
    blockDim.x = 1; blockIdx.x = 0; threadIdx.x = 0;
    beamflow_step_lengths(t, out, both, damping);
}
"""
INTENSITY_SUM_DRIVER = r"""
extern "C" void run_intensity_sum(int grid_x, int grid_y, int block, const float2* a,
                                  float* out, int b, long long mm, int per)
{
    blockDim.x = block;
    for (int gy = 0; gy < grid_y; ++gy)
        for (int g = 0; g < grid_x; ++g)
            for (int t = 0; t < block; ++t) {
                blockIdx.x = g; blockIdx.y = gy; threadIdx.x = t;
                beamflow_intensity_sum(a, out, b, mm, per);
            }
}
"""
SOURCES = {"apply_step": APPLY_STEP_SOURCE, "exit_wave": EXIT_WAVE_SOURCE,
           "intensity_sum": INTENSITY_SUM_SOURCE,
           "modulus_amplitudes": modulus_source(False), "modulus_counts": modulus_source(True),
           "object_terms": OBJECT_TERMS_SOURCE, "position_sum": POSITION_SUM_SOURCE,
           "ramp_product": RAMP_PRODUCT_SOURCE, "step_lengths": STEP_LENGTHS_SOURCE,
           "step_systems": STEP_SYSTEMS_SOURCE}


@pytest.fixture(scope="module")
def cpu_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the CUDA source on the CPU")
    d = tmp_path_factory.mktemp("kernels")
    src = d / "kernels.cpp"
    src.write_text(PRELUDE + OBJECT_TERMS_SOURCE + OBJECT_TERMS_DRIVER + STEP_SYSTEMS_SOURCE
                   + STEP_SYSTEMS_DRIVER + EXIT_WAVE_SOURCE + EXIT_WAVE_DRIVER
                   + RAMP_PRODUCT_SOURCE + RAMP_PRODUCT_DRIVER + STEP_LENGTHS_SOURCE
                   + STEP_LENGTHS_DRIVER + INTENSITY_SUM_SOURCE + INTENSITY_SUM_DRIVER
                   + modulus_source(False) + modulus_source(True) + MODULUS_DRIVER
                   + APPLY_STEP_SOURCE + APPLY_STEP_DRIVER + POSITION_SUM_SOURCE
                   + POSITION_SUM_DRIVER)
    lib = d / "kernels.so"
    done = subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


def _waves(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


# The per-position kernels' grid rows: as GpuKernels launches them (a row a position), or
# fewer rows than positions and not a divisor of their number, so each thread strides over
# several positions as it does when a chunk holds more than CUDA's 65535 rows.
GRID_ROWS = {"a row a position": None, "strided": 4}


def _grid(pixels: int, b: int, rows: int | None) -> tuple[int, int]:
    """GpuKernels' grid for ``b`` positions of ``pixels``, with ``rows`` rows if given."""
    grid_x, grid_y = position_grid(pixels, b)
    if rows is not None:
        assert rows < b and b % rows != 0
        grid_y = rows
    return grid_x, grid_y


def test_per_position_grid_has_a_row_a_position_up_to_cudas_limit():
    """A chunk of more positions than CUDA's 65535 grid rows still launches: its threads
    stride over the positions past the last row (the strided cases below)."""
    assert position_grid(20 * 20, 7) == (2, 7)          # M² = 400: two blocks of 256
    assert position_grid(3 * 128 * 128, 4000) == (192, 4000)
    assert position_grid(128 * 128, 100_000) == (64, 65535)


@pytest.mark.parametrize("rows", GRID_ROWS.values(), ids=GRID_ROWS.keys())
@pytest.mark.parametrize("modes, shared, conj, in_place", [
    (1, True, False, False),   # the shifted probe: one spectrum for every position
    (3, True, False, False),   # probe modes
    (2, False, False, True),   # the probe terms: each position's own stack, in place
    (1, True, True, False),    # the near-field propagator: conj(r_j)·H
], ids=["probe", "modes", "in-place", "conjugate"])
def test_ramp_product_kernel_makes_the_cpus_ramps(cpu_kernels, modes, shared, conj, in_place,
                                                  rows):
    """The ramps the kernel makes from a position's two factors are the CPU's
    (ArrayOps.phase_ramps on the CPU), times the stack."""
    from beamflow.ptycho import array_backend

    rng = np.random.default_rng(2)
    b, m = 6, 12  # K·M² not a multiple of the block
    frac = rng.uniform(-0.5, 0.5, (b, 2))
    kfreq = np.fft.fftfreq(m)
    e = np.exp(-2j * np.pi * (frac[:, :, None] * kfreq)).astype(np.complex64)  # (b, 2, M)
    ramps = array_backend("cpu", threads=1).phase_ramps(frac, kfreq)
    assert ramps.shape == (b, m, m)
    a = _waves(rng, 1 if shared else b, modes, m, m)
    want = (np.conj(ramps) if conj else ramps)[:, None] * a
    out = a if in_place else np.full((b, modes, m, m), np.nan, np.complex64)
    cpu_kernels.run_ramp_product(
        *_grid(modes * m * m, b, rows), THREADS, _ptr(e), _ptr(a),
        ctypes.c_longlong(0 if shared else modes * m * m), _ptr(out), b, modes, m, int(conj))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", GRID_ROWS.values(), ids=GRID_ROWS.keys())
@pytest.mark.parametrize("modes, shared_probe", [(1, False), (1, True), (3, False)],
                         ids=["one-mode", "shared-probe", "modes"])
def test_exit_wave_kernel_gives_the_array_codes_patches_and_waves(cpu_kernels, modes,
                                                                 shared_probe, rows):
    rng = np.random.default_rng(5)
    b, m, h, w = 7, 20, 41, 53  # M² not a multiple of the block
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    obj, pd = _waves(rng, h, w), _waves(rng, 1 if shared_probe else b, modes, m, m)
    flat = (iy * w + ix).astype(np.int64)
    oj = np.full((b, m, m), np.nan, np.complex64)
    psi = np.full((b, modes, m, m), np.nan, np.complex64)
    cpu_kernels.run_exit_wave(
        *_grid(m * m, b, rows), THREADS, _ptr(obj), _ptr(flat), _ptr(pd),
        ctypes.c_longlong(0 if shared_probe else modes * m * m), _ptr(oj), _ptr(psi), b,
        modes, m, ctypes.c_longlong(w))
    # Core.object_patches and Core.exit_wave's product on the CPU.
    want_oj = np.stack([obj[y : y + m, x : x + m] for y, x in zip(iy, ix, strict=True)])
    np.testing.assert_array_equal(oj, want_oj)
    np.testing.assert_allclose(psi, pd * want_oj[:, None], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", GRID_ROWS.values(), ids=GRID_ROWS.keys())
@pytest.mark.parametrize("modes, shared_probe, exact", [
    (1, False, False),   # rPIE with sub-pixel shifts: one mode, each position its probe
    (1, True, False),    # no sub-pixel shifts: the (1, K, M, M) probe for every position
    (3, False, False),   # probe modes
    (2, False, True),    # DM: the shifted probes' own illumination
], ids=["one-mode", "shared-probe", "modes", "exact-illumination"])
def test_object_terms_kernel_adds_what_the_array_code_adds(cpu_kernels, modes, shared_probe,
                                                           exact, rows):
    rng = np.random.default_rng(7)
    b, m, h, w = 9, 20, 40, 47  # windows overlap; W, M² not multiples of anything
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    pd = _waves(rng, 1 if shared_probe else b, modes, m, m)
    chi = _waves(rng, b, modes, m, m)
    inten = rng.random((m, m)).astype(np.float32)
    flat = (iy * w + ix).astype(np.int64)
    acc = np.zeros(3 * h * w, np.float32)
    grid = _grid(m * m, b, rows)
    most = np.full(grid[0] * grid[1], np.nan, np.float32)
    cpu_kernels.run_object_terms(
        *grid, THREADS, _ptr(pd),
        ctypes.c_longlong(0 if shared_probe else modes * m * m), _ptr(chi), _ptr(inten),
        _ptr(flat), _ptr(acc), _ptr(most), b, modes, m, ctypes.c_longlong(w),
        ctypes.c_longlong(h * w), int(exact))
    # The engine's array code on the CPU (Core.accumulate_object without a GPU).
    terms = (np.conj(pd) * chi).sum(axis=1)
    illum = (np.square(pd.real) + np.square(pd.imag)).sum(axis=1) if exact else inten
    want_num = np.zeros((h, w), np.complex64)
    want_den = np.zeros((h, w), np.float32)
    for j in range(b):
        want_num[iy[j] : iy[j] + m, ix[j] : ix[j] + m] += np.broadcast_to(terms, (b, m, m))[j]
        want_den[iy[j] : iy[j] + m, ix[j] : ix[j] + m] += np.broadcast_to(illum, (b, m, m))[j]
    got_num = acc[: 2 * h * w].view(np.complex64).reshape(h, w)
    got_den = acc[2 * h * w :].reshape(h, w)
    assert np.abs(want_num).max() > 0 and (want_den == 0).any()  # windows leave gaps
    np.testing.assert_allclose(got_num, want_num, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_den, want_den, rtol=1e-5, atol=1e-6)
    # The largest denominator, taken on the way (a value per block of threads, each
    # written): the accumulator's own maximum, to the bit.
    assert not np.isnan(most).any() and most.max() == got_den.max()


def test_object_terms_kernel_without_a_maximum_adds_the_same(cpu_kernels):
    """``most`` null (no maximum asked for): the same sums."""
    rng = np.random.default_rng(3)
    b, m, h, w = 5, 20, 40, 47
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    pd, chi = _waves(rng, b, 1, m, m), _waves(rng, b, 1, m, m)
    inten = rng.random((m, m)).astype(np.float32)
    flat = (iy * w + ix).astype(np.int64)
    accs = {}
    grid = position_grid(m * m, b)
    for with_most in (True, False):
        accs[with_most] = acc = np.zeros(3 * h * w, np.float32)
        most = np.zeros(grid[0] * grid[1], np.float32)
        cpu_kernels.run_object_terms(
            *grid, THREADS, _ptr(pd), ctypes.c_longlong(m * m), _ptr(chi),
            _ptr(inten), _ptr(flat), _ptr(acc), _ptr(most) if with_most else None, b, 1, m,
            ctypes.c_longlong(w), ctypes.c_longlong(h * w), 0)
    np.testing.assert_array_equal(accs[True], accs[False])


def _pair(rng: np.random.Generator, h: int, w: int, reached: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An accumulator pair with a batch's sums where ``reached`` (zeros elsewhere) as one
    float32 buffer, and its largest denominator (float32)."""
    num = np.where(reached, _waves(rng, h, w), 0).astype(np.complex64)
    den = np.where(reached, rng.random((h, w)) + 0.1, 0).astype(np.float32)
    acc = np.concatenate([num.view(np.float32).ravel(), den.ravel()])
    return num, den, acc, np.array([den.max()], np.float32)


@pytest.mark.parametrize("rows", [None, 7], ids=["a row a row", "strided"])
@pytest.mark.parametrize("lsqml", [False, True], ids=["rpie", "lsqml"])
def test_apply_step_kernel_adds_the_array_codes_step_and_clears_the_pair(cpu_kernels, lsqml,
                                                                         rows):
    """rPIE's step, and LSQ-ML's direction times its step length, over a box of the object
    from the accumulator pair (the array code: Core.update_object's steps): the pair holds
    zeros after, and the object outside the box or where no window reached is untouched."""
    rng = np.random.default_rng(9)
    h, w = 41, 300  # a box row of two blocks and a part
    reached = np.zeros((h, w), bool)
    reached[5:20, 10:200] = True
    reached[15:35, 150:290] = True
    num, den, acc, top = _pair(rng, h, w, reached)
    obj = _waves(rng, h, w)
    a = np.float32(0.1)
    c_den, c_max = (1.0, a) if lsqml else (1 - a, a)
    step = np.array([0.7], np.float32)
    y0, y1, x0, x1 = 3, 38, 4, 295
    # the array code's steps, in their order (RPIE.object_step; LSQML.update's direction)
    t = den * np.float32(c_den) if not lsqml else den.copy()
    t += c_max * den.max()
    want = obj.copy()
    want[y0:y1, x0:x1] += ((step[0] if lsqml else 1) * (num * np.reciprocal(t)))[y0:y1, x0:x1]
    got = obj.copy()
    grid_y = min(y1 - y0, MAX_GRID_Y) if rows is None else rows
    cpu_kernels.run_apply_step(
        -(-(x1 - x0) // THREADS), grid_y, THREADS, _ptr(got), _ptr(acc), _ptr(top),
        _ptr(step) if lsqml else None, ctypes.c_float(c_den), ctypes.c_float(c_max),
        ctypes.c_longlong(w), ctypes.c_longlong(h * w), y0, y1 - y0, x0, x1 - x0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[~reached], obj[~reached])
    assert not acc.any()


@pytest.mark.parametrize("b", [1, SUM_POSITIONS + 3])
@pytest.mark.parametrize("ramps, modes", [(True, 1), (True, 2), (False, 1)],
                         ids=["ramps", "ramps-modes", "plain"])
def test_position_sum_kernel_sums_the_array_codes_terms(cpu_kernels, ramps, modes, b):
    """The probe terms' sum over positions (Core.probe_terms: the ramps' product, then the
    sum), added to the sums so far; a batch of more than one group of positions."""
    rng = np.random.default_rng(4)
    m = 12  # K·M² not a multiple of the block
    e = np.exp(-2j * np.pi * rng.uniform(-0.5, 0.5, (b, 2, 1)) * np.fft.fftfreq(m)).astype(
        np.complex64)
    a = _waves(rng, b, modes, m, m)
    before = _waves(rng, modes, m, m)
    r = e[:, 0, :, None] * e[:, 1, None, :]
    want = before + ((r[:, None] * a) if ramps else a).sum(axis=0)
    out = before.copy()
    cpu_kernels.run_position_sum(-(-modes * m * m // THREADS), -(-b // SUM_POSITIONS),
                                 THREADS, _ptr(e) if ramps else None, _ptr(a), _ptr(out), b,
                                 modes, m, SUM_POSITIONS)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b", [1, SUM_POSITIONS, 2 * SUM_POSITIONS + 5])
def test_intensity_sum_kernel_adds_the_array_codes_illumination(cpu_kernels, b):
    """The probe's illumination Σ_j |O_j|² (Core.probe_terms), added to the sums so far;
    a batch that is not a whole number of the kernel's groups of positions included."""
    rng = np.random.default_rng(13)
    m = 24  # M² not a multiple of the block
    oj = _waves(rng, b, m, m)
    before = rng.random((m, m)).astype(np.float32)
    out = before.copy()
    cpu_kernels.run_intensity_sum(
        (m * m + THREADS - 1) // THREADS, (b + SUM_POSITIONS - 1) // SUM_POSITIONS, THREADS,
        _ptr(oj), _ptr(out), b, ctypes.c_longlong(m * m), SUM_POSITIONS)
    ov = oj.view(np.float32).reshape(b, 2 * m * m)  # the array code's sums
    sq = np.einsum("jp,jp->p", ov, ov)
    want = before + sq[0::2].reshape(m, m) + sq[1::2].reshape(m, m)
    np.testing.assert_allclose(out, want, rtol=1e-5)


@pytest.mark.parametrize("rows", GRID_ROWS.values(), ids=GRID_ROWS.keys())
@pytest.mark.parametrize("upd_obj, upd_probe, modes, shifted, m", [
    (True, True, 1, True, 16),     # both directions, sub-pixel shifts: each position its probe
    (True, True, 2, False, 72),    # probe modes, no shifts: one probe and ΔP for all; 2 blocks
    (True, False, 1, True, 24),    # object only (the probe's updates not started)
    (False, True, 1, True, 24),    # probe only
], ids=["both", "modes-unshifted", "object-only", "probe-only"])
def test_step_systems_kernel_sums_what_the_array_code_sums(cpu_kernels, upd_obj, upd_probe,
                                                          modes, shifted, m, rows):
    """LSQ-ML's step-length systems: the kernel's rows against the engine's array code (the
    directions side by side, then lsqml._systems) on the same inputs; frames of 24² and 72²
    make a thread sum several pixels, and 72² two blocks a position."""
    from beamflow.ptycho.arrays.ops import step_system_sums

    rng = np.random.default_rng(11)
    b, h, w, alpha = 7, m + 21, m + 29, np.float32(0.1)
    iy, ix = rng.integers(0, h - m + 1, b), rng.integers(0, w - m + 1, b)
    nb = b if shifted else 1
    pd, sp = _waves(rng, nb, modes, m, m), _waves(rng, nb, modes, m, m)
    oj, chi = _waves(rng, b, m, m), _waves(rng, b, modes, m, m)
    num, den, acc, top = _pair(rng, h, w, np.ones((h, w), bool))
    flat = (iy * w + ix).astype(np.int64)
    out = np.zeros((b, 5), np.float64)
    stride = modes * m * m if shifted else 0
    grid = system_grid(m, b)
    assert grid == ((2 if m == 72 else 1), b)
    cpu_kernels.run_step_systems(
        grid[0], rows or grid[1], THREADS, _ptr(pd), ctypes.c_longlong(stride), _ptr(acc),
        _ptr(top), ctypes.c_float(alpha), _ptr(flat), _ptr(oj), _ptr(sp),
        ctypes.c_longlong(stride), _ptr(chi), _ptr(out), b, modes, m, ctypes.c_longlong(w),
        ctypes.c_longlong(h * w), int(upd_obj), int(upd_probe))
    # The array code (LSQML.update without kernels): the direction, then the systems.
    t = den + alpha * den.max()
    d_obj = num * np.reciprocal(t)
    dirs = []
    if upd_obj:
        patches = np.stack([d_obj[y : y + m, x : x + m] for y, x in zip(iy, ix, strict=True)])
        dirs.append(pd * patches[:, None])
    if upd_probe:
        dirs.append(oj[:, None] * sp)
    gram, rhs = step_system_sums(np.ascontiguousarray(np.stack(dirs, axis=1)), chi, np)
    zero = np.zeros(b, np.float32)
    if upd_obj and upd_probe:
        want = [gram[:, 0, 0], gram[:, 0, 1], gram[:, 1, 1], rhs[:, 0], rhs[:, 1]]
    elif upd_obj:
        want = [gram[:, 0, 0], zero, zero, rhs[:, 0], zero]
    else:
        want = [zero, zero, gram[:, 0, 0], zero, rhs[:, 0]]
    want = np.stack(want, axis=1).astype(np.float64)
    assert np.abs(want).min(where=want != 0, initial=np.inf) > 0
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=1e-3)


@pytest.mark.parametrize("rows", list(GRID_ROWS.values()), ids=list(GRID_ROWS))
@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streamed"])
@pytest.mark.parametrize("counts", [True, False], ids=["counts", "amplitudes"])
@pytest.mark.parametrize("m", [16, 24, 72], ids=["16", "24", "72"])
def test_modulus_kernel_projects_as_the_array_code(cpu_kernels, counts, resident, m, rows):
    """The modulus projection reads each position's frame where it lies (a row of the
    resident stack, or row j of a streamed chunk) and sums d² per position: against the
    engine's array code (Core.amplitude_residual and modulus_projection) on the same
    inputs; 24² frames make a thread take several pixels, 72² two blocks a position."""
    rng = np.random.default_rng(5)
    b, n = 7, 19
    psi = _waves(rng, b, m, m)
    stack = rng.poisson(9.0, (n, m, m)).astype(np.uint16)
    if not counts:
        stack = np.sqrt(stack.astype(np.float32))
    mask = (rng.random((m, m)) > 0.2).astype(np.float32)
    take = rng.choice(n, b, replace=False).astype(np.int64)
    frames = stack if resident else np.ascontiguousarray(stack[take])
    eps, scale = np.float32(1e-6), np.float32(1 / m**2)
    got, loss = psi.copy(), np.zeros(b, np.float64)
    grid_x, grid_y = system_grid(m, b)
    grid_y = rows or grid_y
    cpu_kernels.run_modulus(int(counts), grid_x, grid_y, THREADS, _ptr(got), _ptr(frames),
                            _ptr(take) if resident else None, _ptr(mask), ctypes.c_float(eps),
                            ctypes.c_float(scale), _ptr(loss), b, m)
    amp = np.sqrt(stack[take].astype(np.float32))if counts else stack[take]
    a = np.abs(psi)
    d = (amp - a) * mask
    np.testing.assert_allclose(got, psi * (d / (a + eps) * scale), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss, (d.astype(np.float64) ** 2).sum(axis=(1, 2)), rtol=1e-5)


@pytest.mark.parametrize("both", [True, False], ids=["both", "one"])
@pytest.mark.parametrize("tot", [
    [4.0, 1.0, 3.0, 2.0, 1.5],     # a well-posed batch
    [4.0, 1.0, 3.0, -2.0, 1.5],    # β_O < 0: clipped, never a step against the direction
    [0.0, 0.0, 3.0, 0.0, 1.5],     # no object direction (its sums zero)
], ids=["posed", "clipped", "no-object"])
def test_step_lengths_kernel_solves_as_the_array_code(cpu_kernels, both, tot):
    """LSQ-ML's step pair from the batch's summed system: the kernel against
    ArrayOps.step_lengths on the CPU (float64 solve; float32 damped steps)."""
    from beamflow.ptycho import array_backend

    t = np.array(tot, np.float64)
    out = np.empty(2, np.float32)
    cpu_kernels.run_step_lengths(_ptr(t), _ptr(out), int(both), ctypes.c_float(0.9))
    want = array_backend("cpu", threads=1).step_lengths(t, both, 0.9)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert (out >= 0).all()


def test_a_raw_kernel_refuses_to_write_a_strided_or_mistyped_array():
    """A raw kernel writes through the array's pointer: a strided view (or a copy made
    contiguous for it) would lose the writes, so the wrappers refuse such outputs."""
    from beamflow.ptycho.gpu.kernels import _written

    ok = np.zeros((4, 6), np.complex64)
    assert _written(ok, np.complex64) is ok
    with pytest.raises(ValueError, match="C-contiguous complex64"):
        _written(ok[:, ::2], np.complex64)
    with pytest.raises(ValueError, match="float32"):
        _written(ok, np.float32)


def _nvrtc() -> ctypes.CDLL:
    """libnvrtc (see :func:`_find_nvrtc`); missing, a failure on Linux, else a skip."""
    lib = _find_nvrtc()
    if lib is None:
        _missing("NVRTC not found: the [dev] extra installs it (pip install -e '.[dev]', "
                 "or `make .venv/.installed`; the wheel is nvidia-cuda-nvrtc-cu12)")
    return lib


def _missing(why: str) -> None:
    # The wheels are Linux ones: elsewhere there is nothing pip could install.
    if sys.platform.startswith("linux"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def _find_nvrtc() -> ctypes.CDLL | None:
    """libnvrtc from the nvidia-cuda-nvrtc wheel, a CUDA install, or the loader's path."""
    candidates = []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        # nvidia/cuda_nvrtc/lib (CUDA 12's wheel) or nvidia/cu13/lib (CUDA 13's)
        candidates += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in Path(path).name or ".alt." in Path(path).name:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _nvrtc_compile(lib: ctypes.CDLL, source: str, name: str, options: list[str]
                   ) -> tuple[int, str]:
    """NVRTC's status and log for ``source``."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                  0, None, None) == 0
    opts = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return status, log.value.decode(errors="replace")


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
@pytest.mark.parametrize("name", list(SOURCES))
def test_kernel_source_compiles_with_nvrtc(name, arch):
    lib = _nvrtc()
    status, log = _nvrtc_compile(lib, SOURCES[name], name, [f"--gpu-architecture={arch}"])
    assert status == 0, log


class _RecordingCupy:
    """What GpuKernels asks CuPy to build, recorded instead of compiled."""

    def __init__(self) -> None:
        self.elementwise: dict[str, tuple[str, str, str]] = {}

    def RawKernel(self, source: str, name: str) -> None:  # noqa: N802 - CuPy's name
        return None

    def ElementwiseKernel(self, in_params: str, out_params: str, operation: str,  # noqa: N802
                          name: str) -> None:
        self.elementwise[name] = (in_params, out_params, operation)


def _elementwise_kernels() -> dict[str, tuple[str, str, str]]:
    from beamflow.ptycho.gpu.kernels import GpuKernels

    cp = _RecordingCupy()
    GpuKernels(cp)
    return cp.elementwise


# CuPy's C types of the parameter types the kernels use.
_CTYPES = {"float32": "float", "complex64": "complex<float>", "uint16": "unsigned short"}


def _elementwise_source(name: str, in_params: str, out_params: str, operation: str) -> str:
    """A kernel as CuPy writes an ElementwiseKernel: each input a const value, each output a
    reference to its element, then the body (CuPy's own adds broadcasting and strides)."""
    args, binds = [], []
    for kind, params in (("in", in_params), ("out", out_params)):
        for i, param in enumerate(params.split(",")):
            dtype, var = param.split()
            ctype = _CTYPES[dtype]
            if kind == "in":
                args.append(f"const {ctype}* _in{i}")
                binds.append(f"const {ctype} {var} = _in{i}[i];")
            else:
                args.append(f"{ctype}* _out{i}")
                binds.append(f"{ctype}& {var} = _out{i}[i];")
    return ("#include <cupy/complex.cuh>\n"
            f'extern "C" __global__ void {name}({", ".join(args)}, long long n) {{\n'
            "  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            "  if (i >= n) return;\n  " + "\n  ".join(binds) + f"\n  {operation};\n}}\n")


def _cupy_include() -> Path:
    """CuPy's C++ headers: those of an importable CuPy (a GPU machine), else those the
    Makefile installs beside the venv (``.venv/cupy-headers``), where CuPy is not
    importable, so that the rest of the suite runs as on a host without a card."""
    spec = importlib.util.find_spec("cupy")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).parent
    else:
        root = Path(sys.prefix) / "cupy-headers" / "cupy"
    inc = root / "_core" / "include"
    if not (inc / "cupy" / "complex.cuh").is_file():
        _missing(f"CuPy's headers not found at {inc} (`make .venv/.installed` installs them "
                 "there: pip install --no-deps --target .venv/cupy-headers cupy-cuda12x)")
    return inc


@pytest.mark.parametrize("name", list(_elementwise_kernels()))
def test_elementwise_kernel_bodies_compile_with_cupys_headers(name):
    """The element-wise kernels' bodies against CuPy's own complex type (its headers come
    with CuPy; NVRTC as above): a card is lent to few sessions, and a body that does not
    compile would stop every reconstruction on one."""
    lib = _nvrtc()
    inc = _cupy_include()
    cccl = inc / "cupy" / "_cccl"
    options = ["--gpu-architecture=compute_90", "--std=c++17", f"-I{inc}",
               f"-I{cccl / 'libcudacxx'}", f"-I{cccl / 'thrust'}", f"-I{cccl / 'cub'}"]
    source = _elementwise_source(name, *_elementwise_kernels()[name])
    status, log = _nvrtc_compile(lib, source, name, options)
    assert status == 0, source + log
