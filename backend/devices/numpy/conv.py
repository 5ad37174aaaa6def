"""The NumPy device's convolutions: cache-blocked im2col + GEMM over the pack's thread pool,
depthwise by taps, channels-last for many channels, shifted views for stride 1; transposed
convolutions as GEMM + col2im."""
from __future__ import annotations

import math  # noqa: F401

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...system import threads
from ...system.config import workspace_budget_bytes
from ...ops.plans import conv2d_geometry, conv_transpose2d_geometry
from . import colconv, common, smallconv
from .common import F32, _parallel, _quiet, _split  # noqa: F401


class NumpyConv:
    """conv2d and conv_transpose2d on the host (a mixin of NumpyBackend)."""

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        if smallconv.takes(x.shape, w.shape, stride, pads, dilation, groups, x, w):
            return _quiet(smallconv.conv2d, x, w, bias, stride, pads, dilation)
        x, stride, pads, dilation = _gather_windows(x, w.shape, stride, pads, dilation)
        if _cols_conv_takes(x.shape, w.shape, stride, pads, dilation, groups):
            return colconv.conv2d(x, w, bias, pads, dilation, groups)
        if any(pads):
            x = self._pad(x, pads, "zeros")
        x = np.ascontiguousarray(x)
        N, C, H, W, Cout, Cg, Coutg, KH, KW, OH, OW, sh, sw, *_, dh, dw, G = conv2d_geometry(
            x.shape, w.shape, stride, (0, 0, 0, 0), dilation, groups)
        out = np.empty((N, Cout, OH, OW), F32)
        if out.size == 0:
            return out
        sN, sC, sH, sW = x.strides
        if Cg == 1 and Coutg == 1:
            self._depthwise(x, w, bias, out, stride, dilation)
            return out
        K = Cg * KH * KW
        if (sh, sw) == (1, 1) and KH * KW > 1 and OH * OW >= CONV_SHIFT_MIN_PIXELS:
            if KH * KW * Coutg <= OUTSHIFT_ROWS_MAX and Cg >= OUTSHIFT_MIN_CIN:
                return _conv2d_outshift(x, w, bias, out, (dh, dw), G)
            if CONV_SHIFT_MIN_CIN <= Cg <= CONV_SHIFT_MAX_CIN:
                return _conv2d_shifted(x, w, bias, out, (dh, dw), G)
        if Cg >= 32 or Cg > OW:
            return self._conv2d_channels_last(x, w, bias, out, stride, dilation, groups)
        wmat = np.ascontiguousarray(w).reshape(G, Coutg, K)
        target = max(256, common.CHUNK_BYTES // (4 * K))
        P = OH * OW
        tasks = []
        if P <= target:
            nb = max(1, target // P)
            for g in range(G):
                for n0 in range(0, N, nb):
                    tasks.append((g, n0, min(N, n0 + nb), 0, OH))
        else:
            rows = max(1, target // OW)
            for g in range(G):
                for n in range(N):
                    for r0 in range(0, OH, rows):
                        tasks.append((g, n, n + 1, r0, min(OH, r0 + rows)))

        def task(t):
            g, n0, n1, r0, r1 = t
            nb, rows = n1 - n0, r1 - r0
            src = x[n0:n1, g * Cg:(g + 1) * Cg, r0 * sh:, :]
            view = as_strided(src, shape=(Cg, KH, KW, nb, rows, OW),
                              strides=(sC, dh * sH, dw * sW, sN, sh * sH, sw * sW), writeable=False)
            cols = np.empty((Cg, KH, KW, nb, rows, OW), F32)
            np.copyto(cols, view)
            res = wmat[g] @ cols.reshape(K, nb * rows * OW)
            if bias is not None:
                res += bias[g * Coutg:(g + 1) * Coutg, None]
            out[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1, :] = \
                res.reshape(Coutg, nb, rows, OW).transpose(1, 0, 2, 3)

        with threads.single_threaded_blas():
            _parallel(task, tasks)
        return out

    def _conv2d_channels_last(self, x, w, bias, out, stride, dilation, groups):
        """Many channels, small images: gather patches from an NHWC copy, so every copied run is
        a contiguous stretch of channels, then (pixels x K) @ (K x Cout) as one big GEMM per
        workspace-sized chunk (BLAS's own threads: these GEMMs are large)."""
        N, C, H, W = x.shape
        Cout, Cg, KH, KW = w.shape
        _, _, OH, OW = out.shape
        sh, sw = stride
        dh, dw = dilation
        G = groups
        Coutg = Cout // G
        K = KH * KW * Cg
        xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))  # N, H, W, C
        sN, sH, sW, sC = xh.strides
        # (G, K, Coutg) with K ordered (kh, kw, c) to match the patch gather
        wk = np.ascontiguousarray(w.reshape(G, Coutg, Cg, KH, KW).transpose(0, 3, 4, 2, 1)).reshape(G, K, Coutg)
        outh = np.empty((N, OH, OW, Cout), F32)
        per_image = OH * OW * K * 4
        nbat = max(1, min(N, workspace_budget_bytes() // 2 // max(1, per_image)))
        nt = threads.num_threads()
        for g in range(G):
            for n0 in range(0, N, nbat):
                n1 = min(N, n0 + nbat)
                nb = n1 - n0
                cols = np.empty((nb, OH, OW, KH, KW, Cg), F32)

                def gather(r, n0=n0, g=g, cols=cols):  # rows r of the chunk's output
                    src = xh[n0:n0 + nb, r[0] * sh:, :, g * Cg:(g + 1) * Cg]
                    view = as_strided(src, shape=(nb, r[1] - r[0], OW, KH, KW, Cg),
                                      strides=(sN, sh * sH, sw * sW, dh * sH, dw * sW, sC), writeable=False)
                    np.copyto(cols[:, r[0]:r[1]], view)

                _parallel(gather, _split(OH, nt) if nb * OH * OW * K > 1 << 16 else [(0, OH)])
                res = self._gemm(cols.reshape(nb * OH * OW, K), wk[g])
                if bias is not None:
                    res += bias[g * Coutg:(g + 1) * Coutg]
                outh[n0:n1, :, :, g * Coutg:(g + 1) * Coutg] = res.reshape(nb, OH, OW, Coutg)
        out[...] = outh.transpose(0, 3, 1, 2)
        return out

    def _depthwise(self, x, w, bias, out, stride, dilation):
        """groups == channels, one output per group: accumulate the kernel taps directly."""
        N, C, H, W = x.shape
        _, _, KH, KW = w.shape
        _, _, OH, OW = out.shape
        sh, sw = stride
        dh, dw = dilation
        wt = w.reshape(C, KH, KW)
        planes = N * C
        per = max(1, (common.CHUNK_BYTES // 4) // max(1, OH * OW))
        xs = x.reshape(planes, H, W)
        os_ = out.reshape(planes, OH, OW)
        chan = np.arange(planes) % C

        def task(r):
            p0, p1 = r
            acc = np.zeros((p1 - p0, OH, OW), F32)
            ws = wt[chan[p0:p1]]
            for i in range(KH):
                for j in range(KW):
                    tap = xs[p0:p1, i * dh: i * dh + (OH - 1) * sh + 1: sh, j * dw: j * dw + (OW - 1) * sw + 1: sw]
                    acc += ws[:, i, j, None, None] * tap
            if bias is not None:
                acc += bias[chan[p0:p1], None, None]
            os_[p0:p1] = acc

        _parallel(task, [(p, min(planes, p + per)) for p in range(0, planes, per)])

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        x = np.ascontiguousarray(x)
        N, Cin, H, W, _, Cing, Coutg, KH, KW, OH, OW, sh, sw, ph, _, pw, _, dh, dw, G = conv_transpose2d_geometry(
            x.shape, w.shape, stride, padding, output_padding, dilation, groups)
        out = np.empty((N, Coutg * G, OH, OW), F32)
        if out.size == 0:
            return out
        wg = np.ascontiguousarray(w).reshape(G, Cing, Coutg * KH * KW)
        # tasks: (image, group, block of output channels), at least one per thread; inside a task
        # the input rows go in chunks whose columns fit in L2, accumulated into the task's canvas
        nt = threads.num_threads()
        cob = max(1, -(-Coutg * N * G // nt) // (N * G)) if N * G < nt else Coutg
        per_row = 4 * cob * KH * KW * W
        rows = max(1, min(H, 4 * common.CHUNK_BYTES // max(1, per_row)))  # 4x: fewer, larger col2im adds
        tasks = [(n, g, c0, min(Coutg, c0 + cob)) for n in range(N) for g in range(G)
                 for c0 in range(0, Coutg, cob)]

        def task(t):
            n, g, c0, c1 = t
            nco = c1 - c0
            wblk = np.ascontiguousarray(
                wg[g].reshape(Cing, Coutg, KH * KW)[:, c0:c1].reshape(Cing, nco * KH * KW).T)
            xg = x[n, g * Cing:(g + 1) * Cing].reshape(Cing, H * W)
            # only the output window of the canvas (huge strides / paddings / dilations stay small)
            canvas = np.zeros((nco, OH, OW), F32)
            for r0 in range(0, H, rows):
                r1 = min(H, r0 + rows)
                cols = (wblk @ xg[:, r0 * W:r1 * W]).reshape(nco, KH, KW, r1 - r0, W)
                for i in range(KH):
                    hs = _tap_slices(r0, r1, i * dh, sh, ph, OH)
                    if hs is None:
                        continue
                    for j in range(KW):
                        ws_ = _tap_slices(0, W, j * dw, sw, pw, OW)
                        if ws_ is not None:
                            canvas[:, hs[1], ws_[1]] += cols[:, i, j, hs[0], ws_[0]]
            blk = canvas
            if bias is not None:
                blk = blk + bias[g * Coutg + c0:g * Coutg + c1, None, None]
            out[n, g * Coutg + c0:g * Coutg + c1] = blk

        with threads.single_threaded_blas():
            _parallel(task, tasks)
        return out


def _tap_slices(r0, r1, off, s, p, out_len):
    """Transposed conv, one kernel tap at offset ``off``: (slice of the input rows r0..r1 (local),
    slice of the output) for the inputs whose product lands inside the output window, or None."""
    lo = max(r0, -(-(p - off) // s))
    hi = min(r1, (out_len - 1 + p - off) // s + 1)
    if lo >= hi:
        return None
    d0 = lo * s + off - p
    return slice(lo - r0, hi - r0), slice(d0, d0 + (hi - lo - 1) * s + 1, s)


def _gather_windows(x, wshape, stride, pads, dilation):
    """conv2d along a dim whose padded extent is far larger than its windows (huge padding, stride
    or dilation): gather each output's KH (KW) input rows (zeros outside the input) into a compact
    input read with stride K, dilation 1 and no padding, so no padding is ever materialised."""
    stride, dilation, pads = list(stride), list(dilation), list(pads)
    for ax, k in ((2, wshape[2]), (3, wshape[3])):
        d = ax - 2
        n, lo, hi, s, dl = x.shape[ax], pads[2 * d], pads[2 * d + 1], stride[d], dilation[d]
        ext = n + lo + hi
        out = (ext - dl * (k - 1) - 1) // s + 1
        if ext <= 1024 or ext <= 2 * out * k:
            continue
        idx = (np.arange(out) * s)[:, None] + (np.arange(k) * dl)[None, :] - lo
        idx = np.where((idx >= 0) & (idx < n), idx, n).reshape(-1)
        zero = np.zeros(x.shape[:ax] + (1,) + x.shape[ax + 1:], F32)
        x = np.take(np.concatenate([x, zero], axis=ax), idx, axis=ax)
        stride[d], dilation[d], pads[2 * d], pads[2 * d + 1] = k, 1, 0, 0
    return x, tuple(stride), tuple(pads), tuple(dilation)


def _tap_tasks(N, G, rows_total, row_len, channels, min_rows=1):
    """The tasks (n0, n1, group, r0, r1) of a per-tap shifted-view conv (forward or input gradient)
    whose rows are ``row_len`` floats of ``channels`` channels: several small images a task (one
    stacked matmul per tap), or row blocks of one image, each about common.CHUNK_BYTES."""
    per_img = 4 * channels * rows_total * row_len
    if per_img <= common.CHUNK_BYTES:
        nb = max(1, min(-(-N // threads.num_threads()), common.CHUNK_BYTES // per_img))
        return [(n0, min(N, n0 + nb), g, 0, rows_total) for g in range(G) for n0 in range(0, N, nb)]
    # at least min_rows a block, unless that leaves a thread without a block
    min_rows = min(min_rows, rows_total, max(1, rows_total * N * G // threads.num_threads()))
    rows = max(min_rows, 1, min(rows_total, common.CHUNK_BYTES // (4 * channels * row_len)))
    return [(n, n + 1, g, r0, min(rows_total, r0 + rows)) for n in range(N) for g in range(G)
            for r0 in range(0, rows_total, rows)]


def _tap_offsets(KH, KW, dilation, row_len, row0=0):
    """The positions each tap (kh, kw) is shifted by in a per-channel flat layout of rows ``row_len`` long,
    from row ``row0``: (row0 + kh*dh) * row_len + kw*dw, taps in (kh, kw) order."""
    dh, dw = dilation
    return [(row0 + kh * dh) * row_len + kw * dw for kh in range(KH) for kw in range(KW)]


def _flat_rows(xp, slack):
    """The padded xp (N, C, Hp, Wp) flattened per channel, with ``slack`` zeros after each channel (the last
    taps' shifted views run past the end)."""
    N, C, Hp, Wp = xp.shape
    flat = np.empty((N, C, Hp * Wp + slack), F32)
    flat[:, :, :Hp * Wp].reshape(N, C, Hp, Wp)[...] = xp
    flat[:, :, Hp * Wp:] = 0.0
    return flat


def _tap_sum(wts, base, offsets, shape, strides):
    """sum over taps t of ``wts[t] @ view_t``, view_t the (images, channels, positions) window of
    ``base`` shifted by ``offsets[t]`` positions (a strided view, no copy): the per-tap GEMMs of the
    shifted-view conv forward and input gradient."""
    acc = tmp = None
    for t, d in enumerate(offsets):
        view = as_strided(base[:, :, d:], shape=shape, strides=strides, writeable=False)
        if acc is None:
            acc = np.matmul(wts[t], view)
            tmp = np.empty_like(acc)
        else:
            np.matmul(wts[t], view, out=tmp)
            acc += tmp
    return acc


#: stride-1 convs with COLS_MIN_CIN to COLS_MAX_CIN input channels per group take colconv.conv2d (one GEMM
#: with K = taps x CinG per block of rows) unless _conv2d_outshift takes them (few output channels).
#: Measured (same process, alternating medians, 2-core AVX2 EPYC; old -> new ms): 16x32x64x64 32->32
#: 25.4 -> 20.8 (input gradient 21.7 -> 18.1), 1x16x512x512 16->16 97 -> 44 (31 -> 85 input gradient),
#: 16x8x64x64 8->8 10.5 -> 5.7; 2x64x96x96 64->64 level (17.8 / 17.4); 1x256x64x64 46 -> 51 (kept off)
COLS_MIN_CIN = 8
COLS_MAX_CIN = 64


def _cols_conv_takes(xshape, wshape, stride, pads, dilation, groups) -> bool:
    N, C, H, W = xshape
    Cout, Cg, KH, KW = wshape
    if tuple(stride) != (1, 1) or KH * KW == 1 or not COLS_MIN_CIN <= Cg <= COLS_MAX_CIN:
        return False
    OH = H + pads[0] + pads[1] - dilation[0] * (KH - 1)
    OW = W + pads[2] + pads[3] - dilation[1] * (KW - 1)
    if OH <= 0 or OW <= 0 or OH * OW < CONV_SHIFT_MIN_PIXELS:
        return False
    return not (KH * KW * (Cout // groups) <= OUTSHIFT_ROWS_MAX and Cg >= OUTSHIFT_MIN_CIN)


# ---- stride-1 conv2d without an im2col (forward) ----------------------------------------------------
#: stride-1 convs whose taps x output channels (per group) are at most OUTSHIFT_ROWS_MAX, from
#: OUTSHIFT_MIN_CIN input channels, take _conv2d_outshift (input gradients with as few input channels too,
#: as the flipped forward conv); weight gradients whose taps x output channels are at most TAP_COLS_MAX
#: gather the taps' gy rows (gradients._wgrad_gathered). Measured on a 2-core AVX2 EPYC, 16x32x64x64 (same process, alternating):
#: 32 -> 3 forward 21.7 -> 8.4 ms (PyTorch 5.2), input gradient 23.8 -> 12.4; 32 -> 16 forward 20.5 ->
#: 15.0; 32 -> 32 and 64 -> 64 stay on the input side (36.8 against 39.0, 73.6 against 76.6), and so do
#: 32 -> 16 input gradients (25.8 against 35.4 with columns)
OUTSHIFT_ROWS_MAX = 144
TAP_COLS_MAX = 72
OUTSHIFT_MIN_CIN = 8
#: _conv2d_outshift's blocks have at least this many rows: a block's product runs (KH - 1) * dh rows past it
#: (the last taps' reads), so one-row blocks of wide images computed 3x the work (1x16x512x512 16 -> 16: 93 ms
#: -> 37 with 16 rows; 1x32x256x256 32 -> 16 18 -> 10; 16x32x64x64 32 -> 16 13.6 -> 12.5)
OUTSHIFT_MIN_ROWS = 16
#: stride-1 convs with CONV_SHIFT_MIN_CIN to CONV_SHIFT_MAX_CIN input channels per group and at
#: least CONV_SHIFT_MIN_PIXELS output pixels per image take _conv2d_shifted. Measured (min of 3,
#: old -> new ms, shared host): 16x32x64x64 32->32 112 -> 31; 2x64x96x96 76 -> 38; 1x128x128x128
#: 159 -> 127; single images of 48-128 channels within the host's noise either way (1x64x128x128
#: 28 -> 37, 1x96x64x64 20 -> 14, 1x48x64x64 7.1 -> 3.4); but 1x256x64x64 105 -> 168 (the
#: channels-last path's one big threaded GEMM wins) and 4x16x64x64 5.8 -> 8.1 (the NCHW im2col's
#: K = 144 GEMM wins)
CONV_SHIFT_MIN_CIN = 32
CONV_SHIFT_MAX_CIN = 128
CONV_SHIFT_MIN_PIXELS = 256


def _conv2d_shifted(xp, w, bias, out, dilation, G):
    """Stride-1 conv2d of the already padded xp (N, C, Hp, Wp) as KH*KW GEMMs on shifted views,
    _conv2d_input_grad's scheme run forward: xp is flattened per channel (with slack for the last
    taps), so the input a tap (kh, kw) reads for a block of output rows, at every padded column,
    is one strided 2-D view offset by kh*dh*Wp + kw*dw; each tap is one BLAS GEMM (CoutG x CinG)
    @ view accumulated in float32 into the block (in L2); the ew columns per row that fall past
    the output are dropped at the end. Blocks of rows of every image and group on the thread pool.
    (16x32x64x64, 32 -> 32 and 32 -> 3: 3-9x less time than the channels-last im2col; see
    CONV_SHIFT_MIN_CIN for where it loses.)"""
    N, C, Hp, Wp = xp.shape
    Cout, Cg, KH, KW = w.shape
    _, _, OH, OW = out.shape
    Coutg = Cout // G
    flat = _flat_rows(xp, dilation[1] * (KW - 1))
    wt = np.ascontiguousarray(np.asarray(w, F32).reshape(G, Coutg, Cg, KH * KW).transpose(0, 3, 1, 2))
    outq = np.empty((N, Cout, OH, Wp), F32)
    tasks = _tap_tasks(N, G, OH, Wp, max(Cg, Coutg))
    sn, sc = flat.strides[0], flat.strides[1]

    def task(tk):
        n0, n1, g, r0, r1 = tk
        nb, L = n1 - n0, (r1 - r0) * Wp
        offsets = _tap_offsets(KH, KW, dilation, Wp, r0)
        acc = _tap_sum(wt[g], flat[n0:n1, g * Cg:(g + 1) * Cg], offsets, (nb, Cg, L), (sn, sc, 4))
        if bias is not None:
            acc += np.asarray(bias, F32)[g * Coutg:(g + 1) * Coutg, None]
        outq[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1] = acc.reshape(nb, Coutg, r1 - r0, Wp)

    with threads.single_threaded_blas():
        _parallel(task, tasks)
    out[...] = outq[:, :, :, :OW]
    return out


def _conv2d_outshift(xp, w, bias, out, dilation, G):
    """Stride-1 conv2d with few output channels, the taps on the output side: per block of rows, one GEMM
    z = (taps x CoutG, CinG) @ (CinG, positions) (M = 27 for 3 output channels: the input-side scheme's 9
    GEMMs had M = 3, which BLAS runs slowly), then the block is the sum of z's tap rows, each read shifted
    by its tap's offset kh*dh*Wp + kw*dw. xp is already padded (N, C, Hp, Wp); the columns past OW of each
    row are dropped at the end, as in _conv2d_shifted."""
    N, C, Hp, Wp = xp.shape
    Cout, Cg, KH, KW = w.shape
    _, _, OH, OW = out.shape
    Coutg = Cout // G
    T = KH * KW
    offsets = _tap_offsets(KH, KW, dilation, Wp)
    flat = _flat_rows(xp, dilation[1] * (KW - 1))
    wz = np.ascontiguousarray(np.asarray(w, F32).reshape(G, Coutg, Cg, T).transpose(0, 3, 1, 2)).reshape(G, T * Coutg, Cg)
    outq = np.empty((N, Cout, OH, Wp), F32)
    tasks = _tap_tasks(N, G, OH, Wp, max(Cg, T * Coutg), OUTSHIFT_MIN_ROWS)

    def task(tk):
        n0, n1, g, r0, r1 = tk
        L = (r1 - r0) * Wp
        z = np.matmul(wz[g], flat[n0:n1, g * Cg:(g + 1) * Cg, r0 * Wp:r0 * Wp + L + offsets[-1]])
        acc = z[:, :Coutg, :L].copy()  # tap (0, 0): offset 0
        for t in range(1, T):
            acc += z[:, t * Coutg:(t + 1) * Coutg, offsets[t]:offsets[t] + L]
        if bias is not None:
            acc += np.asarray(bias, F32)[g * Coutg:(g + 1) * Coutg, None]
        outq[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1] = acc.reshape(n1 - n0, Coutg, r1 - r0, Wp)

    with threads.single_threaded_blas():
        _parallel(task, tasks)
    out[...] = outq[:, :, :, :OW]
    return out
