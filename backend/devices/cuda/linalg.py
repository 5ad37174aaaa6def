"""The CUDA backend's GEMM and convolutions, as a mixin of CudaBackend: the CUDA kernel
(kernels/conv_gemm_cuda.cu) with tile and K split chosen per problem, and the direct kernel for
few output channels per group."""
from __future__ import annotations

import math

from ...ops.plans import conv2d_geometry, conv_transpose2d_geometry
from ...ops.quant import FORMATS, DeviceQuant
from ..runtime import pack_args
from ..runtime.conv_gemm import conv_args, kchunk_for, plan as plan_tiles, quant_mode
from .tiles import (DIRECT_MAX_COUT_G, DIRECT_MAX_TAPS, DIRECT_MIN_OUTPUTS_PER_SM, GRID_YZ_MAX, MAX_KSPLIT, OWN_GEMM, TILES, _cdiv, _mode_macros, _size_class,
                    _strided, _vec_ok, mode_fits, vec_fits)


class CudaLinalg:
    """GEMM / conv ops of CudaBackend (uses its cp, _function, _empty, _null, _launch_1d, tables)."""

    # ---- tile choice ------------------------------------------------------------------------
    def _family(self, op: str) -> str:
        """tf32 (when allowed and the GPU has TF32 tensor cores), else the FP32 kernel."""
        return "tf32" if self.tf32 and self._tiles.get("tf32") else "own"

    def _half_pair(self, a, b) -> int:
        """HALF_IO of two operands both float16 (1) or both bfloat16 (2) on a GPU with half tensor-core
        tiles; 0 otherwise (then any half operand is computed as float32: ``_float_pair``)."""
        da, db = self._dtype(a), self._dtype(b)
        if da != db or da == "float32" or not self._tiles.get("half"):
            return 0
        return 1 if da == "float16" else 2

    def _float_pair(self, a, b):
        return self._cast(a, "float32"), self._cast(b, "float32")

    def _cands(self, family: str, op: str, M: int, N: int, Z: int) -> list:
        """Candidate tiles of the own kernel for an op: a tune() winner alone, else the table's."""
        tuned = self._tuned.get(f"{family}:{op}:{_size_class(M, N, Z)}")
        key = "own_conv" if family == "own" and op != "gemm" else family
        cands = self._tiles.get(key) or TILES["default"][key]
        return [tuned] if tuned and tuned in cands else list(cands)

    def _ksplit(self, cfg: dict, M: int, N: int, Z: int, K: int) -> int:
        """K slices for one tile (``_plan`` with a single candidate)."""
        return self._plan([cfg], M, N, Z, K)[1]

    def _plan(self, cands: list, M: int, N: int, Z: int, K: int) -> tuple[dict, int]:
        """(tile, K slices) for the own kernel: the pair with the least modelled time, where time
        = waves of groups (groups per SM from the tile's registers) x one group's FMAs / the
        tile's measured efficiency, plus the split's reduction pass. Slices are at least
        MIN_KSLICE long. ANYDEVICE_CUDA_KSPLIT=n forces the split."""
        pkey = (tuple(map(id, cands)), M, N, Z, K)
        hit = self._plan_cache.get(pkey)
        if hit is not None:
            return hit
        best = plan_tiles(cands, M, N, Z, K, self.sm_count, self._forced_ksplit)
        if len(self._plan_cache) > 4096:
            self._plan_cache.clear()
        self._plan_cache[pkey] = best
        return best

    def _own_launch(self, macros: dict, cfg: dict, M: int, N: int, K: int, Z: int, args_a: tuple,
                    args_b: tuple, c_args: tuple, bias, conv: tuple, out, gemm_out: tuple, ksplit: int,
                    record=None, wq=None):
        """Launch ad_conv_gemm over Z problems (grid z chunks), split over K when ksplit > 1 (then
        into a workspace, and ad_splitk_reduce writes ``out``). ``record``: a key under which a
        one-chunk launch is kept for ``_replay`` (the next call of the same signature skips the
        planning, the build lookup and the argument packing). ``wq``: the last four arguments
        (scales and row lengths of a quantized A and B, macros WQA / WQB) when one is quantized; such
        a launch is not recorded and must fit one z chunk (its operand is indexed from the buffer's start)."""
        cp = self.cp
        fn = self._function(OWN_GEMM[0], OWN_GEMM[1], macros)
        block = (cfg["TILE_N"] // cfg["WPT_N"], cfg["TILE_M"] // cfg["WPT_M"], 1)
        ksplit, kchunk = kchunk_for(K, ksplit, cfg)
        per = max(1, GRID_YZ_MAX // ksplit)
        if wq is not None:
            record = None
            assert Z <= per, "a quantized operand is launched in one z chunk"
        if record is not None and Z <= per:
            a, sam, sak, a_bs = args_a(0)
            b, sbk, sbn, b_bs = args_b(0)
            c, ldc, c_bs, bs = c_args(0)
            tpl = pack_args(OWN_GEMM[1], (M, N, K, None, sam, sak, a_bs, None, sbk, sbn, b_bs, None, ldc,
                                          c_bs, None, bias is not None, *conv, ksplit, kchunk, *self._no_wq()))
            grid = (_cdiv(N, cfg["TILE_N"]), _cdiv(M, cfg["TILE_M"]), Z * ksplit)
            red = red_tpl = None
            if ksplit > 1:
                red = self._function(OWN_GEMM[0], "ad_splitk_reduce", macros)
                is_gemm, OHW, Cout = gemm_out
                red_tpl = pack_args("ad_splitk_reduce", (None, None, None, bias is not None, ksplit, Z, M, N,
                                                         ldc, c_bs, is_gemm, OHW, Cout))
            if len(self._launch_cache) > 4096:
                self._launch_cache.clear()
            self._launch_cache[record] = (fn, grid, block, tuple(tpl), Z * ksplit * M * N if ksplit > 1 else 0,
                                          red, red_tpl, Z * M * N)
            return self._replay(self._launch_cache[record], a, b, c, bs, out)
        for z0 in range(0, Z, per):
            z1 = min(Z, z0 + per)
            a, sam, sak, a_bs = args_a(z0)
            b, sbk, sbn, b_bs = args_b(z0)
            c, ldc, c_bs, bs = c_args(z0)
            ws = c if ksplit == 1 else cp.empty((z1 - z0) * ksplit * M * N, dtype=cp.float32)
            grid = (_cdiv(N, cfg["TILE_N"]), _cdiv(M, cfg["TILE_M"]), (z1 - z0) * ksplit)
            # the scalar arguments as NumPy scalars, built once per geometry (per-call host cost)
            key = (M, N, K, sam, sak, a_bs, sbk, sbn, b_bs, ldc, c_bs, bias is not None, conv, ksplit, kchunk)
            tpl = self._arg_cache.get(key)
            if tpl is None:
                tpl = list(pack_args(OWN_GEMM[1], (M, N, K, None, sam, sak, a_bs, None, sbk, sbn, b_bs, None, ldc,
                                                   c_bs, None, bias is not None, *conv, ksplit, kchunk, *self._no_wq())))
                if len(self._arg_cache) > 4096:
                    self._arg_cache.clear()
                self._arg_cache[key] = tpl
            args = list(tpl)
            args[3], args[7], args[11], args[14] = a, b, ws, bs
            if wq is not None:
                args[-4:] = pack_args(OWN_GEMM[1], (0,) * 33 + tuple(wq))[-4:]
            fn(grid, block, tuple(args))
            if ksplit > 1:
                red = self._function(OWN_GEMM[0], "ad_splitk_reduce", macros)
                is_gemm, OHW, Cout = gemm_out
                self._launch_1d(red, (z1 - z0) * M * N,
                                pack_args("ad_splitk_reduce", (ws, c, bs, bias is not None, ksplit, z1 - z0, M, N,
                                                               ldc, c_bs, is_gemm, OHW, Cout)))
        return out

    def _no_wq(self) -> tuple:
        """ad_conv_gemm's last four arguments when no operand is quantized."""
        return (self._null(), 0, self._null(), 0)

    def _replay(self, rec, a, b, c, bs, out):
        """One recorded launch (``_own_launch(record=...)``) on new operands: A, B, C (or the split's
        workspace) and the bias pointer are the only arguments that change between calls."""
        fn, grid, block, tpl, ws_n, red, red_tpl, total = rec
        args = list(tpl)
        args[3], args[7], args[14] = a, b, bs
        if not ws_n:
            args[11] = c
            fn(grid, block, tuple(args))
            return out
        ws = self.cp.empty(ws_n, dtype=self.cp.float32)
        args[11] = ws
        fn(grid, block, tuple(args))
        rargs = list(red_tpl)
        rargs[0], rargs[1], rargs[2] = ws, c, bs
        self._launch_1d(red, total, tuple(rargs))
        return out

    # ---- matmul -----------------------------------------------------------------------------
    def _bmm(self, a, b):
        cp = self.cp
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        if B * M * N == 0 or K == 0:
            return cp.zeros((B, M, N), dtype=cp.float32)
        if not self._half_pair(a, b):
            a, b = self._float_pair(a, b)
        if Bb == 1 and Ba > 1 and a.flags.c_contiguous:  # one GEMM with the batch folded into M
            y = self._gemm(a.reshape(1, Ba * M, K), b)
            return y.reshape(B, M, N)
        return self._gemm(a, b)

    def _gemm(self, a, b, cfg=None, family=None, ksplit=None):
        """(Ba, M, K) @ (Bb, K, N), Ba/Bb in {1, B}, any strides (copied only when neither layout)."""
        cp = self.cp
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        half = self._half_pair(a, b)
        if not half:
            a, b = self._float_pair(a, b)
        family = family or ("half" if half else self._family("gemm"))
        record = None
        if cfg is None and ksplit is None:
            record = ("gemm", family, half, a.shape, a.strides, a.data.ptr & 15, b.shape, b.strides, b.data.ptr & 15)
            rec = self._launch_cache.get(record)
            if rec is not None:
                c = self._empty((B, M, N))
                return self._replay(rec, a, b, c, self._null(), c)
        a_in, b_in = a, b
        a, sa = _strided(cp, a)
        b, sb = _strided(cp, b)
        a_bs = sa[0] if Ba > 1 else 0
        b_bs = sb[0] if Bb > 1 else 0
        c = self._empty((B, M, N))
        if cfg is None:
            cfg, ks = self._plan(self._cands(family, "gemm", M, N, B), M, N, B, K)
            ksplit = ksplit or ks
        ta, tb = int(sa[2] != 1), int(sb[2] != 1)
        vec_a = int(not half and not ta and vec_fits(cfg, "A") and _vec_ok(a, sa[1], a_bs, K))
        vec_b = int(not half and not tb and vec_fits(cfg, "B") and _vec_ok(b, sb[1], b_bs, N))
        macros = {**cfg, **_mode_macros(dict(IS_GEMM=1, TRANS_A=ta, TRANS_B=tb, VEC_A=vec_a, VEC_B=vec_b))}
        if half:
            macros["HALF_IO"] = half
        return self._own_launch(macros, cfg, M, N, K, B,
                                lambda z: (a[z:] if Ba > 1 else a, sa[1], sa[2], a_bs),
                                lambda z: (b[z:] if Bb > 1 else b, sb[1], sb[2], b_bs),
                                lambda z: (c[z:], N, M * N, self._null()),
                                None, (0,) * 15, c, (1, 1, 1), ksplit or self._ksplit(cfg, M, N, B, K),
                                record=record if (a is a_in and b is b_in) else None)  # no copies made

    def _linear(self, x, w, b):
        """A quantized 2-D weight W (N, K) is ad_conv_gemm's B = W^T read packed (WQB: sbk = 1,
        sbn = K, decoded in the tile loads); other weights the contract's linear."""
        if not isinstance(w, DeviceQuant):
            return super()._linear(x, w, b)
        if len(w.shape) != 2:
            return super()._linear(x, self._dequant(w), b)
        sx = tuple(x.shape)
        rows, K, N = math.prod(sx[:-1]), sx[-1], w.shape[0]
        self._check_size("linear", (rows, N))
        c = self._empty((1, rows, N))
        if rows and N:
            if K == 0:
                c[...] = 0
            else:
                a = self._contig(x).reshape(1, rows, K)
                family, code = self._family("gemm"), FORMATS[w.fmt].code
                cands = self._cands(family, "gemm", rows, N, 1)
                fits = [c for c in cands if mode_fits(c, quant_mode(dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1), code))]
                cfg, ks = self._plan(fits or TILES["default"]["own"], rows, N, 1, K)
                vec_a = int(vec_fits(cfg, "A") and _vec_ok(a, K, 0, K))
                mode = quant_mode(dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1, VEC_A=vec_a), code)
                self._own_launch({**cfg, **_mode_macros(mode)}, cfg, rows, N, K, 1,
                                 lambda z: (a, K, 1, 0), lambda z: (w.data, 1, K, 0),
                                 lambda z: (c, N, rows * N, self._null()), None, (0,) * 15, c, (1, 1, 1), ks,
                                 wq=(self._null(), 0, *self._wq(w)))
        y = c.reshape(sx[:-1] + (N,))
        return y if b is None else self._binary("add", y, b)

    # ---- convolution ------------------------------------------------------------------------
    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        key = (x.shape, w.shape, stride, pads, dilation, groups)
        g = self._geo_cache.get(key)
        if g is None:
            if len(self._geo_cache) > 4096:
                self._geo_cache.clear()
            g = self._geo_cache[key] = conv2d_geometry(x.shape, w.shape, stride, pads, dilation, groups)
        return self._conv(x, w, bias, g, 0)

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        g = conv_transpose2d_geometry(x.shape, w.shape, stride, padding, output_padding, dilation, groups)
        return self._conv(x, w, bias, g, 1)

    def _conv(self, x, w, bias, g, transposed: int):
        """conv2d or conv_transpose2d (transposed=1) of a given geometry: the direct kernel for few
        output channels per group, else the implicit-GEMM kernel. A quantized conv2d weight is read
        packed by the implicit GEMM (WQA); the direct kernel (at most DIRECT_MAX_COUT_G rows a group:
        a tiny weight), a transposed conv and a grid too tall for one launch get it dequantized
        (float32, for this op only)."""
        if isinstance(w, DeviceQuant):
            if transposed or g.CoutG <= DIRECT_MAX_COUT_G or g.G * MAX_KSPLIT > GRID_YZ_MAX:
                w = self._dequant(w)
            else:
                x = self._contig(x)
                bias = None if bias is None else self._contig(bias)
                y = self._empty((g.N, g.Cout, g.OH, g.OW))
                if y.size == 0:
                    return y
                return self._own_conv(x, w, bias, y, g, transposed=0, family=self._family("conv2d"))
        direct = g.CoutG <= DIRECT_MAX_COUT_G and (transposed or self._direct_pays(g))
        # two half operands of one dtype: the tensor cores, the result in their dtype ("half_conv")
        half = 0 if transposed or direct else self._half_pair(x, w)
        if half:
            x, w = self.cp.ascontiguousarray(x), self.cp.ascontiguousarray(w)
        else:
            x, w = self._contig(x), self._contig(w)  # (float32: a half operand is converted)
        bias = None if bias is None else self._contig(bias)
        y = self._empty((g.N, g.Cout, g.OH, g.OW), self._dtype(x) if half else "float32")
        if y.size == 0:
            return y
        if not transposed:  # a conv of this signature ran before: replay its launch
            rec = self._launch_cache.get(("conv", g, self.tf32, half, bias is None, w.data.ptr & 15))
            if rec is not None:
                return self._replay(rec, w, x, y, self._null() if bias is None else bias, y)
        # a transposed conv with an Inf/NaN weight and stride > 1: the direct kernel, which keeps it
        # off the outputs its taps skip (torch scatters products; the GEMM multiplies it by zeros)
        nonfinite = transposed and (g.sh > 1 or g.sw > 1) and not self._all_finite(w)
        if direct or nonfinite:
            return self._direct(x, w, bias, y, g, transposed=transposed)
        family = self._family("conv_transpose2d" if transposed else "conv2d")
        if transposed:  # own kernel: weights re-laid out as (G, CoutG, CinG*KH*KW)
            G, C, CoutG, KH, KW = g.G, g.C, g.CoutG, g.KH, g.KW
            w = self.cp.ascontiguousarray(
                w.reshape(G, C // G, CoutG, KH * KW).transpose(0, 2, 1, 3)).reshape(g.Cout, C // G, KH, KW)
        return self._own_conv(x, w, bias, y, g, transposed=transposed, family="half" if half else family, half=half)

    def _direct_pays(self, g) -> bool:
        """Whether a conv of at most DIRECT_MAX_COUT_G output channels a group runs faster on the direct kernel
        (a thread an output, its CinG*KH*KW taps in a loop) than on the implicit GEMM (a mostly empty tile): with
        few taps (depthwise), or with outputs enough to fill the GPU. The SD1.5 UNet's conv_out (320 -> 4,
        64x64: 16 384 outputs of 2 880 taps) took 467 us direct and 47 us as a half GEMM on an H200."""
        taps = g.CinG * g.KH * g.KW
        return taps <= DIRECT_MAX_TAPS or g.N * g.Cout * g.OH * g.OW >= self.sm_count * DIRECT_MIN_OUTPUTS_PER_SM

    def _direct(self, x, w, bias, y, g, transposed):
        fn = self._misc("ad_direct_conv")
        args = pack_args("ad_direct_conv", (
            x, w, self._null() if bias is None else bias, bias is not None, y,
            *(getattr(g, k) for k in ("N", "C", "H", "W", "Cout", "CinG", "CoutG", "KH", "KW", "OH", "OW",
                                      "sh", "sw", "ph", "pw", "dh", "dw")), transposed))
        self._launch_1d(fn, y.size, args)
        return y

    def _own_conv(self, x, w, bias, y, g, transposed, family, cfg=None, ksplit=None, half=0):
        """``half``: x, w and y are float16 (1) or bfloat16 (2) arrays (the "half" tiles: HALF_IO, C_HALF)."""
        M, Ntot, K = g.CoutG, g.N * g.OH * g.OW, g.CinG * g.KH * g.KW
        G = g.G
        quant = isinstance(w, DeviceQuant)
        record = None
        if cfg is None and ksplit is None and not transposed and not quant:
            record = ("conv", g, self.tf32, half, bias is None, w.data.ptr & 15)
        if cfg is None:
            op = "conv_transpose2d" if transposed else "conv2d"
            cfg, ks = self._plan(self._cands(family, op, M, Ntot, G), M, Ntot, G, K)
            ksplit = ksplit or ks
        mode = dict(IS_GEMM=0, CONV_TRANSPOSED=int(transposed))
        if quant:  # the packed weight, decoded in the tile loads, indexed from its start (one z chunk)
            macros = {**cfg, **_mode_macros(quant_mode(mode, FORMATS[w.fmt].code))}
            HW, P = g.H * g.W, g.OH * g.OW
            return self._own_launch(
                macros, cfg, M, Ntot, K, G, lambda g0: (w.data, K, 1, M * K), lambda g0: (x, 0, 0, 0),
                lambda g0: (y, 0, 0, self._null() if bias is None else bias), bias, conv_args(g), y, (0, P, g.Cout),
                ksplit or self._ksplit(cfg, M, Ntot, G, K), wq=(*self._wq(w), self._null(), 0))
        vec_a = int(not half and vec_fits(cfg, "A") and K % 4 == 0 and (M * K) % 4 == 0 and w.data.ptr % 16 == 0)
        macros = {**cfg, **_mode_macros(dict(mode, VEC_A=vec_a))}
        if half:
            macros.update(HALF_IO=half, C_HALF=1)
        HW, P = g.H * g.W, g.OH * g.OW
        ks = ksplit or self._ksplit(cfg, M, Ntot, G, K)
        conv = conv_args(g)
        # views starting at group g0 (the kernel indexes from these pointers with full strides)
        return self._own_launch(
            macros, cfg, M, Ntot, K, G,
            lambda g0: (w.reshape(-1)[g0 * M * K:], K, 1, M * K),
            lambda g0: (x.reshape(-1)[g0 * g.CinG * HW:], 0, 0, 0),
            lambda g0: (y.reshape(-1)[g0 * M * P:], 0, 0, self._null() if bias is None else bias[g0 * M:]),
            bias, conv, y, (0, P, g.Cout), ks, record=record)

