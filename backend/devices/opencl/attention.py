"""The OpenCL device's fused attention (the fused kernel "attention" of devices/interface.py, called
by ops/attention.py for each block of query rows): kernels/attention.cl's att_cpu (CPU family:
a work item per tile of query rows, vectorised over the keys; on narrow vectors without a mask or causal
rows att_cpu_rows, vectorised over 16 query rows) and kernels/attention.cu's
ad_attention (GPU family, the portable kernel the CUDA backend runs too: a work group per tile of
query rows, K/V tiles in local memory). Both stream the keys with an online
softmax and write only the (..., L, Ev) output: the memory is that of q, k, v and the output.
The operand layout (shapes taken, batch split, argument tuple) is the shared runtime's
(runtime/attention.py), which the CUDA backend's kernels/attention.cu launch uses too."""
from __future__ import annotations

from ...system.config import workspace_budget_bytes
from ..runtime.attention import MAX_HEAD_DIM, attention_args, attention_layout, batch_split, fused_block_rows, shared_tile  # noqa: F401

#: CPU family: query rows one work item computes (TQ in attention.cl), RT of them at a time (RT)
CPU_TQ, CPU_RT = 64, 4
#: CPU family: keys a block (KB: a multiple of 16; 64 measured ~6% faster than 32 on the bench case)
CPU_KB = 64
#: CPU family on narrow vectors (AVX2's 16 ymm; tuning.py): RT 2 rows, blocks of 32 keys, and the value dim
#: in passes of at most NARROW_CV_FLOATS sums a row group (measured on a 2-core AVX2 EPYC, 1x8x4096 heads of
#: 64 / 40: RT 4 KB 64 0.53 / 0.62 of PyTorch; RT 2 KB 32 0.75 / 1.08 before the value passes). The value vectors
#: are 8 lanes (VW8) where that gives a pass more sums: a head of 80 in 16-lane vectors made passes of one vector a
#: row, 4 accumulators (1x8x1024x80: 32.3 -> 23.3 ms, PyTorch 21.4; 1x8x256x160 5.35 -> 4.44, PyTorch 3.34)
NARROW_RT, NARROW_KB, NARROW_CV_FLOATS = 2, 32, 96


def value_vectors(ev: int, vw8: bool = False) -> tuple[int, int]:
    """(VW, NV) of attention.cl: the value dim's vector width and count (``vw8``: at most 8 lanes, its VW8)."""
    vw = 16 if ev % 16 == 0 and not vw8 else 8 if ev % 8 == 0 else 4 if ev % 4 == 0 else 1
    return vw, ev // vw


def cpu_params(E: int, Ev: int, narrow: bool) -> dict:
    """att_cpu's build options for head dims E, Ev (``narrow``: the device's vectors are at most 8 floats)."""
    if not narrow:
        return {"E": E, "EV": Ev, "TQ": CPU_TQ, "RT": CPU_RT, "KB": CPU_KB}
    best = None
    for vw8 in (False, True):  # the most sums a pass within NARROW_CV_FLOATS (a tie: the wider vectors)
        vw, nv = value_vectors(Ev, vw8)
        cv = max([d for d in range(1, nv + 1) if nv % d == 0 and NARROW_RT * d * vw <= NARROW_CV_FLOATS] or [1])
        if best is None or cv * vw > best[0]:
            best = (cv * vw, vw8, cv)
    return {"E": E, "EV": Ev, "TQ": CPU_TQ, "RT": NARROW_RT, "KB": NARROW_KB, "CV": best[2], **({"VW8": 1} if best[1] else {})}


#: CPU family on narrow vectors, no mask and not causal: att_cpu_rows (the scores as vectors over 16 query rows, the
#: softmax's bookkeeping once per 16 rows), KJ keys a score pass
CPU_ROWS = True
ROWS_KJ = 4
#: att_cpu_rows from this many query rows (its groups are 16 rows; 8 heads x 4096 keys x 64, medians of 15: 1 row
#: 6.4 ms against att_cpu's 5.3, 4 rows 5.8 / 4.6, 8 rows 5.1 / 5.8, 16 rows 5.9 / 7.4)
ROWS_MIN_L = 8


#: CPU family on wide vectors (AVX-512's 32 zmm), no mask and not causal, value dims up to WIDE_ROWS_MAX_EV:
#: att_cpu_rows with att_cpu's wide tiles (TQ, RT, KB 64), WIDE_KJ keys a score pass and two 16-row groups a pass
#: (G2: their two loads share the key broadcasts); where the value dim is not a multiple of 16 (att_cpu's value vectors
#: would be 8 lanes or fewer: a head of 40) the value pass over the rows too (VR: VC float16 sums of 16 rows a pass,
#: VC the largest divisor of the value dim up to WIDE_VC_MAX, at least WIDE_VC_MIN). 2-core Intel Xeon with AVX-512,
#: medians of 9-15 alternating in one process, att_cpu -> this (PyTorch): 1x8x4096x40 119.4 -> 94.8 ms without G2,
#: 103.4 -> 98.5 with it (99.4-108.5; KB 32 level, KJ 16 level, KJ 4 +20%, VC 10 +6%), 1x8x4096x64 150.3 -> 142.6
#: (141.4; VR with VC 16 instead: 156, TQ 128 level), 1x8x1024x80 11.7 -> 11.1 (10.9; VR 12.9); 1x8x256x160 2.4
#: against 2.7 (att_cpu kept)
CPU_ROWS_WIDE = True
WIDE_KJ, WIDE_VC_MAX, WIDE_VC_MIN, WIDE_ROWS_MAX_EV = 8, 24, 8, 128
#: (rows_params) 1x8x4096 queries, 77 keys, medians of 15 alternating in one process: a head of 64 7.81 -> 6.08 ms
#: (PyTorch 7.58), 40 6.00 -> 3.87 and 5.03 -> 4.94 (5.6-6.1); 1x8x1024x80 level; 4096 keys level either way
WIDE_SHORT_KB = 32


def wide_value_columns(Ev: int) -> int:
    """VC of att_cpu_rows' value pass over rows: the largest divisor of Ev up to WIDE_VC_MAX."""
    return max(d for d in range(1, min(Ev, WIDE_VC_MAX) + 1) if Ev % d == 0)


def rows_params(E: int, Ev: int, narrow: bool = True, S: int = 0) -> dict:
    """att_cpu_rows' build options for S keys. Narrow vectors: att_cpu's narrow ones (the value pass), KJ keys a score
    pass; wide: att_cpu's wide ones, two row groups a score pass, the value pass over rows (VR) where it takes it, and
    blocks of WIDE_SHORT_KB keys where those pad fewer keys than att_cpu's (a text context of 77 keys: 96 computed, not
    128)."""
    if narrow:
        return {**cpu_params(E, Ev, True), "KJ": ROWS_KJ}
    vr = {"VR": 1, "VC": wide_value_columns(Ev)} if Ev % 16 and wide_value_columns(Ev) >= WIDE_VC_MIN else {}
    p = {**cpu_params(E, Ev, False), "KJ": WIDE_KJ, "G2": 2, **vr}
    short = WIDE_SHORT_KB
    if S and -(-S // short) * short < -(-S // p["KB"]) * p["KB"]:
        p["KB"] = short
    return p


def takes_rows(narrow: bool, Ev: int) -> bool:
    """Whether a call without a mask or causal rows (and at least ROWS_MIN_L query rows) takes att_cpu_rows."""
    if narrow:
        return CPU_ROWS
    return CPU_ROWS_WIDE and Ev <= WIDE_ROWS_MAX_EV


#: GPU family: the work group (query rows of a group) and key tile the kernel asks for first
GPU_WG, GPU_BK = 64, 32


class CLAttention:
    """softmax(q kt * scale + mask) v in one launch, online softmax (a mixin of OpenCLBackend)."""

    def _attention_block_rows(self, plan) -> int:
        """Query rows per ``_attention_rows`` block: the workspace budget alone (no scores kept)."""
        return fused_block_rows(plan, workspace_budget_bytes())

    def _attention_fused(self, q, kt, v, mask, scale, causal, row0=0):
        """q (..., L, E), kt = k^T (..., E, S), v (..., S, Ev) (batch dims broadcast), mask None or
        additive float broadcast to (..., L, S), causal: query i sees keys j <= row0 + i. Returns the
        (..., L, Ev) output, or None for what the kernels do not take (a head dim over
        ``MAX_HEAD_DIM`` or 0, a mask whose broadcast the kernels cannot index)."""
        lay = attention_layout(q.shape, kt.shape, v.shape, None if mask is None else mask.shape)
        if lay is None:
            return None
        B, L, E, Ev = lay.B, lay.L, lay.E, lay.Ev
        y = self._empty(lay.bat + (L, Ev))
        if y.size == 0:
            return y
        args = attention_args(lay, q, kt, v, mask, y, scale, causal, row0,
                              buf=lambda a: a.buffer, off=lambda a: a.offset)
        if self.family == "cpu":
            narrow = self.narrow_vectors
            if mask is None and not causal and L >= ROWS_MIN_L and takes_rows(narrow, Ev):
                self._run("att_cpu_rows", (B * -(-L // CPU_TQ),), (1,), *args, params=rows_params(E, Ev, narrow, lay.S))
                return y
            self._run("att_cpu", (B * -(-L // CPU_TQ),), (1,), *args, params=cpu_params(E, Ev, self.narrow_vectors))
            return y
        wg, bk = self._att_gpu_geometry(E, Ev)
        self._run("ad_attention", (B * -(-L // wg) * wg,), (wg,), *args, params={"E": E, "EV": Ev, "WG": wg, "BK": bk})
        return y

    def _att_gpu_geometry(self, E, Ev):
        """(work group, key tile) for ad_attention: within the device's work-group size, the built
        kernel's own limit and the local memory (the kl and vl tiles, 4 * BK * (E + Ev) bytes)."""
        cache = self.__dict__.setdefault("_att_geom", {})
        hit = cache.get((E, Ev))
        if hit is not None:
            return hit
        bk = shared_tile(E, Ev, self.local_bytes, GPU_BK)
        wg = self._group(GPU_WG)
        while True:
            k = self._kernel("ad_attention", {"E": E, "EV": Ev, "WG": wg, "BK": bk})
            limit = int(k.get_work_group_info(self.cl.kernel_work_group_info.WORK_GROUP_SIZE, self.dev))
            if wg <= limit or wg == 1:
                break
            wg //= 2
        cache[(E, Ev)] = (wg, bk)
        return wg, bk
