"""The OpenCL row norms with the affine fused ("norm_affine", backend/devices/opencl/norms.py, kernels/
elementwise.cl norm_rows_aff): layer_norm and group_norm with weight and/or bias in one launch on the CPU
family, in float32, float16 and bfloat16, against torch in float64; the GPU family composes (same values)."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import dtypes

try:
    from anydevice.backend.devices import opencl
    FAMILIES = {f: opencl.create("opencl", 0, family=f) for f in ("cpu", "gpu")}
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")

# (x shape, op, groups or normalized shape): inner a multiple of 16, not one, one (layer_norm), short rows
CASES = [((2, 32, 8, 8), "group_norm", 8), ((1, 12, 5, 7), "group_norm", 3), ((3, 6, 4), "group_norm", 2),
         ((2, 77, 40), "layer_norm", (40,)), ((4, 19), "layer_norm", (19,)), ((2, 3, 6, 8), "layer_norm", (6, 8)),
         ((1, 640, 16, 16), "group_norm", 32)]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", ["float32"] + list(dtypes.HALF))
@pytest.mark.parametrize("affine", ["wb", "w", "b"])
@pytest.mark.parametrize("xs,op,arg", CASES)
def test_norm_with_affine_fused(family, dtype, affine, xs, op, arg, monkeypatch):
    be = FAMILIES[family]
    assert "norm_affine" in be.caps.fused
    rng = np.random.default_rng(sum(xs) + len(affine))
    x32 = dtypes.round_to((rng.standard_normal(xs) * 2 + 0.5).astype(np.float32), dtype)
    pshape = (xs[1],) if op == "group_norm" else tuple(arg)
    w32 = dtypes.round_to(rng.standard_normal(pshape).astype(np.float32), dtype) if "w" in affine else None
    b32 = dtypes.round_to(rng.standard_normal(pshape).astype(np.float32), dtype) if "b" in affine else None
    x, w, b = (None if a is None else be.to_device(a, dtype=dtype) for a in (x32, w32, b32))
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
    y = getattr(be, op)(x, arg, w, b)
    monkeypatch.setattr(be, "_run", run)
    assert be._dtype(y) == dtype
    if family == "cpu":
        assert launched == ["norm_rows_aff"], launched  # one pass: no cast, no separate product or sum
    t = [None if a is None else torch.from_numpy(a).double() for a in (x32, w32, b32)]
    ref = getattr(torch.nn.functional, op)(t[0], arg, t[1], t[2]).numpy()
    got = np.asarray(be.to_numpy(y), np.float64)
    # float32: the norm's float32 error; half: one rounding of it to the dtype on top
    rtol = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    scale = np.abs(ref).max()
    assert (np.abs(got - ref) <= np.abs(ref) * rtol + 2e-6 * scale).all(), float(np.max(np.abs(got - ref)))


def test_norm_affine_keeps_inf_and_nan_and_offsets():
    """A NaN in a row gives that row NaN (as torch); weight and bias read from views at an offset."""
    be = FAMILIES["cpu"]
    x32 = np.random.default_rng(1).standard_normal((2, 8, 4, 4)).astype(np.float32)
    x32[1, 2, 0, 0] = np.nan
    wb = np.random.default_rng(2).standard_normal(24).astype(np.float32)
    big = be.to_device(wb)
    w, b = be._view(big, (8,), 4), be._view(big, (8,), 12)
    y = np.asarray(be.to_numpy(be.group_norm(be.to_device(x32), 4, w, b)))
    ref = torch.nn.functional.group_norm(torch.from_numpy(x32).double(), 4, torch.from_numpy(wb[4:12]).double(),
                                         torch.from_numpy(wb[12:20]).double()).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(y[ok], ref[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", ["float32"] + list(dtypes.HALF))
@pytest.mark.parametrize("xs,nw", [((2, 64, 9, 13), 64), ((1, 5, 3), 5), ((3, 7), 7), ((2, 16, 4, 4), 1),
                                   ((1, 3, 70, 90), 3)])
def test_prelu_in_one_pass(family, dtype, xs, nw, monkeypatch):
    """be._prelu (the compiled graphs' prelu): one prelu_ch launch, values as torch's prelu (NaN, Inf and
    -0.0 included), in the input's dtype (each value rounded once: exact for half inputs)."""
    be = FAMILIES[family]
    assert "prelu" in be.caps.fused
    rng = np.random.default_rng(sum(xs) + nw)
    x32 = dtypes.round_to(rng.standard_normal(xs).astype(np.float32), dtype)
    flat = x32.reshape(-1)
    flat[:4] = [np.nan, -np.inf, np.inf, -0.0]
    w32 = dtypes.round_to(rng.standard_normal(nw).astype(np.float32), dtype)
    x, w = be.to_device(x32, dtype=dtype), be.to_device(w32, dtype=dtype)
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
    y = be._prelu(x, w)
    monkeypatch.setattr(be, "_run", run)
    assert launched == ["prelu_ch"] and be._dtype(y) == dtype
    ref = torch.nn.functional.prelu(torch.from_numpy(x32).double(), torch.from_numpy(w32).double()).numpy()
    got = np.asarray(be.to_numpy(y), np.float64)
    ref = dtypes.round_to(ref.astype(np.float32), dtype).astype(np.float64)  # x * w rounded once, as torch's
    np.testing.assert_array_equal(got, ref)
    assert np.signbit(got.reshape(-1)[3]) == np.signbit(ref.reshape(-1)[3])
