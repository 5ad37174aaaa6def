"""Single arguments (ints, pairs, numbers, choices), the op and argument vocabularies and the one size
check (``planned``): the helpers every other plan, and the learnable layers' settings, build on."""
from __future__ import annotations

import math

import numpy as np

from ...system.errors import AnyDeviceError


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


# ---- robustness: argument rules added for the robust-ops work ------------------------------------
def planned(op: str, shape, arg: str = "output", backend=None) -> tuple:
    """The one size check: every plan passes the output shape it computed (and the nodes the
    constants they build) through here; over ANYDEVICE_MAX_TENSOR_MB it is refused, naming ``arg``.
    The limit is ``backend``'s; without one, that of the backend whose op is running (each of
    ``Backend``'s ops runs in ``memstat.planning``), the host's outside any op."""
    from ...system.config import tensor_limit
    from ...system.memstat import CURRENT_BACKEND
    shape = tuple(int(v) for v in shape)
    limit, free, where = tensor_limit(backend if backend is not None else CURRENT_BACKEND.get(), 4 * math.prod(shape))
    if arg == "output":
        check_size(op, shape, limit, free, where)
    elif 4 * math.prod(shape) > limit:
        raise AnyDeviceError(op, arg, shape, f"would build a {shape} float32 array of {4 * math.prod(shape) / 2**30:.1f} "
                             f"GiB, over the limit of {_mem(limit)}"
                             + (" (ANYDEVICE_MAX_TENSOR_MB)" if free is None else f" (half of the {_mem(free)} free "
                                f"in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"))
    return shape


# ---- a network spec's settings (learn/layers): the op is "network <where>", where names the layer ------
#: a spec may come from a file, so it is untrusted: ints within MAX_INT, floats finite and within
#: float32's range, no unknown settings
SPEC_OP = "network"
#: the largest int setting (channels, features, kernel sizes, strides, paddings...) and input size
MAX_INT = 2**31 - 1
#: float settings must fit float32 (the kernels take them as such): 1e308 is refused, not made inf
MAX_FLOAT = float(np.finfo(np.float32).max)


def _err(where: str, arg: str, value, reason: str) -> AnyDeviceError:
    try:
        return AnyDeviceError(f"{SPEC_OP} {where}", arg, value, reason)
    except RecursionError:  # a value nested too deep to show
        return AnyDeviceError(f"{SPEC_OP} {where}", arg, f"<{type(value).__name__} nested too deep to show>", reason)


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
        ok = is_scalar(v) and math.isfinite(float(v))
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
