"""Cross entropy with class-index targets on NumPy, forward and backward each in one call (capability
"cross_entropy"; ops/layers.py cross_entropy and learn/autograd/rules_math.py take them): the composite's
log-softmax (ops/layers.py _log_softmax) in whole-array passes, without the contract's per-op dispatch."""
from __future__ import annotations

import numpy as np

from .common import F32


def _log_softmax_rows(x):
    """(N * L, C) log-probabilities of the float32 (N, C, L) x, as the composite: s = x - max, s - log(sum(exp(s)))."""
    N, C, L = x.shape
    rows = x.reshape(N, C) if L == 1 else np.moveaxis(x, 1, 2).reshape(N * L, C)
    with np.errstate(all="ignore"):  # Inf and NaN follow IEEE, as the composite's
        s = rows - rows.max(axis=1, keepdims=True)
        return s - np.log(np.exp(s).sum(axis=1, keepdims=True, dtype=F32))


class NumpyLosses:
    """The NumPy device's fused cross entropy (a mixin of NumpyBackend)."""

    def _cross_entropy_rows(self, x, t, ignore_index: int):
        if x.dtype != F32:
            return None
        logp = _log_softmax_rows(x)
        keep = t != ignore_index
        picked = logp[np.arange(len(t)), np.where(keep, t, 0)]
        return np.where(keep, -picked, F32(0.0)).astype(F32, copy=False)

    def _cross_entropy_grad(self, x, t, ignore_index: int, gy, per_position: bool, den: float):
        if x.dtype != F32 or gy.dtype != F32:
            return None
        N, C, L = x.shape
        keep = t != ignore_index
        with np.errstate(all="ignore"):  # Inf and NaN follow IEEE, as the composite's
            p = np.exp(_log_softmax_rows(x))
            p[np.arange(len(t)), np.where(keep, t, 0)] -= keep.astype(F32)
            g = (gy.reshape(-1) if per_position else gy.reshape(1)) / F32(den)
            p *= np.where(keep, g, F32(0.0))[:, None]
        return p.reshape(N, C) if L == 1 else np.ascontiguousarray(np.moveaxis(p.reshape(N, L, C), 2, 1))
