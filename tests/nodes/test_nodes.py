"""Node contract tests, without ComfyUI: definitions, every preset against PyTorch, the same-type
rule, no input mutation, and every bad input named in the issue."""
from __future__ import annotations

import inspect
import math
import logging
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice import backend as B
from anydevice.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from anydevice.nodes.base import common
from anydevice.nodes.compute import ops as compute
from anydevice.nodes.tensors import nodes as helpers
from anydevice.nodes.compute import presets as P

N = NODE_CLASS_MAPPINGS
AVAILABLE = [i.name for i in B.list_backends() if i.available]
UNAVAILABLE = [i for i in B.list_backends() if not i.available]
ATOL = 2e-5


def run(cls_name, **kw):
    out = N[cls_name]().run(**kw)
    assert set(out) == {"ui", "result"}
    return out


def res(cls_name, **kw):
    return run(cls_name, **kw)["result"]


def dev(name):
    return {"name": name}


@pytest.fixture(params=AVAILABLE)
def device(request):
    return dev(request.param)


def image(b=1, h=24, w=20, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, h, w, c, generator=g)


# ---------------------------------------------------------------------------------------------
# definitions
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(N))
def test_node_definition(name):
    cls = N[name]
    assert name.startswith("AnyDevice")
    display = NODE_DISPLAY_NAME_MAPPINGS[name]
    assert display.endswith("(AnyDevice)") or display.endswith(" on AnyDevice"), display
    assert cls.CATEGORY.startswith("AnyDevice")
    assert isinstance(cls.DESCRIPTION, str) and len(cls.DESCRIPTION) > 20
    assert callable(getattr(cls, cls.FUNCTION))
    spec = cls.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"}
    for section in ("required", "optional"):
        for inp, entry in spec.get(section, {}).items():
            assert len(entry) == 2, (name, inp)
            assert entry[1].get("tooltip"), f"{name}.{inp} has no tooltip"
            if isinstance(entry[0], list):
                assert entry[1].get("default", entry[0][0]) in entry[0]
    assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS)
    if hasattr(cls, "VALIDATE_INPUTS"):
        import inspect
        params = inspect.getfullargspec(cls.VALIDATE_INPUTS).args
        allinputs = {**spec["required"], **spec.get("optional", {})}
        assert all(p in allinputs for p in params[1:]), params


def test_every_compute_node_takes_an_optional_device():
    for cls in compute.COMPUTE_NODES + [helpers.AnyDeviceTensorInfo]:
        assert cls.INPUT_TYPES()["optional"]["device"][0] == "DEVICE"


def test_any_type_passes_comfy_validation_rule():
    # ComfyUI: `if not received_type != input_type: ok`, else split on ',' and intersect
    assert not (common.ANY != "IMAGE") and not (common.ANY != "LATENT")
    assert "IMAGE" in common.DATA.split(",") and "TENSOR" in common.DATA.split(",")


def test_device_select_lists_auto_first_and_every_backend():
    names = N["AnyDeviceDeviceSelect"].INPUT_TYPES()["required"]["device"][0]
    status = N["AnyDeviceDeviceSelect"].INPUT_TYPES()["required"]["device"][1]["anydevice_status"]
    assert names[0] == "auto"
    for info in B.list_backends():
        assert info.name in names
        if not info.available:
            assert info.reason in status[info.name]


def test_load_log_line(caplog):
    import anydevice.nodes as pack_nodes
    pack_nodes._logged = False
    with caplog.at_level(logging.INFO, logger="anydevice"):
        pack_nodes.log_backend_choice()
        pack_nodes.log_backend_choice()
    lines = [r for r in caplog.records if r.name == "anydevice"]
    assert len(lines) == 1
    chosen = common.load_time_backend_name()
    assert f"using {chosen}" in lines[0].getMessage()
    for info in B.list_backends():
        assert info.name in lines[0].getMessage()


# ---------------------------------------------------------------------------------------------
# Conv2D
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", P.KERNEL_PRESETS)
def test_conv2d_presets_match_torch(preset, device):
    img = image()
    out = res("AnyDeviceConv2D", input=img, kernel_source="preset", preset=preset, kernel_size=5, sigma=1.3,
              device=device)[0]
    k = torch.from_numpy(P.kernel_preset(preset, 5, 1.3))
    kh, kw = k.shape
    x = img.permute(0, 3, 1, 2)
    xp = F.pad(x, ((kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2), mode="reflect")
    ref = F.conv2d(xp, k.expand(3, 1, kh, kw), groups=3).permute(0, 2, 3, 1)
    assert out.shape == img.shape
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


def test_conv2d_preset_values():
    assert P.kernel_preset("box_blur", 3).sum() == pytest.approx(1.0)
    g = P.kernel_preset("gaussian", 7, 2.0)
    assert g.sum() == pytest.approx(1.0) and g[3, 3] == g.max()
    assert P.kernel_preset("identity", 3)[1, 1] == 1 and P.kernel_preset("identity", 3).sum() == 1
    assert P.kernel_preset("laplacian").sum() == 0 and P.kernel_preset("sobel_x").sum() == 0
    np.testing.assert_array_equal(P.kernel_preset("sobel_y"), P.kernel_preset("sobel_x").T)


def test_conv2d_text_random_grouped_stride_dilation(device):
    img = image(b=2, h=17, w=19)
    x = img.permute(0, 3, 1, 2)
    # text kernel, valid padding, stride 2, dilation 2
    out = res("AnyDeviceConv2D", input=img, kernel_source="text", kernel_text="1 2; 3 4", padding="valid",
              stride=2, dilation=2, device=device)[0]
    k = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    ref = F.conv2d(x, k.expand(3, 1, 2, 2), stride=2, dilation=2, groups=3).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    # seeded random, grouped 3 -> 6 channels, explicit zero padding, bias
    out = res("AnyDeviceConv2D", input=img, kernel_source="random", kernel_size=3, init_seed=7, channel_mode="grouped",
              out_channels=6, groups=3, padding="explicit", padding_size=2, padding_mode="zeros", bias=0.5,
              device=device)[0]
    w = torch.from_numpy(P.seeded_uniform(7, (6, 1, 3, 3), 9))
    ref = F.conv2d(x, w, torch.full((6,), 0.5), padding=2, groups=3).permute(0, 2, 3, 1)
    assert out.shape == (2, 19, 21, 6)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    # same seed, same output
    again = res("AnyDeviceConv2D", input=img, kernel_source="random", kernel_size=3, init_seed=7, channel_mode="grouped",
                out_channels=6, groups=3, padding="explicit", padding_size=2, padding_mode="zeros", bias=0.5,
                device=device)[0]
    assert torch.equal(out, again)


@pytest.mark.parametrize("mode", ["reflect", "zeros", "replicate", "circular"])
def test_conv2d_padding_modes(mode, device):
    img = image(h=9, w=11)
    out = res("AnyDeviceConv2D", input=img, kernel_source="preset", preset="sharpen", padding_mode=mode,
              device=device)[0]
    x = img.permute(0, 3, 1, 2)
    k = torch.from_numpy(P.kernel_preset("sharpen")).expand(3, 1, 3, 3)
    ref = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="constant" if mode == "zeros" else mode), k, groups=3)
    torch.testing.assert_close(out, ref.permute(0, 2, 3, 1), atol=1e-4, rtol=1e-4)


def test_conv2d_transposed(device):
    t = {"tensor": torch.randn(1, 2, 5, 6, generator=torch.Generator().manual_seed(1))}
    out = res("AnyDeviceConv2D", input=t, kernel_source="random", kernel_size=3, init_seed=3, channel_mode="grouped",
              out_channels=4, groups=1, stride=2, padding="explicit", padding_size=1, transposed=True,
              output_padding=1, device=device)[0]
    w = torch.from_numpy(P.seeded_uniform(3, (2, 4, 3, 3), 4 * 9))
    ref = F.conv_transpose2d(t["tensor"], w, stride=2, padding=1, output_padding=1)
    assert out["tensor"].shape == ref.shape == (1, 4, 10, 12)
    torch.testing.assert_close(out["tensor"], ref, atol=1e-4, rtol=1e-4)


def test_conv2d_weights_input_and_ui_kernel(device):
    wts = res("AnyDeviceWeights", source="random", shape="4, 3, 3, 3", init_seed=5, bias="random")[0]
    img = image()
    r = run("AnyDeviceConv2D", input=img, kernel_source="weights", channel_mode="grouped", groups=1,
            padding="same", padding_mode="zeros", weights=wts, device=device)
    out = r["result"][0]
    ref = F.conv2d(img.permute(0, 3, 1, 2), wts["weight"], wts["bias"], padding=1).permute(0, 2, 3, 1)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    kern = r["ui"]["kernel"][0]
    assert kern["shape"] == [4, 3, 3, 3] and len(kern["slices"]) == 8
    assert kern["slices"][0]["rows"] == 3 and len(kern["slices"][0]["values"]) == 9
    assert r["ui"]["anydevice"][0]["backend"] == device["name"]


# ---------------------------------------------------------------------------------------------
# Linear
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", P.LINEAR_PRESETS)
def test_linear_presets_match_torch(preset, device):
    img = image()
    out = res("AnyDeviceLinear", input=img, source="preset", preset=preset, device=device)[0]
    w, b = P.color_preset(preset, 3)
    ref = F.linear(img, torch.from_numpy(w), None if b is None else torch.from_numpy(b))
    assert out.shape == img.shape
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-5)


def test_linear_sources(device):
    t = {"tensor": torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(2))}
    out = res("AnyDeviceLinear", input=t, source="random", out_features=6, init_seed=9, bias="0.5", device=device)[0]
    w = torch.from_numpy(P.seeded_uniform(9, (6, 4), 4))
    torch.testing.assert_close(out["tensor"], F.linear(t["tensor"], w) + 0.5, atol=ATOL, rtol=1e-5)
    out = res("AnyDeviceLinear", input=t, source="text", matrix="1 0 0 0\n0 0 0 2", bias="1 2", device=device)[0]
    ref = torch.stack([t["tensor"][..., 0] + 1, 2 * t["tensor"][..., 3] + 2], -1)
    torch.testing.assert_close(out["tensor"], ref, atol=ATOL, rtol=1e-5)
    wts = res("AnyDeviceWeights", source="text", matrix="1 2 3 4; 5 6 7 8", bias="0.1 0.2")[0]
    out = res("AnyDeviceLinear", input=t, source="weights", weights=wts, device=device)[0]
    torch.testing.assert_close(out["tensor"], F.linear(t["tensor"], wts["weight"], wts["bias"]), atol=1e-4,
                               rtol=1e-5)


def test_linear_on_latent_acts_on_channels(device):
    lat = {"samples": torch.randn(1, 4, 6, 5), "batch_index": [0], "noise_mask": None}
    out = res("AnyDeviceLinear", input=lat, source="random", out_features=4, init_seed=1, device=device)[0]
    w = torch.from_numpy(P.seeded_uniform(1, (4, 4), 4))
    ref = torch.einsum("oc,bchw->bohw", w, lat["samples"])
    torch.testing.assert_close(out["samples"], ref, atol=1e-5, rtol=1e-5)
    assert out["batch_index"] == [0] and "noise_mask" in out


# ---------------------------------------------------------------------------------------------
# Activation, Loss, TensorOps
# ---------------------------------------------------------------------------------------------
TORCH_ACT = {
    "relu": lambda x: F.relu(x), "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "elu": lambda x: F.elu(x, 0.7),
    "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "softplus": lambda x: F.softplus(x, 2.0, 5.0), "softmax": lambda x: torch.softmax(x, 1),
}


@pytest.mark.parametrize("act", B.ACTIVATIONS)
def test_activation_matches_torch(act, device):
    t = {"tensor": torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(4)) * 3}
    out = res("AnyDeviceActivation", input=t, activation=act, negative_slope=0.2, alpha=0.7, approximate="tanh",
              beta=2.0, threshold=5.0, dim=1, device=device)[0]
    torch.testing.assert_close(out["tensor"], TORCH_ACT[act](t["tensor"]), atol=1e-5, rtol=1e-4)


def _ssim_ref(x, y, win=11, sigma=1.5, dr=1.0):
    g = torch.from_numpy(B.ops.contract.gaussian_window(win, sigma).astype(np.float32))
    c = x.shape[1]
    wv, wh = g.view(1, 1, -1, 1).expand(c, 1, win, 1), g.view(1, 1, 1, -1).expand(c, 1, 1, win)
    blur = lambda t: F.conv2d(F.conv2d(t, wv, groups=c), wh, groups=c)  # noqa: E731
    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    c1, c2 = (0.01 * dr) ** 2, (0.03 * dr) ** 2
    return (((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))).mean()


@pytest.mark.parametrize("loss", compute.LOSS_NAMES)
def test_loss_matches_torch(loss, device):
    a, b = image(seed=1), image(seed=2)
    r = run("AnyDeviceLoss", prediction=a, target=b, loss=loss, delta=0.3, device=device)
    value, emap = r["result"]
    pa, pb = a.permute(0, 3, 1, 2), b.permute(0, 3, 1, 2)
    ref = {"mse": lambda: F.mse_loss(a, b), "l1": lambda: F.l1_loss(a, b),
           "huber": lambda: F.huber_loss(a, b, delta=0.3), "smooth_l1": lambda: F.smooth_l1_loss(a, b, beta=0.3),
           "bce": lambda: F.binary_cross_entropy(a, b), "psnr": lambda: 10 * torch.log10(1 / F.mse_loss(a, b)),
           "ssim": lambda: _ssim_ref(pa, pb)}[loss]()
    assert isinstance(value, float)
    assert value == pytest.approx(float(ref), rel=1e-4, abs=1e-5)
    assert r["ui"]["loss"][0]["value"] == value and r["ui"]["loss"][0]["name"] == loss
    assert emap.shape == a.shape and float(emap.max()) == pytest.approx(1.0)
    d = (a - b).abs()
    torch.testing.assert_close(emap, d / d.max(), atol=1e-5, rtol=1e-4)
    assert N["AnyDeviceLoss"].OUTPUT_NODE is True


def test_loss_identical_is_zero_and_psnr_inf_free(device):
    a = image()
    v = res("AnyDeviceLoss", prediction=a, target=a.clone(), loss="mse", device=device)[0]
    assert v == 0.0
    v = res("AnyDeviceLoss", prediction=a, target=a.clone(), loss="ssim", device=device)[0]
    assert v == pytest.approx(1.0, abs=1e-5)


BIN_REF = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
           "min": torch.minimum, "max": torch.maximum}


@pytest.mark.parametrize("op", list(BIN_REF))
def test_tensorops_binary_broadcast(op, device):
    a = {"tensor": torch.rand(2, 3, 4) + 0.5}
    b = {"tensor": torch.rand(3, 1) + 0.5}
    out = res("AnyDeviceTensorOps", a=a, op=op, b=b, device=device)[0]
    torch.testing.assert_close(out["tensor"], BIN_REF[op](a["tensor"], b["tensor"]), atol=1e-5, rtol=1e-5)
    out = res("AnyDeviceTensorOps", a=a, op=op, scalar=1.5, device=device)[0]
    torch.testing.assert_close(out["tensor"], BIN_REF[op](a["tensor"], torch.tensor(1.5)), atol=1e-5, rtol=1e-5)


def test_tensorops_matmul_unary_reduce(device):
    a, b = {"tensor": torch.randn(2, 3, 4)}, {"tensor": torch.randn(4, 5)}
    out = res("AnyDeviceTensorOps", a=a, op="matmul", b=b, device=device)[0]
    torch.testing.assert_close(out["tensor"], a["tensor"] @ b["tensor"], atol=1e-5, rtol=1e-5)
    x = {"tensor": torch.rand(2, 3, 4) + 0.1}
    for op, ref in {"abs": torch.abs, "neg": torch.neg, "sqrt": torch.sqrt, "exp": torch.exp,
                    "log": torch.log}.items():
        out = res("AnyDeviceTensorOps", a=x, op=op, device=device)[0]
        torch.testing.assert_close(out["tensor"], ref(x["tensor"]), atol=1e-5, rtol=1e-5)
    out = res("AnyDeviceTensorOps", a=x, op="clamp", clamp_min=0.3, clamp_max=0.6, device=device)[0]
    torch.testing.assert_close(out["tensor"], x["tensor"].clamp(0.3, 0.6))
    out = res("AnyDeviceTensorOps", a=x, op="normalize", device=device)[0]["tensor"]
    assert float(out.min()) == pytest.approx(0) and float(out.max()) == pytest.approx(1)
    for op, ref in {"reduce_sum": torch.sum, "reduce_mean": torch.mean, "reduce_max": torch.amax,
                    "reduce_min": torch.amin}.items():
        out = res("AnyDeviceTensorOps", a=x, op=op, dims="1, 2", keepdim=False, device=device)[0]
        torch.testing.assert_close(out["tensor"], ref(x["tensor"], dim=(1, 2)), atol=1e-5, rtol=1e-5)
        out = res("AnyDeviceTensorOps", a=x, op=op, dims="", keepdim=False, device=device)[0]
        assert out["tensor"].shape == ()


def test_tensorops_image_times_mask(device):
    img, mask = image(), torch.rand(1, 24, 20)
    out = res("AnyDeviceTensorOps", a=img, op="mul", b=mask, device=device)[0]
    assert out.shape == img.shape
    torch.testing.assert_close(out, img * mask.unsqueeze(-1))
    # mean over channels keeps an IMAGE (4-D); a full reduction gives a TENSOR
    out = res("AnyDeviceTensorOps", a=img, op="reduce_mean", dims="-1", keepdim=True, device=device)[0]
    assert torch.is_tensor(out) and out.shape == (1, 24, 20, 1)
    out = res("AnyDeviceTensorOps", a=img, op="reduce_mean", device=device, keepdim=False)[0]
    assert isinstance(out, dict) and out["tensor"].shape == ()


# ---------------------------------------------------------------------------------------------
# helpers and converters
# ---------------------------------------------------------------------------------------------
def test_tensor_source_modes():
    a = res("AnyDeviceTensorSource", mode="random_normal", shape="2, 3", seed=4)[0]["tensor"]
    b = res("AnyDeviceTensorSource", mode="random_normal", shape="2, 3", seed=4)[0]["tensor"]
    assert a.shape == (2, 3) and torch.equal(a, b)
    u = res("AnyDeviceTensorSource", mode="random_uniform", shape="1000", seed=1)[0]["tensor"]
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert torch.equal(res("AnyDeviceTensorSource", mode="zeros", shape="2,2")[0]["tensor"], torch.zeros(2, 2))
    assert torch.equal(res("AnyDeviceTensorSource", mode="ones", shape="3")[0]["tensor"], torch.ones(3))
    t = res("AnyDeviceTensorSource", mode="text", text="1 2 3\n4 5 6")[0]["tensor"]
    assert torch.equal(t, torch.tensor([[1.0, 2, 3], [4, 5, 6]]))
    img = image()
    t = res("AnyDeviceTensorSource", mode="image", image=img)[0]["tensor"]
    assert torch.equal(t, img.permute(0, 3, 1, 2))


def test_tensor_info(device):
    x = {"tensor": torch.tensor([[1.0, -2.0], [3.0, 4.0]])}
    r = run("AnyDeviceTensorInfo", input=x, device=device)
    info = r["ui"]["info"][0]
    assert info["shape"] == [2, 2] and info["min"] == -2 and info["max"] == 4 and info["mean"] == 1.5
    assert info["kind"] == "TENSOR" and info["dtype"] == "float32" and info["backend"] == device["name"]
    assert r["result"][0] is x and "min=-2" in r["result"][1]
    assert N["AnyDeviceTensorInfo"].OUTPUT_NODE is True


def test_converters_round_trip():
    img = image(b=2)
    t = res("AnyDeviceImageToTensor", image=img, layout="NCHW")[0]
    assert t["tensor"].shape == (2, 3, 24, 20)
    back = res("AnyDeviceTensorToImage", tensor=t, mode="auto", normalize=False, layout="NCHW")[0]
    assert torch.equal(back, img)
    mask = torch.rand(2, 8, 9)
    mt = res("AnyDeviceMaskToTensor", mask=mask, layout="NCHW")[0]
    assert mt["tensor"].shape == (2, 1, 8, 9)
    assert torch.equal(res("AnyDeviceTensorToMask", tensor=mt, channel=0)[0], mask)
    grey = res("AnyDeviceTensorToImage", tensor=mt, mode="auto", normalize=False, layout="NCHW")[0]
    assert grey.shape == (2, 8, 9, 3) and torch.equal(grey[..., 1], mask)
    lat = {"samples": torch.randn(1, 4, 8, 8)}
    lt = res("AnyDeviceLatentToTensor", latent=lat)[0]
    assert torch.equal(res("AnyDeviceTensorToLatent", tensor=lt)[0]["samples"], lat["samples"])


def test_tensor_to_image_feature_grid():
    t = {"tensor": torch.arange(2 * 5 * 3 * 4, dtype=torch.float32).reshape(2, 5, 3, 4)}
    out = res("AnyDeviceTensorToImage", tensor=t, mode="auto", normalize=True, layout="NCHW")[0]
    assert out.shape == (2, 2 * 3, 3 * 4, 3)  # 5 maps in a 2x3 grid
    assert float(out.max()) == pytest.approx(1.0) and float(out.min()) == 0.0
    # each map normalised on its own: the first map's top-left is 0, bottom-right 1
    assert float(out[0, 0, 0, 0]) == 0 and float(out[0, 2, 3, 0]) == pytest.approx(1.0)
    out = res("AnyDeviceTensorToImage", tensor=t, mode="channels_as_batch", normalize=False, layout="NCHW")[0]
    assert out.shape == (10, 3, 4, 3)


# ---------------------------------------------------------------------------------------------
# same-type rule and no input mutation, every generic node, every kind
# ---------------------------------------------------------------------------------------------
def _inputs_of_every_kind():
    g = torch.Generator().manual_seed(0)
    return {
        "IMAGE": torch.rand(1, 12, 10, 3, generator=g),
        "MASK": torch.rand(2, 12, 10, generator=g),
        "LATENT": {"samples": torch.randn(1, 4, 12, 10, generator=g), "batch_index": [3]},
        "TENSOR": {"tensor": torch.rand(2, 3, 12, 10, generator=g)},
    }


GENERIC = {
    "AnyDeviceConv2D": lambda x: dict(input=x, kernel_source="preset", preset="box_blur", kernel_size=3),
    "AnyDeviceLinear": lambda x: dict(input=x, source="preset", preset="identity"),
    "AnyDeviceActivation": lambda x: dict(input=x, activation="sigmoid"),
    "AnyDeviceTensorOps": lambda x: dict(a=x, op="mul", scalar=2.0),
    "AnyDeviceTensorInfo": lambda x: dict(input=x),
}


def _check_same_kind(kind, inp, out):
    assert common.kind_of(out, "t", "out") == kind
    if kind == "LATENT":
        assert out["batch_index"] == inp["batch_index"] and out["samples"].shape == inp["samples"].shape
    elif kind == "TENSOR":
        assert out["tensor"].shape == inp["tensor"].shape
    else:
        assert out.shape == inp.shape
    t = common.raw(out, kind)
    assert t.device.type == "cpu" and t.dtype == torch.float32


def _snapshot(v):
    if isinstance(v, dict):
        return {k: (x.clone() if torch.is_tensor(x) else x) for k, x in v.items()}
    return v.clone()


def _same(a, b):
    if isinstance(a, dict):
        return all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
    return torch.equal(a, b)


@pytest.mark.parametrize("node", sorted(GENERIC))
@pytest.mark.parametrize("kind", ["IMAGE", "MASK", "LATENT", "TENSOR"])
def test_same_type_and_no_mutation(node, kind, device):
    inp = _inputs_of_every_kind()[kind]
    before = _snapshot(inp)
    out = res(node, device=device, **GENERIC[node](inp))[0]
    _check_same_kind(kind, inp, out)
    assert _same(inp, before), f"{node} wrote into its {kind} input"
    if node != "AnyDeviceTensorInfo":  # (Tensor Info passes its input through by design)
        common.raw(out, kind).add_(1.0)  # a consumer writing into the output must not reach the input
        assert _same(inp, before), f"{node}'s {kind} output shares memory with its input"
    # a second run on the cached input gives the same numbers (ComfyUI reuses outputs across runs)
    out = res(node, device=device, **GENERIC[node](inp))[0]
    out2 = res(node, device=device, **GENERIC[node](inp))[0]
    assert _same(common.raw(out, kind) if kind != "LATENT" else out["samples"],
                 common.raw(out2, kind) if kind != "LATENT" else out2["samples"])


def test_no_mutation_two_input_nodes(device):
    data = _inputs_of_every_kind()
    a, b = data["IMAGE"], data["IMAGE"] * 0.5
    snap = (a.clone(), b.clone())
    res("AnyDeviceLoss", prediction=a, target=b, loss="ssim", window_size=3, device=device)
    res("AnyDeviceTensorOps", a=a, op="sub", b=b, device=device)
    res("AnyDeviceTensorOps", a=a, op="normalize", device=device)
    wts = res("AnyDeviceWeights", source="random", shape="3, 3", init_seed=0)[0]
    wsnap = wts["weight"].clone()
    res("AnyDeviceLinear", input=a, source="weights", weights=wts, device=device)
    res("AnyDeviceConv2D", input=a, kernel_source="weights", weights=res(
        "AnyDeviceWeights", source="random", shape="3, 3", init_seed=1)[0], device=device)
    t = data["TENSOR"]
    tsnap = t["tensor"].clone()
    for node, kw in [("AnyDeviceTensorToImage", dict(tensor=t, mode="auto", normalize=True)),
                     ("AnyDeviceTensorToMask", dict(tensor=t, channel=1)),
                     ("AnyDeviceTensorToLatent", dict(tensor=t))]:
        out = res(node, **kw)[0]
        common.raw(out, common.kind_of(out, "t", "o")).add_(1.0)  # a consumer writing into the output
    assert torch.equal(t["tensor"], tsnap)
    for shape, node, kw in [((1, 3, 5, 4), "AnyDeviceTensorToMask", dict(channel=0)), ((5, 4), "AnyDeviceTensorToMask", {}),
                            ((1, 3, 5, 4), "AnyDeviceTensorToImage", dict(mode="auto", normalize=False)),
                            ((2, 3, 4), "AnyDeviceTensorToLatent", {})]:
        src = {"tensor": torch.rand(shape)}
        before = src["tensor"].clone()
        out = res(node, tensor=src, **kw)[0]
        common.raw(out, common.kind_of(out, "t", "o")).add_(1.0)
        assert torch.equal(src["tensor"], before), (node, shape)
    img = image()
    snap_img = img.clone()
    out = res("AnyDeviceImageToTensor", image=img, layout="NHWC")[0]
    out["tensor"].add_(1.0)
    out = res("AnyDeviceTensorSource", mode="image", image=img)[0]
    out["tensor"].add_(1.0)
    assert torch.equal(img, snap_img)
    assert torch.equal(a, snap[0]) and torch.equal(b, snap[1]) and torch.equal(wts["weight"], wsnap)


def test_progress_bar_used_when_comfy_present(monkeypatch):
    calls = []

    class PB:
        def __init__(self, total, node_id=None):
            calls.append(("init", total))

        def update(self, n):
            calls.append(("update", n))

    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = PB
    comfy.utils = utils
    monkeypatch.setitem(sys.modules, "comfy", comfy)
    monkeypatch.setitem(sys.modules, "comfy.utils", utils)
    res("AnyDeviceConv2D", input=image(b=3))
    assert calls[0] == ("init", 3) and calls.count(("update", 1)) == 3


# ---------------------------------------------------------------------------------------------
# bad input: VALIDATE_INPUTS (widget values) and execution errors, each naming node, input, value
# ---------------------------------------------------------------------------------------------
def _comfy_widget_checks(cls, values: dict) -> str | bool:
    """ComfyUI's own checks of widget values against INPUT_TYPES (type, min, max, combo), imitated
    with messages that name node, input and value."""
    spec = {}
    for section in ("required", "optional"):
        spec.update(cls.INPUT_TYPES().get(section, {}))
    node = cls.DISPLAY
    for name, val in values.items():
        if val is None or name not in spec:  # linked inputs arrive as None
            continue
        typ, opts = spec[name][0], (spec[name][1] if len(spec[name]) > 1 else {})
        if isinstance(typ, (list, tuple)):
            if val not in typ:
                return f"{node}: input '{name}' = {val!r}: must be one of {', '.join(map(str, typ))}"
            continue
        if typ in ("INT", "FLOAT"):
            if isinstance(val, bool) or not isinstance(val, (int, float)):
                return f"{node}: input '{name}' = {val!r}: must be a number"
            if typ == "INT" and float(val) != int(val):
                return f"{node}: input '{name}' = {val!r}: must be an integer"
            if not math.isfinite(float(val)):
                return f"{node}: input '{name}' = {val!r}: must be a finite number"
            if "min" in opts and val < opts["min"]:
                return f"{node}: input '{name}' = {val!r}: must be >= {opts['min']}"
            if "max" in opts and val > opts["max"]:
                return f"{node}: input '{name}' = {val!r}: must be <= {opts['max']}"
    return True


def _validate(cls_name, **kw):
    """What validation says about these widget values before anything runs, as in ComfyUI: the checks
    against INPUT_TYPES (min, max, combo: _comfy_widget_checks) for the widgets VALIDATE_INPUTS does
    not take, then VALIDATE_INPUTS with only those it takes."""
    cls = N[cls_name]
    takes = inspect.getfullargspec(cls.VALIDATE_INPUTS).args[1:] if hasattr(cls, "VALIDATE_INPUTS") else []
    r = _comfy_widget_checks(cls, {k: v for k, v in kw.items() if k not in takes})
    if r is True and takes:
        r = cls.VALIDATE_INPUTS(**{k: v for k, v in kw.items() if k in takes})
    return r


def _msg(cls_name, **kw):
    r = _validate(cls_name, **kw)
    assert isinstance(r, str), f"{cls_name} accepted {kw}"
    assert r.startswith(N[cls_name].DISPLAY + ": input '")
    return r


def _err(cls_name, **kw) -> str:
    """The message of the error running the node with these inputs raises."""
    with pytest.raises(common.NodeError) as e:
        res(cls_name, **kw)
    assert str(e.value).startswith(N[cls_name].DISPLAY + ": input '")
    return str(e.value)


@pytest.mark.parametrize("text,why", [("1 2 3\n4 5", "ragged"), ("1 2\n3 x", "'x'"), ("", "empty"),
                                      ("1 nan", "finite")])
def test_bad_matrix_text(text, why):
    # refused when the prompt is queued where the source parses the text, and (through the Python
    # API, past validation) when the node runs, with the same message
    m = _err("AnyDeviceConv2D", input=image(), kernel_source="text", kernel_text=text)
    assert "kernel_text" in m and why in m
    assert _msg("AnyDeviceConv2D", kernel_source="text", kernel_text=text) == m
    m = _err("AnyDeviceLinear", input=image(), source="text", matrix=text)
    assert "'matrix'" in m and why in m
    assert _msg("AnyDeviceLinear", source="text", matrix=text) == m
    assert _validate("AnyDeviceConv2D", kernel_source="preset", kernel_text=text) is True
    assert _validate("AnyDeviceLinear", source="preset", matrix=text) is True
    with pytest.raises(common.NodeError, match="Conv2D \\(AnyDevice\\): input 'kernel_text'"):
        res("AnyDeviceConv2D", input=image(), kernel_source="text", kernel_text=text)


def test_bad_widgets_through_the_api():
    m = _msg("AnyDeviceConv2D", stride=0)
    assert "'stride' = 0" in m and ">= 1" in m
    m = _msg("AnyDeviceConv2D", padding_size=-1)
    assert "'padding_size' = -1" in m
    m = _msg("AnyDeviceConv2D", dilation=0)
    assert "'dilation' = 0" in m
    # rules between widgets are checked at run time, naming the one widget at fault
    m = _err("AnyDeviceConv2D", input=image(), transposed=True, stride=1, dilation=1, output_padding=1)
    assert "output_padding" in m
    assert "'window_size' = 4" in _err("AnyDeviceLoss", prediction=image(), target=image(), loss="ssim",
                                       window_size=4)
    assert "'dims'" in _msg("AnyDeviceTensorOps", dims="1, a")
    assert "'shape'" in _err("AnyDeviceTensorSource", mode="zeros", shape="2, -1")
    assert "'shape'" in _err("AnyDeviceTensorSource", mode="zeros", shape="100000, 100000, 100")
    assert "'source' = 'nope'" in _msg("AnyDeviceLinear", source="nope")
    assert _validate("AnyDeviceConv2D", stride=None, padding_size=None) is True  # linked inputs
    assert _validate("AnyDeviceConv2D", stride=2, padding_size=3, kernel_source="text", kernel_text="1 2;3 4") is True
    # and at execution time too (a runner that skips validation)
    with pytest.raises(common.NodeError, match="input 'stride' = 0"):
        res("AnyDeviceConv2D", input=image(), stride=0)
    with pytest.raises(common.NodeError, match="input 'padding_size' = -2"):
        res("AnyDeviceConv2D", input=image(), padding="explicit", padding_size=-2)


def test_channel_mismatch_between_tensor_and_weights():
    wts = res("AnyDeviceWeights", source="random", shape="4, 5", init_seed=0)[0]
    with pytest.raises(common.NodeError) as e:
        res("AnyDeviceLinear", input=image(), source="weights", weights=wts)
    assert "Linear (AnyDevice): input 'weights'" in str(e.value) and "expects 5" in str(e.value)
    assert "has 3" in str(e.value)
    wts = res("AnyDeviceWeights", source="random", shape="8, 4, 3, 3", init_seed=0)[0]
    with pytest.raises(common.NodeError, match=r"Conv2D \(AnyDevice\): input 'weights'.*expects 4 input channels"):
        res("AnyDeviceConv2D", input=image(), kernel_source="weights", channel_mode="grouped", weights=wts)
    with pytest.raises(common.NodeError, match=r"input 'preset' .*expects 3 input channels.*has 4"):
        res("AnyDeviceLinear", input={"samples": torch.zeros(1, 4, 8, 8)}, source="preset", preset="sepia")
    with pytest.raises(common.NodeError, match=r"input 'groups' = 2: must divide the input's 3 channels"):
        res("AnyDeviceConv2D", input=image(), kernel_source="random", channel_mode="grouped", groups=2,
            out_channels=4)
    with pytest.raises(common.NodeError, match="input 'weights' = None"):
        res("AnyDeviceLinear", input=image(), source="weights")


def test_loss_shapes_that_do_not_broadcast():
    with pytest.raises(common.NodeError) as e:
        res("AnyDeviceLoss", prediction=image(h=24, w=20), target=image(h=16, w=16), loss="mse")
    m = str(e.value)
    assert m.startswith("Loss (AnyDevice): input 'target'") and "(1, 16, 16, 3)" in m and "(1, 24, 20, 3)" in m
    with pytest.raises(common.NodeError, match="input 'target'.*same shape"):
        res("AnyDeviceLoss", prediction=image(), target=image(b=2), loss="psnr")
    with pytest.raises(common.NodeError, match="input 'b'.*does not broadcast"):
        res("AnyDeviceTensorOps", a={"tensor": torch.ones(3, 4)}, op="add", b={"tensor": torch.ones(5)})
    with pytest.raises(common.NodeError, match=r"Tensor Ops \(AnyDevice\): .*matmul"):
        res("AnyDeviceTensorOps", a={"tensor": torch.ones(3, 4)}, op="matmul", b={"tensor": torch.ones(5, 2)})


@pytest.mark.skipif(not UNAVAILABLE, reason="every backend is available on this machine")
def test_unavailable_device():
    bad = UNAVAILABLE[0]
    m = _msg("AnyDeviceDeviceSelect", device=bad.name)
    assert f"'device' = '{bad.name}'" in m and "unavailable" in m and bad.reason in m
    with pytest.raises(common.NodeError, match=f"Conv2D \\(AnyDevice\\): input 'device' = '{bad.name}'"):
        res("AnyDeviceConv2D", input=image(), device=dev(bad.name))
    with pytest.raises(common.NodeError, match="unavailable"):
        res("AnyDeviceDeviceSelect", device=bad.name)


def test_unknown_device_and_auto():
    assert "unknown backend" in _msg("AnyDeviceDeviceSelect", device="quantum")
    assert _validate("AnyDeviceDeviceSelect", device="auto") is True
    d = res("AnyDeviceDeviceSelect", device="auto")[0]
    out = run("AnyDeviceConv2D", input=image(), device=d)
    assert out["ui"]["anydevice"][0]["backend"] == common.load_time_backend_name().split(":")[0]


def test_huge_kernel_on_tiny_image():
    tiny = image(h=6, w=6)
    with pytest.raises(common.NodeError) as e:
        res("AnyDeviceConv2D", input=tiny, kernel_source="preset", preset="gaussian", kernel_size=31)
    m = str(e.value)
    assert m.startswith("Conv2D (AnyDevice): input 'kernel_size' = 31") and "6x6" in m
    with pytest.raises(common.NodeError, match="input 'kernel_size' = 31.*larger than"):
        res("AnyDeviceConv2D", input=tiny, preset="box_blur", kernel_size=31, padding="valid")
    with pytest.raises(common.NodeError, match="input 'window_size' = 11"):
        res("AnyDeviceLoss", prediction=tiny, target=tiny, loss="ssim")


def test_backend_errors_are_prefixed_with_the_node():
    with pytest.raises(B.AnyDeviceError) as e:
        res("AnyDeviceActivation", input=image(), activation="softmax", dim=5)
    assert str(e.value).startswith("Activation (AnyDevice): input 'dim' = 5")
    with pytest.raises(B.AnyDeviceError) as e:
        res("AnyDeviceLoss", prediction=image() * 3, target=image(), loss="bce")
    # names the node's input (was "Loss (AnyDevice): binary_cross_entropy: argument 'input' = (min, max)")
    assert str(e.value).startswith("Loss (AnyDevice): input 'prediction' = 'IMAGE of shape (1, 24, 20, 3)'")
    assert "between 0 and 1 (found min" in str(e.value)


# ---------------------------------------------------------------------------------------------
# edge cases found in review
def test_conv2d_empty_batch_is_a_clear_error():
    with pytest.raises(B.AnyDeviceError, match=r"Conv2D \(AnyDevice\).*'input'.*empty batch"):
        N["AnyDeviceConv2D"]().run(input=torch.rand(0, 8, 8, 3), device=dev("numpy"))


def test_tensor_to_image_nhwc_never_returns_the_input():
    src = {"tensor": torch.rand(2, 5, 6, 3)}
    keep = src["tensor"].clone()
    out = res("AnyDeviceTensorToImage", tensor=src, layout="NHWC")[0]
    assert out.untyped_storage().data_ptr() != src["tensor"].untyped_storage().data_ptr()
    out.add_(1.0)
    assert torch.equal(src["tensor"], keep)


@pytest.mark.parametrize("k", [3, 4])
def test_transposed_same_keeps_the_size(k):
    out = res("AnyDeviceConv2D", input=image(1, 8, 8), preset="box_blur", kernel_size=k, padding="same",
              transposed=True, device=dev("numpy"))[0]
    assert tuple(out.shape) == (1, 8, 8, 3)


def test_loss_on_empty_and_0d_inputs():
    r = res("AnyDeviceLoss", prediction={"tensor": torch.zeros(0, 3)}, target={"tensor": torch.zeros(0, 3)},
            loss="mse", device=dev("numpy"))
    assert np.isnan(r[0])
    r = res("AnyDeviceActivation", input={"tensor": torch.tensor(2.0)}, activation="softmax", dim=0,
            device=dev("numpy"))
    assert float(r[0]["tensor"]) == 1.0


# ---------------------------------------------------------------------------------------------
# every rule once: the node's error is the backend's rule, restated with the node's widget names
# ---------------------------------------------------------------------------------------------
RULES = [
    # (node, inputs, backend op and argument at fault, the node's message starts with, and contains)
    ("AnyDeviceConv2D", dict(input=image(h=6, w=6), preset="gaussian", kernel_size=31),  # reflect limit
     ("conv2d", "padding"), "input 'kernel_size' = 31: ", "reflect padding of 15 needs an input larger than 6x6"),
    ("AnyDeviceConv2D", dict(input=image(h=6, w=6), preset="sharpen", padding="explicit", padding_size=6),
     ("conv2d", "padding"), "input 'padding_size' = 6: ", "reflect padding of 6"),
    ("AnyDeviceConv2D", dict(input=image(h=6, w=6), preset="box_blur", kernel_size=9, padding="valid"),  # kernel > input
     ("conv2d", "weight"), "input 'kernel_size' = 9: ", "larger than the padded input 6x6"),
    ("AnyDeviceConv2D", dict(input=image(h=6, w=6), kernel_source="text", kernel_text="1 2 3 4 5 6 7", padding="valid"),
     ("conv2d", "weight"), "input 'kernel_text' = '1 2 3 4 5 6 7': ", "larger than the padded input"),
    ("AnyDeviceConv2D", dict(input=image(h=6, w=6), preset="box_blur", kernel_size=2, padding_mode="reflect",
                             dilation=11),  # 'same' with an even kernel: padded (5 and 6) before the conv
     ("pad", "pad"), "input 'kernel_size' = 2: ", "reflect padding of 6 needs an input larger than 6x6"),
    ("AnyDeviceConv2D", dict(input=image(), kernel_source="random", channel_mode="grouped", groups=2, out_channels=4),
     ("conv2d", "groups"), "input 'groups' = 2: ", "must divide the input's 3 channels"),
    ("AnyDeviceConv2D", dict(input=image(), kernel_source="random", channel_mode="grouped", groups=3, out_channels=4,
                             transposed=True), ("conv_transpose2d", "groups"), "input 'groups' = 3: ", "out_channels=4"),
    ("AnyDeviceConv2D", dict(input=image(), stride=2, dilation=2, transposed=True, output_padding=2),
     ("conv_transpose2d", "output_padding"), "input 'output_padding' = 2: ", "smaller than either stride"),
    ("AnyDeviceLoss", dict(prediction=image(), target=image(h=16, w=16), loss="l1"),
     ("l1_loss", "target"), "input 'target' = 'IMAGE of shape (1, 16, 16, 3)': ",
     "does not broadcast with 'prediction' (IMAGE of shape (1, 24, 20, 3))"),
    ("AnyDeviceLoss", dict(prediction=image(), target=image(b=2), loss="bce"),
     ("binary_cross_entropy", "target"), "input 'target' = 'IMAGE of shape (2, 24, 20, 3)': ",
     "same shape as 'prediction' (IMAGE of shape (1, 24, 20, 3))"),
    ("AnyDeviceLoss", dict(prediction=image(h=8, w=8), target=image(h=8, w=8), loss="ssim", window_size=9),
     ("ssim", "input"), "input 'window_size' = 9: ", "larger than the height or width of 'prediction'"),
    ("AnyDeviceLoss", dict(prediction=image(), target=image(), loss="ssim", window_size=6),
     ("ssim", "window_size"), "input 'window_size' = 6: ", "odd"),
    ("AnyDeviceLoss", dict(prediction=image(), target=image(), loss="cosine"),
     ("loss", "name"), "input 'loss' = 'cosine': ", "choose one of mse, l1, huber, smooth_l1, bce, psnr, ssim"),
    ("AnyDeviceTensorOps", dict(a=image(), op="max", b=torch.rand(1, 5, 20)),
     ("maximum", "other"), "input 'b' = 'MASK of shape (1, 5, 20)': ",
     "does not broadcast with 'a' (IMAGE of shape (1, 24, 20, 3))"),
    ("AnyDeviceTensorOps", dict(a={"tensor": torch.ones(3, 4)}, op="reduce_max", dims="0, -2"),
     ("max", "dim"), "input 'dims' = '0, -2': ", "names a dim twice"),
    ("AnyDeviceActivation", dict(input=image(), activation="softmax", dim=-5),
     ("softmax", "dim"), "input 'dim' = -5: ", "out of range"),
]


@pytest.mark.parametrize("case", range(len(RULES)), ids=[f"{r[0][9:]}-{r[2][0]}-{r[2][1]}" for r in RULES])
def test_each_rule_lives_in_the_backend_and_names_the_widget(case):
    node, kw, (op, arg), head, fragment = RULES[case]
    with pytest.raises(common.NodeError) as e:
        res(node, device=dev("numpy"), **kw)
    m = str(e.value)
    assert m.startswith(f"{N[node].DISPLAY}: {head}"), m
    assert fragment in m, m
    cause = e.value.__cause__  # raised by the backend's rule, not by a copy of it in the node
    assert isinstance(cause, B.AnyDeviceError) and not isinstance(cause, common.NodeError), m
    assert (cause.op, cause.arg) == (op, arg) and e.value.backend_op == op


def test_loss_names_are_the_backends():
    assert compute.LOSS_NAMES == list(B.LOSSES)
    assert N["AnyDeviceLoss"].INPUT_TYPES()["required"]["loss"][0] == list(B.LOSSES)


def test_no_message_is_rewritten():
    assert "replace" not in inspect.getsource(common.NodeError)
    err = common.NodeError("Node (AnyDevice)", "w", 3, "argument 'x' stays as written")
    assert str(err) == "Node (AnyDevice): input 'w' = 3: argument 'x' stays as written"


# ---------------------------------------------------------------------------------------------
# VALIDATE_INPUTS: ComfyUI flags every input VALIDATE_INPUTS takes with its message, and skips its
# own min/max/combo check for each: so each takes only the widgets it checks in full
# ---------------------------------------------------------------------------------------------
def _comfy_flags(cls, inputs: dict) -> list[tuple[str, str]]:
    """(input, details) of each custom_validation_failed error ComfyUI's validate_inputs makes."""
    takes = inspect.getfullargspec(cls.VALIDATE_INPUTS).args[1:]
    r = cls.VALIDATE_INPUTS(**{k: v for k, v in inputs.items() if k in takes})
    return [] if r is True else [(x, f"{x} - {r}") for x in takes if x in inputs]


def _widgets(cls) -> dict:
    spec = cls.INPUT_TYPES()
    return {k: v[1].get("default", v[0][0] if isinstance(v[0], list) else None)
            for sec in ("required", "optional") for k, v in spec.get(sec, {}).items()
            if isinstance(v[0], list) or v[0] in ("INT", "FLOAT", "STRING", "BOOLEAN")}


@pytest.mark.parametrize("name", sorted(N))
def test_validate_inputs_takes_only_widgets_it_checks_in_full(name):
    """Each input VALIDATE_INPUTS takes is text without min/max, or a combo that VALIDATE_INPUTS
    checks itself (ComfyUI then skips the membership check): a value outside it is refused, naming
    it (a mode that says which text is parsed; the registry's devices; the input folder's sets)."""
    cls = N[name]
    if not hasattr(cls, "VALIDATE_INPUTS"):
        return
    takes = inspect.getfullargspec(cls.VALIDATE_INPUTS).args[1:]
    assert takes
    assert inspect.getfullargspec(cls.VALIDATE_INPUTS).varkw is None  # **kwargs would take every input
    spec = {**cls.INPUT_TYPES()["required"], **cls.INPUT_TYPES().get("optional", {})}
    for name in takes:
        typ, opts = spec[name]
        assert not {"min", "max"} & set(opts), name
        if isinstance(typ, list):
            r = cls.VALIDATE_INPUTS(**{name: "no-such-choice"})
            assert isinstance(r, str) and r.startswith(f"{cls.DISPLAY}: input '{name}' = 'no-such-choice': "), r
        else:
            assert typ == "STRING", (name, typ)


@pytest.mark.parametrize("name,bad,widget,flagged", [
    ("AnyDeviceConv2D", dict(kernel_source="text", kernel_text="1 2\n3"), "kernel_text",
     ["kernel_source", "kernel_text"]),
    ("AnyDeviceLinear", dict(bias="0.1 x"), "bias", ["source", "matrix", "bias"]),
    ("AnyDeviceLinear", dict(source="text", matrix="1 2; 3"), "matrix", ["source", "matrix", "bias"]),
    ("AnyDeviceTensorOps", dict(dims="1, a"), "dims", ["dims"]),
    ("AnyDeviceWeights", dict(bias="1 nan"), "bias", ["source", "shape", "matrix", "bias"]),
    ("AnyDeviceWeights", dict(source="text", matrix="[[1,2],[3]]"), "matrix", ["source", "shape", "matrix", "bias"]),
    ("AnyDeviceTensorSource", dict(mode="text", text="nan"), "text", ["mode", "shape", "text"]),
    ("AnyDeviceDeviceSelect", dict(device="quantum"), "device", ["device"]),
])
def test_failed_validation_names_the_widget_at_fault(name, bad, widget, flagged):
    """ComfyUI flags each input VALIDATE_INPUTS takes (the mode that says which text is parsed, too)
    with the one message, which names the widget at fault."""
    cls = N[name]
    inputs = {**_widgets(cls), **bad}
    flags = _comfy_flags(cls, inputs)
    assert [f[0] for f in flags] == flagged, flags
    assert all(f[1] == f"{f[0]} - {flags[0][1].split(' - ', 1)[1]}" for f in flags)
    assert f" - {cls.DISPLAY}: input '{widget}' = {bad[widget]!r}: " in flags[0][1]


# ---------------------------------------------------------------------------------------------
# NaN and Inf are kept (PyTorch semantics) but never silent: a log line and the badge's warning
# ---------------------------------------------------------------------------------------------
def test_nan_and_inf_outputs_are_reported(caplog, device):
    x = {"tensor": torch.tensor([[-1.0, 0.0, 1.0, 4.0], [-2.0, 2.0, 0.0, float("nan")]])}
    with caplog.at_level(logging.WARNING, logger="anydevice"):
        r = run("AnyDeviceTensorOps", a=x, op="log", device=device)
    ref = torch.log(x["tensor"])
    torch.testing.assert_close(r["result"][0]["tensor"], ref, equal_nan=True)  # values unchanged
    text = "output has 3 NaN and 2 Inf values"
    assert r["ui"]["anydevice"][0]["warning"] == text
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "anydevice" and rec.levelno == logging.WARNING]
    assert lines == [f"Tensor Ops (AnyDevice): {text}"]


def test_nan_warning_counts_every_output_and_is_absent_when_finite(caplog):
    img = image(h=64, w=64)
    img[0, 10, 10, :] = float("nan")
    with caplog.at_level(logging.WARNING, logger="anydevice"):
        r = run("AnyDeviceConv2D", input=img, preset="box_blur", kernel_size=3, padding_mode="zeros",
                device=dev("numpy"))
    assert r["ui"]["anydevice"][0]["warning"] == "output has 27 NaN and 0 Inf values"  # 3x3 around, 3 channels
    assert "Conv2D (AnyDevice): output has 27 NaN and 0 Inf values" in caplog.text
    big = image(h=16, w=16) * 1e30
    r = run("AnyDeviceLoss", prediction=big, target=-big, loss="mse", device=dev("numpy"))
    assert r["ui"]["anydevice"][0]["warning"] == "output 'value' has 0 NaN and 1 Inf values"
    r = run("AnyDeviceConv2D", input=image(), device=dev("numpy"))
    assert "warning" not in r["ui"]["anydevice"][0]
    assert common.nonfinite_counts({"samples": torch.tensor([float("inf"), float("-inf"), float("nan")])}) == (1, 2)
