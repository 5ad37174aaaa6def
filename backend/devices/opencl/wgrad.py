"""The OpenCL device's conv2d weight gradient (the fused kernel "conv_weight_grad" of
devices/interface.py, called by ops/convgrad.py): CPU-family packed GEMMs, depthwise and shifted
paths."""
from __future__ import annotations

import math  # noqa: F401

import numpy as np  # noqa: F401

from .memory import CLArray, CLQuant, _collapse, _contig_strides  # noqa: F401
from .params import F32  # noqa: F401

# ---- conv2d weight gradient (autograd; backend/ops/convgrad.py) ----------------------------------------
#: bytes of packed columns one step of the weight gradient packs and multiplies (kept in cache)
WGRAD_CHUNK_BYTES = 16 << 20


#: stride-1 convs with at least this many input channels per group take _wgrad_shifted, when the
#: im2col it saves has at least WGRAD_SHIFT_MIN_COLS values (below, its ~KH*KW+5 launches cost more)
WGRAD_SHIFT_MIN_CIN = 16
WGRAD_SHIFT_MIN_COLS = 4 << 20
#: bytes of packed operands one step of _wgrad_shifted holds
WGRAD_SHIFT_BYTES = 32 << 20
#: strided input gradients (one group) whose columns (Cin*KH*KW x N*OH*OW) hold at most this many floats
#: take _input_grad_col2im (beyond: the shared conv_transpose2d path)
COL2IM_MAX_COLS = 1 << 22
#: one-group convs with fewer output positions per image than this sum over the whole batch in each
#: product (_conv2d_weight_grad) instead of one product per image summed after
WGRAD_MULTI_MAX_P = 256


class CLWeightGrad:
    """conv2d's weight and input gradients in OpenCL kernels (a mixin of OpenCLBackend)."""

    def _conv2d_input_grad(self, gy, w, in_hw, stride, pads, dilation, groups):
        """CPU family, stride 1, ungrouped: gx = conv2d(gy, w with its taps flipped and its two channel
        axes swapped, padding d*(k-1) - p), on the forward conv's own paths (the padded direct kernel,
        Winograd, im2col + GEMM). Measured here 1.2-2.9x faster than the transposed direct kernel
        (conv_t2d_direct) the shared path takes, e.g. 8.0 against 16.6 ms on 16x32x64x64. The flip is
        one strided copy of the weight. Strided: ``_input_grad_col2im``. None elsewhere (grouped, the GPU
        family: ops/convgrad.py's conv_transpose2d path)."""
        from ...ops import bigconv
        if self.family != "cpu" or groups != 1 or isinstance(w, CLQuant):
            return None
        if tuple(stride) != (1, 1):
            return self._input_grad_col2im(gy, w, in_hw, stride, pads, dilation)
        Cout, Cin, KH, KW = w.shape
        (dh, dw), (t, b, l, r) = dilation, pads
        q = (dh * (KH - 1) - t, dh * (KH - 1) - b, dw * (KW - 1) - l, dw * (KW - 1) - r)
        if min(q) < 0 or gy.shape[1] != Cout:
            return None  # (a padding past the kernel's reach: the shared path crops)
        w = self._contiguous(w)
        khw = KH * KW
        wf = self._empty((Cin, Cout, KH, KW), self._dtype(w))
        self._copy_strided(w, w.offset + khw - 1, (Cin, Cout, KH, KW), (khw, Cin * khw, -KW, -1),
                           wf, 0, (Cout * khw, khw, KW, 1))
        gx = bigconv.conv2d(self, gy, wf, None, (1, 1), q, (dh, dw), 1)
        return gx if tuple(gx.shape[2:]) == tuple(in_hw) else None

    def _input_grad_col2im(self, gy, w, in_hw, stride, pads, dilation):
        """Strided, one group, columns of at most COL2IM_MAX_COLS floats: cols = w^T . gy (one GEMM over
        every image's positions: gy with its two leading axes swapped) then col2im_gather, each input
        summing the columns of the taps that reach it. The digits CNN's stride-2 input gradient: 0.8 ms
        in conv_t2d_direct (whose phases leave most lanes idle at 4 output columns), ~0.4 ms so; and
        no finiteness read-back (the shared path checks the weight for Inf/NaN first)."""
        N, Cout, OH, OW = gy.shape
        _, Cin, KH, KW = w.shape
        H, W = in_hw
        ckk, cols_n = Cin * KH * KW, N * OH * OW
        if ckk * cols_n > COL2IM_MAX_COLS or self._dtype(gy) != "float32" or N * Cin * H * W == 0:
            return None
        (sh, sw), (dh, dw), (t, _, l, _) = stride, dilation, pads
        w = self._f32(self._contiguous(w))
        gyt = self._permute(gy, (1, 0, 2, 3))  # (Cout, N, OH, OW)
        cols = self._gemm(ckk, cols_n, Cout, 1, w, w.offset, 1, ckk, 0, gyt, gyt.offset, cols_n, 1, 0,
                          out_shape=(ckk, cols_n))
        del gyt
        gx = self._empty((N, Cin, H, W))
        n = N * Cin  # (a work item takes planes (nn, c): 8 items a compute unit)
        if self.is_cpu_device:
            chunk = -(-n // (8 * self.compute_units))
            g, lsz = (-(-n // chunk),), (1,)
        else:
            g, lsz, chunk = self._flat_geometry(n)
        self._run("col2im_gather", g, lsz, cols.buffer, cols.offset, gx.buffer, gx.offset, Cin, H, W, KH, KW,
                  OH, OW, sh, sw, t, l, dh, dw, n, chunk)
        return gx

    def _conv2d_weight_grad(self, x, gy, wshape, stride, pads, dilation, groups):
        """CPU family: gW = sum over images of gy[n] (CoutG x OH*OW) . cols[n] (OH*OW x CinG*KH*KW) per
        group, as gemm_cpu products: gy is packed in place by pack_a, kernels/conv_grad_cpu.cl packs the
        columns from x in place, in steps of about WGRAD_CHUNK_BYTES (whole images, or position ranges
        of one) so the packed panels are still in cache when gemm_cpu reads them. Every step writes its
        own (G, CoutG, Kw) partial product into one buffer, summed by one reduction at the end.
        None (the caller's generic path) for the GPU family."""
        from .params import PACK_K
        if self.family != "cpu":
            return None
        N, C, H, W = x.shape
        Cout, CinG, KH, KW = wshape
        G = groups
        CoutG = Cout // G
        OH, OW = gy.shape[2:]
        P, Kw = OH * OW, CinG * KH * KW
        if N == 0 or P == 0:
            return None
        (sh, sw), (dh, dw), (t, _, l, _) = stride, dilation, pads
        if (sh, sw) == (1, 1) and CinG == 1 and CoutG == 1:
            return self._wgrad_depthwise(x, gy, wshape, dilation, pads)
        if self._wgrad_wino_takes(x, gy, wshape, stride, dilation, groups):
            gw = self._wgrad_winograd(x, gy, wshape, pads)
            if gw is not None:
                return gw
        if (sh, sw) == (1, 1) and CinG >= WGRAD_SHIFT_MIN_CIN and N * P * Kw >= WGRAD_SHIFT_MIN_COLS:
            gw = self._wgrad_shifted(x, gy, wshape, dilation, pads, groups)
            if gw is not None:
                return gw
        # one group, small images (P < WGRAD_MULTI_MAX_P): the positions of every image in one row, gy with its
        # two leading axes swapped (Cout, N*P), so each product sums over the batch (per image, the digits
        # CNN's stride-2 conv had products of K = 16 and a 64-way partial sum after them)
        multi = G == 1 and N > 1 and P < WGRAD_MULTI_MAX_P
        rowlen = N * P if multi else P
        src = self._permute(gy, (1, 0, 2, 3)) if multi else gy
        params = self._rows_fit(self._shape_class(CoutG, Kw, min(rowlen, 4096)), CoutG)
        mr, msub = params["MR"], params["MSUB"]
        mt, ntl = -(-CoutG // mr), -(-Kw // 32)
        per_pos = 4 * G * (ntl * 32 + mt * mr)  # packed bytes per output position of one image
        npos = min(rowlen, max(PACK_K, WGRAD_CHUNK_BYTES // per_pos // PACK_K * PACK_K))
        nimg = max(1, min(N, WGRAD_CHUNK_BYTES // (per_pos * npos))) if npos == P and not multi else 1
        steps = [(n0, min(N, n0 + nimg) - n0, p0, min(npos, rowlen - p0)) for n0 in range(0, 1 if multi else N, nimg)
                 for p0 in range(0, rowlen, npos)]
        # partial products: one (nb*G, CoutG, Kw) block per step, nb images each (summed at the end)
        slots = sum(nb for _, nb, _, _ in steps)
        part = self._empty((slots, Cout * Kw))
        cpu_l = (1, 1, 1)
        slot = 0
        for n0, nb, p0, npp in steps:
            bb = nb * G
            kb = -(-npp // PACK_K)
            Ap = self._empty((bb, mt * mr * npp))
            self._run("pack_a", (kb, mt, bb), cpu_l, CoutG, npp, src.buffer, src.offset + n0 * Cout * P + p0,
                      rowlen, 1, CoutG * rowlen, Ap.buffer, Ap.buffer, 0, params=params)
            Bp = self._empty((bb, ntl * 32 * npp))
            self._run("wgrad_pack_b", (kb, ntl, bb), cpu_l, x.buffer, x.offset + n0 * C * H * W, Bp.buffer,
                      H, W, CinG, KH, KW, OW, sh, sw, t, l, dh, dw, p0, npp, OH, P if multi else 0)
            self._run("gemm_cpu", (-(-CoutG // (mr * msub)), ntl, bb), cpu_l,
                      CoutG, Kw, npp, Ap.buffer, mt * mr * npp, Bp.buffer, ntl * 32 * npp,
                      part.buffer, slot * Cout * Kw, Kw, CoutG * Kw, part.buffer, 0, 0, 1 << 30, 0, 0, params=params)
            slot += nb
            del Ap, Bp
        gw = self._reduce("sum", part, (0,), False) if slots > 1 else part
        return self._reshape(gw, (Cout, CinG, KH, KW))

    def _wgrad_depthwise(self, x, gy, wshape, dilation, pads):
        """Depthwise stride-1 weight gradient (a GEMM would be 1 x 9 per image and channel): x and gy
        channel-major and zero-padded to the (Hq, Wq) the taps read, one flat row of N*Hq*Wq positions
        per channel; tap (kh, kw) is then gy * (x shifted by kh*dh*Wq + kw*dw positions), a view of one
        contiguous span of the same buffer (what runs past a row meets gy's zeros), summed per channel."""
        N, C, H, W = x.shape
        _, _, KH, KW = wshape
        OH, OW = gy.shape[2:]
        dh, dw = dilation
        t, _, l, _ = pads
        Hq, Wq = (KH - 1) * dh + OH, (KW - 1) * dw + OW
        Q = N * Hq * Wq
        slack = (KH - 1) * dh * Wq + (KW - 1) * dw
        xc = self._permute(x, (1, 0, 2, 3))
        xq = self._pad_crop(xc, (t, Hq - H - t, l, Wq - W - l), "zeros")  # negative: rows never read
        del xc
        xf = self._reshape(xq, (C * Q,))
        if slack:  # the last channel's shifted views run past its row
            z = self._empty((slack,))
            self._fill(z, 0.0)
            xf = self._cat([xf, z], 0)
        gq = self._pad(self._permute(gy, (1, 0, 2, 3)), (0, Hq - OH, 0, Wq - OW), "zeros")
        gf = self._reshape(gq, (C, Q))
        cols = []
        for kh in range(KH):
            for kw in range(KW):
                d = kh * dh * Wq + kw * dw
                view = CLArray((C, Q), xf.block, xf.offset + d)
                cols.append(self._reduce("sum", self._binary("mul", gf, view), (1,), True))
        gw = self._cat(cols, 1)  # (C, KH*KW)
        return self._reshape(gw, (C, 1, KH, KW))


    def _wgrad_shifted(self, x, gy, wshape, dilation, pads, groups):
        """Stride-1 weight gradient without an im2col: x is packed once (kernels/conv_grad_cpu.cl's
        wgrad_pack_x: padded positions q = row * Wq + col, one channel per column), gy once with its
        rows widened to Wq by zeros; tap (kh, kw) is then gy . (x panels shifted by kh*dh*Wq + kw*dw
        positions), one gemm_cpu launch per tap and 32-channel tile reading a sub-buffer of the same
        packed panels. None where a sub-buffer's origin would break the device's alignment."""
        from .params import PACK_K
        N, C, H, W = x.shape
        Cout, CinG, KH, KW = wshape
        G = groups
        CoutG = Cout // G
        OH, OW = gy.shape[2:]
        dh, dw = dilation
        t, _, l, _ = pads
        Hq, Wq = (KH - 1) * dh + OH, (KW - 1) * dw + OW
        Kg = OH * Wq
        Q = Hq * Wq + (KW - 1) * dw
        align = max(1, int(self.dev.mem_base_addr_align) // 8)
        if (4 * 32) % align:
            return None
        params = self._rows_fit(self._shape_class(CoutG, min(CinG, 32), min(Kg, 4096)), CoutG)
        mr, msub = params["MR"], params["MSUB"]
        mt, ntl = -(-CoutG // mr), -(-CinG // 32)
        per_img = 4 * G * (ntl * Q * 32 + mt * mr * Kg)
        nimg = max(1, min(N, WGRAD_SHIFT_BYTES // max(1, per_img)))
        gyq = self._pad(gy, (0, 0, 0, Wq - OW), "zeros") if Wq != OW else gy  # (N, Cout, OH, Wq)
        taps = KH * KW
        out_per = taps * CoutG * CinG  # one batch's (taps, CoutG, CinG) block
        part = self._empty((N * G, out_per))
        cpu_l = (1, 1, 1)
        for n0 in range(0, N, nimg):
            nb = min(N, n0 + nimg) - n0
            bb = nb * G
            Ap = self._empty((bb, mt * mr * Kg))
            self._run("pack_a", (-(-Kg // PACK_K), mt, bb), cpu_l, CoutG, Kg, gyq.buffer,
                      gyq.offset + n0 * Cout * Kg, Kg, 1, CoutG * Kg, Ap.buffer, Ap.buffer, 0, params=params)
            Bp = self._empty((bb, ntl * Q * 32))
            self._run("wgrad_pack_x", (-(-Q // PACK_K), ntl, bb), cpu_l, x.buffer, x.offset + n0 * C * H * W,
                      Bp.buffer, H, W, CinG, Hq, Wq, t, l, Q)
            total = bb * ntl * Q * 32
            for kh in range(KH):
                for kw in range(KW):
                    delta = kh * dh * Wq + kw * dw
                    for nt in range(ntl):
                        origin = (nt * Q + delta) * 32
                        sub = Bp.buffer.get_sub_region(4 * (Bp.offset + origin), 4 * (total - origin))
                        self._run("gemm_cpu", (-(-CoutG // (mr * msub)), 1, bb), cpu_l,
                                  CoutG, min(32, CinG - nt * 32), Kg, Ap.buffer, mt * mr * Kg, sub, ntl * Q * 32,
                                  part.buffer, (n0 * G) * out_per + (kh * KW + kw) * CoutG * CinG + nt * 32,
                                  CinG, out_per, part.buffer, 0, 0, 1 << 30, 0, 0, params=params)
            del Ap, Bp
        gw = self._reduce("sum", self._reshape(part, (N, G * out_per)), (0,), False) if N > 1 else part
        gw = self._permute(self._reshape(gw, (G, taps, CoutG, CinG)), (0, 2, 3, 1))
        return self._reshape(gw, (Cout, CinG, KH, KW))
