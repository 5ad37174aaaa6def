"""The OpenCL CPU family's Winograd F(2x2, 3x3) convolution and its weight gradient, a mixin of OpenCLBackend
(kernels/winograd_cpu.cl, kernels/winograd_wgrad_cpu.cl): the forward conv (linalg.py's _conv2d takes it where
_conv_path says "winograd"; the input gradient is such a conv), fused into one kernel up to WINO_FUSED_MAX_C
input channels, and the weight gradient of 3x3 stride-1 convs (wgrad.py's _conv2d_weight_grad)."""
from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from ...ops.contract import workspace_budget_bytes
from ...system import config
from .memory import CLArray, _HostBlock
from .params import PACK_K, WINO_OB

#: CPU family's Winograd: tiles per chunk at most. Its transformed input and products (16 x 4 x (C + Cout)
#: bytes a tile) then stay in the caches between the three kernels: 4 MiB at 64 channels, where the
#: transforms' memory traffic bounds the conv. Measured in one process against whole-conv chunks: the
#: compact upscaler 589 against 671 ms, the SD VAE decoder 12.3 against 13.9 s, the SD1.5 UNet step
#: level (4.98 against 4.92 s: its 64x64 latent is 1 024 tiles)
WINO_CHUNK_TILES = 512
#: Winograd convs with at most this many input channels take wino_fused (the input transform, the products
#: and the output transform in one kernel: a 32-tile group's transformed input, 16 x C x 32 floats, in local
#: memory, where the device has that much)
WINO_FUSED_MAX_C = 128
#: wino_fused's rows of output channels a block on narrow vectors (AVX2): MR 4 (8 ymm accumulators), in place of
#: gemm_cpu's MR 6 (2-core AVX2 EPYC, medians of 20 in one process, prefetch and NT stores on: 1x16x512^2 16 -> 16
#: 14.7 -> 13.7 ms, 1x32x256^2 11.6 -> 10.3, 1x16x256^2 6.5 -> 4.5, 1x64x128^2 9.3 -> 9.1, 1x128x64^2 9.4 -> 9.1:
#: 16 and 32 output channels are no longer 18 and 36 rows, and the short channel loop's fold is smaller)
WINO_FUSED_NARROW_MR = 4
#: the same on wide vectors (AVX-512: 16 floats, 32 zmm): MR 8, both 16-tile halves of a group at once (H2 in
#: winograd_cpu.cl, where the input channels are one block: per channel 2 loads of V and 8 broadcasts of U feed 16 sums,
#: not 1 and 8 for 8). 2-core Intel Xeon with AVX-512, medians of 15 alternating in one process, MR 16 one half at a time
#: -> H2 MR 8: 1x16x512^2 16 -> 16 5.51 -> 5.12 ms (5.29 -> 4.99), 16x32x64^2 -> 32 4.58 -> 3.97 (4.13 -> 3.90),
#: 1x64x128^2 64 -> 64 3.50 -> 2.89, 16x32x64^2 -> 3 2.37 -> 2.22 (MR 8 both), 16x3x64^2 -> 32 1.01 -> 0.93; H2 with MR
#: 16 spills (32 sums: 5.5 -> 7.0 ms), MR 10 and 12 slower than 8
WINO_FUSED_WIDE_MR = 8
WINO_FUSED_WIDE_H2 = True
#: wino_fused and wino_in on wide vectors (AVX-512) read a float32 run wholly inside the image straight from x (WD in
#: winograd_cpu.cl: no copy of its 4 rows into private memory, whose 8-float stores its 16-float reads at offsets 1-3
#: could not forward from). 2-core Intel Xeon with AVX-512, medians of 21 alternating in one process: 1x16x512^2 16 ->
#: 16 5.92 -> 5.30 ms, 16x32x64^2 -> 32 4.23 -> 4.13, 1x64x128^2 64 -> 64 3.50 -> 3.41 (not measured on AVX2: off there)
WINO_IN_DIRECT = True
#: wino_fused on a CPU device with at most this many input channels is built for its C (WC in winograd_cpu.cl: the
#: product loop unrolled whole; AVX-512 Xeon, 1x16x512^2 16 -> 16 at MR 8: 5.39 -> 4.96 ms). 2-core AVX2 EPYC, paired runs in one process (medians of 40 / 20): 1x16x512^2 16 -> 16
#: 8.12 -> 7.56 ms (after the single-block product, 8.69 -> 8.12), 1x32x256^2 32 -> 32 6.06 -> 5.74, 16x32x64^2 -> 32 6%;
#: 64 and 128 channels 3-7% slower unrolled (their loops are long enough)
WINO_FUSED_UNROLL_MAX_C = 32
#: outputs of at least this many bytes (twice a Zen 3 core's L2) are written by the Winograd kernels with
#: non-temporal stores (NTS in winograd_cpu.cl): no read for ownership of lines written whole, and the input stays
#: in the caches. Measured on a 2-core AVX2 EPYC, chains of four 3x3 convs, in one process against none: 16x32x64^2
#: 46.3 -> 40.6 ms, 1x64x128^2 38.2 -> 30.7, 1x16x512^2 70.4 -> 56.0, 4x32x64^2 15.0 -> 13.0, 1x64x64^2 11.8 -> 11.1
#: (the next conv reads the output back from memory either way; a 512 KiB output gained too: 5.1 -> 4.7)
WINO_NT_MIN_BYTES = 1 << 20
#: a constant weight's transformed U (16/9 of it) is kept while the weight lives, up to ANYDEVICE_WINOGRAD_WEIGHTS_MB
#: (default 0: none, so a compiled model is never copied) and this share of the host's free memory (with what is
#: kept already). A compiled model's float32 weights are wrapped host memory the caller promised not to write
#: (memory.py _HostBlock); each call transforms them again otherwise (perf over an SD1.5 UNet step: wino_filter 6.3%
#: of the samples, plus page faults on its fresh buffers; 1x1280x16^2 1280 -> 1280 60.1 -> 32.4 ms kept, 1x512x64^2
#: 80.3 -> 73.6, 1x320x64^2 33.0 -> 30.8)
WINO_U_CACHE_SHARE = 0.25
#: stride-1 3x3 convs with at least this many input channels take _wgrad_winograd (2-core AVX2 EPYC, medians of
#: 7-9 in one process, against the per-tap or im2col GEMMs: 16x16x64^2 16 -> 16 19.2 -> 10.1 ms, 1x16x512^2 85 ->
#: 28, 16x8x64^2 8 -> 8 12.6 -> 6.8, 1x4x512^2 4 -> 8 30 -> 13, 16x32x64^2 32 -> 3 10.1 -> 7.3; 3 -> 32 even, 6.0
#: against 5.5)
WGRAD_WINO_MIN_CIN = 4
#: tiles (2x2 outputs) one chunk of _wgrad_winograd transforms and multiplies (2 x 16 x 32 x 4 bytes a tile
#: at 32 channels: 4 MiB)
WGRAD_WINO_TILES = 1024
#: floats after each 32-tile group of the transformed operands (kernels/winograd_wgrad_cpu.cl: a group
#: stride of a multiple of 4 KiB maps a channel's row to one L1 set)
WGRAD_WINO_GPAD = 16


class CLWinograd:
    """Winograd convs and weight gradients in OpenCL kernels (a mixin of OpenCLBackend)."""

    def _wino_in_direct(self) -> dict:
        """The input transform's build option WD (WINO_IN_DIRECT) where it is on: wide vectors."""
        return {"WD": 1} if WINO_IN_DIRECT and self.wide_vectors else {}

    def _conv2d_winograd(self, x, w, bias, out, pt, pl, slope=None):
        """Winograd F(2x2, 3x3) (kernels/winograd_cpu.cl): filter transform straight into packed-A
        panels; then, up to WINO_FUSED_MAX_C input channels (where the device's local memory holds a
        32-tile group's transformed input), one wino_fused launch (input transform into local memory, the
        16 products, output transform adding the bias: nothing between them goes through global memory);
        above, input transform straight into packed-B panels (tile chunks within the workspace budget),
        16 batched gemm_cpu products, output transform adding the bias.

        The two transforms also flag an Inf/NaN among the values they read (a transformed sum that is
        not finite; a finite overflow flags too); returns False then, and the caller recomputes ``out``
        on an exact path. One 4-byte read-back at the end replaces separate finiteness passes."""
        N, C, H, W = x.shape
        Cout = w.shape[0]
        _, _, OH, OW = out.shape
        th, tw = -(-OH // 2), -(-OW // 2)
        total = N * th * tw
        params = self._rows_fit(self._shape_class(Cout, min(total, 1024), C), Cout)
        fused = C <= WINO_FUSED_MAX_C and 16 * 32 * 4 * C <= int(self.dev.local_mem_size)
        if fused and self.narrow_vectors:
            params = dict(params, MR=WINO_FUSED_NARROW_MR)
        elif fused and self.is_cpu_device:
            params = dict(params, MR=WINO_FUSED_WIDE_MR)
        else:  # V as gemm_cpu's panels in halves where it takes them (wino_in's BH)
            params = self._b_halves(params)
        mr, msub = params["MR"], params["MSUB"]
        wparams = dict(params, PK=PACK_K, OB=WINO_OB)
        nts = {"NTS": 1} if out.nbytes >= WINO_NT_MIN_BYTES else {}
        cpu_l = (1, 1)
        flag = self._empty((1,))
        self._q_fill(flag.buffer, np.int32(0), 0, 4)
        hb = int(bias is not None)
        bbuf = bias.buffer if hb else out.buffer
        # output channels in slices where the weight is stored compressed (U is 16/9 of it in float32)
        cstep = self._weight_rows(w, Cout, 16 * 4 * C, mr * msub)
        slices = [[c0, min(cstep, Cout - c0), self._slice_bias(bias, 1, Cout, c0, min(cstep, Cout - c0)) if hb else None,
                   None] for c0 in range(0, Cout, cstep)]
        if fused:
            # wino_fused: no transformed input or product in global memory, so no tile chunks; a weight slice's U
            # is transformed once
            unroll = {"WC": C} if self.is_cpu_device and C <= min(WINO_FUSED_UNROLL_MAX_C, wparams.get("KP", 256)) else {}
            unroll.update(self._wino_in_direct())
            if WINO_FUSED_WIDE_H2 and self.wide_vectors and C <= wparams.get("KP", 256):
                unroll["H2"] = 1
            for c0, cc, bb, _ in slices:
                mt = -(-cc // mr)
                Up = self._wino_u(w, c0, cc, C, mr, wparams, flag)
                self._run("wino_fused", (-(-total // 32),), (1,), x.buffer, x.offset, Up.buffer, mt * mr * C,
                          C, H, W, pt, pl, cc, out.buffer, c0 * OH * OW, bb.buffer if hb else bbuf, hb,
                          Cout, OH, OW, th, tw, 0, total, *self._slope_args(slope, c0, bbuf), flag.buffer,
                          self.cl.LocalMemory(16 * 32 * 4 * C),
                          params={**wparams, **self._xdt(x), **self._xdt(out, "YDT"), **nts, **unroll})
                del Up
            return self._winograd_flag(flag)
        per_tile = 4 * 16 * (C + min(cstep, Cout))
        chunk = max(32, (workspace_budget_bytes() // per_tile) // 32 * 32)
        chunk = min(chunk, WINO_CHUNK_TILES, -(-total // 32) * 32)
        # one transformed-input and one product buffer for every chunk (the kernels take the chunk's sizes): a
        # recording (replay.py) pins each buffer its commands touch, and would pin a pair per chunk
        Vp = self._empty((16, -(-chunk // 32) * 32 * C))
        Mb = self._empty((16, min(cstep, Cout), chunk))
        for t0 in range(0, total, chunk):
            ntl = min(chunk, total - t0)
            nt = -(-ntl // 32)
            self._run("wino_in", (-(-C // PACK_K), nt), cpu_l, x.buffer, x.offset, Vp.buffer,
                      C, H, W, pt, pl, th, tw, t0, ntl, flag.buffer, 32 * C, nt * 32 * C,
                      params={**wparams, **self._xdt(x), **self._wino_in_direct()})
            for sl in slices:
                c0, cc, bb, Up = sl
                mt = -(-cc // mr)
                if Up is None:
                    Up = self._wino_u(w, c0, cc, C, mr, wparams, flag)
                    if len(slices) == 1:
                        sl[3] = Up  # the whole weight: transformed once for every tile chunk
                self._run("gemm_cpu", (-(-cc // (mr * msub)), nt, 16), (1, 1, 1),
                          cc, ntl, C, Up.buffer, mt * mr * C, Vp.buffer, nt * 32 * C,
                          Mb.buffer, 0, ntl, cc * ntl, Mb.buffer, 0, 0, 1 << 30, 0, 0, params=self.gemm_build(params, cc, C, nt))
                del Up
                self._run("wino_out", (-(-nt // WINO_OB), cc), cpu_l, Mb.buffer, ntl, cc * ntl,
                          out.buffer, c0 * OH * OW, bb.buffer if hb else bbuf, hb, Cout, OH, OW, th, tw, t0, ntl,
                          *self._slope_args(slope, c0, bbuf), params={**wparams, **self._xdt(out, "YDT"), **nts})
        del Vp, Mb
        return self._winograd_flag(flag)

    def _wino_u(self, w, c0: int, cc: int, C: int, mr: int, wparams: dict, flag):
        """U = G g Gt of weight rows [c0, c0 + cc) in gemm_cpu's packed-A panels (wino_filter; an Inf/NaN weight
        sets ``flag``). For a constant weight (a float32 CLArray on wrapped host memory: memory.py _HostBlock, a
        compiled model's) it is transformed once and kept while the weight's block lives, within
        ANYDEVICE_WINOGRAD_WEIGHTS_MB (default 0: never) and WINO_U_CACHE_SHARE of the host's free memory; a new
        entry is not made while recording (its check reads the conv's flag back). A weight written in place is re-wrapped by the
        compile path (compile/weights.py: uploaded again per tensor version), a new block: the same guarantee
        a copied weight has."""
        mt = -(-cc // mr)
        block = w.block if type(w) is CLArray else None
        cache = key = None
        if isinstance(block, _HostBlock) and config.get("ANYDEVICE_WINOGRAD_WEIGHTS_MB"):
            with self._wino_u_lock:
                cache = self.__dict__.setdefault("_wino_u_cache", weakref.WeakKeyDictionary())
                key = (w.offset, w.shape, mr, c0, cc)
                hit = cache.get(block, {}).get(key)
            if hit is not None:
                return hit
            if self.recording() is not None:
                cache = None
        Up = self._empty((16, mt * mr * C))
        self._run("wino_filter", (-(-C // PACK_K), mt), (1, 1), w.buffer, w.offset + c0 * C * 9, Up.buffer,
                  cc, C, flag.buffer, *self._wq(w), params={**wparams, **self._wdt(w)})
        # kept only while the conv's flag is clear (not recording: read back): an Inf/NaN weight never is (nor one
        # whose conv read an Inf/NaN input before it: kept on a later call)
        if cache is None or not self._winograd_flag(flag):
            return Up
        from ...system import memstat
        free = memstat.free_bytes(None)[0]
        limit = config.get("ANYDEVICE_WINOGRAD_WEIGHTS_MB")
        with self._wino_u_lock:
            kept = sum(u.block.nbytes for entries in list(cache.values()) for u in entries.values())
            if kept + 4 * Up.size <= min(limit, WINO_U_CACHE_SHARE * (free + kept)):
                cache.setdefault(block, {})[key] = Up
        return Up

    #: guards the transformed-weight cache's dicts (any thread may run a conv; no call is made under it)
    _wino_u_lock = threading.Lock()

    def _winograd_flag(self, flag) -> bool:
        """Whether the Winograd transforms read only finite values (their flag still clear): read back, or
        while recording a guard checked after each replay (no read-back: the flag's word is a NaN's bits
        when set, WINO_BAD) and True."""
        rec = self.recording()
        if rec is not None:
            rec.guard_finite(flag)
            return True
        bad = np.zeros(1, np.int32)
        self._q_read(bad, flag.buffer)
        return not bad[0]

    def _wgrad_wino_takes(self, x, gy, wshape, stride, dilation, groups) -> bool:
        """Whether the weight gradient takes _wgrad_winograd: float32, 3x3, stride and dilation 1, one group,
        at least WGRAD_WINO_MIN_CIN input channels, below 2^31 elements (the kernels' int offsets)."""
        Cout, CinG, KH, KW = wshape
        return ((KH, KW) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1
                and CinG >= WGRAD_WINO_MIN_CIN and self._dtype(x) == "float32" and self._dtype(gy) == "float32"
                and max(math.prod(x.shape), math.prod(gy.shape)) < 2**31)

    def _wgrad_winograd(self, x, gy, wshape, pads):
        """Winograd F(2x2, 3x3) weight gradient (kernels/winograd_wgrad_cpu.cl): in chunks of
        WGRAD_WINO_TILES output tiles, x's 4x4 patches transformed by winograd_cpu.cl's wino_in and gy's 2x2
        tiles by wino_gy (both tiles in the vector lanes), their 16 per-element products summed over the
        chunk's tiles by wino_wgemm into one (16, Cout, Cin) partial product a chunk; wino_wgrad_out sums
        those in order and applies Gt . G. 16 multiplies a tile and channel pair against the per-tap
        GEMMs' 36, and no im2col or packing of x (measured: tools' notes, docs/notes/trainspeed.md).

        The transforms flag an Inf/NaN among the values they read (Winograd mixes a tile: Inf - Inf = NaN
        where torch's weight gradient has an Inf); None then (the caller's exact path), or a guard while
        recording, as the forward's Winograd."""
        N, C, H, W = x.shape
        Cout = wshape[0]
        OH, OW = gy.shape[2:]
        t, _, l, _ = pads
        th, tw = -(-OH // 2), -(-OW // 2)
        total = N * th * tw
        if total == 0:
            return None
        chunk = min(WGRAD_WINO_TILES, -(-total // 32) * 32)
        groups32 = -(-chunk // 32)
        flag = self._empty((1,))
        self._q_fill(flag.buffer, np.int32(0), 0, 4)
        x, gy = self._contiguous(x), self._contiguous(gy)
        gpad = WGRAD_WINO_GPAD
        Vp = self._empty((16, groups32 * (32 * C + gpad)))
        Ug = self._empty((16, groups32 * (32 * Cout + gpad)))
        nchunks = -(-total // chunk)
        part = self._empty((nchunks, 16 * Cout * C))
        inp = {"PK": PACK_K, "OB": WINO_OB}
        gp = self.default_tunables("winograd_wgrad_cpu.cl")  # (params.py: VW 8 on narrow vectors)
        cpu_l = (1, 1)
        for p, t0 in enumerate(range(0, total, chunk)):
            ntl = min(chunk, total - t0)
            nt = -(-ntl // 32)
            self._run("wino_in", (-(-C // PACK_K), nt), cpu_l, x.buffer, x.offset, Vp.buffer,
                      C, H, W, t, l, th, tw, t0, ntl, flag.buffer, 32 * C + gpad, nt * (32 * C + gpad),
                      params={**inp, **self._wino_in_direct()})
            self._run("wino_gy", (-(-Cout // PACK_K), nt), cpu_l, gy.buffer, gy.offset, Ug.buffer,
                      Cout, OH, OW, th, tw, t0, ntl, flag.buffer, gpad, params=gp)
            self._run("wino_wgemm", (-(-Cout // gp["RM"]), 16), cpu_l, Ug.buffer, Vp.buffer, Cout, C, ntl,
                      part.buffer, p * 16 * Cout * C, gpad, params=gp)
        del Vp, Ug
        gw = self._empty((Cout, C, 3, 3))
        self._run("wino_wgrad_out", (Cout * C,), (1,), part.buffer, nchunks, Cout, C, gw.buffer, 0, params=gp)
        del part
        return gw if self._winograd_flag(flag) else None
