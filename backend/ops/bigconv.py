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

Every path runs long work in chunks of about ``cancel.CHUNK_SECONDS`` of wall time and calls
``cancel.check()`` between them, so a registered checker (ComfyUI's interrupt) stops it within a
fraction of a second, also with another CPU-heavy process beside it:

* ``chunked``: images, then output row bands, the size re-estimated from each chunk's elapsed time
  (``cancel.Sizer``: it halves when a chunk took too long);
* the finiteness check of the input, and on a device backend the FFT path's download of the input
  and upload of the result: row chunks of at most ``CHUNK_ELEMS`` (``cancel.timed_chunks``);
* the FFT path: kernel spectra group by group, one pool task per group and band with a check
  before each of its stages (``threads.run_parallel`` raises the first task's cancel and ends the
  others at their next check). Its band geometry depends on the shapes only, never on timing: the
  numbers do not depend on the load.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..system import cancel, threads
from ..system.config import workspace_budget_bytes
from .plans import conv2d_geometry, conv_transpose2d_geometry

log = logging.getLogger("anydevice")

F32 = np.float32
#: rank-1 test: the rest of the spectrum (sqrt of sum of s_i^2, i >= 1) at most this times s_0
SEP_TOL = 1e-7
#: kernels with fewer taps than this keep the backend's own conv (it is fast enough there)
SEP_MIN_TAPS = 49
#: The FFT path's fewest kernel taps (KH*KW) are each device's ``caps.fft_min_taps`` (small kernels
#: with many channels stay GEMMs: the FFT only pays for itself on big spatial kernels), and a conv's
#: multiply-adds per second its ``caps.macs_per_s`` (devices/interface.py); they only decide whether
#: an op is long enough to be cut into chunks (the row bands are then sized from the first band's
#: measured time). A device without an estimate (a GPU) gets this one:
DEFAULT_MACS_PER_S = (5e11, 5e12)


# ---- chunking ------------------------------------------------------------------------------------
def _rows(be, x, a, b):
    return be._band_rows(x, a, b)


def _batch(be, x, a, b):
    return be._band_batch(x, a, b)


def _cat(be, parts, axis):
    return parts[0] if len(parts) == 1 else be._band_cat(parts, axis)


def _sync(be):
    try:
        be.synchronize()
    except Exception:  # noqa: BLE001
        pass


#: Winograd F(2x2, 3x3)'s multiplies per direct multiply-add (a device with "winograd")
WINOGRAD_MACS = 1 / 2.25
#: a "winograd" device runs it for 3x3 stride-1 ungrouped convs with at least this many input and output
#: channels (below it the transforms cost more than the multiplies saved: the OpenCL CPU family's rule)
WINOGRAD_MIN_CH = 64


def _seconds(be, macs: float, g, transposed: bool = False) -> float:
    slow, fast = be.caps.macs_per_s or DEFAULT_MACS_PER_S
    if not transposed and "winograd" in be.caps.fused and min(g.CinG, g.CoutG) >= WINOGRAD_MIN_CH \
            and (g.KH, g.KW, g.sh, g.sw, g.dh, g.dw, g.G) == (3, 3, 1, 1, 1, 1, 1):
        macs *= WINOGRAD_MACS  # (estimated as direct, a 0.12 s conv was cut into row bands, each
        #                         transforming the whole filter again)
    return macs / (slow if g.CinG * g.CoutG < 16 else fast)


class _Out:
    """The chunks of a chunked op's output, placed as they come: a NumPy or PyTorch chunk is copied
    into one output allocated at the first chunk (inside the chunk's timed, checked work, so no long
    copy runs after the last check); other arrays (a device backend's) are kept and concatenated at
    the end (``_cat``: queued device copies)."""

    def __init__(self, be, shape):
        self.be, self.shape, self.out, self.parts = be, tuple(shape), None, []

    def put(self, y, n0: int, n1: int, r0: int, r1: int) -> None:
        if self.out is None and not self.parts:
            if isinstance(y, np.ndarray):
                self.out = np.empty(self.shape, y.dtype)
            elif type(y).__module__.startswith("torch"):
                import torch
                self.out = torch.empty(self.shape, dtype=y.dtype, device=y.device)
        if self.out is not None:
            self.out[n0:n1, :, r0:r1] = y
        else:
            self.parts.append((n0, y))

    def result(self):
        if self.out is not None:
            return self.out
        images, rows = [], []  # row bands of one image, concatenated along H, then the images along N
        for i, (n0, y) in enumerate(self.parts):
            rows.append(y)
            if i + 1 == len(self.parts) or self.parts[i + 1][0] != n0:
                images.append(_cat(self.be, rows, 2))
                rows = []
        return _cat(self.be, images, 0)


def chunked(be, fn, x, w, bias, stride, pads, dilation, groups):
    """fn(x, w, bias, stride, pads, dilation, groups) (a zero-padded conv2d) in chunks of about
    cancel.CHUNK_SECONDS with cancel.check() between them: whole images while one takes well under
    a chunk, else output row bands. The size is in output rows (k whole images are k * OH rows),
    re-estimated after every chunk from its wall time (``cancel.Sizer``: the first chunk, a guess
    from the device's caps.macs_per_s, is timed; then the size halves when a chunk took too long), so a CPU-heavy
    process starting mid-op shrinks the chunks instead of stretching them."""
    g = conv2d_geometry(be._shape(x), be._shape(w), stride, pads, dilation, groups)
    macs = float(g.N) * g.Cout * g.OH * g.OW * g.CinG * g.KH * g.KW
    secs = _seconds(be, macs, g)
    if secs <= cancel.CHUNK_SECONDS or g.N * g.OH <= 1:
        return fn(x, w, bias, stride, pads, dilation, groups)
    per_image = secs / g.N
    if per_image <= cancel.CHUNK_SECONDS / 2 or g.OH == 1:  # whole images per chunk
        first = max(1, int(cancel.CHUNK_SECONDS / max(per_image, 1e-12))) * g.OH
    else:  # row bands: the first a quarter of the estimate
        first = max(1, int(g.OH * cancel.CHUNK_SECONDS / per_image) // 4)
    sizer = cancel.Sizer(first)
    KHe = g.dh * (g.KH - 1) + 1

    def band(r0, r1):
        start, stop = r0 * g.sh - g.pt, (r1 - 1) * g.sh - g.pt + KHe
        a, b = max(0, start), min(g.H, stop)
        return a, b, a - start, stop - b

    out = _Out(be, (g.N, g.Cout, g.OH, g.OW))
    done, total_rows = 0, g.N * g.OH
    n, r0 = 0, 0
    cancel.check()
    _sync(be)  # the first chunk's time is its own, not that of the work queued before it
    while n < g.N:
        if done:
            cancel.check()
        t0 = time.perf_counter()
        size = sizer.size
        if r0 == 0 and size >= g.OH:  # whole images
            n1 = min(g.N, n + size // g.OH)
            out.put(fn(_batch(be, x, n, n1), w, bias, stride, pads, dilation, groups), n, n1, 0, g.OH)
            rows, n = (n1 - n) * g.OH, n1
        else:
            r1 = min(g.OH, r0 + size)
            a, b, top, bottom = band(r0, r1)
            xn = x if g.N == 1 else _batch(be, x, n, n + 1)
            if a >= b:  # a band reading only padding (huge strides): the rest of the image at once
                y = fn(xn, w, bias, stride, pads, dilation, groups)
                r1 = g.OH
                out.put(_rows(be, y, r0, r1) if r0 else y, n, n + 1, r0, r1)
            else:
                out.put(fn(_rows(be, xn, a, b), w, bias, stride, (top, bottom, pads[2], pads[3]), dilation, groups),
                        n, n + 1, r0, r1)
            rows, r0 = r1 - r0, r1
            if r0 == g.OH:
                n, r0 = n + 1, 0
        _sync(be)
        sizer.update(rows, time.perf_counter() - t0)
        done += rows
        cancel.progress(done, total_rows)
    return out.result()


def chunked_transpose(be, fn, x, w, bias, stride, padding, output_padding, dilation, groups):
    """conv_transpose2d in batch chunks with cancel.check() between them, sized by wall time
    (``cancel.Sizer``) from a first chunk guessed from the device's caps.macs_per_s."""
    g = conv_transpose2d_geometry(be._shape(x), be._shape(w), stride, padding, output_padding, dilation, groups)
    macs = float(g.N) * g.C * g.H * g.W * g.CoutG * g.KH * g.KW
    secs = _seconds(be, macs, g, transposed=True)
    if secs <= cancel.CHUNK_SECONDS or g.N <= 1:
        return fn(x, w, bias, stride, padding, output_padding, dilation, groups)
    per = max(1, int(g.N * cancel.CHUNK_SECONDS / secs))
    sizer = cancel.Sizer(per)
    outs = []
    n0 = 0
    while n0 < g.N:
        if n0:
            cancel.check()
        n1 = min(g.N, n0 + sizer.size)
        t0 = time.perf_counter()
        outs.append(fn(_batch(be, x, n0, n1), w, bias, stride, padding, output_padding, dilation, groups))
        _sync(be)
        sizer.update(n1 - n0, time.perf_counter() - t0)
        n0 = n1
        cancel.progress(n0, g.N)
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


def _plane_rows(P: int, H: int, a: int, b: int):
    """(plane, r0, r1) pieces of the flat rows [a, b) of P planes of H rows."""
    while a < b:
        p, r = divmod(a, H)
        e = min(b, (p + 1) * H)
        yield p, r, r + e - a
        a = e


#: elements in a chunk of a finiteness check or a transfer (16 MB: then halved while a chunk takes
#: longer than cancel.CHUNK_SECONDS). Never more: a bigger chunk is not faster (a larger download,
#: a larger temporary, is memory touched for the first time: 600 MB in one read took 1.3 s here
#: unloaded, 16 MB pieces of it 0.15 s in all)
CHUNK_ELEMS = 1 << 22


def _finite(be, x) -> bool:
    """No Inf or NaN in x. Checked in row chunks of about cancel.CHUNK_SECONDS with cancel.check()
    between them (a whole 4096x4096 batch in one call was most of a second under load)."""
    s = be._shape(x)
    H, W = s[-2], s[-1]
    P = math.prod(s[:-2])
    if P * H * W == 0:
        return True
    first = max(1, CHUNK_ELEMS // max(1, W))
    if isinstance(x, np.ndarray):  # plane by plane (x may be a strided view: no flattening copy)
        planes = list(np.ndindex(*s[:-2]))
        for a, b in cancel.timed_chunks(P * H, first):
            if not all(bool(np.isfinite(x[planes[p]][r0:r1]).all()) for p, r0, r1 in _plane_rows(P, H, a, b)):
                return False
        return True
    if "all_finite" not in be.caps.fused:
        return False
    f = be._all_finite
    flat = be._reshape(x, (P * H, W))
    return all(f(_batch(be, flat, a, b)) for a, b in cancel.timed_chunks(P * H, first))


def _host_image(be, x, n: int, g, h: np.ndarray | None = None) -> np.ndarray:
    """Image n of x (C, H, W) on the host for the FFT path: a view of a NumPy array, else downloaded
    into ``h`` (reused from image to image; None: a new one) in row chunks with cancel.check()
    between them (the whole batch in one blocking read was seconds under load; counted as one
    download of the image)."""
    if isinstance(x, np.ndarray):
        return x[n]
    C, H, W = g.C, g.H, g.W
    flat = be._reshape(_batch(be, x, n, n + 1), (C * H, W))
    h = np.empty((C * H, W), F32) if h is None else h.reshape(C * H, W)
    for a, b in cancel.timed_chunks(C * H, max(1, CHUNK_ELEMS // max(1, W))):
        h[a:b] = be._to_numpy(_batch(be, flat, a, b))
    be._count("downloads", h.nbytes)
    return h.reshape(C, H, W)


class _DeviceOut:
    """The FFT path's output on a device backend, written image by image from the host in row chunks
    of about cancel.CHUNK_SECONDS with cancel.check() between them (one upload of a whole batch was
    seconds under load). OpenCL arrays are written in place (one output array, no concatenation);
    any other device backend gets one upload per image and a concatenation at the end."""

    def __init__(self, be, shape):
        self.be, self.shape = be, tuple(shape)
        self.cl = "write_rows" in be.caps.fused  # written in place (OpenCL)
        self.out = be._empty(self.shape) if self.cl else None
        self.parts = []

    def put(self, n: int, y: np.ndarray) -> None:
        be = self.be
        y = np.ascontiguousarray(y, F32)
        if not self.cl:  # a copy: the host image is reused for the next one
            self.parts.append(be._from_numpy(np.array(y[None])))
        else:
            rows = y.reshape(-1, y.shape[-1])
            W = rows.shape[1]
            base = n * rows.size
            for a, b in cancel.timed_chunks(rows.shape[0], max(1, CHUNK_ELEMS // max(1, W))):
                be._write_rows(self.out, base + a * W, rows[a:b])
        be._count("uploads", y.nbytes)

    def result(self):
        return self.out if self.cl else _cat(self.be, self.parts, 0)


def _fft_capable(be) -> bool:
    """Whether the host FFT conv pays off on this device (its capability "fft_conv")."""
    return "fft_conv" in be.caps.fused


def conv2d(be, x, w, bias, stride, pads, dilation, groups):
    """The contract's conv2d dispatch (see the module doc)."""
    if be.kind == "vendor":
        return chunked(be, be._conv2d, x, w, bias, stride, pads, dilation, groups)
    g = conv2d_geometry(be._shape(x), be._shape(w), stride, pads, dilation, groups)
    if g.N * g.Cout * g.OH * g.OW == 0 or g.H == 0 or g.W == 0:
        return be._conv2d(x, w, bias, stride, pads, dilation, groups)
    taps = g.KH * g.KW
    sep = g.CinG == 1 and g.KH > 1 and g.KW > 1 and taps >= SEP_MIN_TAPS
    fft = _fft_capable(be) and taps >= be.caps.fft_min_taps and _fft_fits(g)
    if sep or fft:
        cancel.check()
        if be._dtype(x) != "float32":  # a half input ("half_conv"): these paths compute on float32
            x = be._cast(x, "float32")
        wh = _host_weight(be, w)
        if not np.isfinite(wh).all() or not _finite(be, x):  # checked in chunks
            sep = fft = False
        cancel.check()
        if sep:
            fac = rank1_factors(wh.reshape(g.Cout, g.KH, g.KW))
            if fac is not None:
                log.debug("anydevice conv2d: separable path (%dx%d)", g.KH, g.KW)
                return _separable(be, x, fac, bias, g)
        if fft:
            log.debug("anydevice conv2d: FFT path (%dx%d, %d in-channels per group)", g.KH, g.KW, g.CinG)
            return _fft_conv(be, x, wh, bias, g)
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


def _fft_conv(be, x, wh, bias, g):
    """Overlap-save FFT conv2d in float64 (cross-correlation: the kernel is flipped), output row bands.

    The band geometry (Fh) depends on the shapes only, never on timing (the numbers must not depend
    on the load). The work is cut for cancel instead: kernel spectra group by group, an input image
    downloaded in row chunks (device backends), one pool task per group and band with a check
    before each of its stages, the result uploaded image by image in row chunks."""
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
    # flipped kernels, spectra (G, CoutG, CinG, Fh, Fw/2+1), a few groups at a time (each transform
    # is independent: the same numbers as one call)
    Wf = np.empty((g.G, g.CoutG, g.CinG, Fh, Fw // 2 + 1), np.complex128)
    wk = wk.reshape(g.G, g.CoutG, g.CinG, KHe, KWe)
    for g0, g1 in cancel.timed_chunks(g.G, max(1, (1 << 20) // max(1, g.CoutG * g.CinG * Fh * Fw))):
        Wf[g0:g1] = np.fft.rfft2(wk[g0:g1, :, :, ::-1, ::-1], s=(Fh, Fw))
    cancel.check()
    dev = None if isinstance(x, np.ndarray) else _DeviceOut(be, (N, g.Cout, g.OH, g.OW))
    out = np.empty((N if dev is None else 1, g.Cout, g.OH, g.OW), F32)
    col_sl = slice(KWe - 1, KWe - 1 + (g.OW - 1) * g.sw + 1, g.sw)
    nb = -(-g.OH // rows)
    done = 0
    xn = None
    for n in range(N):
        xn = _host_image(be, x, n, g, xn)
        on = out[n if dev is None else 0]
        for r0 in range(0, g.OH, rows):
            cancel.check()
            r1 = min(g.OH, r0 + rows)
            start = r0 * g.sh - g.pt  # first padded input row, in input coordinates
            L = (r1 - 1 - r0) * g.sh + KHe
            a, b = max(0, start), min(H, start + L)

            def task(gi, r0=r0, r1=r1, start=start, a=a, b=b):
                cancel.check()
                c0 = gi * g.CinG
                band = np.zeros((g.CinG, Fh, Fw))
                if a < b:
                    band[:, a - start:b - start, g.pl:g.pl + W] = xn[c0:c0 + g.CinG, a:b]
                cancel.check()
                Xf = np.fft.rfft2(band)
                del band
                cancel.check()
                if g.CinG == 1:
                    Yf = Wf[gi, :, 0] * Xf[0]
                else:
                    Yf = np.einsum("ochw,chw->ohw", Wf[gi], Xf, optimize=True)
                del Xf
                cancel.check()
                y = np.fft.irfft2(Yf, s=(Fh, Fw))
                del Yf
                cancel.check()
                y = y[:, KHe - 1:KHe - 1 + (r1 - 1 - r0) * g.sh + 1:g.sh, col_sl]
                if bh is not None:
                    y = y + bh[gi * g.CoutG:(gi + 1) * g.CoutG, None, None]
                on[gi * g.CoutG:(gi + 1) * g.CoutG, r0:r1] = y

            threads.run_parallel(task, range(g.G))
            done += 1
            cancel.progress(done, N * nb)
        if dev is not None:
            cancel.check()
            dev.put(n, on)
    return out if dev is None else dev.result()
