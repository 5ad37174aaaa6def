"""A compiled graph's device work recorded once and replayed (a CUDA graph; OpenCL's GPU family: a recorded
command list, devices/opencl/graphs.py), on devices with "graph_replay".

Interpreted op by op, a compiled graph costs tens of microseconds of Python per kernel: an SD1.5 UNet step
on an H200 spent 89 of its 344 ms on the GPU (docs/GPU_H200.md). Its kernels, sizes and buffers are the
same at every call of one signature, so the second call of a signature records them (``be._capture``) and
the later ones replay the recording: the inputs copied into the recorded input arrays, one graph launch,
the outputs downloaded.

A signature (``key``) is the inputs' shapes, dtypes and devices, the SymInt values and the weights'
versions: a new image size, a LoRA patch or a weight written in place is another signature, recorded when
it repeats. A recording holds the weights' and folded constants' device arrays it reads (``pins``) and is
dropped when the weights cache lets any device copy go (``Weights.generation``) or the device retires its
graphs (``be._graph_valid``: ComfyUI unloading models). Not recorded: graphs with a seeded random op (a
replay would repeat its numbers), with host fallbacks, or whose outputs include a host tensor of the call;
a recording that fails (a transfer or synchronisation inside an op, streamed weights) falls back to the
eager run, and after ``MAX_FAILURES`` the graph stops trying. ANYDEVICE_GRAPHS=0 turns replays off.
"""
from __future__ import annotations

import logging

log = logging.getLogger("anydevice")

#: recordings kept per compiled graph (the newest signatures; each holds its own activation memory)
MAX_RECORDS = 2
#: failed recordings after which a compiled graph runs eagerly for good
MAX_FAILURES = 2


def _torch():
    import torch
    return torch


def _draws(torch, n) -> bool:
    """Whether node ``n`` draws random numbers (a replay would repeat them): a seeded op, but for
    attention without dropout (torch tags every SDPA op seeded for its dropout)."""
    t = n.target
    if not (isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags):
        return False
    if "attention" not in t.__name__:
        return True
    names = [a.name for a in t._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = n.kwargs.get("dropout_p", n.args[i] if len(n.args) > i else 0.0)
    return not isinstance(p, (int, float)) or p != 0


class _Record:
    __slots__ = ("graph", "inputs", "outs", "pins", "generation", "moved")

    def __init__(self, graph, inputs, outs, pins, generation, moved):
        self.graph, self.inputs, self.outs, self.pins, self.generation = graph, inputs, outs, pins, generation
        self.moved = moved  # the bytes its ops read and write (report.COUNT_MOVED), added per replay


class Replays:
    """The recordings of one compiled graph (``Lowered.replays``), by signature."""

    def __init__(self):
        self.records: dict = {}
        self.seen: set = set()
        self.failures = 0
        #: why the last recording failed ("" when none did)
        self.reason = ""

    @classmethod
    def make(cls, lw) -> "Replays | None":
        """Replays for ``lw``, or None where its device or graph cannot be replayed (``why_not``)."""
        return None if cls.why_not(lw) else cls()

    @staticmethod
    def why_not(lw) -> str:
        """Why ``lw`` is not recorded ("" where it may be)."""
        from ..system import config
        if "graph_replay" not in lw.be.caps.fused:
            return f"{lw.be.name} records no device graphs"
        if not config.get("ANYDEVICE_GRAPHS"):
            return "ANYDEVICE_GRAPHS=0"
        torch = _torch()
        for n in lw.nodes:
            if _draws(torch, n):
                return f"{n.target} draws random numbers"
            if lw.kind[n] == "host":
                return f"{n.target} runs on the host"
        return ""

    def key(self, lw, args, vkeys):
        torch = _torch()
        parts = []
        for i, n in enumerate(lw.placeholders):
            v, k = args[i], lw.kind[n]
            if isinstance(v, torch.Tensor):
                parts.append(vkeys.get(n) if k == "static" else (tuple(v.shape), v.dtype, v.device))
            else:
                parts.append(v)
        try:
            key = tuple(parts)
            hash(key)
        except TypeError:
            return None
        return key

    def call(self, lw, args, vkeys):
        """The graph's outputs for ``args`` from a recording (made now where this signature repeats), or
        None: the caller runs the graph eagerly."""
        key = self.key(lw, args, vkeys)
        if key is None:
            return None
        rec = self.records.get(key)
        if rec is not None:
            if rec.generation == lw.weights.generation and lw.be._graph_valid(rec.graph):
                return self._replay(lw, rec, args, key)
            del self.records[key]  # a weight's device copy went, or the device retired its graphs
        if key not in self.seen or self.failures >= MAX_FAILURES:
            if len(self.seen) > 64:
                self.seen.clear()
            self.seen.add(key)  # recorded when it repeats: the first call builds kernels, uploads weights
            return None
        return self._record(lw, key, args, vkeys)

    def _uploads(self, lw, args):
        """[(argument index, device array)] of the call's tensor inputs, each in an array of the recording's
        own (an upload may be a view of the caller's tensor: a CUDA tensor through DLPack, whose memory the
        caller reuses; later calls copy their inputs into these arrays)."""
        torch = _torch()
        be = lw.be
        out = []
        for i, n in enumerate(lw.placeholders):
            v = args[i]
            if lw.kind[n] == "input" and isinstance(v, torch.Tensor) and n not in lw.packed_nodes:
                a = lw.upload_input(v, n.name)
                own = be._empty(be._shape(a), be._dtype(a))
                be._copy_into(own, a)
                out.append((i, own))
        return out

    def _record(self, lw, key, args, vkeys):
        be = lw.be
        inputs = self._uploads(lw, args)
        pins: dict = {}
        generation = lw.weights.generation
        moved = lw.stats.moved
        try:
            graph, outs = be._capture(lambda: lw._run(
                args, vkeys, inputs={lw.placeholders[i]: a for i, a in inputs}, pending=True, pins=pins))
        except Exception as exc:  # noqa: BLE001 - run eagerly (a real error is raised there again)
            if lw.is_cancel_or_oom(exc):
                raise
            self._failed(lw, f"{type(exc).__name__}: {exc}")
            return None
        if graph is None:  # the work ran but was not kept (a device recording as it runs: OpenCL)
            self._failed(lw, be._capture_reason() or "not kept")
            return lw.collect(outs)
        if lw.weights.generation != generation:  # an upload inside replaced a weight: record again later
            return None
        rec = _Record(graph, inputs, outs, list(pins.values()), generation, lw.stats.moved - moved)
        while len(self.records) >= MAX_RECORDS:
            self.records.pop(next(iter(self.records)))
        be._launch_graph(graph)
        if not be._graph_checks(graph):  # a check the recording assumed failed: its outputs are not used
            self._drop(lw, key, "a data-dependent check failed")
            return None
        self.records[key] = rec
        lw.count.add("recorded")
        return lw.collect(outs)

    def _replay(self, lw, rec, args, key):
        from ..system import cancel
        cancel.check()
        be = lw.be
        for i, a in rec.inputs:
            be._copy_into(a, lw.upload_input(args[i], lw.placeholders[i].name))
        be._launch_graph(rec.graph)
        if not be._graph_checks(rec.graph):  # (an Inf or NaN met a path that assumed none: run op by op)
            self._drop(lw, key, "a data-dependent check failed in a replay")
            return None
        if rec.moved:
            lw.count.add("moved", rec.moved)
        lw.count.add("replayed")
        return lw.collect(rec.outs)

    def _failed(self, lw, reason: str) -> None:
        """A recording of ``lw`` that is not used (``MAX_FAILURES`` of them: the graph stops trying)."""
        self.failures += 1
        self.reason = reason
        log.info("anydevice compile: %s is not recorded as a device graph on %s (%s); it runs op by op",
                 lw.name, lw.be.name, reason)

    def _drop(self, lw, key, reason: str) -> None:
        """Forget ``key``'s recording (made again when the signature repeats), counted as a failure."""
        self.records.pop(key, None)
        self.seen.discard(key)
        self._failed(lw, reason)
