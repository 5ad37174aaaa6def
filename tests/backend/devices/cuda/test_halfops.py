"""The operand indexing of the CUDA backend's half binary kernel (elementwise_half_cuda.cu, ad_binary_h), no GPU
needed: halfops.block_pattern's (inner, count) read at (i // inner) % count gives, for every output i, the value
NumPy's broadcasting gives; an operand it cannot describe so is refused (the backend materialises it)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from anydevice.backend.devices.cuda.halfops import block_pattern

SHAPES = [(2, 3, 4, 5), (1, 3, 1, 5), (3, 1), (4, 7), (1,), (2, 1, 6)]


def _operands(shape):
    """every shape that broadcasts to ``shape``: each dim kept or 1, and fewer leading dims"""
    for k in range(len(shape) + 1):
        tail = shape[len(shape) - k:]
        for keep in itertools.product((True, False), repeat=k):
            yield tuple(d if kp else 1 for d, kp in zip(tail, keep))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_block_pattern_reads_what_broadcasting_gives(shape):
    n = int(np.prod(shape))
    seen = 0
    for vs in _operands(shape):
        v = np.arange(int(np.prod(vs)), dtype=np.int64).reshape(vs)
        want = np.broadcast_to(v, shape).ravel()
        pat = block_pattern(vs, shape)
        if pat is None:  # refused: a 1 between kept dims of more than one value
            vs_full = (1,) * (len(shape) - len(vs)) + vs
            kept = [d for d, s in enumerate(vs_full) if s != 1]
            assert any(vs_full[d] == 1 and shape[d] != 1 for d in range(kept[0], kept[-1] + 1))
            continue
        inner, count = pat
        i = np.arange(n)
        assert np.array_equal(v.ravel()[(i // inner) % count], want), (vs, shape, pat)
        seen += 1
    assert seen >= 2


def test_block_pattern_refuses_shapes_that_do_not_broadcast():
    assert block_pattern((3,), (2, 4)) is None
    assert block_pattern((2, 1, 5), (2, 3, 5)) is None  # a 1 between kept dims
    assert block_pattern((5, 1, 1), (2, 5, 3, 4)) == (12, 5)  # a per-channel bias


def test_stored_dtype_by_letter():
    """CudaBackend._dtype reads the dtype's letter (float16 'e', bfloat16's uint16 bits 'H'; all else float32)"""
    from anydevice.backend.devices.cuda.backend import CudaBackend
    got = [CudaBackend._dtype(None, np.zeros(1, t)) for t in (np.float32, np.float16, np.uint16, np.int32, bool)]
    assert got == ["float32", "float16", "bfloat16", "float32", "float32"]


# (M, N, K, measured best class): three of the UNet's float16 convs on the H200 (tools/gpu_half_sweep.py,
# 2026-11-28): 320 -> 320 3x3 at 64x64 ran best on 64x64 tiles (235 us; the old plan's 128x64 k4: 264), a
# 1280-channel 1x1 at 16x16 in 3 slices (64x64 34 us, 128x64 33; old 64x64 k2: 46), the 8x8 3x3 on 64x64 in 8 (93 us)
HALF_PLANS = [(320, 4096, 2880, (64, 64, 4)), (1280, 256, 1280, (64, 64, 3)), (1280, 64, 11520, (64, 64, 8))]


@pytest.mark.parametrize("M,N,K,want", HALF_PLANS, ids=lambda v: str(v))
def test_half_tiles_planned_as_measured(M, N, K, want):
    from anydevice.backend.devices.runtime.conv_gemm import _H_L, _H_M, _H_S, plan
    cfg, ks = plan([_H_L, _H_M, _H_S], M, N, 1, K, 132)
    assert (cfg["TILE_M"], cfg["TILE_N"], ks) == want
