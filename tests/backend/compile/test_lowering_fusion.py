"""The interpreter's fusion of a GroupNorm with the SiLU that alone reads it (Lowered._fused_acts): on a
device with "norm_affine" both run as one kernel (the activation before the one rounding); a norm whose
result has another reader, or a device without the capability, runs the two ops. Likewise a conv whose one
reader is a PReLU ("conv_prelu": the OpenCL CPU family's Winograd output transform applies it). Values
against eager float64 on every backend."""
from __future__ import annotations

import copy

import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.ops import dtypes


class _Block(torch.nn.Module):
    """A ResNet block's head: GroupNorm -> SiLU -> conv; ``residual`` also reads the norm's result."""

    def __init__(self, residual: bool):
        super().__init__()
        self.norm = torch.nn.GroupNorm(8, 32)
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.residual = residual

    def forward(self, x):
        h = self.norm(x)
        y = self.conv(torch.nn.functional.silu(h))
        return y + h if self.residual else y


def _model(residual):
    torch.manual_seed(3)
    m = _Block(residual).eval()
    with torch.no_grad():
        m.norm.weight.normal_()
        m.norm.bias.normal_()
    return m


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", ["opencl", "numpy", "cpu"])
def test_group_norm_silu_runs_as_one_op(name, residual, monkeypatch):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    m = _model(residual)
    x = torch.randn(2, 32, 12, 12, generator=torch.Generator().manual_seed(1)) * 3 + 1
    with torch.no_grad():
        exact = copy.deepcopy(m).double()(x.double())
    compiled = C.compile_module(m, be)
    calls = []
    fused = type(be)._group_norm_act
    monkeypatch.setattr(type(be), "_group_norm_act",
                        lambda self, *a: (calls.append(a[5] if len(a) > 5 else None), fused(self, *a))[1])
    with torch.no_grad():
        y = compiled(x)
    assert calls[0] == (None if residual else "silu"), calls  # (a device without the kernel composes)
    assert float((y.double() - exact).norm() / exact.norm()) < 2e-6
    assert not compiled.graphs[0].stats.fallbacks


@pytest.mark.parametrize("family", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", ["float32"] + list(dtypes.HALF))
def test_group_norm_act_kernel(family, dtype, monkeypatch):
    """be._group_norm_act(..., "silu") against torch float64: the CPU family in one launch (norm_rows_aff),
    rounded once to the dtype; the GPU family as the two ops (each rounded)."""
    try:
        from anydevice.backend.devices import opencl
        be = opencl.create("opencl", 0, family=family)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"OpenCL unavailable: {exc}")
    import numpy as np
    rng = np.random.default_rng(4)
    for shape, groups, affine in [((2, 32, 8, 8), 8, True), ((1, 12, 5, 7), 3, True), ((1, 16, 4, 4), 4, False)]:
        x32 = dtypes.round_to((rng.standard_normal(shape) * 2 + 0.5).astype(np.float32), dtype)
        w32 = dtypes.round_to(rng.standard_normal(shape[1]).astype(np.float32), dtype) if affine else None
        b32 = dtypes.round_to(rng.standard_normal(shape[1]).astype(np.float32), dtype) if affine else None
        x, w, b = (None if a is None else be.to_device(a, dtype=dtype) for a in (x32, w32, b32))
        launched = []
        run = be._run
        monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
        y = be._group_norm_act(x, groups, w, b, 1e-5, "silu")
        monkeypatch.setattr(be, "_run", run)
        assert be._dtype(y) == dtype
        if family == "cpu":
            assert launched == ["norm_rows_aff"], launched
        t = [None if a is None else torch.from_numpy(a).double() for a in (x32, w32, b32)]
        ref = torch.nn.functional.silu(torch.nn.functional.group_norm(t[0], groups, t[1], t[2])).numpy()
        got = np.asarray(be.to_numpy(y), np.float64)
        # fused: one rounding of the float32 result; the GPU family's two ops: the norm's rounding, which
        # silu's slope carries, and silu's own
        rtol = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype] * (1 if family == "cpu" else 4)
        assert (np.abs(got - ref) <= np.abs(ref) * rtol + 3e-6 * np.abs(ref).max()).all(), \
            float(np.max(np.abs(got - ref)))


class _ConvPReLU(torch.nn.Module):
    """conv -> PReLU (the compact upscaler's body); ``tap`` also reads the conv's result."""

    def __init__(self, cin, cout, slopes, tap, bias=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=bias)
        self.act = torch.nn.PReLU(num_parameters=slopes)
        self.tap = tap

    def forward(self, x):
        h = self.conv(x)
        y = self.act(h)
        return y + h if self.tap else y


#: (in, out channels, image side, PReLU slopes, tap, bias): 64 -> 64 on 256-wide rows takes Winograd on the
#: OpenCL CPU family (the PReLU in its output transform), 8 -> 8 the direct kernel (the PReLU after it)
CONV_PRELU = [(64, 64, 256, 64, False, True), (64, 64, 256, 1, False, False), (64, 64, 256, 64, True, True),
              (8, 8, 40, 8, False, True)]


@pytest.mark.parametrize("cin,cout,side,slopes,tap,bias", CONV_PRELU)
@pytest.mark.parametrize("name", ["opencl", "numpy"])
def test_conv_prelu_fused_where_the_conv_allows(name, cin, cout, side, slopes, tap, bias):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    torch.manual_seed(5)
    m = _ConvPReLU(cin, cout, slopes, tap, bias).eval()
    with torch.no_grad():
        m.act.weight.uniform_(-0.5, 0.5)  # negative slopes too
    x = torch.randn(1, cin, side // 4, side, generator=torch.Generator().manual_seed(2))
    if cin == 8:  # (a NaN in a Winograd conv's input sends it to the exact direct path: the PReLU after)
        x[0, 0, 0, :3] = float("nan")
    with torch.no_grad():
        exact = copy.deepcopy(m).double()(x.double())
    compiled = C.compile_module(m, be)
    launched = []
    run = getattr(type(be), "_run", None)
    if run is not None:
        type(be)._run = lambda self, k, *a, **kw: (launched.append(k), run(self, k, *a, **kw))[1]
    try:
        with torch.no_grad():
            y = compiled(x)
    finally:
        if run is not None:
            type(be)._run = run
    nan = torch.isnan(exact)
    assert torch.equal(torch.isnan(y), nan)
    assert float((y.double()[~nan] - exact[~nan]).norm() / exact[~nan].norm()) < 2e-6
    if name == "opencl" and be.family == "cpu" and cin == 64 and not tap:
        assert ("wino_out" in launched or "wino_fused" in launched) and "prelu_ch" not in launched  # the PReLU in the output transform
    if name == "opencl" and (tap or cin == 8):
        assert "prelu_ch" in launched  # a conv result read twice, or a direct conv: the PReLU's own pass


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv_prelu_in_a_half_model(dtype):
    """A model stored in half: the conv (half_conv) and its PReLU as the two ops give them, rounded once each."""
    try:
        be = get_backend("opencl")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend opencl unavailable: {exc}")
    torch.manual_seed(6)
    m = _ConvPReLU(64, 64, 64, False).eval()
    with torch.no_grad():
        m.act.weight.uniform_(-0.5, 0.5)
    x = torch.randn(1, 64, 32, 160, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        exact = copy.deepcopy(m).double()(x.double())
        y = C.compile_module(m, be, dtype=dtype)(x)
    assert y.dtype == torch.float32 and y.shape == exact.shape  # returned in the traced dtype
    assert float((y.double() - exact).norm() / exact.norm()) < (5e-3 if dtype == "float16" else 3e-2)
