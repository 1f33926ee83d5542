"""Every engine setting reachable one way everywhere: `[reconstruction]` in beamflow.toml, the
`beamflow reconstruct` options, the flows' input schemas, the run parameters and the compute
function all take the engine's names and limits (``beamflow.ptycho.state.ReconParams``), and
the run page shows what the engine used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
from pydantic import ValidationError

import flows
from beamflow.cli import app
from beamflow.cli.reconstruct import ENGINE_FLAGS
from beamflow.config import (
    ENGINE_SETTINGS,
    ConfigError,
    Reconstruction,
    load_config,
)
from beamflow.job.models import (
    ReconstructJob,
    RunParameters,
    flow_parameters_schema,
    settings_used,
)
from beamflow.ptycho.state import ReconParams
from beamflow.runs.records import Run
from beamflow.status.views import parameters_of

FLOWS = ("ptycho_reconstruct", "ptycho_shared_fs")

#: a value other than the default for every engine setting, accepted together by the engine
CHANGED: dict[str, Any] = {
    "algorithm": "lsqml", "iterations": 7, "batch_size": 5, "batch_selection": "compact",
    "probe_modes": 2, "alpha": 0.2, "beta": 0.5, "probe_update_start": 3,
    "object_update_start": 1, "position_correction": True, "position_correction_start": 4,
    "position_step_limit_px": 1.5, "noise_model": "poisson", "orthogonalize_every": 2,
    "center_probe": True, "seed": 11, "momentum": 0.8, "probe_momentum": 0.4,
    "momentum_every": 4, "opr_modes": 2, "opr_weight_smoothing": 0.3, "slices": 2,
    "slice_spacing_m": 1e-4, "layer_regularization": 0.5,
}


def test_the_changed_values_cover_every_engine_setting():
    assert set(CHANGED) == set(ENGINE_SETTINGS)
    assert set(ENGINE_SETTINGS) == set(ReconParams.model_fields) - {"propagation"}
    defaults = ReconParams()
    assert all(CHANGED[k] != getattr(defaults, k) for k in CHANGED)
    ReconParams(**CHANGED)


def _reconstruct_options() -> dict[str, click.Option]:
    command = typer.main.get_command(app).commands["reconstruct"]
    return {name: p for p in command.params for name in p.opts + p.secondary_opts}


def test_every_setting_has_the_engine_name_everywhere():
    options = _reconstruct_options()
    config_keys = set(Reconstruction.model_fields)
    for name in ENGINE_SETTINGS:
        assert name in config_keys, f"[reconstruction] lacks {name}"
        assert name in RunParameters.model_fields, f"run parameters lack {name}"
        flag = ENGINE_FLAGS.get(name, "--" + name.replace("_", "-"))
        assert flag in options, f"reconstruct lacks {flag}"
        for flow in FLOWS:
            section = flows.load_schema(flow)["properties"]["reconstruction"]
            assert name in section["properties"], f"{flow}.schema.json lacks {name}"
    assert "--no-position-correction" in options and "--no-center-probe" in options


@pytest.mark.parametrize("flow", FLOWS)
def test_the_shipped_flow_schemas_hold_the_parameters_the_model_derives(flow):
    shipped = flows.load_schema(flow)["properties"]["reconstruction"]
    assert shipped == flow_parameters_schema(), (
        f"flows/{flow}.schema.json: its 'reconstruction' part is not the model's; replace it "
        "with the output of `python -m beamflow.job.models`")


def test_the_limits_are_the_engines_everywhere():
    import jsonschema

    schema = flow_parameters_schema()
    options = _reconstruct_options()
    for name, field in ReconParams.model_fields.items():
        if name not in ENGINE_SETTINGS:
            continue
        for limit in field.metadata:
            for key, option_key in (("ge", "min"), ("le", "max")):
                if hasattr(limit, key):
                    bound = getattr(limit, key)
                    assert schema["properties"][name]["minimum" if key == "ge" else "maximum"] \
                        == bound
                    assert getattr(options["--" + name.replace("_", "-")], option_key) == bound
    # probe modes: 64 accepted by all, 65 by none (it was 16 in the config before)
    for value, ok in ((64, True), (65, False)):
        body = {"algorithm": "rpie", "iterations": 1, "probe_modes": value}
        assert jsonschema.Draft7Validator(schema).is_valid(body) == ok
        for model in (Reconstruction, RunParameters, ReconParams):
            if ok:
                model(probe_modes=value)
            else:
                with pytest.raises(ValidationError):
                    model(probe_modes=value)


def test_the_config_section_takes_every_setting_and_the_engines_checks(tmp_path: Path):
    lines = [f"{k} = {json.dumps(v)}" for k, v in CHANGED.items()]
    path = tmp_path / "beamflow.toml"
    path.write_text("[reconstruction]\n" + "\n".join(lines) + "\n")
    section = load_config(path).reconstruction
    assert section.engine_settings() == CHANGED

    path.write_text('[reconstruction]\nalgorithm = "rpie"\nalpha = 1.5\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(path) in str(exc.value)
    assert ("reconstruction: alpha=1.5 is out of range for algorithm 'rpie': expected 0.0 < "
            "alpha <= 1.0") in str(exc.value)
    assert "Value error" not in str(exc.value) and "'batch_size'" not in str(exc.value)

    path.write_text("[reconstruction]\nbatch = 8\n")  # the old name of batch_size
    assert load_config(path).reconstruction.batch_size == 8


def test_a_job_takes_every_setting_flat(tmp_path: Path):
    job = ReconstructJob(scan=tmp_path / "s.h5", out=tmp_path / "o", **CHANGED)
    assert job.params.model_dump(include=set(ENGINE_SETTINGS)) == CHANGED
    assert ReconstructJob(scan=tmp_path / "s.h5", out=tmp_path / "o", batch=3).params \
        .batch_size == 3


@pytest.fixture
def captured(monkeypatch) -> dict[str, ReconstructJob]:
    """The job `beamflow reconstruct` and the compute function would run."""
    import beamflow.job.run

    seen: dict[str, ReconstructJob] = {}

    def capture(job, progress=None):
        seen["job"] = job
        raise RuntimeError("captured")

    monkeypatch.setattr(beamflow.job.run, "run_reconstruction", capture)
    return seen


def _cli(tmp_path: Path, config: str, *options: str) -> ReconParams:
    from typer.testing import CliRunner

    path = tmp_path / "beamflow.toml"
    path.write_text(config)
    result = CliRunner().invoke(app, ["reconstruct", str(tmp_path / "scan.h5"), "--out",
                                      str(tmp_path / "out"), "--config", str(path), *options])
    assert result.exception is not None and "captured" in str(result.exception), result.output
    return result


def test_the_cli_takes_the_config_and_its_options_override_it(tmp_path, captured):
    lines = [f"{k} = {json.dumps(v)}" for k, v in CHANGED.items()]
    _cli(tmp_path, "[reconstruction]\n" + "\n".join(lines) + "\n")
    assert captured["job"].params.model_dump(include=set(ENGINE_SETTINGS)) == CHANGED

    _cli(tmp_path, "[reconstruction]\n" + "\n".join(lines) + "\n",
         "--algorithm", "rpie", "--noise-model", "gaussian", "--alpha", "0.3", "--beta", "0.4",
         "--no-position-correction", "--no-center-probe", "--batch-selection", "random",
         "--batch-size", "6", "--probe-update-start", "2", "--object-update-start", "5",
         "--orthogonalize-every", "3", "--position-correction-start", "9",
         "--position-step-limit-px", "0.25", "--probe-modes", "3", "--iterations", "4",
         "--seed", "2", "--momentum", "0.7", "--probe-momentum", "0.3", "--momentum-every",
         "2", "--opr-modes", "3", "--opr-weight-smoothing", "0.1", "--slices", "3",
         "--slice-spacing", "1e-4,2e-4", "--layer-regularization", "0.1")
    assert captured["job"].params.model_dump(include=set(ENGINE_SETTINGS)) == {
        "algorithm": "rpie", "iterations": 4, "batch_size": 6, "batch_selection": "random",
        "probe_modes": 3, "alpha": 0.3, "beta": 0.4, "probe_update_start": 2,
        "object_update_start": 5, "position_correction": False,
        "position_correction_start": 9, "position_step_limit_px": 0.25,
        "noise_model": "gaussian", "orthogonalize_every": 3, "center_probe": False, "seed": 2,
        "momentum": 0.7, "probe_momentum": 0.3, "momentum_every": 2, "opr_modes": 3,
        "opr_weight_smoothing": 0.1, "slices": 3, "slice_spacing_m": [1e-4, 2e-4],
        "layer_regularization": 0.1}


def test_the_cli_refuses_what_the_engine_refuses(tmp_path):
    from typer.testing import CliRunner

    path = tmp_path / "beamflow.toml"
    path.write_text("")
    runner = CliRunner()
    base = ["reconstruct", str(tmp_path / "s.h5"), "--out", str(tmp_path / "o"), "--config",
            str(path)]
    result = runner.invoke(app, [*base, "--alpha", "1.5"])
    assert result.exit_code == 2
    assert ("invalid reconstruction settings: alpha=1.5 is out of range for algorithm "
            "'rpie': expected 0.0 < alpha <= 1.0") in " ".join(result.output.split())
    result = runner.invoke(app, [*base, "--noise-model", "poisson"])
    assert result.exit_code == 2 and "only implemented by algorithm 'lsqml'" in result.output
    result = runner.invoke(app, [*base, "--probe-modes", "65"])
    assert result.exit_code == 2 and "--probe-modes" in result.output


def test_the_compute_function_passes_every_setting_to_the_job(tmp_path, captured):
    from functions.reconstruct import reconstruct

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "s_master.h5").write_bytes(b"")
    with pytest.raises(RuntimeError, match="captured"):
        reconstruct(scan_path=str(tmp_path / "raw" / "s_master.h5"), output_dir=str(tmp_path / "o"),
                    allowed_roots=[str(tmp_path)], parameters={**CHANGED, "device": "cpu"})
    assert captured["job"].params.model_dump(include=set(ENGINE_SETTINGS)) == CHANGED


def test_the_run_parameters_of_a_flow_run_carry_every_setting():
    import jsonschema

    from beamflow.config import Settings
    from beamflow.runs.request import reconstruction_params

    body = RunParameters(**CHANGED).model_dump()
    assert jsonschema.Draft7Validator(flow_parameters_schema()).is_valid(body)
    asked = reconstruction_params(Settings(), {"alpha": 0.2, "position_correction": True})
    assert asked["alpha"] == 0.2 and asked["position_correction"] is True


def test_settings_used_resolve_the_algorithms_defaults():
    used = settings_used(ReconParams(algorithm="rpie"), n_positions=200)
    assert used["alpha"] == 0.1 and used["beta"] == 0.1
    assert used["batch_size"] == 32  # a power of two near 200/8
    assert used["center_probe"] is False
    assert set(used) == set(ENGINE_SETTINGS)


def test_the_run_page_lists_the_parameters_and_what_the_engine_used():
    run = Run(id="r1", scan_name="s", scan_path="/d/s", flow="f", backend="local",
              status="SUCCEEDED", created_at=0.0, updated_at=0.0,
              parameters={"alpha": None, "iterations": 5},
              result={"summary": {"parameters": {"alpha": 0.1, "iterations": 5,
                                                 "batch_size": 8}}})
    rows = dict(parameters_of(run))
    assert rows["alpha"] == "null → 0.1 used"
    assert rows["iterations"] == "5"
    assert rows["batch_size"] == "– → 8 used"


def test_the_run_page_leaves_out_settings_that_do_nothing_for_the_run():
    def rows_of(**settings: Any) -> dict[str, str]:
        used = settings_used(ReconParams(**settings), n_positions=100)
        run = Run(id="r1", scan_name="s", scan_path="/d/s", flow="f", backend="local",
                  status="SUCCEEDED", created_at=0.0, updated_at=0.0, parameters=settings,
                  result={"summary": {"parameters": used}})
        return dict(parameters_of(run))

    rpie = rows_of(algorithm="rpie")
    assert "momentum" not in rpie and "opr_weight_smoothing" not in rpie
    assert "noise_model" not in rpie and "position_step_limit_px" not in rpie
    assert "alpha" in rpie and "opr_modes" in rpie and "position_correction" in rpie
    mpie = rows_of(algorithm="mpie", opr_modes=3, position_correction=True, probe_modes=2)
    for name in ("momentum", "probe_momentum", "momentum_every", "opr_weight_smoothing",
                 "position_step_limit_px", "orthogonalize_every"):
        assert name in mpie, name
    assert "noise_model" in rows_of(algorithm="lsqml")


def test_a_run_with_settings_from_the_config_applies_and_records_them(tmp_path: Path):
    import numpy as np

    from beamflow.formats import read_product
    from beamflow.job.run import run_reconstruction
    from beamflow.simulate import simulate_scan

    master = simulate_scan(tmp_path / "det", "s", positions=30, probe_size=32, photons=2e5,
                           seed=4, frames_per_file=30)
    path = tmp_path / "beamflow.toml"
    path.write_text('[reconstruction]\nalgorithm = "lsqml"\nnoise_model = "poisson"\n'
                    "position_correction = true\nposition_correction_start = 1\n"
                    "iterations = 4\nbeta = 0.5\n")
    section = load_config(path).reconstruction
    job = ReconstructJob(scan=master, out=tmp_path / "out", device="cpu", threads=1,
                         preview_every=0, checkpoint_every=0, **section.engine_settings())
    summary = run_reconstruction(job)
    used = summary.parameters
    assert (used["algorithm"], used["noise_model"], used["position_correction"]) == (
        "lsqml", "poisson", True)
    assert used["alpha"] == 0.1 and used["beta"] == 0.5  # lsqml's alpha; beta as given
    product = read_product(tmp_path / "out" / "product.h5")
    assert "noise_model=poisson" in product.comments
    assert "position_correction=True" in product.comments
    # position correction moved the positions away from the scan file's
    scan_x = np.sort(product.probe_position_x_m)
    from beamflow.formats import load_scan

    nominal = np.sort(load_scan(master).positions_m[:, 1])
    assert not np.allclose(scan_x - scan_x.mean(), nominal - nominal.mean(), atol=1e-12)
