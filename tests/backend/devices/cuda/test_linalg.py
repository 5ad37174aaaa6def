"""The CUDA backend's choice between the direct conv kernel and the implicit GEMM for convs of few output
channels a group (backend/devices/cuda/linalg.py ``_direct_pays``), no GPU needed: the direct kernel (a thread
an output, its taps in a loop) keeps depthwise convs and convs with outputs enough to fill the GPU; a UNet's
conv_out (320 -> 4 channels at 64x64: 16 384 outputs of 2 880 taps; 467 us direct, 47 us as a half GEMM on an
H200) takes the GEMM."""
from __future__ import annotations

import pytest

from anydevice.backend.devices.cuda.linalg import CudaLinalg
from anydevice.backend.ops.plans import conv2d_geometry


class _H200(CudaLinalg):
    sm_count = 132


# (x shape, w shape, groups, direct?)
CASES = [((1, 320, 64, 64), (4, 320, 3, 3), 1, False),      # SD1.5 UNet conv_out: the GEMM
         ((1, 128, 512, 512), (3, 128, 3, 3), 1, True),     # SD1.x VAE conv_out: 786 432 outputs, direct
         ((1, 64, 56, 56), (64, 1, 3, 3), 64, True),        # depthwise: 9 taps, direct
         ((2, 16, 32, 32), (4, 16, 3, 3), 1, False),        # 144 taps, 8 192 outputs: the GEMM
         ((1, 32, 8, 8), (2, 32, 1, 1), 1, True)]           # 32 taps: direct


@pytest.mark.parametrize("xs,ws,groups,direct", CASES, ids=lambda v: str(v))
def test_direct_or_gemm(xs, ws, groups, direct):
    g = conv2d_geometry(xs, ws, (1, 1), (1, 1, 1, 1) if ws[2] == 3 else (0, 0, 0, 0), (1, 1), groups)
    assert _H200()._direct_pays(g) is direct
