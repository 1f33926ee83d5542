"""The Globus Compute function of the retention flow (``flows/retention_cleanup.json``):
delete the cluster copies of raw frames and the checkpoints of scans untouched for
``[retention]``'s days, never a product, a scan with a run in flight or anything outside the
roots (the rules: :mod:`beamflow.cleanup_task`).

The body is self-contained (every import is inside it), as the endpoint runs it from its
source text; it needs beamflow installed on the endpoint, as ``reconstruct`` does.

Flow kwargs::

    cleanup(roots=[...], raw_days=7, checkpoint_days=14, keep=[...], dry_run=False)
"""

from typing import Any


def cleanup(
    *,
    roots: list[str],
    raw_days: float | None = None,
    checkpoint_days: float | None = None,
    keep: list[str] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Delete (``dry_run``: list) what is due; return what, with sizes, and what was skipped."""
    try:
        from beamflow.cleanup_task import clean
    except ImportError as exc:
        raise RuntimeError(
            f"beamflow is not importable on this endpoint ({exc}); install beamflow (same "
            "version as the registered function) in its environment"
        ) from None
    return clean(roots, raw_days, checkpoint_days, keep=keep, dry_run=dry_run)
