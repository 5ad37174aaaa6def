"""The NumPy device's column-gather stride-1 convolutions (backend/devices/numpy/colconv.py): the forward conv,
its input gradient (the flipped forward conv) and its weight gradient, each against torch's float64 conv and
autograd over shapes that exercise the block splits (several images a block, rows of one image, one image
split over the threads), groups, dilation, uneven and zero padding, odd widths, 5x5 and 3x1 kernels; through
the backend's own entry points, with a spy that colconv ran, and the inputs unchanged."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from anydevice.backend import get_backend  # noqa: E402
from anydevice.backend.devices.numpy import colconv as CC  # noqa: E402

from precision_helpers import relerr  # noqa: E402
from spy_helpers import spy  # noqa: E402

BE = get_backend("numpy")


def _err(got, ref) -> float:
    return relerr(np.asarray(got, np.float64), ref)


CASES = [  # (N, Cin, Cout, H, W, (kh, kw), dilation, groups, (t, b, l, r)); past smallconv's 1M floats of
    # columns, and more than 16 channels each side (fewer: the output-side scheme takes the conv or its gradient)
    (16, 32, 32, 24, 24, (3, 3), 1, 1, (1, 1, 1, 1)),   # the denoiser's conv, smaller: images a block
    (2, 24, 24, 130, 97, (3, 3), 1, 1, (1, 1, 1, 1)),   # rows of one image a block, odd width
    (1, 24, 24, 200, 40, (3, 3), 1, 1, (1, 1, 1, 1)),   # one image: its rows over the threads
    (3, 24, 20, 40, 44, (3, 3), 2, 1, (2, 2, 2, 2)),    # dilation
    (2, 64, 64, 36, 30, (3, 3), 1, 2, (1, 1, 1, 1)),    # groups (32 in, 32 out a group)
    (4, 12, 40, 33, 35, (5, 5), 1, 1, (2, 1, 0, 2)),    # 5x5, uneven padding
    (2, 56, 64, 60, 61, (3, 1), 1, 1, (1, 1, 0, 0)),    # 3x1
    (6, 64, 24, 24, 24, (3, 3), 1, 1, (0, 0, 0, 0)),    # no padding, 64 channels
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"_k{c[5][0]}{c[5][1]}d{c[6]}g{c[7]}")
def test_colconv_forward_and_gradients_match_torch(monkeypatch, case):
    N, C, O, H, W, (kh, kw), d, g, (t, b, l, r) = case
    rng = np.random.default_rng(N * 1000 + C * 10 + O)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = (rng.standard_normal((O, C // g, kh, kw)) / (kh * kw) ** 0.5).astype(np.float32)
    bias = rng.standard_normal(O).astype(np.float32)
    x0, w0 = x.copy(), w.copy()
    xt = torch.from_numpy(x).double().requires_grad_()
    wt = torch.from_numpy(w).double().requires_grad_()
    ref = F.conv2d(F.pad(xt, (l, r, t, b)), wt, torch.from_numpy(bias).double(), 1, 0, d, g)
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    gx_ref, gw_ref = torch.autograd.grad(ref, (xt, wt), torch.from_numpy(gy).double())

    fwd = spy(monkeypatch, CC, "conv2d")
    y = BE._conv2d(x, w, bias, (1, 1), (t, b, l, r), (d, d), g)
    assert _err(y, ref) < 1e-6
    assert fwd == ["conv2d"]

    dx = spy(monkeypatch, CC, "input_grad")
    gx = BE._conv2d_input_grad(gy, w, (H, W), (1, 1), (t, b, l, r), (d, d), g)
    assert _err(gx, gx_ref) < 1e-6
    assert dx == ["input_grad"]

    gw = BE._conv2d_weight_grad(x, gy, w.shape, (1, 1), (t, b, l, r), (d, d), g)
    assert _err(gw, gw_ref) < 1e-6
    np.testing.assert_array_equal(x, x0)  # inputs are never changed
    np.testing.assert_array_equal(w, w0)


@pytest.mark.parametrize("chunk", [1 << 12, 1 << 16, 1 << 26])
def test_every_block_split_gives_the_same_conv(monkeypatch, chunk):
    """Block sizes from one row a block to whole batches a block: the same values (within float32 rounding
    of a K = 288 dot product) for the forward conv and both gradients."""
    monkeypatch.setattr(CC, "COLS_CHUNK_BYTES", chunk)
    monkeypatch.setattr(CC, "WGRAD_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 32, 30, 26)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) / 3).astype(np.float32)
    xt = torch.from_numpy(x).double().requires_grad_()
    wt = torch.from_numpy(w).double().requires_grad_()
    ref = F.conv2d(xt, wt, None, 1, 1)
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    gx_ref, gw_ref = torch.autograd.grad(ref, (xt, wt), torch.from_numpy(gy).double())
    assert _err(CC.conv2d(x, w, None, (1, 1, 1, 1), (1, 1), 1), ref) < 1e-6
    assert _err(CC.input_grad(gy, w, (30, 26), (1, 1, 1, 1), (1, 1), 1), gx_ref) < 1e-6
    assert _err(CC.weight_grad(x, gy, w.shape, (1, 1, 1, 1), (1, 1), 1), gw_ref) < 1e-6


def test_input_gradient_declines_padding_past_the_taps():
    """A pad larger than the taps' extent (the flipped conv would need a negative pad): None, the caller's
    other path takes it (and still matches torch)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    x = rng.standard_normal((2, 16, 20, 20)).astype(np.float32)
    xt = torch.from_numpy(x).double().requires_grad_()
    ref = F.conv2d(xt, torch.from_numpy(w).double(), None, 1, 3)
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    assert CC.input_grad(gy, w, (20, 20), (3, 3, 3, 3), (1, 1), 1) is None
    gx_ref, = torch.autograd.grad(ref, xt, torch.from_numpy(gy).double())
    assert _err(BE._conv2d_input_grad(gy, w, (20, 20), (1, 1), (3, 3, 3, 3), (1, 1), 1), gx_ref) < 1e-6


@pytest.mark.parametrize("nt", [1, 2, 16])
@pytest.mark.parametrize("shape", [(16, 1, 64, 66, 288), (1, 1, 64, 66, 288), (2, 1, 20, 22, 288),
                                   (1, 1, 5, 7, 288), (3, 2, 30, 32, 144), (4, 1, 512, 514, 144)])
def test_blocks_cover_every_row_once_and_feed_the_threads(monkeypatch, nt, shape):
    from anydevice.backend.system import threads
    monkeypatch.setattr(threads, "num_threads", lambda: nt)
    N, G, OH = shape[:3]
    for chunk in (None, 4 << 20, 1 << 12):
        blocks = CC._blocks(*shape, chunk)
        seen = {}
        for n0, n1, g, r0, r1 in blocks:
            assert 0 <= n0 < n1 <= N and 0 <= g < G and 0 <= r0 < r1 <= OH
            for key in ((n, g, r) for n in range(n0, n1) for r in range(r0, r1)):
                seen[key] = seen.get(key, 0) + 1
        assert len(seen) == N * G * OH and set(seen.values()) == {1}
        assert len(blocks) >= min(nt, N * G * OH)


def test_weight_gradient_non_finite_values_reach_only_the_taps_that_read_them():
    """An Inf in x's last column is read by no tap with kw = 0 (its output column would be past the edge):
    torch's weight gradient stays finite there, and so does colconv's (the columns' padding positions, which
    read the next row, are zeroed rather than multiplied by gy's zeros)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 8, 128, 128)).astype(np.float32)
    x[0, :, 5, -1] = np.inf
    w = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
    gy = rng.standard_normal((2, 32, 128, 128)).astype(np.float32)
    xt = torch.from_numpy(x).double().requires_grad_()
    ref = F.conv2d(xt, torch.from_numpy(w).double().requires_grad_(), None, 1, 1)
    _, gw_ref = torch.autograd.grad(ref, (xt, ref.grad_fn.next_functions[1][0].variable), torch.from_numpy(gy).double())
    gw = np.asarray(BE._conv2d_weight_grad(x, gy, w.shape, (1, 1), (1, 1, 1, 1), (1, 1), 1), np.float64)
    ref_np = gw_ref.numpy()
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(ref_np))
    np.testing.assert_array_equal(np.isinf(gw), np.isinf(ref_np))
    fin = np.isfinite(ref_np)
    assert fin.any() and np.abs(gw[fin] - ref_np[fin]).max() <= 1e-5 * np.abs(ref_np[fin]).max()
