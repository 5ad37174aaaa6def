"""Shared by the data-movement tests (tests/backend/ops/test_movement.py) and the layer-op tests
(tests/backend/ops/test_layers.py): a result as a host array, and "refused before any kernel ran".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anydevice.backend import AnyDeviceError


def host(be, y):
    if isinstance(y, torch.Tensor):
        return y.detach().cpu().numpy()
    if isinstance(y, np.ndarray):
        return y
    return be.to_numpy(y)


def refused_before_kernels(be, monkeypatch, case, prims):
    """case = (fn(be), op, arg, message fragment): fn raises AnyDeviceError naming op and arg
    before any of the primitives ``prims`` runs (they are patched to fail)."""
    fn, op, arg, fragment = case

    def no_kernel(*a, **k):
        raise AssertionError("a primitive ran before the arguments were checked")

    for prim in prims:
        monkeypatch.setattr(be, prim, no_kernel)
    with pytest.raises(AnyDeviceError) as ei:
        fn(be)
    e = ei.value
    assert (e.op, e.arg) == (op, arg), str(e)
    assert fragment in str(e), str(e)
