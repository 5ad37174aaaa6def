"""Compiled graphs replayed on OpenCL (capability "graph_replay", compile/replay.py): a graph's device work
is a ``Recording`` of replay.py (the launches with their prepared arguments, the copies and fills), made
while the graph runs once op by op and enqueued again at later calls without the per-op Python (tens of
microseconds a kernel, ~1 600 kernels a call of the compact upscaler).

OpenCL runs the commands while they are recorded, so the first launch after ``_capture`` has nothing left
to do. The data-dependent checks a recording keeps as guards (the finiteness flags of the Winograd and
GEMM-fallback paths, assumed to pass while recording) are read after each launch by ``_graph_checks``:
where one fails, the caller drops the recording and runs the graph op by op, which takes the exact path.

A recording pins the buffers it touches (nothing else is handed them while it lives; replay.py's
MAX_PINNED_BYTES bounds them): dropped graphs give theirs back through a queue that the next capture,
launch or ``free_memory`` empties (a finaliser runs on any thread, maybe inside the pool's lock: it only
appends). ``free_memory`` (ComfyUI unloading models) retires every graph: none runs again."""
from __future__ import annotations

import collections
import weakref


class GraphBreak(RuntimeError):
    """The graph's work could not be recorded (why: the recording's reason)."""


class _Graph:
    """A recorded graph: its Recording, the epoch it was made in, and whether it has run since it was
    recorded (the recording ran it)."""
    __slots__ = ("rec", "epoch", "fresh", "__weakref__")

    def __init__(self, rec, epoch):
        self.rec, self.epoch, self.fresh = rec, epoch, True


class CLGraphs:
    """graph_replay of OpenCLBackend (uses its record, _assign and pool)."""

    #: raised by free_memory: graphs of an older epoch do not run again
    _graph_epoch = 0

    def _graphs_closing(self) -> collections.deque:
        q = self.__dict__.get("_closing")
        if q is None:
            q = self.__dict__.setdefault("_closing", collections.deque())
        return q

    def _close_dropped_graphs(self) -> None:
        """Give back the buffers of the graphs dropped since the last call (their finalisers queued them)."""
        q = self._graphs_closing()
        for _ in range(len(q)):
            try:
                rec = q.popleft()
            except IndexError:
                return
            rec.close()

    def _capture(self, fn):
        """(graph, fn()); (None, fn()) where the work ran but could not be kept (too many buffers or checks:
        ``_capture_reason`` says why), its outputs valid; raises GraphBreak where they may not be (a check the
        recording assumed failed)."""
        self._close_dropped_graphs()
        with self.record() as rec:
            try:
                result = fn()
            except BaseException:  # (cancelled, out of memory, a real error: raised again by the op-by-op run)
                rec.close()
                raise
        if not rec.ok:  # (its buffers went back when it failed: Recording.fail)
            if rec.guards and not rec.guards_pass():
                raise GraphBreak(rec.reason)
            self.__dict__["_capture_why"] = rec.reason
            return None, result
        g = _Graph(rec, self._graph_epoch)
        weakref.finalize(g, self._graphs_closing().append, rec)
        return g, result

    def _capture_reason(self) -> str:
        """Why the last ``_capture`` that returned no graph kept none."""
        return self.__dict__.get("_capture_why", "")

    def _launch_graph(self, g) -> None:
        self._close_dropped_graphs()
        if g.fresh:  # (recording ran the commands)
            g.fresh = False
            return
        g.rec.replay()

    def _graph_checks(self, g) -> bool:
        """Whether the last launch's guards held (reads them back: waits for the queue); False: its outputs
        may be wrong (an Inf or NaN met a path that assumed none), the caller runs the graph op by op."""
        return not g.rec.guards or g.rec.guards_pass()

    def _copy_into(self, dst, src) -> None:
        self._assign(dst, src)

    def _graph_valid(self, g) -> bool:
        return g.epoch == self._graph_epoch

    def _retire_graphs(self) -> None:
        """No recorded graph runs again (free_memory); their buffers come back as the graphs are dropped."""
        self._graph_epoch += 1
        self._close_dropped_graphs()
