"""Small convolutions on the host (the digits CNN's 64x1x8x8 and 64x16x8x8 layers, any conv whose
column matrix fits in L2): the forward, the weight gradient and the input gradient each as a handful
of NumPy calls on one thread, channels last, with single-threaded BLAS.

Measured on the 2-core AMD EPYC (digits CNN, 64x16x8x8 -> 32 channels, stride 2): the general paths
hand these to the thread pool and to BLAS's own threads, whose start-up costs more than the work
(forward 650 -> ~200 us, input gradient 730 -> ~330 us, weight gradient 510 -> ~250 us). Layouts:

- forward and weight gradient: the input zero-padded straight into NHWC, its columns gathered as
  (N*OH*OW, KH*KW*C) with the channels innermost (one contiguous run per tap), one GEMM;
- input gradient: columns (KH*KW*C, OH*OW*N) = w^T @ gy, then one strided add per tap into a
  (C, Hp, Wp, N) buffer, so each add moves runs of N contiguous floats.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...system import threads
from ...ops.plans.conv import conv_output_size
from .common import F32, zero_pad

#: convs whose column matrix (N*OH*OW x C*KH*KW per group) holds at most this many floats take
#: this module's paths (1 MB: in L2 with room for the weights and the output)
SMALL_COLS = 1 << 20
#: inputs with fewer channels gather their columns from the NCHW input instead (runs of OW floats
#: rather than of C)
NCHW_MAX_CIN = 4


def takes(xshape, wshape, stride, pads, dilation, groups, *arrays) -> bool:
    """Whether conv2d of an input of ``xshape`` with weights of ``wshape`` (pads (t, b, l, r)) takes
    this module's paths: ``arrays`` all float32, one group, a non-empty output and at most SMALL_COLS
    floats of columns."""
    if groups != 1 or len(xshape) != 4 or min(pads) < 0 or any(a.dtype != F32 for a in arrays):
        return False
    N, C, H, W = xshape
    _, _, KH, KW = wshape
    (sh, sw), (dh, dw), (t, b, l, r) = stride, dilation, pads
    OH, OW = conv_output_size(H, KH, sh, t + b, dh), conv_output_size(W, KW, sw, l + r, dw)
    return OH > 0 and OW > 0 and 0 < N * OH * OW * C * KH * KW <= SMALL_COLS


def _nhwc_padded(x, t: int, b: int, l: int, r: int):
    """x (N, C, H, W) as (N, H+t+b, W+l+r, C) with zeros around: one pass, only the border zeroed."""
    N, C, H, W = x.shape
    xp = np.empty((N, H + t + b, W + l + r, C), F32)
    if t:
        xp[:, :t] = 0.0
    if b:
        xp[:, t + H:] = 0.0
    if l:
        xp[:, t:t + H, :l] = 0.0
    if r:
        xp[:, t:t + H, l + W:] = 0.0
    xp[:, t:t + H, l:l + W] = x.transpose(0, 2, 3, 1)
    return xp


def _columns(xp, KH: int, KW: int, OH: int, OW: int, stride, dilation):
    """(N*OH*OW, KH*KW*C) columns of the padded NHWC input, taps (kh, kw) outer and channels inner."""
    N, _, _, C = xp.shape
    sN, sH, sW, sC = xp.strides
    (sh, sw), (dh, dw) = stride, dilation
    view = as_strided(xp, shape=(N, OH, OW, KH, KW, C),
                      strides=(sN, sh * sH, sw * sW, dh * sH, dw * sW, sC), writeable=False)
    return np.ascontiguousarray(view).reshape(N * OH * OW, KH * KW * C)


def _columns_nchw(x, t: int, b: int, l: int, r: int, KH: int, KW: int, OH: int, OW: int, stride, dilation):
    """(C*KH*KW, N*OH*OW) columns of the zero-padded NCHW input (few channels)."""
    xp = zero_pad(x, t, b, l, r)
    N, C = xp.shape[:2]
    sN, sC, sH, sW = xp.strides
    (sh, sw), (dh, dw) = stride, dilation
    view = as_strided(xp, shape=(C, KH, KW, N, OH, OW),
                      strides=(sC, dh * sH, dw * sW, sN, sh * sH, sw * sW), writeable=False)
    return np.ascontiguousarray(view).reshape(C * KH * KW, N * OH * OW)


def conv2d(x, w, bias, stride, pads, dilation):
    """conv2d of float32 x (N, C, H, W) with w (Cout, C, KH, KW), one group; pads (t, b, l, r)."""
    N, C, H, W = x.shape
    Cout, _, KH, KW = w.shape
    (sh, sw), (dh, dw), (t, b, l, r) = stride, dilation, pads
    OH, OW = conv_output_size(H, KH, sh, t + b, dh), conv_output_size(W, KW, sw, l + r, dw)
    if C < NCHW_MAX_CIN:
        cols = _columns_nchw(x, t, b, l, r, KH, KW, OH, OW, stride, dilation)
        with threads.single_threaded_blas():
            res = w.reshape(Cout, C * KH * KW) @ cols
        if bias is not None:
            res += bias[:, None]
        return np.ascontiguousarray(res.reshape(Cout, N, OH, OW).transpose(1, 0, 2, 3))
    cols = _columns(_nhwc_padded(x, t, b, l, r), KH, KW, OH, OW, stride, dilation)
    wk = w.transpose(2, 3, 1, 0).reshape(KH * KW * C, Cout)
    with threads.single_threaded_blas():
        res = cols @ wk
    if bias is not None:
        res += bias
    return np.ascontiguousarray(res.reshape(N, OH, OW, Cout).transpose(0, 3, 1, 2))


def weight_grad(x, gy, wshape, stride, pads, dilation):
    """dL/dw (Cout, C, KH, KW) of conv2d(x, w) for its output gradient gy (N, Cout, OH, OW)."""
    N, C, H, W = x.shape
    Cout, _, KH, KW = wshape
    _, _, OH, OW = gy.shape
    (sh, sw), (dh, dw), (t, _, l, _) = stride, dilation, pads
    # zero padding only where the taps read
    b2 = max(0, (KH - 1) * dh + (OH - 1) * sh + 1 - H - t)
    r2 = max(0, (KW - 1) * dw + (OW - 1) * sw + 1 - W - l)
    g = gy.transpose(1, 0, 2, 3).reshape(Cout, N * OH * OW)
    if C < NCHW_MAX_CIN:
        cols = _columns_nchw(x, t, b2, l, r2, KH, KW, OH, OW, stride, dilation)
        with threads.single_threaded_blas():
            return (g @ cols.T).reshape(Cout, C, KH, KW)
    cols = _columns(_nhwc_padded(x, t, b2, l, r2), KH, KW, OH, OW, stride, dilation)
    with threads.single_threaded_blas():
        gw = g @ cols
    return np.ascontiguousarray(gw.reshape(Cout, KH, KW, C).transpose(0, 3, 1, 2))


def input_grad(gy, w, in_hw, stride, pads, dilation):
    """dL/dx (N, C, H, W) of conv2d(x, w) for its output gradient gy (N, Cout, OH, OW)."""
    N, Cout, OH, OW = gy.shape
    _, C, KH, KW = w.shape
    H, W = in_hw
    (sh, sw), (dh, dw), (t, _, l, _) = stride, dilation, pads
    Hp = max((OH - 1) * sh + dh * (KH - 1) + 1, t + H)
    Wp = max((OW - 1) * sw + dw * (KW - 1) + 1, l + W)
    g = gy.transpose(1, 2, 3, 0).reshape(Cout, OH * OW * N)
    wt = w.transpose(2, 3, 1, 0).reshape(KH * KW * C, Cout)
    with threads.single_threaded_blas():
        cols = (wt @ g).reshape(KH, KW, C, OH, OW, N)
    gxp = np.zeros((C, Hp, Wp, N), F32)
    for kh in range(KH):
        for kw in range(KW):
            gxp[:, kh * dh:kh * dh + (OH - 1) * sh + 1:sh, kw * dw:kw * dw + (OW - 1) * sw + 1:sw] += cols[kh, kw]
    return np.ascontiguousarray(gxp[:, t:t + H, l:l + W].transpose(3, 0, 1, 2))
