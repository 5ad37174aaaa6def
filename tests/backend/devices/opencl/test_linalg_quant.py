"""Quantized weights on the OpenCL GPU kernel family (backend/devices/opencl/linalg.py): linear's and
conv2d's weight stays packed (CLQuant) and kernels/conv_gemm_cuda.cu's ad_conv_gemm decodes it in its
tile loads (WQB: linear's B = W^T; WQA: conv2d's A), never making a float32 copy of it.

Values: every format of ops/quant.py against a float64 reference computed from
``QTensor.dequantize()``, normwise relative error <= 1e-6. Memory: the buffer pool's peak during a
linear whose weight is far bigger than its activations stays near the quantized bytes, well under
the float32 weight's size."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import quant

torch = pytest.importorskip("torch")
pytest.importorskip("pyopencl", reason="pyopencl not installed")
F = torch.nn.functional
TOL = 1e-6
FORMATS = list(quant.FORMATS)


@pytest.fixture(scope="module")
def be():
    from anydevice.backend.devices import opencl
    try:
        return opencl.create("opencl", 0, family="gpu")
    except Exception as exc:  # no OpenCL device here
        pytest.skip(f"no OpenCL device: {exc}")


def _rel(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    n = np.linalg.norm(ref)
    return float(np.linalg.norm(y - ref) / n) if n else float(np.linalg.norm(y))


def _no_dequant(be, monkeypatch):
    """Fail if the op dequantizes the weight (a float32 copy)."""
    def refuse(w):
        raise AssertionError(f"{w!r} was dequantized")
    monkeypatch.setattr(be, "_dequant", refuse)


LINEAR = [((50, 320), (96, 320)), ((50, 200), (96, 200)), ((3, 7, 72), (40, 72))]  # K 200, 72: not tile multiples


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("xs,ws", LINEAR, ids=[f"K{c[1][1]}" for c in LINEAR])
def test_linear_reads_the_packed_weight(be, monkeypatch, fmt, xs, ws):
    rng = np.random.default_rng(hash((fmt, ws)) % 2**32)
    x = rng.standard_normal(xs).astype(np.float32)
    q = quant.quantize(rng.standard_normal(ws).astype(np.float32), fmt)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    _no_dequant(be, monkeypatch)
    y = be.linear(torch.from_numpy(x), q, torch.from_numpy(b))
    ref = F.linear(torch.from_numpy(x).double(), torch.from_numpy(q.dequantize()).double(), torch.from_numpy(b).double())
    assert tuple(y.shape) == tuple(ref.shape)
    err = _rel(y, ref)
    assert err <= TOL, (fmt, xs, ws, err)


CONV = [  # (x shape, w shape, stride, padding, groups)
    ((2, 16, 9, 11), (32, 16, 3, 3), 1, 1, 1),   # 3x3 pad 1
    ((2, 16, 9, 11), (32, 16, 1, 1), 1, 0, 1),   # 1x1
    ((1, 16, 13, 12), (32, 16, 3, 3), 2, 1, 1),  # stride 2
    ((2, 16, 9, 9), (32, 8, 3, 3), 1, 1, 2),     # groups 2
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("xs,ws,stride,pad,groups", CONV, ids=["3x3", "1x1", "stride2", "groups2"])
def test_conv2d_reads_the_packed_weight(be, monkeypatch, fmt, xs, ws, stride, pad, groups):
    rng = np.random.default_rng(hash((fmt, ws, stride)) % 2**32)
    x = rng.standard_normal(xs).astype(np.float32)
    q = quant.quantize(rng.standard_normal(ws).astype(np.float32), fmt)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    _no_dequant(be, monkeypatch)
    y = be.conv2d(torch.from_numpy(x), q, torch.from_numpy(b), stride=stride, padding=pad, groups=groups)
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(q.dequantize()).double(), torch.from_numpy(b).double(),
                   stride=stride, padding=pad, groups=groups)
    assert tuple(y.shape) == tuple(ref.shape)
    err = _rel(y, ref)
    assert err <= TOL, (fmt, xs, ws, err)


@pytest.mark.parametrize("fmt", ["q4_1", "int8"])
def test_direct_conv_few_output_channels(be, fmt):
    """At most 4 output channels per group: the direct kernel, on the (tiny) weight dequantized."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 16, 9, 9)).astype(np.float32)
    q = quant.quantize(rng.standard_normal((4, 16, 3, 3)).astype(np.float32), fmt)
    y = be.conv2d(torch.from_numpy(x), q, None, padding=1)
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(q.dequantize()).double(), padding=1)
    assert _rel(y, ref) <= TOL


def test_no_float32_copy_of_a_big_weight(be):
    """x (4, 4096) @ W (4096, 4096)^T in q8_0: the pool's peak during the op is the packed weight plus
    the (small) activations and workspace, far below the float32 weight's 64 MiB."""
    rng = np.random.default_rng(0)
    n = 4096
    q = quant.quantize(rng.standard_normal((n, n)).astype(np.float32), "q8_0")
    x = rng.standard_normal((4, n)).astype(np.float32)
    f32_bytes = 4 * n * n
    wq = be._from_quant(q)  # the packed weight, as a loaded model keeps it
    base = be._memory_peak(reset=True)
    y = be.linear(torch.from_numpy(x), wq)
    peak = be._memory_peak()
    assert peak - base < 4 * 2**20, (peak, base)  # activations, output, a K split's workspace
    assert peak < q.nbytes + 4 * 2**20 < f32_bytes // 3, (peak, q.nbytes, f32_bytes)
    ref = x.astype(np.float64) @ q.dequantize().astype(np.float64).T
    assert _rel(y, ref) <= TOL
    # the weight uploaded by the op itself (a host QTensor): its packed bytes, no more
    del wq
    be._memory_peak(reset=True)
    be.linear(torch.from_numpy(x), q)
    assert be._memory_peak() < q.nbytes + 4 * 2**20
