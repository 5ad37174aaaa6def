"""Quantized weights on the OpenCL CPU kernel family: pack_a / pack_b decode a quantized row a block at a
time (kernels/quant_decode.h qd_run: the block's scale read once) and the other kernels element by
element (qd_load). Both must give exactly the values ``QTensor.dequantize()`` gives: the product with
the quantized weight is bit for bit the product with its dequantized float32 copy (the same GEMM on the
same values), for every format, rows of K not a multiple of 32 (blocks that straddle rows) included."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import quant

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)


@pytest.mark.parametrize("fmt", list(quant.FORMATS))
@pytest.mark.parametrize("n,k", [(96, 72), (130, 320), (64, 1000), (7, 96)])
def test_linear_with_a_quantized_weight_is_the_dequantized_product_bit_for_bit(fmt, n, k):
    rng = np.random.default_rng(n + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    if w.size % quant.FORMATS[fmt].block:
        pytest.skip("not storable")
    q = quant.quantize(w, fmt)
    x = rng.standard_normal((60, k)).astype(np.float32)
    np.testing.assert_array_equal(BE.to_numpy(BE.linear(x, q)), BE.to_numpy(BE.linear(x, q.dequantize())))


@pytest.mark.parametrize("fmt", list(quant.FORMATS))
@pytest.mark.parametrize("ws,kw", [((40, 36, 3, 3), {"padding": 1}), ((48, 64, 3, 3), {"stride": 2, "padding": 1}),
                                   ((64, 96, 1, 1), {})])
def test_conv2d_with_a_quantized_weight_is_the_dequantized_conv_bit_for_bit(fmt, ws, kw):
    rng = np.random.default_rng(sum(ws))
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    q = quant.quantize(w, fmt)
    x = rng.standard_normal((1, ws[1], 14, 13)).astype(np.float32)
    np.testing.assert_array_equal(BE.to_numpy(BE.conv2d(x, q, None, **kw)),
                                  BE.to_numpy(BE.conv2d(x, q.dequantize(), None, **kw)))
