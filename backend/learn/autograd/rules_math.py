"""A pure table: the backward rules of the elementwise ops, reductions, activations, softmax and losses.

Each rule: ``fn(ctx, gy) -> {argument name: gradient}`` (tape.py). Gradients are computed with
the contract's own public ops on native arrays (``be.mul(a, b)``...), so they stay on the device.
Broadcast gradients may be returned at the output's shape: the tape sums them down.

The formulas are torch's own (``tools/autograd/derivatives.yaml`` and ``FunctionsManual.cpp``),
including their choices at the edges: relu's, abs's and clamp's masks (0 gradient at relu(0), at
abs(0); clamp passes the gradient where min <= x <= max), the tie rules of minimum / maximum (half
to each side) and of amax / amin (split evenly among the tied maxima), pow's rules at 0, var's
NaN / Inf where the degrees of freedom are <= 0. Selections are made with ``be.where`` so an Inf or
NaN of the unselected side never leaks into a gradient (``0 * Inf``).

Dispatchers (``unary``, ``activation``, ``binary``, ``reduce``, ``loss``) use the rule of the op
they name. Gradients for a loss's ``weight``: binary_cross_entropy and probability-target
cross_entropy give it (torch's composite formula); nll_loss / class-index cross_entropy refuse it
(torch has no derivative for it either).
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from ...system.errors import AnyDeviceError
from ...ops.plans import UNARY_OPS, UNARY_PARAMS, normalize_dims
from .tape import Ctx, _signature, _tensorish, rule


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shape(be, x) -> tuple[int, ...]:
    return tuple(be._shape(x))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


_CONSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cached(be, key, make):
    """A constant native array, made (uploaded) once per backend and key."""
    table = _CONSTS.get(be)
    if table is None:
        table = _CONSTS[be] = {}
    v = table.get(key)
    if v is None:
        v = table[key] = be.to_device(make(), "backward", "constant", constant=True)
    return v


def _c(be, value: float):
    """A 0-d native constant, uploaded once per backend (a number given to ``be.where`` would be
    uploaded at every call)."""
    return _cached(be, ("scalar", repr(float(value))), lambda: np.asarray(value, np.float32))


def _sub_ctx(ctx: Ctx, op: str, args: dict, needs: dict | None = None) -> Ctx:
    """A Ctx for op ``op`` (a Backend method) from a dispatcher's arguments, defaults applied."""
    be = ctx.be
    bound = _signature(be, op).bind(**args)
    bound.apply_defaults()
    natives = {}
    for k, v in bound.arguments.items():
        natives[k] = be.to_device(v, op, k) if v is not None and not _num(v) and _tensorish(be, v) \
            and not isinstance(v, be.native_types) else v
    return Ctx(be, op, natives, ctx.out, dict(ctx.needs if needs is None else needs))


# ==== unary ops ================================================================================
def _sgn(be, x):
    """torch.sgn of a real tensor: 1, 0, -1 (0 for NaN, as torch's CPU sign)."""
    return be.sub(be.gt(x, 0.0), be.lt(x, 0.0))


_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_GELU_KAPPA = 0.044715


def _unary_grad(be, op: str, x, y, p: dict, gy):
    """d(op)/dx * gy, torch's formulas; ``y`` is the op's output, ``p`` its checked parameters."""
    if op == "abs":
        return be.mul(gy, _sgn(be, x))
    if op == "neg":
        return be.neg(gy)
    if op == "exp":
        return be.mul(gy, y)
    if op == "log":
        return be.div(gy, x)
    if op == "sqrt":
        return be.div(gy, be.mul(y, 2.0))
    if op == "relu":  # threshold_backward on the result: 0 where y <= 0 (NaN passes the gradient)
        return be.where(be.le(y, 0.0), _c(be, 0.0), gy)
    if op == "sigmoid":
        return be.mul(be.mul(gy, be.sub(1.0, y)), y)
    if op == "tanh":
        return be.mul(gy, be.sub(1.0, be.mul(y, y)))
    if op == "gelu":
        if p.get("approximate", "none") == "tanh":
            x2 = be.mul(x, x)
            inner = be.mul(be.add(x, be.mul(be.mul(x2, x), _GELU_KAPPA)), _GELU_BETA)
            th = be.tanh(inner)
            left = be.mul(x, 0.5)
            right = be.add(th, 1.0)
            left_d = be.mul(right, 0.5)
            right_d = be.sub(1.0, be.mul(th, th))
            inner_d = be.mul(be.add(be.mul(x2, 3.0 * _GELU_KAPPA), 1.0), _GELU_BETA)
            return be.mul(gy, be.add(left_d, be.mul(be.mul(left, right_d), inner_d)))
        cdf = be.mul(be.add(be.erf(be.div(x, _SQRT_2)), 1.0), 0.5)
        pdf = be.mul(be.exp(be.mul(be.mul(x, x), -0.5)), _INV_SQRT_2PI)
        return be.mul(gy, be.add(cdf, be.mul(x, pdf)))
    if op == "silu":
        s = be.sigmoid(x)
        return be.mul(be.mul(gy, s), be.add(be.mul(x, be.sub(1.0, s)), 1.0))
    if op == "elu":  # x <= 0: alpha * exp(x)
        alpha = float(p["alpha"])
        return be.where(be.le(x, 0.0), be.mul(be.mul(gy, alpha), be.exp(x)), gy)
    if op == "leaky_relu":
        return be.where(be.gt(x, 0.0), gy, be.mul(gy, float(p["negative_slope"])))
    if op == "softplus":  # x * beta > threshold: the identity's gradient; else sigmoid(beta x)
        bx = be.mul(x, float(p["beta"]))
        return be.where(be.gt(bx, float(p["threshold"])), gy, be.mul(gy, be.sigmoid(bx)))
    if op == "clamp":
        lo, hi = p.get("min"), p.get("max")
        mask = None
        if lo is not None:
            mask = be.ge(x, float(lo))
        if hi is not None:
            m = be.le(x, float(hi))
            mask = m if mask is None else be.mul(mask, m)
        if mask is None:
            return gy
        return be.where(mask, gy, _c(be, 0.0))
    if op == "rsqrt":
        return be.mul(be.mul(gy, -0.5), be.mul(be.mul(y, y), y))
    if op == "erf":
        return be.mul(gy, be.mul(be.exp(be.neg(be.mul(x, x))), 2.0 / math.sqrt(math.pi)))
    if op == "sin":
        return be.mul(gy, be.cos(x))
    if op == "cos":
        return be.mul(be.neg(gy), be.sin(x))
    raise AnyDeviceError("autograd", "op", op, "has no backward rule")


def _unary_params(op: str, given: dict) -> dict:
    p = dict(UNARY_PARAMS.get(op, {}))
    p.update(given or {})
    return p


def _make_unary_rule(op: str):
    def fn(ctx, gy):
        p = _unary_params(op, {k: ctx[k] for k in UNARY_PARAMS.get(op, {}) if k in ctx.args})
        return {"input": _unary_grad(ctx.be, op, ctx["input"], ctx.out, p, gy)}
    fn.__name__ = f"_{op}_backward"
    return fn


for _op in UNARY_OPS:
    rule(_op)(_make_unary_rule(_op))


@rule("unary")
def _unary(ctx, gy):
    op = ctx["op"]
    return {"input": _unary_grad(ctx.be, op, ctx["input"], ctx.out, _unary_params(op, ctx["params"]), gy)}


@rule("activation")
def _activation(ctx, gy):
    name, params = ctx["name"], dict(ctx["params"] or {})
    if name == "softmax":
        return _softmax(_sub_ctx(ctx, "softmax", {"input": ctx["input"], **params}), gy)
    return {"input": _unary_grad(ctx.be, name, ctx["input"], ctx.out, _unary_params(name, params), gy)}


# ==== binary ops ===============================================================================
def _binary_grads(be, op, a, b, out, gy, need_a, need_b):
    """(grad of a, grad of b) of ``op(a, b)``; a or b may be a Python number (no gradient)."""
    need_a = need_a and not _num(a)
    need_b = need_b and not _num(b)
    ga = gb = None
    if op == "add":
        ga, gb = (gy if need_a else None), (gy if need_b else None)
    elif op == "sub":
        ga, gb = (gy if need_a else None), (be.neg(gy) if need_b else None)
    elif op == "mul":
        ga = be.mul(gy, b) if need_a else None
        gb = be.mul(gy, a) if need_b else None
    elif op == "div":
        ga = be.div(gy, b) if need_a else None
        gb = be.mul(be.neg(gy), be.div(be.div(a, b), b)) if need_b else None
    elif op == "pow":
        if need_a:
            if _num(b):
                ga = _zeros_like(be, gy) if b == 0 else be.mul(gy, be.mul(be.pow(a, float(b) - 1.0), float(b)))
            else:
                ga = be.where(be.eq(b, 0.0), _c(be, 0.0), be.mul(gy, be.mul(b, be.pow(a, be.sub(b, 1.0)))))
        if need_b:
            if _num(a):
                la = math.log(a) if a > 0 else (-math.inf if a == 0 else math.nan)
                if a == 0:
                    gb = be.mul(gy, be.where(be.ge(b, 0.0), _c(be, 0.0), be.mul(out, la)))
                else:
                    gb = be.mul(gy, be.mul(out, la))
            else:
                cond = be.mul(be.eq(a, 0.0), be.ge(b, 0.0))
                gb = be.mul(gy, be.where(cond, _c(be, 0.0), be.mul(out, be.log(a))))
    elif op in ("maximum", "minimum"):
        half = be.where(be.eq(a, b), be.mul(gy, 0.5), gy)
        # maximum: a's gradient is 0 where a < b; minimum: where a > b
        a_loses, b_loses = (be.lt, be.gt) if op == "maximum" else (be.gt, be.lt)
        ga = be.where(a_loses(a, b), _c(be, 0.0), half) if need_a else None
        gb = be.where(b_loses(a, b), _c(be, 0.0), half) if need_b else None
    else:
        raise AnyDeviceError("autograd", "op", op, "has no backward rule")
    return ga, gb


def _zeros_like(be, x):
    z = _c(be, 0.0)
    return be.where(x, z, z)  # the condition only gives the shape


def _make_binary_rule(op: str, second: str):
    def fn(ctx, gy):
        ga, gb = _binary_grads(ctx.be, op, ctx["input"], ctx[second], ctx.out, gy,
                               ctx.needs.get("input"), ctx.needs.get(second))
        return {"input": ga, second: gb}
    fn.__name__ = f"_{op}_backward"
    return fn


for _op in ("add", "sub", "mul", "div", "minimum", "maximum"):
    rule(_op)(_make_binary_rule(_op, "other"))
rule("pow")(_make_binary_rule("pow", "exponent"))


@rule("binary")
def _binary(ctx, gy):
    ga, gb = _binary_grads(ctx.be, ctx["op"], ctx["input"], ctx["other"], ctx.out, gy,
                           ctx.needs.get("input"), ctx.needs.get("other"))
    return {"input": ga, "other": gb}


# ==== reductions ===============================================================================
def _keep(be, gy, shape, dims, keepdim):
    """A reduction's output (gradient) reshaped with the reduced dims kept (size 1)."""
    if keepdim:
        return gy
    dims = set(dims)
    return be.reshape(gy, tuple(1 if i in dims else n for i, n in enumerate(shape)))


def _reduce_grad(be, op, x, y, dim, keepdim, gy):
    shape = _shape(be, x)
    dims = normalize_dims(op, dim, len(shape))
    gk = _keep(be, gy, shape, dims, keepdim)
    if op == "sum":
        return be.expand(gk, *shape)
    if op == "mean":
        n = _numel(shape[d] for d in dims)
        return be.div(be.expand(gk, *shape), float(n))
    if op in ("max", "min"):  # amax / amin: split evenly among the ties (torch's scale_grad_by_count)
        mask = be.eq(x, _keep(be, y, shape, dims, keepdim))
        count = be.sum(mask, dim=dims, keepdim=True) if dims else mask
        return be.mul(be.div(gk, count), mask)
    raise AnyDeviceError("autograd", "op", op, "has no backward rule")


def _make_reduce_rule(op: str):
    def fn(ctx, gy):
        return {"input": _reduce_grad(ctx.be, op, ctx["input"], ctx.out, ctx["dim"], ctx["keepdim"], gy)}
    fn.__name__ = f"_{op}_backward"
    return fn


for _op in ("sum", "mean", "max", "min"):
    rule(_op)(_make_reduce_rule(_op))


@rule("reduce")
def _reduce(ctx, gy):
    return {"input": _reduce_grad(ctx.be, ctx["op"], ctx["input"], ctx.out, ctx["dim"], ctx["keepdim"], gy)}


def _var_grad(be, x, dim, correction, keepdim, gy):
    """torch's var_backward: 2 / (n - correction) * gy * (x - mean)."""
    shape = _shape(be, x)
    correction = 1.0 if correction is None else float(correction)
    all_dims = dim is None or len(shape) == 0 or (isinstance(dim, (tuple, list)) and len(dim) == 0)
    dims = normalize_dims("var", dim, len(shape))
    gk = _keep(be, gy, shape, dims, keepdim)
    d = be.sub(x, be.mean(x, dim=dims, keepdim=True)) if dims else be.sub(x, x)
    if dims:  # the corrected two-pass centring of the forward (layers._centered)
        d = be.sub(d, be.mean(d, dim=dims, keepdim=True))
    n = _numel(shape[i] for i in dims)
    dof = n - correction
    if all_dims and dof <= 0:  # torch: NaN where x is its mean (Inf * 0), else Inf
        return be.mul(gk, be.where(be.eq(d, 0.0), _c(be, math.nan), _c(be, math.inf)))
    factor = 2.0 / dof if dof != 0 else math.inf
    return be.mul(be.mul(gk, factor), d)


@rule("var")
def _var(ctx, gy):
    return {"input": _var_grad(ctx.be, ctx["input"], ctx["dim"], ctx["correction"], ctx["keepdim"], gy)}


@rule("std")
def _std(ctx, gy):
    be, y = ctx.be, ctx.out
    gv = be.where(be.eq(y, 0.0), _c(be, 0.0), be.div(gy, be.mul(y, 2.0)))
    return {"input": _var_grad(be, ctx["input"], ctx["dim"], ctx["correction"], ctx["keepdim"], gv)}


# ==== softmax ==================================================================================
def _sm_dim(be, x, dim) -> int:
    nd = len(_shape(be, x))
    return dim % nd if nd else 0


@rule("softmax")
def _softmax(ctx, gy):
    be, y = ctx.be, ctx.out
    d = _sm_dim(be, y, ctx["dim"])
    s = be.sum(be.mul(gy, y), dim=d, keepdim=True)
    return {"input": be.mul(y, be.sub(gy, s))}


@rule("log_softmax")
def _log_softmax(ctx, gy):
    be, y = ctx.be, ctx.out
    d = _sm_dim(be, y, ctx["dim"])
    return {"input": _log_softmax_grad(be, y, d, gy)}


def _log_softmax_grad(be, logp, d, g):
    return be.sub(g, be.mul(be.exp(logp), be.sum(g, dim=d, keepdim=True)))


# ==== losses ===================================================================================
def _scaled(be, gy, reduction, n):
    """gy divided by the element count for 'mean' (gy is 0-d for 'mean' / 'sum')."""
    return be.div(gy, float(n)) if reduction == "mean" else gy


def _pair(ctx, g):
    return {"input": g if ctx.needs.get("input") else None,
            "target": ctx.be.neg(g) if ctx.needs.get("target") else None}


def _diff(ctx):
    be = ctx.be
    d = be.sub(ctx["input"], ctx["target"])
    return be, d, _numel(_shape(be, d))


@rule("mse_loss")
def _mse(ctx, gy):
    be, d, n = _diff(ctx)
    return _pair(ctx, be.mul(be.mul(d, 2.0), _scaled(be, gy, ctx["reduction"], n)))


@rule("l1_loss")
def _l1(ctx, gy):
    be, d, n = _diff(ctx)
    return _pair(ctx, be.mul(_scaled(be, gy, ctx["reduction"], n), _sgn(be, d)))


@rule("smooth_l1_loss")
def _smooth_l1(ctx, gy):
    be, d, n = _diff(ctx)
    beta = float(ctx["beta"])
    g = _scaled(be, gy, ctx["reduction"], n)
    if beta == 0:  # torch: l1_loss
        return _pair(ctx, be.mul(g, _sgn(be, d)))
    return _pair(ctx, be.mul(be.div(be.clamp(d, -beta, beta), beta), g))


@rule("huber_loss")
def _huber(ctx, gy):
    be, d, n = _diff(ctx)
    delta = float(ctx["delta"])
    return _pair(ctx, be.mul(be.clamp(d, -delta, delta), _scaled(be, gy, ctx["reduction"], n)))


@rule("binary_cross_entropy")
def _bce(ctx, gy):
    be, x, t, w = ctx.be, ctx["input"], ctx["target"], ctx["weight"]
    n = _numel(_shape(be, x))
    g = _scaled(be, gy, ctx["reduction"], n)
    out = {}
    if ctx.needs.get("input"):
        gi = be.div(be.mul(g, be.sub(x, t)), be.maximum(be.mul(be.sub(1.0, x), x), 1e-12))
        out["input"] = gi if w is None else be.mul(gi, w)
    if ctx.needs.get("target"):  # -logit(x)
        gt = be.mul(g, be.neg(be.log(be.div(x, be.sub(1.0, x)))))
        out["target"] = gt if w is None else be.mul(gt, w)
    if ctx.needs.get("weight"):  # the unweighted per-element loss
        la = be.clamp(be.log(x), min=-100.0)
        l1a = be.clamp(be.log(be.sub(1.0, x)), min=-100.0)
        elem = be.neg(be.add(be.mul(t, la), be.mul(be.sub(1.0, t), l1a)))
        out["weight"] = be.mul(elem, g)
    return out


@rule("psnr")
def _psnr(ctx, gy):
    be, d, n = _diff(ctx)
    mse = be.div(be.sum(be.mul(d, d)), float(n))
    # y = 10 / ln10 * (2 ln r - ln mse): dy/dmse = -10 / (ln10 mse); dmse/dx = 2 d / n
    gm = be.div(be.mul(gy, -10.0 / math.log(10.0)), mse)
    return _pair(ctx, be.mul(d, be.mul(gm, 2.0 / n)))


@rule("ssim")
def _ssim(ctx, gy):
    """The analytic gradient of mean(ssim map): the map's derivatives with respect to the five
    blurred planes (mu_x, mu_y, E[xx], E[yy], E[xy]), back through the separable Gaussian blur
    (its transpose: conv_transpose2d with the same taps) and the products x*x, y*y, x*y.

    Done in groups of whole planes of ``contract.ssim_chunk_elements`` elements (as the forward's
    chunks) so the scratch stays a fraction of the inputs; one plane larger than that is one piece."""
    from ...ops import contract
    be, a, b = ctx.be, ctx["input"], ctx["target"]
    shape = _shape(be, a)
    ws, sigma, rng = int(ctx["window_size"]), float(ctx["sigma"]), float(ctx["data_range"])
    consts = ((float(ctx["k1"]) * rng) ** 2, (float(ctx["k2"]) * rng) ** 2)
    h, w = shape[-2:]
    planes = _numel(shape[:-2])
    oh, ow = h - ws + 1, w - ws + 1
    g = contract.gaussian_window(ws, sigma).astype(np.float32)
    wv = _cached(be, ("ssim_v", ws, sigma),
                 lambda: np.ascontiguousarray(np.broadcast_to(g.reshape(1, 1, -1, 1), (5, 1, ws, 1))))
    wh = _cached(be, ("ssim_h", ws, sigma),
                 lambda: np.ascontiguousarray(np.broadcast_to(g.reshape(1, 1, 1, -1), (5, 1, 1, ws))))
    x = be.reshape(a, (planes, 1, h, w))
    y = be.reshape(b, (planes, 1, h, w))
    gs = be.div(gy, float(planes * oh * ow))          # d mean / d map
    need_x, need_y = bool(ctx.needs.get("input")), bool(ctx.needs.get("target"))
    step = max(1, contract.ssim_chunk_elements(planes * h * w) // (h * w))
    gxs, gys = [], []
    for p0 in range(0, planes, step):
        k = min(step, planes - p0)
        xp = x if k == planes else be.narrow(x, 0, p0, k)
        yp = y if k == planes else be.narrow(y, 0, p0, k)
        gx, gyy = _ssim_piece(be, xp, yp, wv, wh, consts, gs, need_x, need_y)
        gxs.append(gx)
        gys.append(gyy)
    out = {}
    if need_x:
        out["input"] = be.reshape(gxs[0] if len(gxs) == 1 else be.cat(gxs, dim=0), shape)
    if need_y:
        out["target"] = be.reshape(gys[0] if len(gys) == 1 else be.cat(gys, dim=0), shape)
    return out


def _ssim_piece(be, x, y, wv, wh, consts, gs, need_x, need_y):
    """(d/dx, d/dy) of gs * sum(ssim map) of k planes (k, 1, h, w)."""
    c1, c2 = consts
    stack = be.cat([x, y, be.mul(x, x), be.mul(y, y), be.mul(x, y)], dim=1)
    blur = be.conv2d(be.conv2d(stack, wv, None, groups=5), wh, None, groups=5)
    del stack
    mx, my, exx, eyy, exy = [be.narrow(blur, 1, i, 1) for i in range(5)]
    mxy, mxx, myy = be.mul(mx, my), be.mul(mx, mx), be.mul(my, my)
    a1 = be.add(be.mul(mxy, 2.0), c1)
    a2 = be.add(be.mul(be.sub(exy, mxy), 2.0), c2)
    b1 = be.add(be.add(mxx, myy), c1)
    b2 = be.add(be.add(be.sub(exx, mxx), be.sub(eyy, myy)), c2)
    del blur, exx, eyy, exy, mxy, mxx, myy
    den = be.mul(b1, b2)
    s = be.div(be.mul(a1, a2), den)
    q = be.div(gs, den)                               # gs / (B1 B2)
    gsb = be.div(be.mul(gs, s), b2)                   # gs S / B2
    a21, b21 = be.sub(a2, a1), be.sub(b2, b1)
    # dS/dmu_x = [2 mu_y (A2 - A1) - 2 mu_x S (B2 - B1)] / (B1 B2), and mu_y's likewise
    q2 = be.mul(q, 2.0)
    g_mx = be.mul(be.sub(be.mul(my, a21), be.mul(be.mul(mx, s), b21)), q2)
    g_my = be.mul(be.sub(be.mul(mx, a21), be.mul(be.mul(my, s), b21)), q2)
    g_exx = be.neg(gsb)                               # dS/dE[xx] = dS/dE[yy] = -S / B2
    g_exy = be.mul(a1, q2)                            # dS/dE[xy] = 2 A1 / (B1 B2)
    del s, q, gsb, a21, b21, den
    gb = be.cat([g_mx, g_my, g_exx, g_exx, g_exy], dim=1)
    del g_mx, g_my, g_exx, g_exy
    gst = be.conv_transpose2d(be.conv_transpose2d(gb, wh, None, groups=5), wv, None, groups=5)
    del gb
    u = [be.narrow(gst, 1, i, 1) for i in range(5)]
    gx = be.add(be.add(u[0], be.mul(be.mul(x, u[2]), 2.0)), be.mul(y, u[4])) if need_x else None
    gyy = be.add(be.add(u[1], be.mul(be.mul(y, u[3]), 2.0)), be.mul(x, u[4])) if need_y else None
    return gx, gyy


_LOSS_METHODS = {"mse": "mse_loss", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss", "huber": "huber_loss",
                 "bce": "binary_cross_entropy", "psnr": "psnr", "ssim": "ssim"}


@rule("loss")
def _loss(ctx, gy):
    op = _LOSS_METHODS[ctx["name"]]
    sub = _sub_ctx(ctx, op, {"input": ctx["input"], "target": ctx["target"], **dict(ctx["params"] or {})})
    return {k: v for k, v in RULES_BY_LOSS[op](sub, gy).items() if k in ("input", "target")}


RULES_BY_LOSS = {"mse_loss": _mse, "l1_loss": _l1, "smooth_l1_loss": _smooth_l1, "huber_loss": _huber,
                 "binary_cross_entropy": _bce, "psnr": _psnr, "ssim": _ssim}


# ==== nll_loss / cross_entropy =================================================================
def _class_parts(be, op, x, t, ignore_index, w):
    """(mask, wcls, vk, kept, cd, C) for host class indices ``t``: the one-hot mask of the targets
    at x's shape (0 where ignored), the class weights shaped to broadcast along the class dim (None
    without weights), 1.0 at the valid positions (shape ``kept``), x's shape with the class dim 1,
    the class dim and the number of classes."""
    shape = _shape(be, x)
    cd = 0 if len(shape) == 1 else 1
    C = shape[cd]
    kept = shape[:cd] + (1,) + shape[cd + 1:]
    valid = t != int(ignore_index)
    tf = np.where(valid, t, -1).astype(np.float32).reshape(kept)
    td = be.to_device(tf, op, "target")
    classes = (C,) + (1,) * (len(shape) - cd - 1)
    iota = _cached(be, ("iota", classes), lambda: np.arange(C, dtype=np.float32).reshape(classes))
    mask = be.eq(td, iota)
    wcls = None if w is None else be.reshape(w, classes)
    vk = be.to_device(valid.astype(np.float32).reshape(kept), op, "target")
    return mask, wcls, vk, kept, cd, C


def _no_weight_grad(ctx, op):
    if ctx.needs.get("weight"):
        raise AnyDeviceError(op, "weight", "a Var that requires grad",
                             "has no gradient with class-index targets (as in torch)")


def _index_scale(be, gy, reduction, kept, mask, wcls, vk):
    """The per-position factor of the picked log-probabilities: gy (kept shape), divided by the
    total weight of the valid targets for 'mean'."""
    g = be.reshape(gy, kept) if reduction == "none" else gy
    if reduction == "mean":  # the total weight of the valid targets
        g = be.div(g, be.sum(vk) if wcls is None else be.sum(be.mul(mask, wcls)))
    return g


@rule("nll_loss")
def _nll(ctx, gy):
    _no_weight_grad(ctx, "nll_loss")
    be, x = ctx.be, ctx["input"]
    t = be._class_indices("nll_loss", ctx["target"])
    mask, wcls, vk, kept, cd, C = _class_parts(be, "nll_loss", x, t, ctx["ignore_index"], ctx["weight"])
    g = be.neg(_index_scale(be, gy, ctx["reduction"], kept, mask, wcls, vk))
    if wcls is not None:
        g = be.mul(g, wcls)
    return {"input": be.where(mask, g, _c(be, 0.0))}


@rule("cross_entropy")
def _cross_entropy(ctx, gy):
    be, x, w, red = ctx.be, ctx["input"], ctx["weight"], ctx["reduction"]
    eps = float(ctx["label_smoothing"] or 0.0)
    shape = _shape(be, x)
    cd = 0 if len(shape) == 1 else 1
    C = shape[cd]
    t = be._class_indices("cross_entropy", ctx["target"])
    if t is not None and w is None and eps == 0 and "cross_entropy" in be.caps.fused and _numel(shape):
        _no_weight_grad(ctx, "cross_entropy")  # one pass (devices/interface.py)
        t = np.asarray(t).reshape(-1)
        ig = int(ctx["ignore_index"])
        den = float(np.count_nonzero(t != ig)) if red == "mean" else 1.0
        N, L = math.prod(shape[:cd]), math.prod(shape[cd + 1:])
        gx = be._cross_entropy_grad(be._reshape(x, (N, C, L)), t, ig, gy, red == "none", den)
        if gx is not None:
            return {"input": be._reshape(gx, shape)}
    logp = be.log_softmax(x, dim=cd)
    classes = (C,) + (1,) * (len(shape) - cd - 1)
    wcls = None if w is None else be.reshape(w, classes)
    out = {}
    if t is None:  # class probabilities
        tp = ctx["target"]
        tps = be.add(be.mul(tp, 1.0 - eps), eps / C) if eps > 0 else tp
        kept = shape[:cd] + (1,) + shape[cd + 1:]
        g = be.reshape(gy, kept) if red == "none" else gy
        if red == "mean":
            g = be.div(g, float(_numel(shape) // C))
        g = be.neg(g)                                   # d loss / d (w * tp * logp)
        gl = be.mul(g, tps) if wcls is None else be.mul(be.mul(g, tps), wcls)
        if ctx.needs.get("input"):
            out["input"] = _log_softmax_grad(be, logp, cd, gl)
        if ctx.needs.get("target"):
            gt = be.mul(g, logp) if wcls is None else be.mul(be.mul(g, logp), wcls)
            out["target"] = be.mul(gt, 1.0 - eps) if eps > 0 else gt
        if ctx.needs.get("weight"):
            gw = be.mul(be.mul(g, tps), logp)
            others = tuple(i for i in range(len(shape)) if i != cd)
            out["weight"] = be.reshape(be.sum(gw, dim=others) if others else gw, (C,))
        return out
    _no_weight_grad(ctx, "cross_entropy")
    mask, wcls, vk, kept, cd, C = _class_parts(be, "cross_entropy", x, t, ctx["ignore_index"], w)
    g = be.neg(_index_scale(be, gy, red, kept, mask, wcls, vk))    # d loss / d (w_t logp_t)
    gw = g if wcls is None else be.mul(g, wcls)
    gl = be.where(mask, be.mul(gw, 1.0 - eps) if eps > 0 else gw, _c(be, 0.0))
    if eps > 0:  # + eps / C * sum_c w_c logp_c at the valid positions
        gl = be.add(gl, be.mul(be.mul(gw, vk), eps / C))
    if ctx.needs.get("input"):
        out["input"] = _log_softmax_grad(be, logp, cd, gl)
    return out
