"""Cancellation of long ops: one process-wide checker, called between the chunks of a long op.

The node layer registers ComfyUI's ``comfy.model_management.throw_exception_if_processing_interrupted``
when it runs inside ComfyUI (``set_checker``); outside ComfyUI there is no checker and ``check()``
does nothing. Long ops (conv2d / conv_transpose2d and their separable / FFT paths) cut their work
into chunks (output row bands, planes) sized to a fraction of a second and call ``check()`` between
them, so an interrupt raised by the checker ends the op within about a second. ``set_progress``
registers an optional ``fn(done, total)`` called after each chunk of a chunked op.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("anydevice")

_checker = None
_progress = None
_lock = threading.Lock()
#: seconds of work one chunk of a long op aims at (cancel latency is about one chunk)
CHUNK_SECONDS = 0.2


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
