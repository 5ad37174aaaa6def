"""kernels/attention.cu (the CUDA backend's fused attention, ``ad_attention``) run as OpenCL C on
this GPU-less machine (PoCL): the file is in the portable subset of kernels/README.md, so
``prelude_opencl.h + body`` builds as OpenCL C, as test_portable_kernels.py does for the other
portable kernels. Launched with the CUDA backend's geometry (groups B * ceil(L / WG), group size
WG; OpenCL global size = groups x group size) and arguments (runtime/attention.py's layout and
argument tuple, signatures.py's types), compared with a float64 reference of ops/attention.py's
composite (row max at least -FLT_MAX, sum at least 1): normwise relative error <= 1e-6, NaN/Inf
positions exact. Shapes: L != S, Ev != E, S = 1, one query, broadcast batch dims, masks broadcast
over batch / rows / keys, causal from a block's first row, fully masked rows, NaN/Inf inputs,
several (WG, BK) including a key tile that does not divide S."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cb
from anydevice.backend.devices.runtime import cl_scalar_dtypes
from anydevice.backend.devices.runtime.attention import attention_args, attention_layout, shared_tile
from anydevice.backend.devices.runtime.kernel_source import kernel_source

from precision_helpers import ATTENTION_SHAPES, check, random_mask, opencl_device

torch = pytest.importorskip("torch")
cl = pytest.importorskip("pyopencl", reason="pyopencl not installed (pip install pyopencl pocl-binary-distribution)")

TOL = 1e-6
_FLT_MAX = float(np.finfo(np.float32).max)


class Att:
    """Builds attention.cu as OpenCL C (PoCL first) and launches ad_attention as the CUDA backend does."""

    def __init__(self):
        self.dev, self.ctx, self.queue = opencl_device()
        self.src = kernel_source("attention.cu", "opencl", cb.KERNELS_DIR)
        self._k: dict = {}

    def kernel(self, macros):
        key = tuple(sorted(macros.items()))
        if key not in self._k:
            prg = cl.Program(self.ctx, self.src).build(options=" ".join(cb.build_options(macros)))
            k = prg.ad_attention
            k.set_scalar_arg_dtypes(cl_scalar_dtypes("ad_attention"))
            self._k[key] = k
        return self._k[key]

    def buf(self, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                         hostbuf=a if a.size else np.zeros(1, np.float32))

    def __call__(self, q, kt, v, mask=None, scale=1.0, causal=False, row0=0, wg=None, bk=None):
        lay = attention_layout(q.shape, kt.shape, v.shape, None if mask is None else mask.shape)
        assert lay is not None
        E, Ev = lay.E, lay.Ev
        wg = wg or 64
        bk = bk or shared_tile(E, Ev, int(self.dev.local_mem_size))
        y = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(4, 4 * lay.B * lay.L * Ev))
        bufs = {id(a): self.buf(a) for a in (q, kt, v) + (() if mask is None else (mask,))}
        args = attention_args(lay, q, kt, v, mask, y, scale, causal, row0,
                              buf=lambda a: a if a is y else bufs[id(a)], off=lambda a: 0)
        groups = lay.B * -(-lay.L // wg)
        k = self.kernel({"E": E, "EV": Ev, "WG": wg, "BK": bk})
        k(self.queue, (groups * wg,), (wg,), *args)
        out = np.empty(lay.bat + (lay.L, Ev), np.float32)
        cl.enqueue_copy(self.queue, out, y)
        self.queue.finish()
        return out


@pytest.fixture(scope="module")
def att():
    return Att()


def reference(q, kt, v, mask=None, scale=1.0, causal=False, row0=0):
    """ops/attention.py's composite in float64: (q * scale rounded to float32) @ kt + mask (+ -inf past
    the causal diagonal), exp(s - max(row max, -FLT_MAX)), (e @ v) / max(sum, 1)."""
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).double()  # noqa: E731
    s = t((q * np.float32(scale)).astype(np.float32)) @ t(kt)
    if mask is not None:
        s = s + t(mask)
    if causal:
        L, S = s.shape[-2:]
        far = torch.arange(S)[None, :] > torch.arange(row0, row0 + L)[:, None]
        s = s + torch.where(far, -torch.inf, 0.0).double()
    mx = torch.clamp(s.amax(-1, keepdim=True), min=-_FLT_MAX)
    e = torch.exp(s - mx)
    return ((e @ t(v)) / torch.clamp(e.sum(-1, keepdim=True), min=1.0)).numpy()


def _data(seed, sq, sk, sv):
    """q (.., L, E), kt = k^T (.., E, S) contiguous, v (.., S, Ev) from shapes q, k (.., S, E), v."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (sq, sk, sv))
    return q, np.ascontiguousarray(np.swapaxes(k, -1, -2)), v


SHAPES = ATTENTION_SHAPES + [  # (query, key, value)
    ((1, 1, 70, 64), (1, 1, 300, 64), (1, 1, 300, 64)),      # several groups and key tiles
]


@pytest.mark.parametrize("sq,sk,sv", SHAPES, ids=[f"{'x'.join(map(str, s[0]))}-S{s[1][-2]}-Ev{s[2][-1]}"
                                                  for s in SHAPES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_shapes(att, sq, sk, sv, causal):
    q, kt, v = _data(sum(sq) + sum(sk), sq, sk, sv)
    scale = 1.0 / np.sqrt(sq[-1])
    check(att(q, kt, v, scale=scale, causal=causal), reference(q, kt, v, scale=scale, causal=causal),
          f"{sq} {sk} {sv} causal={causal}", TOL)


@pytest.mark.parametrize("wg,bk", [(1, 1), (16, 8), (32, 7), (128, 32)])
def test_group_and_key_tile(att, wg, bk):
    """Other work groups and key tiles (7 divides neither S nor the group's loads evenly)."""
    q, kt, v = _data(2, (2, 37, 24), (2, 51, 24), (2, 51, 20))
    check(att(q, kt, v, scale=0.3, causal=True, wg=wg, bk=bk), reference(q, kt, v, scale=0.3, causal=True),
          f"wg {wg} bk {bk}", TOL)


def test_causal_from_a_block_row(att):
    """A block of query rows from row0 of the whole query (ops/attention.py's causal blocks)."""
    q, kt, v = _data(4, (1, 2, 13, 8), (1, 2, 40, 8), (1, 2, 40, 6))
    for row0 in (0, 5, 30, 39):
        check(att(q, kt, v, causal=True, row0=row0), reference(q, kt, v, causal=True, row0=row0),
              f"row0 {row0}", TOL)


MASKS = [(9, 40), (1, 40), (9, 1), (1, 1), (3, 9, 40), (2, 1, 9, 40), (2, 3, 1, 40), (2, 3, 9, 40)]


@pytest.mark.parametrize("ms", MASKS, ids=["x".join(map(str, m)) for m in MASKS])
def test_masks_broadcast(att, ms):
    """Additive masks broadcast over batch, heads, rows or keys (with and without causal)."""
    q, kt, v = _data(5, (2, 3, 9, 8), (2, 3, 40, 8), (2, 3, 40, 5))
    mask = random_mask(np.random.default_rng(len(ms) + ms[-1]), ms, "float")
    check(att(q, kt, v, mask, scale=0.5), reference(q, kt, v, mask, scale=0.5), f"mask {ms}", TOL)
    check(att(q, kt, v, mask, causal=True), reference(q, kt, v, mask, causal=True), f"mask {ms} causal", TOL)


def test_fully_masked_rows_are_zero(att):
    q, kt, v = _data(6, (1, 2, 4, 8), (1, 2, 37, 8), (1, 2, 37, 3))
    keep = np.ones((4, 37), bool)
    keep[1] = False
    keep[3, :36] = False
    mask = np.where(keep, 0.0, -np.inf).astype(np.float32)
    y = att(q, kt, v, mask, bk=8)
    check(y, reference(q, kt, v, mask), "fully masked rows", TOL)
    assert (y[:, :, 1] == 0).all()


def test_nan_inf_propagate(att):
    """NaN/Inf positions as the composite, also a NaN key past every query's causal diagonal."""
    q, kt, v = _data(13, (1, 2, 6, 4), (1, 2, 37, 4), (1, 2, 37, 3))
    q[0, 0, 1, 2] = np.nan
    kt[0, 1, 0, 3] = np.inf
    v[0, 0, 4, 1] = -np.inf
    q[0, 1, 4, 1] = -np.inf
    kt[0, 0, 1, 20] = np.nan
    for causal in (False, True):
        y, ref = att(q, kt, v, causal=causal, bk=8), reference(q, kt, v, causal=causal)
        check(y, ref, f"nan/inf causal={causal}", TOL)
        assert np.isnan(ref).any()
