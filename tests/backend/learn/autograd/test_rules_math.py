"""Gradients of the elementwise ops, reductions, activations, softmax and the losses (issue 13),
each checked against torch's autograd in float64 by ``check_grad`` on every backend: several
shapes (0-d, broadcasting pairs, a size-1 dim, empty where the op allows), keyword variants, every
reduction, the dispatchers (unary, activation, binary, reduce, loss), and torch's values at the
edges (relu / abs at 0, sqrt / log / pow at 0, ties of minimum / maximum / amax)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend import AnyDeviceError
from anydevice.backend.learn import autograd as ag
from anydevice.backend.ops.contract import gaussian_window
from grad_check import check_grad

_RNG = np.random.default_rng(13)
# torch's own warnings about the cases asked for on purpose (broadcast loss targets, dof <= 0)
pytestmark = [pytest.mark.filterwarnings("ignore:Using a target size:UserWarning"),
              pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")]


def randn(*shape):
    return _RNG.standard_normal(shape).astype(np.float32)


def rand(*shape, lo=0.0, hi=1.0):
    return _RNG.uniform(lo, hi, shape).astype(np.float32)


def ints(*shape, lo=-2, hi=3):
    """Small whole numbers: ties are frequent (minimum / maximum / amax)."""
    return _RNG.integers(lo, hi, shape).astype(np.float32)


def pos(*shape):
    return (np.abs(_RNG.standard_normal(shape)) + 0.2).astype(np.float32)


CASES = []


def case(cid, op, tensors, torch_fn, params=None, **kw):
    CASES.append(pytest.param(op, tensors, torch_fn, params or {}, kw, id=cid))


# ---- unary ops (the methods and the dispatchers) ---------------------------------------------
TORCH_UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": TF.gelu, "silu": TF.silu,
    "elu": TF.elu, "leaky_relu": TF.leaky_relu, "softplus": TF.softplus, "clamp": torch.clamp,
    "rsqrt": torch.rsqrt, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
}
POSITIVE = {"log", "sqrt", "rsqrt"}
UNARY_VARIANTS = {
    "gelu": [{}, {"approximate": "tanh"}, {"approximate": "none"}],
    "elu": [{}, {"alpha": 0.5}],
    "leaky_relu": [{}, {"negative_slope": 0.2}],
    "softplus": [{}, {"beta": 2.0, "threshold": 1.0}, {"beta": 0.5, "threshold": 30.0}],
    "clamp": [{"min": -0.5, "max": 0.7}, {"min": -0.3}, {"max": 0.2}, {"min": 0.5, "max": -0.5}],
}
for _op, _tfn in TORCH_UNARY.items():
    gen = pos if _op in POSITIVE else randn
    for _shape in [(), (3, 4), (2, 1, 5), (0, 3)]:
        for _p in UNARY_VARIANTS.get(_op, [{}]):
            sid = "x".join(map(str, _shape)) or "0d"
            pid = "-".join(f"{k}={v}" for k, v in _p.items())
            case(f"{_op}-{sid}{'-' + pid if pid else ''}", _op, {"input": gen(*_shape)}, _tfn, _p)
    # the dispatchers: unary(op, input, **params) and activation(name, input, **params)
    _p = UNARY_VARIANTS.get(_op, [{}])[-1]
    case(f"unary-{_op}", "unary", {"input": gen(4, 3)},
         lambda input, op, **p: TORCH_UNARY[op](input, **p), {"op": _op, **_p})
for _name in ("relu", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "tanh", "softplus"):
    _p = UNARY_VARIANTS.get(_name, [{}])[-1]
    case(f"activation-{_name}", "activation", {"input": randn(2, 5)},
         lambda input, name, **p: TORCH_UNARY[name](input, **p), {"name": _name, **_p})
case("activation-softmax", "activation", {"input": randn(3, 4, 2)},
     lambda input, name, dim: torch.softmax(input, dim), {"name": "softmax", "dim": 1})

# edge values: torch's gradient at the kinks and poles (Inf / NaN patterns must match exactly)
_EDGE = np.array([0.0, -0.0, 1.5, -2.0, 0.0, 3.0], np.float32)
case("edge-relu0", "relu", {"input": _EDGE}, torch.relu)
case("edge-abs0", "abs", {"input": _EDGE}, torch.abs)
case("edge-sqrt0", "sqrt", {"input": np.abs(_EDGE)}, torch.sqrt)
case("edge-log0", "log", {"input": np.abs(_EDGE)}, torch.log)
case("edge-rsqrt0", "rsqrt", {"input": np.abs(_EDGE)}, torch.rsqrt)
case("edge-leaky0", "leaky_relu", {"input": _EDGE}, TF.leaky_relu, {"negative_slope": 0.3})
case("edge-elu0", "elu", {"input": _EDGE}, TF.elu, {"alpha": 2.0})
case("edge-clamp-bounds", "clamp", {"input": np.array([-1.0, -0.5, 0.0, 0.7, 0.9], np.float32)}, torch.clamp,
     {"min": -0.5, "max": 0.7})
case("edge-softplus-threshold", "softplus", {"input": np.array([-3.0, 0.0, 2.0, 9.0, 11.0], np.float32)},
     TF.softplus, {"beta": 2.0, "threshold": 20.0})

# NaN inputs: torch's masks decide (relu passes the gradient, abs's sign and clamp's mask give 0)
_NAN = np.array([np.nan, 0.5, -0.5, 0.0], np.float32)
for _op, _p in (("relu", {}), ("abs", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 0.5}),
                ("clamp", {"min": -0.2, "max": 0.2}), ("sigmoid", {}), ("softplus", {})):
    case(f"edge-nan-{_op}", _op, {"input": _NAN}, TORCH_UNARY[_op], _p)

# ---- binary ops -----------------------------------------------------------------------------
TORCH_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
                "minimum": torch.minimum, "maximum": torch.maximum}
PAIRS = [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((4,), ()), ((0, 3), (1, 3)), ((), ())]


def _pair_data(op, sa, sb):
    if op == "pow":
        return pos(*sa), randn(*sb)
    if op in ("minimum", "maximum"):
        return ints(*sa), ints(*sb)
    if op == "div":
        b = randn(*sb)
        return randn(*sa), np.where(np.abs(b) < 0.3, 0.3 + np.abs(b), b).astype(np.float32)
    return randn(*sa), randn(*sb)


for _op, _tfn in TORCH_BINARY.items():
    second = "exponent" if _op == "pow" else "other"
    for _sa, _sb in PAIRS:
        _a, _b = _pair_data(_op, _sa, _sb)
        sid = ("x".join(map(str, _sa)) or "0d") + "_" + ("x".join(map(str, _sb)) or "0d")
        case(f"{_op}-{sid}", _op, {"input": _a, second: _b}, _tfn)
    # a Python number on either side: no gradient for it
    _a, _b = _pair_data(_op, (3, 2), (3, 2))
    case(f"{_op}-tensor_number", _op, {"input": _a},
         lambda _f=_tfn, _s=second, **kw: _f(kw["input"], torch.tensor(kw[_s], dtype=torch.float64)), {second: 1.5})
    case(f"{_op}-number_tensor", _op, {second: _b},
         lambda _f=_tfn, _s=second, **kw: _f(torch.tensor(kw.pop("input"), dtype=torch.float64), kw[_s]),
         {"input": 2.5})
    case(f"binary-{_op}", "binary", {"input": _a, "other": _b},
         lambda input, other, op: TORCH_BINARY[op](input, other), {"op": _op})

# pow at 0 and with negative bases (torch's rules: no gradient where exponent == 0, and for the
# exponent where base == 0 and exponent >= 0)
_BASE = np.array([0.0, 0.0, 0.0, -0.0, 2.0, -1.5, -2.0, 0.0], np.float32)
_EXP = np.array([2.0, 0.0, -1.0, -1.0, 0.0, 2.0, 3.0, 0.5], np.float32)
case("pow-edges", "pow", {"input": _BASE, "exponent": _EXP}, torch.pow)
case("pow-scalar_exponent0", "pow", {"input": _BASE}, torch.pow, {"exponent": 0.0})
case("pow-scalar_exponent2", "pow", {"input": _BASE}, torch.pow, {"exponent": 2.0})
case("pow-scalar_exponent3", "pow", {"input": randn(3, 3)}, torch.pow, {"exponent": 3})
case("pow-base0", "pow", {"exponent": _EXP},
     lambda input, exponent: torch.pow(input, exponent), {"input": 0.0})
case("pow-base_negative", "pow", {"exponent": np.array([1.0, 2.0, 0.5], np.float32)},
     lambda input, exponent: torch.pow(input, exponent), {"input": -2.0})
case("maximum-ties", "maximum", {"input": np.array([1.0, 2.0, 3.0, -1.0], np.float32),
                                 "other": np.array([1.0, 0.0, 3.0, 2.0], np.float32)}, torch.maximum)
case("minimum-ties_broadcast", "minimum", {"input": ints(4, 3, lo=0, hi=2), "other": ints(3, lo=0, hi=2)},
     torch.minimum)
case("maximum-number_ties", "maximum", {"input": ints(5, 4, lo=0, hi=3)},
     lambda input, other: torch.maximum(input, torch.tensor(other, dtype=torch.float64)), {"other": 1.0})

# ---- reductions -----------------------------------------------------------------------------
def _t_reduce(op):
    def fn(input, dim=None, keepdim=False):
        if op in ("max", "min"):
            f = torch.amax if op == "max" else torch.amin
            return f(input, dim=() if dim is None else dim, keepdim=keepdim)
        f = torch.sum if op == "sum" else torch.mean
        return f(input, dim=dim, keepdim=keepdim) if dim is not None else (
            f(input).reshape((1,) * input.dim()) if keepdim else f(input))
    return fn


for _op in ("sum", "mean", "max", "min"):
    gen = ints if _op in ("max", "min") else randn  # ties: the gradient split evenly among them
    for _shape, _dim in [((3, 4, 5), None), ((3, 4, 5), 1), ((3, 4, 5), (0, 2)), ((3, 4, 5), -1),
                         ((2, 1, 3), 1), ((), None), ((), 0), ((6,), 0), ((3, 4, 5), [])]:
        for _kd in (False, True):
            sid = "x".join(map(str, _shape)) or "0d"
            case(f"{_op}-{sid}-dim{_dim}-keep{int(_kd)}", _op, {"input": gen(*_shape)}, _t_reduce(_op),
                 {"dim": _dim, "keepdim": _kd})
    case(f"reduce-{_op}", "reduce", {"input": gen(3, 4)},
         lambda input, op, dim, keepdim: _t_reduce(op)(input, dim, keepdim), {"op": _op, "dim": 0, "keepdim": True})
for _op in ("sum", "mean"):
    case(f"{_op}-empty-dim1", _op, {"input": randn(0, 3)}, _t_reduce(_op), {"dim": 1})
    case(f"{_op}-empty-all", _op, {"input": randn(0, 3)}, _t_reduce(_op), {"dim": None})
case("max-all_tied", "max", {"input": np.full((3, 2), 1.5, np.float32)}, _t_reduce("max"), {"dim": None})
case("min-all_tied_dim", "min", {"input": np.full((3, 2), -1.0, np.float32)}, _t_reduce("min"), {"dim": 0})

case("max-nan_slice", "max", {"input": np.array([[1.0, np.nan, 2.0], [3.0, 0.0, 3.0]], np.float32)},
     _t_reduce("max"), {"dim": 1})
case("maximum-nan", "maximum", {"input": np.array([np.nan, 1.0, 2.0], np.float32),
                                "other": np.array([1.0, np.nan, 2.0], np.float32)}, torch.maximum)
for _op, _tfn in (("var", torch.var), ("std", torch.std)):
    for _shape, _dim in [((4, 5), None), ((4, 5), 1), ((3, 4, 5), (0, 2)), ((3, 4, 5), -1), ((2, 1, 3), 1), ((6,), 0)]:
        for _corr in (0, 1, 2):
            for _kd in (False, True):
                sid = "x".join(map(str, _shape))
                case(f"{_op}-{sid}-dim{_dim}-c{_corr}-keep{int(_kd)}", _op, {"input": randn(*_shape)}, _tfn,
                     {"dim": _dim, "correction": _corr, "keepdim": _kd})
case("std-constant_row", "std", {"input": np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 3.0]], np.float32)}, torch.std,
     {"dim": 1})

for _op, _tfn in (("var", torch.var), ("std", torch.std)):  # dof <= 0 over everything: NaN / Inf
    case(f"{_op}-single-all", _op, {"input": randn(1)}, _tfn, {})
    case(f"{_op}-dof_negative-all", _op, {"input": randn(2, 1)}, _tfn, {"correction": 3})

# ---- softmax / log_softmax ------------------------------------------------------------------
for _op, _tfn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
    for _shape, _dim in [((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1), ((5,), 0), ((), 0), ((2, 1, 3), 1),
                         ((0, 3), 1)]:
        sid = "x".join(map(str, _shape)) or "0d"
        case(f"{_op}-{sid}-dim{_dim}", _op, {"input": randn(*_shape) * 3}, _tfn, {"dim": _dim})

_MASKED = randn(3, 5)
_MASKED[0, 1] = _MASKED[2, 4] = -np.inf  # masked logits: probability 0, gradient as torch's
case("softmax-neginf", "softmax", {"input": _MASKED}, torch.softmax, {"dim": 1})
case("log_softmax-neginf", "log_softmax", {"input": _MASKED}, torch.log_softmax, {"dim": 1})

# ---- losses ---------------------------------------------------------------------------------
REDUCTIONS = ("mean", "sum", "none")
LOSS_PAIRS = [((3, 4), (3, 4)), ((2, 3, 4), (3, 4)), ((), ()), ((5,), (5,))]
for _op, _tfn, _variants in (("mse_loss", TF.mse_loss, [{}]), ("l1_loss", TF.l1_loss, [{}]),
                             ("smooth_l1_loss", TF.smooth_l1_loss, [{}, {"beta": 0.5}, {"beta": 0.0}]),
                             ("huber_loss", TF.huber_loss, [{}, {"delta": 0.3}, {"delta": 2.5}])):
    for _sa, _sb in LOSS_PAIRS:
        for _red in REDUCTIONS:
            for _p in _variants:
                sid = ("x".join(map(str, _sa)) or "0d") + "_" + ("x".join(map(str, _sb)) or "0d")
                pid = "-".join(f"{k}={v}" for k, v in _p.items())
                case(f"{_op}-{sid}-{_red}{'-' + pid if pid else ''}", _op,
                     {"input": randn(*_sa), "target": randn(*_sb)}, _tfn, {"reduction": _red, **_p})
    case(f"{_op}-ties", _op, {"input": ints(3, 4), "target": ints(3, 4)}, _tfn, {"reduction": "sum"})

for _red in REDUCTIONS:
    for _shape in [(3, 4), (2, 3, 2), ()]:
        sid = "x".join(map(str, _shape)) or "0d"
        case(f"bce-{sid}-{_red}", "binary_cross_entropy",
             {"input": rand(*_shape, lo=0.05, hi=0.95), "target": rand(*_shape)}, TF.binary_cross_entropy,
             {"reduction": _red})
    case(f"bce-weight-{_red}", "binary_cross_entropy",
         {"input": rand(3, 4, lo=0.05, hi=0.95), "target": rand(3, 4), "weight": rand(4, lo=0.5, hi=2.0)},
         TF.binary_cross_entropy, {"reduction": _red}, wrt=["input", "target"])


def _t_psnr(input, target, data_range=1.0):
    return 10.0 * torch.log10(data_range ** 2 / torch.mean((input - target) ** 2))


def _t_ssim(input, target, data_range=1.0, window_size=11, sigma=1.5, k1=0.01, k2=0.03):
    g = torch.tensor(gaussian_window(window_size, sigma).astype(np.float32), dtype=torch.float64)
    h, w = input.shape[-2:]
    x, y = input.reshape(-1, 1, h, w), target.reshape(-1, 1, h, w)

    def blur(z):
        return TF.conv2d(TF.conv2d(z, g.view(1, 1, -1, 1)), g.view(1, 1, 1, -1))
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    m = (2 * mx * my + c1) * (2 * sxy + c2) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return m.mean()


for _shape, _p in [((4, 5), {}), ((2, 3), {"data_range": 2.0})]:
    a = rand(*_shape)
    case(f"psnr-{'x'.join(map(str, _shape))}", "psnr",
         {"input": a, "target": (a + 0.1 * randn(*_shape)).astype(np.float32)}, _t_psnr, _p)
for _shape, _p in [((2, 3, 16, 16), {}), ((12, 12), {"window_size": 7}),
                   ((3, 14, 13), {"window_size": 5, "sigma": 1.0, "data_range": 2.0, "k1": 0.02, "k2": 0.05})]:
    a = rand(*_shape)
    case(f"ssim-{'x'.join(map(str, _shape))}", "ssim",
         {"input": a, "target": np.clip(a + 0.2 * randn(*_shape), 0, 1).astype(np.float32)}, _t_ssim, _p)

TORCH_LOSS = {"mse": TF.mse_loss, "l1": TF.l1_loss, "smooth_l1": TF.smooth_l1_loss, "huber": TF.huber_loss,
              "bce": TF.binary_cross_entropy, "psnr": _t_psnr, "ssim": _t_ssim}
for _name, _p, _x, _t in (
        ("mse", {"reduction": "sum"}, randn(3, 4), randn(3, 4)),
        ("l1", {"reduction": "none"}, randn(3, 4), randn(4)),
        ("smooth_l1", {"beta": 0.5}, randn(3, 4), randn(3, 4)),
        ("huber", {"delta": 0.5, "reduction": "none"}, randn(3, 4), randn(3, 4)),
        ("bce", {"reduction": "sum"}, rand(3, 4, lo=0.1, hi=0.9), rand(3, 4)),
        ("psnr", {"data_range": 2.0}, rand(3, 4), rand(3, 4)),
        ("ssim", {"window_size": 5}, rand(2, 9, 9), rand(2, 9, 9))):
    case(f"loss-{_name}", "loss", {"input": _x, "target": _t},
         lambda name, input, target, **p: TORCH_LOSS[name](input, target, **p), {"name": _name, **_p})

_BW = rand(4, lo=0.5, hi=2.0)
case("loss-bce-weight", "loss", {"input": rand(3, 4, lo=0.1, hi=0.9), "target": rand(3, 4)},
     lambda name, input, target, weight: TF.binary_cross_entropy(input, target, torch.tensor(weight, dtype=torch.float64)),
     {"name": "bce", "weight": _BW})

# ---- nll_loss / cross_entropy ---------------------------------------------------------------
def _targets(shape, C, ignore=None):
    t = _RNG.integers(0, C, shape).astype(np.int64)
    if ignore is not None and t.size:
        t.reshape(-1)[:: 3] = ignore
    return t


CLASS_SHAPES = [((5,), ()), ((4, 3), (4,)), ((2, 3, 4, 5), (2, 4, 5)), ((3, 4, 1), (3, 1))]
for _op, _tfn in (("nll_loss", TF.nll_loss), ("cross_entropy", TF.cross_entropy)):
    for _xs, _ts in CLASS_SHAPES:
        C = _xs[0 if len(_xs) == 1 else 1]
        sid = "x".join(map(str, _xs))
        for _red in REDUCTIONS:
            case(f"{_op}-{sid}-{_red}", _op, {"input": randn(*_xs), "target": _targets(_ts, C)}, _tfn,
                 {"reduction": _red})
            case(f"{_op}-{sid}-{_red}-weight-ignore", _op,
                 {"input": randn(*_xs), "target": _targets(_ts, C, ignore=1 if len(_xs) > 1 else None),
                  "weight": rand(C, lo=0.5, hi=2.0)}, _tfn, {"reduction": _red, "ignore_index": 1},
                 wrt=["input"])
            if _op == "cross_entropy":
                case(f"ce-{sid}-{_red}-smoothing", _op,
                     {"input": randn(*_xs), "target": _targets(_ts, C, ignore=-100 if len(_xs) > 1 else None),
                      "weight": rand(C, lo=0.5, hi=2.0)}, _tfn, {"reduction": _red, "label_smoothing": 0.2},
                     wrt=["input"])
                case(f"ce-{sid}-{_red}-smoothing-noweight", _op,
                     {"input": randn(*_xs), "target": _targets(_ts, C)}, _tfn,
                     {"reduction": _red, "label_smoothing": 0.1})
                # class probabilities (the input's shape): gradients for input, target and weight
                _p = _RNG.random(_xs).astype(np.float32)
                _p = (_p / _p.sum(axis=0 if len(_xs) == 1 else 1, keepdims=True)).astype(np.float32)
                case(f"ce-probs-{sid}-{_red}", _op, {"input": randn(*_xs), "target": _p}, _tfn,
                     {"reduction": _red})
                case(f"ce-probs-{sid}-{_red}-weight-smoothing", _op,
                     {"input": randn(*_xs), "target": _p, "weight": rand(C, lo=0.5, hi=2.0)}, _tfn,
                     {"reduction": _red, "label_smoothing": 0.3})


def _dispatched(be, disp, name, tensors, torch_fn, params):
    """check_grad for the dispatchers whose first argument is itself called ``op`` (unary, binary,
    reduce): ag.apply's own first parameter is ``op``, so the op name goes in positionally here."""
    import grad_check
    real = grad_check.ag

    class _Shim:  # check_grad calls ag.apply(disp, be=..., **tensors, **params)
        Var = real.Var
        backward = staticmethod(real.backward)

        @staticmethod
        def apply(_disp, be=None, **kw):
            return real.apply(_disp, name, be=be, **kw)
    grad_check.ag = _Shim
    try:
        check_grad(be, disp, tensors, lambda **kw: torch_fn(op=name, **kw), params)
    finally:
        grad_check.ag = real


@pytest.mark.parametrize("op,tensors,torch_fn,params,kw", CASES)
def test_grad(backend_target, op, tensors, torch_fn, params, kw):
    if op in ("unary", "binary", "reduce"):
        params = dict(params)
        name = params.pop("op")
        _dispatched(backend_target, op, name, tensors, torch_fn, params)
        return
    check_grad(backend_target, op, tensors, torch_fn, params, **kw)


# ---- chains and refusals ----------------------------------------------------------------------
def test_log_softmax_nll_equals_cross_entropy(backend_target):
    be = backend_target
    x = randn(4, 5, 3)
    t = _targets((4, 3), 5, ignore=2)
    w = rand(5, lo=0.5, hi=2.0)
    X1 = ag.Var(be, x, requires_grad=True)
    X2 = ag.Var(be, x, requires_grad=True)
    l1 = ag.F.nll_loss(ag.F.log_softmax(X1, dim=1), t, weight=w, ignore_index=2)
    l2 = ag.F.cross_entropy(X2, t, weight=w, ignore_index=2)
    g1, = ag.grad(l1, [X1])
    g2, = ag.grad(l2, [X2])
    np.testing.assert_allclose(be.to_numpy(g1), be.to_numpy(g2), rtol=1e-5, atol=1e-7)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    TF.cross_entropy(tx, torch.tensor(t), weight=torch.tensor(w, dtype=torch.float64), ignore_index=2).backward()
    np.testing.assert_allclose(be.to_numpy(g2), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_chain_of_elementwise_and_reductions(backend_target):
    """softplus -> mul -> amax + var -> sqrt -> mse: the rules compose (the tape adds the paths)."""
    be = backend_target
    x, t = randn(3, 6), randn(3)
    X = ag.Var(be, x, requires_grad=True)
    h = ag.F.mul(ag.F.softplus(X, beta=2.0), X)
    y = ag.F.add(ag.F.max(h, dim=1), ag.F.sqrt(ag.F.var(h, dim=1)))
    gx, = ag.grad(ag.F.mse_loss(y, t), [X])
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    th = TF.softplus(tx, beta=2.0) * tx
    TF.mse_loss(th.amax(1) + th.var(1).sqrt(), torch.tensor(t, dtype=torch.float64)).backward()
    np.testing.assert_allclose(be.to_numpy(gx), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_class_index_weight_gradient_is_refused(backend_target):
    be = backend_target
    X = ag.Var(be, randn(4, 3), requires_grad=True)
    W = ag.Var(be, rand(3, lo=0.5, hi=1.0), requires_grad=True)
    loss = ag.F.nll_loss(X, np.array([0, 1, 2, 1]), weight=W)
    with pytest.raises(AnyDeviceError, match="weight"):
        loss.backward()


def test_backward_stays_on_the_device(backend_target):
    """The rules run on native arrays: a backward pass downloads nothing and uploads nothing but
    its seed (the constants the rules select with are uploaded once per backend)."""
    be = backend_target
    x, t, o = randn(3, 4), rand(3, 4, lo=0.1, hi=0.9), randn(3, 4)
    X = ag.Var(be, x, requires_grad=True)
    T, O = ag.Var(be, t, requires_grad=True), ag.Var(be, o, requires_grad=True)
    for attempt in range(2):
        h = ag.F.maximum(ag.F.gelu(X, approximate="tanh"), O)
        h = ag.F.clamp(ag.F.div(ag.F.pow(ag.F.softplus(h), 1.5), ag.F.add(ag.F.abs(O), 1.0)), min=-2.0, max=3.0)
        p = ag.F.softmax(ag.F.mul(h, 2.0), dim=1)
        loss = ag.F.add(ag.F.add(ag.F.binary_cross_entropy(ag.F.clamp(p, min=0.01, max=0.99), T),
                                 ag.F.huber_loss(ag.F.log_softmax(h, dim=0), O, delta=0.5)),
                        ag.F.add(ag.F.sum(ag.F.max(h, dim=1)),
                                 ag.F.sum(ag.F.std(h, dim=0))))
        be.reset_transfers()
        grads = ag.grad(loss, [X, T, O])
        moved = be.transfers()
        assert all(g is not None for g in grads)
        assert moved["downloads"] == 0 and moved["uploads"] == 0, moved
        if attempt:
            assert moved["constants"] <= 1, moved  # the seed


def test_ssim_gradient_in_chunks(backend_target, monkeypatch):
    """Inputs larger than one ssim chunk: forward and backward go in groups of planes (one plane,
    then two: 256 elements each) and still match torch."""
    from anydevice.backend.ops import contract
    monkeypatch.setattr(contract, "SSIM_MIN_CHUNK", 300)
    a = rand(2, 3, 16, 16)
    b = np.clip(a + 0.2 * randn(2, 3, 16, 16), 0, 1).astype(np.float32)
    check_grad(backend_target, "ssim", {"input": a, "target": b}, _t_ssim, {"window_size": 5})
    monkeypatch.setattr(contract, "SSIM_MIN_CHUNK", 600)
    check_grad(backend_target, "ssim", {"input": a, "target": b}, _t_ssim, {"window_size": 7, "sigma": 1.2})
