"""The GPU's own: the fused CUDA kernels (:mod:`.kernels`, their sources in ``cuda/*.cu``) and
the CUDA graphs a batch's launches are replayed as (:mod:`.graphs`). Neither imports CuPy:
the array backend (:mod:`beamflow.ptycho.arrays`) hands it to them."""
