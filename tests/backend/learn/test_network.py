"""backend/learn/network.py (the Network value) and backend/learn/netio.py (safetensors save/load).

The forward pass of every layer type is compared with ``net.to_torch()`` on the same weights in
float64 (normwise relative error <= 1e-5) on every backend, in evaluation and in training mode
(batch statistics, updated running statistics)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from anydevice.backend import AnyDeviceError
from anydevice.backend.learn.network import Network, layer_seed
from anydevice.backend.learn import netio

from grad_check import normwise

RTOL = 1e-5


def _rich() -> Network:
    """Every layer type, residual blocks (one nested) included."""
    body = (Network.empty().add("conv2d", out_channels=8, kernel_size=3, padding=1, padding_mode="reflect")
            .add("group_norm", num_groups=2).add("activation", name="gelu"))
    inner = Network.empty().add("activation", name="silu").add("conv2d", out_channels=8, kernel_size=1, bias=False)
    body = body.residual(inner)
    return (Network.empty()
            .add("conv2d", out_channels=8, kernel_size=3, padding=1)
            .add("batch_norm")
            .add("activation", name="leaky_relu", negative_slope=0.2)
            .residual(body)
            .add("pool", kind="max", kernel_size=2)
            .add("layer_norm")
            .add("dropout", p=0.25)
            .add("upsample", scale_factor=2, mode="bilinear")
            .add("instance_norm", affine=True)
            .add("conv2d", out_channels=6, kernel_size=3, stride=2, padding=1, groups=2)
            .add("activation", name="elu")
            .add("pool", kind="avg", kernel_size=2)
            .add("pool", kind="adaptive_avg", output_size=2)
            .add("flatten")
            .add("linear", out_features=12)
            .add("batch_norm")
            .add("activation", name="tanh")
            .add("linear", out_features=5)
            .add("activation", name="softmax"))


IN = (4, 3, 8, 8)


def _perturbed(net: Network, seed=5) -> Network:
    """Weights moved by noise (norm weights and biases away from 1 and 0) and running statistics
    away from 0 / 1, so that they are tested too."""
    rng = np.random.default_rng(seed)
    params = {k: (v + rng.uniform(-0.3, 0.3, v.shape)).astype(np.float32) for k, v in net.params.items()}
    buffers = {k: (rng.uniform(0.5, 1.5, v.shape) if k.endswith("var") else rng.uniform(-0.3, 0.3, v.shape))
               .astype(np.float32) for k, v in net.buffers.items()}
    return net.with_params(params, buffers)


@pytest.fixture(scope="module")
def rich():
    return _perturbed(_rich().initialized(IN, seed=3))


def _x(shape=IN, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- forward against torch ------------------------------------------------------------------
def test_forward_matches_torch_eval(backend_target, rich):
    x = _x()
    y = rich.forward(backend_target, x)
    assert y.shape == (4, 5)
    ref = rich.to_torch(torch.float64).eval()(torch.from_numpy(x).double()).detach().numpy()
    assert normwise(y.numpy(), ref) <= RTOL


def test_forward_matches_torch_training(backend_target):
    """Training mode: batch norm on the batch's statistics, and the running statistics torch's
    modules end with (dropout left out: its masks are the pack's own)."""
    net = (Network.empty().add("conv2d", out_channels=6, kernel_size=3, padding=1).add("batch_norm", momentum=0.3)
           .add("activation", name="relu").add("flatten").add("linear", out_features=4).add("batch_norm")
           .add("activation", name="sigmoid"))
    net = _perturbed(net.initialized((5, 2, 4, 4), seed=0))
    x = _x((5, 2, 4, 4))
    y, bufs = net.forward(backend_target, x, training=True, return_buffers=True)
    tnet = net.to_torch(torch.float64).train()
    ref = tnet(torch.from_numpy(x).double()).detach().numpy()
    assert normwise(y.numpy(), ref) <= RTOL
    state = tnet.state_dict()
    assert set(bufs) == set(net.buffers)
    for k, v in bufs.items():
        assert normwise(backend_target.to_numpy(v), state[k].numpy()) <= RTOL, k
    for k, v in net.buffers.items():  # the network itself is unchanged
        assert not np.array_equal(v, state[k].numpy()), k


def test_conv_transpose2d_layer(backend_target):
    """An encoder-decoder: strided conv down, transposed conv (output_padding, groups) back up."""
    net = (Network.empty().add("conv2d", out_channels=4, kernel_size=3, stride=2, padding=1)
           .add("activation", name="relu")
           .add("conv_transpose2d", out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1, groups=2))
    assert net.shapes((2, 3, 9, 9)) == [(2, 4, 5, 5), (2, 4, 5, 5), (2, 6, 10, 10)]
    net = net.initialized((2, 3, 9, 9), seed=1)
    assert net.params["2.weight"].shape == (4, 3, 3, 3) and net.params["2.bias"].shape == (6,)
    bound = 1 / np.sqrt(3 * 9)  # torch: fan_in = weight.size(1) * kH * kW
    assert np.abs(net.params["2.weight"]).max() <= bound and np.abs(net.params["2.bias"]).max() <= bound
    x = _x((2, 3, 9, 9))
    ref = net.to_torch(torch.float64)(torch.from_numpy(x).double()).detach().numpy()
    assert normwise(net.forward(backend_target, x).numpy(), ref) <= RTOL


def test_to_torch_keys_and_values(rich):
    t = rich.to_torch()
    state = {k: v for k, v in t.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert list(k for k in state if k in rich.params) == list(rich.params)  # torch's order
    assert set(state) == set(rich.params) | set(rich.buffers)
    assert "3.body.0.weight" in rich.params and "3.body.3.body.1.weight" in rich.params
    for k, v in state.items():
        ours = rich.params.get(k, rich.buffers.get(k))
        np.testing.assert_array_equal(v.numpy(), ours)


def test_param_vars_record_gradients(backend_target):
    from anydevice.backend.learn import autograd as ag
    net = (Network.empty().add("linear", out_features=3).add("activation", name="relu")
           .add("linear", out_features=1)).initialized((2, 4), seed=1)
    be = backend_target
    pv = net.param_vars(be)
    assert list(pv) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = _x((6, 4))
    y = net.forward(be, x, params=pv)
    assert y.requires_grad
    loss = ag.apply("sum", y)
    grads = ag.grad(loss, list(pv.values()))
    tn = net.to_torch(torch.float64)
    tn(torch.from_numpy(x).double()).sum().backward()
    for (k, _), g in zip(pv.items(), grads):
        assert normwise(be.to_numpy(g), dict(tn.named_parameters())[k].grad.numpy()) <= RTOL, k
    # constants: nothing recorded
    assert not net.forward(be, x).requires_grad
    # a network holding Vars (of this backend or another) runs on any backend
    from anydevice.backend import get_backend
    other = get_backend("numpy")
    held = net.with_params(net.param_vars(other, requires_grad=False))
    assert normwise(held.forward(be, x).numpy(), net.forward(be, x).numpy()) == 0.0
    assert held.param_vars(be)["0.weight"].be is be


# ---- shapes and errors ----------------------------------------------------------------------
def test_shapes(rich):
    shapes = rich.shapes(IN)
    assert len(shapes) == len(rich.layers)
    assert shapes[0] == (4, 8, 8, 8) and shapes[4] == (4, 8, 4, 4) and shapes[7] == (4, 8, 8, 8)
    assert shapes[9] == (4, 6, 4, 4) and shapes[-1] == (4, 5) and rich.out_shape((7, 3, 8, 8)) == (7, 5)
    assert Network.empty().out_shape((2, 3)) == (2, 3)


@pytest.mark.parametrize("net, in_shape, arg, fragment", [
    (Network.empty().add("conv2d", out_channels=4, kernel_size=3).add("flatten").add("conv2d", out_channels=2,
                                                                                      kernel_size=1),
     (1, 3, 8, 8), "layer 2 (conv2d)", "4-D"),
    (Network.empty().add("linear", out_features=3), (2, 3, 4, 4), "layer 0 (linear)", "flatten"),
    (Network.empty().add("conv2d", out_channels=4, kernel_size=9), (1, 3, 8, 8), "layer 0 (conv2d)", "larger"),
    (Network.empty().add("activation", name="relu").residual(Network.empty().add("conv2d", out_channels=5,
                                                                                  kernel_size=1)),
     (1, 3, 8, 8), "layer 1 (residual)", "input's shape"),
    (Network.empty().residual(Network.empty().add("activation", name="relu").add("pool", kind="max",
                                                                                  kernel_size=16)),
     (1, 3, 8, 8), "layer 0.body.1 (pool)", "too small"),
    (Network.empty().add("group_norm", num_groups=4), (1, 6, 8, 8), "layer 0 (group_norm)", "num_groups"),
    (Network.empty().add("conv2d", out_channels=4, kernel_size=1, groups=2), (1, 3, 8, 8), "layer 0 (conv2d)",
     "groups"),
])
def test_shapes_name_the_layer(net, in_shape, arg, fragment):
    with pytest.raises(AnyDeviceError) as ei:
        net.shapes(in_shape)
    assert ei.value.op == "network" and ei.value.arg == arg, str(ei.value)
    assert fragment in str(ei.value)


def test_params_that_do_not_fit_the_input(backend_target):
    net = Network.empty().add("conv2d", out_channels=4, kernel_size=3).initialized((1, 3, 8, 8), seed=0)
    with pytest.raises(AnyDeviceError) as ei:
        net.shapes((1, 4, 8, 8))
    assert ei.value.arg == "layer 0 (conv2d)" and "(4, 3, 3, 3)" in str(ei.value)
    with pytest.raises(AnyDeviceError) as ei:
        net.forward(backend_target, _x((1, 4, 8, 8)))
    assert ei.value.arg == "layer 0 (conv2d)"


@pytest.mark.parametrize("type, config, arg", [
    ("conv2d", {"out_channels": 0, "kernel_size": 3}, "out_channels"),
    ("conv2d", {"out_channels": 4}, "kernel_size"),
    ("conv2d", {"out_channels": 4, "kernel_size": 3, "padding_mode": "mirror"}, "padding_mode"),
    ("conv2d", {"out_channels": 4, "kernel_size": 3, "stride": 2, "padding": "same"}, "padding"),
    ("conv2d", {"out_channels": 4, "kernel_size": 3, "kernel": 3}, "kernel"),
    ("conv2d", {"out_channels": 6, "kernel_size": 3, "groups": 4}, "groups"),
    ("linear", {"out_features": 2.5}, "out_features"),
    ("activation", {"name": "swish"}, "name"),
    ("activation", {"name": "relu", "negative_slope": 0.1}, "negative_slope"),
    ("activation", {"name": "gelu", "approximate": "fast"}, "approximate"),
    ("batch_norm", {"momentum": 2.0}, "momentum"),
    ("group_norm", {}, "num_groups"),
    ("pool", {"kind": "max"}, "kernel_size"),
    ("pool", {"kind": "median", "kernel_size": 2}, "kind"),
    ("pool", {"kind": "adaptive_avg", "kernel_size": 2, "output_size": 1}, "kernel_size"),
    ("pool", {"kind": "max", "kernel_size": 2, "padding": 2}, "padding"),
    ("upsample", {"scale_factor": 0}, "scale_factor"),
    ("upsample", {"scale_factor": 2, "mode": "nearest", "align_corners": True}, "align_corners"),
    ("dropout", {"p": 1.5}, "p"),
    ("residual", {"body": []}, "body"),
    ("transformer", {}, "type"),
])
def test_add_checks_its_config(type, config, arg):
    with pytest.raises(AnyDeviceError) as ei:
        Network.empty().add(type, **config)
    assert ei.value.arg == arg, str(ei.value)


def test_immutable_and_json(rich):
    a = Network.empty().add("linear", out_features=3)
    b = a.add("activation", name="relu")
    assert len(a.layers) == 1 and len(b.layers) == 2
    c = b.initialized((2, 5), seed=0)
    assert b.params is None and c.params is not None
    with pytest.raises(ValueError):
        c.params["0.weight"][0, 0] = 1.0  # read-only arrays
    s = rich.spec_json()
    back = Network.from_spec_json(s)
    assert back.layers == rich.layers and back.in_shape == rich.in_shape and back.params is None
    assert json.loads(s)["layers"][3]["type"] == "residual"
    with pytest.raises(AnyDeviceError):
        Network.from_spec_json('{"layers": [{"type": "conv2d"}]}')
    with pytest.raises(AnyDeviceError):
        Network.from_spec_json("not json")


def test_initialized_is_seeded_and_keeps_params():
    net = Network.empty().add("conv2d", out_channels=4, kernel_size=3).add("flatten")
    a = net.initialized((1, 2, 5, 5), seed=7)
    b = net.initialized((1, 2, 5, 5), seed=7)
    c = net.initialized((1, 2, 5, 5), seed=8)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k])
        assert not np.array_equal(a.params[k], c.params[k])
    bound = 1 / np.sqrt(2 * 9)  # torch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both
    assert np.abs(a.params["0.weight"]).max() <= bound and np.abs(a.params["0.bias"]).max() <= bound
    d = a.add("linear", out_features=3).initialized((1, 2, 5, 5), seed=99)
    np.testing.assert_array_equal(d.params["0.weight"], a.params["0.weight"])  # kept
    assert d.params["2.weight"].shape == (3, 36)
    assert layer_seed(7, "0") != layer_seed(7, "2") and layer_seed(7, "0") == layer_seed(7, "0")


def test_to_torch_needs_params_and_shape():
    with pytest.raises(AnyDeviceError) as ei:
        Network.empty().add("linear", out_features=2).to_torch()
    assert ei.value.arg == "params"
    held = Network.empty().add("linear", out_features=2).with_params({"0.weight": np.ones((2, 3), np.float32)})
    with pytest.raises(AnyDeviceError) as ei:
        held.to_torch()
    assert ei.value.arg == "in_shape"
    t = held.initialized((1, 3), seed=0).to_torch()  # keeps the weight, adds the missing bias
    np.testing.assert_array_equal(t[0].weight.detach().numpy(), np.ones((2, 3), np.float32))
    plain = Network.empty().add("activation", name="relu").add("flatten").to_torch()  # no shapes needed
    assert len(plain) == 2


def test_describe(rich):
    text = rich.describe()
    lines = text.splitlines()
    assert lines[0] == f"input {IN}"
    assert any(line.startswith("0 conv2d(") and "-> (4, 8, 8, 8)" in line and "[224 params]" in line for line in lines)
    assert any(line.strip().startswith("3.body.0 conv2d(") for line in lines)
    assert lines[-1] == f"{rich.num_params()} parameters"
    assert "not initialised" in Network.empty().add("linear", out_features=2).describe((1, 3)).splitlines()[-1]


# ---- save / load ----------------------------------------------------------------------------
def test_save_load_roundtrip(tmp_path, rich, backend_target):
    path = tmp_path / "net.safetensors"
    netio.save(rich, path, metadata={"note": "hello"})
    back = netio.load(path)
    assert back.layers == rich.layers and back.in_shape == rich.in_shape
    assert list(back.params) == list(rich.params) and set(back.buffers) == set(rich.buffers)
    for k in rich.params:
        np.testing.assert_array_equal(back.params[k], rich.params[k])
    for k in rich.buffers:
        np.testing.assert_array_equal(back.buffers[k], rich.buffers[k])
    x = _x()
    np.testing.assert_array_equal(back.forward(backend_target, x).numpy(), rich.forward(backend_target, x).numpy())
    # the format: 8-byte length, JSON header, F32 tensors
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    assert header["__metadata__"]["note"] == "hello"
    assert json.loads(header["__metadata__"][netio.LAYERS_KEY])["layers"] == [dict(x) for x in rich.layers]
    assert header["0.weight"]["dtype"] == "F32" and header["0.weight"]["shape"] == [8, 3, 3, 3]
    assert n % 8 == 0 and len(blob) == 8 + n + max(v["data_offsets"][1] for k, v in header.items()
                                                    if k != "__metadata__")


def test_safetensors_package_interop(tmp_path, rich):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    path = tmp_path / "ours.safetensors"
    netio.save(rich, path)
    theirs = st.load_file(str(path))
    assert set(theirs) == set(rich.params) | set(rich.buffers)
    for k, v in theirs.items():
        np.testing.assert_array_equal(v, rich.params.get(k, rich.buffers.get(k)))
    # a file the package writes (torch's state dict of the same network, our spec in the metadata)
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in rich.to_torch().state_dict().items()}
    path2 = tmp_path / "theirs.safetensors"
    save_file(state, str(path2), metadata={netio.LAYERS_KEY: rich.spec_json()})
    back = netio.load(path2)  # num_batches_tracked (int64) is skipped
    assert set(back.params) == set(rich.params) and set(back.buffers) == set(rich.buffers)
    for k in rich.params:
        np.testing.assert_array_equal(back.params[k], rich.params[k])


@pytest.mark.parametrize("blob, fragment", [
    (b"\x01\x02", "shorter"),
    (struct.pack("<Q", 1000) + b"{}", "does not fit"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (struct.pack("<Q", 5) + b"{nope", "not JSON"),
    (struct.pack("<Q", 64) + json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
     .ljust(64) + b"\0" * 8, "offsets"),
    (struct.pack("<Q", 64) + json.dumps({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}).encode()
     .ljust(64) + b"\0" * 8, "bad entry"),
    (struct.pack("<Q", 8) + b"{}      ", "no layer spec"),
])
def test_load_refuses_bad_files(tmp_path, blob, fragment):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(AnyDeviceError) as ei:
        netio.load(path)
    assert ei.value.op == "load" and fragment in str(ei.value), str(ei.value)


def test_load_refuses_tensors_that_do_not_fit(tmp_path):
    net = Network.empty().add("linear", out_features=3)
    net = Network(net.layers, {"0.weight": np.zeros((3, 5), np.float32), "0.bias": np.zeros(3, np.float32)}, {},
                  (1, 4))  # made for 5 features, saying 4
    path = tmp_path / "net.safetensors"
    netio.save(net, path)
    with pytest.raises(AnyDeviceError) as ei:
        netio.load(path)
    assert "do not fit" in str(ei.value)
    with pytest.raises(AnyDeviceError):
        netio.save(Network.empty().add("linear", out_features=3), path)  # no parameters
    with pytest.raises(AnyDeviceError):
        netio.load(tmp_path / "missing.safetensors")
