"""The Normalize node (nodes/compute/norm.py): every method on IMAGE, MASK, LATENT and TENSOR values,
checked against torch (float64) channels-first, the input's type kept, inputs never written, bad
inputs named."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from anydevice import backend as B
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.base.common import NodeError
from anydevice.nodes.base.resident import DeviceTensor

#: the backends the node tests run on (the op tests cover every variant)
DEVICES = [n for n in ("numpy", "opencl", "cpu") if n in {i.name for i in B.list_backends() if i.available}]
METHODS = ["instance", "group", "layer", "rms", "batch"]


@pytest.fixture(params=DEVICES)
def device(request):
    return {"name": request.param}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def image(b=2, h=12, w=10, c=3, seed=0):
    return torch.rand(b, h, w, c, generator=gen(seed))


def run(**kw):
    out = N["AnyDeviceNormalize"]().run(**kw)
    assert set(out) == {"ui", "result"}
    return out["result"][0]


from node_helpers import close  # noqa: E402


def ref(x, method, num_groups=1, eps=1e-5, scale=1.0, shift=0.0):
    """torch's normalisation of an (N, C, H, W) float64 tensor."""
    if method == "instance":
        y = F.instance_norm(x, eps=eps)
    elif method == "group":
        y = F.group_norm(x, num_groups, eps=eps)
    elif method == "layer":
        y = F.layer_norm(x, x.shape[1:], eps=eps)
    elif method == "rms":
        y = F.rms_norm(x, x.shape[1:], eps=eps)
    else:
        y = F.batch_norm(x, None, None, training=True, eps=eps)
    return y * scale + shift


@pytest.mark.parametrize("method", METHODS)
def test_image(device, method):
    img = image(c=4) if method == "group" else image()
    before = img.clone()
    out = run(input=img, method=method, num_groups=2, eps=1e-5, device=device)
    assert torch.equal(img, before)
    assert torch.is_tensor(out) and out.dtype == torch.float32 and out.shape == img.shape
    close(out, ref(img.permute(0, 3, 1, 2).double(), method, 2).permute(0, 2, 3, 1))


@pytest.mark.parametrize("method", METHODS)
def test_latent(device, method):
    lat = {"samples": 3.0 * torch.randn(2, 4, 8, 6, generator=gen(1)) + 0.5, "other": 1}
    before = lat["samples"].clone()
    out = run(input=lat, method=method, num_groups=2, eps=1e-3, scale=0.5, shift=0.25, device=device)
    assert torch.equal(lat["samples"], before)
    assert isinstance(out, dict) and out["other"] == 1 and out["samples"] is not lat["samples"]
    close(out["samples"], ref(lat["samples"].double(), method, 2, 1e-3, 0.5, 0.25))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (6, 5, 7)])
def test_tensor(device, method, shape):
    t = torch.randn(*shape, generator=gen(2)) * 2.0 - 1.0
    before = t.clone()
    out = run(input={"tensor": t}, method=method, num_groups=3, eps=1e-5, scale=-2.0, device=device)
    assert torch.equal(t, before)
    assert isinstance(out, DeviceTensor) and tuple(out.shape) == shape
    x = t.double() if len(shape) == 4 else t.double()[None]
    close(out["tensor"], ref(x, method, 3, scale=-2.0).reshape(shape))


@pytest.mark.parametrize("method", ["instance", "layer", "rms", "batch"])
def test_mask(device, method):
    mask = torch.rand(2, 9, 11, generator=gen(3))
    out = run(input=mask, method=method, device=device)
    assert torch.is_tensor(out) and out.shape == mask.shape
    close(out, ref(mask[:, None].double(), method)[:, 0])


@pytest.mark.parametrize("method", ["layer", "batch"])
def test_video_latent_frames_are_samples(device, method):
    lat = {"samples": torch.randn(2, 4, 3, 6, 5, generator=gen(5))}  # [B, C, T, H, W]
    out = run(input=lat, method=method, device=device)
    frames = lat["samples"].double().permute(0, 2, 1, 3, 4).reshape(6, 4, 6, 5)
    want = ref(frames, method).reshape(2, 3, 4, 6, 5).permute(0, 2, 1, 3, 4)
    close(out["samples"], want)


def test_group_extremes_are_layer_and_instance(device):
    lat = {"samples": torch.randn(1, 4, 8, 8, generator=gen(4))}
    x = lat["samples"].double()
    close(run(input=lat, method="group", num_groups=1, device=device)["samples"], F.layer_norm(x, x.shape[1:]))
    close(run(input=lat, method="group", num_groups=4, device=device)["samples"], F.instance_norm(x))


def test_defaults_and_badge():
    out = N["AnyDeviceNormalize"]().run(input=image(), device={"name": "numpy"})
    info = out["ui"]["anydevice"][0]
    assert info["op"] == "instance_norm" and info["shape"] == [2, 12, 10, 3]
    close(out["result"][0], F.instance_norm(image().permute(0, 3, 1, 2).double()).permute(0, 2, 3, 1))
    assert out["result"][0].min() < 0  # a normalised image leaves 0..1, as the description says


@pytest.mark.parametrize("inp,kw,name,why", [
    (image(), dict(method="group", num_groups=2), "num_groups", "must divide the input's 3 channels"),
    ({"samples": torch.randn(1, 4, 4, 4)}, dict(method="group", num_groups=3), "num_groups", "4 channels"),
    (image(b=0), dict(method="layer"), "input", "empty batch"),
    (torch.zeros(2, 0, 5, 3), dict(method="instance"), "input", "empty"),
    (image(b=1, h=1, w=1, c=3), dict(method="batch"), "input", "more than 1 value per channel"),
    (image(), dict(method="power"), "method", "must be one of"),
    (image(), dict(method="layer", eps=-1.0), "eps", ">= 0"),
    ({"tensor": torch.zeros(5)}, dict(method="layer"), "input", "dims"),
])
def test_bad_inputs_named(inp, kw, name, why):
    with pytest.raises(NodeError) as info:
        N["AnyDeviceNormalize"]().run(input=inp, device={"name": "numpy"}, **kw)
    msg = str(info.value)
    assert info.value.arg == name, msg
    assert msg.startswith("Normalize (AnyDevice): input '" + name + "' = "), msg
    assert why in msg, msg
