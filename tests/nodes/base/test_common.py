"""Constants a node builds itself (Conv2D's random and preset kernels, Linear's random and identity
matrices, Tensor Source's tensors, Weights' random weight) are checked against the tensor limit in
the dtype they are generated in, before they are generated: a clear error naming the node, the input
and its value, and nothing of that size allocated (the seeded init draws float64 before its float32
copy: a float32-only check let a 20 GiB float64 draw through, a raw MemoryError)."""
from __future__ import annotations

import tracemalloc

import pytest
import torch

from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.base.common import NodeError
from anydevice.nodes.base.resident import DeviceTensor


def _refused(name, limit_mb, monkeypatch, **kw) -> tuple[str, int]:
    """(the error running node ``name`` with ``kw`` raises under ANYDEVICE_MAX_TENSOR_MB=limit_mb, the
    traced peak of the call)."""
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", str(limit_mb))
    tracemalloc.start()
    try:
        with pytest.raises(NodeError) as e:
            N[name]().run(**kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(e.value), peak


def test_conv_random_kernel_far_above_the_widget_max(monkeypatch):
    # the float32 kernel (10.1 GiB) is under the limit; the float64 draw it is made from (20.1 GiB) is not
    msg, peak = _refused("AnyDeviceConv2D", 16384, monkeypatch, input=torch.rand(1, 8, 8, 3), kernel_source="random",
                         kernel_size=30000, device={"name": "numpy"})
    assert msg == ("Conv2D (AnyDevice): input 'kernel_size' = 30000: would build a (3, 1, 30000, 30000) random "
                   "kernel of 20.1 GiB in float64, over the limit of 16.0 GiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20


def test_conv_random_kernel_with_the_default_limit(monkeypatch):
    """Without the setting the limit is half the free host memory: the message says so."""
    from anydevice.backend.system import memstat
    monkeypatch.delenv("ANYDEVICE_MAX_TENSOR_MB", raising=False)
    monkeypatch.setattr(memstat, "free_bytes", lambda be=None, want=0: (32 * 2**30, "host RAM"))
    tracemalloc.start()
    try:
        with pytest.raises(NodeError) as e:
            N["AnyDeviceConv2D"]().run(input=torch.rand(1, 8, 8, 3), kernel_source="random", kernel_size=30000,
                                       device={"name": "numpy"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == ("Conv2D (AnyDevice): input 'kernel_size' = 30000: would build a (3, 1, 30000, 30000) "
                            "random kernel of 20.1 GiB in float64, over the limit of 16.0 GiB (half of the 32.0 GiB "
                            "free in host RAM; ANYDEVICE_MAX_TENSOR_MB sets another)")
    assert peak < 4 * 2**20


@pytest.mark.parametrize("k,kw,shape,gib", [
    (20000, {"channel_mode": "grouped", "out_channels": 6, "groups": 3}, (6, 1, 20000, 20000), 17.9),
    (15000, {"channel_mode": "grouped", "transposed": True, "out_channels": 6}, (3, 6, 15000, 15000), 30.2)])
def test_conv_grouped_random_kernel(k, kw, shape, gib, monkeypatch):
    msg, peak = _refused("AnyDeviceConv2D", 16384, monkeypatch, input=torch.rand(1, 8, 8, 3), kernel_source="random",
                         kernel_size=k, device={"name": "numpy"}, **kw)
    assert msg == (f"Conv2D (AnyDevice): input 'kernel_size' = {k}: would build a {shape} random kernel of {gib} GiB "
                   "in float64, over the limit of 16.0 GiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20


def test_conv_gaussian_preset_is_computed_in_float64(monkeypatch):
    # one channel (a MASK): the float32 kernel is 3.4 GiB, its float64 computation 6.7 GiB
    msg, peak = _refused("AnyDeviceConv2D", 4096, monkeypatch, input=torch.rand(1, 8, 8), preset="gaussian",
                         kernel_size=30000, device={"name": "numpy"})
    assert msg == ("Conv2D (AnyDevice): input 'kernel_size' = 30000: would build a (30000, 30000) gaussian kernel "
                   "of 6.7 GiB in float64, over the limit of 4.0 GiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20


def test_conv_2d_kernel_repeated_for_many_channels(monkeypatch):
    msg, peak = _refused("AnyDeviceConv2D", 64, monkeypatch, input=torch.rand(1, 8, 8, 3), kernel_source="text",
                         kernel_text="1 2 1", channel_mode="grouped", out_channels=10**7, device={"name": "numpy"})
    assert msg == ("Conv2D (AnyDevice): input 'out_channels' = 10000000: would build a (10000000, 3, 1, 3) kernel of "
                   "343.3 MiB in float32, over the limit of 64.0 MiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20


def test_linear_random_and_identity_matrices(monkeypatch):
    msg, peak = _refused("AnyDeviceLinear", 16, monkeypatch, input=torch.rand(1, 4, 4, 3), source="random",
                         out_features=10**6, device={"name": "numpy"})
    assert msg == ("Linear (AnyDevice): input 'out_features' = 1000000: would build a (1000000, 3) random matrix of "
                   "22.9 MiB in float64, over the limit of 16.0 MiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20
    msg, peak = _refused("AnyDeviceLinear", 16, monkeypatch, input={"tensor": torch.zeros(1, 4096)}, source="preset",
                         preset="identity", device={"name": "numpy"})
    assert msg == ("Linear (AnyDevice): input 'preset' = 'identity': would build a (4096, 4096) identity matrix of "
                   "64.0 MiB in float32, over the limit of 16.0 MiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20


@pytest.mark.parametrize("mode", ["zeros", "ones", "random_normal", "random_uniform"])
def test_tensor_source_tensors(mode, monkeypatch):
    msg, peak = _refused("AnyDeviceTensorSource", 16, monkeypatch, mode=mode, shape="4096, 4096")
    assert msg == ("Tensor Source (AnyDevice): input 'shape' = '4096, 4096': would build a (4096, 4096) tensor of "
                   "64.0 MiB in float32, over the limit of 16.0 MiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20
    out = N["AnyDeviceTensorSource"]().run(mode=mode, shape="2048, 2048")["result"][0]  # 16 MiB: at the limit
    assert isinstance(out, DeviceTensor) and tuple(out.shape) == (2048, 2048)


def test_weights_random_is_drawn_in_float64(monkeypatch):
    # float32 2048 x 2048 is 16 MiB, at the limit; the float64 draw is 32 MiB
    msg, peak = _refused("AnyDeviceWeights", 16, monkeypatch, source="random", shape="2048, 2048")
    assert msg == ("Weights (AnyDevice): input 'shape' = '2048, 2048': would build a (2048, 2048) random weight of "
                   "32.0 MiB in float64, over the limit of 16.0 MiB (ANYDEVICE_MAX_TENSOR_MB)")
    assert peak < 4 * 2**20
    w = N["AnyDeviceWeights"]().run(source="random", shape="1448, 1448")["result"][0]["weight"]  # 16.0 MiB float64
    assert w.dtype == torch.float32 and tuple(w.shape) == (1448, 1448)


def test_constants_under_the_limit_are_built_as_before(monkeypatch):
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    out = N["AnyDeviceConv2D"]().run(input=torch.rand(1, 8, 8, 3), kernel_source="random", kernel_size=5,
                                     device={"name": "numpy"})
    assert out["ui"]["kernel"][0]["shape"] == [3, 1, 5, 5]
    out = N["AnyDeviceLinear"]().run(input=torch.rand(1, 4, 4, 3), source="random", out_features=4,
                                     device={"name": "numpy"})
    assert out["ui"]["kernel"][0]["shape"] == [4, 3]
