"""The CUDA backend's fused attention (the fused kernel "attention" of devices/interface.py, called
by ops/attention.py for each block of query rows), as a mixin of CudaBackend: kernels/attention.cu
(``ad_attention``, the portable GPU-family kernel: a group of WG threads takes WG query rows, the
keys stream through shared-memory K^T / V tiles of BK keys, online softmax) writes only the
(..., L, Ev) output; the memory is that of q, k^T, v and the output. The operand layout and the
argument tuple are the shared runtime's (runtime/attention.py), as for the OpenCL backend."""
from __future__ import annotations

from ...ops import dtypes
from ...system.config import workspace_budget_bytes
from ..runtime import pack_args
from ..runtime.attention import attention_args, attention_layout, fused_block_rows, shared_tile
from .tiles import ATT_BK, ATT_MMA_BKV, ATT_MMA_MAX_DIM, ATT_WG, ATTENTION, ATTENTION_MMA, STATIC_SMEM


class CudaAttention:
    """softmax(q kt * scale + mask) v in one launch (uses CudaBackend's cp, _function, _cast, _contig,
    _dtype, _empty, _enter)."""

    def _attention_block_rows(self, plan) -> int:
        """Query rows per ``_attention_rows`` block: the workspace budget alone (no scores kept)."""
        return fused_block_rows(plan, workspace_budget_bytes())

    def _att_operand(self, x, keep: int, dtype=dtypes.FLOAT32):
        """``x`` as a contiguous array of ``dtype``, its zero-stride (broadcast) dims before the last ``keep``
        taken once (size 1: the kernel's batch strides broadcast them again)."""
        if self._dtype(x) != dtype:
            x = self._cast(x, dtype)
        idx = tuple(slice(0, 1) if st == 0 and n > 1 and d < x.ndim - keep else slice(None)
                    for d, (n, st) in enumerate(zip(x.shape, x.strides)))
        x = x[idx] if idx else x
        return self._contig(x) if dtype == dtypes.FLOAT32 else self.cp.ascontiguousarray(x)

    def _att_half(self, q, kt, v, E: int, Ev: int, mask=None) -> int:
        """HK of the tensor-core kernel for these operands: 1 (float16) / 2 (bfloat16) where kt and v are
        both stored so ("half_attention": a half model's attention) on a GPU with half tiles, the head
        dims within ATT_MMA_MAX_DIM and no mask (the kernel's mask path has not run on a GPU yet: a masked
        attention keeps the float32 kernel); 0: ad_attention in float32."""
        dk, dv = self._dtype(kt), self._dtype(v)
        if dk != dv or dk == dtypes.FLOAT32 or not self._tiles.get("half") or max(E, Ev) > ATT_MMA_MAX_DIM \
                or mask is not None:
            return 0
        return 1 if dk == dtypes.FLOAT16 else 2

    def _attention_fused(self, q, kt, v, mask, scale, causal, row0=0):
        """q (..., L, E), kt = k^T (..., E, S), v (..., S, Ev) (batch dims broadcast), mask None or
        additive float broadcast to (..., L, S), causal: query i sees keys j <= row0 + i. Returns the
        (..., L, Ev) output, or None for what the kernel does not take (runtime/attention.py)."""
        full = attention_layout(q.shape, kt.shape, v.shape, None if mask is None else mask.shape)
        if full is None:
            return None
        self._enter()
        hk = self._att_half(q, kt, v, full.E, full.Ev, mask)
        if hk:  # the tensor cores: kt and v as stored, q too where it has their dtype (else float32)
            half = self._dtype(kt)
            qh = int(self._dtype(q) == half)
            q = self._att_operand(q, 2, half if qh else dtypes.FLOAT32)
            kt, v = self._att_operand(kt, 2, half), self._att_operand(v, 2, half)
        else:
            q, kt, v = self._att_operand(q, 2), self._att_operand(kt, 2), self._att_operand(v, 2)
        mask = None if mask is None else self._att_operand(mask, 0)
        lay = attention_layout(q.shape, kt.shape, v.shape, None if mask is None else mask.shape, bat=full.bat)
        if lay is None:
            return None
        y = self._empty(lay.bat + (lay.L, lay.Ev))
        if y.size == 0:
            return y
        if hk:
            fn = self._function(ATTENTION_MMA[0], ATTENTION_MMA[1], {"E": lay.E, "EV": lay.Ev, "HK": hk, "QH": qh, "KH": 1,
                                                                     "VH": 1, "BKV": ATT_MMA_BKV})
            fn((lay.B * -(-lay.L // 64),), (128,),
               pack_args(ATTENTION_MMA[1], attention_args(lay, q, kt, v, mask, y, scale, causal, row0)))
            return y
        wg, bk = self._att_geometry(lay.E, lay.Ev)
        fn = self._function(ATTENTION[0], ATTENTION[1], {"E": lay.E, "EV": lay.Ev, "WG": wg, "BK": bk})
        fn((lay.B * -(-lay.L // wg),), (wg,),
           pack_args(ATTENTION[1], attention_args(lay, q, kt, v, mask, y, scale, causal, row0)))
        return y

    def _att_geometry(self, E: int, Ev: int) -> tuple[int, int]:
        """(threads a group, keys a tile) for ad_attention: within the device's threads per block,
        the built kernel's own limit (its registers) and the shared memory a block may declare
        statically (the kt and v tiles, 4 * BK * (E + Ev) bytes)."""
        cache = self.__dict__.setdefault("_att_geom", {})
        hit = cache.get((E, Ev))
        if hit is not None:
            return hit
        props = self.cp.cuda.runtime.getDeviceProperties(self.index)
        smem = min(STATIC_SMEM, int(props.get("sharedMemPerBlock", STATIC_SMEM)))
        bk = shared_tile(E, Ev, smem, ATT_BK)
        wg = min(ATT_WG, 1 << (max(1, int(props.get("maxThreadsPerBlock", ATT_WG))).bit_length() - 1))
        while wg > 1:
            fn = self._function(ATTENTION[0], ATTENTION[1], {"E": E, "EV": Ev, "WG": wg, "BK": bk})
            if wg <= int(getattr(fn, "max_threads_per_block", wg)):
                break
            wg //= 2
        cache[(E, Ev)] = (wg, bk)
        return wg, bk
