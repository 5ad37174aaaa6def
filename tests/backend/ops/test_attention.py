"""scaled_dot_product_attention on every backend against torch in float64 (the precision suite's
bar: normwise relative error <= 1e-6, NaN/Inf positions exact, inputs never written)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hypothesis import given
from hypothesis import strategies as st

from anydevice.backend import AnyDeviceError
from anydevice.backend.system.config import workspace_budget_bytes
from anydevice.backend.ops.plans import attention_plan

from precision_helpers import HYP, _assert_unchanged, _snapshot, check, random_mask, relerr, t64, tol_for

SDPA = F.scaled_dot_product_attention


def _data(seed, sq, sk, sv):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in (sq, sk, sv))


def _ref(q, k, v, mask=None, **kw):
    m = None if mask is None else (torch.from_numpy(mask) if mask.dtype == np.bool_ else t64(mask))
    return SDPA(t64(q), t64(k), t64(v), attn_mask=m, **kw).numpy()


SHAPES = [  # (query, key, value)
    ((5, 8), (7, 8), (7, 4)),                               # 2-D
    ((3, 6, 16), (3, 9, 16), (3, 9, 16)),                   # 3-D
    ((2, 4, 11, 32), (2, 4, 11, 32), (2, 4, 11, 8)),        # 4-D, L == S
    ((1, 2, 1, 8), (1, 2, 13, 8), (1, 2, 13, 8)),           # one query
    ((2, 3, 17, 8), (1, 3, 5, 8), (2, 1, 5, 3)),            # broadcast batch dims
    ((2, 2, 3, 9, 4), (2, 2, 3, 4, 4), (2, 2, 3, 4, 5)),    # 5-D
    ((1, 1, 64, 64), (1, 1, 128, 64), (1, 1, 128, 64)),
]


@pytest.mark.parametrize("sq,sk,sv", SHAPES, ids=[f"{'x'.join(map(str, s[0]))}-S{s[1][-2]}" for s in SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_shapes(backend_target, sq, sk, sv, causal):
    q, k, v = _data(sum(sq) + sum(sk), sq, sk, sv)
    y = backend_target.scaled_dot_product_attention(q, k, v, is_causal=causal)
    check(y, _ref(q, k, v, is_causal=causal), f"sdpa {sq} {sk} causal={causal}", tol_for(backend_target))


@pytest.mark.parametrize("scale", [0.05, 1.0, 2.5, -0.7])
def test_sdpa_scale(backend_target, scale):
    q, k, v = _data(3, (2, 3, 6, 8), (2, 3, 10, 8), (2, 3, 10, 8))
    y = backend_target.scaled_dot_product_attention(q, k, v, scale=scale)
    check(y, _ref(q, k, v, scale=scale), f"scale {scale}", tol_for(backend_target))


MASKS = [(6, 10), (1, 10), (1, 1), (3, 1, 10), (2, 3, 6, 10), (2, 1, 6, 1), (3, 6, 10)]


@pytest.mark.parametrize("ms", MASKS, ids=["x".join(map(str, m)) for m in MASKS])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_sdpa_masks(backend_target, ms, mask_kind):
    q, k, v = _data(5, (2, 3, 6, 8), (2, 3, 10, 8), (2, 3, 10, 4))
    rng = np.random.default_rng(len(ms))
    mask = random_mask(rng, ms, mask_kind)
    y = backend_target.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    check(y, _ref(q, k, v, mask), f"mask {mask_kind} {ms}", tol_for(backend_target))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_sdpa_fully_masked_rows_are_zero(backend_target, mask_kind):
    """torch 2.13 (CPU, float32 and float64) gives zeros for a query whose keys are all masked."""
    q, k, v = _data(6, (1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 3))
    keep = np.ones((4, 5), bool)
    keep[1] = False
    keep[3, :4] = False
    mask = keep if mask_kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    ref = _ref(q, k, v, mask)
    assert (ref[:, :, 1] == 0).all()
    y = np.asarray(backend_target.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    check(y, ref, "fully masked rows", tol_for(backend_target))
    assert (y[:, :, 1] == 0).all()


@pytest.mark.parametrize("L,S", [(3, 9), (9, 3), (1, 5), (5, 1), (16, 16)])
def test_sdpa_causal_l_ne_s(backend_target, L, S):
    """torch's causal mask is top-left aligned: query i sees keys j <= i, also when L != S."""
    q, k, v = _data(L * 10 + S, (2, 2, L, 8), (2, 2, S, 8), (2, 2, S, 6))
    y = backend_target.scaled_dot_product_attention(q, k, v, is_causal=True)
    check(y, _ref(q, k, v, is_causal=True), f"causal L={L} S={S}", tol_for(backend_target))


@pytest.mark.parametrize("hq,hk,hv", [(4, 2, 2), (6, 3, 1), (8, 1, 8), (4, 4, 4)])
def test_sdpa_gqa(backend_target, hq, hk, hv):
    q, k, v = _data(hq + hk, (2, hq, 5, 8), (2, hk, 7, 8), (2, hv, 7, 4))
    y = backend_target.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    check(y, _ref(q, k, v, enable_gqa=True, is_causal=True), f"gqa {hq}/{hk}/{hv}", tol_for(backend_target))


def test_sdpa_large_logits(backend_target):
    """Scores up to ~+-400: exp overflows without the row max subtracted. (At +-1500 float32
    rounding of the scores alone gives 1.5e-6, torch's float32 result as well.)"""
    q, k, v = _data(9, (1, 2, 12, 16), (1, 2, 20, 16), (1, 2, 20, 16))
    q = q * 5
    k = k * 5
    y = backend_target.scaled_dot_product_attention(q, k, v, scale=1.0)
    check(y, _ref(q, k, v, scale=1.0), "large logits", tol_for(backend_target))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask", [None, "bool-rows", "float-keys"])
def test_sdpa_blocked_matches(backend_target, monkeypatch, causal, mask):
    """A small workspace budget splits the queries into several blocks (the last one shorter):
    the same result as torch and as one block."""
    if causal and mask:
        pytest.skip("torch refuses attn_mask with is_causal")
    L, S = 203, 150
    q, k, v = _data(11, (1, 2, L, 16), (1, 2, S, 16), (1, 2, S, 8))
    rng = np.random.default_rng(12)
    m = None
    if mask == "bool-rows":
        m = rng.random((L, S)) > 0.3
        m[5] = False
    elif mask == "float-keys":
        m = rng.standard_normal((2, 1, S)).astype(np.float32)
    be = backend_target
    whole = np.asarray(be.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal))
    monkeypatch.setenv("ANYDEVICE_WORKSPACE_MB", str(16 * 2 * S * 4 / 2**20))  # 16 query rows per block
    budget = workspace_budget_bytes()
    calls = []
    inner = be._attention_rows

    def spy(qb, kt, vb, mb):
        rows = be._shape(qb)[-2]
        calls.append(rows)
        assert 2 * rows * S * 4 <= budget
        return inner(qb, kt, vb, mb)

    monkeypatch.setattr(be, "_attention_rows", spy)
    y = np.asarray(be.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal))
    blocks = math.ceil(L / (budget // (2 * S * 4)))
    assert blocks > 1 and len(calls) == blocks and sum(calls) == L
    check(y, _ref(q, k, v, m, is_causal=causal), "blocked", tol_for(be))
    assert relerr(y, whole) <= 1e-6


def test_sdpa_long_sequence_plan_within_budget():
    """1x8x4096x64 at the default budget: never the full 4096x4096 scores of every head at once."""
    plan = attention_plan("sdpa", (1, 8, 4096, 64), (1, 8, 4096, 64), (1, 8, 4096, 64), None,
                          0.0, False, None, False)
    from anydevice.backend import get_backend
    rows = get_backend("numpy")._attention_block_rows(plan)
    assert rows < 4096 and 8 * rows * 4096 * 4 <= workspace_budget_bytes()


def test_sdpa_nan_inf_like_torch(backend_target):
    q, k, v = _data(13, (1, 2, 6, 4), (1, 2, 5, 4), (1, 2, 5, 3))
    q[0, 0, 1, 2] = np.nan
    k[0, 1, 3, 0] = np.inf
    v[0, 0, 4, 1] = -np.inf
    q[0, 1, 4, 1] = -np.inf
    be = backend_target
    check(be.scaled_dot_product_attention(q, k, v), _ref(q, k, v), "nan/inf", tol_for(be))
    keep = np.tril(np.ones((6, 5), bool))
    check(be.scaled_dot_product_attention(q, k, v, attn_mask=keep), _ref(q, k, v, keep), "nan/inf mask", tol_for(be))
    check(be.scaled_dot_product_attention(q, k, v, is_causal=True), _ref(q, k, v, is_causal=True),
          "nan/inf causal", tol_for(be))


@pytest.mark.parametrize("sq,sk,sv", [((1, 2, 3, 4), (1, 2, 0, 4), (1, 2, 0, 6)),
                                      ((1, 2, 0, 4), (1, 2, 5, 4), (1, 2, 5, 6)),
                                      ((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 6)),
                                      ((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 6))],
                         ids=["S0", "L0", "N0", "E0"])
def test_sdpa_empty_like_torch(backend_target, sq, sk, sv):
    q, k, v = _data(14, sq, sk, sv)
    check(backend_target.scaled_dot_product_attention(q, k, v), _ref(q, k, v), f"empty {sq} {sk}")


@pytest.mark.parametrize("as_torch", [False, True])
def test_sdpa_inputs_unchanged_and_kind(backend_target, as_torch):
    q, k, v = _data(15, (2, 2, 7, 8), (2, 2, 9, 8), (2, 2, 9, 8))
    m = np.random.default_rng(0).random((7, 9)) > 0.5
    args = [q, k, v, m]
    if as_torch:
        args = [torch.from_numpy(a) for a in args]
    before = _snapshot(*args)
    y = backend_target.scaled_dot_product_attention(*args[:3], attn_mask=args[3])
    _assert_unchanged(before, _snapshot(*args))
    assert isinstance(y, torch.Tensor) == as_torch
    check(y, _ref(q, k, v, m), "kind", tol_for(backend_target))


BAD = [
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(dropout_p=1.5), "dropout_p"),
    (dict(attn_mask=np.ones((3, 5), bool), is_causal=True), "attn_mask"),
    (dict(attn_mask=np.ones((3, 4), np.float32)), "attn_mask"),
    (dict(attn_mask=np.ones((2, 2, 3, 5), np.float32)), "attn_mask"),
    (dict(scale="x"), "scale"),
    (dict(attn_mask=np.ones(5, bool)), "attn_mask"),
    (dict(is_causal=1), "is_causal"),
]


@pytest.mark.parametrize("kw,arg", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_sdpa_refused(kw, arg):
    from anydevice.backend import get_backend
    q, k, v = _data(16, (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6))
    with pytest.raises(AnyDeviceError) as exc:
        get_backend("numpy").scaled_dot_product_attention(q, k, v, **kw)
    assert exc.value.arg == arg


@pytest.mark.parametrize("sq,sk,sv,gqa,arg", [
    ((4,), (5, 4), (5, 6), False, "query"),
    ((1, 2, 3, 4), (1, 2, 5, 3), (1, 2, 5, 6), False, "key"),
    ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 4, 6), False, "value"),
    ((1, 4, 3, 4), (1, 2, 5, 4), (1, 2, 5, 6), False, "key"),
    ((1, 4, 3, 4), (1, 3, 5, 4), (1, 3, 5, 6), True, "key"),
    ((1, 4, 3, 4), (1, 2, 5, 4), (1, 3, 5, 6), True, "value"),
])
def test_sdpa_shape_errors(sq, sk, sv, gqa, arg):
    from anydevice.backend import get_backend
    q, k, v = _data(17, sq, sk, sv)
    with pytest.raises(AnyDeviceError) as exc:
        get_backend("numpy").scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    assert exc.value.arg == arg
    with pytest.raises(RuntimeError):  # torch refuses them too
        SDPA(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), enable_gqa=gqa)


def test_sdpa_bench_case_runs(backend_target):
    """The bench's attention case (make + torch_fn), on a small shape."""
    from anydevice.backend.bench import ops as bench
    case = next(c for c in bench.CASES if c.name.startswith("attention"))
    assert case.torch_fn == "F.scaled_dot_product_attention" and case.op == "scaled_dot_product_attention"
    small = bench.Case("attention small", case.op, (), (), {}, 4.0 * 2 * 32 * 32 * 8,
                       make=lambda rng: ([rng.standard_normal((1, 2, 32, 8)).astype(np.float32) for _ in range(3)], {}),
                       torch_fn=case.torch_fn)
    row = bench.bench_case(backend_target, small, budget_s=0.01, max_reps=3)
    assert row.ms > 0 and row.torch_ms > 0


@st.composite
def sdpa_args(draw):
    lead = draw(st.sampled_from([(), (1,), (2,), (2, 1), (1, 3), (2, 2)]))
    heads = draw(st.sampled_from([1, 2, 4]))
    gqa = draw(st.booleans()) and heads > 1
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0])) if gqa else heads
    L, S = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    E, Ev = draw(st.sampled_from([1, 3, 8, 16])), draw(st.sampled_from([1, 4, 8]))
    mask = draw(st.sampled_from([None, None, "bool", "float", "causal"]))
    mshape = draw(st.sampled_from([(L, S), (1, S), (heads, L, S), (heads, 1, S)]))
    scale = draw(st.sampled_from([None, None, 0.5, 2.0]))
    block_rows = draw(st.sampled_from([None, 1, 3, 7]))
    seed = draw(st.integers(0, 2**31 - 1))
    return lead, heads, kv_heads, gqa, L, S, E, Ev, mask, mshape, scale, block_rows, seed


@HYP
@given(a=sdpa_args())
def test_sdpa_random(backend_target, a):
    lead, heads, kv_heads, gqa, L, S, E, Ev, mask, mshape, scale, block_rows, seed = a
    q, k, v = _data(seed, lead + (heads, L, E), lead + (kv_heads, S, E), lead + (kv_heads, S, Ev))
    rng = np.random.default_rng(seed + 1)
    m = None
    if mask == "bool":
        m = rng.random(mshape) > 0.3
    elif mask == "float":
        m = rng.standard_normal(mshape).astype(np.float32)
        m[rng.random(mshape) < 0.2] = -np.inf
    kw = dict(is_causal=mask == "causal", scale=scale, enable_gqa=gqa)
    be = backend_target
    if block_rows is None:
        y = be.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    else:  # force blocks of block_rows query rows
        batch = math.prod(lead) * heads
        old = be.attention_block_bytes
        be.attention_block_bytes = 4 * batch * S * block_rows
        try:
            y = be.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
        finally:
            be.attention_block_bytes = old
    check(y, _ref(q, k, v, m, **kw), f"sdpa {a}", tol_for(be))
