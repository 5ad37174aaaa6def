"""Dynamic W8A8 quantization: ``linear_w8a8`` and ``conv2d_w8a8`` (1x1, stride 1), the host reference
of their math, and the shared composite every device without the fused kernel "w8a8" runs.

The math (one definition for every device; the kernels compute exactly this):

- the weight ``w`` (N, K) is int8 per output channel (ops/quant.py's ``int8``): ``wq[j, k]`` int8 in
  [-127, 127], ``sw[j]`` float32; a float weight is quantized so on the host first, a weight in another
  quantized format is dequantized and quantized so;
- the activations ``x`` (..., K) are quantized per row (a row: the K values of one leading index) at
  run time, as quant.quantize's int8 does a weight row:
  ``sx[i] = max_k |x[i, k]| / 127`` (float32 division; 1 where the row is all zeros, NaN where it holds
  an Inf or a NaN), ``xq[i, k] = round(x[i, k] / sx[i])`` (float32 division, rounded half away from
  zero, clamped to [-127, 127]; 0 in a NaN row);
- ``acc[i, j] = sum_k xq[i, k] * wq[j, k]``, exact in int32: |acc| <= K * 127^2, so K <= ``MAX_K`` = 2^16
  keeps it below 2^31 (a larger K is refused: AnyDeviceError);
- ``y[i, j] = (sx[i] * sw[j]) * float(acc[i, j]) + b[j]``, in float32 (the scales' product rounded once,
  the int32 sum converted once). A row with an Inf or NaN gives a NaN output row.

``reference`` computes the same in float64 (the tests' bar: a kernel matches it to float32 rounding).
Devices with the fused kernel (``caps.fused`` has "w8a8") implement ``_linear_w8a8(x, wq, b)``: x a float32
native array (..., K), wq their packed int8 weight (``_from_quant``), b None or (N,). The others run
``_linear_w8a8_host``: the rows quantized, the int32 products (exact: float64 GEMM of integers below
2^53) and the epilogue on the host, the result uploaded.
"""
from __future__ import annotations

import math

import numpy as np

from ..system.errors import AnyDeviceError
from . import quant
from .plans import linear_shapes

#: the longest K whose int32 accumulation is exact (K * 127^2 < 2^31 with margin)
MAX_K = 1 << 16


# ---- the host reference ------------------------------------------------------------------------
def quantize_rows(x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(xq int8 (M, K), sx float32 (M,)) of float32 rows ``x2`` (M, K), as the module docstring defines."""
    x2 = np.ascontiguousarray(x2, np.float32)
    M = x2.shape[0]
    with np.errstate(invalid="ignore"):
        amax = np.abs(x2).max(axis=1) if x2.size else np.zeros(M, np.float32)
    finite = np.isfinite(amax)
    sx = np.where(finite, np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)), np.float32(np.nan))
    sx = sx.astype(np.float32)
    safe = np.where(finite, sx, np.float32(1.0)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.where(finite[:, None], x2 / safe[:, None], np.float32(0.0)).astype(np.float32)
    xq = np.clip(quant._round_half_away(v), -127, 127).astype(np.int8)
    return xq, sx


def int_products(xq: np.ndarray, wq: np.ndarray) -> np.ndarray:
    """acc = xq (M, K) @ wq (N, K)^T as int64, exact (a float64 GEMM of integers: every partial sum is an
    integer below 2^53)."""
    return (xq.astype(np.float64) @ wq.astype(np.float64).T).astype(np.int64)


def epilogue(acc: np.ndarray, sx: np.ndarray, sw: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The float32 epilogue the kernels compute: (sx[i] * sw[j]) * float(acc[i, j]) + b[j]."""
    s = sx.astype(np.float32)[:, None] * sw.astype(np.float32)[None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        y = s * acc.astype(np.float32)
        if b is not None:
            y = y + np.asarray(b, np.float32)[None, :]
    return y.astype(np.float32)


def reference(x2: np.ndarray, wq: np.ndarray, sw: np.ndarray, b=None) -> np.ndarray:
    """The float64 reference of the same quantized math: rows quantized as ``quantize_rows``, then
    sx[i] * sw[j] * acc[i, j] + b[j] in float64."""
    xq, sx = quantize_rows(x2)
    acc = int_products(xq, wq).astype(np.float64)
    y = sx.astype(np.float64)[:, None] * sw.astype(np.float64)[None, :] * acc
    return y if b is None else y + np.asarray(b, np.float64)[None, :]


def int8_parts(q: quant.QTensor) -> tuple[np.ndarray, np.ndarray]:
    """(wq int8 (N, K), sw float32 (N,)) of a 2-D int8 QTensor."""
    return q.data.view(np.int8).reshape(q.shape), q.scale


# ---- the ops ---------------------------------------------------------------------------------------
class W8A8Ops:
    """``linear_w8a8`` / ``conv2d_w8a8`` of ``contract.Backend``."""

    def linear_w8a8(self, input, weight, bias=None):
        """torch.nn.functional.linear with dynamic W8A8 quantization (the module docstring's math):
        ``weight`` (N, K) an int8 QTensor or this device's packed int8 weight, or a float weight
        (quantized per output channel here, on the host) or another format (dequantized, then so)."""
        op = "linear_w8a8"
        w = self._w8a8_weight(weight, op)
        if "w8a8" in self.caps.fused:
            kind, like, x, w, b = self._inputs(op, input=input, weight=w, bias=bias, _keep=("weight",))
        else:
            kind, like, x, b = self._inputs(op, input=input, bias=bias)
        sx = self._shape(x)
        linear_shapes(op, sx, tuple(w.shape), None if b is None else self._shape(b))
        self._w8a8_check_k(op, sx)
        rows = math.prod(sx[:-1])
        self._check_size(op, (rows, w.shape[0]))
        if "w8a8" in self.caps.fused and rows * w.shape[0] * sx[-1] > 0:  # an empty product: the composite
            y = self._linear_w8a8(x, w, b)
        else:
            y = self._linear_w8a8_host(x, w, b)
        return self._out(y, kind, like)

    def conv2d_w8a8(self, input, weight, bias=None):
        """conv2d of a 1x1 weight (Cout, Cin, 1, 1), stride 1, no padding, one group, with dynamic W8A8
        quantization: each pixel's Cin values are one activation row, so it is ``linear_w8a8`` of the
        (N*H*W, Cin) pixels (the same GEMM), laid back out as (N, Cout, H, W)."""
        op = "conv2d_w8a8"
        shape = tuple(weight.shape)
        if len(shape) != 4 or shape[2:] != (1, 1):
            raise AnyDeviceError(op, "weight", shape, "must be a 1x1 conv weight (Cout, Cin, 1, 1)")
        w2 = self._w8a8_weight(weight, op, (shape[0], shape[1]))
        kind, like, x = self._inputs(op, input=input)
        s = self._shape(x)
        if len(s) != 4 or s[1] != shape[1]:
            raise AnyDeviceError(op, "input", s, f"must be (N, {shape[1]}, H, W) for a weight of {shape}")
        n, c, h, wd = s
        rows = self._reshape(self._permute(x, (0, 2, 3, 1)), (n * h * wd, c))
        y = self.linear_w8a8(rows, w2, bias)  # a native array in, a native float32 array out
        y = self._permute(self._reshape(y, (n, h, wd, shape[0])), (0, 3, 1, 2))
        return self._out(self._contiguous(y), kind, like)

    # ---- helpers ---------------------------------------------------------------------------------
    def _w8a8_weight(self, weight, op: str, shape2=None):
        """The weight as an int8 per-output-channel QTensor (N, K), or this device's packed int8 form
        where the device has the kernel (``shape2``: the (N, K) a 1x1 conv weight is read as)."""
        if isinstance(weight, quant.Transposed):
            raise AnyDeviceError(op, "weight", weight, "must be (out, in): a transposed weight is not taken")
        native = isinstance(weight, quant.DeviceQuant) and isinstance(weight, self.native_types)
        if isinstance(weight, quant.DeviceQuant) and not native:
            raise AnyDeviceError(op, "weight", type(weight).__name__, f"is another device's quantized weight (this is {self.name})")
        if native and weight.fmt == "int8" and shape2 is None and "w8a8" in self.caps.fused and len(weight.shape) == 2 \
                and weight.rowlen == weight.shape[1]:
            return weight
        if isinstance(weight, quant.QTensor) and weight.fmt == "int8" and shape2 is None and weight.ndim == 2 \
                and weight.rowlen == weight.shape[1]:
            return weight
        if isinstance(weight, quant.QTensor) and shape2 is not None and weight.fmt == "int8" \
                and weight.rowlen == math.prod(shape2[1:]):
            # a 1x1 conv weight in int8: one scale per output channel already, the same bytes as (N, K)
            return quant.QTensor("int8", shape2, weight.data, weight.scale)
        a = self.to_numpy(weight)  # a float weight, or another format's values
        if shape2 is not None:
            a = a.reshape(shape2)
        if a.ndim != 2:
            raise AnyDeviceError(op, "weight", a.shape, "must be 2-D (out_features, in_features)")
        return quant.quantize(a, "int8", op)

    def _w8a8_check_k(self, op: str, sx) -> None:
        K = sx[-1] if sx else 0
        if K > MAX_K:
            raise AnyDeviceError(op, "input", sx, f"has K = {K} input features: W8A8's int32 accumulation is "
                                 f"exact up to K = {MAX_K} (K * 127^2 < 2^31); use linear for this layer")

    def _linear_w8a8_host(self, x, w, b):
        """The shared composite: quantize, int32 products and epilogue on the host (module docstring)."""
        q = w if isinstance(w, quant.QTensor) else quant.quantize(self.to_numpy(w), "int8", "linear_w8a8")
        xh = self.to_numpy(x)
        K = xh.shape[-1]
        wq, sw = int8_parts(q)
        xq, sx = quantize_rows(xh.reshape(-1, K))
        y = epilogue(int_products(xq, wq), sx, sw, None if b is None else self.to_numpy(b))
        return self.to_device(y.reshape(xh.shape[:-1] + (wq.shape[0],)), "linear_w8a8", "output")
