"""Conversion between the caller's arrays and a device's (the one place host<->device transfers are
counted), and the dtype rule of every op: inputs converted to the compute dtype (float32), the result
rounded to the promoted dtype (dtypes.py)."""
from __future__ import annotations

import math

import numpy as np

from ..system.errors import AnyDeviceError
from . import dtypes, quant
from .kinds import Kind, _is_torch_tensor, _kind

_FLOAT32 = np.dtype(np.float32)


class Conversion:
    """``to_device`` / ``to_numpy`` and the input/output conversion every op of ``contract.Backend`` runs."""

    def to_device(self, x, op: str = "to_device", arg: str = "input", constant: bool = False, dtype=None,
                  share: bool = False):
        """Any accepted input -> this backend's native array, stored as ``dtype`` (None: float32, the
        compute dtype; a dtype the device cannot store is refused; a native array of another dtype is
        converted on the device). A host array is one upload, counted under
        ``constants`` for a constant parameter such as a kernel or a bias.

        ``share``: the caller promises not to write ``x`` while the result lives (a compiled weight), so
        a device that works in host memory may wrap a float32, C-contiguous host array or CPU tensor
        instead of copying it (``_wrap_host``; nothing moves, nothing is counted); elsewhere a copy."""
        key = "constants" if constant else "uploads"
        dtype = self._storage_dtype(op, dtype)
        size = dtypes.ITEMSIZE[dtype]
        if quant.is_quantized(x):  # a quantized weight where an array is wanted: its values, dequantized
            if isinstance(x, quant.QTensor):
                self._count(key, size * x.numel)
                return self._from_numpy(x.dequantize(), dtype)
            if not isinstance(x, self.native_types):
                raise AnyDeviceError(op, arg, type(x).__name__, f"is another device's quantized weight (this is {self.name})")
            y = self._dequant(x)
            return y if dtype == dtypes.FLOAT32 else self._cast(y, dtype)
        if isinstance(x, np.ndarray) or isinstance(x, (list, tuple, int, float, np.number)):
            a = _as_float32(x if isinstance(x, np.ndarray) else _host_array(x, op, arg), op, arg)
            if share and dtype == "float32":
                w = self._wrap_host(a)
                if w is not None:
                    return w
            self._count(key, size * a.size)
            return self._from_numpy(a) if dtype == "float32" else self._from_numpy(a, dtype)
        if _is_torch_tensor(x):
            if x.is_complex():
                raise AnyDeviceError(op, arg, x, f"complex dtype {x.dtype} is not supported")
            if share and dtype == "float32":
                a = _shared_view(x)
                w = None if a is None else self._wrap_host(a)
                if w is not None:
                    return w
            self._count(key, size * x.numel(), x.device.type == "cpu")
            return self._from_torch(x) if dtype == "float32" else self._from_torch(x, dtype)
        if isinstance(x, self.native_types):  # a native array in another dtype is converted on the device
            return x if self._dtype(x) == dtype else self._cast(x, dtype)
        raise AnyDeviceError(op, arg, type(x).__name__,
                             "must be a NumPy array, a torch tensor or a device array")

    def to_numpy(self, x) -> np.ndarray:
        """A NumPy array of ``x`` (a native array: one download; float32 from a device that stores
        other dtypes; a quantized weight dequantized)."""
        if isinstance(x, quant.QTensor):
            return x.dequantize()
        if isinstance(x, quant.DeviceQuant):
            x = self.to_device(x)
        if isinstance(x, np.ndarray) and (x.dtype == _FLOAT32 or self._dtype(x) not in self.caps.storage_dtypes):
            return x
        if _is_torch_tensor(x):
            self._count("downloads", 4 * x.numel(), x.device.type != "cpu")
            t = x.detach().to("cpu")
            return (t.float() if dtypes.of(t) in dtypes.HALF else t).numpy()
        self._count("downloads", 4 * math.prod(self._shape(x)))
        return self._to_numpy(x)

    def _inputs(self, op: str, optional=("bias",), _keep=(), _stored=(), _same=(), _half=(), _cap="", **arrays):
        """Convert the named inputs; return (kind_of_first, like_first, natives...). Only the
        arguments named in ``optional`` may be None (a None elsewhere is refused, naming it).
        ``kind.dtype`` is the result dtype, torch's promotion over the floating inputs (ops/dtypes.py),
        which ``_out`` rounds the result to. The natives are in the compute dtype (float32), except
        native half arrays named in
        - ``_keep`` (a weight) on a device whose kernels read half weights ("half_weights" in ``caps.fused``);
          a quantized weight named in ``_keep`` stays packed where the device reads its format
          (``caps.quant_formats``: a host ``QTensor`` is uploaded as it is), else it is dequantized;
        - ``_stored``: ops that only give the array a new shape (reshape, view);
        - ``_same``: elementwise ops, where the array has the result dtype and the device's elementwise
          kernels load and store half ("half_elementwise": computed in float32, rounded once);
        - ``_half``: arguments the device's kernels for this op read as stored where it declares the capability
          ``_cap`` and the array has the result dtype: "half_movement" (permute, slice, cat...: half values
          moved as they are), "half_norm" (a norm's input, weight and bias, read by the fused row norm)."""
        kind = like = None
        dts = {}
        for arg, value in arrays.items():
            if value is None:
                if arg not in optional:
                    raise AnyDeviceError(op, arg, None, "is required: pass a tensor, not None")
                continue
            if kind is None:
                kind, like = _kind(value, self), value
            dts[arg] = self._value_dtype(value)
        result = dtypes.promote(dts.values())
        fused = self.caps.fused
        natives = []
        for arg, value in arrays.items():
            dt = dts.get(arg)
            if arg in _keep and quant.is_quantized(value) and value.fmt in self.caps.quant_formats:
                natives.append(value if isinstance(value, quant.DeviceQuant) else self._quant_upload(value, op))
            elif value is not None and dt in dtypes.HALF and _kind(value, self) == "native" and (
                    arg in _stored or (arg in _keep and "half_weights" in fused)
                    or (arg in _same and dt == result and "half_elementwise" in fused)
                    or (arg in _half and dt == result and _cap in fused)):
                natives.append(value)  # as it is stored: the op or the device's kernels read it so
            else:
                natives.append(None if value is None else self.to_device(value, op, arg))  # float32
        return (Kind(kind or "numpy", result), like, *natives)

    def to_device_quant(self, q):
        """A host ``QTensor`` as this device keeps it: packed on the device (``_from_quant``) where its
        kernels read the format (``caps.quant_formats``), else the QTensor itself (each op that takes it
        dequantizes it: the weight stays quantized in memory)."""
        if q.fmt in self.caps.quant_formats:
            return self._quant_upload(q, "to_device_quant")
        return q

    def _quant_upload(self, q, op: str):
        """A host QTensor in the device's packed form (its bytes and scales uploaded as they are)."""
        self._count("constants", q.nbytes)
        return self._from_quant(q)

    def _value_dtype(self, value):
        """The contract dtype of an op's argument (None: a number, an integer or bool array, or a quantized
        weight: like ComfyUI-GGUF's dequantized weights, it takes the dtype of the other inputs)."""
        if quant.is_quantized(value):
            return None
        if isinstance(value, self.native_types) and _kind(value, self) == "native":
            return self._dtype(value)
        return dtypes.of(value)

    def _out(self, y, kind, like):
        """The result ``y`` (a native float32 array, or what an op returns as it is) as the caller's kind,
        rounded to the result dtype ``kind.dtype`` where that is a half dtype."""
        dtype = getattr(kind, "dtype", dtypes.FLOAT32)
        half = dtype != dtypes.FLOAT32 and (isinstance(y, self.native_types) or _is_torch_tensor(y)) \
            and self._dtype(y) == dtypes.FLOAT32
        if kind == "torch":
            self._count("downloads", 4 * math.prod(self._shape(y)), like.device.type == "cpu")
            t = self._to_torch(y, like)
            return t.to(dtypes.torch_dtype(dtype)) if half else t
        if kind == "numpy":  # rounded on the host (a device that stores float32 only gives host halves too)
            if not isinstance(y, np.ndarray):
                y = self.to_numpy(y)
            return dtypes.host_store(y, dtype) if half else y
        return self._cast(y, dtype) if half and dtype in self.caps.storage_dtypes else y


# ----------------------------------------------------------------------------------------------
# input kinds
# ----------------------------------------------------------------------------------------------
def _host_array(x, op: str, arg: str) -> np.ndarray:
    """A list, tuple or number as a NumPy array (a ragged list is refused, naming the argument)."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as exc:
        raise AnyDeviceError(op, arg, x, f"is not a rectangular array of numbers ({exc})") from None


def _shared_view(t) -> np.ndarray | None:
    """A NumPy array on the memory of ``t``, a plain float32 C-contiguous CPU tensor (None for any other:
    a tensor subclass may keep its data elsewhere). It holds a detached tensor, not ``t``: a cache that
    keeps the device array by a weak reference to ``t`` still sees ``t`` go (compile/lowering.py Weights)."""
    import torch
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type != "cpu" \
            or t.dtype != torch.float32 or not t.is_contiguous() or t.numel() == 0:
        return None
    try:
        return t.detach().numpy()
    except (RuntimeError, TypeError):
        return None


def _as_float32(a: np.ndarray, op: str, arg: str) -> np.ndarray:
    if a.dtype == _FLOAT32:
        return a
    if isinstance(a, dtypes.BF16):
        return dtypes.from_bf16(a)
    if a.dtype.kind in "fiub":
        return a.astype(np.float32)
    raise AnyDeviceError(op, arg, a, f"dtype {a.dtype} is not supported (use a real number type)")
