"""The OpenCL GPU kernel family on a small GPU, emulated on whatever OpenCL device is here (PoCL in
CI): a work-group size of 64 or 128 items and 8 or 16 KiB of local memory (``limits``). Every
launch stays within the group size, the GEMM/conv tiles within the local memory, and the results
equal torch in float64."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

try:
    from anydevice.backend.devices import opencl
    opencl.create("opencl", 0, family="gpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

LIMITS = {"64 items, 8 KiB": {"max_group": 64, "local_bytes": 8192},
          "128 items, 16 KiB": {"max_group": 128, "local_bytes": 16384}}


@pytest.fixture(scope="module", params=list(LIMITS))
def small(request):
    lim = LIMITS[request.param]
    be = opencl.create("opencl", 0, family="gpu", limits=lim)
    assert be.max_group == lim["max_group"] and be.local_bytes == lim["local_bytes"]
    return be, lim


def rel(y, ref) -> float:
    y = torch.as_tensor(np.asarray(y)).double()
    return float((y - ref).norm() / max(float(ref.norm()), 1e-30))


def _watch(be, monkeypatch):
    """Every launch's local size, and the tiles ad_conv_gemm was built with."""
    seen = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, g, l, *a, **kw: (seen.append((name, l, kw.get("params"))),
                                                                  run(name, g, l, *a, **kw))[1])
    return seen


def _check_launches(seen, lim):
    assert seen
    for name, local, params in seen:
        if local is not None:
            assert int(np.prod(local)) <= lim["max_group"], (name, local)
        if name == "ad_conv_gemm":
            pad = params.get("SMEM_PAD", 4)
            shared = 4 * 2 * params["TILE_K"] * (params["TILE_M"] + params["TILE_N"] + 2 * pad)
            assert shared <= lim["local_bytes"], (name, params)


def test_gemm_and_convs_fit_a_small_gpu(small, monkeypatch):
    be, lim = small
    rng = np.random.default_rng(0)
    seen = _watch(be, monkeypatch)
    for M, K, N in [(37, 29, 45), (130, 70, 200), (64, 1000, 33)]:
        a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
        y = be.to_numpy(be.matmul(be.to_device(a), be.to_device(b)))
        assert rel(y, torch.from_numpy(a).double() @ torch.from_numpy(b).double()) <= 1e-6
    x = rng.standard_normal((2, 24, 19, 23)).astype(np.float32)
    for w_shape, kw in [((40, 24, 3, 3), {"padding": 1}), ((16, 24, 3, 3), {"stride": 2}),
                        ((32, 24, 1, 1), {}), ((3, 24, 3, 3), {"padding": 1})]:  # the last: the direct kernel
        w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
        bias = rng.standard_normal(w_shape[0]).astype(np.float32)
        y = be.to_numpy(be.conv2d(be.to_device(x), be.to_device(w), be.to_device(bias), **kw))
        ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(bias).double(), **kw)
        assert rel(y, ref) <= 1e-6, (w_shape, kw)
    wt = rng.standard_normal((24, 8, 4, 4)).astype(np.float32)
    y = be.to_numpy(be.conv_transpose2d(be.to_device(x), be.to_device(wt), stride=2, padding=1))
    assert rel(y, F.conv_transpose2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(), stride=2, padding=1)) <= 1e-6
    _check_launches(seen, lim)
    assert any(n == "ad_conv_gemm" for n, _, _ in seen) and any(n == "ad_direct_conv" for n, _, _ in seen)


def test_elementwise_norms_and_attention_fit_a_small_gpu(small, monkeypatch):
    be, lim = small
    rng = np.random.default_rng(1)
    seen = _watch(be, monkeypatch)
    x = rng.standard_normal((2, 32, 9, 11)).astype(np.float32)
    t = torch.from_numpy(x).double()
    assert rel(be.to_numpy(be.relu(be.to_device(x))), torch.relu(t)) == 0
    s = rng.standard_normal((32, 1, 1)).astype(np.float32)
    assert rel(be.to_numpy(be.add(be.to_device(x), be.to_device(s))), t + torch.from_numpy(s).double()) <= 1e-7
    assert rel(be.to_numpy(be.sum(be.to_device(x), (0, 2, 3))), t.sum((0, 2, 3))) <= 1e-6
    gw, gb = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    y = be.to_numpy(be.group_norm(be.to_device(x), 8, be.to_device(gw), be.to_device(gb)))
    assert rel(y, F.group_norm(t, 8, torch.from_numpy(gw).double(), torch.from_numpy(gb).double())) <= 1e-5
    y = be.to_numpy(be.layer_norm(be.to_device(x), (11,)))
    assert rel(y, F.layer_norm(t, (11,))) <= 1e-5
    q, k, v = (rng.standard_normal((1, 2, 50, 64)).astype(np.float32) for _ in range(3))
    y = be.to_numpy(be.scaled_dot_product_attention(be.to_device(q), be.to_device(k), be.to_device(v)))
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a).double() for a in (q, k, v)))
    assert rel(y, ref) <= 1e-5
    _check_launches(seen, lim)


def test_a_device_too_small_for_any_tile_says_so():
    be = opencl.create("opencl", 0, family="gpu", limits={"max_group": 32, "local_bytes": 4096})
    a = be.to_device(np.ones((40, 40), np.float32))
    with pytest.raises(Exception, match="fit no GEMM tile"):
        be.to_numpy(be.matmul(a, a))
