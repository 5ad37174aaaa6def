"""The fused Adam / AdamW step (a backend's ``_adam_step``: kernels/elementwise.cl's adam_step on
OpenCL, NumPy ufuncs into new buffers) against the unfused path of backend/learn/optim.py, which runs the
same float32 operations one op at a time: parameters and state buffers must come out bit for bit
equal after several steps, in every option combination (the lerp form of beta1 <= 0.5 included);
and the step never writes into the arrays it was given."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from anydevice.backend.learn import autograd as ag, optim

SHAPES = [(33, 17), (5,), (8, 3, 3, 3), (1,)]
CASES = [dict(lr=lr, betas=b, eps=e, weight_decay=wd, amsgrad=a, maximize=mx)
         for lr, b, e, wd, a, mx in itertools.product((0.01,), ((0.9, 0.999), (0.3, 0.5)), (1e-8, 1e-3),
                                                       (0.0, 0.1), (False, True), (False, True))]


def _run(be, cls, kw, fused: bool, steps: int = 5):
    rng = np.random.default_rng(3)
    ps = [ag.Var(be, rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in SHAPES]
    opt = getattr(optim, cls)(ps, **kw)
    held = []
    for _ in range(steps):
        for p in ps:
            p.grad = be.to_device((rng.standard_normal(p.shape) * rng.uniform(0.01, 3.0)).astype(np.float32))
        before = [(be.to_numpy(p.data).copy(), be.to_numpy(p.grad).copy(), p.data, p.grad) for p in ps]
        if fused:
            opt.step()
        else:
            saved = type(be).__dict__.get("_adam_step")
            type(be)._adam_step = None
            try:
                opt.step()
            finally:
                if saved is None:
                    del type(be)._adam_step
                else:
                    type(be)._adam_step = saved
        held.append(before)
    for before in held:  # the arrays handed to a step still hold their numbers
        for pv, gv, pd, gd in before:
            np.testing.assert_array_equal(be.to_numpy(pd), pv)
            np.testing.assert_array_equal(be.to_numpy(gd), gv)
    state = [{k: (v if isinstance(v, float) else be.to_numpy(v).copy()) for k, v in opt.state[id(p)].items()}
             for p in ps]
    return [be.to_numpy(p.data).copy() for p in ps], state


@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_fused_adam_matches_unfused(backend_target, cls, kw):
    be = backend_target
    if "adam_step" not in be.caps.fused:
        pytest.skip(f"{be.name} has no fused Adam step")
    fp, fs = _run(be, cls, kw, True)
    up, us = _run(be, cls, kw, False)
    for a, b in zip(fp, up):
        np.testing.assert_array_equal(a, b)
    for sa, sb in zip(fs, us):
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    assert any(np.any(a != 0) for a in fp)
