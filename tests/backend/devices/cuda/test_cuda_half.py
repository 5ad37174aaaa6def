"""Half operands on the CUDA backend's tensor cores (ad_conv_gemm's HALF_IO branch: f16 / bf16
mma.sync.m16n8k16, FP32 accumulators): convs and GEMMs of two float16 or two bfloat16 arrays, against
PyTorch in float64 on the same (half) values.

Bounds: the products of two halves are exact in FP32, their sum over K rounds at most K times
(|error| <= K 2^-24 sum|x||w|, the worst case), and a conv's result is rounded once to the half dtype
(one ulp allowed): per element |y - ref| <= ulp(ref) + K 2^-24 sum|x||w|; and over the whole result, the
relative (Frobenius) error is at most one ulp of the dtype at 1 for a conv, 2e-6 for a GEMM's float32
result (FP32's own figure at K = 4096 is 1.1e-6); a wrong fragment layout is off by O(1)."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cuda_backend

from precision_helpers import within_ulp

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
_PROBE = cuda_backend.probe("cuda")
needs_gpu = pytest.mark.skipif(not _PROBE["available"], reason=f"cuda backend unavailable: {_PROBE['reason']}")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# (N, Cin, H, W, Cout, k, stride, pad, groups): SD1.5's shapes, odd sizes, K not a multiple of 16, splits
CONVS = [(1, 320, 16, 16, 320, 3, 1, 1, 1), (1, 4, 64, 64, 320, 3, 1, 1, 1), (2, 640, 8, 8, 1280, 1, 1, 0, 1),
         (1, 1280, 8, 8, 1280, 3, 1, 1, 1), (1, 320, 32, 32, 320, 3, 2, 1, 1), (3, 37, 13, 11, 45, 3, 1, 1, 1),
         (2, 64, 9, 9, 96, 5, 2, 2, 2), (1, 512, 7, 7, 512, 7, 2, 3, 1), (1, 24, 6, 6, 130, 1, 1, 0, 1),
         (1, 320, 64, 64, 4, 3, 1, 1, 1)]  # conv_out: 4 rows of a tile (the GEMM, not the direct kernel)
GEMMS = [(1, 4096, 320, 320), (1, 77, 768, 320), (2, 1024, 40, 1024), (1, 33, 17, 65), (1, 512, 4608, 64)]


@pytest.fixture(scope="module")
def be():
    if not _PROBE["available"]:
        pytest.skip(f"cuda backend unavailable: {_PROBE['reason']}")
    b = cuda_backend.create("cuda", 0)
    if not b._tiles.get("half"):
        pytest.skip(f"{b.device}: no half tensor-core tiles (sm_80 or newer)")
    return b


def _check(y, ref, mag, tdt, K, rel=None):
    ulp = torch.finfo(tdt).eps  # the spacing at 1: ulp(r) <= eps * |r|
    err = (y.double() - ref).abs()
    bound = ulp * ref.abs() + K * 2.0**-24 * mag + 1e-30
    bad = err > bound
    assert not bool(bad.any()), f"{int(bad.sum())} of {bad.numel()} beyond the bound; worst " \
        f"{float((err / bound).max()):.3g} x"
    assert float(err.norm() / ref.norm()) <= (rel or ulp)


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", CONVS, ids=lambda s: "x".join(map(str, s)))
def test_half_conv_on_the_tensor_cores(be, shape, dtype):
    N, C, H, W, Co, k, s, p, G = shape
    tdt = DTYPES[dtype]
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(N, C, H, W, generator=g).to(tdt)
    w = (torch.randn(Co, C // G, k, k, generator=g) / (C * k * k / G) ** 0.5).to(tdt)
    b = torch.randn(Co, generator=g).to(tdt)
    xd, wd, bd = (be.to_device(t.float(), "test", "x", dtype=dtype) for t in (x, w, b))
    y = be.conv2d(xd, wd, bd, stride=s, padding=p, groups=G)
    assert be._dtype(y) == dtype  # written in the operands' dtype: no float32 result, no cast pass
    got = torch.from_numpy(be.to_numpy(y))
    ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), stride=s, padding=p, groups=G)
    mag = torch.nn.functional.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), stride=s, padding=p,
                                     groups=G)
    _check(got, ref, mag, tdt, C // G * k * k)
    np.testing.assert_array_equal(be.to_numpy(xd), x.float().numpy())  # the input is unchanged


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", GEMMS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
def test_half_matmul_on_the_tensor_cores(be, shape, trans, dtype):
    B, M, K, N = shape
    tdt = DTYPES[dtype]
    g = torch.Generator().manual_seed(M * 7 + N)
    a = torch.randn(B, K, M, generator=g).transpose(1, 2) if trans[0] else torch.randn(B, M, K, generator=g)
    b = torch.randn(B, N, K, generator=g).transpose(1, 2) if trans[1] else torch.randn(B, K, N, generator=g)
    a, b = a.to(tdt), b.to(tdt)
    ad = be.to_device(a.float().contiguous(), "test", "a", dtype=dtype)
    bd = be.to_device(b.float().contiguous(), "test", "b", dtype=dtype)
    if trans[0]:
        ad = be.to_device(a.transpose(1, 2).float().contiguous(), "test", "a", dtype=dtype).transpose(0, 2, 1)
    if trans[1]:
        bd = be.to_device(b.transpose(1, 2).float().contiguous(), "test", "b", dtype=dtype).transpose(0, 2, 1)
    y = be._gemm(ad, bd)
    got = torch.from_numpy(be.to_numpy(y))
    ref = a.double() @ b.double()
    _check(got, ref, a.double().abs() @ b.double().abs(), torch.float32, K, rel=2e-6)


@needs_gpu
def test_a_half_and_a_float_operand_compute_as_float32(be):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, 10, 10, generator=g)
    w = torch.randn(48, 32, 3, 3, generator=g).half()
    xd = be.to_device(x, "test", "x")
    wd = be.to_device(w.float(), "test", "w", dtype="float16")
    y = be.conv2d(xd, wd, padding=1)
    assert be._dtype(y) == "float32"
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    assert float((torch.from_numpy(be.to_numpy(y)).double() - ref).norm() / ref.norm()) < 1e-6


# (batch, heads, L, S, E, mask, causal): SD1.5's head dims 40 / 80 / 160 (self- and cross-attention),
# SDXL's 64; odd L and S (a partial tile of query rows and of keys)
ATTENTION = [(1, 8, 256, 256, 40, None, False), (2, 8, 130, 77, 40, None, False), (1, 10, 64, 64, 64, None, False),
             (1, 5, 100, 77, 80, "full", False), (1, 2, 96, 96, 160, "row", False), (1, 4, 70, 70, 64, None, True)]


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", ATTENTION, ids=lambda c: "-".join(map(str, c)))
def test_half_attention_on_the_tensor_cores(be, case, dtype, monkeypatch):
    """softmax(q k^T s + mask) v of half q, k and v (scaled_dot_product_attention): the tensor-core kernel
    (attention_mma.cu) runs; against float64 on the same half values within a few ulps of the dtype (the
    scaled q and the probabilities are rounded to it, as FlashAttention rounds them)."""
    B, H, L, S, E, mask, causal = case
    tdt = DTYPES[dtype]
    g = torch.Generator().manual_seed(L * S + E)
    q, k, v = (torch.randn(B, H, n, E, generator=g).to(tdt) for n in (L, S, S))
    m = None
    if mask == "full":  # in the model's dtype (a float32 mask would make the attention float32)
        m = (torch.randn(L, S, generator=g) * 2).to(tdt)
    elif mask == "row":
        m = torch.where(torch.rand(1, S, generator=g) < 0.2, float("-inf"), 0.0).to(tdt)
    nat = [be.to_device(t.float(), "test", "x", dtype=dtype) for t in (q, k, v)]
    built, function = [], be._function
    monkeypatch.setattr(be, "_function", lambda f, k_, mac: built.append(k_) or function(f, k_, mac))
    y = be.scaled_dot_product_attention(*nat, attn_mask=None if m is None else be.to_device(m.float(), "test", "m",
                                                                                             dtype=dtype),
                                        is_causal=causal)
    if mask is None:
        assert "ad_attention_mma" in built and "ad_attention" not in built, built
    else:  # a masked attention keeps the float32 kernel (attention.py: the mma kernel's mask path unmeasured)
        assert "ad_attention" in built and "ad_attention_mma" not in built, built
    got = torch.from_numpy(be.to_numpy(y)).double()
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           attn_mask=None if m is None else m.double(),
                                                           is_causal=causal)
    eps = torch.finfo(tdt).eps
    assert float((got - ref).norm() / ref.norm()) <= 4 * eps
    assert float((got - ref).abs().max()) <= 16 * eps * float(ref.abs().max())


NORMS = [("group", (2, 64, 9, 9), 8, "silu"), ("group", (1, 320, 32, 32), 32, None), ("layer", (3, 77, 320), None, None),
         ("group", (1, 12, 5, 7), 3, None)]


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", *DTYPES])
@pytest.mark.parametrize("case", NORMS, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[3]}")
def test_fused_norm_in_the_stored_dtype(be, case, dtype, monkeypatch):
    """group_norm (+ silu: a compiled graph's GroupNorm + SiLU pair) and layer_norm in one launch
    (norm_cuda.cu), read and written in the stored dtype: within one rounding of the dtype of float64 on the
    same values (float32: 1e-5 relative)."""
    kind, shape, groups, act = case
    tdt = DTYPES.get(dtype, torch.float32)
    g = torch.Generator().manual_seed(len(shape) + shape[1])
    x = (torch.randn(*shape, generator=g) * 3 + 1).to(tdt)
    C = shape[1] if kind == "group" else shape[-1]
    w, b = (torch.randn(C, generator=g).to(tdt) for _ in range(2))
    xd, wd, bd = (be.to_device(t.float(), "test", "x", dtype=dtype) for t in (x, w, b))
    built, function = [], be._function
    monkeypatch.setattr(be, "_function", lambda f, k_, mac: built.append(k_) or function(f, k_, mac))
    if kind == "group":
        y = be._group_norm_act(xd, groups, wd, bd, 1e-5, act)
        ref = torch.nn.functional.group_norm(x.double(), groups, w.double(), b.double(), 1e-5)
        ref = torch.nn.functional.silu(ref) if act else ref
    else:
        y = be.layer_norm(xd, (C,), wd, bd, 1e-5)
        ref = torch.nn.functional.layer_norm(x.double(), (C,), w.double(), b.double(), 1e-5)
    assert built == ["ad_norm_rows_affine"], built
    assert be._dtype(y) == dtype
    got = torch.from_numpy(be.to_numpy(y)).double()
    if dtype == "float32":
        assert float((got - ref).norm() / ref.norm()) < 1e-5
    else:
        eps = torch.finfo(tdt).eps
        assert bool(((got - ref).abs() <= eps * ref.abs() + 1e-5 * float(ref.abs().max())).all())


# (a shape, b shape or a number, a permuted): same shapes, a per-channel bias, a (N, C, 1, 1) embedding, a last-dim
# bias, an irregular broadcast (materialised), a number on either side, a transposed (non-contiguous) operand
BINARY = [((2, 320, 16, 16), (2, 320, 16, 16), False), ((2, 320, 16, 16), (320, 1, 1), False),
          ((2, 320, 16, 16), (2, 320, 1, 1), False), ((4, 77, 768), (768,), False), ((3, 1, 5), (1, 4, 1), False),
          ((5, 7, 9), 0.3, False), (0.7, (5, 7, 9), False), ((6, 40, 33), (6, 33, 40), True), ((1,), (3, 5), False)]


def _half_pair(dtype, g, *shapes):
    tdt = DTYPES[dtype]
    return [s if isinstance(s, float) else (torch.randn(*s, generator=g) * 2).to(tdt) for s in shapes]


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", BINARY, ids=lambda c: f"{c[0]}-{c[1]}-{'T' if c[2] else ''}")
def test_half_binary_in_the_stored_dtype(be, case, dtype, monkeypatch):
    """add / sub / mul / div / minimum / maximum / pow of half arrays ("half_elementwise",
    elementwise_half_cuda.cu): one launch, the result in their dtype, equal to torch's float32 opmath rounded
    once (bit for bit but pow: one ulp); the inputs unchanged; comparisons as float32 1 / 0."""
    sa, sb, transposed = case
    g = torch.Generator().manual_seed(7)
    a, b = _half_pair(dtype, g, sa, sb)
    if transposed:
        b = b.transpose(1, 2)
    nat = [v if isinstance(v, float) else be.to_device(v.float(), "test", "x", dtype=dtype) for v in (a, b)]
    if transposed:
        nat[1] = be.transpose(be.to_device(b.transpose(1, 2).float(), "test", "x", dtype=dtype), 1, 2)
    before = [None if isinstance(v, float) else be.to_numpy(v).copy() for v in nat]
    built, function = [], be._function
    monkeypatch.setattr(be, "_function", lambda f, k_, mac: built.append(k_) or function(f, k_, mac))
    for op in ("add", "sub", "mul", "div", "minimum", "maximum", "pow"):
        if op in ("minimum", "maximum") and any(isinstance(v, float) for v in (a, b)):
            continue
        x, y = nat
        if op == "pow":  # positive bases
            x = be.abs(x) if not isinstance(x, float) else x
        built.clear()  # (after the abs: the H200's run of 2026-11-28 counted its ad_unary_h here)
        got = getattr(be, op)(x, y)
        assert be._dtype(got) == dtype, op
        assert built == ["ad_binary_h"], (op, built)
        ta, tb = (v if isinstance(v, float) else v.float() for v in (a, b))
        if op == "pow" and not isinstance(ta, float):
            ta = ta.abs()
        ref = getattr(torch, op)(ta, tb) if not isinstance(ta, float) else getattr(torch, op)(torch.tensor(ta), tb)
        ref = ref.to(DTYPES[dtype]).double()
        out = torch.from_numpy(be.to_numpy(got)).double()
        if op == "pow":
            assert within_ulp(out, ref, DTYPES[dtype]), op
        else:
            assert torch.equal(out, ref), (op, float((out - ref).abs().max()))
    for v, was in zip(nat, before):
        if was is not None:
            assert np.array_equal(be.to_numpy(v), was)
    if not any(isinstance(v, float) for v in (a, b)):
        gt = be.gt(*nat)
        assert torch.equal(torch.from_numpy(be.to_numpy(gt)).double(), (a.float() > b.float()).double())


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_half_unary_cast_and_movement_in_the_stored_dtype(be, dtype, monkeypatch):
    """unary ops of a permuted half array in its dtype (ad_unary_h: torch's float32 opmath rounded once, within
    one ulp for the transcendental ones), the casts in one launch each (ad_to_half / ad_from_half, bfloat16
    nearest even by its bits), and permute / contiguous / cat / slice moving the 16-bit values unchanged."""
    tdt = DTYPES[dtype]
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 33, 40, generator=g) * 3).to(tdt)
    xd = be.to_device(x.float(), "test", "x", dtype=dtype)
    pd = be.permute(xd, (0, 2, 1))
    assert be._dtype(pd) == dtype
    c = be.contiguous(pd)
    assert be._dtype(c) == dtype and bool(c.flags.c_contiguous)
    assert torch.equal(torch.from_numpy(be.to_numpy(c)), x.permute(0, 2, 1).float())
    cat = be.cat([xd, xd], 1)
    assert be._dtype(cat) == dtype and torch.equal(torch.from_numpy(be.to_numpy(cat)), torch.cat([x, x], 1).float())
    built, function = [], be._function
    monkeypatch.setattr(be, "_function", lambda f, k_, mac: built.append(k_) or function(f, k_, mac))
    xp = x.permute(0, 2, 1).float()
    for op, ref in (("relu", torch.relu(xp)), ("silu", torch.nn.functional.silu(xp)), ("exp", torch.exp(xp)),
                    ("gelu", torch.nn.functional.gelu(xp)), ("tanh", torch.tanh(xp)), ("sigmoid", torch.sigmoid(xp))):
        built.clear()
        y = be.unary(op, pd)
        assert be._dtype(y) == dtype and built == ["ad_unary_h"], (op, built)
        out, r = torch.from_numpy(be.to_numpy(y)).double(), ref.to(tdt).double()
        slack = 2.0**-21 * float(xp.abs().max()) if op == "gelu" else 0.0  # the float32 gelu's 1 + erf cancels
        assert within_ulp(out, r, tdt, slack), op
    y = be.clamp(pd, min=-1.0, max=2.0)
    assert torch.equal(torch.from_numpy(be.to_numpy(y)).double(), xp.clamp(-1.0, 2.0).to(tdt).double())
    # casts: float32 -> half rounds as torch (nearest even), NaN and Inf kept; half -> float32 exact
    v = torch.cat([torch.randn(1000, generator=g) * 100, torch.tensor([float("nan"), float("inf"), -float("inf"),
                                                                       65504.0, 70000.0, 1e-8, -0.0])])
    built.clear()
    h = be._cast(be.to_device(v, "test", "v"), dtype)
    assert built == ["ad_to_half"], built
    got = torch.from_numpy(be.to_numpy(h))
    assert torch.equal(got.isnan(), v.to(tdt).float().isnan())
    assert torch.equal(got.nan_to_num(), v.to(tdt).float().nan_to_num())
    back = be._cast(h, "float32")
    assert be._dtype(back) == "float32" and torch.equal(torch.from_numpy(be.to_numpy(back)).nan_to_num(),
                                                         got.nan_to_num())
