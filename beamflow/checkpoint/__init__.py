"""Asynchronous, multi-level, crash-proof checkpointing of named arrays + JSON metadata.

Knows nothing of ptychography (or of cupy: device arrays reach host memory through the
`to_host` callable the caller supplies).

    policy = CheckpointPolicy(l1=LevelConfig(dir=local, every_iterations=1, keep=2),
                              l2=LevelConfig(dir=shared, every_iterations=20, keep=3))
    with Checkpointer(policy, fingerprint=fp, to_host=cupy.asnumpy) as ck:
        for it in range(start, n):
            step()
            ck.maybe_save(it + 1, lambda: {"object": obj, "probe": probe}, {"loss": loss})
        ck.finalize(n, lambda: {...})
    latest = load_latest([local, shared])   # newest verified, or None
    check_compatible(latest.fingerprint, fp, prefix_digest=digest_of_first_n)
"""

from beamflow.checkpoint.compat import (
    Compatibility,
    Difference,
    IncompatibleCheckpoint,
    check_compatible,
)
from beamflow.checkpoint.policy import CheckpointPolicy, LevelConfig
from beamflow.checkpoint.signals import TerminationGuard, install_sigterm_flush
from beamflow.checkpoint.store import (
    COMMIT_STEPS,
    LATEST_NAME,
    SCHEMA_VERSION,
    Checkpoint,
    CorruptCheckpoint,
    LatestRecord,
    apply_retention,
    checkpoint_name,
    clean_stale_temps,
    clear_checkpoints,
    list_checkpoints,
    load_latest,
    read_checkpoint,
    read_latest_record,
)
from beamflow.checkpoint.writer import Checkpointer, CheckpointError, CheckpointStats

__all__ = [
    "COMMIT_STEPS",
    "LATEST_NAME",
    "SCHEMA_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointPolicy",
    "CheckpointStats",
    "Checkpointer",
    "Compatibility",
    "CorruptCheckpoint",
    "Difference",
    "IncompatibleCheckpoint",
    "LatestRecord",
    "LevelConfig",
    "TerminationGuard",
    "apply_retention",
    "check_compatible",
    "checkpoint_name",
    "clean_stale_temps",
    "clear_checkpoints",
    "install_sigterm_flush",
    "list_checkpoints",
    "load_latest",
    "read_checkpoint",
    "read_latest_record",
]
