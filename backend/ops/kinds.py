"""What kind of value an op was given: the backend's own array ("native"), a torch tensor or
anything NumPy takes ("numpy"). Shared by the contract and its op mixins (results come back in the
kind of the first tensor argument)."""
from __future__ import annotations

import sys

import numpy as np


def _is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # no torch imported: nothing can be a tensor
    return torch is not None and isinstance(x, torch.Tensor)


class Kind(str):
    """An op's input kind ("native", "torch" or "numpy", compared as a string) and ``dtype``, the
    contract dtype name its result is rounded to (ops/dtypes.py)."""

    dtype = "float32"

    def __new__(cls, kind: str, dtype: str = "float32"):
        self = super().__new__(cls, kind)
        self.dtype = dtype
        return self


def _kind(x, backend) -> str:
    if isinstance(x, backend.native_types) and not isinstance(x, np.ndarray) and not _is_torch_tensor(x):
        return "native"
    if _is_torch_tensor(x):
        return "torch"
    return "numpy"
