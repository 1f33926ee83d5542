"""Configuration: complete workspace file, env overrides, clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from beamflow.config import (
    ConfigError,
    Settings,
    find_config,
    globus_workspace_toml,
    load_config,
    local_workspace_toml,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "beamflow.toml"
    path.write_text(text)
    return path


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
    assert str(path) in message and "agent.quiet_secs" in message and "spelling" in message


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
