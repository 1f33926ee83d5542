"""The Globus Compute function the flows call: reconstruct one scan on a GPU node.

The body is self-contained (every import is inside it): globus-compute serialises the
function, and the endpoint runs it without this module. It needs beamflow installed on the
endpoint (the same version: the registered checksum includes it).

Flow kwargs (``flows/ptycho_reconstruct.json``, task kwargs)::

    reconstruct(scan_path=..., output_dir=..., allowed_roots=[...], parameters={...},
                checkpoint_dir=..., node_local_dir=None, run_name=...)

``scan_path`` is the scan's file (master or ``.cxi``) as the compute nodes see it, the flow
input's ``compute.scan_path``.

Every path must resolve (symlinks followed, ``..`` collapsed) inside one of
``allowed_roots``; anything else is refused before a byte is read. The GPU is the one the
endpoint pinned for this worker (``CUDA_VISIBLE_DEVICES``, which the endpoint's
``available_accelerators`` sets, on the endpoint and in the local backend's engine alike); the
function never widens it.
Errors raise ``ValueError`` (bad input: nothing to retry), ``RuntimeError`` (the
reconstruction failed) or ``OSError`` (a full disk on the cluster, with its number), all
built-ins so they deserialise anywhere, with the scan or the disk and the cause in the
message.
"""

from typing import Any


def reconstruct(
    *,
    scan_path: str,
    output_dir: str,
    allowed_roots: list[str],
    parameters: dict[str, Any] | None = None,
    checkpoint_dir: str | None = None,
    node_local_dir: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Reconstruct the scan at ``scan_path`` into ``output_dir`` (product.h5, previews/);
    return a summary.

    The steps (check the request, confine its paths, pick the device, build the job, run
    it, report) are beamflow.job.task's: this body only reaches them on the endpoint.
    """
    try:
        from beamflow.job.task import run_task
    except ImportError as exc:
        raise RuntimeError(
            f"scan {scan_path!r}: beamflow.job is not importable on this endpoint ({exc}); "
            "install beamflow (same version as the registered function) in its environment"
        ) from None
    return run_task(scan_path=scan_path, output_dir=output_dir, allowed_roots=allowed_roots,
                    parameters=parameters, checkpoint_dir=checkpoint_dir,
                    node_local_dir=node_local_dir, run_name=run_name)
