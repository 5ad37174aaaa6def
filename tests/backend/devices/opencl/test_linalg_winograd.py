"""The CPU family's Winograd F(2x2, 3x3) conv (kernels/winograd_cpu.cl) in float32 against torch in float64:
the input transform's row runs (32 tiles side by side: each input row read contiguously) and its gathers
(groups of tiles crossing a row or an image, the border), the output transform's contiguous rows and its
tile by tile stores (odd output sizes, the last group), with and without padding and bias; the whole
conv fused (wino_fused) and apart (wino_in, gemm_cpu, wino_out)."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")

def _builds(monkeypatch) -> list:
    """The (kernel name, build options) of every kernel the backend asks for from now on."""
    built = []
    kernel = BE._kernel
    monkeypatch.setattr(BE, "_kernel", lambda name, params=None, *a, **k: (built.append((name, dict(params or {}))),
                                                                            kernel(name, params, *a, **k))[1])
    return built


CASES = [((1, 32, 64, 64), 32, 1, True),    # tw 32: every group one run
         ((2, 32, 66, 71), 40, 1, True),    # runs, groups crossing rows and images, odd output width
         ((1, 48, 130, 64), 32, 0, False),  # no padding: 128x62 outputs
         ((1, 32, 9, 200), 64, 1, True),    # one tall-thin band of runs, last group partial
         ((3, 32, 17, 33), 32, 1, True)]    # no run at all (tw 17)


@pytest.mark.parametrize("nt", [True, False])  # y by non-temporal stores (NTS, where 64-byte aligned) or plain ones
@pytest.mark.parametrize("fused", ["fused", "apart", "apart-halves"])  # wino_fused, or wino_in + gemm_cpu + wino_out
@pytest.mark.parametrize("xs,cout,pad,bias", CASES)                   # (more than 128 channels), V's panels in rows or
def test_winograd_conv_matches_torch(xs, cout, pad, bias, fused, nt, monkeypatch):  # two halves (gemm_cpu.cl's BH)
    from anydevice.backend.devices.opencl import linalg, winograd
    halves = fused == "apart-halves"
    fused = fused == "fused"
    if not fused:
        monkeypatch.setattr(winograd, "WINO_FUSED_MAX_C", 0)
        monkeypatch.setattr(linalg, "GEMM_B_HALVES", halves)
        tunables = BE.tunables
        # BH needs gemm_cpu's two 16-column passes (NH 2, AVX2's default): forced here on any machine
        monkeypatch.setattr(BE, "tunables", lambda f, sc="": dict(tunables(f, sc), **({"NH": 2, "MR": 6} if f == "gemm_cpu.cl" else {})))
    monkeypatch.setattr(winograd, "WINO_NT_MIN_BYTES", 0 if nt else 1 << 62)
    built = _builds(monkeypatch)
    rng = np.random.default_rng(sum(xs) + cout)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((cout, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "winograd")  # (the direct kernel wins on these narrow rows)
    y = np.asarray(BE.to_numpy(BE.conv2d(BE.to_device(x), BE.to_device(w), None if b is None else BE.to_device(b),
                                         1, pad)), np.float64)
    monkeypatch.setattr(BE, "_run", run)
    assert ("wino_fused" if fused else "wino_in") in launched and ("wino_fused" if fused else "wino_out") in launched, launched
    assert ("gemm_cpu" in launched) != fused, launched
    if not fused:
        panels = [p for name, p in built if name in ("wino_in", "gemm_cpu")]
        assert panels and all(p.get("BH", 0) == int(halves) for p in panels), built
    outs = [p for name, p in built if name in ("wino_fused", "wino_out")]
    assert outs and all(p.get("NTS", 0) == int(nt) for p in outs), built
    if fused and BE.narrow_vectors:  # AVX2: wino_fused's blocks of 4 output channels (WINO_FUSED_NARROW_MR)
        assert all(p["MR"] == winograd.WINO_FUSED_NARROW_MR for p in outs), built
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     None if b is None else torch.from_numpy(b).double(), padding=pad).numpy()
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("M,want", [(64, (8, 8)), (32, (8, 4)), (40, (8, 4)), (128, (8, 8)), (48, None), (24, None),
                                    (256, None), (30, None)])
def test_rows_fit_takes_mr_8_where_no_row_is_padding(M, want):
    sc = BE._shape_class(M, 1024, 64)
    saved = BE._tune.pop(f"gemm_cpu.cl:{sc}", None)
    try:
        p = BE._rows_fit(sc, M)
        default = BE.tunables("gemm_cpu.cl", sc)
        if default["MR"] != 12:  # narrow vectors (AVX2): MR 6 x 16 tiles, no fit
            want = None
        assert (p["MR"], p["MSUB"]) == (want if want is not None else (default["MR"], default["MSUB"]))
        BE._tune[f"gemm_cpu.cl:{sc}"] = {"MR": 14, "MSUB": 2}  # a stored tuning wins
        assert (BE._rows_fit(sc, M)["MR"], BE._rows_fit(sc, M)["MSUB"]) == (14, 2)
    finally:
        BE._tune.pop(f"gemm_cpu.cl:{sc}", None)
        if saved is not None:
            BE._tune[f"gemm_cpu.cl:{sc}"] = saved


@pytest.mark.parametrize("C", [3, 16, 20, 32, 40])
def test_fused_unrolled_channels_give_the_same_bits(C, monkeypatch):
    """wino_fused built for its input channel count (WC: the product loop unrolled, narrow vectors, C up to
    WINO_FUSED_UNROLL_MAX_C) computes the same fused multiply-adds in the same order as the loop over C: the same
    bits, and torch's float64 conv within the fused path's bound."""
    from anydevice.backend.devices.opencl import winograd
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8))  # narrow vectors (AVX2), on any machine
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "winograd")
    built = _builds(monkeypatch)
    rng = np.random.default_rng(C)
    x = rng.standard_normal((2, C, 37, 70)).astype(np.float32)  # runs and gathers, a partial last group
    w = (rng.standard_normal((20, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)

    def conv():
        return np.asarray(BE.to_numpy(BE.conv2d(BE.to_device(x), BE.to_device(w), BE.to_device(b), 1, 1)), np.float64)
    monkeypatch.setattr(winograd, "WINO_FUSED_UNROLL_MAX_C", 0)
    looped = conv()
    assert all("WC" not in p for name, p in built if name == "wino_fused") and any(n == "wino_fused" for n, _ in built)
    built.clear()
    monkeypatch.setattr(winograd, "WINO_FUSED_UNROLL_MAX_C", 32)
    unrolled = conv()
    fused = [p for name, p in built if name == "wino_fused"]
    assert fused and all(p.get("WC") == (C if C <= 32 else None) for p in fused), fused
    assert np.array_equal(looped, unrolled)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     torch.from_numpy(b).double(), padding=1).numpy()
    assert np.abs(unrolled - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("C", [3, 20, 40])
def test_fused_channel_blocks_over_kp(C, monkeypatch):
    """A stored tuning with KP under C: wino_fused folds its channel blocks into the private sums (the general path,
    which no default tuning reaches: every fused conv has at most 128 channels, KP is 128 or 256), and is built with WC
    only where C fits one block (C = 3)."""
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8))
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "winograd")
    tunables = BE.tunables
    monkeypatch.setattr(BE, "tunables", lambda f, sc="": dict(tunables(f, sc), **({"KP": 8} if f == "gemm_cpu.cl" else {})))
    built = _builds(monkeypatch)
    rng = np.random.default_rng(C + 1)
    x = rng.standard_normal((1, C, 30, 66)).astype(np.float32)
    w = (rng.standard_normal((12, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
    y = np.asarray(BE.to_numpy(BE.conv2d(BE.to_device(x), BE.to_device(w), None, 1, 1)), np.float64)
    fused = [p for name, p in built if name == "wino_fused"]
    assert fused and all(p.get("KP") == 8 and p.get("WC") == (C if C <= 8 else None) for p in fused), fused
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.mark.parametrize("xs,cout", [((2, 16, 37, 70), 20), ((1, 8, 64, 130), 8), ((1, 3, 20, 200), 5), ((3, 32, 17, 33), 16)])
def test_wide_fused_reads_runs_straight_from_x(xs, cout, monkeypatch):
    """Wide vectors (AVX-512): wino_fused in blocks of 8 output channels with both 16-tile halves at once (H2), unrolled
    over its input channels, and a float32 run wholly inside the image read straight from x (WD): the same bits as
    through the private row copy (runs inside, runs at the border, groups of no run) and as one half at a time, and
    torch's float64 conv within the fused path's bound."""
    from anydevice.backend.devices.opencl import winograd
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 16))  # wide vectors, on any machine
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "winograd")
    built = _builds(monkeypatch)
    rng = np.random.default_rng(sum(xs) + cout)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((cout, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)

    def conv():
        return np.asarray(BE.to_numpy(BE.conv2d(BE.to_device(x), BE.to_device(w), BE.to_device(b), 1, 1)), np.float64)
    monkeypatch.setattr(winograd, "WINO_IN_DIRECT", False)
    copied = conv()
    assert all("WD" not in p for name, p in built if name == "wino_fused")
    built.clear()
    monkeypatch.setattr(winograd, "WINO_IN_DIRECT", True)
    direct = conv()
    fused = [p for name, p in built if name == "wino_fused"]
    assert fused and all(p.get("WD") == 1 and p["MR"] == winograd.WINO_FUSED_WIDE_MR and p.get("WC") == xs[1]
                         and p.get("H2") == 1 for p in fused), fused
    assert np.array_equal(copied, direct)
    built.clear()
    monkeypatch.setattr(winograd, "WINO_FUSED_WIDE_H2", False)  # one 16-tile half at a time: the same sums in order
    halves = conv()
    assert all("H2" not in p for name, p in built if name == "wino_fused")
    assert np.array_equal(halves, direct)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     torch.from_numpy(b).double(), padding=1).numpy()
    assert np.abs(direct - ref).max() <= 2e-5 * np.abs(ref).max()
