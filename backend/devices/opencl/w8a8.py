"""The OpenCL backend's W8A8 linear (the fused kernel "w8a8"; the math: ops/w8a8.py), as a mixin of
OpenCLBackend. CPU family: kernels/w8a8_cpu.cl (rows quantized straight into the packed A, the weight
packed into 32-column int8 panels, int32 GEMM, scales in its epilogue). GPU family: kernels/w8a8.cu,
the CUDA backend's portable kernels built as OpenCL C (runtime/w8a8.py)."""
from __future__ import annotations

import math

from ..runtime import w8a8 as pw


class CLW8A8:
    """``_linear_w8a8`` of OpenCLBackend (uses its _run, _empty, pool, tunables and family)."""

    def _linear_w8a8(self, x, wq, b):
        sx = x.shape
        K, N = sx[-1], wq.shape[0]
        M = math.prod(sx[:-1])
        out = self._empty(sx[:-1] + (N,))
        if b is not None:
            b = self._at0(b, b.offset, N)
        bbuf, hb = (b.buffer, 1) if b is not None else (out.buffer, 0)
        rs = self._empty((M,))  # the rows' scales
        if self.family == "gpu":
            ldq = pw.ldq(K)
            xq = self.pool.alloc(max(4, M * ldq))
            g, l = pw.rows_launch(M)
            self._run(pw.ROWS, tuple(a * c for a, c in zip(g, l)), l, x.buffer, x.offset, xq.buf, rs.buffer,
                      M, K, ldq, params=pw.MACROS)
            g, l = pw.gemm_launch(M, N)
            self._run(pw.GEMM, tuple(a * c for a, c in zip(g, l)), l, xq.buf, ldq, wq.buffer, rs.buffer,
                      wq.scale.buffer, bbuf, hb, out.buffer, M, N, K, params=pw.MACROS)
            return out
        params = self.tunables("w8a8_cpu.cl")
        mr, msub = params["MR"], params["MSUB"]
        mt, nt = -(-M // mr), -(-N // 32)
        ap = self._empty((mt * mr * K,))  # int32 words
        self._run("w8a8_rows_cpu", (mt * mr,), (1,), x.buffer, x.offset, ap.buffer, rs.buffer, M, K, params=params)
        bp = self.pool.alloc(max(4, nt * 32 * K))
        self._run("w8a8_pack_b", (-(-K // params["PK"]), nt), (1, 1), wq.buffer, bp.buf, N, K,
                  params=params)
        self._run("w8a8_gemm_cpu", (-(-M // (mr * msub)), nt), (1, 1), ap.buffer, bp.buf, rs.buffer,
                  wq.scale.buffer, bbuf, hb, out.buffer, M, N, K, params=params)
        return out
