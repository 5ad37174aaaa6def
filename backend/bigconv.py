"""Big-kernel conv2d paths and chunked (cancellable) long convs, shared by every backend.

``conv2d(be, ...)`` is the contract's conv2d dispatch (zero padding already resolved):

* separable: a depthwise-style conv (one input channel per group) whose every KHxKW kernel is
  rank 1 (gaussian, box, sobel, any outer product; found by an SVD of each small kernel on the
  host, residual <= SEP_TOL of the kernel's norm) runs as two 1-D passes through the backend's own
  conv: (KH, 1) with the row stride / dilation / padding, then (1, KW) with the column ones and
  the bias. Exact for every stride, dilation and padding.
* FFT: a large general kernel on a CPU backend (numpy; OpenCL on a CPU device) runs as an
  overlap-save FFT convolution in float64 on the host (numpy.fft) in output row bands: float64
  spectra keep the normwise error near 1e-15, far inside the 1e-6 bar.
* otherwise the backend's own conv.

Both special paths need finite inputs and weights (an Inf or NaN would spread through an FFT, and
a rank-1 split changes which products are formed): otherwise the op takes the backend's own conv.

Every path runs long work in chunks (batch, output row bands) of about ``cancel.CHUNK_SECONDS``
and calls ``cancel.check()`` between them (``chunked``), so a registered checker can stop it.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from . import cancel, threads
from .config import workspace_budget_bytes
from .plans import conv2d_geometry, conv_transpose2d_geometry

log = logging.getLogger("anydevice")

F32 = np.float32
#: rank-1 test: the rest of the spectrum (sqrt of sum of s_i^2, i >= 1) at most this times s_0
SEP_TOL = 1e-7
#: kernels with fewer taps than this keep the backend's own conv (it is fast enough there)
SEP_MIN_TAPS = 49
#: FFT path: fewest kernel taps (KH*KW) where a backend goes through the FFT (small kernels with
#: many channels stay GEMMs: the FFT only pays for itself on big spatial kernels)
FFT_MIN_TAPS = {"numpy": 120, "opencl": 577}
#: multiply-adds per second of each backend's conv, (few channels: depthwise-like, many: GEMM-like),
#: measured here and rounded down; they only decide whether an op is long enough to be cut into
#: chunks (the row bands are then sized from the first band's measured time)
MACS_PER_S = {"numpy": (1.0e9, 2e10), "opencl": (4.0e9, 2e10), "cpu": (0.25e9, 2e10)}
DEFAULT_MACS_PER_S = (5e11, 5e12)  # GPUs


# ---- chunking ------------------------------------------------------------------------------------
def _rows(be, x, a, b):
    f = getattr(be, "_band_rows", None)
    return f(x, a, b) if f is not None else x[:, :, a:b]


def _batch(be, x, a, b):
    f = getattr(be, "_band_batch", None)
    return f(x, a, b) if f is not None else x[a:b]


def _cat(be, parts, axis):
    if len(parts) == 1:
        return parts[0]
    f = getattr(be, "_band_cat", None)
    if f is not None:
        return f(parts, axis)
    p = parts[0]
    if isinstance(p, np.ndarray):
        return np.concatenate(parts, axis=axis)
    mod = type(p).__module__
    if mod.startswith("torch"):
        import torch
        return torch.cat(parts, dim=axis)
    import cupy  # the CUDA backend's arrays
    return cupy.concatenate(parts, axis=axis)


def _sync(be):
    try:
        be.synchronize()
    except Exception:  # noqa: BLE001
        pass


def _seconds(be, macs: float, g) -> float:
    slow, fast = MACS_PER_S.get(be.name, DEFAULT_MACS_PER_S)
    return macs / (slow if g.CinG * g.CoutG < 16 else fast)


def chunked(be, fn, x, w, bias, stride, pads, dilation, groups):
    """fn(x, w, bias, stride, pads, dilation, groups) (a zero-padded conv2d) in chunks of about
    cancel.CHUNK_SECONDS: images, then output row bands, with cancel.check() between chunks."""
    g = conv2d_geometry(be._shape(x), be._shape(w), stride, pads, dilation, groups)
    macs = float(g.N) * g.Cout * g.OH * g.OW * g.CinG * g.KH * g.KW
    secs = _seconds(be, macs, g)
    if secs <= cancel.CHUNK_SECONDS or g.N * g.OH <= 1:
        return fn(x, w, bias, stride, pads, dilation, groups)
    per_image = secs / g.N
    if per_image <= cancel.CHUNK_SECONDS / 2 or g.OH == 1:  # whole images per chunk
        per = max(1, int(cancel.CHUNK_SECONDS / max(per_image, 1e-12)))
        outs = []
        for n0, n1 in cancel.chunks(g.N, per):
            outs.append(fn(_batch(be, x, n0, n1), w, bias, stride, pads, dilation, groups))
            _sync(be)
        return _cat(be, outs, 0)
    # row bands: the first (a quarter of the estimate) is timed, the others sized from it (one size,
    # so device code built per launch size is built once more at most)
    rows = max(1, int(g.OH * cancel.CHUNK_SECONDS / per_image) // 4)
    KHe = g.dh * (g.KH - 1) + 1

    def band(r0, r1):
        start, stop = r0 * g.sh - g.pt, (r1 - 1) * g.sh - g.pt + KHe
        a, b = max(0, start), min(g.H, stop)
        return a, b, a - start, stop - b

    outs = []
    done, total_rows = 0, g.N * g.OH
    for n in range(g.N):
        xn = x if g.N == 1 else _batch(be, x, n, n + 1)
        parts = []
        r0 = 0
        while r0 < g.OH:
            if done:
                cancel.check()
            r1 = min(g.OH, r0 + rows)
            a, b, top, bottom = band(r0, r1)
            if a >= b:  # a band reading only padding (huge strides): the whole image at once
                parts = [fn(xn, w, bias, stride, pads, dilation, groups)]
                done += g.OH - r0
                break
            t0 = time.perf_counter()
            parts.append(fn(_rows(be, xn, a, b), w, bias, stride, (top, bottom, pads[2], pads[3]), dilation, groups))
            _sync(be)
            dt = time.perf_counter() - t0
            if done == 0 and dt > 0:
                rows = max(1, min(g.OH, int((r1 - r0) * cancel.CHUNK_SECONDS / dt)))
            done += r1 - r0
            r0 = r1
            cancel.progress(done, total_rows)
        outs.append(_cat(be, parts, 2))
    return _cat(be, outs, 0)


def chunked_transpose(be, fn, x, w, bias, stride, padding, output_padding, dilation, groups):
    """conv_transpose2d in batch chunks with cancel.check() between them."""
    g = conv_transpose2d_geometry(be._shape(x), be._shape(w), stride, padding, output_padding, dilation, groups)
    macs = float(g.N) * g.C * g.H * g.W * g.CoutG * g.KH * g.KW
    secs = _seconds(be, macs, g)
    if secs <= cancel.CHUNK_SECONDS or g.N <= 1:
        return fn(x, w, bias, stride, padding, output_padding, dilation, groups)
    per = max(1, int(g.N * cancel.CHUNK_SECONDS / secs))
    outs = []
    for n0, n1 in cancel.chunks(g.N, per):
        outs.append(fn(_batch(be, x, n0, n1), w, bias, stride, padding, output_padding, dilation, groups))
        _sync(be)
    return _cat(be, outs, 0)


# ---- dispatch ------------------------------------------------------------------------------------
def _host_weight(be, w) -> np.ndarray:
    """The kernel on the host (a device backend counts the read as a check: it picks the path)."""
    return np.asarray(be.read_check(w), dtype=np.float64)


def rank1_factors(wh: np.ndarray):
    """(column factors (P, KH), row factors (P, KW)) of kernels wh (P, KH, KW) that are all rank 1
    within SEP_TOL, else None. Computed in float64."""
    u, s, vt = np.linalg.svd(wh)
    s0 = s[:, 0]
    rest = np.sqrt(np.sum(s[:, 1:] ** 2, axis=1))
    if not np.all(rest <= SEP_TOL * s0 + 1e-300):
        return None
    r = np.sqrt(s0)
    return u[:, :, 0] * r[:, None], vt[:, 0, :] * r[:, None]


def _finite(be, x) -> bool:
    if isinstance(x, np.ndarray):  # plane by plane (x may be a strided view: no flattening copy)
        return all(bool(np.isfinite(x[i]).all()) for i in np.ndindex(*x.shape[:-2]))
    f = getattr(be, "_all_finite", None)
    if f is not None:
        return f(x)
    cp = getattr(be, "cp", None)  # the CUDA backend (CuPy arrays)
    if cp is not None and isinstance(x, cp.ndarray):
        return bool(cp.isfinite(x).all())
    return False


def _download(be, x) -> np.ndarray:
    """x on the host for the FFT path (counted as a download on a device backend)."""
    if isinstance(x, np.ndarray):
        return x
    h = be._to_numpy(x)
    be._count("downloads", h.nbytes)
    return h


def _fft_capable(be) -> bool:
    if be.name == "numpy":
        return True
    return be.name == "opencl" and getattr(be, "family", "") == "cpu" and getattr(be, "is_cpu_device", False)


def conv2d(be, x, w, bias, stride, pads, dilation, groups):
    """The contract's conv2d dispatch (see the module doc)."""
    if be.kind == "vendor":
        return chunked(be, be._conv2d, x, w, bias, stride, pads, dilation, groups)
    g = conv2d_geometry(be._shape(x), be._shape(w), stride, pads, dilation, groups)
    if g.N * g.Cout * g.OH * g.OW == 0 or g.H == 0 or g.W == 0:
        return be._conv2d(x, w, bias, stride, pads, dilation, groups)
    taps = g.KH * g.KW
    sep = g.CinG == 1 and g.KH > 1 and g.KW > 1 and taps >= SEP_MIN_TAPS
    fft = _fft_capable(be) and taps >= FFT_MIN_TAPS.get(be.name, 1 << 30) and _fft_fits(g)
    if sep or fft:
        cancel.check()
        wh = _host_weight(be, w)
        xh = _download(be, x) if fft and not sep else None  # the FFT reads the input on the host
        if not np.isfinite(wh).all() or not _finite(be, x if xh is None else xh):
            sep = fft = False
        cancel.check()
        if sep:
            fac = rank1_factors(wh.reshape(g.Cout, g.KH, g.KW))
            if fac is not None:
                log.debug("anydevice conv2d: separable path (%dx%d)", g.KH, g.KW)
                return _separable(be, x, fac, bias, g)
        if fft:
            log.debug("anydevice conv2d: FFT path (%dx%d, %d in-channels per group)", g.KH, g.KW, g.CinG)
            return _fft_conv(be, x, wh, bias, g, xh)
    return chunked(be, be._conv2d, x, w, bias, stride, pads, dilation, groups)


def _separable(be, x, fac, bias, g):
    col, row = fac
    wc = be.to_device(col.astype(F32).reshape(g.Cout, 1, g.KH, 1), "conv2d", "weight", constant=True)
    wr = be.to_device(row.astype(F32).reshape(g.Cout, 1, 1, g.KW), "conv2d", "weight", constant=True)
    t = chunked(be, be._conv2d, x, wc, None, (g.sh, 1), (g.pt, g.pb, 0, 0), (g.dh, 1), g.G)
    return chunked(be, be._conv2d, t, wr, bias, (1, g.sw), (0, 0, g.pl, g.pr), (1, g.dw), g.Cout)


# ---- FFT -----------------------------------------------------------------------------------------
def fast_len(n: int) -> int:
    """Smallest 5-smooth integer >= n (sizes pocketfft transforms fastest)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _fft_fits(g) -> bool:
    """FFT path geometry limits: small strides, pads within the kernel, kernel spectra in budget."""
    KHe, KWe = g.dh * (g.KH - 1) + 1, g.dw * (g.KW - 1) + 1
    if g.sh > 2 or g.sw > 2 or max(g.pt, g.pb) >= KHe or max(g.pl, g.pr) >= KWe:
        return False
    if KHe * KWe > 4 * g.KH * g.KW:  # dilation spreads the taps: FFT cost grows, the direct one does not
        return False
    Fw = fast_len(g.W + g.pl + g.pr)
    Fh = fast_len(min(g.H + g.pt + g.pb, max(4 * KHe, 256)))
    spectra = 16.0 * g.Cout * g.CinG * Fh * (Fw // 2 + 1)
    return spectra <= workspace_budget_bytes()


def _fft_conv(be, x, wh, bias, g, xh=None):
    """Overlap-save FFT conv2d in float64 (cross-correlation: the kernel is flipped), output row bands."""
    xh = np.asarray(_download(be, x) if xh is None else xh, dtype=F32)
    bh = None if bias is None else np.asarray(be._to_numpy(bias), dtype=np.float64)
    N, C, H, W = g.N, g.C, g.H, g.W
    KHe, KWe = g.dh * (g.KH - 1) + 1, g.dw * (g.KW - 1) + 1
    Wp = W + g.pl + g.pr
    Fw = fast_len(Wp)
    # band: output rows per band so that a band's transforms stay near 2^23 elements (a fraction of a second)
    elems = int((1 << 20) * min(1.0, cancel.CHUNK_SECONDS / 0.2))
    fh_cap = max(2 * KHe, elems // max(1, Fw * (g.CinG + 1)))
    need = (g.OH - 1) * g.sh + KHe  # padded input rows the whole output reads
    Fh = fast_len(min(need, max(fh_cap, 2 * KHe)))
    rows = max(1, (Fh - KHe) // g.sh + 1)
    wk = np.zeros((g.Cout, g.CinG, KHe, KWe))
    wk[:, :, ::g.dh, ::g.dw] = wh
    # flipped kernels, spectra (G, CoutG, CinG, Fh, Fw/2+1)
    Wf = np.fft.rfft2(wk[:, :, ::-1, ::-1], s=(Fh, Fw)).reshape(g.G, g.CoutG, g.CinG, Fh, Fw // 2 + 1)
    cancel.check()
    out = np.empty((N, g.Cout, g.OH, g.OW), F32)
    col_sl = slice(KWe - 1, KWe - 1 + (g.OW - 1) * g.sw + 1, g.sw)
    nb = -(-g.OH // rows)
    done = 0
    for n in range(N):
        for r0 in range(0, g.OH, rows):
            if done:
                cancel.check()
            r1 = min(g.OH, r0 + rows)
            start = r0 * g.sh - g.pt  # first padded input row, in input coordinates
            L = (r1 - 1 - r0) * g.sh + KHe
            a, b = max(0, start), min(H, start + L)
            band = np.zeros((C, Fh, Fw))
            if a < b:
                band[:, a - start:b - start, g.pl:g.pl + W] = xh[n, :, a:b]

            def task(gi, band=band, n=n, r0=r0, r1=r1):
                if gi:
                    cancel.check()
                Xf = np.fft.rfft2(band[gi * g.CinG:(gi + 1) * g.CinG])
                if g.CinG == 1:
                    Yf = Wf[gi, :, 0] * Xf[0]
                else:
                    Yf = np.einsum("ochw,chw->ohw", Wf[gi], Xf, optimize=True)
                y = np.fft.irfft2(Yf, s=(Fh, Fw))
                y = y[:, KHe - 1:KHe - 1 + (r1 - 1 - r0) * g.sh + 1:g.sh, col_sl]
                if bh is not None:
                    y = y + bh[gi * g.CoutG:(gi + 1) * g.CoutG, None, None]
                out[n, gi * g.CoutG:(gi + 1) * g.CoutG, r0:r1] = y

            threads.run_parallel(task, range(g.G))
            done += 1
            cancel.progress(done, N * nb)
    return out if isinstance(x, np.ndarray) else be.to_device(out, "conv2d")  # counted as an upload
