"""`beamflow reconstruct` errors say what is wrong in the user's terms: the output path
named as such, bad counts named by their data file and the frame as that file numbers it,
no exception class names and no engine class names."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401 - the bitshuffle filter of the simulated data files
import numpy as np
import pytest
from typer.testing import CliRunner

from beamflow.cli import app
from beamflow.formats import write_cxi
from beamflow.formats.eiger import DATA_KEY, data_file_name
from beamflow.formats.load import load_scan
from beamflow.job.models import plain_words
from beamflow.ptycho.state import PtychoData
from beamflow.simulate import simulate_scan

CLASS_NAMES = re.compile(r"\b[A-Z][a-z]+[A-Z]\w*(Error|Data|State|Params|Exception)\b|\w+Error:")


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("detector")
    return simulate_scan(root, "e", positions=24, probe_size=16, photons=1e4, seed=3,
                         frames_per_file=10)


def reconstruct(scan: Path, out: Path, config_dir: Path) -> tuple[int, str]:
    config = config_dir / "beamflow.toml"
    config.write_text("")  # no user or workspace configuration leaks in
    result = CliRunner().invoke(app, [
        "reconstruct", str(scan), "-o", str(out), "--iterations", "1", "--device", "cpu",
        "--preview-every", "0", "-c", str(config)])  # fmt: skip
    return result.exit_code, result.stderr


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith("error: ")
    assert not CLASS_NAMES.search(lines[0]), lines[0]
    return lines[0]


def test_an_existing_file_as_the_output_is_named_as_the_output(
    master: Path, tmp_path: Path
) -> None:
    taken = tmp_path / "passwd"
    taken.write_text("root:x:0:0\n")
    code, err = reconstruct(master, taken, tmp_path)
    line = one_error_line(err)
    assert code == 1
    assert line == (f"error: {taken}: the output directory is an existing file; give a "
                    "directory (it is created if missing)")
    assert str(master) not in line and taken.read_text() == "root:x:0:0\n"
    code, err = reconstruct(master, taken / "out", tmp_path)
    assert code == 1
    assert one_error_line(err) == (
        f"error: {taken / 'out'}: the output directory cannot be created: {taken} is a file")


def test_a_nan_is_named_by_its_data_file_and_1_based_frame(master: Path, tmp_path: Path) -> None:
    scan = tmp_path / "nan"
    scan.mkdir()
    for f in master.parent.iterdir():
        (scan / f.name).write_bytes(f.read_bytes())
    data = scan / data_file_name("e", 2)  # frames 11..20 of the scan
    with h5py.File(data, "r") as f:
        frames = f[DATA_KEY][...].astype(np.float32)
        attrs = dict(f[DATA_KEY].attrs)
    frames[2, 8, 8] = np.nan  # the third frame of the file: image 13 of the scan
    with h5py.File(data, "w") as f:
        ds = f.create_dataset(DATA_KEY, data=frames)
        ds.attrs.update(attrs)
    code, err = reconstruct(scan / "e_master.h5", tmp_path / "out", tmp_path)
    line = one_error_line(err)
    assert code == 1
    assert line.startswith(f"error: {data}: {DATA_KEY}: frame 3 of 10 in this file "
                           "(image 13 of the scan, counted from 1): a NaN or infinite value")
    assert "e_master.h5" not in line


def test_a_nan_in_a_cxi_file_is_named_by_its_0_based_index(master: Path, tmp_path: Path) -> None:
    scan = load_scan(master)
    frames = scan.frames()
    frames[4, 1, 1] = np.inf
    cxi = tmp_path / "bad.cxi"
    write_cxi(cxi, frames=frames, positions_m=scan.positions_m, geometry=scan.geometry)
    code, err = reconstruct(cxi, tmp_path / "out", tmp_path)
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: {cxi}: ")
    assert "frame index 4 (counted from 0): a NaN or infinite value" in line


@pytest.mark.parametrize("bad", [
    {"intensities": np.ones((3, 8, 6), np.float32)},  # not square
    {"intensities": np.ones((0, 8, 8), np.float32), "positions_px": np.zeros((0, 2))},
    {"positions_px": np.zeros((2, 2))},  # fewer positions than frames
    {"mask": np.zeros((8, 8), bool)},  # no valid pixel
    {"mask": np.ones((4, 4), bool)},  # the wrong shape
    {"object_shape": (4, 4)},  # smaller than a frame
])
def test_engine_messages_read_without_class_names(bad: dict) -> None:
    good = {"intensities": np.ones((3, 8, 8), np.float32), "positions_px": np.zeros((3, 2)),
            "object_shape": (16, 16), "mask": np.ones((8, 8), bool)}
    with pytest.raises(ValueError) as caught:
        PtychoData(**{**good, **bad})
    assert "PtychoData" in str(caught.value)  # the engine speaks to programmers...
    words = plain_words(str(caught.value))
    assert "PtychoData" not in words and not CLASS_NAMES.search(words), words  # ...we don't
    assert words.startswith("the "), words
