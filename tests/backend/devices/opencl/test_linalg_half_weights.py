"""conv2d and linear with a weight stored in half on OpenCL ("half_weights": the CPU family's pack_a,
pack_b, wino_filter and conv2d_direct read float16/bfloat16 words and convert in registers; the other
paths convert the weight first). Each path gives what the float32 path gives on the rounded weight
(normwise 1e-6, the precision suite's bar), on both kernel families, and no float32 copy of the weight
is made on the paths that read it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from anydevice.backend.ops import dtypes

try:
    from anydevice.backend.devices import opencl
    FAMILIES = {f: opencl.create("opencl", 0, family=f) for f in ("cpu", "gpu")}
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

# (x shape, w shape, options): the CPU family's winograd, direct and im2col+GEMM paths, grouped, strided
CONVS = [((1, 32, 12, 12), (40, 32, 3, 3), {"padding": 1}),            # winograd
         ((2, 3, 30, 33), (8, 3, 3, 3), {"padding": 1}),               # direct
         ((1, 64, 9, 7), (48, 64, 3, 3), {"stride": 2, "padding": 1}),  # im2col + GEMM
         ((1, 8, 10, 26), (8, 2, 3, 3), {"groups": 4, "padding": 1}),   # grouped, direct
         ((1, 16, 6, 6), (24, 16, 1, 1), {})]
LINEARS = [((7, 96), (130, 96)), ((2, 3, 300), (64, 300)), ((3, 4), (5, 4))]  # GEMM; batched; small


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("xs,ws,kw", CONVS)
def test_conv2d_reads_the_half_weight(family, dtype, xs, ws, kw):
    be = FAMILIES[family]
    assert "half_weights" in be.caps.fused
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    wh = be.to_device(w, dtype=dtype)
    assert be._dtype(wh) == dtype
    xd = be.to_device(x)
    y = be.to_numpy(be.conv2d(xd, wh, b, **kw))
    ref = be.to_numpy(be.conv2d(xd, be.to_device(dtypes.round_to(w, dtype)), b, **kw))
    assert _rel(y, ref) <= 1e-6


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("xs,ws", LINEARS)
def test_linear_reads_the_half_weight(family, dtype, xs, ws):
    be = FAMILIES[family]
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    y = be.to_numpy(be.linear(be.to_device(x), be.to_device(w, dtype=dtype), b))
    ref = x.astype(np.float64) @ dtypes.round_to(w, dtype).astype(np.float64).T + b
    assert _rel(y, ref) <= 1e-6


def test_no_float32_copy_of_the_weight(monkeypatch):
    """On the CPU family's im2col path the weight is never converted: _cast is not called for it."""
    be = FAMILIES["cpu"]
    casts = []
    real = type(be)._cast
    monkeypatch.setattr(type(be), "_cast", lambda self, x, dtype: casts.append((x.shape, dtype)) or real(self, x, dtype))
    w = be.to_device(np.ones((48, 64, 3, 3), np.float32), dtype="float16")
    x = be.to_device(np.ones((1, 64, 9, 7), np.float32))
    be.conv2d(x, w, None, stride=2, padding=1)
    be.linear(be.to_device(np.ones((77, 768), np.float32)), be.to_device(np.ones((320, 768), np.float32), dtype="bfloat16"))
    assert [c for c in casts if c[1] == "float32"] == []


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
def test_matmul_reads_a_half_2d_operand(family, dtype):
    """matmul(x, w_t) with w_t a 2-D half native (a compiled model's transposed linear weight)."""
    be = FAMILIES[family]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((77, 96)).astype(np.float32)
    wt = rng.standard_normal((96, 130)).astype(np.float32)
    y = be.to_numpy(be.matmul(be.to_device(x), be.to_device(wt, dtype=dtype)))
    ref = x.astype(np.float64) @ dtypes.round_to(wt, dtype).astype(np.float64)
    assert _rel(y, ref) <= 1e-6


def test_reshape_keeps_half_storage():
    """reshape / view of a half native give the array as it is stored, in the new shape (no float32 copy)."""
    be = FAMILIES["cpu"]
    h = be.to_device(np.arange(24, dtype=np.float32).reshape(4, 6), dtype="float16")
    r = be.reshape(h, (2, 12))
    assert be._dtype(r) == "float16" and r.block is h.block
    np.testing.assert_array_equal(be.to_numpy(be.view(h, 3, 8)), np.arange(24, dtype=np.float32).reshape(3, 8))


UNARY = [("relu", {}), ("silu", {}), ("gelu", {"approximate": "tanh"}), ("exp", {}), ("clamp", {"min": -0.5, "max": 0.7})]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
def test_elementwise_on_half_arrays(family, dtype):
    """unary and binary ops on half natives of one dtype run on them as stored ("half_elementwise"):
    the result has that dtype and equals the float32 op on the same values rounded once."""
    be = FAMILIES[family]
    assert "half_elementwise" in be.caps.fused
    rng = np.random.default_rng(9)
    a32 = dtypes.round_to(rng.standard_normal((3, 5, 7)).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal((5, 1)).astype(np.float32), dtype)
    a, b = be.to_device(a32, dtype=dtype), be.to_device(b32, dtype=dtype)
    for op, kw in UNARY:
        y = be.unary(op, a, **kw)
        assert be._dtype(y) == dtype
        ref = be.to_numpy(be.unary(op, be.to_device(a32), **kw))
        np.testing.assert_array_equal(be.to_numpy(y), dtypes.round_to(ref, dtype))
    for op in ("add", "sub", "mul", "div", "maximum"):
        for x, z in ((a, b), (b, a), (a, a), (a, 2.5), (1.5, a)):
            y = getattr(be, op)(x, z)
            assert be._dtype(y) == dtype, (op, x, z)
            ref = getattr(be, op)(*(be.to_device(be.to_numpy(v)) if not isinstance(v, float) else v for v in (x, z)))
            np.testing.assert_array_equal(be.to_numpy(y), dtypes.round_to(be.to_numpy(ref), dtype))
    mixed = be.add(a, be.to_device(a32))  # half + float32: float32, as torch promotes
    assert be._dtype(mixed) == "float32"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
def test_movement_on_half_arrays_converts_nothing(family, dtype, monkeypatch):
    """permute, transpose, slice, narrow, split, chunk, expand, contiguous, cat and stack on half natives of one
    dtype ("half_movement") keep the dtype, give the float32 op's values exactly, and launch no cast."""
    be = FAMILIES[family]
    assert "half_movement" in be.caps.fused
    rng = np.random.default_rng(4)
    a32 = dtypes.round_to(rng.standard_normal((2, 3, 5, 7)).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal((2, 4, 5, 7)).astype(np.float32), dtype)
    a, b = be.to_device(a32, dtype=dtype), be.to_device(b32, dtype=dtype)
    a1 = be.to_device(dtypes.round_to(rng.standard_normal((1, 3, 1, 7)).astype(np.float32), dtype), dtype=dtype)
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *x, **k: (launched.append(name), run(name, *x, **k))[1])
    got = {
        "permute": be.permute(a, (0, 2, 3, 1)), "transpose": be.transpose(a, 1, 3), "slice": be.slice(a, 2, 1, 4),
        "narrow": be.narrow(a, 3, 2, 3), "split": be.split(a, 2, dim=1)[1], "chunk": be.chunk(a, 2, dim=3)[0],
        "expand": be.expand(a1, 2, 3, 5, 7), "contiguous": be.contiguous(a), "cat": be.cat([a, b], dim=1),
        "stack": be.stack([a, a], dim=2)}
    assert not [n for n in launched if n.startswith("cast")], launched
    ref = {"permute": a32.transpose(0, 2, 3, 1), "transpose": a32.swapaxes(1, 3), "slice": a32[:, :, 1:4],
           "narrow": a32[..., 2:5], "split": a32[:, 2:], "chunk": a32[..., :4],
           "expand": np.broadcast_to(be.to_numpy(a1), (2, 3, 5, 7)), "contiguous": a32,
           "cat": np.concatenate([a32, b32], 1), "stack": np.stack([a32, a32], 2)}
    for k, y in got.items():
        assert be._dtype(y) == dtype, k
        np.testing.assert_array_equal(be.to_numpy(y), ref[k], err_msg=k)
    assert be._dtype(be.cat([a, be.to_device(b32)], dim=1)) == "float32"  # half with float32: float32


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
def test_norms_read_half_inputs_as_stored(family, dtype, monkeypatch):
    """group_norm / layer_norm of a half input ("half_norm"): the fused row norm reads it as stored (no cast
    of the input), the result has the dtype and equals the float32 norm of the same values rounded once."""
    be = FAMILIES[family]
    assert "half_norm" in be.caps.fused
    rng = np.random.default_rng(6)
    x32 = dtypes.round_to((rng.standard_normal((2, 8, 6, 5)) * 3 + 1).astype(np.float32), dtype)
    w32 = dtypes.round_to(rng.standard_normal(8).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal(8).astype(np.float32), dtype)
    x, w, b = (be.to_device(a, dtype=dtype) for a in (x32, w32, b32))
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append((name, a)), run(name, *a, **k))[1])
    y = be.group_norm(x, 4, w, b)
    z = be.layer_norm(x, (6, 5))
    assert [n for n, _ in launched if n.startswith("norm_rows")], launched
    assert not [n for n, a in launched if n == "cast_to_f32" and any(v is x.buffer for v in a)], launched
    monkeypatch.setattr(be, "_run", run)
    assert be._dtype(y) == be._dtype(z) == dtype
    ry = be.group_norm(be.to_device(x32), 4, be.to_device(w32), be.to_device(b32))
    rz = be.layer_norm(be.to_device(x32), (6, 5))
    np.testing.assert_array_equal(be.to_numpy(y), dtypes.round_to(be.to_numpy(ry), dtype))
    np.testing.assert_array_equal(be.to_numpy(z), dtypes.round_to(be.to_numpy(rz), dtype))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("mnk", [(77, 96, 80), (130, 33, 300)])
def test_matmul_packs_a_half_activation_as_stored(family, dtype, mnk, monkeypatch):
    """A plain 2-D matmul of half natives ("half_gemm"): the activation is packed from half as well as the
    weight (the CPU family launches no cast of it); the result is the float32 product of the same values
    rounded once (within float32 summation order: 1e-6 of the float32 result before rounding)."""
    be = FAMILIES[family]
    assert "half_gemm" in be.caps.fused
    M, N, K = mnk
    rng = np.random.default_rng(8)
    a32 = dtypes.round_to(rng.standard_normal((M, K)).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal((K, N)).astype(np.float32), dtype)
    a, b = be.to_device(a32, dtype=dtype), be.to_device(b32, dtype=dtype)
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *x, **k: (launched.append((name, x)), run(name, *x, **k))[1])
    y = be.matmul(a, b)
    monkeypatch.setattr(be, "_run", run)
    if family == "cpu":
        assert not [n for n, x in launched if n == "cast_to_f32" and any(v is a.buffer for v in x)], launched
        assert "cast_from_f32" not in [n for n, x in launched], launched  # gemm_cpu stored the half result
    assert be._dtype(y) == dtype
    ref = a32.astype(np.float64) @ b32.astype(np.float64)
    got = np.asarray(be.to_numpy(y), np.float64)
    # one rounding to the half dtype of a float32 result
    ulp = np.abs(dtypes.round_to(ref.astype(np.float32), dtype).astype(np.float64) - ref)
    assert (np.abs(got - ref) <= ulp + 1e-6 * np.abs(ref).max() + np.abs(ref) * (2e-3 if dtype == "float16" else 1.6e-2)).all()


HALF_CONV_CASES = CONVS + [((1, 40, 17, 19), (48, 40, 3, 3), {"padding": 1}),          # winograd, odd sizes
                           ((1, 32, 64, 64), (32, 32, 3, 3), {"padding": 1}),          # rows of 32 tiles (runs)
                           ((2, 32, 66, 71), (40, 32, 3, 3), {"padding": 1}),          # runs and row-crossing groups
                           ((2, 16, 8, 8), (16, 16, 3, 3), {"padding": 1, "padding_mode": "reflect"}),
                           ((1, 32, 12, 12), (40, 32, 3, 3), {"padding": 1, "inf": True})]  # Winograd's fallback


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("xs,ws,kw", HALF_CONV_CASES)
def test_conv2d_reads_a_half_input_as_stored(family, dtype, xs, ws, kw, monkeypatch):
    """A conv of a half input, weight and bias ("half_conv"): the CPU family's Winograd and im2col paths read
    the input's 16-bit words (no cast of it is launched) and write the half result themselves; every
    path gives the float32 conv of the same values rounded once to the input's dtype (1e-6 of the result's
    largest value for float32 summation order, plus one rounding). An Inf in the input takes Winograd's
    exact fallback and gives torch's Inf/NaN pattern."""
    be = FAMILIES[family]
    assert "half_conv" in be.caps.fused
    kw = dict(kw)
    inf = kw.pop("inf", False)
    rng = np.random.default_rng(sum(xs) + sum(ws) + 1)
    x32 = dtypes.round_to(rng.standard_normal(xs).astype(np.float32), dtype)
    if inf:
        x32[0, 1, 3, 4] = np.inf
    w32 = dtypes.round_to((rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal(ws[0]).astype(np.float32), dtype)
    x, w, b = (be.to_device(v, dtype=dtype) for v in (x32, w32, b32))
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append((name, a, k.get("params"))), run(name, *a, **k))[1])
    y = be.conv2d(x, w, b, **kw)
    monkeypatch.setattr(be, "_run", run)
    assert be._dtype(y) == dtype
    names = [n for n, _, _ in launched]
    if family == "cpu" and not inf and kw.get("padding_mode", "zeros") == "zeros" and ("wino_in" in names or "wino_fused" in names or "im2col_pack" in names):
        assert not [n for n, a, _ in launched if n == "cast_to_f32" and any(v is x.buffer for v in a)], names
        assert "cast_from_f32" not in names, names  # wino_out / gemm_cpu stored the half result
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x32).double(), torch.from_numpy(w32).double(),
                                     torch.from_numpy(b32).double(), **kw).numpy() if not kw.get("padding_mode") else \
        torch.nn.Conv2d(ws[1], ws[0], ws[2], padding=kw["padding"], padding_mode=kw["padding_mode"]).double()._conv_forward(
            torch.from_numpy(x32).double(), torch.from_numpy(w32).double(), torch.from_numpy(b32).double()).detach().numpy()
    got = np.asarray(be.to_numpy(y), np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    ok = np.isfinite(ref)
    ref, got = ref[ok], got[ok]
    ulp = np.abs(dtypes.round_to(ref.astype(np.float32), dtype).astype(np.float64) - ref)
    tol = ulp + 1e-6 * np.abs(ref).max() + np.abs(ref) * (1e-3 if dtype == "float16" else 8e-3)
    assert (np.abs(got - ref) <= tol).all(), float(np.max(np.abs(got - ref) - tol))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("n", [1, 3])
def test_a_chunked_half_conv_stays_half(family, dtype, n, monkeypatch):
    """A conv long enough to be cut into cancel chunks (here: a tiny chunk time) with a half input: its row
    bands and image batches are cut, computed and joined in the input's dtype (no float32 copy of the input,
    no cast of the result), within one rounding of float64 as the whole conv."""
    from anydevice.backend.system import cancel
    be = FAMILIES[family]
    monkeypatch.setattr(cancel, "CHUNK_SECONDS", 1e-5)
    rng = np.random.default_rng(n)
    xs, ws = (n, 64, 12, 136), (64, 64, 3, 3)  # (the CPU family's Winograd: 64 channels, rows past 128)
    x32 = dtypes.round_to(rng.standard_normal(xs).astype(np.float32), dtype)
    w32 = dtypes.round_to((rng.standard_normal(ws) / np.sqrt(576)).astype(np.float32), dtype)
    b32 = dtypes.round_to(rng.standard_normal(64).astype(np.float32), dtype)
    x, w, b = (be.to_device(v, dtype=dtype) for v in (x32, w32, b32))
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append((name, a)), run(name, *a, **k))[1])
    y = be.conv2d(x, w, b, 1, 1)
    monkeypatch.setattr(be, "_run", run)
    names = [nm for nm, _ in launched]
    assert be._dtype(y) == dtype
    assert (names.count("wino_in") + names.count("wino_fused") if family == "cpu" else names.count("ad_conv_gemm")) > 1 \
        or family == "gpu", names  # chunked
    if family == "cpu":
        assert "cast_from_f32" not in names and not [nm for nm, a in launched if nm == "cast_to_f32"
                                                     and any(v is x.buffer for v in a)], names
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.conv2d(torch.from_numpy(x32).double(), torch.from_numpy(w32).double(),
                                     torch.from_numpy(b32).double(), padding=1).numpy()
    got = np.asarray(be.to_numpy(y), np.float64)
    ulp = np.abs(dtypes.round_to(ref.astype(np.float32), dtype).astype(np.float64) - ref)
    tol = ulp + 1e-6 * np.abs(ref).max() + np.abs(ref) * (1e-3 if dtype == "float16" else 8e-3)
    assert (np.abs(got - ref) <= tol).all()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", list(dtypes.HALF))
@pytest.mark.parametrize("xs,ws,bias,chunk", [((3, 70, 300), (133, 300), "half", 0), ((256, 64), (640, 64), None, 0),
                                             ((77, 768), (320, 768), "half", 64 * 768 * 4),  # B in column chunks
                                             ((40, 96), (200, 96), "float32", 0),  # float32 bias: a float32 result
                                             ((5, 8), (6, 8), "half", 0)])  # small: gemm_small
def test_linear_reads_a_half_input_as_stored(family, dtype, xs, ws, bias, chunk, monkeypatch):
    """A linear layer of half natives ("half_linear"): on the CPU family the input is packed from half, the result
    stored in the half dtype by the GEMM with the bias added in its epilogue (per column, across B's column chunks):
    no cast launched, and the bits of the float32 path (input converted, product, bias added, result rounded once).
    A float32 bias makes the result float32 (torch's promotion); the GPU family and small products convert first."""
    from anydevice.backend.devices.opencl import linalg
    be = FAMILIES[family]
    assert "half_linear" in be.caps.fused
    if chunk:
        monkeypatch.setattr(linalg, "GEMM_B_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(len(xs) + ws[0])
    x32 = dtypes.round_to(rng.standard_normal(xs).astype(np.float32), dtype)
    w32 = dtypes.round_to((rng.standard_normal(ws) / np.sqrt(ws[1])).astype(np.float32), dtype)
    b32 = None if bias is None else rng.standard_normal(ws[0]).astype(np.float32)
    if bias == "half":
        b32 = dtypes.round_to(b32, dtype)
    x, w = be.to_device(x32, dtype=dtype), be.to_device(w32, dtype=dtype)
    b = None if bias is None else be.to_device(b32, dtype=dtype if bias == "half" else "float32")
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append((name, a)), run(name, *a, **k))[1])
    y = be.linear(x, w, b)
    monkeypatch.setattr(be, "_run", run)
    want = "float32" if bias == "float32" else dtype
    assert be._dtype(y) == want
    fused = family == "cpu" and np.prod(xs) * ws[0] > 48 ** 3 and bias != "float32"
    if fused:  # (the bias alone, ws[0] values, is converted)
        assert not [n for n, a in launched if n == "cast_to_f32" and any(v is x.buffer for v in a)], launched
        assert "cast_from_f32" not in [n for n, a in launched], launched
    got = be.to_numpy(y)
    monkeypatch.setattr(be, "caps", dataclasses.replace(be.caps, fused=be.caps.fused - {"half_linear"}))
    plain = be.to_numpy(be.linear(x, w, b))  # the input converted to float32 first
    np.testing.assert_array_equal(got, plain)
    ref = x32.astype(np.float64) @ w32.T.astype(np.float64) + (0.0 if b32 is None else b32)
    ulp = np.abs(dtypes.round_to(ref.astype(np.float32), want).astype(np.float64) - ref)
    assert (np.abs(got - ref) <= ulp + 1e-5 * np.abs(ref).max()).all()
