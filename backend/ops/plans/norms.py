"""Normalisations, dropout, losses and their targets."""
from __future__ import annotations

import math

import numpy as np

from ...system.errors import AnyDeviceError
from .args import REDUCTIONS, _check_choice, _is_int, _number
from .conv import check_groups


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
