"""The NumPy device's conv2d gradients (the fused kernels "conv_weight_grad" and "conv_input_grad"
of devices/interface.py, called by ops/convgrad.py): cache-blocked im2col GEMMs and shifted views."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...system import threads
from ...ops.plans import conv2d_geometry, conv_transpose2d_geometry  # noqa: F401
from . import colconv, common, smallconv
from .common import F32, _parallel, _quiet, _split, parallel_sums, zero_pad  # noqa: F401
from .conv import (COLS_MAX_CIN, CONV_SHIFT_MIN_PIXELS, OUTSHIFT_ROWS_MAX, TAP_COLS_MAX,  # noqa: F401
                   _conv2d_outshift, _tap_offsets, _tap_sum, _tap_tasks)


# ---- conv2d weight gradient (autograd; backend/ops/convgrad.py) ----------------------------------------
def _channel_major(xp, gy, KH, KW, dilation):
    """The shifted-view weight gradients' layout: xp (N, C, Hp, Wp) and gy (N, Cout, OH, OW) channel-
    major with one position axis q = (n, row, col) over all padded images (gy widened by zeros, xp
    with the slack the last tap's view reads past the end). Returns (xF, gF, Q)."""
    N, C, Hp, Wp = xp.shape
    OH, OW = gy.shape[2:]
    Q = N * Hp * Wp
    slack = (KH - 1) * dilation[0] * Wp + (KW - 1) * dilation[1]
    xF = np.zeros((C, Q + slack), F32)
    xF[:, :Q].reshape(C, N, Hp, Wp)[...] = xp.transpose(1, 0, 2, 3)
    gF = np.zeros((gy.shape[1], N, Hp, Wp), F32)
    gF[:, :, :OH, :OW] = gy.transpose(1, 0, 2, 3)
    return xF, gF.reshape(gy.shape[1], Q), Q


def _wgrad_depthwise_shifted(xp, gy, k, dilation):
    """Depthwise stride-1 weight gradient in _wgrad_shifted's channel-major layout: per channel,
    each tap is a float32 product of gy's row with x's row shifted by the tap, summed pairwise
    (NumPy's float32 sum along a contiguous row: error ~ log2(n) ulps); threads over channels, a channel's rows stay in L2
    across its taps."""
    C, Wp = xp.shape[1], xp.shape[3]
    KH, KW = k
    dh, dw = dilation
    xF, gF, Q = _channel_major(xp, gy, KH, KW, dilation)
    out = np.empty((C, KH * KW), np.float64)

    def task(r):
        tmp = np.empty(Q, F32)
        for c in range(r[0], r[1]):
            for kh in range(KH):
                for kw in range(KW):
                    d = kh * dh * Wp + kw * dw
                    np.multiply(gF[c], xF[c, d:d + Q], out=tmp)
                    out[c, kh * KW + kw] = np.sum(tmp)  # NumPy's pairwise float32 sum

    _parallel(task, _split(C, threads.num_threads()))
    return out.astype(F32).reshape(C, 1, KH, KW)


#: positions (of all images, channel-major) one _wgrad_shifted step multiplies, per thread
WGRAD_STEP = 4096
#: stride-1 weight gradients with at least this many input channels per group take _wgrad_shifted
#: (fewer: the im2col's few columns cost less than _wgrad_shifted's copy of gy and its thin GEMMs)
WGRAD_SHIFT_MIN_CIN = 16
#: stride-1 weight gradients with WGRAD_COLS_MIN_CIN to WGRAD_COLS_MAX_CIN input channels per group (and more
#: than TAP_COLS_MAX taps x output channels) take colconv.weight_grad: one GEMM per block against all the taps'
#: columns (old -> new ms, same process: 1x16x512x512 16->16 54 -> 33, 16x8x64x64 6.5 -> 5.0, 16x32x64x64
#: 32->32 22.9 -> 20.8; 3 input channels 3.7 -> 5.9 and 3 output channels 6.5 -> 14 stay where they were)
WGRAD_COLS_MIN_CIN = 8
WGRAD_COLS_MAX_CIN = 32


def _wgrad_shifted(xp, gy, wshape, dilation, G):
    """Stride-1 weight gradient without an im2col. xp (N, C, Hp, Wp) is the zero-padded input with
    exactly the rows / columns the taps read (Hp = OH + eh, Wp = OW + ew). Both xp and gy go
    channel-major with one position axis over all images, q = (n, row, col) of the padded
    image (gy's rows widened to Wp and its images to Hp rows by zeros), so tap (kh, kw) is
    gW_tap = gyF (CoutG x Q) @ xF[:, q + kh*dh*Wp + kw*dw]^T: a strided view of the same xF, the
    reads that run into the next image meeting gy's zeros. Threads take ranges of q (every tap
    on the same range while it is in cache) into their own accumulators."""
    Wp = xp.shape[3]
    Cout, Cg, KH, KW = wshape
    Coutg = Cout // G
    xF, gF, Q = _channel_major(xp, gy, KH, KW, dilation)
    offsets = _tap_offsets(KH, KW, dilation, Wp)
    if len(offsets) * Coutg <= TAP_COLS_MAX:
        return _wgrad_gathered(xF, gF, Q, wshape, offsets, G)

    def work(acc, lo, hi):
        tmp = np.empty((Coutg, Cg), F32)
        for s0 in range(lo * WGRAD_STEP, min(Q, hi * WGRAD_STEP), WGRAD_STEP):
            s1 = min(Q, s0 + WGRAD_STEP)
            for g in range(G):
                a = gF[g * Coutg:(g + 1) * Coutg, s0:s1]
                for t, d in enumerate(offsets):
                    np.matmul(a, xF[g * Cg:(g + 1) * Cg, s0 + d:s1 + d].T, out=tmp)
                    acc[g, t] += tmp

    total = parallel_sums(work, -(-Q // WGRAD_STEP), (G, KH * KW, Coutg, Cg))
    return total.transpose(0, 2, 3, 1).reshape(Cout, Cg, KH, KW).astype(F32)


def _wgrad_gathered(xF, gF, Q, wshape, offsets, G):
    """_wgrad_shifted for few output channels (the denoiser's last conv: 3): gW_tap[o, c] = sum over u of
    gy[o, u - d_tap] x[c, u], so per block of positions u the taps' shifted gy rows are gathered into one
    (taps x CoutG, block) matrix (27 rows for 3 channels: a small copy) and multiplied by the block of x
    once, instead of 9 GEMMs with 3 rows each reading the block (BLAS packed the 32 x block operand
    every time: ~9 GFLOPS). Threads over blocks into their own float64 accumulators."""
    Cout, Cg, KH, KW = wshape
    Coutg = Cout // G
    T, dmax = len(offsets), offsets[-1]
    U = Q + dmax  # the positions of x the taps read
    gP = np.zeros((Cout, dmax + U), F32)  # gy with dmax zeros before: gy[o, u - d] = gP[o, dmax + u - d]
    gP[:, dmax:dmax + Q] = gF
    def work(acc, lo, hi):
        for u0 in range(lo * WGRAD_STEP, min(U, hi * WGRAD_STEP), WGRAD_STEP):
            u1 = min(U, u0 + WGRAD_STEP)
            rows = np.empty((T * Coutg, u1 - u0), F32)
            for g in range(G):
                for t, d in enumerate(offsets):
                    rows[t * Coutg:(t + 1) * Coutg] = gP[g * Coutg:(g + 1) * Coutg, dmax + u0 - d:dmax + u1 - d]
                acc[g] += rows @ xF[g * Cg:(g + 1) * Cg, u0:u1].T

    total = parallel_sums(work, -(-U // WGRAD_STEP), (G, T * Coutg, Cg))
    return total.reshape(G, T, Coutg, Cg).transpose(0, 2, 3, 1).reshape(Cout, Cg, KH, KW).astype(F32)


# ---- conv2d input gradient (autograd; backend/ops/convgrad.py) -----------------------------------------
#: strided input gradients whose columns (CinG*KH*KW x N*OH*OW per group) hold at most this many
#: values take _conv2d_input_grad_col2im (larger: the threaded conv_transpose2d path)
COL2IM_MAX = 1 << 20


def _conv2d_input_grad_col2im(gy, w, in_hw, stride, pads, dilation, groups):
    """Small strided input gradients (the digits CNN's stride-2 conv: 64x32x4x4 -> 64x16x8x8):
    per group one GEMM, columns = w_g^T (CinG*KH*KW x CoutG) @ gy_g (CoutG x N*OH*OW), then KH*KW
    strided adds of the columns into the zero-padded input (col2im), cropped to (H, W). A few
    NumPy calls instead of the thread pool's tasks (4 ms -> ~0.3 ms there). None above COL2IM_MAX."""
    N, Cout, OH, OW = gy.shape
    _, Cg, KH, KW = w.shape
    G = groups
    Coutg = Cout // G
    H, W = in_hw
    (sh, sw), (dh, dw), (t, b, l, r) = stride, dilation, pads
    if N == 0 or Cg * KH * KW * N * OH * OW > COL2IM_MAX:
        return None
    Hf, Wf = (OH - 1) * sh + dh * (KH - 1) + 1, (OW - 1) * sw + dw * (KW - 1) + 1
    Hp, Wp = max(Hf, t + H), max(Wf, l + W)
    gxp = np.zeros((N, G * Cg, Hp, Wp), F32)
    wf = np.asarray(w, F32).reshape(G, Coutg, Cg * KH * KW)
    for g in range(G):
        gyg = gy[:, g * Coutg:(g + 1) * Coutg].transpose(1, 0, 2, 3).reshape(Coutg, N * OH * OW)
        with threads.single_threaded_blas():  # a small GEMM: BLAS's threads would only spin
            cols = (wf[g].T @ gyg).reshape(Cg, KH, KW, N, OH, OW)
        dst = gxp[:, g * Cg:(g + 1) * Cg]
        for kh in range(KH):
            for kw in range(KW):
                dst[:, :, kh * dh:kh * dh + (OH - 1) * sh + 1:sh, kw * dw:kw * dw + (OW - 1) * sw + 1:sw] += \
                    cols[:, kh, kw].transpose(1, 0, 2, 3)
    return np.ascontiguousarray(gxp[:, :, t:t + H, l:l + W])


class NumpyGradients:
    """conv2d's weight and input gradients on the host (a mixin of NumpyBackend)."""

    def _conv2d_weight_grad(self, x, gy, wshape, stride, pads, dilation, groups):
        """gW[g] = sum over chunks of gy_chunk (CoutG x cols) @ im2col(x)_chunk^T (cols x CinG*KH*KW):
        the forward's cache-blocked column gather (chunks of output rows or of whole images, about
        common.CHUNK_BYTES of columns), one single-threaded BLAS GEMM per chunk into the task's own float32
        accumulator, the thread pool over chunks, the accumulators summed in float64 at the end.
        Depthwise (one in and one out channel per group): the products of each tap summed directly."""
        if smallconv.takes(x.shape, wshape, stride, pads, dilation, groups, x, gy):
            return _quiet(smallconv.weight_grad, x, gy, wshape, stride, pads, dilation)
        x = np.ascontiguousarray(x)
        gy = np.ascontiguousarray(gy)
        N, C, H, W = x.shape
        Cout, Cg, KH, KW = wshape
        G = groups
        Coutg = Cout // G
        OH, OW = gy.shape[2:]
        if N == 0 or OH * OW == 0:
            return None
        (sh, sw), (dh, dw), (t, b, l, r) = stride, dilation, pads
        # zero padding only where the taps read
        b2 = max(0, (KH - 1) * dh + (OH - 1) * sh + 1 - H - t)
        r2 = max(0, (KW - 1) * dw + (OW - 1) * sw + 1 - W - l)
        if (sh, sw) == (1, 1) and WGRAD_COLS_MIN_CIN <= Cg <= WGRAD_COLS_MAX_CIN and KH * KW > 1 \
                and KH * KW * Coutg > TAP_COLS_MAX and OH * OW >= CONV_SHIFT_MIN_PIXELS and min(t, l) >= 0:
            return colconv.weight_grad(x, gy, wshape, (t, b2, l, r2), (dh, dw), G)
        if t or b2 or l or r2:
            x = zero_pad(x, t, b2, l, r2) if x.dtype == F32 else np.pad(x, [(0, 0), (0, 0), (t, b2), (l, r2)])
        sN, sC, sH, sW = x.strides
        nt = threads.num_threads()
        if Cg == 1 and Coutg == 1:  # depthwise: per channel and tap, sum over (n, oh, ow) of gy * tap
            if (sh, sw) == (1, 1):
                return _wgrad_depthwise_shifted(x, gy, (KH, KW), (dh, dw))
            out = np.empty((C, KH * KW), np.float64)
            gy3 = gy.reshape(N, C, OH * OW)

            def dw_task(rng_):
                for k in range(rng_[0], rng_[1]):
                    i, j = divmod(k, KW)
                    tap = x[:, :, i * dh: i * dh + (OH - 1) * sh + 1: sh, j * dw: j * dw + (OW - 1) * sw + 1: sw]
                    prod = gy3 * tap.reshape(N, C, OH * OW)
                    out[:, k] = np.sum(prod, axis=2).sum(axis=0, dtype=np.float64)  # pairwise rows

            _parallel(dw_task, _split(KH * KW, nt))
            return out.astype(F32).reshape(Cout, 1, KH, KW)
        if (sh, sw) == (1, 1) and Cg >= WGRAD_SHIFT_MIN_CIN:
            return _wgrad_shifted(x, gy, wshape, (dh, dw), G)
        K = Cg * KH * KW
        target = max(256, common.CHUNK_BYTES // (4 * K))
        P = OH * OW
        tasks = []
        if P <= target:
            nb = max(1, target // P)
            tasks = [(n0, min(N, n0 + nb), 0, OH) for n0 in range(0, N, nb)]
        else:
            rows = max(1, target // OW)
            tasks = [(n, n + 1, r0, min(OH, r0 + rows)) for n in range(N) for r0 in range(0, OH, rows)]
        parts = _split(len(tasks), nt)
        accs = [np.zeros((G, Coutg, K), F32) for _ in parts]

        def task(item):
            pi = item[0]
            acc = accs[pi]
            for n0, n1, r0, r1 in tasks[parts[pi][0]:parts[pi][1]]:
                nb, rows = n1 - n0, r1 - r0
                for g in range(G):
                    src = x[n0:n1, g * Cg:(g + 1) * Cg, r0 * sh:, :]
                    view = as_strided(src, shape=(Cg, KH, KW, nb, rows, OW),
                                      strides=(sC, dh * sH, dw * sW, sN, sh * sH, sw * sW), writeable=False)
                    cols = np.empty((Cg, KH, KW, nb, rows, OW), F32)
                    np.copyto(cols, view)
                    gyc = gy[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1, :]
                    gyc = gyc.reshape(Coutg, rows * OW) if nb == 1 else \
                        np.ascontiguousarray(gyc.transpose(1, 0, 2, 3)).reshape(Coutg, nb * rows * OW)
                    acc[g] += gyc @ cols.reshape(K, nb * rows * OW).T

        with threads.single_threaded_blas():
            _parallel(task, [(i,) for i in range(len(parts))])
        total = accs[0].astype(np.float64)
        for a in accs[1:]:
            total += a
        return total.astype(F32).reshape(Cout, Cg, KH, KW)


    def _conv2d_input_grad(self, gy, w, in_hw, stride, pads, dilation, groups):
        """Stride 1: the gradient of the padded input, gxp[ci, hp, wp] = sum over taps of
        w[:, ci, kh, kw]^T gy[:, hp - kh*dh, wp - kw*dw], with no column gather: gy is zero-padded
        (eh rows above and below, ew columns either side) and flattened per channel, so the gy a tap
        reads for a block of output rows is one strided 2-D view (row stride of a channel) offset by
        that tap; each tap is one BLAS GEMM (CinG x CoutG) @ view accumulated into the block (in L2),
        blocks of rows of every image and group on the thread pool; the padding columns are dropped at
        the end. None for strided convs (the caller's conv_transpose2d path)."""
        if smallconv.takes((gy.shape[0], w.shape[1]) + tuple(in_hw), w.shape, stride, pads, dilation, groups, gy, w):
            return _quiet(smallconv.input_grad, gy, w, in_hw, stride, pads, dilation)
        if tuple(stride) != (1, 1):
            return _conv2d_input_grad_col2im(gy, w, in_hw, stride, pads, dilation, groups)
        gy = np.ascontiguousarray(gy)
        N, Cout, OH, OW = gy.shape
        _, Cg, KH, KW = w.shape
        G = groups
        Coutg = Cout // G
        H, W = in_hw
        (dh, dw), (t, b, l, r) = dilation, pads
        eh, ew = dh * (KH - 1), dw * (KW - 1)
        Hq, Wq = OH + eh, OW + ew  # rows / columns of the padded input that the conv reads
        if N == 0 or Hq < t + H or Wq < l + W:
            return None
        outshift = KH * KW * Cg <= OUTSHIFT_ROWS_MAX and KH * KW * Coutg > TAP_COLS_MAX
        if not outshift and KH * KW > 1 and Coutg <= COLS_MAX_CIN and OH * OW >= CONV_SHIFT_MIN_PIXELS \
                and not (Cg == 1 and Coutg == 1):
            gx = colconv.input_grad(gy, w, in_hw, pads, dilation, G)
            if gx is not None:
                return gx
        if outshift and OH * OW >= CONV_SHIFT_MIN_PIXELS:
            # few input channels (a first layer's 3): the forward conv of the padded gy with the flipped,
            # transposed weight, its taps on the output side (one GEMM with M = taps x CinG, not M = CinG)
            gyp = zero_pad(gy, eh, eh, ew, ew)
            wf = np.asarray(w, F32)[:, :, ::-1, ::-1].reshape(G, Coutg, Cg, KH, KW).transpose(0, 2, 1, 3, 4)
            gxq = np.empty((N, G * Cg, Hq, Wq), F32)
            _conv2d_outshift(gyp, np.ascontiguousarray(wf).reshape(G * Cg, Coutg, KH, KW), None, gxq, dilation, G)
            return np.ascontiguousarray(gxq[:, :, t:t + H, l:l + W])
        R, C2 = OH + 2 * eh, OW + 2 * ew
        flat = np.zeros((N, Cout, R * C2 + ew), F32)  # ew of slack: the last taps' views run past the end
        flat[:, :, :R * C2].reshape(N, Cout, R, C2)[:, :, eh:eh + OH, ew:ew + OW] = gy
        # weights per group and tap as (CinG, CoutG) matrices
        wt = np.ascontiguousarray(np.asarray(w, F32).reshape(G, Coutg, Cg, KH * KW).transpose(0, 3, 2, 1))
        gxq = np.empty((N, G * Cg, Hq, C2), F32)
        tasks = _tap_tasks(N, G, Hq, C2, max(Cg, Coutg))
        sn, st = flat.strides[0], flat.strides[1]

        def task(tk):
            n0, n1, g, r0, r1 = tk
            nb, L = n1 - n0, (r1 - r0) * C2
            offsets = [(r0 + eh - kh * dh) * C2 + (ew - kw * dw) for kh in range(KH) for kw in range(KW)]
            acc = _tap_sum(wt[g], flat[n0:n1, g * Coutg:(g + 1) * Coutg], offsets, (nb, Coutg, L), (sn, st, 4))
            gxq[n0:n1, g * Cg:(g + 1) * Cg, r0:r1] = acc.reshape(nb, Cg, r1 - r0, C2)

        with threads.single_threaded_blas():
            _parallel(task, tasks)
        return np.ascontiguousarray(gxq[:, :, t:t + H, l:l + W])
