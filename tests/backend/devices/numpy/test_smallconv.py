"""The NumPy device's small-conv paths (backend/devices/numpy/smallconv.py): forward, weight and input
gradients against PyTorch in float64 on many shapes (strides, dilations, uneven padding, few and many
input channels), and which convs take them."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.nn.grad import conv2d_input, conv2d_weight  # noqa: E402

from anydevice.backend.devices.numpy import smallconv  # noqa: E402

SHAPES = [  # x shape, w shape, stride, pads (t, b, l, r), dilation
    ((64, 1, 8, 8), (16, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # digits conv 1 (NCHW columns)
    ((64, 16, 8, 8), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),    # digits conv 2 (NHWC columns)
    ((3, 2, 11, 7), (5, 2, 3, 2), (2, 1), (2, 0, 1, 3), (1, 2)),
    ((2, 6, 9, 10), (4, 6, 5, 3), (3, 2), (0, 2, 1, 0), (1, 1)),
    ((5, 8, 6, 6), (3, 8, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 4, 13, 5), (7, 4, 3, 3), (1, 1), (0, 0, 0, 0), (2, 1)),
    ((4, 3, 16, 16), (8, 3, 4, 4), (2, 2), (1, 2, 2, 1), (1, 1)),
    ((2, 32, 10, 10), (16, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
]


def _torch_ref(x, w, bias, stride, pads, dilation, gy):
    t, b, l, r = pads
    xt = torch.nn.functional.pad(torch.from_numpy(x).double(), (l, r, t, b))
    wt = torch.from_numpy(w).double()
    y = torch.nn.functional.conv2d(xt, wt, torch.from_numpy(bias).double(), stride, 0, dilation)
    gyt = torch.from_numpy(gy).double()
    gw = conv2d_weight(xt, w.shape, gyt, stride, 0, dilation)
    gxp = conv2d_input(xt.shape, wt, gyt, stride, 0, dilation)
    gx = gxp[:, :, t:t + x.shape[2], l:l + x.shape[3]]
    return y.numpy(), gw.numpy(), gx.numpy()


def _close(a, ref, what):
    assert a.shape == ref.shape, what
    assert a.dtype == np.float32, what
    err = np.abs(a.astype(np.float64) - ref).max() / max(1.0, np.abs(ref).max())
    assert err < 2e-6, (what, err)


@pytest.mark.parametrize("xs,ws,stride,pads,dilation", SHAPES)
def test_small_paths_match_torch(xs, ws, stride, pads, dilation):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    bias = rng.standard_normal(ws[0]).astype(np.float32)
    assert smallconv.takes(xs, ws, stride, pads, dilation, 1, x, w)
    y = smallconv.conv2d(x, w, bias, stride, pads, dilation)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    yr, gwr, gxr = _torch_ref(x, w, bias, stride, pads, dilation, gy)
    x0, w0 = x.copy(), w.copy()
    _close(y, yr, "forward")
    _close(smallconv.weight_grad(x, gy, ws, stride, pads, dilation), gwr, "weight grad")
    _close(smallconv.input_grad(gy, w, xs[2:], stride, pads, dilation), gxr, "input grad")
    assert np.array_equal(x, x0) and np.array_equal(w, w0)  # inputs untouched


def test_which_convs_take_the_small_paths():
    f32 = np.zeros(1, np.float32)
    assert smallconv.takes((64, 16, 8, 8), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, f32)
    assert not smallconv.takes((64, 16, 8, 8), (32, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2, f32)  # groups
    assert not smallconv.takes((16, 32, 64, 64), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, f32)  # large
    assert not smallconv.takes((4, 4, 8, 8), (4, 4, 3, 3), (1, 1), (-1, 1, 1, 1), (1, 1), 1, f32)  # cropping
    assert not smallconv.takes((4, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, f32.astype(np.float64))
    assert not smallconv.takes((4, 4, 2, 2), (4, 4, 3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1, f32)  # empty output


def test_backend_routes_small_convs_here(monkeypatch):
    """The NumPy backend's conv2d and its two gradients run these paths for a small float32 conv, and
    give the same values as the general paths."""
    from anydevice.backend import get_backend
    be = get_backend("numpy")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    args = ((2, 2), (1, 1, 1, 1), (1, 1), 1)
    calls = []
    for name in ("conv2d", "weight_grad", "input_grad"):
        fn = getattr(smallconv, name)
        monkeypatch.setattr(smallconv, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
    y = be._conv2d(x, w, None, *args)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gw = be._conv2d_weight_grad(x, gy, w.shape, *args)
    gx = be._conv2d_input_grad(gy, w, (9, 9), *args)
    assert calls == ["conv2d", "weight_grad", "input_grad"]
    monkeypatch.setattr(smallconv, "SMALL_COLS", 0)  # the general paths
    np.testing.assert_allclose(y, be._conv2d(x, w, None, *args), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, be._conv2d_weight_grad(x, gy, w.shape, *args), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gx, be._conv2d_input_grad(gy, w, (9, 9), *args), rtol=1e-5, atol=1e-5)
