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
"""
from __future__ import annotations

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
#: the clock ``Pacer`` reads (time.monotonic; tests put a fake one here)
_clock = time.monotonic


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
    """Call the checker (if any): it raises when the running work is to be cancelled."""
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
