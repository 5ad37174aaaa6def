"""linear_w8a8 / conv2d_w8a8 (backend/ops/w8a8.py) on every backend here (the fused kernels of the OpenCL
CPU and GPU families, the host composite of numpy / cpu / the mini device).

Values: the float64 reference of the same quantized math (``w8a8.reference``) to float32 rounding
(normwise <= 1e-6); the int32 accumulation exactly (rows whose absmax is 127 and integer values, a weight
with unit scales: y is the integer sum itself, below 2^24); the error against float32 linear within what
int8 rounding of both operands implies, element by element."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import quant, w8a8
from anydevice.backend.system.errors import AnyDeviceError

torch = pytest.importorskip("torch")
TOL = 1e-6
#: (M, N, K): K not a multiple of 4 / 16 / 32, tiles with partial edges, a single element
SHAPES = [(1, 1, 1), (5, 11, 37), (30, 33, 4), (77, 70, 130), (13, 65, 257), (64, 64, 64), (3, 7, 1000)]


def _rel(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(y - ref) / n) if n else float(np.linalg.norm(y))


def _case(M, N, K, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, K)) * scale).astype(np.float32)
    if M > 2:
        x[1] = 0.0  # an all-zero row: sx = 1, y = b
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_matches_quantized_reference(backend_target, M, N, K):
    be = backend_target
    x, w, b = _case(M, N, K)
    q = quant.quantize(w, "int8")
    y = be.to_numpy(be.linear_w8a8(x, q, b))
    ref = w8a8.reference(x, *w8a8.int8_parts(q), b)
    assert y.shape == (M, N) and y.dtype == np.float32
    assert _rel(y, ref) <= TOL
    if M > 2:
        np.testing.assert_array_equal(y[1], b)


@pytest.mark.parametrize("scale", [1e20, 1e-20])
def test_large_and_small_magnitudes(backend_target, scale):
    be = backend_target
    x, w, b = _case(9, 40, 70, seed=1, scale=scale)
    q = quant.quantize(w * np.float32(1e10), "int8")
    y = be.to_numpy(be.linear_w8a8(x, q))
    ref = w8a8.reference(x, *w8a8.int8_parts(q))
    assert np.isfinite(y).all() and _rel(y, ref) <= TOL


@pytest.mark.parametrize("K", [1, 3, 37, 130, 1000])
def test_int32_accumulation_exact(backend_target, K):
    """sx = sw = 1 exactly: y is float(acc), the exact integer sum (|acc| < 2^24 here)."""
    be = backend_target
    rng = np.random.default_rng(K)
    M, N = 19, 45
    xi = rng.integers(-127, 128, (M, K))
    xi[:, rng.integers(0, K, M)] = 0
    xi[np.arange(M), rng.integers(0, K, M)] = rng.choice([-127, 127], M)  # every row's absmax is 127
    wi = rng.integers(-127, 128, (N, K)).astype(np.int8)
    q = quant.QTensor("int8", (N, K), wi.view(np.uint8), np.ones(N, np.float32))
    y = be.to_numpy(be.linear_w8a8(xi.astype(np.float32), q))
    acc = w8a8.int_products(xi.astype(np.int8), wi)
    assert np.abs(acc).max() < 2 ** 24
    np.testing.assert_array_equal(y, acc.astype(np.float32))


def test_error_is_what_int8_implies(backend_target):
    be = backend_target
    x, w, b = _case(20, 50, 300, seed=3)
    q = quant.quantize(w, "int8")
    y = be.to_numpy(be.linear_w8a8(x, w, b)).astype(np.float64)  # a float weight: quantized per channel here
    np.testing.assert_array_equal(y, be.to_numpy(be.linear_w8a8(x, q, b)))
    y32 = x.astype(np.float64) @ w.astype(np.float64).T + b
    _, sx = w8a8.quantize_rows(x)
    sw = q.scale.astype(np.float64)
    sx = sx.astype(np.float64)
    ax, aw = np.abs(x).sum(1).astype(np.float64), np.abs(w).sum(1).astype(np.float64)
    bound = 0.5 * sx[:, None] * aw[None, :] + 0.5 * sw[None, :] * ax[:, None] + 0.25 * x.shape[1] * sx[:, None] * sw
    assert (np.abs(y - y32) <= bound * (1 + 1e-5) + 1e-5).all()
    assert _rel(y, y32) < 0.02  # int8 of both operands: about a percent


def test_nonfinite_row_gives_nan_row(backend_target):
    be = backend_target
    x, w, b = _case(4, 8, 33, seed=4)
    x[2, 5] = np.inf
    y = be.to_numpy(be.linear_w8a8(x, quant.quantize(w, "int8"), b))
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()


def test_torch_input_and_leading_dims(backend_target):
    be = backend_target
    x, w, b = _case(12, 16, 40, seed=5)
    q = quant.quantize(w, "int8")
    yt = be.linear_w8a8(torch.from_numpy(x.reshape(2, 6, 40)), q, torch.from_numpy(b))
    assert isinstance(yt, torch.Tensor) and tuple(yt.shape) == (2, 6, 16)
    assert _rel(yt.numpy().reshape(12, 16), w8a8.reference(x, *w8a8.int8_parts(q), b)) <= TOL


def test_conv2d_1x1(backend_target):
    be = backend_target
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 24, 5, 7)).astype(np.float32)
    w = (rng.standard_normal((10, 24, 1, 1)) / 5).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    y = be.to_numpy(be.conv2d_w8a8(x, quant.quantize(w, "int8"), b))
    rows = x.transpose(0, 2, 3, 1).reshape(-1, 24)
    ref = w8a8.reference(rows, *w8a8.int8_parts(quant.quantize(w.reshape(10, 24), "int8")), b)
    assert y.shape == (2, 10, 5, 7)
    assert _rel(y, ref.reshape(2, 5, 7, 10).transpose(0, 3, 1, 2)) <= TOL
    with pytest.raises(AnyDeviceError):
        be.conv2d_w8a8(x, np.zeros((10, 24, 3, 3), np.float32))


def test_refuses_long_k(backend_target):
    be = backend_target
    K = w8a8.MAX_K + 1
    with pytest.raises(AnyDeviceError, match="exact up to K"):
        be.linear_w8a8(np.ones((1, K), np.float32), np.ones((1, K), np.float32))


def test_host_helpers():
    x = np.array([[0.0, 0.0], [1.0, -2.0], [np.nan, 1.0]], np.float32)
    xq, sx = w8a8.quantize_rows(x)
    assert sx[0] == 1 and sx[1] == np.float32(2.0) / np.float32(127.0) and np.isnan(sx[2])
    np.testing.assert_array_equal(xq, [[0, 0], [64, -127], [0, 0]])  # 63.5 rounds away from zero
    # the same rounding as quant.quantize's int8 weight rows
    r = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32)
    q = quant.quantize(r, "int8")
    xq, sx = w8a8.quantize_rows(r)
    np.testing.assert_array_equal(xq, q.data.view(np.int8).reshape(6, 50))
    np.testing.assert_array_equal(sx, q.scale)
