"""Live previews drawn by a helper process, so that a reconstruction never waits for them.

Drawing the preview PNGs takes ~0.5 s of matplotlib, which holds the GIL (the engine's
threads stall meanwhile), and ~60 MB (matplotlib itself, the phase unwrapping, the figures)
on top of a job whose peak memory is budgeted at twice its frames. So the job hands a helper
process the current object, probe, loss history, probe positions and the variable probe's
weights (when it has one) in a file of five ``.npy`` arrays (no pickle, written without an
intermediate copy) and goes on; the helper
draws the newest one whenever it is free, and a state handed over while it draws replaces
the waiting one. The final previews are drawn by the job itself, after the engine has
released its memory.

The helper runs at a lower priority (nice +10), ignores SIGINT and SIGTERM (the job handles
them and closes the helper) and dies with the job (PR_SET_PDEATHSIG). One that dies on its
own is started again at the next bundle, at most ``MAX_STARTS`` times per job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from beamflow.atomic import atomic_path
from beamflow.processes import die_with_parent, helper_command

__all__ = ["LivePreviews"]

log = logging.getLogger(__name__)

BUNDLE = ".live-preview.npy"


class LivePreviews:
    """The job's side: ``submit`` a state now and then, ``close`` at the end.

    ``files`` holds the previews written so far, ``drawn`` how many bundles were drawn and
    ``errors`` what went wrong (a state the previews refuse, such as a diverged one, or a
    helper that died); none of it stops the job.
    """

    MAX_STARTS = 3
    #: how long ``close`` waits for a drawing in progress
    CLOSE_TIMEOUT_S = 30.0

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self._proc: subprocess.Popen | None = None
        self._starts = 0
        self._busy = False
        self._pending: dict | None = None
        self.files: dict[str, Path] = {}
        self.drawn = 0
        self.errors: list[str] = []

    def start(self) -> None:
        """Start the helper now (its imports take ~1 s of CPU: a job starts it while it reads
        its frames, when a core is free). ``submit`` starts it otherwise."""
        if self._proc is None:
            self._start()

    def submit(self, obj: np.ndarray, probe: np.ndarray, loss_history: Sequence[float],
               title: str, pixel_size_m: float,
               scan_extent_px: Sequence[int] | None = None,
               positions_px: np.ndarray | None = None,
               noise_floor: float | None = None,
               opr_weights: np.ndarray | None = None,
               spacings_m: Sequence[float] = ()) -> None:
        """Hand over a state to draw (the arrays are written out at once; no wait).

        ``pixel_size_m``, ``scan_extent_px``, ``title``, ``positions_px`` (the probe
        windows' corners, for the illuminated region), ``noise_floor`` and ``spacings_m`` (a
        thick sample's layers) are those of
        :func:`beamflow.ptycho.quality.previews.write_previews`; ``opr_weights`` (N, K), the
        variable probe's weights, adds ``probe_variation.png``
        (:func:`beamflow.ptycho.quality.opr_previews.write_opr_preview`).
        """
        if self._proc is None and self._starts >= self.MAX_STARTS:
            return  # no helper any more: live previews are off for this job
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with (atomic_path(self.out_dir / BUNDLE, durable=False) as tmp,
                  open(tmp, "wb") as f):  # np.save to a real file writes the array as it is
                # No positions (no weights) travel as an empty array: the helper reads five.
                corners = np.zeros((0, 2)) if positions_px is None else positions_px
                weights = np.zeros((0, 0)) if opr_weights is None else opr_weights
                for a in (obj, probe, np.asarray(loss_history, np.float64),
                          np.asarray(corners, np.float64), np.asarray(weights, np.float64)):
                    np.save(f, a, allow_pickle=False)
        except OSError as e:  # a full disk must not stop the reconstruction
            self.errors.append(f"live preview not handed over: {e}")
            log.warning("%s", self.errors[-1])
            return
        floor = None if noise_floor is None or not np.isfinite(noise_floor) else noise_floor
        self._pending = {"title": title, "pixel_size_m": float(pixel_size_m),
                         "scan_extent_px": None if scan_extent_px is None
                         else [int(v) for v in scan_extent_px],
                         "noise_floor": None if floor is None else float(floor),
                         "spacings_m": [float(v) for v in spacings_m]}
        self._collect(0.0)
        self._send_pending()

    def wait(self, timeout: float) -> bool:
        """Wait until every submitted state is drawn (or failed); False on timeout."""
        while self._busy or self._pending is not None:
            if not self._collect(timeout):
                return False
            self._send_pending()
        return True

    def close(self) -> None:
        """Let a drawing in progress finish, then stop the helper and remove the bundle."""
        self._pending = None
        if self._proc is not None:
            self._collect(self.CLOSE_TIMEOUT_S)
            log.info("live previews: %d drawn by the helper", self.drawn)
        if self._proc is not None:  # (a helper that died while drawing is gone already)
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=self.CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
            self._proc = None
        with contextlib.suppress(OSError):
            (self.out_dir / BUNDLE).unlink()

    # -- internals ------------------------------------------------------------------------
    def _send_pending(self) -> None:
        if self._busy or self._pending is None:
            return
        if self._proc is not None and self._proc.poll() is not None:
            self._gone(f"live preview helper exited (status {self._proc.returncode})")
        if self._proc is None and not self._start():
            self._pending = None
            return
        try:
            self._proc.stdin.write(json.dumps(self._pending) + "\n")
            self._proc.stdin.flush()
        except OSError as e:  # it died just now: the next bundle starts another
            self._gone(f"live preview helper stopped: {e}")
            return
        self._pending = None
        self._busy = True

    def _collect(self, timeout: float) -> bool:
        """Read the helper's reply if one comes within ``timeout``; False if none did."""
        if not self._busy:
            return True
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            return False
        line = self._proc.stdout.readline()
        if not line:
            self._gone(f"live preview helper exited (status {self._proc.wait()})")
            return True
        self._busy = False
        reply = json.loads(line)
        if "error" in reply:
            self.errors.append(reply["error"])
            log.warning("live previews not drawn: %s", reply["error"])
        else:
            self.files.update({k: Path(v) for k, v in reply["files"].items()})
            self.drawn += 1
        return True

    def _gone(self, why: str) -> None:
        self._busy = False
        self.errors.append(why)
        log.warning("%s", why)
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    pipe.close()
            self._proc = None

    def _start(self) -> bool:
        if self._starts >= self.MAX_STARTS:
            return False
        self._starts += 1
        cmd, env = helper_command(__name__, str(os.getpid()), str(self.out_dir))
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True, env=env)
        except OSError as e:  # no process to be had: the job goes on without live previews
            self.errors.append(f"live preview helper not started: {e}")
            log.warning("%s", self.errors[-1])
            return False
        return True


def main(argv: Sequence[str]) -> None:
    """The helper: one JSON request per line on stdin, one JSON reply per line on stdout."""
    parent, out_dir = int(argv[0]), Path(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(parent)
    with contextlib.suppress(OSError):
        os.nice(10)
    # matplotlib: here, not in the job
    from beamflow.ptycho.quality.opr_previews import PROBE_VARIATION_NAME, write_opr_preview  # noqa: PLC0415
    from beamflow.ptycho.quality.previews import write_previews  # noqa: PLC0415

    for line in sys.stdin:
        request = json.loads(line)
        try:
            with open(out_dir / BUNDLE, "rb") as f:
                obj, probe, losses, corners, weights = (np.load(f, allow_pickle=False)
                                                        for _ in range(5))
            files = write_previews(out_dir, obj, probe, request["pixel_size_m"], losses,
                                   scan_extent_px=request["scan_extent_px"],
                                   title=request["title"], positions_px=corners,
                                   noise_floor=request.get("noise_floor"),
                                   spacings_m=request.get("spacings_m") or ())
            if weights.size:
                files[PROBE_VARIATION_NAME] = write_opr_preview(out_dir, weights, probe,
                                                                title=request["title"])
            reply = {"files": {k: str(v) for k, v in files.items()}}
        except Exception as e:  # a refused state, a vanished bundle: report, keep serving
            reply = {"error": f"{type(e).__name__}: {e}"[:2000]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
