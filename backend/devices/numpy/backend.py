"""NumPy backend: plain NumPy on the CPU, always available.

Convolutions are cache-blocked im2col + GEMM: the output positions are cut into chunks whose
column matrix fits in L2, each chunk is gathered with one strided copy and multiplied with
single-threaded BLAS, and the chunks are spread over the pack's own thread pool (see threads.py).
Depthwise convolutions accumulate kernel taps directly. Transposed convolutions are GEMM + col2im.
Reductions accumulate in float64 so long sums keep FP32 precision.
"""
from __future__ import annotations

import math
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...system import threads
from ...ops.contract import Backend, workspace_budget_bytes
from ...ops.plans import conv2d_geometry, conv_transpose2d_geometry

F32 = np.float32
#: bytes of im2col columns one task gathers at a time (about half of L2)
CHUNK_BYTES = 512 * 1024
#: below this many flops a GEMM runs as one NumPy call
PARALLEL_FLOPS = 4e6
#: from this many flops a GEMM is always split over the pack's threads (see _gemm)
SPLIT_FLOPS = 1e9
#: floats of input and output one window pass works on at a time (in L2)
WINDOW_BLOCK = 256 * 1024


def _erfc_abs(x: np.ndarray) -> np.ndarray:
    """erfc(|x|) in float64 (Numerical Recipes' Chebyshev fit, relative error < 1.2e-7)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    return t * np.exp(poly)


def erfc_neg(x: np.ndarray) -> np.ndarray:
    """erfc(-x) = 1 + erf(x), accurate where erf(x) is close to -1 (gelu's negative side)."""
    e = _erfc_abs(x)
    return np.where(x >= 0, 2.0 - e, e)


def erf(x: np.ndarray) -> np.ndarray:
    """erf in float64: its Maclaurin series below |x| = 1 (20 terms, error < 1e-17), 1 - erfc(|x|)
    with x's sign above (erfc(1) = 0.16, so the fit's 1.2e-7 relative error is < 2e-8 of erf)."""
    z = np.where(np.abs(x) < 1.0, x, 0.0)
    term, acc = z * (2.0 / math.sqrt(math.pi)), np.zeros_like(z)
    for n in range(20):
        acc = acc + term / (2 * n + 1)
        term = term * (-z * z) / (n + 1)
    return np.where(np.abs(x) < 1.0, acc, np.copysign(1.0 - _erfc_abs(x), x))


def probe(name: str = "numpy") -> dict:
    return {"available": True, "reason": "", "devices": [f"CPU via NumPy {np.__version__}"]}


def create(name: str = "numpy", index: int = 0) -> "NumpyBackend":
    return NumpyBackend(index)


class NumpyBackend(Backend):
    name = "numpy"
    kind = "own"
    native_types = (np.ndarray,)

    @property
    def device(self) -> str:
        return f"CPU via NumPy {np.__version__} ({threads.num_threads()} threads)"

    # ---- conversion / layout ----------------------------------------------------------------
    def _from_numpy(self, a):
        return a

    def _to_numpy(self, x):
        return x

    def _reshape(self, x, shape):
        return np.reshape(x, shape)

    def _permute(self, x, axes):
        return np.transpose(x, axes)

    def _expand(self, x, shape):
        return np.broadcast_to(x, shape)

    def _concat_channels(self, parts, n, c, h, w):
        return np.concatenate(parts, axis=1)

    def _slice1(self, x, i):
        return x[:, i]

    # ---- matmul -----------------------------------------------------------------------------
    def _bmm(self, a, b):
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        if Bb == 1 and Ba > 1:  # one big GEMM instead of B small ones
            y = self._gemm(a.reshape(Ba * M, K), b[0])
            return y.reshape(B, M, N)
        if B == 1:
            return self._gemm(a[0], b[0]).reshape(1, M, N)
        if 2.0 * B * M * N * K < PARALLEL_FLOPS:
            return _quiet(np.matmul, a, b)
        out = np.empty((B, M, N), F32)

        def task(r):
            i0, i1 = r
            np.matmul(a[i0:i1] if Ba > 1 else a, b[i0:i1] if Bb > 1 else b, out=out[i0:i1])

        with threads.single_threaded_blas():
            _parallel(task, _split(B, threads.num_threads()))
        return out

    def _mm(self, a, b):
        return self._gemm(a, b)

    def _gemm(self, a, b):
        """2-D GEMM, threaded by what measured best here (same-run block A/B, 2 cores):
        small: one BLAS call; large (>= SPLIT_FLOPS): split over the pack's threads with
        single-threaded BLAS (185-206 GFLOPS at n = 1000-2000, level with OpenBLAS's own threads,
        and it never leaves spinning BLAS workers behind); mid-size: BLAS's own threads (134 vs 112
        GFLOPS at n = 500) if BLAS was loaded with a short spin time, else the split too, so no
        spinning BLAS workers slow the next PyTorch call (inside ComfyUI NumPy loads first)."""
        M, K = a.shape
        N = b.shape[1]
        flops = 2.0 * M * N * K
        if flops < PARALLEL_FLOPS or threads.num_threads() == 1 or (
                threads.BLAS_SPIN_SAFE and flops < SPLIT_FLOPS):
            return _quiet(np.matmul, a, b)
        out = np.empty((M, N), F32)
        nt = threads.num_threads()
        if M >= N:
            def task(r):
                np.matmul(a[r[0]:r[1]], b, out=out[r[0]:r[1]])
            parts = _split(M, nt)
        else:  # each thread writes a block of columns (contiguous temporaries keep BLAS fast)
            def task(r):
                out[:, r[0]:r[1]] = a @ np.ascontiguousarray(b[:, r[0]:r[1]])
            parts = _split(N, nt)
        with threads.single_threaded_blas():
            _parallel(task, parts)
        return out

    # ---- convolution ------------------------------------------------------------------------
    def _pad(self, x, pads, mode):
        t, b, l, r = pads
        np_mode = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        width = [(0, 0)] * (x.ndim - 2) + [(t, b), (l, r)]
        return np.pad(x, width, mode=np_mode)

    def _window2d(self, x, mode, rows, cols):
        (ri, rw), (ci, cw) = rows, cols
        lead, (H, W) = x.shape[:-2], x.shape[-2:]
        OH, OW = ri.shape[0], ci.shape[0]
        P = math.prod(lead)
        out = np.empty((P, OH, OW), F32)
        if out.size == 0:
            return out.reshape(lead + (OH, OW))
        is_max = mode == "max"
        nt = threads.num_threads()
        # columns first (the gathers along the last axis, on the smaller array), over blocks of
        # rows of x; then the rows, over blocks of columns of every plane: each step of a table's
        # plan (_axis_plan) is one NumPy pass, so the blocks keep those passes in cache
        x2 = np.ascontiguousarray(x).reshape(P * H, W)
        t = np.empty((P * H, OW), F32)
        cplan, rplan = _axis_plan(ci, cw), _axis_plan(ri, rw)
        rb = max(1, WINDOW_BLOCK // (W + OW))

        def cols_task(r):
            for r0 in range(r[0], r[1], rb):
                r1 = min(r[1], r0 + rb)
                _apply_axis(x2[r0:r1], cplan, t[r0:r1], 1, is_max)

        _parallel(cols_task, _split(P * H, nt) if P * H * OW > 1 << 15 else [(0, P * H)])
        t3 = t.reshape(P, H, OW)
        cb = max(512, WINDOW_BLOCK // (H + OH))  # (measured: narrower strips cost more than cache misses)
        pb = max(1, WINDOW_BLOCK // ((H + OH) * OW))
        blocks = [(p0, min(P, p0 + pb), c0, min(OW, c0 + cb)) for p0 in range(0, P, pb) for c0 in range(0, OW, cb)]

        def rows_task(r):
            for p0, p1, c0, c1 in blocks[r[0]:r[1]]:
                _apply_axis(t3[p0:p1, :, c0:c1], rplan, out[p0:p1, :, c0:c1], 1, is_max)

        _parallel(rows_task, _split(len(blocks), nt) if P * OH * OW > 1 << 15 else [(0, len(blocks))])
        return out.reshape(lead + (OH, OW))

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        x, stride, pads, dilation = _gather_windows(x, w.shape, stride, pads, dilation)
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
        if (sh, sw) == (1, 1) and CONV_SHIFT_MIN_CIN <= Cg <= CONV_SHIFT_MAX_CIN and KH * KW > 1 and OH * OW >= CONV_SHIFT_MIN_PIXELS:
            return _conv2d_shifted(x, w, bias, out, (dh, dw), G)
        if Cg >= 32 or Cg > OW:
            return self._conv2d_channels_last(x, w, bias, out, stride, dilation, groups)
        wmat = np.ascontiguousarray(w).reshape(G, Coutg, K)
        target = max(256, CHUNK_BYTES // (4 * K))
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
        per = max(1, (CHUNK_BYTES // 4) // max(1, OH * OW))
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
        rows = max(1, min(H, 4 * CHUNK_BYTES // max(1, per_row)))  # 4x: fewer, larger col2im adds
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

    # ---- elementwise ------------------------------------------------------------------------
    def _unary(self, op, x, **p):
        y = self._unary_np(op, x, **p)
        return y if isinstance(y, np.ndarray) else np.asarray(y, dtype=F32)  # 0-d stays an array

    def _unary_np(self, op, x, **p):
        with np.errstate(all="ignore"):
            if op == "abs":
                return np.abs(x)
            if op == "neg":
                return np.negative(x)
            if op == "exp":
                return np.exp(x)
            if op == "log":
                return np.log(x)
            if op == "sqrt":
                return np.sqrt(x)
            if op == "rsqrt":
                return (1.0 / np.sqrt(x.astype(np.float64))).astype(F32)
            if op == "erf":
                return erf(x.astype(np.float64)).astype(F32)
            if op in ("sin", "cos"):
                return getattr(np, op)(x.astype(np.float64)).astype(F32)
            if op == "relu":
                return np.maximum(x, F32(0))
            if op == "sigmoid":
                return _sigmoid(x)
            if op == "tanh":
                return np.tanh(x)
            if op == "silu":
                return x * _sigmoid(x)
            if op == "gelu":
                return _blocked(x, _gelu_tanh if p["approximate"] == "tanh" else _gelu)
            if op == "elu":
                return np.where(x > 0, x, F32(p["alpha"]) * np.expm1(x)).astype(F32, copy=False)
            if op == "leaky_relu":
                return np.where(x > 0, x, x * F32(p["negative_slope"])).astype(F32, copy=False)
            if op == "softplus":
                beta, thr = p["beta"], p["threshold"]
                bx = x * F32(beta)
                soft = (np.log1p(np.exp(bx.astype(np.float64))) / beta).astype(F32)
                return np.where(bx > thr, x, soft)
            if op == "clamp":
                y = x
                if p["min"] is not None:
                    y = np.maximum(y, F32(p["min"]))
                if p["max"] is not None:
                    y = np.minimum(y, F32(p["max"]))
                return y if y is not x else x.copy()
        raise NotImplementedError(op)

    def _binary(self, op, a, b):
        a = F32(a) if isinstance(a, float) else a
        b = F32(b) if isinstance(b, float) else b
        with np.errstate(all="ignore"):
            return np.asarray(_BINARY[op](a, b), dtype=F32)

    def _slice(self, x, dim, start, length, step):
        return x[(slice(None),) * dim + (slice(start, start + (length - 1) * step + 1 if length else start, step),)]

    def _cat(self, parts, dim):
        return np.concatenate(parts, axis=dim)

    def _where(self, c, a, b):
        return np.asarray(np.where(c != 0, a, b), dtype=F32)

    def _contiguous(self, x):
        return np.ascontiguousarray(x) if x.ndim else x

    def _reduce(self, op, x, dims, keepdim):
        if op == "sum":
            y = np.sum(x, axis=dims, dtype=np.float64, keepdims=keepdim)
        elif op == "mean":  # sum / count: an empty mean is NaN as in torch, without NumPy's warning
            count = math.prod(x.shape[d] for d in dims)
            with np.errstate(all="ignore"):
                y = np.sum(x, axis=dims, dtype=np.float64, keepdims=keepdim) / count if count else \
                    np.full(np.sum(x, axis=dims, keepdims=keepdim).shape, np.nan)
        elif op == "max":
            y = np.max(x, axis=dims, keepdims=keepdim)
        else:
            y = np.min(x, axis=dims, keepdims=keepdim)
        return np.asarray(y, dtype=F32)

    def _norm_rows(self, x, eps):
        """layers._normalize fused, in two passes over each L2-sized block of rows (the OpenCL
        kernel's scheme): shifted sums t = x - K (K the mean of the row's first <= 256 values),
        m = mean(t), q = mean(t^2), var = q - m^2, accepted when m^2 <= var / 4 (the
        cancellation costs at most a factor 1.25 in var's relative error), y = (t - m) / sqrt(var
        + eps). Otherwise (a shift far from the mean, non-finite values) those rows are redone
        about the accurate mean a = K + m (the composite's corrected two-pass statistics). The
        sums: float32 partial dots of 256 values (BLAS gemv: one call a block) summed in float64.
        Blocks of rows on the thread pool; the result is written into one output buffer."""
        rows, n = x.shape
        x = np.ascontiguousarray(x)
        out = np.empty((rows, n), F32)
        eps64 = float(F32(eps))

        def sums(t, sq):  # (float64 sum(t) / n, float64 sum(t^2) / n) of each row of the block
            np.multiply(t, t, out=sq)
            return _row_sums(t) / n, _row_sums(sq) / n

        per = max(1, _NORM_BLOCK // max(n, 1))

        def task(r):
            sq_all = np.empty((min(per, r[1] - r[0]), n), F32)
            for i in range(r[0], r[1], per):
                j = min(r[1], i + per)
                xb, t, sq = x[i:j], out[i:j], sq_all[:j - i]
                k = np.add.reduce(xb[:, :256], axis=1, dtype=np.float64, keepdims=True)
                k = (k / min(n, 256)).astype(F32)
                np.subtract(xb, k, out=t)
                m, q = sums(t, sq)
                v = q - m * m
                bad = ~(np.isfinite(v) & np.isfinite(m) & (m * m <= 0.25 * v))
                if bad.any():  # about the accurate mean a: b = mean(x - a), var = mean((x - a - b)^2)
                    a = (k[bad, 0] + m[bad]).astype(F32)[:, None]
                    tb = np.subtract(xb[bad], a)
                    mb, qb = sums(tb, np.empty_like(tb))
                    t[bad] = tb
                    m = m.copy()
                    m[bad], v[bad] = mb, qb - mb * mb
                rs = (1.0 / np.sqrt(np.maximum(v, 0.0) + eps64)).astype(F32)[:, None]
                np.subtract(t, m.astype(F32)[:, None], out=t)
                np.multiply(t, rs, out=t)

        tasks = _split(rows, threads.num_threads()) if rows * n > 2 * BLOCK else [(0, rows)]
        with threads.single_threaded_blas():
            if len(tasks) == 1 or threading.current_thread().name.startswith("anydevice"):
                for t in tasks:
                    _quiet(task, t)
            else:
                _parallel(task, tasks)
        return out

    def _softmax_rows(self, s):
        """attention's exp(s - max(row max, -FLT_MAX)) in place on s and the rows' sums (at
        least 1; ``_row_sums``), as its composite, blocks of rows on the thread pool."""
        rows, n = s.shape
        if not s.flags.c_contiguous or not s.flags.writeable:
            return None
        t = np.empty((rows, 1), F32)
        lo = F32(-np.finfo(F32).max)

        per = max(1, BLOCK // max(n, 1))

        def task(r):  # one pool task per thread (tiny tasks' overhead measured 15%), L2-sized steps
            for i in range(r[0], r[1], per):
                j = min(r[1], i + per)
                sb = s[i:j]
                mx = np.maximum(np.max(sb, axis=1, keepdims=True), lo)
                np.subtract(sb, mx, out=sb)
                np.exp(sb, out=sb)
                t[i:j, 0] = np.maximum(_row_sums(sb), 1.0)

        tasks = _split(rows, threads.num_threads()) if rows * n > 2 * BLOCK else [(0, rows)]
        with threads.single_threaded_blas():  # _row_sums' gemv calls, one pool thread each
            if len(tasks) == 1 or threading.current_thread().name.startswith("anydevice"):
                for r in tasks:
                    _quiet(task, r)
            else:
                _parallel(task, tasks)
        return s, t


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
           "pow": np.power, "minimum": np.minimum, "maximum": np.maximum,
           "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal}


def _gelu(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * erfc_neg(x64 / math.sqrt(2.0))).astype(F32)


def _gelu_tanh(x):
    x64 = x.astype(np.float64)
    inner = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)
    return (0.5 * x64 * (1.0 + np.tanh(inner))).astype(F32)


#: elements per block of an elementwise op with float64 temporaries (~14 of them: 64 K elements each)
BLOCK = 1 << 16
#: _row_sums' partial sums: float32 dots of this many values (BLAS lanes of <= 32 terms)
_NORM_PART = 256
#: _norm_rows' block of rows: about this many values (x, t and t^2 blocks stay in L2)
_NORM_BLOCK = BLOCK


def _blocked(x, fn):
    """fn (elementwise, float32 -> float32) over x in blocks of BLOCK elements on the thread pool:
    the float64 temporaries stay a few MB whatever the size of x (the result is the same)."""
    if x.size <= BLOCK:
        return fn(x)
    flat = x.reshape(-1)  # a view of a contiguous x (a copy otherwise)
    out = np.empty(x.size, F32)

    def task(r):
        out[r[0]:r[1]] = fn(flat[r[0]:r[1]])

    tasks = [(i, min(x.size, i + BLOCK)) for i in range(0, x.size, BLOCK)]
    if threading.current_thread().name.startswith("anydevice"):  # already on the pool: no nesting
        for t in tasks:
            task(t)
    else:
        _parallel(task, tasks)
    return out.reshape(x.shape)


def _sigmoid(x):
    # 1 / (1 + exp(-x)); exp overflow to inf gives 0, as in torch
    return (1.0 / (1.0 + np.exp(-x))).astype(F32, copy=False)


_ONES = np.ones(_NORM_PART, F32)


def _row_sums(a):
    """float64 sums of the rows of the contiguous 2-D float32 ``a``: float32 partial sums of
    _NORM_PART values (one BLAS gemv a call; OpenBLAS's vector lanes add <= 32 values each, so a
    partial's relative error is <= 32 eps of its absolute sum, ~eps typically; even a sequential
    BLAS stays ~sqrt(256) eps typically) added in float64, a row's tail (< _NORM_PART values) in
    float64 too. 3-5x the speed of a float64 np.sum here (3.7 vs 21 us for 64K values)."""
    rows, n = a.shape
    w = _NORM_PART
    n0 = n - n % w
    tot = np.zeros(rows) if not n0 else \
        (a[:, :n0].reshape(-1, w) @ _ONES).reshape(rows, -1).sum(axis=1, dtype=np.float64)
    if n0 < n:
        tot = tot + np.add.reduce(a[:, n0:], axis=1, dtype=np.float64)
    return tot


def _quiet(fn, *args, **kw):
    """fn without NumPy's floating-point warnings: Inf and NaN are valid data here, and propagate
    as in torch (the error state is per thread, so each pool task sets it too)."""
    with np.errstate(all="ignore"):
        return fn(*args, **kw)


def _parallel(task, tasks) -> None:
    threads.run_parallel(lambda t: _quiet(task, t), tasks)


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


def _split(n: int, parts: int):
    parts = max(1, min(parts, n))
    step = math.ceil(n / parts)
    return [(i, min(n, i + step)) for i in range(0, n, step)]


# ---- window tables (_window2d): strided runs where the table allows them ---------------------
_PLANS: dict = {}


def _axis_plan(idx, wgt):
    """A table (idx (O, T), wgt (O, T)) as a list of steps, each tap j cut into strided runs:
    ("slice", j, o0, o1, ostep, s0, sstep, w) for outputs o0:o1:ostep reading s0, s0 + sstep, ...
    (w a scalar or one weight per output), and ("take", j, outs, srcs, ws) for what is left.
    The period ostep (1-8) is the one that leaves the fewest steps (2x upsampling: 2)."""
    key = (idx.shape, idx.tobytes(), wgt.tobytes())
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    O, T = idx.shape
    plan = []
    for j in range(T):
        c, w = idx[:, j].astype(np.int64), wgt[:, j]
        best = None
        for per in range(1, min(8, O) + 1):
            steps, rest = [], []
            for ph in range(per):
                os_ = np.arange(ph, O, per)
                k = 0
                while k < len(os_):
                    if c[os_[k]] < 0:
                        k += 1
                        continue
                    e = k + 1
                    if e < len(os_) and c[os_[e]] >= 0:
                        step = c[os_[e]] - c[os_[k]]
                        while e < len(os_) and c[os_[e]] >= 0 and c[os_[e]] - c[os_[e - 1]] == step:
                            e += 1
                    if e - k >= 4 and step >= 0:
                        ws = w[os_[k:e]]
                        wv = ws[0] if (ws == ws[0]).all() else ws.copy()
                        steps.append(("slice", j, int(os_[k]), int(os_[e - 1]) + 1, per, int(c[os_[k]]), int(step), wv))
                    else:
                        rest.extend(os_[k:e].tolist())
                    k = e
            cost = len(steps) + (1 + len(rest) / 16 if rest else 0)
            if best is None or cost < best[0]:
                best = (cost, steps, rest)
            if cost <= 1:
                break
        _, steps, rest = best
        plan.extend(steps)
        if rest:
            rest = np.asarray(sorted(rest), np.int64)
            plan.append(("take", j, rest, c[rest], w[rest].copy()))
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _apply_axis(x, plan, acc, axis, is_max):
    """x (..., n, ...) through an axis plan along ``axis`` (1 of a 2-D or 3-D array, or the last),
    written into ``acc`` (the same with the table's output count there)."""
    last = axis == x.ndim - 1
    acc.fill(-np.inf if is_max else 0.0)
    pre = (slice(None),) * axis
    with np.errstate(all="ignore"):
        for st in plan:
            if st[0] == "slice":
                _, j, o0, o1, ostep, s0, sstep, w = st
                cnt = len(range(o0, o1, ostep))
                src = x[pre + (slice(s0, s0 + sstep * (cnt - 1) + 1, sstep if sstep else None),)] if sstep else \
                    np.broadcast_to(x[pre + (slice(s0, s0 + 1),)], x.shape[:axis] + (cnt,) + x.shape[axis + 1:])
                dst = acc[pre + (slice(o0, o1, ostep),)]
                if is_max:
                    np.maximum(dst, src, out=dst)
                else:
                    wv = w if np.ndim(w) == 0 or last else np.reshape(w, (-1,) + (1,) * (x.ndim - axis - 1))
                    dst += src * wv
            else:
                _, j, outs, srcs, w = st
                src = np.take(x, srcs, axis=axis)
                sel = pre + (outs,)
                if is_max:
                    acc[sel] = np.maximum(acc[sel], src)
                else:
                    wv = w if last else np.reshape(w, (-1,) + (1,) * (x.ndim - axis - 1))
                    acc[sel] += src * wv
    return acc


# ---- conv2d weight gradient (autograd; backend/ops/convgrad.py) ----------------------------------------
def _conv2d_weight_grad(self, x, gy, wshape, stride, pads, dilation, groups):
    """gW[g] = sum over chunks of gy_chunk (CoutG x cols) @ im2col(x)_chunk^T (cols x CinG*KH*KW):
    the forward's cache-blocked column gather (chunks of output rows or of whole images, about
    CHUNK_BYTES of columns), one single-threaded BLAS GEMM per chunk into the task's own float32
    accumulator, the thread pool over chunks, the accumulators summed in float64 at the end.
    Depthwise (one in and one out channel per group): the products of each tap summed directly."""
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
    if t or b2 or l or r2:
        x = np.pad(x, [(0, 0), (0, 0), (t, b2), (l, r2)])
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
    target = max(256, CHUNK_BYTES // (4 * K))
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


NumpyBackend._conv2d_weight_grad = _conv2d_weight_grad

def _tap_tasks(N, G, rows_total, row_len, channels):
    """The tasks (n0, n1, group, r0, r1) of a per-tap shifted-view conv (forward or input gradient)
    whose rows are ``row_len`` floats of ``channels`` channels: several small images a task (one
    stacked matmul per tap), or row blocks of one image, each about CHUNK_BYTES."""
    per_img = 4 * channels * rows_total * row_len
    if per_img <= CHUNK_BYTES:
        nb = max(1, min(-(-N // threads.num_threads()), CHUNK_BYTES // per_img))
        return [(n0, min(N, n0 + nb), g, 0, rows_total) for g in range(G) for n0 in range(0, N, nb)]
    rows = max(1, min(rows_total, CHUNK_BYTES // (4 * channels * row_len)))
    return [(n, n + 1, g, r0, min(rows_total, r0 + rows)) for n in range(N) for g in range(G)
            for r0 in range(0, rows_total, rows)]


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
    dh, dw = dilation
    xF, gF, Q = _channel_major(xp, gy, KH, KW, dilation)
    nt = threads.num_threads()
    parts = _split(-(-Q // WGRAD_STEP), nt)
    accs = [np.zeros((G, KH * KW, Coutg, Cg), np.float64) for _ in parts]

    def task(item):
        pi = item[0]
        acc = accs[pi]
        tmp = np.empty((Coutg, Cg), F32)
        for s0 in range(parts[pi][0] * WGRAD_STEP, min(Q, parts[pi][1] * WGRAD_STEP), WGRAD_STEP):
            s1 = min(Q, s0 + WGRAD_STEP)
            for g in range(G):
                a = gF[g * Coutg:(g + 1) * Coutg, s0:s1]
                for kh in range(KH):
                    for kw in range(KW):
                        d = kh * dh * Wp + kw * dw
                        np.matmul(a, xF[g * Cg:(g + 1) * Cg, s0 + d:s1 + d].T, out=tmp)
                        acc[g, kh * KW + kw] += tmp

    with threads.single_threaded_blas():
        _parallel(task, [(i,) for i in range(len(parts))])
    total = accs[0]
    for a in accs[1:]:
        total += a
    return total.transpose(0, 2, 3, 1).reshape(Cout, Cg, KH, KW).astype(F32)


# ---- conv2d input gradient (autograd; backend/ops/convgrad.py) -----------------------------------------
def _conv2d_input_grad(self, gy, w, in_hw, stride, pads, dilation, groups):
    """Stride 1: the gradient of the padded input, gxp[ci, hp, wp] = sum over taps of
    w[:, ci, kh, kw]^T gy[:, hp - kh*dh, wp - kw*dw], with no column gather: gy is zero-padded
    (eh rows above and below, ew columns either side) and flattened per channel, so the gy a tap
    reads for a block of output rows is one strided 2-D view (row stride of a channel) offset by
    that tap; each tap is one BLAS GEMM (CinG x CoutG) @ view accumulated into the block (in L2),
    blocks of rows of every image and group on the thread pool; the padding columns are dropped at
    the end. None for strided convs (the caller's conv_transpose2d path)."""
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


NumpyBackend._conv2d_input_grad = _conv2d_input_grad

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


# ---- Adam / AdamW step (backend/learn/optim.py) ---------------------------------------------------------
def _adam_step(self, param, grad, m, v, vmax, w, lerp_form, beta2, omb2, bc2_sqrt, eps, neg_step):
    """One Adam update of one parameter as NumPy ufuncs into new buffers (no temporaries beyond
    one): the unfused ops' float32 operations in their order, each correctly rounded; returns new
    (param, exp_avg, exp_avg_sq, max_exp_avg_sq or None). The inputs are never written."""
    p, g, m, v = (np.asarray(a, F32) for a in (param, grad, m, v))
    w, beta2, omb2, bc2_sqrt, eps, neg_step = (F32(s) for s in (w, beta2, omb2, bc2_sqrt, eps, neg_step))
    tmp = np.empty(p.shape, F32)
    mo, vo, po = np.empty(p.shape, F32), np.empty(p.shape, F32), np.empty(p.shape, F32)
    with np.errstate(all="ignore"):
        np.subtract(g, m, out=tmp)
        np.multiply(tmp, w, out=tmp)
        np.add(g if lerp_form else m, tmp, out=mo)
        np.multiply(g, omb2, out=tmp)
        np.multiply(tmp, g, out=tmp)
        np.multiply(v, beta2, out=vo)
        np.add(vo, tmp, out=vo)
        vmo = None
        s = vo
        if vmax is not None:
            vmo = np.maximum(np.asarray(vmax, F32), vo)
            s = vmo
        np.sqrt(s, out=tmp)
        np.divide(tmp, bc2_sqrt, out=tmp)
        np.add(tmp, eps, out=tmp)
        np.multiply(mo, neg_step, out=po)
        np.divide(po, tmp, out=po)
        np.add(p, po, out=po)
    return po, mo, vo, vmo


NumpyBackend._adam_step = _adam_step


# ---- stride-1 conv2d without an im2col (forward) ----------------------------------------------------
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
    dh, dw = dilation
    ew = dw * (KW - 1)
    slack = ew
    flat = np.empty((N, C, Hp * Wp + slack), F32)
    flat[:, :, :Hp * Wp].reshape(N, C, Hp, Wp)[...] = xp
    flat[:, :, Hp * Wp:] = 0.0
    wt = np.ascontiguousarray(np.asarray(w, F32).reshape(G, Coutg, Cg, KH * KW).transpose(0, 3, 1, 2))
    outq = np.empty((N, Cout, OH, Wp), F32)
    tasks = _tap_tasks(N, G, OH, Wp, max(Cg, Coutg))
    sn, sc = flat.strides[0], flat.strides[1]

    def task(tk):
        n0, n1, g, r0, r1 = tk
        nb, L = n1 - n0, (r1 - r0) * Wp
        offsets = [(r0 + kh * dh) * Wp + kw * dw for kh in range(KH) for kw in range(KW)]
        acc = _tap_sum(wt[g], flat[n0:n1, g * Cg:(g + 1) * Cg], offsets, (nb, Cg, L), (sn, sc, 4))
        if bias is not None:
            acc += np.asarray(bias, F32)[g * Coutg:(g + 1) * Coutg, None]
        outq[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1] = acc.reshape(nb, Coutg, r1 - r0, Wp)

    with threads.single_threaded_blas():
        _parallel(task, tasks)
    out[...] = outq[:, :, :, :OW]
    return out
