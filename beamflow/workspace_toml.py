"""The beamflow.toml of a new workspace (`beamflow init`, the demo): a complete, working
configuration for the local backend, and the Globus one with every id to fill in, each
commented for the person who edits it. The values shown are the configuration model's
defaults (:mod:`beamflow.config`), the one source of each."""

from __future__ import annotations

import textwrap
import uuid
from typing import Any

from beamflow.config import ENGINE_SETTINGS, Reconstruction


def _reconstruction_toml(**overrides: Any) -> str:
    """The [reconstruction] section of a new workspace: the model's defaults (the one source
    of each default), with ``overrides``."""
    r = Reconstruction(**overrides)
    shown = ("algorithm", "iterations", "probe_modes")
    others = textwrap.fill(", ".join(n for n in ENGINE_SETTINGS if n not in shown), 88,
                           initial_indent="#   ", subsequent_indent="#   ")
    return f"""[reconstruction]
algorithm = "{r.algorithm}"                     # auto | rpie | mpie | epie | dm | lsqml
iterations = {r.iterations}
{_probe_modes_line(r.probe_modes)}
device = "{r.device}"                        # auto | cpu | cuda
checkpoint_every = {r.checkpoint_every}
preview_every = {r.preview_every}
# The engine's other settings, by the same names as the options of `beamflow reconstruct`
# (docs/reconstruction.md#parameters):
{others}
"""


def _probe_modes_line(modes: int | None) -> str:
    """TOML has no null: the default (None) is a commented line that says what it means."""
    if modes is None:
        return "# probe_modes = 1                   # unset: 1, or 2 for a near-field scan"
    return f"probe_modes = {modes}"


def local_workspace_toml(
    *,
    iterations: int | None = None,
    quiet_seconds: float = 2.0,
    progressive: tuple[float, ...] = (),
    max_concurrent_runs: int = 2,
) -> str:
    """A complete, working local-backend configuration for `beamflow init` (and the demo,
    which tunes a few values)."""
    recon = {} if iterations is None else {"iterations": iterations}
    beamline_id, hpc_id, endpoint_id = (str(uuid.uuid4()) for _ in range(3))
    return f"""\
# beamflow workspace: the embedded local backend (one machine, no network).
# Relative paths are relative to this file. Environment variables BEAMFLOW_* override
# (nested keys with "__", e.g. BEAMFLOW_STATUS__PORT=9000).
backend = "local"
state_dir = "state"          # run store, registered ids, logs

[beamline]
collection_id = "{beamline_id}"
collection_root = "beamline"           # the collection's "/" on this machine
detector_dir = "beamline/detector"     # the edge agent watches this directory
preview_dir = "beamline/previews"      # previews and products come back here

[hpc]
collection_id = "{hpc_id}"
collection_root = "hpc"
scratch_dir = "hpc"                    # the compute function reads and writes only here
# node_local_dir = "/tmp/beamflow-l1"  # fast L1 checkpoints (optional)

[compute]
endpoint_id = "{endpoint_id}"
workers = 1                            # reconstructions at once (one per GPU on a GPU node)
# engine_config = "engine.yaml"        # an endpoint engine config (YAML with engine:) instead

{_reconstruction_toml(**recon)}
[agent]
quiet_seconds = {quiet_seconds}                    # files unchanged this long before reading
stall_timeout = 120.0                  # short of frames this long: processed as aborted
rescan_seconds = 30.0
observer = "auto"                      # auto | inotify | polling (network filesystems)
max_concurrent_runs = {max_concurrent_runs}
max_retries = 3
progressive = {list(progressive)}                       # e.g. [0.25, 0.5]: also at these fractions

[status]
host = "127.0.0.1"                     # loopback only; set a token before exposing it
port = 8765
# Off loopback every page, preview, API call and download needs the token;
# public_viewing = true lets anyone who reaches the page view (actions still need it).
# public_viewing = false

[retention]                            # days files stay once their scan is untouched
raw_days = 7                           # hpc/<scan>/raw/: the copies of the raw frames
checkpoint_days = 14                   # hpc/<scan>/checkpoints/
preview_days = "never"                 # beamline/previews/<run>/previews/ (products stay)
"""


def globus_workspace_toml() -> str:
    """A commented template for a facility deployment on Globus."""
    return f"""\
# beamflow on Globus. Fill in every id marked FILL, then:
#   beamflow login && beamflow register functions && beamflow register flows && beamflow doctor
# See docs/deployment.md.
backend = "globus"
state_dir = "state"

[globus]
client_id = "FILL: Globus Auth app client id (app registered at app.globus.org)"
# client_secret: never in this file for shared machines; use BEAMFLOW_GLOBUS__CLIENT_SECRET
# for the unattended agent (a confidential client / service account).
# agent_client_id = "..."              # the agent's confidential client: starts the flows
# staff_group = "..."                  # Globus group of beamline staff: start the flows,
#                                      # see and cancel every run (docs/deployment.md §6)
# data_access_collections = []        # mapped collections needing data_access consent;
#                                      # default both collection ids, [] for guest collections

[beamline]
collection_id = "FILL: UUID of the beamline's Globus collection"
collection_root = "/"                  # the local path that the collection's "/" maps to
detector_dir = "/data/detector"        # local path the edge agent watches
preview_dir = "/data/previews"         # local path previews come back to

[hpc]
collection_id = "FILL: UUID of the cluster's Globus collection"
collection_root = "/"                  # path of the collection's "/" as the compute nodes see it
scratch_dir = "/lus/project/beamflow"  # the compute function reads and writes only here
# node_local_dir = "/local/scratch"    # fast L1 checkpoints on the GPU node

[compute]
endpoint_id = "FILL: UUID of the Globus Compute endpoint (see deploy/)"

{_reconstruction_toml(device="cuda")}
[agent]
quiet_seconds = 5.0
stall_timeout = 300.0
rescan_seconds = 60.0
observer = "polling"                   # detector file systems are often NFS/GPFS
max_concurrent_runs = 8
max_retries = 3
poll_seconds = 15.0                    # each poll is a Flows API call: keep it gentle
progressive = [0.25, 0.5]

[status]
host = "127.0.0.1"
port = 8765
# token: set BEAMFLOW_STATUS__TOKEN before using --host 0.0.0.0; off loopback, viewing
# needs it too unless public_viewing = true (unpublished data: think twice)

[cluster]
# `beamflow render-endpoint deploy/compute-endpoint/<kind> DIR` writes the endpoint's files
# from these (docs/deployment.md §4):
# service_account = "beamflow"                 # the agent's client runs as this account
# people_domain = "facility.org"               # <user>@facility.org runs as <user>
# worker_env = "/soft/beamflow-env-0.1.0"      # the environment the workers activate
# modules = ["cuda/12.2"]                      # module load (a failed one fails the job)
# endpoint_dir = "/srv/beamflow/endpoint"      # where render-endpoint wrote: doctor reads it
# [cluster.preview]                    # batch jobs of progressive runs (Slurm: partition, qos;
# partition = "debug"                  # PBS Pro: queue; both: account, walltime)
# walltime = "00:20:00"
# [cluster.final]                      # batch jobs of whole-scan runs
# walltime = "08:00:00"

[retention]                            # days files stay once their scan is untouched
raw_days = 7                           # cluster copies of raw frames
checkpoint_days = 14                   # checkpoints (a later run starts from iteration 0)
preview_days = "never"                 # beamline previews (products always stay)
"""
