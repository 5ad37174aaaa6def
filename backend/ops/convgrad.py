"""Gradients of the convolutions and of pad, shared by every backend (autograd/rules_conv.py).

All helpers take and return the backend's native arrays and call its primitives (``_conv2d``,
``_conv_transpose2d``, ``_window2d``, ``_permute``...), so the backward of a conv stays on the
device and runs the backend's own fast conv paths (Winograd, im2col + packed GEMM, BLAS).

conv2d, y = conv(x_padded, w) with stride s, dilation d, groups G:

* weight gradient: gW[co, ci, kh, kw] = sum over n, oh, ow of gy[n, co, oh, ow] *
  x_padded[n, ci, oh*s + kh*d, ow*s + kw*d]. That is itself a grouped conv: input x with its
  batch and channels swapped (Cin/G, G*N, H, W), "kernel" gy swapped the same way (Cout, N, OH, OW),
  stride d, dilation s, groups G -> (Cin/G, Cout, KH, KW). It goes straight to the backend's
  ``_conv2d`` primitive (im2col + one GEMM whose reduction runs over N*OH*OW), never through the
  big-kernel dispatch (bigconv: a 64x64 "kernel" here must not take the FFT path). A backend may
  provide ``_conv2d_weight_grad(x, gy, wshape, stride, pads, dilation, groups)`` instead (its
  fused kernel "conv_weight_grad", devices/interface.py).
* input gradient: conv_transpose2d of gy (its padding and output_padding chosen to land on the
  input's rows), cropped / zero-padded where the padding is asymmetric. A backend may provide
  ``_conv2d_input_grad(gy, w, (H, W), stride, pads, dilation, groups)`` ("conv_input_grad"): NumPy's
  (stride 1) runs per-tap GEMMs on shifted views of the padded gy; the OpenCL CPU family's (stride 1)
  is a conv2d of gy with the flipped weight on its forward paths, 2x faster there than the transposed
  direct kernel since those paths were sped up (8.0 vs 16.6 ms on 16x32x64x64).
* bias gradient: gy summed over (N, H, W).
"""
from __future__ import annotations

import numpy as np

from . import bigconv


def _shape(be, x):
    return tuple(int(v) for v in be._shape(x))


# ---- conv2d -------------------------------------------------------------------------------------
def conv2d_weight_grad(be, x, gy, wshape, stride, pads, dilation, groups):
    """gW (Cout, Cin/G, KH, KW) of conv2d(x, w, stride, pads (t, b, l, r) of zeros, dilation, groups)
    for the output gradient gy (N, Cout, OH, OW). x (N, Cin, H, W) is the unpadded input."""
    own = be._conv2d_weight_grad if "conv_weight_grad" in be.caps.fused else None
    if own is None and be.kind == "vendor":
        own = _torch_weight_grad(be)
    if own is not None:
        r = own(x, gy, tuple(wshape), tuple(stride), tuple(pads), tuple(dilation), groups)
        if r is not None:
            return r
    N, C, H, W = _shape(be, x)
    Cout, Cing, KH, KW = (int(v) for v in wshape)
    _, _, OH, OW = _shape(be, gy)
    G = groups
    if N == 0 or OH == 0 or OW == 0:
        return be.to_device(np.zeros((Cout, Cing, KH, KW), np.float32), "conv2d", "weight", constant=True)
    (sh, sw), (dh, dw) = stride, dilation
    t, b, l, r = pads
    # pad only what the taps read: rows up to (KH-1)*dh + (OH-1)*sh of the padded input
    need_h, need_w = (KH - 1) * dh + (OH - 1) * sh + 1, (KW - 1) * dw + (OW - 1) * sw + 1
    b2, r2 = need_h - H - t, need_w - W - l
    if b2 < 0 or r2 < 0:  # the conv never reads the last rows / columns of x: leave them out
        x = be._slice(x, 2, 0, H + min(b2, 0), 1) if b2 < 0 else x
        x = be._slice(x, 3, 0, W + min(r2, 0), 1) if r2 < 0 else x
        H, W = H + min(b2, 0), W + min(r2, 0)
        b2, r2 = max(b2, 0), max(r2, 0)
    xt = be._reshape(be._permute(be._reshape(x, (N, G, Cing, H, W)), (2, 1, 0, 3, 4)), (Cing, G * N, H, W))
    gt = be._permute(gy, (1, 0, 2, 3))  # (Cout, N, OH, OW)
    res = be._conv2d(xt, gt, None, (dh, dw), (t, b2, l, r2), (sh, sw), G)  # (Cing, Cout, KH, KW)
    return be._permute(res, (1, 0, 2, 3))


def _torch_weight_grad(be):
    """The PyTorch backends: torch's own conv weight gradient (aten.convolution_backward, the kernel
    torch's autograd runs; 16x faster than the swapped conv on a 3-channel input here), in the
    backend's precision context. None where the arrays are not torch tensors."""
    def fn(x, gy, wshape, stride, pads, dilation, groups):
        import torch
        if not (isinstance(x, torch.Tensor) and isinstance(gy, torch.Tensor)):
            return None
        t, b, l, r = pads
        (H, W), (OH, OW), (KH, KW) = x.shape[2:], gy.shape[2:], wshape[2:]
        if ((H + t + b - dilation[0] * (KH - 1) - 1) // stride[0] + 1,
                (W + l + r - dilation[1] * (KW - 1) - 1) // stride[1] + 1) != (OH, OW):
            return None  # gy covers fewer outputs than x gives (conv_transpose2d's output_padding)
        if t != b or l != r:
            x = torch.nn.functional.pad(x, (l, r, t, b))
            t = l = 0
        w = torch.zeros(wshape, dtype=x.dtype, device=x.device)  # only its shape is used
        with be._precision(), torch.no_grad():
            return torch.ops.aten.convolution_backward(
                gy, x, w, None, list(stride), [t, l], list(dilation), False, [0, 0], groups,
                [False, True, False])[1]
    return fn


def conv2d_input_grad(be, gy, w, in_hw, stride, pads, dilation, groups):
    """gx (N, Cin, H, W) of conv2d(x, w, stride, pads (t, b, l, r) of zeros, dilation, groups): the
    gradient of the (zero-)padded input cropped to x; in_hw = (H, W) of x."""
    N, Cout, OH, OW = _shape(be, gy)
    _, Cing, KH, KW = _shape(be, w)
    H, W = in_hw
    (sh, sw), (dh, dw) = stride, dilation
    t, b, l, r = pads
    eh, ew = dh * (KH - 1), dw * (KW - 1)
    if N == 0:
        return be.to_device(np.zeros((0, Cing * groups, H, W), np.float32), "conv2d", "input", constant=True)
    own = be._conv2d_input_grad if "conv_input_grad" in be.caps.fused else None
    if own is not None:
        gx = own(gy, w, (H, W), (sh, sw), tuple(pads), (dh, dw), groups)
        if gx is not None:
            return gx
    # conv_transpose2d with padding p = min(t, b) (its output starts at padded row p) and an
    # output_padding that reaches row t + H where the stride allows it; the rest is cropped / padded
    ph, pw = min(t, b), min(l, r)
    full_h, full_w = (OH - 1) * sh + eh + 1, (OW - 1) * sw + ew + 1
    # padded rows [ph, full_h - ph + oph) come out; rows [t, t + H) are wanted
    want_h, want_w = t + H - (full_h - ph), l + W - (full_w - pw)
    oph = want_h if 0 <= want_h < max(sh, dh) else 0
    opw = want_w if 0 <= want_w < max(sw, dw) else 0
    if full_h - 2 * ph + oph < 1 or full_w - 2 * pw + opw < 1:  # padding eats everything: crop afterwards
        ph = pw = oph = opw = 0
    gx = bigconv.chunked_transpose(be, be._conv_transpose2d, gy, w, None, (sh, sw), (ph, pw), (oph, opw),
                                   (dh, dw), groups)
    top, left = t - ph, l - pw
    bot, right = (full_h - 2 * ph + oph) - top - H, (full_w - 2 * pw + opw) - left - W
    if top or left or bot or right:  # crop (positive) or zero-pad (negative) to (H, W)
        gx = be._pad_crop(gx, (-top, -bot, -left, -right), "zeros")
    return gx


def bias_grad(be, gy):
    return be._reduce("sum", gy, (0, 2, 3), False)


# ---- conv_transpose2d ---------------------------------------------------------------------------
def conv_transpose2d_input_grad(be, gy, w, in_hw, stride, padding, dilation, groups):
    """gx of conv_transpose2d(x, w, ...): conv2d(gy, w, stride, padding, dilation, groups), whose
    output may have one extra row / column (output_padding >= stride) that is cut off."""
    ph, pw = padding
    gx = bigconv.conv2d(be, gy, w, None, tuple(stride), (ph, ph, pw, pw), tuple(dilation), groups)
    H, W = in_hw
    gh, gw = _shape(be, gx)[2:]
    if (gh, gw) != (H, W):
        gx = be._pad_crop(gx, (0, H - gh, 0, W - gw), "zeros")
    return gx


def conv_transpose2d_weight_grad(be, x, gy, wshape, stride, padding, dilation, groups):
    """gW (Cin, Cout/G, KH, KW) of conv_transpose2d(x, w): the weight gradient of the conv2d that is
    its adjoint (input gy, output gradient x)."""
    ph, pw = padding
    return conv2d_weight_grad(be, gy, x, wshape, stride, (ph, ph, pw, pw), dilation, groups)


# ---- pad ----------------------------------------------------------------------------------------
def _pad_sources(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    """For each output index of pad along one dim (``_pad_crop``'s order of padding and cropping),
    the input index it copies, -1 for a zero."""
    idx = np.arange(n)
    np_mode = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    plo, phi, clo, chi = max(lo, 0), max(hi, 0), max(-lo, 0), max(-hi, 0)

    def padded(a):
        if not (plo or phi):
            return a
        if np_mode == "constant":
            return np.pad(a, (plo, phi), mode="constant", constant_values=-1)
        return np.pad(a, (plo, phi), mode=np_mode)

    if mode in ("zeros", "circular"):  # crop first, then pad
        return padded(idx[clo:n - chi])
    out = padded(idx)
    return out[clo:len(out) - chi]


def _transpose_table(src: np.ndarray, n: int):
    """(idx (n, T) int32, wgt (n, T) float32): for each input index, the output indices that copy
    it (-1 pads a row), for _window2d's "sum" mode."""
    lists = [[] for _ in range(n)]
    for o, s in enumerate(src.tolist()):
        if s >= 0:
            lists[s].append(o)
    T = max(1, max((len(v) for v in lists), default=1))
    idx = np.full((n, T), -1, np.int32)
    for i, v in enumerate(lists):
        idx[i, :len(v)] = v
    return idx, (idx >= 0).astype(np.float32)


def pad_backward(be, g, in_shape, pads, mode):
    """Gradient of ``_pad_crop(x, pads (t, b, l, r), mode)`` (x of ``in_shape``, any leading dims) for
    the output gradient g: zeros mode crops / zero-pads back; reflect, replicate and circular fold
    every copy back onto the element it copied (one _window2d "sum" pass through index tables)."""
    t, b, l, r = pads
    H, W = in_shape[-2:]
    if mode == "zeros":
        return be._pad_crop(g, (-t, -b, -l, -r), "zeros")
    rows = _transpose_table(_pad_sources(H, t, b, mode), H)
    cols = _transpose_table(_pad_sources(W, l, r, mode), W)
    return be._window2d(g, "sum", rows, cols)

