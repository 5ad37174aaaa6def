"""The OpenCL GPU kernel family's GEMM and convolutions: the CUDA backend's kernels
(kernels/conv_gemm_cuda.cu's ad_conv_gemm and ad_splitk_reduce, misc_cuda.cu's direct conv) built
as OpenCL C, with tiles chosen within the device's group size and local memory (a mixin of
OpenCLBackend)."""
from __future__ import annotations

from ...ops.quant import FORMATS
from ..runtime.conv_gemm import (_O_L, _O_M, _O_S, _mode_macros, conv_args, kchunk_for, operand_layout,
                                 plan as plan_tiles, tile_shared_bytes, tile_threads, vec_fits)
from .memory import CLArray, CLQuant, _contig_strides

#: GPU family: the CUDA kernel's tiles (measured on an H100), GEMMs and convolutions
GEMM_TILES, CONV_TILES = [_O_L, _O_S], [_O_M, _O_S]
#: GPU family, for devices whose group size or local memory the tiles above exceed (256 work items,
#: 17-26 KiB double-buffered): 64x32 tiles of 128 work items (13 or 6.5 KiB), 32x32 tiles of 64 (4.5 KiB)
SMALL_GPU_TILES = [dict(TILE_M=64, TILE_N=32, TILE_K=16, WPT_M=4, WPT_N=4),
                   dict(TILE_M=64, TILE_N=32, TILE_K=8, WPT_M=4, WPT_N=4),
                   dict(TILE_M=32, TILE_N=32, TILE_K=8, WPT_M=4, WPT_N=4)]
#: GPU family: convs with at most this many output channels per group use the direct kernel
GPU_DIRECT_MAX_COUT_G = 4


class CLGpuLinalg:
    """ad_conv_gemm / ad_direct_conv launches of the GPU family (a mixin of OpenCLBackend)."""

    # ---- GPU family: the CUDA backend's kernels built as OpenCL C --------------------------------
    def _at0(self, x: CLArray, off: int, span: int) -> CLArray:
        """x's elements [off, off + span) at offset 0 of a buffer (the GPU-family kernels take no
        offsets): x itself when off is 0, else a copy of that span."""
        if off == 0:
            return x
        out = self._empty((span,))
        self._copy_strided(x, off, (span,), (1,), out, 0, (1,))
        return out

    def _gpu_quant_ok(self, X, s_row, s_col, rows, cols):
        """GPU family: ``X`` as ad_conv_gemm reads it: a quantized weight as it is (decoded in the
        kernel's tile loads) when one of its two inner strides is 1, as any operand must be (else
        dequantized: it cannot be copied into another layout packed); a half one as float32."""
        if isinstance(X, CLQuant) and operand_layout(rows, cols, s_row, s_col)[0]:
            return X
        return self._f32(X)

    def _gpu_operand(self, X: CLArray, off, s_row, s_col, s_batch, batches, rows, cols):
        """(array at offset 0, row, column and batch strides, transposed flag) for ad_conv_gemm, which
        needs one of the two inner strides to be 1 (else the operand is copied contiguous). A quantized
        operand (offset 0, a usable layout: ``_gpu_quant_ok``) is passed as it is."""
        if isinstance(X, CLQuant):
            _, s_row, s_col = operand_layout(rows, cols, s_row, s_col)
            return X, s_row, s_col, s_batch, int(s_col != 1)
        nb = batches if s_batch else 1
        usable, s_row2, s_col2 = operand_layout(rows, cols, s_row, s_col)
        if not usable:
            tmp = self._empty((nb, rows, cols))
            self._copy_strided(X, off, (nb, rows, cols), (s_batch, s_row, s_col), tmp, 0, _contig_strides((nb, rows, cols)))
            X, off, s_batch = tmp, 0, rows * cols if nb > 1 else 0
            _, s_row2, s_col2 = operand_layout(rows, cols, cols, 1)
        s_row, s_col = s_row2, s_col2
        span = (nb - 1) * s_batch + (rows - 1) * s_row + (cols - 1) * s_col + 1
        return self._at0(X, off, span), s_row, s_col, s_batch, int(s_col != 1)

    def _conv_gemm(self, op, mode, vec_a, vec_b, M, N, K, Z, a, b, out, c_layout, bias, conv, layout=(1, 1, 1)):
        """Launch kernels/conv_gemm_cuda.cu's ad_conv_gemm (a = (A, sam, sak, a_bs), b likewise),
        with the tile and K split the shared plan picks; a split writes a workspace that
        ad_splitk_reduce sums in order into ``out`` (+ bias). A or B may be a CLQuant (built with
        WQA / WQB: decoded in the tile loads, its scales passed last)."""
        cands = self._fitting_tiles(GEMM_TILES if op == "gemm" else CONV_TILES)
        cfg, ks = plan_tiles(cands, M, N, Z, K, self.compute_units)
        qa, qb = isinstance(a[0], CLQuant), isinstance(b[0], CLQuant)
        mode = dict(mode, VEC_A=int(bool(vec_a) and vec_fits(cfg, "A") and not qa),
                    VEC_B=int(bool(vec_b) and vec_fits(cfg, "B") and not qb),
                    WQA=FORMATS[a[0].fmt].code if qa else 0, WQB=FORMATS[b[0].fmt].code if qb else 0)
        macros = {**cfg, **_mode_macros(mode)}
        ks, kchunk = kchunk_for(K, ks, cfg)
        ws = out if ks == 1 else self._empty((Z * ks * M * N,))
        (A, sam, sak, a_bs), (B, sbk, sbn, b_bs), (ldc, c_bs) = a, b, c_layout
        lsz = (cfg["TILE_N"] // cfg["WPT_N"], cfg["TILE_M"] // cfg["WPT_M"], 1)
        gsz = (-(-N // cfg["TILE_N"]) * lsz[0], -(-M // cfg["TILE_M"]) * lsz[1], Z * ks)
        bbuf, hb = (bias.buffer, 1) if bias is not None else (out.buffer, 0)
        self._run("ad_conv_gemm", gsz, lsz, M, N, K, A.buffer, sam, sak, a_bs, B.buffer, sbk, sbn, b_bs,
                  ws.buffer, ldc, c_bs, bbuf, hb, *conv, ks, kchunk, *self._wq(A), *self._wq(B), params=macros)
        if ks > 1:
            n, wg = Z * M * N, self._group()
            self._run("ad_splitk_reduce", (min(-(-n // wg), 8 * self.compute_units) * wg,), (wg,),
                      ws.buffer, out.buffer, bbuf, hb, ks, Z, M, N, ldc, c_bs, *layout, params=macros)
        return out

    def _fitting_tiles(self, cands: list) -> list:
        """The tiles of ``cands`` whose group (threads) and double-buffered shared tiles fit the device
        (``max_group``, ``local_bytes``); where none does, the first of SMALL_GPU_TILES that fits."""
        def fits(c):
            return tile_threads(c) <= self.max_group and tile_shared_bytes(c) <= self.local_bytes
        ok = [c for c in cands if fits(c)]
        if ok:
            return ok
        small = [c for c in SMALL_GPU_TILES if fits(c)]
        if not small:
            raise RuntimeError(f"OpenCL device {self.device}: a work group of {self.max_group} items and "
                               f"{self.local_bytes} bytes of local memory fit no GEMM tile (the smallest "
                               "needs 64 items and 4.5 KiB)")
        return small[:1]

    def _gpu_conv(self, x, w, bias, out, g, transposed: int, direct: bool = False):
        """conv2d / conv_transpose2d with the CUDA backend's kernels: misc_cuda.cu's direct kernel
        for few output channels per group (or when ``direct``), else ad_conv_gemm's implicit GEMM
        (batch folded into N)."""
        x, w = self._at0(x, x.offset, x.size), self._at0(w, w.offset, w.size)
        if direct or g.CoutG <= GPU_DIRECT_MAX_COUT_G:
            # few output channels per group: the weight is tiny (at most 4 rows a group), so the direct
            # kernel reads a quantized one dequantized (float32, for this op only)
            w = self._f32(w)
            n, wg = out.size, self._group()
            self._run("ad_direct_conv", (min(-(-n // wg), 8 * self.compute_units) * wg,), (wg,),
                      x.buffer, w.buffer, bias.buffer if bias is not None else out.buffer, int(bias is not None),
                      out.buffer, g.N, g.C, g.H, g.W, g.Cout, g.CinG, g.CoutG, g.KH, g.KW, g.OH, g.OW,
                      g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, transposed, params={"BLOCK": wg})
            return out
        M, Ntot, K = g.CoutG, g.N * g.OH * g.OW, g.CinG * g.KH * g.KW
        if transposed:  # weights re-laid out as (G, CoutG, CinG*KH*KW)
            w = self._permute(self._reshape(w, (g.G, g.CinG, g.CoutG, g.KH * g.KW)), (0, 2, 1, 3))
        return self._conv_gemm("conv", dict(IS_GEMM=0, CONV_TRANSPOSED=transposed), K % 4 == 0 and not isinstance(w, CLQuant), False,
                               M, Ntot, K, g.G, (w, K, 1, M * K), (x, 0, 0, 0), out, (0, 0), bias, conv_args(g),
                               layout=(0, g.OH * g.OW, g.Cout))
