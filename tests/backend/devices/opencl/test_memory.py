"""The OpenCL buffer pool under threads and the garbage collector (backend/devices/opencl/memory.py).

Blocks are dropped from many threads, handed between threads and freed by the collector
(reference cycles, ``gc.collect()`` in the threads, a low collection threshold so collections
also run inside other pool calls and in the bootstrap of the timer's new threads) while the idle
timer fires over and over. Every thread runs under a hard bound: a deadlock fails the test instead
of hanging the suite (``faulthandler`` dumps every stack and ends the run if even that hangs).
The pool's accounting is checked at the end: every buffer made is pooled or given back to the
driver, once. Skipped, with the reason, without pyopencl or an OpenCL device (PoCL).
"""
from __future__ import annotations

import collections
import faulthandler
import gc
import logging
import random
import sys
import threading
import time
from types import SimpleNamespace

import pytest

import e2e_helpers as H
from anydevice.backend.devices.opencl import memory

log = logging.getLogger(__name__)

THREADS = 8
RUN_S = 3.0
JOIN_S = 30.0
SIZES = (64, 100, 1000, 4096, 5000, 20000, 70000)


def _context():
    """(an OpenCL context, "") or (None, why not)."""
    try:
        import pyopencl as cl
    except Exception as exc:
        return None, f"pyopencl not installed ({type(exc).__name__}: {exc})"
    try:
        devs = [d for p in cl.get_platforms() for d in p.get_devices()]
    except Exception as exc:
        return None, f"no OpenCL platform ({type(exc).__name__}: {exc})"
    if not devs:
        return None, "no OpenCL device"
    try:
        return cl.Context(devices=[devs[0]]), ""
    except Exception as exc:
        return None, f"no OpenCL context ({type(exc).__name__}: {exc})"


@pytest.fixture(scope="module")
def ctx():
    c, why = _context()
    if c is None:
        pytest.skip(why)
    return c


class _OwnedLock:
    """The pool's lock, remembering which thread holds it (a plain Lock cannot say)."""

    def __init__(self):
        self._lock, self.owner = threading.Lock(), None

    def acquire(self, blocking=True, timeout=-1):
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self):
        self.owner = None
        self._lock.release()

    def held_here(self) -> bool:
        return self.owner == threading.get_ident()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


@pytest.fixture(params=[False, True], ids=["device-ram", "host-ram-huge-pages"])
def pool(ctx, monkeypatch, request):
    """A pool of its own (256 KB: some buffers are pooled, some go back to the driver) whose lock
    knows its owner; records the buffers given back to the driver, the idle timer's runs, and
    every thread start, OpenCL buffer creation or release made while the lock was held. The host-RAM pool
    advises huge pages from 4 KiB (every new buffer's map and unmap on the allocating thread's queue)."""
    host = request.param
    p = memory.BufferPool(ctx, 256 << 10, host_ram=host)
    if host:
        monkeypatch.setattr(memory, "HUGE_PAGES_MIN_BYTES", 4096)
    p.lock = _OwnedLock()
    rec = SimpleNamespace(released=[], released_sizes=[], idle_runs=0, idle_active=0, under_lock=[], guard=threading.Lock())

    def to_driver(bufs):
        bufs = list(bufs)
        if bufs and p.lock.held_here():
            rec.under_lock.append("buffer release")
        with rec.guard:
            rec.released.extend(bufs)  # kept: their ids stay unique
            rec.released_sizes.extend(b.size for b in bufs)  # (asked before: a released buffer cannot say)
        for b in bufs:
            b.release()
    p._to_driver = to_driver

    real_idle = p._idle

    def idle():
        with rec.guard:
            rec.idle_runs += 1
            rec.idle_active += 1
        try:
            real_idle()
        finally:
            with rec.guard:
                rec.idle_active -= 1
    p._idle = idle

    class Timer(threading.Timer):
        def start(self):
            if p.lock.held_here():
                rec.under_lock.append("timer start")
            super().start()
    monkeypatch.setattr(threading, "Timer", Timer)

    real_cl = memory._cl()

    def buffer(*args, **kw):
        if p.lock.held_here():
            rec.under_lock.append("buffer creation")
        rec.big += len(args) > 2 and args[2] >= 4096
        return real_cl.Buffer(*args, **kw)

    def map_buffer(*args, **kw):
        if p.lock.held_here():
            rec.under_lock.append("buffer map")
        rec.maps += 1
        return real_cl.enqueue_map_buffer(*args, **kw)
    rec.maps = rec.big = 0
    fake_cl = SimpleNamespace(Buffer=buffer, mem_flags=real_cl.mem_flags, CommandQueue=real_cl.CommandQueue,
                              enqueue_map_buffer=map_buffer, map_flags=real_cl.map_flags)
    monkeypatch.setattr(memory, "_cl", lambda: fake_cl)
    p.rec = rec
    yield p
    from anydevice.backend.system import config
    if host and memory._madvise_fn() is not None and config.get("ANYDEVICE_HUGE_PAGES"):
        assert rec.maps == rec.big, (rec.maps, rec.big)  # every new buffer of 4 KiB or more was advised
    p.IDLE_S = 3600.0
    if p.lock.acquire(timeout=10):  # not when a deadlocked thread holds it: the test failed already
        p.lock.release()
        p.clear()


def _quiet(pool, timeout=10.0):
    """Wait until no idle timer run is in progress (the timer may go on firing: IDLE_S is long now)."""
    pool.IDLE_S = 3600.0
    deadline = time.monotonic() + timeout
    while pool.rec.idle_active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pool.rec.idle_active, "an idle timer run did not finish"


def _check_accounting(pool, allocs: int) -> None:
    """Every buffer made is in the free lists or was given back to the driver, exactly once."""
    rec = pool.rec
    assert pool.live == 0  # (drains what the finalisers returned)
    with pool.lock:
        free = [(size, b) for size, lst in pool.free.items() for b in lst]
        assert not pool.returned
        assert pool._live == 0
        assert pool._pooled == sum(size for size, _ in free)
        assert pool._pooled <= pool.limit
        assert all(size == pool.bucket(size) and b.size == size for size, b in free)
        pooled_ids = [id(b) for _, b in free]
        released_ids = [id(b) for b in rec.released]
        assert len(set(pooled_ids)) == len(pooled_ids), "a buffer is pooled twice"
        assert len(set(released_ids)) == len(released_ids), "a buffer was released twice"
        assert not set(pooled_ids) & set(released_ids), "a released buffer is still pooled"
        assert pool.misses == len(free) + len(rec.released), "a buffer was lost"
        assert pool.hits + pool.misses == allocs


class _Cycle:
    """A block only the garbage collector frees (it references itself)."""

    def __init__(self, block):
        self.block, self.me = block, self


def test_pool_survives_threads_gc_and_the_idle_timer(pool, monkeypatch):
    monkeypatch.setattr(pool, "IDLE_S", 0.0)  # every timer run trims (switched with 0.05 s below)
    monkeypatch.setattr(pool, "MIN_DELAY_S", 0.001)  # and the timer fires every millisecond
    handoff = collections.deque()  # blocks made in one thread and dropped in another
    counts = [0] * THREADS
    cycles = [0] * THREADS
    errors = []
    stop_at = time.monotonic() + RUN_S

    def worker(i):
        rng = random.Random(i)
        kept = []
        try:
            while time.monotonic() < stop_at:
                block = pool.alloc(rng.choice(SIZES))
                counts[i] += 1
                r = rng.random()
                if r < 0.3:
                    _Cycle(block)
                    cycles[i] += 1
                elif r < 0.5:
                    kept.append(block)
                elif r < 0.7:
                    handoff.append(block)
                del block
                if len(kept) > 16:
                    del kept[rng.randrange(len(kept))]
                try:
                    handoff.popleft()  # someone else's block, dropped here
                except IndexError:
                    pass
                r = rng.random()
                if r < 0.03:
                    gc.collect(1)  # (the young generations, where the cycles are: a full one takes 0.1 s)
                elif r < 0.04:
                    pool.clear()
                elif r < 0.1:
                    assert pool.pooled >= 0 and pool.live >= 0
            kept.clear()
        except BaseException as exc:  # reported by the main thread
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    def collector():
        n = 0
        while time.monotonic() < stop_at:
            gc.collect(1)
            time.sleep(0.001)
            n += 1
            if n % 20 == 0:  # the timer trims (IDLE_S 0), then finds the pool busy and arms itself again
                pool.IDLE_S = 0.05 if pool.IDLE_S == 0.0 else 0.0

    threshold, switch = gc.get_threshold(), sys.getswitchinterval()
    faulthandler.dump_traceback_later(JOIN_S + 60, exit=True)  # the last resort: never hang the suite
    gc.set_threshold(50, 5, 5)  # collections everywhere, thread bootstraps included
    sys.setswitchinterval(1e-4)  # the timer's threads get the GIL often among the busy workers
    try:
        threads = [threading.Thread(target=worker, args=(i,), name=f"pool-worker-{i}", daemon=True)
                   for i in range(THREADS)]
        threads.append(threading.Thread(target=collector, name="pool-gc", daemon=True))
        alive = H.start_and_join(threads, JOIN_S)
        if alive:
            faulthandler.dump_traceback(all_threads=True)
            pytest.fail(f"still running {JOIN_S:.0f} s after the start (a deadlock in the buffer pool?): "
                        f"{', '.join(alive)}")
        assert not errors, errors
        handoff.clear()
        gc.collect()
        _quiet(pool)
        assert not pool.rec.under_lock, sorted(set(pool.rec.under_lock))
        allocs = sum(counts)
        log.info("%d allocations (%d hits), %d blocks in cycles, %d buffers released, %d idle timer runs",
                 allocs, pool.hits, sum(cycles), len(pool.rec.released), pool.rec.idle_runs)
        assert allocs > 1000 and sum(cycles) > 100
        assert pool.rec.idle_runs >= 20, pool.rec.idle_runs  # the timer fired over and over
        assert pool.hits > 0 and pool.rec.released  # both pooled and released buffers were seen
        _check_accounting(pool, allocs)
        pool.clear()
        assert pool.pooled == 0 and pool.live == 0
        assert pool.misses == len(pool.rec.released)
    finally:
        gc.set_threshold(*threshold)
        sys.setswitchinterval(switch)
        faulthandler.cancel_dump_traceback_later()


def test_finaliser_does_not_wait_for_the_lock(pool):
    """A block dropped (and one collected) in a thread while another thread holds the lock: the
    finalisers return at once and the next pool call takes both blocks in."""
    box = [pool.alloc(1000), _Cycle(pool.alloc(4000))]
    assert (pool.live, pool.pooled) == (1024 + 4096, 0)

    def drop():
        box.clear()
        gc.collect()
    with pool.lock:
        t = threading.Thread(target=drop, daemon=True)
        t.start()
        t.join(10)
        finished = not t.is_alive()
        assert len(pool.returned) == 2  # handed over, not yet counted
    assert finished, "a finaliser waited for the pool's lock"
    assert (pool.live, pool.pooled) == (0, 1024 + 4096)
    assert sorted(pool.free) == [1024, 4096]
    assert pool.rec.under_lock == []


def test_timer_armed_outside_the_lock_and_still_empties_the_pool(pool, monkeypatch):
    monkeypatch.setattr(pool, "IDLE_S", 0.05)
    monkeypatch.setattr(pool, "MIN_DELAY_S", 0.01)
    block = pool.alloc(3000)  # in use: the timer looks for it until it comes back
    time.sleep(0.2)
    assert pool.live == 4096
    del block  # no pool call after this one: the timer alone takes it in and gives it back
    deadline = time.monotonic() + 10
    while pool.rec.released == [] and time.monotonic() < deadline:
        time.sleep(0.01)
    _quiet(pool)
    assert pool.rec.released_sizes == [4096]
    assert (pool.live, pool.pooled, pool.misses) == (0, 0, 1)
    assert pool.rec.idle_runs >= 2 and pool.rec.under_lock == []


def test_nothing_goes_to_the_pool_at_exit(pool, monkeypatch):
    block = pool.alloc(100)
    is_finalizing = sys.is_finalizing
    monkeypatch.setattr(memory.sys, "is_finalizing", lambda: True)
    del block
    monkeypatch.setattr(memory.sys, "is_finalizing", is_finalizing)
    assert len(pool.returned) == 0
    assert pool.live == 128  # the driver frees it at exit; the pool never sees it again
    with pool.lock:
        pool._live = 0  # (the pretend exit is over: no timer keeps looking for it)


def _vm_flags(addr: int) -> str:
    """The VmFlags of the mapping of this process that holds ``addr`` (/proc/self/smaps), '' if none."""
    found = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                found = lo <= addr < hi
            elif found and line.startswith("VmFlags:"):
                return line
    return ""


def test_host_buffers_ask_for_huge_pages(ctx, monkeypatch):
    """A host-RAM pool advises transparent huge pages for a new buffer of HUGE_PAGES_MIN_BYTES or more: whole
    2 MiB pages inside the buffer (the madvise call's range, and the kernel's own record, VmFlags ``hg``), the
    buffer's values intact; smaller buffers, other pools and ANYDEVICE_HUGE_PAGES=0 advise nothing."""
    import numpy as np
    import pyopencl as cl
    fn = memory._madvise_fn()
    if fn is None:
        pytest.skip("no transparent huge pages here (not Linux, or THP is `never`)")
    calls = []
    monkeypatch.setattr(memory, "_MADVISE", [lambda addr, length: (calls.append((addr, length)), fn(addr, length))[1]])
    q = cl.CommandQueue(ctx)
    size = 3 * memory.HUGE_PAGES_MIN_BYTES + 12345
    pool = memory.BufferPool(ctx, 1 << 30, host_ram=True)
    block = pool.alloc(size)
    n = block.nbytes // 4
    data = np.arange(n, dtype=np.float32)
    cl.enqueue_copy(q, block.buf, data)
    arr, _ = cl.enqueue_map_buffer(q, block.buf, cl.map_flags.READ, 0, (n,), np.float32)
    try:
        np.testing.assert_array_equal(arr, data)
        addr = arr.ctypes.data
    finally:
        arr.base.release(q)
    q.finish()
    assert len(calls) == 1, calls
    lo, length = calls[0]
    assert lo % (2 << 20) == 0 and length % (2 << 20) == 0 and length >= 2 << 20
    assert addr <= lo and lo + length <= addr + block.nbytes
    assert " hg" in _vm_flags(lo), _vm_flags(lo)
    calls.clear()
    small = pool.alloc(memory.HUGE_PAGES_MIN_BYTES // 2)
    device_pool = memory.BufferPool(ctx, 1 << 30, host_ram=False)
    other = device_pool.alloc(size)
    monkeypatch.setattr(memory, "_MADVISE", [None])  # ANYDEVICE_HUGE_PAGES=0
    off = pool.alloc(2 * size)
    assert calls == []
    del block, small, other, off
    pool.clear()
    device_pool.clear()
