"""The conv plan is made once per op and handed to the backward rule (autograd/tape.PLANNED): the
backward reads the forward's own plan object from ctx.extra["plan"], and the gradients it gives are
torch's (float64 reference) for strided, dilated, padded and 'same' geometries."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend import get_backend
from anydevice.backend.learn import autograd as ag
from anydevice.backend.learn.autograd import rules_conv
from anydevice.backend.ops import contract


def _count(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **k):
        plan = real(*a, **k)
        calls.append(plan)
        return plan
    monkeypatch.setattr(module, name, counted)
    return calls


CASES = [("conv2d", (2, 3, 9, 8), (4, 3, 3, 2), {"stride": 2, "padding": (1, 2), "dilation": (1, 2)}),
         ("conv2d", (1, 2, 7, 7), (2, 2, 4, 4), {"padding": "same"}),
         ("conv2d", (2, 4, 6, 5), (4, 2, 3, 3), {"padding": 1, "groups": 2, "padding_mode": "reflect"}),
         ("conv_transpose2d", (2, 3, 5, 4), (3, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
         ("conv_transpose2d", (1, 4, 4, 4), (4, 1, 2, 3), {"groups": 2, "dilation": 2})]


def _torch(op, x, w, b, kw):
    if op == "conv_transpose2d":
        return TF.conv_transpose2d(x, w, b, **kw)
    kw = dict(kw)
    mode = kw.pop("padding_mode", "zeros")
    if mode != "zeros":
        p = kw.pop("padding")
        x = TF.pad(x, (p, p, p, p), mode=mode)
    return TF.conv2d(x, w, b, **kw)


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("name", ["numpy", "opencl"])
@pytest.mark.parametrize("op,sx,sw,kw", CASES)
def test_backward_reads_the_forwards_plan(monkeypatch, name, op, sx, sw, kw):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    plan_fn = "conv2d_plan" if op == "conv2d" else "conv_transpose2d_plan"
    made = _count(monkeypatch, contract, plan_fn)
    remade = _count(monkeypatch, rules_conv, plan_fn)
    rng = np.random.default_rng(3)
    xs, ws = rng.standard_normal(sx), rng.standard_normal(sw)
    bs = rng.standard_normal(sw[1] * kw.get("groups", 1) if op == "conv_transpose2d" else sw[0])
    x, w, b = (ag.Var(be, a.astype(np.float32), requires_grad=True) for a in (xs, ws, bs))
    y = ag.apply(op, x, w, b, **kw)
    assert len(made) == 1
    gys = rng.standard_normal(tuple(be._shape(y.data)))
    gx, gw, gb = ag.grad(y, [x, w, b], gys.astype(np.float32))
    assert len(made) == 1 and remade == [], "the backward made the plan again"
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xs, ws, bs))
    ty = _torch(op, tx, tw, tb, kw)
    ref = torch.autograd.grad(ty, [tx, tw, tb], torch.tensor(gys))
    assert np.abs(be.to_numpy(y.data) - ty.detach().numpy()).max() <= 1e-5 * max(1.0, np.abs(ty.detach().numpy()).max())
    for got, want in zip((gx, gw, gb), ref):
        got, want = be.to_numpy(got).astype(np.float64), want.numpy()
        assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
