"""The window nodes (nodes/compute/windows.py): Resize and Pool on IMAGE, MASK and LATENT values, values
checked against torch (float64), the input's type kept, inputs never written, bad widgets named."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice import backend as B
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.base.common import NodeError
from node_helpers import close

#: the backends the node tests run on (the op tests, test_windows.py, cover every variant)
DEVICES = [n for n in ("numpy", "opencl", "cpu") if n in {i.name for i in B.list_backends() if i.available}]


@pytest.fixture(params=DEVICES)
def device(request):
    return {"name": request.param}


def image(b=2, h=24, w=20, c=3, seed=0):
    return torch.rand(b, h, w, c, generator=torch.Generator().manual_seed(seed))


def run(cls, **kw):
    out = N[cls]().run(**kw)
    assert set(out) == {"ui", "result"}
    return out["result"][0]


def nchw(img):
    return img.permute(0, 3, 1, 2).double()


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest", "nearest-exact", "area"])
def test_resize_image_by_scale(device, mode):
    img = image()
    before = img.clone()
    out = run("AnyDeviceResize", input=img, mode=mode, target="scale_factor", scale_factor=1.5,
              align_corners=False, device=device)
    assert torch.equal(img, before)
    corners = False if mode in ("bilinear", "bicubic") else None
    ref = F.interpolate(nchw(img), scale_factor=1.5, mode=mode, align_corners=corners).permute(0, 2, 3, 1)
    assert out.shape == (2, 36, 30, 3)
    close(out, ref)


def test_resize_to_size_align_corners(device):
    img = image()
    out = run("AnyDeviceResize", input=img, mode="bilinear", target="size", width=7, height=41,
              align_corners=True, device=device)
    ref = F.interpolate(nchw(img), size=(41, 7), mode="bilinear", align_corners=True).permute(0, 2, 3, 1)
    close(out, ref)


def test_resize_mask_and_latent(device):
    mask = torch.rand(2, 10, 12, generator=torch.Generator().manual_seed(3))
    out = run("AnyDeviceResize", input=mask, mode="nearest", target="size", width=24, height=5, device=device)
    close(out, F.interpolate(mask[:, None].double(), size=(5, 24), mode="nearest")[:, 0])
    lat = {"samples": torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(4)), "other": 1}
    out = run("AnyDeviceResize", input=lat, mode="bicubic", target="scale_factor", scale_factor=2.0, device=device)
    assert out["other"] == 1
    close(out["samples"], F.interpolate(lat["samples"].double(), scale_factor=2.0, mode="bicubic"))


@pytest.mark.parametrize("pool,kw,fn", [
    ("max", dict(kernel_size=3, stride=2, padding=1), lambda x: F.max_pool2d(x, 3, 2, 1)),
    ("max", dict(kernel_size=2, stride=0, dilation=2, ceil_mode=True),
     lambda x: F.max_pool2d(x, 2, None, 0, 2, ceil_mode=True)),
    ("avg", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
     lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
    ("adaptive_max", dict(output_width=7, output_height=5), lambda x: F.adaptive_max_pool2d(x, (5, 7))),
    ("adaptive_avg", dict(output_width=7, output_height=5), lambda x: F.adaptive_avg_pool2d(x, (5, 7))),
])
def test_pool_image(device, pool, kw, fn):
    img = image()
    before = img.clone()
    out = run("AnyDevicePool", input=img, pool=pool, device=device, **kw)
    assert torch.equal(img, before)
    close(out, fn(nchw(img)).permute(0, 2, 3, 1))


def test_pool_latent_keeps_type(device):
    lat = {"samples": torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(5))}
    out = run("AnyDevicePool", input=lat, pool="avg", kernel_size=2, device=device)
    close(out["samples"], F.avg_pool2d(lat["samples"].double(), 2))


@pytest.mark.parametrize("cls,kw,name", [
    ("AnyDevicePool", dict(pool="max", kernel_size=3, padding=2), "padding"),
    ("AnyDevicePool", dict(pool="max", kernel_size=64), "kernel_size"),
    ("AnyDevicePool", dict(pool="median"), "pool"),
    ("AnyDeviceResize", dict(mode="trilinear"), "mode"),
    ("AnyDeviceResize", dict(mode="bilinear", target="scale_factor", scale_factor=0.01), "scale_factor"),
])
def test_bad_inputs_named(cls, kw, name):
    with pytest.raises(NodeError) as info:
        N[cls]().run(input=image(), device={"name": "numpy"}, **kw)
    assert info.value.arg == name, str(info.value)
    assert "(AnyDevice)" in str(info.value)
