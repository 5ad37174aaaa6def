"""The CUDA backend's half elementwise ops (backend/devices/cuda/halfops.py, kernels/elementwise_half_cuda.cu)
without a GPU: the mixin's own code (operand patterns, materialised broadcasts, numbers on either side, the
casts) run against the kernel built as OpenCL C on PoCL (vload_half / vstore_half_rte where CUDA has PTX
conversions), through a stand-in whose ``cp`` is NumPy. Each result equals torch's float32 opmath rounded
once to the half dtype, bit for bit (pow and the transcendental unary ops: within one ulp of the dtype).
The same ops through CuPy on a GPU: test_cuda_half.py."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices.cuda.backend import CudaBackend
from anydevice.backend.devices.cuda.halfops import CudaHalfOps

from pocl_standin import NP_OF, FakeCp, PoclStandIn, standin, stored, value
from precision_helpers import within_ulp

torch = pytest.importorskip("torch")
TDT = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class PoclHalfOps(PoclStandIn, CudaHalfOps):
    """CudaHalfOps with NumPy arrays for CuPy's (bfloat16 as uint16 bits, as the backend keeps it) and its
    kernels launched on PoCL with CudaBackend's 1-D geometry."""
    cp = FakeCp
    hip = False
    sm_count = 2
    _launch_1d = CudaBackend._launch_1d


@pytest.fixture(scope="module")
def pocl():
    return standin(PoclHalfOps)


# (a, b): same shapes, per-channel bias, (N, C, 1, 1), last-dim bias, an irregular broadcast (materialised),
# numbers on either side, a size-1 array, a transposed operand
BINARY = [((2, 8, 5, 6), (2, 8, 5, 6)), ((2, 8, 5, 6), (8, 1, 1)), ((2, 8, 5, 6), (2, 8, 1, 1)), ((3, 7, 12), (12,)),
          ((3, 1, 5), (1, 4, 1)), ((5, 7, 9), 0.3), (-0.7, (5, 7, 9)), ((1,), (3, 5)), ((4, 6, 10), "T")]
OPS = ("add", "sub", "mul", "div", "minimum", "maximum", "pow")


@pytest.mark.parametrize("dtype", list(TDT))
@pytest.mark.parametrize("case", BINARY, ids=lambda c: f"{c[0]}-{c[1]}")
def test_binary_half_on_pocl(pocl, case, dtype):
    g = torch.Generator().manual_seed(11)
    tdt = TDT[dtype]
    sa, sb = case
    a = sa if isinstance(sa, float) else (torch.randn(*sa, generator=g) * 3).to(tdt)
    if sb == "T":  # a transposed (non-contiguous) operand
        b = (torch.randn(sa[0], sa[2], sa[1], generator=g) * 3).to(tdt).transpose(1, 2)
        nb = stored(b.transpose(1, 2), dtype).transpose(0, 2, 1)
    else:
        b = sb if isinstance(sb, float) else (torch.randn(*sb, generator=g) * 3).to(tdt)
        nb = sb if isinstance(sb, float) else stored(b, dtype)
    na = sa if isinstance(sa, float) else stored(a, dtype)
    keep = [None if isinstance(v, float) else v.copy() for v in (na, nb)]
    for op in OPS:
        if op in ("minimum", "maximum") and (isinstance(sa, float) or isinstance(sb, float)):
            continue
        x, ta = na, a
        if op == "pow" and not isinstance(sa, float):  # positive bases
            x, ta = stored(a.abs(), dtype), a.abs()
        pocl.launches.clear()
        y = pocl._binary_half(op, x, nb, dtype)
        assert pocl.launched() == ["ad_binary_h"] and y.dtype == NP_OF[dtype], (op, pocl.launched())
        fa = torch.tensor(ta) if isinstance(ta, float) else ta.float()
        fb = torch.tensor(b) if isinstance(b, float) else b.float()
        ref = getattr(torch, op)(fa, fb).to(tdt).double()
        out = value(y, dtype)
        assert out.shape == ref.shape
        if op == "pow":
            assert within_ulp(out, ref, tdt), op
        else:
            assert torch.equal(out, ref), (op, float((out - ref).abs().max()))
    for v, was in zip((na, nb), keep):  # inputs unchanged
        if was is not None:
            assert np.array_equal(v, was)


@pytest.mark.parametrize("dtype", list(TDT))
def test_unary_and_casts_half_on_pocl(pocl, dtype):
    tdt = TDT[dtype]
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 17, 29, generator=g) * 3).to(tdt)
    nx = stored(x, dtype).transpose(0, 2, 1)  # permuted: made contiguous first
    xp = x.permute(0, 2, 1).float()
    for op, p, ref in (("relu", {}, torch.relu(xp)), ("silu", {}, torch.nn.functional.silu(xp)),
                       ("exp", {}, torch.exp(xp)), ("tanh", {}, torch.tanh(xp)),
                       ("gelu", {"approximate": "none"}, torch.nn.functional.gelu(xp)),
                       ("clamp", {"min": -1.0, "max": 2.0}, xp.clamp(-1.0, 2.0))):
        pocl.launches.clear()
        y = pocl._unary_half(op, nx, dtype, **p)
        assert pocl.launched() == ["ad_unary_h"] and y.dtype == NP_OF[dtype], op
        out, r = value(y, dtype), ref.to(tdt).double()
        # gelu's float32 kernel takes 1 + erf(x / sqrt 2), which cancels for negative x (an absolute error
        # of a few float32 ulps of 1 times |x|, as the float32 op has): more than an ulp of tiny results
        slack = 2.0**-21 * float(xp.abs().max()) if op == "gelu" else 0.0
        assert within_ulp(out, r, tdt, slack), (op, float((out - r).abs().max()))
    v = torch.cat([torch.randn(1000, generator=g) * 100,
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0, 70000.0, 1e-8, -0.0, 3e38])])
    h = pocl._cast_half(v.numpy(), "float32", dtype)
    out = value(h, dtype)
    want = v.to(tdt).double()
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.nan_to_num(), want.nan_to_num())
    back = pocl._cast_half(h, dtype, "float32")
    assert back.dtype == np.float32 and torch.equal(torch.from_numpy(back).double().nan_to_num(), out.nan_to_num())
