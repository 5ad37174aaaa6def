"""Shared by the compute-node tests (tests/nodes/compute/): a node output against a float64
reference, normwise relative error <= 1e-6.
"""
from __future__ import annotations

import torch


def close(y, ref):
    y = y.double() if torch.is_tensor(y) else torch.as_tensor(y).double()
    assert y.shape == ref.shape, (tuple(y.shape), tuple(ref.shape))
    err = (y - ref).norm() / ref.norm()
    assert err <= 1e-6, f"normwise relative error {err:.3g}"
