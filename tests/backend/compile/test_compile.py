"""torch.compile(backend="anydevice") and compile_module: results against PyTorch (float64 eager),
zero host fallbacks on a VAE-style decoder, many image sizes without eager fallback, bf16,
inference mode, the fallback report, bad models and the tensor-size limit."""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn

from anydevice.backend import AnyDeviceError
from anydevice.backend import compile as adc

import compile_models as cm
from compile_models import _fresh_dynamo, ref64, rel  # noqa: F401 (_fresh_dynamo: an autouse fixture)

TOL = 1e-5


def test_register_is_idempotent():
    adc.register()
    adc.register()
    assert "anydevice" in torch._dynamo.list_backends(exclude_tags=())


def test_vae_decoder_zero_fallbacks(backend_target):
    m = cm.decoder()
    x = torch.randn(1, 4, 12, 10)
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    with torch.inference_mode():
        y = c(x)
    assert y.shape == (1, 3, 24, 20) and y.dtype == torch.float32
    assert rel(y, ref64(m, x)) <= TOL
    r = adc.report(c)
    assert r["fallbacks"] == {}, r
    assert r["graphs"] == 1 and r["calls"] == 1 and r["eager_fallbacks"] == 0
    assert r["transfers"]["uploads"] == 1 and r["transfers"]["downloads"] == 1  # input once, output once
    assert adc.last_report()["fallbacks"] == {}


def test_weights_uploaded_once_per_model(backend_target):
    m = cm.decoder()
    n_tensors = len(list(m.parameters())) + len(list(m.buffers()))
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    x = torch.randn(1, 4, 8, 8)
    with torch.inference_mode():
        for _ in range(3):
            c(x)
    r = adc.report(c)
    assert r["calls"] == 3
    assert r["transfers"]["constants"] == n_tensors  # not once per call
    assert r["transfers"]["uploads"] == 3 and r["transfers"]["downloads"] == 3


def test_weights_refreshed_when_changed():
    """A LoRA-style patch: a parameter replaced by another tensor, or written in place (also as an
    inference tensor, which has no version counter) gives the new results."""
    with torch.inference_mode():  # made inside inference mode, as ComfyUI loads models
        m = nn.Sequential(*[nn.Conv2d(4, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 3, 1)])
        c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
        x = torch.randn(1, 4, 8, 8)
        assert rel(c(x), m(x)) <= TOL
        m[0].weight.mul_(2.0)  # in place, no version counter
        assert rel(c(x), m(x)) <= TOL
        m[2].weight = nn.Parameter(torch.randn_like(m[2].weight))  # replaced
        assert rel(c(x), m(x)) <= TOL
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 3, 1))
    f = adc.compile_module(m, device="numpy")
    with torch.no_grad():
        y0 = f(x)
        m[2].bias.add_(1.0)  # a versioned tensor written in place
        y1 = f(x)
    assert rel(y1 - y0, torch.ones_like(y0)) <= TOL


def test_many_sizes_no_eager_fallback(backend_target):
    """Tiled upscaling feeds many tile sizes: >= 10 sizes, every call through the compiled graphs."""
    m = cm.compact()
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    sizes = [(8, 8), (9, 8), (8, 11), (12, 12), (13, 7), (16, 10), (7, 15), (10, 10), (14, 9), (11, 13), (6, 6)]
    with torch.inference_mode():
        for h, w in sizes:
            x = torch.rand(1, 3, h, w)
            y = c(x)
            assert y.shape == (1, 3, 2 * h, 2 * w)
            assert rel(y, ref64(m, x)) <= TOL, (h, w)
    r = adc.report(c)
    assert r["calls"] == len(sizes), r  # every call ran our graph: none ran eagerly
    assert r["eager_fallbacks"] == 0 and r["fallbacks"] == {}
    assert r["graphs"] <= 4  # dynamic shapes after the first recompiles, not one graph per size


def test_compile_module_without_dynamo(backend_target):
    m = cm.decoder()
    f = adc.compile_module(m, device=backend_target)
    with torch.inference_mode():
        for shape in ((1, 4, 8, 8), (2, 4, 6, 10), (1, 4, 8, 8)):
            x = torch.randn(*shape)
            assert rel(f(x), ref64(m, x)) <= TOL
    r = adc.report(f)
    assert r["fallbacks"] == {} and r["graphs"] == 2 and r["calls"] == 3


def test_bf16_model_computed_in_float32():
    """A bf16 VAE-style decoder: weights and input bf16, computed in float32, result bf16 (rounded
    once, so within bf16's rounding of the float64 result)."""
    m = cm.decoder().to(torch.bfloat16)
    x = torch.randn(1, 4, 8, 8, dtype=torch.bfloat16)
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    with torch.inference_mode():
        y = c(x)
    assert y.dtype == torch.bfloat16 and y.shape == (1, 3, 16, 16)
    ref = ref64(m, x)
    assert rel(y, ref) <= 2.0 ** -8
    assert rel(y, ref.to(torch.bfloat16)) <= 2.0 ** -8
    assert adc.report(c)["fallbacks"] == {}
    f = adc.compile_module(m, device="numpy")
    assert f(x).dtype == torch.bfloat16 and rel(f(x), ref) <= 2.0 ** -8


def test_inference_mode_and_no_grad_and_grad(backend_target):
    m = cm.decoder()
    x = torch.randn(1, 4, 8, 8)
    ref = ref64(m, x)
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    with torch.inference_mode():
        assert rel(c(x), ref) <= TOL
    with torch.no_grad():
        assert rel(c(x), ref) <= TOL
    y = c(x)  # grad mode, parameters requiring grad: the forward still runs on the device
    assert rel(y, ref) <= TOL


class _Cumsum(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.cumsum(self.conv(x), dim=-1) * 0.5


def test_fallback_report_and_one_log_line(caplog):
    m = _Cumsum().eval()
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    x = torch.randn(1, 3, 6, 6)
    with caplog.at_level(logging.WARNING, logger="anydevice"), torch.inference_mode():
        y1, y2 = c(x), c(x)
    assert rel(y1, ref64(m, x)) <= TOL and rel(y2, ref64(m, x)) <= TOL
    r = adc.report(c)
    assert r["fallbacks"] == {"aten.cumsum.default": 2}, r
    assert adc.last_report()["fallbacks"] == {"aten.cumsum.default": 2}
    lines = [rec.getMessage() for rec in caplog.records if "aten.cumsum.default" in rec.getMessage()]
    assert len(lines) == 1 and "host" in lines[0]
    adc.reset_report()
    assert adc.last_report()["fallbacks"] == {}


class _F64(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x):
        return torch.relu(self.lin(x))


class _Complex(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x * 2.0).abs() + 1.0


@pytest.mark.parametrize("make,x", [(_F64, torch.randn(2, 4, dtype=torch.float64)),
                                    (_Complex, torch.randn(2, 8))])
def test_model_the_device_cannot_take(make, x):
    m = make()
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    with torch.inference_mode():
        with pytest.raises(AnyDeviceError) as ei:
            c(x)
        assert isinstance(ei.value, adc.AnyDeviceCompileError)
        msg = str(ei.value)
        assert "cannot" in msg and ("float64" in msg or "complex" in msg), msg
        assert m(x).shape[0] == 2  # the original module still works
    f = adc.compile_module(m, device="numpy")
    with pytest.raises(adc.AnyDeviceCompileError):
        f(x)


def test_max_tensor_mb_reported(monkeypatch):
    m = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU())
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    x = torch.randn(1, 3, 96, 96)  # conv output 64*96*96*4 B = 2.25 MiB
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    with torch.inference_mode():
        with pytest.raises(adc.AnyDeviceRunError) as ei:
            c(x)
    msg = str(ei.value)
    assert "aten.convolution" in msg and "2.2 MiB" in msg and "ANYDEVICE_MAX_TENSOR_MB=1" in msg, msg
    monkeypatch.delenv("ANYDEVICE_MAX_TENSOR_MB")
    with torch.inference_mode():
        assert rel(c(x), ref64(m, x)) <= TOL


def test_bad_options():
    m = nn.Linear(2, 2)
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(m, backend="anydevice", options={"devce": "numpy"})(torch.randn(1, 2))
    with pytest.raises(AnyDeviceError, match="unknown backend"):
        adc.compile_module(m, device="nonsense")


def test_recompile_limit_eager_fallback_is_reported():
    """Past dynamo's recompile limit a frame runs eagerly (PyTorch's rule): the report says so."""
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"}, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), torch.inference_mode():
        for s in (5, 6, 7, 8):
            x = torch.randn(1, 3, s, s)
            assert rel(c(x), ref64(m, x)) <= TOL  # eager or ours: the right numbers either way
    r = adc.report(c)
    assert r["calls"] == 2 and r["graphs"] == 2
    assert r["eager_fallbacks"] >= 1


class _Scatter(nn.Module):
    """In-place writes into slices (as ComfyUI's slice_attention does): functionalised to
    slice_scatter / select_scatter."""

    def forward(self, x):
        r = torch.zeros_like(x)
        r[:, :, 1:4] = x[:, :, 1:4] * 2.0
        r[:, 0] = x[:, 1] + 1.0
        return r


def test_slice_writes(backend_target):
    m = _Scatter()
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    x = torch.randn(2, 3, 6, 5)
    with torch.inference_mode():
        y = c(x)
    assert rel(y, ref64(m, x)) <= TOL
    assert adc.report(c)["fallbacks"] == {}


class _Masked(nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 1.0


@pytest.mark.parametrize("kind", ["bool", "additive", "causal"])
def test_attention_masks(kind):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=g) for _ in range(3))
    if kind == "bool":
        mask = torch.rand(5, 5, generator=g) > 0.3
        mask[:, 0] = True
    elif kind == "additive":
        mask = torch.randn(2, 1, 5, 5, generator=g)
    else:
        mask = None
    m = _Masked()
    if kind == "causal":
        m.forward = lambda q, k, v, mask: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    with torch.inference_mode():
        y = c(q, k, v, mask)
    with torch.no_grad():
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=None if mask is None else
            (mask if mask.dtype == torch.bool else mask.double()), is_causal=kind == "causal")
    assert rel(y, ref) <= TOL
    assert adc.last_report()["fallbacks"] == {}


class _Broken(nn.Module):
    """A graph break in the middle (as ComfyUI's slice attention has): two graphs per call."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1)

    def forward(self, x, scale=1.0):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h) * scale, {"mid": h}


def test_graph_break_and_structured_outputs(backend_target):
    m = _Broken()
    x = torch.randn(1, 3, 7, 6)
    ref_y, ref_d = (lambda mm: mm(x.double(), scale=2.0))(copy.deepcopy(m).double())
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    f = adc.compile_module(m, device=backend_target)
    with torch.inference_mode():
        for fn in (c, f):
            y, d = fn(x, scale=2.0)
            assert rel(y, ref_y) <= TOL and rel(d["mid"], ref_d["mid"]) <= TOL
    r = adc.report(c)
    assert r["graphs"] == 2 and r["calls"] == 2 and r["fallbacks"] == {}


@pytest.mark.parametrize("shape", [(3, 5, 8), (2, 2, 5, 8), (2, 2, 2, 5, 8)])
def test_attention_ranks(shape):
    """3-D, 4-D and 5-D attention inputs (the 5-D one through torch's math decomposition)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    c = torch.compile(f, backend="anydevice", options={"device": "numpy"})
    with torch.inference_mode():
        y = c(q, k, v)
    assert rel(y, f(q.double(), k.double(), v.double())) <= TOL


def test_linear_weights_kept_as_stored(backend_target):
    """A linear layer's weight transpose (a folded constant matmul reads) is kept as the weight itself on a device
    whose linear reads it as stored ("linear_weight": quant.Transposed, the product through ``linear``: few rows then
    need no pack of the weight); the values match eager float64 on every backend, with and without bias, over few
    and many rows."""
    torch.manual_seed(11)
    m = nn.Sequential(nn.Linear(96, 400), nn.GELU(), nn.Linear(400, 64, bias=False)).eval()
    ref = copy.deepcopy(m).double()
    c = torch.compile(m, backend="anydevice", options={"device": backend_target})
    calls = []
    linear = backend_target._linear
    backend_target._linear = lambda x, w, b: (calls.append(tuple(backend_target._shape(w))), linear(x, w, b))[1]
    try:
        with torch.inference_mode():
            for rows in (5, 77, 700):
                x = torch.randn(rows, 96)
                assert rel(c(x), ref(x.double())) <= TOL
    finally:
        del backend_target._linear
    if "linear_weight" in backend_target.caps.fused:
        assert (400, 96) in calls and (64, 400) in calls, calls
