"""Batch norm in training mode on NumPy, forward and backward each in one call (capability "batch_norm";
ops/layers.py batch_norm and learn/autograd/rules_layers.py take them): the composite's statistics (the
corrected two-pass mean and biased variance, layers.py) in a few whole-array NumPy passes, without the
contract's per-op dispatch of the twenty-odd ops the composite and its backward rule run."""
from __future__ import annotations

import numpy as np

from .common import F32, channel_sums


def _stats(x, eps: float):
    """(d, mean, var, rs): d = (x - a) - b, the composite's centred x (a the mean, b the correction), mean =
    a + b, var the biased variance and rs = 1 / sqrt(var + eps), per channel of the (N, C, L) x, as (1, C, 1)
    float32."""
    inv_n = F32(1.0) / F32(x.shape[0] * x.shape[2])
    a = (channel_sums(x) * inv_n).reshape(1, -1, 1)
    d = x - a
    b = (channel_sums(d) * inv_n).reshape(1, -1, 1)
    d -= b
    var = np.einsum("ncl,ncl->c", d, d, dtype=F32).reshape(1, -1, 1) * inv_n
    return d, a + b, var, F32(1.0) / np.sqrt(var + F32(eps))


class NumpyNorms:
    """The NumPy device's fused batch norm (a mixin of NumpyBackend)."""

    def _batch_norm_train(self, x, w, b, rm, rv, momentum: float, eps: float):
        with np.errstate(all="ignore"):  # Inf and NaN follow IEEE, as the composite's
            return self._bn_train(x, w, b, rm, rv, momentum, eps)

    def _batch_norm_grad(self, gy, x, w, eps: float, need_input: bool):
        with np.errstate(all="ignore"):
            return self._bn_grad(gy, x, w, eps, need_input)

    def _bn_train(self, x, w, b, rm, rv, momentum, eps):
        if any(v is not None and v.dtype != F32 for v in (x, w, b, rm, rv)):
            return None
        N, C, L = x.shape
        d, mean, var, rs = _stats(x, eps)
        y = np.multiply(d, rs if w is None else rs * w.reshape(1, C, 1), out=d)
        if b is not None:
            y += b.reshape(1, C, 1)
        if rm is None or rv is None:
            return y, None, None
        n = N * L
        m, om = F32(momentum), F32(1.0 - momentum)
        new_rm = rm * om + mean.reshape(C) * m
        new_rv = rv * om + (var.reshape(C) * F32(n / max(n - 1, 1))) * m
        return y, new_rm, new_rv

    def _bn_grad(self, gy, x, w, eps, need_input):
        if any(v is not None and v.dtype != F32 for v in (gy, x, w)):
            return None
        N, C, L = x.shape
        d, _, _, rs = _stats(x, eps)
        gb = channel_sums(gy)
        gw = np.einsum("ncl,ncl->c", gy, d, dtype=F32) * rs.reshape(C)  # sum of gy * xhat
        if not need_input:
            return None, gw, gb
        # gx = (gy - gb / n - xhat * gw / n) * sc with xhat = d * rs: gy * sc + d * k1 + k0 per channel
        inv_n = F32(1.0) / F32(N * L)
        sc = rs if w is None else rs * w.reshape(1, C, 1)
        gx = gy * sc
        gx += np.multiply(d, (-inv_n) * gw.reshape(1, C, 1) * rs * sc, out=d)
        gx += (-inv_n) * gb.reshape(1, C, 1) * sc
        return gx, gw, gb
