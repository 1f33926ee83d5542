"""One source of each reconstruction default: the config model. Whoever builds a
reconstruction without a value (a job, the compute function's parameters, a new workspace's
file, the demo) ends with the config model's value, and changing the model changes them all."""

from __future__ import annotations

import tomllib

import pytest

from beamflow import config, workspace_toml
from beamflow.config import Reconstruction
from beamflow.job.models import ReconstructJob, RunParameters


@pytest.mark.parametrize("field", ["algorithm", "iterations", "probe_modes"])
def test_a_job_given_no_value_takes_the_config_default(tmp_path, monkeypatch, field):
    changed = {"algorithm": "lsqml", "iterations": 7, "probe_modes": 3}[field]
    monkeypatch.setattr(config, "RECONSTRUCTION_DEFAULTS", Reconstruction(**{field: changed}))
    import beamflow.job.models as rc

    monkeypatch.setattr(rc, "RECONSTRUCTION_DEFAULTS", config.RECONSTRUCTION_DEFAULTS)
    job = ReconstructJob(scan=tmp_path / "s.h5", out=tmp_path / "out")
    assert getattr(job.params, field) == changed


def test_every_builder_agrees_with_the_config_model(tmp_path):
    d = Reconstruction()
    job = ReconstructJob(scan=tmp_path / "s.h5", out=tmp_path / "out")
    assert (job.params.algorithm, job.params.iterations, job.params.probe_modes) == (
        d.algorithm, d.iterations, d.probe_modes)
    assert (job.device, job.checkpoint_every, job.preview_every) == (
        d.device, d.checkpoint_every, d.preview_every)
    assert RunParameters().model_dump(include=set(Reconstruction.model_fields)) == d.model_dump()
    for text in (workspace_toml.local_workspace_toml(), workspace_toml.globus_workspace_toml()):
        written = tomllib.loads(text)["reconstruction"]
        expected = d.model_dump(include=set(written))
        expected["device"] = written["device"]  # the Globus template names the GPU on purpose
        assert written == expected
    from beamflow.demo import DemoOptions

    assert DemoOptions(workspace=tmp_path).iterations == d.iterations
