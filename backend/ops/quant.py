"""Quantized weights: the formats, host quantizers and dequantizers, and ``QTensor``, a quantized
weight as a value ops take (linear's, conv2d's and matmul's weight).

Formats (``FORMATS``), all read by flat element index over the weight's C-order data:

- GGUF blocks of 32 (ggml's layouts, byte for byte, so a GGUF file's tensor data is used as it is):
  ``q8_0`` (fp16 d, 32 int8: d*q), ``q4_0`` (fp16 d, 16 bytes of nibbles: d*(q-8)), ``q4_1`` (fp16 d,
  fp16 m, nibbles: d*q+m), ``q5_0`` (fp16 d, 32 high bits, nibbles: d*(q-16)), ``q5_1`` (fp16 d, m,
  high bits, nibbles: d*q+m). Element j of a block is nibble j (low half of byte j) for j < 16 and
  the high half of byte j-16 otherwise.
- ``int8``: symmetric int8 with one float32 scale per output channel (row of dim 0).
- ``float8_e4m3fn`` / ``float8_e5m2``: 8-bit floats (torch's dtypes, bit for bit) times one float32
  scale (ComfyUI's scaled-fp8 checkpoints: ``scale_weight``).

The scaled formats keep ``scale`` (float32, one per row of ``rowlen`` elements); the block formats carry
their scales inside the blocks. A device that reads a format in its kernels lists it in
``caps.quant_formats``; elsewhere the contract dequantizes a weight for the one op that uses it.

The references are the ``gguf`` package's NumPy dequantizer and torch's float8 dtypes (tests); this
module needs neither.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..system.errors import AnyDeviceError


@dataclass(frozen=True)
class Format:
    name: str
    block: int        #: elements per block (1: no blocks)
    block_bytes: int  #: bytes per block
    code: int         #: the kernels' WDT code (kernels/weight_load.h)
    scaled: bool      #: a separate float32 scale per row (int8, fp8)
    gguf: int | None  #: GGMLQuantizationType value

    def nbytes(self, numel: int) -> int:
        return numel // self.block * self.block_bytes


FORMATS = {f.name: f for f in (
    Format("int8", 1, 1, 3, True, None),
    Format("float8_e4m3fn", 1, 1, 4, True, None),
    Format("float8_e5m2", 1, 1, 5, True, None),
    Format("q8_0", 32, 34, 6, False, 8),
    Format("q4_0", 32, 18, 7, False, 2),
    Format("q4_1", 32, 20, 8, False, 3),
    Format("q5_0", 32, 22, 9, False, 6),
    Format("q5_1", 32, 24, 10, False, 7),
)}
#: GGMLQuantizationType value -> format name
GGUF_TYPES = {f.gguf: f.name for f in FORMATS.values() if f.gguf is not None}


class QTensor:
    """A quantized weight on the host: ``fmt``, logical ``shape``, ``data`` (the packed bytes, uint8,
    1-D) and for the scaled formats ``scale`` (float32, one per ``rowlen`` elements). Read-only once
    made. It is not an array: ops that take it (linear, conv2d, matmul's weight) read it in their
    kernels or dequantize it."""

    __slots__ = ("fmt", "shape", "data", "scale", "rowlen", "__weakref__")

    def __init__(self, fmt: str, shape, data: np.ndarray, scale: np.ndarray | None = None, rowlen: int | None = None):
        f = FORMATS.get(fmt)
        if f is None:
            raise AnyDeviceError("quantize", "format", fmt, f"is not one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.shape = tuple(int(s) for s in shape)
        numel = math.prod(self.shape)
        if numel % f.block:
            raise AnyDeviceError("quantize", "shape", self.shape,
                                 f"has {numel} elements, not a multiple of {fmt}'s block of {f.block}")
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if data.size != f.nbytes(numel):
            raise AnyDeviceError("quantize", "data", f"{data.size} bytes",
                                 f"{fmt} {self.shape} needs {f.nbytes(numel)} bytes")
        data.flags.writeable = False
        self.data = data
        if f.scaled:
            rowlen = int(rowlen if rowlen is not None else (numel // self.shape[0] if self.shape and self.shape[0] else numel))
            scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
            if rowlen <= 0 or numel % rowlen or scale.size != numel // rowlen:
                raise AnyDeviceError("quantize", "scale", f"{scale.size} values",
                                     f"{fmt} {self.shape} needs one scale per {rowlen} elements")
            scale.flags.writeable = False
            self.scale, self.rowlen = scale, rowlen
        else:
            self.scale, self.rowlen = None, 0

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes stored: the blocks plus the scales."""
        return self.data.size + (0 if self.scale is None else 4 * self.scale.size)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dequantize(self) -> np.ndarray:
        """The float32 values (a new array)."""
        return dequantize(self)

    def __repr__(self):
        return f"QTensor({self.fmt}, shape={self.shape}, {self.nbytes} bytes)"


# ---- decoding (float32, as the kernels compute it) ---------------------------------------------
def _fp8_table(fmt: str) -> np.ndarray:
    b = np.arange(256, dtype=np.uint32)
    s = np.where(b >> 7, -1.0, 1.0)
    if fmt == "float8_e4m3fn":
        e, m = (b >> 3) & 15, b & 7
        v = np.where(e > 0, (1 + m / 8.0) * np.exp2(e.astype(np.float64) - 7), m * 2.0 ** -9)
        v = np.where((e == 15) & (m == 7), np.nan, v)
    else:  # e5m2: the top byte of a float16
        with np.errstate(invalid="ignore"):
            return (b << 8).astype(np.uint16).view(np.float16).astype(np.float32)
    return (s * v).astype(np.float32)


_FP8 = {}


def fp8_decode(fmt: str, bits: np.ndarray) -> np.ndarray:
    t = _FP8.get(fmt)
    if t is None:
        t = _FP8[fmt] = _fp8_table(fmt)
    return t[bits]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) values: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def dequantize(q: QTensor) -> np.ndarray:
    f = q.format
    if f.scaled:
        v = q.data.view(np.int8).astype(np.float32) if q.fmt == "int8" else fp8_decode(q.fmt, q.data)
        out = (v.reshape(-1, q.rowlen) * q.scale[:, None]).astype(np.float32)
        return out.reshape(q.shape)
    b = q.data.reshape(-1, f.block_bytes)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    if q.fmt == "q8_0":
        out = d * b[:, 2:].view(np.int8).astype(np.float32)
    elif q.fmt in ("q4_0", "q4_1"):
        qs = _nibbles(b[:, -16:]).astype(np.float32)
        if q.fmt == "q4_0":
            out = d * (qs - 8)
        else:
            out = d * qs + b[:, 2:4].copy().view(np.float16).astype(np.float32)
    else:  # q5_0 / q5_1
        hi_at = 2 if q.fmt == "q5_0" else 4
        qh = b[:, hi_at:hi_at + 4].copy().view(np.uint32)
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        qs = (_nibbles(b[:, -16:]) | (hi << 4)).astype(np.float32)
        if q.fmt == "q5_0":
            out = d * (qs - 16)
        else:
            out = d * qs + b[:, 2:4].copy().view(np.float16).astype(np.float32)
    return out.astype(np.float32).reshape(q.shape)


# ---- encoding (ggml's reference quantizers, so files and our own quantization agree) ------------
def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.trunc(x + np.copysign(np.float32(0.5), x)).astype(np.float32)


def quantize(a, fmt: str, op: str = "quantize") -> QTensor:
    """Quantize float values (NumPy array or CPU tensor; any float dtype) into ``fmt``. GGUF formats
    block the flat C-order data in 32s (the element count must be a multiple of 32); int8 and fp8 scale
    per row of dim 0 (int8, absmax/127) or per tensor (fp8, absmax/finfo.max)."""
    f = FORMATS.get(fmt)
    if f is None:
        raise AnyDeviceError(op, "format", fmt, f"is not one of {', '.join(FORMATS)}")
    if not isinstance(a, np.ndarray):
        import torch  # a tensor (any float dtype)
        a = a.detach().to("cpu", torch.float32).contiguous().numpy()
    a = np.ascontiguousarray(a, np.float32)
    shape = a.shape
    if not np.isfinite(a).all():
        raise AnyDeviceError(op, "weight", fmt, "has Inf or NaN values: they cannot be quantized")
    if a.size % f.block:
        raise AnyDeviceError(op, "weight", shape, f"has {a.size} elements, not a multiple of {fmt}'s block of {f.block}")
    if fmt == "int8":
        rows = a.reshape(shape[0] if a.ndim else 1, -1)
        amax = np.abs(rows).max(axis=1) if rows.size else np.zeros(rows.shape[0], np.float32)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        qv = np.clip(_round_half_away(rows / scale[:, None]), -127, 127).astype(np.int8)
        return QTensor(fmt, shape, qv.view(np.uint8), scale)
    if f.scaled:  # fp8, one scale for the tensor
        import torch
        tdt = getattr(torch, fmt)
        fmax = float(torch.finfo(tdt).max)
        amax = float(np.abs(a).max()) if a.size else 0.0
        scale = np.float32(amax / fmax if amax > 0 else 1.0)
        bits = torch.from_numpy(a / scale).to(tdt).view(torch.uint8).numpy()
        return QTensor(fmt, shape, bits, np.array([scale], np.float32), rowlen=a.size)
    blocks = a.reshape(-1, 32)
    n = blocks.shape[0]
    if fmt in ("q8_0",):
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127
        with np.errstate(divide="ignore", invalid="ignore"):
            qv = np.where(d == 0, 0, blocks / d)
        qv = _round_half_away(qv).astype(np.int8)
        out = np.concatenate([d.astype(np.float16).view(np.uint8), qv.view(np.uint8)], axis=1)
    elif fmt in ("q4_0", "q5_0"):
        levels = 8 if fmt == "q4_0" else 16
        imax = np.abs(blocks).argmax(axis=1)[:, None]
        mx = np.take_along_axis(blocks, imax, axis=1)
        d = mx / -levels
        with np.errstate(divide="ignore"):
            idd = np.where(d == 0, 0, 1 / d)
        qv = np.trunc(blocks * idd + np.float32(levels + 0.5)).astype(np.uint8).clip(0, 2 * levels - 1)
        out = _pack_nibbles(d, None, qv, fmt == "q5_0")
    else:  # q4_1 / q5_1
        top = 15 if fmt == "q4_1" else 31
        mn, mx = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        d = (mx - mn) / top
        with np.errstate(divide="ignore"):
            idd = np.where(d == 0, 0, 1 / d)
        qv = np.trunc((blocks - mn) * idd + np.float32(0.5)).astype(np.uint8).clip(0, top)
        out = _pack_nibbles(d, mn, qv, fmt == "q5_1")
    assert out.shape == (n, f.block_bytes)
    return QTensor(fmt, shape, out.reshape(-1))


def _pack_nibbles(d, m, qv, five: bool) -> np.ndarray:
    parts = [d.astype(np.float16).view(np.uint8)]
    if m is not None:
        parts.append(m.astype(np.float16).view(np.uint8))
    if five:
        parts.append(np.packbits(qv >> 4, axis=1, bitorder="little").reshape(-1, 4))
    parts.append((qv[:, :16] & 15) | ((qv[:, 16:] & 15) << 4))
    return np.concatenate(parts, axis=1)


class DeviceQuant:
    """Base of a device's packed quantized weight (the form ``Device._from_quant`` makes): ``fmt``, the
    logical ``shape``, for int8 / fp8 ``scale`` (the device's float32 array, one per ``rowlen`` elements)
    and ``nbytes`` (packed bytes plus scales); the device's linear / conv2d kernels read it,
    ``Device._dequant`` converts it. A subclass adds where its bytes are."""
    __slots__ = ()

    def _init(self, fmt: str, shape, data_bytes: int, scale=None, rowlen: int = 0) -> None:
        self.fmt, self.shape = fmt, tuple(int(s) for s in shape)
        self.scale, self.rowlen = scale, int(rowlen)
        self.size = math.prod(self.shape)
        self.nbytes = int(data_bytes) + (0 if scale is None else int(scale.nbytes))

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> str:
        return self.fmt

    def __repr__(self):
        return f"{type(self).__name__}({self.fmt}, shape={self.shape}, {self.nbytes} bytes)"


class Transposed:
    """``w.T`` of a quantized 2-D weight ``w`` (N, K) (a QTensor or a device's packed form), as a graph's
    matmul reads a linear weight: the product ``a @ Transposed(w)`` is ``linear(a, w)``, so the weight
    keeps its rows of K in blocks, as GGUF files and per-output-channel scales have them."""
    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w

    @property
    def shape(self) -> tuple:
        return tuple(reversed(self.w.shape))

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    @property
    def fmt(self) -> str:
        return self.w.fmt


def is_quantized(x) -> bool:
    """A quantized weight: a host ``QTensor`` or a device's packed form (or one of them transposed)."""
    return isinstance(x, (QTensor, DeviceQuant, Transposed))


def quantizable(shape, fmt: str) -> bool:
    """Whether a weight of ``shape`` can be stored in ``fmt`` (element count a multiple of its block,
    a row dimension for int8)."""
    n = math.prod(shape)
    return n > 0 and n % FORMATS[fmt].block == 0 and len(shape) >= 1
