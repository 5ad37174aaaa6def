"""predict(..., weights=fmt) (backend/learn/train.py quantized_params; the Apply Network node's weights
widget): the conv and linear weights of a network run quantized, packed on a device that reads the format,
and the output is the network's on those weights' dequantized values (normwise 1e-6); the network itself
is not changed."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend import AnyDeviceError, get_backend
from anydevice.backend.learn.network import Network
from anydevice.backend.learn.train import predict, quantized_params
from anydevice.backend.ops import quant

IN = (4, 3, 16, 16)


def _net() -> Network:
    return (Network.empty().add("conv2d", out_channels=32, kernel_size=3, padding=1).add("activation", name="relu")
            .add("conv2d", out_channels=32, kernel_size=3, padding=1, groups=2).add("batch_norm")
            .add("pool", kind="adaptive_avg", output_size=2).add("flatten")
            .add("linear", out_features=64).add("activation", name="gelu").add("linear", out_features=10)
            .initialized(IN, seed=4))


def _backend(name):
    try:
        return get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")


@pytest.mark.parametrize("fmt", ["q8_0", "int8", "q4_1", "float8_e4m3fn"])
@pytest.mark.parametrize("name", ["opencl", "numpy", "cpu"])
def test_predict_with_quantized_weights(name, fmt):
    be = _backend(name)
    net = _net()
    x = np.random.default_rng(1).standard_normal(IN).astype(np.float32)
    before = {k: np.array(v) for k, v in net.params.items()}
    y = predict(net, be, x, weights=fmt)
    deq = {k: (quant.quantize(v, fmt).dequantize() if k.endswith(".weight") and v.ndim >= 2 else v)
           for k, v in before.items()}
    ref = predict(net.with_params(deq, net.buffers), be, x)
    assert float(np.linalg.norm(y - ref) / np.linalg.norm(ref)) <= 1e-6
    assert float(np.linalg.norm(y - predict(net, be, x)) / np.linalg.norm(ref)) > 1e-5  # quantized, visibly
    assert all(np.array_equal(np.array(v), before[k]) for k, v in net.params.items())  # the network is unchanged
    params = quantized_params(net, be, fmt)
    packed = [k for k, v in params.items() if quant.is_quantized(v)]
    assert sorted(packed) == sorted(k for k in before if k.endswith(".weight") and before[k].ndim >= 2)
    if name == "opencl":
        assert all(type(params[k]).__name__ == "CLQuant" for k in packed)


def test_unknown_format_is_refused():
    with pytest.raises(AnyDeviceError, match="weights.*q3_x"):
        predict(_net(), get_backend("numpy"), np.zeros(IN, np.float32), weights="q3_x")
