"""The operator's runs list in a real Chromium: on a phone-width screen (390 px) the runs are
cards, not a table scrolled sideways; running runs show their speed and ETA as the page
refreshes; the time filter and sort are controls whose choice lands in the URL; a run links
to its logs."""

from __future__ import annotations

import time
from pathlib import Path

from browser_kit import BROWSER_MARKS, shot, until

from beamflow.runs.records import Run, RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

pytestmark = BROWSER_MARKS

LONG_PATH = "/data/beamline/2026-11-25/sample_holder_B/day2/ptycho_scan_000123_master.h5"

CARDS = """() => [...document.querySelectorAll('#runs-body tr.run')].map(tr => {
  const box = tr.getBoundingClientRect();
  const step = tr.querySelector('td.c-step');
  return {display: getComputedStyle(tr).display, left: box.left, right: box.right,
          top: box.top, bottom: box.bottom,
          label: getComputedStyle(step, '::before').content,
          head: getComputedStyle(document.querySelector('#runs thead')).display};
})"""
NO_SIDEWAYS = """() => document.documentElement.scrollWidth <= window.innerWidth
  && [...document.querySelectorAll('.table-wrap, #runs, #runs-body tr')]
       .every(e => e.scrollWidth <= e.clientWidth + 1)"""


def runs(store: Store) -> dict[str, Run]:
    now = time.time()
    out = {}
    out["failed"] = store.create_run(scan_name="ptycho_scan_000121", flow="ptycho_reconstruct",
                                     backend="local", scan_path=LONG_PATH.replace("123", "121"))
    store.update_run(out["failed"].id, status=RunStatus.FAILED, finished_at=now - 600,
                     error="ptycho_scan_000121_master.h5 is not an HDF5 file (no HDF5 "
                     "signature)", error_step="ReconstructOnHPC")
    failed = out["failed"].id
    store.add_event(failed, "RunCreated", "queued ptycho_scan_000121 (dedupe key day2/121)")
    store.add_event(failed, "RunStarted", "started on the local backend")
    store.record_step(failed, "TransferScanToHPC", "SUCCEEDED", started_at=now - 700,
                      finished_at=now - 698, details={"action": {"details": {
                          "files_transferred": 3, "bytes_transferred": 73400320}}})
    store.record_step(failed, "ReconstructOnHPC", "FAILED", started_at=now - 698,
                      finished_at=now - 600, details={"error": {
                          "code": "ActionFailedException",
                          "cause": "ScanFormatError: ptycho_scan_000121_master.h5: /: not an "
                                   "HDF5 file (no HDF5 signature)"}})
    store.add_event(failed, "RunFailed", "failed: Reconstruct on HPC: not an HDF5 file",
                    level="error")
    old = store.create_run(scan_name="ptycho_scan_000007", flow="ptycho_reconstruct",
                           backend="local", scan_path=LONG_PATH.replace("123", "007"))
    out["old"] = store.update_run(old.id, status=RunStatus.FAILED, finished_at=now - 7200,
                                  error="boom")
    out["done"] = store.create_run(scan_name="ptycho_scan_000122", flow="ptycho_reconstruct",
                                   backend="local", scan_path=LONG_PATH.replace("123", "122"))
    store.update_run(out["done"].id, status=RunStatus.SUCCEEDED, iteration=200,
                     iterations_total=200)
    live = store.create_run(scan_name="ptycho_scan_000123", flow="ptycho_reconstruct",
                            backend="local", scan_path=LONG_PATH)
    store.record_step(live.id, "TransferScanToHPC", "SUCCEEDED", started_at=now - 30,
                      finished_at=now - 28)
    store.record_step(live.id, "ReconstructOnHPC", "ACTIVE", started_at=now - 28)
    out["live"] = store.update_run(live.id, status=RunStatus.ACTIVE,
                                   current_step="ReconstructOnHPC", iteration=20,
                                   iterations_total=200)
    return out


def test_phone_width_runs_are_cards(store, browser, tmp_path: Path) -> None:
    made = runs(store)
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
        page.goto(base + "/")
        until(page, "document.querySelector('#live-text').textContent.startsWith('Live')")
        # The live run makes progress; its card shows speed and ETA once the page has seen
        # two counts (the page refreshes every 0.4 s here).
        for iteration in (40, 60):
            time.sleep(0.5)
            store.update_run(made["live"].id, iteration=iteration)
        until(page, "[...document.querySelectorAll('#runs-body .rate')]"
                    ".some(s => s.textContent.includes('it/s'))")
        cards = page.evaluate(CARDS)
        assert len(cards) == 4
        for card in cards:
            assert card["display"] == "grid" and card["head"] == "none", card
            assert card["left"] >= 0 and card["right"] <= 390, card  # inside the screen
            assert card["label"] == '"Step"', card  # each fact says what it is
        assert all(a["bottom"] <= b["top"] for a, b in zip(cards, cards[1:], strict=False))
        assert page.evaluate(NO_SIDEWAYS)
        step = page.locator(f'#runs-body tr[data-id="{made["live"].id}"] td.c-step')
        assert step.text_content() == "Reconstruct on HPC"
        path = shot(page, tmp_path, "status-runs-phone-390.png")
        assert path.exists()

        # The same page on a desktop is still a table.
        page.set_viewport_size({"width": 1280, "height": 900})
        assert page.evaluate("getComputedStyle(document.querySelector('#runs-body tr')).display"
                             ) == "table-row"
        page.close()


def test_time_filter_and_sort_controls(store, browser, tmp_path: Path) -> None:
    made = runs(store)
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/")
        until(page, "document.querySelectorAll('#runs-body tr').length === 4")
        # Failed in the last hour: two controls, no reload, the URL says it.
        page.select_option("#f-status", "FAILED")
        page.select_option("#f-since", "1h")
        until(page, "document.querySelectorAll('#runs-body tr').length === 1")
        assert page.locator("#runs-body tr").get_attribute("data-id") == made["failed"].id
        assert "status=FAILED" in page.url and "since=1h" in page.url
        assert page.locator('[data-count="FAILED"]').text_content() == "1"
        # Reloaded from that URL, the controls show the same choice.
        page.reload()
        assert page.locator("#f-since").input_value() == "1h"
        assert page.locator("#runs-body tr").count() == 1
        page.select_option("#f-status", "")
        page.select_option("#f-since", "")
        page.select_option("#f-sort", "oldest")
        until(page, "document.querySelectorAll('#runs-body tr').length === 4 && "
                    f"document.querySelector('#runs-body tr').dataset.id === '{made['failed'].id}'")
        assert "sort=oldest" in page.url
        # A run's logs are a click away.
        page.click(f'#runs-body tr[data-id="{made["failed"].id}"] a.scan')
        page.click("#logs-link")
        page.wait_for_url(f"{base}/runs/{made['failed'].id}/logs")
        assert "Logs of ptycho_scan_000121" in page.locator("h1").text_content()
        assert page.locator("#log-events li").count() == 3
        assert "no HDF5 signature" in page.locator(".step-log pre").nth(1).text_content()
        shot(page, tmp_path, "status-run-logs.png")
        page.close()
