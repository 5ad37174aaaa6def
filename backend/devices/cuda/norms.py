"""The CUDA backend's fused row norm ("norm_affine"), as a mixin of CudaBackend: layer_norm and group_norm
(and a compiled graph's GroupNorm + SiLU pair) in one launch of kernels/norm_cuda.cu, reading and writing
float32, float16 or bfloat16 as stored ("half_norm"), where the composite took about ten CuPy launches and
the casts around them."""
from __future__ import annotations

from ...ops import dtypes
from ..runtime import pack_args

#: file, kernel and threads a row of the fused norm
NORM = ("norm_cuda.cu", "ad_norm_rows_affine")
NORM_THREADS = 512
#: XT of the kernel per stored dtype
NORM_XT = {dtypes.FLOAT32: 0, dtypes.FLOAT16: 1, dtypes.BFLOAT16: 2}


class CudaNorms:
    """_norm_rows_affine of CudaBackend (uses its cp, _dtype, _empty, _enter, _function)."""

    def _norm_rows_affine(self, x, eps, w, b, groups, inner, act=None):
        """Each row of the contiguous (rows, n) ``x`` normalised, ``* w[ch] + b[ch]`` (ch = (row % groups) *
        (w's length / groups) + column // inner), then silu where ``act`` is "silu": one launch, in x's dtype;
        None (the composite) for another activation, a w / b of another dtype, or on ROCm (the kernel's PTX)."""
        dtype = self._dtype(x)
        if self.hip or act not in (None, "silu") or any(v is not None and self._dtype(v) != dtype for v in (w, b)):
            return None
        self._enter()
        cp = self.cp
        x = cp.ascontiguousarray(x)
        rows, n = x.shape
        nch = (w if w is not None else b).shape[0] if (w is not None or b is not None) else groups
        y = self._empty((rows, n), dtype)
        if y.size == 0:
            return y
        w_, b_ = (x if v is None else cp.ascontiguousarray(v) for v in (w, b))
        flags = int(w is not None) | int(b is not None) << 1 | int(act == "silu") << 2
        fn = self._function(NORM[0], NORM[1], {"XT": NORM_XT[dtype], "NB": NORM_THREADS})
        fn((rows,), (NORM_THREADS,), pack_args(NORM[1], (x, y, w_, b_, flags, rows, n, groups, nch // groups, inner,
                                                          float(eps))))
        return y
