"""First use on a CPU device, as a mixin of the OpenCL backend: PoCL generates a kernel's code at its first
launch (about 0.3 s each on this project's machine, in its worker threads), so while the self-check runs on
one core, a thread launches the common flat kernels (elementwise, reductions, selects) and the 3x3 direct
conv once on a tiny array on a command queue of its own, and their code is ready when the first workflow
asks (the self-check joins it: nothing of it runs once the backend is handed out). Its launches are not
counted (``kernel_launches``)."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

log = logging.getLogger("anydevice")


def _conv3x3(be, width: int):
    """A depthwise 3x3 conv (2 channels of 4 x ``width``, a box of 1/8, padding 1)."""
    img = np.linspace(0.0, 1.0, 8 * width, dtype=np.float32).reshape(1, 2, 4, width)
    return be.conv2d(be.to_device(img), be.to_device(np.full((2, 1, 3, 3), 0.125, np.float32)), padding=1, groups=2)


#: the ops whose kernels the warm thread launches (name, args builder): what nearly every workflow runs
WARM_OPS = (
    ("unary", lambda be, x: be.sqrt(x)), ("binary", lambda be, x: be.add(x, x)),
    ("binary scalar", lambda be, x: be.pow(x, 2.0)), ("reduce all", lambda be, x: be.max(x, None, keepdim=True)),
    ("reduce min", lambda be, x: be.min(x, None, keepdim=True)), ("reduce dim", lambda be, x: be.mean(x, 1, keepdim=True)),
    ("broadcast", lambda be, x: be.div(be.sub(x, be.sum(x, 0, keepdim=True)), 2.0)),
    ("clamp", lambda be, x: be.clamp(x, 0.0, 1.0)), ("where", lambda be, x: be.where(be.gt(x, 0.5), x, x)),
    ("permute", lambda be, x: be.permute(x, (1, 0))),
    # the direct conv's 3x3 stride-1 build (blur, sharpen, edge filters and small 3x3 layers take it: rows
    # of 24 values or more), on wide rows and on narrow ones (zero-padded first: opencl/linalg.py _conv_path)
    ("conv 3x3", lambda be, x: _conv3x3(be, 160)), ("conv 3x3 narrow", lambda be, x: _conv3x3(be, 32)),
)


class CLWarm:
    """The launch queue (``queue``: the warm thread's own there) and the background warm-up of OpenCLBackend."""

    #: the warm thread's thread-local (its ``queue``) while a warm-up runs; None otherwise (the fast path)
    _warm_tls = None

    @property
    def queue(self):
        """The command queue a launch or copy goes to: this thread's warm-up queue, else the backend's."""
        tls = self._warm_tls
        if tls is None:
            return self._main_queue
        q = getattr(tls, "queue", None)
        return self._main_queue if q is None else q

    def _counted(self) -> int:
        """1 for a launch ``kernel_launches`` counts (any but the warm thread's), else 0."""
        tls = self._warm_tls
        return 1 if tls is None or getattr(tls, "queue", None) is None else 0

    def _warm_in_background(self):
        """On a CPU device (PoCL): the started warm-up thread (the caller joins it), else None."""
        if not self.is_cpu_device or self.family != "cpu" or self._warm_tls is not None:
            return None
        self._warm_tls = threading.local()
        t = threading.Thread(target=self._warm_flat, name="anydevice-opencl-warm", daemon=True)
        t.start()
        return t

    def _warm_flat(self) -> None:
        tls = self._warm_tls
        t0 = time.perf_counter()
        try:
            self.pool.private.on = True  # this queue's buffers are its own (memory.py)
            tls.queue = self.cl.CommandQueue(self.ctx, self.dev)
            x = self.to_device(np.linspace(0.0, 1.0, 8, dtype=np.float32).reshape(2, 4), "warm", "x")
            for name, op in WARM_OPS:
                try:
                    op(self, x)
                except Exception as exc:  # noqa: BLE001 - a warm-up is best effort; the op says it again in use
                    log.debug("anydevice: opencl warm-up of %s failed: %s", name, exc)
            tls.queue.finish()
        except Exception as exc:  # noqa: BLE001
            log.debug("anydevice: opencl warm-up stopped: %s", exc)
        finally:
            self.pool.private.on = False
            tls.queue = None
            self._warm_tls = None  # the other threads' launches take the fast path again
        log.debug("anydevice: opencl warm-up of %d ops took %.2f s", len(WARM_OPS), time.perf_counter() - t0)
