"""Row normalisation on OpenCL (kernels/elementwise.cl): layers._normalize fused (``_norm_rows``), and
with the norm's affine applied in the same pass (``_norm_rows_affine``, capability "norm_affine"); and
PReLU in one pass (``_prelu_fused``, capability "prelu")."""
from __future__ import annotations


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
