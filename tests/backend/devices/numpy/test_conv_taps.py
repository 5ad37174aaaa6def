"""The NumPy device's stride-1 tap schemes (backend/devices/numpy/conv.py, gradients.py, colconv.py): few output
channels take the taps on the output side (_conv2d_outshift: one GEMM with taps x channels rows, then shifted
sums), an input gradient with up to 64 channels a tap runs as colconv's flipped forward conv, one with few input
channels as the flipped forward conv on the output side, and a weight gradient with few output channels gathers
the taps' shifted gy rows (_wgrad_gathered). Each against torch's float64 conv and autograd, with a
spy that the scheme under test ran (the shapes are past smallconv's 1M floats of columns, so the threaded
paths take them)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from anydevice.backend import get_backend  # noqa: E402
from anydevice.backend.devices.numpy import colconv as CC, conv as CV, gradients as GR  # noqa: E402

from precision_helpers import relerr  # noqa: E402
from spy_helpers import spy  # noqa: E402

BE = get_backend("numpy")


def _err(got, ref) -> float:
    return relerr(np.asarray(got, np.float64), ref)


CASES = [  # (N, Cin, Cout, H, W, k, dilation, groups, padding)
    (4, 32, 3, 40, 44, 3, 1, 1, 1),        # the residual denoiser's last conv, smaller
    (4, 16, 8, 48, 45, 3, 2, 1, 2),        # dilation, odd width
    (2, 48, 12, 40, 40, 3, 1, 2, 1),       # groups: 6 output channels a group
    (1, 24, 4, 60, 50, 5, 1, 1, 0),        # 5x5, no padding
    (3, 32, 16, 36, 36, 3, 1, 1, (1, 0)),  # 16 output channels (144 rows), uneven padding
]


@pytest.mark.parametrize("case", CASES)
def test_few_output_channels_take_the_output_side(monkeypatch, case):
    N, C, O, H, W, k, d, g, p = case
    pad = p if isinstance(p, tuple) else (p, p)
    rng = np.random.default_rng(N * C + O * H + W)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.standard_normal((O, C // g, k, k)) / k).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    x0, w0 = x.copy(), w.copy()
    calls = spy(monkeypatch, CV, "_conv2d_outshift")
    xt, wt = torch.from_numpy(x).double().requires_grad_(), torch.from_numpy(w).double().requires_grad_()
    ref = F.conv2d(xt, wt, torch.from_numpy(b).double(), 1, pad, d, g)
    assert _err(BE.conv2d(x, w, b, 1, pad, d, g), ref) < 1e-6
    assert calls == ["_conv2d_outshift"]
    # the input gradient: few output channels a tap -> colconv's flipped forward conv (one GEMM a block)
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    gx_ref, gw_ref = torch.autograd.grad(ref, (xt, wt), torch.from_numpy(gy).double())
    cols = spy(monkeypatch, CC, "input_grad")
    gx = BE._conv2d_input_grad(gy, w, (H, W), (1, 1), (pad[0], pad[0], pad[1], pad[1]), (d, d), g)
    assert _err(gx, gx_ref) < 1e-6
    assert cols == ["input_grad"]
    # the weight gradient: few output channels -> the taps' shifted gy rows gathered, one GEMM a block
    gathered = spy(monkeypatch, GR, "_wgrad_gathered")
    gw = BE._conv2d_weight_grad(x, gy, w.shape, (1, 1), (pad[0], pad[0], pad[1], pad[1]), (d, d), g)
    assert _err(gw, gw_ref) < 1e-6
    assert bool(gathered) == (k * k * (O // g) <= CV.TAP_COLS_MAX)
    np.testing.assert_array_equal(x, x0)  # inputs are never changed
    np.testing.assert_array_equal(w, w0)


@pytest.mark.parametrize("case", [(4, 3, 32, 100, 110, 3, 1, 1, 1), (4, 4, 24, 90, 100, 3, 2, 1, 2),
                                  (4, 6, 32, 100, 100, 3, 1, 2, 1)])
def test_few_input_channels_input_gradient_runs_as_the_flipped_forward(monkeypatch, case):
    N, C, O, H, W, k, d, g, p = case
    rng = np.random.default_rng(N + C * O + H)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.standard_normal((O, C // g, k, k)) / k).astype(np.float32)
    xt = torch.from_numpy(x).double().requires_grad_()
    ref = F.conv2d(xt, torch.from_numpy(w).double(), None, 1, p, d, g)
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    gx_ref, = torch.autograd.grad(ref, xt, torch.from_numpy(gy).double())
    calls = spy(monkeypatch, GR, "_conv2d_outshift")
    gx = BE._conv2d_input_grad(gy, w, (H, W), (1, 1), (p, p, p, p), (d, d), g)
    assert calls == ["_conv2d_outshift"]
    assert _err(gx, gx_ref) < 1e-6


@pytest.mark.parametrize("channels,scheme", [(32, "colconv"), (96, "shifted")])
def test_many_channels_stay_on_the_input_side(monkeypatch, channels, scheme):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, channels, 40, 40)).astype(np.float32)
    w = (rng.standard_normal((channels, channels, 3, 3)) / 3).astype(np.float32)
    out_side = spy(monkeypatch, CV, "_conv2d_outshift")
    shifted = spy(monkeypatch, CV, "_conv2d_shifted")
    cols = spy(monkeypatch, CC, "conv2d")
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, 1, 1)
    assert _err(BE.conv2d(x, w, None, 1, 1), ref) < 1e-6
    assert out_side == []
    assert (shifted, cols) == (([], ["conv2d"]) if scheme == "colconv" else (["_conv2d_shifted"], []))


@pytest.mark.parametrize("cout,scheme", [(4, "_conv2d_outshift"), (24, "conv2d")])
def test_inf_and_nan_reach_what_torch_gives(monkeypatch, cout, scheme):
    """A non-finite input value spreads to exactly the outputs whose window holds it (the shifted sums add
    each tap's product once, as a direct conv does; colconv's columns hold each tap's value once, and the
    padding columns that read the next row are dropped)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 16, 48, 48)).astype(np.float32)
    x[0, 3, 10, 10] = np.inf
    x[1, 5, 0, 47] = np.nan
    w = (rng.standard_normal((cout, 16, 3, 3)) / 3).astype(np.float32)
    calls = spy(monkeypatch, CV if scheme.startswith("_") else CC, scheme)
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), None, 1, 1).numpy()
    got = np.asarray(BE.conv2d(x, w, None, 1, 1), np.float64)
    assert calls == [scheme]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    assert np.abs(got[fin] - ref[fin]).max() <= 1e-5 * np.abs(ref[fin]).max()
