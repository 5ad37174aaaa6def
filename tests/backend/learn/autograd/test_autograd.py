"""The autograd tape itself (issue 13): recording, accumulation, broadcasting, no_grad, errors.
The per-op gradient checks live in test_rules_*.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend import AnyDeviceError
from anydevice.backend.learn import autograd as ag
from grad_check import check_grad


def _linear_case(be, seed):
    """A seeded linear layer on be: the input X (4x5), weight W (3x5) and bias B (3) as Vars (W and B
    need grads), the target t (4x3, numpy); and torch's float64 twin (tw, tb: leaves that need grads,
    ty = linear(x, tw, tb), the target tt)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    t = rng.standard_normal((4, 3)).astype(np.float32)
    tw = torch.tensor(w.astype(np.float64), requires_grad=True)
    tb = torch.tensor(b.astype(np.float64), requires_grad=True)
    ty = TF.linear(torch.tensor(x, dtype=torch.float64), tw, tb)
    twin = (tw, tb, ty, torch.tensor(t, dtype=torch.float64))
    return ag.Var(be, x), ag.Var(be, w, requires_grad=True), ag.Var(be, b, requires_grad=True), t, twin


def test_chain_and_accumulation(backend_target):
    be = backend_target
    X, W, B, t, (tw, tb, ty, tt) = _linear_case(be, 1)
    y = ag.F.linear(X, W, B)
    z = ag.F.relu(y) * 2.0 + y  # y used twice: gradients add up
    loss = ag.F.mse_loss(z, t)
    loss.backward()
    TF.mse_loss(torch.relu(ty) * 2 + ty, tt).backward()
    np.testing.assert_allclose(be.to_numpy(W.grad), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(be.to_numpy(B.grad), tb.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert X.grad is None
    # a second backward through a new graph accumulates into .grad, as torch's
    ag.F.mse_loss(ag.F.linear(X, W, B), t).backward()
    assert be.to_numpy(W.grad).shape == (3, 5)


def _second_backward_graph(be):
    X, W, B, t, (tw, tb, ty, tt) = _linear_case(be, 2)
    y = ag.F.linear(X, W, B)
    loss = ag.F.mse_loss(ag.F.tanh(y) * 2.0 + y, t)
    tloss = TF.mse_loss(torch.tanh(ty) * 2 + ty, tt)
    return (W, B, loss), (tw, tb, tloss)


def test_a_second_backward_through_a_freed_graph_is_an_error(backend_target):
    """The first backward frees the graph; a second one silently did nothing (the loss had become a
    leaf). torch raises "Trying to backward through the graph a second time", and so does the tape,
    leaving .grad as the first backward made it."""
    be = backend_target
    (W, B, loss), (tw, tb, tloss) = _second_backward_graph(be)
    loss.backward()
    tloss.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        tloss.backward()
    first_w, first_b = be.to_numpy(W.grad).copy(), be.to_numpy(B.grad).copy()
    with pytest.raises(AnyDeviceError) as e:
        loss.backward()
    msg = str(e.value)
    assert msg.startswith("backward: argument 'graph' = ") and "freed at op" in msg, msg
    assert "Trying to backward through the graph a second time" in msg and "retain_graph=True" in msg, msg
    np.testing.assert_array_equal(be.to_numpy(W.grad), first_w)
    np.testing.assert_array_equal(be.to_numpy(B.grad), first_b)
    np.testing.assert_allclose(first_w, tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(AnyDeviceError, match="second time"):  # ag.grad through it too
        ag.grad(loss, [W])
    assert not loss.is_leaf  # the loss keeps its (freed) node: it did not turn into a leaf


def test_retain_graph_lets_a_second_backward_accumulate_as_torch(backend_target):
    be = backend_target
    (W, B, loss), (tw, tb, tloss) = _second_backward_graph(be)
    loss.backward(retain_graph=True)
    loss.backward()  # accumulates: twice the gradient, as torch's
    tloss.backward(retain_graph=True)
    tloss.backward()
    np.testing.assert_allclose(be.to_numpy(W.grad), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(be.to_numpy(B.grad), tb.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(AnyDeviceError, match="second time"):  # the second (without retain_graph) freed it
        loss.backward()
    # ag.grad with retain_graph keeps it too; nothing is accumulated into .grad
    (W2, B2, loss2), (tw2, _tb2, tloss2) = _second_backward_graph(be)
    g1, = ag.grad(loss2, [W2], retain_graph=True)
    g2, = ag.grad(loss2, [W2])
    ref, = torch.autograd.grad(tloss2, [tw2])
    np.testing.assert_allclose(be.to_numpy(g1), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(be.to_numpy(g1), be.to_numpy(g2))
    assert W2.grad is None


def test_a_backward_through_part_of_a_freed_graph_is_an_error(backend_target):
    """Two losses over one shared value: after the first one's backward, the second reaches the
    shared (freed) ops and raises, as torch does for ops that kept tensors."""
    be = backend_target
    W = ag.Var(be, np.arange(6, dtype=np.float32).reshape(2, 3) / 6, requires_grad=True)
    y = ag.F.tanh(W)
    ag.F.sum(y).backward()
    with pytest.raises(AnyDeviceError, match="second time"):
        ag.F.mean(ag.F.mul(y, y)).backward()
    tw = torch.tensor(np.arange(6, dtype=np.float64).reshape(2, 3) / 6, requires_grad=True)
    ty = torch.tanh(tw)
    ty.sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        (ty * ty).mean().backward()


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
