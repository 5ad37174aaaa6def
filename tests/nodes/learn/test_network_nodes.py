"""The learning nodes (nodes/learn/network.py): building a network on the canvas, Train Network against
a PyTorch run from the same start, Apply Network (same type out), Save/Load, errors that name the
node and input, progress, the live events and cancel; the core nodes the training workflows use."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import AnyDeviceError
from anydevice.backend.system import cancel
from anydevice.backend.learn.network import Network
from anydevice.backend.learn.train import batch_plan
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.headless import core_nodes as C
from anydevice.nodes.learn import network as NN
from anydevice.nodes.headless import runner
from anydevice.nodes.base.common import NodeError
from anydevice.nodes.base.resident import DeviceTensor
from conftest import TARGETS
from e2e_helpers import conv_train_prompt, finishes

BACKENDS = [t[0] for t in TARGETS if t[0] in ("numpy", "opencl", "cpu", "cuda", "rocm", "torch-cuda")]


def run(cls, **kw):
    return N[cls]().run(**kw)


def net_of(cls, **kw):
    return run(cls, **kw)["result"][0]


def conv(net=None, out=3, k=3, padding="same", mode="zeros", **kw):
    args = dict(out_channels=out, kernel_size=k, stride=1, padding=padding, padding_size=0, padding_mode=mode,
                dilation=1, groups=1, bias=True)
    args.update(kw)
    return run("AnyDeviceConvLayer", network=net, **args)


def act(net, name="relu"):
    return net_of("AnyDeviceActivationLayer", network=net, activation=name, negative_slope=0.01, alpha=1.0,
                  approximate="none", dim=1)


def train(net, x, y, **kw):
    args = dict(network=net, inputs=x, targets=y, loss="mse", optimizer="sgd", learning_rate=0.1, weight_decay=0.0,
                steps=5, epochs=0, batch_size=4, momentum=0.9, train_seed=0)
    args.update(kw)
    return run("AnyDeviceTrainNetwork", **args)


def rand_image(n=8, h=6, w=6, c=3, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).random((n, h, w, c), dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------
def test_layer_nodes_build_the_network_and_say_each_output_shape():
    net = net_of("AnyDeviceNetworkInput", shape="3, 16, 16")
    r = conv(net, 8, 3)
    assert r["ui"]["text"] == ["layer 0: conv 3x3 -> 8", "-> [1, 8, 16, 16]"]
    net = act(r["result"][0])
    r = run("AnyDevicePoolLayer", network=net, kind="max", kernel_size=2, stride=0, padding=0, output_size=1)
    assert r["ui"]["text"][1] == "-> [1, 8, 8, 8]"
    r = run("AnyDeviceNormLayer", network=r["result"][0], kind="group_norm", num_groups=4, eps=1e-5, momentum=0.1,
            affine=True)
    r = run("AnyDeviceUpsampleLayer", network=r["result"][0], scale_factor=2.0, mode="nearest")
    assert r["ui"]["text"][1] == "-> [1, 8, 16, 16]"
    r = run("AnyDeviceDropoutLayer", network=r["result"][0], p=0.25)
    r = run("AnyDeviceFlattenLayer", network=r["result"][0])
    assert r["ui"]["text"][1] == "-> [1, 2048]"
    r = run("AnyDeviceLinearLayer", network=r["result"][0], out_features=10, bias=True)
    net = r["result"][0]
    assert r["ui"]["text"] == ["layer 7: linear -> 10", "-> [1, 10]"]
    assert [layer["type"] for layer in net.layers] == ["conv2d", "activation", "pool", "group_norm", "upsample",
                                                        "dropout", "flatten", "linear"]
    assert net.layers[2] == {"type": "pool", "kind": "max", "kernel_size": 2, "stride": 2, "padding": 0}
    assert net.params is None  # weights come with training (or Apply's seed-0 start)


def test_network_input_from_an_example_and_a_chain_without_one():
    ex = {"samples": torch.zeros(2, 4, 8, 8)}
    r = run("AnyDeviceNetworkInput", shape="1", example=ex)
    assert r["result"][0].in_shape == (1, 4, 8, 8) and r["ui"]["text"] == ["input [1, 4, 8, 8]"]
    r = conv(None, 4)
    assert r["result"][0].in_shape is None and "Network Input" in r["ui"]["text"][1]
    assert N["AnyDeviceNetworkInput"].VALIDATE_INPUTS(shape="3, a") is not True
    assert N["AnyDeviceNetworkInput"].VALIDATE_INPUTS(shape="3, 8, 8") is True


def test_a_layer_that_does_not_take_its_input_is_refused_at_that_node():
    net = conv(net_of("AnyDeviceNetworkInput", shape="3, 8, 8"), 4)["result"][0]
    with pytest.raises(NodeError) as e:
        run("AnyDeviceLinearLayer", network=net, out_features=10, bias=True)
    msg = str(e.value)
    assert msg.startswith("Linear Layer (AnyDevice): input 'network' = 'layer 1 (linear)'") and "flatten" in msg


def test_residual_joins_a_body_chain_and_checks_its_shape():
    body = conv(act(conv(None, 8)["result"][0]), 3)["result"][0]
    trunk = net_of("AnyDeviceNetworkInput", shape="3, 8, 8")
    r = run("AnyDeviceResidual", network=trunk, body=body)
    assert r["result"][0].layers[0]["type"] == "residual" and r["ui"]["text"][1] == "-> [1, 3, 8, 8]"
    with pytest.raises(NodeError, match="Residual .*body"):
        run("AnyDeviceResidual", network=trunk, body=conv(None, 5)["result"][0])


def test_sockets_are_typed_so_a_wrong_wiring_is_refused():
    assert runner.types_match(NN.NETWORK, N["AnyDeviceTrainNetwork"].INPUT_TYPES()["required"]["network"][0])
    assert not runner.types_match("IMAGE", NN.NETWORK)
    assert not runner.types_match(NN.NETWORK, "IMAGE,MASK,LATENT,TENSOR")
    assert runner.types_match(NN.LABELS, N["AnyDeviceTrainNetwork"].INPUT_TYPES()["required"]["targets"][0])
    assert N["AnyDeviceTrainNetwork"].RETURN_TYPES == (NN.NETWORK, "LOSS_MAP", "FLOAT")


def test_seed_widgets_do_not_get_comfyuis_randomising_control():
    """ComfyUI's frontend adds control_after_generate (randomize) to INT widgets named seed/noise_seed."""
    for cls in NN.NETWORK_NODES:
        spec = cls.INPUT_TYPES()
        names = [k for s in ("required", "optional") for k in spec.get(s, {})]
        assert "seed" not in names and "noise_seed" not in names, cls.__name__
        for s in ("required", "optional"):
            for k, v in spec.get(s, {}).items():
                assert len(v) > 1 and v[1].get("tooltip"), (cls.__name__, k)


# ---------------------------------------------------------------------------------------------
# training against PyTorch
# ---------------------------------------------------------------------------------------------
def _torch_run(net: Network, x: np.ndarray, y: np.ndarray, steps, bs, seed, lr, momentum):
    """torch.optim.SGD from the weights Train starts from, on the same batches, in float64."""
    full = (min(bs, x.shape[0]),) + x.shape[1:]
    start = net.initialized(full, seed)
    model = start.to_torch(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    xt, yt = torch.from_numpy(x).double(), torch.from_numpy(y).double()
    losses = []
    for idx in batch_plan(x.shape[0], bs, seed, steps):
        idx = torch.from_numpy(idx)
        opt.zero_grad()
        loss = F.mse_loss(model(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_matches_torch_from_the_same_start(backend):
    img = rand_image(10, 6, 6, 3, seed=1)
    tgt = torch.flip(img, dims=[3]) * 0.5 + 0.1  # a per-pixel colour map: reachable by a 1x1 conv
    net = conv(net_of("AnyDeviceNetworkInput", example=img, shape="3"), 3, 1)["result"][0]
    r = train(net, img, tgt, steps=7, batch_size=4, learning_rate=0.2, momentum=0.9, device={"name": backend})
    trained, loss_map, final = r["result"]
    x = img.permute(0, 3, 1, 2).numpy()
    y = tgt.permute(0, 3, 1, 2).numpy()
    model, losses = _torch_run(net, x, y, 7, 4, 0, 0.2, 0.9)
    assert set(loss_map) == {"loss"} and len(loss_map["loss"]) == 7
    np.testing.assert_allclose(loss_map["loss"], losses, rtol=1e-4)
    assert final == pytest.approx(losses[-1], rel=1e-4)
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(trained.params[k], v.numpy(), rtol=1e-4, atol=1e-6, err_msg=k)
    assert r["ui"]["anydevice"][0]["backend"] == backend and len(r["ui"]["train_curve"][0]["loss"]) == 7
    assert net.params is None  # the input network is unchanged


def test_same_seed_same_weights_and_another_seed_differs():
    img = rand_image(8, 5, 5, 3, seed=2)
    net = conv(net_of("AnyDeviceNetworkInput", shape="3, 5, 5"), 3, 3)["result"][0]
    a = train(net, img, img, steps=3)["result"][0]
    b = train(net, img, img, steps=3)["result"][0]
    c = train(net, img, img, steps=3, train_seed=1)["result"][0]
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["0.weight"], c.params["0.weight"])


def test_train_seeds_that_differ_above_32_bits_train_other_weights():
    """train_seed 0 and 2**32 (the widget goes to 2**64 - 1) gave the same weights."""
    img = rand_image(8, 5, 5, 3, seed=2)
    net = conv(net_of("AnyDeviceNetworkInput", shape="3, 5, 5"), 3, 3)["result"][0]
    a = train(net, img, img, steps=2, train_seed=0)["result"][0]
    b = train(net, img, img, steps=2, train_seed=2**32)["result"][0]
    c = train(net, img, img, steps=2, train_seed=2**32)["result"][0]
    d = train(net, img, img, steps=2, train_seed=NN.SEED_MAX)["result"][0]
    assert not np.array_equal(a.params["0.weight"], b.params["0.weight"])
    assert not np.array_equal(b.params["0.weight"], d.params["0.weight"])
    assert all(np.array_equal(b.params[k], c.params[k]) for k in b.params)


def test_mask_latent_and_tensor_batches_train_and_apply_as_their_own_type():
    m = torch.rand(6, 5, 5, generator=torch.Generator().manual_seed(0))
    net = conv(None, 1, 3)["result"][0]
    tr = train(net, m, m * 0.5, steps=2)["result"][0]
    r = run("AnyDeviceApplyNetwork", network=tr, input=m, batch_size=4)
    out = r["result"][0]
    assert torch.is_tensor(out) and out.shape == (6, 5, 5)
    ref = tr.to_torch()(m.unsqueeze(1))[:, 0]
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-6)
    lat = {"samples": torch.rand(3, 4, 4, 4), "batch_index": [0, 1, 2]}
    tr = train(conv(None, 4, 1)["result"][0], lat, lat, steps=2, batch_size=3)["result"][0]
    out = run("AnyDeviceApplyNetwork", network=tr, input=lat, batch_size=2)["result"][0]
    assert out["batch_index"] == [0, 1, 2] and out["samples"].shape == (3, 4, 4, 4)
    feats = DeviceTensor.from_host(torch.rand(9, 5))
    lin = net_of("AnyDeviceLinearLayer", network=None, out_features=2, bias=True)
    tr = train(lin, feats, DeviceTensor.from_host(torch.rand(9, 2)), steps=3)["result"][0]
    r = run("AnyDeviceApplyNetwork", network=tr, input=feats, batch_size=4)
    out, pred, acc = r["result"]
    assert isinstance(out, DeviceTensor) and out.shape == (9, 2)
    assert pred.dtype == torch.int64 and torch.equal(pred, out["tensor"].argmax(1)) and acc == 0.0


def test_class_labels_train_with_cross_entropy_and_apply_gives_accuracy():
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 3, 30).astype(np.int64))
    x = torch.zeros(30, 4, 4, 3)
    for i, c in enumerate(labels.tolist()):
        x[i, :, :, c] = 1.0  # the class is the lit channel
    net = net_of("AnyDeviceFlattenLayer", network=net_of("AnyDeviceNetworkInput", example=x, shape="1"))
    net = net_of("AnyDeviceLinearLayer", network=net, out_features=3, bias=True)
    r = train(net, x, labels, loss="cross_entropy", optimizer="adam", learning_rate=0.1, steps=40, batch_size=10)
    r = run("AnyDeviceApplyNetwork", network=r["result"][0], input=x, batch_size=8, labels=labels)
    out, pred, acc = r["result"]
    assert torch.equal(pred, labels) and acc == 1.0
    assert r["ui"]["text"][-1] == "accuracy 100.00% (30/30)"


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def test_bad_training_input_is_a_node_error_naming_the_input():
    img = rand_image(8)
    net = conv(None, 3)["result"][0]
    with pytest.raises(NodeError, match=r"Train Network \(AnyDevice\): input 'learning_rate' = 0.0: must be > 0"):
        train(net, img, img, learning_rate=0.0)
    with pytest.raises(NodeError, match=r"input 'targets' = 'a batch of 5': .*batch of 8"):
        train(net, img, img[:5])
    cls = net_of("AnyDeviceLinearLayer", network=net_of("AnyDeviceFlattenLayer", network=None), out_features=10,
                 bias=True)
    bad = torch.tensor([0, 1, 2, 3, 4, 5, 6, 12])
    with pytest.raises(NodeError, match=r"input 'targets' .*class index 12 is out of range.*10 classes"):
        train(cls, img, bad, loss="cross_entropy")
    with pytest.raises(NodeError, match="cross_entropy"):
        train(cls, img, bad, loss="mse")
    lin = net_of("AnyDeviceLinearLayer", network=net_of("AnyDeviceNetworkInput", shape="3, 6, 6"), out_features=2,
                 bias=True) if False else None
    with pytest.raises(NodeError, match=r"network.*layer 0 \(linear\)"):
        train(net_of("AnyDeviceLinearLayer", network=None, out_features=2, bias=True), img, img)
    with pytest.raises(NodeError, match="has no layers"):
        train(Network.empty(), img, img)
    assert lin is None


def test_batch_size_1_trains_and_batch_norm_on_features_says_why_not():
    """Linear Layer after Network Input "3", 8 feature rows, batch_size=1, steps=3 never finished
    (every one-sample batch was skipped)."""
    rng = np.random.default_rng(0)
    x = DeviceTensor.from_host(torch.from_numpy(rng.standard_normal((8, 3)).astype(np.float32)))
    y = DeviceTensor.from_host(torch.from_numpy(rng.standard_normal((8, 2)).astype(np.float32)))
    lin = net_of("AnyDeviceLinearLayer", network=net_of("AnyDeviceNetworkInput", shape="3"), out_features=2,
                 bias=True)
    r = finishes(lambda: train(lin, x, y, batch_size=1, steps=3))
    trained, loss_map, final = r["result"]
    assert len(loss_map["loss"]) == 3 and final == loss_map["loss"][-1] and "after 3 steps" in r["ui"]["text"][0]
    bn = run("AnyDeviceNormLayer", network=lin, kind="batch_norm", num_groups=4, eps=1e-5, momentum=0.1,
             affine=True)["result"][0]
    with pytest.raises(NodeError) as e:
        finishes(lambda: train(bn, x, y, batch_size=1, steps=3))
    msg = str(e.value)
    assert msg.startswith("Train Network (AnyDevice): input 'batch_size' = 1: "), msg
    assert "batch norm needs at least 2 samples per batch" in msg, msg
    assert len(train(bn, x, y, batch_size=2, steps=3)["result"][1]["loss"]) == 3


def test_a_loss_that_turns_nan_stops_with_a_warning_and_the_last_finite_weights():
    img = rand_image(8)
    net = conv(None, 3)["result"][0]
    r = train(net, img, img * 1e3, learning_rate=10.0, steps=50, momentum=0.9)
    warn = r["ui"]["anydevice"][0]["warning"]
    assert "loss became" in warn and "at step" in warn
    trained, loss_map, final = r["result"]
    assert all(np.isfinite(v).all() for v in trained.params.values())
    assert np.isfinite(loss_map["loss"]).all() and len(loss_map["loss"]) < 50 and final == loss_map["loss"][-1]


# ---------------------------------------------------------------------------------------------
# ComfyUI plumbing: progress bar, live events, cancel
# ---------------------------------------------------------------------------------------------
def _fake_comfy_server(monkeypatch):
    """ComfyUI's PromptServer (its send_sync records (event, data, sid) in the first list) and
    comfy.utils.ProgressBar (its updates record (total, n) in the second), faked in sys.modules."""
    sent, ticks = [], []

    class Inst:
        client_id = "c1"

        def send_sync(self, event, data, sid=None):
            sent.append((event, dict(data), sid))

    class Bar:
        def __init__(self, total):
            self.total = total

        def update(self, n):
            ticks.append((self.total, n))

    monkeypatch.setitem(sys.modules, "server", types.SimpleNamespace(PromptServer=types.SimpleNamespace(instance=Inst())))
    monkeypatch.setitem(sys.modules, "comfy.utils", types.SimpleNamespace(ProgressBar=Bar))
    return sent, ticks


def test_progress_events_and_cancel(monkeypatch):
    sent, ticks = _fake_comfy_server(monkeypatch)
    monkeypatch.setattr(cancel, "REPORT_SECONDS", 0.0)  # a report every step (see the paced test below)
    img = rand_image(8)
    net = conv(None, 3)["result"][0]
    train(net, img, img, steps=4, unique_id="17")
    assert sent[0] == ("anydevice.train", {"node": "17", "step": 0, "steps": 0, "loss": None, "start": True}, "c1")
    assert [(d["step"], d["steps"]) for _, d, _ in sent[1:]] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(isinstance(d["loss"], float) for _, d, _ in sent[1:])
    assert ticks == [(4, 1)] * 4

    class Stop(Exception):
        pass

    calls = []

    def checker():
        calls.append(1)
        if len(calls) > 2:
            raise Stop()

    cancel.set_checker(checker)
    try:
        with pytest.raises(Stop):
            train(net, img, img, steps=50)
    finally:
        cancel.set_checker(None)
    assert len(calls) == 3  # checked before every step: the third step never ran


def test_progress_and_events_are_paced_by_wall_time_and_cancel_is_checked_every_step(monkeypatch):
    """A report every step (a progress bar tick, the progress state and a loss event: server
    messages inside ComfyUI) flooded the server's event loop on a long run of short steps, and
    ComfyUI answered Cancel seconds late. Reports now come every cancel.REPORT_SECONDS of wall
    time (a fake monotonic clock here: 0.03 s a step) and at the last step; the interrupt is still
    checked before every step."""
    (events, ticks), checks = _fake_comfy_server(monkeypatch), []
    clock = iter(i * 0.03 for i in range(10**6))
    monkeypatch.setattr(cancel, "_clock", lambda: next(clock))
    assert cancel.REPORT_SECONDS == 0.1
    img = rand_image(8)
    net = conv(None, 3)["result"][0]
    cancel.set_checker(lambda: checks.append(1))
    try:
        r = train(net, img, img, steps=20, unique_id="5")
    finally:
        cancel.set_checker(None)
    assert len(checks) == 20  # before every step
    sent = [d for _, d, _ in events]
    assert [d["step"] for d in sent[1:]] == [1, 5, 9, 13, 17, 20]  # t = 0, 0.12, 0.24, 0.36, 0.48; the last
    assert all(d["steps"] == 20 and isinstance(d["loss"], float) for d in sent[1:])
    assert ticks == [(20, 1), (20, 4), (20, 4), (20, 4), (20, 4), (20, 3)] and sum(n for _, n in ticks) == 20
    assert sent[-1]["loss"] == r["result"][1]["loss"][-1] and len(r["result"][1]["loss"]) == 20


def test_pacer_says_when_the_interval_has_passed(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(cancel, "_clock", lambda: now[0])
    p = cancel.Pacer(0.2)
    assert p.due() and not p.due()
    now[0] += 0.19
    assert not p.due()
    now[0] += 0.02
    assert p.due() and not p.due()
    now[0] += 5.0  # however long a step took: one report
    assert p.due() and not p.due()


# ---------------------------------------------------------------------------------------------
# save / load, Conv2D and Linear with a trained layer
# ---------------------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    img = rand_image(8)
    tr = train(conv(net_of("AnyDeviceNetworkInput", shape="3, 6, 6"), 3)["result"][0], img, img)["result"][0]
    r = run("AnyDeviceSaveNetwork", network=tr, filename="nets/mine")
    path = tmp_path / "models" / "anydevice" / "nets" / "mine.safetensors"
    assert path.is_file() and r["ui"]["text"][0] == "saved mine.safetensors"
    spec = N["AnyDeviceLoadNetwork"].INPUT_TYPES()["required"]["name"][0]
    assert spec == ["nets/mine.safetensors"]
    back = net_of("AnyDeviceLoadNetwork", name="nets/mine.safetensors")
    assert back.layers == tr.layers and all(np.array_equal(back.params[k], tr.params[k]) for k in tr.params)
    a = run("AnyDeviceApplyNetwork", network=back, input=img, batch_size=4)["result"][0]
    b = run("AnyDeviceApplyNetwork", network=tr, input=img, batch_size=4)["result"][0]
    assert torch.equal(a, b)
    for bad in ("../x", "/abs/x", ""):
        with pytest.raises(NodeError, match="input 'filename'"):
            run("AnyDeviceSaveNetwork", network=tr, filename=bad)
    with pytest.raises(NodeError, match="has no weights yet"):
        run("AnyDeviceSaveNetwork", network=conv(None)["result"][0], filename="x")
    with pytest.raises(NodeError, match="input 'name'"):
        run("AnyDeviceLoadNetwork", name="missing.safetensors")


def test_save_never_replaces_a_file_unless_overwrite_is_on(tmp_path, monkeypatch):
    """Save Network replaced an existing file silently. It now counts on as ComfyUI's savers do
    (name_00001_.safetensors); overwrite=True replaces the file of that name."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "models" / "anydevice"
    img = rand_image(8)
    net = conv(net_of("AnyDeviceNetworkInput", shape="3, 6, 6"), 3)["result"][0]
    a = train(net, img, img, steps=2)["result"][0]
    b = train(net, img, img, steps=2, train_seed=1)["result"][0]
    run("AnyDeviceSaveNetwork", network=a, filename="keep")
    first = (folder / "keep.safetensors").read_bytes()
    r = run("AnyDeviceSaveNetwork", network=b, filename="keep")
    assert r["ui"]["text"][:2] == ["saved keep_00001_.safetensors", "keep.safetensors exists: kept (overwrite is off)"]
    assert (folder / "keep.safetensors").read_bytes() == first
    assert r["ui"]["anydevice"][0]["path"] == str(folder / "keep_00001_.safetensors")
    run("AnyDeviceSaveNetwork", network=b, filename="keep.safetensors", overwrite=False)
    assert (folder / "keep_00002_.safetensors").is_file() and (folder / "keep.safetensors").read_bytes() == first
    (folder / "keep_00009_.safetensors").write_bytes(first)  # counting goes on from the highest, as ComfyUI's
    assert run("AnyDeviceSaveNetwork", network=b, filename="keep")["ui"]["text"][0] == "saved keep_00010_.safetensors"
    back = net_of("AnyDeviceLoadNetwork", name="keep_00001_.safetensors")
    assert all(np.array_equal(back.params[k], b.params[k]) for k in b.params)
    assert all(np.array_equal(net_of("AnyDeviceLoadNetwork", name="keep.safetensors").params[k], a.params[k])
               for k in a.params)
    r = run("AnyDeviceSaveNetwork", network=b, filename="keep", overwrite=True)
    assert r["ui"]["text"][:2] == ["saved keep.safetensors", "replaced the file of that name (overwrite is on)"]
    back = net_of("AnyDeviceLoadNetwork", name="keep.safetensors")
    assert all(np.array_equal(back.params[k], b.params[k]) for k in b.params)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.safetensors", "keep_00001_.safetensors",
                                                        "keep_00002_.safetensors", "keep_00009_.safetensors",
                                                        "keep_00010_.safetensors"]
    # a name whose folder part is an existing file: a NodeError naming node, input and value
    for over in (False, True):
        with pytest.raises(NodeError) as e:
            run("AnyDeviceSaveNetwork", network=a, filename="keep.safetensors/x", overwrite=over)
        msg = str(e.value)
        assert msg.startswith("Save Network (AnyDevice): input 'filename' = 'keep.safetensors/x': "), msg
        assert "'keep.safetensors' is a file" in msg and "not a folder" in msg, msg
    (folder / "dir.safetensors").mkdir()
    with pytest.raises(NodeError, match="input 'filename' = 'dir': is a folder"):
        run("AnyDeviceSaveNetwork", network=a, filename="dir", overwrite=True)
    assert not list(folder.glob("*.tmp*"))


def test_save_network_overwrite_widget_is_optional_so_saved_prompts_still_run(tmp_path, monkeypatch):
    spec = N["AnyDeviceSaveNetwork"].INPUT_TYPES()
    assert "overwrite" not in spec["required"]
    kind, opts = spec["optional"]["overwrite"]
    assert kind == "BOOLEAN" and opts["default"] is False and "name_00001_.safetensors" in opts["tooltip"]
    assert "unless overwrite is on" in spec["required"]["filename"][1]["tooltip"]
    monkeypatch.chdir(tmp_path)
    prompt = {  # an API prompt saved before the widget existed
        **conv_train_prompt(size=6, images=4, lr=0.1, steps=2, batch_size=2),
        "5": {"class_type": "AnyDeviceSaveNetwork", "inputs": {"filename": "old_prompt", "network": ["4", 0]}},
    }
    for _ in range(2):
        runner.run_prompt(prompt, output_dir=tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "models" / "anydevice").iterdir()) == [
        "old_prompt.safetensors", "old_prompt_00001_.safetensors"]


def test_folder_paths_registration(monkeypatch, tmp_path):
    fp = types.SimpleNamespace(folder_names_and_paths={}, models_dir=str(tmp_path))
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    NN.register_model_folder()
    assert fp.folder_names_and_paths["anydevice"] == ([str(tmp_path / "anydevice")], {".safetensors"})


def test_conv2d_and_linear_nodes_take_a_trained_layer():
    img = rand_image(4, 7, 7)
    net = conv(net_of("AnyDeviceNetworkInput", shape="3, 7, 7"), 3, 5, mode="reflect")["result"][0]
    tr = train(net, img, img, steps=2)["result"][0]
    a = run("AnyDeviceApplyNetwork", network=tr, input=img, batch_size=4)["result"][0]
    r = run("AnyDeviceLayerWeights", network=tr, layer=-1, shape="as stored")
    w = r["result"][0]
    assert r["ui"]["text"] == ["layer 0: conv 5x5 -> 3 reflect", "weight [3, 3, 5, 5], bias [3]"]
    r = run("AnyDeviceConv2D", input=img, kernel_source="weights", weights=w, channel_mode="grouped", out_channels=3,
            groups=1, padding="same", padding_mode="reflect")
    torch.testing.assert_close(r["result"][0], a, rtol=1e-5, atol=1e-6)
    assert r["ui"]["kernel"][0]["shape"] == [3, 3, 5, 5]
    px = train(conv(None, 3, 1)["result"][0], img, img, steps=2)["result"][0]
    a = run("AnyDeviceApplyNetwork", network=px, input=img, batch_size=4)["result"][0]
    w = net_of("AnyDeviceLayerWeights", network=px, layer=0, shape="matrix")
    assert tuple(w["weight"].shape) == (3, 3)
    r = run("AnyDeviceLinear", input=img, source="weights", weights=w)
    torch.testing.assert_close(r["result"][0], a, rtol=1e-5, atol=1e-6)
    with pytest.raises(NodeError, match=r"Layer Weights .*input 'shape' = 'matrix': only a 1x1 conv"):
        run("AnyDeviceLayerWeights", network=tr, layer=0, shape="matrix")
    with pytest.raises(NodeError, match=r"input 'layer' = 1: is layer 1 \(activation\)"):
        run("AnyDeviceLayerWeights", network=act(tr), layer=1, shape="as stored")
    with pytest.raises(NodeError, match=r"input 'layer' = 5: the network has 1 layers"):
        run("AnyDeviceLayerWeights", network=tr, layer=5, shape="as stored")
    with pytest.raises(NodeError, match="no weights yet"):
        run("AnyDeviceLayerWeights", network=net, layer=0, shape="as stored")


def test_image_patches_are_seeded_crops_with_noise():
    img = rand_image(2, 10, 12)
    a = run("AnyDeviceImagePatches", image=img, patch_size=4, count=5, noise_std=0.1, clamp=False, patch_seed=3)
    b = run("AnyDeviceImagePatches", image=img, patch_size=4, count=5, noise_std=0.1, clamp=False, patch_seed=3)
    (p, n), (p2, n2) = a["result"], b["result"]
    assert p.shape == (5, 4, 4, 3) and torch.equal(p, p2) and torch.equal(n, n2)
    src = img.numpy()
    for patch in p.numpy():  # every patch is a crop of the image
        assert any(np.array_equal(patch, src[i, y:y + 4, x:x + 4]) for i in range(2) for y in range(7)
                   for x in range(9))
    assert 0.05 < float((n - p).std()) < 0.15
    with pytest.raises(NodeError, match="patch_size"):
        run("AnyDeviceImagePatches", image=img, patch_size=11, count=1, noise_std=0.0, clamp=True, patch_seed=0)


# ---------------------------------------------------------------------------------------------
# the core nodes the headless runner learned for the training workflows
# ---------------------------------------------------------------------------------------------
def _gauss(k, sigma):
    ax = torch.linspace(-1, 1, k, dtype=torch.float64)
    d2 = ax[:, None] ** 2 + ax[None, :] ** 2
    g = torch.exp(-d2 / (2 * sigma * sigma))
    return g / g.sum()


def test_image_blur_is_a_reflect_padded_gaussian():
    img = rand_image(2, 9, 11, seed=3)
    out = C.ImageBlur().run(None, img, blur_radius=2, sigma=1.5)[0]
    x = img.double().permute(0, 3, 1, 2)
    ref = F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), _gauss(5, 1.5).expand(3, 1, 5, 5), groups=3)
    torch.testing.assert_close(out.double(), ref.permute(0, 2, 3, 1), rtol=0, atol=1e-6)


def test_image_sharpen_crop_and_scale():
    img = rand_image(1, 9, 11, seed=4)
    out = C.ImageSharpen().run(None, img, sharpen_radius=1, sigma=1.0, alpha=0.5)[0]
    k = _gauss(3, 1.0) * -5.0
    k[1, 1] = k[1, 1] - k.sum() + 1.0
    x = img.double().permute(0, 3, 1, 2)
    ref = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), k.expand(3, 1, 3, 3), groups=3).clamp(0, 1)
    torch.testing.assert_close(out.double(), ref.permute(0, 2, 3, 1), rtol=0, atol=1e-6)
    crop = C.ImageCrop().run(None, img, width=4, height=3, x=9, y=2)[0]
    assert torch.equal(crop, img[:, 2:5, 9:11])
    sc = C.ImageScale().run(None, img, upscale_method="bilinear", width=22, height=0, crop="disabled")[0]
    assert sc.shape == (1, 18, 22, 3)
    torch.testing.assert_close(sc, F.interpolate(img.permute(0, 3, 1, 2), size=(18, 22), mode="bilinear")
                               .permute(0, 2, 3, 1))
    assert {"ImageBlur", "ImageSharpen", "ImageScale", "ImageCrop"} <= set(C.CORE_NODES)


_TWO_PROCESSES = r"""
import hashlib, importlib.util, sys
root = sys.argv[1]
spec = importlib.util.spec_from_file_location("anydevice", root + "/__init__.py", submodule_search_locations=[root])
mod = importlib.util.module_from_spec(spec); sys.modules["anydevice"] = mod; spec.loader.exec_module(mod)
import numpy as np, torch
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
img = torch.from_numpy(np.random.default_rng(0).random((8, 6, 6, 3), dtype=np.float32))
net = N["AnyDeviceNetworkInput"]().run(shape="3, 6, 6")["result"][0]
net = N["AnyDeviceConvLayer"]().run(network=net, out_channels=4, kernel_size=3, stride=1, padding="same",
    padding_size=0, padding_mode="zeros", dilation=1, groups=1, bias=True)["result"][0]
net = N["AnyDeviceActivationLayer"]().run(network=net, activation="gelu", negative_slope=0.01, alpha=1.0,
    approximate="none", dim=1)["result"][0]
net = N["AnyDeviceConvLayer"]().run(network=net, out_channels=3, kernel_size=3, stride=1, padding="same",
    padding_size=0, padding_mode="zeros", dilation=1, groups=1, bias=True)["result"][0]
r = N["AnyDeviceTrainNetwork"]().run(network=net, inputs=img, targets=img.flip(1), loss="mse", optimizer="adam",
    learning_rate=0.01, weight_decay=0.0, steps=6, epochs=0, batch_size=3, momentum=0.9, train_seed=5,
    device={"name": sys.argv[2]})
h = hashlib.sha256()
for k, v in sorted(r["result"][0].params.items()):
    h.update(k.encode()); h.update(np.ascontiguousarray(v, np.float32).tobytes())
print(h.hexdigest())
"""


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("numpy", "opencl")])
def test_same_seed_two_processes_same_weights_bit_for_bit(backend, tmp_path):
    from repo_paths import ROOT
    from two_processes import run_twice
    outs = run_twice(tmp_path, "two.py", _TWO_PROCESSES, str(ROOT), backend)
    for o in outs:
        assert o.returncode == 0, o.stderr[-2000:]
    hashes = [o.stdout.strip().splitlines()[-1] for o in outs]
    assert len(hashes[0]) == 64 and hashes[0] == hashes[1]


def test_a_step_over_the_memory_limit_is_refused_before_any_work(monkeypatch):
    """Refused by the checks before training (the layer whose output alone is over the limit, or the step)."""
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    net = conv(None, 32, 3)["result"][0]
    with pytest.raises(NodeError, match=r"Train Network \(AnyDevice\): input 'network' = 'layer 0 \(conv2d\)'.*"
                                        r"over the limit ANYDEVICE_MAX_TENSOR_MB=1"):
        train(net, torch.zeros(64, 64, 64, 3), torch.zeros(64, 64, 64, 32), batch_size=64, steps=1)
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "3")
    net = conv(None, 8, 3)["result"][0]
    with pytest.raises(NodeError, match=r"input 'batch_size' = 64: a training step would hold about .* over the limit"):
        train(net, torch.zeros(64, 32, 32, 3), torch.zeros(64, 32, 32, 8), batch_size=64, steps=1)
