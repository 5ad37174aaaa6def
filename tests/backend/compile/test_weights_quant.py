"""Compiled models with quantized weights (compile_module(..., weights=fmt)): the weights that only
matmuls, linears and convs read are quantized on load and kept packed where the device reads the format.

Exactness: the compiled model equals the same model run in float64 with each of those weights replaced
by its dequantized value (ops/quant.py's decoder, checked against the gguf package and torch's float8
in tests/backend/ops/test_quant.py) to float32 rounding: the quantization is the only difference, and it
is applied exactly. Memory: the report's weights_bytes is what the formats imply."""
from __future__ import annotations

import copy

import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile.lowering import Weights
from anydevice.backend.ops import quant

from compile_models import conv_attention_model


class _LinearHead(torch.nn.Module):
    """A conv trunk and linear layers (their transposed weights are folded constants of the graph)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = conv_attention_model(0)
        self.fc1 = torch.nn.Linear(24 * 24, 64)
        self.fc2 = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        y = self.trunk(x).flatten(2)
        return self.fc2(torch.nn.functional.gelu(self.fc1(y)))


def _dequantized(m, fmt):
    """m in float64 with every conv / linear weight that can be stored in ``fmt`` replaced by its
    dequantized value (what the compiled model computes with)."""
    d = copy.deepcopy(m).double()
    for mod in d.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)) and quant.quantizable(tuple(mod.weight.shape), fmt):
            q = quant.quantize(mod.weight.detach().float().numpy(), fmt)
            with torch.no_grad():
                mod.weight.copy_(torch.from_numpy(q.dequantize()).double())
    return d


def _backend(name):
    try:
        return get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")


@pytest.mark.parametrize("fmt", list(quant.FORMATS))
@pytest.mark.parametrize("name", ["opencl", "numpy", "cpu", "cuda"])
def test_compiled_model_with_quantized_weights_is_exact(name, fmt):
    be = _backend(name)
    m = _LinearHead().eval()
    x = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = _dequantized(m, fmt)(x.double())
        exact = copy.deepcopy(m).double()(x.double())
    Weights.of(be, "float32", fmt).clear()
    cm = C.compile_module(m, be, weights=fmt)
    with torch.no_grad():
        y = cm(x)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err <= 2e-6, f"{fmt} on {name}: {err:.3g} from the dequantized model"
    assert not cm.graphs[0].stats.fallbacks, cm.graphs[0].stats.fallbacks
    g = cm.graphs[0]
    # every conv and linear weight was quantized: 4 convs (one of 4x4x1x1 = 16 elements stays, not a
    # multiple of 32, except for int8/fp8), the two folded transposed linear weights
    qn = g.quant_nodes
    assert len(qn) >= 5, qn
    # the quantization is visible: the model's error against float32 is the format's
    qerr = float((y.double() - exact).norm() / exact.norm())
    assert qerr > 1e-4
    # weights_bytes: quantized bytes for those weights, float32 for the rest
    total = 0
    for p_name, p in m.named_parameters():
        total += p.numel() * 4
    rep = C.report(cm)
    assert rep["weights_bytes"] < 0.45 * total, (rep["weights_bytes"], total)


@pytest.mark.parametrize("fmt", ["q8_0", "int8"])
def test_quantized_weights_are_packed_on_opencl(fmt, monkeypatch):
    be = _backend("opencl")
    if be.family != "cpu":
        pytest.skip("the CPU kernel family's weight slices are checked here")
    from anydevice.backend.devices.opencl import linalg
    panel = 256 << 10  # float32 panels of a weight at once (16 MB by default: these weights are 4 MB)
    monkeypatch.setattr(linalg, "WEIGHT_PANEL_BYTES", panel)
    m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.SiLU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(3, 1024)
    Weights.of(be, "float32", fmt).clear()
    cm = C.compile_module(m, be, weights=fmt)
    with torch.no_grad():
        cm(x)
        base = be._memory_peak(reset=True)  # what is held now (the packed weights, other tests' arrays)
        y = cm(x)
    ref = _dequantized(m, fmt)(x.double())
    assert float((y.double() - ref).norm() / ref.norm()) <= 2e-6
    g = cm.graphs[0]
    packed = [a for a in g._fold_dev.values() if quant.is_quantized(a)]
    # the linear weights, quantized as (out, in) rows and read through their transpose, packed on the device
    assert len(packed) == 2 and all(type(a.w).__name__ == "CLQuant" for a in packed)
    wq = sum(a.nbytes for a in packed)
    assert wq <= 0.28 * 4 * (1024 * 1024 + 1024 * 256)
    # the call adds no float32 copy of the 4 MB weight to the device peak (activations are a few KB): a few
    # panels, the pool's rounding
    extra = be._memory_peak() - base
    assert extra < 3 * panel + 64 * 1024 < 4 * 1024 * 1024, (extra, wq)


def test_unknown_format_is_refused_by_name():
    with pytest.raises(Exception, match="weights.*q3_x.*is not a quantized format"):
        C.compile_module(torch.nn.Linear(4, 4), "numpy", weights="q3_x")


class _ScaledFP8Linear(torch.nn.Module):
    """ComfyUI's scaled_fp8_ops Linear (comfy/ops.py): a float8 weight and a 0-d scale_weight, dequantized in
    forward as ``weight.to(dtype) * scale_weight``."""

    def __init__(self, w, b, dt):
        super().__init__()
        s = w.abs().max() / torch.finfo(dt).max
        self.weight = torch.nn.Parameter((w / s).to(dt), requires_grad=False)
        self.scale_weight = torch.nn.Parameter(s.reshape(()).float(), requires_grad=False)
        self.bias = torch.nn.Parameter(b, requires_grad=False)

    def forward(self, x):
        w = self.weight.to(x.dtype) * self.scale_weight.to(x.dtype)
        return torch.nn.functional.linear(x, w, self.bias)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_scaled_fp8_weights_stay_float8_on_the_device(fmt):
    """A scaled-fp8 model's weights are kept as their float8 bytes and scale (no option needed: lossless),
    packed on OpenCL; the result is the eager model's."""
    be = _backend("opencl")
    torch.manual_seed(0)
    dt = getattr(torch, fmt)
    m = torch.nn.Sequential(_ScaledFP8Linear(torch.randn(256, 128), torch.randn(256), dt), torch.nn.GELU(),
                            _ScaledFP8Linear(torch.randn(64, 256), torch.randn(64), dt)).eval()
    x = torch.randn(5, 128)
    with torch.no_grad():
        w1 = m[0].weight.double() * m[0].scale_weight.double()
        w2 = m[2].weight.double() * m[2].scale_weight.double()
        ref = torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(
            x.double(), w1, m[0].bias.double())), w2, m[2].bias.double())
    cm = C.compile_module(m, be)
    with torch.no_grad():
        y = cm(x)
    assert float((y.double() - ref).norm() / ref.norm()) <= 2e-6
    g = cm.graphs[0]
    assert len(g.float8) == 2, g.float8
    packed = [a for a in g._fold_dev.values() if quant.is_quantized(a)]
    assert len(packed) == 2 and all(a.fmt == fmt for a in packed)
    assert sum(a.nbytes for a in packed) == 256 * 128 + 64 * 256 + 8  # one byte a weight, one scale each
    assert not g.stats.fallbacks
