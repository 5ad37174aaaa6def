"""scaled_dot_product_attention in query blocks (a mixin of ``Backend``): the score matrix of
a block at a time, so long sequences stay within the workspace budget.

Per block of query rows: scores = (q * scale) @ k^T (+ the mask), an exact row softmax (the row
max subtracted, exp, sum) and (exp @ v) / sum. Built from ``_bmm`` (through ``_matmul``),
``_binary``, ``_unary``, ``_reduce``, ``_reshape``, ``_permute``, ``_expand``, ``_slice``,
``_pad`` and ``_concat_channels``, so every backend runs it.

A device with the fused kernel "attention" (``caps.fused``) computes each block in one kernel,
``_attention_fused``: an online softmax over the keys, never the block's scores in memory; it
returns None for what it does not take (the composite runs).

Like torch 2.13 on the CPU, a row whose keys are all masked out gives zeros: its max is -inf,
replaced by -FLT_MAX (so exp gives 0, not NaN), and the sum is taken as max(sum, 1) (a row with a
finite max has sum >= 1, so only those rows change).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from ..system.config import workspace_budget_bytes
from .plans import attention_plan

_FLT_MAX = float(np.finfo(np.float32).max)


def _is_bool(x) -> bool:
    if x is None:
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.dtype == torch.bool
    return isinstance(x, (np.ndarray, np.bool_, bool)) and np.asarray(x).dtype == np.bool_


@dataclass(frozen=True)
class CausalRows:
    """The causal mask of a block of query rows, not yet made: rows [row0, row0 + rows) of the
    (L, S) mask with 0 where key j <= query i and -inf elsewhere (all S keys, as torch: a NaN key
    or an Inf value past the diagonal gives NaN)."""

    row0: int
    rows: int
    S: int

    def mask(self, be):
        """The block's (rows, S) mask as a device array."""
        cols, rws = np.arange(self.S)[None, :], np.arange(self.row0, self.row0 + self.rows)[:, None]
        return be.to_device(np.where(cols <= rws, 0.0, -np.inf).astype(np.float32),
                            "scaled_dot_product_attention", "is_causal", constant=True)


class AttentionOps:
    """scaled_dot_product_attention, computed a block of query rows at a time."""

    #: target size of one block's scores (the workspace budget caps it further): measured on the
    #: 1x8x4096x64 bench case, blocks of 256 MB took 2x the time of 8-32 MB ones on NumPy (every
    #: fresh buffer that large is page-faulted in) and 1.2x on OpenCL (PoCL)
    attention_block_bytes = 16 * 2**20

    def scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        """torch.nn.functional.scaled_dot_product_attention: softmax(q k^T * scale + mask) v.

        query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); batch dims
        broadcast. attn_mask: bool (True takes part) or additive float, broadcast to (..., L, S).
        is_causal: query i sees keys j <= i (top-left aligned, as torch, also when L != S).
        enable_gqa: key/value heads (dim -3) are repeated to the query's. dropout_p must be 0."""
        op = "scaled_dot_product_attention"
        bool_mask = _is_bool(attn_mask)
        # half keys and values stay half where the fused kernel reads them ("half_attention")
        kind, like, q, k, v, m = self._inputs(op, ("attn_mask",), query=query, key=key, value=value,
                                              attn_mask=attn_mask, _half=("key", "value"), _cap="half_attention")
        plan = attention_plan(op, self._shape(q), self._shape(k), self._shape(v),
                              None if m is None else self._shape(m), dropout_p, is_causal, scale, enable_gqa)
        self._check_size(op, plan.out_shape)
        if math.prod(plan.out_shape) == 0 or plan.S == 0:  # nothing to attend to: zeros, as torch
            zero = self.to_device(np.zeros((1,) * len(plan.out_shape), np.float32), op, "output", constant=True)
            y = self._binary("add", self._expand(zero, plan.out_shape), 0.0)
            return self._out(y, kind, like)
        k = self._repeat_heads(k, plan.key_groups)
        v = self._repeat_heads(v, plan.value_groups)
        if m is not None and bool_mask:  # True -> 0, False -> -inf
            m = self._unary("log", m)
        y = self._attention(q, k, v, m, plan, bool(is_causal))
        return self._out(y, kind, like)

    def _repeat_heads(self, x, groups):
        """(..., H, S, D) -> (..., H * groups, S, D), each head repeated ``groups`` times in a row."""
        if groups == 1:
            return x
        s = self._shape(x)
        x = self._expand(self._reshape(x, s[:-2] + (1,) + s[-2:]), s[:-2] + (groups,) + s[-2:])
        return self._reshape(x, s[:-3] + (s[-3] * groups,) + s[-2:])

    def _attention_block_rows(self, plan) -> int:
        """Query rows per block: one block's scores (batch * rows * S floats) within the workspace
        budget (and ``attention_block_bytes``)."""
        per_row = 4 * max(1, math.prod(plan.batch)) * plan.S
        budget = min(workspace_budget_bytes(), self.attention_block_bytes)
        rows = max(1, min(plan.L, budget // per_row))
        blocks = -(-plan.L // rows)
        return -(-plan.L // blocks)  # the same rows in every block, within one

    def _attention(self, q, k, v, m, plan, causal):
        L, S = plan.L, plan.S
        sq = self._shape(q)
        if plan.scale != 1.0:
            q = self._binary("mul", q, plan.scale)
        nk = len(self._shape(k))
        kt = self._permute(k, tuple(range(nk - 2)) + (nk - 1, nk - 2))
        ms = None if m is None else self._shape(m)
        rows = self._attention_block_rows(plan)
        parts = []
        for r0 in range(0, L, rows):
            n = min(rows, L - r0)
            qb = q if n == L else self._slice(q, len(sq) - 2, r0, n, 1)
            mb = None
            if m is not None:
                mb = m if ms[-2] == 1 or n == L else self._slice(m, len(ms) - 2, r0, n, 1)
            elif causal:  # the block's causal mask, made by _attention_rows where it needs one
                mb = CausalRows(r0, n, S)
            parts.append(self._attention_rows(qb, kt, v, mb))
        if len(parts) == 1:
            return self._reshape(parts[0], plan.out_shape)
        B, Ev = math.prod(plan.batch), plan.Ev
        blocks = []
        for p in parts:
            p = self._reshape(p, (B, 1, self._shape(p)[-2], Ev))
            if self._shape(p)[2] < rows:
                p = self._pad(p, (0, rows - self._shape(p)[2], 0, 0), "zeros")
            blocks.append(p)
        y = self._reshape(self._concat_channels(blocks, B, 1, rows, Ev), (B, len(blocks) * rows, Ev))
        if len(blocks) * rows != L:
            y = self._slice(y, 1, 0, L, 1)
        return self._reshape(y, plan.out_shape)

    def _softmax_rows(self, s):
        """exp(s - max(row max, -FLT_MAX)) of the contiguous (rows, n) scores ``s`` (which it may
        overwrite) and each row's sum, at least 1 (rows, 1), fused; None where the backend has no
        such kernel (the composite runs)."""
        return None

    def _attention_rows(self, q, kt, v, m):
        """softmax(q @ kt + m) @ v for one block of query rows (q already scaled; m None, an additive
        mask or the block's ``CausalRows``): the fused kernel where the device has one and takes the
        block (a causal block without its mask in memory), else the scores, a row softmax and @ v."""
        causal = isinstance(m, CausalRows)
        if "attention" in self.caps.fused:
            y = self._attention_fused(q, kt, v, None if causal else m, 1.0, causal, row0=m.row0 if causal else 0)
            if y is not None:
                return y
        if causal:
            m = m.mask(self)
        s = self._matmul(q, kt, "scaled_dot_product_attention")
        if m is not None:
            s = self._binary("add", s, m)
        d = len(self._shape(s)) - 1
        ss = self._shape(s)
        fused = self._softmax_rows(self._reshape(s, (math.prod(ss[:-1]), ss[-1]))) if math.prod(ss) else None
        if fused is not None:  # the same steps in one pass over s, in place
            e, total = (self._reshape(a, ss[:-1] + (n,)) for a, n in zip(fused, (ss[-1], 1)))
            return self._binary("div", self._matmul(e, v, "scaled_dot_product_attention"), total)
        mx = self._binary("maximum", self._reduce("max", s, (d,), True), -_FLT_MAX)
        e = self._unary("exp", self._binary("sub", s, mx))
        del s
        total = self._binary("maximum", self._reduce("sum", e, (d,), True), 1.0)
        return self._binary("div", self._matmul(e, v, "scaled_dot_product_attention"), total)
