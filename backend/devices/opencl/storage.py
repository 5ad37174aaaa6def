"""OpenCL arrays in and out: allocation, upload and download, and the dtype conversions (float16 and
bfloat16 are stored as 16-bit words, ``CLHalf``; kernels/elementwise.cl cast_* converts on the device)."""
from __future__ import annotations

import math

import numpy as np

from ...ops import dtypes
from ...ops.quant import FORMATS
from .memory import CLArray, CLHalf, CLQuant

F32 = np.float32


class CLStorage:
    """The OpenCL backend's allocation and conversion primitives (needs ``pool``, ``cl``, ``queue``, ``dev``,
    ``is_cpu_device``, ``_run`` and ``_flat_geometry`` of the backend)."""

    #: whether ``_wrap_host`` wraps (False: every upload copies, e.g. to compare the two paths)
    share_host = True
    #: the most alignment (bytes) a wrapped host array needs: the widest CPU vector load (AVX-512) and
    #: torch's CPU allocator's alignment
    WRAP_ALIGN = 64

    def _wrap_host(self, a):
        """``a`` (float32, C-contiguous, non-empty, aligned) used in place on a CPU device, where buffers
        are host RAM anyway (PoCL uses a ``CL_MEM_USE_HOST_PTR`` pointer as it is); None elsewhere
        (the caller copies). The alignment asked is the device's ``mem_base_addr_align`` up to
        WRAP_ALIGN: that base alignment (1024 bits on PoCL) is the largest OpenCL type's (long16),
        while the kernels read float buffers through scalars and vloadn (element alignment), and a
        torch CPU tensor of any size is 64-byte aligned only (asking 128 would wrap none of them)."""
        if not (self.share_host and self.is_cpu_device and isinstance(a, np.ndarray) and a.dtype == F32
                and a.size and a.flags.c_contiguous):
            return None
        align = max(4, min(int(self.dev.mem_base_addr_align) // 8, self.WRAP_ALIGN))
        if a.ctypes.data % align:
            return None
        try:
            block = self.pool.wrap(a)
        except Exception:  # a driver that refuses the pointer (or a read-only array): copied instead
            return None
        return CLArray(a.shape, block, 0)

    def _empty(self, shape, dtype="float32"):
        n = max(1, math.prod(shape))
        if dtype != "float32":
            return CLHalf(shape, self.pool.alloc(2 * n), dtype)
        return CLArray(shape, self.pool.alloc(4 * n), 0)

    def _from_numpy(self, a, dtype="float32"):
        if dtype != "float32":  # rounded on the host, uploaded as 16-bit words: half the bytes
            a = np.asarray(dtypes.host_store(np.asarray(a, F32), dtype), order="C").view(np.uint16)
        else:
            a = np.asarray(a, dtype=F32, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        out = self._empty(a.shape, dtype)
        if a.size:
            self._q_upload(out.buffer, a)
        return out

    def _to_numpy(self, x):
        if isinstance(x, CLHalf):  # 16-bit words down, float32 on the host
            bits = np.empty(x.shape, np.uint16)
            if bits.size:
                self._q_read(bits, x.buffer, 2 * x.offset)
            return dtypes.from_bf16(bits) if x.dtype == dtypes.BFLOAT16 else bits.view(np.float16).astype(F32)
        out = np.empty(x.shape, F32)
        if out.size:
            self._q_read(out, x.buffer, 4 * x.offset)
        return out

    def _dtype(self, x):
        return x.dtype if isinstance(x, (CLHalf, CLQuant)) else dtypes.FLOAT32

    def _from_quant(self, q):
        """A host QTensor's bytes (and scales) uploaded as they are: the kernels decode them."""
        data = np.ascontiguousarray(q.data)
        block = self.pool.alloc(max(4, data.size))
        if data.size:
            self._q_upload(block.buf, data)
        scale = None if q.scale is None else self._from_numpy(q.scale)
        return CLQuant(q.fmt, q.shape, block, data.size, scale, q.rowlen)

    def _dequant(self, w):
        """A CLQuant's float32 values (kernels/dequant.cu, the CUDA backend's kernel as OpenCL C; a copy for one op)."""
        out = self._empty(w.shape)
        n = out.size
        if n:
            sb, wq_k = (w.scale.buffer, w.rowlen) if w.scale is not None else (w.buffer, 0)
            wg = self._group()
            self._run("ad_dequant", (min(-(-n // wg), 4096) * wg,), (wg,), w.buffer, out.buffer, n, sb, wq_k,
                      params={"WQ": FORMATS[w.fmt].code})
        return out

    def _cast(self, x, dtype):
        """float32 <-> float16/bfloat16 on the device (kernels/elementwise.cl cast_*)."""
        have = self._dtype(x)
        if have == dtype:
            return x
        if have != dtypes.FLOAT32 and dtype != dtypes.FLOAT32:
            return self._cast(self._cast(x, dtypes.FLOAT32), dtype)
        out = self._empty(x.shape, dtype)
        n = x.size
        if n:
            g, l, chunk = self._flat_geometry(n)
            if dtype == dtypes.FLOAT32:
                self._run("cast_to_f32", g, l, x.buffer, x.offset, out.buffer, n, chunk, int(have == dtypes.BFLOAT16))
            else:
                self._run("cast_from_f32", g, l, x.buffer, x.offset, out.buffer, n, chunk,
                          int(dtype == dtypes.BFLOAT16))
        return out

    def _memory_peak(self, reset: bool = False):
        """The most bytes the backend's arrays held at once since the last reset: the buffer pool's live
        bytes at their peak, plus the host memory the device reads in place now (``pool.wrapped``: shared
        float32 weights; memory the model needs on the device, though not a copy of its own)."""
        if reset:
            return self.pool.reset_peak() + self.pool.wrapped
        self.pool._drain()
        return self.pool.peak + self.pool.wrapped
