"""kernels/w8a8.cu (the CUDA backend's W8A8 kernels, portable branch: the four-way dot without __dp4a)
built as OpenCL C on PoCL with the CUDA backend's build (its shipped configuration) and launched with the
shared geometry (backend/devices/runtime/w8a8.py) and signatures: equal to the float64 reference of the
same quantized math (ops/w8a8.py) to float32 rounding, and the int32 sums exact."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cb
from anydevice.backend.devices.runtime import cl_scalar_dtypes
from anydevice.backend.devices.runtime import w8a8 as pw
from anydevice.backend.devices.runtime.kernel_source import kernel_source
from anydevice.backend.ops import quant, w8a8
from precision_helpers import opencl_device

cl = pytest.importorskip("pyopencl", reason="pyopencl not installed (pip install pyopencl pocl-binary-distribution)")


@pytest.fixture(scope="module")
def prg():
    dev, ctx, queue = opencl_device()
    assert pw.MACROS in cb.shipped_configs()[pw.FILE]
    src = kernel_source(pw.FILE, "opencl", cb.KERNELS_DIR)
    p = cl.Program(ctx, src).build(options=" ".join(cb.build_options(pw.MACROS)))
    return ctx, queue, p


def _run(prg, x, wq, sw, b):
    ctx, queue, p = prg
    mf = cl.mem_flags
    M, K = x.shape
    N = wq.shape[0]
    ldq = pw.ldq(K)

    def buf(a):
        a = np.ascontiguousarray(a)
        return cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a if a.size else np.zeros(4, np.uint8))
    xb, wb, swb = buf(x), buf(wq.view(np.uint8)), buf(sw)
    bb = buf(b if b is not None else np.zeros(1, np.float32))
    xq = cl.Buffer(ctx, mf.READ_WRITE, max(4, M * ldq))
    rs = cl.Buffer(ctx, mf.READ_WRITE, 4 * M)
    yb = cl.Buffer(ctx, mf.READ_WRITE, 4 * M * N)
    kr, kg = cl.Kernel(p, pw.ROWS), cl.Kernel(p, pw.GEMM)
    kr.set_scalar_arg_dtypes(cl_scalar_dtypes(pw.ROWS))
    kg.set_scalar_arg_dtypes(cl_scalar_dtypes(pw.GEMM))
    g, l = pw.rows_launch(M)
    kr(queue, tuple(a * c for a, c in zip(g, l)), l, xb, 0, xq, rs, M, K, ldq)
    g, l = pw.gemm_launch(M, N)
    kg(queue, tuple(a * c for a, c in zip(g, l)), l, xq, ldq, wb, rs, swb, bb, int(b is not None), yb, M, N, K)
    y = np.empty((M, N), np.float32)
    cl.enqueue_copy(queue, y, yb)
    queue.finish()
    return y


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (5, 70, 37), (65, 63, 130), (3, 9, 1000)])
def test_w8a8_portable(prg, M, N, K):
    rng = np.random.default_rng(K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    q = quant.quantize(w, "int8")
    wq, sw = w8a8.int8_parts(q)
    y = _run(prg, x, wq, sw, b)
    ref = w8a8.reference(x, wq, sw, b)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-6
    # exact int32 sums: integer rows with absmax 127, unit weight scales
    xi = rng.integers(-127, 128, (M, K))
    xi[:, 0] = 127
    y = _run(prg, xi.astype(np.float32), wq, np.ones(N, np.float32), None)
    np.testing.assert_array_equal(y, w8a8.int_products(xi.astype(np.int8), wq).astype(np.float32))
