"""What the compiled graphs did: host fallbacks per ATen op, transfers, graphs, calls.

One ``Stats`` per compiled graph, plus the process-wide one that ``last_report()`` reads (everything
since ``reset_report()``). Every count goes to both. A fallback op kind is logged once (logger
"anydevice"), with the op's name; the report counts every call.
"""
from __future__ import annotations

import logging
import re
import threading
from collections import Counter

log = logging.getLogger("anydevice")

#: "streamed": weights uploaded for one use because they did not fit the device budget (lowering.Weights)
TRANSFER_KEYS = ("uploads", "downloads", "bytes_up", "bytes_down", "constants", "bytes_constants",
                 "streamed", "bytes_streamed")

_lock = threading.Lock()
_logged: set[str] = set()


class Stats:
    """Counters of one compiled graph (or of everything: ``GLOBAL``)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        if self is GLOBAL_HOLDER[0]:
            LIMIT_HITS.clear()
        self.fallbacks: Counter = Counter()
        self.transfers = dict.fromkeys(TRANSFER_KEYS, 0)
        self.graphs = 0
        self.calls = 0
        self.eager_fallbacks = 0
        self.folded = 0
        #: device graphs recorded, and calls served by replaying one (compile/replay.py)
        self.recorded = 0
        self.replayed = 0
        #: bytes the device ops read and wrote (their device operands and results; counted while COUNT_MOVED)
        self.moved = 0

    def as_dict(self) -> dict:
        return {"fallbacks": dict(self.fallbacks), "transfers": dict(self.transfers), "graphs": self.graphs,
                "calls": self.calls, "eager_fallbacks": self.eager_fallbacks, "folded": self.folded,
                "recorded": self.recorded, "replayed": self.replayed, "moved": self.moved}


#: count the bytes each device op reads and writes (Stats.moved; ``anydevice bench --model`` turns it on:
#: a few microseconds an op, not paid otherwise)
COUNT_MOVED = [False]
#: whether any graph was compiled for the backend in this process (set by lowering.Lowered): only
#: then is a recompile-limit warning ours to count
ANY_COMPILED = [False]
GLOBAL_HOLDER: list = [None]
GLOBAL = Stats()
GLOBAL_HOLDER[0] = GLOBAL


class Counting:
    """Counts into a graph's Stats and GLOBAL at once."""

    def __init__(self, stats: Stats):
        self.stats = stats

    def _both(self):
        return (self.stats, GLOBAL)

    def transfer(self, key: str, nbytes: int) -> None:
        bkey = {"uploads": "bytes_up", "downloads": "bytes_down", "constants": "bytes_constants",
                "streamed": "bytes_streamed"}[key]
        with _lock:
            for s in self._both():
                s.transfers[key] += 1
                s.transfers[bkey] += int(nbytes)

    def fallback(self, op: str, why: str, device: str) -> None:
        with _lock:
            for s in self._both():
                s.fallbacks[op] += 1
            first = op not in _logged
            _logged.add(op)
        if first:
            log.warning("anydevice compile: %s runs on the host through PyTorch on %s (%s); "
                        "the report counts every call", op, device, why)

    def add(self, field: str, n: int = 1) -> None:
        with _lock:
            for s in self._both():
                setattr(s, field, getattr(s, field) + n)


def merge(stats_list) -> dict:
    """One report of several graphs' Stats."""
    out = Stats()
    for s in stats_list:
        out.fallbacks.update(s.fallbacks)
        for k in TRANSFER_KEYS:
            out.transfers[k] += s.transfers[k]
        out.graphs += s.graphs
        out.calls += s.calls
        out.eager_fallbacks += s.eager_fallbacks
        out.folded += s.folded
        out.recorded += s.recorded
        out.replayed += s.replayed
        out.moved += s.moved
    return out.as_dict()


# ---- dynamo's recompile limit: the frames it gives up on run eagerly -----------------------
class _LimitFilter(logging.Filter):
    """Counts dynamo's "hit config.recompile_limit" warnings (from then on that frame runs
    eagerly, without our graphs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a log record we cannot format is not ours to judge
            return True
        if "hit config." in msg and "limit" in msg:
            if ANY_COMPILED[0]:
                Counting(Stats()).add("eager_fallbacks")
                m = re.search(r"function: '([^']+)' \((.+):(\d+)\)", msg)
                if m:
                    with _lock:
                        LIMIT_HITS[(m.group(2), m.group(1), int(m.group(3)))] += 1
                log.warning("anydevice compile: torch's recompile limit was hit; that code now runs "
                            "eagerly in PyTorch, not on the AnyDevice backend (torch.compile(..., "
                            "dynamic=True) or torch._dynamo.config.recompile_limit avoid it)")
        return True


#: (code file, code name) -> recompile-limit hits (report attribution)
LIMIT_HITS: Counter = Counter()
_filter_installed = [False]


def watch_recompile_limit() -> None:
    if _filter_installed[0]:
        return
    _filter_installed[0] = True
    logging.getLogger("torch._dynamo.convert_frame").addFilter(_LimitFilter())
