"""A weight stored compressed (half or quantized) is packed to float32 panels in slices of at most
``WEIGHT_PANEL_BYTES`` (CPU family: GEMM rows or columns, im2col conv rows, Winograd output channels),
so no float32 copy of a whole weight exists. Here the slice size is made tiny: every path then runs in
many slices, gives the values of the float64 reference on the weight's stored values (normwise 1e-6,
the precision suite's bar), and the device peak stays far below a float32 copy of the weight."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anydevice.backend.ops import dtypes, quant

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import linalg
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

PANEL = 64 << 10
# (x shape, w shape, options): winograd (bias), im2col + GEMM (grouped, strided, bias)
CONVS = [((1, 64, 14, 14), (200, 64, 3, 3), {"padding": 1}),
         ((1, 128, 9, 7), (384, 64, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
         ((2, 128, 6, 6), (640, 128, 1, 1), {})]
STORED = ["float16", "q8_0", "q4_1", "int8"]


@pytest.fixture(autouse=True)
def _tiny_panels(monkeypatch):
    monkeypatch.setattr(linalg, "WEIGHT_PANEL_BYTES", PANEL)


def _stored(w, how):
    """(the weight as passed to the op, its stored values in float64)"""
    if how in dtypes.HALF:
        a = BE.to_device(w, dtype=how)
        return a, dtypes.round_to(w, how).astype(np.float64)
    q = quant.quantize(w, how)
    return BE.to_device_quant(q), q.dequantize().astype(np.float64)  # packed on the device before the peak


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("how", STORED)
@pytest.mark.parametrize("xs,ws,kw", CONVS)
def test_conv2d_in_weight_slices(xs, ws, kw, how):
    rng = np.random.default_rng(sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    wd, wref = _stored(w, how)
    xd = BE.to_device(x)
    BE._memory_peak(reset=True)
    base = BE._memory_peak()
    y = BE.to_numpy(BE.conv2d(xd, wd, b, **kw))
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wref), torch.from_numpy(b).double(),
                                     **kw).numpy()
    assert _rel(y, ref) <= 1e-6
    full = 4 * w.size * (16 / 9 if ws[-1] == 3 and "stride" not in kw else 1)
    assert full > 4 * PANEL  # the test means something: the weight's float32 panels are many slices
    assert BE._memory_peak() - base < 2 * PANEL + 4 * (y.size + 3 * x.size * 9), "a float32 copy of the weight"


@pytest.mark.parametrize("how", STORED)
@pytest.mark.parametrize("xs,ws", [((5, 256), (700, 256)), ((2, 3, 512), (300, 512))])
def test_linear_in_weight_slices(xs, ws, how):
    rng = np.random.default_rng(ws[0])
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(ws[1])).astype(np.float32)
    wd, wref = _stored(w, how)
    xd = BE.to_device(x)
    BE._memory_peak(reset=True)
    base = BE._memory_peak()
    y = BE.to_numpy(BE.linear(xd, wd))
    ref = x.astype(np.float64) @ wref.T
    assert _rel(y, ref) <= 1e-6
    assert 4 * w.size > 4 * PANEL
    assert BE._memory_peak() - base < 3 * PANEL + 8 * (y.size + x.size * 2)  # pool buckets round sizes up
