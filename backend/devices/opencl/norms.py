"""Row normalisation on OpenCL (kernels/elementwise.cl): layers._normalize fused (``_norm_rows``), and
with the norm's affine applied in the same pass (``_norm_rows_affine``, capability "norm_affine"); and
PReLU in one pass (``_prelu_fused``, capability "prelu"); batch norm in training mode, forward and backward
in one launch each (``_batch_norm_train``, ``_batch_norm_grad``, capability "batch_norm"; kernels/batchnorm.cl);
a conv2d's PReLU in its Winograd output transform (``_conv2d_prelu``, capability "conv_prelu")."""
from __future__ import annotations

import threading

import numpy as np

from .memory import CLArray


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

    # ---- conv2d + PReLU (capability "conv_prelu"; compile/aten_ops.py's convolution lowering) --------------
    def _conv2d_prelu(self, x, w, b, stride, padding, dilation, groups, slope):
        """prelu(conv2d(x, w, b, ...), slope) with the PReLU in the Winograd output transform where the conv
        takes that path (kernels/winograd_cpu.cl wino_out), else a pass after it. The slope is handed to this
        thread's ``_conv2d`` calls of this weight and bias (bigconv's chunks of the output); a call on another
        weight or bias (a conv computed in parts, a bias added afterwards) leaves it to the pass after."""
        tls = self.__dict__.setdefault("_conv_ep", threading.local())
        used = [False]
        fits = all(isinstance(v, CLArray) for v in (x, w, slope)) and slope.size in (1, w.shape[0]) \
            and getattr(tls, "ep", None) is None  # float32 (a half model's convs: the PReLU after them)
        if fits:
            tls.ep = (slope, w, b, used)
        try:
            y = self.conv2d(x, w, b, stride, padding, dilation, groups)
        finally:
            if fits:
                tls.ep = None
        return y if used[0] else self._prelu(y, slope)

    def _conv_epilogue(self, w, bias):
        """The PReLU slope a ``_conv2d_prelu`` of this thread set for this very weight and bias (marked used),
        as a (Cout,) array; else None."""
        tls = self.__dict__.get("_conv_ep")
        ep = getattr(tls, "ep", None) if tls is not None else None
        if ep is None or w is not ep[1] or bias is not ep[2]:
            return None
        ep[3][0] = True
        slope = ep[0]
        return slope if slope.size == w.shape[0] else self._binary("mul", self._expand(slope, (w.shape[0],)), 1.0)

    @staticmethod
    def _slope_args(slope, c0: int, dummy):
        """wino_out's PReLU arguments: the slope buffer from output channel c0, and whether to apply it."""
        return (slope.buffer, slope.offset + c0, 1) if slope is not None else (dummy, 0, 0)
