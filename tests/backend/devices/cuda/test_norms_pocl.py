"""The CUDA backend's fused norm split over several blocks a row (backend/devices/cuda/norms.py
``_norm_split``, kernels/norm_split_cuda.cu) without a GPU: few rows of many values (a group norm of 2-4 groups,
rows of 131 072-133 563 values, parts of uneven length) through the mixin's own code, the kernels built as
OpenCL C on PoCL. Against torch's group_norm in float64 on the same stored values: float32 within the precision
suite's 1e-6 (normwise), float16 / bfloat16 within one rounding of the dtype; the three split launches ran.
The one-block-a-row kernel (norm_cuda.cu, warp shuffles) is CUDA-only: test_cuda_half.py on a GPU."""
from __future__ import annotations

import pytest

from anydevice.backend.devices.cuda.norms import NORM_SPLIT_MIN_ROW, CudaNorms

from pocl_standin import FakeCp, PoclStandIn, standin, stored, value

torch = pytest.importorskip("torch")


class PoclNorms(PoclStandIn, CudaNorms):
    """CudaNorms with NumPy arrays for CuPy's, its kernels on PoCL, and 8 SMs (rows below 8 are split)."""
    cp = FakeCp
    hip = False
    sm_count = 8


@pytest.fixture(scope="module")
def pocl():
    return standin(PoclNorms)


# (N, C, H, W, groups, silu)
CASES = [(1, 8, 256, 256, 4, True), (1, 6, 211, 211, 2, False), (2, 4, 256, 256, 2, True)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"g{c[4]}" + ("-silu" if c[5] else ""))
def test_split_norm_on_pocl(pocl, case, dtype):
    N, C, H, W, G, silu = case
    g = torch.Generator().manual_seed(C * H + G)
    x = torch.randn(N, C, H, W, generator=g) * 3 + 5  # a mean far from 0: the corrected mean matters
    wt, bt = torch.randn(C, generator=g), torch.randn(C, generator=g)
    xs, ws, bs = stored(x, dtype), stored(wt, dtype), stored(bt, dtype)
    rows, n = N * G, C // G * H * W
    assert n >= NORM_SPLIT_MIN_ROW and pocl._norm_parts(rows, n) > 1
    pocl.launches.clear()
    y = pocl._norm_rows_affine(xs.reshape(rows, n), 1e-5, ws, bs, G, H * W, "silu" if silu else None)
    assert pocl.launched() == ["ad_norm_split_sum", "ad_norm_split_dev", "ad_norm_split_apply"]
    xv, wv, bv = (value(a, dtype) for a in (xs, ws, bs))
    ref = torch.nn.functional.group_norm(xv, G, wv, bv, 1e-5)
    ref = torch.nn.functional.silu(ref) if silu else ref
    got = value(y, dtype).reshape(ref.shape)
    if dtype == "float32":
        assert float((got - ref).norm() / ref.norm()) <= 1e-6
    else:
        eps = torch.finfo(getattr(torch, dtype)).eps
        assert bool(((got - ref).abs() <= eps * ref.abs() + 1e-5 * float(ref.abs().max())).all())


class _H200(CudaNorms):
    sm_count = 132


# (rows, n, parts on an H200's 132 SMs): the SD1.5 UNet's group norms (32 groups of at most 82 K values) keep
# one block a row; the SD1.x VAE decoder's (32 groups of 0.26-1 M values) split; layer norms (one row a token)
# never do
PARTS = [(32, 40960, 1), (32, 81920, 1), (32, 262144, 8), (32, 1048576, 9), (4096, 320, 1), (200, 2**20, 1)]


@pytest.mark.parametrize("rows,n,parts", PARTS, ids=lambda v: str(v))
def test_norm_parts(rows, n, parts):
    assert _H200()._norm_parts(rows, n) == parts
