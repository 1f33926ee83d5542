"""The one configuration model: ``beamflow.toml`` plus ``BEAMFLOW_*`` environment overrides.

Where the file is looked for (first found wins): the ``--config`` option, ``./beamflow.toml``,
``~/.config/beamflow/beamflow.toml``. Relative paths in the file are relative to the file's own
directory, so a workspace can be moved or opened from anywhere.

Environment variables override the file, with ``__`` between nested keys:
``BEAMFLOW_BACKEND=globus``, ``BEAMFLOW_STATUS__PORT=9000``, ``BEAMFLOW_GLOBUS__CLIENT_SECRET=...``.
A list or a whole section is given as JSON (``BEAMFLOW_AGENT__PROGRESSIVE='[0.25, 0.5]'``).

Bad input is refused at load, one line per problem naming the file or the variable, the key
and the problem: unknown keys and unknown ``BEAMFLOW_*`` variables (with the closest known
name), values out of bounds (no ``inf`` nor ``nan``), a file that is not UTF-8 TOML, a
variable that is not the JSON its key needs.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import tomllib
import types
import typing
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from beamflow.ptycho.state import ReconParams
from beamflow.validation_text import field_path

CONFIG_NAME = "beamflow.toml"
USER_CONFIG = Path("~/.config/beamflow") / CONFIG_NAME


def is_uuid(value: object) -> bool:
    """Whether ``value`` spells a UUID (Globus collection, endpoint, client and flow ids)."""
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, the key and the fix."""


class _Section(BaseModel):
    # No section takes inf or nan: "quiet_seconds = inf" would wait for ever, silently.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Beamline(_Section):
    """The beamline side: where the detector writes and where results come back."""

    collection_id: str = Field(
        default="", description="Globus collection (or local collection id) of the beamline"
    )
    collection_root: Path = Field(
        default=Path("beamline"), description="local path that the collection's '/' maps to"
    )
    detector_dir: Path = Field(
        default=Path("beamline/detector"), description="directory the edge agent watches"
    )
    preview_dir: Path = Field(
        default=Path("beamline/previews"), description="where previews and products arrive"
    )


class HPC(_Section):
    """The cluster side: where raw data lands and the compute function writes results."""

    collection_id: str = ""
    collection_root: Path = Path("hpc")
    scratch_dir: Path = Field(
        default=Path("hpc"), description="root the compute function may read and write"
    )
    node_local_dir: Path | None = Field(
        default=None, description="fast node-local directory for L1 checkpoints (optional)"
    )


class Compute(_Section):
    """Where the reconstruct function runs."""

    endpoint_id: str = ""
    workers: int = Field(default=1, ge=1, description="local backend: worker processes")
    engine_config: Path | None = Field(
        default=None,
        description="local backend: a YAML file with an engine section (GlobusComputeEngine "
        "with a LocalProvider), e.g. a rendered user_config_template.yaml.j2, to run compute "
        "on; default: `workers` workers, a GPU each",
    )
    pickup_timeout: float = Field(
        default=60.0, gt=0, le=86400,
        description="local backend: a task no worker took this long restarts the engine",
    )  # fmt: skip
    stall_timeout: float = Field(
        default=600.0, gt=0, le=7 * 86400,
        description="local backend: a task no worker took, or whose worker used no CPU, this "
        "long fails as lost (retried)",
    )  # fmt: skip


# A Globus principal as Flows roles take it: an identity or a group, by URN.
PRINCIPAL_PATTERN = (
    r"^urn:globus:(auth:identity|groups:id):[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"
)
Principal = Annotated[str, Field(pattern=PRINCIPAL_PATTERN)]


def _uuid_or_empty(value: str) -> str:
    if value and not is_uuid(value):
        raise ValueError(f"not a UUID: {value!r}")
    return value


class Globus(_Section):
    """Globus ids; registered function and flow ids live in the state directory, not here.
    The roles: who may start, view and administer the flows, and who may see and cancel the
    runs (principals are ``urn:globus:auth:identity:<id>`` or ``urn:globus:groups:id:<id>``)."""

    client_id: str = Field(default="", description="Globus Auth app (native or confidential)")
    client_secret: SecretStr | None = Field(
        default=None, description="confidential client secret (unattended agent)"
    )
    token_storage: Path | None = Field(
        default=None, description="SQLite token file; default <state_dir>/tokens.db"
    )
    data_access_collections: list[str] | None = Field(
        default=None,
        description="mapped collections that need a data_access consent (default: the "
        "beamline and HPC collections; [] when both are guest collections)",
    )
    agent_client_id: str = Field(
        default="", description="the agent's confidential client: may start the flows "
        "(default: client_id, when a client secret is configured)")
    staff_group: str = Field(
        default="", description="Globus group (UUID) of beamline staff: may start and view "
        "the flows, and see and cancel every run")
    flow_administrators: list[Principal] = Field(
        default_factory=list, description="may edit and delete the flows, besides their owner")
    flow_starters: list[Principal] = Field(
        default_factory=list, description="may start the flows, besides the agent and staff")
    flow_viewers: list[Principal] = Field(
        default_factory=list, description="may see the flows, besides the starters")
    run_managers: list[Principal] = Field(
        default_factory=list, description="may cancel the runs, besides the staff group")
    run_monitors: list[Principal] = Field(
        default_factory=list, description="may see the runs, besides the staff group")

    _ids = field_validator("agent_client_id", "staff_group")(_uuid_or_empty)


#: The engine's settings a user sets, under the engine's own names and limits: every field of
#: ``beamflow.ptycho.state.ReconParams`` but the propagation model, which the job builds from
#: ``propagation`` and ``focus_distance_m`` below. A field added to ReconParams is a key of
#: ``[reconstruction]``, a run parameter (flows, compute function), a ``beamflow
#: reconstruct`` option and a line on the run page, with no other change
#: (docs/reconstruction.md, "Adding a setting").
ENGINE_SETTINGS: tuple[str, ...] = tuple(n for n in ReconParams.model_fields if n != "propagation")

#: Keys that were renamed: old name -> the engine's name (accepted, for old files and runs).
RENAMED_SETTINGS = {"batch": "batch_size"}


def current_names(data: Any) -> Any:
    """Settings given as a mapping, each renamed one under its current name (only an old file
    or run names it, so the old name's value is the one meant); anything else as it is. The
    one rule for :data:`RENAMED_SETTINGS`, for every model that takes the settings."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in RENAMED_SETTINGS.items():
        if old in data:
            data[new] = data.pop(old)
    return data


def _engine_fields() -> dict[str, Any]:
    """The engine's fields (type, default, limits, description), copied from ReconParams."""
    fields = ReconParams.model_fields
    return {name: (fields[name].annotation, copy.copy(fields[name])) for name in ENGINE_SETTINGS}


_EngineSettings = create_model("_EngineSettings", __base__=_Section, **_engine_fields())


#: Why a reconstruction of 0 iterations is refused (config, runs, `beamflow reconstruct`).
NO_ITERATIONS = ("at least 1 iteration: 0 would write the blank starting guess as the product, "
                 "reconstructing nothing")


class Reconstruction(_EngineSettings):  # type: ignore[misc, valid-type]
    """Defaults for reconstructions started by the agent and `runs start`: the engine's
    settings (:data:`ENGINE_SETTINGS`) and the job's."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto picks the GPU the endpoint pinned, else the CPU")
    checkpoint_every: int = Field(
        default=10, ge=0, description="iterations between checkpoints (0: only at the end)")
    preview_every: int = Field(
        default=10, ge=0, description="iterations between preview images (0: only at the end)")
    propagation: Literal["far-field", "near-field"] | None = Field(
        default=None, description="propagation model (None: as the scan file says, else "
        "far-field)")
    focus_distance_m: float | None = Field(
        default=None, gt=0, description="near field, cone beam: focus-to-sample distance z1 "
        "in metres (None: as the scan file says, else a parallel beam)")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return current_names(data)

    @field_validator("iterations")
    @classmethod
    def _some_iterations(cls, value: int) -> int:
        # The engine takes 0 (a state checked as it is); a job of 0 iterations would write
        # the blank starting guess as its product.
        if value < 1:
            raise PydanticCustomError("too_few_iterations", NO_ITERATIONS)
        return value

    @model_validator(mode="after")
    def _engine_accepts(self) -> Reconstruction:
        # The limits that depend on other settings (alpha's range per algorithm, Poisson
        # for lsqml only, ...) are the engine's: ask it.
        ReconParams(**self.engine_settings())
        return self

    def engine_settings(self) -> dict[str, Any]:
        """The engine's settings of this section, by name."""
        return {name: getattr(self, name) for name in ENGINE_SETTINGS}


# The one source of each reconstruction default: whoever builds a reconstruction (CLI,
# compute function, agent, demo, a new workspace's file) and is given no value takes it here.
RECONSTRUCTION_DEFAULTS = Reconstruction()


class Agent(_Section):
    """Edge agent policy."""

    # Upper bounds: a value past them is a typo (or inf), not a policy.
    quiet_seconds: float = Field(
        default=2.0, ge=0, le=3600, description="files unchanged this long")
    stall_timeout: float = Field(
        default=120.0, gt=0, le=7 * 86400, description="a short scan is aborted")
    rescan_seconds: float = Field(
        default=30.0, gt=0, le=86400, description="periodic full rescan")
    observer: Literal["auto", "inotify", "polling"] = "auto"
    max_concurrent_runs: int = Field(default=2, ge=1, le=1024)
    max_retries: int = Field(default=3, ge=0, le=100)
    retry_backoff_seconds: float = Field(default=5.0, ge=0, le=86400)
    no_space_backoff_seconds: float = Field(
        default=300.0, ge=0, le=86400,
        description="a run that filled a disk is retried after this, doubling: time for "
        "someone to free space")
    poll_seconds: float = Field(default=1.0, gt=0, le=3600)
    progressive: list[float] = Field(
        default_factory=list, examples=[[0.25, 0.5]],
        description="fractions of frames at which to start runs, e.g. [0.5]",
    )  # fmt: skip
    flow: str = Field(default="ptycho_reconstruct", description="flow the agent runs per scan")

    @field_validator("progressive")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        if any(not 0 < f < 1 for f in value):
            raise ValueError("fractions must lie strictly between 0 and 1 (1.0 is implied)")
        return sorted(set(value))


OLD_VIEWING_KEY = "require_token_for_viewing"


class Status(_Section):
    """The status page. Bound to loopback, anyone on this machine may view and retry. Bound
    elsewhere, a token is required, and every page, preview, API call and download needs
    it unless ``public_viewing`` is set (then only actions, such as retry, need it)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=1, le=65535)
    token: SecretStr | None = Field(default=None, description="required off loopback")
    public_viewing: bool = Field(
        default=False,
        description="off loopback: anyone who reaches the page may view runs, previews and "
        "products without the token (unpublished data!); actions still need it",
    )
    session_hours: float = Field(
        default=12.0, gt=0, le=24 * 30,
        description="how long a login to the exposed page lasts; logout ends it sooner",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_viewing_key(cls, data: Any) -> Any:
        """The old key ``require_token_for_viewing``: ``true`` is what the default does
        now, so it is accepted; ``false`` meant public viewing, which is now an explicit
        choice: refused, saying what to write instead."""
        if not isinstance(data, dict) or OLD_VIEWING_KEY not in data:
            return data
        data = dict(data)
        old = data.pop(OLD_VIEWING_KEY)
        if str(old).strip().lower() in ("true", "1", "yes", "on"):
            return data
        raise ValueError(
            f"status.{OLD_VIEWING_KEY} is gone: viewing the status page off loopback now "
            "needs the token by default. Remove the key, or, to let anyone who can reach "
            "the page view runs, previews and products without the token, set "
            "status.public_viewing = true (BEAMFLOW_STATUS__PUBLIC_VIEWING=true)"
        )


# Endpoint template variables a run may set: the same patterns as the templates' schemas
# (deploy/compute-endpoint/*/user_config_schema.json), so the endpoint never refuses them.
_SCHEDULER_NAME = r"^[A-Za-z0-9_.+-]{1,64}$"
_WALLTIME = r"^([0-9]{1,2}-)?[0-9]{1,3}:[0-5][0-9]:[0-5][0-9]$"
_ACCOUNT = r"^[a-z_][a-z0-9_.-]{0,31}\$?$"  # a POSIX user name


class RunResources(_Section):
    """Where one kind of run's batch job goes: Globus Compute's ``user_endpoint_config`` of
    the Reconstruct step. Unset keys keep the endpoint template's defaults. Slurm templates
    take ``partition`` and ``qos``, PBS Pro templates ``queue``; both ``account`` and
    ``walltime``."""

    account: str | None = Field(default=None, pattern=_SCHEDULER_NAME)
    partition: str | None = Field(default=None, pattern=_SCHEDULER_NAME)
    qos: str | None = Field(default=None, pattern=_SCHEDULER_NAME)
    queue: str | None = Field(default=None, pattern=_SCHEDULER_NAME)
    walltime: str | None = Field(default=None, pattern=_WALLTIME, description="[D-]HH:MM:SS")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=16, description="GPUs per node (the cluster templates)")

    def endpoint_config(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class Cluster(_Section):
    """The cluster's Compute endpoint as the beamline sees it: per-run resources, and the
    identity mapping `beamflow doctor` checks the agent's client identity against."""

    identity_mapping: Path | None = Field(
        default=None,
        description="a readable copy of the endpoint's identity_mapping.json (doctor checks "
        "that the confidential client's identity is mapped)",
    )
    service_account: str | None = Field(
        default=None, pattern=_ACCOUNT,
        description="the local account the client identity should map to",
    )
    people_domain: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$",
        description="render-endpoint: people <user>@<domain> run as their own account "
        "(unset: only the agent is mapped)",
    )
    worker_env: str | None = Field(
        default=None, pattern=r"^(/|\$HOME/)[A-Za-z0-9_.+/-]{1,4095}$",
        description="render-endpoint: the environment with beamflow that the workers "
        "activate, as the compute nodes see it",
    )
    module_paths: list[Annotated[str, Field(pattern=r"^/[A-Za-z0-9_.+/-]{1,4095}$")]] = Field(
        default_factory=list, description="render-endpoint: `module use` directories")
    modules: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+/-]{1,255}$")]] = Field(
        default_factory=list,
        description="render-endpoint: modules the workers load (a failed load fails the job)")
    endpoint_dir: Path | None = Field(
        default=None, description="a readable copy of the endpoint's files as "
        "`beamflow render-endpoint` wrote them (doctor checks them)")
    preview: RunResources = Field(
        default_factory=RunResources, description="progressive runs (part of a scan)"
    )
    final: RunResources = Field(
        default_factory=RunResources, description="runs of the whole scan"
    )


# Days a kind of file stays, or "never" (kept for ever).
RetentionDays = Annotated[int, Field(ge=1, le=3650)] | Literal["never"]


class Retention(_Section):
    """How long each kind of file stays once its scan's runs have ended. The agent applies
    it every ``every_hours`` (the local backend), a Globus Timer does on Globus; `beamflow
    cleanup` applies it now. Products and run records always stay."""

    raw_days: RetentionDays = Field(
        default=7, description="cluster copies of raw frames (hpc.scratch_dir/<scan>/raw/) of "
        "scans untouched this long")
    checkpoint_days: RetentionDays = Field(
        default=14, description="checkpoints (hpc.scratch_dir/<scan>/checkpoints/) of scans "
        "untouched this long; a later run of such a scan starts from iteration 0")
    preview_days: RetentionDays = Field(
        default="never", description="beamline previews (preview_dir/<run>/previews/) of runs "
        "finished this long ago; the product stays")
    every_hours: float = Field(default=24.0, gt=0, le=24 * 30,
                               description="how often retention is applied")

    def days(self, older_than: float | None = None) -> dict[str, float | None]:
        """Days per kind (None: kept for ever); ``older_than`` replaces every number."""
        out: dict[str, float | None] = {}
        for kind, value in (("raw", self.raw_days), ("checkpoints", self.checkpoint_days),
                            ("previews", self.preview_days)):  # fmt: skip
            out[kind] = None if value == "never" else (
                float(value) if older_than is None else older_than)  # fmt: skip
        return out


class Settings(BaseSettings):
    """Everything beamflow is configured with. Load it with :func:`load_config`."""

    model_config = SettingsConfigDict(
        env_prefix="BEAMFLOW_", env_nested_delimiter="__", extra="forbid"
    )

    backend: Literal["local", "globus"] = "local"
    state_dir: Path = Field(default=Path("state"), description="run store, registry, tokens")
    beamline: Beamline = Field(default_factory=Beamline)
    hpc: HPC = Field(default_factory=HPC)
    compute: Compute = Field(default_factory=Compute)
    globus: Globus = Field(default_factory=Globus)
    reconstruction: Reconstruction = Field(default_factory=Reconstruction)
    agent: Agent = Field(default_factory=Agent)
    status: Status = Field(default_factory=Status)
    cluster: Cluster = Field(default_factory=Cluster)
    retention: Retention = Field(default_factory=Retention)

    # Where the settings came from; not a setting.
    source: Path | None = Field(default=None, exclude=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment beats the file, which is passed in as init values.
        return (env_settings, init_settings)

    @property
    def store_path(self) -> Path:
        return self.state_dir / "runs.sqlite"

    @property
    def registry_path(self) -> Path:
        return self.state_dir / "registry.json"

    @property
    def token_path(self) -> Path:
        return self.globus.token_storage or self.state_dir / "tokens.db"


def agent_client_id(settings: Settings) -> str | None:
    """The agent's confidential client: ``globus.agent_client_id``, else this configuration's
    own client when it has a secret (then it is the agent's)."""
    g = settings.globus
    if g.agent_client_id:
        return g.agent_client_id
    return g.client_id if g.client_secret and is_uuid(g.client_id) else None


def find_config(explicit: Path | None = None) -> Path | None:
    """The config file to use: explicit, ./beamflow.toml, then the user's config."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"{explicit}: no such config file (create one with `beamflow init`)")
        return explicit
    for candidate in (Path.cwd() / CONFIG_NAME, USER_CONFIG.expanduser()):
        if candidate.is_file():
            return candidate
    return None


def load_config(path: Path | None = None) -> Settings:
    """Load and validate the configuration; errors name the file or the variable, the key and
    the fix, one line each."""
    found = find_config(path)
    data = _read_toml(found) if found is not None else {}
    _check_environment()
    base = found.parent.resolve() if found else Path.cwd()
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_explain(found, exc)) from None
    except SettingsError as exc:  # what _check_environment missed: still one line
        raise ConfigError(f"BEAMFLOW_* environment: {exc}") from None
    settings = _resolve_paths(settings, base)
    settings.source = found
    return settings


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a text file (byte {exc.start} is not UTF-8): a beamflow.toml is TOML "
            "text (create one with `beamflow init`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


# BEAMFLOW_* variables that are not settings: beamflow sets or reads them itself (the
# compute engine's mark on its processes, the reconstruction's node-local checkpoint
# directory, the tests' screenshot directory).
NOT_SETTINGS = frozenset(
    {"BEAMFLOW_COMPUTE_ENGINE", "BEAMFLOW_CHECKPOINT_L1_DIR", "BEAMFLOW_SCREENSHOT_DIR"}
)
ENV_PREFIX = "BEAMFLOW_"


def _env_name(parts: list[str] | tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(parts).upper()


def _setting_names(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of ``model``: sections and the keys in them."""
    names = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        names.append((*prefix, name))
        section = _section_type(field.annotation)
        if section is not None:
            names.extend(_setting_names(section, (*prefix, name)))
    return names


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _needs_json(annotation: Any) -> bool:
    """Whether an environment variable for a key of this type is read as JSON (as
    pydantic-settings does: lists, dicts, sections)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_needs_json(a) for a in args if a is not type(None))
    origin = typing.get_origin(annotation) or annotation
    return origin in (list, dict, set, tuple) or _section_type(annotation) is not None


def closest(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for the known name nearest ``name``, else ``""``."""
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def _check_environment(environ: typing.Mapping[str, str] | None = None) -> None:
    """Unknown ``BEAMFLOW_*`` variables, and values that are not the JSON their key needs,
    refused as a file's unknown keys are: one line each, naming the variable."""
    environ = os.environ if environ is None else environ
    keys = {_env_name(path): path for path in _setting_names(Settings)}
    problems = []
    for var in sorted(environ):
        name = var.upper()
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
            continue
        path = keys.get(name)
        if path is None:
            problems.append(f"{var}: not a beamflow setting{closest(name, list(keys))}; unset it")
            continue
        field = _field_at(path)
        if _needs_json(field.annotation):
            try:
                json.loads(environ[var])
            except ValueError as exc:
                problems.append(
                    f"{var}: {'.'.join(path)} takes JSON here (e.g. {_json_example(field)}): "
                    f"{exc} (got {environ[var]!r})"
                )
    if problems:
        raise ConfigError("\n".join(problems))


def _field_at(path: tuple[str, ...]) -> Any:
    model: type[BaseModel] = Settings
    for part in path[:-1]:
        model = _section_type(model.model_fields[part].annotation)  # type: ignore[assignment]
    return model.model_fields[path[-1]]


def _json_example(field: Any) -> str:
    section = _section_type(field.annotation)
    if section is not None:
        return '{"key": value}'
    if field.examples:
        return json.dumps(field.examples[0])
    default = field.get_default(call_default_factory=True)
    return json.dumps(default) if default not in (None, [], {}) else "[...]"


def _explain(found: Path | None, exc: ValidationError) -> str:
    """One line per problem: where it was set (the variable, else the file), the key, the
    problem and what was given."""
    lines = []
    for err in exc.errors():
        key = field_path(err)
        loc = [str(p) for p in err["loc"]]
        env = _env_name(loc)
        from_env = env in {k.upper() for k in os.environ}
        where = env if from_env else str(found) if found else "defaults"
        if err["type"] == "extra_forbidden":
            # The nearest key of the same section: "agent.quiet_secs" -> agent.quiet_seconds
            known = [".".join(p) for p in _setting_names(Settings) if list(p[:-1]) == loc[:-1]]
            lines.append(f"{where}: {key}: unknown key{closest(key, known)}; remove it or "
                         "check the spelling (see `beamflow init` for a complete file)")
            continue
        if err["type"] == "value_error" and OLD_VIEWING_KEY in err["msg"]:
            lines.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
            continue
        if err["type"] == "value_error" and isinstance(err.get("input"), dict):
            # A check of a section's settings together: its message names them.
            lines.append(f"{where}: {key}: {err['msg'].removeprefix('Value error, ')}")
            continue
        hint = "" if from_env else f"; {env} sets it too"
        lines.append(f"{where}: {key}: {err['msg']} (got {err.get('input')!r}{hint})")
    return "\n".join(lines)


def _resolve_paths(settings: Settings, base: Path) -> Settings:
    def absolute(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p)

    settings.state_dir = absolute(settings.state_dir)
    for section in (settings.beamline, settings.hpc, settings.globus, settings.compute,
                    settings.cluster):
        for name, field in type(section).model_fields.items():
            value = getattr(section, name)
            if isinstance(value, Path) or (value is None and "Path" in str(field.annotation)):
                setattr(section, name, absolute(value))
    return settings


def environ_overrides() -> dict[str, str]:
    """The BEAMFLOW_* variables in effect (for `doctor` and logs; secrets masked)."""
    return {
        k: ("***" if "SECRET" in k or "TOKEN" in k else v)
        for k, v in os.environ.items()
        if k.startswith("BEAMFLOW_")
    }
