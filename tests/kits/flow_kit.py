"""A local workspace holding one scan (``beamline/detector/s1``), for the tests of the flows'
definitions and of the inputs beamflow builds for them."""

from __future__ import annotations

from pathlib import Path

from beamflow.config import Settings, load_config
from beamflow.workspace_toml import local_workspace_toml

FUNCTION_ID = "44444444-4444-4444-8444-444444444444"


def scan_workspace(directory: Path, extra_toml: str = "", *, master: bytes = b"") -> Settings:
    """``directory`` as a local workspace (``beamflow init``'s file plus ``extra_toml``) with
    the scan ``s1`` (its master file holding ``master``); its settings."""
    for sub in ("beamline/detector/s1", "beamline/previews", "hpc", "state"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    (directory / "beamline/detector/s1/s1_master.h5").write_bytes(master)
    config = directory / "beamflow.toml"
    config.write_text(local_workspace_toml() + extra_toml)
    return load_config(config)
