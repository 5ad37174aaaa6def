"""The CUDA backend's W8A8 linear (the fused kernel "w8a8"; the math: ops/w8a8.py): kernels/w8a8.cu's
portable kernels (rows quantized per group, then the tiled int8 GEMM whose four-way dot is __dp4a),
the launch geometry and build of runtime/w8a8.py, shared with the OpenCL GPU family. Imports without
CuPy."""
from __future__ import annotations

import math

from ..runtime import pack_args
from ..runtime import w8a8 as pw


class CudaW8A8:
    """``_linear_w8a8`` of CudaBackend (uses its cp, _function, _empty, _contig and _null)."""

    def _linear_w8a8(self, x, wq, b):
        self._enter()
        sx = tuple(x.shape)
        K, N = sx[-1], wq.shape[0]
        M = math.prod(sx[:-1])
        out = self._empty(sx[:-1] + (N,))
        x = self._contig(x)
        ldq = pw.ldq(K)
        xq = self.cp.empty((M, ldq), dtype=self.cp.int8)
        rs = self.cp.empty((M,), dtype=self.cp.float32)
        g, l = pw.rows_launch(M)
        self._function(pw.FILE, pw.ROWS, pw.MACROS)(g, l, pack_args(pw.ROWS, (x, 0, xq, rs, M, K, ldq)))
        bias, hb = (self._contig(b), 1) if b is not None else (self._null(), 0)
        g, l = pw.gemm_launch(M, N)
        self._function(pw.FILE, pw.GEMM, pw.MACROS)(
            g, l, pack_args(pw.GEMM, (xq, ldq, wq.data, rs, wq.scale, bias, hb, out, M, N, K)))
        return out
