"""A real one-node Slurm cluster on this machine, for tests: Debian's slurm-wlm and munge.

`installed()` installs the packages when they are missing (root, apt-get) and says why it
cannot otherwise. `OneNodeSlurm` writes a slurm.conf and a MUNGE key into a scratch
directory, starts munged, slurmctld and slurmd in the foreground as children of this
process (their own socket, ports, state and logs: nothing under /etc or /run is used), waits
for the node to be idle, and on `stop()` cancels every job, stops the daemons and waits for
them, job step daemons included. Everything talks over loopback.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# What the cluster needs: daemons (in sbin) and the client commands Parsl's SlurmProvider
# calls.
DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "srun", "mungekey")
PACKAGES = ("slurm-wlm", "munge")
SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin"]
)
# Process names of the daemons and of the per-job step daemon slurmd forks.
PROCESS_NAMES = {"munged", "slurmctld", "slurmd", "slurmstepd"}


def which(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def missing() -> list[str]:
    return [name for name in (*DAEMONS, *COMMANDS) if which(name) is None]


def installed() -> str | None:
    """None when Slurm and MUNGE are ready to run here, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "needs root: runs munged, slurmctld and slurmd as root (CI runs as root)"
    if not missing():
        return None
    apt = which("apt-get")
    if apt is None:
        return f"{', '.join(missing())} not installed, and no apt-get to install {PACKAGES}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        [apt, "update", "-qq"],
        [apt, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"{' '.join(command)} took over 10 minutes (no network to the Debian registry?)"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return (
                f"{' '.join(command)} failed (no network to the Debian registry?): "
                + " | ".join(tail)
            )
    if missing():
        return f"installed {PACKAGES} but {', '.join(missing())} still not found"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes() -> dict[int, str]:
    """pid -> name of every Slurm or MUNGE daemon on the machine."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name in PROCESS_NAMES:
            found[int(entry.name)] = name
    return found


class OneNodeSlurm:
    """munged + slurmctld + slurmd for this host, everything under `base`.

    `base` must be short: the MUNGE socket's path has to fit a Unix socket name (108 bytes).
    """

    def __init__(self, base: Path, partition: str = "debug") -> None:
        self.base = base
        self.partition = partition
        self.conf = base / "slurm.conf"
        self.socket = base / "munge" / "munge.socket"
        self.logs = base / "log"
        self.node = ""
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._before: set[int] = set()

    @property
    def pids(self) -> set[int]:
        """The daemons this object started (children of this process)."""
        return {proc.pid for _name, proc in self._daemons}

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this cluster (every Slurm command reads SLURM_CONF)."""
        return {"SLURM_CONF": str(self.conf)}

    # -- start ----------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        self._before = set(processes())
        for sub in ("munge", "key", "state", "spool", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        # munged refuses a key readable by others; the socket's directory must be
        # traversable by every job's user.
        (self.base / "key").chmod(0o700)
        (self.base / "munge").chmod(0o755)
        key = self.base / "key" / "munge.key"
        self._run([which("mungekey"), "--create", f"--keyfile={key}"])
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                which("munged"), "--foreground", "--force", f"--socket={self.socket}",
                f"--key-file={key}", f"--log-file={self.logs / 'munged.log'}",
                f"--pid-file={self.base / 'munge' / 'munged.pid'}",
                f"--seed-file={self.base / 'key' / 'munged.seed'}",
            ],
        )  # fmt: skip
        self._wait(lambda: self.socket.exists(), timeout, "munged's socket")
        self.conf.write_text(self._slurm_conf())
        self._spawn("slurmctld", [which("slurmctld"), "-D", "-f", str(self.conf)])
        self._spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, timeout, f"node {self.node} idle in sinfo")

    def _slurm_conf(self) -> str:
        # The node as slurmd itself measures it (CPUs, sockets, cores, memory), so that the
        # controller does not drain it for having less than configured.
        measured = self._run([which("slurmd"), "-C"]).splitlines()[0].split()
        self.node = measured[0].removeprefix("NodeName=")
        hardware = " ".join(measured[1:])
        b = self.base
        return "\n".join([
            "ClusterName=beamflowtest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={b / 'state'}",
            f"SlurmdSpoolDir={b / 'spool'}",
            f"SlurmctldPidFile={b / 'slurmctld.pid'}",
            f"SlurmdPidFile={b / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.logs / 'slurmctld.log'}",
            f"SlurmdLogFile={self.logs / 'slurmd.log'}",
            # No cgroups in containers: track job processes through /proc, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"NodeName={self.node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE"
            " State=UP",
            "",
        ])  # fmt: skip

    def _node_idle(self) -> bool:
        state = self.sinfo()
        if state.startswith(("drain", "down", "fail")):
            raise RuntimeError(f"node {self.node} is {state}: see {self.logs}")
        return state == "idle"

    def sinfo(self) -> str:
        out = self._run([which("sinfo"), "-h", "-N", "-o", "%t"], check=False)
        return out.strip()

    def jobs(self) -> list[str]:
        """Ids of the jobs still known to the controller (pending, running, completing)."""
        return self._run([which("squeue"), "-h", "-o", "%i"], check=False).split()

    # -- stop -----------------------------------------------------------------------------
    def stop(self, timeout: float = 60.0) -> None:
        """Cancel every job, stop the daemons, and wait until none of ours is left."""
        if any(name == "slurmctld" and p.poll() is None for name, p in self._daemons):
            if self.jobs():
                self._run([which("scancel"), "--full", "-u", "root"], check=False)
            deadline = time.monotonic() + timeout
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.5)
        for _name, proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in reversed(self._daemons):
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._wait(lambda: not self.leftovers(), timeout, "job step daemons to exit", watch=False)

    def leftovers(self) -> dict[int, str]:
        """Slurm or MUNGE processes running now that were not running before `start`."""
        return {pid: name for pid, name in processes().items() if pid not in self._before}

    # -- helpers --------------------------------------------------------------------------
    def _spawn(self, name: str, command: list[str | None]) -> None:
        log = (self.logs / f"{name}.out").open("wb")
        env = {**os.environ, **self.env}
        proc = subprocess.Popen([str(c) for c in command], stdout=log, stderr=log, env=env)
        log.close()
        self._daemons.append((name, proc))

    def _run(self, command: list[str | None], check: bool = True) -> str:
        env = {**os.environ, **self.env}
        done = subprocess.run(
            [str(c) for c in command], env=env, capture_output=True, text=True, timeout=60
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, command))}: {done.stderr.strip()}")
        return done.stdout

    def _wait(
        self, ready: Callable[[], bool], timeout: float, what: str, watch: bool = True
    ) -> None:
        """Until `ready()`; with `watch`, a daemon that exits meanwhile is an error."""
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self._daemons if watch else ():
                if proc.poll() is not None:
                    log = (self.logs / f"{name}.out").read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"{name} exited ({proc.returncode}) waiting for {what}:\n{log}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout:.0f} s: see {self.logs}")
            time.sleep(0.2)
