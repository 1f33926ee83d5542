"""The operator's night in a real Chromium (as test_status_browser): a run the agent retried in
its own record lists every attempt (start, end, step, kind, error), and a new attempt
appears without a reload; the agent panel speaks plain words (no Markdown backticks)."""

from __future__ import annotations

import time

from browser_kit import BROWSER_MARKS, shot, until

from beamflow.agent_state import AgentState, state_path, write_state
from beamflow.error_kinds import ErrorKind
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

pytestmark = BROWSER_MARKS

LOST = "lost: the worker running the task ended (killed, or out of memory)"
DISK = ("the cluster's disk is full: /scratch/beamflow/s7-1a2b3c4d/raw/s7/s7_data_000003.h5: "
        "No space left on device (12 MB free of 2 TB); the scan needs 41.9 GB there")
ITEMS = "#attempts li"


def failed_attempt(store: Store, run_id: str, error: str, step: str, kind: ErrorKind) -> None:
    """The run starts, fails and is put back in the queue, as the agent's driver does."""
    store.update_run(run_id, status=RunStatus.ACTIVE, backend_run_id=f"b-{time.time()}")
    store.update_run(run_id, status=RunStatus.FAILED, error=error, error_step=step,
                     error_kind=kind)
    store.requeue(run_id)


def test_the_attempts_of_a_retried_run_are_listed_and_follow_live(store, browser, tmp_path):
    run = store.create_run(scan_name="s7", scan_path="/data/detector/s7/s7_master.h5",
                           flow="ptycho_reconstruct", backend="local")
    failed_attempt(store, run.id, LOST, "Reconstruct", ErrorKind.LOST)
    store.update_run(run.id, status=RunStatus.ACTIVE, backend_run_id="b-now",
                     current_step="TransferScanToHPC")
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        for width in (380, 1280):  # a phone (the side panel stacks), then a desktop
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.goto(f"{base}/runs/{run.id}")
            panel = page.locator("#attempts-panel")
            assert panel.is_visible()
            items = page.locator(ITEMS)
            assert items.count() == 2
            first = items.nth(0)
            assert first.locator("b").text_content() == "Attempt 1"
            assert first.locator(".attempt-status").text_content() == "Failed"
            assert first.locator(".attempt-step").text_content() == "in Reconstruct"
            assert first.locator(".kind").text_content() == "lost"
            assert first.locator(".attempt-msg").text_content() == LOST
            times = first.locator(".attempt-times time")
            assert all(times.nth(i).text_content()[:2] == "20" for i in range(2))  # dates
            assert items.nth(1).locator(".attempt-status").text_content() == "Running"
            # Nothing sticks out of a narrow screen.
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            shot(page, tmp_path, f"status-run-attempts-{width}.png")
            if width == 380:
                page.close()
                continue
            # Attempt 2 fills the disk and is queued again: the list grows without a reload.
            page.evaluate("window.__same = true")
            failed_attempt(store, run.id, DISK, "TransferScanToHPC", ErrorKind.NO_SPACE)
            until(page, f"document.querySelectorAll('{ITEMS}').length === 3")
            second = items.nth(1)
            assert second.locator(".kind").text_content() == "no_space"
            assert second.locator(".attempt-step").text_content() == "in Transfer scan to HPC"
            assert second.locator(".attempt-msg").text_content() == DISK
            assert items.nth(2).locator(".attempt-status").text_content() == "Queued"
            assert page.evaluate("window.__same") is True
            page.close()


def test_a_run_tried_once_shows_no_attempts_panel(store, browser) -> None:
    run = store.create_run(scan_name="s8", scan_path="/data/detector/s8/s8_master.h5",
                           flow="ptycho_reconstruct", backend="local")
    store.update_run(run.id, status=RunStatus.FAILED, error="diverged", error_step="Reconstruct",
                     error_kind=ErrorKind.FAILED)
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/runs/{run.id}")
        until(page, "document.querySelector('#live-text').textContent.startsWith('Live')")
        assert page.locator("#attempts-panel").is_hidden()
        page.close()


def test_the_agent_panel_tells_the_last_once_in_plain_words(store, browser, tmp_path) -> None:
    path = state_path(tmp_path / "state")
    now = time.time()
    write_state(path, AgentState(
        pid=4242, mode="once", running=False, watching="/data/detector", backend="local",
        started_at=now - 60, updated_at=now,
        summary="agent --once: 2 processed, 1 waiting, 0 skipped, 0 failed"))
    options = StatusOptions(poll_seconds=0.4, agent_state=path)
    with serve_in_thread(create_app(store, options)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/")
        until(page, "document.querySelector('#live-text').textContent.startsWith('Live')")
        headline = page.locator("#agent-headline").text_content()
        assert "`" not in headline
        assert headline.startswith("beamflow agent --once ended at ")
        assert headline.endswith(": 2 processed, 1 waiting, 0 skipped, 0 failed")
        page.close()
