"""Optimizers (backend/learn/optim.py) against torch.optim, and the default initialisation (backend/learn/init.py)
against torch's formulas.

Each optimizer runs 20 steps on random parameters and a random gradient sequence, next to
torch.optim's single-tensor implementation (float32, foreach=False); parameters and state buffers
must agree within 1e-6 relative to their largest value (measured: about 2e-7 for SGD, whose update
torch fuses into one multiply-add, and 5e-8 for Adam/AdamW, on every backend)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from anydevice.backend import AnyDeviceError
from anydevice.backend.learn import autograd as ag, init, optim

SHAPES = [(7, 5), (3,), (4, 2, 3, 3)]
STEPS = 20
RTOL = 1e-6

SGD_CASES = [dict(lr=0.1, momentum=m, dampening=d, weight_decay=wd, nesterov=n, maximize=mx)
             for m, d, wd, n, mx in itertools.product((0.0, 0.9), (0.0, 0.3), (0.0, 0.1), (False, True), (False, True))
             if not (n and (m == 0 or d != 0))]
ADAM_CASES = [dict(lr=0.01, betas=b, eps=e, weight_decay=wd, amsgrad=a, maximize=mx)
              for b, e, wd, a, mx in itertools.product(((0.9, 0.999), (0.3, 0.5)), (1e-8, 1e-3), (0.0, 0.1),
                                                      (False, True), (False, True))
              if not (e == 1e-3 and b == (0.3, 0.5))]


def _sequence(seed: int, steps: int = STEPS):
    rng = np.random.default_rng(seed)
    p0 = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * rng.uniform(0.01, 3.0)).astype(np.float32) for s in SHAPES]
             for _ in range(steps)]
    return p0, grads


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _pair(be, name, kw, seed=0):
    p0, grads = _sequence(seed)
    ours_p = [ag.Var(be, p.copy(), requires_grad=True) for p in p0]
    ref_p = [torch.tensor(p.copy(), requires_grad=True) for p in p0]
    ours = getattr(optim, name)(ours_p, **kw)
    ref = getattr(torch.optim, name)(ref_p, foreach=False, **kw)
    return ours_p, ref_p, ours, ref, grads


def _steps(be, ours_p, ref_p, ours, ref, grads):
    """The same gradient sequence through both (either side may be left out: None)."""
    for g in grads:
        if ours is not None:
            for v, gg in zip(ours_p, g):
                v.grad = be.to_device(gg)
            ours.step()
        if ref is not None:
            for t, gg in zip(ref_p, g):
                t.grad = torch.tensor(gg)
            ref.step()


def _compare(be, ours_p, ref_p, ours, ref, what):
    worst = 0.0
    for i, (v, t) in enumerate(zip(ours_p, ref_p)):
        worst = max(worst, _rel(v.numpy(), t.detach().numpy()))
        mine, theirs = ours.state[id(v)], ref.state[t]
        for key, buf in theirs.items():
            if key == "step":
                assert mine["step"] == float(buf), what
            elif buf is not None:
                assert _rel(be.to_numpy(mine[key]), buf.numpy()) <= RTOL, (what, i, key)
    assert worst <= RTOL, (what, worst)
    return worst


@pytest.mark.parametrize("name,cases", [("SGD", SGD_CASES), ("Adam", ADAM_CASES), ("AdamW", ADAM_CASES)],
                         ids=["SGD", "Adam", "AdamW"])
def test_matches_torch_optim(backend_target, name, cases):
    be = backend_target
    for k, kw in enumerate(cases):
        if name == "AdamW" and kw["weight_decay"] == 0.0:
            kw = dict(kw, weight_decay=1e-2)  # AdamW's default: the decoupled decay is the point
        pair = _pair(be, name, kw, seed=k)
        _steps(be, *pair[:4], pair[4])
        _compare(be, *pair[:4], f"{name} {kw}")


def test_defaults_and_make(backend_target):
    be = backend_target
    p0, grads = _sequence(5, 8)
    for name, ref_cls, ref_kw in [("adam", torch.optim.Adam, {}), ("adamw", torch.optim.AdamW, {}),
                                  ("sgd", torch.optim.SGD, {}), ("sgd_momentum", torch.optim.SGD, {"momentum": 0.9}),
                                  ("sgd_nesterov", torch.optim.SGD, {"momentum": 0.9, "nesterov": True})]:
        vs = [ag.Var(be, p.copy(), requires_grad=True) for p in p0]
        ts = [torch.tensor(p.copy(), requires_grad=True) for p in p0]
        wd = 1e-2 if name == "adamw" else 0.0
        ours = optim.make(name, vs, lr=0.05, weight_decay=wd)
        ref = ref_cls(ts, lr=0.05, weight_decay=wd, foreach=False, **ref_kw)
        assert type(ours).__name__ == ref_cls.__name__
        _steps(be, vs, ts, ours, ref, grads)
        _compare(be, vs, ts, ours, ref, name)
    # torch's defaults
    v = ag.Var(be, np.zeros(3, np.float32), requires_grad=True)
    assert optim.Adam([v]).defaults == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0,
                                        "amsgrad": False, "maximize": False}
    assert optim.AdamW([v]).defaults["weight_decay"] == 1e-2
    assert optim.SGD([v]).defaults == {"lr": 1e-3, "momentum": 0, "dampening": 0, "weight_decay": 0,
                                       "nesterov": False, "maximize": False}
    with pytest.raises(AnyDeviceError, match="'name' = 'rmsprop'.*adam, adamw, sgd"):
        optim.make("rmsprop", [v], lr=0.1)


def test_state_dict_round_trip(backend_target):
    be = backend_target
    for name, kw in [("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
                     ("Adam", dict(lr=0.01, amsgrad=True)), ("AdamW", dict(lr=0.01))]:
        p0, grads = _sequence(3)
        a = [ag.Var(be, p.copy(), requires_grad=True) for p in p0]
        opt_a = getattr(optim, name)(a, **kw)
        _steps(be, a, None, opt_a, None, grads[:10])
        sd = opt_a.state_dict()
        for s in sd["state"].values():  # host NumPy copies, step a float
            assert all(isinstance(v, (float, np.ndarray)) or v is None for v in s.values())
        b = [ag.Var(be, v.numpy().copy(), requires_grad=True) for v in a]
        opt_b = getattr(optim, name)(b, lr=123.0)  # hyper-parameters come from the state dict
        opt_b.load_state_dict(sd)
        assert opt_b.param_groups[0]["lr"] == kw["lr"]
        for s in sd["state"].values():  # the copies are the caller's: writing them changes nothing
            for v in s.values():
                if isinstance(v, np.ndarray):
                    v[...] = np.nan
        for opt in (opt_a, opt_b):
            opt.param_groups[0]["lr"] = kw["lr"] / 2  # hyper-parameters may change between steps
        _steps(be, a, None, opt_a, None, grads[10:])
        _steps(be, b, None, opt_b, None, grads[10:])
        for va, vb in zip(a, b):
            np.testing.assert_array_equal(va.numpy(), vb.numpy())


def test_load_torch_state_dict(backend_target):
    """A torch optimizer's state_dict (tensors, a tensor step) loads and the run continues alike."""
    be = backend_target
    for name, kw in [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)), ("Adam", dict(lr=0.01, amsgrad=True))]:
        p0, grads = _sequence(4)
        ts = [torch.tensor(p.copy(), requires_grad=True) for p in p0]
        ref = getattr(torch.optim, name)(ts, foreach=False, **kw)
        _steps(be, None, ts, None, ref, grads[:10])
        vs = [ag.Var(be, t.detach().numpy().copy(), requires_grad=True) for t in ts]
        ours = getattr(optim, name)(vs, **kw)
        ours.load_state_dict(ref.state_dict())
        _steps(be, vs, ts, ours, ref, grads[10:])
        _compare(be, vs, ts, ours, ref, name)


def test_step_details(backend_target):
    be = backend_target
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    w = ag.Var(be, w0, requires_grad=True)
    u = ag.Var(be, w0[0], requires_grad=True)
    opt = optim.Adam([w, u], lr=0.1)
    ag.F.sum(ag.F.mul(w, w)).backward()
    old = w.data
    old_host = np.array(be.to_numpy(old), copy=True)
    opt.step()
    assert w.data is not old
    np.testing.assert_array_equal(be.to_numpy(old), old_host)  # the old array keeps its numbers
    assert id(u) not in opt.state or not opt.state[id(u)]  # no gradient: skipped, no state
    np.testing.assert_array_equal(u.numpy(), w0[0])
    # the first Adam step moves every element by lr (|m / sqrt(v)| = 1)
    np.testing.assert_allclose(np.abs(w.numpy() - w0), 0.1, rtol=1e-5)
    opt.zero_grad()
    assert w.grad is None
    w.grad = w.data
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(be.to_numpy(w.grad), np.zeros((4, 3), np.float32))
    w.grad = np.ones((4, 3), np.float32)  # a host gradient set by hand is uploaded
    opt.step()
    w.grad = np.ones((2, 3), np.float32)
    with pytest.raises(AnyDeviceError, match="'grad'.*shape"):
        opt.step()


@pytest.mark.parametrize("make,match", [
    (lambda v: optim.SGD([v], lr=-0.1), "SGD: argument 'lr' = -0.1: Invalid learning rate"),
    (lambda v: optim.Adam([v], lr=-1), "Adam: argument 'lr' = -1: Invalid learning rate"),
    (lambda v: optim.SGD([v], momentum=-0.5), "'momentum' = -0.5: Invalid momentum value"),
    (lambda v: optim.SGD([v], weight_decay=-1.0), "'weight_decay' = -1.0: Invalid weight_decay value"),
    (lambda v: optim.SGD([v], nesterov=True), "'nesterov' = True: Nesterov momentum requires a momentum"),
    (lambda v: optim.SGD([v], momentum=0.9, dampening=0.1, nesterov=True), "Nesterov momentum requires"),
    (lambda v: optim.Adam([v], eps=-1e-8), "'eps' = -1e-08: Invalid epsilon value"),
    (lambda v: optim.Adam([v], betas=(1.0, 0.9)), "Invalid beta parameter at index 0"),
    (lambda v: optim.AdamW([v], betas=(0.9, -0.1)), "AdamW: .*Invalid beta parameter at index 1"),
    (lambda v: optim.Adam([v], weight_decay=-0.1), "Invalid weight_decay value"),
    (lambda v: optim.Adam([v], lr="fast"), "'lr' = 'fast': must be a number"),
    (lambda v: optim.Adam([]), "empty parameter list"),
    (lambda v: optim.Adam(v), "not one Var"),
    (lambda v: optim.Adam([v, v]), "more than once"),
    (lambda v: optim.Adam([np.zeros(3)]), "must hold autograd Vars"),
    (lambda v: optim.Adam([ag.Var(v.be, np.zeros(3, np.float32))]), "without requires_grad"),
    (lambda v: optim.Adam([v * 2.0]), "non-leaf"),
])
def test_argument_errors(make, match):
    from anydevice.backend import get_backend
    v = ag.Var(get_backend("numpy"), np.zeros(3, np.float32), requires_grad=True)
    with pytest.raises(AnyDeviceError, match=match):
        make(v)


def test_param_groups():
    """Per-group hyper-parameters, as torch's param groups."""
    from anydevice.backend import get_backend
    be = get_backend("numpy")
    p0, grads = _sequence(7)
    vs = [ag.Var(be, p.copy(), requires_grad=True) for p in p0]
    ts = [torch.tensor(p.copy(), requires_grad=True) for p in p0]
    ours = optim.SGD([{"params": vs[:2]}, {"params": vs[2:], "lr": 0.5, "momentum": 0.5}], lr=0.1, momentum=0.9)
    ref = torch.optim.SGD([{"params": ts[:2]}, {"params": ts[2:], "lr": 0.5, "momentum": 0.5}], lr=0.1,
                          momentum=0.9, foreach=False)
    _steps(be, vs, ts, ours, ref, grads)
    _compare(be, vs, ts, ours, ref, "groups")
    sd = ours.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2]]
    assert sd["param_groups"][1]["lr"] == 0.5


# ---------------------------------------------------------------------------------------------
# initialisation
# ---------------------------------------------------------------------------------------------
def _torch_bound(weight_shape) -> tuple[float, float]:
    """(weight bound, bias bound) as torch's reset_parameters computes them."""
    w = torch.empty(weight_shape)
    fan_in, _ = torch.nn.init._calculate_fan_in_and_fan_out(w)
    gain = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
    return math.sqrt(3.0) * (gain / math.sqrt(fan_in)), 1 / math.sqrt(fan_in)


@pytest.mark.parametrize("kind,args,wshape", [
    ("conv", (64, 3, 3, 3), (64, 3, 3, 3)), ("conv", (32, 16, 5, 1), (32, 16, 5, 1)),
    ("linear", (200, 64), (200, 64)), ("linear", (10, 1), (10, 1))])
def test_init_matches_torch(kind, args, wshape):
    fn = init.conv2d_params if kind == "conv" else init.linear_params
    w, b = fn(*args, bias=True, seed=1)
    assert w.dtype == np.float32 and b.dtype == np.float32
    assert w.shape == wshape and b.shape == (wshape[0],)
    wb, bb = _torch_bound(wshape)
    fan_in = math.prod(wshape[1:])
    assert init.kaiming_uniform_bound(fan_in) == wb  # the same float64 number, torch's way
    assert init.bias_bound(fan_in) == bb
    assert np.abs(w).max() <= np.float32(wb) and np.abs(b).max() <= np.float32(bb)
    # uniform on [-bound, bound): mean 0, std bound / sqrt(3), the range filled
    n = w.size
    assert abs(w.mean()) <= 5 * wb / math.sqrt(3 * n)
    assert abs(w.std() / (wb / math.sqrt(3)) - 1) <= 5 * math.sqrt(0.8 / n)
    if n >= 1000:
        assert w.max() > 0.99 * wb and w.min() < -0.99 * wb
    # torch's own module, seeded: the same distribution (quantiles), not the same numbers
    torch.manual_seed(1)
    mod = torch.nn.Conv2d(wshape[1], wshape[0], wshape[2:]) if kind == "conv" else torch.nn.Linear(*wshape[::-1])
    tw = mod.weight.detach().numpy()
    assert np.abs(tw).max() <= np.float32(wb)
    if n >= 1000:
        q = [0.1, 0.25, 0.5, 0.75, 0.9]
        np.testing.assert_allclose(np.quantile(w, q), np.quantile(tw, q), atol=0.05 * wb)


def test_init_seeds_and_options():
    a = init.conv2d_params(8, 4, 3, 3, bias=True, seed=7)
    b = init.conv2d_params(8, 4, 3, 3, bias=True, seed=7)
    c = init.conv2d_params(8, 4, 3, 3, bias=True, seed=8)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[1], c[1])
    w, nb = init.linear_params(5, 6, bias=False, seed=7)
    assert nb is None and w.shape == (5, 6)
    np.testing.assert_array_equal(w, init.linear_params(5, 6, bias=True, seed=7)[0])  # weight drawn first
    # a zero-input linear layer: empty weight, zero bias (torch: no-op init, bound 0)
    w0, b0 = init.linear_params(3, 0, seed=0)
    assert w0.shape == (3, 0) and np.array_equal(b0, np.zeros(3, np.float32))
    with pytest.raises(AnyDeviceError, match="conv2d_params: argument 'kh' = 0"):
        init.conv2d_params(8, 4, 0, 3)
    with pytest.raises(AnyDeviceError, match="'seed' = 1.5: must be an integer"):
        init.linear_params(3, 4, seed=1.5)
    with pytest.raises(AnyDeviceError, match="'out_f' = -2"):
        init.linear_params(-2, 4)


# ---------------------------------------------------------------------------------------------
# together: the digits folder, the default initialisation, the tape and an optimizer, against
# torch.nn + torch.optim doing the same training steps
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,loss_name", [("adam", "mse_loss"), ("sgd_momentum", "mse_loss"),
                                            ("adamw", "cross_entropy")])
def test_training_steps_match_torch(backend_target, name, loss_name):
    """Ten full-batch steps of a 64-32-10 MLP on ~240 digits (read by the Load Labeled Images node)."""
    from anydevice.nodes.learn.dataset import AnyDeviceLoadLabeledImages
    be = backend_target
    images, labels, _, _ = AnyDeviceLoadLabeledImages().run(folder="digits/train", channels="grayscale")["result"]
    x = images[::6].reshape(-1, 64).numpy()
    y = labels[::6].numpy()
    target = np.eye(10, dtype=np.float32)[y] if loss_name == "mse_loss" else y
    w1, b1 = init.linear_params(32, 64, seed=1)
    w2, b2 = init.linear_params(10, 32, seed=2)
    params = [ag.Var(be, a, requires_grad=True) for a in (w1, b1, w2, b2)]
    tparams = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
    lr = 0.5 if name == "sgd_momentum" else 0.01
    opt = optim.make(name, params, lr=lr, weight_decay=0.01 if name == "adamw" else 0.0)
    ref = {"adam": lambda: torch.optim.Adam(tparams, lr=lr, foreach=False),
           "adamw": lambda: torch.optim.AdamW(tparams, lr=lr, weight_decay=0.01, foreach=False),
           "sgd_momentum": lambda: torch.optim.SGD(tparams, lr=lr, momentum=0.9, foreach=False)}[name]()
    X = ag.Var(be, x)
    T = ag.Var(be, target) if loss_name == "mse_loss" else target
    tx, tt = torch.tensor(x), torch.tensor(target)
    tloss_fn = getattr(torch.nn.functional, loss_name)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        h = ag.F.relu(ag.F.linear(X, params[0], params[1]))
        loss = getattr(ag.F, loss_name)(ag.F.linear(h, params[2], params[3]), T)
        loss.backward()
        opt.step()
        ref.zero_grad()
        th = torch.relu(torch.nn.functional.linear(tx, tparams[0], tparams[1]))
        tloss = tloss_fn(torch.nn.functional.linear(th, tparams[2], tparams[3]), tt)
        tloss.backward()
        ref.step()
        losses.append((loss.item(), tloss.item()))
    for v, t in zip(params, tparams):
        assert _rel(v.numpy(), t.detach().numpy()) <= 1e-5  # measured: 2e-7 to 5e-7
    np.testing.assert_allclose([a for a, _ in losses], [b for _, b in losses], rtol=1e-5)
    assert losses[-1][0] < losses[0][0]  # it learns
