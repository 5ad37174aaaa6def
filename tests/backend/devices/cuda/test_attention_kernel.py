"""The CUDA backend's fused attention (backend/devices/cuda/attention.py, kernels/attention.cu).

Without a GPU: the mixin's own code (operand preparation, broadcast dims taken once, layout, launch
geometry, argument packing) run against the kernel built as OpenCL C on PoCL: a stand-in backend
whose ``cp`` is NumPy and whose ``_function`` launches ``ad_attention`` through pyopencl with the
(groups, group size) CuPy would get. On a GPU (CuPy and a CUDA device): ``_attention_fused`` and
``scaled_dot_product_attention`` on ``cuda`` against float64, normwise relative error <= 1e-6,
NaN/Inf positions exact (skipped here, with the reason)."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cuda_backend
from anydevice.backend.devices.cuda.attention import CudaAttention
from anydevice.backend.devices.cuda.backend import CudaBackend

from pocl_standin import PoclStandIn, standin
from precision_helpers import check, random_mask

torch = pytest.importorskip("torch")
SDPA = torch.nn.functional.scaled_dot_product_attention
TOL = 1e-6

_PROBE = cuda_backend.probe("cuda")
needs_gpu = pytest.mark.skipif(not _PROBE["available"], reason=f"cuda backend unavailable: {_PROBE['reason']}")


def _ref(q, k, v, mask=None, **kw):
    m = None if mask is None else (torch.from_numpy(mask) if mask.dtype == np.bool_ else
                                   torch.from_numpy(mask).double())
    return SDPA(*(torch.from_numpy(np.ascontiguousarray(a)).double() for a in (q, k, v)), attn_mask=m, **kw).numpy()


def _data(seed, sq, sk, sv):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in (sq, sk, sv))


# ---- the mixin on PoCL ------------------------------------------------------------------------
class _FakeCp:
    """What the mixin uses of CuPy, as NumPy (device properties of an H100)."""
    ascontiguousarray = staticmethod(np.ascontiguousarray)
    float32 = np.float32

    class cuda:
        class runtime:
            @staticmethod
            def getDeviceProperties(index):
                return {"sharedMemPerBlock": 48 * 1024, "maxThreadsPerBlock": 1024}


class PoclAttention(PoclStandIn, CudaAttention):
    """CudaAttention with NumPy arrays for CuPy's and its kernel launched on PoCL."""
    cp = _FakeCp
    index = 0
    _contig = CudaBackend._contig

    def _enter(self):
        pass

    def _dtype(self, x):
        return "float32"

    def _empty(self, shape, dtype="float32"):
        return np.empty(tuple(shape), np.float32)


@pytest.fixture(scope="module")
def pocl():
    return standin(PoclAttention)


def test_declared_fused():
    assert "attention" in CudaBackend.caps.fused


CASES = [  # (query, key, value, mask shape or None)
    ((2, 3, 17, 16), (2, 3, 33, 16), (2, 3, 33, 8), None),
    ((1, 2, 9, 12), (1, 2, 1, 12), (1, 2, 1, 3), (9, 1)),
    ((2, 1, 6, 4), (1, 3, 10, 4), (2, 3, 10, 1), (2, 1, 6, 10)),
    ((1, 2, 70, 64), (1, 2, 90, 64), (1, 2, 90, 64), (1, 90)),
]


@pytest.mark.parametrize("sq,sk,sv,ms", CASES, ids=[f"{'x'.join(map(str, c[0]))}-S{c[1][-2]}" for c in CASES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mixin_on_pocl(pocl, sq, sk, sv, ms, causal):
    """_attention_fused's glue: k^T a transposed view, broadcast (zero-stride) operands taken once."""
    q, k, v = _data(sum(sq), sq, sk, sv)
    mask = None if ms is None else random_mask(np.random.default_rng(3), ms, "float")
    bat = np.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2])
    kx = np.broadcast_to(k, bat + k.shape[-2:])  # zero strides, as an expanded (GQA) key
    kt = np.swapaxes(kx, -1, -2)
    row0 = 3 if causal else 0
    y = pocl._attention_fused(q * np.float32(0.25), kt, v, mask, 1.0, causal, row0=row0)
    m = np.zeros((sq[-2], sk[-2]), np.float32) if mask is None else mask
    if causal:
        m = m + np.where(np.arange(sk[-2])[None, :] > np.arange(row0, row0 + sq[-2])[:, None], -np.inf, 0.0)
    check(y, _ref(q * np.float32(0.25), k, v, np.asarray(m, np.float32), scale=1.0), f"{sq} {sk} {sv} mask {ms}", TOL)
    fname, kname, macros, grid, block = pocl.launches[-1]
    assert (fname, kname) == ("attention.cu", "ad_attention") and block == (macros["WG"],)
    assert grid == (int(np.prod(bat)) * -(-sq[-2] // macros["WG"]),)


def test_geometry_within_limits(pocl):
    for E, Ev in [(64, 64), (40, 40), (256, 256), (3, 1), (256, 8)]:
        wg, bk = pocl._att_geometry(E, Ev)
        assert 1 <= wg <= 1024 and bk >= 1 and 4 * bk * (E + Ev) <= 48 * 1024 - 1024


def test_declines_what_the_kernel_does_not_take(pocl):
    q, k, v = _data(1, (1, 4, 300), (1, 5, 300), (1, 5, 8))
    assert pocl._attention_fused(q, np.swapaxes(k, -1, -2), v, None, 1.0, False) is None


# ---- on a GPU --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def be():
    return cuda_backend.create("cuda", 0)


GPU_SHAPES = [
    ((2, 3, 17, 16), (2, 3, 33, 16), (2, 3, 33, 8)),
    ((1, 2, 1, 64), (1, 2, 100, 64), (1, 2, 100, 64)),
    ((1, 2, 9, 12), (1, 2, 1, 12), (1, 2, 1, 3)),
    ((2, 1, 6, 4), (1, 3, 10, 4), (2, 3, 10, 1)),
    ((1, 8, 256, 64), (1, 8, 1024, 64), (1, 8, 1024, 64)),
    ((1, 2, 77, 128), (1, 2, 300, 128), (1, 2, 300, 128)),
    ((1, 1, 40, 256), (1, 1, 70, 256), (1, 1, 70, 256)),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("sq,sk,sv", GPU_SHAPES, ids=[f"{'x'.join(map(str, s[0]))}-S{s[1][-2]}-Ev{s[2][-1]}"
                                                      for s in GPU_SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_on_gpu(be, sq, sk, sv, causal):
    q, k, v = _data(sum(sq) + sum(sk), sq, sk, sv)
    dq, dk, dv = (be._from_numpy(a) for a in (q, k, v))
    y = be._attention_fused(dq, dk.swapaxes(-1, -2), dv, None, 1.0 / np.sqrt(sq[-1]), causal)
    assert y is not None
    check(be._to_numpy(y), _ref(q, k, v, is_causal=causal), f"cuda {sq} {sk} {sv} causal={causal}", TOL)
    check(be.scaled_dot_product_attention(q, k, v, is_causal=causal), _ref(q, k, v, is_causal=causal),
          "cuda sdpa", TOL)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("ms", [(9, 40), (1, 40), (9, 1), (2, 1, 9, 40), (2, 3, 9, 40)])
def test_masks_on_gpu(be, ms):
    q, k, v = _data(5, (2, 3, 9, 8), (2, 3, 40, 8), (2, 3, 40, 5))
    mask = random_mask(np.random.default_rng(len(ms)), ms, "float")
    check(be.scaled_dot_product_attention(q, k, v, attn_mask=mask), _ref(q, k, v, mask), f"cuda mask {ms}", TOL)
    keep = np.ones((9, 40), bool)
    keep[2] = False
    y = np.asarray(be.scaled_dot_product_attention(q, k, v, attn_mask=keep))
    check(y, _ref(q, k, v, keep), "cuda fully masked row", TOL)
    assert (y[:, :, 2] == 0).all()


@pytest.mark.gpu
@needs_gpu
def test_nan_inf_on_gpu(be):
    q, k, v = _data(13, (1, 2, 6, 4), (1, 2, 37, 4), (1, 2, 37, 3))
    q[0, 0, 1, 2] = np.nan
    k[0, 1, 3, 0] = np.inf
    v[0, 0, 4, 1] = -np.inf
    k[0, 0, 20, 1] = np.nan
    for causal in (False, True):
        check(be.scaled_dot_product_attention(q, k, v, is_causal=causal), _ref(q, k, v, is_causal=causal),
              f"cuda nan/inf causal={causal}", TOL)
