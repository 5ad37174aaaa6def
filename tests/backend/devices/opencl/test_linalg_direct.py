"""The CPU family's direct conv (kernels/conv_cpu.cl conv2d_direct) on narrow rows: the input's columns
are zero-padded once (linalg._direct_padded) so that every 32-column tile loads with vectors. Against
torch in float64, on geometries whose tiles cross the left edge, the right edge or both, and some
that need no padding."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import linalg
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")

@pytest.fixture(autouse=True)
def _direct_on_wide_vectors(monkeypatch):
    """The direct kernel for 3x3 convs on wide vectors too (there they take wino_fused, linalg.WINOGRAD_WIDE)."""
    monkeypatch.setattr(linalg, "WINOGRAD_WIDE", False)


#: (x shape, Cout, kernel, padding, dilation, stride, padded?)
CASES = [((2, 32, 64, 64), 32, 3, 1, 1, 1, True),    # the training denoiser's convs
         ((1, 3, 40, 70), 16, 3, 1, 1, 1, True),     # 3 tiles, the last one partial
         ((1, 8, 30, 97), 8, 5, 2, 1, 1, True),      # 5x5, 4 tiles
         ((1, 8, 33, 128), 8, 3, 2, 2, 1, True),     # dilation 2
         ((2, 5, 9, 100), 7, 3, 1, 1, 1, True),      # 4 tiles, odd channel counts (a partial group of 8)
         ((1, 64, 16, 100), 64, 3, 1, 1, 1, True),   # 64 channels: direct rather than Winograd
         ((1, 4, 12, 64), 12, 7, 3, 1, 1, True),     # 7x7
         ((1, 4, 12, 64), 4, 1, 0, 1, 1, False),     # 1x1, no padding: every tile inside already
         ((1, 6, 60, 60), 6, 3, 1, 1, 2, False),     # stride 2: not padded (one-by-one loads)
         ((1, 16, 20, 300), 16, 3, 1, 1, 1, False)]  # 10 tiles a row: few cross an edge, not padded


@pytest.mark.parametrize("xs,cout,k,pad,dil,stride,padded", CASES)
def test_direct_conv_on_narrow_rows_matches_torch(xs, cout, k, pad, dil, stride, padded, monkeypatch):
    rng = np.random.default_rng(sum(xs) + cout + k)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((cout, xs[1], k, k)) / np.sqrt(k * k * xs[1])).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    x0 = x.copy()
    xd = BE.to_device(x)
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 16))  # (narrow vectors: Winograd from 32 channels)
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **kw: (launched.append(name), run(name, *a, **kw))[1])
    y = np.asarray(BE.to_numpy(BE.conv2d(xd, BE.to_device(w), BE.to_device(b), stride, pad, dil)), np.float64)
    monkeypatch.setattr(BE, "_run", run)
    assert "conv2d_direct" in launched, launched
    assert ("pad2d" in launched) == padded, launched
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     torch.from_numpy(b).double(), stride=stride, padding=pad, dilation=dil).numpy()
    assert y.shape == ref.shape
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(ref)) <= 1e-6
    np.testing.assert_array_equal(np.asarray(BE.to_numpy(xd)), x0)  # the input is not changed


def _launching(fn):
    """(fn(), the kernels it launched)."""
    launched = []
    run = BE._run

    def spy(name, *a, **k):
        launched.append(name)
        return run(name, *a, **k)
    BE._run = spy
    try:
        return fn(), launched
    finally:
        BE._run = run


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("row", [0, 2])  # a weight row that meets the top (0) or bottom (2) padding rows
def test_nonfinite_weight_meets_the_padding_rows_as_torch(bad, row):
    """The direct kernel multiplies the zero padding rows by a non-finite weight (NaN, as torch's im2col)
    from the device flag, with no read-back; a finite weight keeps the fast path (values as torch's)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 10, 40)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    w[2, 1, row, 1] = bad
    y, launched = _launching(lambda: BE.to_numpy(BE.conv2d(BE.to_device(x), BE.to_device(w), None, 1, 1)))
    assert "conv2d_direct" in launched
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    assert (np.isnan(y) == np.isnan(ref)).all() and (np.isinf(y) == np.isinf(ref)).all()
    fin = np.isfinite(ref)
    assert np.abs(y[fin] - ref[fin]).max() <= 1e-5 * np.abs(ref[fin]).max()


def test_the_finite_flag_is_made_once_per_weight_buffer():
    rng = np.random.default_rng(8)
    x = BE.to_device(rng.standard_normal((1, 4, 10, 40)).astype(np.float32))
    w = BE.to_device(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    a, first = _launching(lambda: BE.to_numpy(BE.conv2d(x, w, None, 1, 1)))
    b, second = _launching(lambda: BE.to_numpy(BE.conv2d(x, w, None, 1, 1)))
    assert len(second) < len(first)  # the second call makes no flag
    np.testing.assert_array_equal(a, b)
