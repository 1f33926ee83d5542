"""Step 5 of the job, finish: the verdict on the final state, its previews (marked SUSPECT
when the verdict is), the Ptychodus product with the verdict, and the summary."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import numpy as np

from beamflow.formats import Product, write_product
from beamflow.job.engine_input import EngineInput
from beamflow.job.iterate import Iterated
from beamflow.job.load import Inputs
from beamflow.job.models import ReconstructJob, ReconstructSummary, settings_used
from beamflow.job.start import Start
from beamflow.ptycho.quality.verdict import Verdict, judge
from beamflow.ptycho.scan_geometry import ScanFrame
from beamflow.ptycho.state import ReconState

log = logging.getLogger(__name__)


def finish(job: ReconstructJob, inputs: Inputs, start: Start, given: EngineInput,
           iterated: Iterated, t_start: float) -> ReconstructSummary:
    """Previews, the verdict and the product of the final state; the summary."""
    final, scan = iterated.final, inputs.scan
    verdict = judge(obj=final.object, probe=final.probe, positions_px=final.positions_px,
                    loss_history=final.loss_history, propagation=inputs.propagation,
                    data=given.regime)
    notes = inputs.notes + verdict.notes
    if verdict.verdict == "suspect":
        verdict.reasons += notes
        log.warning("%s: the result is SUSPECT: %s", scan.source, " ".join(verdict.reasons))
    else:
        log.info("%s: the result is trusted", scan.source)
    previews = dict(iterated.live_previews)
    previews.update(_final_previews(job, inputs, start.frame, given, final,
                                    suspect=verdict.verdict == "suspect"))
    product_path = _write_product(job, inputs, start, final, verdict)
    times = iterated.times
    return ReconstructSummary(
        iterations=final.iteration,
        iterations_this_run=final.iteration - iterated.start_iteration,
        seconds_per_iteration=statistics.median(times[1:]) if len(times) > 1 else (
            times[0] if times else None),
        final_loss=final.loss_history[-1] if final.loss_history else None,
        device=iterated.device,
        fft=iterated.fft,
        product=str(product_path),
        previews=[str(p) for p in previews.values()],
        resumed_from_iteration=start.resumed_from,
        continuation=start.continuation,
        checkpoint=iterated.checkpoint_file,
        checkpoint_errors=iterated.checkpoint_errors,
        n_frames=inputs.n,
        algorithm=inputs.params.algorithm,
        seconds=time.perf_counter() - t_start,
        initial_probe=start.initial_probe,
        propagation=inputs.propagation.model,
        focus_distance_m=inputs.focus_distance_m,
        object_pixel_size_m=start.frame.pixel_size_m,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        verdict_metrics=verdict.metrics,
        notes=notes,
        parameters=settings_used(inputs.params, inputs.n),
    )


def _final_previews(job: ReconstructJob, inputs: Inputs, frame: ScanFrame,
                    given: EngineInput, final: ReconState, suspect: bool) -> dict[str, Path]:
    """The previews of the final state, marked SUSPECT when the verdict is (none of a
    diverged state: it is reported instead)."""
    from beamflow.ptycho.quality.previews import write_previews

    try:
        previews = write_previews(
            job.out / "previews", final.object, final.probe, frame.pixel_size_m,
            final.loss_history, scan_extent_px=given.extent,
            title=inputs.title(final.iteration), positions_px=final.positions_px,
            noise_floor=given.regime.noise_floor, suspect=suspect,
            spacings_m=inputs.params.slice_spacings)
        if "opr_weights" in final.extras:  # the variable probe: its weights along the scan
            from beamflow.ptycho.quality.figures import headline
            from beamflow.ptycho.quality.opr_previews import write_opr_preview

            path = write_opr_preview(job.out / "previews", final.extras["opr_weights"],
                                     final.probe,
                                     title=headline(inputs.title(final.iteration), suspect))
            previews[path.stem] = path
        return previews
    except ValueError as e:  # a diverged state: report, do not draw it
        log.warning("previews not written: %s", e)
        return {}


def _write_product(job: ReconstructJob, inputs: Inputs, start: Start, final: ReconState,
                   verdict: Verdict) -> Path:
    """The Ptychodus product of the final state, with the verdict."""
    scan, frame, n = inputs.scan, start.frame, inputs.n
    positions_m = frame.to_metres(final.positions_px)
    centre_y, centre_x = frame.centre_m()
    product_path = job.out / "product.h5"
    write_product(product_path, Product(
        name=job.name or scan.name,
        comments=f"beamflow {inputs.params.algorithm}, {final.iteration} iterations, {n} "
                 f"frames, initial probe from {start.initial_probe}; settings: "
                 + ", ".join(f"{k}={v}" for k, v in settings_used(inputs.params, n).items()),
        detector_object_distance_m=scan.geometry.distance_m,
        photon_energy_eV=scan.geometry.energy_eV,
        probe_photon_count=float(np.sum(np.abs(final.probe) ** 2)),
        probe=final.probe,
        probe_pixel_width_m=frame.pixel_size_m,
        probe_pixel_height_m=frame.pixel_size_m,
        object=final.object,
        object_layer_spacing_m=np.asarray(inputs.params.slice_spacings, np.float64),
        object_center_x_m=centre_x,
        object_center_y_m=centre_y,
        object_pixel_width_m=frame.pixel_size_m,
        object_pixel_height_m=frame.pixel_size_m,
        probe_position_indexes=np.arange(n),
        probe_position_x_m=positions_m[:, 1],
        probe_position_y_m=positions_m[:, 0],
        loss_epochs=np.arange(1, len(final.loss_history) + 1),
        loss_values=np.asarray(final.loss_history),
        propagation=inputs.propagation.model,
        focus_distance_m=inputs.focus_distance_m,
        verdict=verdict.verdict,
        verdict_reasons=verdict.reasons,
        opr_eigen_probes=final.extras.get("opr_eigen_probes"),
        opr_weights=final.extras.get("opr_weights"),
    ))
    return product_path
