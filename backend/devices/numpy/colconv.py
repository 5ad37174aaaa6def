"""The NumPy device's stride-1 convolutions with many channels, as one GEMM per block of output rows whose
K is every tap: the forward conv, its input gradient (the forward conv of gy with the flipped, transposed
weight) and its weight gradient.

The input goes channel-major and flattened per channel with its zero padding (``_padded_flat``: the padded
rows of Wp columns, then slack for the last taps), so the input a tap (kh, kw) reads for a block of output
rows -- at every padded column -- is one contiguous run of each channel, offset by kh*dh*Wp + kw*dw. A block's
columns (taps x CinG rows, rows*Wp positions) are those runs copied one after the other (memcpy-like copies,
in L2), then

- forward: out_block (CoutG, positions) = W (CoutG, taps x CinG) @ columns, one BLAS GEMM with K = 9 x CinG
  (the per-tap shifted-view scheme it replaces ran 9 GEMMs with K = CinG, each packing its operand and
  adding its product into the block: 2x the time at 32 channels); the block's Wp - OW padding columns per
  row are dropped as the block is stored;
- weight gradient: gW (CoutG, taps x CinG) += gy_block (CoutG, positions) @ columns^T, gy widened to Wp
  columns by zeros and the columns' padding positions zeroed (their products vanish, and an Inf or NaN of x
  reaches exactly the weights torch's does), per thread a float64 accumulator.

Blocks of rows of every image and group run on the pack's thread pool with single-threaded BLAS; a block's
columns are about COLS_CHUNK_BYTES.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...system import threads
from .common import F32, _parallel, _split, parallel_sums, zero_pad

#: bytes of columns one block gathers (taps x CinG x rows*Wp floats). Same process, medians, 2-core AVX2 EPYC
#: (512 KiB L2 a core): 16x32x64x64 32->32 at 128 KiB / 256 KiB / 512 KiB / 1 / 2 / 4 MiB 120 / 47 / 25 / 22 /
#: 19.4 / 19.5 ms (a block of one or two rows makes BLAS calls with N = 66-132 columns: ~100 us a block of
#: calls and hand-offs); 1x16x512x512 16->24 1 / 2 / 4 / 8 MiB 53 / 37 / 33 / 41 ms
COLS_CHUNK_BYTES = 2 << 20
#: the weight gradient's blocks (a reduction over the block: larger blocks, fewer passes over the
#: accumulator; 16x32x64x64 22.8 ms at 1 MiB, 20.8 at 4 MiB; 1x16x512x512 37.5 -> 34.5)
WGRAD_CHUNK_BYTES = 4 << 20


def _padded_flat(x, pads, slack):
    """x (N, C, H, W) zero-padded by pads (t, b, l, r), flattened per channel: (N, C, Hp*Wp + slack), the
    slack zeros (the last taps' runs read past the last row). Filled on the thread pool, an image a task."""
    N, C, H, W = x.shape
    t, b, l, r = pads
    Hp, Wp = H + t + b, W + l + r
    flat = np.empty((N, C, Hp * Wp + slack), F32)

    def fill(rng_):
        for n in range(rng_[0], rng_[1]):
            flat[n, :, Hp * Wp:] = 0.0
            zero_pad(x[n], t, b, l, r, out=flat[n, :, :Hp * Wp].reshape(C, Hp, Wp))

    _parallel(fill, _split(N, threads.num_threads()) if x.size >= 1 << 16 else [(0, N)])
    return flat, Hp, Wp


def _blocks(N, G, OH, Wp, col_rows, chunk=None):
    """The tasks (n0, n1, g, r0, r1): several whole images a task when an image's columns are small (and
    there are images enough for the threads), else blocks of rows of one image, each about ``chunk`` bytes of
    columns (COLS_CHUNK_BYTES), and at least one block per thread where the rows allow."""
    chunk = chunk or COLS_CHUNK_BYTES
    per_row = 4 * col_rows * Wp
    nt = threads.num_threads()
    if per_row * OH <= chunk and N * G >= nt:
        nb = max(1, min(-(-N // nt), chunk // (per_row * OH)))
        return [(n0, min(N, n0 + nb), g, 0, OH) for g in range(G) for n0 in range(0, N, nb)]
    rows = max(1, min(OH, chunk // per_row, OH * N * G // nt))  # and at least one block per thread
    return [(n, n + 1, g, r0, min(OH, r0 + rows)) for n in range(N) for g in range(G) for r0 in range(0, OH, rows)]


def _gather(flat, n0, n1, c0, c1, taps, start, L):
    """The columns (images, taps x channels, L) of a block: tap (kh, kw)'s rows are channels c0..c1 of ``flat``
    from position start + kh*dh*Wp + kw*dw; ``taps`` = (KH, KW, dh*Wp, dw). One strided copy (a call per tap
    cost ~5 us each: small blocks paid more in calls than they saved in cache misses)."""
    KH, KW, sh, sw = taps
    ch = c1 - c0
    cols = np.empty((n1 - n0, KH, KW, ch, L), F32)
    src = flat[n0:n1, c0:c1, start:]
    sn, sc, sp = src.strides
    view = as_strided(src, shape=(n1 - n0, KH, KW, ch, L), strides=(sn, sh * sp, sw * sp, sc, sp), writeable=False)
    np.copyto(cols, view)
    return cols.reshape(n1 - n0, KH * KW * ch, L)


def conv2d(x, w, bias, pads, dilation, groups):
    """Stride-1 conv2d of x (N, C, H, W) with w (Cout, CinG, KH, KW), zero pads (t, b, l, r) >= 0 and
    ``dilation``: (N, Cout, OH, OW) float32."""
    N, C, H, W = x.shape
    Cout, Cg, KH, KW = w.shape
    G = groups
    Coutg = Cout // G
    dh, dw = dilation
    T = KH * KW
    flat, Hp, Wp = _padded_flat(x, pads, dw * (KW - 1))
    OH, OW = Hp - dh * (KH - 1), Wp - dw * (KW - 1)
    out = np.empty((N, Cout, OH, OW), F32)
    # (G, CoutG, taps x CinG), K ordered (tap, channel) as the columns
    wz = np.ascontiguousarray(np.asarray(w, F32).reshape(G, Coutg, Cg, T).transpose(0, 1, 3, 2)).reshape(G, Coutg, T * Cg)
    b = None if bias is None else np.asarray(bias, F32).reshape(G, Coutg, 1)
    taps = (KH, KW, dh * Wp, dw)

    def task(tk):
        n0, n1, g, r0, r1 = tk
        L = (r1 - r0) * Wp
        cols = _gather(flat, n0, n1, g * Cg, (g + 1) * Cg, taps, r0 * Wp, L)
        res = np.matmul(wz[g], cols)
        if b is not None:
            res += b[g]
        out[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1] = res.reshape(n1 - n0, Coutg, r1 - r0, Wp)[..., :OW]

    with threads.single_threaded_blas():
        _parallel(task, _blocks(N, G, OH, Wp, T * Cg))
    return out


def input_grad(gy, w, in_hw, pads, dilation, groups):
    """The input gradient of a stride-1 conv2d, as the forward conv of gy with the flipped, transposed
    weight and pads (eh - t, eh - b, ew - l, ew - r); None when a pad is larger than the taps' extent (the
    caller's other path)."""
    Cout, Cg, KH, KW = w.shape
    G = groups
    Coutg = Cout // G
    (dh, dw), (t, b, l, r) = dilation, pads
    eh, ew = dh * (KH - 1), dw * (KW - 1)
    p = (eh - t, eh - b, ew - l, ew - r)
    if min(p) < 0:
        return None
    wf = np.asarray(w, F32)[:, :, ::-1, ::-1].reshape(G, Coutg, Cg, KH, KW).transpose(0, 2, 1, 3, 4)
    gx = conv2d(gy, wf.reshape(G * Cg, Coutg, KH, KW), None, p, dilation, G)
    return gx if gx.shape[2:] == tuple(in_hw) else None


def weight_grad(x, gy, wshape, pads, dilation, groups):
    """The weight gradient (Cout, CinG, KH, KW) of a stride-1 conv2d of x (N, C, H, W) whose output
    gradient is gy (N, Cout, OH, OW); ``pads`` (t, b, l, r) >= 0 the zero padding the taps read (the caller's:
    b and r only as far as the output needs)."""
    N = x.shape[0]
    Cout, Cg, KH, KW = wshape
    G = groups
    Coutg = Cout // G
    dh, dw = dilation
    T = KH * KW
    OH, OW = gy.shape[2:]
    flat, Hp, Wp = _padded_flat(x, pads, dw * (KW - 1))
    gq = np.zeros((N, Cout, OH, Wp), F32)  # gy widened to Wp columns: the padding columns contribute 0
    gq[..., :OW] = gy
    taps = (KH, KW, dh * Wp, dw)
    blocks = _blocks(N, G, OH, Wp, T * Cg, WGRAD_CHUNK_BYTES)

    def work(acc, lo, hi):
        for n0, n1, g, r0, r1 in blocks[lo:hi]:
            L = (r1 - r0) * Wp
            cols = _gather(flat, n0, n1, g * Cg, (g + 1) * Cg, taps, r0 * Wp, L)
            # the padding columns read the next row's values: zeros there, so an Inf never meets gy's zero
            cols.reshape(n1 - n0, T * Cg, r1 - r0, Wp)[..., OW:] = 0.0
            gb = gq[n0:n1, g * Coutg:(g + 1) * Coutg, r0:r1].reshape(n1 - n0, Coutg, L)
            for i in range(n1 - n0):
                acc[g] += gb[i] @ cols[i].T

    total = parallel_sums(work, len(blocks), (G, Coutg, T * Cg))
    return total.reshape(G, Coutg, T, Cg).transpose(0, 1, 3, 2).reshape(Cout, Cg, KH, KW).astype(F32)
