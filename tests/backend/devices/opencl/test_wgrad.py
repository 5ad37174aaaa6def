"""The CPU family's conv2d gradients (backend/devices/opencl/wgrad.py): the input gradient for stride 1,
ungrouped, a conv2d of the output gradient with the flipped, channel-swapped weight, on the forward
conv's paths, strided and ungrouped one GEMM and a col2im gather; grouped ones decline (None: the shared
conv_transpose2d path). The weight gradient of small images summed over the batch in each product.
Against torch autograd in float64."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")

#: (N, Cin, Cout, H, W, kernel, pads (t, b, l, r), dilation)
CASES = [(2, 32, 32, 64, 64, 3, (1, 1, 1, 1), 1),   # the training denoiser's convs (direct path)
         (1, 3, 16, 20, 30, 3, (1, 1, 1, 1), 1),    # a 3-channel gradient
         (1, 8, 8, 30, 40, 5, (2, 2, 2, 2), 1),     # 5x5
         (1, 8, 8, 33, 40, 3, (2, 2, 2, 2), 2),     # dilation 2
         (1, 16, 24, 20, 24, 3, (0, 0, 0, 0), 1),   # no padding: the gradient conv pads 2
         (2, 5, 7, 9, 13, 3, (1, 0, 0, 1), 1),      # asymmetric padding
         (1, 4, 4, 12, 50, 1, (0, 0, 0, 0), 1),     # 1x1
         (1, 70, 66, 10, 12, 3, (1, 1, 1, 1), 1),   # past DIRECT_MAX_K: the im2col GEMM
         (2, 64, 64, 12, 140, 3, (1, 1, 1, 1), 1)]  # Winograd


@pytest.mark.parametrize("N,C,O,H,W,k,pads,d", CASES)
def test_input_grad_equals_torch_autograd(N, C, O, H, W, k, pads, d, monkeypatch):
    rng = np.random.default_rng(N + C + O + H + W + k)
    x = torch.from_numpy(rng.standard_normal((N, C, H, W)).astype(np.float32)).double().requires_grad_()
    w32 = (rng.standard_normal((O, C, k, k)) / np.sqrt(C * k * k)).astype(np.float32)
    t, b, l, r = pads
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (l, r, t, b)), torch.from_numpy(w32).double(), dilation=d)
    gy32 = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.from_numpy(gy32).double())
    wd = BE.to_device(w32)
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **kw: (launched.append(name), run(name, *a, **kw))[1])
    gx = BE._conv2d_input_grad(BE.to_device(gy32), wd, (H, W), (1, 1), pads, (d, d), 1)
    monkeypatch.setattr(BE, "_run", run)
    assert "conv_t2d_direct" not in launched, launched
    got = torch.as_tensor(np.asarray(BE.to_numpy(gx))).double()
    assert tuple(got.shape) == (N, C, H, W)
    assert float((got - x.grad).norm() / x.grad.norm()) <= 1e-6
    np.testing.assert_array_equal(np.asarray(BE.to_numpy(wd)), w32)  # the weight is not changed


#: (N, Cin, Cout, H, W, kernel, stride, pads (t, b, l, r), dilation): strided, one group
STRIDED = [(64, 16, 32, 8, 8, 3, (2, 2), (1, 1, 1, 1), 1),   # the digits CNN's stride-2 conv
           (2, 3, 5, 11, 9, 3, (2, 3), (1, 0, 2, 1), 1),     # uneven strides and padding
           (3, 4, 6, 13, 12, 4, (2, 2), (1, 1, 1, 1), 1),    # an even kernel
           (2, 5, 4, 15, 14, 3, (3, 2), (2, 2, 1, 1), 2),    # dilation
           (1, 8, 8, 9, 10, 1, (2, 2), (0, 0, 0, 0), 1)]     # 1x1: the inputs no tap reaches get 0


@pytest.mark.parametrize("N,C,O,H,W,k,s,pads,d", STRIDED)
def test_strided_input_grad_is_one_gemm_and_a_gather(N, C, O, H, W, k, s, pads, d, monkeypatch):
    rng = np.random.default_rng(N + C + O + H + W + k)
    x = torch.from_numpy(rng.standard_normal((N, C, H, W)).astype(np.float32)).double().requires_grad_()
    w32 = rng.standard_normal((O, C, k, k)).astype(np.float32)
    t, b, l, r = pads
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (l, r, t, b)), torch.from_numpy(w32).double(),
                                   stride=s, dilation=d)
    gy32 = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.from_numpy(gy32).double())
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **kw: (launched.append(name), run(name, *a, **kw))[1])
    gx = BE._conv2d_input_grad(BE.to_device(gy32), BE.to_device(w32), (H, W), s, pads, (d, d), 1)
    monkeypatch.setattr(BE, "_run", run)
    assert "col2im_gather" in launched and "conv_t2d_direct" not in launched, launched
    got = torch.as_tensor(np.asarray(BE.to_numpy(gx))).double()
    assert tuple(got.shape) == (N, C, H, W)
    assert float((got - x.grad).norm() / x.grad.norm()) <= 1e-6


def test_strided_input_grad_keeps_an_inf_weight_where_torch_does():
    """An Inf weight reaches exactly the inputs its tap reaches (torch scatters the products)."""
    w32 = np.ones((2, 2, 3, 3), np.float32)
    w32[0, 1, 0, 0] = np.inf
    gy32 = np.ones((1, 2, 3, 3), np.float32)
    ref = torch.nn.grad.conv2d_input((1, 2, 6, 6), torch.from_numpy(w32), torch.from_numpy(gy32), stride=2,
                                     padding=1).numpy()
    got = np.asarray(BE.to_numpy(BE._conv2d_input_grad(BE.to_device(gy32), BE.to_device(w32), (6, 6), (2, 2),
                                                       (1, 1, 1, 1), (1, 1), 1)))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-6)


@pytest.mark.parametrize("stride,groups", [((1, 1), 2), ((2, 2), 2)])
def test_other_geometries_take_the_shared_path(stride, groups):
    gy = BE.to_device(np.ones((1, 4, 5, 5), np.float32))
    w = BE.to_device(np.ones((4, 4 // groups, 3, 3), np.float32))
    assert BE._conv2d_input_grad(gy, w, (10 if stride[0] == 2 else 5, 10 if stride[0] == 2 else 5), stride,
                                 (1, 1, 1, 1), (1, 1), groups) is None


#: (N, Cin, Cout, H, W, kernel, stride, pads (t, b, l, r), dilation): small images, one group
WGRAD_ROWS = [(64, 1, 16, 8, 8, 3, 1, (1, 1, 1, 1), 1),    # the digits CNN's first conv
              (64, 16, 32, 8, 8, 3, 2, (1, 1, 1, 1), 1),   # and its stride-2 conv
              (5, 3, 7, 9, 11, 3, 2, (1, 0, 2, 1), 1),     # uneven positions, asymmetric padding
              (3, 4, 5, 10, 10, 3, 1, (2, 2, 2, 2), 2),    # dilation
              (7, 6, 4, 6, 5, 1, 1, (0, 0, 0, 0), 1)]      # 1x1


@pytest.mark.parametrize("chunk", [None, 4096])  # 4096 bytes: steps of positions that cross images
@pytest.mark.parametrize("N,C,O,H,W,k,s,pads,d", WGRAD_ROWS)
def test_weight_grad_summed_over_the_batch_in_each_product(N, C, O, H, W, k, s, pads, d, chunk, monkeypatch):
    from anydevice.backend.devices.opencl import wgrad
    if chunk:
        monkeypatch.setattr(wgrad, "WGRAD_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(N + C + O + H + W + k + s)
    x32 = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = torch.from_numpy(rng.standard_normal((O, C, k, k)).astype(np.float32)).double().requires_grad_()
    t, b, l, r = pads
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(torch.from_numpy(x32).double(), (l, r, t, b)), w,
                                   stride=s, dilation=d)
    gy32 = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    y.backward(torch.from_numpy(gy32).double())
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **kw: (launched.append((name, a[0])), run(name, *a, **kw))[1])
    gw = BE._conv2d_weight_grad(BE.to_device(x32), BE.to_device(gy32), (O, C, k, k), (s, s), pads, (d, d), 1)
    monkeypatch.setattr(BE, "_run", run)
    assert all(g[2] == 1 for name, g in launched if name == "gemm_cpu"), launched  # one product per step
    got = torch.as_tensor(np.asarray(BE.to_numpy(gw))).double()
    assert float((got - w.grad).norm() / w.grad.norm()) <= 1e-6
