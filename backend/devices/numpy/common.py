"""What the NumPy device's modules share: float32, the im2col chunk size and the thread-pool helpers."""
from __future__ import annotations

import math

import numpy as np

from ...system import threads

F32 = np.float32
#: bytes of im2col columns one task gathers at a time (about half of L2)
CHUNK_BYTES = 512 * 1024


_ONES: dict = {}


def ones(n: int):
    """A read-only float32 vector of ``n`` ones (the per-channel sums' GEMV operand; a few sizes kept)."""
    v = _ONES.get(n)
    if v is None:
        if len(_ONES) >= 64:
            _ONES.clear()
        v = _ONES[n] = np.ones(n, F32)
        v.flags.writeable = False
    return v


def channel_sums(x, dtype=F32):
    """Per-channel sums (C,) of the float32 (N, C, ...) ``x`` over every other axis: a ones GEMV over the batch
    (BLAS's blocked FMA sums: 4-10x faster than a sum over axes (0, 2, ...), and closer to the float64 sum),
    then along the rest in ``dtype`` (pairwise). The GEMV goes through blas_call (one BLAS thread where
    OpenBLAS's workers would spin after it)."""
    N, C = x.shape[:2]
    xm = np.ascontiguousarray(x).reshape(N, -1)
    return blas_call(xm.size, np.matmul, ones(N), xm).reshape(C, -1).sum(axis=1, dtype=dtype)


#: OpenBLAS (NumPy's 0.3.31 here) threads a GEMM from M*N*K = 524288 and a GEMV from M*N = 524288 (measured:
#: 64x128x64, 64x8192 and 16x32768 left its workers burning 92-100 ms of CPU in the next 100 ms; 80x80x80,
#: 64x4096 and 16x16384 none); blas_call takes half that, for other builds' thresholds
BLAS_THREADED_MIN = 262144


def blas_call(work: int, fn, *args):
    """``fn(*args)`` (quietly), a BLAS product of ``work`` = M*N*K (GEMM) or M*N (GEMV): on one BLAS thread
    where OpenBLAS would thread it and its workers would then spin for ~70-100 ms (NumPy loaded before the
    pack, as inside ComfyUI: they took a core from the next op's pool threads, or from PyTorch). Plain where
    the spin is short (threads.BLAS_SPIN_SAFE) or the product small: the switch costs ~5 us a call each way
    (the digits step, 40-odd small products: 5.2 -> 5.4 ms when every one switched)."""
    if threads.BLAS_SPIN_SAFE or work < BLAS_THREADED_MIN:
        return _quiet(fn, *args)
    with threads.single_threaded_blas():
        return _quiet(fn, *args)


def _quiet(fn, *args, **kw):
    """fn without NumPy's floating-point warnings: Inf and NaN are valid data here, and propagate
    as in torch (the error state is per thread, so each pool task sets it too)."""
    with np.errstate(all="ignore"):
        return fn(*args, **kw)


def _parallel(task, tasks) -> None:
    """Run ``task`` on each of ``tasks`` on the pack's thread pool (quietly, as ``_quiet``)."""
    threads.run_parallel(lambda t: _quiet(task, t), tasks)


def parallel_sums(work, n: int, shape):
    """``work(acc, lo, hi)`` adds the items lo..hi-1 of range(n) into the float64 ``acc``: the ranges split over
    the pack's threads (BLAS single-threaded), each range into its own zeros of ``shape``; returns their sum
    (the weight gradients' reductions over positions)."""
    parts = _split(n, threads.num_threads()) if n > 0 else []
    accs = [np.zeros(shape, np.float64) for _ in parts] or [np.zeros(shape, np.float64)]

    def task(i):
        work(accs[i], *parts[i])

    with threads.single_threaded_blas():
        _parallel(task, range(len(parts)))
    total = accs[0]
    for a in accs[1:]:
        total += a
    return total


def _split(n: int, parts: int):
    """[(start, end)] cutting range(n) into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    step = math.ceil(n / parts)
    return [(i, min(n, i + step)) for i in range(0, n, step)]


def zero_pad(x, t: int, b: int, l: int, r: int, out=None):
    """float32 ``x`` (..., H, W) with t / b rows and l / r columns of zeros around its last two dims (all >= 0),
    as numpy.pad's constant mode, which costs ~100 us even on small arrays: only the border is zeroed. Into
    ``out`` (a float32 (..., H + t + b, W + l + r) array or view) when given, else a new array."""
    if out is None and not (t or b or l or r):
        return x.copy()  # a new array, as numpy.pad's
    H, W = x.shape[-2:]
    if out is None:
        out = np.empty(x.shape[:-2] + (H + t + b, W + l + r), F32)
    out[..., :t, :] = 0.0
    out[..., t + H:, :] = 0.0
    out[..., t:t + H, :l] = 0.0
    out[..., t:t + H, l + W:] = 0.0
    out[..., t:t + H, l:l + W] = x
    return out
