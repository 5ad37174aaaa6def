"""Scaled dot-product attention (ops/attention.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...system.errors import AnyDeviceError
from .args import _number
from .elementwise import broadcast_shapes


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
