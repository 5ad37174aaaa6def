"""The OpenCL backend's GEMM and convolutions (CPU family: packed GEMM, direct, im2col, Winograd;
GPU family: the dispatch here, the launches of the CUDA backend's kernels built as OpenCL C in
gpu_linalg.py), as a mixin of OpenCLBackend."""
from __future__ import annotations

import math
import weakref

import numpy as np

from ...ops.bigconv import WINOGRAD_MIN_CH
from ...ops.contract import workspace_budget_bytes
from ...ops.plans import conv2d_geometry, conv_transpose2d_geometry
from ...ops.quant import FORMATS
from .memory import CLArray, CLHalf, CLQuant, _Block
from .winograd import WINO_FUSED_MAX_C
from .params import (ATT_NL, DIRECT_MAX_K, DIRECT_PAD_MAX_BYTES, DIRECT_PAD_MAX_TILES, GEMM_A_UNPACKED, GEMM_B_CHUNK_BYTES,  # noqa: F401
                     GEMM_B_HALVES, HALF_CODES, LINEAR_TRANSPOSED, LINEAR_TRANSPOSED_MAX_ROWS, LINEAR_TRANSPOSED_RATIO, PACK_K,
                     POINTWISE_GEMM, POINTWISE_MIN_PIXELS, SMALL_GEMM_MACS, WEIGHT_PANEL_BYTES, WINOGRAD_MIN_TILES,
                     WINOGRAD_NARROW_MIN_CH, WINOGRAD_WIDE, _direct_spec)



class LinalgOps:
    """GEMM / conv ops of OpenCLBackend (uses its _run, _empty, _kernel, pool and family).

    A weight may come stored in half (``CLHalf``: the contract passes conv2d's and linear's weight as
    it is stored where ``caps.fused`` has "half_weights"): the CPU family's kernels that read weights
    (pack_a, pack_b, wino_filter, conv2d_direct) are built with -DWDT=1/2 and convert in registers
    (kernels/weight_load.h); the other paths convert it to float32 first (``_f32``)."""

    @staticmethod
    def _wdt(x) -> dict:
        """The build option that reads ``x`` as it is stored ({} for float32)."""
        if isinstance(x, CLQuant):
            return {"WDT": FORMATS[x.fmt].code}
        return {"WDT": HALF_CODES[x.dtype]} if isinstance(x, CLHalf) else {}

    @staticmethod
    def _xdt(x, option="XDT") -> dict:
        """The build option of a kernel reading (XDT) or writing (YDT) an activation ``x`` as stored
        (kernels/half_io.h): {} for float32."""
        return {option: HALF_CODES[x.dtype]} if isinstance(x, CLHalf) else {}

    @staticmethod
    def _wq(x) -> tuple:
        """The last two arguments of a kernel that reads weights (weight_load.h WQ_PARAMS): a quantized
        int8 / fp8 weight's scales and row length; else any buffer and 0."""
        if isinstance(x, CLQuant) and x.scale is not None:
            return x.scale.buffer, x.rowlen
        return x.buffer, 0

    def _f32(self, x):
        """``x`` as a float32 CLArray (a half-stored weight converted, a quantized one dequantized, on the
        device: a copy for one op)."""
        if isinstance(x, CLQuant):
            return self._dequant(x)
        return self._cast(x, "float32") if isinstance(x, CLHalf) else x

    # ---- matmul ------------------------------------------------------------------------------
    def _gemm(self, M, N, K, batches, A, a_off, sam, sak, a_bs, B, b_off, sbk, sbn, b_bs, out_shape=None,
              out_dtype="float32", out=None, bias=None, out_t=False, col_bias=None):
        """C (batches, M, N) contiguous = A . B with strided operands (strides in elements). C is float32,
        or ``out_dtype`` where the CPU family's packed GEMM stores it (gemm_cpu's YDT: rounded once).
        ``out_t`` (CPU family, one batch, past SMALL_GEMM_MACS): C stored transposed, C[m][n] at out[n][m].
        CPU family, M * N * K past SMALL_GEMM_MACS: into ``out`` (contiguous, float32 or half) where given,
        plus ``bias`` (M floats at offset 0) per row where given, or ``col_bias`` (N floats) per column."""
        shape = out_shape or (batches, M, N)
        half = out_dtype != "float32" and self.family != "gpu" and M * N * K > SMALL_GEMM_MACS
        if out is None:
            out = self._empty(shape, out_dtype if half else "float32")
        if out.size == 0:
            return out
        if K == 0:
            self._fill(out, 0.0)
            if bias is not None:  # (float32 out: the copy moves words of one dtype)
                self._copy_strided(bias, bias.offset, (batches, M, N), (0, 1, 0), out, out.offset, (M * N, N, 1))
            return out
        if self.family == "gpu":  # a quantized operand stays packed (ad_conv_gemm decodes it: WQA / WQB)
            A, B = self._gpu_quant_ok(A, sam, sak, M, K), self._gpu_quant_ok(B, sbk, sbn, K, N)
        elif M * N * K <= SMALL_GEMM_MACS:
            A, B = self._f32(A), self._f32(B)
        if self.family == "gpu":
            A, sam, sak, a_bs, ta = self._gpu_operand(A, a_off, sam, sak, a_bs, batches, M, K)
            B, sbk, sbn, b_bs, tb = self._gpu_operand(B, b_off, sbk, sbn, b_bs, batches, K, N)
            vec_a = not ta and sam % 4 == 0 and a_bs % 4 == 0 and K % 4 == 0 and not isinstance(A, CLQuant)
            vec_b = not tb and sbk % 4 == 0 and b_bs % 4 == 0 and N % 4 == 0 and not isinstance(B, CLQuant)
            self._conv_gemm("gemm", dict(IS_GEMM=1, TRANS_A=ta, TRANS_B=tb), vec_a, vec_b, M, N, K, batches,
                            (A, sam, sak, a_bs), (B, sbk, sbn, b_bs), out, (N, M * N), None, (0,) * 15)
            return out
        if M * N * K <= SMALL_GEMM_MACS:
            if self._dtype(out) != "float32":
                raise ValueError(f"gemm_small writes float32, not into a {self._dtype(out)} output")
            rows = max(1, min(M, 2048 // max(1, N * K)))
            self._run("gemm_small", (1, -(-M // rows), batches), (1, 1, 1) if self.is_cpu_device else None,
                      M, N, K, A.buffer, a_off, sam, sak, a_bs, B.buffer, b_off, sbk, sbn, b_bs,
                      out.buffer, 0, out.buffer if bias is None else bias.buffer, int(bias is not None), rows)
            return out
        params = self._b_halves(self.tunables("gemm_cpu.cl", self._shape_class(M, N, K)))
        mr, msub = params["MR"], params["MSUB"]
        ba = batches if a_bs else 1
        bb = batches if b_bs else 1
        # a weight stored compressed (half, quantized) is packed to float32 panels in slices of rows (A) or
        # columns (B) of at most WEIGHT_PANEL_BYTES: never a float32 copy of the whole weight
        mstep = self._weight_rows(A, M, 4 * K, mr * msub) if ba == 1 else M
        nstep = self._weight_rows(B, N, 4 * K, 32) if bb == 1 else N
        if GEMM_B_CHUNK_BYTES and 4 * K * N * bb > GEMM_B_CHUNK_BYTES:
            nstep = min(nstep, max(32, GEMM_B_CHUNK_BYTES // (4 * K * bb) // 32 * 32))
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        Bp = None
        # one float32 A for every batch, rows of K: gemm_cpu reads its rows as stored (AU), no pack_a pass
        au = (GEMM_A_UNPACKED and ba == 1 and sak == 1 and sam == K and not self._compressed(A)
              and self.gemm_reads_a(batches * -(-N // 32)))
        for m0 in range(0, M, mstep):
            mc = min(mstep, M - m0)
            mt = -(-mc // mr)
            if au:  # (ap_bs carries A's offset)
                Ap, a0 = A, a_off + m0 * K
            else:
                Ap, a0 = self._empty((ba, mt * mr * K)), (mt * mr * K) if ba > 1 else 0
                self._run("pack_a", (kb, mt, ba), cpu_l, mc, K, A.buffer, a_off + m0 * sam, sam, sak, a_bs, Ap.buffer,
                          *self._wq(A), params={**params, **self._wdt(A)})
            bsl = None if bias is None else self._slice_bias(bias, 1, M, m0, mc)
            # gemm_cpu's bias and has_bias: per column (2), per row of this slice (1), or none (0)
            bias_args = ((col_bias.buffer, 2) if col_bias is not None else (bsl.buffer, 1) if bsl is not None
                         else (out.buffer, 0))
            for n0 in range(0, N, nstep):
                nc = min(nstep, N - n0)
                nt = -(-nc // 32)
                if Bp is None or nstep < N:
                    Bp = self._empty((bb, nt * 32 * K))
                    self._run("pack_b", (kb, nt, bb), cpu_l, nc, K, B.buffer, b_off + n0 * sbn, sbk, sbn, b_bs,
                              Bp.buffer, *self._wq(B), params={**params, **self._wdt(B)})
                # C's place: rows of N (c_off, ldc, c_bs, cseg, cseg_stride), or transposed: column n at n * M
                cmap = (m0, 1, M * N, 1, M) if out_t else (m0 * N, N, M * N, 1 << 30, 0)
                self._run("gemm_cpu", (-(-mc // (mr * msub)), nt, batches), cpu_l,
                          mc, nc, K, Ap.buffer, a0, Bp.buffer,
                          (nt * 32 * K) if bb > 1 else 0, out.buffer, *cmap[:3],
                          *bias_args, 0, *cmap[3:], n0,
                          params={**self.gemm_build(params, mc, K, nt), **self._xdt(out, "YDT"), **({"AU": 1} if au else {})})
            del Ap
        return out

    @staticmethod
    def _b_halves(params: dict) -> dict:
        """gemm_cpu's tunables with BH (B panels as two K x 16 halves, each NH pass's rows contiguous) where it runs
        in two 16-column passes (NH 2) and GEMM_B_HALVES is on; for the packers of B (pack_b, wino_in) and gemm_cpu."""
        return dict(params, BH=1) if params.get("NH", 1) == 2 and GEMM_B_HALVES else params

    @staticmethod
    def _compressed(x) -> bool:
        """A weight stored in fewer bytes than float32 (half or quantized): packed in slices."""
        return isinstance(x, (CLHalf, CLQuant))

    def _packed_b(self, B, b_off, sbk, sbn, b_bs, N, K, batches, params):
        """B in pack_b's layout (per batch ceil(N/32)*32*K), as _gemm packs it."""
        bb = batches if b_bs else 1
        nt = -(-N // 32)
        Bp = self._empty((bb, nt * 32 * K))
        self._run("pack_b", (-(-K // PACK_K), nt, bb), (1, 1, 1), N, K, B.buffer, b_off, sbk, sbn, b_bs, Bp.buffer,
                  *self._wq(B), params={**params, **self._wdt(B)})
        return Bp

    def _gemm_packed(self, Ap, Bp, M, N, K, batches, params):
        """_gemm's CPU-family GEMM of operands already packed (pack_a's / pack_b's layouts; an
        operand with one batch is shared by all)."""
        out = self._empty((batches, M, N))
        mr, msub = params["MR"], params["MSUB"]
        mt, nt = -(-M // mr), -(-N // 32)
        self._run("gemm_cpu", (-(-M // (mr * msub)), nt, batches), (1, 1, 1),
                  M, N, K, Ap.buffer, (mt * mr * K) if Ap.shape[0] > 1 else 0,
                  Bp.buffer, (nt * 32 * K) if Bp.shape[0] > 1 else 0,
                  out.buffer, 0, N, M * N, out.buffer, 0, 0, 1 << 30, 0, 0, params=params)
        return out

    def _attention(self, q, k, v, m, plan, causal):
        if "attention" in self.caps.fused:  # the fused kernel (attention.py) per query block
            return super()._attention(q, k, v, m, plan, causal)
        y = self._attention_cpu(q, k, v, m, plan, causal)
        if y is not None:
            return y
        self._att_packs = {}  # kt's and v's packed panels, shared by the query blocks of this call
        try:
            return super()._attention(q, k, v, m, plan, causal)
        finally:
            self._att_packs = {}

    def _attention_cpu(self, q, k, v, m, plan, causal):
        """CPU family, no mask, not causal, q / k / v of one batch shape (else None: the generic
        blocks). The whole call in place of attention.py's blocks: k^T packed for gemm_cpu
        straight from k (no transposed copy) and v packed once; per query block, q's rows packed
        straight from q (no slice copy), s = q k^T (gemm_cpu, ``ATT_NL`` column tiles a work
        item: K = E is short), softmax_tile writes exp(s - max) into e @ v's packed A and the
        row sums into one (B, L) array, and e @ v lands in its rows of the (B, L, Ev) output
        (no concatenation); one division at the end. The same kernels and the same values as
        the blocked path."""
        sq, sk, sv = self._shape(q), self._shape(k), self._shape(v)
        B, L, E, S, Ev = math.prod(sq[:-2]), sq[-2], sq[-1], sk[-2], sv[-1]
        rows = self._attention_block_rows(plan)
        if (self.family != "cpu" or m is not None or causal or sk[:-2] != sq[:-2] or sv[:-2] != sq[:-2]
                or rows * Ev * S <= SMALL_GEMM_MACS or rows * S * E <= SMALL_GEMM_MACS or B * L * S * Ev == 0):
            return None
        p1 = self.tunables("gemm_cpu.cl", self._shape_class(rows, S, E))
        p1n = dict(p1, NL=ATT_NL)
        p2 = self.tunables("gemm_cpu.cl", self._shape_class(rows, Ev, S))
        mr1, mr, msub = p1["MR"], p2["MR"], p2["MSUB"]
        if mr > 16:
            return None
        if plan.scale != 1.0:
            q = self._binary("mul", q, plan.scale)
        kp = self._packed_b(k, k.offset, 1, E, S * E if B > 1 else 0, S, E, B, p1)  # k^T: (E, S)
        vp = self._packed_b(v, v.offset, Ev, 1, S * Ev if B > 1 else 0, Ev, S, B, p2)
        y = self._empty((B, L, Ev))
        t = self._empty((B, L, 1))
        nt1, nt2 = -(-S // 32), -(-Ev // 32)
        for r0 in range(0, L, rows):
            n = min(rows, L - r0)
            mt1, mt = -(-n // mr1), -(-n // mr)
            aq = self._empty((B, mt1 * mr1 * E))
            self._run("pack_a", (-(-E // PACK_K), mt1, B), (1, 1, 1), n, E, q.buffer, q.offset + r0 * E, E, 1,
                      L * E, aq.buffer, *self._wq(q), params=p1)
            s = self._empty((B, n, S))
            self._run("gemm_cpu", (-(-n // (mr1 * p1["MSUB"])), -(-nt1 // ATT_NL), B), (1, 1, 1),
                      n, S, E, aq.buffer, mt1 * mr1 * E, kp.buffer, (nt1 * 32 * E) if B > 1 else 0,
                      s.buffer, 0, S, n * S, s.buffer, 0, 0, 1 << 30, 0, 0, params=p1n)
            del aq
            ap = self._empty((B, mt * mr * S))
            self._run("softmax_tile", (B * mt,), (1,), s.buffer, 0, ap.buffer, 0, t.buffer, r0, B, n, S, mr, L)
            del s
            self._run("gemm_cpu", (-(-n // (mr * msub)), nt2, B), (1, 1, 1),
                      n, Ev, S, ap.buffer, mt * mr * S, vp.buffer, (nt2 * 32 * S) if B > 1 else 0,
                      y.buffer, r0 * Ev, Ev, L * Ev, y.buffer, 0, 0, 1 << 30, 0, 0, params=p2)
            del ap
        return self._reshape(self._binary("div", y, t), plan.out_shape)

    def _att_packed_b(self, x, N, K, B, params):
        """x (B, K, N) contiguous packed for gemm_cpu, once per attention call (x stays referenced
        by the cache entry, so its id is not reused while the entry lives)."""
        packs = getattr(self, "_att_packs", None)
        hit = None if packs is None else packs.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        Bp = self._packed_b(x, x.offset, N, 1, K * N if B > 1 else 0, N, K, B, params)
        if packs is not None:
            packs[id(x)] = (x, Bp)
        return Bp

    def _attention_rows(self, q, kt, v, m):
        """CPU family, no mask, one batch shape: kt and v packed once per call, and softmax_tile
        writes exp(s - max) straight into gemm_cpu's packed A of e @ v (no pack_a pass over the
        block's largest operand)."""
        sq, sv = q.shape, v.shape
        B, M, E, S, Ev = math.prod(sq[:-2]), sq[-2], sq[-1], kt.shape[-1], sv[-1]
        if (self.family != "cpu" or "attention" in self.caps.fused or m is not None or kt.shape[:-2] != sq[:-2]
                or sv[:-2] != sq[:-2] or M * Ev * S <= SMALL_GEMM_MACS or M * S * E <= SMALL_GEMM_MACS or B * M * S * Ev == 0):
            return super()._attention_rows(q, kt, v, m)
        p1 = self.tunables("gemm_cpu.cl", self._shape_class(M, S, E))
        mr1 = p1["MR"]
        Aq = self._empty((B, -(-M // mr1) * mr1 * E))
        self._run("pack_a", (-(-E // PACK_K), -(-M // mr1), B), (1, 1, 1), M, E, q.buffer, q.offset, E, 1, M * E,
                  Aq.buffer, *self._wq(q), params=p1)
        s = self._gemm_packed(Aq, self._att_packed_b(kt, S, E, B, p1), M, S, E, B, p1)
        del Aq
        params = self.tunables("gemm_cpu.cl", self._shape_class(M, Ev, S))
        mr = params["MR"]
        mt = -(-M // mr)
        Ap = self._empty((B, mt * mr * S))
        t = self._empty(sq[:-1] + (1,))
        if mr <= 16:
            self._run("softmax_tile", (B * mt,), (1,), s.buffer, s.offset, Ap.buffer, 0, t.buffer, 0, B, M, S, mr, M)
        else:
            self._run("softmax_rows", (B * mt * mr,), (1,), s.buffer, s.offset, Ap.buffer, 0, t.buffer, 0, B, M, S, mr)
        del s
        y = self._gemm_packed(Ap, self._att_packed_b(v, Ev, S, B, params), M, Ev, S, B, params)
        return self._binary("div", self._reshape(y, sq[:-1] + (Ev,)), t)

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
        # two half operands of one dtype ("half_gemm"): the result has their dtype, stored by the GEMM
        dt = a.dtype if isinstance(a, CLHalf) and isinstance(b, CLHalf) and a.dtype == b.dtype else "float32"
        return self._gemm(M, N, K, 1, a, a.offset, K, 1, 0, b, b.offset, N, 1, 0, out_shape=(M, N), out_dtype=dt)

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
            return super()._linear(self._f32(x), self._f32(w), b)
        rows, K = math.prod(sx[:-1]), sx[-1]
        Nout = sw[0]
        self._check_size("linear", (rows, Nout))
        packed = self.family == "cpu" and rows * Nout * K > SMALL_GEMM_MACS
        if isinstance(x, CLHalf):  # a half input ("half_linear"): the CPU family's packing reads it as stored
            if not packed:
                x = self._f32(x)
            elif isinstance(w, CLHalf) and w.dtype == x.dtype and (b is None or self._dtype(b) == "float32"):
                # both half of one dtype: the result in it, the bias added in the GEMM's epilogue (rounded once)
                return self._gemm(rows, Nout, K, 1, x, x.offset, K, 1, 0, w, w.offset, 1, K, 0, out_shape=sx[:-1] + (Nout,),
                                  out_dtype=x.dtype, col_bias=None if b is None else self._copy_of(b) if b.offset else b)
        if (LINEAR_TRANSPOSED and packed and not self._compressed(w) and not isinstance(x, CLHalf)
                and rows <= LINEAR_TRANSPOSED_MAX_ROWS and rows * LINEAR_TRANSPOSED_RATIO <= Nout
                and (b is None or self._dtype(b) == "float32")):
            # y^T = w x^T: the weight is A as stored (its rows of K), only x is packed; the bias in the epilogue
            y = self._empty(sx[:-1] + (Nout,))
            return self._gemm(Nout, rows, K, 1, w, w.offset, K, 1, 0, x, x.offset, 1, K, 0, out=y, bias=b, out_t=True)
        y = self._gemm(rows, Nout, K, 1, x, x.offset, K, 1, 0, w, w.offset, 1, K, 0,
                       out_shape=sx[:-1] + (Nout,))
        return y if b is None else self._binary("add", y, b)

    # ---- convolution --------------------------------------------------------------------
    def _conv_out(self, g, bias, dtype="float32"):
        """(output array, bias at offset 0, has-bias flag, bias buffer or a stand-in) for a conv."""
        out = self._empty((g.N, g.Cout, g.OH, g.OW), dtype)
        if bias is not None and bias.offset:
            bias = self._copy_of(bias)
        hb = int(bias is not None)
        return out, bias, hb, (bias.buffer if hb else out.buffer)

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        slope = self._conv_epilogue(w, bias)
        done = [False]
        out = self._conv2d_paths(x, w, bias, stride, pads, dilation, groups, slope, done)
        if slope is not None and not done[0]:
            out = self._prelu(out, slope)
        return out

    def _conv2d_paths(self, x, w, bias, stride, pads, dilation, groups, slope=None, done=None):
        """conv2d on the CPU family's paths (or the GPU family's); ``slope``: a PReLU the Winograd output
        transform applies (then done[0] is set)."""
        g = conv2d_geometry(x.shape, w.shape, stride, pads, dilation, groups)
        N, C, H, W, Cout, CinG, CoutG, KH, KW, OH, OW, sh, sw, pt, pb, pl, pr, dh, dw, G = g
        K = CinG * KH * KW
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, pt, pl, dh, dw)
        path = "gpu" if self.family == "gpu" else self._conv_path(x.shape, Cout, KH, KW, stride, dilation, G, OW,
                                                                  (pt, pb, pl, pr))
        if isinstance(x, CLHalf) and path in ("gpu", "direct"):  # ("half_conv": the CPU family's
            x = self._f32(x)  # Winograd and im2col paths read a half input as it is stored)
        # Winograd and the GEMM write a half input's result in its dtype (the contract's result dtype: "half_conv")
        out, bias, hb, bbuf = self._conv_out(g, bias, self._dtype(x) if path in ("winograd", "gemm", "pointwise")
                                             else "float32")
        if out.size == 0:
            return out
        if path == "gpu":
            return self._gpu_conv(x, w if isinstance(w, CLQuant) else self._f32(w), bias, out, g, 0)
        if path == "pointwise":  # out[n] = w (Cout x C) . x[n] (C x H*W): _gemm's packed GEMM, B straight from x
            P = H * W
            return self._gemm(Cout, P, C, N, w, w.offset, C, 1, 0, x, x.offset, P, 1, C * P, out=out, bias=bias)
        if path == "winograd" and self._conv2d_winograd(x, w, bias, out, pt, pl,
                                                         slope if isinstance(out, CLArray) else None):
            done[0] = slope is not None and isinstance(out, CLArray)
            return out
        if path == "winograd":  # Inf/NaN: Winograd's transforms mix a tile (Inf - Inf = NaN)
            path = "direct" if K <= DIRECT_MAX_K and OW >= 24 else "gemm"
            if path == "direct" and isinstance(x, CLHalf):  # (the GEMM path reads and writes half)
                x, out = self._f32(x), self._empty(out.shape)
        if path == "direct" and isinstance(w, CLQuant):
            path = "gemm"
        if path == "direct" and isinstance(w, CLHalf):
            # the direct kernel reads each weight once per output tile: a half weight converted once
            # (a float32 panel of at most WEIGHT_PANEL_BYTES, as the GEMM paths unpack), else the GEMM path
            if 4 * w.size <= WEIGHT_PANEL_BYTES:
                w = self._f32(w)
            else:
                path = "gemm"
        if path == "direct":
            tile = self.default_tunables("conv_cpu.cl")
            x, geo = self._direct_padded(x, geo, tile["TN"])
            ncob = -(-CoutG // tile["DCO"])
            # Inf/NaN weights: torch multiplies them by the zero padding (-> NaN); the kernel does too where
            # the flag (computed on the device, no read-back) says so
            flag = self._finite_flag(w)
            self._run("conv2d_direct", (-(-OW // tile["TN"]) * ncob, OH, N * G), (1, 1, 1),
                      x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob, flag.buffer,
                      params={**_direct_spec(KH, KW, sh, sw, dh, dw), **self._wdt(w), **tile})
            return out
        # im2col into packed panels + GEMM, in column chunks that fit the workspace budget
        P = OH * OW
        total = N * P
        per_col = 4 * K * G
        chunk = max(32, (workspace_budget_bytes() // max(1, per_col)) // 32 * 32)
        chunk = min(chunk, -(-total // 32) * 32)
        params = self._b_halves(self._rows_fit(self._shape_class(CoutG, chunk, K), CoutG))
        mr, msub = params["MR"], params["MSUB"]
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        mstep = self._weight_rows(w, CoutG, 4 * K * G, mr * msub)
        slices = []  # (first row, rows, row tiles, bias buffer of those rows, packed weight or None)
        for m0 in range(0, CoutG, mstep):  # one slice (the whole weight) unless it is stored compressed
            mc = min(mstep, CoutG - m0)
            slices.append([m0, mc, -(-mc // mr), self._slice_bias(bias, G, CoutG, m0, mc) if hb else None, None])
        # a float32 weight of one group (one slice: the whole weight): gemm_cpu reads its rows as stored (AU)
        au = GEMM_A_UNPACKED and G == 1 and not self._compressed(w) and self.gemm_reads_a(-(-total // 32))
        for c0 in range(0, total, chunk):
            nc = min(chunk, total - c0)
            nt = -(-nc // 32)
            Bp = self._empty((G, nt * 32 * K))
            self._run("im2col_pack", (kb, nt, G), cpu_l, x.buffer, x.offset, Bp.buffer,
                      C, H, W, CinG, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, c0, nc,
                      params={**self._xdt(x), **({"BH": 1} if params.get("BH") else {})})
            for sl in slices:
                m0, mc, mt, bb, Ap = sl
                if au:  # no pack_a pass
                    Ap = w
                elif Ap is None:
                    Ap = self._empty((G, mt * mr * K))
                    self._run("pack_a", (kb, mt, G), cpu_l, mc, K, w.buffer, w.offset + m0 * K, K, 1, CoutG * K,
                              Ap.buffer, *self._wq(w), params={**params, **self._wdt(w)})
                    if len(slices) == 1:
                        sl[4] = Ap  # the whole weight: packed once for every column chunk
                self._run("gemm_cpu", (-(-mc // (mr * msub)), nt, G), cpu_l,
                          mc, nc, K, Ap.buffer, w.offset + m0 * K if au else mt * mr * K, Bp.buffer, nt * 32 * K,
                          out.buffer, m0 * P, P, CoutG * P, bb.buffer if hb else bbuf, hb, mc, P, Cout * P, c0,
                          params={**self.gemm_build(params, mc, K, nt), **self._xdt(out, "YDT"), **({"AU": 1} if au else {})})
                del Ap
        return out

    def _weight_rows(self, w, rows: int, row_bytes: int, multiple: int) -> int:
        """Rows of a weight packed to float32 panels at once: all of them, or for a weight stored compressed
        (half, quantized) slices of at most WEIGHT_PANEL_BYTES (a multiple of ``multiple`` rows)."""
        if not self._compressed(w) or rows * row_bytes <= WEIGHT_PANEL_BYTES:
            return rows
        return max(multiple, WEIGHT_PANEL_BYTES // row_bytes // multiple * multiple)

    def _slice_bias(self, bias, G, CoutG, m0, mc):
        """The bias of output channels [m0, m0 + mc) of each group, laid out (G, mc) (the GEMM reads
        bias[group * mc + row]); the bias itself when that is all of it. (The caller keeps the array,
        not only its buffer: a dropped array's buffer goes back to the pool.)"""
        if mc == CoutG:
            return bias
        part = self._empty((G, mc))
        self._copy_strided(bias, bias.offset + m0, (G, mc), (CoutG, 1), part, 0, (mc, 1))
        return part

    def _finite_flag(self, w):
        """A one-element device array: sum(w * 0), 0 where ``w`` (float32 or half) is finite, NaN where it holds
        an Inf or NaN; kept per pooled buffer while it lives (no op writes into an array it did not make; a
        buffer on the caller's host memory is checked at every call: its owner may write it)."""
        pooled = isinstance(w.block, _Block)
        flags = self.__dict__.setdefault("_finite_flags", weakref.WeakKeyDictionary()).setdefault(w.block, {}) \
            if pooled else {}
        key = (w.offset, w.size, self._dtype(w))
        f = flags.get(key)
        if f is None:
            f = flags[key] = self._nan_sum(self._f32(w))
        return f

    def _nan_sum(self, a):
        """sum(a * 0) as a 0-d device array: 0 where ``a`` is finite, NaN where it holds an Inf or NaN."""
        return self._reduce("sum", self._binary("mul", a, 0.0), tuple(range(len(a.shape))), False)

    def _all_finite(self, a) -> bool:
        """No Inf or NaN in ``a`` (``_nan_sum``, one scalar read back; while recording, a guard instead)."""
        s = self._nan_sum(a)
        rec = self.recording()
        if rec is not None:
            rec.guard_finite(s)
            return True
        return bool(np.isfinite(self._to_numpy(s)).all())

    def _direct_padded(self, x, geo, tn):
        """conv2d_direct loads a tile's ``tn`` input columns with vector loads where they all lie inside
        the row, and one by one where the tile crosses the left or right edge (at W = 64 every tile
        does). Where at most DIRECT_PAD_MAX_TILES tiles span a row, the columns are zero-padded once
        (pad2d, one pass over x) so that every tile lies inside: (x, geo) with W and pl replaced."""
        C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, pt, pl, dh, dw = geo
        last = -(-OW // tn) * tn - 1 - pl + (KW - 1) * dw  # the last tile's last column
        if sw != 1 or -(-OW // 32) > DIRECT_PAD_MAX_TILES or (pl == 0 and last < W):
            return x, geo
        right = max(0, last + 1 - W)  # columns past W the tiles read
        Wp = pl + W + right
        if 4 * x.shape[0] * C * H * Wp > DIRECT_PAD_MAX_BYTES:
            return x, geo
        xp = self._pad(x, (0, 0, pl, right), "zeros")
        return xp, (C, H, Wp, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, pt, 0, dh, dw)

    def _conv_path(self, xshape, Cout, KH, KW, stride, dilation, groups, OW, pads=None) -> str:
        """CPU family: which conv2d path a geometry takes ("pointwise", "winograd", "direct" or "gemm"); ``pads``
        (t, b, l, r) where the caller has them (a 1x1 conv without padding: "pointwise")."""
        C = xshape[1]
        K = (C // groups) * KH * KW
        if POINTWISE_GEMM and (KH, KW) == (1, 1) and tuple(stride) == (1, 1) and groups == 1 and pads is not None \
                and not any(pads) and xshape[2] * xshape[3] >= POINTWISE_MIN_PIXELS \
                and Cout * math.prod(xshape[1:]) > SMALL_GEMM_MACS and 4 * math.prod(xshape) <= workspace_budget_bytes():
            return "pointwise"
        direct = K <= DIRECT_MAX_K and OW >= 24
        # narrow vectors (AVX2; tuning.py): Winograd from WINOGRAD_NARROW_MIN_CH channels on both sides, on any
        # row width (2-core AVX2 EPYC, direct -> Winograd: 16x32x64^2 32 -> 32 28 -> 19 ms, 4x32x128^2 29 -> 16,
        # 1x48x128^2 15.5 -> 11.3, 1x32x512^2 134 -> 67; since wino_fused, medians of 7 in one process:
        # 1x16x512^2 16 -> 16 24.9 -> 19.7 ms, 1x16x256^2 16 -> 32 10.8 -> 8.8, 1x32x256^2 32 -> 16 11.3 -> 8.2,
        # 16x16x64^2 and 4x16x128^2 16 -> 16 even; 8 -> 8 direct, 5.5 against 10.6)
        narrow = self.narrow_vectors and min(C, Cout) >= WINOGRAD_NARROW_MIN_CH
        # wide vectors: wino_fused's convs from 8 input channels, fewer on rows the direct kernel pads (WINOGRAD_WIDE)
        narrow = narrow or (WINOGRAD_WIDE and self.wide_vectors and C <= WINO_FUSED_MAX_C
                            and 16 * 32 * 4 * C <= int(self.dev.local_mem_size)
                            and (C >= 8 or (direct and -(-OW // 32) <= DIRECT_PAD_MAX_TILES)))
        if direct and -(-OW // 32) <= DIRECT_PAD_MAX_TILES and not narrow:
            return "direct"  # narrow rows, padded (_direct_padded): faster than Winograd up to 64 channels
        # rows of more than DIRECT_PAD_MAX_TILES tiles (the direct kernel's edge tiles load one by one): Winograd
        # from 32 channels where in x out channels reach 2048 (1x64x256^2: 64 -> 48 36 -> 23 ms, 64 -> 32 30 -> 23,
        # 32 -> 64 27 -> 20; 32 -> 32 and 64 <-> 16 stay direct, 13 against 22 ms)
        wide = -(-OW // 32) > DIRECT_PAD_MAX_TILES and min(C, Cout) >= 32 and C * Cout >= 2048
        # few output channels from many input channels, where the direct kernel does not take the conv (more taps than
        # DIRECT_MAX_K, or rows under 24 columns): a model's last conv (the VAE decoder's 128 -> 3 at 512^2, the UNet's
        # 320 -> 4); im2col's GEMM has 3-4 rows a pass over its columns (2-core AVX2 EPYC: 1x128x512^2 -> 3 445 against
        # 54 ms, PyTorch 131; 1x320x64^2 -> 4 18.6 against 5.6; 32x16x7^2 -> 1 0.88 against 0.72)
        few_out = not direct and Cout < WINOGRAD_NARROW_MIN_CH <= C
        OH = xshape[2] + (pads[0] + pads[1] if pads else 2) - 2  # a 3x3 stride-1 conv's (pads unknown: 1 each side)
        if (KH, KW) == (3, 3) and math.prod(xshape) < 2**31 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 \
                and (wide or narrow or few_out or (C >= WINOGRAD_MIN_CH and Cout >= WINOGRAD_MIN_CH)) \
                and 16 * 4 * (-(-Cout // 16) * 16) * C <= workspace_budget_bytes() \
                and xshape[0] * -(-OH // 2) * -(-OW // 2) >= WINOGRAD_MIN_TILES:
            return "winograd"
        return "direct" if direct else "gemm"

    def _rows_fit(self, shape_class: str, M: int) -> dict:
        """gemm_cpu's tunables for a product of M rows: the stored tuning of its shape class where there is one;
        else the defaults, but with MR 12 (wide vectors) MR 8 where M (at most 128) is a multiple of 8 and not of
        12, so that no panel row is padding (MR 12 computes 72 rows for 64, 48 for 32). Measured (AVX-512 EPYC, same process, MR 12 x 4
        against the fit): the compact upscaler's 64-channel Winograd convs 577 -> 522 ms (8 x 8; 8 x 4: 540), the
        residual denoiser's training step (32 channels: conv GEMMs, weight gradients) 158 -> 147 ms."""
        params = self.tunables("gemm_cpu.cl", shape_class)
        if params["MR"] == 12 and not self._tune.get(f"gemm_cpu.cl:{shape_class}") and M <= 128 and M % 8 == 0 and M % 12:
            params = dict(params, MR=8, MSUB=8 if M >= 64 else 4)
        return params

    # ---- chunks of long convs (bigconv.chunked): batch and row-band views (joined by _cat) ----------
    # (a half input stays half: "half_conv" convs take it, and the bands of their results are joined as they are)
    def _band_batch(self, x: CLArray, a: int, b: int) -> CLArray:
        inner = math.prod(x.shape[1:])
        return self._view(x, (b - a,) + tuple(x.shape[1:]), x.offset + a * inner)

    def _band_rows(self, x: CLArray, a: int, b: int) -> CLArray:
        N, C, H, W = x.shape
        out = self._empty((N, C, b - a, W), self._dtype(x))
        self._copy_strided(x, x.offset + a * W, (N * C, b - a, W), (H * W, W, 1), out, 0, ((b - a) * W, W, 1))
        return out

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        w = self._f32(w)
        g = conv_transpose2d_geometry(x.shape, w.shape, stride, padding, output_padding, dilation, groups)
        N, C, H, W, _, CinG, CoutG, KH, KW, OH, OW, sh, sw, ph, _, pw, _, dh, dw, G = g
        out, bias, hb, bbuf = self._conv_out(g, bias)
        if out.size == 0:
            return out
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, ph, pw, dh, dw)
        # an Inf/NaN weight with stride > 1: only the direct kernel keeps it off the outputs its taps
        # skip (torch scatters products; the GEMM and phase kernels multiply it by zeros)
        finite = (g.sh == 1 and g.sw == 1) or self._all_finite(w)
        if self.family == "gpu" or not finite:
            return self._gpu_conv(x, w, bias, out, g, 1, direct=not finite)
        # 32 columns: its phases' taps test and divide per tap, which 16 columns would pay twice (AVX2, 1x16x256^2
        # 16 -> 8 4x4 s2, same process, medians of 7: DCO 4 x 32 13.5 ms, 4 x 16 17.0)
        tile = dict(self.default_tunables("conv_cpu.cl"), TN=32)
        ncob = -(-CoutG // tile["DCO"])
        J = -(-OW // sw)
        self._run("conv_t2d_direct", (-(-J // tile["TN"]), OH * sw, N * G * ncob), (1, 1, 1),
                  x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob,
                  params={**_direct_spec(KH, KW, sh, sw, dh, dw), **tile})
        return out

