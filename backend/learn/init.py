"""torch's default initialisation of nn.Conv2d and nn.Linear, as float32 NumPy arrays.

``reset_parameters`` of both modules draws the weight with ``kaiming_uniform_(w, a=sqrt(5))``:
gain = sqrt(2 / (1 + a^2)), std = gain / sqrt(fan_in), bound = sqrt(3) * std (which is
1/sqrt(fan_in) up to one rounding; the bound here is computed torch's way, in that order), and the
bias with ``uniform_(-1/sqrt(fan_in), 1/sqrt(fan_in))``; fan_in = in_channels/groups * kh * kw for a
convolution, in_features for a linear layer.

The random numbers come from NumPy's ``default_rng(seed)``, not torch's generator: the same seed
gives the same arrays on every machine and backend, but not the numbers ``torch.manual_seed(seed)``
would give. The draw follows torch's CPU ``uniform_`` for float32: a 24-bit uniform ``u`` in [0, 1)
(k / 2^24), then ``u * (to - from) + from`` in float32. The weight is drawn first, then the bias, from
one generator.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ..system.errors import AnyDeviceError

__all__ = ["kaiming_uniform_bound", "bias_bound", "uniform", "conv2d_params", "linear_params"]

_A = math.sqrt(5)


def kaiming_uniform_bound(fan_in: int, a: float = _A) -> float:
    """torch.nn.init.kaiming_uniform_'s bound for ``fan_in`` (mode fan_in, leaky_relu gain)."""
    gain = math.sqrt(2.0 / (1 + a ** 2))
    std = gain / math.sqrt(fan_in)
    return math.sqrt(3.0) * std


def bias_bound(fan_in: int) -> float:
    """The bias bound of nn.Conv2d / nn.Linear's reset_parameters."""
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0


def uniform(rng: np.random.Generator, shape, low: float, high: float) -> np.ndarray:
    """torch's CPU float32 ``uniform_(low, high)`` construction, from ``rng``."""
    k = rng.integers(0, 1 << 24, size=shape, dtype=np.int64)
    u = (k.astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)
    lo, hi = np.float32(low), np.float32(high)
    return (u * (hi - lo) + lo).astype(np.float32, copy=False)


def _size(op: str, name: str, value, minimum: int = 0) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise AnyDeviceError(op, name, value, "must be an integer") from None
    if isinstance(value, bool) or v < minimum:
        raise AnyDeviceError(op, name, value, f"must be an integer >= {minimum}")
    return v


def _seed(op: str, seed) -> int:
    try:
        s = operator.index(seed)
    except TypeError:
        raise AnyDeviceError(op, "seed", seed, "must be an integer") from None
    if isinstance(seed, bool) or s < 0:
        raise AnyDeviceError(op, "seed", seed, "must be an integer >= 0")
    return s


def _params(op: str, wshape: tuple, fan_in: int, bias_len: int, bias: bool, seed):
    rng = np.random.default_rng(_seed(op, seed))
    if 0 in wshape:  # torch: "Initializing zero-element tensors is a no-op" (empty weight)
        w = np.zeros(wshape, np.float32)
    else:
        b = kaiming_uniform_bound(fan_in)
        w = uniform(rng, wshape, -b, b)
    if not bias:
        return w, None
    bb = bias_bound(fan_in)
    return w, uniform(rng, (bias_len,), -bb, bb)


def conv2d_params(out_ch: int, in_ch_per_group: int, kh: int, kw: int, bias: bool = True, seed: int = 0):
    """(weight (out_ch, in_ch_per_group, kh, kw), bias (out_ch,) or None), float32, as nn.Conv2d
    initialises them (for groups > 1 pass in_channels // groups)."""
    op = "conv2d_params"
    out_ch = _size(op, "out_ch", out_ch, 1)
    cin = _size(op, "in_ch_per_group", in_ch_per_group, 1)
    kh, kw = _size(op, "kh", kh, 1), _size(op, "kw", kw, 1)
    return _params(op, (out_ch, cin, kh, kw), cin * kh * kw, out_ch, bias, seed)


def linear_params(out_f: int, in_f: int, bias: bool = True, seed: int = 0):
    """(weight (out_f, in_f), bias (out_f,) or None), float32, as nn.Linear initialises them."""
    op = "linear_params"
    out_f = _size(op, "out_f", out_f, 1)
    in_f = _size(op, "in_f", in_f, 0)
    return _params(op, (out_f, in_f), in_f, out_f, bias, seed)
