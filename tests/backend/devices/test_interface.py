"""The device interface (backend/devices/interface.py) is complete and its dtype slot is live.

``MiniDevice`` derives only from the shared ops (``contract.Backend``, whose base is ``Device``) and
implements exactly ``Device``'s abstract methods, each in a few lines of plain NumPy; conftest.py
adds it as the backend target "mini", so the whole precision suite (test_precision.py) runs on it.
``HalfStore`` is the NumPy device storing float16 through ``to_device(..., dtype=...)``.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from anydevice.backend.devices.interface import FUSED_KERNELS, Capabilities, Device
from anydevice.backend.devices.numpy import NumpyBackend
from anydevice.backend.ops.contract import Backend
from anydevice.backend.system.errors import AnyDeviceError

F32 = np.float32
from repo_paths import ROOT  # noqa: E402


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
           "minimum": np.minimum, "maximum": np.maximum, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
           "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}


def _unary(op, x, p):
    x64 = x.astype(np.float64)
    if op in ("abs", "exp", "log", "sqrt", "tanh", "sin", "cos"):
        return getattr(np, op)(x64)
    table = {
        "neg": lambda: -x64, "rsqrt": lambda: 1.0 / np.sqrt(x64), "erf": lambda: _erf(x64),
        "relu": lambda: np.maximum(x64, 0.0), "sigmoid": lambda: _sigmoid(x), "silu": lambda: x * _sigmoid(x),
        "elu": lambda: np.where(x64 > 0, x64, p.get("alpha", 1.0) * np.expm1(x64)),
        "leaky_relu": lambda: np.where(x64 > 0, x64, x64 * p.get("negative_slope", 0.01)),
    }
    if op in table:
        return table[op]()
    if op == "gelu" and p.get("approximate", "none") == "tanh":
        return 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    if op == "gelu":
        return 0.5 * x64 * _erfc(-x64 / math.sqrt(2.0))
    if op == "softplus":
        bx = x * F32(p["beta"])
        return np.where(bx > p["threshold"], x64, np.log1p(np.exp(bx.astype(np.float64))) / p["beta"])
    if op == "clamp":
        y = x if p["min"] is None else np.maximum(x, F32(p["min"]))
        return y if p["max"] is None else np.minimum(y, F32(p["max"]))
    raise NotImplementedError(op)


def _index(start, step, n, size):
    """The n input positions start + step*k, ``size`` (a zero row) where outside the input."""
    r = start + step * np.arange(n)
    return np.where((r >= 0) & (r < size), r, size)


def _taps(x, idx, wgt, axis, mode):
    """One axis of a window table: x's ``axis`` gathered through idx (O, T) (-1: no tap) and reduced."""
    shape = list(x.shape)
    n, shape[axis] = shape[axis], 1
    xp = np.concatenate([x, np.full(shape, 0.0 if mode == "sum" else -np.inf, F32)], axis=axis)
    g = np.take(xp, np.where(idx >= 0, idx, n), axis=axis)  # (..., O, T, ...)
    if mode == "max":
        return g.max(axis=axis + 1)
    w = np.where(idx >= 0, wgt, 0).astype(F32).reshape(idx.shape + (1,) * (x.ndim - axis - 1))
    return (g * w).sum(axis=axis + 1, dtype=F32)


class MiniDevice(Backend):
    """A minimal device: the interface's required primitives in plain NumPy, nothing else."""

    name = "mini"
    native_types = (np.ndarray,)

    # conversion and layout: NumPy arrays are the native arrays, views where NumPy gives them
    _from_numpy = staticmethod(lambda a, dtype="float32": a)
    _to_numpy = staticmethod(lambda x: x)
    _reshape = staticmethod(np.reshape)
    _permute = staticmethod(np.transpose)
    _expand = staticmethod(np.broadcast_to)
    _concat_channels = staticmethod(lambda parts, n, c, h, w: np.concatenate(parts, axis=1))
    _slice1 = staticmethod(lambda x, i: x[:, i])

    def _slice(self, x, dim, start, length, step):
        return x[(slice(None),) * dim + (slice(start, start + (length - 1) * step + 1 if length else start, step),)]

    def _cat(self, parts, dim):
        return np.concatenate(parts, axis=dim)

    def _contiguous(self, x):
        return np.ascontiguousarray(x)

    def _where(self, c, a, b):
        return np.asarray(np.where(c != 0, a, b), F32)

    def _bmm(self, a, b):
        return np.matmul(a, b)

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        (N, C, H, W), (Co, Cg, KH, KW), (sh, sw), (dh, dw), G = x.shape, w.shape, stride, dilation, groups
        OH = max(0, (H + pads[0] + pads[1] - dh * (KH - 1) - 1) // sh + 1)
        OW = max(0, (W + pads[2] + pads[3] - dw * (KW - 1) - 1) // sw + 1)
        xz = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))  # taps outside x read this zero row / column
        cols = np.empty((N, G, Cg, KH, KW, OH, OW), F32)
        for i in range(KH):
            for j in range(KW):
                r, c = _index(i * dh - pads[0], sh, OH, H), _index(j * dw - pads[2], sw, OW, W)
                cols[:, :, :, i, j] = xz[:, :, r][:, :, :, c].reshape(N, G, Cg, OH, OW)
        with np.errstate(all="ignore"):  # inf and NaN propagate as in torch
            y = np.matmul(w.reshape(G, Co // G, -1), cols.reshape(N, G, Cg * KH * KW, OH * OW)).reshape(N, Co, OH, OW)
        return y if bias is None else y + bias.reshape(1, -1, 1, 1)

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        (N, C, H, W), (_, CoG, KH, KW), (sh, sw), (dh, dw), G = x.shape, w.shape, stride, dilation, groups
        OH = (H - 1) * sh - 2 * padding[0] + dh * (KH - 1) + output_padding[0] + 1
        OW = (W - 1) * sw - 2 * padding[1] + dw * (KW - 1) + output_padding[1] + 1
        wg = w.reshape(G, C // G, CoG * KH * KW).transpose(0, 2, 1)
        with np.errstate(all="ignore"):  # inf and NaN propagate as in torch
            cols = np.matmul(wg, x.reshape(N, G, C // G, H * W)).reshape(N, G * CoG, KH, KW, H, W)
        full = np.zeros((N, G * CoG, max(OH + padding[0], (H - 1) * sh + dh * (KH - 1) + 1),
                         max(OW + padding[1], (W - 1) * sw + dw * (KW - 1) + 1)), F32)
        for i in range(KH):
            for j in range(KW):
                full[:, :, i * dh:i * dh + (H - 1) * sh + 1:sh, j * dw:j * dw + (W - 1) * sw + 1:sw] += cols[:, :, i, j]
        y = full[:, :, padding[0]:padding[0] + OH, padding[1]:padding[1] + OW]
        return np.ascontiguousarray(y if bias is None else y + bias.reshape(1, -1, 1, 1))

    def _pad(self, x, pads, mode):
        np_mode = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        return np.pad(x, [(0, 0)] * (x.ndim - 2) + [pads[:2], pads[2:]], mode=np_mode)

    def _window2d(self, x, mode, rows, cols):
        with np.errstate(all="ignore"):
            return _taps(_taps(x, *rows, x.ndim - 2, mode), *cols, x.ndim - 1, mode)

    def _unary(self, op, x, **params):
        with np.errstate(all="ignore"):
            return np.asarray(_unary(op, x, params), F32)

    def _binary(self, op, a, b):
        a, b = (F32(v) if isinstance(v, float) else v for v in (a, b))
        with np.errstate(all="ignore"):
            return np.asarray(_BINARY[op](a, b), F32)

    def _reduce(self, op, x, dims, keepdim):
        with np.errstate(all="ignore"):
            if op in ("sum", "mean"):
                y = np.sum(x, axis=dims, dtype=np.float64, keepdims=keepdim)
                count = math.prod(x.shape[d] for d in dims)
                y = y if op == "sum" else (y / count if count else np.full(y.shape, np.nan))
            else:
                y = (np.max if op == "max" else np.min)(x, axis=dims, keepdims=keepdim)
        return np.asarray(y, F32)


class HalfStore(NumpyBackend):
    """The NumPy device storing float16 when asked (``to_device(..., dtype="float16")``)."""

    name = "numpy-half"
    caps = dataclasses.replace(NumpyBackend.caps, storage_dtypes=frozenset({"float32", "float16"}))

    def _from_numpy(self, a, dtype="float32"):
        return a.astype(np.float16) if self._storage_dtype("to_device", dtype) == "float16" else a

    def _to_numpy(self, x):
        return np.asarray(x, F32)


def create_mini():
    """The "mini" backend target of conftest.py."""
    return MiniDevice()


# ---- the interface -------------------------------------------------------------------------------
def _defined(cls) -> set[str]:
    return {k for k, v in vars(cls).items() if callable(v) and not k.startswith("__")}


def test_minidevice_implements_exactly_the_abstract_methods():
    assert MiniDevice.__mro__[1] is Backend and not issubclass(MiniDevice, NumpyBackend)
    assert Device in Backend.__mro__
    assert _defined(MiniDevice) == set(Device.__abstractmethods__)
    assert not MiniDevice.__abstractmethods__
    MiniDevice()


def test_a_device_missing_a_primitive_cannot_be_made():
    partial = type("Partial", (MiniDevice,), {"_bmm": Device._bmm})
    with pytest.raises(TypeError, match="_bmm"):
        partial()


def test_every_primitive_has_hints_and_a_docstring():
    for name in Device.__abstractmethods__:
        fn = getattr(Device, name)
        assert fn.__doc__ and fn.__doc__.strip(), name
        assert "return" in fn.__annotations__ and len(fn.__annotations__) > 1, name


@pytest.mark.parametrize("cls", ["NumpyBackend", "OpenCLBackend", "CudaBackend", "TorchBackend", "MiniDevice"])
def test_declared_fused_kernels_are_implemented(cls):
    """Each name in a device's caps.fused is a known kernel whose method the device overrides."""
    import importlib
    mods = {"NumpyBackend": "anydevice.backend.devices.numpy", "MiniDevice": __name__,
            "OpenCLBackend": "anydevice.backend.devices.opencl.backend",
            "CudaBackend": "anydevice.backend.devices.cuda.backend",
            "TorchBackend": "anydevice.backend.devices.torch.backend"}
    try:
        klass = getattr(importlib.import_module(mods[cls]), cls)
    except ImportError as exc:
        pytest.skip(str(exc))
    fused = klass.caps.fused
    if cls == "OpenCLBackend":
        from anydevice.backend.devices.opencl.backend import FUSED
        fused = FUSED
    # every device computes in float32; the ones that store half (the half-precision step) store float32 too
    assert klass.caps.compute_dtypes == frozenset({"float32"})
    assert "float32" in klass.caps.storage_dtypes <= {"float32", "float16", "bfloat16"}
    methods = {"adam_step": "_adam_step", "conv_weight_grad": "_conv2d_weight_grad",
               "conv_input_grad": "_conv2d_input_grad", "all_finite": "_all_finite", "write_rows": "_write_rows",
               "attention": "_attention_fused", "w8a8": "_linear_w8a8", "norm_affine": "_norm_rows_affine",
               "prelu": "_prelu_fused", "graph_replay": "_capture", "batch_norm": "_batch_norm_train",
               "cross_entropy": "_cross_entropy_rows", "conv_prelu": "_conv2d_prelu", "replay": "record"}
    assert set(methods) | {"fft_conv", "winograd", "half_weights", "half_elementwise", "half_movement", "half_norm", "half_gemm", "half_linear", "half_conv", "half_attention",
                            "linear_weight"} == set(FUSED_KERNELS)
    for kernel in fused:
        assert kernel in FUSED_KERNELS
        if kernel in methods:
            assert getattr(klass, methods[kernel]) is not getattr(Device, methods[kernel]), kernel


def test_a_device_without_a_kernel_says_so():
    be = MiniDevice()
    assert be.caps == Capabilities() and be.capabilities is be.caps
    with pytest.raises(NotImplementedError, match="adam_step"):
        be._adam_step(*([None] * 12))


def test_readme_lists_the_interface():
    """README's "Adding a backend" names exactly Device's abstract methods."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Adding a backend", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if re.match(r"\s*- `_", line)]  # the list's lines
    listed = {name for line in items for name in re.findall(r"`(_\w+)\(", line)}
    assert listed == set(Device.__abstractmethods__)


# ---- the dtype slot ------------------------------------------------------------------------------
def test_float16_storage_through_the_dtype_slot():
    be = HalfStore()
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(F32) * 100
    d = be.to_device(x, dtype="float16")
    assert isinstance(d, np.ndarray) and d.dtype == np.float16
    y = be.to_numpy(d)
    assert y.dtype == F32
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(F32))
    assert be.to_device(x).dtype == F32  # the default stays float32


def test_float32_devices_refuse_other_dtypes():
    be = MiniDevice()  # declares float32 storage only (the interface's default)
    with pytest.raises(AnyDeviceError) as e:
        be.to_device(np.ones(3, F32), "conv2d", dtype="float16")
    msg = str(e.value)
    assert "conv2d" in msg and "'dtype'" in msg and "float16" in msg and "float32" in msg
    with pytest.raises(AnyDeviceError, match="dtype"):
        be.to_device(np.ones(3, F32), dtype="not-a-dtype")
    assert be.to_device(np.ones(3, F32), dtype="float32").dtype == F32
