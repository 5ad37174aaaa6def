"""The model nodes' ``dtype`` option: auto (float16 where the pack's device stores half, float32 on the
PyTorch backends), float32, float16, bfloat16; the weights stored on the device in it; a half model that
overflows runs again in float32 (as ComfyUI upcasts a VAE that overflows in float16); a dtype the device
cannot store is an error naming the node, the input and the value."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from anydevice.backend import get_backend
from anydevice.backend.compile.lowering import Weights
from anydevice.nodes import NODE_CLASS_MAPPINGS
from anydevice.nodes.base.common import NodeError
from anydevice.nodes.models import compiled as mn

import compile_models as cm
from compile_models import _fresh_dynamo, rel  # noqa: F401 (_fresh_dynamo: an autouse fixture)
from test_compiled import descriptor

UPSCALE = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]


def test_dtype_widget():
    for cls in mn.MODEL_NODES:
        choices, opts = cls.INPUT_TYPES()["optional"]["dtype"]
        assert choices == ["auto", "float32", "float16", "bfloat16"] and opts["default"] == "auto" and opts["tooltip"]


@pytest.mark.parametrize("name,dtype,stored", [("numpy", "auto", "float16"), ("opencl", "auto", "float16"),
                                               ("opencl", "bfloat16", "bfloat16"), ("cpu", "auto", "float32")])
def test_upscale_model_in_half(name, dtype, stored):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    model = cm.compact()
    desc = descriptor(model)
    out = UPSCALE().run(upscale_model=desc, device={"name": name}, dtype=dtype)
    assert f"in {stored}" in " ".join(out["ui"]["text"]), out["ui"]["text"]
    new = out["result"][0]
    x = torch.rand(1, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref, y = desc(x), new(x)
    assert y.dtype == torch.float32 and y.shape == ref.shape
    # a few units of the dtype's rounding (2^-11 for float16, 2^-8 for bfloat16) over the model
    bound = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5}[stored]
    assert rel(y, ref) <= bound, (rel(y, ref), bound)
    if stored != "float32":
        n = sum(p.numel() for p in model.parameters())
        assert 0.9 * 2 * n <= Weights.of(be, stored).nbytes <= 2 * n  # the weights (less a folded PReLU), 2 bytes each
        assert new.model.compiled is not None and new.model.store_dtype == stored


class _Overflows(nn.Module):
    """Finite in float32, inf in float16: an intermediate past 65504."""

    def __init__(self):
        super().__init__()
        self.up = nn.Conv2d(3, 3, 1, bias=False)
        self.down = nn.Conv2d(3, 3, 1, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(torch.eye(3).reshape(3, 3, 1, 1) * 1e5)
            self.down.weight.copy_(torch.eye(3).reshape(3, 3, 1, 1) * 1e-5)

    def forward(self, x):
        return self.down(self.up(x))


def test_a_half_model_that_overflows_runs_again_in_float32(caplog):
    model = _Overflows().eval()
    desc = descriptor(model, scale=1)
    new = UPSCALE().run(upscale_model=desc, device={"name": "numpy"}, dtype="float16")["result"][0]
    x = torch.rand(1, 3, 6, 6)
    with caplog.at_level(logging.WARNING, logger="anydevice"), torch.inference_mode():
        y, y2, ref = new(x), new(x), desc(x)
    assert torch.isfinite(y).all() and rel(y, ref) <= 1e-5 and rel(y2, ref) <= 1e-5
    said = [r.getMessage() for r in caplog.records if "overflowed in float16" in r.getMessage()]
    assert len(said) == 1 and "float32 from now on" in said[0], said
    assert new.model.store_dtype == "float32"


def test_a_dtype_the_device_cannot_store_is_an_error():
    desc = descriptor(cm.compact())
    with pytest.raises(NodeError) as e:
        UPSCALE().run(upscale_model=desc, device={"name": "numpy"}, dtype="float64")
    assert str(e.value).startswith("Upscale Model on AnyDevice: ") and "dtype" in str(e.value) and "float64" in str(e.value)
