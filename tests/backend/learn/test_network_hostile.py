"""A saved network is untrusted input: hostile layer specs (backend/learn/network.py) and hostile
safetensors files (backend/learn/netio.py) are refused with an AnyDeviceError that names where (the layer
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
from anydevice.backend.learn import netio
from anydevice.backend.learn.network import MAX_DEPTH, Network
from anydevice.backend.learn.train import predict

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
    from anydevice.nodes.base.common import NodeError
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


# ---- 3. the neighbours: odd values in settings, odd files ---------------------------------------
@pytest.mark.parametrize("layer, setting, value", [
    ({"type": "activation", "name": "leaky_relu", "negative_slope": float("nan")}, "negative_slope", "nan"),
    ({"type": "batch_norm", "eps": float("inf")}, "eps", "inf"),
    ({"type": "batch_norm", "momentum": float("-inf")}, "momentum", "-inf"),
    ({"type": "activation", "name": "elu", "alpha": 1e308}, "alpha", "1e+308"),
    ({"type": "upsample", "scale_factor": 1e308}, "scale_factor", "1e+308"),
    ({"type": "upsample", "scale_factor": [2, float("nan")]}, "scale_factor", "nan"),
    ({"type": "dropout", "p": float("nan")}, "p", "nan"),
    ({"type": "linear", "out_features": 1e308}, "out_features", "1e+308"),
    ({"type": "linear", "out_features": True}, "out_features", "True"),
    ({"type": "linear", "out_features": 3, "bias": 1}, "bias", "1"),
    ({"type": "conv2d", "out_channels": "8", "kernel_size": 3}, "out_channels", "'8'"),
    ({"type": "conv2d", "out_channels": 8, "kernel_size": [3, True]}, "kernel_size", "True"),
    ({"type": "conv2d", "out_channels": 8, "kernel_size": 3, "stride": 3.0}, "stride", "3.0"),
    ({"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": "full"}, "padding", "'full'"),
    ({"type": "conv2d", "out_channels": 8, "kernel_size": 3, "padding_mode": ["zeros"]}, "padding_mode", "['zeros']"),
    ({"type": "linear", "out_features": 10**40}, "out_features", "10000000000000000000000000000000000000000"),
    ({"type": "batch_norm", "eps": 10**400}, "eps", "1000000"),
    ({"type": "activation", "name": "softmax", "dim": 1.5}, "dim", "1.5"),
    ({"type": "activation", "name": 3}, "name", "3"),
    ({"type": "pool", "kind": "adaptive_avg", "kernel_size": 0, "output_size": 1}, "kernel_size", "0"),
    ({"type": "transformer"}, "type", "'transformer'"),
    ({"type": ["linear"]}, "type", "['linear']"),
    ({"type": None}, "type", "None"),
    ({"type": "flatten", "start_dim": 2}, "start_dim", "2"),
    ({"type": "linear", "out_features": 3, "weights": [1, 2]}, "weights", "[1, 2]"),
    ({"type": "activation", "name": "relu", "inplace": True}, "inplace", "True"),
    ({"type": "residual", "body": "conv"}, "body", "'conv'"),
    ({"type": "residual", "body": [{"type": "linear", "out_features": 0.5}]}, "out_features", "0.5"),
])
def test_odd_settings_are_named(layer, setting, value):
    text = json.dumps({"layers": [layer]}, allow_nan=True)
    exc = refused(lambda: Network.from_spec_json(text), f"'{setting}'", value)
    assert exc.arg == setting
    assert "layer 0" in str(exc)


@pytest.mark.parametrize("text, arg, fragment", [
    ('{"layers": [], "weights": 1}', "weights", "unknown key"),
    ('{"format": "anydevice.network/9", "layers": []}', "format", "anydevice.network/1"),
    ('{"layers": [], "in_shape": 5}', "in_shape", "ints from 0"),
    ('{"layers": [], "in_shape": [1, -3]}', "in_shape", "ints from 0"),
    ('{"layers": [], "in_shape": [1, true]}', "in_shape", "ints from 0"),
    ('{"layers": [], "in_shape": [1, 3.5]}', "in_shape", "ints from 0"),
    ('{"layers": [{"type": "flatten"}], "in_shape": [1, 100000, 100000, 100000]}', "layer 0 (flatten)", "TiB"),
    ('{"layers": "conv"}', "spec", "'layers' list"),
    ('{"layers": [5]}', "layer", "'type'"),
    ('[{"type": "flatten"}', "spec", "not valid JSON"),
    ('{"layers": [{"type": "linear", "out_features": ' + "9" * 5000 + '}]}', "spec", "not valid JSON"),
    (json.dumps({"layers": [{"type": "flatten"}] * 10001}), "spec", "at most 10000"),
])
def test_odd_specs_are_named(text, arg, fragment, limit_mb):
    exc = refused(lambda: Network.from_spec_json(text), fragment)
    assert exc.arg == arg, str(exc)


def _entry(dtype="F32", shape=(3, 2), offsets=(0, 24)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


_META = {netio.LAYERS_KEY: spec([{"type": "linear", "out_features": 3}])}


@pytest.mark.parametrize("header, data, fragments", [
    ({"__metadata__": _META, "0.weight": _entry("f32")}, 24, ["'0.weight'", "dtype 'f32'", "F32, F16"]),
    ({"__metadata__": _META, "0.weight": _entry("F8_E4M3")}, 24, ["'0.weight'", "'F8_E4M3'"]),
    ({"__metadata__": _META, "0.weight": _entry(["F32"])}, 24, ["'0.weight'", "['F32']"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=(0, 20))}, 24, ["'0.weight'", "[3, 2]", "needs 24 bytes",
                                                                         "has 20"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=(0, 28))}, 28, ["'0.weight'", "[3, 2]", "has 28"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=(0, 24))}, 8, ["'0.weight'", "[0, 24]", "outside the 8"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=(16, 8))}, 24, ["'0.weight'", "[16, 8]"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=(0, 2**62))}, 24, ["'0.weight'", "outside"]),
    ({"__metadata__": _META, "0.weight": _entry(shape=(-3, -2))}, 24, ["'0.weight'", "[-3, -2]", "negative"]),
    ({"__metadata__": _META, "0.weight": _entry(shape=(3.0, 2))}, 24, ["'0.weight'", "[3.0, 2]", "ints"]),
    ({"__metadata__": _META, "0.weight": _entry(shape=(True, 2))}, 24, ["'0.weight'", "ints"]),
    ({"__metadata__": _META, "0.weight": _entry(shape=(2**31, 2**31))}, 24, ["'0.weight'", "[2147483648, 2147483648]"]),
    ({"__metadata__": _META, "0.weight": _entry(shape=[1] * 9, offsets=(0, 4))}, 24, ["'0.weight'", "at most 8"]),
    ({"__metadata__": _META, "0.weight": _entry(offsets=("0", "24"))}, 24, ["'0.weight'", "data_offsets"]),
    ({"__metadata__": _META, "0.weight": [1, 2]}, 24, ["'0.weight'", "bad entry"]),
    ({"__metadata__": _META, "0.weight": {**_entry(), "extra": 1}}, 24, ["'0.weight'", "bad entry"]),
    ({"__metadata__": {netio.LAYERS_KEY: {"layers": []}}}, 0, ["'anydevice.layers'", "not a string"]),
    ({"__metadata__": [1]}, 0, ["__metadata__", "list"]),
    ({"__metadata__": {netio.LAYERS_KEY: spec([]), netio.BUFFERS_KEY: "{"}}, 0, ["'anydevice.buffers'"]),
    ({"__metadata__": {netio.LAYERS_KEY: spec([]), netio.BUFFERS_KEY: "[[1]]"}}, 0, ["'anydevice.buffers'"]),
    ({"__metadata__": {netio.LAYERS_KEY: "[" * 5000 + "]" * 5000}}, 0, ["layer spec", "nests"]),
])
def test_odd_headers_are_named(tmp_path, header, data, fragments):
    path = st_file(tmp_path / "odd.safetensors", header, b"\0" * data)
    exc = refused(lambda: netio.load(path), *fragments)
    assert exc.op == "load" and exc.arg == "path" and exc.value == str(path)  # the message shows it, cut short


@pytest.mark.parametrize("blob, fragment", [
    (b"", "is empty"),
    (b"\x01\x02\x03", "shorter than its 8-byte header length"),
    (struct.pack("<Q", 2**64 - 1) + b"{}", "header length 18446744073709551615"),
    (struct.pack("<Q", netio.MAX_HEADER + 8) + b"{}", "at most"),
    (struct.pack("<Q", 4096) + b"{}" + b" " * 62, "points past the end"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "is not a safetensors file"),
    (b"PK\x03\x04" + b"\0" * 100, "is not a safetensors file"),
    (struct.pack("<Q", 8) + b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8", "not JSON"),
    (struct.pack("<Q", 8) + b"12345678", "not a JSON object"),
])
def test_files_that_are_not_safetensors(tmp_path, blob, fragment):
    path = tmp_path / "odd.safetensors"
    path.write_bytes(blob)
    exc = refused(lambda: netio.load(path), fragment)
    assert exc.op == "load" and exc.value == str(path)


def test_paths_that_are_not_files(tmp_path):
    assert refused(lambda: netio.load(tmp_path), "is a directory").value == str(tmp_path)
    exc = refused(lambda: netio.load(tmp_path / "missing.safetensors"), "cannot be read", "No such file")
    assert exc.value == str(tmp_path / "missing.safetensors")
    import os
    if os.path.exists("/dev/zero"):  # would read forever
        refused(lambda: netio.load("/dev/zero"), "/dev/zero", "not a regular file")


def test_weights_that_are_not_finite(tmp_path):
    path = net_file(tmp_path / "nan.safetensors", [{"type": "linear", "out_features": 3}],
                    {"0.weight": np.full((3, 2), np.nan), "0.bias": np.zeros(3)})
    refused(lambda: netio.load(path), "'0.weight'", "[3, 2]", "NaN or Inf")
    header = {"__metadata__": _META, "0.weight": _entry("F64", (3, 2), (0, 48)), "0.bias": _entry("F64", (3,), (48, 72))}
    path = st_file(tmp_path / "big.safetensors", header, np.full(9, 1e308).tobytes())
    refused(lambda: netio.load(path), "'0.weight'", "float32's range")


def test_tensors_over_the_memory_limit_are_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    n = 1 << 19  # 2 MiB of F32
    header = {"__metadata__": {netio.LAYERS_KEY: spec([])}, "big": _entry("F32", (n,), (0, 4 * n))}
    path = st_file(tmp_path / "big.safetensors", header, b"\0" * (4 * n))
    refused(lambda: netio.load(path), "'big'", "2.0 MiB", "ANYDEVICE_MAX_TENSOR_MB=1", peak_mb=1)


def test_a_good_file_still_loads(tmp_path, be):
    net = (Network.empty().add("conv2d", out_channels=4, kernel_size=3, padding=1).add("batch_norm")
           .residual(Network.empty().add("activation", name="relu")).add("flatten").add("linear", out_features=2))
    net = net.initialized((1, 3, 8, 8), 0)
    netio.save(net, tmp_path / "ok.safetensors")
    back = netio.load(tmp_path / "ok.safetensors")
    assert list(back.params) == list(net.params) and set(back.buffers) == set(net.buffers)
    np.testing.assert_array_equal(back.forward(be, IMG).numpy(), net.forward(be, IMG).numpy())
    # without the input shape in the spec: same tensors, in the layers' order
    no_shape = Network(net.layers, net.params, net.buffers, None)
    netio.save(no_shape, tmp_path / "noshape.safetensors")
    back = netio.load(tmp_path / "noshape.safetensors")
    assert back.in_shape is None and list(back.params) == list(net.params)


def test_sizes_do_not_stop_describe_or_weights_that_are_there(be, monkeypatch):
    """describe() says the parameter count of a network too large to make; a network whose weights
    exist runs under a limit lower than they are (only what forward would make is checked)."""
    net = Network.from_spec_json(spec([{"type": "flatten"}, {"type": "linear", "out_features": 10**6}]))
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "256")
    assert net.describe((1, 3, 32, 32)).splitlines()[-1] == "3073000000 parameters (not initialised)"
    small = Network.empty().add("linear", out_features=300).initialized((2, 1000), 0)  # 1.1 MiB of weights
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    assert small.forward(be, np.zeros((2, 1000), np.float32)).shape == (2, 300)
    refused(lambda: small.initialized((2, 2000), 0), "layer 0 (linear)", "weight (300, 2000)")
