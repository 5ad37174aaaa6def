"""Window ops: pooling and resampling (a mixin of ``Backend``).

max_pool2d, avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d and interpolate, each named and
called as its ``torch.nn.functional`` counterpart. All of them are one backend primitive,
``_window2d``: every output pixel combines the input pixels named by a row table and a column
table (index and weight per tap, built once on the host by the op), as a weighted sum or a max.

A table is ``(idx, wgt)``: idx int32 (O, T), wgt float32 (O, T), one row per output position along
that axis; idx -1 is a skipped tap (padding, or the unused end of a ragged window). The tables use
torch's index and weight formulas (aten/src/ATen/native/UpSample.h, Pool.h, AdaptivePooling.h),
computed in float64 as torch's float64 path does (nearest: in float32, as torch always does).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..system.errors import AnyDeviceError
from .plans import adaptive_plan, divisor_arg, interpolate_plan, pool2d_plan


def _table(taps: list[list[int]], weights: list[list[float]]):
    """Ragged per-output taps -> (idx int32 (O, T), wgt float32 (O, T)), read-only."""
    T = max([len(t) for t in taps] + [1])
    idx = np.full((len(taps), T), -1, np.int32)
    wgt = np.zeros((len(taps), T), np.float32)
    for o, (t, w) in enumerate(zip(taps, weights)):
        idx[o, :len(t)] = t
        wgt[o, :len(w)] = w
    idx.flags.writeable = False
    wgt.flags.writeable = False
    return idx, wgt


@lru_cache(maxsize=256)
def pool_table(n: int, on: int, k: int, s: int, p: int, d: int, avg: bool = False,
               count_include_pad: bool = True, divisor: float | None = None):
    """Max pooling (avg False: taps o*s - p + i*d inside [0, n)) or avg pooling (dilation 1: the
    window clipped to the input, weight 1 / its size, counted as torch: padding included up to
    n + p when count_include_pad; ``divisor`` given: weight 1 / divisor, 1 where it is 1)."""
    taps, weights = [], []
    for o in range(on):
        start = o * s - p
        if not avg:
            t = [start + i * d for i in range(k) if 0 <= start + i * d < n]
            taps.append(t)
            weights.append([1.0] * len(t))
            continue
        end = min(start + k, n + p)
        size = end - start
        lo, hi = max(start, 0), min(end, n)
        t = list(range(lo, hi))
        w = 1.0 / divisor if divisor is not None else 1.0 / (size if count_include_pad else max(hi - lo, 1))
        taps.append(t)
        weights.append([w] * len(t))
    return _table(taps, weights)


@lru_cache(maxsize=256)
def adaptive_table(n: int, on: int, avg: bool):
    """Adaptive pooling windows: [floor(o n / on), ceil((o + 1) n / on)), weight 1 / length."""
    taps, weights = [], []
    for o in range(on):
        lo, hi = (o * n) // on, ((o + 1) * n + on - 1) // on
        taps.append(list(range(lo, hi)))
        weights.append([1.0 / (hi - lo) if avg else 1.0] * (hi - lo))
    return _table(taps, weights)


def pool_tables(op: str, shape, kernel_size=None, stride=None, padding=0, dilation=1, ceil_mode=False,
                count_include_pad=True, divisor=None, output_size=None):
    """(output shape, row table, column table) of the 2-D pool ``op`` (max_pool2d, avg_pool2d,
    adaptive_avg_pool2d, adaptive_max_pool2d) on an input of ``shape``: its forward and its
    backward rule build the same tables here. ``divisor`` is avg_pool2d's divisor_override, already checked
    by plans.divisor_arg."""
    H, W = shape[-2:]
    if op.startswith("adaptive_"):
        out_shape = adaptive_plan(op, shape, output_size)
        avg = op == "adaptive_avg_pool2d"
        return out_shape, adaptive_table(H, out_shape[-2], avg), adaptive_table(W, out_shape[-1], avg)
    if op == "max_pool2d":
        plan = pool2d_plan(op, shape, kernel_size, stride, padding, dilation, ceil_mode)
        row_w = col_w = ()  # max taps: no weights
    else:  # avg_pool2d: dilation 1; the weights clipped and counted as torch's
        plan = pool2d_plan(op, shape, kernel_size, stride, padding, 1, ceil_mode)
        cip = bool(count_include_pad)
        row_w = (True, cip, None if divisor is None else float(divisor))
        col_w = (True, cip, None if divisor is None else 1.0)
    OH, OW = plan.out_shape[-2:]
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = plan.kernel, plan.stride, plan.padding, plan.dilation
    return plan.out_shape, pool_table(H, OH, kh, sh, ph, dh, *row_w), pool_table(W, OW, kw, sw, pw, dw, *col_w)


def _area_scale(n: int, on: int, align_corners: bool, scale) -> float:
    """torch's area_pixel_compute_scale (float64)."""
    if align_corners:
        return (n - 1) / (on - 1) if on > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n / on


def _source_index(scale: float, o: int, align_corners: bool, cubic: bool) -> float:
    """torch's area_pixel_compute_source_index."""
    if align_corners:
        return scale * o
    src = scale * (o + 0.5) - 0.5
    return 0.0 if (not cubic and src < 0) else src


def _cubic_weights(t: float, A: float = -0.75):
    """torch's get_cubic_upsample_coefficients (A = -0.75)."""
    def c1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def c2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
    return [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)]


@lru_cache(maxsize=256)
def interp_table(n: int, on: int, mode: str, align_corners: bool, scale):
    """One axis of interpolate: nearest / nearest-exact (one tap), linear (two), cubic (four)."""
    taps, weights = [], []
    if mode in ("nearest", "nearest-exact"):
        # torch: compute_scales_value<float> and floorf, in float32 whatever the dtype
        f = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n) / np.float32(on)
        for o in range(on):
            if mode == "nearest":
                i = o if on == n else (o >> 1 if on == 2 * n else int(np.floor(np.float32(o) * f)))
            else:
                i = int(np.floor(np.float32((o + 0.5) * float(f))))
            taps.append([min(i, n - 1)])
            weights.append([1.0])
        return _table(taps, weights)
    if mode == "linear" and on == n:  # torch's linear kernels copy an axis whose size is kept,
        return _identity_table(n)     # whatever the scale_factor
    sc = _area_scale(n, on, align_corners, scale)
    for o in range(on):
        if mode == "linear":
            src = _source_index(sc, o, align_corners, False)
            i0 = min(int(math.floor(src)), n - 1)
            lam = min(max(src - i0, 0.0), 1.0)
            taps.append([i0, i0 + (1 if i0 < n - 1 else 0)])
            weights.append([1.0 - lam, lam])
        else:  # cubic: four taps around floor(src), clamped to the border
            src = _source_index(sc, o, align_corners, True)
            i = int(math.floor(src))
            taps.append([min(max(i - 1 + j, 0), n - 1) for j in range(4)])
            weights.append(_cubic_weights(src - i))
    return _table(taps, weights)


def _identity_table(n: int):
    return interp_table(n, n, "nearest", False, None)


class WindowOps:
    """max_pool2d, avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d, interpolate."""

    def _window(self, op, x, mode, rows, cols, out_shape):
        """x (..., H, W) through the tables -> out_shape (its leading dims are x's)."""
        self._check_size(op, out_shape)
        if math.prod(self._shape(x)) == 0:
            return self._reshape(x, out_shape)  # an empty batch: empty in, empty out
        return self._window2d(x, mode, rows, cols)

    def max_pool2d(self, input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                   return_indices=False):
        """torch.nn.functional.max_pool2d (NaN propagates; return_indices is not supported yet)."""
        op = "max_pool2d"
        if return_indices:
            raise AnyDeviceError(op, "return_indices", return_indices, "return_indices=True is not supported")
        kind, like, x = self._inputs(op, input=input)
        out_shape, rows, cols = pool_tables(op, self._shape(x), kernel_size, stride, padding, dilation, ceil_mode)
        return self._out(self._window(op, x, "max", rows, cols, out_shape), kind, like)

    def avg_pool2d(self, input, kernel_size, stride=None, padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
        """torch.nn.functional.avg_pool2d."""
        op = "avg_pool2d"
        divisor = divisor_arg(op, divisor_override)
        kind, like, x = self._inputs(op, input=input)
        out_shape, rows, cols = pool_tables(op, self._shape(x), kernel_size, stride, padding, 1, ceil_mode,
                                            count_include_pad, divisor)
        return self._out(self._window(op, x, "sum", rows, cols, out_shape), kind, like)

    def adaptive_avg_pool2d(self, input, output_size):
        """torch.nn.functional.adaptive_avg_pool2d."""
        return self._adaptive("adaptive_avg_pool2d", input, output_size, True)

    def adaptive_max_pool2d(self, input, output_size, return_indices=False):
        """torch.nn.functional.adaptive_max_pool2d (return_indices is not supported yet)."""
        op = "adaptive_max_pool2d"
        if return_indices:
            raise AnyDeviceError(op, "return_indices", return_indices, "return_indices=True is not supported")
        return self._adaptive(op, input, output_size, False)

    def _adaptive(self, op, input, output_size, avg):
        kind, like, x = self._inputs(op, input=input)
        out_shape, rows, cols = pool_tables(op, self._shape(x), output_size=output_size)
        return self._out(self._window(op, x, "sum" if avg else "max", rows, cols, out_shape), kind, like)

    def interpolate(self, input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                    recompute_scale_factor=None, antialias=False):
        """torch.nn.functional.interpolate for 3-D (N, C, L: nearest, nearest-exact, linear, area)
        and 4-D (N, C, H, W: nearest, nearest-exact, bilinear, bicubic, area) input."""
        op = "interpolate"
        kind, like, x = self._inputs(op, input=input)
        shape = self._shape(x)
        plan = interpolate_plan(op, shape, size, scale_factor, mode, align_corners, recompute_scale_factor,
                                antialias)
        out = plan.out_shape
        x4 = self._reshape(x, shape[:2] + (1, shape[2])) if len(shape) == 3 else x
        out4 = out[:2] + (1, out[2]) if len(shape) == 3 else out
        H, W = self._shape(x4)[-2:]
        OH, OW = out4[-2:]
        sh, sw = ((None,) + plan.scales) if len(shape) == 3 else plan.scales
        if mode == "area":
            rows, cols = adaptive_table(H, OH, True), adaptive_table(W, OW, True)
        else:
            axis = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
            rows = _identity_table(H) if len(shape) == 3 else interp_table(H, OH, axis, plan.align_corners, sh)
            cols = interp_table(W, OW, axis, plan.align_corners, sw)
        y = self._window(op, x4, "sum", rows, cols, out4)
        return self._out(self._reshape(y, out), kind, like)
