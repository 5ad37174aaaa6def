"""Compiled graphs recorded once and replayed (compile/replay.py, "graph_replay": CUDA graphs, OpenCL's GPU family's
recorded command lists).

A replay runs the very kernels the op-by-op run launches, on the same weights, so its outputs are the
op-by-op run's to the bit (ANYDEVICE_GRAPHS=0 is that run); they are also checked against PyTorch in
float64. The recording is made at a signature's second call and dropped when a weight changes or the
device lets its graphs go (ComfyUI unloading models)."""
from __future__ import annotations

import copy

import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile.lowering import Weights
from anydevice.backend.compile.replay import Replays

from compile_models import conv_attention_model


def _exact(m, x):
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double())


def _inputs(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, 12, 12, generator=g) for _ in range(n)]


_GPU_FAMILY = {}


def _device(name):
    """The CUDA backend, or the OpenCL GPU kernel family (a recorded command list; on PoCL here, the family
    forced on the CPU device)."""
    try:
        if name == "cuda":
            return get_backend("cuda")
        if "be" not in _GPU_FAMILY:
            from anydevice.backend.devices import opencl
            _GPU_FAMILY["be"] = opencl.create("opencl", 0, family="gpu")
        return _GPU_FAMILY["be"]
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable ({'no CUDA GPU or CuPy' if name == 'cuda' else 'no OpenCL'}): {exc}")


DEVICES = pytest.mark.parametrize("device", ["cuda", "opencl-gpu-family"])


def test_a_device_without_graph_replay_runs_op_by_op():
    be = get_backend("numpy")
    m = conv_attention_model(0)
    f = C.compile_module(m, be)
    for x in _inputs(3):
        with torch.no_grad():
            y = f(x)
        exact = _exact(m, x)
        assert float((y.double() - exact).norm() / exact.norm()) < 1e-5
    lw = f.graphs[0]
    assert lw.replays is None and "records no device graphs" in Replays.why_not(lw)
    assert lw.stats.recorded == lw.stats.replayed == 0


@DEVICES
@pytest.mark.parametrize("dtype", [None, "float16"])
def test_replays_match_the_op_by_op_run_to_the_bit(device, dtype, monkeypatch):
    be = _device(device)
    m = conv_attention_model(0)
    Weights.of(be, dtype or "float32").clear()
    replayed = C.compile_module(m, be, dtype=dtype)
    xs = _inputs(4)
    monkeypatch.setenv("ANYDEVICE_GRAPHS", "0")
    plain = C.compile_module(m, be, dtype=dtype)
    with torch.no_grad():
        want = [plain(xs[0])]  # traced and lowered at the first call: no replays
        monkeypatch.delenv("ANYDEVICE_GRAPHS")
        want += [plain(x) for x in xs[1:]]
        got = [replayed(x) for x in xs]
    lw = replayed.graphs[0]
    assert plain.graphs[0].replays is None
    assert (lw.stats.recorded, lw.stats.replayed) == (1, 2), lw.replays.reason  # 1: op by op, 2: recorded
    for x, y, w in zip(xs, got, want):
        assert torch.equal(y, w)
        exact = _exact(m, x)
        assert float((y.double() - exact).norm() / exact.norm()) < (1e-5 if dtype is None else 3e-3)


@DEVICES
def test_a_changed_weight_or_freed_memory_records_again(device):
    be = _device(device)
    m = conv_attention_model(1)
    f = C.compile_module(m, be)
    xs = _inputs(6, seed=5)
    with torch.no_grad():
        for x in xs[:3]:
            f(x)
        lw = f.graphs[0]
        assert (lw.stats.recorded, lw.stats.replayed) == (1, 1)
        m[0].weight.mul_(-0.5)  # written in place: a new version, so another signature
        for x in xs[3:5]:
            y = f(x)
            exact = _exact(m, x)
            assert float((y.double() - exact).norm() / exact.norm()) < 1e-5
        assert lw.stats.recorded == 2
        be.free_memory()  # ComfyUI unloading models: the recording's pool goes
        y = f(xs[5])
        exact = _exact(m, xs[5])
        assert float((y.double() - exact).norm() / exact.norm()) < 1e-5
        assert lw.stats.replayed == 1  # not from the retired recording


class _Noisy(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x) + torch.rand_like(x)


@DEVICES
def test_a_graph_that_draws_random_numbers_is_not_recorded(device):
    be = _device(device)
    f = C.compile_module(_Noisy(), be)
    x = torch.zeros(2, 3)
    with torch.no_grad():
        a, b = f(x), f(x)
    assert not torch.equal(a, b)
    lw = f.graphs[0]
    assert lw.replays is None and "random" in Replays.why_not(lw)
