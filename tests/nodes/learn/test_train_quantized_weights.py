"""Apply Network (AnyDevice) with its weights widget: the conv / linear layers run with quantized weights
(backend/learn/train.py predict(weights=)), the node says so, the network is not changed, and a format the
widget does not offer is an error naming the node and the input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from anydevice.backend import get_backend
from anydevice.backend.learn.network import Network
from anydevice.backend.learn.train import predict
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.base.common import NodeError


def _net():
    return (Network.empty().add("conv2d", out_channels=32, kernel_size=3, padding=1).add("activation", name="relu")
            .add("flatten").add("linear", out_features=10).initialized((2, 3, 8, 8), seed=2))


def test_apply_network_with_q8_0_weights():
    net = _net()
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    r = N["AnyDeviceApplyNetwork"]().run(network=net, input={"tensor": x}, batch_size=8, device={"name": "numpy"},
                                         weights="q8_0")
    y = r["result"][0]["tensor"].numpy()
    ref = predict(net, get_backend("numpy"), x.numpy(), weights="q8_0")
    np.testing.assert_array_equal(y, ref)
    assert "conv/linear weights as q8_0" in r["ui"]["text"][0]
    plain = predict(net, get_backend("numpy"), x.numpy())
    assert not np.array_equal(y, plain)


def test_apply_network_refuses_an_unknown_format():
    with pytest.raises(NodeError, match="weights.*q3_x"):
        N["AnyDeviceApplyNetwork"]().run(network=_net(), input={"tensor": torch.zeros(1, 3, 8, 8)}, weights="q3_x")
