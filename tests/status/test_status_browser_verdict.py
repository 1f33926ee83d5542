"""A succeeded run with a suspect result must look different from a trusted one, in a real
Chromium (as test_status_browser): the runs list marks it, the run page says why, and the
list's live refresh keeps the mark."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_kit import BROWSER_MARKS, CHROMIUM, FLAGS

from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

REASON = ("The data look like near-field holograms (their content moves with the scan, "
          "R² 0.85; no stationary central diffraction peak), but a far-field model was used: "
          "try --propagation near-field.")

pytestmark = BROWSER_MARKS


def _succeeded(store: Store, scan: str, verdict: str, reasons: list[str]) -> str:
    run = store.create_run(scan_name=scan, scan_path=f"/data/{scan}",
                           flow="ptycho_reconstruct", backend="local",
                           status=RunStatus.ACTIVE)
    now = time.time()
    store.update_run(run.id, status=RunStatus.SUCCEEDED, started_at=now - 60, finished_at=now,
                     verdict=verdict, verdict_reasons=reasons,
                     result={"summary": {"verdict": verdict, "verdict_reasons": reasons}})
    return run.id


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    store = Store(tmp_path / "state" / "runs.sqlite")
    suspect = _succeeded(store, "petra_p25_far_field", "suspect", [REASON])
    trusted = _succeeded(store, "petra_p25_near_field", "trusted", [])
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        yield base, suspect, trusted


def test_suspect_run_is_marked_in_the_list_and_explained_on_its_page(site, tmp_path):
    from playwright.sync_api import sync_playwright

    base, suspect, trusted = site
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(base + "/")
            row = page.locator(f'tr[data-id="{suspect}"] .verdict.suspect')
            row.wait_for(timeout=10_000)
            assert row.inner_text().strip() == "suspect"
            assert REASON in (row.get_attribute("title") or "")
            assert page.locator(f'tr[data-id="{trusted}"] .verdict').count() == 0
            # After the list's live refresh (rows rebuilt by the script) the mark stays.
            page.wait_for_timeout(1200)
            assert page.locator(f'tr[data-id="{suspect}"] .verdict.suspect').count() == 1
            page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)

            page.goto(f"{base}/runs/{suspect}")
            box = page.locator("#run-verdict.suspect")
            box.wait_for(timeout=10_000)
            text = box.inner_text()
            assert "Suspect result" in text and "--propagation near-field" in text
            colour = page.evaluate(
                "getComputedStyle(document.querySelector('#run-verdict')).backgroundColor")
            page.screenshot(path=str(tmp_path / "run_suspect.png"), full_page=True)

            page.goto(f"{base}/runs/{trusted}")
            ok = page.locator("#run-verdict.trusted")
            ok.wait_for(timeout=10_000)
            assert "trusted" in ok.inner_text()
            assert page.evaluate("getComputedStyle(document.querySelector('#run-verdict'))"
                                 ".backgroundColor") != colour
        finally:
            browser.close()


def test_api_carries_the_verdict(site):
    import httpx

    base, suspect, trusted = site
    runs = {r["id"]: r for r in httpx.get(base + "/api/runs").json()["runs"]}
    assert runs[suspect]["verdict"] == "suspect"
    assert runs[suspect]["verdict_reasons"] == [REASON]
    assert runs[trusted]["verdict"] == "trusted"
    one = httpx.get(f"{base}/api/runs/{suspect}").json()
    assert one["run"]["verdict"] == "suspect"
    assert one["run"]["verdict_reasons"] == [REASON]
