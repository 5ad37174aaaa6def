"""The CUDA backend's unary and binary ops on float16 / bfloat16 arrays as they are stored
("half_elementwise"), as a mixin of CudaBackend: one launch of kernels/elementwise_half_cuda.cu each, which
loads the 16-bit values, computes in float32 as the float32 kernels do and rounds once, where a float32
composite took a cast of every operand and of the result (about 1 500 cast launches a float16 SD1.5 UNet
step on an H200, 8.4 of its 40.8 GPU milliseconds). ROCm (no PTX conversions) computes through float32."""
from __future__ import annotations

import math

import numpy as np

from ...ops import dtypes
from ...ops.contract import unary_kernel_args
from ..runtime import pack_args
from .tiles import BLOCK, HALF_EW

#: binary op -> BOP_* code of kernels/elementwise_math.h; comparisons take the float32 path (_compare)
HALF_BINARY_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "minimum": 5, "maximum": 6}
#: XT of the kernel per stored dtype
HALF_XT = {dtypes.FLOAT16: 1, dtypes.BFLOAT16: 2}


def block_pattern(vshape, shape):
    """(inner, count) such that a C-contiguous operand of shape ``vshape`` broadcast to ``shape`` holds the
    value of output i at (i // inner) % count: its dims other than 1 are one run of ``shape``'s dims (with
    only 1s of ``shape`` between them); None where it is not so (the operand is then materialised)."""
    vs = (1,) * (len(shape) - len(vshape)) + tuple(vshape)
    kept = [d for d, v in enumerate(vs) if v != 1]
    if any(vs[d] != shape[d] for d in kept):
        return None
    if not kept:
        return 1, 1
    lo, hi = kept[0], kept[-1]
    if any(vs[d] == 1 and shape[d] != 1 for d in range(lo, hi + 1)):
        return None
    return math.prod(shape[hi + 1:]), math.prod(vs)


class CudaHalfOps:
    """_unary_half / _binary_half of CudaBackend (uses its cp, hip, _cast, _dtype, _empty, _function,
    _launch_1d, _unary, _binary)."""

    def _half_kernel(self, name: str, dtype: str):
        return self._function(HALF_EW, name, {"BLOCK": BLOCK, "XT": HALF_XT[dtype]})

    def _cast_half(self, x, have, dtype):
        """The contiguous ``x`` (float32 or half) converted to ``dtype`` (half or float32) in one launch: CuPy's
        bit operations for bfloat16 took six."""
        half = dtype if have == dtypes.FLOAT32 else have
        name = "ad_to_half" if have == dtypes.FLOAT32 else "ad_from_half"
        y = self._empty(x.shape, dtype)
        self._launch_1d(self._half_kernel(name, half), y.size, pack_args(name, (x, y, y.size)))
        return y

    def _unary_half(self, op, x, dtype, **p):
        """op(x) of a float16 / bfloat16 x, in x's dtype (computed in float32, rounded once)."""
        if self.hip:
            return self._cast(self._unary(op, self._cast(x, dtypes.FLOAT32), **p), dtype)
        x = self.cp.ascontiguousarray(x)
        y = self._empty(x.shape, dtype)
        if y.size == 0:
            return y
        code, p0, p1, has_min, has_max = unary_kernel_args(op, p)
        self._launch_1d(self._half_kernel("ad_unary_h", dtype), y.size,
                        pack_args("ad_unary_h", (x, y, y.size, code, p0, p1, has_min | has_max << 1)))
        return y

    def _binary_half(self, op, a, b, dtype):
        """a op b where every array operand is stored as ``dtype`` (float16 / bfloat16), either side may be a
        number: the result in ``dtype`` for arithmetic (computed in float32, rounded once); comparisons
        give float32 1.0 / 0.0 as the float32 path (the caller rounds them to the result dtype)."""
        cp = self.cp
        if self.hip or op not in HALF_BINARY_CODES:
            a, b = (self._cast(v, dtypes.FLOAT32) if isinstance(v, cp.ndarray) else v for v in (a, b))
            y = self._binary(op, a, b)
            return self._cast(y, dtype) if op in HALF_BINARY_CODES else y
        shape = tuple(np.broadcast_shapes(*(v.shape for v in (a, b) if isinstance(v, cp.ndarray))))
        y = self._empty(shape, dtype)
        n = y.size
        if n == 0:
            return y
        s, operands = 0.0, []
        for v in (a, b):
            if not isinstance(v, cp.ndarray):  # a number: the kernel's s (an = 0)
                s = float(v)
                operands.append((y, 1, 0))
                continue
            pat = block_pattern(v.shape, shape)
            if pat is None:  # an irregular broadcast: its values laid out as y's (one copy kernel)
                v, pat = cp.ascontiguousarray(cp.broadcast_to(v, shape)), (1, n)
            else:
                v = cp.ascontiguousarray(v)
            operands.append((v, *pat))
        (va, ai, an), (vb, bi, bn) = operands
        self._launch_1d(self._half_kernel("ad_binary_h", dtype), n,
                        pack_args("ad_binary_h", (va, vb, y, n, HALF_BINARY_CODES[op], ai, an, bi, bn, s)))
        return y
