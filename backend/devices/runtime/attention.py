"""The fused attention kernels' operand layout, shared by the backends that launch them
(kernels/attention.cl through the OpenCL backend, kernels/attention.cu through the CUDA backend):
which (..., L, E) / (..., E, S) / (..., S, Ev) / mask shapes the kernels take, and the flat batch
split into outer x inner with each operand's two strides (the ``ATT_BOFF`` of both kernels)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: the largest head dims the kernels take (their private arrays are sized by them)
MAX_HEAD_DIM = 256


def _batch_strides(shape, bat, inner):
    """Per dim of the output batch ``bat``: the element stride of an operand of batch shape
    ``shape`` (right-aligned, contiguous, ``inner`` elements an entry), 0 where it broadcasts."""
    nb = len(bat)
    s = (1,) * (nb - len(shape)) + tuple(shape)
    out, acc = [0] * nb, inner
    for d in reversed(range(nb)):
        out[d] = 0 if s[d] == 1 else acc
        acc *= s[d]
    return out


def _collapse(bat, st):
    """One stride for the dims ``bat`` (sizes) with strides ``st`` taken as one flat index, or
    None when they do not collapse (size-1 dims ignored)."""
    dims = [(n, s) for n, s in zip(bat, st) if n != 1]
    for (n0, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    return dims[-1][1] if dims else 0


def batch_split(bat, strides):
    """(inner count, [(outer stride, inner stride)] per operand) such that entry b of the flat
    batch starts at (b // inner) * so + (b % inner) * si in every operand; None if no split works."""
    for p in range(len(bat), -1, -1):
        pairs = []
        for st in strides:
            so, si = _collapse(bat[:p], st[:p]), _collapse(bat[p:], st[p:])
            if so is None or si is None:
                break
            pairs.append((so, si))
        else:
            return math.prod(bat[p:]), pairs
    return None


@dataclass(frozen=True)
class AttentionLayout:
    """One fused launch's sizes: output batch ``bat`` (B entries, split at ``bi``), per operand
    (q, kt, v, mask) its (outer, inner) batch strides, the mask's row and key strides."""

    bat: tuple
    B: int
    bi: int
    L: int
    E: int
    S: int
    Ev: int
    pairs: tuple  # ((qo, qi), (ko, ki), (vo, vi), (mo, mi))
    m_r: int
    m_k: int


def attention_layout(sq, sk, sv, ms=None, bat=None) -> AttentionLayout | None:
    """The layout of q (..., L, E), kt (..., E, S), v (..., S, Ev) and the additive mask of shape
    ``ms`` (None: none; broadcast to (..., L, S)), each contiguous, for the output batch ``bat``
    (None: the operands' broadcast batch; given, they must broadcast to it), or None for what the kernels do
    not take (a head dim over ``MAX_HEAD_DIM`` or 0, no keys, batch dims that do not broadcast, a
    mask whose broadcast the kernels cannot index, sizes past their int indices)."""
    L, E, S, Ev = sq[-2], sq[-1], sk[-1], sv[-1]
    if not (0 < E <= MAX_HEAD_DIM and 0 < Ev <= MAX_HEAD_DIM) or S == 0:
        return None
    try:
        full = tuple(np.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2], *(() if bat is None else (tuple(bat),))))
    except ValueError:
        return None
    if bat is not None and full != tuple(bat):
        return None
    bat = full
    strides = [_batch_strides(sq[:-2], bat, L * E), _batch_strides(sk[:-2], bat, E * S),
               _batch_strides(sv[:-2], bat, S * Ev)]
    m_r = m_k = 0
    if ms is not None:
        ms = (1,) * max(0, 2 - len(ms)) + tuple(ms)
        if len(ms) - 2 > len(bat) or ms[-2] not in (1, L) or ms[-1] not in (1, S):
            return None
        try:
            if tuple(np.broadcast_shapes(ms[:-2], bat)) != bat:
                return None
        except ValueError:
            return None
        m_k = int(ms[-1] != 1)
        m_r = ms[-1] if ms[-2] != 1 else 0
        strides.append(_batch_strides(ms[:-2], bat, ms[-2] * ms[-1]))
    split = batch_split(bat, strides)
    if split is None:
        return None
    bi, pairs = split
    B = math.prod(bat)
    if B * (L + 1) >= 2**31 or S >= 2**31:  # the kernels' int sizes (offsets are 64-bit)
        return None
    pairs = tuple(pairs[:3]) + ((tuple(pairs[3]) if ms is not None else (0, 0)),)
    return AttentionLayout(bat, B, bi, L, E, S, Ev, pairs, m_r, m_k)


def attention_args(lay: AttentionLayout, q, kt, v, mask, y, scale: float, causal: bool, row0: int,
                   buf=lambda a: a, off=lambda a: 0) -> tuple:
    """The kernels' arguments (signatures.py's att_cpu / ad_attention order) for ``lay``; ``buf`` /
    ``off`` give an operand's buffer and element offset (a CUDA array: itself and 0). Without a
    mask, q stands in for its buffer (never read)."""
    mk = mask if mask is not None else q
    (qo, qi), (ko, ki), (vo, vi), (mo, mi) = lay.pairs
    return (buf(q), off(q), qo, qi, buf(kt), off(kt), ko, ki, buf(v), off(v), vo, vi,
            buf(mk), off(mk), mo, mi, lay.m_r, lay.m_k, int(mask is not None), buf(y), 0,
            lay.B, lay.bi, lay.L, lay.S, float(scale), int(row0) + 1 if causal else 0)


def fused_block_rows(plan, budget_bytes: int) -> int:
    """Query rows per ``_attention_rows`` block for a device with a fused kernel: it keeps no
    scores, so only the workspace budget (not ``attention_block_bytes``) bounds a block's
    rows x S x batch floats; fewer blocks are fewer launches and no output pieces to join."""
    per_row = 4 * max(1, math.prod(plan.batch)) * plan.S
    rows = max(1, min(plan.L, budget_bytes // per_row))
    blocks = -(-plan.L // rows)
    return -(-plan.L // blocks)


def shared_tile(E: int, Ev: int, shared_bytes: int, bk: int = 32) -> int:
    """Keys a shared-memory tile (the GPU kernels' BK): ``bk`` halved until the kt and v tiles
    (4 * BK * (E + Ev) bytes) fit ``shared_bytes`` less 1 KiB."""
    while bk > 1 and 4 * bk * (E + Ev) > shared_bytes - 1024:
        bk //= 2
    return bk
