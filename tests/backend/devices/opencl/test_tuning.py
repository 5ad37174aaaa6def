"""The CPU kernel family's tunables (backend/devices/opencl/tuning.py): the defaults follow the device's
float vector width (AVX-512: MR 12 x 32 tiles; AVX2/NEON: MR 6 x 16 twice), a stored tuning wins, and
every GEMM-based op gives torch's float64 values under each tile the defaults or the tuner can pick, on
whichever machine runs the tests (the tile is forced through the stored tuning entry of the file)."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

from anydevice.backend.devices.opencl import linalg
from anydevice.backend.devices.opencl.params import DEFAULT_TUNE, NARROW_TUNE

torch = pytest.importorskip("torch")
F = torch.nn.functional

#: every gemm_cpu tile the defaults (wide, narrow) or the tuner's candidates give
TILES = {"wide": DEFAULT_TUNE["gemm_cpu.cl"], "narrow": NARROW_TUNE["gemm_cpu.cl"],
         "narrow MR 4": dict(NARROW_TUNE["gemm_cpu.cl"], MR=4, MSUB=8),
         "narrow KC 256": dict(NARROW_TUNE["gemm_cpu.cl"], KC=256, KP=128, MSUB=2),
         "wide MR 8": dict(DEFAULT_TUNE["gemm_cpu.cl"], MR=8, KC=128), "wide MR 14": dict(DEFAULT_TUNE["gemm_cpu.cl"], MR=14, MSUB=2)}


@pytest.fixture(params=sorted(TILES))
def tile(request):
    saved = dict(BE._tune)
    BE._tune.clear()
    BE._tune["gemm_cpu.cl"] = dict(TILES[request.param])
    try:
        yield TILES[request.param]
    finally:
        BE._tune.clear()
        BE._tune.update(saved)


def _err(got, ref) -> float:
    got = np.asarray(got, np.float64)
    ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
    assert got.shape == ref.shape
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))


def _t(a):
    return torch.from_numpy(a).double()


@pytest.mark.parametrize("M,N,K", [(97, 131, 300), (64, 64, 64), (6, 200, 70), (256, 40, 1030), (130, 33, 17)])
def test_matmul_under_every_tile(tile, M, N, K):
    rng = np.random.default_rng(M * N + K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    assert BE.tunables("gemm_cpu.cl", BE._shape_class(M, N, K))["MR"] == tile["MR"]
    assert _err(BE.to_numpy(BE.matmul(a, b)), _t(a) @ _t(b)) < 1e-6


@pytest.mark.parametrize("xs,ws,stride,padding", [((2, 64, 12, 20), (40, 64, 3, 3), 1, 1),   # Winograd
                                                  ((1, 32, 9, 11), (70, 32, 3, 3), 1, 0),
                                                  ((2, 5, 19, 23), (7, 5, 5, 5), 2, 2),      # im2col GEMM
                                                  ((1, 48, 10, 10), (30, 48, 1, 1), 1, 0)])
def test_conv2d_and_its_gradients_under_every_tile(tile, xs, ws, stride, padding):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    xt, wt = _t(x).requires_grad_(), _t(w).requires_grad_()
    ref = F.conv2d(xt, wt, _t(b), stride, padding)
    assert _err(BE.to_numpy(BE.conv2d(x, w, b, stride, padding)), ref) < 2e-6
    gy = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    gx_ref, gw_ref = torch.autograd.grad(ref, (xt, wt), _t(gy))
    p = (padding,) * 4
    s = (stride, stride)
    gx = BE._conv2d_input_grad(BE.to_device(gy), BE.to_device(w), xs[2:], s, p, (1, 1), 1)
    gw = BE._conv2d_weight_grad(BE.to_device(x), BE.to_device(gy), ws, s, p, (1, 1), 1)
    assert _err(BE.to_numpy(gx), gx_ref) < 2e-6
    assert _err(BE.to_numpy(gw), gw_ref) < 2e-6


@pytest.mark.parametrize("L,S,E", [(200, 300, 64), (77, 50, 40)])
def test_attention_under_every_tile(tile, L, S, E):
    rng = np.random.default_rng(L + S + E)
    q, k, v = (rng.standard_normal((1, 2, n, E)).astype(np.float32) for n in (L, S, S))
    got = BE.to_numpy(BE.scaled_dot_product_attention(BE.to_device(q), BE.to_device(k), BE.to_device(v)))
    assert _err(got, F.scaled_dot_product_attention(_t(q), _t(k), _t(v))) < 2e-6


def test_the_defaults_follow_the_vector_width(monkeypatch):
    cls = type(BE)
    monkeypatch.setattr(cls, "vector_width", property(lambda self: 8))
    assert BE.narrow_vectors == BE.is_cpu_device
    if BE.is_cpu_device:
        assert BE.default_tunables("gemm_cpu.cl") == NARROW_TUNE["gemm_cpu.cl"]
        assert BE.default_tunables("w8a8_cpu.cl") == DEFAULT_TUNE["w8a8_cpu.cl"]  # no narrow variant: as before
        assert all("MR" not in c or c["MR"] <= 6 for c in BE._tune_candidates())
    monkeypatch.setattr(cls, "vector_width", property(lambda self: 16))
    assert not BE.narrow_vectors
    assert BE.default_tunables("gemm_cpu.cl") == DEFAULT_TUNE["gemm_cpu.cl"]
    saved = dict(BE._tune)
    try:
        BE._tune.clear()
        BE._tune["gemm_cpu.cl:lll"] = {"MR": 8, "MSUB": 2}  # a stored tuning wins over the defaults
        assert BE.tunables("gemm_cpu.cl", "lll") == dict(DEFAULT_TUNE["gemm_cpu.cl"], MR=8, MSUB=2)
        assert BE.tunables("gemm_cpu.cl", "mmm") == DEFAULT_TUNE["gemm_cpu.cl"]
    finally:
        BE._tune.clear()
        BE._tune.update(saved)


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("E,Ev", [(64, 64), (40, 40), (32, 48), (80, 80), (8, 12), (24, 7), (160, 160), (64, 80)])
def test_attention_under_both_vector_widths(monkeypatch, narrow, E, Ev):
    """att_cpu's build options follow the vector width (attention.cpu_params: narrow vectors take 2 rows, 32-key
    blocks and the value dim in passes); a mask, causal rows and a key count past the last block, both ways."""
    from anydevice.backend.devices.opencl import attention
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8 if narrow else 16))
    p = attention.cpu_params(E, Ev, BE.narrow_vectors)
    vw, nv = attention.value_vectors(Ev, bool(p.get("VW8")))
    assert nv % p.get("CV", nv) == 0 and p["TQ"] % p["RT"] == 0
    if narrow:  # the value passes: the most sums (vectors of 8 lanes for a head of 80 or 160, not 16)
        assert bool(p.get("VW8")) == (Ev in (80, 160)) and p["RT"] * p["CV"] * vw <= attention.NARROW_CV_FLOATS
    rng = np.random.default_rng(E * Ev)
    L, S = 70, 83
    q = rng.standard_normal((2, 3, L, E)).astype(np.float32)
    k = rng.standard_normal((2, 3, S, E)).astype(np.float32)
    v = rng.standard_normal((2, 3, S, Ev)).astype(np.float32)
    m = rng.standard_normal((L, S)).astype(np.float32)
    got = BE.to_numpy(BE.scaled_dot_product_attention(*(BE.to_device(a) for a in (q, k, v)), attn_mask=BE.to_device(m)))
    assert _err(got, F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=_t(m))) < 2e-6
    got = BE.to_numpy(BE.scaled_dot_product_attention(*(BE.to_device(a) for a in (q, k, v)), is_causal=True))
    assert _err(got, F.scaled_dot_product_attention(_t(q), _t(k), _t(v), is_causal=True)) < 2e-6


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("xs,cout,k,stride,padding,dilation,groups", [
    ((2, 5, 19, 40), 7, 3, 1, 1, 1, 1), ((1, 16, 12, 70), 13, 3, 1, 1, 1, 1), ((2, 6, 30, 70), 6, 5, 2, 2, 1, 1),
    ((1, 8, 20, 50), 9, 3, 1, 2, 2, 1), ((1, 12, 10, 64), 12, 3, 1, 1, 1, 3), ((1, 3, 40, 100), 16, 3, 1, 1, 1, 1),
    ((1, 20, 5, 300), 5, 3, 1, 1, 1, 1)])  # (rows of more than 4 tiles: edge tiles unpadded; 20 x 9 taps: 3 folds)
def test_direct_convs_under_both_tiles(monkeypatch, narrow, xs, cout, k, stride, padding, dilation, groups):
    """conv2d_direct and conv_t2d_direct with the wide tile (8 output channels x 32 columns) and the narrow one (4 x
    16 columns, AVX2): channel counts that leave a partial tile, rows past one tile, padding, stride, dilation, groups."""
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8 if narrow else 16))
    want = 4 if narrow and BE.is_cpu_device else 8
    assert BE.default_tunables("conv_cpu.cl") == ({"DCO": 4, "TN": 16} if want == 4 else {"DCO": 8, "TN": 32})
    _check_direct_convs(monkeypatch, want, xs, cout, k, stride, padding, dilation, groups)


@pytest.mark.parametrize("dco,tn", [(1, 16), (3, 16), (5, 16), (6, 16), (7, 32), (4, 32)])
def test_direct_convs_under_every_tile(monkeypatch, dco, tn):
    """Every output-channel count of the direct kernels' tile (RC's 1-8) with both column widths builds and matches
    torch, on rows with interior and edge tiles and inputs of several folds."""
    if not BE.is_cpu_device:
        pytest.skip("the direct conv kernels are the CPU family's")
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8))
    monkeypatch.setitem(NARROW_TUNE, "conv_cpu.cl", {"DCO": dco, "TN": tn})
    _check_direct_convs(monkeypatch, dco, (2, 9, 7, 150), 11, 3, 1, 1, 1, 1)
    _check_direct_convs(monkeypatch, dco, (1, 4, 9, 80), 6, 3, 2, 1, 1, 1)


def _check_direct_convs(monkeypatch, want, xs, cout, k, stride, padding, dilation, groups):
    rng = np.random.default_rng(sum(xs) + cout + k)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((cout, xs[1] // groups, k, k)) / k).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    launched = []
    run = BE._run
    monkeypatch.setattr(linalg, "WINOGRAD_WIDE", False)  # (wide vectors: 3x3 convs take wino_fused)
    monkeypatch.setattr(BE, "_run", lambda name, *a, **kw: (launched.append((name, kw.get("params"))), run(name, *a, **kw))[1])
    y = BE.to_numpy(BE.conv2d(x, w, b, stride, padding, dilation, groups))
    assert ("conv2d_direct", want) in [(n, (p or {}).get("DCO")) for n, p in launched], launched
    assert _err(y, F.conv2d(_t(x), _t(w), _t(b), stride, padding, dilation, groups)) < 2e-6
    wt = (rng.standard_normal((xs[1], cout, k, k)) / k).astype(np.float32)
    yt = BE.to_numpy(BE.conv_transpose2d(x, wt, None, stride, padding, 0, groups=1, dilation=dilation))
    assert _err(yt, F.conv_transpose2d(_t(x), _t(wt), None, stride, padding, 0, 1, dilation)) < 2e-6


@pytest.mark.parametrize("K", [200, 320, 500, 700])
def test_wide_gemm_takes_one_k_block_up_to_512(monkeypatch, K):
    """Wide vectors: gemm_cpu runs a K over its KC and up to GEMM_ONE_BLOCK_K as one block (KC 512, no 64-value
    tail for K = 320); other K keep the tuned KC. Against float64 either way."""
    if not BE.is_cpu_device:
        pytest.skip("the CPU kernel family's GEMM")
    from anydevice.backend.devices.opencl import params as P
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 16))
    built = []
    kernel = BE._kernel
    monkeypatch.setattr(BE, "_kernel", lambda name, params=None, *a, **k: (built.append((name, dict(params or {}))),
                                                                            kernel(name, params, *a, **k))[1])
    rng = np.random.default_rng(K)
    a = rng.standard_normal((300, K)).astype(np.float32)
    b = rng.standard_normal((K, 200)).astype(np.float32)
    y = np.asarray(BE.to_numpy(BE.matmul(BE.to_device(a), BE.to_device(b))), np.float64)
    kcs = {p["KC"] for name, p in built if name == "gemm_cpu"}
    kc = BE.tunables("gemm_cpu.cl")["KC"]
    assert kcs == ({P.GEMM_ONE_BLOCK_K} if kc < K <= P.GEMM_ONE_BLOCK_K else {kc}), (kcs, built)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()
