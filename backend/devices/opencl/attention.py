"""The OpenCL device's fused attention (the fused kernel "attention" of devices/interface.py, called
by ops/attention.py for each block of query rows): kernels/attention.cl's att_cpu (CPU family:
a work item per tile of query rows, vectorised over the keys) and att_gpu (GPU family: a work
group per tile of query rows, K/V tiles in local memory). Both stream the keys with an online
softmax and write only the (..., L, Ev) output: the memory is that of q, k, v and the output."""
from __future__ import annotations

import math

import numpy as np

from ...system.config import workspace_budget_bytes

#: the largest head dims the kernels take (their private arrays are sized by them)
MAX_HEAD_DIM = 256
#: CPU family: query rows one work item computes (TQ in attention.cl), RT of them at a time (RT)
CPU_TQ, CPU_RT = 64, 4
#: CPU family: keys a block (KB: a multiple of 16; 64 measured ~6% faster than 32 on the bench case)
CPU_KB = 64
#: GPU family: the work group (query rows of a group) and key tile the kernel asks for first
GPU_WG, GPU_BK = 64, 32


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


class CLAttention:
    """softmax(q kt * scale + mask) v in one launch, online softmax (a mixin of OpenCLBackend)."""

    def _attention_block_rows(self, plan) -> int:
        """Query rows per ``_attention_rows`` block: the fused kernel keeps no scores, so only the
        workspace budget (not ``attention_block_bytes``) bounds a block's rows x S x batch floats;
        fewer blocks are fewer launches and no output pieces to join."""
        per_row = 4 * max(1, math.prod(plan.batch)) * plan.S
        rows = max(1, min(plan.L, workspace_budget_bytes() // per_row))
        blocks = -(-plan.L // rows)
        return -(-plan.L // blocks)

    def _attention_fused(self, q, kt, v, mask, scale, causal, row0=0):
        """q (..., L, E), kt = k^T (..., E, S), v (..., S, Ev) (batch dims broadcast), mask None or
        additive float broadcast to (..., L, S), causal: query i sees keys j <= row0 + i. Returns the
        (..., L, Ev) output, or None for what the kernels do not take (a head dim over
        ``MAX_HEAD_DIM`` or 0, a mask whose broadcast the kernels cannot index)."""
        sq, sk, sv = q.shape, kt.shape, v.shape
        L, E, S, Ev = sq[-2], sq[-1], sk[-1], sv[-1]
        if not (0 < E <= MAX_HEAD_DIM and 0 < Ev <= MAX_HEAD_DIM) or S == 0:
            return None
        try:
            bat = tuple(np.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2]))
        except ValueError:
            return None
        strides = [_batch_strides(sq[:-2], bat, L * E), _batch_strides(sk[:-2], bat, E * S),
                   _batch_strides(sv[:-2], bat, S * Ev)]
        m_r = m_k = 0
        if mask is not None:
            ms = (1,) * max(0, 2 - len(mask.shape)) + tuple(mask.shape)
            if len(ms) - 2 > len(bat) or ms[-2] not in (1, L) or ms[-1] not in (1, S):
                return None
            if tuple(np.broadcast_shapes(ms[:-2], bat)) != bat:
                return None
            m_k = int(ms[-1] != 1)
            m_r = ms[-1] if ms[-2] != 1 else 0
            strides.append(_batch_strides(ms[:-2], bat, ms[-2] * ms[-1]))
        split = batch_split(bat, strides)
        if split is None:
            return None
        bi, pairs = split
        B = math.prod(bat)
        if B * (L + 1) >= 2**31 or S >= 2**31:  # the kernels' int sizes (offsets are long)
            return None
        y = self._empty(bat + (L, Ev))
        if y.size == 0:
            return y
        mk = mask if mask is not None else q
        (qo, qi), (ko, ki), (vo, vi) = pairs[:3]
        mo, mi = pairs[3] if mask is not None else (0, 0)
        args = (q.buffer, q.offset, qo, qi, kt.buffer, kt.offset, ko, ki, v.buffer, v.offset, vo, vi,
                mk.buffer, mk.offset, mo, mi, m_r, m_k, int(mask is not None), y.buffer, 0,
                B, bi, L, S, float(scale), int(row0) + 1 if causal else 0)
        if self.family == "cpu":
            tq = CPU_TQ
            self._run("att_cpu", (B * -(-L // tq),), (1,), *args,
                      params={"E": E, "EV": Ev, "TQ": tq, "RT": CPU_RT, "KB": CPU_KB})
            return y
        wg, bk = self._att_gpu_geometry(E, Ev)
        self._run("att_gpu", (B * -(-L // wg) * wg,), (wg,), *args, params={"E": E, "EV": Ev, "WG": wg, "BK": bk})
        return y

    def _att_gpu_geometry(self, E, Ev):
        """(work group, key tile) for att_gpu: within the device's work-group size, the built
        kernel's own limit and the local memory (the kl and vl tiles, 4 * BK * (E + Ev) bytes)."""
        cache = self.__dict__.setdefault("_att_geom", {})
        hit = cache.get((E, Ev))
        if hit is not None:
            return hit
        local = int(self.dev.local_mem_size)
        bk = GPU_BK
        while bk > 1 and 4 * bk * (E + Ev) > local - 1024:
            bk //= 2
        wg = min(GPU_WG, 1 << (max(1, int(self.dev.max_work_group_size)).bit_length() - 1))
        while True:
            k = self._kernel("att_gpu", {"E": E, "EV": Ev, "WG": wg, "BK": bk})
            limit = int(k.get_work_group_info(self.cl.kernel_work_group_info.WORK_GROUP_SIZE, self.dev))
            if wg <= limit or wg == 1:
                break
            wg //= 2
        cache[(E, Ev)] = (wg, bk)
        return wg, bk
