"""Gradient checks of the layer, window, data-movement, dropout and attention ops (issue 13):
every rule of backend/learn/autograd/rules_layers.py against torch's float64 autograd (check_grad)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from anydevice.backend import AnyDeviceError
from anydevice.backend.learn import autograd as ag
from anydevice.backend.learn.autograd import rules_layers
from grad_check import check_grad


def _r(*shape, seed=10):  # (check_grad draws its output gradient with seed 0)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ties(*shape, seed=10, levels=3):
    """Small integers: many ties in every pooling window (the first maximum must win)."""
    return np.random.default_rng(seed).integers(0, levels, shape).astype(np.float32)


# ---- normalisations -------------------------------------------------------------------------
@pytest.mark.parametrize("ns,affine", [((5,), True), ((3, 5), True), ((5,), False), (5, "weight")])
def test_layer_norm(backend_target, ns, affine):
    x = _r(2, 3, 5) * 3 + 1
    shape = (ns,) if isinstance(ns, int) else ns
    t = {"input": x}
    if affine:
        t["weight"] = _r(*shape, seed=1)
        if affine is True:
            t["bias"] = _r(*shape, seed=2)
    check_grad(backend_target, "layer_norm", t, TF.layer_norm, {"normalized_shape": ns, "eps": 1e-4},
               torch_kwargs={"normalized_shape": shape})


@pytest.mark.parametrize("shape,groups,affine", [((2, 6, 3, 4), 3, True), ((2, 4, 5), 2, False), ((3, 4), 2, True)])
def test_group_norm(backend_target, shape, groups, affine):
    t = {"input": _r(*shape) * 2 - 1}
    if affine:
        t["weight"], t["bias"] = _r(shape[1], seed=1), _r(shape[1], seed=2)
    check_grad(backend_target, "group_norm", t, TF.group_norm, {"num_groups": groups, "eps": 1e-5})


@pytest.mark.parametrize("ns,weight,eps", [((6,), True, None), ((4, 6), True, 1e-3), ((6,), False, 1e-6)])
def test_rms_norm(backend_target, ns, weight, eps):
    t = {"input": _r(3, 4, 6)}
    if weight:
        t["weight"] = _r(*ns, seed=1)
    # eps None: float32's epsilon here (the pack computes in float32); torch's float64 run needs it spelt out
    check_grad(backend_target, "rms_norm", t, TF.rms_norm, {"normalized_shape": ns, "eps": eps},
               torch_kwargs={"eps": float(np.finfo(np.float32).eps) if eps is None else eps})


def _bn_stats(c, seed=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(c).astype(np.float32), (rng.random(c) + 0.5).astype(np.float32)


@pytest.mark.parametrize("shape", [(4, 3, 2, 2), (5, 3)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("stats", [True, False])
def test_batch_norm_training(backend_target, shape, affine, stats):
    c = shape[1]
    rm, rv = _bn_stats(c)
    t = {"input": _r(*shape) * 2 + 0.5, "running_mean": rm if stats else None, "running_var": rv if stats else None}
    if affine:
        t["weight"], t["bias"] = _r(c, seed=1), _r(c, seed=2)
    t = {k: v for k, v in t.items() if v is not None}
    params = {"training": True, "momentum": 0.2, "eps": 1e-4}
    if not stats:
        params.update(running_mean=None, running_var=None)
    wrt = [k for k in ("input", "weight", "bias") if k in t]
    check_grad(backend_target, "batch_norm", t, TF.batch_norm, params, wrt=wrt)


def test_batch_norm_return_stats(backend_target):
    """return_stats=True: (y, new running mean, new running var); only y carries a gradient."""
    rm, rv = _bn_stats(3)

    def ref(input, running_mean, running_var, weight, bias, training, momentum, eps, return_stats):
        rm_, rv_ = running_mean.detach().clone(), running_var.detach().clone()
        y = TF.batch_norm(input, rm_, rv_, weight, bias, training, momentum, eps)
        return y, rm_, rv_

    check_grad(backend_target, "batch_norm",
               {"input": _r(4, 3, 3, 2), "running_mean": rm, "running_var": rv, "weight": _r(3, seed=1),
                "bias": _r(3, seed=2)}, ref,
               {"training": True, "momentum": 0.1, "eps": 1e-5, "return_stats": True},
               wrt=["input", "weight", "bias"])


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_eval(backend_target, affine):
    """Evaluation mode: also the gradients of the running statistics (torch refuses those; the
    reference is the formula (x - mean) / sqrt(var + eps) * w + b)."""
    rm, rv = _bn_stats(3)
    t = {"input": _r(2, 3, 4, 2), "running_mean": rm, "running_var": rv}
    if affine:
        t["weight"], t["bias"] = _r(3, seed=1), _r(3, seed=2)

    def ref(input, running_mean, running_var, weight=None, bias=None, training=False, eps=1e-5):
        per = (1, -1, 1, 1)
        y = (input - running_mean.reshape(per)) / torch.sqrt(running_var.reshape(per) + eps)
        if weight is not None:
            y = y * weight.reshape(per) + bias.reshape(per)
        return y

    check_grad(backend_target, "batch_norm", t, ref, {"training": False, "eps": 1e-3})


# ---- window ops -----------------------------------------------------------------------------
@pytest.mark.parametrize("params", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 1, "padding": 1},
    {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 2, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True},
])
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool2d(backend_target, params, ties):
    x = _ties(2, 2, 7, 6) if ties else _r(2, 2, 7, 6)
    check_grad(backend_target, "max_pool2d", {"input": x}, TF.max_pool2d, params)


def test_max_pool2d_nan_inf_and_unbatched(backend_target):
    """torch's tap: the last NaN of a window holding NaN; the first valid tap of an all -inf window
    (padding never); an unbatched (C, H, W) input."""
    x = _ties(2, 6, 6, seed=3)
    x[0, 1, 1] = x[0, 0, 2] = x[1, 4, 4] = np.nan
    x[1, 0:3, 0:3] = -np.inf
    for params in ({"kernel_size": 3, "stride": 1, "padding": 1}, {"kernel_size": (2, 3), "stride": 2}):
        check_grad(backend_target, "max_pool2d", {"input": x}, TF.max_pool2d, params)


@pytest.mark.parametrize("out", [(3, 2), 1, (5, None), (9, 4)])
def test_adaptive_max_pool2d(backend_target, out):
    x = _ties(2, 2, 6, 5, seed=4)
    x[1, 1, 2, 3] = np.nan
    check_grad(backend_target, "adaptive_max_pool2d", {"input": x}, TF.adaptive_max_pool2d, {"output_size": out})
    check_grad(backend_target, "adaptive_max_pool2d", {"input": _r(2, 6, 5)}, TF.adaptive_max_pool2d,
               {"output_size": out})


@pytest.mark.parametrize("params", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 1), "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": 2, "stride": 1, "divisor_override": 3},
])
def test_avg_pool2d(backend_target, params):
    check_grad(backend_target, "avg_pool2d", {"input": _r(2, 2, 7, 6)}, TF.avg_pool2d, params)


@pytest.mark.parametrize("out", [(3, 2), 1, (4, None), (9, 7)])
def test_adaptive_avg_pool2d(backend_target, out):
    check_grad(backend_target, "adaptive_avg_pool2d", {"input": _r(2, 3, 6, 5)}, TF.adaptive_avg_pool2d,
               {"output_size": out})


@pytest.mark.parametrize("params", [
    {"size": (9, 4), "mode": "nearest"},
    {"scale_factor": 2, "mode": "nearest"},
    {"scale_factor": (0.5, 1.7), "mode": "nearest-exact"},
    {"size": (11, 3), "mode": "bilinear", "align_corners": False},
    {"size": (11, 3), "mode": "bilinear", "align_corners": True},
    {"scale_factor": 1.5, "mode": "bilinear", "recompute_scale_factor": True},
    {"scale_factor": (2.3, 0.6), "mode": "bilinear"},
    {"size": (9, 10), "mode": "bicubic", "align_corners": False},
    {"scale_factor": 0.7, "mode": "bicubic", "align_corners": True},
    {"size": (3, 2), "mode": "area"},
    {"scale_factor": 1.5, "mode": "area"},
])
def test_interpolate(backend_target, params):
    check_grad(backend_target, "interpolate", {"input": _r(2, 2, 6, 5)}, TF.interpolate, params)


@pytest.mark.parametrize("params", [
    {"size": 9, "mode": "nearest"},
    {"scale_factor": 0.6, "mode": "nearest-exact"},
    {"size": 11, "mode": "linear", "align_corners": True},
    {"scale_factor": 1.7, "mode": "linear"},
    {"size": 4, "mode": "area"},
])
def test_interpolate_1d(backend_target, params):
    check_grad(backend_target, "interpolate", {"input": _r(2, 3, 7)}, TF.interpolate, params)


def test_transpose_table_is_the_adjoint():
    """<W x, y> == <x, W^T y> for a table with repeated and skipped taps."""
    idx = np.array([[0, 0, -1], [2, 1, 3], [3, -1, -1]], np.int32)
    wgt = np.array([[0.25, 0.5, 9.0], [1.0, -2.0, 0.5], [3.0, 0.0, 0.0]], np.float32)
    tidx, twgt = rules_layers.transpose_table(idx, wgt, 5)
    W = np.zeros((3, 5))
    for o in range(3):
        for i, w in zip(idx[o], wgt[o]):
            if i >= 0:
                W[o, i] += w
    WT = np.zeros((5, 3))
    for i in range(5):
        for o, w in zip(tidx[i], twgt[i]):
            if o >= 0:
                WT[i, o] += w
    np.testing.assert_allclose(WT, W.T)
    assert (tidx[4] == -1).all()


# ---- data movement --------------------------------------------------------------------------
def test_reshape_permute_transpose(backend_target):
    be = backend_target
    x = _r(2, 3, 4)
    check_grad(be, "reshape", {"input": x}, torch.reshape, {"shape": (4, -1)})
    check_grad(be, "permute", {"input": x}, torch.permute, {"dims": (2, 0, 1)})
    check_grad(be, "permute", {"input": x}, torch.permute, {"dims": (-1, -2, 0)})
    check_grad(be, "transpose", {"input": x}, torch.transpose, {"dim0": 0, "dim1": -1})
    check_grad(be, "contiguous", {"input": x}, lambda input: input.contiguous())


def test_broadcast_to(backend_target):
    check_grad(backend_target, "broadcast_to", {"input": _r(3, 1)}, torch.broadcast_to, {"size": (2, 3, 4)})
    check_grad(backend_target, "broadcast_to", {"input": _r(1, 4)}, torch.broadcast_to, {"size": (-1, 4)})


def _star_args_supported(be):
    try:
        ag.apply("view", ag.Var(be, np.ones((2, 3), np.float32), requires_grad=True), (6,))
        return True
    except AnyDeviceError as exc:
        return "*args" not in str(exc)


def test_view_expand_rules(backend_target):
    """view / expand (ops with *shape): the rules on a hand-made context; through the tape too
    once the tape passes *args (docs/notes/gradlayers.md)."""
    be = backend_target
    x, gy = _r(2, 3), _r(3, 2, seed=1)
    ctx = ag.Ctx(be, "view", {"input": be.to_device(x), "shape": ((3, 2),)}, None, {"input": True})
    g = ag.RULES["view"](ctx, be.to_device(gy))["input"]
    np.testing.assert_array_equal(be.to_numpy(g), gy.reshape(2, 3))
    gy2 = _r(4, 2, 3, seed=2)
    ctx = ag.Ctx(be, "expand", {"input": be.to_device(_r(2, 1)), "sizes": (4, 2, 3)}, None, {"input": True})
    g = ag.sum_to(be, ag.RULES["expand"](ctx, be.to_device(gy2))["input"], (2, 1))
    np.testing.assert_allclose(be.to_numpy(g), gy2.sum(axis=(0, 2)).reshape(2, 1), rtol=1e-6)
    if not _star_args_supported(be):
        pytest.skip("the tape refuses ops taking *args (view, expand): see docs/notes/gradlayers.md")
    X = ag.Var(be, x, requires_grad=True)
    gx, = ag.grad(ag.apply("view", X, (3, 2)), [X], gradient=gy)
    np.testing.assert_array_equal(be.to_numpy(gx), gy.reshape(2, 3))
    X = ag.Var(be, _r(2, 1), requires_grad=True)
    gx, = ag.grad(ag.apply("expand", X, (4, 2, 3)), [X], gradient=gy2)
    np.testing.assert_allclose(be.to_numpy(gx), gy2.sum(axis=(0, 2)).reshape(2, 1), rtol=1e-6)


def _torch_slice(input, dim, start, stop, step):
    return input[(slice(None),) * dim + (slice(start, stop, step),)]


@pytest.mark.parametrize("dim,start,stop,step", [(0, 1, 4, 1), (1, None, None, 2), (2, 1, None, 3), (1, -3, 5, 2),
                                                 (2, 4, 4, 1), (0, 2, None, 1)])
def test_slice(backend_target, dim, start, stop, step):
    check_grad(backend_target, "slice", {"input": _r(4, 5, 6)}, _torch_slice,
               {"dim": dim, "start": start, "stop": stop, "step": step})


@pytest.mark.parametrize("dim,start,length", [(0, 1, 2), (1, -3, 2), (2, 0, 6), (1, 2, 0)])
def test_narrow(backend_target, dim, start, length):
    check_grad(backend_target, "narrow", {"input": _r(3, 5, 6)}, torch.narrow,
               {"dim": dim, "start": start, "length": length})


def test_cat_stack(backend_target):
    be = backend_target
    parts = [_r(2, 3, seed=0), _r(2, 1, seed=1), _r(2, 4, seed=2)]
    check_grad(be, "cat", {"tensors": parts}, lambda tensors, dim: torch.cat(tensors, dim), {"dim": 1})
    check_grad(be, "cat", {"tensors": [_r(2, 3), _r(1, 3, seed=1)]}, lambda tensors, dim: torch.cat(tensors, dim),
               {"dim": -2})
    check_grad(be, "cat", {"tensors": [_r(2, 3), np.zeros((0,), np.float32), _r(1, 3, seed=1)]},
               lambda tensors, dim: torch.cat(tensors, dim), {"dim": 0})
    same = [_r(2, 3, seed=i) for i in range(3)]
    for d in (0, 1, 2, -1):
        check_grad(be, "stack", {"tensors": same}, lambda tensors, dim: torch.stack(tensors, dim), {"dim": d})


def test_split_chunk(backend_target):
    be = backend_target
    x = _r(7, 4)
    check_grad(be, "split", {"tensor": x}, torch.split, {"split_size_or_sections": 3, "dim": 0})
    check_grad(be, "split", {"tensor": x}, torch.split, {"split_size_or_sections": [1, 3], "dim": 1})
    check_grad(be, "chunk", {"input": x}, torch.chunk, {"chunks": 3, "dim": 0})
    check_grad(be, "chunk", {"input": x}, torch.chunk, {"chunks": 2, "dim": -1})
    check_grad(be, "chunk", {"input": x}, torch.chunk, {"chunks": 1, "dim": 0})  # one part
    check_grad(be, "split", {"tensor": x}, torch.split, {"split_size_or_sections": 4, "dim": 1})


def test_split_unused_part(backend_target):
    """A part the loss never uses gets a zero gradient."""
    be = backend_target
    X = ag.Var(be, _r(6, 2), requires_grad=True)
    a, b, c = ag.apply("chunk", X, 3, 0)
    ag.apply("sum", b).backward()
    want = np.zeros((6, 2), np.float32)
    want[2:4] = 1
    np.testing.assert_array_equal(be.to_numpy(X.grad), want)


def test_where(backend_target):
    be = backend_target
    c = np.random.default_rng(3).random((3, 4)) > 0.5
    check_grad(be, "where", {"condition": c, "input": _r(3, 4), "other": _r(1, 4, seed=1)}, torch.where)
    check_grad(be, "where", {"condition": c, "input": _r(4, seed=2), "other": _r(3, 4, seed=1)}, torch.where)
    check_grad(be, "where", {"condition": c.astype(np.float32), "input": _r(3, 4)},
               lambda condition, input, other: torch.where(condition != 0, input, other), {"other": 0.5},
               wrt=["input"])


# ---- dropout --------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.3, 0.0, 1.0])
def test_dropout_seeded(backend_target, p):
    x = _r(4, 5)

    def ref(input, p, training, seed):
        return input * torch.tensor(rules_layers.dropout_noise(tuple(input.shape), p, seed).astype(np.float64))

    check_grad(backend_target, "dropout", {"input": x}, ref, {"p": p, "training": True, "seed": 7})
    check_grad(backend_target, "dropout", {"input": x}, lambda input, p, training, seed: input * 1.0,
               {"p": p, "training": False, "seed": None})


def test_dropout_unseeded_reads_the_mask_back(backend_target):
    be = backend_target
    x = _r(6, 7) + 0.01
    X = ag.Var(be, x, requires_grad=True)
    y = ag.apply("dropout", X, 0.4)
    gy = _r(6, 7, seed=1)
    gx, = ag.grad(y, [X], gradient=gy)
    kept = y.numpy() != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(be.to_numpy(gx), gy * kept / np.float32(0.6), rtol=1e-6)


# ---- attention ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["plain", "float_mask", "bool_mask", "causal", "causal_rect", "scale",
                                  "broadcast", "gqa", "masked_row"])
def test_sdpa(backend_target, case):
    q, k, v = _r(2, 2, 5, 4), _r(2, 2, 6, 4, seed=1), _r(2, 2, 6, 3, seed=2)
    t = {"query": q, "key": k, "value": v}
    params = {}
    if case == "float_mask":
        t["attn_mask"] = _r(5, 6, seed=3)
    elif case == "bool_mask":
        m = np.random.default_rng(4).random((2, 1, 5, 6)) > 0.4
        m[..., 0] = True
        t["attn_mask"] = m
    elif case == "masked_row":  # a row without keys: zeros out, zero gradients
        m = np.random.default_rng(4).random((1, 5, 6)) > 0.4
        m[:, 2] = False
        m[:, 3, 1] = True
        t["attn_mask"] = m
    elif case == "causal":
        t["key"], t["value"] = _r(2, 2, 5, 4, seed=1), _r(2, 2, 5, 3, seed=2)
        params["is_causal"] = True
    elif case == "causal_rect":
        params["is_causal"] = True
    elif case == "scale":
        params["scale"] = 0.7
        t["attn_mask"] = _r(2, 1, 1, 6, seed=3)
    elif case == "broadcast":
        t["key"], t["value"] = _r(1, 2, 6, 4, seed=1), _r(2, 6, 3, seed=2)
    elif case == "gqa":
        t["query"] = _r(2, 4, 5, 4)
        params["enable_gqa"] = True
    check_grad(backend_target, "scaled_dot_product_attention", t, TF.scaled_dot_product_attention, params)


def test_sdpa_blocks(backend_target, monkeypatch):
    """The backward recomputes the scores a block of query rows at a time, as the forward."""
    be = backend_target
    monkeypatch.setattr(type(be), "attention_block_bytes", 4 * 2 * 6 * 2, raising=False)
    check_grad(be, "scaled_dot_product_attention",
               {"query": _r(2, 7, 4), "key": _r(2, 6, 4, seed=1), "value": _r(2, 6, 3, seed=2),
                "attn_mask": _r(7, 6, seed=3)}, TF.scaled_dot_product_attention)
    check_grad(be, "scaled_dot_product_attention",
               {"query": _r(2, 7, 4), "key": _r(2, 6, 4, seed=1), "value": _r(2, 6, 3, seed=2)},
               TF.scaled_dot_product_attention, {"is_causal": True})


def test_sdpa_unbatched(backend_target):
    check_grad(backend_target, "scaled_dot_product_attention",
               {"query": _r(5, 4), "key": _r(6, 4, seed=1), "value": _r(6, 2, seed=2), "attn_mask": _r(5, 6, seed=3)},
               TF.scaled_dot_product_attention)


@pytest.mark.parametrize("op,params,torch_fn", [
    ("max_pool2d", {"kernel_size": 2}, TF.max_pool2d),
    ("avg_pool2d", {"kernel_size": 2}, TF.avg_pool2d),
    ("adaptive_max_pool2d", {"output_size": 2}, TF.adaptive_max_pool2d),
    ("interpolate", {"scale_factor": 2, "mode": "bilinear"}, TF.interpolate),
    ("group_norm", {"num_groups": 1}, TF.group_norm),
])
def test_empty_batch(backend_target, op, params, torch_fn):
    """An empty batch: empty gradients of the input's shape."""
    check_grad(backend_target, op, {"input": np.zeros((0, 2, 4, 4), np.float32)}, torch_fn, params)


def test_chain_stays_native(backend_target):
    """Rules compose through the tape, and every gradient is the backend's own array (nothing
    comes back to the host on the way)."""
    be = backend_target
    x, w, b = _r(2, 3, 8, 8), _r(3, seed=1), _r(3, seed=2)
    mask = np.random.default_rng(5).random((1, 3, 8, 8)) > 0.3
    gy = _r(2, 3, 8, 16, seed=3)
    X, W, B = (ag.Var(be, a, requires_grad=True) for a in (x, w, b))
    h = ag.F.batch_norm(X, None, None, W, B, training=True)
    h = ag.F.max_pool2d(h, 3, stride=2, padding=1)
    h = ag.F.interpolate(h, scale_factor=2, mode="bilinear")
    h = ag.F.where(mask, h, 0.5)
    h = ag.F.cat([h, ag.F.slice(h, 3, 1, None, 1)], dim=3)
    h = ag.F.narrow(ag.F.layer_norm(h, (15,)), 3, 0, 15)
    h = ag.F.cat([h, ag.F.transpose(ag.F.reshape(h, (2, 3, 15, 8)), 2, 3)], dim=3)
    h = ag.F.narrow(h, 3, 0, 16)
    grads = ag.grad(h, [X, W, B], gradient=gy)
    t = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w, b)]
    r = TF.batch_norm(t[0], None, None, t[1], t[2], training=True)
    r = TF.interpolate(TF.max_pool2d(r, 3, stride=2, padding=1), scale_factor=2, mode="bilinear")
    r = torch.where(torch.tensor(mask), r, 0.5)
    r = torch.cat([r, r[..., 1:]], dim=3)
    r = TF.layer_norm(r, (15,))[..., :15]
    r = torch.cat([r, r.reshape(2, 3, 15, 8).transpose(2, 3)], dim=3)[..., :16]
    ref = torch.autograd.grad(r, t, torch.tensor(gy.astype(np.float64)))
    for g, tg in zip(grads, ref):
        if be.native_types:
            assert isinstance(g, be.native_types) and not (isinstance(g, np.ndarray)
                                                           and not getattr(g, "_anydevice_native", True))
        np.testing.assert_allclose(be.to_numpy(g), tg.numpy(), rtol=2e-4, atol=2e-5)
