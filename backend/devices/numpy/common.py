"""What the NumPy device's modules share: float32, the im2col chunk size and the thread-pool helpers."""
from __future__ import annotations

import math

import numpy as np

from ...system import threads

F32 = np.float32
#: bytes of im2col columns one task gathers at a time (about half of L2)
CHUNK_BYTES = 512 * 1024


def _quiet(fn, *args, **kw):
    """fn without NumPy's floating-point warnings: Inf and NaN are valid data here, and propagate
    as in torch (the error state is per thread, so each pool task sets it too)."""
    with np.errstate(all="ignore"):
        return fn(*args, **kw)


def _parallel(task, tasks) -> None:
    """Run ``task`` on each of ``tasks`` on the pack's thread pool (quietly, as ``_quiet``)."""
    threads.run_parallel(lambda t: _quiet(task, t), tasks)


def _split(n: int, parts: int):
    """[(start, end)] cutting range(n) into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    step = math.ceil(n / parts)
    return [(i, min(n, i + step)) for i in range(0, n, step)]
