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
#: few rows of many values (a group norm's N * G rows) split over several blocks each (norm_split_cuda.cu):
#: rows of at least NORM_SPLIT_MIN_ROW values, parts of at least NORM_SPLIT_MIN_PART, at most NORM_SPLIT_MAX
#: parts, about two blocks an SM. The VAE decoder's rows (0.26-1 M values, 32 a norm) split; the SD1.5
#: UNet's (at most 82 K) keep one block a row (not yet measured split: 14 us a norm as they are)
NORM_SPLIT = "norm_split_cuda.cu"
NORM_SPLIT_THREADS = 256
NORM_SPLIT_MIN_ROW = 2**17
NORM_SPLIT_MIN_PART = 2**15
NORM_SPLIT_MAX = 32
#: XT of the kernel per stored dtype
NORM_XT = {dtypes.FLOAT32: 0, dtypes.FLOAT16: 1, dtypes.BFLOAT16: 2}


class CudaNorms:
    """_norm_rows_affine of CudaBackend (uses its cp, _dtype, _empty, _enter, _function)."""

    def _norm_rows_affine(self, x, eps, w, b, groups, inner, act=None):
        """Each row of the contiguous (rows, n) ``x`` normalised, ``* w[ch] + b[ch]`` (ch = (row % groups) *
        (w's length / groups) + column // inner), then silu where ``act`` is "silu": one launch (three where a few
        rows of many values are split over several blocks each: ``_norm_split``), in x's dtype;
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
        parts = self._norm_parts(rows, n)
        if parts > 1:
            return self._norm_split(x, y, w_, b_, flags, rows, n, parts, groups, nch // groups, inner, eps, dtype)
        fn = self._function(NORM[0], NORM[1], {"XT": NORM_XT[dtype], "NB": NORM_THREADS})
        fn((rows,), (NORM_THREADS,), pack_args(NORM[1], (x, y, w_, b_, flags, rows, n, groups, nch // groups, inner,
                                                          float(eps))))
        return y

    def _norm_parts(self, rows: int, n: int) -> int:
        """Blocks a row of the fused norm takes: 1 (norm_cuda.cu) unless few rows of many values would leave
        SMs idle; then parts of at least NORM_SPLIT_MIN_PART values, about two blocks an SM."""
        if n < NORM_SPLIT_MIN_ROW or rows >= self.sm_count:
            return 1
        return max(1, min(NORM_SPLIT_MAX, -(-2 * self.sm_count // rows), n // NORM_SPLIT_MIN_PART))

    def _norm_split(self, x, y, w, b, flags, rows, n, parts, groups, cpg, inner, eps, dtype):
        """``_norm_rows_affine`` with each row over ``parts`` blocks: three launches of norm_split_cuda.cu
        (the parts' sums, their squared deviations, the result), float64 partial sums in two small buffers."""
        cp = self.cp
        ws, wq = cp.empty(rows * parts, dtype=cp.float64), cp.empty(rows * parts, dtype=cp.float64)
        macros = {"XT": NORM_XT[dtype], "NB": NORM_SPLIT_THREADS}
        grid, block = (rows * parts,), (NORM_SPLIT_THREADS,)
        self._function(NORM_SPLIT, "ad_norm_split_sum", macros)(
            grid, block, pack_args("ad_norm_split_sum", (x, ws, rows, n, parts)))
        self._function(NORM_SPLIT, "ad_norm_split_dev", macros)(
            grid, block, pack_args("ad_norm_split_dev", (x, ws, wq, rows, n, parts)))
        self._function(NORM_SPLIT, "ad_norm_split_apply", macros)(
            grid, block, pack_args("ad_norm_split_apply", (x, y, w, b, ws, wq, flags, rows, n, parts, groups, cpg,
                                                           inner, float(eps))))
        return y
