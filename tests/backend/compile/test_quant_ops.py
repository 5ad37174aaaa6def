"""torch.ops.anydevice.quant_linear / quant_conv2d (backend/compile/quant_ops.py): a linear / conv2d
whose weight stays packed (uint8 bytes of an ops/quant.py format).

Eager: the op equals F.linear / F.conv2d of the weight dequantized by ops/quant.py (float64 reference,
normwise <= 1e-6), for every format; its torch dequantizer equals quant.dequantize value for value.
Compiled (compile_module, torch.compile): the result equals eager; the graph never uploads the uint8
weight as floats: on OpenCL it is a CLQuant (packed) in the Weights cache and weights_bytes is the
quantized size."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile import quant_ops
from anydevice.backend.compile.lowering import Weights
from anydevice.backend.ops import quant

quant_ops.register()
FMTS = list(quant.FORMATS)


def _q(shape, fmt, seed=0):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return quant.quantize(w, fmt)


def _tensors(q):
    data = torch.from_numpy(q.data.copy())
    scale = None if q.scale is None else torch.from_numpy(q.scale.copy())
    return data, scale


class QLinearConv(torch.nn.Module):
    """conv2d (packed) -> SiLU -> flatten -> linear (packed)."""

    def __init__(self, fmt):
        super().__init__()
        self.fmt = fmt
        self.qc = _q((16, 8, 3, 3), fmt, 1)
        self.ql = _q((32, 16 * 6 * 6), fmt, 2)
        for name, q in (("c", self.qc), ("l", self.ql)):
            d, s = _tensors(q)
            self.register_parameter(f"{name}_data", torch.nn.Parameter(d, requires_grad=False))
            self.register_parameter(f"{name}_scale", None if s is None else torch.nn.Parameter(s, requires_grad=False))
        g = torch.Generator().manual_seed(3)
        self.c_bias = torch.nn.Parameter(torch.randn(16, generator=g))
        self.l_bias = torch.nn.Parameter(torch.randn(32, generator=g))

    def forward(self, x):
        y = torch.ops.anydevice.quant_conv2d(x, self.c_data, self.c_scale, self.c_bias, self.fmt, list(self.qc.shape),
                                             [1, 1], [1, 1], [1, 1], 1)
        y = F.silu(y).flatten(1)
        return torch.ops.anydevice.quant_linear(y, self.l_data, self.l_scale, self.l_bias, self.fmt,
                                                list(self.ql.shape))

    def reference(self, x):
        """float64 with the weights quant.dequantize gives."""
        wc = torch.from_numpy(self.qc.dequantize()).double()
        wl = torch.from_numpy(self.ql.dequantize()).double()
        y = F.silu(F.conv2d(x.double(), wc, self.c_bias.double(), 1, 1)).flatten(1)
        return F.linear(y, wl, self.l_bias.double())

    @property
    def packed_bytes(self):
        return self.qc.nbytes + self.ql.nbytes


def _x():
    return torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(5))


def _err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("fmt", FMTS)
def test_torch_dequantize_equals_quant_dequantize(fmt):
    q = _q((24, 64), fmt, 7)
    d, s = _tensors(q)
    got = quant_ops.dequantize(d, s, fmt, q.shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == q.shape
    np.testing.assert_array_equal(got.numpy(), q.dequantize())


@pytest.mark.parametrize("fmt", FMTS)
def test_eager_ops_equal_the_dequantized_weight(fmt):
    m = QLinearConv(fmt)
    x = _x()
    with torch.no_grad():
        y = m(x)
        ref = m.reference(x)
    assert y.dtype == torch.float32 and y.shape == (2, 32)
    assert _err(y, ref) <= 1e-6
    # the quantization is visible (the op did not read some float copy of the original weights)
    assert float(ref.abs().max()) > 1.0


def test_eager_op_runs_in_the_input_dtype():
    m = QLinearConv("q8_0")
    x = _x()
    with torch.no_grad():
        y = m(x.to(torch.bfloat16))
        ref = m.reference(x)
    assert y.dtype == torch.bfloat16
    assert _err(y, ref) <= 3e-2


def test_eager_ops_give_gradients_for_input_and_bias():
    m = QLinearConv("q4_0")
    x = _x().requires_grad_(True)
    m(x).square().sum().backward()
    xr = _x().double().requires_grad_(True)
    b1 = m.c_bias.detach().double().requires_grad_(True)
    wc = torch.from_numpy(m.qc.dequantize()).double()
    wl = torch.from_numpy(m.ql.dequantize()).double()
    y = F.linear(F.silu(F.conv2d(xr, wc, b1, 1, 1)).flatten(1), wl, m.l_bias.detach().double())
    y.square().sum().backward()
    assert _err(x.grad, xr.grad) <= 1e-5
    assert _err(m.c_bias.grad, b1.grad) <= 1e-5


def test_bad_packed_weight_is_named():
    q = _q((4, 32), "q8_0")
    d, _ = _tensors(q)
    with pytest.raises(ValueError, match="quant_linear: argument 'data' = '100 bytes'.*needs 136 bytes"):
        torch.ops.anydevice.quant_linear(torch.randn(1, 32), d[:100], None, None, "q8_0", [4, 32])
    with pytest.raises(ValueError, match="argument 'fmt' = 'q3_x'"):
        torch.ops.anydevice.quant_linear(torch.randn(1, 32), d, None, None, "q3_x", [4, 32])


def _backend(name):
    try:
        return get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("name", ["opencl", "numpy", "cpu", "cuda"])
def test_compiled_equals_eager(name, fmt):
    be = _backend(name)
    m = QLinearConv(fmt).eval()
    x = _x()
    Weights.of(be).clear()
    cm = C.compile_module(m, be)
    with torch.no_grad():
        eager = m(x)
        y = cm(x)
        y2 = cm(x)
    assert _err(y, eager) <= 2e-6, f"{fmt} on {name}"
    assert torch.equal(y, y2)
    g = cm.graphs[0]
    assert not g.stats.fallbacks, g.stats.fallbacks
    # both weights' bytes are handed to the lowering as they are: never uploaded as float arrays
    assert len(g.packed_nodes) == (2 if quant.FORMATS[fmt].block > 1 else 4)
    rep = C.report(cm)
    biases = 4 * (16 + 32)
    assert rep["weights_bytes"] == m.packed_bytes + biases
    if name == "opencl" and fmt in be.caps.quant_formats:
        kinds = sorted(type(e[2]).__name__ for e in Weights.of(be)._entries.values())
        assert kinds.count("CLQuant") == 2, kinds


@pytest.mark.parametrize("name", ["opencl", "numpy"])
def test_torch_compile_equals_eager_and_keeps_the_weights_packed(name):
    be = _backend(name)
    m = QLinearConv("q8_0").eval()
    x = _x()
    Weights.of(be).clear()
    C.reset_report()
    t = torch.compile(m, backend="anydevice", options={"device": be})
    with torch.no_grad():
        eager = m(x)
        y = t(x)
    assert _err(y, eager) <= 2e-6
    rep = C.report(t)
    assert rep["fallbacks"] == {} and rep["eager_fallbacks"] == 0
    assert rep["weights_bytes"] == m.packed_bytes + 4 * (16 + 32)
    # the float32 weights would take 4x the q8_0 bytes (34 bytes per 32 values)
    assert m.packed_bytes < 0.27 * 4 * (m.qc.numel + m.ql.numel)


def test_weight_changed_in_place_is_read_again():
    be = _backend("numpy")
    m = QLinearConv("q8_0").eval()
    x = _x()
    cm = C.compile_module(m, be)
    with torch.no_grad():
        cm(x)
        q2 = _q(m.ql.shape, "q8_0", 11)
        m.l_data.copy_(torch.from_numpy(q2.data.copy()))
        m.ql = q2
        y = cm(x)
        ref = m.reference(x)
    assert _err(y, ref) <= 2e-6
