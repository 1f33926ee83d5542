"""Live previews: drawn by a helper process from the states a job hands over, never in the
job's own process; a refused state or a helper that dies does not stop the job."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beamflow.job.live_previews import BUNDLE, LivePreviews
from beamflow.ptycho.quality.previews import PREVIEW_NAMES

PNG = b"\x89PNG\r\n\x1a\n"
FILES = set(PREVIEW_NAMES)


def _state(rng: np.random.Generator, n: int = 48) -> tuple[np.ndarray, np.ndarray, list]:
    obj = np.exp(1j * rng.uniform(-1, 1, (n, n))).astype(np.complex64)
    yy, xx = np.mgrid[-8:8, -8:8]
    probe = np.exp(-(yy**2 + xx**2) / 20.0).astype(np.complex64)[None]
    return obj, probe, [1.0, 0.5, 0.2]


@pytest.fixture
def live(tmp_path: Path):
    lp = LivePreviews(tmp_path / "previews")
    yield lp
    lp.close()


def test_a_state_is_drawn_by_the_helper_not_by_the_job(tmp_path: Path) -> None:
    # In a fresh interpreter, so that "the job never imports matplotlib" can be checked.
    code = f"""
import sys, numpy as np
from pathlib import Path
from beamflow.job.live_previews import LivePreviews
lp = LivePreviews(Path({str(tmp_path)!r}) / "previews")
obj = np.exp(1j * np.linspace(0, 3, 48 * 48)).reshape(48, 48).astype(np.complex64)
lp.submit(obj, np.ones((1, 16, 16), np.complex64), [1.0, 0.5], "scan · rpie · iteration 7",
          1e-8, scan_extent_px=(4, 44, 4, 44))
assert lp.wait(120), "not drawn in 120 s"
helper = lp._proc
lp.close()
assert helper.poll() is not None, "the helper outlived close()"
print(lp.drawn, sorted(lp.files), lp.errors, "matplotlib" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == f"1 {sorted(FILES)} [] False"
    for name in FILES:
        assert (tmp_path / "previews" / f"{name}.png").read_bytes().startswith(PNG)
    assert not (tmp_path / "previews" / BUNDLE).exists()


def test_states_handed_over_while_drawing_replace_each_other(live: LivePreviews) -> None:
    rng = np.random.default_rng(0)
    for _ in range(4):  # the first is drawing (the helper is still starting) while 3 arrive
        live.submit(*_state(rng), "t", 1e-8)
    assert live.wait(120)
    assert live.drawn == 2 and live.errors == []
    assert set(live.files) == FILES


def test_positions_reach_the_helper(live: LivePreviews) -> None:
    """The probe positions travel in the bundle: with them the object images are drawn
    around the illuminated region (so they change), the probe and convergence do not."""
    obj, probe, losses = _state(np.random.default_rng(5))
    drawn = []
    corners = np.array([[8.0, 8.0], [8.0, 20.0], [20.0, 8.0], [20.0, 20.0]])
    for positions in (None, corners):
        live.submit(obj, probe, losses, "t", 1e-8, positions_px=positions)
        assert live.wait(120) and live.errors == []
        drawn.append({n: p.read_bytes() for n, p in live.files.items()})
    changed = {n for n in FILES if drawn[0][n] != drawn[1][n]}
    assert changed == {"object_phase", "object_phase_full", "object_amplitude"}


def test_the_variable_probes_weights_are_drawn_too(tmp_path: Path) -> None:
    """A state with OPR weights adds probe_variation.png; one without draws only the usual
    previews (the weights travel in the bundle, so the two differ only by them)."""
    obj, probe, losses = _state(np.random.default_rng(6))
    weights = np.column_stack([np.ones(40), 0.1 * np.sin(np.linspace(0, 6, 40))])
    for name, w in (("plain", None), ("opr", weights)):
        lp = LivePreviews(tmp_path / name)
        try:
            lp.submit(obj, probe, losses, "scan · rpie · iteration 4", 1e-8, opr_weights=w)
            assert lp.wait(120) and lp.errors == [], lp.errors
            files = dict(lp.files)
        finally:
            lp.close()
        if w is None:
            assert set(files) == FILES
            assert not (tmp_path / name / "probe_variation.png").exists()
        else:
            assert set(files) == FILES | {"probe_variation"}
            assert files["probe_variation"] == tmp_path / name / "probe_variation.png"
            assert files["probe_variation"].read_bytes().startswith(PNG)


def test_a_refused_state_is_reported_and_the_helper_goes_on(
        live: LivePreviews, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(1)
    obj, probe, losses = _state(rng)
    bad = obj.copy()
    bad[3, 3] = np.nan  # a diverged state: the previews refuse to draw it
    with caplog.at_level(logging.WARNING, logger="beamflow.job.live_previews"):
        live.submit(bad, probe, losses, "diverged", 1e-8)
        assert live.wait(120)
    assert live.drawn == 0 and len(live.errors) == 1
    assert "finite" in live.errors[0] and "live previews not drawn" in caplog.text
    live.submit(obj, probe, losses, "fine", 1e-8)
    assert live.wait(120)
    assert live.drawn == 1 and set(live.files) == FILES


def test_a_helper_that_dies_is_started_again(live: LivePreviews) -> None:
    rng = np.random.default_rng(2)
    live.submit(*_state(rng), "one", 1e-8)
    assert live.wait(120) and live.drawn == 1
    os.kill(live._proc.pid, signal.SIGKILL)
    live._proc.wait()
    live.submit(*_state(rng), "two", 1e-8)
    assert live.wait(120)
    assert live.drawn == 2
    assert any("exited" in e for e in live.errors), live.errors


def test_no_more_helpers_than_max_starts(live: LivePreviews) -> None:
    rng = np.random.default_rng(3)
    for _ in range(LivePreviews.MAX_STARTS + 1):
        live.submit(*_state(rng), "x", 1e-8)
        assert live.wait(120)
        if live._proc is not None:
            os.kill(live._proc.pid, signal.SIGKILL)
            live._proc.wait()
    live.submit(*_state(rng), "not drawn", 1e-8)
    assert live.wait(5)
    assert live._proc is None and live.drawn == LivePreviews.MAX_STARTS


def test_a_state_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    lp = LivePreviews(tmp_path / "file" / "previews")
    try:
        lp.submit(*_state(np.random.default_rng(4)), "x", 1e-8)
        assert lp.wait(5)
        assert lp.drawn == 0 and len(lp.errors) == 1
        assert "not handed over" in lp.errors[0] and "file" in lp.errors[0]
    finally:
        lp.close()
