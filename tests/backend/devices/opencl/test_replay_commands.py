"""The OpenCL backend's recorded command lists (backend/devices/opencl/replay.py): a replay redoes the
recorded work on new inputs, cells change scalars, buffers a recording touches are never handed out
again until it closes, read-backs and other threads spoil a recording, signatures tell steps apart."""
import threading

import numpy as np
import pytest

from anydevice.backend.devices.opencl.replay import Cell

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def be(opencl_backend):
    return opencl_backend


def test_replay_recomputes_on_new_inputs(be):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((4, 8)).astype(np.float32)
    w = be.to_device(rng.standard_normal((8, 3)).astype(np.float32))
    with be.record({"x": x0}) as rec:
        y = be.relu(be.add(be.matmul(be.to_device(x0), w), 1.0))
    assert rec.ok and rec.bound == {"x"}
    np.testing.assert_allclose(be.to_numpy(y), np.maximum(x0 @ be.to_numpy(w) + 1, 0), rtol=1e-5, atol=1e-6)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        assert rec.matches({"x": x})
        rec.replay({"x": x})
        np.testing.assert_allclose(be.to_numpy(y), np.maximum(x @ be.to_numpy(w) + 1, 0), rtol=1e-5, atol=1e-6)
    assert not rec.matches({"x": x0[:2]})  # another shape: not this recording
    rec.close()


def test_hooks_run_then_cells_update_before_each_replay(be):
    """(Adam's use, learn/optim.py: its step count moves on, then its bias corrections follow; that the
    replayed updates match torch's is tests/backend/learn/test_train.py's step-by-step test.)"""
    a = be.to_device(np.arange(6, dtype=np.float32))
    state = {"k": 1.0}
    with be.record() as rec:
        rec.on_replay(lambda: state.__setitem__("k", state["k"] + 1.0))
        c = rec.cell(lambda: state["k"] * 2.0)
        y = be.mul(a, 2.0)
    assert isinstance(c, Cell) and c.value == 2.0
    for k in (2.0, 3.0):
        rec.replay()
        assert state["k"] == k and c.value == 2 * k
    np.testing.assert_array_equal(be.to_numpy(y), 2 * np.arange(6, dtype=np.float32))
    rec.close()


def test_pinned_buffers_are_not_reused_until_closed(be):
    with be.record() as rec:
        t = be.add(be.to_device(np.ones(1000, np.float32)), 1.0)
        buf = t.buffer
        y = be.mul(t, 3.0)
        del t  # dropped inside the recording: the buffer stays with it
    be.synchronize()
    others = [be._empty((1000,)) for _ in range(8)]
    assert all(o.buffer is not buf for o in others)
    rec.replay()
    np.testing.assert_array_equal(be.to_numpy(y), np.full(1000, 6.0, np.float32))
    rec.close()
    del others
    assert id(buf) not in be.pool.pinned


def test_read_back_spoils_a_recording(be):
    with be.record() as rec:
        y = be.add(be.to_device(np.ones(4, np.float32)), 1.0)
        be.to_numpy(y)
    assert not rec.ok and "read back" in rec.reason
    rec.close()


def test_commands_from_another_thread_spoil_a_recording(be):
    with be.record() as rec:
        th = threading.Thread(target=lambda: be.to_numpy(be.add(be.to_device(np.ones(4, np.float32)), 1.0)))
        th.start()
        th.join(30)
    assert not rec.ok and "thread" in rec.reason
    rec.close()


def test_signatures_show_scalars_from_the_data(be):
    a = be.to_device(np.ones(8, np.float32))
    sigs = []
    for k in (2.0, 2.0, 3.0):
        with be.record() as rec:
            be.mul(a, k)
        sigs.append(rec.signature())
        rec.close()
    assert sigs[0] == sigs[1] and sigs[0] != sigs[2]


def test_one_recording_at_a_time(be):
    with be.record():
        with pytest.raises(RuntimeError, match="already open"):
            with be.record():
                pass


def test_a_recording_past_its_pinned_bytes_is_spoilt(be, monkeypatch):
    from anydevice.backend.devices.opencl import replay
    monkeypatch.setattr(replay, "MAX_PINNED_BYTES", 1 << 12)
    with be.record() as rec:
        be.add(be.to_device(np.ones(4096, np.float32)), 1.0)
    assert not rec.ok and "MiB" in rec.reason
    rec.close()


def test_a_winograd_conv_records_with_a_guard(be, monkeypatch):
    """The CPU family's Winograd conv checks its inputs' finiteness by a flag read back at the end; while
    recording it keeps the flag as a guard instead (no read-back: the recording stays usable), replays match
    torch on new inputs, and an Inf in a replayed input fails the guard."""
    if not be.is_cpu_device:
        pytest.skip("Winograd is the CPU family's path")
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(type(be), "_conv_path", lambda self, *a: "winograd")
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((2, 32, 20, 24)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32) / 17
    wd = be.to_device(w)
    launched = []
    run = be._run
    monkeypatch.setattr(be, "_run", lambda name, *a, **k: (launched.append(name), run(name, *a, **k))[1])
    with be.record({"x": x0}) as rec:
        y = be.conv2d(be.to_device(x0), wd, None, 1, 1)
    assert rec.ok, rec.reason
    assert ("wino_in" in launched or "wino_fused" in launched) and len(rec.guards) == 1
    for seed in (4, 5):
        x = np.random.default_rng(seed).standard_normal(x0.shape).astype(np.float32)
        rec.replay({"x": x})
        ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
        assert np.abs(be.to_numpy(y) - ref).max() <= 2e-5 * np.abs(ref).max()
        assert rec.guards_pass()
    x[0, 3, 5, 7] = np.inf
    rec.replay({"x": x})
    assert not rec.guards_pass()
    rec.close()


def test_a_sub_buffer_counts_nothing_against_the_pinned_bytes(be):
    """wgrad.py's shifted panels are sub-buffers of one packed buffer (one per tap): pinning them counts the
    parent once, not once more per view (a training step's recording stayed under MAX_PINNED_BYTES only so)."""
    a = be.to_device(np.zeros(1 << 16, np.float32))
    before = be.pool.pinned_bytes
    with be.record() as rec:
        rec._pin(a.buffer)
        after_parent = be.pool.pinned_bytes
        for k in range(4):
            rec._pin(a.buffer.get_sub_region(1024 * k, 4096))
    assert after_parent - before == a.buffer.size
    assert be.pool.pinned_bytes == after_parent
    rec.close()
    assert be.pool.pinned_bytes == before
