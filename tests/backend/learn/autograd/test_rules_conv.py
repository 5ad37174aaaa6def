"""Backward rules of conv2d, conv_transpose2d, linear, matmul and pad (issue 13), on every backend:
each case through tests/support/grad_check.py's check_grad (float64 torch autograd reference, normwise
relative error <= 1e-5 for the output and every input gradient)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend.learn import autograd as ag
from grad_check import check_grad


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


def _torch_conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """nn.Conv2d's padding_mode on top of F.conv2d (as torch's Conv2d does it)."""
    if padding_mode == "zeros":
        return TF.conv2d(input, weight, bias, stride, padding, dilation, groups)
    kh, kw = weight.shape[-2:]
    if padding == "same":
        dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
        th, tw = dh * (kh - 1), dw * (kw - 1)
        pads = [tw // 2, tw - tw // 2, th // 2, th - th // 2]
    elif padding == "valid":
        pads = [0, 0, 0, 0]
    else:
        ph, pw = (padding, padding) if isinstance(padding, int) else padding
        pads = [pw, pw, ph, ph]
    return TF.conv2d(TF.pad(input, pads, mode=padding_mode), weight, bias, stride, 0, dilation, groups)


# (input shape, weight shape, bias?, options)
CONV_CASES = [
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 1}),
    ((2, 3, 7, 8), (4, 3, 3, 3), False, {"padding": 1, "stride": 2}),
    ((1, 2, 9, 9), (3, 2, 3, 3), True, {"stride": 3}),
    ((2, 3, 8, 7), (4, 3, 3, 2), True, {"stride": (2, 1), "padding": (1, 0)}),
    ((2, 3, 10, 9), (2, 3, 3, 3), True, {"dilation": 2}),
    ((2, 3, 10, 9), (2, 3, 3, 3), True, {"dilation": (2, 1), "padding": (2, 1)}),
    ((2, 3, 11, 10), (2, 3, 3, 3), False, {"dilation": 2, "stride": 2, "padding": 1}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": "same"}),
    ((2, 3, 7, 8), (4, 3, 4, 4), True, {"padding": "same"}),
    ((2, 3, 9, 8), (4, 3, 2, 3), True, {"padding": "same", "dilation": 2}),
    ((2, 3, 9, 8), (4, 3, 2, 3), True, {"padding": "same", "dilation": (1, 3)}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": "valid"}),
    ((2, 4, 6, 7), (6, 2, 3, 3), True, {"groups": 2, "padding": 1}),
    ((2, 6, 6, 7), (3, 2, 3, 3), True, {"groups": 3, "stride": 2}),
    ((2, 4, 7, 7), (4, 1, 3, 3), True, {"groups": 4, "padding": 1}),               # depthwise
    ((2, 4, 7, 7), (8, 1, 3, 3), True, {"groups": 4, "padding": 1, "stride": 2}),  # depthwise x2
    ((2, 4, 9, 9), (4, 1, 5, 5), False, {"groups": 4, "padding": "same"}),
    ((2, 4, 9, 8), (4, 1, 3, 3), True, {"groups": 4, "padding": 1, "stride": 2}),   # depthwise strided
    ((2, 4, 9, 8), (4, 1, 3, 2), True, {"groups": 4, "padding": (2, 0), "dilation": 2}),
    ((2, 4, 9, 8), (4, 1, 2, 2), True, {"groups": 4}),                             # x rows never read
    ((2, 3, 6, 6), (5, 3, 1, 1), True, {}),                                       # 1x1
    ((2, 3, 6, 6), (5, 3, 1, 1), True, {"stride": 2}),
    ((2, 3, 5, 6), (4, 3, 5, 6), True, {}),                                       # kernel = image
    ((2, 3, 5, 6), (4, 3, 3, 3), True, {"padding": 3}),                           # padding > kernel
    ((2, 3, 5, 6), (4, 3, 2, 2), True, {"padding": (3, 2), "stride": 2}),
    ((2, 3, 8, 8), (4, 3, 1, 5), True, {"padding": (0, 2)}),
    ((2, 3, 8, 8), (4, 3, 5, 1), True, {"padding": (2, 0), "stride": (1, 2)}),
    ((3, 7, 8), (4, 3, 3, 3), True, {"padding": 1}),                              # unbatched
    ((3, 7, 8), (4, 3, 3, 3), True, {"padding": 1, "stride": 2, "padding_mode": "reflect"}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 1, "padding_mode": "reflect"}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 2, "padding_mode": "reflect"}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": (1, 2), "padding_mode": "replicate"}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 3, "padding_mode": "replicate", "stride": 2}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 1, "padding_mode": "circular"}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": (2, 3), "padding_mode": "circular"}),
    ((2, 3, 4, 4), (4, 3, 3, 3), True, {"padding": 4, "padding_mode": "circular"}),   # pad = size
    ((2, 4, 7, 8), (4, 2, 3, 3), True, {"padding": "same", "padding_mode": "reflect", "groups": 2}),
    ((2, 3, 9, 8), (4, 3, 2, 3), True, {"padding": "same", "padding_mode": "circular", "dilation": 2}),
    ((2, 4, 7, 7), (4, 1, 3, 3), True, {"padding": 1, "padding_mode": "replicate", "groups": 4}),
    ((2, 3, 7, 8), (4, 3, 3, 3), True, {"padding": 1, "padding_mode": "reflect", "dilation": 2}),
    ((1, 1, 5, 5), (1, 1, 3, 3), True, {"padding": 1}),
    ((4, 8, 12, 12), (8, 8, 3, 3), True, {"padding": 1}),                          # Winograd-sized
    ((3, 32, 6, 6), (32, 32, 3, 3), True, {"padding": 1}),
    ((2, 16, 5, 5), (32, 16, 3, 3), True, {"padding": 1}),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("xs,ws,has_bias,opts", CONV_CASES,
                         ids=[f"{i}-{'x'.join(map(str, c[0]))}-{c[3]}" for i, c in enumerate(CONV_CASES)])
def test_conv2d_grad(backend_target, xs, ws, has_bias, opts):
    tensors = {"input": _rand(1, *xs), "weight": _rand(2, *ws) * 0.5}
    if has_bias:
        tensors["bias"] = _rand(3, ws[0])
    check_grad(backend_target, "conv2d", tensors, _torch_conv2d, opts)


def test_conv2d_grad_of_one_input(backend_target):
    """Only the weight needs a gradient (a first layer's data input), then only the input."""
    x, w = _rand(1, 2, 3, 6, 7), _rand(2, 4, 3, 3, 3)
    check_grad(backend_target, "conv2d", {"input": x, "weight": w}, TF.conv2d, {"padding": 1}, wrt=["weight"])
    check_grad(backend_target, "conv2d", {"input": x, "weight": w}, TF.conv2d, {"stride": 2}, wrt=["input"])


# (input shape, weight shape, bias?, options)
TRANSPOSE_CASES = [
    ((2, 4, 5, 6), (4, 3, 3, 3), True, {}),
    ((2, 4, 5, 6), (4, 3, 3, 3), True, {"stride": 2, "padding": 1}),
    ((2, 4, 5, 6), (4, 3, 3, 3), True, {"stride": 2, "padding": 1, "output_padding": 1}),
    ((2, 4, 5, 4), (4, 2, 4, 4), False, {"stride": (2, 3), "padding": (1, 0), "output_padding": (0, 2)}),
    ((2, 4, 5, 6), (4, 3, 3, 3), True, {"dilation": 2, "padding": 2}),
    ((2, 4, 5, 6), (4, 3, 3, 2), True, {"stride": 2, "dilation": (2, 3), "output_padding": 1}),
    ((2, 4, 5, 6), (4, 2, 3, 3), True, {"groups": 2, "stride": 2, "padding": 1}),
    ((2, 4, 5, 6), (4, 1, 3, 3), True, {"groups": 4, "padding": 1}),
    ((4, 5, 6), (4, 3, 3, 3), True, {"stride": 2}),                                 # unbatched
    ((2, 3, 4, 4), (3, 5, 1, 1), True, {"stride": 2, "output_padding": 1}),
    ((2, 3, 4, 4), (3, 2, 2, 2), True, {"stride": 1, "dilation": 3, "output_padding": 2}),  # op >= stride
]


@pytest.mark.parametrize("xs,ws,has_bias,opts", TRANSPOSE_CASES,
                         ids=[f"{i}-{c[3]}" for i, c in enumerate(TRANSPOSE_CASES)])
def test_conv_transpose2d_grad(backend_target, xs, ws, has_bias, opts):
    tensors = {"input": _rand(1, *xs), "weight": _rand(2, *ws) * 0.5}
    if has_bias:
        tensors["bias"] = _rand(3, ws[1] * opts.get("groups", 1))
    check_grad(backend_target, "conv_transpose2d", tensors, TF.conv_transpose2d, opts)


MATMUL_CASES = [
    ((3, 4), (4, 5)),
    ((4,), (4,)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),            # b shared by the batch
    ((3, 4), (2, 4, 5)),            # a shared by the batch
    ((2, 1, 3, 4), (5, 4, 2)),      # broadcast batch dims on both sides
    ((1, 3, 4), (2, 3, 4, 5)),
    ((2, 3, 1, 3, 4), (3, 2, 4, 2)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_CASES, ids=[f"{a}@{b}" for a, b in MATMUL_CASES])
def test_matmul_grad(backend_target, sa, sb):
    check_grad(backend_target, "matmul", {"input": _rand(1, *sa), "other": _rand(2, *sb)}, torch.matmul)


LINEAR_CASES = [
    ((5, 4), (3, 4), (3,)),
    ((2, 5, 4), (3, 4), (3,)),
    ((4,), (3, 4), (3,)),
    ((2, 5, 4), (3, 4), None),
    ((5, 4), (4,), None),           # vector weight: y = x @ w
    ((2, 5, 4), (4,), (1,)),
    ((4,), (4,), None),
    ((5, 4), (3, 4), ()),           # 0-d bias
]


@pytest.mark.parametrize("sx,sw,sb", LINEAR_CASES, ids=[f"{x}-{w}-{b}" for x, w, b in LINEAR_CASES])
def test_linear_grad(backend_target, sx, sw, sb):
    tensors = {"input": _rand(1, *sx), "weight": _rand(2, *sw)}
    if sb is not None:
        tensors["bias"] = _rand(3, *sb)
    check_grad(backend_target, "linear", tensors, _torch_linear)


def _torch_linear(input, weight, bias=None):
    if weight.dim() == 1:  # torch's F.linear refuses a bias with a vector weight; the contract has it
        y = torch.matmul(input, weight)
        return y if bias is None else y + bias
    return TF.linear(input, weight, bias)


PADS = [(1, 2), (1, 2, 2, 1), (0, 3, 4, 0), (-1, 2, 2, -2), (-2, -1, 0, -1), (2, -1, -1, 3)]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pad", PADS, ids=[str(p) for p in PADS])
def test_pad_grad(backend_target, mode, pad):
    for shape in ((2, 3, 5, 6), (6, 7), (3, 1, 6, 5)):
        check_grad(backend_target, "pad", {"input": _rand(1, *shape)}, _torch_pad, {"pad": pad, "mode": mode})


def _torch_pad(input, pad, mode):
    """F.pad on the last two dims of any input (torch's reflect / replicate / circular want a
    batched 4-D input for a 2-D pad)."""
    pad = tuple(pad) + (0, 0) * (len(pad) == 2)
    lead, (h, w) = input.shape[:-2], input.shape[-2:]
    y = TF.pad(input.reshape(-1, 1, h, w), pad, mode=mode)
    return y.reshape(lead + y.shape[-2:])


def test_pad_grad_large_replicate(backend_target):
    """replicate: an edge pixel receives every copy (pad + 1 of them) along both dims."""
    check_grad(backend_target, "pad", {"input": _rand(1, 2, 3, 4)}, _torch_pad, {"pad": (5, 6, 7, 4), "mode": "replicate"})


def test_conv_chain_matches_torch(backend_target):
    """A small CNN (conv -> relu -> conv -> mean) end to end, both weights' gradients."""
    be = backend_target
    x = _rand(1, 2, 3, 8, 8).astype(np.float32)
    w1 = (_rand(2, 4, 3, 3, 3) * 0.3).astype(np.float32)
    w2 = (_rand(3, 2, 4, 3, 3) * 0.3).astype(np.float32)
    W1, W2 = ag.Var(be, w1, requires_grad=True), ag.Var(be, w2, requires_grad=True)
    h = ag.F.relu(ag.F.conv2d(ag.Var(be, x), W1, None, padding=1, padding_mode="reflect"))
    loss = ag.F.mean(ag.F.conv2d(h, W2, None, stride=2, padding=1))
    loss.backward()
    t1 = torch.tensor(w1.astype(np.float64), requires_grad=True)
    t2 = torch.tensor(w2.astype(np.float64), requires_grad=True)
    th = torch.relu(TF.conv2d(TF.pad(torch.tensor(x, dtype=torch.float64), [1, 1, 1, 1], mode="reflect"), t1))
    TF.conv2d(th, t2, stride=2, padding=1).mean().backward()
    np.testing.assert_allclose(be.to_numpy(W1.grad), t1.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(be.to_numpy(W2.grad), t2.grad.numpy(), rtol=1e-4, atol=1e-6)


PATH_CASES = [
    ((2, 16, 6, 7), (5, 16, 3, 3), {"padding": 1}),
    ((2, 40, 5, 6), (6, 40, 3, 2), {"padding": (1, 2), "dilation": (2, 1)}),    # two 32-channel tiles
    ((3, 32, 6, 5), (8, 16, 3, 3), {"padding": "same", "groups": 2}),
    ((2, 16, 7, 6), (4, 16, 4, 4), {"padding": "same"}),                       # asymmetric padding
    ((2, 16, 7, 6), (4, 16, 2, 3), {"padding": 0, "dilation": 2}),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("xs,ws,opts", PATH_CASES, ids=[str(i) for i in range(len(PATH_CASES))])
def test_conv2d_grad_shifted_paths(backend_target, monkeypatch, xs, ws, opts):
    """The stride-1 weight / input gradient paths that the size thresholds keep for large convs
    (OpenCL: packed x shifted per tap; NumPy: shifted views, several position steps per thread)
    forced on small ones."""
    from anydevice.backend.devices.numpy import gradients as numpy_backend
    monkeypatch.setattr(numpy_backend, "WGRAD_STEP", 7)
    monkeypatch.setattr(numpy_backend, "WGRAD_SHIFT_MIN_CIN", 1)
    try:
        from anydevice.backend.devices.opencl import wgrad as ocl
        monkeypatch.setattr(ocl, "WGRAD_SHIFT_MIN_COLS", 0)
        monkeypatch.setattr(ocl, "WGRAD_SHIFT_MIN_CIN", 1)
        monkeypatch.setattr(ocl, "WGRAD_SHIFT_BYTES", 1)  # one image per step
    except ImportError:  # no pyopencl here
        pass
    tensors = {"input": _rand(1, *xs), "weight": _rand(2, *ws) * 0.5, "bias": _rand(3, ws[0])}
    check_grad(backend_target, "conv2d", tensors, _torch_conv2d, opts)


def test_huge_geometry_backward_is_refused(backend_target):
    """The forward takes strides past 32-bit indexing (plans.conv_reach); its backward is refused
    with an error naming the argument, not a huge allocation."""
    from anydevice.backend import AnyDeviceError
    be = backend_target
    W = ag.Var(be, np.ones((1, 1, 1, 1), np.float32), requires_grad=True)
    y = ag.F.conv2d(ag.Var(be, np.ones((1, 1, 3, 3), np.float32)), W, None, stride=2**40)
    with pytest.raises(AnyDeviceError, match="stride"):
        ag.F.sum(y).backward()
