"""The floating-point dtypes of the contract: float32 (the default), float16 and bfloat16.

Storage and compute are separate: a device stores the dtypes in ``caps.storage_dtypes`` and computes
in ``caps.compute_dtypes``. The contract converts each op's half inputs to a dtype the device computes
in (float32 on every device today), runs the op there and rounds the result once to the result dtype
(``promote``, torch's rule), so accumulation is float32 and every result is rounded as torch rounds a
float16/bfloat16 op's float32 internal result. Half stays the storage and transfer format.

bfloat16 has no NumPy dtype: on the host it is ``BF16``, a uint16 array of the bit patterns (rounded
to nearest even from float32, NaN kept NaN), as torch stores it.
"""
from __future__ import annotations

import numpy as np

from ..system.errors import AnyDeviceError

FLOAT32, FLOAT16, BFLOAT16 = "float32", "float16", "bfloat16"
#: the floating dtypes the contract knows, in torch's names
FLOATS = (FLOAT32, FLOAT16, BFLOAT16)
#: the 16-bit ones
HALF = (FLOAT16, BFLOAT16)
#: bytes per element of each stored dtype
ITEMSIZE = {FLOAT32: 4, FLOAT16: 2, BFLOAT16: 2}
#: torch.testing's default tolerances per dtype (rtol, atol)
TOLERANCES = {FLOAT32: (1.3e-6, 1e-5), FLOAT16: (1e-3, 1e-5), BFLOAT16: (1.6e-2, 1e-5)}


class BF16(np.ndarray):
    """A host bfloat16 array: uint16 bit patterns that say which dtype they are."""

    def __array_finalize__(self, obj):  # views and copies stay BF16
        pass


def name(dtype) -> str:
    """A dtype's contract name from a name, a NumPy dtype or a torch dtype; other dtypes are refused
    by the caller (this returns their own name)."""
    if isinstance(dtype, str):
        return {"half": FLOAT16, "float": FLOAT32, "bf16": BFLOAT16}.get(dtype, dtype)
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):
        pass
    n = _name(dtype)
    if len(_NAMES) < 256:
        try:
            _NAMES[dtype] = n
        except TypeError:  # unhashable
            pass
    return n


#: dtype object -> its contract name (NumPy's dtype.name takes microseconds; every op asks)
_NAMES: dict = {}


def _name(dtype) -> str:
    text = str(dtype)
    if text.startswith("torch."):
        return text[6:].replace("half", FLOAT16).replace("bfloat16", BFLOAT16)
    try:
        return np.dtype(dtype).name
    except TypeError:
        return text


def of(x) -> str | None:
    """The contract dtype name of a host or torch array (None: not a floating array: integer or bool
    inputs take no part in promotion, as torch's integer tensors do not lower a float result)."""
    if isinstance(x, BF16):
        return BFLOAT16
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    n = name(dt)
    return n if n in FLOATS else None


def promote(names) -> str:
    """torch's result dtype over the floating inputs' dtypes: the same dtype stays; float16 with
    bfloat16, or anything with float32, is float32; no floating input: float32."""
    found = {n for n in names if n is not None}
    if len(found) == 1:
        return found.pop()
    return FLOAT32


def to_bf16(a: np.ndarray) -> BF16:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (NaN stays a quiet NaN)."""
    a = np.ascontiguousarray(a, np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r.view(BF16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns -> float32 (exact)."""
    return (np.asarray(b).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to ``dtype`` and back to float32 (what storing them as ``dtype`` keeps)."""
    return host_float32(host_store(a, dtype))


def host_store(a: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 host array as the host stores ``dtype`` (float16 ndarray, BF16 bits, float32)."""
    if dtype == FLOAT16:
        return np.asarray(a, np.float32).astype(np.float16)
    if dtype == BFLOAT16:
        return to_bf16(a)
    return np.asarray(a, np.float32)


def host_float32(a: np.ndarray) -> np.ndarray:
    """A host array as stored by ``host_store`` -> float32."""
    if isinstance(a, BF16):
        return from_bf16(a)
    return np.asarray(a, np.float32)


def torch_dtype(dtype: str):
    import torch
    return {FLOAT32: torch.float32, FLOAT16: torch.float16, BFLOAT16: torch.bfloat16}[dtype]


def check(op: str, arg: str, dtype) -> str:
    """``dtype``'s contract name, or an AnyDeviceError naming op, arg and the value."""
    n = name(dtype)
    if n not in FLOATS:
        raise AnyDeviceError(op, arg, dtype, f"is not one of {', '.join(FLOATS)}")
    return n
