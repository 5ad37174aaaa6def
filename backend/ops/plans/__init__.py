"""Argument checks and shape plans: every rule an op's arguments must follow, in one place.

Each function takes shapes (never data) and plain argument values, checks them with PyTorch's
rules and returns what the op needs (normalised arguments, output shape), or raises an
``AnyDeviceError`` naming the op's argument. ``Backend`` (contract.py) calls them before any
kernel runs; the nodes call nothing here twice: they map the argument an error names to their
own widget (see nodes/common.py, ``PackNode.ARGS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from ..system.errors import AnyDeviceError

UNARY_OPS = (
    "abs", "neg", "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "gelu", "silu", "elu",
    "leaky_relu", "softplus", "clamp", "rsqrt", "erf", "sin", "cos",
)
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "minimum", "maximum")
REDUCE_OPS = ("sum", "mean", "max", "min")
ACTIVATIONS = ("relu", "leaky_relu", "elu", "gelu", "silu", "sigmoid", "tanh", "softplus", "softmax")
LOSSES = ("mse", "l1", "huber", "smooth_l1", "bce", "psnr", "ssim")
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
REDUCTIONS = ("mean", "sum", "none")


# ----------------------------------------------------------------------------------------------
# single arguments
# ----------------------------------------------------------------------------------------------
def is_scalar(x) -> bool:
    """A Python or NumPy number (not a bool): ops take it in place of a tensor."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def pair(op: str, arg: str, value, *, minimum: int | None = None) -> tuple[int, int]:
    """An int or a 2-sequence of ints, as torch's _pair, checked against ``minimum``."""
    if _is_int(value):
        out = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(_is_int(v) for v in value):
        out = (int(value[0]), int(value[-1]))
    else:
        raise AnyDeviceError(op, arg, value, "must be an int or a pair of ints")
    if minimum is not None and min(out) < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise AnyDeviceError(op, arg, value, f"must be {what}")
    return out


def _number(op: str, arg: str, value, *, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AnyDeviceError(op, arg, value, "must be a number")
    return float(value)


def positive(op: str, arg: str, value) -> float:
    value = _number(op, arg, value)
    if not value > 0:  # NaN too
        raise AnyDeviceError(op, arg, value, "must be positive")
    return value


def _check_choice(op, arg, value, choices):
    if value not in choices:
        raise AnyDeviceError(op, arg, value, f"must be one of {', '.join(map(str, choices))}")


def known(op: str, arg: str, value, choices, what: str) -> None:
    """A name that must be one of ``choices`` (an op, a loss, an activation)."""
    if value not in choices:
        raise AnyDeviceError(op, arg, value, f"unknown {what}; choose one of {', '.join(choices)}")


# ----------------------------------------------------------------------------------------------
# shapes
# ----------------------------------------------------------------------------------------------
def broadcast_shapes(op: str, a: Sequence[int], b: Sequence[int], names=("input", "other")) -> tuple:
    try:
        shape = tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise AnyDeviceError(op, names[1], tuple(b), f"shape does not broadcast with {{{names[0]}}}",
                             refs={names[0]: tuple(a)}) from None
    return planned(op, shape)


def pair_shapes(op: str, sa, sb, same_shape: bool) -> None:
    """input and target of a loss: the same shape, or shapes that broadcast."""
    if same_shape and tuple(sa) != tuple(sb):
        raise AnyDeviceError(op, "target", tuple(sb), "must have the same shape as {input}",
                             refs={"input": tuple(sa)})
    broadcast_shapes(op, sa, sb, ("input", "target"))


def normalize_dims(op: str, dim, ndim: int, arg: str = "dim") -> tuple[int, ...]:
    """torch's dim argument (None, int or sequence) as a sorted tuple of non-negative axes."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):  # torch: [] means all dims
        return tuple(range(ndim))
    dims = [dim] if _is_int(dim) else list(dim) if isinstance(dim, (tuple, list)) else None
    if dims is None or not all(_is_int(d) for d in dims):
        raise AnyDeviceError(op, arg, dim, "must be None, an int or a sequence of ints")
    rank = max(ndim, 1)
    out = []
    for d in dims:
        if not -rank <= d < rank:
            raise AnyDeviceError(op, arg, dim, f"out of range for a tensor with {ndim} dims")
        out.append(int(d) % rank)
    if len(set(out)) != len(out):
        raise AnyDeviceError(op, arg, dim, "names a dim twice")
    return tuple(sorted(out)) if ndim else ()


def reduce_dims(op: str, shape, dim) -> tuple[int, ...]:
    """The axes a reduction runs over (max and min need them non-empty)."""
    dims = normalize_dims(op, dim, len(shape))
    if op in ("max", "min") and any(shape[d] == 0 for d in dims):
        raise AnyDeviceError(op, "input", tuple(shape), "cannot take max/min over an empty dim")
    return dims


def softmax_dim(op: str, dim, ndim: int) -> int:
    if dim is None or not _is_int(dim):
        raise AnyDeviceError(op, "dim", dim, "must be an int")
    dims = normalize_dims(op, dim, ndim)
    return dims[0] if dims else 0


@dataclass(frozen=True)
class MatmulPlan:
    """torch.matmul: operands as (batch..., M, K) @ (batch..., K, N) and the result's shape."""
    a_shape: tuple   # input with a vector promoted to a 1-row matrix
    b_shape: tuple   # other with a vector promoted to a 1-column matrix
    batch: tuple
    M: int
    N: int
    out_shape: tuple


def matmul_plan(op: str, sa, sb) -> MatmulPlan:
    sa, sb = tuple(sa), tuple(sb)
    if len(sa) == 0 or len(sb) == 0:
        raise AnyDeviceError(op, "input" if len(sa) == 0 else "other", sa if len(sa) == 0 else sb,
                             "both arguments need at least 1 dimension")
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    sa2 = (1,) + sa if a_vec else sa
    sb2 = sb + (1,) if b_vec else sb
    if sa2[-1] != sb2[-2]:
        raise AnyDeviceError(op, "other", sb, f"inner dimensions do not match for matmul: {{input}} has "
                             f"{sa2[-1]} columns, this has {sb2[-2]} rows", refs={"input": sa})
    try:
        batch = tuple(np.broadcast_shapes(sa2[:-2], sb2[:-2]))
    except ValueError:
        raise AnyDeviceError(op, "other", sb, f"batch dims {sb2[:-2]} do not broadcast with those of {{input}}",
                             refs={"input": sa}) from None
    M, N = sa2[-2], sb2[-1]
    out = batch + ((M,) if not a_vec else ()) + ((N,) if not b_vec else ())
    return MatmulPlan(sa2, sb2, batch, M, N, planned(op, out))


def linear_shapes(op: str, sx, sw, sb) -> None:
    sx, sw = tuple(sx), tuple(sw)
    if len(sw) not in (1, 2):
        raise AnyDeviceError(op, "weight", sw, "must be 1-D or 2-D (out_features, in_features)")
    if len(sx) == 0 or sx[-1] != sw[-1]:
        has = f"has {sx[-1]}" if sx else "is 0-d"
        raise AnyDeviceError(op, "input", sx, f"last dim must equal in_features={sw[-1]} of weight {sw}",
                             refs={"input": sx},
                             alt=("weight", sw, f"expects {sw[-1]} input channels (in_features) but {{input}} {has}"))
    if sb is not None:
        sb = tuple(sb)
        if len(sw) == 2 and sb not in ((sw[0],), ()):
            raise AnyDeviceError(op, "bias", sb, f"must have shape ({sw[0]},)")
        if len(sw) == 1:
            broadcast_shapes(op, sx[:-1], sb, ("output", "bias"))
    planned(op, sx[:-1] + sw[:-1])


# ----------------------------------------------------------------------------------------------
# padding and convolutions
# ----------------------------------------------------------------------------------------------
def conv_output_size(size: int, k: int, stride: int, pad_total: int, dilation: int) -> int:
    """Output length of a conv along one dim (torch's formula); pad_total = both sides."""
    return (size + pad_total - dilation * (k - 1) - 1) // stride + 1


def conv_transpose_output_size(size: int, k: int, stride: int, padding: int, output_padding: int,
                               dilation: int) -> int:
    """Output length of a transposed conv along one dim (torch's formula)."""
    return (size - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1


class ConvGeometry(NamedTuple):
    """Every size a conv kernel launch needs, computed once from validated shapes. For a transposed
    conv, C is the input's channels, CinG = C // G and CoutG comes from the weight (C, CoutG, KH, KW);
    ph/pw are its padding (pads = (ph, ph, pw, pw))."""
    N: int
    C: int
    H: int
    W: int
    Cout: int
    CinG: int
    CoutG: int
    KH: int
    KW: int
    OH: int
    OW: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    dh: int
    dw: int
    G: int

    @property
    def ph(self) -> int:
        return self.pt

    @property
    def pw(self) -> int:
        return self.pl


def conv2d_geometry(sx, sw, stride, pads, dilation, groups) -> ConvGeometry:
    """Geometry of conv2d on input shape (N, C, H, W), weight (Cout, C/G, KH, KW), pads (t, b, l, r)."""
    N, C, H, W = (int(v) for v in sx)
    Cout, CinG, KH, KW = (int(v) for v in sw)
    (sh, sw_), (dh, dw), (t, b, l, r) = stride, dilation, pads
    return ConvGeometry(N, C, H, W, Cout, CinG, Cout // groups, KH, KW,
                        conv_output_size(H, KH, sh, t + b, dh), conv_output_size(W, KW, sw_, l + r, dw),
                        sh, sw_, t, b, l, r, dh, dw, groups)


def conv_transpose2d_geometry(sx, sw, stride, padding, output_padding, dilation, groups) -> ConvGeometry:
    """Geometry of conv_transpose2d on input (N, C, H, W), weight (C, CoutG, KH, KW)."""
    N, C, H, W = (int(v) for v in sx)
    _, CoutG, KH, KW = (int(v) for v in sw)
    (sh, sw_), (ph, pw), (dh, dw) = stride, padding, dilation
    return ConvGeometry(N, C, H, W, CoutG * groups, C // groups, CoutG, KH, KW,
                        conv_transpose_output_size(H, KH, sh, ph, output_padding[0], dh),
                        conv_transpose_output_size(W, KW, sw_, pw, output_padding[1], dw),
                        sh, sw_, ph, ph, pw, pw, dh, dw, groups)


def same_pads(kh: int, kw: int, dilation: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of torch's padding='same' (the odd pixel goes after)."""
    th, tw = dilation[0] * (kh - 1), dilation[1] * (kw - 1)
    return th // 2, th - th // 2, tw // 2, tw - tw // 2


def _check_pad_mode(op, hw, pads, mode, arg="padding", value=None):
    """pads (top, bottom, left, right) against the input's (h, w); ``value`` is the argument as given."""
    t, b, l, r = pads
    h, w = hw
    value = pads if value is None else value
    if mode == "reflect" and (max(t, b) >= h or max(l, r) >= w):
        raise AnyDeviceError(op, arg, value, f"reflect padding of {max(pads)} needs an input larger than {h}x{w}")
    if mode == "circular" and (max(t, b) > h or max(l, r) > w):
        raise AnyDeviceError(op, arg, value, f"circular padding of {max(pads)} needs an input of at least "
                                             f"{max(t, b)}x{max(l, r)}, not {h}x{w}")
    if mode == "replicate" and (h == 0 or w == 0):
        raise AnyDeviceError(op, "input", tuple(hw), "replicate padding needs a non-empty input")


def pad_plan(op: str, shape, pad, mode) -> tuple[tuple[int, int, int, int], str]:
    """torch.nn.functional.pad on the last two dims: ((top, bottom, left, right), mode)."""
    if not (isinstance(pad, (tuple, list)) and len(pad) in (2, 4) and all(_is_int(p) for p in pad)):
        raise AnyDeviceError(op, "pad", pad, "must be (left, right) or (left, right, top, bottom) ints")
    l, r, t, bo = (tuple(int(p) for p in pad) + (0, 0))[:4]
    mode = {"constant": "zeros"}.get(mode, mode)
    if mode not in PADDING_MODES:
        raise AnyDeviceError(op, "mode", mode, "must be constant, reflect, replicate or circular")
    if len(shape) < 2:
        raise AnyDeviceError(op, "input", tuple(shape), "needs at least 2 dims")
    _check_pad_mode(op, shape[-2:], tuple(max(v, 0) for v in (t, bo, l, r)), mode, "pad", pad)
    if min(pad) < 0:
        crop_check(op, shape[-2:], (t, bo, l, r), mode, pad)
    planned(op, tuple(shape[:-2]) + (shape[-2] + t + bo, shape[-1] + l + r))
    return (t, bo, l, r), mode


def check_groups(op: str, groups, channels: int, what: str = "the input's {} channels", arg: str = "groups") -> None:
    """groups must be a positive int dividing ``channels``."""
    if not _is_int(groups) or groups < 1:
        raise AnyDeviceError(op, arg, groups, "must be a positive int")
    if channels % groups:
        raise AnyDeviceError(op, arg, groups, "must divide " + what.format(channels))


def _conv_common(op, sx, sw, stride, dilation, groups, weight_layout):
    """Checks both conv plans share: ranks, stride, dilation, groups; the input as (n, c, h, w)."""
    if len(sx) not in (3, 4):
        raise AnyDeviceError(op, "input", tuple(sx), "must be 4-D (N, C, H, W) or 3-D (C, H, W)")
    if len(sw) != 4:
        raise AnyDeviceError(op, "weight", tuple(sw), f"must be 4-D {weight_layout}")
    stride = pair(op, "stride", stride, minimum=1)
    dilation = pair(op, "dilation", dilation, minimum=1)
    if not _is_int(groups) or groups < 1:
        raise AnyDeviceError(op, "groups", groups, "must be a positive int")
    unbatched = len(sx) == 3
    return stride, dilation, unbatched, ((1,) + tuple(sx) if unbatched else tuple(sx))


def _check_bias(op, sb, cout):
    if sb is not None and tuple(sb) != (cout,):
        raise AnyDeviceError(op, "bias", tuple(sb), f"must have shape ({cout},)")


@dataclass(frozen=True)
class Conv2dPlan:
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]  # (top, bottom, left, right)
    out_shape: tuple
    unbatched: bool
    #: rows/columns of the output (top, bottom, left, right) no kernel tap can reach from the input:
    #: the conv computes the rest, these are 0 (+ bias); see ``conv_reach``
    out_pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: per spatial dim, None or the index of the conv's output to keep (a single output inside the input)
    picks: tuple = (None, None)


@dataclass(frozen=True)
class ConvTranspose2dPlan:
    stride: tuple[int, int]
    dilation: tuple[int, int]
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    out_shape: tuple
    unbatched: bool


def conv2d_plan(op, sx, sw, sb, stride, padding, dilation, groups, padding_mode="zeros") -> Conv2dPlan:
    """Validate conv2d arguments (torch's rules) and compute padding and output shape."""
    stride, dilation, unbatched, (n, c, h, w) = _conv_common(
        op, sx, sw, stride, dilation, groups, "(out_channels, in_channels/groups, kH, kW)")
    _check_choice(op, "padding_mode", padding_mode, PADDING_MODES)
    cout, cin_g, kh, kw = sw
    check_groups(op, groups, cout, "out_channels={}")
    check_groups(op, groups, c)
    if cin_g * groups != c:
        raise AnyDeviceError(op, "weight", tuple(sw),
                             f"expects {cin_g * groups} input channels (in_channels/groups={cin_g}, "
                             f"groups={groups}) but {{input}} has {c}", refs={"input": tuple(sx)})
    if kh < 1 or kw < 1 or cout < 1 or cin_g < 1:
        raise AnyDeviceError(op, "weight", tuple(sw), "has an empty dimension")
    _check_bias(op, sb, cout)
    if c < 1 or h < 1 or w < 1:
        raise AnyDeviceError(op, "input", tuple(sx), "has no channels or an empty image (only the batch may be 0)")
    if isinstance(padding, str):
        if padding == "valid":
            pads = (0, 0, 0, 0)
        elif padding == "same":
            if stride != (1, 1):
                raise AnyDeviceError(op, "padding", padding, "'same' is not supported for strided convolutions")
            pads = same_pads(kh, kw, dilation)
        else:
            raise AnyDeviceError(op, "padding", padding, "must be an int, a pair, 'same' or 'valid'")
    else:
        ph, pw = pair(op, "padding", padding, minimum=0)
        pads = (ph, ph, pw, pw)
    if padding_mode != "zeros":
        _check_pad_mode(op, (h, w), pads, padding_mode)
    eh, ew = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    hp, wp = h + pads[0] + pads[1], w + pads[2] + pads[3]
    if eh > hp or ew > wp:
        raise AnyDeviceError(op, "weight", tuple(sw),
                             f"kernel {kh}x{kw} (dilated {eh}x{ew}) is larger than the padded input "
                             f"{hp}x{wp}")
    oh = conv_output_size(h, kh, stride[0], pads[0] + pads[1], dilation[0])
    ow = conv_output_size(w, kw, stride[1], pads[2] + pads[3], dilation[1])
    out_shape = planned(op, (cout, oh, ow) if unbatched else (n, cout, oh, ow))
    stride, dilation, cpads, out_pads, picks = conv_reach(op, (h, w), (kh, kw), stride, dilation, pads, (oh, ow),
                                                          padding_mode == "zeros")
    return Conv2dPlan(stride, dilation, cpads if padding_mode == "zeros" else pads, out_shape, unbatched, out_pads,
                      picks)


def conv_transpose2d_plan(op, sx, sw, sb, stride, padding, output_padding, groups,
                          dilation) -> ConvTranspose2dPlan:
    stride, dilation, unbatched, (n, c, h, w) = _conv_common(
        op, sx, sw, stride, dilation, groups, "(in_channels, out_channels/groups, kH, kW)")
    padding = pair(op, "padding", padding, minimum=0)
    output_padding = pair(op, "output_padding", output_padding, minimum=0)
    for i in range(2):
        if output_padding[i] >= stride[i] and output_padding[i] >= dilation[i]:
            raise AnyDeviceError(op, "output_padding", output_padding,
                                 f"must be smaller than either stride {stride} or dilation {dilation}")
    cin, cout_g, kh, kw = sw
    check_groups(op, groups, c)
    if cin != c:
        raise AnyDeviceError(op, "weight", tuple(sw),
                             f"expects {cin} input channels (weight.shape[0]) but {{input}} has {c}",
                             refs={"input": tuple(sx)})
    if kh < 1 or kw < 1 or cout_g < 1 or cin < 1:
        raise AnyDeviceError(op, "weight", tuple(sw), "has an empty dimension")
    if h < 1 or w < 1:
        raise AnyDeviceError(op, "input", tuple(sx), "has an empty image (only the batch may be 0)")
    cout = cout_g * groups
    _check_bias(op, sb, cout)
    oh = conv_transpose_output_size(h, kh, stride[0], padding[0], output_padding[0], dilation[0])
    ow = conv_transpose_output_size(w, kw, stride[1], padding[1], output_padding[1], dilation[1])
    if oh < 1 or ow < 1:
        raise AnyDeviceError(op, "padding", padding, f"leaves an empty output ({oh}x{ow})")
    out_shape = planned(op, (cout, oh, ow) if unbatched else (n, cout, oh, ow))
    stride, dilation = conv_transpose_reach(op, (h, w), (kh, kw), stride, padding, output_padding, dilation)
    return ConvTranspose2dPlan(stride, dilation, padding, output_padding, out_shape, unbatched)


# ----------------------------------------------------------------------------------------------
# elementwise parameters, losses and metrics
# ----------------------------------------------------------------------------------------------
#: the unary ops that take parameters, with torch's defaults
UNARY_PARAMS = {
    "gelu": {"approximate": "none"}, "elu": {"alpha": 1.0}, "leaky_relu": {"negative_slope": 0.01},
    "softplus": {"beta": 1.0, "threshold": 20.0}, "clamp": {"min": None, "max": None},
}


def _check_unary_params(op, params):
    allowed = UNARY_PARAMS.get(op, {})
    for k in params:
        if k not in allowed:
            raise AnyDeviceError(op, k, params[k], f"unknown parameter; {op} takes {', '.join(allowed) or 'none'}")
    out = dict(allowed)
    out.update(params)
    if op == "gelu":
        _check_choice(op, "approximate", out["approximate"], ("none", "tanh"))
    elif op == "clamp":
        out["min"] = _number(op, "min", out["min"], allow_none=True)
        out["max"] = _number(op, "max", out["max"], allow_none=True)
        if out["min"] is None and out["max"] is None:
            raise AnyDeviceError(op, "min", None, "at least one of min and max must be given")
    else:
        for k in out:
            out[k] = _number(op, k, out[k])
    return out


def correction_arg(op: str, correction) -> float:
    """var/std's correction: any number (the divisor is max(0, count - correction), as torch;
    None is torch's default, 1)."""
    return 1.0 if correction is None else _number(op, "correction", correction)


def norm_eps(op: str, eps, default: float | None = None) -> float:
    """A normalisation's eps: a finite number >= 0 (None: ``default``, where the op has one)."""
    if eps is None and default is not None:
        return default
    value = _number(op, "eps", eps)
    if not 0 <= value < math.inf:
        raise AnyDeviceError(op, "eps", eps, "must be a finite number >= 0")
    return value


def _affine_shape(op, arg, shape, want) -> None:
    if shape is not None and tuple(shape) != tuple(want):
        raise AnyDeviceError(op, arg, tuple(shape), f"must have shape {tuple(want)}")


def normalized_dims(op: str, shape, normalized_shape, sw=None, sb=None) -> tuple[int, ...]:
    """layer_norm/rms_norm: the trailing dims of ``shape`` that ``normalized_shape`` names (which
    must match them), after checking weight and bias have that shape."""
    ns = [normalized_shape] if _is_int(normalized_shape) else normalized_shape
    if not isinstance(ns, (tuple, list)) or not ns or not all(_is_int(v) and v >= 0 for v in ns):
        raise AnyDeviceError(op, "normalized_shape", normalized_shape,
                             "must be an int or a non-empty sequence of ints >= 0")
    ns, shape = tuple(int(v) for v in ns), tuple(shape)
    if len(ns) > len(shape) or shape[len(shape) - len(ns):] != ns:
        raise AnyDeviceError(op, "normalized_shape", normalized_shape,
                             "must equal the last dims of {input}", refs={"input": shape})
    _affine_shape(op, "weight", sw, ns)
    _affine_shape(op, "bias", sb, ns)
    return tuple(range(len(shape) - len(ns), len(shape)))


def group_norm_shape(op: str, shape, num_groups, sw=None, sb=None) -> tuple[int, int, int]:
    """group_norm on input (N, C, *): (N, num_groups, elements per group); weight and bias (C,)."""
    shape = tuple(shape)
    if len(shape) < 2:
        raise AnyDeviceError(op, "input", shape, "must have at least 2 dims (N, C, *)")
    check_groups(op, num_groups, shape[1], arg="num_groups")
    _affine_shape(op, "weight", sw, (shape[1],))
    _affine_shape(op, "bias", sb, (shape[1],))
    return shape[0], int(num_groups), math.prod(shape[1:]) // int(num_groups)


def check_reduction(op: str, reduction) -> None:
    _check_choice(op, "reduction", reduction, REDUCTIONS)


def loss_threshold(op: str, arg: str, value, reduction) -> float:
    """reduction and the threshold of smooth_l1 (beta >= 0) or huber (delta > 0)."""
    check_reduction(op, reduction)
    value = _number(op, arg, value)
    if arg == "beta" and not value >= 0:  # NaN is refused, as torch
        raise AnyDeviceError(op, arg, value, "must be >= 0")
    if arg == "delta" and not value > 0:
        raise AnyDeviceError(op, arg, value, "must be positive")
    return value


def bce_range(op: str, shape, lo: float, hi: float) -> None:
    if not (lo >= 0 and hi <= 1):  # a NaN element is refused too, as torch (2.13) does
        raise AnyDeviceError(op, "input", tuple(shape),
                             f"all elements must be between 0 and 1 (found min {lo:g}, max {hi:g})")


def ssim_args(op: str, data_range, window_size, sigma) -> tuple[float, float]:
    """(data_range, sigma) of an ssim call, after checking them and window_size."""
    data_range = _number(op, "data_range", data_range)
    sigma = _number(op, "sigma", sigma)
    if not data_range > 0:  # NaN too
        raise AnyDeviceError(op, "data_range", data_range, "must be positive")
    if not _is_int(window_size) or window_size < 1 or window_size % 2 == 0:
        raise AnyDeviceError(op, "window_size", window_size, "must be a positive odd int")
    if not sigma > 0:  # NaN too
        raise AnyDeviceError(op, "sigma", sigma, "must be positive")
    return data_range, sigma


def ssim_shape(op: str, shape, window_size: int) -> tuple[int, int, int, int]:
    """The ssim input as (N, C, H, W); the window must fit in it."""
    shape = tuple(shape)
    if len(shape) not in (2, 3, 4):
        raise AnyDeviceError(op, "input", shape, "must be (N, C, H, W), (C, H, W) or (H, W)")
    if min(shape[-2:]) < window_size:
        raise AnyDeviceError(op, "input", shape, f"height and width must be at least window_size={window_size}",
                             refs={"input": shape},
                             alt=("window_size", window_size, "is larger than the height or width of {input}"))
    return (1,) * (4 - len(shape)) + shape


def check_size(op: str, shape, limit_bytes: int, free: int | None = None, where: str | None = None) -> None:
    """A float32 result of ``shape`` must fit in ``limit_bytes``; ``free``/``where``: the limit is the
    default share of that much free memory there (the error says so)."""
    nbytes = 4 * math.prod(shape)
    if nbytes > limit_bytes:
        if free is None:
            limit = f"ANYDEVICE_MAX_TENSOR_MB={limit_bytes // 2**20}"
        else:
            limit = (f"of {_mem(limit_bytes)} (half of the {_mem(free)} free in {where}; "
                     f"ANYDEVICE_MAX_TENSOR_MB sets another)")
        raise AnyDeviceError(op, "output", tuple(shape), f"result would need {_mem(nbytes)}, over the limit {limit}")


def _mem(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


# ---- window ops: pooling, interpolate (windows.py) ---------------------------------------------
INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "area")


@dataclass(frozen=True)
class PoolPlan:
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    out_shape: tuple   # the result's shape (3-D input: 3-D result)


def _window_input(op: str, shape, what: str = "3-D (C, H, W) or 4-D (N, C, H, W)") -> tuple:
    """A pooling input: 3-D or 4-D, every dim but the batch non-empty."""
    shape = tuple(shape)
    if len(shape) not in (3, 4) or min(shape[-3:]) < 1:
        raise AnyDeviceError(op, "input", shape, f"must be {what} with non-empty C, H, W (only the batch may be 0)")
    return shape


def pool_output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape: with ceil_mode the last window must start inside the input or
    the left padding."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def pool2d_plan(op: str, shape, kernel_size, stride, padding, dilation=1, ceil_mode=False) -> PoolPlan:
    """max_pool2d / avg_pool2d arguments (torch's rules) and the output shape."""
    shape = _window_input(op, shape)
    k = pair(op, "kernel_size", kernel_size, minimum=1)
    if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0):
        s = k
    else:
        s = pair(op, "stride", stride, minimum=1)
    p = pair(op, "padding", padding, minimum=0)
    d = pair(op, "dilation", dilation, minimum=1)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise AnyDeviceError(op, "padding", padding, f"must be at most half of kernel_size {k}")
    oh = pool_output_size(shape[-2], k[0], s[0], p[0], d[0], bool(ceil_mode))
    ow = pool_output_size(shape[-1], k[1], s[1], p[1], d[1], bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise AnyDeviceError(op, "input", shape, f"is too small for this window: the output would be {oh}x{ow}")
    return PoolPlan(k, s, p, d, shape[:-2] + (oh, ow))


def divisor_arg(op: str, divisor_override):
    """avg_pool2d's divisor_override: None or a non-zero int."""
    if divisor_override is None:
        return None
    if not _is_int(divisor_override) or divisor_override == 0:
        raise AnyDeviceError(op, "divisor_override", divisor_override, "must be None or a non-zero int")
    return int(divisor_override)


def adaptive_plan(op: str, shape, output_size) -> tuple:
    """adaptive_*_pool2d's output shape: output_size an int or a pair (None keeps that dim)."""
    shape = _window_input(op, shape)
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        sizes = tuple(shape[-2 + i] if v is None else v for i, v in enumerate(output_size))
    else:
        sizes = (output_size, output_size)
    if not all(_is_int(v) and v >= 0 for v in sizes):
        raise AnyDeviceError(op, "output_size", output_size, "must be an int >= 0 or a pair of them (None keeps the input's)")
    return shape[:-2] + tuple(int(v) for v in sizes)


@dataclass(frozen=True)
class InterpolatePlan:
    mode: str
    align_corners: bool
    out_shape: tuple
    scales: tuple   # per resized dim: the scale factor the kernel uses, or None (from the sizes)


def interpolate_plan(op: str, shape, size, scale_factor, mode, align_corners, recompute_scale_factor,
                     antialias) -> InterpolatePlan:
    """torch.nn.functional.interpolate's rules for 3-D (N, C, L) and 4-D (N, C, H, W) input."""
    shape = tuple(shape)
    if mode not in INTERPOLATE_MODES:
        raise AnyDeviceError(op, "mode", mode, f"must be one of {', '.join(INTERPOLATE_MODES)}")
    if len(shape) not in (3, 4) or min(shape[1:]) < 1:
        raise AnyDeviceError(op, "input", shape, "must be 3-D (N, C, L) or 4-D (N, C, H, W) with non-empty "
                             "C and spatial dims (only the batch may be 0)")
    dim = len(shape) - 2
    need = {"linear": 1, "bilinear": 2, "bicubic": 2}.get(mode)
    if need is not None and need != dim:
        raise AnyDeviceError(op, "mode", mode, f"needs {need + 2}-D input, but {{input}} is {len(shape)}-D",
                             refs={"input": shape})
    if mode in ("nearest", "nearest-exact", "area"):
        if align_corners is not None:
            raise AnyDeviceError(op, "align_corners", align_corners,
                                 "can only be set with the interpolating modes linear, bilinear and bicubic")
        align = False
    else:
        align = bool(align_corners) if align_corners is not None else False
    if antialias:
        raise AnyDeviceError(op, "antialias", antialias, "antialias=True is not supported")
    if size is not None and scale_factor is not None:
        raise AnyDeviceError(op, "size", size, "only one of size and scale_factor may be given")
    if size is None and scale_factor is None:
        raise AnyDeviceError(op, "size", size, "one of size and scale_factor must be given")
    if size is not None:
        if recompute_scale_factor:
            raise AnyDeviceError(op, "recompute_scale_factor", recompute_scale_factor,
                                 "is not meaningful with an explicit size")
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * dim
        if len(sizes) != dim or not all(_is_int(v) for v in sizes):
            raise AnyDeviceError(op, "size", size, f"must be an int or a sequence of {dim} ints for {{input}}",
                                 refs={"input": shape})
        out = tuple(int(v) for v in sizes)
        scales = (None,) * dim
        bad = ("size", size)
    else:
        factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * dim
        if len(factors) != dim:
            raise AnyDeviceError(op, "scale_factor", scale_factor, f"must be a number or a sequence of {dim} "
                                 "numbers for {input}", refs={"input": shape})
        factors = tuple(_number(op, "scale_factor", f) for f in factors)
        if not all(math.isfinite(f) for f in factors):
            raise AnyDeviceError(op, "scale_factor", scale_factor, "must be finite")
        out = tuple(math.floor(float(n) * f) for n, f in zip(shape[2:], factors))
        scales = (None,) * dim if recompute_scale_factor or mode == "area" else factors
        bad = ("scale_factor", scale_factor)
    if min(out) < 1:
        raise AnyDeviceError(op, bad[0], bad[1], f"gives an empty output size {out}: input and output sizes "
                             "must be greater than 0")
    return InterpolatePlan(mode, align, shape[:2] + out, scales)


# ---- data movement, selection, losses, dropout, batch_norm (movement.py, layers.py) -------------

#: comparisons (movement.py): float32 1.0 / 0.0 results (torch: bool)
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")


def crop_check(op: str, hw, pads, mode, value) -> None:
    """pad with negative amounts (cropping), torch's rules: constant and circular crop first (the
    crop may empty a dim but not go past it), reflect and replicate pad first and may not leave a
    negative size, nor an empty output (torch: a (left, right) pad must leave W >= 1, a 4-tuple
    H >= 1 or W >= 1); circular may not wrap past the cropped size (torch reads uninitialised
    memory there)."""
    (h, w), (t, b, l, r) = tuple(hw), pads
    outs = (h + t + b, w + l + r)
    if mode in ("reflect", "replicate") and (min(outs) < 0 or (outs[1] < 1 if len(value) == 2 else max(outs) < 1)):
        raise AnyDeviceError(op, "pad", value, f"leaves an empty output ({outs[0]}x{outs[1]} of {h}x{w})")
    for size, lo, hi in ((h, t, b), (w, l, r)):
        kept = size + min(lo, 0) + min(hi, 0)
        if mode in ("zeros", "circular") and kept < 0:
            raise AnyDeviceError(op, "pad", value, f"crops {-min(lo, 0) - min(hi, 0)} elements off a dim of {size}")
        if mode == "circular" and max(lo, hi) > kept:
            raise AnyDeviceError(op, "pad", value, f"circular padding of {max(lo, hi)} wraps past the "
                                                   f"{kept} elements left after cropping")


def _int_seq(op, arg, value):
    seq = [value] if _is_int(value) else list(value) if isinstance(value, (tuple, list)) else None
    if seq is None or not all(_is_int(v) for v in seq):
        raise AnyDeviceError(op, arg, value, "must be an int or a sequence of ints")
    return [int(v) for v in seq]


def view_shape(op: str, shape, new_shape, arg: str = "shape") -> tuple:
    """reshape/view's target shape with its one -1 inferred (torch's rules)."""
    dims = _int_seq(op, arg, new_shape)
    n = math.prod(shape)
    if dims.count(-1) > 1:
        raise AnyDeviceError(op, arg, new_shape, "only one dim can be -1")
    if any(d < -1 for d in dims):
        raise AnyDeviceError(op, arg, new_shape, "sizes must be >= 0 (or -1 for one inferred dim)")
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        if rest == 0 or n % rest:
            raise AnyDeviceError(op, arg, new_shape, f"is invalid for an input of {n} elements",
                                 refs={"input": tuple(shape)})
        dims[dims.index(-1)] = n // rest
    if math.prod(dims) != n:
        raise AnyDeviceError(op, arg, new_shape, f"is invalid for an input of {n} elements",
                             refs={"input": tuple(shape)})
    return tuple(dims)


def one_dim(op: str, ndim: int, dim, arg: str = "dim", extra: int = 0) -> int:
    """One dim of a tensor with ``ndim`` dims (``extra`` = 1: stack's new dim), as an axis >= 0."""
    if not _is_int(dim):
        raise AnyDeviceError(op, arg, dim, "must be an int")
    rank = max(ndim + extra, 1)
    if not -rank <= dim < rank:
        raise AnyDeviceError(op, arg, dim, f"out of range for a tensor with {ndim} dims (expected "
                                           f"[{-rank}, {rank - 1}])")
    return int(dim) % rank


def permute_dims(op: str, ndim: int, dims) -> tuple[int, ...]:
    dims_ = _int_seq(op, "dims", dims)
    if len(dims_) != ndim:
        raise AnyDeviceError(op, "dims", dims, f"must name each of the input's {ndim} dims once")
    out = tuple(one_dim(op, ndim, d, "dims") for d in dims_)
    if len(set(out)) != len(out):
        raise AnyDeviceError(op, "dims", dims, "names a dim twice")
    return out


def expand_shape(op: str, shape, sizes, arg: str = "size") -> tuple:
    """expand/broadcast_to: the new shape (-1 keeps a dim; new dims go in front)."""
    sizes_ = _int_seq(op, arg, sizes)
    shape = tuple(shape)
    lead = len(sizes_) - len(shape)
    if lead < 0:
        raise AnyDeviceError(op, arg, sizes, f"has fewer dims than the input's {len(shape)}",
                             refs={"input": shape})
    out = []
    for i, s in enumerate(sizes_):
        if i < lead:
            if s < 0:
                raise AnyDeviceError(op, arg, sizes, "a new leading dim must be >= 0 (-1 is not allowed there)")
            out.append(s)
            continue
        have = shape[i - lead]
        if s == -1:
            s = have
        if s < 0 or (have != 1 and s != have):
            raise AnyDeviceError(op, arg, sizes, f"cannot expand {{input}}'s dim {i - lead} of size {have} to {s}",
                                 refs={"input": shape})
        out.append(s)
    return tuple(out)


def _sliceable(op, shape):
    if len(shape) == 0:
        raise AnyDeviceError(op, "input", tuple(shape), "cannot be sliced: it is 0-d")


def narrow_args(op: str, shape, dim, start, length) -> tuple[int, int, int]:
    """narrow: (dim, start >= 0, length)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    if not _is_int(start) or not -n <= start <= n:
        raise AnyDeviceError(op, "start", start, f"must be an int in [{-n}, {n}] (dim {d} has size {n})")
    start = int(start) % n if n and start < 0 else int(start)
    if not _is_int(length) or length < 0 or start + length > n:
        raise AnyDeviceError(op, "length", length, f"must be an int >= 0 with start + length <= {n} "
                                                   f"(start {start}, dim {d} has size {n})")
    return d, start, int(length)


def slice_args(op: str, shape, dim, start, stop, step) -> tuple[int, int, int, int]:
    """x[..., start:stop:step] along dim, Python's clamping: (dim, start, length, step)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    for arg, v in (("start", start), ("stop", stop)):
        if v is not None and not _is_int(v):
            raise AnyDeviceError(op, arg, v, "must be an int or None")
    if not _is_int(step) or step <= 0:
        raise AnyDeviceError(op, "step", step, "must be a positive int (torch refuses steps <= 0)")
    s, _, st = slice(start, stop, int(step)).indices(shape[d])
    return d, s, len(range(*slice(start, stop, int(step)).indices(shape[d]))), st


def _tensor_list(op, arg, tensors):
    if not isinstance(tensors, (tuple, list)) or not tensors:
        raise AnyDeviceError(op, arg, type(tensors).__name__ if not isinstance(tensors, (tuple, list)) else tensors,
                             "must be a non-empty sequence of tensors")


def cat_plan(op: str, shapes, dim) -> tuple[int, tuple, list[int]]:
    """cat: (dim, output shape, the indices of the parts that take part: torch skips 1-D empty
    tensors (legacy) when another part has more dims)."""
    shapes = [tuple(s) for s in shapes]
    keep = [i for i, s in enumerate(shapes) if s != (0,)]
    if not keep:
        keep = [0]
    ref = shapes[keep[0]]
    if len(ref) == 0:
        raise AnyDeviceError(op, f"tensors[{keep[0]}]", ref, "a 0-d tensor cannot be concatenated")
    d = one_dim(op, len(ref), dim)
    total = 0
    for i in keep:
        s = shapes[i]
        if len(s) != len(ref) or s[:d] + s[d + 1:] != ref[:d] + ref[d + 1:]:
            raise AnyDeviceError(op, f"tensors[{i}]", s, f"must match {{first}} in every dim but dim {d}",
                                 refs={"first": ref})
        total += s[d]
    return d, ref[:d] + (total,) + ref[d + 1:], keep


def stack_plan(op: str, shapes, dim) -> tuple[int, tuple]:
    shapes = [tuple(s) for s in shapes]
    ref = shapes[0]
    d = one_dim(op, len(ref), dim, extra=1)
    for i, s in enumerate(shapes):
        if s != ref:
            raise AnyDeviceError(op, f"tensors[{i}]", s, "must have the shape of {first}", refs={"first": ref})
    return d, ref[:d] + (len(shapes),) + ref[d:]


def split_sizes(op: str, shape, split_size_or_sections, dim) -> tuple[int, list[int]]:
    """split: (dim, the sizes of the parts along it)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    v = split_size_or_sections
    if _is_int(v):
        if v < 0 or (v == 0 and n):
            raise AnyDeviceError(op, "split_size_or_sections", v, f"must be positive (0 only for an empty dim; "
                                                                 f"dim {d} has size {n})")
        if n == 0:
            return d, [0]
        return d, [min(v, n - i) for i in range(0, n, v)]
    if isinstance(v, (tuple, list)) and all(_is_int(s) and s >= 0 for s in v) and v:
        if sum(v) != n:
            raise AnyDeviceError(op, "split_size_or_sections", v, f"must sum to the size {n} of dim {d}")
        return d, [int(s) for s in v]
    raise AnyDeviceError(op, "split_size_or_sections", v, "must be an int or a non-empty list of ints >= 0")


def chunk_sizes(op: str, shape, chunks, dim) -> tuple[int, list[int]]:
    """chunk: torch's sizes (ceil(n / chunks) each, the last smaller; maybe fewer parts)."""
    if not _is_int(chunks) or chunks < 1:
        raise AnyDeviceError(op, "chunks", chunks, "must be a positive int")
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    if n == 0:
        return d, [0] * int(chunks)
    step = -(-n // chunks)
    return d, [min(step, n - i) for i in range(0, n, step)]


def class_dim(op: str, shape) -> int:
    """The class dim of a loss input: 0 for an unbatched (C,) input, else 1."""
    if len(shape) == 0:
        raise AnyDeviceError(op, "input", tuple(shape), "must have at least 1 dim (C) or (N, C, ...)")
    cd = 0 if len(shape) == 1 else 1
    if shape[cd] == 0:
        raise AnyDeviceError(op, "input", tuple(shape), "needs at least 1 class (its class dim is empty)")
    return cd


def index_targets(op: str, shape, target: np.ndarray, ignore_index, sw) -> None:
    """Class-index targets (host integers): shape (), (N) or (N, d1, ...) as the input (C), (N, C)
    or (N, C, d1, ...); each in [0, C) or ignore_index; weight (C,)."""
    shape = tuple(shape)
    cd = class_dim(op, shape)
    if not _is_int(ignore_index):
        raise AnyDeviceError(op, "ignore_index", ignore_index, "must be an int")
    want = shape[:cd] + shape[cd + 1:]
    if tuple(target.shape) != want:
        raise AnyDeviceError(op, "target", tuple(target.shape), f"must have shape {want} for {{input}}",
                             refs={"input": shape})
    C = shape[cd]
    bad = (target != ignore_index) & ((target < 0) | (target >= C))
    if bad.any():
        raise AnyDeviceError(op, "target", target, f"class index {int(target[bad].flat[0])} is out of bounds "
                                                   f"for {C} classes (ignore_index {ignore_index})")
    if sw is not None and tuple(sw) != (C,):
        raise AnyDeviceError(op, "weight", tuple(sw), f"must have shape ({C},), one weight per class")


def prob_targets(op: str, shape, st, sw) -> None:
    """Class-probability targets: the input's shape; weight (C,)."""
    cd = class_dim(op, shape)
    if tuple(st) != tuple(shape):
        raise AnyDeviceError(op, "target", tuple(st), "class probabilities must have the shape of {input} "
                                                      "(class indices: an integer array)", refs={"input": tuple(shape)})
    if sw is not None and tuple(sw) != (shape[cd],):
        raise AnyDeviceError(op, "weight", tuple(sw), f"must have shape ({shape[cd]},), one weight per class")


def label_smoothing_arg(op: str, value) -> float:
    v = _number(op, "label_smoothing", value)
    if not 0.0 <= v <= 1.0:
        raise AnyDeviceError(op, "label_smoothing", value, "must be between 0.0 and 1.0")
    return v


def dropout_args(op: str, p, training, inplace, seed) -> float:
    p = _number(op, "p", p)
    if not 0.0 <= p <= 1.0:
        raise AnyDeviceError(op, "p", p, "dropout probability has to be between 0 and 1")
    if inplace:
        raise AnyDeviceError(op, "inplace", inplace, "no op writes into its input; use inplace=False")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise AnyDeviceError(op, "seed", seed, "must be None or an int >= 0")
    return p


def batch_norm_args(op: str, shape, srm, srv, sw, sb, training, momentum, eps) -> tuple[float, float]:
    """(momentum, eps) of batch_norm on (N, C, *), after checking the shapes of the (C,) vectors."""
    shape = tuple(shape)
    if len(shape) < 2:
        raise AnyDeviceError(op, "input", shape, "must have at least 2 dims (N, C, *)")
    C = shape[1]
    momentum = _number(op, "momentum", momentum)
    eps = norm_eps(op, eps)
    for arg, s in (("running_mean", srm), ("running_var", srv), ("weight", sw), ("bias", sb)):
        if s is not None and tuple(s) != (C,):
            raise AnyDeviceError(op, arg, tuple(s), f"must have shape ({C},)", refs={"input": shape})
    if not training and (srm is None or srv is None):
        arg = "running_mean" if srm is None else "running_var"
        raise AnyDeviceError(op, arg, None, "must be given in evaluation mode (training=False)")
    if training and shape[0] * math.prod(shape[2:]) == 1:
        raise AnyDeviceError(op, "input", shape, "expected more than 1 value per channel when training")
    return momentum, eps



# ---- attention (attention.py) --------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionPlan:
    batch: tuple        # the output's batch dims (query, key, value and mask broadcast)
    L: int
    S: int
    E: int
    Ev: int
    scale: float
    key_groups: int     # enable_gqa: each key head serves this many query heads (1: none)
    value_groups: int
    out_shape: tuple


def attention_plan(op: str, sq, sk, sv, sm, dropout_p, is_causal, scale, enable_gqa) -> AttentionPlan:
    """scaled_dot_product_attention: query (..., L, E), key (..., S, E), value (..., S, Ev), the
    batch dims broadcast; attn_mask broadcasts to (..., L, S) (without growing the batch)."""
    sq, sk, sv = tuple(sq), tuple(sk), tuple(sv)
    for arg, s in (("query", sq), ("key", sk), ("value", sv)):
        if len(s) < 2:
            raise AnyDeviceError(op, arg, s, "must have at least 2 dims (..., length, features)")
    p = _number(op, "dropout_p", dropout_p)
    if not 0 <= p <= 1:
        raise AnyDeviceError(op, "dropout_p", dropout_p, "must be between 0 and 1")
    if p != 0:
        raise AnyDeviceError(op, "dropout_p", dropout_p,
                             "attention dropout is not supported (training only); pass 0.0")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise AnyDeviceError(op, "is_causal", is_causal, "must be True or False")
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise AnyDeviceError(op, "enable_gqa", enable_gqa, "must be True or False")
    if is_causal and sm is not None:
        raise AnyDeviceError(op, "attn_mask", tuple(sm), "must be None when is_causal=True")
    L, E, S, Ev = sq[-2], sq[-1], sk[-2], sv[-1]
    if sk[-1] != E:
        raise AnyDeviceError(op, "key", sk, f"must have {E} features (the last dim of {{query}})",
                             refs={"query": sq})
    if sv[-2] != S:
        raise AnyDeviceError(op, "value", sv, f"must have length {S} (dim -2 of {{key}})", refs={"key": sk})
    groups = [1, 1]
    if enable_gqa and len(sq) >= 3:
        for i, (arg, s) in enumerate((("key", sk), ("value", sv))):
            if len(s) < 3 or s[-3] < 1 or sq[-3] % s[-3]:
                raise AnyDeviceError(op, arg, s, "its heads (dim -3) must divide those of {query} (enable_gqa)",
                                     refs={"query": sq})
            groups[i] = sq[-3] // s[-3]
    bk = sk[:-3] + (sk[-3] * groups[0],) if groups[0] > 1 else sk[:-2]
    bv = sv[:-3] + (sv[-3] * groups[1],) if groups[1] > 1 else sv[:-2]
    batch = broadcast_shapes(op, sq[:-2], bk, ("query", "key"))
    batch = broadcast_shapes(op, batch, bv, ("query", "value"))
    if sm is not None and len(sm) < 2:
        raise AnyDeviceError(op, "attn_mask", tuple(sm), "must have at least 2 dims (..., L, S)")
    if sm is not None:
        want = batch + (L, S)
        try:
            full = tuple(np.broadcast_shapes(tuple(sm), want))
        except ValueError:
            full = None
        if full != want:
            raise AnyDeviceError(op, "attn_mask", tuple(sm), f"must broadcast to {want} (batch, L, S)")
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else math.inf
    else:
        scale = _number(op, "scale", scale)
    return AttentionPlan(batch, L, S, E, Ev, scale, groups[0], groups[1], batch + (L, Ev))


# ---- robustness: argument rules added for the robust-ops work ------------------------------------
def planned(op: str, shape, arg: str = "output") -> tuple:
    """The one size check: every plan passes the output shape it computed (and the nodes the
    constants they build) through here; over ANYDEVICE_MAX_TENSOR_MB it is refused, naming ``arg``."""
    from ..system.config import tensor_limit
    from ..system.memstat import CURRENT_BACKEND
    shape = tuple(int(v) for v in shape)
    limit, free, where = tensor_limit(CURRENT_BACKEND.get(), 4 * math.prod(shape))
    if arg == "output":
        check_size(op, shape, limit, free, where)
    elif 4 * math.prod(shape) > limit:
        raise AnyDeviceError(op, arg, shape, f"would build a {shape} float32 array of {4 * math.prod(shape) / 2**30:.1f} "
                             f"GiB, over the limit of {_mem(limit)}"
                             + (" (ANYDEVICE_MAX_TENSOR_MB)" if free is None else f" (half of the {_mem(free)} free "
                                f"in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"))
    return shape


def conv_image(op: str, sx) -> None:
    """A conv input (N, C, H, W) with H or W 0 is refused, as torch ("only zero batch or zero channel
    inputs are supported"); the nodes check it before padding the input themselves."""
    if len(sx) >= 2 and 0 in tuple(sx)[-2:]:
        raise AnyDeviceError(op, "input", tuple(sx), "has an empty image (height or width 0); PyTorch's "
                             "convolutions take only an empty batch or empty channels")


#: the largest geometry value (stride, dilation, padded extent) the conv kernels index with (32-bit ints)
CONV_INDEX_MAX = 2**31 - 1


def conv_reach(op, hw, k, stride, dilation, pads, out_hw, zero_pad=True):
    """A conv's geometry reduced to what can reach the input, as torch computes it with 64-bit sizes:
    (stride, dilation, pads for the kernel, out_pads, picks). Only where a value is past
    CONV_INDEX_MAX (e.g. stride=2**40, dilation=2**40, padding=2**31): a dilation of a 1-tap kernel
    is 1, output rows/columns whose taps all land in the zero padding are left out of the conv
    (``out_pads``), the padding is cut to what the rest reads and a stride past the single remaining
    output is shortened; a single output that starts inside the input is computed as the second of
    a conv whose stride is its offset (``picks``: take that index). What is still too large for
    the kernels is refused, naming the argument."""
    extent = max(hw[0] + pads[0] + pads[1], hw[1] + pads[2] + pads[3])
    if max(max(stride), max(dilation), extent) <= CONV_INDEX_MAX:
        return stride, dilation, pads, (0, 0, 0, 0), (None, None)
    s_, d_, p_, o_, picks = [], [], [], [], []
    for i in range(2):
        h, kk, s, d, pt, pb, n = hw[i], k[i], stride[i], dilation[i], pads[2 * i], pads[2 * i + 1], out_hw[i]
        if not zero_pad:  # the input is padded first (reflect, ...): every output reads it
            h, pt, pb = h + pt + pb, 0, 0
        d = 1 if kk == 1 else d
        eh = d * (kk - 1) + 1
        lo = max(0, -((eh - 1 - pt) // s))  # the first output whose last tap reaches row 0
        hi = min(n - 1, (h - 1 + pt) // s)  # the last output whose first tap is in the input
        pick = None
        if lo > hi:  # no output reaches the input: all 0 (+ bias)
            s, d, pt, pb, lo, hi = 1, 1, 0, 0, n, n - 1
        elif lo == hi and lo * s > pt:  # one output, starting inside the input at row r0
            r0 = lo * s - pt
            s, pt, pb, pick = r0, 0, max(0, r0 + eh - h), 1
        else:
            lo = min(lo, pt // s)  # no negative padding: start at an output that reads the padding
            pt -= lo * s
            pb = max(0, (hi - lo) * s + eh - pt - h)
            if hi == lo:
                s = min(s, h + pt + pb - eh + 1)
        s_.append(s), d_.append(d), p_.extend((pt, pb)), o_.extend((lo, n - 1 - hi)), picks.append(pick)
        if h + pt + pb > CONV_INDEX_MAX:
            arg, value = (("dilation", dilation) if eh - 1 > CONV_INDEX_MAX // 2 else
                          ("stride", stride) if s > CONV_INDEX_MAX // 2 else ("padding", pads))
            raise AnyDeviceError(op, arg, value, f"spans {h + pt + pb} rows/columns even where no tap can reach "
                                 f"the input; the kernels index with 32-bit ints (at most {CONV_INDEX_MAX})")
    return tuple(s_), tuple(d_), tuple(p_), tuple(o_), tuple(picks)


def conv_transpose_reach(op, hw, k, stride, padding, output_padding, dilation):
    """(stride, dilation) of a transposed conv with what cannot matter shortened (the stride of a
    1-pixel input, the dilation of a 1-tap kernel); a value still past CONV_INDEX_MAX is refused."""
    s_, d_ = [], []
    for i in range(2):
        s, d = stride[i], dilation[i]
        if s > CONV_INDEX_MAX and hw[i] == 1:
            s = output_padding[i] + 1  # keeps output_padding < stride
        if d > CONV_INDEX_MAX and k[i] == 1:
            d = 1 if output_padding[i] < s else output_padding[i] + 1
        s_.append(s), d_.append(d)
        for arg, value, v in (("stride", stride, s), ("dilation", dilation, d), ("padding", padding, padding[i]),
                              ("output_padding", output_padding, output_padding[i]),
                              ("stride", stride, (hw[i] - 1) * s + d * (k[i] - 1) + 1)):
            if v > CONV_INDEX_MAX:
                raise AnyDeviceError(op, arg, value, f"is past what the kernels index with 32-bit ints "
                                     f"(at most {CONV_INDEX_MAX})")
    return tuple(s_), tuple(d_)
