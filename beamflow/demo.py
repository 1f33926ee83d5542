"""`beamflow demo`: the whole job on one machine, live.

A workspace on the embedded local backend; functions and flows registered; the status page
served; the edge agent watching the detector directory; and the beamline simulator writing
scans into it frame file by frame file, as a detector would. The agent starts a flow run per
scan (and one at half the frames: a progressive run that the final one continues from), the
flow moves the data "to the cluster", reconstructs it, and brings previews and the product
back. At the end, each reconstruction is scored against the simulator's ground truth.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from beamflow.config import CONFIG_NAME, RECONSTRUCTION_DEFAULTS, Settings, load_config
from beamflow.console import make_console, styled, styled_status, verdict_text
from beamflow.formats import read_product
from beamflow.ground_truth import read_ground_truth, score_product
from beamflow.run_backends import get_run_backend, retry_and_follow
from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.simulate import simulate_scan
from beamflow.status.server import build_app, free_port, serve_in_thread
from beamflow.workspace_toml import local_workspace_toml
from edge_agent.agent import EdgeAgent
from edge_agent.policy import FINAL, dedupe_key


@dataclass
class DemoOptions:
    workspace: Path
    scans: int = 3
    positions: int = 200
    probe_size: int = 64
    photons: float = 1e6
    iterations: int = RECONSTRUCTION_DEFAULTS.iterations
    rate_hz: float = 60.0
    port: int | None = None
    exit_when_done: bool = False
    timeout_s: float = 900.0


@dataclass
class _Scans:
    """What the simulator thread has written so far (read by the display)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    frames: dict[str, tuple[int, int]] = field(default_factory=dict)
    masters: dict[str, Path] = field(default_factory=dict)
    error: str | None = None
    done: bool = False

    def progress(self, name: str, written: int, total: int) -> None:
        with self.lock:
            self.frames[name] = (written, total)


def prepare_workspace(options: DemoOptions, console: Console) -> Settings:
    """Create (or reuse) the demo workspace and register functions and flows."""
    ws = options.workspace
    config = ws / CONFIG_NAME
    if not config.exists():
        for sub in ("beamline/detector", "beamline/previews", "hpc", "state"):
            (ws / sub).mkdir(parents=True, exist_ok=True)
        config.write_text(
            local_workspace_toml(
                iterations=options.iterations,
                quiet_seconds=1.0,
                progressive=(0.5,),
                max_concurrent_runs=1,  # two cores: one reconstruction at a time is fastest
            )
        )
    settings = load_config(config)
    if settings.backend != "local":
        raise ValueError(f"{config}: the demo runs on the local backend, not {settings.backend}")
    backend = get_run_backend(settings)
    try:
        for result in [*backend.register_functions(), *backend.register_flows()]:
            console.print(f"  registered {result.kind} {result.name}: {result.action}")
    finally:
        backend.close()
    return settings


def _simulate(settings: Settings, options: DemoOptions, scans: _Scans, names: list[str]) -> None:
    try:
        for i, name in enumerate(names):
            scans.progress(name, 0, options.positions)
            master = simulate_scan(
                settings.beamline.detector_dir,
                name,
                positions=options.positions,
                probe_size=options.probe_size,
                photons=options.photons,
                seed=100 + i,
                frames_per_file=max(1, options.positions // 10),
                rate_hz=options.rate_hz,
                progress=lambda w, t, name=name: scans.progress(name, w, t),
            )
            with scans.lock:
                scans.masters[name] = master
    except Exception as exc:  # noqa: BLE001 - shown on the console and in the summary
        scans.error = f"simulator: {exc}"
    finally:
        scans.done = True


def _runs_by_scan(store: Store, names: list[str]) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for run in store.list_runs(limit=200, oldest_first=True):
        if run.scan_name in runs:
            runs[run.scan_name].append(run)
    return runs


def _live_table(store: Store, scans: _Scans, names: list[str], url: str) -> Group:
    table = Table(title="beamflow demo: beamline → flow → reconstruction → previews")
    for column in ("scan", "frames", "run", "status", "step", "time"):
        table.add_column(column)
    runs = _runs_by_scan(store, names)
    with scans.lock:
        frames = dict(scans.frames)
    for name in names:
        written, total = frames.get(name, (0, 0))
        first = True
        for run in runs[name] or [None]:
            part = "-" if run is None else ("final" if run.fraction in (None, 1.0)
                                            else f"{run.fraction:.0%} of frames")
            status = "-" if run is None else styled_status(run.status)
            table.add_row(
                name if first else "",
                f"{written}/{total}" if first else "",
                part,
                status,
                "-" if run is None else (run.current_step or "-"),
                "-" if run is None or run.duration is None else f"{run.duration:.1f} s",
            )
            first = False
    return Group(table, Text.assemble("status page: ", (url, f"link {url}")))


def _final_runs(store: Store, settings: Settings, scans: _Scans, names: list[str]
                ) -> dict[str, Run | None]:
    with scans.lock:
        masters = dict(scans.masters)
    return {
        name: store.get_run_by_key(dedupe_key(masters[name], FINAL)) if name in masters else None
        for name in names
    }


def score_against_truth(store: Store, run: Run, scan_dir: Path) -> str:
    """The run's complex NRMSE against the simulator's ground truth, as text; recorded once
    in the run's result (``result.truth``) so that the status page and `runs show` show it."""
    truth = run.result.get("truth")
    if isinstance(truth, dict) and truth.get("nrmse") is not None:
        return f"{truth['nrmse']:.3f}"
    if run.status != RunStatus.SUCCEEDED or not run.product:
        return "-"
    path = scan_dir / "ground_truth.h5"
    try:
        nrmse = float(score_product(read_product(run.product), read_ground_truth(scan_dir)).nrmse)
    except (OSError, ValueError) as exc:
        return f"unscored: {exc}"
    store.update_run(run.id, result={**run.result, "truth": {
        "nrmse": nrmse, "metric": "complex NRMSE", "ground_truth": str(path)}})
    return f"{nrmse:.3f}"


def summary_table(store: Store, settings: Settings, scans: _Scans, names: list[str]
                  ) -> tuple[Table, bool]:
    """The closing table: scan, status, verdict, iterations, NRMSE vs the truth, wall
    time, product."""
    table = Table(title="summary")
    for column in ("scan", "status", "verdict", "iterations", "NRMSE (complex)", "wall time",
                   "product"):
        table.add_column(column)
    ok = True
    for name, run in _final_runs(store, settings, scans, names).items():
        if run is None:
            table.add_row(name, styled("no run", "red"), "-", "-", "-", "-", "-")
            ok = False
            continue
        ok &= run.status == RunStatus.SUCCEEDED
        iterations = "-" if run.iteration is None else str(run.iteration)
        nrmse = score_against_truth(store, run, settings.beamline.detector_dir / name)
        wall = sum(r.duration or 0.0 for r in _runs_by_scan(store, [name])[name])
        table.add_row(
            name,
            Text.assemble(styled_status(run.status), f" ({run.error})" if run.error else ""),
            verdict_text(run.verdict),
            iterations,
            nrmse,
            f"{wall:.1f} s",
            run.product or "-",
        )
    return table, ok


def _new_scan_names(settings: Settings, n: int) -> list[str]:
    """Names after the demo scans already in the detector directory: a second demo in the
    same workspace adds new scans (each scan is processed once, so old names would not run)."""
    detector = Path(settings.beamline.detector_dir)
    taken = {p.name for p in detector.glob("demo_scan_*")} if detector.is_dir() else set()
    first = 1
    while f"demo_scan_{first:03d}" in taken:
        first += 1
    return [f"demo_scan_{first + i:03d}" for i in range(n)]


def run_demo(options: DemoOptions, console: Console | None = None) -> bool:
    """Run the demo; True when every scan's final run succeeded."""
    console = console or make_console()
    console.print(Text.assemble(styled("beamflow demo", "bold"),
                                f" in {options.workspace.resolve()}"))
    settings = prepare_workspace(options, console)
    store = Store(settings.store_path)
    names = _new_scan_names(settings, options.scans)
    scans = _Scans()
    port = options.port or free_port(settings.status.host)
    app = build_app(settings, host=settings.status.host, retry=partial(retry_and_follow, settings))
    with serve_in_thread(app, settings.status.host, port) as url:
        # The address as soon as it answers: the page is worth opening while the runs go.
        console.print(f"status page: {url}", highlight=False, soft_wrap=True)
        edge = EdgeAgent(settings, store=store)
        agent_thread = threading.Thread(target=edge.run_forever, name="agent", daemon=True)
        agent_thread.start()
        sim = threading.Thread(
            target=_simulate, args=(settings, options, scans, names), name="simulator",
            daemon=True,
        )
        sim.start()
        deadline = time.monotonic() + options.timeout_s
        ok = False
        try:
            with Live(_live_table(store, scans, names, url), console=console,
                      refresh_per_second=4) as live:
                while True:
                    live.update(_live_table(store, scans, names, url))
                    finals = _final_runs(store, settings, scans, names)
                    for name, run in finals.items():  # the score on the page as soon as can be
                        if run is not None and run.status == RunStatus.SUCCEEDED:
                            score_against_truth(store, run, settings.beamline.detector_dir / name)
                    if scans.done and (scans.error or all(
                        r is not None and r.status.finished for r in finals.values()
                    )):
                        break
                    if time.monotonic() > deadline:
                        console.print(styled("demo timed out", "red"))
                        break
                    time.sleep(0.25)
            if not console.is_terminal:
                console.line()  # a pipe gets the last frame without its line end
            table, ok = summary_table(store, settings, scans, names)
            console.print(table)
            if scans.error:
                console.print(styled(scans.error, "red"))
                ok = False
            if options.exit_when_done:
                # The page stops with the demo: the last line says how to see it again.
                config = options.workspace / CONFIG_NAME
                console.print(f"workspace: {options.workspace}", highlight=False,
                              soft_wrap=True)
                console.print(f"the status page has stopped; to see these runs again: "
                              f"beamflow serve --config {config}", highlight=False,
                              soft_wrap=True)
            else:
                console.print(f"status page: {url}   workspace: {options.workspace}",
                              highlight=False, soft_wrap=True)
                console.print("serving the status page; Ctrl-C to stop")
                while True:
                    time.sleep(1)
        except KeyboardInterrupt:
            pass  # Ctrl-C or SIGTERM: stop serving; the outcome is what the runs did
        finally:
            # A second Ctrl-C must not cut the shutdown short: it stops the compute engine
            # (its interchange and worker pool do not get the terminal's Ctrl-C themselves).
            with _interrupts_ignored():
                edge.stop()
                agent_thread.join(timeout=15)
                edge.backend.close()
    return ok


@contextmanager
def _interrupts_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT,
                                                                     signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
