"""The status page in a real Chromium (Debian's /usr/bin/chromium through Playwright).

A uvicorn server on a free loopback port serves a temporary store with real PNG previews;
the test changes the store as the agent would and watches the page follow without a reload.
Screenshots go to the test's tmp dir (and to $BEAMFLOW_SCREENSHOT_DIR when set).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_kit import BROWSER_MARKS, shot, until
from page_kit import draw_previews

from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

XSS_SCAN = '<img src=x onerror="window.__pwned=1">'

pytestmark = BROWSER_MARKS


KINDS = ("object_phase", "object_amplitude", "probe", "convergence")


PREVIEW_SETS = {"lamella_A_0001": (0, 100), "lamella_A_0002": (1, 100),
                "siemens_star_0007": (2, 100), "catalyst_0042": (5, 30),
                "ptychotomo_0107": (2, 72)}


def seed_store(store: Store, previews_root: Path, bank: Path | None = None) -> dict[str, Run]:
    """A morning at the beamline: finished scans, a failure, a live run, a queue. Previews
    are copied from ``bank`` when given (drawing them is the slow part)."""
    now = time.time()
    runs: dict[str, Run] = {}

    def write_previews(directory: Path, seed: int, iterations: int = 100) -> list[Path]:
        if bank is None:
            return draw_previews(directory, seed, iterations)
        shutil.copytree(bank / directory.name, directory)
        return [directory / f"{k}.png" for k in KINDS]

    def run(key: str, scan: str, status: RunStatus, age: float, **fields) -> Run:
        r = store.create_run(scan_name=scan, scan_path=f"/data/{scan}",
                             flow="ptycho_reconstruct", backend="local",
                             parameters={"algorithm": "rpie", "iterations": 100,
                                         "probe_modes": 1, "batch": 32})
        t0 = now - age
        if status is not RunStatus.QUEUED:
            fields["started_at"] = t0
            store.record_step(r.id, "TransferIn", "SUCCEEDED", started_at=t0,
                              finished_at=t0 + 3.2)
            active = status == RunStatus.ACTIVE
            store.record_step(r.id, "Reconstruct", "ACTIVE" if active else status.value,
                              started_at=t0 + 3.2, finished_at=None if active else t0 + 61)
            if not active:
                fields["finished_at"] = t0 + 61
        if status == RunStatus.SUCCEEDED:
            store.record_step(r.id, "TransferOut", "SUCCEEDED", started_at=t0 + 61,
                              finished_at=t0 + 63.5)
            fields["finished_at"] = t0 + 63.5
        runs[key] = store.update_run(r.id, status=status, **fields)
        return runs[key]

    for i, scan in enumerate(["lamella_A_0001", "lamella_A_0002", "siemens_star_0007"]):
        files = write_previews(previews_root / scan, seed=i)
        product = previews_root / scan / "product.h5"
        product.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(2048))
        r = run(scan, scan, RunStatus.SUCCEEDED, age=3600 - 600 * i, iteration=100,
                iterations_total=100, current_step="TransferOut", product=str(product))
        store.add_previews(r.id, [str(f) for f in files])
    run("failed", "zeolite_0031", RunStatus.FAILED, age=1500, current_step="Reconstruct",
        error_step="Reconstruct",
        error="scan positions missing: /entry/data/positions not in zeolite_0031_master.h5")
    run("xss", XSS_SCAN, RunStatus.CANCELLED, age=1200)
    live_files = write_previews(previews_root / "catalyst_0042", seed=5, iterations=30)
    live = run("live", "catalyst_0042", RunStatus.ACTIVE, age=45, iteration=30,
               iterations_total=100, current_step="Reconstruct", fraction=0.5)
    store.add_previews(live.id, [str(f) for f in live_files])
    steady = write_previews(previews_root / "ptychotomo_0107", seed=2, iterations=72)
    other = run("steady", "ptychotomo_0107", RunStatus.ACTIVE, age=400, iteration=72,
                iterations_total=200, current_step="Reconstruct")
    store.add_previews(other.id, [str(f) for f in steady])
    run("queued", "catalyst_0043", RunStatus.QUEUED, age=5)
    store.add_event(live.id, "started", "run started on local")
    store.add_event(live.id, "preview", "previews at iteration 30")
    return runs


class Retry:
    def __init__(self, store: Store) -> None:
        self.store = store

    def __call__(self, run_id: str) -> Run:
        old = self.store.require_run(run_id)
        return self.store.add_retry(old, old.new_attempt(old.backend))


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("preview-bank")
    for scan, (seed, iterations) in PREVIEW_SETS.items():
        draw_previews(root / scan, seed, iterations)
    return root


@pytest.fixture
def site(tmp_path: Path, bank: Path) -> Iterator[tuple[str, Store, dict[str, Run]]]:
    store = Store(tmp_path / "state" / "runs.sqlite")
    runs = seed_store(store, tmp_path / "beamline" / "previews", bank)
    app = create_app(store, StatusOptions(poll_seconds=0.4), retry=Retry(store))
    with serve_in_thread(app) as base:
        yield base, store, runs


IMAGES_LOADED = (
    "[...document.querySelectorAll('#previews img')]"
    ".every(i => i.complete && i.naturalWidth > 0)"
)


def test_runs_page_lists_updates_live_and_filters(site, browser, tmp_path: Path) -> None:
    base, store, runs = site
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(base + "/")

    rows = page.locator("#runs-body tr")
    assert rows.count() == 8
    assert page.locator(f'tr[data-id="{runs["live"].id}"] .badge').get_attribute(
        "data-status") == "ACTIVE"
    # The malicious scan name shows as text and never runs.
    assert page.locator(f'tr[data-id="{runs["xss"].id}"] a.scan').text_content() == XSS_SCAN
    until(page, "document.getElementById('live-text').textContent.startsWith('Live ·')")

    # The agent moves the live run on; the row follows without a reload.
    page.evaluate("window.__sameDocument = true")
    store.update_run(runs["live"].id, iteration=80)
    live_row = f'tr[data-id="{runs["live"].id}"]'
    until(page,
        f"document.querySelector('{live_row} .ptext').textContent === 'iteration 80 of 100'")
    store.update_run(runs["live"].id, iteration=100, status=RunStatus.SUCCEEDED,
                     current_step="TransferOut")
    page.wait_for_selector(f'{live_row} .badge[data-status="SUCCEEDED"]', timeout=10_000)
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator(f"{live_row} .badge-text").text_content() == "Succeeded"
    assert page.locator('[data-count="SUCCEEDED"]').text_content() == "4"
    assert page.evaluate("window.__pwned") is None
    shot(page, tmp_path, "status-runs.png")

    # Filters: by status, then by scan name; the URL follows so a reload keeps them.
    page.select_option("#f-status", "FAILED")
    until(page, "document.querySelectorAll('#runs-body tr').length === 1")
    assert page.locator("#runs-body tr .badge").get_attribute("data-status") == "FAILED"
    assert "status=FAILED" in page.url
    page.select_option("#f-status", "")
    page.fill("#f-scan", "lamella")
    until(page, "document.querySelectorAll('#runs-body tr').length === 2")
    scans = page.locator("#runs-body a.scan").all_text_contents()
    assert sorted(scans) == ["lamella_A_0001", "lamella_A_0002"]
    page.reload()
    assert page.locator("#runs-body tr").count() == 2
    page.fill("#f-scan", "no such scan")
    page.wait_for_selector("#runs-empty:not([hidden])")
    assert problems == []

    # The server goes away: the page says so instead of showing stale data as live.
    page.route("**/api/runs*", lambda route: route.abort())
    until(page, "document.getElementById('live').classList.contains('down')")
    assert "Connection lost" in page.locator("#live-text").text_content()
    page.unroute("**/api/runs*")
    until(page, "!document.getElementById('live').classList.contains('down')", timeout=15)


def test_run_page_previews_load_and_refresh(site, browser, tmp_path: Path) -> None:
    base, store, runs = site
    live = runs["live"]
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(f"{base}/runs/{live.id}")

    images = page.locator("#previews img")
    assert images.count() == 4
    until(page, IMAGES_LOADED)
    assert [c.split(" ")[0] for c in page.locator("#previews figcaption").all_text_contents()] == [
        "Object", "Object", "Probe", "Convergence"]
    first = page.locator('figure[data-kind="object_phase"] img').get_attribute("src")
    # Timeline bars are placed by the script (no inline styles under the CSP).
    width = page.evaluate("document.querySelector('#steps .fill').style.width")
    assert width.endswith("%") and float(width[:-1]) > 0

    # A progressive run delivers a new phase preview: the image follows, same document.
    phase = Path(store.require_run(live.id).previews[0])
    draw_previews(phase.parent, seed=9, iterations=60)
    later = time.time() + 3
    os.utime(phase, (later, later))
    store.update_run(live.id, iteration=60)
    until(page,
        "document.querySelector('figure[data-kind=\"object_phase\"] img').getAttribute('src')"
        f" !== '{first}'", timeout=10)
    until(page, "document.querySelector('[data-field=progress_text]').textContent"
          " === 'iteration 60 of 100'")
    assert page.locator('figure[data-kind="object_phase"] img').evaluate(
        "i => i.naturalWidth") > 0
    shot(page, tmp_path, "status-run.png")

    # The failed run shows its step and cause, and the retry button starts a new run.
    failed = runs["failed"]
    page.goto(f"{base}/runs/{failed.id}")
    error = page.locator("#run-error")
    assert error.is_visible() and "scan positions missing" in error.text_content()
    assert "in step Reconstruct" in error.text_content()
    page.click("#retry")
    page.wait_for_url(lambda url: "/runs/" in url and failed.id not in url, timeout=10_000)
    new = store.get_run(page.url.rsplit("/", 1)[1])
    assert new is not None and new.parent_run_id == failed.id
    # Back on the old run: no second retry is offered; the page links the one there is.
    page.goto(f"{base}/runs/{failed.id}")
    until(page, "document.querySelector('#run-retry-note').textContent.includes('Retried as')")
    assert not page.locator("#retry-form").is_visible()
    assert page.locator("#run-retry-note a").get_attribute("href") == f"/runs/{new.id}"
    assert problems == []


def test_big_screen_layout(site, browser, tmp_path: Path) -> None:
    base, _, runs = site
    page = browser.new_page(viewport={"width": 2560, "height": 1440})
    page.goto(f"{base}/runs/{runs['lamella_A_0002'].id}")
    until(page, IMAGES_LOADED)
    # Images large enough to judge: each preview at least 500 px wide on a wall screen.
    widths = page.evaluate(
        "[...document.querySelectorAll('#previews img')].map(i => i.getBoundingClientRect().width)")
    assert min(widths) >= 500, widths
    # ... and all four in view at once, without scrolling.
    assert page.evaluate(
        "[...document.querySelectorAll('#previews img')]"
        ".every(i => i.getBoundingClientRect().bottom <= innerHeight)")
    shot(page, tmp_path, "status-run-wall.png", full=False)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(base + "/")
    # Laptop: the table fits without sideways scrolling.
    assert page.evaluate(
        "document.querySelector('.table-wrap').scrollWidth <= "
        "document.querySelector('.table-wrap').clientWidth + 1")
    shot(page, tmp_path, "status-runs-laptop.png")
