"""The OpenCL backend's warm-up (backend/devices/opencl/warm.py): on a CPU device a thread launches the
common flat kernels once on a queue of its own while the self-check runs, so PoCL has generated their code
when the first workflow asks. Its launches and transfers are nobody's; the ops it ran give what they gave
before; the self-check joins it; a GPU-family backend starts none."""
from __future__ import annotations

import threading

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    _BE = opencl.create("opencl", 0)
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

from anydevice.backend.devices.opencl import warm
from anydevice.backend.system import selfcheck


def _cpu():
    be = opencl.create("opencl", 0)
    if not (be.is_cpu_device and be.family == "cpu"):
        pytest.skip(f"{be.device}: the warm-up is for CPU devices (PoCL)")
    return be


def test_the_warm_thread_builds_the_flat_kernels_uncounted():
    be = _cpu()
    launches, counts = be.kernel_launches(), be.transfers()
    t = be._warm_in_background()
    assert isinstance(t, threading.Thread) and t.daemon
    t.join(selfcheck.WARM_JOIN_S)
    assert not t.is_alive()
    assert be.kernel_launches() == launches  # the warm thread's launches are no user's
    built = {k[0] for k in be._kernels}
    assert {"unary"} <= built and len(built) >= 5, built
    assert be.queue is be._main_queue  # this thread launches on the backend's queue
    selfcheck._uncount(be, counts)
    assert be.transfers() == counts
    x = np.linspace(-1.0, 2.0, 24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(be.to_numpy(be.sqrt(np.abs(x))), np.sqrt(np.abs(x)))
    np.testing.assert_array_equal(be.to_numpy(be.clamp(x, 0.0, 1.0)), np.clip(x, 0.0, 1.0))
    np.testing.assert_allclose(be.to_numpy(be.max(x, None, keepdim=True)), x.max(keepdims=True).reshape(1, 1))


def _conv3x3(width):
    """A warm conv's result (2 channels of 4 x width, each its own 3x3 box of 1/8, zero padding), by NumPy."""
    img = np.linspace(0.0, 1.0, 8 * width, dtype=np.float32).astype(np.float64).reshape(1, 2, 4, width)
    p = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    return sum(p[:, :, i:i + 4, j:j + width] for i in range(3) for j in range(3)) * 0.125


def test_every_warm_op_runs_and_gives_the_numpy_result():
    """WARM_OPS on the backend against NumPy's values (a warm-up op that fails would be logged and skipped:
    here none may)."""
    be = _cpu()
    x = np.linspace(0.0, 1.0, 8, dtype=np.float32).reshape(2, 4)
    want = {"unary": np.sqrt(x), "binary": x + x, "binary scalar": x ** 2, "reduce all": x.max(keepdims=True),
            "reduce min": x.min(keepdims=True), "reduce dim": x.mean(1, keepdims=True),
            "broadcast": (x - x.sum(0, keepdims=True)) / 2, "clamp": np.clip(x, 0, 1), "where": x, "permute": x.T,
            "conv 3x3": _conv3x3(160), "conv 3x3 narrow": _conv3x3(32)}
    assert [n for n, _ in warm.WARM_OPS] == list(want)
    for name, op in warm.WARM_OPS:
        np.testing.assert_allclose(be.to_numpy(op(be, be.to_device(x))), want[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_the_gpu_family_starts_no_warm_thread():
    be = opencl.create("opencl", 0, family="gpu")
    assert be._warm_in_background() is None


def test_the_warm_threads_buffers_never_meet_the_pool():
    """The warm thread launches on a queue of its own: a buffer this thread dropped (its commands maybe still
    queued) is never handed to it, and its own buffers never enter the free lists (the self-check's conv came
    out wrong at first use on a cold cache when the warm queue rewrote a buffer the main queue still read)."""
    be = _cpu()
    pool = be.pool
    mine = be.to_device(np.ones(1000, np.float32))
    del mine
    pooled = pool.pooled  # the dropped buffer is in the free lists now
    assert pooled > 0
    got = {}

    def other():
        pool.private.on = True
        try:
            blk = pool.alloc(4000)
            got["pool"], got["pooled"] = blk.pool, pool.pooled
            del blk
            got["returned"] = len(pool.returned)
        finally:
            pool.private.on = False

    t = threading.Thread(target=other)
    t.start()
    t.join(30)
    assert got == {"pool": None, "pooled": pooled, "returned": 0}, got
    assert not getattr(pool.private, "on", False)  # the flag is the other thread's only

