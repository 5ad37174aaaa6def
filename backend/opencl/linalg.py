"""The OpenCL backend's GEMM and convolutions (CPU family: packed GEMM, direct, im2col, Winograd;
GPU family: the portable tiled kernels), as a mixin of OpenCLBackend."""
from __future__ import annotations

import math

import numpy as np

from ..contract import workspace_budget_bytes
from ..plans import conv2d_geometry, conv_transpose2d_geometry
from .memory import CLArray
from .params import DIRECT_MAX_K, PACK_K, SMALL_GEMM_MACS, WINO_MIN_CH, WINO_OB, _direct_spec


class LinalgOps:
    """GEMM / conv ops of OpenCLBackend (uses its _run, _empty, _kernel, pool and family)."""

    # ---- matmul ------------------------------------------------------------------------------
    def _gemm(self, M, N, K, batches, A, a_off, sam, sak, a_bs, B, b_off, sbk, sbn, b_bs, out_shape=None):
        """C (batches, M, N) contiguous = A . B with strided operands (strides in elements)."""
        out = self._empty(out_shape or (batches, M, N))
        if out.size == 0:
            return out
        if K == 0:
            self._fill(out, 0.0)
            return out
        if self.family == "gpu":
            self._run("gemm_gpu", (-(-N // 64) * 16, -(-M // 64) * 16, batches), (16, 16, 1),
                      M, N, K, A.buffer, a_off, sam, sak, a_bs, B.buffer, b_off, sbk, sbn, b_bs,
                      out.buffer, 0, N, M * N, out.buffer, 0, 1 << 30, 0,
                      params=self.tunables("gemm_gpu.cl"))
            return out
        if M * N * K <= SMALL_GEMM_MACS:
            rows = max(1, min(M, 2048 // max(1, N * K)))
            self._run("gemm_small", (1, -(-M // rows), batches), (1, 1, 1) if self.is_cpu_device else None,
                      M, N, K, A.buffer, a_off, sam, sak, a_bs, B.buffer, b_off, sbk, sbn, b_bs,
                      out.buffer, 0, out.buffer, 0, rows)
            return out
        params = self.tunables("gemm_cpu.cl", self._shape_class(M, N, K))
        mr, msub = params["MR"], params["MSUB"]
        ba = batches if a_bs else 1
        bb = batches if b_bs else 1
        mt, nt = -(-M // mr), -(-N // 32)
        Ap = self._empty((ba, mt * mr * K))
        Bp = self._empty((bb, nt * 32 * K))
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        self._run("pack_a", (kb, mt, ba), cpu_l, M, K, A.buffer, a_off, sam, sak, a_bs, Ap.buffer, params=params)
        self._run("pack_b", (kb, nt, bb), cpu_l, N, K, B.buffer, b_off, sbk, sbn, b_bs, Bp.buffer, params=params)
        self._run("gemm_cpu", (-(-M // (mr * msub)), nt, batches), cpu_l,
                  M, N, K, Ap.buffer, (mt * mr * K) if ba > 1 else 0, Bp.buffer, (nt * 32 * K) if bb > 1 else 0,
                  out.buffer, 0, N, M * N, out.buffer, 0, 0, 1 << 30, 0, 0, params=params)
        return out

    def _copy_of(self, x: CLArray) -> CLArray:
        out = self._empty(x.shape)
        self._copy_strided(x, x.offset, (x.size,), (1,), out, 0, (1,))
        return out

    @staticmethod
    def _shape_class(M, N, K) -> str:
        def b(v):
            return "s" if v < 128 else "m" if v < 1024 else "l"
        return b(M) + b(N) + b(K)

    def _mm(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        return self._gemm(M, N, K, 1, a, a.offset, K, 1, 0, b, b.offset, N, 1, 0, out_shape=(M, N))

    def _bmm(self, a, b):
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        if Bb == 1 and Ba > 1:
            y = self._gemm(Ba * M, N, K, 1, a, a.offset, K, 1, 0, b, b.offset, N, 1, 0)
            return self._reshape(y, (B, M, N))
        return self._gemm(M, N, K, B, a, a.offset, K, 1, M * K if Ba > 1 else 0,
                          b, b.offset, N, 1, K * N if Bb > 1 else 0)

    def _linear(self, x, w, b):
        sx, sw = x.shape, w.shape
        if len(sw) != 2:
            return super()._linear(x, w, b)
        rows, K = math.prod(sx[:-1]), sx[-1]
        Nout = sw[0]
        self._check_size("linear", (rows, Nout))
        y = self._gemm(rows, Nout, K, 1, x, x.offset, K, 1, 0, w, w.offset, 1, K, 0,
                       out_shape=sx[:-1] + (Nout,))
        return y if b is None else self._binary("add", y, b)

    # ---- convolution --------------------------------------------------------------------
    def _conv_out(self, g, bias):
        """(output array, bias at offset 0, has-bias flag, bias buffer or a stand-in) for a conv."""
        out = self._empty((g.N, g.Cout, g.OH, g.OW))
        if bias is not None and bias.offset:
            bias = self._copy_of(bias)
        hb = int(bias is not None)
        return out, bias, hb, (bias.buffer if hb else out.buffer)

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        g = conv2d_geometry(x.shape, w.shape, stride, pads, dilation, groups)
        N, C, H, W, Cout, CinG, CoutG, KH, KW, OH, OW, sh, sw, pt, pb, pl, pr, dh, dw, G = g
        out, bias, hb, bbuf = self._conv_out(g, bias)
        if out.size == 0:
            return out
        K = CinG * KH * KW
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, pt, pl, dh, dw)
        if self.family == "gpu":
            self._run("conv2d_gpu", (-(-(OH * OW) // 64) * 16, -(-CoutG // 64) * 16, N * G), (16, 16, 1),
                      x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo,
                      params=self.tunables("conv2d_gpu.cl"))
            return out
        path = self._conv_path(x.shape, Cout, KH, KW, stride, dilation, G, OW)
        if path == "winograd" and self._conv2d_winograd(x, w, bias, out, pt, pl):
            return out
        if path == "winograd":  # Inf/NaN: Winograd's transforms mix a tile (Inf - Inf = NaN)
            path = "direct" if K <= DIRECT_MAX_K and OW >= 24 else "gemm"
        if path == "direct" and not self._all_finite(w):
            path = "gemm"  # Inf/NaN weights: torch multiplies them by the zero padding (-> NaN); im2col does too
        if path == "direct":
            ncob = -(-CoutG // 8)
            self._run("conv2d_direct", (-(-OW // 32), OH, N * G * ncob), (1, 1, 1),
                      x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob,
                      params=_direct_spec(KH, KW, sh, sw, dh, dw))
            return out
        # im2col into packed panels + GEMM, in column chunks that fit the workspace budget
        P = OH * OW
        total = N * P
        per_col = 4 * K * G
        chunk = max(32, (workspace_budget_bytes() // max(1, per_col)) // 32 * 32)
        chunk = min(chunk, -(-total // 32) * 32)
        params = self.tunables("gemm_cpu.cl", self._shape_class(CoutG, chunk, K))
        mr, msub = params["MR"], params["MSUB"]
        mt = -(-CoutG // mr)
        Ap = self._empty((G, mt * mr * K))
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        self._run("pack_a", (kb, mt, G), cpu_l, CoutG, K, w.buffer, w.offset, K, 1, CoutG * K, Ap.buffer,
                  params=params)
        for c0 in range(0, total, chunk):
            nc = min(chunk, total - c0)
            nt = -(-nc // 32)
            Bp = self._empty((G, nt * 32 * K))
            self._run("im2col_pack", (kb, nt, G), cpu_l, x.buffer, x.offset, Bp.buffer,
                      C, H, W, CinG, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, c0, nc)
            self._run("gemm_cpu", (-(-CoutG // (mr * msub)), nt, G), cpu_l,
                      CoutG, nc, K, Ap.buffer, mt * mr * K, Bp.buffer, nt * 32 * K,
                      out.buffer, 0, P, CoutG * P, bbuf, hb, CoutG, P, Cout * P, c0, params=params)
        return out

    def _all_finite(self, a) -> bool:
        """No Inf or NaN in ``a``: sum(a * 0) is 0, or NaN when there is one (one scalar read back)."""
        z = self._reduce("sum", self._binary("mul", a, 0.0), tuple(range(len(a.shape))), False)
        return bool(np.isfinite(self._to_numpy(z)).all())

    def _conv_path(self, xshape, Cout, KH, KW, stride, dilation, groups, OW) -> str:
        """CPU family: which conv2d path a geometry takes ("winograd", "direct" or "gemm")."""
        C = xshape[1]
        K = (C // groups) * KH * KW
        if (KH, KW) == (3, 3) and math.prod(xshape) < 2**31 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 \
                and C >= WINO_MIN_CH and Cout >= WINO_MIN_CH \
                and 16 * 4 * (-(-Cout // 16) * 16) * C <= workspace_budget_bytes():
            return "winograd"
        if K <= DIRECT_MAX_K and OW >= 24:
            return "direct"
        return "gemm"

    def _conv2d_winograd(self, x, w, bias, out, pt, pl):
        """Winograd F(2x2, 3x3) (kernels/winograd_cpu.cl): filter transform straight into packed-A
        panels, input transform straight into packed-B panels (tile chunks within the workspace
        budget), 16 batched gemm_cpu products, output transform adding the bias.

        The two transforms also flag an Inf/NaN among the values they read (a transformed sum that is
        not finite; a finite overflow flags too); returns False then, and the caller recomputes ``out``
        on an exact path. One 4-byte read-back at the end replaces separate finiteness passes."""
        N, C, H, W = x.shape
        Cout = w.shape[0]
        _, _, OH, OW = out.shape
        th, tw = -(-OH // 2), -(-OW // 2)
        total = N * th * tw
        params = self.tunables("gemm_cpu.cl", self._shape_class(Cout, min(total, 1024), C))
        mr, msub = params["MR"], params["MSUB"]
        wparams = dict(params, PK=PACK_K, OB=WINO_OB)
        mt = -(-Cout // mr)
        cpu_l = (1, 1)
        Up = self._empty((16, mt * mr * C))
        flag = self._empty((1,))
        self.cl.enqueue_fill_buffer(self.queue, flag.buffer, np.int32(0), 0, 4)
        self._run("wino_filter", (-(-C // PACK_K), mt), cpu_l, w.buffer, w.offset, Up.buffer, Cout, C,
                  flag.buffer, params=wparams)
        hb = int(bias is not None)
        bbuf = bias.buffer if hb else out.buffer
        per_tile = 4 * 16 * (C + Cout)
        chunk = max(32, (workspace_budget_bytes() // per_tile) // 32 * 32)
        chunk = min(chunk, -(-total // 32) * 32)
        for t0 in range(0, total, chunk):
            ntl = min(chunk, total - t0)
            nt = -(-ntl // 32)
            Vp = self._empty((16, nt * 32 * C))
            self._run("wino_in", (-(-C // PACK_K), nt), cpu_l, x.buffer, x.offset, Vp.buffer,
                      C, H, W, pt, pl, th, tw, t0, ntl, flag.buffer, params=wparams)
            Mb = self._empty((16, Cout, ntl))
            self._run("gemm_cpu", (-(-Cout // (mr * msub)), nt, 16), (1, 1, 1),
                      Cout, ntl, C, Up.buffer, mt * mr * C, Vp.buffer, nt * 32 * C,
                      Mb.buffer, 0, ntl, Cout * ntl, Mb.buffer, 0, 0, 1 << 30, 0, 0, params=params)
            self._run("wino_out", (-(-nt // WINO_OB), Cout), cpu_l, Mb.buffer, ntl, Cout * ntl,
                      out.buffer, 0, bbuf, hb, Cout, OH, OW, th, tw, t0, ntl, params=wparams)
        bad = np.zeros(1, np.int32)
        self.cl.enqueue_copy(self.queue, bad, flag.buffer, is_blocking=True)
        return not bad[0]

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        g = conv_transpose2d_geometry(x.shape, w.shape, stride, padding, output_padding, dilation, groups)
        N, C, H, W, _, CinG, CoutG, KH, KW, OH, OW, sh, sw, ph, _, pw, _, dh, dw, G = g
        out, bias, hb, bbuf = self._conv_out(g, bias)
        if out.size == 0:
            return out
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, ph, pw, dh, dw)
        if self.family == "gpu":
            self._run("conv_transpose2d_gpu", (-(-(OH * OW) // 64) * 16, -(-CoutG // 64) * 16, N * G),
                      (16, 16, 1), x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo,
                      params=self.tunables("conv_transpose2d_gpu.cl"))
            return out
        ncob = -(-CoutG // 8)
        J = -(-OW // sw)
        self._run("conv_t2d_direct", (-(-J // 32), OH * sw, N * G * ncob), (1, 1, 1),
                  x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob,
                  params=_direct_spec(KH, KW, sh, sw, dh, dw))
        return out

