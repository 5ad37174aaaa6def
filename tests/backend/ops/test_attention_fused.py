"""The OpenCL fused attention kernels (kernels/attention.cl, the fused kernel "attention"), both
kernel families on whatever OpenCL device is here: the fused path is the one taken, its results
match torch in float64 at the precision suite's bar (normwise relative error <= 1e-6, NaN/Inf
positions exact), and its memory grows with the sequence, not with its square."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from precision_helpers import ATTENTION_SHAPES, check, random_mask

SDPA = F.scaled_dot_product_attention
TOL = 1e-6
_cache: dict = {}


@pytest.fixture(params=["cpu", "gpu"], scope="module")
def cl(request):
    """The OpenCL backend with the CPU or the GPU kernel family."""
    if request.param not in _cache:
        try:
            from anydevice.backend.devices import opencl
            _cache[request.param] = opencl.create("opencl", 0, family=request.param)
        except Exception as exc:  # no OpenCL device here
            pytest.skip(f"no OpenCL device: {exc}")
    return _cache[request.param]


@pytest.fixture
def spy(cl, monkeypatch):
    """Counts the fused calls and how many gave a result (None: the composite ran)."""
    calls = {"n": 0, "taken": 0}
    inner = cl._attention_fused

    def wrapped(*a, **kw):
        calls["n"] += 1
        y = inner(*a, **kw)
        calls["taken"] += y is not None
        return y

    monkeypatch.setattr(cl, "_attention_fused", wrapped)
    return calls


def _data(seed, sq, sk, sv):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in (sq, sk, sv))


def _ref(q, k, v, mask=None, **kw):
    m = None if mask is None else (torch.from_numpy(mask) if mask.dtype == np.bool_ else
                                   torch.from_numpy(mask).double())
    return SDPA(*(torch.from_numpy(a).double() for a in (q, k, v)), attn_mask=m, **kw).numpy()


def test_declared_fused(cl):
    assert "attention" in cl.caps.fused


SHAPES = ATTENTION_SHAPES + [  # (query, key, value)
    ((1, 1, 64, 64), (1, 1, 4096, 64), (1, 1, 4096, 64)),   # long S
    ((1, 2, 33, 40), (1, 2, 4096, 40), (1, 2, 4096, 40)),   # long S, head dim 40
]


@pytest.mark.parametrize("sq,sk,sv", SHAPES, ids=[f"{'x'.join(map(str, s[0]))}-S{s[1][-2]}-Ev{s[2][-1]}"
                                                  for s in SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_shapes(cl, spy, sq, sk, sv, causal):
    q, k, v = _data(sum(sq) + sum(sk), sq, sk, sv)
    y = cl.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert spy["n"] >= 1 and spy["taken"] == spy["n"]
    check(y, _ref(q, k, v, is_causal=causal), f"fused {sq} {sk} {sv} causal={causal}", TOL)


@pytest.mark.parametrize("scale", [0.05, 2.5, -0.7])
def test_fused_scale(cl, spy, scale):
    q, k, v = _data(3, (2, 3, 6, 8), (2, 3, 37, 8), (2, 3, 37, 8))
    check(cl.scaled_dot_product_attention(q, k, v, scale=scale), _ref(q, k, v, scale=scale), f"scale {scale}", TOL)
    assert spy["taken"] == spy["n"] >= 1


MASKS = [(9, 40), (1, 40), (9, 1), (1, 1), (3, 9, 40), (2, 1, 9, 40), (2, 3, 1, 40), (2, 3, 9, 40)]


@pytest.mark.parametrize("ms", MASKS, ids=["x".join(map(str, m)) for m in MASKS])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fused_masks(cl, spy, ms, mask_kind):
    """Additive and bool masks broadcast over batch, heads, rows or keys: all fused."""
    q, k, v = _data(5, (2, 3, 9, 8), (2, 3, 40, 8), (2, 3, 40, 5))
    rng = np.random.default_rng(len(ms) + ms[-1])
    mask = random_mask(rng, ms, mask_kind)
    y = cl.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert spy["taken"] == spy["n"] >= 1
    check(y, _ref(q, k, v, mask), f"mask {mask_kind} {ms}", TOL)


def test_fused_long_mask(cl, spy):
    q, k, v = _data(8, (1, 2, 70, 64), (1, 2, 4096, 64), (1, 2, 4096, 64))
    mask = np.random.default_rng(9).random((70, 4096)) > 0.5
    check(cl.scaled_dot_product_attention(q, k, v, attn_mask=mask), _ref(q, k, v, mask), "long mask", TOL)
    assert spy["taken"] == spy["n"] >= 1


def test_mask_without_a_batch_split_takes_the_composite(cl, spy):
    """A mask broadcast the kernels cannot index (heads broadcast between two real batch dims):
    _attention_fused says None and the composite gives the same result."""
    q, k, v = _data(10, (2, 3, 4, 5, 8), (2, 3, 4, 7, 8), (2, 3, 4, 7, 4))
    mask = np.random.default_rng(1).standard_normal((2, 1, 4, 5, 7)).astype(np.float32)
    check(cl.scaled_dot_product_attention(q, k, v, attn_mask=mask), _ref(q, k, v, mask), "no split", TOL)
    assert spy["n"] >= 1 and spy["taken"] == 0


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fused_fully_masked_rows_are_zero(cl, spy, mask_kind):
    q, k, v = _data(6, (1, 2, 4, 8), (1, 2, 37, 8), (1, 2, 37, 3))
    keep = np.ones((4, 37), bool)
    keep[1] = False
    keep[3, :36] = False
    mask = keep if mask_kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    y = np.asarray(cl.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert spy["taken"] == spy["n"] >= 1
    check(y, _ref(q, k, v, mask), "fully masked rows", TOL)
    assert (y[:, :, 1] == 0).all()


def test_fused_nan_inf_like_torch(cl, spy):
    """NaN/Inf positions as torch, also a NaN key past the causal diagonal (torch: NaN)."""
    q, k, v = _data(13, (1, 2, 6, 4), (1, 2, 37, 4), (1, 2, 37, 3))
    q[0, 0, 1, 2] = np.nan
    k[0, 1, 3, 0] = np.inf
    v[0, 0, 4, 1] = -np.inf
    q[0, 1, 4, 1] = -np.inf
    k[0, 0, 20, 1] = np.nan  # past every query's diagonal
    check(cl.scaled_dot_product_attention(q, k, v), _ref(q, k, v), "nan/inf", TOL)
    check(cl.scaled_dot_product_attention(q, k, v, is_causal=True), _ref(q, k, v, is_causal=True),
          "nan/inf causal", TOL)
    assert spy["taken"] == spy["n"] >= 2


def test_gpu_geometry_within_device_limits(cl):
    if cl.family != "gpu":
        pytest.skip("GPU family only")
    for E, Ev in [(64, 64), (40, 40), (256, 256), (3, 1)]:
        wg, bk = cl._att_gpu_geometry(E, Ev)
        assert 1 <= wg <= cl.dev.max_work_group_size and bk >= 1
        assert 4 * bk * (E + Ev) <= cl.dev.local_mem_size


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequence_memory(cl, spy, causal):
    """1x1x8192x64: the pool's peak during the call stays far below the L x S scores' bytes
    (the causal case holds one query block's mask, within the attention block size)."""
    L = 8192
    if cl.family == "gpu" and cl.is_cpu_device:
        L = 4096  # PoCL runs the GPU family's work groups slowly: a shorter sequence, same check
    rng = np.random.default_rng(0)
    q, k, v = (cl.to_device(rng.standard_normal((1, 1, L, 64)).astype(np.float32)) for _ in range(3))
    cl.synchronize()
    base = cl.pool.live
    cl.pool.reset_peak()
    y = cl.scaled_dot_product_attention(q, k, v, is_causal=causal)
    cl.synchronize()
    peak = cl.pool.reset_peak() - base
    assert spy["taken"] == spy["n"] >= 1
    assert peak < L * L * 4 / 8, f"peak {peak / 2**20:.1f} MiB for L = S = {L}"
    # a few rows against float64
    rows = np.r_[0:3, L // 2, L - 2:L]
    hq, hk, hv = (cl.to_numpy(a)[0, 0] for a in (q, k, v))
    s = (hq[rows].astype(np.float64) / 8.0) @ hk.T.astype(np.float64)
    if causal:
        s = np.where(np.arange(L)[None, :] <= rows[:, None], s, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p @ hv.astype(np.float64)) / p.sum(1, keepdims=True)
    check(np.asarray(cl.to_numpy(y))[0, 0, rows], ref, "long sequence rows", TOL)
