"""Padding and convolutions: output sizes, geometry, ``conv2d_plan``/``conv_transpose2d_plan`` and the
32-bit reach of their kernels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...system.errors import AnyDeviceError
from .args import PADDING_MODES, _check_choice, _is_int, pair, planned
from .movement import crop_check
from .windows import SlidingWindow


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
class Conv2dPlan(SlidingWindow):
    pads: tuple[int, int, int, int]  # (top, bottom, left, right)
    out_shape: tuple
    unbatched: bool
    #: rows/columns of the output (top, bottom, left, right) no kernel tap can reach from the input:
    #: the conv computes the rest, these are 0 (+ bias); see ``conv_reach``
    out_pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    #: per spatial dim, None or the index of the conv's output to keep (a single output inside the input)
    picks: tuple = (None, None)
    #: (stride, dilation, pads) as the arguments asked for them, before ``conv_reach`` shortened any
    asked: tuple = ()


@dataclass(frozen=True)
class ConvTranspose2dPlan(SlidingWindow):
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    out_shape: tuple
    unbatched: bool
    #: (stride, dilation) as the arguments asked for them, before ``conv_transpose_reach`` shortened any
    asked: tuple = ()


def conv2d_plan(op, sx, sw, sb, stride, padding, dilation, groups, padding_mode="zeros", *,
                size_check: bool = True) -> Conv2dPlan:
    """Validate conv2d arguments (torch's rules) and compute padding and output shape (its size checked
    against the limit, ``planned``, unless ``size_check`` is False: the backward of a conv whose
    forward checked it)."""
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
    out_shape = planned(op, out_shape) if size_check else tuple(int(v) for v in out_shape)
    asked = (stride, dilation, pads)
    stride, dilation, cpads, out_pads, picks = conv_reach(op, (h, w), (kh, kw), stride, dilation, pads, (oh, ow),
                                                          padding_mode == "zeros")
    return Conv2dPlan(stride, dilation, cpads if padding_mode == "zeros" else pads, out_shape, unbatched, out_pads,
                      picks, asked)


def conv_transpose2d_plan(op, sx, sw, sb, stride, padding, output_padding, groups,
                          dilation, *, size_check: bool = True) -> ConvTranspose2dPlan:
    """Validate conv_transpose2d arguments (torch's rules) and compute the output shape (its size checked,
    ``planned``, unless ``size_check`` is False: the backward of a conv whose forward checked it)."""
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
    out_shape = planned(op, out_shape) if size_check else tuple(int(v) for v in out_shape)
    asked = (stride, dilation)
    stride, dilation = conv_transpose_reach(op, (h, w), (kh, kw), stride, padding, output_padding, dilation)
    return ConvTranspose2dPlan(stride, dilation, padding, output_padding, out_shape, unbatched, asked)


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
