"""The CPU family's Winograd conv keeps a constant weight's transform (winograd.py ``_wino_u``): a float32 weight on
wrapped host memory (``to_device(..., share=True)``, a compiled model's: memory.py _HostBlock) is transformed by
wino_filter once and its U kept while the weight lives, within ANYDEVICE_WINOGRAD_WEIGHTS_MB (default 0: never)
and WINO_U_CACHE_SHARE of the free memory; results are
the bits of the uncached conv, fused and unfused; an Inf/NaN weight is never kept (torch's NaN pattern each call);
a copied weight is transformed every call."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import winograd
    from anydevice.backend.devices.opencl.memory import _HostBlock
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")


def _shared(w: np.ndarray):
    """``w`` wrapped in place (a torch tensor: 64-byte aligned), as the compile path's weights are."""
    t = torch.tensor(w)
    d = BE.to_device(t, share=True)
    if not isinstance(d.block, _HostBlock):
        pytest.skip("this device does not wrap host memory")
    return d, t


@pytest.fixture
def spied(monkeypatch):
    monkeypatch.setenv("ANYDEVICE_WINOGRAD_WEIGHTS_MB", "4096")
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "winograd")
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
    return launched


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("xs,cout", [((1, 32, 20, 23), 40), ((2, 16, 9, 33), 16)])
def test_a_constant_weight_is_transformed_once(spied, monkeypatch, fused, xs, cout):
    if not fused:
        monkeypatch.setattr(winograd, "WINO_FUSED_MAX_C", 0)
    rng = np.random.default_rng(sum(xs) + cout)
    x = BE.to_device(rng.standard_normal(xs).astype(np.float32))
    w = (rng.standard_normal((cout, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    ws, _t = _shared(w)
    want = BE.to_numpy(BE.conv2d(x, BE.to_device(w), None, 1, 1))  # a copy: transformed every call
    assert spied.count("wino_filter") == 1
    for call in range(3):
        got = BE.to_numpy(BE.conv2d(x, ws, None, 1, 1))
        np.testing.assert_array_equal(got, want)
        assert spied.count("wino_filter") == 2, (call, spied)  # the first constant call only
    ref = torch.nn.functional.conv2d(torch.from_numpy(BE.to_numpy(x)).double(), torch.from_numpy(w).double(), padding=1)
    assert np.abs(got - ref.numpy()).max() <= 2e-5 * float(ref.abs().max())
    entries = BE._wino_u_cache.get(ws.block)
    assert entries and len(entries) == 1
    block, n = weakref.ref(ws.block), len(BE._wino_u_cache)
    del ws
    gc.collect()
    assert block() is None and len(BE._wino_u_cache) == n - 1  # the weight's U went with it


def test_an_inf_or_nan_weight_is_not_kept(spied):
    rng = np.random.default_rng(3)
    x = BE.to_device(rng.standard_normal((1, 32, 12, 12)).astype(np.float32))
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    w[3, 5, 1, 1] = np.inf
    w[7, 0, 0, 2] = np.nan
    ws, _t = _shared(w)
    ref = torch.nn.functional.conv2d(torch.from_numpy(BE.to_numpy(x)), torch.from_numpy(w), padding=1).numpy()
    for _ in range(2):
        got = BE.to_numpy(BE.conv2d(x, ws, None, 1, 1))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    assert spied.count("wino_filter") == 2  # transformed (and refused) each call
    assert not BE.__dict__.get("_wino_u_cache", {}).get(ws.block)


def test_nothing_is_kept_past_the_budget(spied, monkeypatch):
    monkeypatch.setattr(winograd, "WINO_U_CACHE_SHARE", 0.0)
    rng = np.random.default_rng(4)
    x = BE.to_device(rng.standard_normal((1, 32, 10, 10)).astype(np.float32))
    ws, _t = _shared((rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32))
    a = BE.to_numpy(BE.conv2d(x, ws, None, 1, 1))
    b = BE.to_numpy(BE.conv2d(x, ws, None, 1, 1))
    np.testing.assert_array_equal(a, b)
    assert spied.count("wino_filter") == 2
    assert not BE.__dict__.get("_wino_u_cache", {}).get(ws.block)


def test_nothing_is_kept_by_default(spied, monkeypatch):
    monkeypatch.delenv("ANYDEVICE_WINOGRAD_WEIGHTS_MB")
    rng = np.random.default_rng(5)
    x = BE.to_device(rng.standard_normal((1, 32, 10, 10)).astype(np.float32))
    ws, _t = _shared((rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32))
    for _ in range(2):
        BE.conv2d(x, ws, None, 1, 1)
    assert spied.count("wino_filter") == 2
    assert not BE.__dict__.get("_wino_u_cache", {}).get(ws.block)


def test_the_megabytes_bound_the_cache(spied, monkeypatch):
    """32 x 32 x 3 x 3 weights: U is 16 x 32 x 32 floats (64 KiB) each; a 0.1 MB limit keeps one of two."""
    monkeypatch.setenv("ANYDEVICE_WINOGRAD_WEIGHTS_MB", "0.1")
    rng = np.random.default_rng(6)
    x = BE.to_device(rng.standard_normal((1, 32, 10, 10)).astype(np.float32))
    kept = BE.__dict__.get("_wino_u_cache")
    before = 0 if kept is None else sum(u.block.nbytes for e in kept.values() for u in e.values())
    if before:
        pytest.skip("another test's weights are still kept")
    pairs = [_shared((rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)) for _ in range(2)]
    for ws, _t in pairs:
        BE.conv2d(x, ws, None, 1, 1)
    assert sum(bool(BE._wino_u_cache.get(ws.block)) for ws, _t in pairs) == 1
