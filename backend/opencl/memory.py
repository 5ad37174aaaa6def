"""OpenCL device arrays (``CLArray``: shape + pooled buffer + element offset, C-contiguous) and
the size-bucketed buffer pool they come from."""
from __future__ import annotations

import logging
import math
import sys
import threading
import time

import numpy as np

from .device import _cl

log = logging.getLogger("anydevice")


class _Block:
    """One pooled buffer; goes back to the pool when the last array referencing it is dropped."""
    __slots__ = ("buf", "nbytes", "pool")

    def __init__(self, buf, nbytes, pool):
        self.buf, self.nbytes, self.pool = buf, nbytes, pool

    def __del__(self):
        pool = self.pool
        if pool is not None and not sys.is_finalizing():  # at exit the driver frees everything; the
            try:                                            # pool's lock may be held by a stopped thread
                pool.release(self.buf, self.nbytes)
            except Exception:
                pass


class BufferPool:
    """Size-bucketed free lists of cl.Buffer. A buffer is only here while no _Block holds it.

    Bounded by ``limit`` and, on a CPU device (PoCL: its buffers are host RAM, taken from ComfyUI's
    models), by HOST_SHARE of the host's available RAM; there, when the host is short (less free than
    twice the request plus what the pool keeps), a miss also gives back as many pooled bytes (of
    other sizes) as it allocates, so the pool does not add to a peak. (Giving them back on every miss
    made a model whose sizes alternate thrash: each miss freed the buffers the next op needed, and
    every call malloc'ed and page-faulted its working set again.) Emptied when nothing was allocated
    for IDLE_S seconds (a timer), and by ``clear()`` (``free_memory()``: ComfyUI asking for memory).

    The lock is re-entrant: a _Block finalised by the garbage collector inside a locked section of
    the same thread gives its buffer back without deadlocking."""

    #: on a CPU device, the pool keeps at most this share of the host's available RAM
    HOST_SHARE = 1 / 16
    #: seconds without an allocation after which the pooled buffers go back to the driver
    IDLE_S = 10.0

    def __init__(self, ctx, limit_bytes: int, host_ram: bool = False):
        self.ctx = ctx
        self.limit = limit_bytes
        self.host_ram = host_ram
        self.free: dict[int, list] = {}
        self.pooled = 0
        self.live = 0  # bytes of buffers held by arrays
        self.hits = 0
        self.misses = 0
        self.lock = threading.RLock()
        self.last_use = time.monotonic()
        self._timer = None

    @staticmethod
    def bucket(nbytes: int) -> int:
        nbytes = max(64, int(nbytes))
        if nbytes <= 4096:
            return 1 << (nbytes - 1).bit_length()
        step = 1 << max(12, (nbytes - 1).bit_length() - 3)  # 8 buckets per power of two
        return -(-nbytes // step) * step

    def bound(self) -> int:
        """The most the pool may keep now."""
        if not self.host_ram:
            return self.limit
        from ..memstat import free_bytes
        return min(self.limit, int(free_bytes(None)[0] * self.HOST_SHARE))

    def alloc(self, nbytes: int) -> _Block:
        size = self.bucket(nbytes)
        with self.lock:
            self.last_use = time.monotonic()
            self.live += size
            lst = self.free.get(size)
            if lst:
                buf = lst.pop()
                self.pooled -= size
                self.hits += 1
                return _Block(buf, size, self)
            self.misses += 1
            spare = self._evict(size) if self.host_ram and self.pooled and self._short(size) else []
        for b in spare:  # host RAM: a new buffer takes the place of pooled ones of other sizes
            b.release()
        cl = _cl()
        try:
            try:
                buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
            except Exception:
                self.clear()
                buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
        except BaseException:
            with self.lock:
                self.live -= size
            raise
        return _Block(buf, size, self)

    def release(self, buf, size: int) -> None:
        with self.lock:
            self.live -= size
            if self.pooled + size <= self.bound():
                self.free.setdefault(size, []).append(buf)
                self.pooled += size
                self._arm()
                return
        buf.release()

    def _short(self, nbytes: int) -> bool:
        """(lock held) Whether the host has less RAM free than twice ``nbytes`` plus the pooled bytes."""
        from ..memstat import free_bytes
        return free_bytes(None, 2 * nbytes)[0] < 2 * nbytes + self.pooled

    def _evict(self, nbytes: int) -> list:
        """(lock held) Take at least ``nbytes`` of pooled buffers out (the largest first), to release."""
        out, got = [], 0
        for size in sorted(self.free, reverse=True):
            lst = self.free[size]
            while lst and got < nbytes:
                out.append(lst.pop())
                got += size
                self.pooled -= size
            if not lst:
                del self.free[size]
            if got >= nbytes:
                break
        return out

    def _arm(self) -> None:
        """(lock held) A timer that empties the pool once it has been idle IDLE_S seconds."""
        if self._timer is None:
            delay = max(0.05, self.last_use + self.IDLE_S - time.monotonic())
            self._timer = threading.Timer(delay, self._idle)
            self._timer.daemon = True
            self._timer.start()

    def _idle(self) -> None:
        with self.lock:
            self._timer = None
            if not self.pooled:
                return
            if time.monotonic() - self.last_use < self.IDLE_S:
                self._arm()
                return
        log.debug("AnyDevice: OpenCL buffer pool idle for %.0f s, %d MB given back", self.IDLE_S,
                  self.pooled >> 20)
        self.clear()

    def clear(self) -> None:
        with self.lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            spare = [b for lst in self.free.values() for b in lst]
            self.free.clear()
            self.pooled = 0
        for b in spare:  # outside the lock: the driver's release may take a while
            b.release()


class CLArray:
    """A C-contiguous float32 array in an OpenCL buffer (read-only once made; ops never write it)."""
    __slots__ = ("shape", "block", "offset", "size", "__weakref__")
    dtype = np.dtype(np.float32)

    def __init__(self, shape, block: _Block, offset: int = 0):
        self.shape = tuple(int(s) for s in shape)
        self.block = block
        self.offset = int(offset)
        self.size = math.prod(self.shape)

    @property
    def buffer(self):
        return self.block.buf

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def __repr__(self):
        return f"CLArray(shape={self.shape}, offset={self.offset})"


def _contig_strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def _collapse(shape, *stride_sets):
    """Drop size-1 dims and merge dims that are contiguous in every stride set."""
    dims = [(s, [st[i] for st in stride_sets]) for i, s in enumerate(shape) if s != 1]
    if not dims:
        return (1,), [(1,) for _ in stride_sets]
    out = [dims[0]]
    for s, st in dims[1:]:
        ps, pst = out[-1]
        if all(pst[j] == st[j] * s for j in range(len(st))):
            out[-1] = (ps * s, st)
        else:
            out.append((s, st))
    shape2 = tuple(s for s, _ in out)
    return shape2, [tuple(st[j] for _, st in out) for j in range(len(stride_sets))]
