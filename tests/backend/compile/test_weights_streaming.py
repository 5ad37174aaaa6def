"""Weights past the device budget stream (ANYDEVICE_DEVICE_MB, weights.device_budget): uploaded for one
use, dropped after; the model runs with the same result; compile.report() shows the resident weights, the
bytes streamed per call and the device peak."""
from __future__ import annotations

import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile.weights import Weights, device_budget


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Conv2d(32, 32, 3, padding=1) for _ in range(8)]).eval()


@pytest.mark.parametrize("name", ["numpy", "opencl"])
@pytest.mark.parametrize("dtype", [None, "float16"])
def test_a_model_larger_than_the_budget_runs_and_gives_the_same_result(monkeypatch, name, dtype):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    m = _model()
    x = torch.randn(1, 32, 16, 16)
    item = 2 if dtype else 4
    total = sum(p.numel() for p in m.parameters()) * item
    cache = Weights.of(be, dtype or "float32")
    cache.clear()
    with torch.no_grad():
        whole = C.compile_module(m, be, dtype=dtype)(x)
    assert cache.nbytes == total
    cache.clear()
    monkeypatch.setenv("ANYDEVICE_DEVICE_MB", str(total / 2 / 2**20))
    assert device_budget(be) == total // 2
    cm = C.compile_module(m, be, dtype=dtype)
    with torch.no_grad():
        cm(x)
        before = C.report(cm)
        y = cm(x)
    rep = C.report(cm)
    assert torch.equal(y, whole)  # the same numbers, resident or streamed
    assert 0 < rep["weights_bytes"] == cache.nbytes <= total // 2
    streamed = rep["transfers"]["bytes_streamed"] - before["transfers"]["bytes_streamed"]
    assert streamed == total - rep["weights_bytes"] > 0  # per call: every weight that is not resident
    assert rep["transfers"]["constants"] == before["transfers"]["constants"]  # no resident weight uploaded again
    if name == "opencl":
        assert rep["device_peak_bytes"] is not None and rep["device_peak_bytes"] > 0
    cache.clear()


def test_zero_budget_streams_everything(monkeypatch):
    be = get_backend("numpy")
    m = _model()
    x = torch.randn(1, 32, 8, 8)
    monkeypatch.setenv("ANYDEVICE_DEVICE_MB", "0")
    Weights.of(be).clear()
    cm = C.compile_module(m, be)
    with torch.no_grad():
        y, ref = cm(x), m(x)
    assert float((y - ref).norm() / ref.norm()) < 1e-5
    rep = C.report(cm)
    assert rep["weights_bytes"] == 0 and rep["transfers"]["bytes_streamed"] == sum(p.numel() for p in m.parameters()) * 4
