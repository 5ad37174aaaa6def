"""The CPU family's linear layer over few rows as y^T = w x^T (opencl/linalg.py _linear, LINEAR_TRANSPOSED): the
float32 weight is gemm_cpu's A as stored (no pack of it), only x is packed, the result is stored transposed and the
bias added in the epilogue. Against torch in float64 on row and output counts around the 32-column tiles and the row
blocks, with and without bias, leading batch dims; and the layers that keep the packed-weight path."""
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


def _linear(monkeypatch, x, w, b):
    """(the backend's linear as float64, the kernels launched with their first arguments)."""
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k: (launched.append((name, a[2:5])), run(name, *a, **k))[1])
    y = BE.linear(BE.to_device(x), BE.to_device(w), None if b is None else BE.to_device(b))
    out = np.asarray(BE.to_numpy(y), np.float64)
    monkeypatch.setattr(BE, "_run", run)
    return out, launched


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead,K,N", [((77,), 768, 3072), ((1, 33), 100, 257), ((2, 50), 64, 400), ((256,), 320, 1280),
                                      ((5,), 1000, 64), ((3, 7), 48, 130)])
def test_few_rows_take_the_transposed_product(monkeypatch, lead, K, N, bias):
    if BE.family != "cpu":
        pytest.skip("the CPU kernel family's path")
    rng = np.random.default_rng(K + N + sum(lead))
    x = rng.standard_normal(lead + (K,)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    x0, w0 = x.copy(), w.copy()
    y, launched = _linear(monkeypatch, x, w, b)
    rows = int(np.prod(lead))
    transposed = rows <= linalg.LINEAR_TRANSPOSED_MAX_ROWS and 2 * rows <= N and rows * N * K > linalg.SMALL_GEMM_MACS
    packs = [a for name, a in launched if name == "pack_b"]
    if transposed:  # x packed (K x rows), never the weight; no separate bias add
        assert packs and all(a[0] == rows for a in packs), launched
        assert not any(name.startswith("binary") for name, _ in launched), launched
    ref = torch.nn.functional.linear(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     None if b is None else torch.from_numpy(b).double()).numpy()
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)


def test_the_transposed_product_matches_the_packed_one(monkeypatch):
    """The same values either way (each output is the same dot product; the sums' order differs, so within 1e-6)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    w = (rng.standard_normal((1024, 512)) / 20).astype(np.float32)
    b = rng.standard_normal(1024).astype(np.float32)
    fast, launched = _linear(monkeypatch, x, w, b)
    assert any(name == "pack_b" and a[0] == 64 for name, a in launched), launched  # x packed
    monkeypatch.setattr(linalg, "LINEAR_TRANSPOSED", False)
    plain, launched = _linear(monkeypatch, x, w, b)
    assert any(name == "pack_b" and a[0] == 1024 for name, a in launched), launched  # the weight packed
    assert np.abs(fast - plain).max() <= 1e-6 * np.abs(plain).max()


@pytest.mark.parametrize("rows,N", [(1024, 4096), (300, 500), (8, 8)])
def test_many_rows_or_few_outputs_keep_the_packed_weight(monkeypatch, rows, N):
    rng = np.random.default_rng(rows + N)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    w = rng.standard_normal((N, 64)).astype(np.float32)
    y, launched = _linear(monkeypatch, x, w, None)
    assert not any(name == "pack_b" and a[0] == rows and rows != N for name, a in launched), launched
    assert np.abs(y - x.astype(np.float64) @ w.T.astype(np.float64)).max() <= 1e-5 * np.abs(y).max()
