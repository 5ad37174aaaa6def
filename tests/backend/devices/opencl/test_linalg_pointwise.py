"""The CPU family's 1x1 convs as _gemm's batched GEMM (linalg.py's "pointwise" path: B packed straight from
the input, the bias in gemm_cpu's epilogue): which convs take it, and their values against float64 with and
without a bias, on partial row and column tiles and several images, an input or a weight stored in half or
quantized (bit for bit against the float32 product of the same values), a fused PReLU, and Inf / NaN inputs
(torch's pattern: no padding, so no zero meets them)."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import dtypes, quant

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import linalg
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)


@pytest.fixture
def gemms(monkeypatch):
    """The conv paths taken (one entry per conv2d) and the _gemm calls that wrote into a given output."""
    taken, calls = [], []
    path, gemm = BE._conv_path, BE._gemm

    def spy_path(*a, **k):
        p = path(*a, **k)
        taken.append(p)
        return p

    def spy_gemm(*a, **k):
        if k.get("out") is not None:
            calls.append(k)
        return gemm(*a, **k)
    monkeypatch.setattr(BE, "_conv_path", spy_path)
    monkeypatch.setattr(BE, "_gemm", spy_gemm)
    return taken, calls


def _ref(x, w, b):
    import torch
    import torch.nn.functional as F
    return F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                    None if b is None else torch.from_numpy(b).double()).numpy()


@pytest.mark.parametrize("xs,cout", [((2, 320, 16, 16), 320), ((3, 33, 10, 13), 70), ((1, 64, 9, 8), 200),
                                     ((4, 7, 31, 5), 130), ((1, 512, 8, 8), 16), ((2, 64, 32, 32), 4)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_pointwise_matches_float64(gemms, xs, cout, with_bias):
    taken, calls = gemms
    rng = np.random.default_rng(sum(xs) + cout)
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = (rng.standard_normal((cout, xs[1], 1, 1)) / np.sqrt(xs[1])).astype(np.float32)
    b = rng.uniform(-1, 1, cout).astype(np.float32) if with_bias else None
    y = BE.to_numpy(BE.conv2d(x, w, b))
    ref = _ref(x, w, b)
    assert y.shape == ref.shape and y.dtype == np.float32
    assert np.abs(y - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max()) * np.sqrt(xs[1])
    assert taken == ["pointwise"] and len(calls) == 1
    assert (calls[0]["bias"] is not None) == with_bias


@pytest.mark.parametrize("kw,xs", [({"padding": 1}, (2, 64, 16, 16)), ({"stride": 2}, (2, 64, 16, 16)),
                                   ({"groups": 2}, (2, 64, 16, 16)), ({}, (1, 2, 3, 3)), ({}, (32, 64, 7, 7)),
                                   ({}, (2, 4, 24, 24))])
def test_other_1x1_convs_keep_their_paths(gemms, kw, xs):
    """Padding, a stride, groups, an image's product under SMALL_GEMM_MACS (the batch's over it: 2 x 4 x 24^2 -> 32;
    a compiled model's last conv, once lost its bias in _gemm's small path) or images under POINTWISE_MIN_PIXELS: not
    the pointwise path (and right)."""
    taken, calls = gemms
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = rng.standard_normal((32, xs[1] // kw.get("groups", 1), 1, 1)).astype(np.float32)
    b = rng.uniform(-1, 1, 32).astype(np.float32)
    y = BE.to_numpy(BE.conv2d(x, w, b, **kw))
    import torch
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     torch.from_numpy(b).double(), **kw).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert taken and "pointwise" not in taken and not calls


def test_input_past_the_workspace_budget_is_not_packed_whole(monkeypatch):
    """An input larger than the workspace budget keeps the other paths (which bound their temporaries by it); the
    path needs the pads (without them, not taken)."""
    monkeypatch.setattr(linalg, "workspace_budget_bytes", lambda: 4 * 2 * 64 * 16 * 16 - 4)
    assert BE._conv_path((2, 64, 16, 16), 32, 1, 1, (1, 1), (1, 1), 1, 16, (0, 0, 0, 0)) != "pointwise"
    monkeypatch.setattr(linalg, "workspace_budget_bytes", lambda: 4 * 2 * 64 * 16 * 16)
    assert BE._conv_path((2, 64, 16, 16), 32, 1, 1, (1, 1), (1, 1), 1, 16, (0, 0, 0, 0)) == "pointwise"
    assert BE._conv_path((2, 64, 16, 16), 32, 1, 1, (1, 1), (1, 1), 1, 16) != "pointwise"  # pads unknown


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
def test_half_input_gives_its_rounded_float32_product(gemms, kind):
    """A half model's 1x1 conv: the input stays half (pack_b reads it as stored) and the output is half, rounded
    once from the float32 sums: the float32 conv of the same values, rounded."""
    taken, _ = gemms
    rng = np.random.default_rng(11)
    x = dtypes.round_to(rng.uniform(-1, 1, (2, 96, 12, 11)).astype(np.float32), kind)
    w = dtypes.round_to(rng.standard_normal((80, 96, 1, 1)).astype(np.float32) / 10, kind)
    b = dtypes.round_to(rng.uniform(-1, 1, 80).astype(np.float32), kind)
    y = BE.conv2d(*(BE.to_device(v, dtype=kind) for v in (x, w, b)))
    assert BE._dtype(y) == kind
    y32 = BE.to_numpy(BE.conv2d(x, w, b))
    np.testing.assert_array_equal(np.asarray(BE.to_numpy(y), np.float32), dtypes.round_to(y32, kind))
    assert taken == ["pointwise", "pointwise"]


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "q8_0", "q4_0"])
def test_compressed_weight_is_its_float32_product(gemms, kind):
    taken, _ = gemms
    rng = np.random.default_rng(12)
    x = rng.uniform(-1, 1, (2, 64, 10, 10)).astype(np.float32)
    w = rng.standard_normal((96, 64)).astype(np.float32) / 8
    b = rng.uniform(-1, 1, 96).astype(np.float32)
    if kind in quant.FORMATS:
        q = quant.quantize(w, kind)
        wd, wf = BE.to_device_quant(q), q.dequantize()
    else:
        wd, wf = BE.to_device(w, dtype=kind), dtypes.round_to(w, kind)
    wd = BE.reshape(wd, (96, 64, 1, 1))
    y = BE.to_numpy(BE.conv2d(x, wd, b))
    np.testing.assert_array_equal(y, BE.to_numpy(BE.conv2d(x, wf.reshape(96, 64, 1, 1), b)))
    assert taken == ["pointwise", "pointwise"]


def test_weight_sliced_into_panels_matches(gemms, monkeypatch):
    """A compressed weight over WEIGHT_PANEL_BYTES is packed in slices of rows, each with its slice of the bias."""
    taken, _ = gemms
    monkeypatch.setattr(linalg, "WEIGHT_PANEL_BYTES", 4 * 64 * 24)
    rng = np.random.default_rng(13)
    x = rng.uniform(-1, 1, (2, 64, 9, 9)).astype(np.float32)
    w = dtypes.round_to(rng.standard_normal((100, 64, 1, 1)).astype(np.float32) / 8, "float16")
    b = rng.uniform(-1, 1, 100).astype(np.float32)
    y = BE.to_numpy(BE.conv2d(x, BE.to_device(w, dtype="float16"), b))
    ref = _ref(x, w, b)
    assert np.abs(y - ref).max() <= 1e-5
    assert taken == ["pointwise"]


def test_inf_and_nan_inputs_follow_torch(gemms):
    taken, _ = gemms
    rng = np.random.default_rng(14)
    x = rng.uniform(-1, 1, (2, 40, 8, 8)).astype(np.float32)
    x[0, 3, 2, 5] = np.inf
    x[1, 7, 0, 0] = np.nan
    x[1, 8, 4, 4] = -np.inf
    w = rng.standard_normal((50, 40, 1, 1)).astype(np.float32)
    y = BE.to_numpy(BE.conv2d(x, w, None))
    ref = _ref(x, w, None)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(ref))
    fin = np.isfinite(ref)
    assert fin.sum() > 0.9 * ref.size
    assert np.abs(y[fin] - ref[fin]).max() <= 1e-5 * max(1.0, np.abs(ref[fin]).max())
    assert taken == ["pointwise"]


def test_prelu_epilogue_after_the_gemm(gemms):
    """conv_prelu's slope on a 1x1 conv: the GEMM's output, then the PReLU pass (as torch's two ops)."""
    import torch
    taken, _ = gemms
    rng = np.random.default_rng(15)
    x = rng.uniform(-1, 1, (2, 48, 10, 10)).astype(np.float32)
    w = rng.standard_normal((40, 48, 1, 1)).astype(np.float32) / 7
    b = rng.uniform(-1, 1, 40).astype(np.float32)
    a = rng.uniform(0, 0.5, 40).astype(np.float32)
    dev = [BE.to_device(v) for v in (x, w, b, a)]
    y = BE.to_numpy(BE._conv2d_prelu(dev[0], dev[1], dev[2], 1, 0, 1, 1, dev[3]))
    ref = torch.nn.functional.prelu(torch.from_numpy(_ref(x, w, b)), torch.from_numpy(a).double()).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    assert taken == ["pointwise"]


def test_small_gemm_adds_the_bias_and_refuses_a_half_output():
    """_gemm's small path (gemm_small) takes the bias too, and writes float32 only."""
    rng = np.random.default_rng(16)
    a = BE.to_device(rng.standard_normal((5, 7)).astype(np.float32))
    bm = rng.standard_normal((2, 7, 9)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    y = BE._gemm(5, 9, 7, 2, a, a.offset, 7, 1, 0, BE.to_device(bm), 0, 9, 1, 63, bias=BE.to_device(bias))
    ref = np.einsum("mk,bkn->bmn", BE.to_numpy(a).astype(np.float64), bm) + bias[None, :, None]
    np.testing.assert_allclose(BE.to_numpy(y), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32"):
        BE._gemm(5, 9, 7, 2, a, a.offset, 7, 1, 0, BE.to_device(bm), 0, 9, 1, 63, out=BE._empty((2, 5, 9), "float16"))


def test_k0_gemm_gives_the_bias():
    rng = np.random.default_rng(18)
    bias = rng.standard_normal(70).astype(np.float32)
    a, b = BE._empty((70, 0)), BE._empty((2, 0, 300))
    y = BE._gemm(70, 300, 0, 2, a, 0, 0, 1, 0, b, 0, 300, 1, 0, bias=BE.to_device(bias))
    np.testing.assert_array_equal(BE.to_numpy(y), np.broadcast_to(bias[None, :, None], (2, 70, 300)))
