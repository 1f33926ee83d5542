"""The reconstruction job: scan file in -> engine with checkpoints -> product + previews out.

``beamflow reconstruct`` and the compute function (through :mod:`beamflow.job.task`) run a
job with :func:`beamflow.job.run.run_reconstruction`, a build of named steps, one module each:

    models.py        what a job is asked and answers: ReconstructJob, RunParameters,
                     ReconstructSummary, FunctionSummary, ReconstructError
    run.py           the entry: run_reconstruction, the steps below in order
    load.py          1. load: the scan, its propagation model, the frames
    start.py         2. starting point: a compatible checkpoint, or a fresh object frame
    engine_input.py  3. engine input: the engine's data, the starting state and probe
    iterate.py       4. iterate: the engine, with checkpoints, live previews, progress
    finish.py        5. finish: the verdict, the final previews, the product, the summary
    checkpoints.py   the job's checkpoints: fingerprint, metadata, resuming, their previews
    snapshots.py     the thread that hands a state copied to the host to its users
    live_previews.py the helper process that draws the live previews
    task.py          the compute function's work: check, confine, build the job, run, report

Output directory::

    DIR/product.h5              Ptychodus product (written at the end)
    DIR/previews/*.png          object phase (windowed and full range), amplitude, probe,
                                convergence (refreshed every few iterations and at the end)
    DIR/checkpoints/            L2 checkpoints + LATEST.json (beamflow.checkpoint)

Resuming: when ``DIR/checkpoints`` (or the node-local L1 level) holds a checkpoint, the job
continues from it if it is compatible (:mod:`beamflow.job.checkpoints` holds the rules):
the same geometry, frame shape, probe modes and algorithm (hard; a mismatch is refused with
the differences named), the same frames or MORE frames of the same scan (the stored frames
are a prefix of the current ones: the reconstruction goes on with the new positions
appended). Other settings (step sizes, iteration budget, batch size) may change; the
differences are logged.

``iterations`` counts iterations over the current data, from the iteration where it began
(``since``: 0, or where a continuation added frames): a fresh run or a resume of the same
data stops at ``iterations`` in total; a continuation with more frames runs ``iterations``
more. The iteration the job stops at, ``since + iterations``, has its own name,
``stop_iteration`` (the engine's ``ReconParams.iterations`` is such a total: the job hands it
that). Resuming is exact: N iterations straight and k + kill + resume + N-k give
bit-identical results (numpy backend, same thread count).

Nothing is imported here: the run path reads ``beamflow.job.models`` alone, and the
live-preview helper starts as ``python -m beamflow.job.live_previews`` with its own
imports only.
"""
