"""An embedded interpreter of the Globus Flows language: the same flow definitions that run on
Globus Flows run here, on one machine, with pluggable action providers.

API (others code against these names)
-------------------------------------
``FlowRunner(definition, providers, *, flow_id=None, input_schema=None, clock=None,
poll_interval=1.0, max_poll_interval=10.0, user=None)``
    Validates ``definition`` (raises :class:`FlowDefinitionError` listing every problem).
    ``providers`` maps ActionUrl → :class:`ActionProvider`; a trailing slash on either side
    does not matter. ``runner.missing_providers`` lists ActionUrls the definition uses that
    have no provider (such a state fails at run time with ``ActionUnableToRun``).

``runner.run(input, run_id=None, label=None, tags=(), on_log=None) -> RunResult``
    Runs to the end in the calling thread. ``runner.start(...)`` takes the same arguments
    and returns a :class:`RunHandle` (``.cancel()``, ``.wait(timeout)``, ``.status``,
    ``.log``, ``.result``) with the run going on in a thread. ``runner.cancel(run_id)``
    cancels a run of this runner from any thread. ``input`` is checked against
    ``input_schema`` first (raises :class:`FlowInputError`).

``on_log(entry)`` is called, in the run's thread, with every run-log entry as it happens
(``{time, code, description, details}``; state entries carry ``details.state_name`` and
``details.state_type``), so a backend can record steps and timings as they happen.

``RunResult``: ``run_id, flow_id, status, output, log, error, details, label, tags,
start_time, completion_time``. ``status`` is SUCCEEDED, FAILED or ENDED (cancelled).
``output`` is the flow state at the end (for FAILED: at the failure). ``error`` is None or
``{"Error", "Cause", "state_name"}``. ``details`` is what the service's run document
holds: ``{code, description, output}`` and, on failure, ``details`` with the error.

Action providers (our own protocol; the service speaks the Action Provider HTTP API)::

    start(body: dict, context: RunContext) -> ActionStatus
    status(action_id: str) -> ActionStatus
    cancel(action_id: str) -> ActionStatus

``ActionStatus``: ``action_id, status (ACTIVE|INACTIVE|SUCCEEDED|FAILED), start_time,
completion_time, details, display_status, creator_id, label``. A provider that cannot start
an action raises (``ActionUnableToRunError`` to pass a structured error, or any exception).

The rooms beside this one: the Action state (start, poll, time out, fail) is
:mod:`beamflow.local.action_state`; the run's result and its states' errors,
:mod:`beamflow.local.flow_run`; Choice's tests, :mod:`beamflow.local.choice`.

Clocks (:mod:`beamflow.local.clock`): ``SystemClock`` (``time_scale=0.01`` makes waits and
polls 100x shorter while the flow sees full-length time) and ``ManualClock`` (sleeps return at
once and advance its time; for tests). The provider interface is :mod:`beamflow.local.actions`.

Service semantics implemented, and where they come from
-------------------------------------------------------
* States, fields, Parameters with ``.$`` JSONPaths and ``.=`` expressions (nested in
  objects and list items), ``__Private_Parameters``, ``_private`` state keys hidden from
  logs and output, ``$._context`` (flow_id, run_id, username, email, user_id, identities,
  token_info; read-only), ResultPath default ``$`` (replaces the whole state), WaitTime
  default 300 s → ``ActionTimeout`` (the action is cancelled), ExceptionOnActionFailure
  default true → ``ActionFailedException`` (false: the FAILED status goes to ResultPath and
  the run goes on), ``ActionUnableToRun`` when the action cannot start, Catch with
  ErrorEquals/Next/ResultPath, polling with doubling back-off: Globus Flows "Authoring
  Flows" (docs.globus.org/api/flows/authoring-flows/, "Actions", "Expressions", "Handling
  Exceptions", "Run Context", "Protecting Secrets"; older copy in globus-automate-client
  ``docs/source/authoring_flows.rst``). The service caps its back-off at 10 minutes; here
  ``max_poll_interval`` (10 s) so local runs notice completion quickly.
* What lands at ResultPath for an Action is the action status document plus
  ``state_name``, as in the run logs recorded in globus-sdk ``testing/data/flows``.
* Run-log codes and descriptions (FlowStarted "The Flow Instance started execution",
  ``<Type>Started``/``<Type>Completed`` "State X of type T started/completed" with
  state_name/state_type/input/output, FlowSucceeded, FlowCanceled) and the run's
  ``details`` (``code``, ``description``, ``output``): globus-sdk ``testing/data/flows``
  (get_run_logs, get_run, cancel_run). ``ActionFailed`` and ``FlowFailed`` follow the same
  pattern but are not in those recordings (unverified names).
* Choice (every operator family, ``*Path`` variants, And/Or/Not, Default; no match and no
  Default fails the run with ``States.NoChoiceMatched``), Wait, Pass (Result, Parameters,
  InputPath), Fail (Error/Cause or ErrorPath/CausePath), Catch error objects
  ``{"Error": name, "Cause": string}`` and ``States.ALL``: the Amazon States Language
  (states-language.net), which Globus Flows follows "in nearly the same manner", and the
  Globus "Choice States"/"Fail States" pages. Runtime faults in the definition's own
  plumbing (a ``.$`` path that names nothing, an expression that fails, a Choice Variable
  that is missing) fail the run with ``States.Runtime``, which no Catch handles (ASL).
* Cancelled runs end with status ENDED and the FlowCanceled code (DESIGN.md; note the
  globus-sdk recording of cancel_run shows status FAILED with code FlowCanceled).
"""

from __future__ import annotations

import copy
import getpass
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from beamflow.local.action_state import run_action
from beamflow.local.actions import ActionProvider, RunContext, iso_time, normalize_action_url
from beamflow.local.choice import compare, type_test
from beamflow.local.clock import Clock, SystemClock
from beamflow.local.expressions import ExpressionError, evaluate
from beamflow.local.flow_run import (
    LogListener,
    RunCanceled,
    RunResult,
    RunStatus,
    StateFailure,
    cause_text,
    runtime_failure,
    strip_private,
)
from beamflow.local.jsonpath import (
    JSONPathError,
    PathNotFound,
    get_value,
    has_value,
    set_value,
)
from beamflow.local.validation import (
    ALL_ERRORS,
    FlowDefinitionError,
    FlowInputError,
    check_definition,
    parse_timestamp,
    validate_input,
)

__all__ = [
    "FlowDefinitionError",
    "FlowInputError",
    "FlowRunner",
    "RunHandle",
]

log = logging.getLogger(__name__)


# -- the run -----------------------------------------------------------------------------------
class _Execution:
    def __init__(
        self,
        runner: FlowRunner,
        body: dict[str, Any],
        run_id: str,
        label: str | None,
        tags: Sequence[str],
        on_log: LogListener | None,
    ) -> None:
        self.runner = runner
        self.clock = runner.clock
        self.run_id = run_id
        self.label = label
        self.tags = list(tags)
        self.on_log = on_log
        self.data: Any = copy.deepcopy(body)
        self.status: RunStatus = "ACTIVE"
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.cancel_event = threading.Event()
        self.done = threading.Event()
        self.result: RunResult | None = None
        self.start_ts = self.clock.time()
        user = runner.user
        self.context: dict[str, Any] = {
            "flow_id": runner.flow_id,
            "run_id": run_id,
            "username": user.get("username"),
            "email": user.get("email"),
            "user_id": user.get("user_id"),
            "identities": list(user.get("identities") or [user.get("user_id")]),
            "token_info": {
                "exp": int(self.start_ts) + 172_800,
                "iat": int(self.start_ts),
                "nbf": int(self.start_ts),
            },
        }

    # -- bookkeeping ---------------------------------------------------------------------
    def emit(self, code: str, description: str, details: dict[str, Any]) -> None:
        entry = {
            "time": iso_time(self.clock.time()),
            "code": code,
            "description": description,
            "details": strip_private(copy.deepcopy(details)),
        }
        with self.lock:
            self.log.append(entry)
        if self.on_log is not None:
            try:
                self.on_log(copy.deepcopy(entry))
            except Exception:  # a listener must not break the run
                log.exception("run %s: log listener failed on %s", self.run_id, code)

    def state_entry(self, name: str, kind: str, what: str, **details: Any) -> None:
        self.emit(
            f"{kind}{what}",
            f"State {name} of type {kind} {what.lower()}",
            {"state_name": name, "state_type": kind, **details},
        )

    def cancel(self) -> None:
        self.cancel_event.set()

    def check_cancel(self) -> None:
        if self.cancel_event.is_set():
            raise RunCanceled

    # -- values --------------------------------------------------------------------------
    def path(self, data: Any, path: str, where: str) -> Any:
        try:
            return get_value(data, path, self.context)
        except (PathNotFound, JSONPathError) as exc:
            raise runtime_failure(f"{where}: {exc}") from None

    def expr(self, source: str, data: Any, where: str) -> Any:
        try:
            return evaluate(source, data, self.context)
        except ExpressionError as exc:
            raise runtime_failure(f"{where}: {exc}") from None

    def build(self, template: Any, data: Any, where: str) -> tuple[Any, Any]:
        """(value, value for the log): ``.$`` and ``.=`` keys resolved at any depth;
        ``__Private_Parameters`` names dropped from the log copy and the key itself dropped."""
        if isinstance(template, dict):
            private = set(template.get("__Private_Parameters") or [])
            out: dict[str, Any] = {}
            shown: dict[str, Any] = {}
            for key, sub in template.items():
                if key == "__Private_Parameters":
                    continue
                here = f"{where}.{key}"
                if key.endswith(".$"):
                    name = key[:-2]
                    value = self.path(data, sub, here)
                    value_shown = value
                elif key.endswith(".="):
                    name = key[:-2]
                    value = self.expr(sub, data, here)
                    value_shown = value
                else:
                    name = key
                    value, value_shown = self.build(sub, data, here)
                out[name] = value
                if name not in private and key not in private:
                    shown[name] = value_shown
            return out, shown
        if isinstance(template, list):
            pairs = [self.build(item, data, f"{where}[{i}]") for i, item in enumerate(template)]
            return [p[0] for p in pairs], [p[1] for p in pairs]
        return copy.deepcopy(template), copy.deepcopy(template)

    def put(self, data: Any, result_path: str, value: Any, where: str) -> Any:
        try:
            return set_value(data, result_path, value)
        except (PathNotFound, JSONPathError) as exc:
            raise runtime_failure(f"{where}: ResultPath: {exc}") from None

    # -- main loop -----------------------------------------------------------------------
    def execute(self) -> RunResult:
        definition = self.runner.definition
        states = definition["States"]
        self.emit("FlowStarted", "The Flow Instance started execution", {"input": self.data})
        name = definition["StartAt"]
        try:
            while True:
                self.check_cancel()
                state = states[name]
                try:
                    nxt = self.step(name, state)
                except StateFailure as failure:
                    catcher = self.find_catcher(state, failure)
                    if catcher is None:
                        return self.finish_failed(name, failure)
                    self.data = self.put(
                        self.data,
                        catcher.get("ResultPath", "$"),
                        failure.error_object(),
                        f"State {name!r}: Catch",
                    )
                    nxt = catcher["Next"]
                if nxt is None:
                    return self.finish("SUCCEEDED")
                name = nxt
        except StateFailure as failure:  # raised while handling a Catch
            return self.finish_failed(name, failure)
        except RunCanceled:
            return self.finish("ENDED")

    @staticmethod
    def find_catcher(state: dict[str, Any], failure: StateFailure) -> dict[str, Any] | None:
        if not failure.catchable:
            return None
        for catcher in state.get("Catch") or []:
            errors = catcher["ErrorEquals"]
            if failure.error in errors or ALL_ERRORS in errors:
                return catcher
        return None

    def step(self, name: str, state: dict[str, Any]) -> str | None:
        kind = state["Type"]
        handler = getattr(self, f"do_{kind}")
        nxt = handler(name, state)
        if kind == "Choice":
            return nxt
        return None if state.get("End") is True else state["Next"]

    def do_Pass(self, name: str, state: dict[str, Any]) -> None:  # noqa: N802
        self.state_entry(name, "Pass", "Started", input=self.data)
        value = self.data
        if "InputPath" in state:
            value = self.path(self.data, state["InputPath"], f"State {name!r}: InputPath")
        if "Parameters" in state:
            value, _ = self.build(state["Parameters"], value, f"State {name!r}: Parameters")
        if "Result" in state:
            value = copy.deepcopy(state["Result"])
        self.data = self.put(self.data, state.get("ResultPath", "$"), value, f"State {name!r}")
        self.state_entry(name, "Pass", "Completed", output=self.data)

    def do_ExpressionEval(self, name: str, state: dict[str, Any]) -> None:  # noqa: N802
        self.state_entry(name, "ExpressionEval", "Started", input=self.data)
        value, _ = self.build(state["Parameters"], self.data, f"State {name!r}: Parameters")
        self.data = self.put(self.data, state.get("ResultPath", "$"), value, f"State {name!r}")
        self.state_entry(name, "ExpressionEval", "Completed", output=self.data)

    def do_Fail(self, name: str, state: dict[str, Any]) -> None:  # noqa: N802
        self.state_entry(name, "Fail", "Started", input=self.data)
        where = f"State {name!r}"
        error = state.get("Error")
        cause = state.get("Cause")
        if "ErrorPath" in state:
            error = cause_text(self.path(self.data, state["ErrorPath"], f"{where}: ErrorPath"))
        if "CausePath" in state:
            cause = cause_text(self.path(self.data, state["CausePath"], f"{where}: CausePath"))
        raise StateFailure(error or "States.Fail", cause or "", catchable=False)

    def do_Wait(self, name: str, state: dict[str, Any]) -> None:  # noqa: N802
        self.state_entry(name, "Wait", "Started", input=self.data)
        where = f"State {name!r}"
        now = self.clock.time()
        if "Seconds" in state:
            until = now + float(state["Seconds"])
        elif "SecondsPath" in state:
            seconds = self.path(self.data, state["SecondsPath"], f"{where}: SecondsPath")
            if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
                raise runtime_failure(f"{where}: SecondsPath gave {seconds!r}, not a number ≥ 0")
            until = now + float(seconds)
        else:
            if "Timestamp" in state:
                stamp = state["Timestamp"]
            else:
                stamp = self.path(self.data, state["TimestampPath"], f"{where}: TimestampPath")
            moment = parse_timestamp(stamp)
            if moment is None:
                raise runtime_failure(f"{where}: {stamp!r} is not an RFC 3339 timestamp")
            until = moment.timestamp()
        while True:
            self.check_cancel()
            left = until - self.clock.time()
            if left <= 0:
                break
            self.clock.sleep(left, self.cancel_event)
        self.state_entry(name, "Wait", "Completed", output=self.data)

    def do_Choice(self, name: str, state: dict[str, Any]) -> str:  # noqa: N802
        self.state_entry(name, "Choice", "Started", input=self.data)
        where = f"State {name!r}"
        chosen = None
        for i, rule in enumerate(state["Choices"]):
            if self.rule_matches(rule, f"{where}: Choices[{i}]"):
                chosen = rule["Next"]
                break
        if chosen is None:
            chosen = state.get("Default")
        if chosen is None:
            raise StateFailure(
                "States.NoChoiceMatched",
                f"{where}: no choice rule matched and there is no Default",
                catchable=False,
            )
        self.state_entry(name, "Choice", "Completed", output=self.data, next_state=chosen)
        return chosen

    def rule_matches(self, rule: dict[str, Any], where: str) -> bool:
        if "And" in rule:
            return all(self.rule_matches(r, f"{where}.And[{i}]") for i, r in enumerate(rule["And"]))
        if "Or" in rule:
            return any(self.rule_matches(r, f"{where}.Or[{i}]") for i, r in enumerate(rule["Or"]))
        if "Not" in rule:
            return not self.rule_matches(rule["Not"], f"{where}.Not")
        return _evaluate_test(self, rule, where)

    def do_Action(self, name: str, state: dict[str, Any]) -> None:  # noqa: N802
        where = f"State {name!r}"
        if "InputPath" in state:
            body = self.path(self.data, state["InputPath"], f"{where}: InputPath")
            shown = body
        else:
            body, shown = self.build(state["Parameters"], self.data, f"{where}: Parameters")
        self.state_entry(name, "Action", "Started", input=shown)
        context = RunContext(
            run_id=self.run_id,
            flow_id=self.runner.flow_id,
            state_name=name,
            label=self.label,
            tags=tuple(self.tags),
            username=self.context["username"],
            user_id=self.context["user_id"],
        )
        try:
            doc = run_action(
                state, body, context, self.runner.provider_for(state["ActionUrl"]),
                clock=self.clock, cancelled=self.cancel_event,
                poll_interval=self.runner.poll_interval,
                max_poll_interval=self.runner.max_poll_interval, on_status=self.set_status,
            )  # fmt: skip
        except StateFailure as failure:
            self.state_entry(name, "Action", "Failed", error=failure.error_object())
            raise
        self.state_entry(name, "Action", "Completed", output=doc)
        self.data = self.put(self.data, state.get("ResultPath", "$"), doc, where)

    def set_status(self, status: RunStatus) -> None:
        with self.lock:
            self.status = status

    # -- endings -------------------------------------------------------------------------
    def finish(self, status: RunStatus) -> RunResult:
        output = strip_private(self.data)
        if status == "SUCCEEDED":
            self.emit(
                "FlowSucceeded", "The Flow Instance completed successfully", {"output": output}
            )
            details = {
                "code": "FlowSucceeded",
                "description": "The Flow run reached a successful completion state",
                "output": output,
            }
        else:
            self.emit("FlowCanceled", "The Flow Instance was canceled by the user", {})
            details = {
                "code": "FlowCanceled",
                "description": "The Flow Instance was canceled by the user",
                "details": {},
                "output": output,
            }
        return self.result_of(status, output, details, None)

    def finish_failed(self, name: str, failure: StateFailure) -> RunResult:
        output = strip_private(self.data)
        error = {**failure.error_object(), "state_name": name}
        description = f"The Flow Instance failed in state {name}: {failure.error}"
        if failure.cause:
            description += f": {failure.cause}"
        self.emit("FlowFailed", description, {"error": error, "output": output})
        details = {
            "code": "FlowFailed",
            "description": description,
            "details": error,
            "output": output,
        }
        return self.result_of("FAILED", output, details, error)

    def result_of(
        self, status: RunStatus, output: Any, details: dict[str, Any], error: Any
    ) -> RunResult:
        with self.lock:
            self.status = status
            entries = copy.deepcopy(self.log)
        self.result = RunResult(
            run_id=self.run_id,
            flow_id=self.runner.flow_id,
            status=status,
            output=output,
            log=entries,
            error=error,
            details=details,
            label=self.label,
            tags=self.tags,
            start_time=iso_time(self.start_ts),
            completion_time=iso_time(self.clock.time()),
        )
        return self.result


def _evaluate_test(run: _Execution, rule: dict[str, Any], where: str) -> bool:
    op = next(k for k in rule if k not in ("Variable", "Next", "Comment"))
    expected = rule[op]
    variable = rule["Variable"]
    if op == "IsPresent":
        return has_value(run.data, variable, run.context) == expected
    value = run.path(run.data, variable, f"{where}: Variable")
    if op.startswith("Is"):
        return type_test(op, value) == expected
    if op.endswith("Path"):
        expected = run.path(run.data, expected, f"{where}: {op}")
        op = op[:-4]
    return compare(op, value, expected)


# -- the runner --------------------------------------------------------------------------------
class RunHandle:
    """A run going on in a thread."""

    def __init__(self, execution: _Execution, thread: threading.Thread) -> None:
        self._execution = execution
        self._thread = thread

    @property
    def run_id(self) -> str:
        return self._execution.run_id

    @property
    def status(self) -> RunStatus:
        with self._execution.lock:
            return self._execution.status

    @property
    def log(self) -> list[dict[str, Any]]:
        with self._execution.lock:
            return copy.deepcopy(self._execution.log)

    @property
    def result(self) -> RunResult | None:
        return self._execution.result

    def done(self) -> bool:
        return self._execution.done.is_set()

    def cancel(self) -> None:
        self._execution.cancel()

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """The result once the run has ended, or None if ``timeout`` passed first."""
        self._execution.done.wait(timeout)
        return self._execution.result


class FlowRunner:
    """Runs one flow definition; see the module docstring."""

    def __init__(
        self,
        definition: dict[str, Any],
        providers: Mapping[str, ActionProvider] | None = None,
        *,
        flow_id: str | None = None,
        input_schema: dict[str, Any] | None = None,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        max_poll_interval: float = 10.0,
        user: Mapping[str, Any] | None = None,
    ) -> None:
        check_definition(definition)
        self.definition = copy.deepcopy(definition)
        self.providers = {normalize_action_url(u): p for u, p in (providers or {}).items()}
        self.flow_id = flow_id or str(uuid.uuid4())
        self.input_schema = input_schema
        self.clock: Clock = clock or SystemClock()
        if poll_interval <= 0 or max_poll_interval < poll_interval:
            raise ValueError("need 0 < poll_interval <= max_poll_interval")
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        if user is None:
            try:
                name = getpass.getuser()
            except Exception:  # noqa: BLE001 - no login name in some containers
                name = "local"
            user = {"username": name, "user_id": f"urn:beamflow:local:{name}"}
        self.user = dict(user)
        self._active: dict[str, _Execution] = {}
        self._lock = threading.Lock()

    def provider_for(self, url: str) -> ActionProvider | None:
        return self.providers.get(normalize_action_url(url))

    @property
    def action_urls(self) -> list[str]:
        urls = {s["ActionUrl"] for s in self.definition["States"].values() if s["Type"] == "Action"}
        return sorted(urls)

    @property
    def missing_providers(self) -> list[str]:
        return [u for u in self.action_urls if self.provider_for(u) is None]

    def _prepare(
        self,
        body: dict[str, Any],
        run_id: str | None,
        label: str | None,
        tags: Sequence[str],
        on_log: LogListener | None,
    ) -> _Execution:
        problems = validate_input(body, self.input_schema)
        if problems:
            raise FlowInputError(problems)
        execution = _Execution(self, body, run_id or str(uuid.uuid4()), label, tags, on_log)
        with self._lock:
            if execution.run_id in self._active:
                raise ValueError(f"run {execution.run_id} is already going")
            self._active[execution.run_id] = execution
        return execution

    def _execute(self, execution: _Execution) -> RunResult:
        try:
            return execution.execute()
        except Exception as exc:  # an interpreter bug must still end the run, with a reason
            log.exception("run %s: interpreter error", execution.run_id)
            return execution.finish_failed(
                "?", StateFailure("States.Runtime", f"interpreter error: {exc!r}", catchable=False)
            )
        finally:
            with self._lock:
                self._active.pop(execution.run_id, None)
            execution.done.set()

    def run(
        self,
        input: dict[str, Any],  # noqa: A002 - the service's own word
        run_id: str | None = None,
        label: str | None = None,
        tags: Sequence[str] = (),
        on_log: LogListener | None = None,
    ) -> RunResult:
        """Run to the end in this thread; cancel from another with :meth:`cancel`."""
        return self._execute(self._prepare(input, run_id, label, tags, on_log))

    def start(
        self,
        input: dict[str, Any],  # noqa: A002
        run_id: str | None = None,
        label: str | None = None,
        tags: Sequence[str] = (),
        on_log: LogListener | None = None,
    ) -> RunHandle:
        """Start the run in a thread and return at once."""
        execution = self._prepare(input, run_id, label, tags, on_log)
        thread = threading.Thread(
            target=self._execute,
            args=(execution,),
            name=f"flow-run-{execution.run_id[:8]}",
            daemon=True,
        )
        thread.start()
        return RunHandle(execution, thread)

    def cancel(self, run_id: str) -> bool:
        """Ask a run of this runner to stop; False if no such run is going."""
        with self._lock:
            execution = self._active.get(run_id)
        if execution is None:
            return False
        execution.cancel()
        return True

    def active_runs(self) -> list[str]:
        with self._lock:
            return list(self._active)
