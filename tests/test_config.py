"""Configuration: complete workspace file, env overrides, clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from beamflow.config import ConfigError, Settings, find_config, load_config
from beamflow.workspace_toml import globus_workspace_toml, local_workspace_toml


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "beamflow.toml"
    path.write_text(text)
    return path


def refusal_of_a_workspace(tmp_path: Path) -> str:
    """What loading a new local workspace's beamflow.toml is refused with (the environment
    set by the test is to blame)."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, local_workspace_toml()))
    return str(info.value)


def test_local_workspace_file_loads_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    settings = load_config(write(tmp_path, local_workspace_toml()))
    assert settings.backend == "local"
    assert settings.beamline.detector_dir == tmp_path / "beamline" / "detector"
    assert settings.store_path == tmp_path / "state" / "runs.sqlite"
    assert settings.beamline.collection_id and settings.hpc.collection_id
    assert settings.beamline.collection_id != settings.hpc.collection_id
    assert settings.status.host == "127.0.0.1"


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, local_workspace_toml())
    monkeypatch.setenv("BEAMFLOW_STATUS__PORT", "9100")
    monkeypatch.setenv("BEAMFLOW_RECONSTRUCTION__ALGORITHM", "lsqml")
    settings = load_config(path)
    assert settings.status.port == 9100
    assert settings.reconstruction.algorithm == "lsqml"
    assert settings.reconstruction.iterations == 100  # the rest of the section stays


def test_unknown_key_names_the_key_and_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\nquiet_secs = 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message == (
        f"{path}: agent.quiet_secs: unknown key (did you mean agent.quiet_seconds?); remove it "
        "or check the spelling (see `beamflow init` for a complete file)"
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("backend = 'cloud'\n", "backend"),
        ("[status]\nport = 70000\n", "status.port"),
        ("[reconstruction]\nalgorithm = 'magic'\n", "reconstruction.algorithm"),
        ("[agent]\nprogressive = [0.5, 1.5]\n", "agent.progressive"),
        ("[compute]\nworkers = 0\n", "compute.workers"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[agent]\nquiet_seconds = inf\n", "agent.quiet_seconds: Input should be a finite number"),
        ("[agent]\nstall_timeout = nan\n", "agent.stall_timeout: Input should be a finite"),
        ("[reconstruction]\niterations = 1e13\n", "reconstruction.iterations: Input should"),
        ("[agent]\nmax_concurrent_runs = 100000\n", "agent.max_concurrent_runs"),
        ("[compute]\npickup_timeout = -1\n", "compute.pickup_timeout"),
    ],
)
def test_values_out_of_bounds_are_refused_at_load_in_one_line(
    tmp_path: Path, text: str, key: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}") and "\n" not in message


def test_a_binary_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "beamflow.toml"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: not a text file (byte 128 is not UTF-8): a beamflow.toml is TOML text "
        "(create one with `beamflow init`)"
    )


def test_a_variable_that_is_not_json_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BEAMFLOW_AGENT__PROGRESSIVE", "notjson")
    message = refusal_of_a_workspace(tmp_path)
    assert message.startswith("BEAMFLOW_AGENT__PROGRESSIVE: agent.progressive takes JSON here")
    assert "[0.25, 0.5]" in message and "'notjson'" in message and "\n" not in message
    monkeypatch.setenv("BEAMFLOW_AGENT__PROGRESSIVE", "[0.5]")
    assert load_config(write(tmp_path, local_workspace_toml())).agent.progressive == [0.5]


def test_unknown_variables_are_flagged_with_the_closest_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, local_workspace_toml())
    monkeypatch.setenv("BEAMFLOW_AGENT__QUIET_SECOND", "1")
    monkeypatch.setenv("BEAMFLOW_STATSU__PORT", "9000")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        "BEAMFLOW_AGENT__QUIET_SECOND: not a beamflow setting (did you mean "
        "BEAMFLOW_AGENT__QUIET_SECONDS?); unset it",
        "BEAMFLOW_STATSU__PORT: not a beamflow setting (did you mean BEAMFLOW_STATUS__PORT?); "
        "unset it",
    ]
    # Variables beamflow sets for itself are not settings, and not errors.
    monkeypatch.delenv("BEAMFLOW_AGENT__QUIET_SECOND")
    monkeypatch.delenv("BEAMFLOW_STATSU__PORT")
    monkeypatch.setenv("BEAMFLOW_COMPUTE_ENGINE", str(tmp_path))
    monkeypatch.setenv("BEAMFLOW_CHECKPOINT_L1_DIR", str(tmp_path))
    assert load_config(path).backend == "local"


def test_a_bad_value_from_a_variable_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BEAMFLOW_STATUS__PORT", "0")
    assert refusal_of_a_workspace(tmp_path).startswith(
        "BEAMFLOW_STATUS__PORT: status.port: Input should be")


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "backend = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        find_config(tmp_path / "nope.toml")


def test_globus_template_is_valid_toml_with_ids_to_fill(tmp_path: Path) -> None:
    text = globus_workspace_toml()
    assert text.count("FILL") >= 4
    settings = load_config(write(tmp_path, text))
    assert settings.backend == "globus"
    assert settings.agent.progressive == [0.25, 0.5]


def test_defaults_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = load_config()
    assert isinstance(settings, Settings) and settings.source is None
    assert settings.state_dir == tmp_path / "state"
