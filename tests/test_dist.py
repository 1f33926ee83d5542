"""The install artifact: `make dist` builds a wheel and an sdist (offline, with the venv's
hatchling) holding beamflow, the edge agent, the compute function and the flow definitions;
the wheel works on its own (the flows load from inside it). deploy/constraints-worker.txt
pins what the tests run with."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from beamflow import __version__
from beamflow.constraints import constraints_text, read_constraints, runtime_pins

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _has_hatchling() -> bool:
    done = subprocess.run([sys.executable, "-c", "import hatchling"], capture_output=True)
    return done.returncode == 0


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    if not _has_hatchling():
        pytest.skip("hatchling is not installed in this venv (it is in [dev]: make installs it)")
    out = tmp_path_factory.mktemp("dist")
    # The Makefile's own recipe, on this venv (STAMP= : the venv exists already).
    done = subprocess.run(
        ["make", "-s", "dist", f"DIST_DIR={out}", f"BIN={BIN}", "STAMP="],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PIP_NO_INDEX": "1"},  # offline: nothing may be downloaded
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_make_dist_builds_a_wheel_and_an_sdist(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        f"beamflow-{__version__}-py3-none-any.whl",
        f"beamflow-{__version__}.tar.gz",
    ]


def test_the_wheel_holds_the_code_the_flows_and_the_function(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert tops == {"beamflow", "edge_agent", "flows", "functions",
                    f"beamflow-{__version__}.dist-info"}  # fmt: skip
    for name in ("ptycho_reconstruct", "ptycho_shared_fs"):
        assert f"flows/{name}.json" in names and f"flows/{name}.schema.json" in names
    assert "functions/reconstruct.py" in names
    assert "edge_agent/agent.py" in names and "beamflow/cli/__init__.py" in names
    assert any(n.startswith("beamflow/status/static/") for n in names)
    assert any(n.startswith("beamflow/status/templates/") for n in names)
    # the GPU's kernels are CUDA sources read as package data
    cuda = Path(__file__).parents[1] / "beamflow/ptycho/gpu/cuda"
    assert {f"beamflow/ptycho/gpu/cuda/{p.name}" for p in cuda.iterdir()} <= names
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(f"beamflow-{__version__}.dist-info/METADATA"))
        entry_points = z.read(f"beamflow-{__version__}.dist-info/entry_points.txt").decode()
    assert "beamflow = beamflow.cli:main" in entry_points
    requires = meta.get_all("Requires-Dist")
    assert "globus-compute-endpoint==4.19.*" in requires
    assert any(r.startswith("cupy-cuda12x") and "extra == 'gpu'" in r for r in requires)


def test_the_flows_and_the_function_load_from_the_wheel_alone(dist: Path, tmp_path) -> None:
    """Installed from the wheel, beamflow finds its flows and its function inside it (package
    data), not in a checkout."""
    (wheel,) = dist.glob("*.whl")
    script = (
        "import flows, functions, beamflow.registry as r\n"
        "print(flows.__file__)\n"
        "print(sorted(flows.flow_names()))\n"
        "print(flows.load_definition('ptycho_reconstruct')['StartAt'])\n"
        "print(r.function_names(), len(r.function_source('reconstruct')) > 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    where, names, start, functions = done.stdout.splitlines()
    assert where.startswith(str(wheel))
    assert names == "['ptycho_reconstruct', 'ptycho_shared_fs', 'retention_cleanup']"
    assert start == "TransferScanToHPC" and functions == "['cleanup', 'reconstruct'] True"


def test_the_sdist_holds_the_source_the_deploy_files_and_the_constraints(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("pyproject.toml", "flows/ptycho_reconstruct.json", "functions/reconstruct.py",
                   "edge_agent/agent.py", "deploy/constraints-worker.txt",
                   "deploy/compute-endpoint/slurm-gpu/identity_mapping.json"):  # fmt: skip
        assert needed in names, needed


# -- the constraints ----------------------------------------------------------------------------
SHIPPED = ROOT / "deploy" / "constraints-worker.txt"


def test_the_constraints_pin_what_the_tests_run_with() -> None:
    """Regenerate with `make constraints` when the environment changes."""
    expected = constraints_text(runtime_pins(extras=("gpu",)))
    assert SHIPPED.read_text() == expected, "run `make constraints` and commit the file"


def test_the_constraints_pin_every_runtime_dependency_within_pyproject() -> None:
    pins = read_constraints(SHIPPED.read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        req = Requirement(text)
        name = req.name.lower()
        assert name in pins, f"{name} is not pinned: run `make constraints`"
        assert req.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    for name in ("parsl", "globus-compute-endpoint", "globus-compute-sdk", "pyzmq", "dill"):
        assert name in pins, name  # what must match between the endpoint and its workers


def test_constraints_files_are_read_back() -> None:
    text = constraints_text({"parsl": "2026.10.26", "numpy": "2.4.6"})
    assert text.startswith("#") and read_constraints(text) == {"parsl": "2026.10.26",
                                                                "numpy": "2.4.6"}  # fmt: skip
