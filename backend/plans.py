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

from .errors import AnyDeviceError

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
    if value <= 0:
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
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        raise AnyDeviceError(op, names[1], tuple(b), f"shape does not broadcast with {{{names[0]}}}",
                             refs={names[0]: tuple(a)}) from None


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
    return MatmulPlan(sa2, sb2, batch, M, N, out)


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
    if min(pad) < 0:
        raise AnyDeviceError(op, "pad", pad, "negative padding (cropping) is not supported")
    l, r, t, bo = (tuple(pad) + (0, 0))[:4]
    mode = {"constant": "zeros"}.get(mode, mode)
    if mode not in PADDING_MODES:
        raise AnyDeviceError(op, "mode", mode, "must be constant, reflect, replicate or circular")
    if len(shape) < 2:
        raise AnyDeviceError(op, "input", tuple(shape), "needs at least 2 dims")
    _check_pad_mode(op, shape[-2:], (t, bo, l, r), mode, "pad", pad)
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
    out_shape = (cout, oh, ow) if unbatched else (n, cout, oh, ow)
    return Conv2dPlan(stride, dilation, pads, out_shape, unbatched)


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
    out_shape = (cout, oh, ow) if unbatched else (n, cout, oh, ow)
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
    """var/std's correction: any number (the divisor is max(0, count - correction), as torch)."""
    return _number(op, "correction", correction)


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
    if arg == "beta" and value < 0:
        raise AnyDeviceError(op, arg, value, "must be >= 0")
    if arg == "delta" and value <= 0:
        raise AnyDeviceError(op, arg, value, "must be positive")
    return value


def bce_range(op: str, shape, lo: float, hi: float) -> None:
    if lo < 0 or hi > 1:  # NaN passes, as in torch
        raise AnyDeviceError(op, "input", tuple(shape),
                             f"all elements must be between 0 and 1 (found min {lo:g}, max {hi:g})")


def ssim_args(op: str, data_range, window_size, sigma) -> tuple[float, float]:
    """(data_range, sigma) of an ssim call, after checking them and window_size."""
    data_range = _number(op, "data_range", data_range)
    sigma = _number(op, "sigma", sigma)
    if data_range <= 0:
        raise AnyDeviceError(op, "data_range", data_range, "must be positive")
    if not _is_int(window_size) or window_size < 1 or window_size % 2 == 0:
        raise AnyDeviceError(op, "window_size", window_size, "must be a positive odd int")
    if sigma <= 0:
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


def check_size(op: str, shape, limit_bytes: int) -> None:
    nbytes = 4 * math.prod(shape)
    if nbytes > limit_bytes:
        raise AnyDeviceError(op, "output", tuple(shape),
                             f"result would need {nbytes / 2**30:.1f} GiB, over the limit "
                             f"ANYDEVICE_MAX_TENSOR_MB={limit_bytes // 2**20}")


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


# ---- attention (attention.py) --------------------------------------------------------------------


# ---- robustness: argument rules added for the robust-ops work ------------------------------------
