"""A pure table: the backward rules of the layer ops (layers.py), the window ops (windows.py),
data movement (movement.py), dropout and scaled_dot_product_attention (attention.py).

Each rule: ``fn(ctx, gy) -> {argument name: gradient}`` (tape.py). Gradients are computed with the
contract's public ops on native arrays, so they stay on the device; the window ops' backward runs
the same ``_window2d`` primitive as their forward:

* sum windows (avg_pool2d, adaptive_avg_pool2d, interpolate) are linear: the gradient is another
  ``_window2d`` sum through the TRANSPOSED tables (for each input row/column: the (output,
  weight) pairs that read it), built on the host from the forward's own tables (windows.py's
  table functions) and cached;
* max windows (max_pool2d, adaptive_max_pool2d) route each output gradient to the tap torch
  picks: the FIRST maximum in row-major window order, or the LAST NaN where the window holds NaN
  (aten's ``(val > maxval) || isnan(val)``). Separably: Z = the max over each window's columns
  (..., H, OW); the rows stage routes gy to the first row tap whose Z equals the output, the
  columns stage routes that to the first column tap whose x equals Z (each stage: one gather of
  all taps stacked, a score per tap, its max over the taps, a select, one transposed scatter; see
  ``_route``). No new primitive.

Multi-output ops (split, chunk, batch_norm with return_stats) receive a list of output gradients.
"""
from __future__ import annotations

import logging
import math
import weakref

import numpy as np

from ...ops.attention import _FLT_MAX, _is_bool
from ...ops.plans import (attention_plan, cat_plan, chunk_sizes, divisor_arg, interpolate_plan, narrow_args,
                     normalized_dims, permute_dims, slice_args, split_sizes, stack_plan)
from ...ops.windows import adaptive_table, interp_table, pool_tables
from .tape import rule

log = logging.getLogger("anydevice")
_F32 = np.float32


# ---- helpers --------------------------------------------------------------------------------
def _shape(be, x) -> tuple[int, ...]:
    return tuple(be._shape(x))


def _dev(be, x, op="backward", arg="input"):
    """A native array of ``x`` (bool / int host arrays as float32; native arrays as they are)."""
    return None if x is None else be.to_device(x, op, arg)


_CONSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _const(be, a, arg="constant"):
    """A constant as a native array; small ones uploaded once per backend and content (an upload
    waits for the device's queue on some backends)."""
    a = np.ascontiguousarray(a, _F32)
    if a.size > 1 << 16:
        return be.to_device(a, "backward", arg, constant=True)
    table = _CONSTS.get(be)
    if table is None:
        table = _CONSTS[be] = {}
    key = (a.shape, a.tobytes())
    v = table.get(key)
    if v is None:
        if len(table) > 256:
            table.clear()
        v = table[key] = be.to_device(a, "backward", arg, constant=True)
    return v


def _zero(be):
    """0-d zero (a number given to ``be.where`` would be uploaded at every call)."""
    return _const(be, np.zeros((), _F32), "zero")


def _zeros(be, shape):
    """Zeros of ``shape`` on the device (one element uploaded, broadcast there)."""
    shape = tuple(shape)
    z = _const(be, np.zeros((1,) * len(shape)), "zeros")
    return z if shape == (1,) * len(shape) else be.broadcast_to(z, shape)


def _sum_dims(be, g, dims):
    return be.sum(g, dim=tuple(dims)) if dims else g


# ---- data movement --------------------------------------------------------------------------
@rule("reshape", "view")
def _reshape(ctx, gy):
    be = ctx.be
    return {"input": be.reshape(gy, _shape(be, ctx["input"]))}


@rule("contiguous")
def _contiguous(ctx, gy):
    return {"input": gy}


@rule("expand", "broadcast_to")
def _expand(ctx, gy):
    return {"input": gy}  # the tape sums a broadcast gradient to the input's shape


@rule("permute")
def _permute(ctx, gy):
    be = ctx.be
    axes = permute_dims("permute", len(_shape(be, ctx["input"])), ctx["dims"])
    if not axes:
        return {"input": gy}
    return {"input": be.permute(gy, tuple(int(i) for i in np.argsort(axes)))}


@rule("transpose")
def _transpose(ctx, gy):
    be = ctx.be
    if not _shape(be, ctx["input"]):
        return {"input": gy}
    return {"input": be.transpose(gy, ctx["dim0"], ctx["dim1"])}


def _embed(be, g, shape, d, start, step=1):
    """The gradient of a slice: zeros of ``shape`` with ``g`` at start::step along dim ``d``."""
    gs = _shape(be, g)
    n = gs[d]
    if n == 0 or math.prod(shape) == 0:
        return _zeros(be, shape)
    if step > 1:  # interleave step - 1 zero slabs after each slab of g
        rest = gs[d + 1:]
        g1 = be.reshape(g, gs[:d] + (n, 1) + rest)
        g1 = be.cat([g1, _zeros(be, gs[:d] + (n, step - 1) + rest)], dim=d + 1)
        g = be.narrow(be.reshape(g1, gs[:d] + (n * step,) + rest), d, 0, (n - 1) * step + 1)
        gs = _shape(be, g)
    after = shape[d] - start - gs[d]
    parts = []
    if start:
        parts.append(_zeros(be, gs[:d] + (start,) + gs[d + 1:]))
    parts.append(g)
    if after:
        parts.append(_zeros(be, gs[:d] + (after,) + gs[d + 1:]))
    return parts[0] if len(parts) == 1 else be.cat(parts, dim=d)


@rule("narrow")
def _narrow(ctx, gy):
    be = ctx.be
    shape = _shape(be, ctx["input"])
    d, start, _ = narrow_args("narrow", shape, ctx["dim"], ctx["start"], ctx["length"])
    return {"input": _embed(be, gy, shape, d, start)}


@rule("slice")
def _slice(ctx, gy):
    be = ctx.be
    shape = _shape(be, ctx["input"])
    d, s, _, st = slice_args("slice", shape, ctx["dim"], ctx["start"], ctx["stop"], ctx["step"])
    return {"input": _embed(be, gy, shape, d, s, st)}


@rule("cat")
def _cat(ctx, gy):
    be = ctx.be
    xs = ctx["tensors"]
    shapes = [_shape(be, x) for x in xs]
    d, _, keep = cat_plan("cat", shapes, ctx["dim"])
    grads, off = [None] * len(xs), 0
    for i in keep:
        n = shapes[i][d]
        grads[i] = be.narrow(gy, d, off, n)
        off += n
    return {"tensors": grads}


@rule("stack")
def _stack(ctx, gy):
    be = ctx.be
    xs = ctx["tensors"]
    shapes = [_shape(be, x) for x in xs]
    d, _ = stack_plan("stack", shapes, ctx["dim"])
    return {"tensors": [be.reshape(be.narrow(gy, d, i, 1), shapes[i]) for i in range(len(xs))]}


def _join_parts(be, gys, d):
    """The output gradients of split / chunk joined back (one part: the tape passes it alone)."""
    gys = list(gys) if isinstance(gys, (list, tuple)) else [gys]
    return gys[0] if len(gys) == 1 else be.cat(gys, dim=d)


@rule("split")
def _split(ctx, gy):
    be = ctx.be
    d, _ = split_sizes("split", _shape(be, ctx["tensor"]), ctx["split_size_or_sections"], ctx["dim"])
    return {"tensor": _join_parts(be, gy, d)}


@rule("chunk")
def _chunk(ctx, gy):
    be = ctx.be
    d, _ = chunk_sizes("chunk", _shape(be, ctx["input"]), ctx["chunks"], ctx["dim"])
    return {"input": _join_parts(be, gy, d)}


@rule("where")
def _where(ctx, gy):
    """input where the condition holds, other elsewhere; no gradient for the condition."""
    be = ctx.be
    c = _dev(be, ctx["condition"], "where", "condition")
    return {"input": be.where(c, gy, _zero(be)) if ctx.needs.get("input") else None,
            "other": be.where(c, _zero(be), gy) if ctx.needs.get("other") else None}


# ---- normalisations -------------------------------------------------------------------------
def _norm_grad(be, g, xhat, rstd, dims):
    """d/dx of xhat = (x - mean) * rstd over ``dims``, given g = dL/dxhat:
    rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    mg = be.mean(g, dim=dims, keepdim=True)
    mgx = be.mean(be.mul(g, xhat), dim=dims, keepdim=True)
    return be.mul(rstd, be.sub(be.sub(g, mg), be.mul(xhat, mgx)))


@rule("layer_norm")
def _layer_norm(ctx, gy):
    be, x, w = ctx.be, ctx["input"], ctx["weight"]
    eps = float(ctx["eps"])
    shape = _shape(be, x)
    if math.prod(shape) == 0:
        return {"input": _zeros(be, shape), "weight": None, "bias": None}
    dims = normalized_dims("layer_norm", shape, ctx["normalized_shape"])
    xhat = be.layer_norm(x, ctx["normalized_shape"], None, None, eps)
    out = {"bias": gy if ctx.needs.get("bias") else None,
           "weight": be.mul(gy, xhat) if ctx.needs.get("weight") else None}
    if ctx.needs.get("input"):
        rstd = be.rsqrt(be.add(be.var(x, dims, correction=0, keepdim=True), eps))
        g = gy if w is None else be.mul(gy, w)
        out["input"] = _norm_grad(be, g, xhat, rstd, dims)
    return out


@rule("group_norm")
def _group_norm(ctx, gy):
    be, x, w = ctx.be, ctx["input"], ctx["weight"]
    eps, G = float(ctx["eps"]), int(ctx["num_groups"])
    shape = _shape(be, x)
    if math.prod(shape) == 0:
        return {"input": _zeros(be, shape), "weight": None, "bias": None}
    per = (shape[1],) + (1,) * (len(shape) - 2)
    chan = (0,) + tuple(range(2, len(shape)))  # every dim but C
    xhat = be.group_norm(x, G, None, None, eps)
    out = {"bias": _sum_dims(be, gy, chan) if ctx.needs.get("bias") else None,
           "weight": _sum_dims(be, be.mul(gy, xhat), chan) if ctx.needs.get("weight") else None}
    if ctx.needs.get("input"):
        grouped = (shape[0], G, -1)
        rstd = be.rsqrt(be.add(be.var(be.reshape(x, grouped), 2, correction=0, keepdim=True), eps))
        g = gy if w is None else be.mul(gy, be.reshape(w, per))
        gx = _norm_grad(be, be.reshape(g, grouped), be.reshape(xhat, grouped), rstd, (2,))
        out["input"] = be.reshape(gx, shape)
    return out


@rule("rms_norm")
def _rms_norm(ctx, gy):
    """y = x * r * w, r = rsqrt(mean(x^2) + eps): dx = r * (g - x * r^2 * mean(g * x)), g = gy * w."""
    be, x, w = ctx.be, ctx["input"], ctx["weight"]
    eps = ctx["eps"]
    eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
    shape = _shape(be, x)
    if math.prod(shape) == 0:
        return {"input": _zeros(be, shape), "weight": None}
    dims = normalized_dims("rms_norm", shape, ctx["normalized_shape"])
    r = be.rsqrt(be.add(be.mean(be.mul(x, x), dim=dims, keepdim=True), eps))
    out = {"weight": be.mul(gy, be.mul(x, r)) if ctx.needs.get("weight") else None}
    if ctx.needs.get("input"):
        g = gy if w is None else be.mul(gy, w)
        m = be.mean(be.mul(g, x), dim=dims, keepdim=True)
        out["input"] = be.mul(r, be.sub(g, be.mul(x, be.mul(be.mul(r, r), m))))
    return out


@rule("batch_norm")
def _batch_norm(ctx, gy):
    """Gradients of y for input, weight, bias (training: through the batch statistics); in
    evaluation mode also for float running_mean / running_var that require them. With
    return_stats=True only y's gradient is followed (the updated statistics carry none)."""
    be, x, w = ctx.be, ctx["input"], ctx["weight"]  # gy: y's gradient alone (tape.FIRST_ONLY)
    eps = float(ctx["eps"])
    shape = _shape(be, x)
    if math.prod(shape) == 0:
        return {"input": _zeros(be, shape)}
    needs = ctx.needs
    if ctx["training"] and "batch_norm" in be.caps.fused:  # one pass a channel (devices/interface.py)
        N, C, L = shape[0], shape[1], math.prod(shape[2:])
        r = be._batch_norm_grad(be._reshape(gy, (N, C, L)), be._reshape(x, (N, C, L)), w, eps,
                                bool(needs.get("input")))
        if r is not None:
            return {"input": None if r[0] is None else be._reshape(r[0], shape), "weight": r[1], "bias": r[2]}
    per = (shape[1],) + (1,) * (len(shape) - 2)
    chan = (0,) + tuple(range(2, len(shape)))
    out = {"bias": _sum_dims(be, gy, chan) if needs.get("bias") else None}
    wc = None if w is None else be.reshape(w, per)
    if ctx["training"]:
        xhat = be.batch_norm(x, None, None, None, None, True, 0.1, eps)
        if needs.get("weight"):
            out["weight"] = _sum_dims(be, be.mul(gy, xhat), chan)
        if needs.get("input"):
            rstd = be.rsqrt(be.add(be.var(x, chan, correction=0, keepdim=True), eps))
            g = gy if wc is None else be.mul(gy, wc)
            out["input"] = _norm_grad(be, g, xhat, rstd, chan)
        return out
    rm, rv = be.reshape(ctx["running_mean"], per), be.reshape(ctx["running_var"], per)
    rstd = be.rsqrt(be.add(rv, eps))
    scale = rstd if wc is None else be.mul(rstd, wc)
    d = be.sub(x, rm)
    if needs.get("weight"):
        out["weight"] = _sum_dims(be, be.mul(gy, be.mul(d, rstd)), chan)
    gs = be.mul(gy, scale)
    if needs.get("input"):
        out["input"] = gs
    if needs.get("running_mean"):
        out["running_mean"] = be.neg(_sum_dims(be, gs, chan))
    if needs.get("running_var"):  # d/dv rsqrt(v + eps) = -rstd^3 / 2
        out["running_var"] = be.mul(_sum_dims(be, be.mul(gs, d), chan),
                                    be.reshape(be.mul(be.mul(rstd, rstd), -0.5), (shape[1],)))
    return out


# ---- dropout --------------------------------------------------------------------------------
_WARNED = set()


def dropout_noise(shape, p: float, seed) -> np.ndarray:
    """The forward's noise (layers.py: keep / (1 - p), drawn with numpy.random.default_rng(seed))."""
    keep = np.random.default_rng(seed).random(shape) >= p
    return keep.astype(np.float32) / np.float32(1.0 - p) if p < 1.0 else np.zeros(shape, np.float32)


@rule("dropout")
def _dropout(ctx, gy):
    """gy * the forward's noise, redrawn from the seed. seed None (the forward drew a fresh mask,
    which cannot be redrawn): the mask is read back where the input is a nonzero number (out != 0
    there exactly where kept); where the input is 0 or NaN it is unknowable and the expected
    factor 1 is used (a warning is logged once). Exact: pass seed= (see docs/notes/gradlayers.md)."""
    be, x = ctx.be, ctx["input"]
    p = float(ctx["p"])
    if not ctx["training"] or p == 0.0:
        return {"input": gy}
    shape = _shape(be, x)
    seed = ctx["seed"]
    if seed is not None:
        noise = be.to_device(dropout_noise(shape, p, seed), "dropout", "mask", constant=True)
        return {"input": be.mul(gy, noise)}
    if p >= 1.0:
        return {"input": be.mul(gy, 0.0)}
    if "dropout" not in _WARNED:
        _WARNED.add("dropout")
        log.warning("autograd: dropout with seed=None: its mask is read back from the output; where the "
                    "input is 0 or NaN the gradient is gy (the expected value). Pass seed= for the exact mask.")
    known = be.eq(be.ne(x, 0.0), be.eq(x, x))  # x nonzero and not NaN
    kept = be.mul(be.mul(be.ne(ctx.out, 0.0), be.eq(ctx.out, ctx.out)), 1.0 / (1.0 - p))  # a dropped Inf: NaN
    return {"input": be.mul(gy, be.where(known, kept, _const(be, np.ones((), _F32), "one")))}


# ---- window ops -----------------------------------------------------------------------------
_TCACHE: dict = {}


def _identity(n: int):
    idx = np.arange(n, dtype=np.int32).reshape(n, 1)
    return idx, np.ones((n, 1), _F32)


def transpose_table(idx: np.ndarray, wgt: np.ndarray, n: int):
    """The transposed window table: for each of the ``n`` input positions, the (output position,
    weight) pairs of the taps that read it (repeated pairs merged, weights summed in float64).
    A sum window through (rows, cols) has as adjoint the sum window through the transposed ones."""
    key = (idx.tobytes(), wgt.tobytes(), idx.shape, n)
    hit = _TCACHE.get(key)
    if hit is not None:
        return hit
    O, T = idx.shape
    o = np.repeat(np.arange(O, dtype=np.int64), T)
    i = idx.reshape(-1).astype(np.int64)
    w = wgt.reshape(-1).astype(np.float64)
    ok = i >= 0
    o, i, w = o[ok], i[ok], w[ok]
    uk, inv = np.unique(i * max(O, 1) + o, return_inverse=True)
    ws = np.zeros(len(uk))
    np.add.at(ws, inv.reshape(-1), w)
    ii, oo = uk // max(O, 1), uk % max(O, 1)
    counts = np.bincount(ii, minlength=n) if len(ii) else np.zeros(n, np.int64)
    T2 = max(int(counts.max(initial=0)), 1)
    pos = np.arange(len(uk)) - np.repeat(np.cumsum(counts) - counts, counts)
    tidx = np.full((n, T2), -1, np.int32)
    twgt = np.zeros((n, T2), _F32)
    tidx[ii, pos] = oo
    twgt[ii, pos] = ws
    tidx.flags.writeable = False
    twgt.flags.writeable = False
    if len(_TCACHE) > 512:
        _TCACHE.clear()
    _TCACHE[key] = (tidx, twgt)
    return tidx, twgt


def _sum_window_grad(be, gy, rows, cols, H, W):
    """Adjoint of a sum window: gy (..., OH, OW) -> (..., H, W)."""
    return be._window2d(be.contiguous(gy), "sum", transpose_table(*rows, H), transpose_table(*cols, W))


def _route(be, src, red, g, idx, axis):
    """Route ``g`` (the shape of ``red``) back through one axis of a max window: ``red`` is the max
    of ``src`` over the taps ``idx`` (O, T) along ``axis`` (-2 rows, -1 columns). Each element's
    gradient goes to the first tap equal to ``red``, or the last NaN tap where red is NaN.

    All taps at once: one gather of the T taps stacked along the axis (..., T * O), a score per
    tap (2T - t where it matches, 1 + t where it is NaN, 0 elsewhere: matches and NaN exclude each
    other), its maximum over the taps picks torch's tap, and one scatter through the stacked
    table's transpose."""
    shape = _shape(be, src)
    n = shape[axis]
    O, T = idx.shape
    rows_axis = axis == -2
    other = _identity(shape[-1] if rows_axis else shape[-2])
    stacked = np.ascontiguousarray(idx.T.reshape(T * O, 1))  # row t * O + o: tap t of output o
    ones = np.ones((T * O, 1), _F32)

    def through(x, mode, table):
        return be._window2d(x, mode, table, other) if rows_axis else be._window2d(x, mode, other, table)

    rshape = _shape(be, red)
    lead = rshape[:-2]
    if rows_axis:  # (..., T, O, X); the taps along dim -3
        tshape, rb, tdim, tcol = lead + (T, O, rshape[-1]), lead + (1, O, rshape[-1]), -3, (T, 1, 1)
    else:          # (..., H, T, O); the taps along dim -2
        tshape, rb, tdim, tcol = lead + (rshape[-2], T, O), lead + (rshape[-2], 1, O), -2, (T, 1)
    xs = be.reshape(through(src, "max", (stacked, ones)), tshape)  # a skipped tap gives -inf
    red_b = be.reshape(red, rb)
    # score (0/1 flags, exact): 2T - t where the tap matches, 1 + t where it is NaN, 0 elsewhere
    # (a skipped tap never matches: red may be -inf, what the gather gives there)
    t = np.arange(T, dtype=_F32).reshape(tcol)
    valid = (idx.T >= 0).reshape((T, O, 1) if rows_axis else (T, O))
    score = be.add(be.mul(be.eq(xs, red_b), _const(be, (2 * T - t) * valid, "taps")),
                   be.mul(be.ne(xs, xs), _const(be, 1 + t, "taps")))
    del xs
    sel = be.eq(score, be.max(score, dim=tdim, keepdim=True))
    gs = be.where(sel, be.reshape(g, rb), _zero(be))
    del score, sel
    flat = lead + ((T * O, rshape[-1]) if rows_axis else (rshape[-2], T * O))
    return through(be.reshape(gs, flat), "sum", transpose_table(stacked, ones, n))


def _max_window_grad(be, x, y, gy, rows, cols):
    """Gradient of a max window (max_pool2d's tables): to torch's tap of each window."""
    H = _shape(be, x)[-2]
    z = be._window2d(x, "max", _identity(H), cols)  # (..., H, OW): the max over each column window
    gz = _route(be, z, y, be.contiguous(gy), rows[0], -2)
    return _route(be, x, z, gz, cols[0], -1)


def _empty(be, x):
    return math.prod(_shape(be, x)) == 0


def _pool_tables(ctx, shape, op):
    """The (rows, cols) window tables of a 2-D pool's forward (windows.pool_tables), or None where
    its output is empty."""
    if op.startswith("adaptive_"):
        out_shape, rows, cols = pool_tables(op, shape, output_size=ctx["output_size"])
    elif op == "max_pool2d":
        out_shape, rows, cols = pool_tables(op, shape, ctx["kernel_size"], ctx["stride"], ctx["padding"],
                                            ctx["dilation"], ctx["ceil_mode"])
    else:
        out_shape, rows, cols = pool_tables(op, shape, ctx["kernel_size"], ctx["stride"], ctx["padding"], 1,
                                            ctx["ceil_mode"], ctx["count_include_pad"],
                                            divisor_arg(op, ctx["divisor_override"]))
    return None if 0 in out_shape[-2:] else (rows, cols)


def _pool_rule(op: str):
    """Register the backward rule of the 2-D pool ``op``: zeros for an empty input or output; a max
    pool routes gy to torch's tap of each window, an avg pool (a sum window) sends it back through
    the transposed tables."""
    routed = "max" in op

    def grad(ctx, gy):
        be, x = ctx.be, ctx["input"]
        shape = _shape(be, x)
        tables = None if _empty(be, x) else _pool_tables(ctx, shape, op)
        if tables is None:
            return {"input": _zeros(be, shape)}
        rows, cols = tables
        if routed:
            return {"input": _max_window_grad(be, x, ctx.out, gy, rows, cols)}
        H, W = shape[-2:]
        return {"input": _sum_window_grad(be, gy, rows, cols, H, W)}

    grad.__name__ = grad.__qualname__ = f"_{op}"
    return rule(op)(grad)


_max_pool2d = _pool_rule("max_pool2d")
_adaptive_max_pool2d = _pool_rule("adaptive_max_pool2d")
_avg_pool2d = _pool_rule("avg_pool2d")
_adaptive_avg_pool2d = _pool_rule("adaptive_avg_pool2d")


def interpolate_tables(shape, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """interpolate's (rows, cols) tables on the 4-D view of its input (windows.interpolate's)."""
    plan = interpolate_plan("interpolate", shape, size, scale_factor, mode, align_corners,
                            recompute_scale_factor, antialias)
    out = plan.out_shape
    three = len(shape) == 3
    H, W = (1, shape[2]) if three else shape[-2:]
    OH, OW = (1, out[2]) if three else out[-2:]
    sh, sw = ((None,) + plan.scales) if three else plan.scales
    if mode == "area":
        return adaptive_table(H, OH, True), adaptive_table(W, OW, True), plan
    axis = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    rows = interp_table(H, H, "nearest", False, None) if three else interp_table(H, OH, axis, plan.align_corners, sh)
    cols = interp_table(W, OW, axis, plan.align_corners, sw)
    return rows, cols, plan


@rule("interpolate")
def _interpolate(ctx, gy):
    be, x = ctx.be, ctx["input"]
    shape = _shape(be, x)
    if _empty(be, x):
        return {"input": _zeros(be, shape)}
    rows, cols, plan = interpolate_tables(shape, ctx["size"], ctx["scale_factor"], ctx["mode"],
                                          ctx["align_corners"], ctx["recompute_scale_factor"], ctx["antialias"])
    H, W = (1, shape[2]) if len(shape) == 3 else shape[-2:]
    out4 = _shape(be, gy)
    if len(shape) == 3:
        gy = be.reshape(gy, out4[:2] + (1, out4[2]))
    return {"input": be.reshape(_sum_window_grad(be, gy, rows, cols, H, W), shape)}


# ---- attention ------------------------------------------------------------------------------
def _repeat_heads(be, x, groups):
    if groups == 1:
        return x
    s = _shape(be, x)
    x = be.broadcast_to(be.reshape(x, s[:-2] + (1,) + s[-2:]), s[:-2] + (groups,) + s[-2:])
    return be.reshape(x, s[:-3] + (s[-3] * groups,) + s[-2:])


def _sum_heads(be, g, groups):
    """Adjoint of _repeat_heads: (..., H * groups, S, D) -> (..., H, S, D)."""
    if groups == 1:
        return g
    s = _shape(be, g)
    return be.sum(be.reshape(g, s[:-3] + (s[-3] // groups, groups) + s[-2:]), dim=len(s) - 2)


@rule("scaled_dot_product_attention")
def _sdpa(ctx, gy):
    """P = softmax(q k^T * scale + mask) (recomputed a block of query rows at a time, as the
    forward, all-masked rows giving zeros), D = rowsum(gy * out):
    dv = P^T gy, dS = P * (gy v^T - D), dq = dS k * scale, dk = dS^T q * scale, dmask = dS."""
    be = ctx.be
    op = "scaled_dot_product_attention"
    q, k, v, m = ctx["query"], ctx["key"], ctx["value"], ctx["attn_mask"]
    bool_mask = _is_bool(m)
    if m is not None:
        m = _dev(be, m, op, "attn_mask")
    plan = attention_plan(op, _shape(be, q), _shape(be, k), _shape(be, v), None if m is None else _shape(be, m),
                          ctx["dropout_p"], ctx["is_causal"], ctx["scale"], ctx["enable_gqa"])
    needs = ctx.needs
    if math.prod(plan.out_shape) == 0 or plan.S == 0:
        return {name: _zeros(be, _shape(be, a)) for name, a in (("query", q), ("key", k), ("value", v))}
    if m is not None and bool_mask:
        m = be.log(m)
    kr, vr = _repeat_heads(be, k, plan.key_groups), _repeat_heads(be, v, plan.value_groups)
    L, S, scale = plan.L, plan.S, plan.scale
    qs = be.mul(q, scale) if scale != 1.0 else q
    kt = be.transpose(kr, -1, -2)
    vt = be.transpose(vr, -1, -2)
    ms = None if m is None else _shape(be, m)
    rows = be._attention_block_rows(plan)
    out, gy = ctx.out, be.contiguous(gy)
    want_m = bool(needs.get("attn_mask")) and m is not None and not bool_mask
    dq_parts, dm_parts = [], []
    dk = dv = dm_sum = None
    for r0 in range(0, L, rows):
        n = min(rows, L - r0)
        whole = n == L
        qb = qs if whole else be.narrow(qs, -2, r0, n)
        gb = gy if whole else be.narrow(gy, -2, r0, n)
        ob = out if whole else be.narrow(out, -2, r0, n)
        s = be.matmul(qb, kt)
        if m is not None:
            s = be.add(s, m if ms[-2] == 1 or whole else be.narrow(m, -2, r0, n))
        elif ctx["is_causal"]:
            cols, rws = np.arange(S)[None, :], np.arange(r0, r0 + n)[:, None]
            s = be.add(s, _const(be, np.where(cols <= rws, 0.0, -np.inf), "is_causal"))
        mx = be.maximum(be.max(s, dim=-1, keepdim=True), -_FLT_MAX)
        e = be.exp(be.sub(s, mx))
        del s
        p = be.div(e, be.maximum(be.sum(e, dim=-1, keepdim=True), 1.0))
        del e
        if needs.get("value"):
            t = be.matmul(be.transpose(p, -1, -2), gb)
            dv = t if dv is None else be.add(dv, t)
        d = be.sum(be.mul(gb, ob), dim=-1, keepdim=True)
        ds = be.mul(p, be.sub(be.matmul(gb, vt), d))
        del p
        if needs.get("query"):
            dq_parts.append(be.matmul(ds, kr))
        if needs.get("key"):
            t = be.matmul(be.transpose(ds, -1, -2), qb)
            dk = t if dk is None else be.add(dk, t)
        if want_m:
            if ms[-2] == 1:
                t = be.sum(ds, dim=-2, keepdim=True)
                dm_sum = t if dm_sum is None else be.add(dm_sum, t)
            else:
                dm_parts.append(ds)
    res = {}
    if dq_parts:
        dq = dq_parts[0] if len(dq_parts) == 1 else be.cat(dq_parts, dim=-2)
        res["query"] = be.mul(dq, scale) if scale != 1.0 else dq
    if dk is not None:
        res["key"] = _sum_heads(be, dk, plan.key_groups)
    if dv is not None:
        res["value"] = _sum_heads(be, dv, plan.value_groups)
    if want_m:
        res["attn_mask"] = dm_sum if dm_sum is not None else (
            dm_parts[0] if len(dm_parts) == 1 else be.cat(dm_parts, dim=-2))
    return res
