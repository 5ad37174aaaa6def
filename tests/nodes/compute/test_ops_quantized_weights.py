"""Linear and Conv2D nodes with quantized WEIGHTS (Weights (AnyDevice)'s quantize widget): the result is the
float64 product with the dequantized weight (to float32 rounding), on every backend available; OpenCL keeps
the weight packed (the node's constant is a CLQuant); a weight that cannot be stored in the format is an
error naming the node, the input and the value."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice import backend as B
from anydevice.backend.ops import quant
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.base import resident
from anydevice.nodes.base.common import NodeError

AVAILABLE = [i.name for i in B.list_backends() if i.available and i.name in ("numpy", "opencl", "cpu")]
FORMATS = ["q8_0", "int8", "q4_1", "float8_e4m3fn"]


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("device", AVAILABLE)
def test_linear_node_with_quantized_weights(device, fmt):
    wts = N["AnyDeviceWeights"]().run(source="random", shape="48, 64", init_seed=3, bias="random", quantize=fmt)
    value = wts["result"][0]
    q = value["weight"]
    assert isinstance(q, quant.QTensor) and q.fmt == fmt and q.shape == (48, 64)
    assert f"stored as {fmt}" in wts["ui"]["text"][0]
    t = {"tensor": torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1))}
    r = N["AnyDeviceLinear"]().run(input=t, source="weights", weights=value, device={"name": device})
    ref = F.linear(t["tensor"].double(), torch.from_numpy(q.dequantize()).double(), value["bias"].double())
    assert _rel(r["result"][0]["tensor"], ref) <= 1e-6
    assert r["ui"]["kernel"][0]["shape"] == [48, 64]  # the grid shows the dequantized values
    np.testing.assert_allclose(r["ui"]["kernel"][0]["slices"][0]["values"][:5], np.round(q.dequantize()[0, :5], 5),
                               atol=1e-5)
    if device == "opencl":
        be = B.get_backend("opencl")
        assert type(resident.constant(be, q)).__name__ == "CLQuant"  # packed on the device


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("device", AVAILABLE)
def test_conv2d_node_with_quantized_weights(device, fmt):
    wts = N["AnyDeviceWeights"]().run(source="random", shape="32, 3, 3, 3", init_seed=5, bias="random",
                                      quantize=fmt)["result"][0]
    q = wts["weight"]
    img = torch.rand(1, 20, 18, 3, generator=torch.Generator().manual_seed(2))
    r = N["AnyDeviceConv2D"]().run(input={"tensor": img.permute(0, 3, 1, 2).contiguous()}, kernel_source="weights",
                                   channel_mode="grouped", groups=1, padding="same", padding_mode="zeros",
                                   weights=wts, device={"name": device})
    ref = F.conv2d(img.permute(0, 3, 1, 2).double(), torch.from_numpy(q.dequantize()).double(), wts["bias"].double(),
                   padding=1)
    assert _rel(r["result"][0]["tensor"], ref) <= 1e-6


def test_a_weight_the_format_cannot_store_names_the_input():
    with pytest.raises(NodeError, match="quantize.*q8_0.*cannot store the weight \\(3, 5\\)"):
        N["AnyDeviceWeights"]().run(source="random", shape="3, 5", quantize="q8_0")
    with pytest.raises(NodeError, match="quantize.*q3_x.*must be one of"):
        N["AnyDeviceWeights"]().run(source="random", shape="4, 8", quantize="q3_x")
