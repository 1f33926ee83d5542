"""The one-way architecture of docs/architecture.md, checked on the source: no import
circles, and no arrow that runs back up a floor. Every import counts, including those inside
functions (a late import hides a circle; it does not remove it)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("beamflow", "edge_agent", "functions")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(name: str) -> str | None:
    """The longest known module that ``name`` (a module or a name in one) lies in."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    package = module if _is_package(module) else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    targets = {_resolve(n) for n in names} - {None, module}
    # A module inside a package reaches the package's __init__ on its way in; that is not
    # an arrow of the design.
    return {t for t in targets if not (_is_package(t) and module.startswith(t + "."))}


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of ``graph`` with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles(GRAPH) == []


def _room(module: str) -> str:
    """The room a module lies in: a top-level module or package of beamflow, or one of the
    other packages."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "beamflow" and len(parts) > 1 else parts[0]


def test_no_circles_between_rooms():
    """A room (``beamflow.runs``, ``beamflow.local``, ...) is one piece of the design: no two
    rooms reach each other, whichever of their modules the arrows leave from."""
    rooms: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        rooms.setdefault(_room(m), set()).update(_room(t) for t in targets)
    assert _cycles({r: ts - {r} for r, ts in rooms.items()}) == []


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _arrows(source: Callable[[str], bool], wrong: Callable[[str, str], bool]) -> list[str]:
    """The imports ``m -> t`` from every module ``m`` that ``source`` picks, that are
    ``wrong(m, t)``."""
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if source(m)
                  for t in targets if wrong(m, t))


# Floors, bottom first: a module may import its own floor and those below, never above.
# The run package spans floors: its record and store lie at the bottom, the interface of the
# run backends (local, Globus) above the job, and its run path (the request, the flow's input,
# the life of a run, its failures and retention) above the backends.
RUN_RECORD = ("beamflow.runs.records", "beamflow.runs.naming", "beamflow.runs.schema",
              "beamflow.runs.store")
RUN_BACKEND = ("beamflow.runs.backend",)  # the interface the backends implement
RUN_PATH = ("beamflow.runs.request", "beamflow.runs.flow_input", "beamflow.runs.compute_output",
            "beamflow.runs.failures", "beamflow.runs.lifecycle", "beamflow.runs.retention")
SCIENCE_AND_STORAGE = (
    "beamflow.ptycho", "beamflow.checkpoint", "beamflow.formats", *RUN_RECORD,
    "beamflow.atomic", "beamflow.validation_text", "beamflow.error_kinds",
)
JOB = ("beamflow.job",)
ABOVE_JOB = (
    *RUN_BACKEND, "beamflow.local", "beamflow.globus", *RUN_PATH, "beamflow.run_backends",
    "beamflow.status", "beamflow.cli", "beamflow.demo", "edge_agent", "functions",
)
ABOVE_SCIENCE = (*JOB, *ABOVE_JOB)
BACKENDS = ("beamflow.local", "beamflow.globus")
STARTERS = (*RUN_PATH, "beamflow.run_backends", "beamflow.status", "beamflow.cli",
            "beamflow.demo", "edge_agent")


def test_the_run_package_is_the_floors_listed():
    """Every module of beamflow/runs/ stands on a floor above (a new one must be placed), and
    its root imports nothing: importing the store must not pull in the run path."""
    runs = {m for m in MODULES if _under(m, ("beamflow.runs",))} - {"beamflow.runs"}
    assert runs == {*RUN_RECORD, *RUN_BACKEND, *RUN_PATH}
    assert GRAPH["beamflow.runs"] == set()


@pytest.mark.parametrize(
    ("floor", "forbidden"),
    [
        (SCIENCE_AND_STORAGE, ABOVE_SCIENCE),
        (JOB, ABOVE_JOB),
        (RUN_BACKEND, (*BACKENDS, *STARTERS)),
        (BACKENDS, STARTERS),
    ],
    ids=["science-and-storage", "job", "backend-interface", "backends"],
)
def test_no_arrow_runs_back_up(floor, forbidden):
    assert _arrows(lambda m: _under(m, floor), lambda m, t: _under(t, forbidden)) == []


def test_science_knows_nothing_of_flows_globus_or_the_web():
    third_party = ("globus_sdk", "globus_compute_sdk", "globus_compute_endpoint", "fastapi",
                   "uvicorn", "jinja2", "typer", "rich", "watchdog")
    wrong = []
    for m, path in MODULES.items():
        if not _under(m, SCIENCE_AND_STORAGE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            wrong += [f"{m} -> {n}" for n in names if n.split(".")[0] in third_party]
    assert wrong == []


# The rooms of the job, bottom first, as docs/architecture.md lists them: the models, the two
# helpers, the job's checkpoints, the build's steps in their order, the entry, the compute
# function's work. A room imports only rooms before it.
JOB_ROOMS = tuple(f"beamflow.job.{room}" for room in (
    "models", "snapshots", "live_previews", "checkpoints", "load", "start", "engine_input",
    "iterate", "finish", "run", "task"))


def test_the_jobs_rooms_import_only_the_rooms_before_them():
    assert sorted(JOB_ROOMS) == sorted(m for m in MODULES if _under(m, JOB) and m not in JOB)
    wrong = sorted(f"{m} -> {t}" for i, m in enumerate(JOB_ROOMS) for t in GRAPH[m]
                   if t in JOB_ROOMS[i:])
    assert wrong == []


def test_the_job_package_imports_nothing_at_its_root():
    """The run path reads beamflow.job.models and the preview helper starts as
    beamflow.job.live_previews: importing the package must not load the engine."""
    assert GRAPH["beamflow.job"] == set()
    assert "import" not in MODULES["beamflow.job"].read_text().split('"""')[-1]


# Leaf utilities: standard library (and pydantic) only, usable from every floor.
LEAVES = ("beamflow.atomic", "beamflow.validation_text", "beamflow.processes",
          "beamflow.error_kinds", "beamflow.disk")
SCIENCE = ("beamflow.ptycho", "beamflow.checkpoint", "beamflow.formats")


def test_science_imports_nothing_else_of_beamflow_but_leaf_utilities():
    wrong = _arrows(lambda m: _under(m, SCIENCE) or m in LEAVES,
                    lambda m, t: not _under(t, SCIENCE + LEAVES) or (m in LEAVES and t != m))
    assert wrong == []


# The backend packages, each reached from outside through its root's public API (its
# ``__all__``) only: the starters never import one backend's internals. The agent, the demo
# and the status page do not even name a backend: they get one from
# beamflow.run_backends.get_run_backend.
BACKEND_PACKAGES = ("beamflow.local", "beamflow.globus")
BACKEND_BLIND = ("edge_agent", "beamflow.demo", "beamflow.status")


def test_starters_import_a_backend_package_only_through_its_root():
    wrong = _arrows(lambda m: _under(m, STARTERS),
                    lambda m, t: _under(t, BACKEND_PACKAGES) and t not in BACKEND_PACKAGES)
    assert wrong == []


def test_agent_demo_and_status_page_import_no_backend_package():
    assert _arrows(lambda m: _under(m, BACKEND_BLIND),
                   lambda m, t: _under(t, BACKEND_PACKAGES)) == []


def _public_names(package: str) -> set[str]:
    tree = ast.parse(MODULES[package].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def test_starters_use_only_the_public_api_of_a_backend_package():
    wrong = []
    for m, path in MODULES.items():
        if not _under(m, STARTERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in BACKEND_PACKAGES:
                public = _public_names(node.module)
                wrong += [f"{m} -> {node.module}.{a.name}" for a in node.names
                          if a.name not in public]  # fmt: skip
    assert wrong == []


def test_the_rules_see_the_cli_package_and_the_backend_roots():
    """The checks above are not vacuous: the CLI is a package of several modules, and it
    reaches the backend packages' roots (flows, Globus account), which the rules allow."""
    cli = [m for m in MODULES if _under(m, ("beamflow.cli",))]
    assert len(cli) > 5
    reached = {t for m in cli for t in GRAPH[m]}
    assert set(BACKEND_PACKAGES) <= reached
    assert _public_names("beamflow.local") and _public_names("beamflow.globus")


def _external_imports(module: str) -> set[str]:
    """The top-level names of the packages ``module`` imports (absolute imports only)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_array_backend_imports_cupy():
    """The engine is one code path over an array module: the GPU's array library is reached
    through beamflow/ptycho/arrays/ (ArrayBackend) only."""
    users = sorted(m for m in MODULES if _external_imports(m) & {"cupy", "cupyx"})
    assert users == ["beamflow.ptycho.arrays"]


# The engine's rooms (docs/architecture.md, "The rooms of beamflow/ptycho/"): the forward
# models know no algorithm, the algorithms know neither the loop that runs them nor the
# judging of its result, quality judges states without the machinery that made them, and
# the GPU's kernels and graphs are handed CuPy and import nothing of beamflow.
P = "beamflow.ptycho"
ENGINE_ROOMS = [
    ((f"{P}.forward",), (f"{P}.algorithms", f"{P}.core", f"{P}.engine", f"{P}.quality",
                         f"{P}.accumulators")),
    ((f"{P}.algorithms",), (f"{P}.engine", f"{P}.quality")),
    ((f"{P}.quality",), (f"{P}.algorithms", f"{P}.core", f"{P}.engine",
                         f"{P}.accumulators")),
    ((f"{P}.gpu",), ("beamflow",)),
]


@pytest.mark.parametrize(("room", "forbidden"), ENGINE_ROOMS,
                         ids=["forward", "algorithms", "quality", "gpu"])
def test_the_engines_rooms_keep_to_themselves(room, forbidden):
    assert _arrows(lambda m: _under(m, room),
                   lambda m, t: _under(t, forbidden) and not _under(t, room)) == []


# Big rooms hide their architecture: no module of the product over 700 lines, no class over
# 450, no function whose body runs over 120 (a command's option declarations are its
# signature, not its body).
def _sizes() -> list[str]:
    big = []
    for m, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > 700:
            big.append(f"{m}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno >= 450:
                big.append(f"{m}.{node.name}: class of {node.end_lineno - node.lineno + 1} lines")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.end_lineno - node.body[0].lineno + 1
                if body > 120:
                    big.append(f"{m}.{node.name}: a body of {body} lines")
    return big


def test_no_room_is_too_big_to_read():
    assert _sizes() == []
