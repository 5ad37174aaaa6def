"""GPU tests of the CUDA backend (the pack's own kernels through CuPy). Skipped, with the reason,
without CuPy or a CUDA GPU; the shared precision suite also covers ``cuda`` when it is available."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cuda_backend

pytestmark = pytest.mark.gpu

_PROBE = cuda_backend.probe("cuda")
_ROCM = cuda_backend.probe("rocm")
_AVAILABLE = _PROBE["available"] or _ROCM["available"]
_REASON = _PROBE["reason"] if not _PROBE["available"] else ""

torch = pytest.importorskip("torch")
needs_gpu = pytest.mark.skipif(not _AVAILABLE, reason=f"cuda backend unavailable: {_REASON}")
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="PyTorch has no CUDA device (CPU-only build or no GPU)")

SEED_CONVS = [  # (k, stride, padding) on input 32x512x7x7, weights 512x512xkxk
    (3, 1, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0), (1, 2, 0), (7, 2, 3),
]


@pytest.fixture(scope="module")
def be():
    return cuda_backend.create("cuda" if _PROBE["available"] else "rocm", 0)


def _relerr(y, ref) -> float:
    y = np.asarray(y, dtype=np.float64)
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-300))


def _ref_conv(x, w, b, **kw):
    t = lambda a: None if a is None else torch.from_numpy(a).double()  # noqa: E731
    return torch.nn.functional.conv2d(t(x), t(w), t(b), **kw).numpy()


def test_probe_shape():
    for p in (_PROBE, _ROCM):
        assert set(p) >= {"available", "reason", "devices", "kind"} and p["kind"] == "own"
        assert p["available"] or p["reason"]


@needs_gpu
def test_device_string_names_own_kernels(be):
    assert "own" in be.device and "CuPy" in be.device


@needs_gpu
@pytest.mark.parametrize("k,s,p", SEED_CONVS, ids=[f"k{k}s{s}p{p}" for k, s, p in SEED_CONVS])
def test_seed_convs_precision(be, k, s, p):
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    x = rng.standard_normal((32, 512, 7, 7)).astype(np.float32)
    w = (rng.standard_normal((512, 512, k, k)) / np.sqrt(512 * k * k)).astype(np.float32)
    b = rng.standard_normal(512).astype(np.float32)
    y = be.conv2d(x, w, b, stride=s, padding=p)
    ref = _ref_conv(x, w, b, stride=s, padding=p)
    assert y.shape == ref.shape
    assert _relerr(y, ref) <= 1e-6


@needs_gpu
@pytest.mark.parametrize("seed", range(8))
def test_random_conv_shapes(be, seed):
    rng = np.random.default_rng(seed)
    g = int(rng.choice([1, 1, 2, 4]))
    cin, cout = g * int(rng.integers(1, 24)), g * int(rng.integers(1, 40))
    k = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
    s, d = (int(rng.integers(1, 4)), int(rng.integers(1, 3))), (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    p = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    h, wd = int(rng.integers(d[0] * (k[0] - 1) + 1, 40)), int(rng.integers(d[1] * (k[1] - 1) + 1, 40))
    n = int(rng.integers(1, 5))
    x = rng.standard_normal((n, cin, h, wd)).astype(np.float32)
    w = rng.standard_normal((cout, cin // g, *k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) if seed % 2 else None
    y = be.conv2d(x, w, b, stride=s, padding=p, dilation=d, groups=g)
    assert _relerr(y, _ref_conv(x, w, b, stride=s, padding=p, dilation=d, groups=g)) <= 1e-6
    # transposed conv with the same parameters (output_padding < stride or dilation)
    op = (min(s[0], d[0]) - 1, min(s[1], d[1]) - 1)
    if min((h - 1) * s[0] - 2 * p[0] + d[0] * (k[0] - 1) + op[0], (wd - 1) * s[1] - 2 * p[1] + d[1] * (k[1] - 1) + op[1]) < 0:
        return  # empty transposed output for these parameters
    wt = rng.standard_normal((cin, cout // g, *k)).astype(np.float32)
    yt = be.conv_transpose2d(x, wt, b if b is None else b[: (cout // g) * g], stride=s, padding=p,
                             output_padding=op, groups=g, dilation=d)
    t = lambda a: None if a is None else torch.from_numpy(a).double()  # noqa: E731
    ref = torch.nn.functional.conv_transpose2d(t(x), t(wt), t(b), s, p, op, g, d).numpy()
    assert _relerr(yt, ref) <= 1e-6


@needs_gpu
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 17, 33, 9), (2, 128, 64, 257), (1, 1000, 1, 300)])
def test_random_matmul_shapes(be, shape):
    rng = np.random.default_rng(len(shape) + shape[-1])
    if len(shape) == 3:
        m, k, n = shape
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    else:
        bt, m, k, n = shape
        a, b = rng.standard_normal((bt, m, k)), rng.standard_normal((k, n))
    a, b = a.astype(np.float32), b.astype(np.float32)
    assert _relerr(be.matmul(a, b), a.astype(np.float64) @ b) <= 1e-6
    wt = rng.standard_normal((7, b.shape[0])).astype(np.float32)  # linear: x @ W^T (transposed view)
    assert _relerr(be.linear(a, wt), a.astype(np.float64) @ wt.T.astype(np.float64)) <= 1e-6


@needs_gpu
def test_elementwise_pad_reduce(be):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    t = torch.from_numpy(x)
    F = torch.nn.functional
    for mode in ("constant", "reflect", "replicate", "circular"):
        np.testing.assert_array_equal(be.pad(x, (2, 1, 3, 2), mode=mode), F.pad(t, (2, 1, 3, 2), mode=mode).numpy())
    for op, f in [("relu", torch.relu), ("sigmoid", torch.sigmoid), ("gelu", F.gelu), ("silu", F.silu)]:
        np.testing.assert_allclose(be.unary(op, x), f(t.double()).float().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(be.sum(x[1], dim=(1, 2)), t[1].double().sum(dim=(1, 2)).numpy(), rtol=1e-6)
    assert np.isnan(be.max(x)) and np.isnan(be.mean(x))


@needs_gpu
@needs_torch_cuda
def test_dlpack_round_trip_zero_copy(be):
    x = torch.randn(4, 8, 16, 16, device="cuda")
    w = torch.randn(16, 8, 3, 3, device="cuda")
    x0, w0 = x.clone(), w.clone()
    # the input comes in without a copy
    native = be.to_device(x)
    assert native.data.ptr == x.data_ptr()
    y = be.conv2d(x, w, padding=1)
    assert isinstance(y, torch.Tensor) and y.device == x.device and y.dtype == torch.float32
    assert torch.equal(x, x0) and torch.equal(w, w0)  # inputs not modified
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert float((y.double() - ref).norm() / ref.norm()) <= 1e-6
    # a result comes out without a copy either
    r = be.relu(native)
    out = be._to_torch(r, x)
    assert out.data_ptr() == r.data.ptr
    # a half, non-contiguous input stays on the GPU and keeps its dtype (the backend stores half)
    h = x.half().permute(0, 1, 3, 2)
    yh = be.relu(h)
    assert yh.device == x.device and yh.dtype == torch.float16 and torch.equal(yh, torch.relu(h))


@needs_gpu
@needs_torch_cuda
def test_work_on_a_side_stream(be):
    """ComfyUI may queue work on a non-default stream: our kernels must run after it, on it."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.empty(2048, 2048, device="cuda")
        torch.cuda._sleep(20_000_000)  # keep the stream busy so a wrong ordering would show
        a.fill_(1.0)
        b = torch.full((2048, 2048), 2.0, device="cuda")
        y = be.matmul(a, b)
        z = be.add(y, 1.0)
    s.synchronize()
    assert float(y[0, 0]) == 2.0 * 2048 and float(z.min()) == 4097.0 == float(z.max())
    assert be.cp.cuda.get_current_stream().ptr == s.cuda_stream


@needs_gpu
def test_tf32_path_builds_and_is_close(be, monkeypatch):
    if be.hip or be.cc < (8, 0):
        pytest.skip("TF32 tensor cores need sm_80+")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 300, 200)).astype(np.float32)
    b = rng.standard_normal((1, 200, 150)).astype(np.float32)
    cp = be.cp
    y = be._gemm(cp.asarray(a), cp.asarray(b), family="tf32", cfg=cuda_backend._T_S)
    assert _relerr(cp.asnumpy(y), a.astype(np.float64) @ b) < 5e-3
    y = be._gemm(cp.asarray(a), cp.asarray(b), family="own", cfg=cuda_backend._O_S)
    assert _relerr(cp.asnumpy(y), a.astype(np.float64) @ b) < 1e-6
