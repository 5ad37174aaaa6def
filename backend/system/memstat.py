"""How much memory a backend's device has free: the reading behind ANYDEVICE_MAX_TENSOR_MB's
default (a fraction of it) and the OpenCL buffer pool's bound.

Host RAM (numpy, torch cpu, OpenCL on a CPU device such as PoCL): ``MemAvailable`` of
/proc/meminfo, less where a cgroup (v2 ``memory.max``) allows less; ``os.sysconf`` elsewhere.
GPUs: the driver's free memory plus what the backend's own pool holds free (CuPy's
``memGetInfo``, ``torch.cuda.mem_get_info``); an OpenCL GPU, which has no such query, its global
memory less the pool's buffers in use.

Every op checks its result's size, so a reading is kept for ``TTL_S`` seconds per device; a request
for a large share of the last reading (``FRESH_SHARE``) reads again (such an op costs far more than
the reading).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger("anydevice")

#: a default limit is this share of the free memory (ComfyUI keeps results cached: a second
#: result at the limit still fits, and the op's own scratch with it)
DEFAULT_SHARE = 0.5
TTL_S = 1.0
FRESH_SHARE = 1 / 16

_cache: dict[object, tuple[float, int, str]] = {}
#: the backend whose op is running (set for the op's call only, by ``planning``), so plans.planned
#: checks sizes against that backend's device; None outside any op
CURRENT_BACKEND: ContextVar = ContextVar("anydevice_current_backend", default=None)
_lock = threading.Lock()


@contextmanager
def planning(backend):
    """The sizes planned inside are checked against ``backend``'s device; the backend before is back after."""
    token = CURRENT_BACKEND.set(backend)
    try:
        yield
    finally:
        CURRENT_BACKEND.reset(token)


def plans_on_self(cls):
    """Class decorator for the contract's ``Backend``: each public method it has from its own package's
    classes (the op families) runs inside ``planning(self)``, so the sizes its plans check are checked
    against its own device, for that call only."""
    package = cls.__module__.rsplit(".", 1)[0] + "."
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        fn = vars(owner)[name] if owner is not None else None
        if owner is None or not (owner.__module__.startswith(package) and type(fn).__name__ == "function"):
            continue
        setattr(cls, name, _planned_on_self(fn))
    return cls


def _planned_on_self(fn):
    def op(self, *args, **kwargs):
        token = CURRENT_BACKEND.set(self)
        try:
            return fn(self, *args, **kwargs)
        finally:
            CURRENT_BACKEND.reset(token)
    op.__name__, op.__qualname__, op.__doc__, op.__wrapped__ = fn.__name__, fn.__qualname__, fn.__doc__, fn
    return op


def _cgroup_room() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            lim = f.read().strip()
        if lim == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            return max(0, int(lim) - int(f.read()))
    except (OSError, ValueError):
        return None


def host_available_bytes() -> int:
    """RAM the host can still give without swapping (MemAvailable; the cgroup's room if less)."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            free = 8 << 30  # no reading at all: the old fixed default
    room = _cgroup_room()
    return free if room is None else min(free, room)


def _reading(be) -> tuple[int, str]:
    """(free bytes, where) for the backend's device, read now."""
    if be is None:
        return host_available_bytes(), "host RAM"
    try:
        got = be.device_free_bytes()  # Device interface: None where the device's memory is the host's
    except Exception as exc:  # noqa: BLE001 - a failed query must not fail the op
        log.debug("AnyDevice: free memory of %r unknown (%s); using host RAM", be, exc)
        got = None
    if got is not None:
        return int(got), f"{be.name}:{be.index}"
    return host_available_bytes(), "host RAM"


def free_bytes(be=None, want: int = 0) -> tuple[int, str]:
    """(free bytes, where) for the backend's device (None: the host), at most TTL_S old, or read
    now where ``want`` is a large share of the last reading."""
    key = None if be is None else id(be)
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and now - hit[0] < TTL_S and want < FRESH_SHARE * hit[1]:
        return hit[1], hit[2]
    free, where = _reading(be)
    with _lock:
        _cache[key] = (now, free, where)
    return free, where


#: counts forget() calls: a cache built on these readings (the OpenCL pool's bound) reads again after one
FORGOTTEN = [0]


def forget() -> None:
    """Drop the cached readings (after memory was freed, and in tests)."""
    with _lock:
        _cache.clear()
        FORGOTTEN[0] += 1


def default_tensor_limit(be=None, want: int = 0) -> tuple[int, int, str]:
    """(limit, free, where): ANYDEVICE_MAX_TENSOR_MB's default for this backend's device."""
    free, where = free_bytes(be, want)
    return max(1, int(free * DEFAULT_SHARE)), free, where
