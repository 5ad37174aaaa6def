"""Window ops: pooling, adaptive pooling and interpolate (ops/windows.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...system.errors import AnyDeviceError
from .args import _is_int, _number, pair


# ---- window ops: pooling, interpolate (windows.py) ---------------------------------------------
INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "area")


@dataclass(frozen=True)
class SlidingWindow:
    """What every sliding-window plan (pooling, conv2d, conv_transpose2d) has: the step between
    windows and between a window's taps, per spatial dim (H, W)."""
    stride: tuple[int, int]
    dilation: tuple[int, int]


@dataclass(frozen=True)
class PoolPlan(SlidingWindow):
    kernel: tuple[int, int]
    padding: tuple[int, int]
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
    return PoolPlan(stride=s, dilation=d, kernel=k, padding=p, out_shape=shape[:-2] + (oh, ow))


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
