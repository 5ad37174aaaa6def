"""Training steps replayed from recorded launches (backend/learn/replay.py) on OpenCL: the same losses,
weights, optimizer state and running statistics as the steps run op by op, on changing batches; what is
never replayed."""
import math

import numpy as np
import pytest

from anydevice.backend.learn import optim
from anydevice.backend.learn.autograd import apply
from anydevice.backend.learn.network import Network
from anydevice.backend.learn.replay import TrainStep


@pytest.fixture(scope="module")
def cl(opencl_backend):
    return opencl_backend


def _digits(p_drop=0.0):
    net = (Network.empty()
           .add("conv2d", out_channels=8, kernel_size=3, padding=1).add("batch_norm").add("activation", name="relu")
           .add("conv2d", out_channels=16, kernel_size=3, stride=2, padding=1).add("batch_norm")
           .add("activation", name="relu").add("flatten"))
    if p_drop:
        net = net.add("dropout", p=p_drop)
    return net.add("linear", out_features=10)


def _steps(be, net, batches, replay: bool, opt="adam", loss="cross_entropy"):
    pvars = net.param_vars(be, requires_grad=True)
    o = optim.make(opt, list(pvars.values()), lr=1e-2, **({"momentum": 0.9} if opt == "sgd" else {}))
    ts = TrainStep(be, net, pvars, o, {k: be.to_device(v) for k, v in net.buffers.items()},
                   lambda y, t: apply(loss, y, t, be=be))
    if not replay:
        ts.off = "op by op (test)"
    losses = [ts(x, t, seed=i) for i, (x, t) in enumerate(batches)]
    state = {k: be.to_numpy(v.data) for k, v in pvars.items()}
    state.update({k: be.to_numpy(v) for k, v in ts.buffers.items()})
    moments = [be.to_numpy(st[k]) for st in o.state.values() for k in o.BUFFERS if st.get(k) is not None]
    replayed = ts.replaying
    ts.close()
    return losses, state, moments, replayed


def _batches(n, bs=16, last=None, seed=0):
    rng = np.random.default_rng(seed)
    out = [(rng.standard_normal((bs, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, bs)) for _ in range(n)]
    if last:
        out.append((rng.standard_normal((last, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, last)))
    return out


@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_replayed_steps_match_the_steps_run_op_by_op(cl, opt):
    net = _digits().initialized((16, 1, 8, 8), seed=0)
    batches = _batches(9, last=5)
    batches.insert(6, batches.pop())  # a short batch between replays runs op by op (into the replayed state)
    ref = _steps(cl, net, batches, False, opt)
    got = _steps(cl, net, batches, True, opt)
    assert got[3] is True and ref[3] is False
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
    for k in ref[1]:
        np.testing.assert_allclose(got[1][k], ref[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(got[2], ref[2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_float_targets_replay_too(cl):
    net = (Network.empty().add("conv2d", out_channels=4, kernel_size=3, padding=1).add("activation", name="relu")
           .add("conv2d", out_channels=1, kernel_size=3, padding=1)).initialized((4, 1, 8, 8), seed=1)
    _mse_steps_replay(cl, net, (4, 1, 8, 8), 1)


def _mse_steps_replay(cl, net, shape, seed, rtol=1e-6, wtol=1e-5):
    """Six MSE steps of ``net`` on random batches of ``shape``: replayed, with the op-by-op run's losses and weights."""
    rng = np.random.default_rng(seed)
    batches = [(rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32))
               for _ in range(6)]
    ref = _steps(cl, net, batches, False, loss="mse_loss")
    got = _steps(cl, net, batches, True, loss="mse_loss")
    assert got[3], "the steps ran op by op"
    np.testing.assert_allclose(got[0], ref[0], rtol=rtol)
    for k in ref[1]:
        np.testing.assert_allclose(got[1][k], ref[1][k], rtol=wtol, atol=1e-6, err_msg=k)


def test_winograd_and_shifted_weight_gradients_replay(cl, monkeypatch):
    """32-channel 3x3 convs on the CPU family's Winograd path (what AVX2 takes: a finiteness flag, a guard while
    recording) and their shifted weight gradients (sub-buffer panels): the step is recorded and replayed, with
    the losses and weights of the steps run op by op (on AVX2 such a step once ran op by op: the flag's
    read-back spoilt the recording, then the sub-buffers' pinned bytes did)."""
    if not cl.is_cpu_device:
        pytest.skip("Winograd is the CPU family's path")
    monkeypatch.setattr(type(cl), "_conv_path", lambda self, xs, cout, kh, *a: "winograd" if kh == 3 and xs[1] >= 8
                        else "direct")
    net = (Network.empty().add("conv2d", out_channels=32, kernel_size=3, padding=1).add("activation", name="relu")
           .add("conv2d", out_channels=32, kernel_size=3, padding=1).add("activation", name="relu")
           .add("conv2d", out_channels=2, kernel_size=3, padding=1)).initialized((4, 2, 24, 24), seed=2)
    _mse_steps_replay(cl, net, (4, 2, 24, 24), 2, rtol=1e-5, wtol=1e-4)


def test_what_is_never_replayed(cl):
    from anydevice.backend import get_backend
    net = _digits(0.25).initialized((16, 1, 8, 8), seed=0)
    pv = net.param_vars(cl, requires_grad=True)
    ts = TrainStep(cl, net, pv, optim.make("adam", list(pv.values()), lr=1e-3), {}, lambda y, t: y)
    assert ts.off == "the network has dropout"
    npb = get_backend("numpy")
    pv = _digits().initialized((16, 1, 8, 8), seed=0).param_vars(npb, requires_grad=True)
    assert "no launch replay" in TrainStep(npb, net, pv, optim.make("adam", list(pv.values()), lr=1e-3), {},
                                           lambda y, t: y).off
    # class targets holding ignore_index: those steps run op by op (the mean's count would change)
    net = _digits().initialized((16, 1, 8, 8), seed=0)
    batches = _batches(5)
    batches[4][1][3] = -100
    ref = _steps(cl, net, batches, False)
    got = _steps(cl, net, batches, True)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)


def test_a_non_finite_loss_in_a_replay_changes_nothing(cl):
    net = _digits().initialized((16, 1, 8, 8), seed=0)
    pvars = net.param_vars(cl, requires_grad=True)
    o = optim.make("adam", list(pvars.values()), lr=1e-2)
    ts = TrainStep(cl, net, pvars, o, {k: cl.to_device(v) for k, v in net.buffers.items()},
                   lambda y, t: apply("cross_entropy", y, t, be=cl))
    for x, t in _batches(4):
        assert math.isfinite(ts(x, t))
    assert ts.replaying
    before = {k: cl.to_numpy(v.data) for k, v in pvars.items()}
    x, t = _batches(1, seed=5)[0]
    x[0, 0, 0, 0] = np.nan
    assert math.isnan(ts(x, t))
    for k, v in pvars.items():
        np.testing.assert_array_equal(cl.to_numpy(v.data), before[k])
    ts.close()


def test_equal_class_targets_postpone_the_comparison(cl):
    """Steps 2 and 3 with the same class targets (other inputs) prove nothing about uploads made from the
    targets: the later recording is kept and compared with step 4's."""
    net = _digits().initialized((16, 1, 8, 8), seed=0)
    batches = _batches(6)
    batches[2] = (batches[2][0], batches[1][1].copy())  # step 3's targets are step 2's
    pvars = net.param_vars(cl, requires_grad=True)
    o = optim.make("adam", list(pvars.values()), lr=1e-2)
    ts = TrainStep(cl, net, pvars, o, {k: cl.to_device(v) for k, v in net.buffers.items()},
                   lambda y, t: apply("cross_entropy", y, t, be=cl))
    seen = []
    for x, t in batches:
        ts(x, t.astype(np.int32))  # (int32 targets: uploaded as int64, bound all the same)
        seen.append(ts.replaying)
    assert seen == [False, False, False, True, True, True]  # (without: replaying from step 3 on)
    ts.close()


@pytest.mark.parametrize("lr", [1e5, 1e8])
def test_train_stopped_by_a_nan_returns_what_the_op_by_op_run_returns(cl, lr, monkeypatch):
    """train() diverging while its steps are replayed: the same stop, weights and batch-norm statistics
    (those the last finite loss was computed with) as with ANYDEVICE_GRAPHS=0."""
    from anydevice.backend.learn.train import train
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    t = rng.integers(0, 10, 64)
    net = (Network.empty().add("conv2d", out_channels=8, kernel_size=3, padding=1).add("batch_norm")
           .add("activation", name="relu").add("flatten").add("linear", out_features=10)).initialized((16, 1, 8, 8), seed=0)
    out = {}
    for g in ("0", "1"):
        monkeypatch.setenv("ANYDEVICE_GRAPHS", g)
        out[g] = train(net, x, t, be=cl, loss="cross_entropy", optimizer="sgd", lr=lr, batch_size=16, steps=40, seed=0)
    a, b = out["0"], out["1"]
    assert a.stopped is not None and a.stopped == b.stopped and a.losses == b.losses
    for k in list(a.network.params) + list(a.network.buffers):
        got = b.network.params.get(k, b.network.buffers.get(k))
        ref = a.network.params.get(k, a.network.buffers.get(k))
        np.testing.assert_array_equal(got, ref, err_msg=k)
