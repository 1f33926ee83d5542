"""Registration is safe to repeat: content checksums decide create / update / unchanged."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import flows
from beamflow import registry as reg
from beamflow.cli import app
from beamflow.workspace_toml import local_workspace_toml


class FakeService:
    """Records what the registry asked the backend to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.deleted: set[str] = set()
        self.counter = 0

    def create(self, name: str) -> str:
        self.counter += 1
        self.calls.append(("create", name))
        return f"id-{name}-{self.counter}"

    def update(self, name: str, item_id: str) -> str | None:
        self.calls.append(("update", name, item_id))
        if item_id in self.deleted:
            raise reg.GoneOnService(item_id)
        return None  # keeps the id

    def exists(self, item_id: str) -> bool:
        return item_id not in self.deleted


def register(r: reg.Registry, svc: FakeService, **kwargs: Any) -> dict[str, tuple[str, str]]:
    results = reg.register_flows(
        r, create=svc.create, update=svc.update, exists=svc.exists, **kwargs
    )
    return {x.name: (x.action, x.id) for x in results}


def test_twice_is_unchanged_and_calls_nothing(tmp_path: Path) -> None:
    r, svc = reg.Registry(tmp_path / "registry.json", "local"), FakeService()
    first = register(r, svc)
    assert {a for a, _ in first.values()} == {"created"}
    assert set(first) == set(flows.flow_names())
    calls = len(svc.calls)
    second = register(r, svc)
    assert second == {name: ("unchanged", item_id) for name, (_, item_id) in first.items()}
    assert len(svc.calls) == calls


def test_a_changed_flow_is_updated_keeping_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, svc = reg.Registry(tmp_path / "registry.json", "local"), FakeService()
    first = register(r, svc)
    original = flows.load_definition

    def edited(name: str) -> dict[str, Any]:
        definition = original(name)
        if name == "ptycho_reconstruct":
            definition["Comment"] += " (edited)"
        return definition

    monkeypatch.setattr(flows, "load_definition", edited)
    second = register(r, svc)
    assert second["ptycho_reconstruct"] == ("updated", first["ptycho_reconstruct"][1])
    assert second["ptycho_shared_fs"][0] == "unchanged"
    assert r.get("flow", "ptycho_reconstruct").checksum == reg.flow_checksum("ptycho_reconstruct")
    assert register(r, svc)["ptycho_reconstruct"][0] == "unchanged"


def test_a_changed_schema_changes_the_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    before = reg.flow_checksum("ptycho_reconstruct")
    original = flows.load_schema
    monkeypatch.setattr(
        flows, "load_schema", lambda name: {**original(name), "title": "something else"}
    )
    assert reg.flow_checksum("ptycho_reconstruct") != before


def test_a_deleted_registry_entry_is_created_again(tmp_path: Path) -> None:
    r, svc = reg.Registry(tmp_path / "registry.json", "local"), FakeService()
    first = register(r, svc)
    assert r.forget("flow", "ptycho_shared_fs")
    again = register(r, svc)
    assert again["ptycho_shared_fs"][0] == "created"
    assert again["ptycho_shared_fs"][1] != first["ptycho_shared_fs"][1]
    assert again["ptycho_reconstruct"][0] == "unchanged"


def test_an_item_deleted_on_the_service_is_recreated(tmp_path: Path) -> None:
    r, svc = reg.Registry(tmp_path / "registry.json", "globus"), FakeService()
    first = register(r, svc)
    svc.deleted.add(first["ptycho_reconstruct"][1])
    again = register(r, svc)
    assert again["ptycho_reconstruct"][0] == "created"
    assert again["ptycho_reconstruct"][1] != first["ptycho_reconstruct"][1]


def test_gone_during_update_recreates(tmp_path: Path) -> None:
    r, svc = reg.Registry(tmp_path / "registry.json", "globus"), FakeService()
    r.record("flow", "ptycho_reconstruct", "old-id", "stale-checksum")
    svc.deleted.add("old-id")
    result = r.ensure(
        "flow",
        "ptycho_reconstruct",
        "new-checksum",
        create=svc.create,
        update=svc.update,  # no exists(): the update finds out
    )
    assert result.action == "created"
    assert ("update", "ptycho_reconstruct", "old-id") in svc.calls
    assert r.id_of("flow", "ptycho_reconstruct") == result.id != "old-id"


def test_update_may_return_a_new_id(tmp_path: Path) -> None:
    r = reg.Registry(tmp_path / "registry.json", "globus")
    r.record("function", "reconstruct", "fn-1", "old")
    result = r.ensure(
        "function", "reconstruct", "new", create=lambda n: "x", update=lambda n, i: "fn-2"
    )
    assert (result.action, result.id) == ("updated", "fn-2")
    assert r.name_of("function", "fn-2") == "reconstruct"


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    r, svc = reg.Registry(path, "local"), FakeService()
    results = register(r, svc, dry_run=True)
    assert {a for a, _ in results.values()} == {"created"}
    assert svc.calls == []
    assert not path.exists()


def test_backends_have_separate_ids(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    local, globus = reg.Registry(path, "local"), reg.Registry(path, "globus")
    local.record("function", "reconstruct", "local-id", "c")
    assert globus.get("function", "reconstruct") is None
    assert globus.decide("function", "reconstruct", "c") == "created"
    assert local.decide("function", "reconstruct", "c") == "unchanged"
    data = json.loads(path.read_text())
    assert data["backends"]["local"]["function"]["reconstruct"]["id"] == "local-id"


def test_function_checksum_covers_source_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    assert reg.function_names() == ["cleanup", "reconstruct"]
    before = reg.function_checksum("reconstruct")
    assert before == reg.function_checksum("reconstruct")
    monkeypatch.setattr(reg, "__version__", "99.0")
    assert reg.function_checksum("reconstruct") != before
    monkeypatch.setattr(reg, "function_source", lambda name: "def reconstruct(): pass\n")
    assert reg.function_checksum("reconstruct") not in (before,)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"

    def write(i: int) -> None:
        reg.Registry(path, "local").record("flow", f"flow{i}", f"id{i}", "c")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reg.Registry(path, "local").entries("flow")) == 16


def test_a_damaged_registry_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    path.write_text("{not json")
    with pytest.raises(reg.RegistryError, match="registry.json: not valid JSON"):
        reg.Registry(path, "local").get("flow", "x")


def test_unregistered_items_say_how_to_register(tmp_path: Path) -> None:
    r = reg.Registry(tmp_path / "registry.json", "local")
    with pytest.raises(reg.RegistryError, match="beamflow register functions"):
        r.require_id("function", "reconstruct")


def test_cli_register_twice_reports_unchanged(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    config = tmp_path / "beamflow.toml"
    config.write_text(local_workspace_toml())
    runner = CliRunner()
    lines = {}
    for attempt in range(2):
        out = []
        for kind in ("functions", "flows"):
            result = runner.invoke(app, ["register", kind, "--config", str(config)])
            assert result.exit_code == 0, result.output
            out += result.stdout.splitlines()
        lines[attempt] = out
    shipped = [*reg.function_names(), *flows.flow_names()]
    assert [line.split()[0] for line in lines[0]] == ["created"] * len(shipped)
    assert lines[1] == [line.replace("created", "unchanged", 1) for line in lines[0]]
    names = {line.split()[1] for line in lines[0]}
    assert names == set(shipped)
    dry = runner.invoke(app, ["register", "flows", "--dry-run", "--config", str(config)])
    assert dry.exit_code == 0 and all(
        line.startswith("unchanged") for line in dry.stdout.splitlines()
    )
