"""The one vocabulary every layer kind checks its settings with, and the limits a spec is held to.

A spec may come from a file, so it is untrusted: ints within 2**31 - 1, floats finite and within
float32's range, no unknown settings. Each refusal is an AnyDeviceError whose op is ``network
<where>`` (``where`` names the layer, e.g. "layer 3.body.0 (conv2d)"), naming the setting and its
value. Also the memory limit every size is checked against (``over_limit``) and how a size is said.
"""
from __future__ import annotations

import math

import numpy as np

from ...system.errors import AnyDeviceError
from ...ops import plans

OP = "network"

#: residual blocks nest at most this deep (a block in a block ... in a block): every walk over the
#: layers recurses into the bodies, so a deeper spec is refused before it could exhaust the stack
MAX_DEPTH = 64
#: the most layers a network may have, the ones in residual bodies included
MAX_LAYERS = 10000
#: the largest int setting (channels, features, kernel sizes, strides, paddings...) and input size
MAX_INT = 2**31 - 1
#: float settings must fit float32 (the kernels take them as such): 1e308 is refused, not made inf
MAX_FLOAT = float(np.finfo(np.float32).max)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _err(where: str, arg: str, value, reason: str) -> AnyDeviceError:
    try:
        return AnyDeviceError(f"{OP} {where}", arg, value, reason)
    except RecursionError:  # a value nested too deep to show
        return AnyDeviceError(f"{OP} {where}", arg, f"<{type(value).__name__} nested too deep to show>", reason)


def _int(where, arg, v, minimum=1) -> int:
    if not _is_int(v) or v < minimum:
        raise _err(where, arg, v, f"must be an int >= {minimum}")
    if v > MAX_INT:
        raise _err(where, arg, v, f"must be an int <= {MAX_INT}")
    return int(v)


def _pair(where, arg, v, minimum=1):
    """An int or a pair of ints (kept as given: int, or a 2-list)."""
    if _is_int(v):
        return _int(where, arg, v, minimum)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(e) and e >= minimum for e in v):
        if max(v) > MAX_INT:
            raise _err(where, arg, v, f"must be ints <= {MAX_INT}")
        return [int(e) for e in v]
    raise _err(where, arg, v, f"must be an int >= {minimum} or a pair of them")


def _float(where, arg, v, lo=None, hi=None, lo_open=False) -> float:
    try:
        ok = _is_num(v) and math.isfinite(float(v))
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        raise _err(where, arg, v, "must be a finite number")
    v = float(v)
    if abs(v) > MAX_FLOAT:
        raise _err(where, arg, v, f"must be within float32's range (at most {MAX_FLOAT:.4g} in magnitude)")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _err(where, arg, v, f"must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and v > hi:
        raise _err(where, arg, v, f"must be <= {hi}")
    return v


def _bool(where, arg, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise _err(where, arg, v, "must be true or false")
    return bool(v)


def _choice(where, arg, v, choices):
    if not isinstance(v, str) or v not in choices:
        raise _err(where, arg, v, f"must be one of {', '.join(map(str, choices))}")
    return v


def _unknown(where, config, known, owner):
    for k in config:
        if k not in known:
            raise _err(where, k, config[k], f"unknown setting; {owner} takes {', '.join(known) or 'none'}")


def _required(where, config, *names):
    """AnyDeviceError naming the first of ``names`` that ``config`` lacks."""
    for name in names:
        if name not in config:
            raise _err(where, name, None, "is required")


def _two(v):
    return (v, v) if _is_int(v) or isinstance(v, float) else tuple(v)


# ---- sizes ---------------------------------------------------------------------------------------
def _mem(nbytes: int) -> str:
    return f"{nbytes / 2**40:.1f} TiB" if nbytes >= 2**40 else plans._mem(nbytes)


def _over_limit(need: int, be=None) -> str | None:
    """None where ``need`` bytes fit the tensor limit (ANYDEVICE_MAX_TENSOR_MB; unset, half the memory
    free on ``be``'s device, the host's without one), else that limit as an error says it."""
    from ...system.config import tensor_limit
    limit, free, where = tensor_limit(be, need)
    if need <= limit:
        return None
    if free is None:
        return f"the limit ANYDEVICE_MAX_TENSOR_MB={limit / 2**20:g}"
    return f"the limit of {_mem(limit)} (half of the {_mem(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"
