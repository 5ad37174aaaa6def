"""OpenCL's compiled-graph replay (backend/devices/opencl/graphs.py, "graph_replay" of the GPU kernel family):
a capture runs and records the work, its first launch is the recording's own run, later launches replay
it on the inputs copied in; guards fail a launch's checks; a capture that cannot be kept still returns its
(valid) results and gives its buffers back at once; free_memory retires the graphs and dropped graphs give
their buffers back."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend.devices.opencl import replay

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def be():
    try:
        from anydevice.backend.devices import opencl
        return opencl.create("opencl", 0, family="gpu")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"OpenCL unavailable: {exc}")


def test_only_the_gpu_family_replays_graphs(be, opencl_backend):
    assert "graph_replay" in be.caps.fused
    if opencl_backend.family == "cpu":  # (a CPU device: the host and the kernels share the cores)
        assert "graph_replay" not in opencl_backend.caps.fused


def test_a_capture_replays_on_new_inputs_and_guards_its_checks(be):
    rng = np.random.default_rng(0)
    x = be.to_device(rng.standard_normal((64, 32)).astype(np.float32))
    w = be.to_device(rng.standard_normal((32, 16)).astype(np.float32))
    launches = be.kernel_launches()

    def work():
        y = be.relu(be.matmul(x, w))
        be.recording().guard_finite(be._nan_sum(y))
        return y
    g, y = be._capture(work)
    ran = be.kernel_launches() - launches
    assert g is not None and be._graph_valid(g) and len(g.rec.guards) == 1
    be._launch_graph(g)  # the capture ran it: nothing more is queued
    assert be.kernel_launches() - launches == ran
    assert be._graph_checks(g)
    np.testing.assert_allclose(be.to_numpy(y), np.maximum(be.to_numpy(x) @ be.to_numpy(w), 0), rtol=1e-5, atol=1e-5)
    for seed in (1, 2):
        xn = np.random.default_rng(seed).standard_normal((64, 32)).astype(np.float32)
        be._copy_into(x, be.to_device(xn))
        be._launch_graph(g)
        assert be._graph_checks(g)
        np.testing.assert_allclose(be.to_numpy(y), np.maximum(xn @ be.to_numpy(w), 0), rtol=1e-5, atol=1e-5)
    xn[3, 4] = np.inf
    be._copy_into(x, be.to_device(xn))
    be._launch_graph(g)
    assert not be._graph_checks(g)


def test_a_capture_past_the_pinned_bytes_keeps_no_graph_but_its_results(be, monkeypatch):
    monkeypatch.setattr(replay, "MAX_PINNED_BYTES", 1 << 14)
    be._close_dropped_graphs()
    before = be.pool.pinned_bytes
    a = be.to_device(np.arange(8192, dtype=np.float32))
    g, (y, z) = be._capture(lambda: (be.add(a, 1.0), be.mul(be.add(a, 2.0), 3.0)))
    assert g is None and "MiB" in be._capture_reason()
    assert be.pool.pinned_bytes == before  # given back as soon as it failed
    np.testing.assert_array_equal(be.to_numpy(y), np.arange(8192) + 1.0)
    np.testing.assert_array_equal(be.to_numpy(z), (np.arange(8192) + 2.0) * 3.0)


def test_a_capture_that_raises_gives_its_buffers_back(be):
    be._close_dropped_graphs()
    before = be.pool.pinned_bytes
    a = be.to_device(np.ones(4096, np.float32))

    def work():
        be.add(a, 1.0)
        raise KeyboardInterrupt("cancelled")
    with pytest.raises(KeyboardInterrupt):
        be._capture(work)
    assert be.pool.pinned_bytes == before and be.recording() is None


def test_free_memory_retires_graphs_and_dropped_graphs_give_their_buffers_back(be):
    be._close_dropped_graphs()
    before = be.pool.pinned_bytes
    a = be.to_device(np.ones(4096, np.float32))
    g, y = be._capture(lambda: be.add(a, 1.0))
    assert be.pool.pinned_bytes > before
    be.free_memory()
    assert not be._graph_valid(g)
    del g, y
    be._close_dropped_graphs()
    assert be.pool.pinned_bytes == before


def test_a_compiled_graph_not_kept_runs_once(be, monkeypatch):
    """A recording past its bytes (a big model) costs no second run: its call returns the recording run's
    outputs, and the later calls run op by op as before."""
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 3, 3, padding=1))
    xs = [torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    monkeypatch.setenv("ANYDEVICE_GRAPHS", "0")
    plain_f = C.compile_module(m, be)
    with torch.no_grad():
        plain_f(xs[0])
        n0 = be.kernel_launches()
        plain_f(xs[1])
        plain = be.kernel_launches() - n0
        monkeypatch.delenv("ANYDEVICE_GRAPHS")
        f = C.compile_module(m, be)
        f(xs[0])  # (a signature's first call is never recorded)
        monkeypatch.setattr(replay, "MAX_PINNED_BYTES", 1 << 10)
        n0 = be.kernel_launches()
        y = f(xs[1])
        assert be.kernel_launches() - n0 <= plain + 2  # (the inputs' copies), not a second run
        ref = m.double()(xs[1].double())
    lw = f.graphs[0]
    assert lw.stats.recorded == 0 and "MiB" in lw.replays.reason
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-5
