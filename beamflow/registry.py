"""Content-hash registration of compute functions and flows, shared by every backend.

Registration must be safe to repeat (users re-run ``beamflow register`` after every upgrade),
so what decides is a checksum of the content, not whether someone ran the command before:

- a function's checksum is SHA-256 over the source text of ``functions/NAME.py`` and the
  beamflow version (a new release re-registers, since the body imports beamflow);
- a flow's checksum is SHA-256 over the sorted-keys JSON of its definition and input schema.

The registry file (``settings.registry_path``, JSON, written atomically under a lock) keeps
the id and the checksum of every item per backend, because the ids of the local backend and
of Globus differ::

    {"version": 1,
     "backends": {"local":  {"function": {"reconstruct": {"id", "checksum", "registered_at"}},
                             "flow":     {"ptycho_reconstruct": {...}}},
                  "globus": {...}}}

A backend registers by handing :meth:`Registry.ensure` (or :func:`register_functions` /
:func:`register_flows`) its own callables; the registry decides what to call and records the
result::

    registry = Registry(settings.registry_path, "globus")
    results = register_flows(
        registry,
        create=lambda name: flows_client.create_flow(...)["id"],
        update=lambda name, flow_id: flows_client.update_flow(flow_id, ...) and flow_id,
        exists=lambda flow_id: flow_still_on_the_service(flow_id),   # optional
        dry_run=False,
    )

``update`` may return a new id (Globus Compute gives a re-registered function a new id), the
same id, or None (keep the old one); it may raise :class:`GoneOnService` when the service
says the item was deleted, and the item is created again. ``exists`` (optional) is asked
before anything is decided, so an item deleted on the service is recreated even when its
content did not change.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from beamflow import __version__
from beamflow.atomic import atomic_write_json

# A timer (Globus Timers) runs a registered flow on a schedule: the retention flow's.
Kind = Literal["function", "flow", "timer"]
Action = Literal["created", "updated", "unchanged"]


class RegistrationResult(BaseModel):
    """What `register` did (or would do, with --dry-run) for one function or flow."""

    kind: Kind
    name: str
    action: Action
    id: str | None = None
    checksum: str
    # Who may do what with it, where the backend has roles (Globus Flows), by role name.
    roles: dict[str, list[str]] = Field(default_factory=dict)


KINDS: tuple[Kind, ...] = ("function", "flow", "timer")
REGISTRY_VERSION = 1

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RegistryError(Exception):
    """The registry file cannot be read or written, or a name is unknown; says which."""


class GoneOnService(Exception):
    """Raised by an ``update`` callable when the service no longer has the item."""


class Entry(BaseModel):
    id: str
    checksum: str
    registered_at: float


# -- what there is to register -------------------------------------------------------------
def function_names() -> list[str]:
    """Functions shipped in the ``functions`` package: ``functions/NAME.py`` defining ``NAME``."""
    names = []
    for entry in resources.files("functions").iterdir():
        stem = entry.name[:-3] if entry.name.endswith(".py") else ""
        if stem and not stem.startswith("_") and _NAME.match(stem):
            names.append(stem)
    return sorted(names)


def function_source(name: str) -> str:
    """The source text of ``functions/NAME.py``."""
    if not _NAME.match(name or ""):
        raise RegistryError(f"{name!r} is not a function name")
    entry = resources.files("functions") / f"{name}.py"
    if not entry.is_file():
        raise RegistryError(
            f"no function {name!r}: functions/{name}.py does not exist "
            f"(known: {', '.join(function_names())})"
        )
    return entry.read_text(encoding="utf-8")


def load_function(name: str) -> Callable[..., Any]:
    """The callable ``NAME`` from ``functions/NAME.py``."""
    import importlib

    function_source(name)  # a clear error for an unknown name
    module = importlib.import_module(f"functions.{name}")
    func = getattr(module, name, None)
    if not callable(func):
        raise RegistryError(f"functions/{name}.py must define a function named {name!r}")
    return func


def function_checksum(name: str) -> str:
    """SHA-256 of the function's source text and the beamflow version."""
    digest = hashlib.sha256()
    digest.update(function_source(name).encode("utf-8"))
    digest.update(b"\0beamflow ")
    digest.update(__version__.encode("utf-8"))
    return digest.hexdigest()


def flow_checksum(name: str) -> str:
    """SHA-256 of the sorted-keys JSON of the flow's definition and input schema."""
    import flows

    return content_checksum(flows.load_definition(name), flows.load_schema(name))


def content_checksum(definition: dict[str, Any], schema: dict[str, Any] | None) -> str:
    """The flow checksum of a definition and schema given as values."""
    text = json.dumps(
        {"definition": definition, "input_schema": schema},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def flow_names() -> list[str]:
    import flows

    return flows.flow_names()


# -- the registry file ---------------------------------------------------------------------
class Registry:
    """Ids and checksums of registered items for one backend, in ``path``."""

    def __init__(self, path: Path | str, backend_name: str) -> None:
        if not backend_name:
            raise RegistryError("a registry needs a backend name (e.g. 'local', 'globus')")
        self.path = Path(path)
        self.backend = backend_name

    # -- reading -------------------------------------------------------------------------
    def _load(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": REGISTRY_VERSION, "backends": {}}
        except OSError as exc:
            raise RegistryError(f"{self.path}: cannot read the registry: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RegistryError(
                f"{self.path}: not valid JSON ({exc}); move it aside and run "
                "`beamflow register functions` and `beamflow register flows` again"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("backends", {}), dict):
            raise RegistryError(f"{self.path}: not a beamflow registry (no 'backends' object)")
        if data.get("version", REGISTRY_VERSION) > REGISTRY_VERSION:
            raise RegistryError(
                f"{self.path}: registry version {data['version']} is newer than this beamflow "
                f"understands ({REGISTRY_VERSION}); upgrade beamflow"
            )
        data.setdefault("backends", {})
        data["version"] = REGISTRY_VERSION
        return data

    def _section(self, data: dict[str, Any], kind: Kind) -> dict[str, Any]:
        _check_kind(kind)
        backend = data["backends"].setdefault(self.backend, {})
        return backend.setdefault(kind, {})

    def get(self, kind: Kind, name: str) -> Entry | None:
        """The recorded id and checksum of ``name``, or None if it was never registered."""
        raw = self._section(self._load(), kind).get(name)
        if raw is None:
            return None
        try:
            return Entry.model_validate(raw)
        except ValidationError:
            return None  # a damaged entry is treated as absent: it is registered again

    def entries(self, kind: Kind) -> dict[str, Entry]:
        out = {}
        for name, raw in self._section(self._load(), kind).items():
            with contextlib.suppress(ValidationError):
                out[name] = Entry.model_validate(raw)
        return out

    def id_of(self, kind: Kind, name: str) -> str | None:
        entry = self.get(kind, name)
        return entry.id if entry else None

    def require_id(self, kind: Kind, name: str) -> str:
        """The id of a registered item, or an error that says how to register it."""
        entry = self.get(kind, name)
        if entry is None:
            raise RegistryError(
                f"{kind} {name!r} is not registered for the {self.backend} backend: "
                f"run `beamflow register {kind}s` (registry: {self.path})"
            )
        return entry.id

    def name_of(self, kind: Kind, item_id: str) -> str | None:
        """The name registered under ``item_id`` (e.g. a function id from a flow's input)."""
        for name, entry in self.entries(kind).items():
            if entry.id == item_id:
                return name
        return None

    def decide(self, kind: Kind, name: str, checksum: str) -> Action:
        """What registering ``name`` with content ``checksum`` would do."""
        entry = self.get(kind, name)
        if entry is None:
            return "created"
        return "unchanged" if entry.checksum == checksum else "updated"

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under an exclusive lock, then an atomic replace of the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                data = self._load()
                yield data
                atomic_write_json(self.path, data)
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def record(self, kind: Kind, name: str, item_id: str, checksum: str) -> Entry:
        entry = Entry(id=item_id, checksum=checksum, registered_at=time.time())
        with self._locked() as data:
            self._section(data, kind)[name] = entry.model_dump()
        return entry

    def forget(self, kind: Kind, name: str) -> bool:
        """Drop ``name``'s entry; True if there was one."""
        with self._locked() as data:
            return self._section(data, kind).pop(name, None) is not None

    # -- the whole decision --------------------------------------------------------------
    def ensure(
        self,
        kind: Kind,
        name: str,
        checksum: str,
        *,
        create: Callable[[str], str],
        update: Callable[[str, str], str | None] | None = None,
        exists: Callable[[str], bool] | None = None,
        dry_run: bool = False,
    ) -> RegistrationResult:
        """Register ``name`` if its content changed (or it is new, or gone on the service).

        ``create(name) -> id``; ``update(name, old_id) -> new id | None`` (None keeps the id;
        without ``update`` a changed item is created anew); ``exists(id) -> bool``.
        """
        entry = self.get(kind, name)
        if entry is not None and exists is not None and not exists(entry.id):
            entry = None  # deleted on the service: create it again
        if entry is None:
            action: Action = "created"
        elif entry.checksum == checksum:
            return RegistrationResult(
                kind=kind, name=name, action="unchanged", id=entry.id, checksum=checksum
            )
        else:
            action = "updated"
        if dry_run:
            return RegistrationResult(
                kind=kind,
                name=name,
                action=action,
                id=entry.id if entry else None,
                checksum=checksum,
            )
        if entry is None or update is None:
            new_id = create(name)
        else:
            try:
                new_id = update(name, entry.id) or entry.id
            except GoneOnService:
                action = "created"
                new_id = create(name)
        if not isinstance(new_id, str) or not new_id:
            raise RegistryError(f"registering {kind} {name!r} returned no id ({new_id!r})")
        self.record(kind, name, new_id, checksum)
        return RegistrationResult(kind=kind, name=name, action=action, id=new_id, checksum=checksum)


def register_shipped(
    registry: Registry,
    kind: str,
    *,
    create: Callable[[str], str],
    update: Callable[[str, str], str | None] | None = None,
    exists: Callable[[str], bool] | None = None,
    dry_run: bool = False,
    names: Iterable[str] | None = None,
    checksum: Callable[[str], str] | None = None,
) -> list[RegistrationResult]:
    """:meth:`Registry.ensure` for every shipped function or flow (``kind``), or ``names``;
    ``checksum(name)`` replaces the content checksum where more decides (a flow's roles)."""
    _check_kind(kind)
    content, shipped = (
        (function_checksum, function_names) if kind == "function" else (flow_checksum, flow_names)
    )
    checksum = checksum or content
    return [
        registry.ensure(
            kind, name, checksum(name), create=create, update=update, exists=exists,
            dry_run=dry_run,
        )
        for name in (list(names) if names is not None else shipped())
    ]


def register_functions(registry: Registry, **kwargs: Any) -> list[RegistrationResult]:
    """:func:`register_shipped` for the functions in ``functions/``."""
    return register_shipped(registry, "function", **kwargs)


def register_flows(registry: Registry, **kwargs: Any) -> list[RegistrationResult]:
    """:func:`register_shipped` for the flows in ``flows/``."""
    return register_shipped(registry, "flow", **kwargs)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise RegistryError(f"kind must be one of {KINDS}, not {kind!r}")
