"""A saved network is untrusted input: hostile layer specs (backend/network.py) and hostile
safetensors files (backend/netio.py) are refused with an AnyDeviceError that names where (the layer
by index and type, the tensor, the file), what (the setting, the field) and the value, before any
large allocation and without a hang: every case runs in a thread joined with a timeout (a hang
guard, not a speed test) under tracemalloc, whose peak must stay small."""
from __future__ import annotations

import json
import struct
import threading
import tracemalloc

import numpy as np
import pytest

from anydevice.backend import AnyDeviceError, get_backend
from anydevice.backend import netio
from anydevice.backend.network import MAX_DEPTH, Network
from anydevice.backend.train import predict

#: a hostile case must be refused well within this (a hang guard: the bugs took 80 s or forever)
HANG_S = 60
#: and without allocating more than this (the bugs asked for 1.8 GB and 22 GiB)
PEAK_MB = 32


def refused(fn, *fragments, peak_mb=PEAK_MB):
    """The AnyDeviceError ``fn()`` raises, checked to hold every fragment; fn runs in a thread joined
    with a timeout, its traced memory peak bounded. Any other exception (or none) fails."""
    box = {}

    def go():
        tracemalloc.start()
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            box["exc"] = exc
        finally:
            box["peak"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"still running after {HANG_S} s"
    exc = box.get("exc")
    assert isinstance(exc, AnyDeviceError), f"not refused with an AnyDeviceError: {exc!r}"
    text = str(exc)
    for f in fragments:
        assert f in text, f"{f!r} not in: {text}"
    assert box["peak"] < peak_mb * 2**20, f"traced peak {box['peak'] / 2**20:.1f} MiB before: {text}"
    return exc


def spec(layers, **top) -> str:
    return json.dumps({"layers": layers, **top})


def st_file(path, header: dict | None = None, data: bytes = b"", raw: bytes | None = None):
    """A safetensors file: 8-byte header length, the header (``raw`` as given), then ``data``."""
    text = raw if raw is not None else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def net_file(path, layers, tensors: dict | None = None, **top):
    """A file with this spec in its metadata and these {name: float32 array} tensors."""
    header = {"__metadata__": {netio.LAYERS_KEY: spec(layers, **top)}}
    data, off = b"", 0
    for k, a in (tensors or {}).items():
        a = np.ascontiguousarray(a, "<f4")
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        data += a.tobytes()
        off += a.nbytes
    return st_file(path, header, data)


@pytest.fixture
def limit_mb(monkeypatch):
    """The memory limit, fixed (not half of whatever this machine has free)."""
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "256")
    return 256


@pytest.fixture(scope="module")
def be():
    return get_backend("numpy")


IMG = np.zeros((1, 3, 8, 8), np.float32)


# ---- 1. every size is checked against the memory limit before anything is built ----------------
def test_upsample_by_a_million_is_refused_before_the_op_builds_its_tables(tmp_path, be, limit_mb):
    """Was: 80 s and 1.8 GB in interpolate's index tables before the size check refused it."""
    path = net_file(tmp_path / "up.safetensors", [{"type": "upsample", "scale_factor": 1e6}])
    net = netio.load(path)  # no input shape in the file: nothing to check the output against yet
    frags = ("layer 0 (upsample)", "scale_factor=1000000.0", "(1, 3, 8000000, 8000000)", "TiB",
             "ANYDEVICE_MAX_TENSOR_MB=256")
    refused(lambda: net.forward(be, IMG), *frags)
    refused(lambda: predict(net, be, IMG), *frags)
    refused(lambda: net.shapes(IMG.shape), *frags)  # what Apply Network checks first
    # with the input shape in the file, at load
    path = net_file(tmp_path / "up2.safetensors", [{"type": "upsample", "scale_factor": 1e6}], in_shape=[1, 3, 8, 8])
    refused(lambda: netio.load(path), "layer 0 (upsample)", "scale_factor=1000000.0", "TiB")


def test_apply_network_node_refuses_a_loaded_upsample_by_a_million(tmp_path, monkeypatch, limit_mb):
    import torch
    from anydevice.nodes import NODE_CLASS_MAPPINGS as N
    from anydevice.nodes.common import NodeError
    net = netio.load(net_file(tmp_path / "up.safetensors", [{"type": "upsample", "scale_factor": 1e6}]))
    box = {}

    def go():
        try:
            N["AnyDeviceApplyNetwork"]().run(network=net, input=torch.zeros(1, 8, 8, 3), batch_size=1)
        except BaseException as exc:  # noqa: BLE001
            box["exc"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive()
    assert isinstance(box.get("exc"), NodeError), repr(box.get("exc"))
    text = str(box["exc"])
    assert "Apply Network" in text and "layer 0 (upsample)" in text and "scale_factor=1000000.0" in text, text


def test_linear_weights_are_checked_before_they_are_made(limit_mb):
    """Was: a raw MemoryError (22 GiB asked) from initialized(); a mid-sized one was really allocated."""
    # far over the limit whatever the input: refused with the spec, no input shape needed
    exc = refused(lambda: Network.from_spec_json(spec([{"type": "linear", "out_features": 10**9}])),
                  "layer 0 (linear)", "out_features", "1000000000", "7.5 GiB", "ANYDEVICE_MAX_TENSOR_MB=256")
    assert exc.arg == "out_features"
    refused(lambda: Network.empty().add("linear", out_features=10**9), "layer 0 (linear)", "out_features")
    # under the limit for one input feature, over it for the input it gets: refused before any weight
    net = Network.from_spec_json(spec([{"type": "flatten"}, {"type": "linear", "out_features": 10**6}]))
    exc = refused(lambda: net.initialized((1, 3, 32, 32), 0), "layer 1 (linear)", "weight (1000000, 3072)",
                  "out_features=1000000", "11.4 GiB")
    assert exc.arg == "layer 1 (linear)"
    refused(lambda: net.param_shapes((1, 3, 32, 32)), "layer 1 (linear)")
    # the same through a file with the input shape: refused at load
    refused(lambda: Network.from_spec_json(spec(net.layers, in_shape=[1, 3, 32, 32])), "layer 1 (linear)",
            "out_features=1000000")


def test_conv_weights_and_all_layers_together_are_checked(limit_mb):
    refused(lambda: Network.from_spec_json(spec([{"type": "conv2d", "out_channels": 8,
                                                  "kernel_size": [100000, 100000]}])),
            "layer 0 (conv2d)", "kernel_size=[100000, 100000]", "GiB")
    refused(lambda: Network.from_spec_json(spec([{"type": "conv_transpose2d", "out_channels": 2**20,
                                                  "kernel_size": 64}])),
            "layer 0 (conv_transpose2d)", "out_channels", "1048576")
    # each under the limit, together over it
    many = [{"type": "linear", "out_features": 10**7}] * 5
    refused(lambda: Network.from_spec_json(spec(many)), "layers", "381.5 MiB", "ANYDEVICE_MAX_TENSOR_MB=256")
    # weights in a residual body
    body = [{"type": "conv2d", "out_channels": 2**16, "kernel_size": 64}]
    refused(lambda: Network.from_spec_json(spec([{"type": "residual", "body": body}])), "layer 0.body.0 (conv2d)",
            "out_channels", "65536")


@pytest.mark.parametrize("layers, where, setting", [
    ([{"type": "conv2d", "out_channels": 4, "kernel_size": 1, "padding": 2**30}], "layer 0 (conv2d)", "padding="),
    ([{"type": "conv_transpose2d", "out_channels": 4, "kernel_size": 1, "stride": 2**30, "output_padding": 1}],
     "layer 0 (conv_transpose2d)", "stride="),
    ([{"type": "pool", "kind": "adaptive_max", "output_size": 10**6}], "layer 0 (pool)", "output_size="),
    ([{"type": "residual", "body": [{"type": "upsample", "scale_factor": [4096, 4096]}, {"type": "pool", "kind": "avg",
                                                                                         "kernel_size": 4096}]}],
     "layer 0.body.0 (upsample)", "scale_factor="),
])
def test_every_layer_output_is_checked_once_the_input_shape_is_known(be, limit_mb, layers, where, setting):
    net = Network.from_spec_json(spec(layers))
    if net.layers[0]["type"].startswith("conv"):
        net = Network(net.layers, {"0.weight": np.zeros((3, 4, 1, 1) if "transpose" in where else (4, 3, 1, 1),
                                                        np.float32), "0.bias": np.zeros(4, np.float32)}, {}, None)
    refused(lambda: net.forward(be, IMG), where, setting, "would need", "over the limit")
    refused(lambda: Network.from_spec_json(spec(layers, in_shape=[1, 3, 8, 8])), where, setting)


def test_a_batch_is_checked_on_the_device_it_runs_on(be, monkeypatch):
    """shapes() refuses what one sample cannot fit; forward the batch it is given."""
    net = Network.empty().add("upsample", scale_factor=16)
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "4")
    assert net.shapes((64, 3, 8, 8))[-1] == (64, 3, 128, 128)  # 192 KiB a sample: fits
    refused(lambda: net.forward(be, np.zeros((64, 3, 8, 8), np.float32)), "layer 0 (upsample)",
            "(64, 3, 128, 128)", "12.0 MiB", "ANYDEVICE_MAX_TENSOR_MB=4")
    assert predict(net, be, np.zeros((64, 3, 8, 8), np.float32)).shape == (64, 3, 128, 128)  # in batches


# ---- 2. Load Network: the file and its nesting --------------------------------------------------
def test_a_shape_whose_size_overflows_int64_names_the_tensor(tmp_path):
    """Was: ValueError (cannot reshape): 2**32 * 2**32 wrapped to 0 in np.prod."""
    path = st_file(tmp_path / "x.safetensors", {"__metadata__": {netio.LAYERS_KEY: spec([])},
                                                "0.weight": {"dtype": "F32", "shape": [2**32, 2**32],
                                                             "data_offsets": [0, 0]}})
    exc = refused(lambda: netio.load(path), "'0.weight'", "[4294967296, 4294967296]",
                  "needs 73786976294838206464 bytes", "its data has 0")
    assert exc.op == "load" and exc.arg == "path" and "'0.weight'" in exc.reason


def test_deep_nesting_is_refused_without_recursion_error(tmp_path):
    """Was: RecursionError from json.loads ([ x 100000) or from the layer walk (3000 residuals)."""
    refused(lambda: Network.from_spec_json("[" * 100000 + "]" * 100000), "spec", "nests too deep",
            f"at most {MAX_DEPTH} deep")

    def nested(n):
        d = {"type": "activation", "name": "relu"}
        for _ in range(n):
            d = {"type": "residual", "body": [d]}
        return d

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        deep = spec([nested(3000)])
    finally:
        sys.setrecursionlimit(old)
    refused(lambda: Network.from_spec_json(deep), "spec", f"at most {MAX_DEPTH} deep")
    path = st_file(tmp_path / "deep.safetensors", {"__metadata__": {netio.LAYERS_KEY: deep}})
    exc = refused(lambda: netio.load(path), f"at most {MAX_DEPTH} deep")
    assert "layer spec" in exc.reason
    # just over the bound, in JSON and through the Python API: the depth named
    refused(lambda: Network.from_spec_json(spec([nested(MAX_DEPTH + 1)])), "(residual)", "'depth' = 65",
            f"at most {MAX_DEPTH} deep")

    def api(n):
        net = Network.empty().add("activation", name="relu")
        for _ in range(n):
            net = Network.empty().residual(net)
        return net

    refused(lambda: api(3000), "(residual)", "'depth' = 65")
    assert len(Network.from_spec_json(spec([nested(MAX_DEPTH)])).layers) == 1  # the bound itself loads
    assert api(MAX_DEPTH).layers[0]["type"] == "residual"
    # a header (not the spec) nested deep
    path = st_file(tmp_path / "hdr.safetensors", raw=b"[" * 100000 + b"]" * 100000)
    refused(lambda: netio.load(path), "is not a safetensors file", "nests too deep")
    path = st_file(tmp_path / "hdr2.safetensors", raw=b'{"a": ' + b"[" * 500 + b"]" * 500 + b"}")
    refused(lambda: netio.load(path), "is not a safetensors file", "nests deeper")


def test_a_file_without_weights_is_refused_at_load(tmp_path, be):
    """Was: it loaded, then Apply Network failed with KeyError: '0.weight'."""
    path = net_file(tmp_path / "empty.safetensors", [{"type": "flatten"}, {"type": "linear", "out_features": 3}])
    exc = refused(lambda: netio.load(path), "'1.weight'", "layer 1 (linear)", "no weights")
    assert "'1.weight'" in exc.reason
    # one of two tensors: named
    path = net_file(tmp_path / "half.safetensors", [{"type": "linear", "out_features": 3}],
                    {"0.weight": np.zeros((3, 4), np.float32)})
    refused(lambda: netio.load(path), "'0.bias'", "layer 0 (linear)")
    # a tensor no layer has
    path = net_file(tmp_path / "extra.safetensors", [{"type": "flatten"}], {"0.weight": np.zeros((3, 4), np.float32)})
    refused(lambda: netio.load(path), "'0.weight'", "no parameter of its layers")
    # a network without all its weights, built in Python: forward names the missing one
    net = Network.empty().add("linear", out_features=3).with_params({})
    refused(lambda: net.forward(be, np.zeros((2, 4), np.float32)), "layer 0 (linear)", "'0.weight'", "no weights")
    # a spec of layers without parameters needs no tensors
    path = net_file(tmp_path / "relu.safetensors", [{"type": "activation", "name": "relu"}])
    assert netio.load(path).forward(be, IMG).shape == IMG.shape


@pytest.mark.parametrize("layer, where, setting, value", [
    ({"type": "linear", "out_features": -5}, "layer 0 (linear)", "out_features", "-5"),
    ({"type": "conv2d", "out_channels": 4, "kernel_size": 0}, "layer 0 (conv2d)", "kernel_size", "0"),
    ({"type": "pool", "kind": "adaptive_avg", "output_size": 0}, "layer 0 (pool)", "output_size", "0"),
    ({"type": "group_norm", "num_groups": -1}, "layer 0 (group_norm)", "num_groups", "-1"),
    ({"type": "residual", "body": [{"type": "flatten"}, {"type": "dropout", "p": -0.5}]}, "layer 0.body.1 (dropout)",
     "p", "-0.5"),
])
def test_every_spec_message_names_the_layer_the_setting_and_the_value(tmp_path, layer, where, setting, value):
    exc = refused(lambda: Network.from_spec_json(spec([{"type": "flatten"}, layer][1:])), where, f"'{setting}'",
                  value)
    assert exc.arg == setting
    path = net_file(tmp_path / "bad.safetensors", [layer])
    exc = refused(lambda: netio.load(path), where, f"'{setting}'", value)
    assert where in exc.reason and setting in exc.reason  # what the Load Network node shows


def test_load_says_a_refused_spec_in_its_reason(tmp_path, limit_mb):
    """The Load Network node shows the reason of netio's error: it must hold the layer, the setting
    and the value, not only "must be an int >= 1"."""
    path = net_file(tmp_path / "up.safetensors", [{"type": "upsample", "scale_factor": 1e6}], in_shape=[1, 3, 8, 8])
    exc = refused(lambda: netio.load(path), "layer 0 (upsample)")
    assert exc.op == "load" and exc.arg == "path"
    assert "layer 0 (upsample)" in exc.reason and "scale_factor=1000000.0" in exc.reason, exc.reason
