"""The run page offers the full-range phase view, in a real Chromium (as test_status_browser).

The previews are those ``write_previews`` draws (windowed phase, full-range phase, amplitude,
probe, convergence); the page shows four figures, the phase one with a "full range" link,
and keeps the link when its script redraws the previews after the files change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from browser_kit import BROWSER_MARKS, CHROMIUM, FLAGS, until

from beamflow.ptycho.quality.previews import PREVIEW_NAMES, write_previews
from beamflow.runs.records import RunStatus
from beamflow.runs.store import Store
from beamflow.status import StatusOptions, create_app
from beamflow.status.server import serve_in_thread

pytestmark = BROWSER_MARKS


def _previews(directory: Path, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    n, m = 96, 32
    y, x = np.indices((n, n))
    star = np.sin(12 * np.arctan2(y - n / 2, x - n / 2)) > 0
    obj = np.exp(1j * (0.6 * star + 0.05 * rng.standard_normal((n, n))))
    py, px = np.indices((m, m)) - m / 2
    probe = np.exp(-(px**2 + py**2) / 60.0)
    c = np.arange(12, n - m - 11, 8)
    corners = np.stack(np.meshgrid(c, c, indexing="ij"), -1).reshape(-1, 2)
    files = write_previews(directory, obj, probe, 10e-9, [1.0, 0.5, 0.2],
                           positions_px=corners, title=f"star · seed {seed}")
    return [files[name] for name in PREVIEW_NAMES]


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Store, str, list[Path]]]:
    store = Store(tmp_path / "state" / "runs.sqlite")
    files = _previews(tmp_path / "previews" / "star_0001", seed=0)
    run = store.create_run(scan_name="star_0001", scan_path="/data/star_0001",
                           flow="ptycho_reconstruct", backend="local",
                           status=RunStatus.ACTIVE)
    store.update_run(run.id, iteration=10, iterations_total=100)
    store.add_previews(run.id, [str(f) for f in files])
    with serve_in_thread(create_app(store, StatusOptions(poll_seconds=0.4))) as base:
        yield base, store, run.id, files


FULL_LINK = "document.querySelector('figure[data-kind=\"object_phase\"] a.full-range')"


def test_phase_figure_links_the_full_range_view(site) -> None:
    from playwright.sync_api import sync_playwright

    base, store, run_id, files = site
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            problems: list[str] = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{base}/runs/{run_id}")
            kinds = page.locator("#previews figure").evaluate_all(
                "figs => figs.map(f => f.dataset.kind)")
            assert kinds == ["object_phase", "object_amplitude", "probe", "convergence"]
            link = page.locator('figure[data-kind="object_phase"] a.full-range')
            assert link.text_content() == "full range"
            first = link.get_attribute("href")
            full = page.request.get(base + first)
            assert full.ok and full.body() == files[1].read_bytes()

            # New previews arrive: the script redraws the figures and keeps the link,
            # now to the new full-range file.
            _previews(files[0].parent, seed=1)
            later = time.time() + 3
            for f in files:
                os.utime(f, (later, later))
            store.update_run(run_id, iteration=20)
            until(page, f"{FULL_LINK} && {FULL_LINK}.getAttribute('href') !== '{first}'")
            assert page.locator("#previews figure").count() == 4
            assert problems == []
        finally:
            browser.close()
