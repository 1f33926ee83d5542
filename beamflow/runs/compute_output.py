"""What the reconstruct function answered, read from a flow run's output (the compute
action's status document), and the run's fields it fills: product, previews, iterations,
verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from beamflow.job.models import FunctionSummary
from beamflow.runs.backend import FlowRunInfo
from beamflow.runs.records import Run


class _ComputeTask(BaseModel):
    output: Any = None


class _ComputeDetails(BaseModel):
    """The part of a compute action's status that holds the function's return value."""

    result: list[Any] = Field(default_factory=list)
    results: list[_ComputeTask] = Field(default_factory=list)


class _ComputeAction(BaseModel):
    details: _ComputeDetails = Field(default_factory=_ComputeDetails)


def reconstruction_summary(output: dict[str, Any]) -> FunctionSummary | None:
    """The reconstruct function's summary in a flow's output (``$.reconstruct``, the compute
    action's status: ``details.result[0]``, or ``details.results[0].output``); None when
    there is none or it is not one."""
    try:
        details = _ComputeAction.model_validate(output.get("reconstruct")).details
    except ValidationError:
        return None
    answers = [*details.result[:1], *(task.output for task in details.results[:1])]
    for answer in answers:
        try:
            return FunctionSummary.model_validate(answer)
        except ValidationError:
            continue
    return None


def summary_fields(run: Run, summary: FunctionSummary, base: Path | None) -> dict[str, Any]:
    """The run's fields from the function's summary: the product and previews that arrived
    under ``base`` (where the flow brought them; None: as the function wrote them, on a file
    system the beamline shares), the iterations and the verdict."""
    if base is None:
        product = summary.product
        previews = summary.previews
    else:
        arrived = base / summary.product_relative
        product = str(arrived) if arrived.exists() else None
        previews = [str(p) for p in (base / p for p in summary.previews_relative) if p.exists()]
    fields: dict[str, Any] = {
        "result": {**run.result, "summary": summary.model_dump(mode="json")},
        "error": None,
        "error_step": None,
        "error_kind": None,
        "product": product,
        "previews": previews,
        "verdict": summary.verdict,
        "verdict_reasons": summary.verdict_reasons,
    }
    if summary.iterations is not None:
        fields["iteration"] = fields["iterations_total"] = summary.iterations
    return fields


def success_fields(run: Run, info: FlowRunInfo) -> dict[str, Any]:
    summary = reconstruction_summary(info.output)
    if summary is None:
        return {"result": {**run.result, "summary": None}, "error": None, "error_step": None,
                "error_kind": None}  # fmt: skip
    results_dir = run.result.get("results_dir")
    return summary_fields(run, summary, Path(results_dir) if results_dir else None)
