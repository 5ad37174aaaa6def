"""The autograd tape itself (issue 13): recording, accumulation, broadcasting, no_grad, errors.
The per-op gradient checks live in test_grad_*.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend import AnyDeviceError, autograd as ag
from grad_check import check_grad


def test_chain_and_accumulation(backend_target):
    be = backend_target
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    t = rng.standard_normal((4, 3)).astype(np.float32)
    W = ag.Var(be, w, requires_grad=True)
    B = ag.Var(be, b, requires_grad=True)
    X = ag.Var(be, x)
    y = ag.F.linear(X, W, B)
    z = ag.F.relu(y) * 2.0 + y  # y used twice: gradients add up
    loss = ag.F.mse_loss(z, t)
    loss.backward()
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    tb = torch.tensor(b.astype(np.float64), requires_grad=True)
    ty = TF.linear(torch.tensor(x, dtype=torch.float64), tw, tb)
    TF.mse_loss(torch.relu(ty) * 2 + ty, torch.tensor(t, dtype=torch.float64)).backward()
    np.testing.assert_allclose(be.to_numpy(W.grad), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(be.to_numpy(B.grad), tb.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert X.grad is None
    # a second backward through a new graph accumulates into .grad, as torch's
    ag.F.mse_loss(ag.F.linear(X, W, B), t).backward()
    assert be.to_numpy(W.grad).shape == (3, 5)


def test_broadcast_gradient_is_summed(backend_target):
    check_grad(backend_target, "add", {"input": np.ones((4, 1, 3)), "other": np.arange(6.0).reshape(2, 3)},
               torch.add)
    check_grad(backend_target, "mul", {"input": np.random.default_rng(0).standard_normal((2, 3, 4)),
                                       "other": np.random.default_rng(1).standard_normal((3, 1))}, torch.mul)


def test_no_grad_records_nothing(backend_target):
    be = backend_target
    W = ag.Var(be, np.ones((2, 2), np.float32), requires_grad=True)
    with ag.no_grad():
        y = ag.F.mul(W, 3.0)
    assert not y.requires_grad and y.is_leaf


def test_missing_rule_and_nonscalar_seed_are_refused(backend_target):
    be = backend_target
    W = ag.Var(be, np.ones((2, 2), np.float32), requires_grad=True)
    with pytest.raises(AnyDeviceError, match="gradient"):
        ag.F.mul(W, 2.0).backward()
    ag.F.sum(ag.F.mul(W, 2.0)).backward()
    np.testing.assert_array_equal(be.to_numpy(W.grad), np.full((2, 2), 2.0))


def test_inputs_never_written(backend_target):
    be = backend_target
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    keep = x.copy()
    W = ag.Var(be, x, requires_grad=True)
    ag.F.mean(ag.F.mul(W, W)).backward()
    np.testing.assert_array_equal(x, keep)
