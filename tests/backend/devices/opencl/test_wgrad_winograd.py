"""The CPU family's Winograd F(2x2, 3x3) weight gradient (backend/devices/opencl/winograd.py _wgrad_winograd,
kernels/winograd_wgrad_cpu.cl) against torch autograd in float64: gy's row runs (32 tiles side by side) and
its gathers (groups crossing rows and images, odd output sizes, the last partial group), chunks of tiles
summed in order, padding on any side; an Inf/NaN in x or gy takes the exact per-tap path (torch's Inf and
NaN pattern); while recording the flag is a guard."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")

from anydevice.backend.devices.opencl import winograd  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: (N, Cin, Cout, H, W, pads (t, b, l, r))
CASES = [(16, 32, 32, 64, 64, (1, 1, 1, 1)),   # the training denoiser's 32 -> 32 convs: runs, 16 chunks
         (2, 32, 32, 9, 11, (1, 1, 1, 1)),     # odd output sizes: no run, edge tiles
         (1, 48, 40, 33, 70, (1, 1, 1, 1)),    # channels past a register tile, a partial last group
         (3, 32, 64, 7, 5, (0, 0, 0, 0)),      # no padding (5 x 3 outputs)
         (2, 32, 33, 5, 67, (1, 1, 1, 1)),     # wide rows (runs and a tail), one output channel past a tile
         (2, 35, 32, 12, 20, (1, 0, 2, 1)),    # asymmetric padding, odd input channels
         (3, 5, 3, 17, 40, (1, 1, 1, 1)),      # few channels: a register tile past both
         (16, 16, 16, 20, 20, (1, 1, 1, 1)),   # 16 -> 16
         (2, 4, 1, 9, 33, (0, 0, 0, 0))]       # one output channel


def _reference(x32, gy32, wshape, pads):
    t, b, l, r = pads
    xp = torch.nn.functional.pad(torch.from_numpy(x32).double(), (l, r, t, b))
    return torch.nn.grad.conv2d_weight(xp, wshape, torch.from_numpy(gy32).double()).numpy()


def _case(N, C, O, H, W, pads, seed=0):
    rng = np.random.default_rng(seed + N + C + O + H + W)
    t, b, l, r = pads
    x32 = rng.standard_normal((N, C, H, W)).astype(np.float32)
    gy32 = rng.standard_normal((N, O, H + t + b - 2, W + l + r - 2)).astype(np.float32)
    return x32, gy32


def _launched(monkeypatch):
    names = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k: (names.append(name), run(name, *a, **k))[1])
    return names


@pytest.mark.parametrize("tiles", [None, 64])  # 64: many chunks, the last one partial
@pytest.mark.parametrize("N,C,O,H,W,pads", CASES)
def test_winograd_weight_grad_matches_torch(N, C, O, H, W, pads, tiles, monkeypatch):
    if tiles:
        monkeypatch.setattr(winograd, "WGRAD_WINO_TILES", tiles)
    x32, gy32 = _case(N, C, O, H, W, pads)
    x, gy = BE.to_device(x32), BE.to_device(gy32)
    names = _launched(monkeypatch)
    gw = BE._conv2d_weight_grad(x, gy, (O, C, 3, 3), (1, 1), pads, (1, 1), 1)
    assert "wino_wgemm" in names and "gemm_cpu" not in names, names
    got = np.asarray(BE.to_numpy(gw), np.float64)
    ref = _reference(x32, gy32, (O, C, 3, 3), pads)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()
    assert np.linalg.norm(got - ref) <= 1e-6 * np.linalg.norm(ref)
    np.testing.assert_array_equal(BE.to_numpy(x), x32)  # inputs unchanged
    np.testing.assert_array_equal(BE.to_numpy(gy), gy32)


@pytest.mark.parametrize("shape,stride,dil,groups,dtype", [
    ((32, 32, 5, 5), 1, 1, 1, "float32"),   # not 3x3
    ((32, 32, 3, 3), 2, 1, 1, "float32"),   # strided
    ((32, 32, 3, 3), 1, 2, 1, "float32"),   # dilated
    ((32, 16, 3, 3), 1, 1, 2, "float32"),   # grouped
    ((32, 3, 3, 3), 1, 1, 1, "float32"),    # too few input channels
    ((32, 32, 3, 3), 1, 1, 1, "float16")])  # a half activation
def test_other_geometries_do_not_take_it(shape, stride, dil, groups, dtype):
    x = BE.to_device(np.ones((1, shape[1] * groups, 8, 8), np.float32))
    if dtype != "float32":
        x = BE._cast(x, dtype)
    gy = BE.to_device(np.ones((1, shape[0], 6, 6), np.float32))
    assert not BE._wgrad_wino_takes(x, gy, shape, (stride, stride), (dil, dil), groups)


@pytest.mark.parametrize("where,value", [("x", np.inf), ("x", np.nan), ("gy", -np.inf)])
def test_a_non_finite_value_takes_the_exact_path(where, value, monkeypatch):
    """Winograd's transforms mix a tile (Inf - Inf = NaN); the flag sends the gradient to the per-tap path,
    whose Inf / NaN pattern is torch's."""
    x32, gy32 = _case(2, 32, 32, 12, 12, (1, 1, 1, 1), seed=1)
    (x32 if where == "x" else gy32)[1, 5, 6, 7] = value
    names = _launched(monkeypatch)
    gw = np.asarray(BE.to_numpy(BE._conv2d_weight_grad(BE.to_device(x32), BE.to_device(gy32), (32, 32, 3, 3), (1, 1),
                                                       (1, 1, 1, 1), (1, 1), 1)))
    assert "wino_wgemm" in names and "gemm_cpu" in names, names  # tried, flagged, recomputed
    with np.errstate(invalid="ignore"):
        ref = _reference(x32, gy32, (32, 32, 3, 3), (1, 1, 1, 1))
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(gw), np.isinf(ref))
    fin = np.isfinite(ref)
    assert np.abs(gw[fin] - ref[fin]).max() <= 2e-6 * np.abs(ref[fin]).max()


def test_it_records_with_a_guard():
    """No read-back while recording: the flag is a guard; replays match torch on new inputs, and an Inf in a
    replayed input fails the guard."""
    x0, g0 = _case(2, 32, 32, 20, 24, (1, 1, 1, 1), seed=2)
    with BE.record({"x": x0, "g": g0}) as rec:
        gw = BE._conv2d_weight_grad(BE.to_device(x0), BE.to_device(g0), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1),
                                    (1, 1), 1)
    assert rec.ok, rec.reason
    assert len(rec.guards) == 1
    for seed in (4, 5):
        x, g = _case(2, 32, 32, 20, 24, (1, 1, 1, 1), seed=seed)
        rec.replay({"x": x, "g": g})
        assert rec.guards_pass()
        ref = _reference(x, g, (32, 32, 3, 3), (1, 1, 1, 1))
        assert np.abs(np.asarray(BE.to_numpy(gw), np.float64) - ref).max() <= 2e-6 * np.abs(ref).max()
    x[0, 3, 5, 7] = np.inf
    rec.replay({"x": x, "g": g})
    assert not rec.guards_pass()
    rec.close()


@pytest.mark.parametrize("width", [16, 8])  # wino_wgemm's vectors: 16 tiles (AVX-512) or 8 (AVX2) a step
@pytest.mark.parametrize("N,C,O,H,W,pads", [CASES[2], CASES[4]])
def test_both_vector_widths(N, C, O, H, W, pads, width, monkeypatch):
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: width))
    assert BE.narrow_vectors == (width == 8)
    assert BE.default_tunables("winograd_wgrad_cpu.cl")["VW"] == width
    x32, gy32 = _case(N, C, O, H, W, pads)
    got = np.asarray(BE.to_numpy(BE._wgrad_winograd(BE.to_device(x32), BE.to_device(gy32), (O, C, 3, 3), pads)),
                     np.float64)
    ref = _reference(x32, gy32, (O, C, 3, 3), pads)
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()
