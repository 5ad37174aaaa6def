"""The CPU family's conv2d input gradient (backend/devices/opencl/wgrad.py ``_conv2d_input_grad``): for
stride 1, ungrouped, a conv2d of the output gradient with the flipped, channel-swapped weight, on the
forward conv's paths. Against torch autograd in float64; other geometries decline (None: the shared
conv_transpose2d path)."""
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


@pytest.mark.parametrize("stride,groups", [((2, 2), 1), ((1, 1), 2)])
def test_other_geometries_take_the_shared_path(stride, groups):
    gy = BE.to_device(np.ones((1, 4, 5, 5), np.float32))
    w = BE.to_device(np.ones((4, 4 // groups, 3, 3), np.float32))
    assert BE._conv2d_input_grad(gy, w, (10 if stride[0] == 2 else 5, 10 if stride[0] == 2 else 5), stride,
                                 (1, 1, 1, 1), (1, 1), groups) is None
