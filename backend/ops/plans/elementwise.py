"""Elementwise, broadcast, reduction-dim and matmul/linear plans; the unary ops' parameters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...system.errors import AnyDeviceError
from .args import _check_choice, _is_int, _number, planned


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
