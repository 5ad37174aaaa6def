"""batch_norm in training mode and cross_entropy of class indices through their fused capabilities ("batch_norm":
ops/layers.py _batch_norm_fused, the devices' _batch_norm_train / _batch_norm_grad, learn/autograd/rules_layers.py
_batch_norm; "cross_entropy": ops/layers.py _cross_entropy_fused, _cross_entropy_rows / _cross_entropy_grad,
learn/autograd/rules_math.py _cross_entropy) on every backend here, through the public ops and the autograd tape,
against torch in float64 on the same float32 inputs: the outputs (batch norm's updated running statistics, torch's
in-place update with the unbiased variance, included) and the gradients, element by element (rtol 1e-5, atol a
small fraction of the reference's magnitude) and normwise; on the devices with the capability (numpy, opencl and
its GPU kernel family) the fused methods must be the ones that ran (a spy on the class)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend.learn import autograd as ag
from grad_check import check_grad
from movement_helpers import host
from precision_helpers import relerr, tol_for

RTOL = 1e-5
#: atol as a fraction of the reference's largest finite magnitude
ATOL = 1e-6


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The float64 references on one thread: torch's thread pool costs ~50 ms a call on these small shapes
    here (restored after each test)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).double()


def close(be, got, ref, what, rtol=RTOL, atol=ATOL, scale=None, normwise=True):
    """Element by element (NaN / Inf positions exact; atol a fraction of ``scale``, by default the
    reference's largest finite magnitude) and normwise (the precision suite's bar)."""
    got = np.asarray(host(be, got), np.float64)
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != torch's {ref.shape}"
    fin = np.isfinite(ref)
    if scale is None:
        scale = float(np.abs(ref[fin]).max()) if fin.any() else 0.0
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol * max(scale, 1e-30), equal_nan=True,
                               err_msg=f"{what} on {be.name}")
    err = relerr(got, ref) if normwise else 0.0
    assert err <= tol_for(be) * 2, f"{what} on {be.name}: normwise relative error {err:.3g}"


class Spy:
    """Counts the calls of one of the backend's methods (and keeps each call's arguments and result)."""

    def __init__(self, monkeypatch, be, name):
        self.calls = []
        cls = type(be)
        real = getattr(cls, name)

        def spy(obj, *args, **kwargs):
            r = real(obj, *args, **kwargs)
            if obj is be:
                self.calls.append((args, kwargs, r))
            return r
        monkeypatch.setattr(cls, name, spy)  # on the class: undone exactly

    def ran(self, times=None):
        assert self.calls, "the fused method never ran"
        assert all(r is not None for _, _, r in self.calls), "the fused method declined (returned None)"
        if times is not None:
            assert len(self.calls) == times, len(self.calls)


def fused(be, cap) -> bool:
    """Whether ``be`` has the fused capability ``cap``: the pack's numpy and opencl devices must."""
    has = cap in be.caps.fused
    if be.name in ("numpy", "opencl"):
        assert has, f"{be.name} lost the fused {cap!r}"
    return has


def spies(monkeypatch, be, cap, forward, backward):
    """(forward spy, backward spy), or (None, None) on a backend without ``cap`` (the composite runs)."""
    if not fused(be, cap):
        return None, None
    return Spy(monkeypatch, be, forward), Spy(monkeypatch, be, backward)


def bn_spies(monkeypatch, be):
    return spies(monkeypatch, be, "batch_norm", "_batch_norm_train", "_batch_norm_grad")


# ==== batch_norm, training mode ================================================================


def bn_make(shape, seed=0, mean=0.0, scale=1.0):
    rng = np.random.default_rng(seed)
    C = shape[1]
    x = (mean + scale * rng.standard_normal(shape)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, C).astype(np.float32) * np.where(rng.random(C) < 0.3, -1, 1).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    rm = rng.standard_normal(C).astype(np.float32)
    rv = rng.uniform(0.5, 2.0, C).astype(np.float32)
    return x, w, b, rm, rv


def torch_bn(x, w, b, rm, rv, momentum, eps):
    """torch's y and its in-place running statistics update, in float64."""
    RM = None if rm is None else t64(rm)
    RV = None if rv is None else t64(rv)
    y = F.batch_norm(t64(x), RM, RV, None if w is None else t64(w), None if b is None else t64(b),
                     training=True, momentum=momentum, eps=eps)
    return y, RM, RV


# ---- forward --------------------------------------------------------------------------------
SHAPES = [(2, 3), (64, 10), (5, 1), (4, 3, 5, 5), (3, 1, 6, 6), (1, 2, 3, 1), (2, 3, 2, 2, 3), (3, 2, 257),
          (8, 3, 100, 100), (1, 1, 70001)]
#: (affine, momentum, eps) each forward shape runs
FORWARD_CASES = [("both", 0.1, 1e-5), ("both", 0.5, 1e-3), ("weight", 0.5, 1e-5), ("bias", 0.1, 1e-3),
                 (None, 0.1, 1e-5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bn_forward_shapes(backend_target, monkeypatch, shape):
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make(shape, seed=len(shape) + shape[-1])
    for affine, momentum, eps in FORWARD_CASES:
        wi = w if affine in ("both", "weight") else None
        bi = b if affine in ("both", "bias") else None
        y, RM, RV = torch_bn(x, wi, bi, rm, rv, momentum, eps)
        y2, nrm, nrv = be.batch_norm(x, rm, rv, wi, bi, training=True, momentum=momentum, eps=eps,
                                     return_stats=True)
        what = f"batch_norm {shape} affine={affine} momentum={momentum} eps={eps}"
        close(be, y2, y, what + " y")
        close(be, nrm, RM, what + " running_mean")
        close(be, nrv, RV, what + " running_var")
        # without running statistics: only y (None for the statistics)
        y3, s1, s2 = be.batch_norm(x, None, None, wi, bi, training=True, momentum=momentum, eps=eps,
                                   return_stats=True)
        assert s1 is None and s2 is None
        close(be, y3, y, what + " y without running stats")
        # return_stats False: y alone (the fused path with running stats: test_bn_fused_without_return_stats)
        close(be, be.batch_norm(x, None, None, wi, bi, training=True, momentum=momentum, eps=eps), y,
              what + " y (return_stats=False, no running stats)")
    close(be, be.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5),
          torch_bn(x, w, b, rm, rv, 0.1, 1e-5)[0], f"batch_norm {shape} y (return_stats=False)")
    if tr is not None:
        # three fused calls a case and the last call above (without return_stats: no statistics go in);
        # the running statistics went in only with return_stats and running stats given
        tr.ran(3 * len(FORWARD_CASES) + 1)
        assert [(a[3] is not None, a[4] is not None) for a, _, _ in tr.calls] == \
            [(True, True), (False, False), (False, False)] * len(FORWARD_CASES) + [(False, False)]


def test_bn_fused_without_return_stats(backend_target, monkeypatch):
    """batch_norm(x, rm, rv, training=True) (return_stats False) takes the fused kernel too."""
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    if tr is None:
        pytest.skip("no fused 'batch_norm' on this backend")
    x, w, b, rm, rv = bn_make((4, 3, 5, 5), seed=1)
    y, _, _ = torch_bn(x, w, b, rm, rv, 0.1, 1e-5)
    close(be, be.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5), y, "y")
    tr.ran(1)


@pytest.mark.parametrize("eps", [1e-7, 1e-5, 1e-1, 10.0])  # (torch refuses eps 0 in training)
def test_bn_forward_eps(backend_target, monkeypatch, eps):
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make((6, 4, 3, 5), seed=3, scale=0.05)  # a variance near eps for the small ones
    y, RM, RV = torch_bn(x, w, b, rm, rv, 0.1, eps)
    y2, nrm, nrv = be.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=eps, return_stats=True)
    close(be, y2, y, f"y eps={eps}")
    close(be, nrm, RM, f"running_mean eps={eps}")
    close(be, nrv, RV, f"running_var eps={eps}")
    if tr is not None:
        tr.ran(1)
        assert tr.calls[0][0][6] == eps  # eps passed through


@pytest.mark.parametrize("shape,mean", [((16, 3, 8, 8), 1000.0), ((4096, 4), -3e4), ((8, 3, 100, 100), 1000.0)],
                         ids=["16x3x8x8", "4096x4", "8x3x100x100"])
def test_bn_forward_large_mean(backend_target, monkeypatch, shape, mean):
    """x = mean + randn: the statistics must not lose the small spread to the large mean."""
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make(shape, seed=7, mean=mean)
    for momentum in (0.1, 0.5):
        y, RM, RV = torch_bn(x, w, b, rm, rv, momentum, 1e-5)
        y2, nrm, nrv = be.batch_norm(x, rm, rv, w, b, training=True, momentum=momentum, eps=1e-5,
                                     return_stats=True)
        close(be, y2, y, f"y {shape} mean={mean}")
        close(be, nrm, RM, f"running_mean {shape} mean={mean}")
        close(be, nrv, RV, f"running_var {shape} mean={mean}")
    if tr is not None:
        tr.ran(2)


def test_bn_forward_constant_channel(backend_target):
    """A channel of one value: variance 0, y = bias as torch's (x - mean is 0), running var decays."""
    be = backend_target
    x, w, b, rm, rv = bn_make((4, 3, 5), seed=2)
    x[:, 1] = 3.7
    y, RM, RV = torch_bn(x, w, b, rm, rv, 0.1, 1e-5)
    y2, nrm, nrv = be.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5, return_stats=True)
    close(be, y2, y, "y")
    close(be, nrm, RM, "running_mean")
    close(be, nrv, RV, "running_var")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 4, 5)], ids=lambda s: "x".join(map(str, s)))
def test_bn_forward_non_finite(backend_target, monkeypatch, shape, bad):
    """A NaN / Inf in one channel: that channel's y and running var NaN as torch's (the running mean: below),
    the other channels exact."""
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make(shape, seed=4)
    x.reshape(shape[0], shape[1], -1)[1, 1, -1] = bad
    y, RM, RV = torch_bn(x, w, b, rm, rv, 0.1, 1e-5)
    assert torch.isnan(y[:, 1]).all()
    y2, nrm, nrv = be.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5, return_stats=True)
    close(be, y2, y, f"y with {bad}")
    close(be, nrv, RV, f"running_var with {bad}")
    if np.isnan(bad):
        close(be, nrm, RM, f"running_mean with {bad}")
    else:
        # torch's running mean is +-Inf there; the op's mean is the corrected two-pass a + mean(x - a), NaN
        # for an infinite a on every backend (the composite's too): the other channels exact, that one not finite
        nrm = np.asarray(host(be, nrm), np.float64)
        assert not np.isfinite(nrm[1]), nrm
        keep = [0, 2]
        close(be, nrm[keep], RM[keep], f"running_mean with {bad} (the finite channels)")
    if tr is not None:
        tr.ran(1)


def test_bn_inputs_kinds_and_not_written(backend_target, monkeypatch):
    """A torch tensor, a NumPy array and a device array in: same values; the inputs (running stats
    included) never written."""
    be = backend_target
    tr, _ = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make((3, 4, 5, 2), seed=9)
    y, RM, RV = torch_bn(x, w, b, rm, rv, 0.3, 1e-4)
    before = [a.copy() for a in (x, w, b, rm, rv)]
    for xi in (x, torch.from_numpy(x.copy()), be.to_device(x)):
        y2, nrm, nrv = be.batch_norm(xi, rm, rv, w, b, training=True, momentum=0.3, eps=1e-4, return_stats=True)
        if isinstance(xi, torch.Tensor):
            assert isinstance(y2, torch.Tensor) and isinstance(nrm, torch.Tensor)
        close(be, y2, y, f"y from {type(xi).__name__}")
        close(be, nrm, RM, "running_mean")
        close(be, nrv, RV, "running_var")
    for a, a0 in zip((x, w, b, rm, rv), before):
        np.testing.assert_array_equal(a, a0)
    if tr is not None:
        tr.ran(3)


# ---- backward -------------------------------------------------------------------------------
def run_grad(be, x, w, b, rm, rv, gy, momentum, eps, wrt, return_stats=False):
    """y and the gradients of ``wrt`` (names of input / weight / bias) through the autograd tape."""
    vals = {"input": x, "weight": w, "bias": b}
    vars_ = {k: (None if v is None else ag.Var(be, v, requires_grad=k in wrt)) for k, v in vals.items()}
    out = ag.apply("batch_norm", be=be, input=vars_["input"], running_mean=rm, running_var=rv,
                   weight=vars_["weight"], bias=vars_["bias"], training=True, momentum=momentum, eps=eps,
                   return_stats=return_stats)
    yv = out[0] if return_stats else out
    leaves = [vars_[k] for k in wrt]
    grads = ag.backward([yv], [gy], inputs=leaves)
    return out, dict(zip(wrt, (None if g is None else np.asarray(be.to_numpy(g)) for g in grads)))


def torch_grad(x, w, b, rm, rv, gy, momentum, eps, wrt):
    tt = {k: (None if v is None else torch.tensor(v.astype(np.float64), requires_grad=k in wrt))
          for k, v in {"input": x, "weight": w, "bias": b}.items()}
    y = F.batch_norm(tt["input"], None if rm is None else t64(rm), None if rv is None else t64(rv),
                     tt["weight"], tt["bias"], training=True, momentum=momentum, eps=eps)
    gs = torch.autograd.grad(y, [tt[k] for k in wrt], t64(gy))
    return y, dict(zip(wrt, gs))


def gx_scale(x, w, gy, eps):
    """The natural magnitude of dL/dx, max |w| / sqrt(var + eps) * max |gy| (float64): dL/dx itself may be all
    cancellation (two values a channel: xhat is +-1 and dL/dx ~ 0), so its atol is a fraction of this."""
    x64 = np.asarray(x, np.float64).reshape(x.shape[0], x.shape[1], -1)
    rs = 1.0 / np.sqrt(x64.var(axis=(0, 2)) + eps)
    return float(np.max(np.abs(1.0 if w is None else np.asarray(w, np.float64)) * rs) * np.abs(gy).max())


def close_grads(be, g, tg, x, w, gy, eps, what):
    for k, ref in tg.items():
        if k == "input":
            close(be, g[k], ref, f"grad {k} {what}", scale=gx_scale(x, w, gy, eps), normwise=False)
        else:
            close(be, g[k], ref, f"grad {k} {what}")


GRAD_SHAPES = [(2, 3), (64, 10), (5, 1), (4, 3, 5, 5), (2, 4, 7), (3, 1, 6, 6), (2, 3, 2, 2, 3), (3, 2, 257),
               (8, 3, 100, 100)]
#: (affine, running stats) each backward shape runs
GRAD_CASES = [("both", True), ("both", False), ("weight", True), ("bias", False), (None, True)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bn_backward(backend_target, monkeypatch, shape):
    be = backend_target
    _, gr = bn_spies(monkeypatch, be)
    x, w0, b0, rm0, rv0 = bn_make(shape, seed=11 + len(shape))
    gy = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for affine, stats in GRAD_CASES:
        w = w0 if affine in ("both", "weight") else None
        b = b0 if affine in ("both", "bias") else None
        rm, rv = (rm0, rv0) if stats else (None, None)
        wrt = ["input"] + [k for k, v in (("weight", w), ("bias", b)) if v is not None]
        out, g = run_grad(be, x, w, b, rm, rv, gy, 0.1, 1e-5, wrt)
        y, tg = torch_grad(x, w, b, rm, rv, gy, 0.1, 1e-5, wrt)
        what = f"{shape} affine={affine} stats={stats}"
        close(be, out.numpy(), y, f"y {what}")
        close_grads(be, g, tg, x, w, gy, 1e-5, what)
    if gr is not None:
        gr.ran(len(GRAD_CASES))
        for args, _, (gx, gw, gb) in gr.calls:
            assert args[4] is True and gx is not None


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (64, 10), (8, 3, 100, 100)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("wrt", [("weight", "bias"), ("weight",), ("bias",)])
def test_bn_backward_parameters_only(backend_target, monkeypatch, shape, wrt):
    """The input needs no gradient: the fused grad is asked for none (need_input False), w / b still right."""
    be = backend_target
    _, gr = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make(shape, seed=21)
    gy = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    _, g = run_grad(be, x, w, b, rm, rv, gy, 0.5, 1e-3, list(wrt))
    _, tg = torch_grad(x, w, b, rm, rv, gy, 0.5, 1e-3, list(wrt))
    close_grads(be, g, tg, x, w, gy, 1e-3, f"{shape} (no input gradient)")
    if gr is not None:
        gr.ran(1)
        args, _, (gx, gw, gb) = gr.calls[0]
        assert args[4] is False and gx is None


@pytest.mark.parametrize("shape", [(16, 3, 8, 8), (8, 3, 100, 100), (4096, 4)], ids=lambda s: "x".join(map(str, s)))
def test_bn_backward_large_mean(backend_target, monkeypatch, shape):
    be = backend_target
    _, gr = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make(shape, seed=31, mean=1000.0)
    gy = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    wrt = ["input", "weight", "bias"]
    out, g = run_grad(be, x, w, b, rm, rv, gy, 0.1, 1e-5, wrt)
    y, tg = torch_grad(x, w, b, rm, rv, gy, 0.1, 1e-5, wrt)
    close(be, out.numpy(), y, f"y {shape}")
    close_grads(be, g, tg, x, w, gy, 1e-5, f"{shape} mean 1000")
    if gr is not None:
        gr.ran(1)


@pytest.mark.parametrize("eps", [1e-7, 1e-3, 1.0])
def test_bn_backward_eps_and_return_stats(backend_target, monkeypatch, eps):
    """return_stats=True through the tape: the statistics are outputs with no gradient, y's gradient as torch's."""
    be = backend_target
    tr, gr = bn_spies(monkeypatch, be)
    x, w, b, rm, rv = bn_make((5, 4, 3, 3), seed=41, scale=0.1)
    gy = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    wrt = ["input", "weight", "bias"]
    out, g = run_grad(be, x, w, b, rm, rv, gy, 0.5, eps, wrt, return_stats=True)
    y, RM, RV = torch_bn(x, w, b, rm, rv, 0.5, eps)
    close(be, out[0].numpy(), y, "y")
    close(be, out[1].numpy(), RM, "running_mean")
    close(be, out[2].numpy(), RV, "running_var")
    _, tg = torch_grad(x, w, b, rm, rv, gy, 0.5, eps, wrt)
    close_grads(be, g, tg, x, w, gy, eps, f"eps={eps}")
    if tr is not None:
        tr.ran(1)
        gr.ran(1)


# ==== cross_entropy, class-index targets =========================================================
def ce_spies(monkeypatch, be):
    return spies(monkeypatch, be, "cross_entropy", "_cross_entropy_rows", "_cross_entropy_grad")


def ce_make(shape, seed=0, scale=3.0, ignore=None, every=4):
    """Logits of ``shape`` (classes along dim 1, dim 0 unbatched) and their int64 targets, every ``every``-th
    one ``ignore`` (none ignored for None)."""
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal(shape)).astype(np.float32)
    cd = 0 if len(shape) == 1 else 1
    t = rng.integers(0, shape[cd], shape[:cd] + shape[cd + 1:]).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[1::every] = ignore
    return x, t


def torch_ce(x, t, ignore_index, reduction, gy=None):
    """torch's loss in float64 and, with ``gy``, dL/dx for the upstream gradient ``gy``."""
    tx = torch.tensor(np.asarray(x, np.float64), requires_grad=gy is not None)
    loss = F.cross_entropy(tx, torch.from_numpy(np.asarray(t)), ignore_index=ignore_index, reduction=reduction)
    if gy is None:
        return loss, None
    gx, = torch.autograd.grad(loss, [tx], t64(gy))
    return loss, gx


def run_ce_grad(be, x, t, ignore_index, reduction, gy):
    X = ag.Var(be, x, requires_grad=True)
    loss = ag.apply("cross_entropy", be=be, input=X, target=t, ignore_index=ignore_index, reduction=reduction)
    gx, = ag.backward([loss], [gy], inputs=[X])
    return loss.numpy(), np.asarray(be.to_numpy(gx))


#: (shape, ignore_index, how many of the targets ignored: every n-th, None for none)
CE_SHAPES = [((64, 10), -100, None), ((64, 10), -100, 4), ((64, 10), 3, 5), ((10,), -100, None),
             ((7,), 2, None), ((4, 5, 6, 7), -100, 3), ((2, 3, 5), 0, 2), ((3, 4, 1), -100, None),
             ((8, 1000), -100, 3), ((2, 21, 32, 32), 255, 7), ((1, 1), -100, None), ((5, 1, 3), -100, 2),
             ((1, 2), 1, None)]
CE_IDS = ["x".join(map(str, s)) + f"-ig{i}" + ("" if n is None else f"-every{n}") for s, i, n in CE_SHAPES]
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("shape,ignore_index,every", CE_SHAPES, ids=CE_IDS)
def test_ce_forward(backend_target, monkeypatch, shape, ignore_index, every):
    be = backend_target
    rows, _ = ce_spies(monkeypatch, be)
    x, t = ce_make(shape, seed=len(shape) + shape[-1], ignore=ignore_index if every else None, every=every or 1)
    for reduction in REDUCTIONS:
        ref, _ = torch_ce(x, t, ignore_index, reduction)
        y = be.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction)
        close(be, y, ref, f"cross_entropy {shape} ignore_index={ignore_index} {reduction}")
    if rows is not None:
        rows.ran(len(REDUCTIONS))
        for args, _, _ in rows.calls:
            N = 1 if len(shape) == 1 else shape[0]
            assert tuple(args[0].shape) == (N, shape[0 if len(shape) == 1 else 1], int(np.prod(shape[2:])))
            assert args[2] == ignore_index


@pytest.mark.parametrize("shape,ignore_index,every", CE_SHAPES, ids=CE_IDS)
def test_ce_backward(backend_target, monkeypatch, shape, ignore_index, every):
    """The gradient of each reduction through the tape (a random upstream gradient: one value, or one a
    position for "none")."""
    be = backend_target
    _, grad = ce_spies(monkeypatch, be)
    x, t = ce_make(shape, seed=2 * len(shape) + shape[-1], ignore=ignore_index if every else None, every=every or 1)
    rng = np.random.default_rng(5)
    for reduction in REDUCTIONS:
        gy = np.asarray(rng.standard_normal(t.shape if reduction == "none" else ()), np.float32)
        ref, tg = torch_ce(x, t, ignore_index, reduction, gy)
        y, gx = run_ce_grad(be, x, t, ignore_index, reduction, gy)
        what = f"cross_entropy {shape} ignore_index={ignore_index} {reduction}"
        close(be, y, ref, what)
        close(be, gx, tg, what + " grad")
    if grad is not None:
        grad.ran(len(REDUCTIONS))
        kept = int(np.count_nonzero(t != ignore_index))
        for (args, _, _), reduction in zip(grad.calls, REDUCTIONS):
            assert args[4] == (reduction == "none")  # per_position
            assert args[5] == (kept if reduction == "mean" else 1.0)  # den


@pytest.mark.parametrize("shape", [(6, 4), (5,), (2, 3, 4)], ids=lambda s: "x".join(map(str, s)))
def test_ce_all_ignored(backend_target, monkeypatch, shape):
    """Every target ignored: mean is 0 / 0 = NaN as torch's, sum 0, none all 0; the gradients as torch's (0)."""
    be = backend_target
    rows, grad = ce_spies(monkeypatch, be)
    x, t = ce_make(shape, seed=3)
    t[...] = -100
    for reduction in REDUCTIONS:
        gy = np.asarray(np.random.default_rng(1).standard_normal(t.shape if reduction == "none" else ()),
                        np.float32)
        ref, tg = torch_ce(x, t, -100, reduction, gy)
        if reduction == "mean":
            assert torch.isnan(ref)
        y = be.cross_entropy(x, t, reduction=reduction)
        close(be, y, ref, f"all ignored {reduction}")
        y, gx = run_ce_grad(be, x, t, -100, reduction, gy)
        close(be, y, ref, f"all ignored {reduction} (tape)")
        close(be, gx, tg, f"all ignored {reduction} grad")
    if rows is not None:
        rows.ran()
        grad.ran(len(REDUCTIONS))


@pytest.mark.parametrize("scale,offset", [(1e4, 0.0), (3e4, 0.0), (1.0, 1e4), (1.0, -5e4), (100.0, 0.0)])
@pytest.mark.parametrize("shape", [(64, 10), (3, 7, 5, 4), (9,)], ids=lambda s: "x".join(map(str, s)))
def test_ce_large_logits(backend_target, monkeypatch, shape, scale, offset):
    """Logits of 1e4 scale (one class takes all: exp underflows for the others) or a large common offset: the
    log-softmax stays finite and exact (the max taken out first), forward and backward."""
    be = backend_target
    rows, grad = ce_spies(monkeypatch, be)
    x, t = ce_make(shape, seed=17, scale=scale, ignore=-100 if len(shape) > 1 else None)
    x = (x + np.float32(offset)).astype(np.float32)
    rng = np.random.default_rng(6)
    for reduction in REDUCTIONS:
        gy = np.asarray(rng.standard_normal(t.shape if reduction == "none" else ()), np.float32)
        ref, tg = torch_ce(x, t, -100, reduction, gy)
        assert np.isfinite(ref.detach().numpy()).all()
        what = f"cross_entropy {shape} scale={scale} offset={offset} {reduction}"
        close(be, be.cross_entropy(x, t, reduction=reduction), ref, what)
        y, gx = run_ce_grad(be, x, t, -100, reduction, gy)
        close(be, y, ref, what + " (tape)")
        close(be, gx, tg, what + " grad")
    if rows is not None:
        rows.ran()
        grad.ran(len(REDUCTIONS))


def test_ce_non_finite(backend_target, monkeypatch):
    """A NaN logit: that position's loss and gradient NaN; -inf at another class: finite; -inf at the target:
    +inf loss; +inf logit: NaN -- all as torch's (the others untouched)."""
    be = backend_target
    rows, grad = ce_spies(monkeypatch, be)
    x, t = ce_make((6, 5), seed=8)
    t[:] = [0, 1, 2, 3, 4, 0]
    x[0, 3] = np.nan
    x[1, 0] = -np.inf
    x[2, 2] = -np.inf
    x[3, 1] = np.inf
    gy = np.random.default_rng(2).standard_normal(6).astype(np.float32)
    ref, tg = torch_ce(x, t, -100, "none", gy)
    close(be, be.cross_entropy(x, t, reduction="none"), ref, "non-finite logits")
    y, gx = run_ce_grad(be, x, t, -100, "none", gy)
    close(be, y, ref, "non-finite logits (tape)")
    # the gradient of the rows without +-inf / NaN at the target's class exactly as torch's; torch's own
    # gradient there is NaN or 0 by its formula (softmax - onehot), ours must be too
    close(be, gx[[1, 4, 5]], tg[[1, 4, 5]], "grad of the finite rows")
    np.testing.assert_array_equal(np.isnan(gx), np.isnan(tg.numpy()))
    for reduction in ("mean", "sum"):
        ref, _ = torch_ce(x, t, -100, reduction)
        close(be, be.cross_entropy(x, t, reduction=reduction), ref, f"non-finite logits {reduction}")
    if rows is not None:
        rows.ran()
        grad.ran(1)


def test_ce_input_kinds(backend_target, monkeypatch):
    """A torch tensor, a NumPy array or a device array in, targets as NumPy, torch or a list: same values;
    the inputs never written."""
    be = backend_target
    rows, _ = ce_spies(monkeypatch, be)
    x, t = ce_make((12, 6, 3), seed=12, ignore=-100)
    x0, t0 = x.copy(), t.copy()
    ref, _ = torch_ce(x, t, -100, "mean")
    for xi in (x, torch.from_numpy(x.copy()), be.to_device(x)):
        for ti in (t, torch.from_numpy(t.copy()), t.tolist()):
            y = be.cross_entropy(xi, ti)
            if isinstance(xi, torch.Tensor):
                assert isinstance(y, torch.Tensor)
            close(be, y, ref, f"cross_entropy of {type(xi).__name__} / {type(ti).__name__}")
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(t, t0)
    if rows is not None:
        rows.ran(9)


# ==== the project's gradient check (normwise, tests/support/grad_check.py) on the fused paths ===========
def _ce_case(shape, ignore_index, reduction, seed):
    x, t = ce_make(shape, seed=seed, ignore=ignore_index)
    return "cross_entropy", {"input": x, "target": t}, F.cross_entropy, \
        {"reduction": reduction, "ignore_index": ignore_index}


def _bn_case(shape, stats, seed):
    x, w, b, rm, rv = bn_make(shape, seed=seed, mean=5.0)
    t = {"input": x, "weight": w, "bias": b}
    params = {"training": True, "momentum": 0.5, "eps": 1e-4, "running_mean": None, "running_var": None}
    if stats:
        t.update(running_mean=rm, running_var=rv)
        del params["running_mean"], params["running_var"]
    return "batch_norm", t, F.batch_norm, params


CHECK_GRAD_CASES = {
    "bn-2d": lambda: _bn_case((32, 6), True, 1), "bn-4d": lambda: _bn_case((4, 3, 6, 5), False, 2),
    "bn-5d": lambda: _bn_case((2, 2, 3, 4, 5), True, 3),
    "ce-mean": lambda: _ce_case((64, 10), -100, "mean", 4), "ce-sum": lambda: _ce_case((3, 5, 4, 4), 1, "sum", 5),
    "ce-none": lambda: _ce_case((2, 7, 9), -100, "none", 6), "ce-unbatched": lambda: _ce_case((11,), -100, "mean", 7),
}


@pytest.mark.parametrize("case", list(CHECK_GRAD_CASES))
def test_check_grad(backend_target, monkeypatch, case):
    be = backend_target
    op, tensors, torch_fn, params = CHECK_GRAD_CASES[case]()
    names = ("_batch_norm_train", "_batch_norm_grad") if op == "batch_norm" else \
        ("_cross_entropy_rows", "_cross_entropy_grad")
    fwd, bwd = spies(monkeypatch, be, op, *names)
    wrt = [k for k in ("input", "weight", "bias") if k in tensors]
    check_grad(be, op, tensors, torch_fn, params, wrt=wrt, rtol=1e-5)
    if fwd is not None:
        if "running_mean" not in tensors:  # (with them and no return_stats: test_bn_fused_without_return_stats)
            fwd.ran(1)
        bwd.ran(1)
