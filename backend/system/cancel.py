"""Cancellation of long ops: one process-wide checker, called between the chunks of a long op.

The node layer registers ComfyUI's ``comfy.model_management.throw_exception_if_processing_interrupted``
when it runs inside ComfyUI (``set_checker``); outside ComfyUI there is no checker and ``check()``
does nothing. Long ops (conv2d / conv_transpose2d and their separable / FFT paths) cut their work
into chunks (output row bands, planes) sized to a fraction of a second and call ``check()`` between
them, so an interrupt raised by the checker ends the op within about a second. ``set_progress``
registers an optional ``fn(done, total)`` called after each chunk of a chunked op.

A loop of many short steps (training) calls ``check()`` before every step (in ComfyUI a flag read,
so a cancel takes effect at the next step however short or long the steps are) but reports
progress by elapsed wall time (``Pacer``: every ``REPORT_SECONDS``), not every step: inside ComfyUI
each report is several server messages (the progress bar, the progress state, the live loss
point), and one a step would send millions over a long run of short steps.

Chunks are sized by elapsed wall time, not by a count fixed up front: ``Sizer`` (and ``timed_chunks``
over a plain range) re-estimates the size after every chunk from how long it took, so a chunk stays
near ``CHUNK_SECONDS`` when another CPU-heavy process slows the machine down mid-op. After one
measured first chunk the size only halves (or doubles back, never above the measured size): few
distinct sizes, since device code may be built per launch size.

Pool tasks (``threads.run_parallel``) call ``check()`` too: the first task whose check raises ends
the call with that exception, and its sibling tasks end at their next ``check()`` (``Abandoned``,
never seen by the caller), since ComfyUI's check clears the interrupt flag when it raises.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

log = logging.getLogger("anydevice")

_checker = None
_progress = None
_lock = threading.Lock()
#: seconds of work one chunk of a long op aims at (cancel latency is about one chunk)
CHUNK_SECONDS = 0.2
#: the wall time between two progress reports of a loop of short steps (``Pacer``)
REPORT_SECONDS = 0.1
#: the clock ``Pacer`` and ``timed_chunks`` read (time.monotonic; tests put a fake one here)
_clock = time.monotonic
#: per thread: the Event that, once set, makes check() raise Abandoned (``abandon_on``)
_local = threading.local()


class Abandoned(Exception):
    """check() in a pool task whose sibling task raised (``threads.run_parallel``): ends the task at
    its next check; run_parallel raises the sibling's exception, never this one."""


@contextlib.contextmanager
def abandon_on(event: threading.Event):
    """Inside the block, check() on this thread raises Abandoned once ``event`` is set."""
    prev = getattr(_local, "abandon", None)
    _local.abandon = event
    try:
        yield
    finally:
        _local.abandon = prev


def set_checker(fn) -> None:
    """Register fn() (raises to cancel) as the process-wide checker; None removes it."""
    global _checker
    with _lock:
        _checker = fn


def get_checker():
    return _checker


def set_progress(fn) -> None:
    """Register fn(done, total) called after each chunk of a chunked op; None removes it."""
    global _progress
    with _lock:
        _progress = fn


def check() -> None:
    """Call the checker (if any): it raises when the running work is to be cancelled. Lock-free (a
    read of the registered function), so it is cheap enough to call every few milliseconds."""
    ev = getattr(_local, "abandon", None)
    if ev is not None and ev.is_set():
        raise Abandoned()
    fn = _checker
    if fn is not None:
        fn()


def progress(done: int, total: int) -> None:
    """Report a chunk done. Not guarded: ComfyUI's progress hook is itself an interrupt check (it
    raises, and clears the interrupt flag), so what it raises must reach the caller."""
    fn = _progress
    if fn is not None:
        fn(done, total)


def chunks(total: int, per_chunk: int):
    """(start, stop) ranges of ``per_chunk`` items covering range(total), with check() before each
    chunk after the first and progress after each."""
    per_chunk = max(1, int(per_chunk))
    n = -(-total // per_chunk) if total > 0 else 0
    for i, s in enumerate(range(0, total, per_chunk)):
        if i:
            check()
        yield s, min(total, s + per_chunk)
        if n > 1:
            progress(i + 1, n)


class Sizer:
    """The size of the next chunk of a long op, re-estimated by elapsed wall time after every chunk.

    ``size`` is the first chunk (an estimate). With ``probe`` the second is sized from the first's
    measured rate, at most ``MAX_GROWTH`` times the first (a cost that grows faster than the size,
    such as memory touched for the first time, is not extrapolated far); that size is the ceiling
    ``top`` (without ``probe``, ``size`` is). After that a chunk whose size would take longer than
    ``seconds`` (default ``CHUNK_SECONDS``) at the rate just measured halves the size (as often as
    needed), and one that took under a quarter of it doubles it back, up to ``top``. So the sizes are
    ``size``, ``top`` and ``top / 2**k`` (device code built per launch size is built a few times at
    most), and a chunk slowed down by a CPU-heavy process beside this one is followed by smaller ones."""

    #: the most the probe multiplies the first size by
    MAX_GROWTH = 8

    def __init__(self, size: int, seconds: float | None = None, probe: bool = True):
        self.size = self.top = max(1, int(size))
        self.seconds = CHUNK_SECONDS if seconds is None else float(seconds)
        self.probe = probe

    def update(self, n: int, dt: float) -> int:
        """``n`` items took ``dt`` seconds: returns (and keeps) the size of the next chunk."""
        if n <= 0 or dt <= 0:
            return self.size
        per = dt / n
        if self.probe:
            self.probe = False
            self.size = self.top = max(1, min(int(self.seconds / per), self.MAX_GROWTH * self.size))
            return self.size
        while self.size > 1 and self.size * per > self.seconds:
            self.size //= 2
        if self.size * per < self.seconds / 4 and self.size * 2 <= self.top:
            self.size *= 2
        return self.size


def timed_chunks(total: int, size: int, seconds: float | None = None, probe: bool = False):
    """(start, stop) ranges covering range(total), sized by a ``Sizer`` (by default ``size`` at most,
    halved while chunks take longer than ``seconds``) from the wall time the caller spent on the
    chunk before (the time between two yields), with check() before every chunk after the first.
    No progress reports (for the stretches around an op's main work: transfers, finiteness checks)."""
    sizer = Sizer(size, seconds, probe)
    s = 0
    while s < total:
        if s:
            check()
        e = min(total, s + sizer.size)
        t0 = _clock()
        yield s, e
        sizer.update(e - s, _clock() - t0)
        s = e


class Pacer:
    """Says when to report again: ``due()`` is True on its first call and then once at least
    ``seconds`` (default ``REPORT_SECONDS``) of wall time (``time.monotonic``) have passed since it
    last said True, however many steps that was."""

    def __init__(self, seconds: float | None = None):
        self.seconds = REPORT_SECONDS if seconds is None else float(seconds)
        self.last = None

    def due(self) -> bool:
        now = _clock()
        if self.last is None or now - self.last >= self.seconds:
            self.last = now
            return True
        return False
