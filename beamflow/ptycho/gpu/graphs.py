"""CUDA graphs of a batch: its launches recorded once, then replayed in one call.

At the default batch (128) an rPIE iteration at 4000 × 128² on an H100 held its kernels
11.3 ms and the host 35 ms: each of the 32 batches cost ~1 ms of Python and CuPy calls
(~40 launches, six FFTs, reductions) for ~0.35 ms of kernels. A graph replays the batch's
launches with one call, so the batch costs the host a copy of its indices, the replay and a
copy of its loss.

A graph replays fixed kernels with fixed arguments on fixed memory. What makes a batch's
work the same every time (:meth:`.core.Core.bind_batch`, :meth:`.algorithm.Algorithm.run_batch`):

* the batch's indices are copied, before each batch, into one device buffer per batch
  length, which the chunk's kernels read (the graph's own upload would replay stale bytes);
* the object box of a batch is the whole object (random batches span it anyway; outside a
  batch's windows the accumulators are zero, so the step skips those pixels: the same
  values; ePIE's sparse sets update their windows in place and use no box);
* a graph is keyed by the batch's length, the schedule's flags and the addresses of the
  state it reads (object, probe, ramp factors, frames); what else it reads it makes itself
  (the probe caches are dropped before the capture, so the graph computes them);
* its outputs (the chunks' losses) are copied out after each replay: the next replay writes
  the same memory;
* its temporaries come from a memory pool of the graphs' own, on a stream of their own
  (a capture needs one; graphs replay on the engine's stream, one at a time, so they may
  share temporaries): no array outside the graphs is handed that memory. A CuPy pool gives
  its cached blocks back to the device when memory runs short — blocks a graph writes at
  its next replay — so the graphs' pool takes its blocks from :meth:`BatchGraphs._device`,
  which keeps every one allocated until graphs turn off.

The first batch of a key runs as it would without graphs (it makes the FFT plans, compiles
the kernels and grows the pools: none of that may happen during a capture); the second is
captured and launched; every later one is replayed. A capture that fails (an operation a
graph cannot hold) turns graphs off for the run, with a warning, and the batch runs again
without one: slower, never wrong.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["BatchGraphs"]

log = logging.getLogger(__name__)

# Graphs kept at once. Random batches use two keys an iteration (batches of ⌊N/b⌋ and
# ⌈N/b⌉ positions); ePIE's sparse sets one per set size (tens); a schedule's flags change a
# few times a run, a new probe or object array once in a while. A graph holds only its
# launches and outputs: the temporaries are shared (the graphs' pool).
MAX_GRAPHS = 64


class BatchGraphs:
    """The graphs of an engine's batches, by key; see the module's docstring."""

    def __init__(self, cupy: Any, forget: Callable[[], None]):
        self._cp = cupy
        # Called before a capture: drop the caches the graph must make itself.
        self._forget = forget
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._blocks: list[Any] = []  # every block of device memory the graphs' pool got
        self._pool = cupy.cuda.MemoryPool(self._device)
        self._graphs: OrderedDict[Hashable, tuple[Any, list[Any]]] = OrderedDict()
        self._seen: set[Hashable] = set()
        self.enabled = True
        self.captures = 0
        self.replays = 0

    def run(self, key: Hashable, body: Callable[[], list[Any]]) -> list[Any]:
        """Run ``body`` (a batch; returns its losses, device scalars) for ``key``: as it is
        the first time, captured the second, replayed after."""
        if not self.enabled:
            return body()
        entry = self._graphs.get(key)
        if entry is None:
            if key not in self._seen:
                if len(self._seen) >= 8 * MAX_GRAPHS:  # keys of arrays long gone
                    self._seen.clear()
                self._seen.add(key)
                return body()
            entry = self._capture(key, body)
            if entry is None:
                return body()
        else:
            self._graphs.move_to_end(key)
            self.replays += 1
        graph, outputs = entry
        graph.launch(stream=self._cp.cuda.get_current_stream())
        return [v.copy() for v in outputs]

    def _device(self, size: int) -> Any:
        """A new block of device memory for the graphs' pool, kept until graphs turn off:
        the pool may drop it from its cache, but never frees it."""
        block = self._cp.cuda.MemoryPointer(self._cp.cuda.Memory(size), 0)
        self._blocks.append(block)
        return block

    def _capture(self, key: Hashable,
                 body: Callable[[], list[Any]]) -> tuple[Any, list[Any]] | None:
        self._forget()
        stream = self._stream
        try:
            with self._cp.cuda.using_allocator(self._pool.malloc), stream:
                stream.begin_capture()
                try:
                    outputs = body()
                finally:
                    graph = stream.end_capture()
        except Exception as exc:  # noqa: BLE001 - any failure: run without graphs
            self.close()
            log.warning("CUDA graph capture failed (%s: %s); running without graphs",
                        type(exc).__name__, exc)
            return None
        self.captures += 1
        self._graphs[key] = (graph, outputs)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return graph, outputs

    def close(self) -> None:
        """Turn graphs off: drop them and give their memory back to the device (at the end
        of a run — a worker runs one reconstruction after another — or a failed capture)."""
        self.enabled = False
        self._graphs.clear()
        self._seen.clear()
        self._forget()  # caches a graph made (or a failed capture never computed)
        self._cp.cuda.get_current_stream().synchronize()  # the last replays are done
        self._pool.free_all_blocks()
        self._blocks.clear()
