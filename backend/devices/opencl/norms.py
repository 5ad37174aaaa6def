"""Row normalisation on OpenCL (kernels/elementwise.cl): layers._normalize fused (``_norm_rows``), and
with the norm's affine applied in the same pass (``_norm_rows_affine``, capability "norm_affine"); and
PReLU in one pass (``_prelu_fused``, capability "prelu"); batch norm in training mode, forward and backward
in one launch each (``_batch_norm_train``, ``_batch_norm_grad``, capability "batch_norm"; kernels/batchnorm.cl)."""
from __future__ import annotations

import numpy as np


class CLNorms:
    """The OpenCL device's fused row norms (a mixin of OpenCLBackend)."""

    def _norm_rows(self, x, eps):
        """layers._normalize fused: one work item a row (CPU family, enough rows to fill the
        device or rows short enough that one work item each is cheap), a work group a row (GPU
        family)."""
        rows, n = x.shape
        if rows < self.compute_units and n > 65536:  # too few rows to fill the device
            return None
        if self.family != "cpu":  # GPU family: a work group of 256 a row (norm_rows_wg)
            if self.max_group < 256:
                return None
            out = self._empty((rows, n))
            self._run("norm_rows_wg", (rows * 256,), (256,), x.buffer, x.offset, out.buffer, 0, rows, n,
                      1.0 / n, eps, params=self._hdt(self._dtype(x)))
            return out
        out = self._empty((rows, n))
        self._run("norm_rows", (rows,), (1,), x.buffer, x.offset, out.buffer, 0, rows, n, 1.0 / n, eps,
                  params=self._hdt(self._dtype(x)))
        return out

    def _norm_rows_affine(self, x, eps, w, b, groups, inner, act=None):
        """``_norm_rows`` then ``y * w[ch] + b[ch]`` (then silu where ``act`` is "silu") in one pass, in x's
        dtype (rounded once), where ch = (row % groups) * (w's length / groups) + column // inner; w, b None
        or flat arrays of x's dtype. The CPU family (a work item a row: norm_rows_aff); None elsewhere."""
        rows, n = x.shape
        if self.family != "cpu" or (rows < self.compute_units and n > 65536):
            return None
        dtype = self._dtype(x)
        if any(v is not None and self._dtype(v) != dtype for v in (w, b)):
            return None
        if act not in (None, "silu"):
            return None
        nch = (w if w is not None else b).shape[0] if (w is not None or b is not None) else groups
        out = self._empty((rows, n), dtype)
        flags = (w is not None) | (b is not None) << 1 | (act == "silu") << 2
        wb = [a for v in (w, b) for a in ((v.buffer, v.offset) if v is not None else (x.buffer, 0))]
        self._run("norm_rows_aff", (rows,), (1,), x.buffer, x.offset, out.buffer, 0, rows, n, 1.0 / n, eps,
                  *wb, flags, groups, nch // groups, inner, params=self._hdt(dtype))
        return out

    def _prelu_fused(self, x, w, C, inner):
        """"prelu": x > 0 ? x : x * w[(i // inner) % C] in one pass (prelu_ch), x's dtype; w of x's dtype
        (else None: the composite runs)."""
        dtype = self._dtype(x)
        if self._dtype(w) != dtype:
            return None
        out = self._empty(x.shape, dtype)
        n = x.size
        if n:
            g, l, chunk = self._flat_geometry(n)
            self._run("prelu_ch", g, l, x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, n, chunk, C, inner,
                      params=self._hdt(dtype))
        return out

    def _bn_group(self) -> int:
        """Work items a channel: 1 on the CPU family, else a power of two up to 256 the device allows."""
        return 1 if self.family == "cpu" else self._group(256)

    def _batch_norm_train(self, x, w, b, rm, rv, momentum: float, eps: float):
        """"batch_norm": (y, new running mean, new running var) of the contiguous float32 (N, C, L) ``x`` in one
        launch (bn_train); w, b, rm, rv None or flat (C,) float32; the statistics None without rm / rv."""
        N, C, L = x.shape
        if any(v is not None and self._dtype(v) != "float32" for v in (x, w, b, rm, rv)):
            return None
        n = N * L
        y = self._empty((N, C, L))
        stats = rm is not None and rv is not None
        st = self._empty((2, C)) if stats else None
        flags = (w is not None) | (b is not None) << 1 | stats << 2
        args = [a for v in (w, b, rm, rv) for a in ((v.buffer, v.offset) if v is not None else (x.buffer, 0))]
        ls = self._bn_group()
        self._run("bn_train", (C * ls,), (ls,), x.buffer, x.offset, y.buffer, y.offset, *args,
                  st.buffer if stats else y.buffer, 0, N, C, L, float(np.float32(1.0) / np.float32(n)), eps,
                  float(np.float32(1.0 - momentum)), momentum, float(np.float32(n / max(n - 1, 1))), flags,
                  params={"BN_LS": ls})
        if not stats:
            return y, None, None
        return y, self._view(st, (C,), st.offset), self._view(st, (C,), st.offset + C)

    def _batch_norm_grad(self, gy, x, w, eps: float, need_input: bool):
        """"batch_norm": (gx or None, gw, gb) of batch_norm in training mode for dL/dy ``gy``, both contiguous
        float32 (N, C, L), in one launch (bn_grad); w None or flat (C,) float32; gw, gb (C,)."""
        N, C, L = x.shape
        if any(v is not None and self._dtype(v) != "float32" for v in (gy, x, w)):
            return None
        n = N * L
        gwb = self._empty((2, C))
        gx = self._empty((N, C, L)) if need_input else None
        flags = (w is not None) | bool(need_input) << 1
        ls = self._bn_group()
        self._run("bn_grad", (C * ls,), (ls,), gy.buffer, gy.offset, x.buffer, x.offset,
                  *((w.buffer, w.offset) if w is not None else (x.buffer, 0)),
                  *((gx.buffer, gx.offset) if need_input else (gwb.buffer, 0)), gwb.buffer, gwb.offset,
                  N, C, L, float(np.float32(1.0) / np.float32(n)), eps, flags, params={"BN_LS": ls})
        return gx, self._view(gwb, (C,), gwb.offset), self._view(gwb, (C,), gwb.offset + C)
