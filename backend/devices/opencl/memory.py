"""OpenCL device arrays (``CLArray``: shape + pooled buffer + element offset, C-contiguous) and
the size-bucketed buffer pool they come from.

Thread safety of the pool (``BufferPool``):

- Any thread may allocate, drop arrays, ``clear()`` and read ``pooled``/``live`` at any time.
- A finaliser (``_Block.__del__``, run by whichever thread drops the last reference or runs the
  garbage collector, at any allocation, even inside another pool call or the bootstrap of a new
  thread) takes no lock and calls nothing: it appends ``(buffer, size)`` to ``returned``, a
  ``collections.deque`` (``append`` and ``popleft`` are atomic in CPython). The next normal pool call
  (``alloc``, ``release``, ``clear``, reading ``pooled``/``live``, the idle timer) drains it into
  the free lists.
- ``lock`` (not re-entrant) guards the free lists and the counters only. Nothing that can wait runs
  while it is held: no thread is started (the idle timer is armed after the lock is let go), no
  OpenCL call (buffers are created and released outside it), no host RAM reading (taken before),
  no logging. A thread that holds it therefore always lets go of it, whatever the other threads
  and the garbage collector do (a finaliser that waited for it deadlocked the timer thread, which
  held it while ``Timer.start()`` waited for a new thread whose bootstrap ran that finaliser).
- At interpreter exit nothing goes back to the pool: the driver frees everything.
- Reuse is safe because every launch of the pool's users goes to one in-order command queue: a buffer
  dropped on the host may be handed out again at once, the commands still reading it run first. A
  thread with a queue of its own (the warm-up thread, warm.py) marks itself ``private.on``: its
  allocations are new buffers that never enter the free lists (the driver frees them once their last
  command ran), so neither queue writes a buffer the other still reads (a pooled buffer the self-check
  had dropped, rewritten by the warm-up queue, gave a wrong conv at first use on a cold cache).

Huge pages: on a CPU device the pool asks Linux for transparent huge pages under every new buffer of
HUGE_PAGES_MIN_BYTES or more (``madvise(MADV_HUGEPAGE)`` on the memory PoCL gave the buffer, whose address a
non-blocking map on a queue of the pool's own tells before anything has touched it; the map and its unmap wait for
nothing). Fewer TLB misses where a GEMM walks a packed panel (NumPy's arrays, and so PyTorch's inputs in the bench,
have huge pages already): 2-core Intel Xeon with AVX-512, two backends in one process, one advising and one not,
alternating, 15 rounds: matmul 2048^2 62.2 -> 58.7 and 60.0 -> 58.0 ms, 2000^2 56.6 -> 55.5; 1024^2 level.
Off with ANYDEVICE_HUGE_PAGES=0, and where the kernel's THP setting is ``never``.

Wrapped host memory (``_HostBlock``, ``BufferPool.wrap``): on a CPU device a float32 constant the
caller promises not to write (a compiled weight, ``to_device(..., share=True)``) is a
``CL_MEM_USE_HOST_PTR`` buffer on the caller's memory, not a copy. Such a block holds the host array
(and so the memory under it) while any array uses it, never enters the free lists and is not in
``live``/``peak`` (that memory is the caller's: a model's weights); ``wrapped`` counts its bytes. Its
finaliser, like ``_Block``'s, only appends to a deque (``unwrapped``).
"""
from __future__ import annotations

import collections
import logging
import math
import sys
import threading
import time

import numpy as np

from ...ops.quant import DeviceQuant
from .device import _cl

log = logging.getLogger("anydevice")

#: new buffers of at least this many bytes on a CPU device ask for transparent huge pages (module docstring)
HUGE_PAGES_MIN_BYTES = 2 << 20
_HUGE = 2 << 20  # the huge page size advised in whole pages (x86-64, arm64 with 4 KiB pages)


def _madvise_fn():
    """libc's madvise as (address, length) -> int where this is Linux with THP not ``never``; else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import mmap
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                return None
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
        fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
        advice = mmap.MADV_HUGEPAGE
        return lambda addr, length: fn(addr, length, advice)
    except Exception as exc:  # noqa: BLE001 (no libc, no THP: the pages stay as they are)
        log.debug("anydevice: no transparent huge pages: %s", exc)
        return None


_MADVISE: list = []  # [the function or None], looked up once


class _Block:
    """One pooled buffer; goes back to the pool when the last array referencing it is dropped."""
    __slots__ = ("buf", "nbytes", "pool", "__weakref__")

    def __init__(self, buf, nbytes, pool):
        self.buf, self.nbytes, self.pool = buf, nbytes, pool

    def __del__(self):
        pool = self.pool
        # at exit the driver frees everything (and the module's globals, sys too, may be gone already)
        if pool is not None and sys is not None and not sys.is_finalizing():  # at exit the driver frees everything
            try:  # no lock, no call: the pool's next call takes it (see the module docstring)
                pool.returned.append((self.buf, self.nbytes))
            except Exception:
                pass


class _HostBlock:
    """A buffer on host memory the caller owns (``CL_MEM_USE_HOST_PTR``): never pooled, never live; keeps
    ``host`` (the NumPy array on that memory) alive for as long as an array references the block. Weakly
    referable: derived data of a constant kept while it lives (winograd.py's transformed weights)."""
    __slots__ = ("buf", "nbytes", "host", "pool", "__weakref__")

    def __init__(self, buf, nbytes, host, pool):
        self.buf, self.nbytes, self.host, self.pool = buf, nbytes, host, pool

    def __del__(self):
        pool = self.pool
        if pool is not None and sys is not None and not sys.is_finalizing():
            try:  # no lock, no call (see the module docstring); the buffer itself goes with this block
                pool.unwrapped.append(self.nbytes)
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

    Dropped blocks come back through ``returned`` (finalisers take no lock; see the module
    docstring for the thread-safety contract). The idle timer runs while anything is pooled or in
    use (every IDLE_S seconds while only arrays in use are left), so a buffer dropped after the
    last allocation is still given back to the driver."""

    #: on a CPU device, the pool keeps at most this share of the host's available RAM
    HOST_SHARE = 1 / 16
    #: seconds without an allocation after which the pooled buffers go back to the driver
    IDLE_S = 10.0
    #: the idle timer's shortest delay
    MIN_DELAY_S = 0.05
    #: seconds ``bound`` keeps its reading of the host's free RAM (every allocation asks)
    BOUND_TTL_S = 0.05

    def __init__(self, ctx, limit_bytes: int, host_ram: bool = False):
        self.ctx = ctx
        self.limit = limit_bytes
        self.host_ram = host_ram
        self.free: dict[int, list] = {}
        self._pooled = 0
        self._live = 0  # bytes of buffers held by arrays (and dropped ones not yet drained)
        self.peak = 0  # the most ``_live`` has been since reset_peak()
        self.hits = 0
        self.misses = 0
        self.returned: collections.deque = collections.deque()  # (buffer, size) from finalisers
        self._wrapped = 0  # bytes of host memory wrapped by live _HostBlocks (not in _live)
        self.unwrapped: collections.deque = collections.deque()  # sizes of dropped _HostBlocks
        self.lock = threading.Lock()
        self.last_use = time.monotonic()
        self._timer = None
        self._timer_due = 0.0  # when the armed timer fires (time.monotonic)
        self._bound = None  # (time.monotonic, bound, memstat.FORGOTTEN) of the last reading
        self.pinned: dict = {}  # id(buffer) -> [buffer, recordings pinning it, bytes counted]: kept when dropped (replay.py)
        self.pinned_bytes = 0  # their bytes
        self.kept: list = []  # (buffer, size) dropped while pinned: still live, never pooled
        self.private = threading.local()  # ``on`` in a thread with a command queue of its own (see above)

    @property
    def pooled(self) -> int:
        """Bytes in the free lists (the blocks dropped so far taken in first)."""
        self._drain()
        return self._pooled

    @property
    def live(self) -> int:
        """Bytes of buffers held by arrays (the blocks dropped so far taken in first)."""
        self._drain()
        return self._live

    @property
    def wrapped(self) -> int:
        """Bytes of host memory that arrays use in place (``wrap``): the caller's, not in ``live``."""
        with self.lock:
            while self.unwrapped:
                self._wrapped -= self.unwrapped.popleft()
            return self._wrapped

    def wrap(self, host: np.ndarray) -> _HostBlock:
        """A block on the memory of ``host`` (C-contiguous float32, never written while the block lives),
        no copy: a read-only ``CL_MEM_USE_HOST_PTR`` buffer. Not pooled, not counted as live."""
        cl = _cl()
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.USE_HOST_PTR, hostbuf=host)
        with self.lock:
            self._wrapped += host.nbytes
        return _HostBlock(buf, host.nbytes, host, self)

    def reset_peak(self) -> int:
        """The peak of live bytes so far; from now on the peak counts from what is live."""
        self._drain()
        with self.lock:
            peak, self.peak = self.peak, self._live
        return peak

    @staticmethod
    def bucket(nbytes: int) -> int:
        nbytes = max(64, int(nbytes))
        if nbytes <= 4096:
            return 1 << (nbytes - 1).bit_length()
        step = 1 << max(12, (nbytes - 1).bit_length() - 3)  # 8 buckets per power of two
        return -(-nbytes // step) * step

    def bound(self) -> int:
        """The most the pool may keep now (reads the host's free RAM: never with the lock held; the reading
        is kept BOUND_TTL_S, as memstat keeps its own)."""
        if not self.host_ram:
            return self.limit
        from ...system import memstat
        now = time.monotonic()
        hit = self._bound
        if hit is not None and now - hit[0] < self.BOUND_TTL_S and hit[2] == memstat.FORGOTTEN[0]:
            return hit[1]
        b = min(self.limit, int(memstat.free_bytes(None)[0] * self.HOST_SHARE))
        self._bound = (now, b, memstat.FORGOTTEN[0])
        return b

    def alloc(self, nbytes: int) -> _Block:
        size = self.bucket(nbytes)
        if getattr(self.private, "on", False):  # another queue's buffer: never pooled (module docstring)
            cl = _cl()
            return _Block(cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size), size, None)
        bound = self.bound() if self.returned else None
        buf = None
        with self.lock:
            spare = self._take_returned(bound)
            self.last_use = time.monotonic()
            self._live += size
            if self._live > self.peak:
                self.peak = self._live
            lst = self.free.get(size)
            if lst:
                buf = lst.pop()
                self._pooled -= size
                self.hits += 1
            else:
                self.misses += 1
            pooled = self._pooled
        self._to_driver(spare)
        if buf is None:
            buf = self._new_buffer(size, pooled)
        self._arm()
        return _Block(buf, size, self)

    def _new_buffer(self, size: int, pooled: int):
        """A new cl.Buffer of ``size`` bytes (a miss; ``size`` is already counted as live)."""
        if self.host_ram and pooled:
            from ...system.memstat import free_bytes
            if free_bytes(None, 2 * size)[0] < 2 * size + pooled:  # the host is short
                with self.lock:
                    spare = self._evict(size)
                self._to_driver(spare)  # a new buffer takes the place of pooled ones of other sizes
        cl = _cl()
        try:
            try:
                buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
            except Exception:
                self.clear()
                buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
        except BaseException:
            with self.lock:
                self._live -= size
            raise
        if self.host_ram and size >= HUGE_PAGES_MIN_BYTES:
            self._advise_huge_pages(buf, size)
        return buf

    def _advise_huge_pages(self, buf, size: int) -> None:
        """Ask for transparent huge pages under a new host-RAM buffer (module docstring): its address from a
        non-blocking map for reading on this thread's own queue (nothing waits; the unmap follows it there), the
        whole 2 MiB pages inside it advised before any kernel touches them. Any failure leaves the pages as they are."""
        if not _MADVISE:
            from ...system import config
            _MADVISE.append(_madvise_fn() if config.get("ANYDEVICE_HUGE_PAGES") else None)
        madvise = _MADVISE[0]
        if madvise is None:
            return
        cl = _cl()
        try:
            q = getattr(self.private, "map_queue", None)
            if q is None:
                q = self.private.map_queue = cl.CommandQueue(self.ctx)
            arr, _ = cl.enqueue_map_buffer(q, buf, cl.map_flags.READ, 0, (size,), np.uint8, is_blocking=False)
            try:
                addr = arr.ctypes.data
                lo, hi = -(-addr // _HUGE) * _HUGE, (addr + size) // _HUGE * _HUGE
                if hi > lo:
                    madvise(lo, hi - lo)
            finally:
                arr.base.release(q)
                q.flush()
        except Exception as exc:  # noqa: BLE001
            log.debug("anydevice: no huge pages for a buffer of %d bytes: %s", size, exc)

    def release(self, buf, size: int) -> None:
        """Give ``buf`` back (not from a finaliser: it drains what they returned and arms the timer)."""
        self.returned.append((buf, size))
        self._drain()

    def _drain(self) -> None:
        """Take the blocks the finalisers returned into the free lists (beyond the bound: to the driver)."""
        if not self.returned:
            return
        bound = self.bound()
        with self.lock:
            spare = self._take_returned(bound)
        self._to_driver(spare)
        self._arm()

    def _take_returned(self, bound: int | None) -> list:
        """(lock held) Move the returned blocks into the free lists while they fit in ``bound``;
        the buffers beyond it, to release. ``bound`` None: leave them for the next call."""
        spare = []
        if bound is None:
            return spare
        while True:
            try:
                buf, size = self.returned.popleft()
            except IndexError:
                return spare
            if self.pinned and id(buf) in self.pinned:
                self.kept.append((buf, size))  # a recording replays into it: never handed out again
                continue
            self._live -= size
            if self._pooled + size <= bound:
                self.free.setdefault(size, []).append(buf)
                self._pooled += size
            else:
                spare.append(buf)

    def pin(self, buf, nbytes: int | None = None) -> int:
        """``buf`` (live: an array holds it) stays with the recordings that touched it when dropped: it is
        kept out of the free lists until each of them ``unpin``s it. ``nbytes``: what it counts against the
        pinned total (its size; 0 for a sub-buffer, whose memory is its parent's). Returns the bytes pinned in all."""
        with self.lock:
            e = self.pinned.get(id(buf))
            if e is None:
                n = buf.size if nbytes is None else nbytes
                self.pinned[id(buf)] = [buf, 1, n]
                self.pinned_bytes += n
            else:
                e[1] += 1
            return self.pinned_bytes

    def unpin(self, bufs) -> None:
        """One recording stops pinning ``bufs``; those no recording pins and that were dropped meanwhile come
        back as dropped blocks do."""
        with self.lock:
            for b in bufs:
                e = self.pinned.get(id(b))
                if e is not None:
                    e[1] -= 1
                    if e[1] <= 0:
                        del self.pinned[id(b)]
                        self.pinned_bytes -= e[2]
            back = [bs for bs in self.kept if id(bs[0]) not in self.pinned]
            self.kept = [bs for bs in self.kept if id(bs[0]) in self.pinned]
        self.returned.extend(back)
        self._drain()

    def _evict(self, nbytes: int) -> list:
        """(lock held) Take at least ``nbytes`` of pooled buffers out (the largest first), to release."""
        out, got = [], 0
        for size in sorted(self.free, reverse=True):
            lst = self.free[size]
            while lst and got < nbytes:
                out.append(lst.pop())
                got += size
                self._pooled -= size
            if not lst:
                del self.free[size]
            if got >= nbytes:
                break
        return out

    @staticmethod
    def _to_driver(bufs) -> None:
        """Release buffers to the driver (never with the lock held: the driver may take a while)."""
        for b in bufs:
            b.release()

    def _arm(self) -> None:
        """(lock not held) A timer that empties the pool once it has been idle IDLE_S seconds, while
        anything is pooled, in use or returned. A timer already due later than IDLE_S from now (IDLE_S
        was lowered) is replaced."""
        if sys.is_finalizing():
            return
        if self._timer is not None and self._timer_due <= time.monotonic() + self.IDLE_S + self.MIN_DELAY_S:
            return  # one is due soon enough (read without the lock: _idle re-checks under it)
        with self.lock:
            if not (self._pooled or self._live or self.returned):
                return
            now = time.monotonic()
            wait = max(self.MIN_DELAY_S, self.last_use + self.IDLE_S - now if self._pooled else self.IDLE_S)
            if self._timer is not None and self._timer_due <= now + wait + self.MIN_DELAY_S:
                return
        timer = threading.Timer(wait, self._idle)
        timer.daemon = True
        with self.lock:
            old = self._timer
            if old is not None and self._timer_due <= now + wait + self.MIN_DELAY_S:
                return
            self._timer, self._timer_due = timer, now + wait
        if old is not None:
            old.cancel()  # (it also finds itself replaced when it runs)
        try:
            timer.start()  # outside the lock: start() waits for the new thread, which may run finalisers
        except RuntimeError as exc:  # no new thread (interpreter shutdown, thread limit)
            log.debug("AnyDevice: OpenCL buffer pool idle timer not started: %s", exc)
            with self.lock:
                if self._timer is timer:
                    self._timer = None

    def _idle(self) -> None:
        me = threading.current_thread()
        bound = self.bound() if self.returned else None
        with self.lock:
            if self._timer is not me:  # cancelled by clear() (a later timer may run already)
                return
            self._timer = None
            spare = self._take_returned(bound)
            given = 0
            if self._pooled and time.monotonic() - self.last_use >= self.IDLE_S:
                given = self._pooled
                spare += self._take_free()
        if given:
            log.debug("AnyDevice: OpenCL buffer pool idle for %.0f s, %d MB given back", self.IDLE_S,
                      given >> 20)
        self._to_driver(spare)
        self._arm()

    def _take_free(self) -> list:
        """(lock held) Every pooled buffer, out of the free lists."""
        out = [b for lst in self.free.values() for b in lst]
        self.free.clear()
        self._pooled = 0
        return out

    def clear(self) -> None:
        with self.lock:
            timer, self._timer = self._timer, None
            spare = self._take_returned(0)
            spare += self._take_free()
        if timer is not None:
            timer.cancel()
        self._to_driver(spare)  # outside the lock: the driver's release may take a while
        self._arm()  # arrays still in use: their buffers are looked for when idle


class _Dense:
    """A C-contiguous array in a pooled OpenCL buffer (``_Block``) or in wrapped host memory
    (``_HostBlock``): shape, block, element offset (read-only once made)."""
    __slots__ = ("shape", "block", "offset", "size", "__weakref__")
    #: bytes per element
    ITEM = 4

    def __init__(self, shape, block: _Block, offset: int = 0):
        self.shape = tuple(map(int, shape))
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
        return self.ITEM * self.size

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, offset={self.offset})"


class CLArray(_Dense):
    """A C-contiguous float32 array in an OpenCL buffer (read-only once made; ops never write it)."""
    __slots__ = ()
    dtype = np.dtype(np.float32)


class CLHalf(_Dense):
    """A C-contiguous float16 or bfloat16 array in an OpenCL buffer, as 16-bit words (``dtype`` is the
    contract's name). Storage only: the contract converts it to a CLArray (``_cast``) before any op."""
    __slots__ = ("dtype",)
    ITEM = 2

    def __init__(self, shape, block: _Block, dtype: str, offset: int = 0):
        super().__init__(shape, block, offset)
        self.dtype = dtype


class CLQuant(DeviceQuant):
    """A quantized weight packed as it is stored (ops/quant.py: ``fmt``, logical ``shape``): its bytes in
    a pooled buffer (``block``) and, for int8 / fp8, ``scale`` (a CLArray, one per ``rowlen``
    elements). The kernels that read weights decode it in registers (kernels/quant_decode.h)."""
    __slots__ = ("fmt", "shape", "block", "scale", "rowlen", "size", "nbytes", "__weakref__")
    offset = 0

    def __init__(self, fmt: str, shape, block, nbytes: int, scale=None, rowlen: int = 0):
        self._init(fmt, shape, nbytes, scale, rowlen)
        self.block = block

    @property
    def buffer(self):
        return self.block.buf


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
