"""Thread handling for CPU backends.

NumPy's OpenBLAS keeps spinning worker threads after each call, which halves the speed of the next
PyTorch call on a 2-core machine, and inside ComfyUI NumPy is imported long before this pack, so
its environment variables cannot be set. Instead the NumPy backend splits big work itself over a
small pool of plain Python threads (NumPy releases the GIL in BLAS calls and copies) and runs BLAS
single-threaded for the duration of the call (``single_threaded_blas``). Idle pool threads block on
a queue; they never spin.

``ANYDEVICE_NUM_THREADS`` sets the pool size (default: the CPUs this process may run on).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

log = logging.getLogger("anydevice")

#: True when OpenBLAS was loaded with a short spin time, so its own threads are safe to use
BLAS_SPIN_SAFE = False


def prepare_blas_env() -> None:
    """Called before NumPy is imported (backend/__init__.py). OpenBLAS's idle workers spin for
    2^28 cycles (about 70 ms) after every threaded call; a PyTorch call in that window ran 2.4x
    slower here. OPENBLAS_THREAD_TIMEOUT=4 makes them sleep at once. Inside ComfyUI NumPy is
    already loaded, so it cannot apply: then big GEMMs are split over the pack's own threads
    with single-threaded BLAS instead (see numpy_backend._gemm)."""
    global BLAS_SPIN_SAFE
    import sys
    timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    if "numpy" not in sys.modules:
        if timeout is None:
            os.environ["OPENBLAS_THREAD_TIMEOUT"] = timeout = "4"
        BLAS_SPIN_SAFE = timeout.isdigit() and int(timeout) <= 8
    else:
        BLAS_SPIN_SAFE = bool(timeout and timeout.isdigit() and int(timeout) <= 8)


_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas = None  # list of threadpoolctl library controllers, or [] when unavailable


def num_threads() -> int:
    from . import config
    n = config.get("ANYDEVICE_NUM_THREADS")
    if n:
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=num_threads(), thread_name_prefix="anydevice")
        return _pool


def run_parallel(fn, tasks) -> None:
    """Run fn(task) for every task on the pool (inline when there is one task or one thread).

    The calling thread takes tasks too, beside num_threads() - 1 pool threads (it would only wait
    otherwise: one handoff less per call, and no more threads than CPUs).

    The first exception a task raises (a cancel: ``cancel.check()`` in the task) is raised here as
    soon as the tasks already running have stopped: tasks not started are dropped, and running ones
    end at their next ``cancel.check()`` (it raises ``cancel.Abandoned`` in them once a sibling has
    raised: ComfyUI's interrupt check clears its flag when it raises, so they would not see it).
    Nothing is locked while a task runs or checks."""
    tasks = list(tasks)
    n = num_threads()
    if len(tasks) <= 1 or n == 1:
        for t in tasks:
            fn(t)
        return
    from . import cancel
    failed = threading.Event()
    taken = threading.Lock()  # held only to take the next task
    nxt = [0]
    errors: list = []  # (task index, exception)

    def drain():
        while not failed.is_set():
            with taken:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(tasks):
                return
            with cancel.abandon_on(failed):
                try:
                    fn(tasks[i])
                except BaseException as exc:  # noqa: BLE001 - raised below, in task order
                    errors.append((i, exc))
                    failed.set()
                    return

    helpers = [pool().submit(drain) for _ in range(min(n, len(tasks)) - 1)]
    drain()
    for f in helpers:  # a helper not started yet has nothing left to take (or the run failed)
        f.cancel()
    wait([f for f in helpers if not f.cancelled()])
    if errors:  # the first failure in task order, other than a sibling's Abandoned
        errors.sort(key=lambda e: e[0])
        for _, exc in errors:
            if not isinstance(exc, cancel.Abandoned):
                raise exc
        raise errors[0][1]


def _blas_controllers():
    global _blas
    if _blas is None:
        try:
            import numpy  # noqa: F401  (threadpoolctl only sees libraries already loaded)
            from threadpoolctl import ThreadpoolController
            _blas = list(ThreadpoolController().select(user_api="blas").lib_controllers)
        except Exception as exc:  # threadpoolctl missing or a library it cannot drive
            log.debug("threadpoolctl unavailable (%s); BLAS threads left as they are", exc)
            _blas = []
    return _blas


@contextlib.contextmanager
def single_threaded_blas():
    """BLAS runs on one thread inside the block; the previous setting is restored after."""
    libs = _blas_controllers()
    before = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in zip(libs, before):
            if n != 1:
                lib.set_num_threads(n)
