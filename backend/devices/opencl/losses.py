"""Cross entropy with class-index targets on OpenCL, forward and backward in one launch each (capability
"cross_entropy"; kernels/loss.cl)."""
from __future__ import annotations

import numpy as np


class CLLosses:
    """The OpenCL device's fused losses (a mixin of OpenCLBackend)."""

    def _targets(self, t):
        """The host class indices as a read-only int64 device buffer, copied when it is made (no queue
        command: a blocking upload would wait for every queued kernel first)."""
        cl = self.cl
        t = np.ascontiguousarray(t, dtype=np.int64)
        rec = self.recording()
        if rec is not None and rec.ok:  # a recorded upload, pinned (replayed from the step's new targets)
            block = self.pool.alloc(max(8, t.nbytes))
            self._q_upload(block.buf, t)
            return block.buf
        return cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=t)

    def _cross_entropy_rows(self, x, t, ignore_index: int):
        """"cross_entropy": -log_softmax(x)[t] per position of the float32 (N, C, L) ``x`` (classes along C)
        -> (N * L,) float32, 0 where t is ignore_index; ``t`` host int64 (N * L,). None: not float32."""
        if self._dtype(x) != "float32":
            return None
        N, C, L = x.shape
        loss = self._empty((N * L,))
        self._run("ce_rows", (N * L,), None, x.buffer, x.offset, self._targets(t), loss.buffer, loss.offset,
                  N, C, L, int(ignore_index))
        return loss

    def _cross_entropy_grad(self, x, t, ignore_index: int, gy, per_position: bool, den: float):
        """"cross_entropy": dL/dx of ``_cross_entropy_rows`` for dL/dloss ``gy`` (one value, or one a position
        with ``per_position``), divided by ``den``. None: not float32."""
        if self._dtype(x) != "float32" or self._dtype(gy) != "float32":
            return None
        N, C, L = x.shape
        gx = self._empty((N, C, L))
        self._run("ce_grad", (N * L,), None, x.buffer, x.offset, self._targets(t), gy.buffer, gy.offset,
                  int(per_position), den, gx.buffer, gx.offset, N, C, L, int(ignore_index))
        return gx
