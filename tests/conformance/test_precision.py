"""The precision suite: every op of the contract, on every backend available here.

One test per op, parametrised over ``backend_target`` (see conftest.py), so a new backend is tested
by this same code. Reference: PyTorch in float64 on the same float32 inputs. Bar: normwise relative
error ||y - ref|| / ||ref|| <= 1e-6 for the pack's own kernels; the PyTorch-backed backends are held
to VENDOR_TOL (5e-6, what PyTorch promises for float32: see there). NaN and Inf positions must
match the reference exactly.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from anydevice.backend import AnyDeviceError, conv2d_plan, conv_transpose2d_plan
from precision_helpers import HYP, TOL, VENDOR_TOL, _assert_unchanged, _snapshot, check, relerr, t64, tol_for  # noqa: F401

def rand(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# the six seed conv cases: input 32x512x7x7, weight 512x512xkxk
# ---------------------------------------------------------------------------------------------
SEED_CASES = [  # (k, stride, padding)
    (3, 1, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0), (1, 2, 0), (7, 2, 3),
]
_seed_data: dict = {}


def seed_case(k, s, p):
    key = (k, s, p)
    if key not in _seed_data:
        rng = np.random.default_rng(1234 + k * 100 + s * 10 + p)
        x = rng.standard_normal((32, 512, 7, 7)).astype(np.float32)
        w = (rng.standard_normal((512, 512, k, k)) / np.sqrt(512 * k * k)).astype(np.float32)
        b = rng.standard_normal(512).astype(np.float32)
        ref = F.conv2d(t64(x), t64(w), t64(b), s, p).numpy()
        _seed_data[key] = (x, w, b, ref)
    return _seed_data[key]


@pytest.mark.parametrize("k,s,p", SEED_CASES, ids=[f"k{k}s{s}p{p}" for k, s, p in SEED_CASES])
def test_conv2d_seed_cases(backend_target, k, s, p):
    x, w, b, ref = seed_case(k, s, p)
    y = backend_target.conv2d(x, w, b, stride=s, padding=p)
    check(y, ref, f"conv2d k{k} s{s} p{p}", tol_for(backend_target))


MANY_CHANNELS = [  # (x shape, weight shape, stride, padding, groups): big-K paths (Winograd, im2col)
    ((1, 32, 9, 10), (40, 32, 3, 3), 1, 1, 1), ((2, 33, 13, 8), (32, 33, 3, 3), 1, (1, 0), 1),
    ((3, 48, 5, 2), (64, 48, 3, 3), 1, 1, 1), ((1, 64, 1, 1), (32, 64, 3, 3), 1, 1, 1),
    ((2, 64, 11, 11), (48, 64, 3, 3), 2, 1, 1), ((1, 64, 9, 7), (64, 32, 3, 3), 1, 1, 2),
    ((2, 40, 6, 9), (36, 40, 1, 1), 1, 0, 1), ((1, 36, 12, 12), (40, 36, 5, 5), 1, 2, 1),
    ((1, 128, 4, 4), (128, 128, 3, 3), 1, 0, 1),
    ((1, 160, 12, 10), (4, 160, 3, 3), 1, 1, 1),  # a UNet's conv_out: few outputs of many taps (CUDA: the GEMM)
]


@pytest.mark.parametrize("xs,ws,stride,padding,groups", MANY_CHANNELS,
                         ids=[f"{'x'.join(map(str, c[0]))}-{'x'.join(map(str, c[1]))}" for c in MANY_CHANNELS])
def test_conv2d_many_channels(backend_target, xs, ws, stride, padding, groups):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rand(rng, *xs)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rand(rng, ws[0])
    ref = F.conv2d(t64(x), t64(w), t64(b), stride, padding, 1, groups).numpy()
    check(backend_target.conv2d(x, w, b, stride, padding, 1, groups), ref, f"conv2d {xs} {ws}")


# ---------------------------------------------------------------------------------------------
# random shapes (hypothesis, derandomised so CI is reproducible)
# ---------------------------------------------------------------------------------------------
@st.composite
def conv_args(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin_g = draw(st.integers(1, 4))
    cout_g = draw(st.integers(1, 4))
    n = draw(st.sampled_from([1, 1, 2, 3]))
    kh = draw(st.sampled_from([1, 2, 3, 5, 7]))
    kw = draw(st.sampled_from([kh, kh, 1, 2, 3]))
    h = draw(st.integers(1, 17))
    w = draw(st.integers(1, 17))
    stride = draw(st.sampled_from([1, 1, 2, 3, (1, 2), (2, 1)]))
    dilation = draw(st.sampled_from([1, 1, 1, 2, (1, 2)]))
    padding = draw(st.sampled_from([0, 1, 2, 3, (1, 0), (0, 2), "same", "valid"]))
    mode = draw(st.sampled_from(["zeros", "zeros", "reflect", "replicate", "circular"]))
    bias = draw(st.booleans())
    batched = draw(st.sampled_from([True, True, True, False]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(groups=groups, cin=cin_g * groups, cout=cout_g * groups, n=n, kh=kh, kw=kw, h=h, w=w,
                stride=stride, dilation=dilation, padding=padding, mode=mode, bias=bias,
                batched=batched, seed=seed)


def _valid_conv(a):
    xs = (a["n"], a["cin"], a["h"], a["w"]) if a["batched"] else (a["cin"], a["h"], a["w"])
    ws = (a["cout"], a["cin"] // a["groups"], a["kh"], a["kw"])
    try:
        conv2d_plan("conv2d", xs, ws, None, a["stride"], a["padding"], a["dilation"], a["groups"], a["mode"])
    except AnyDeviceError:
        return None
    return xs, ws


@HYP
@given(a=conv_args())
def test_conv2d_random(backend_target, a):
    shapes = _valid_conv(a)
    assume(shapes is not None)
    xs, ws = shapes
    rng = np.random.default_rng(a["seed"])
    x, w = rand(rng, *xs), rand(rng, *ws)
    b = rand(rng, a["cout"]) if a["bias"] else None
    conv = torch.nn.Conv2d(a["cin"], a["cout"], (a["kh"], a["kw"]), a["stride"], a["padding"], a["dilation"],
                           a["groups"], a["bias"], a["mode"]).double()
    with torch.no_grad():
        conv.weight.copy_(t64(w))
        if b is not None:
            conv.bias.copy_(t64(b))
        ref = conv(t64(x)).numpy()
    y = backend_target.conv2d(x, w, b, a["stride"], a["padding"], a["dilation"], a["groups"], a["mode"])
    check(y, ref, f"conv2d {a}")


@st.composite
def convt_args(draw):
    groups = draw(st.sampled_from([1, 1, 2]))
    cin = draw(st.integers(1, 4)) * groups
    cout_g = draw(st.integers(1, 4))
    n = draw(st.sampled_from([1, 2]))
    kh = draw(st.sampled_from([1, 2, 3, 4, 5]))
    kw = draw(st.sampled_from([kh, kh, 1, 3]))
    h, w = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    stride = draw(st.sampled_from([1, 2, 3, (2, 1)]))
    dilation = draw(st.sampled_from([1, 1, 2]))
    padding = draw(st.sampled_from([0, 1, 2, (1, 0)]))
    output_padding = draw(st.sampled_from([0, 0, 1, (1, 0)]))
    return dict(groups=groups, cin=cin, cout_g=cout_g, n=n, kh=kh, kw=kw, h=h, w=w, stride=stride,
                dilation=dilation, padding=padding, output_padding=output_padding,
                bias=draw(st.booleans()), batched=draw(st.sampled_from([True, True, False])),
                seed=draw(st.integers(0, 2**31 - 1)))


@HYP
@given(a=convt_args())
def test_conv_transpose2d_random(backend_target, a):
    xs = (a["n"], a["cin"], a["h"], a["w"]) if a["batched"] else (a["cin"], a["h"], a["w"])
    ws = (a["cin"], a["cout_g"], a["kh"], a["kw"])
    try:
        conv_transpose2d_plan("conv_transpose2d", xs, ws, None, a["stride"], a["padding"],
                              a["output_padding"], a["groups"], a["dilation"])
    except AnyDeviceError:
        assume(False)
    rng = np.random.default_rng(a["seed"])
    x, w = rand(rng, *xs), rand(rng, *ws)
    b = rand(rng, a["cout_g"] * a["groups"]) if a["bias"] else None
    ref = F.conv_transpose2d(t64(x), t64(w), None if b is None else t64(b), a["stride"], a["padding"],
                             a["output_padding"], a["groups"], a["dilation"]).numpy()
    y = backend_target.conv_transpose2d(x, w, b, a["stride"], a["padding"], a["output_padding"],
                                        a["groups"], a["dilation"])
    check(y, ref, f"conv_transpose2d {a}")


@st.composite
def matmul_shapes(draw):
    m, k, n = draw(st.integers(1, 70)), draw(st.integers(1, 70)), draw(st.integers(1, 70))
    kind = draw(st.sampled_from(["2d", "2d", "vec-mat", "mat-vec", "dot", "batch", "bcast", "bcast2"]))
    if kind == "2d":
        return (m, k), (k, n)
    if kind == "vec-mat":
        return (k,), (k, n)
    if kind == "mat-vec":
        return (m, k), (k,)
    if kind == "dot":
        return (k,), (k,)
    b = draw(st.integers(1, 4))
    if kind == "batch":
        return (b, m, k), (b, k, n)
    if kind == "bcast":
        return (b, m, k), (k, n)
    return (2, 1, m, k), (b, k, n)


@HYP
@given(shapes=matmul_shapes(), seed=st.integers(0, 2**31 - 1))
def test_matmul_random(backend_target, shapes, seed):
    rng = np.random.default_rng(seed)
    a, b = rand(rng, *shapes[0]), rand(rng, *shapes[1])
    check(backend_target.matmul(a, b), torch.matmul(t64(a), t64(b)).numpy(), f"matmul {shapes}")


@pytest.mark.parametrize("n", [1, 4, 63, 100, 129, 257])
def test_matmul_square(backend_target, n):
    rng = np.random.default_rng(n)
    a, b = rand(rng, n, n), rand(rng, n, n)
    check(backend_target.matmul(a, b), (t64(a) @ t64(b)).numpy(), f"matmul {n}")


@HYP
@given(lead=st.lists(st.integers(1, 5), min_size=0, max_size=2), fin=st.integers(1, 40),
       fout=st.integers(1, 40), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_linear_random(backend_target, lead, fin, fout, bias, seed):
    rng = np.random.default_rng(seed)
    x, w = rand(rng, *lead, fin), rand(rng, fout, fin)
    b = rand(rng, fout) if bias else None
    ref = F.linear(t64(x), t64(w), None if b is None else t64(b)).numpy()
    check(backend_target.linear(x, w, b), ref, "linear")


# ---------------------------------------------------------------------------------------------
# elementwise, activations, reductions
# ---------------------------------------------------------------------------------------------
UNARY_CASES = [
    ("abs", {}, None), ("neg", {}, None), ("exp", {}, (-20, 20)), ("log", {}, (1e-3, 50)),
    ("sqrt", {}, (0, 50)), ("relu", {}, None), ("sigmoid", {}, (-30, 30)), ("tanh", {}, (-10, 10)),
    ("gelu", {}, (-8, 8)), ("gelu", {"approximate": "tanh"}, (-8, 8)), ("silu", {}, (-20, 20)),
    ("elu", {}, (-10, 10)), ("elu", {"alpha": 0.5}, (-10, 10)), ("leaky_relu", {}, None),
    ("leaky_relu", {"negative_slope": 0.2}, None), ("softplus", {}, (-30, 30)),
    ("softplus", {"beta": 2.0, "threshold": 5.0}, (-10, 10)), ("clamp", {"min": -0.5, "max": 0.3}, None),
    ("clamp", {"min": 0.1}, None), ("clamp", {"max": -0.1}, None), ("rsqrt", {}, (1e-3, 50)),
    ("erf", {}, (-4, 4)), ("erf", {}, (-0.05, 0.05)), ("sin", {}, (-100, 100)), ("cos", {}, (-100, 100)),
]


def torch_unary(op, x, p):
    if op == "clamp":
        return torch.clamp(x, p.get("min"), p.get("max"))
    if op in ("gelu", "elu", "leaky_relu", "softplus", "silu"):
        return getattr(F, op)(x, **p)
    return getattr(torch, op)(x)


@pytest.mark.parametrize("op,params,rng_", UNARY_CASES,
                         ids=[f"{o}-{'-'.join(f'{k}{v}' for k, v in p.items())}-{r}" for o, p, r in UNARY_CASES])
def test_unary(backend_target, op, params, rng_):
    lo, hi = rng_ or (-5, 5)
    rng = np.random.default_rng(7)
    for shape in [(), (1,), (7,), (3, 5, 17), (2, 3, 33, 31)]:
        x = rand(rng, *shape, lo=lo, hi=hi)
        check(backend_target.unary(op, x, **params), torch_unary(op, t64(x), params).numpy(), f"{op} {shape}")


@pytest.mark.parametrize("op", ["relu", "sigmoid", "tanh", "gelu", "silu", "elu", "leaky_relu", "softplus", "softmax"])
def test_activation_dispatch(backend_target, op):
    rng = np.random.default_rng(3)
    x = rand(rng, 2, 5, 6, lo=-4, hi=4)
    ref = F.softmax(t64(x), dim=1) if op == "softmax" else torch_unary(op, t64(x), {})
    y = backend_target.activation(op, x, dim=1) if op == "softmax" else backend_target.activation(op, x)
    check(y, ref.numpy(), op)


@HYP
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data())
def test_softmax_random(backend_target, shape, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    x = rand(rng, *shape, lo=-30, hi=30)
    check(backend_target.softmax(x, dim), F.softmax(t64(x), dim).numpy(), f"softmax {shape} dim {dim}")


@st.composite
def broadcast_pair(draw):
    nd = draw(st.integers(0, 4))
    full = [draw(st.integers(1, 9)) for _ in range(nd)]
    a = [d if draw(st.booleans()) else 1 for d in full]
    b = [d if draw(st.booleans()) else 1 for d in full]
    cut = draw(st.integers(0, nd))
    return tuple(a), tuple(b[cut:])


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "minimum", "maximum"])
@HYP
@given(shapes=broadcast_pair(), seed=st.integers(0, 2**31 - 1), scalar=st.sampled_from([None, None, "left", "right"]))
def test_binary_random(backend_target, op, shapes, seed, scalar):
    rng = np.random.default_rng(seed)
    lo = 0.1 if op == "pow" else -3
    a, b = rand(rng, *shapes[0], lo=lo, hi=3), rand(rng, *shapes[1], lo=-3, hi=3)
    if op == "div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    tfn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
           "minimum": torch.minimum, "maximum": torch.maximum}[op]
    if scalar == "left" and op != "pow":
        s = 1.75
        ref = tfn(torch.full(b.shape, s, dtype=torch.float64), t64(b))
        y = backend_target.binary(op, s, b)
    elif scalar == "right":
        s = 1.5
        ref = tfn(t64(a), torch.tensor(s, dtype=torch.float64))
        y = backend_target.binary(op, a, s)
    else:
        ref = tfn(t64(a), t64(b))
        y = backend_target.binary(op, a, b)
    check(y, ref.numpy(), f"{op} {shapes} scalar={scalar}")


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@HYP
@given(shape=st.lists(st.integers(1, 12), min_size=0, max_size=4), data=st.data())
def test_reduce_random(backend_target, op, shape, data):
    nd = len(shape)
    dim = data.draw(st.one_of(st.none(), st.integers(-max(nd, 1), max(nd, 1) - 1) if nd else st.none(),
                              st.lists(st.integers(0, max(nd - 1, 0)), min_size=1, max_size=nd, unique=True)
                              if nd else st.none()))
    keepdim = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    x = rand(rng, *shape, lo=0.5, hi=2.0)  # positive: a sum's norm is not cancelled away
    tfn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[op]
    t = t64(x)
    if dim is None:
        ref = tfn(t) if op in ("sum", "mean") else tfn(t, dim=tuple(range(nd)))
        if keepdim:
            ref = ref.reshape((1,) * nd)
    else:
        ref = tfn(t, dim=dim, keepdim=keepdim)
    check(backend_target.reduce(op, x, dim, keepdim), ref.numpy(), f"{op} {shape} dim={dim}")


def test_long_sum_precision(backend_target):
    rng = np.random.default_rng(11)
    x = rand(rng, 4, 1 << 18, lo=0.0, hi=1.0)
    for dim in (None, 0, 1):
        ref = t64(x).sum() if dim is None else t64(x).sum(dim)
        check(backend_target.sum(x, dim), ref.numpy(), f"sum over {x.shape} dim {dim}")
        ref = t64(x).mean() if dim is None else t64(x).mean(dim)
        check(backend_target.mean(x, dim), ref.numpy(), f"mean over {x.shape} dim {dim}")


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad(backend_target, mode):
    rng = np.random.default_rng(5)
    x = rand(rng, 2, 3, 6, 7)
    for pad in [(1, 2, 3, 0), (0, 0, 2, 2), (2, 1, 1, 2)] + ([(3, 3)] if mode == "constant" else []):
        ref = F.pad(t64(x), pad, mode=mode).numpy()
        check(backend_target.pad(x, pad, mode), ref, f"pad {mode} {pad}")


# ---------------------------------------------------------------------------------------------
# layer ops (backend/ops/layers.py): var, std, log_softmax, layer_norm, group_norm, rms_norm
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["var", "std"])
@HYP
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=4), data=st.data())
def test_var_std_random(backend_target, op, shape, data):
    nd = len(shape)
    dim = data.draw(st.one_of(st.none(), st.integers(-nd, nd - 1) if nd else st.none(),
                              st.lists(st.integers(0, max(nd - 1, 0)), min_size=1, max_size=nd, unique=True)
                              if nd else st.none()))
    keepdim = data.draw(st.booleans())
    correction = data.draw(st.sampled_from([1, 0, 2, 0.5, 5]))  # >= count: Inf / NaN as torch
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    x = rand(rng, *shape, lo=-2.0, hi=3.0)
    with warnings.catch_warnings():  # torch warns where correction >= count (Inf / NaN)
        warnings.simplefilter("ignore", UserWarning)
        ref = getattr(torch, op)(t64(x), dim=dim, correction=correction, keepdim=keepdim)
    y = getattr(backend_target, op)(x, dim, correction=correction, keepdim=keepdim)
    check(y, ref.numpy(), f"{op} {shape} dim={dim} correction={correction} keepdim={keepdim}")


def test_var_offset_data(backend_target):
    """Two passes: a variance of 1e-2 under a mean of 100 keeps its digits."""
    rng = np.random.default_rng(12)
    x = (100.0 + rand(rng, 3, 4000, lo=-0.2, hi=0.2)).astype(np.float32)
    for dim in (None, 1, 0):
        check(backend_target.var(x, dim), torch.var(t64(x), dim).numpy(), f"var offset dim={dim}")
        check(backend_target.std(x, dim, correction=0), torch.std(t64(x), dim, correction=0).numpy(), "std")


@HYP
@given(shape=st.lists(st.integers(1, 9), min_size=0, max_size=4), data=st.data())
def test_log_softmax_random(backend_target, shape, data):
    dim = data.draw(st.integers(-max(len(shape), 1), max(len(shape), 1) - 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    x = rand(rng, *shape, lo=-30, hi=30)
    check(backend_target.log_softmax(x, dim), F.log_softmax(t64(x), dim).numpy(), f"log_softmax {shape} dim {dim}")


def _maybe(rng, use, shape, lo=-2.0, hi=2.0):
    return rand(rng, *shape, lo=lo, hi=hi) if use else None


def _t64_or_none(a):
    return None if a is None else t64(a)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@HYP
@given(shape=st.lists(st.integers(1, 8), min_size=1, max_size=4), data=st.data())
def test_layer_rms_norm_random(backend_target, op, shape, data):
    k = data.draw(st.integers(1, len(shape)))
    ns = tuple(shape[len(shape) - k:])
    arg = ns if data.draw(st.booleans()) or k > 1 else ns[0]  # normalized_shape as a tuple or an int
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    x = rand(rng, *shape, lo=-3, hi=5)
    w, b = _maybe(rng, data.draw(st.booleans()), ns), _maybe(rng, data.draw(st.booleans()), ns)
    if op == "layer_norm":
        eps = data.draw(st.sampled_from([1e-5, 1e-3, 0.0]))
        if eps == 0.0:
            assume(np.prod(ns) > 1)  # one element per group: 0 / sqrt(0) is NaN, correctly, but not useful
        ref = F.layer_norm(t64(x), ns, _t64_or_none(w), _t64_or_none(b), eps)
        y = backend_target.layer_norm(x, arg, w, b, eps)
    else:
        eps = data.draw(st.sampled_from([None, 1e-6, 0.1]))
        ref_eps = float(np.finfo(np.float32).eps) if eps is None else eps  # float32's: the pack computes in it
        ref = F.rms_norm(t64(x), ns, _t64_or_none(w), ref_eps)
        y = backend_target.rms_norm(x, arg, w, eps)
    check(y, ref.numpy(), f"{op} {shape} {ns} eps={eps}")


GROUP_NORM_CASES = [((2, 6, 5, 4), 3), ((2, 6, 5, 4), 1), ((2, 6, 5, 4), 6), ((3, 4), 2), ((1, 8, 7), 4),
                    ((2, 32, 9, 9), 8), ((0, 4, 3), 2), ((2, 4, 3, 2, 2), 2)]


@pytest.mark.parametrize("shape,groups", GROUP_NORM_CASES, ids=[f"{s}g{g}" for s, g in GROUP_NORM_CASES])
def test_group_norm(backend_target, shape, groups):
    rng = np.random.default_rng(13)
    x = rand(rng, *shape, lo=-2, hi=6)
    for affine, eps in ((False, 1e-5), (True, 1e-5), (True, 0.5)):
        w, b = _maybe(rng, affine, shape[1:2]), _maybe(rng, affine, shape[1:2])
        ref = F.group_norm(t64(x), groups, _t64_or_none(w), _t64_or_none(b), eps)
        check(backend_target.group_norm(x, groups, w, b, eps), ref.numpy(), f"group_norm {shape} G={groups}")


def test_layer_ops_nan_inf_like_torch(backend_target):
    """A NaN or an Inf spreads over its row (its group) as in torch; -Inf in log_softmax is -Inf."""
    be = backend_target
    x = np.array([[np.nan, 1.0, 2.0, 3.0], [-np.inf, 1.0, 2.0, 0.5], [np.inf, 1.0, -1.0, 2.0],
                  [0.5, -1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [-np.inf] * 4], np.float32)
    t32 = torch.from_numpy(x)
    t64_ = t32.double()
    eps32 = float(np.finfo(np.float32).eps)
    for name, ours, ref in [
        ("log_softmax", lambda a: be.log_softmax(a, 1), lambda t: F.log_softmax(t, 1)),
        ("var", lambda a: be.var(a, 1), lambda t: torch.var(t, 1)),
        ("std", lambda a: be.std(a, 1, correction=0, keepdim=True), lambda t: torch.std(t, 1, correction=0, keepdim=True)),
        ("var over 1", lambda a: be.var(a[:, :1], 1), lambda t: torch.var(t[:, :1], 1)),
        ("layer_norm", lambda a: be.layer_norm(a, 4), lambda t: F.layer_norm(t, (4,))),
        ("rms_norm", lambda a: be.rms_norm(a, (4,)), lambda t: F.rms_norm(t, (4,), eps=eps32)),
        ("group_norm", lambda a: be.group_norm(a.reshape(3, 4, 2), 2),
         lambda t: F.group_norm(t.reshape(3, 4, 2), 2)),
    ]:
        with warnings.catch_warnings():  # var over 1 element: torch warns, gives NaN
            warnings.simplefilter("ignore", UserWarning)
            r32, r64 = ref(t32), ref(t64_)
        _same_specials(ours(x), r32, r64)
        check(ours(x), r64.numpy(), name)


def test_layer_ops_edge_shapes(backend_target):
    """0-d and empty inputs as torch: var of one element is NaN, log_softmax of a 0-d tensor 0."""
    be = backend_target
    z = np.float32(2.0) * np.ones((), np.float32)
    assert float(np.asarray(be.to_numpy(be.log_softmax(z, 0)))) == 0.0
    assert np.isnan(float(np.asarray(be.to_numpy(be.var(z)))))
    assert be.log_softmax(np.zeros((3, 0, 4), np.float32), 1).shape == (3, 0, 4)
    assert np.isnan(be.to_numpy(be.var(np.zeros((2, 0), np.float32), 1))).all()
    assert be.var(np.ones((2, 3), np.float32), None, keepdim=True).shape == (1, 1)
    assert be.layer_norm(np.ones((0, 5), np.float32), 5).shape == (0, 5)


# ---------------------------------------------------------------------------------------------
# losses and image metrics
# ---------------------------------------------------------------------------------------------
def ref_ssim(x, y, data_range=1.0, win=11, sigma=1.5):
    x, y = t64(x), t64(y)
    while x.dim() < 4:
        x, y = x.unsqueeze(0), y.unsqueeze(0)
    c = x.shape[1]
    g = torch.arange(win, dtype=torch.float64) - (win - 1) / 2
    g = torch.exp(-(g ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    w2 = (g[:, None] * g[None, :]).expand(c, 1, win, win)
    f = lambda z: F.conv2d(z, w2, groups=c)  # noqa: E731
    mx, my = f(x), f(y)
    sxx, syy, sxy = f(x * x) - mx ** 2, f(y * y) - my ** 2, f(x * y) - mx * my
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    m = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2))
    return m.mean()


LOSS_SHAPES = [((2, 3, 9, 8), (2, 3, 9, 8)), ((5,), (5,)), ((4, 1, 6), (4, 3, 6)), ((1,), (3, 2))]
LOSS_CASES = [(loss, shapes) for loss in ["mse", "l1", "smooth_l1", "huber", "bce"] for shapes in LOSS_SHAPES
              if loss != "bce" or shapes[0] == shapes[1]]  # binary_cross_entropy needs equal shapes


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss,shapes", LOSS_CASES)
def test_losses(backend_target, loss, reduction, shapes):
    rng = np.random.default_rng(13)
    if loss == "bce":
        a = rand(rng, *shapes[0], lo=0.0, hi=1.0)
        a.flat[0] = 0.0  # log(0) is clamped at -100 in torch
        b = rand(rng, *shapes[1], lo=0.0, hi=1.0)
        ref = F.binary_cross_entropy(t64(a), t64(b), reduction=reduction)
        y = backend_target.loss("bce", a, b, reduction=reduction)
    else:
        a, b = rand(rng, *shapes[0], lo=-3, hi=3), rand(rng, *shapes[1], lo=-3, hi=3)
        ta, tb = torch.broadcast_tensors(t64(a), t64(b))
        params = {"smooth_l1": {"beta": 0.7}, "huber": {"delta": 1.3}}.get(loss, {})
        tfn = {"mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss, "huber": F.huber_loss}[loss]
        ref = tfn(ta, tb, reduction=reduction, **params)
        y = backend_target.loss(loss, a, b, reduction=reduction, **params)
    check(y, ref.numpy(), f"{loss} {reduction} {shapes}")


def test_bce_weight(backend_target):
    rng = np.random.default_rng(2)
    a, b, w = rand(rng, 3, 4, lo=0.01, hi=0.99), rand(rng, 3, 4, lo=0, hi=1), rand(rng, 4, lo=0, hi=2)
    ref = F.binary_cross_entropy(t64(a), t64(b), weight=t64(w))
    check(backend_target.binary_cross_entropy(a, b, weight=w), ref.numpy(), "bce weight")


@pytest.mark.parametrize("shape", [(1, 3, 32, 40), (2, 1, 11, 11), (3, 24, 17), (16, 20)])
def test_psnr_ssim(backend_target, shape):
    rng = np.random.default_rng(17)
    a = rand(rng, *shape, lo=0, hi=1)
    b = np.clip(a + rand(rng, *shape, lo=-0.1, hi=0.1), 0, 1).astype(np.float32)
    mse = F.mse_loss(t64(a), t64(b))
    check(backend_target.psnr(a, b), (10 * torch.log10(1.0 / mse)).numpy(), "psnr")
    check(backend_target.psnr(a, b, data_range=2.0), (10 * torch.log10(4.0 / mse)).numpy(), "psnr range 2")
    check(backend_target.ssim(a, b), ref_ssim(a, b).numpy(), f"ssim {shape}")
    check(backend_target.ssim(a, b, window_size=7, sigma=1.0), ref_ssim(a, b, win=7, sigma=1.0).numpy(), "ssim w7")
    s = backend_target.ssim(a, a)
    assert abs(float(np.asarray(s)) - 1.0) < 1e-6


# ---------------------------------------------------------------------------------------------
# contract properties: kinds, dtypes, NaN/Inf, no writes into inputs
# ---------------------------------------------------------------------------------------------
def test_result_kind_follows_first_input(backend_target):
    rng = np.random.default_rng(0)
    x, w = rand(rng, 1, 2, 5, 5), rand(rng, 3, 2, 3, 3)
    y = backend_target.conv2d(x, torch.from_numpy(w))
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    y = backend_target.conv2d(torch.from_numpy(x), w)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.device.type == "cpu"
    for full in (backend_target.sum(torch.from_numpy(x)), backend_target.mse_loss(torch.from_numpy(x), x)):
        assert isinstance(full, torch.Tensor) and full.shape == (), "a full reduction of a tensor is 0-d"
    assert backend_target.sum(x).shape == ()
    native = backend_target.to_device(x)
    y = backend_target.relu(native)
    assert type(y) is type(native)
    np.testing.assert_array_equal(backend_target.to_numpy(y), np.maximum(x, 0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "int32", "uint8", "bool"])
def test_other_dtypes_become_float32(backend_target, dtype):
    """float64, integer and bool inputs compute and return float32; float16 and bfloat16 keep their
    dtype (the half-precision step: test_dtypes.py holds them to their tolerances), a host float16 array too."""
    x = torch.arange(-6, 6).reshape(3, 4)
    x = (x > 0) if dtype == "bool" else (x.abs() if dtype == "uint8" else x).to(getattr(torch, dtype))
    y = backend_target.mul(x, 2.0)
    assert y.dtype == (x.dtype if dtype in ("float16", "bfloat16") else torch.float32)
    np.testing.assert_array_equal(y.float().numpy(), x.float().numpy() * 2)
    y = backend_target.add(x.numpy() if dtype != "bfloat16" else x.float().numpy(), 1.0)
    assert y.dtype == (np.float16 if dtype == "float16" else np.float32)


def _same_specials(y, ref32, ref64):
    """NaN/Inf where torch's float32 result has them; positions where torch's own float32 and float64
    paths disagree (e.g. its vectorised CPU gelu(+inf) = NaN, float64 gives inf) accept either."""
    y = np.asarray(y.numpy() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
    r32, r64 = ref32.double().numpy(), ref64.numpy()
    agree = (np.isnan(r32) == np.isnan(r64)) & (np.isinf(r32) == np.isinf(r64))
    for name, fn in (("NaN", np.isnan), ("Inf", np.isinf)):
        bad = agree & (fn(y) != fn(r32))
        assert not bad.any(), f"{name} positions differ from torch at {np.argwhere(bad).tolist()}: {y} vs {r32}"
    inf = agree & np.isinf(r32)
    assert (y[inf] == r32[inf]).all(), "Inf signs differ from torch"


@pytest.mark.parametrize("coutg", [3, 24], ids=["direct", "gemm"])
def test_transposed_conv_inf_weight_like_torch(backend_target, coutg):
    """An Inf/NaN weight in a strided transposed conv reaches only the outputs its tap lands on (torch
    scatters products; it never multiplies the weight by the zeros between strides)."""
    if backend_target.name == "torch-cuda":
        pytest.skip("torch-cuda is cuDNN itself, whose transposed conv multiplies the weight by the stride's zeros")
    rng = np.random.default_rng(9)
    x = (rng.random((2, 8, 5, 6)) + 0.5).astype(np.float32)  # no zeros: 0 * Inf would be NaN anyway
    for bad in (np.inf, np.nan):
        w = rand(rng, 8, coutg, 3, 3)
        w[2, 1, 0, 0] = bad
        kw = dict(stride=2, padding=1, output_padding=1)
        y = backend_target.conv_transpose2d(x, w, **kw)
        _same_specials(y, F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), **kw),
                       F.conv_transpose2d(t64(x), t64(w), **kw))


def test_nan_inf_propagate_like_torch(backend_target):
    x = np.array([[np.nan, -np.inf, -1.0, 0.0, 2.0, np.inf]], dtype=np.float32)
    t32 = torch.from_numpy(x)
    t64_ = t32.double()
    be = backend_target
    for op, params in [("relu", {}), ("abs", {}), ("exp", {}), ("sigmoid", {}), ("tanh", {}), ("gelu", {}),
                       ("silu", {}), ("elu", {}), ("leaky_relu", {}), ("softplus", {}),
                       ("clamp", {"min": -0.5, "max": 0.5}), ("neg", {}), ("log", {}), ("sqrt", {}),
                       ("rsqrt", {}), ("erf", {}), ("sin", {}), ("cos", {})]:
        _same_specials(be.unary(op, x, **params), torch_unary(op, t32, params), torch_unary(op, t64_, params))
    other = np.array([[1.0, np.nan, 0.5, -2.0, np.inf, 1.0]], dtype=np.float32)
    for op in ["minimum", "maximum", "add", "mul", "div", "pow", "sub"]:
        fn = getattr(torch, op)
        o = torch.from_numpy(other)
        _same_specials(be.binary(op, x, other), fn(t32, o), fn(t64_, o.double()))
    for op, tfn in [("sum", torch.sum), ("max", torch.amax), ("min", torch.amin), ("mean", torch.mean)]:
        for sl in (slice(None), slice(2, 5), slice(1, 4)):
            _same_specials(be.reduce(op, x[:, sl], 1), tfn(t32[:, sl], dim=1), tfn(t64_[:, sl], dim=1))
    img = np.ones((1, 1, 5, 5), np.float32)
    img[0, 0, 2, 2] = np.nan
    img[0, 0, 0, 0] = np.inf
    k = torch.ones(1, 1, 3, 3)
    _same_specials(be.conv2d(img, k.numpy(), padding=1), F.conv2d(torch.from_numpy(img), k, padding=1),
                   F.conv2d(t64(img), k.double(), padding=1))
    # many channels, 3x3: the Winograd paths must not turn an Inf into NaNs around it
    rng = np.random.default_rng(4)
    big = rand(rng, 1, 32, 9, 9)
    big[0, 3, 4, 4], big[0, 5, 1, 7], big[0, 7, 6, 2] = np.inf, -np.inf, np.nan
    kb = rand(rng, 32, 32, 3, 3)
    _same_specials(be.conv2d(big, kb, padding=1), F.conv2d(torch.from_numpy(big), torch.from_numpy(kb), padding=1),
                   F.conv2d(t64(big), t64(kb), padding=1))
    kb[1, 2, 0, 0] = np.inf
    _same_specials(be.conv2d(big[:, :, :, :5], kb), F.conv2d(torch.from_numpy(big[:, :, :, :5]), torch.from_numpy(kb)),
                   F.conv2d(t64(big[:, :, :, :5]), t64(kb)))
    # Inf/NaN in the weights with zero padding: torch (float64) multiplies them by the padded zeros
    for c, k, p in [(3, 3, 1), (8, 5, 2), (32, 3, 1)]:
        for bad in (np.nan, -np.inf, np.inf):
            xi = rand(rng, 1, c, 10, 30)  # 30 wide: the OpenCL CPU family takes its direct kernel
            wi = rand(rng, 4, c, k, k)
            wi[1, 0, 0, 0] = bad
            _same_specials(be.conv2d(xi, wi, padding=p), F.conv2d(torch.from_numpy(xi), torch.from_numpy(wi), padding=p),
                           F.conv2d(t64(xi), t64(wi), padding=p))
    _same_specials(be.matmul(x, other.T), t32 @ torch.from_numpy(other).T, t64_ @ torch.from_numpy(other).double().T)
    for sl in (slice(2, 5), slice(0, 3), slice(3, 6)):
        _same_specials(be.softmax(x[:, sl], -1), F.softmax(t32[:, sl], -1), F.softmax(t64_[:, sl], -1))


@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_no_op_writes_into_inputs(backend_target, as_torch):
    rng = np.random.default_rng(9)
    mk = (lambda a: torch.from_numpy(a)) if as_torch else (lambda a: a)
    x, w, b = mk(rand(rng, 2, 4, 9, 8)), mk(rand(rng, 6, 2, 3, 3)), mk(rand(rng, 6))
    wt = mk(rand(rng, 4, 3, 3, 3))
    m1, m2, v = mk(rand(rng, 3, 5)), mk(rand(rng, 5, 4)), mk(rand(rng, 4))
    lw = mk(rand(rng, 4, 5))
    p = mk(rand(rng, 2, 4, 9, 8, lo=0.01, hi=0.99))
    q = mk(rand(rng, 2, 4, 9, 8, lo=0, hi=1))
    nw, nb = mk(rand(rng, 9, 8)), mk(rand(rng, 9, 8))
    inputs = [x, w, b, wt, m1, m2, v, p, q, lw, nw, nb]
    before = _snapshot(*inputs)
    be = backend_target
    outs = [
        be.conv2d(x, w, b, padding=1, groups=2), be.conv2d(x, w, b, padding=2, groups=2, padding_mode="reflect"),
        be.conv_transpose2d(x, wt, None, 2, 1, 1), be.matmul(m1, m2), be.linear(m1, lw), be.linear(m1, lw, v),
        be.relu(x), be.clamp(x, -0.1, 0.1), be.clamp(x, min=-10.0), be.softmax(x, 1), be.add(x, 1.0), be.mul(x, x),
        be.maximum(x, 0.0), be.sum(x, (1, 2)), be.max(x, -1), be.mse_loss(x, p), be.l1_loss(x, q),
        be.smooth_l1_loss(x, q), be.huber_loss(x, p), be.binary_cross_entropy(p, q), be.psnr(p, q), be.ssim(p, q, window_size=5),
        be.pad(x, (1, 1, 1, 1), "replicate"), be.abs(x), be.sum(x, ()), be.rsqrt(p), be.erf(x), be.sin(x),
        be.cos(x), be.var(x, 1), be.std(x, (2, 3), correction=0), be.var(x, ()), be.log_softmax(x, 1),
        be.layer_norm(x, (9, 8), nw, nb), be.layer_norm(x, 8), be.group_norm(x, 2, v, v), be.group_norm(x, 4),
        be.rms_norm(x, (9, 8), nw), be.rms_norm(x, 8),
    ]
    _assert_unchanged(before, inputs)
    # results must not alias inputs either (a caller may write into a result)
    for o in outs:
        for i in inputs:
            if isinstance(o, np.ndarray) and isinstance(i, np.ndarray):
                assert not np.shares_memory(o, i), "a result shares memory with an input"
            if isinstance(o, torch.Tensor) and isinstance(i, torch.Tensor):
                assert o.data_ptr() != i.data_ptr() or o.numel() == 0, "a result shares memory with an input"


def test_edge_shapes_like_torch(backend_target):
    """0-d, empty and negative-stride inputs (found in review) behave as in torch."""
    be = backend_target
    assert float(np.asarray(be.to_numpy(be.softmax(np.float32(2.0) * np.ones((), np.float32), 0)))) == 1.0
    assert be.softmax(np.zeros((3, 0, 4), np.float32), 1).shape == (3, 0, 4)
    assert np.isnan(float(np.asarray(be.binary_cross_entropy(np.zeros(0, np.float32), np.zeros(0, np.float32)))))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for dim in ([], ()):  # torch reads an empty dim list as "all dims"
        y = be.sum(x, dim)
        assert y.shape == () and float(y) == 15.0
    assert be.conv2d(np.zeros((0, 2, 5, 5), np.float32), np.ones((4, 2, 3, 3), np.float32)).shape == (0, 4, 3, 3)
    assert be.conv_transpose2d(np.zeros((0, 4, 4, 5), np.float32), np.ones((4, 3, 3, 3), np.float32)).shape == (0, 3, 6, 7)
    flipped = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]
    np.testing.assert_array_equal(be.relu(flipped), flipped)
    np.testing.assert_array_equal(be.linear(np.ones((3, 4), np.float32), np.ones(4, np.float32), np.float32(1.0) * np.ones((), np.float32)),
                                  np.full(3, 5.0, np.float32))
