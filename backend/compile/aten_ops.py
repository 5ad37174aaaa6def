"""A pure table: the lowering table, ATen op -> the op contract on the chosen backend (its one place).

Each entry is ``fn(cx, *args, **kwargs)`` with the ATen op's own arguments, where every tensor is
already the backend's native float32 array; it returns a native array (or a tuple, for ops with
several outputs, None where an output is not computed). ``cx.be`` is the backend, ``cx.out`` the
traced output (a FakeTensor: shape and dtype), ``cx.used`` the output indices something reads.
An entry raises ``Unsupported(why)`` before any work when it cannot take these arguments: the op
then runs on the host through PyTorch (counted in the report).

The ops named here are also kept out of the decomposition table (``decompositions()``), so the
traced graph keeps them whole (an upsample stays one interpolate, not index + arange).
"""
from __future__ import annotations

import math

import numpy as np

from ..ops import quant

LOWERINGS: dict = {}
#: ops that only relabel an array (no device work)
IDENTITY = set()


class Unsupported(Exception):
    """This lowering cannot take these arguments: run the op on the host."""


def _aten():
    import torch
    return torch.ops.aten


def lower(*names):
    def deco(fn):
        aten = _aten()
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(aten, packet), overload or "default", None)
            if op is not None:  # an overload this torch lacks is skipped
                LOWERINGS[op] = fn
        return fn
    return deco


def _int_list(v):
    return [int(x) for x in v]


# ---- identity and shape ----------------------------------------------------------------------
@lower("clone", "alias", "detach", "lift_fresh_copy", "contiguous", "alias_copy", "detach_copy",
       "_to_copy", "to.dtype", "_assert_tensor_metadata", "dropout")
def _identity(cx, x, *args, **kwargs):
    if cx.op_name.startswith("aten._to_copy") or cx.op_name.startswith("aten.to"):
        if cx.out is not None and not (cx.out.dtype.is_floating_point or cx.out.dtype == _torch().bool):
            raise Unsupported("a cast to an integer type truncates")
    if cx.op_name.startswith("aten.dropout") and len(args) > 1 and args[1]:
        raise Unsupported("dropout in training mode")
    return x


def _torch():
    import torch
    return torch


@lower("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias")
def _view(cx, x, size, *rest):
    return cx.be.reshape(x, tuple(int(v) for v in size))


@lower("unsqueeze", "unsqueeze_copy")
def _unsqueeze(cx, x, dim):
    s = list(cx.be._shape(x))
    dim = int(dim)
    dim = dim + len(s) + 1 if dim < 0 else dim
    return cx.be.reshape(x, tuple(s[:dim] + [1] + s[dim:]))


@lower("squeeze", "squeeze.dim", "squeeze.dims", "squeeze_copy", "squeeze_copy.dim", "squeeze_copy.dims")
def _squeeze(cx, x, dims=None):
    s = cx.be._shape(x)
    if dims is None:
        dims = range(len(s))
    elif isinstance(dims, int):
        dims = [dims]
    drop = {int(d) % max(len(s), 1) for d in dims}
    return cx.be.reshape(x, tuple(n for i, n in enumerate(s) if not (i in drop and n == 1)))


@lower("flatten.using_ints")
def _flatten(cx, x, start=0, end=-1):
    s = cx.be._shape(x)
    if not s:
        return cx.be.reshape(x, (1,))
    a, b = int(start) % len(s), int(end) % len(s)
    return cx.be.reshape(x, s[:a] + (math.prod(s[a:b + 1]),) + s[b + 1:])


@lower("permute", "permute_copy")
def _permute(cx, x, dims):
    return cx.be.permute(x, _int_list(dims))


@lower("t", "t_copy")
def _t(cx, x):
    return x if len(cx.be._shape(x)) < 2 else cx.be.permute(x, (1, 0))


@lower("transpose.int", "transpose_copy.int")
def _transpose(cx, x, d0, d1):
    return cx.be.transpose(x, int(d0), int(d1))


@lower("expand", "expand_copy")
def _expand(cx, x, size, implicit=False):
    return cx.be.expand(x, tuple(int(s) for s in size))


@lower("slice.Tensor", "slice_copy.Tensor")
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    n = cx.be._shape(x)[int(dim)]
    start = None if start is None else max(-n - 1, min(int(start), n))  # INT64_MAX as torch clamps
    end = None if end is None else max(-n - 1, min(int(end), n))
    return cx.be.slice(x, int(dim), start, end, int(step))


@lower("select.int", "select_copy.int")
def _select(cx, x, dim, index):
    dim, index = int(dim), int(index)
    n = cx.be._shape(x)[dim]
    index = index + n if index < 0 else index
    s = cx.be._shape(x)
    return cx.be.reshape(cx.be.narrow(x, dim, index, 1), s[:dim] + s[dim + 1:])


@lower("cat", "concat")
def _cat(cx, tensors, dim=0):
    return cx.be.cat(list(tensors), int(dim))


@lower("slice_scatter")
def _slice_scatter(cx, x, src, dim=0, start=None, end=None, step=1):
    be = cx.be
    dim = int(dim) % len(be._shape(x))
    n = be._shape(x)[dim]
    s, e, st = slice(start, end, int(step)).indices(n)
    if st != 1:
        raise Unsupported("a step other than 1")
    e = max(e, s)
    parts = ([be.narrow(x, dim, 0, s)] if s else []) + [src] + ([be.narrow(x, dim, e, n - e)] if e < n else [])
    return parts[0] if len(parts) == 1 else be.cat(parts, dim)


@lower("select_scatter")
def _select_scatter(cx, x, src, dim, index):
    be = cx.be
    s = list(be._shape(x))
    dim = int(dim) % len(s)
    index = int(index) % s[dim]
    src = be.reshape(src, tuple(s[:dim] + [1] + s[dim + 1:]))
    return _slice_scatter(cx, x, src, dim, index, index + 1, 1)


@lower("stack")
def _stack(cx, tensors, dim=0):
    return cx.be.stack(list(tensors), int(dim))


@lower("split.Tensor", "split_with_sizes", "split_copy.Tensor", "split_with_sizes_copy")
def _split(cx, x, sizes, dim=0):
    return tuple(cx.be.split(x, sizes if isinstance(sizes, int) else _int_list(sizes), int(dim)))


@lower("unbind.int")
def _unbind(cx, x, dim=0):
    dim = int(dim)
    s = cx.be._shape(x)
    rest = s[:dim] + s[dim + 1:]
    return tuple(cx.be.reshape(p, rest) for p in cx.be.split(x, 1, dim))


@lower("roll")
def _roll(cx, x, shifts, dims=()):
    shifts, dims = _int_list(shifts), _int_list(dims)
    if not dims:
        raise Unsupported("roll over the flattened tensor")
    be = cx.be
    for s, d in zip(shifts, dims):
        n = be._shape(x)[d]
        s %= n
        if s:
            x = be.cat([be.narrow(x, d, n - s, s), be.narrow(x, d, 0, n - s)], d)
    return x


@lower("pixel_shuffle")
def _pixel_shuffle(cx, x, r):
    be, r = cx.be, int(r)
    *lead, c, h, w = be._shape(x)
    y = be.reshape(x, (math.prod(lead), c // (r * r), r, r, h, w))
    y = be.permute(y, (0, 1, 4, 2, 5, 3))
    return be.reshape(y, tuple(lead) + (c // (r * r), h * r, w * r))


@lower("pixel_unshuffle")
def _pixel_unshuffle(cx, x, r):
    be, r = cx.be, int(r)
    *lead, c, h, w = be._shape(x)
    y = be.reshape(x, (math.prod(lead), c, h // r, r, w // r, r))
    y = be.permute(y, (0, 1, 3, 5, 2, 4))
    return be.reshape(y, tuple(lead) + (c * r * r, h // r, w // r))


# ---- constants shaped like a tensor ------------------------------------------------------------
@lower("full_like", "zeros_like", "ones_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty")
def _full_like(cx, x, *args, **kwargs):
    name = cx.op_name.split(".")[1]
    if name in ("full_like", "new_full"):
        value = float(args[-1] if name == "full_like" else args[1])
    else:
        value = 1.0 if "ones" in name else 0.0
    shape = tuple(cx.be._shape(x)) if name.endswith("like") else tuple(int(v) for v in args[0])
    return cx.constant(("full", shape, value), lambda: np.full(shape, value, np.float32))


@lower("copy")
def _copy(cx, x, src, non_blocking=False):
    return cx.be.expand(src, tuple(cx.be._shape(x)))


# ---- matmul and convolution --------------------------------------------------------------------
def _matmul(be, a, b):
    """a @ b; b a quantized linear weight's transpose (lowering.quantized_upload) is linear's weight."""
    if isinstance(b, quant.Transposed):
        return be.linear(a, b.w)
    return be.matmul(a, b)


@lower("mm", "bmm", "matmul")
def _mm(cx, a, b):
    return _matmul(cx.be, a, b)


@lower("addmm")
def _addmm(cx, bias, a, b, beta=1, alpha=1):
    be = cx.be
    y = _matmul(be, a, b)
    if alpha != 1:
        y = be.mul(y, float(alpha))
    if beta == 0:
        return y
    return be.add(y, bias if beta == 1 else be.mul(bias, float(beta)))


@lower("baddbmm")
def _baddbmm(cx, bias, a, b, beta=1, alpha=1):
    return _addmm(cx, bias, a, b, beta, alpha)


@lower("linear")
def _linear(cx, x, w, b=None):
    return cx.be.linear(x, w, b)


@lower("convolution", "_convolution")
def _convolution(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups, *rest):
    be = cx.be
    nd = len(be._shape(w)) - 2
    if nd not in (1, 2):
        raise Unsupported(f"{nd}-D convolution")
    stride, padding, dilation, output_padding = (_int_list(v) for v in (stride, padding, dilation, output_padding))
    if nd == 1:  # (N, C, L) as (N, C, 1, L)
        sx, sw = be._shape(x), be._shape(w)
        x = be.reshape(x, sx[:-1] + (1, sx[-1]))
        w = be.reshape(w, sw[:-1] + (1, sw[-1]))
        stride, padding, dilation = [1] + stride, [0] + padding, [1] + dilation
        output_padding = [0] + output_padding
    slope = cx.act[1] if isinstance(cx.act, tuple) and cx.act[0] == "prelu" else None
    if transposed:
        y = be.conv_transpose2d(x, w, b, stride, padding, output_padding, int(groups), dilation)
    elif slope is not None and nd == 2 and "conv_prelu" in be.caps.fused:
        y = be._conv2d_prelu(x, w, b, stride, padding, dilation, int(groups), slope)  # PReLU in the conv's pass
        slope = None
    else:
        y = be.conv2d(x, w, b, stride, padding, dilation, int(groups))
    if nd == 1:
        s = be._shape(y)
        y = be.reshape(y, s[:-2] + (s[-1],))
    return y if slope is None else be._prelu(y, slope)  # (Lowered._fused_acts: the PReLU node aliases this)


# ---- elementwise ---------------------------------------------------------------------------------
def _num(v):
    return float(v) if isinstance(v, (bool, int, float)) else v


def _alpha(be, other, alpha):
    if alpha in (None, 1):
        return other
    return float(other) * float(alpha) if isinstance(other, (int, float)) else be.mul(other, float(alpha))


def _binop(name):
    def fn(cx, a, b, *, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            raise Unsupported(f"rounding_mode={rounding_mode!r}")
        a, b = _num(a), _num(b)
        if name in ("add", "sub"):
            b = _alpha(cx.be, b, alpha)
        if isinstance(a, float) and isinstance(b, float):
            raise Unsupported("two numbers")
        return cx.be.binary(name, a, b)
    return fn


for _name in ("add", "sub", "mul", "div"):
    lower(f"{_name}.Tensor", f"{_name}.Scalar")(_binop(_name))
lower("div.Tensor_mode")(_binop("div"))
lower("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")(_binop("pow"))
lower("minimum", "fmin")(_binop("minimum"))
lower("maximum", "fmax")(_binop("maximum"))


@lower("rsub.Scalar", "rsub.Tensor")
def _rsub(cx, a, b, alpha=1):
    return cx.be.sub(_num(b), _alpha(cx.be, a, alpha))


@lower("reciprocal")
def _reciprocal(cx, x):
    return cx.be.div(1.0, x)


@lower("square")
def _square(cx, x):
    return cx.be.mul(x, x)


for _name in ("abs", "neg", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "tanh", "sigmoid", "relu", "silu"):
    lower(_name)(lambda cx, x, _n=_name: cx.be.unary(_n, x))


@lower("gelu")
def _gelu(cx, x, approximate="none"):
    return cx.be.gelu(x, approximate=approximate)


@lower("leaky_relu")
def _leaky_relu(cx, x, negative_slope=0.01):
    return cx.be.leaky_relu(x, float(negative_slope))


@lower("elu")
def _elu(cx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale != 1 or input_scale != 1:
        raise Unsupported("elu with scale (selu)")
    return cx.be.elu(x, float(alpha))


@lower("softplus")
def _softplus(cx, x, beta=1.0, threshold=20.0):
    return cx.be.softplus(x, float(beta), float(threshold))


@lower("clamp", "clamp_min", "clamp_max", "hardtanh")
def _clamp(cx, x, lo=None, hi=None):
    name = cx.op_name.split(".")[1]
    if name == "clamp_max":
        lo, hi = None, lo
    elif name == "hardtanh":
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        raise Unsupported("tensor bounds")
    return cx.be.clamp(x, None if lo is None else float(lo), None if hi is None else float(hi))


@lower("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cx, c, a, b):
    return cx.be.where(c, _num(a), _num(b))


@lower("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx, x, mask, value):
    return cx.be.where(mask, _num(value), x)


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    lower(f"{_name}.Tensor", f"{_name}.Scalar")(
        lambda cx, a, b, _n=_name: cx.be.compare(_n, _num(a), _num(b)))


@lower("logical_not")
def _logical_not(cx, x):
    return cx.be.eq(x, 0.0)


@lower("logical_and")
def _logical_and(cx, a, b):
    be = cx.be
    return be.mul(be.ne(a, 0.0), be.ne(b, 0.0))


@lower("logical_or")
def _logical_or(cx, a, b):
    be = cx.be
    return be.maximum(be.ne(a, 0.0), be.ne(b, 0.0))


@lower("_prelu_kernel", "prelu")
def _prelu(cx, x, w):
    return cx.be._prelu(x, w)  # one pass where the device has "prelu" (ops/layers.py)


# ---- reductions and normalisation ----------------------------------------------------------------
def _dims(dim):
    return None if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else \
        (int(dim) if isinstance(dim, int) else _int_list(dim))


@lower("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax", "amin")
def _reduce(cx, x, dim=None, keepdim=False, *, dtype=None):
    op = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}[cx.op_name.split(".")[1]]
    return cx.be.reduce(op, x, _dims(dim), bool(keepdim))


@lower("var.correction", "std.correction")
def _var(cx, x, dim=None, *, correction=None, keepdim=False):
    fn = cx.be.var if cx.op_name.startswith("aten.var") else cx.be.std
    return fn(x, _dims(dim), correction=1 if correction is None else correction, keepdim=bool(keepdim))


@lower("_softmax", "softmax.int")
def _softmax(cx, x, dim, *rest):
    return cx.be.softmax(x, int(dim))


@lower("_log_softmax", "log_softmax.int")
def _log_softmax(cx, x, dim, *rest):
    return cx.be.log_softmax(x, int(dim))


def _only_first(cx, what):
    if cx.used - {0}:
        raise Unsupported(f"the {what} outputs are read")


#: activations the interpreter folds into the norm before them (Lowered.act): aten op name -> contract name
FUSED_ACTS = {"silu": "silu"}


@lower("native_group_norm")
def _group_norm(cx, x, w, b, N, C, HxW, group, eps):
    _only_first(cx, "mean / rstd")
    # a GroupNorm whose only reader is a SiLU (ResNet blocks): both in one pass (cx.act, Lowered.act)
    return (cx.be._group_norm_act(x, int(group), w, b, float(eps), cx.act), None, None)


@lower("native_layer_norm")
def _layer_norm(cx, x, shape, w, b, eps):
    _only_first(cx, "mean / rstd")
    return (cx.be.layer_norm(x, _int_list(shape), w, b, float(eps)), None, None)


@lower("_native_batch_norm_legit_no_training")
def _batch_norm(cx, x, w, b, rm, rv, momentum, eps):
    _only_first(cx, "saved statistics")
    return (cx.be.batch_norm(x, rm, rv, w, b, training=False, eps=float(eps)), None, None)


# ---- resampling, padding, pooling ----------------------------------------------------------------
def _upsample(mode):
    def fn(cx, x, output_size=None, *args):
        # .vec: (x, output_size, [align_corners,] scale_factors); .default: (x, output_size, [ac,] sh, sw)
        ac = None
        if mode in ("bilinear", "bicubic", "linear"):
            ac, args = bool(args[0]), args[1:]
        if cx.op_name.endswith(".vec"):
            scales = args[0] if args else None
        else:
            scales = tuple(args) if args and all(s is not None for s in args) else None
        if scales is not None and output_size is None:
            return cx.be.interpolate(x, scale_factor=tuple(float(s) for s in scales), mode=mode, align_corners=ac)
        if scales is not None:  # torch maps output pixels through the given scale, not in/out
            y = cx.be.interpolate(x, scale_factor=tuple(float(s) for s in scales), mode=mode, align_corners=ac)
            if cx.be._shape(y)[2:] == tuple(int(s) for s in output_size):
                return y
        return cx.be.interpolate(x, size=tuple(int(s) for s in output_size), mode=mode, align_corners=ac)
    return fn


lower("upsample_nearest2d.vec", "upsample_nearest2d.default", "upsample_nearest1d.vec",
      "upsample_nearest1d.default")(_upsample("nearest"))
lower("_upsample_nearest_exact2d.vec", "_upsample_nearest_exact2d.default", "_upsample_nearest_exact1d.vec",
      "_upsample_nearest_exact1d.default")(_upsample("nearest-exact"))
lower("upsample_bilinear2d.vec", "upsample_bilinear2d.default")(_upsample("bilinear"))
lower("upsample_bicubic2d.vec", "upsample_bicubic2d.default")(_upsample("bicubic"))
lower("upsample_linear1d.vec", "upsample_linear1d.default")(_upsample("linear"))


@lower("constant_pad_nd")
def _constant_pad(cx, x, pad, value=0):
    if value != 0 or len(pad) not in (2, 4):
        raise Unsupported("a non-zero value or more than two padded dims")
    return cx.be.pad(x, _int_list(pad), "constant")


@lower("reflection_pad2d", "reflection_pad1d", "replication_pad2d", "replication_pad1d")
def _mode_pad(cx, x, pad):
    mode = "reflect" if "reflection" in cx.op_name else "replicate"
    return cx.be.pad(x, _int_list(pad), mode)


@lower("avg_pool2d")
def _avg_pool2d(cx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return cx.be.avg_pool2d(x, _int_list(kernel_size), _int_list(stride) or None, _int_list(padding) if
                            not isinstance(padding, int) else padding, bool(ceil_mode), bool(count_include_pad),
                            divisor_override)


@lower("max_pool2d_with_indices")
def _max_pool2d(cx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    _only_first(cx, "indices")
    y = cx.be.max_pool2d(x, _int_list(kernel_size), _int_list(stride) or None,
                         padding if isinstance(padding, int) else _int_list(padding),
                         dilation if isinstance(dilation, int) else _int_list(dilation), bool(ceil_mode))
    return (y, None)


@lower("_adaptive_avg_pool2d", "adaptive_avg_pool2d")
def _adaptive_avg(cx, x, size):
    return cx.be.adaptive_avg_pool2d(x, _int_list(size))


# ---- attention -----------------------------------------------------------------------------------
def _mask(cx, mask, index):
    """An attention mask as the device has it: a bool mask (True takes part) arrives as 1.0 / 0.0,
    so it becomes the additive 0 / -inf."""
    if mask is None:
        return None
    node = cx.node.kwargs.get("attn_mask", cx.node.args[index] if len(cx.node.args) > index else None)
    meta = getattr(node, "meta", {}).get("val")
    if meta is not None and meta.dtype == _torch().bool:
        return cx.be.log(mask)
    return mask


@lower("_scaled_dot_product_flash_attention_for_cpu")
def _sdpa_cpu(cx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _only_first(cx, "logsumexp")
    if dropout_p:
        raise Unsupported("attention dropout")
    y = cx.be.scaled_dot_product_attention(q, k, v, _mask(cx, attn_mask, 99), 0.0, bool(is_causal), scale)
    return (y, None)


@lower("scaled_dot_product_attention")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise Unsupported("attention dropout")
    return cx.be.scaled_dot_product_attention(q, k, v, _mask(cx, attn_mask, 3), 0.0, bool(is_causal), scale,
                                              bool(enable_gqa))


@lower("_scaled_dot_product_efficient_attention")
def _sdpa_eff(cx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    _only_first(cx, "logsumexp / seed")
    if dropout_p:
        raise Unsupported("attention dropout")
    y = cx.be.scaled_dot_product_attention(q, k, v, _mask(cx, attn_bias, 3), 0.0, bool(is_causal), scale)
    return (y, None, None, None)


@lower("_scaled_dot_product_flash_attention")
def _sdpa_flash(cx, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    _only_first(cx, "logsumexp / seed")
    if dropout_p:
        raise Unsupported("attention dropout")
    y = cx.be.scaled_dot_product_attention(q, k, v, None, 0.0, bool(is_causal), scale)
    return (y,) + (None,) * 8


def decompositions() -> dict:
    """PyTorch's core ATen decompositions without the ops this table takes whole."""
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    return {op: fn for op, fn in table.items() if op not in LOWERINGS and
            getattr(op, "overloadpacket", None) not in _PACKETS()}


def _PACKETS():
    return {op.overloadpacket for op in LOWERINGS if hasattr(op, "overloadpacket")}


# ---- keeping ops whole while tracing --------------------------------------------------------------
def _sdpa_whole(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention as one op in the trace (torch would pick its math path for fake
    tensors, a dozen ops with a full score matrix)."""
    import torch
    aten = torch.ops.aten
    dims = {q.dim(), k.dim(), v.dim()}
    if dropout_p or enable_gqa or dims not in ({4}, {3}):  # the math path, as torch would trace it
        kw = {"scale": scale, "enable_gqa": enable_gqa} if enable_gqa else {"scale": scale}
        return aten._scaled_dot_product_attention_math.default(q, k, v, attn_mask, dropout_p, is_causal, **kw)[0]
    if dims == {3}:  # (B, L, E): one more batch dim, the mask broadcasts as before
        y = aten._scaled_dot_product_flash_attention_for_cpu.default(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return y.squeeze(0)
    return aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, is_causal,
                                                                    attn_mask=attn_mask, scale=scale)[0]


def _vec_whole(default_op, has_align_corners):
    """An upsample's .vec overload as its .default one, the output size symbolic (torch's C++
    kernel would make dynamo specialise on the input size: a recompile per image size)."""
    def fn(input, output_size, *rest):
        from torch._decomp.decompositions import upsample_compute_output_size
        if has_align_corners:
            align_corners, scale_factors = rest
        else:
            scale_factors = rest[0]
        osize = upsample_compute_output_size(input.size(), output_size, scale_factors)
        scales = list(scale_factors) if scale_factors else [None] * len(osize)
        if has_align_corners:
            return default_op(input, osize, align_corners, *scales)
        return default_op(input, osize, *scales)
    return fn


class keep_whole:
    """While tracing: the lowered ops PyTorch decomposes in Python before the tracer sees them (the
    upsamples' Autograd / CompositeImplicitAutograd kernels) stay whole, and scaled_dot_product_attention
    is traced as one op. Restored on exit."""

    def __enter__(self):
        import torch
        from torch._C import DispatchKey
        self.saved = []
        keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
        for op in LOWERINGS:
            if "upsample" in str(op):
                for k in keys:
                    if k in op.py_kernels:
                        self.saved.append((op, k, op.py_kernels.pop(k)))
                if str(op).endswith(".vec"):  # sizes computed symbolically, then the .default op
                    for k in keys:
                        op.py_kernels[k] = _vec_whole(getattr(op.overloadpacket, "default"), "linear" in str(op)
                                                      or "bicubic" in str(op))
                op._dispatch_cache.clear()
        sdpa = torch.ops.aten.scaled_dot_product_attention.default
        self.sdpa_had = {k: sdpa.py_kernels.get(k) for k in keys}
        for k in keys:
            sdpa.py_kernels[k] = _sdpa_whole
        sdpa._dispatch_cache.clear()
        self.sdpa = sdpa
        return self

    def __exit__(self, *exc):
        from torch._C import DispatchKey
        for op in LOWERINGS:
            if "upsample" in str(op) and str(op).endswith(".vec"):
                for k in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd):
                    op.py_kernels.pop(k, None)
        for op, k, fn in self.saved:
            op.py_kernels[k] = fn
            op._dispatch_cache.clear()
        for k, fn in self.sdpa_had.items():
            if fn is None:
                self.sdpa.py_kernels.pop(k, None)
            else:
                self.sdpa.py_kernels[k] = fn
        self.sdpa._dispatch_cache.clear()
        return False
