"""The OpenCL backend's W8A8 kernels (backend/devices/opencl/w8a8.py), both families: linear_w8a8 runs
the fused kernels (never the host composite), and the rows quantized on the device (scales and int8
values: kernels/w8a8_cpu.cl's packed A, kernels/w8a8.cu's xq) equal the host's ``quantize_rows`` exactly."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import quant, w8a8
from anydevice.backend.devices.runtime import w8a8 as pw

pytest.importorskip("pyopencl", reason="pyopencl not installed")


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def be(request):
    from anydevice.backend.devices import opencl
    try:
        return opencl.create("opencl", 0, family=request.param)
    except Exception as exc:  # no OpenCL device here
        pytest.skip(f"no OpenCL device: {exc}")


def _rows(be, x):
    """(xq, sx) the device's row kernel computes for x (M, K)."""
    M, K = x.shape
    xd = be.to_device(x)
    rs = be._empty((M,))
    if be.family == "gpu":
        ldq = pw.ldq(K)
        xq = be._empty((-(-M * ldq // 4),))
        g, l = pw.rows_launch(M)
        be._run(pw.ROWS, (g[0] * l[0],), l, xd.buffer, 0, xq.buffer, rs.buffer, M, K, ldq, params=pw.MACROS)
        raw = np.empty(xq.size * 4, np.uint8)
        be.cl.enqueue_copy(be.queue, raw, xq.buffer, is_blocking=True)
        q = raw[:M * ldq].view(np.int8).reshape(M, ldq)
        assert not q[:, K:].any()
        q = q[:, :K]
    else:
        p = be.tunables("w8a8_cpu.cl")
        mr = p["MR"]
        mt = -(-M // mr)
        ap = be._empty((mt * mr * K,))
        be._run("w8a8_rows_cpu", (mt * mr,), (1,), xd.buffer, 0, ap.buffer, rs.buffer, M, K, params=p)
        words = np.empty(ap.size, np.int32)
        be.cl.enqueue_copy(be.queue, words, ap.buffer, is_blocking=True)
        q = words.reshape(mt, K, mr).transpose(0, 2, 1).reshape(mt * mr, K)
        assert not q[M:].any()
        q = q[:M]
    return q, be.to_numpy(rs)


@pytest.mark.parametrize("M,K", [(1, 1), (7, 37), (30, 130), (13, 257)])
def test_rows_equal_host(be, M, K):
    rng = np.random.default_rng(M * K)
    x = (rng.standard_normal((M, K)) * np.logspace(-20, 20, M)[:, None]).astype(np.float32)
    x[0, 0] = 0.5 * (np.abs(x[0]).max() / np.float32(127))  # a tie (round half away from zero) somewhere
    if M > 2:
        x[1] = 0.0
        x[2, 0] = np.nan
    q, s = _rows(be, x)
    hq, hs = w8a8.quantize_rows(x)
    np.testing.assert_array_equal(s, hs)
    ok = np.isfinite(hs)
    np.testing.assert_array_equal(q[ok], hq[ok])


def test_fused_kernel_not_composite(be, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("host composite used")
    monkeypatch.setattr(type(be), "_linear_w8a8_host", refuse)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 45)).astype(np.float32)
    w = rng.standard_normal((21, 45)).astype(np.float32)
    q = quant.quantize(w, "int8")
    wd = be.to_device_quant(q)  # packed once (CLQuant), taken as it is
    y = be.to_numpy(be.linear_w8a8(be.to_device(x), wd))
    ref = w8a8.reference(x, *w8a8.int8_parts(q))
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-6
    assert "w8a8" in be.caps.fused
