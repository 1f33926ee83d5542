"""Run Pty-Chi (APS's ptychography engine) on a beamflow benchmark data set — peer venv only.

This script runs in Pty-Chi's own virtual environment (``benchmarks/.peers/venv``, built by
``bench_ptychi.py``), never in the project's: it imports torch and ptychi and nothing of
beamflow. Usage::

    benchmarks/.peers/venv/bin/python benchmarks/ptychi_runner.py DATA.npz OUT_PREFIX \\
        --algorithms rpie lsqml --iterations 100 --batch 32

``DATA.npz`` (written by ``bench_ptychi.py``) holds ``intensities`` (N, M, M) float32 in
detector view (zero frequency in the centre), ``mask`` (M, M) bool (True = valid),
``corners_px`` (N, 2) float64 top-left corners (y, x) of each probe window in the object array,
``object_shape`` (2,), ``probe`` (K, M, M) complex64 (the shared initial guess, already
scaled to the counts), ``wavelength_m`` and ``pixel_size_m``; for a thick sample also
``slice_spacings_m`` (S−1,): the object is then S layers, reconstructed by Pty-Chi's
multislice model (``object_options.slice_spacings_m``, the object guess ones in every layer;
``--multislice-regularization W``: its depth regulariser with weight W).

Writes ``OUT_PREFIX.json`` (one record per algorithm: seconds per epoch, losses, settings)
and ``OUT_PREFIX.npz`` (``object_<alg>``: (H, W), or (S, H, W) for a thick sample;
``probe_<alg>``).

Conventions mapped onto Pty-Chi's (ptychi 2.2.0):

* Positions: Pty-Chi takes patch *centres* in object pixels; a window whose top-left corner
  is ``c`` has its centre at ``c + (M − 1)/2`` (``image_proc.extract_patches_fourier_shift``).
  The position origin is ``SPECIFIED`` at ``[0, 0]`` so object pixel indices are identical in
  both engines and the reconstructions can be compared without registration bias.
* Intensities are DC-centred, so ``data_options.fft_shift = True``.
* torchvision: Pty-Chi imports ``torchvision.transforms.GaussianBlur`` at module level, and the
  PyPI torchvision wheel fails to import beside CPU torch. Nothing used here calls it, so a
  small stand-in module is registered in ``sys.modules`` before ptychi is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
import warnings
from statistics import median


def _install_torchvision_stand_in() -> None:
    import torch

    class GaussianBlur(torch.nn.Module):  # the only torchvision name Pty-Chi uses
        def __init__(self, kernel_size, sigma=(0.1, 2.0)):
            super().__init__()
            self.kernel_size = kernel_size
            self.sigma = sigma

        def forward(self, img):  # pragma: no cover - never called in these runs
            raise NotImplementedError("torchvision stand-in: GaussianBlur is not available")

    tv = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    transforms.GaussianBlur = GaussianBlur
    tv.transforms = transforms
    tv.__version__ = "0.0+stand-in"
    sys.modules.setdefault("torchvision", tv)
    sys.modules.setdefault("torchvision.transforms", transforms)


def block_sizes(n: int, blocks: int) -> list[int]:
    """Split ``n`` iterations into ``blocks`` nearly equal, non-empty blocks."""
    blocks = max(1, min(blocks, n))
    return [n // blocks + (1 if i < n % blocks else 0) for i in range(blocks)] if n > 0 else []


def _options(api, alg: str, d: dict, args) -> tuple[object, dict]:
    """Pty-Chi options for ``alg`` and the task data (passed to ``PtychographyTask``)."""
    import numpy as np
    import torch

    m = d["intensities"].shape[-1]
    centres = d["corners_px"] + (m - 1) / 2.0
    if alg in ("rpie", "epie"):
        options = api.RPIEOptions() if alg == "rpie" else api.EPIEOptions()
        # Maiden et al. 2017, Table 1: alpha regularises the rPIE denominator; step_size is γ.
        options.object_options.alpha = args.alpha
        options.probe_options.alpha = args.beta
        options.object_options.step_size = args.step
        options.probe_options.step_size = args.step
    elif alg == "lsqml":
        options = api.LSQMLOptions()
        options.reconstructor_options.noise_model = api.NoiseModels.GAUSSIAN
        options.object_options.step_size = 1.0
        options.probe_options.step_size = 1.0
    else:
        raise SystemExit(f"unknown algorithm {alg!r} (rpie, epie or lsqml)")

    options.data_options.fft_shift = True
    options.data_options.wavelength_m = float(d["wavelength_m"])

    h, w = (int(v) for v in d["object_shape"])
    options.object_options.pixel_size_m = float(d["pixel_size_m"])
    options.object_options.optimizable = True
    options.object_options.optimizer = api.Optimizers.SGD
    options.object_options.determine_position_origin_coords_by = (
        api.ObjectPosOriginCoordsMethods.SPECIFIED
    )
    options.object_options.position_origin_coords = np.array([0.0, 0.0])
    layers = 1
    if "slice_spacings_m" in d and len(d["slice_spacings_m"]):
        layers = len(d["slice_spacings_m"]) + 1
        options.object_options.slice_spacings_m = np.asarray(d["slice_spacings_m"], float)
        if args.multislice_regularization > 0:
            reg = options.object_options.multislice_regularization
            reg.enabled = True
            reg.weight = args.multislice_regularization

    options.probe_options.optimizable = True
    options.probe_options.optimizer = api.Optimizers.SGD
    options.probe_position_options.optimizable = False

    options.reconstructor_options.batch_size = args.batch
    options.reconstructor_options.num_epochs = args.iterations
    options.reconstructor_options.default_device = (
        api.Devices.GPU if args.device == "cuda" else api.Devices.CPU)
    options.reconstructor_options.random_seed = args.seed
    task_data = {
        "diffraction_data": d["intensities"],
        "valid_pixel_mask": d["mask"],
        "object_data": torch.ones((layers, h, w), dtype=torch.complex64),
        "probe_data": d["probe"].astype(np.complex64)[None],  # [n_opr, n_modes, M, M]
        "probe_position_y_px": centres[:, 0],
        "probe_position_x_px": centres[:, 1],
    }
    return options, task_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data")
    parser.add_argument("out_prefix")
    parser.add_argument("--algorithms", nargs="+", default=["rpie", "lsqml"])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=0.1, help="rPIE object alpha")
    parser.add_argument("--beta", type=float, default=0.1, help="rPIE probe alpha")
    parser.add_argument("--step", type=float, default=1.0, help="PIE step size (gamma)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=4, help="timed blocks after warm-up")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="Pty-Chi's device (bench_gpu.py runs it beside beamflow's)")
    parser.add_argument("--multislice-regularization", type=float, default=0.0,
                        help="thick samples: weight of Pty-Chi's depth regulariser (0: off)")
    args = parser.parse_args()

    t_import = time.perf_counter()
    _install_torchvision_stand_in()
    import logging

    import numpy as np
    import ptychi
    import ptychi.api as api
    import torch
    from ptychi.api.task import PtychographyTask

    logging.getLogger("ptychi").setLevel(logging.WARNING)
    # Pty-Chi's own internals warn (e.g. a tensor-to-scalar conversion); keep stderr readable.
    warnings.filterwarnings("ignore", category=UserWarning)
    t_import = time.perf_counter() - t_import

    with np.load(args.data) as f:
        d = {k: f[k] for k in f.files}
    records = []
    arrays: dict[str, np.ndarray] = {}
    for alg in args.algorithms:
        options, task_data = _options(api, alg, d, args)
        t0 = time.perf_counter()
        task = PtychographyTask(options, **task_data)
        setup_s = time.perf_counter() - t0
        # Timing: one warm-up epoch, then the other epochs in a few long run() calls
        # ("blocks"). Each run() call has a fixed overhead of its own (~0.25 s measured at
        # 60 positions), which timing one epoch per call would charge to every epoch; with
        # blocks of ~25 epochs it is ~1 %. The block means give a median and a minimum per
        # epoch; the minimum is the least disturbed by other work on a shared machine.
        def sync() -> None:  # queued GPU work belongs to the epochs that queued it
            if args.device == "cuda":
                torch.cuda.synchronize()

        t = time.perf_counter()
        task.run(1)
        sync()
        first_s = time.perf_counter() - t
        block_s, block_cpu = [], []
        for n in block_sizes(args.iterations - 1, args.blocks):
            t, c = time.perf_counter(), time.process_time()
            task.run(n)
            sync()
            block_s.append((time.perf_counter() - t) / n)
            block_cpu.append((time.process_time() - c) / n)
        losses: list[float] = []
        try:  # the loss tracker's table: one row per epoch
            table = task.reconstructor.loss_tracker.table
            losses = [float(v) for v in table["loss"].to_numpy()]
        except Exception:  # noqa: BLE001 - informative only; layout differs between versions
            losses = []
        obj = task.get_data_to_cpu("object", as_numpy=True)
        arrays[f"object_{alg}"] = obj if obj.shape[0] > 1 else obj[0]
        arrays[f"probe_{alg}"] = task.get_data_to_cpu("probe", as_numpy=True)[0]
        records.append(
            {
                "engine": "ptychi",
                "version": ptychi.__version__ if hasattr(ptychi, "__version__") else "2.2.0",
                "torch": torch.__version__,
                "torch_threads": torch.get_num_threads(),
                "algorithm": alg,
                "iterations": args.iterations,
                "batch_size": args.batch,
                "seconds_per_iteration": median(block_s) if block_s else first_s,
                "min_seconds_per_iteration": min(block_s) if block_s else first_s,
                "cpu_seconds_per_iteration": median(block_cpu) if block_cpu else None,
                "block_seconds_per_iteration": block_s,
                "first_iteration_seconds": first_s,
                "setup_seconds": setup_s,
                "import_seconds": t_import,
                "losses": losses,
                "settings": {
                    "alpha": args.alpha,
                    "beta": args.beta,
                    "step": args.step,
                }
                if alg != "lsqml"
                else {"noise_model": "gaussian"},
                "slices": int(obj.shape[0]),
                "multislice_regularization": args.multislice_regularization,
            }
        )
        del task
    np.savez(args.out_prefix + ".npz", **arrays)
    with open(args.out_prefix + ".json", "w") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main()
