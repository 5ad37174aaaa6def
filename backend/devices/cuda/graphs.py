"""CUDA graphs ("graph_replay"), as a mixin of CudaBackend: a compiled graph's launches captured once
from a CuPy stream and replayed by later calls (backend/compile/replay.py decides when).

A capture records, it runs nothing: every array made while it records comes from a memory pool of its
own (``_Captured.pool``), so the addresses the graph holds stay the graph's until it is dropped; its
intermediates freed during the capture are reused by later ops of the same capture, in the same order at
every replay. A host transfer, a synchronisation or anything else CUDA cannot record raises (the pack's
own transfers raise ``CaptureBreak`` before they start, so the capture is ended cleanly) and the caller
runs the work eagerly. ``free_memory`` (ComfyUI unloading models) retires every graph made before it."""
from __future__ import annotations

import threading
import weakref


class CaptureBreak(RuntimeError):
    """A transfer or synchronisation asked for while this thread records a CUDA graph."""


class _Captured:
    """A recorded graph, the pool its arrays live in, the stream it was recorded on and its epoch."""
    __slots__ = ("graph", "pool", "stream", "epoch", "__weakref__")

    def __init__(self, graph, pool, stream, epoch):
        self.graph, self.pool, self.stream, self.epoch = graph, pool, stream, epoch


class CudaGraphs:
    """graph_replay of CudaBackend (uses its cp, hip, _enter, synchronize)."""

    #: (thread ident, capturing stream) while a thread records; None otherwise
    _capture_state = None
    #: raised by free_memory: graphs of an older epoch do not run again
    _graph_epoch = 0

    def _capturing(self) -> bool:
        st = self._capture_state
        return st is not None and st[0] == threading.get_ident()

    def _no_capture(self, what: str) -> None:
        """Refuse ``what`` (a host transfer, a synchronisation) while this thread records a graph."""
        if self._capturing():
            raise CaptureBreak(f"{what} cannot be recorded into a CUDA graph")

    def _retire_graphs(self) -> None:
        """No recorded graph runs again, and their pools' free blocks (the intermediates) go back to the
        driver now (free_memory: ComfyUI asking for memory); a recording's outputs stay until it is dropped."""
        self._graph_epoch += 1
        for cap in list(self.__dict__.get("_captures", ())):
            cap.pool.free_all_blocks()

    def _capture(self, fn):
        cp = self.cp
        if self.hip:
            raise CaptureBreak("no stream capture on ROCm through CuPy")
        if self._capture_state is not None:
            raise CaptureBreak("another thread records a CUDA graph on this device")
        self._enter()
        self.synchronize()  # nothing of this thread in flight: what follows is recorded alone
        pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(pool.malloc), stream:
            self._capture_state = (threading.get_ident(), stream)
            try:
                stream.begin_capture()
                try:
                    result = fn()
                except BaseException:
                    try:
                        stream.end_capture()
                    except Exception:  # noqa: BLE001 - an invalidated capture ends with an error too
                        pass
                    raise
                graph = stream.end_capture()
            finally:
                self._capture_state = None
        cap = _Captured(graph, pool, stream, self._graph_epoch)
        self.__dict__.setdefault("_captures", weakref.WeakSet()).add(cap)
        return cap, result

    def _launch_graph(self, cap) -> None:
        self._enter()
        cap.graph.launch(self.cp.cuda.get_current_stream())

    def _copy_into(self, dst, src) -> None:
        self._enter()
        self.cp.copyto(dst, src)

    def _graph_valid(self, cap) -> bool:
        return cap.epoch == self._graph_epoch
