"""Robustness regressions (issue "robust ops"): every repro of the issue, on every backend where it
applies. Wrong objects given as tensors, NaN parameters, the size limit on every op, huge conv
geometry, empty inputs, huge node kernels, converter outputs never aliasing their input, damaged
cache files."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import AnyDeviceError

NAN = float("nan")
X = np.ones((1, 2, 5, 5), np.float32)
W = np.ones((3, 2, 3, 3), np.float32)


def _refused(call, op, arg, fragment=""):
    with pytest.raises(AnyDeviceError) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(f"{op}: argument '{arg}' = "), msg
    assert fragment in msg, msg
    return info.value


# ---- 1. None (or any non-array object) given as a tensor ---------------------------------------
NOT_TENSORS = [
    (lambda be, v: be.conv2d(v, W), "conv2d", "input"),
    (lambda be, v: be.conv2d(X, v), "conv2d", "weight"),
    (lambda be, v: be.conv_transpose2d(X, v), "conv_transpose2d", "weight"),
    (lambda be, v: be.conv_transpose2d(v, np.ones((2, 1, 3, 3), np.float32)), "conv_transpose2d", "input"),
    (lambda be, v: be.matmul(v, np.ones((2, 2))), "matmul", "input"),
    (lambda be, v: be.matmul(np.ones((2, 2)), v), "matmul", "other"),
    (lambda be, v: be.linear(np.ones((2, 2)), v), "linear", "weight"),
    (lambda be, v: be.linear(v, np.ones((2, 2))), "linear", "input"),
    (lambda be, v: be.add(v, np.ones(2)), "add", "input"),
    (lambda be, v: be.add(np.ones(2), v), "add", "other"),
    (lambda be, v: be.relu(v), "relu", "input"),
    (lambda be, v: be.sum(v), "sum", "input"),
    (lambda be, v: be.softmax(v), "softmax", "input"),
    (lambda be, v: be.pad(v, (1, 1)), "pad", "input"),
    (lambda be, v: be.mse_loss(np.ones(3), v), "mse_loss", "target"),
    (lambda be, v: be.ssim(v, X), "ssim", "input"),
    (lambda be, v: be.layer_norm(v, 5), "layer_norm", "input"),
    (lambda be, v: be.var(v), "var", "input"),
]


@pytest.mark.parametrize("value", [None, object(), {"a": 1}, "text", [[1, 2], [3]]],
                         ids=["None", "object", "dict", "str", "ragged"])
@pytest.mark.parametrize("case", range(len(NOT_TENSORS)))
def test_non_tensor_refused_naming_op_and_argument(backend_target, case, value):
    call, op, arg = NOT_TENSORS[case]
    _refused(lambda: call(backend_target, value), op, arg)


def test_optional_tensor_arguments_still_take_none(backend_target):
    be = backend_target
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(be.conv2d(x, np.ones((2, 3, 3, 3), np.float32), None).shape, (2, 2, 2, 2))
    assert be.linear(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), None).shape == (2, 4)
    assert be.conv_transpose2d(x, np.ones((3, 1, 2, 2), np.float32), None).shape == (2, 1, 5, 5)
    assert be.layer_norm(x, 4, None, None).shape == x.shape
    assert be.group_norm(x, 3, None, None).shape == x.shape
    assert be.rms_norm(x, 4, None).shape == x.shape
    assert np.shape(be.binary_cross_entropy(np.full(3, 0.5, np.float32), np.ones(3, np.float32), None)) == ()


# ---- 5. NaN where torch (or the docs) refuse it -------------------------------------------------
def test_nan_parameters_refused(backend_target):
    be, a = backend_target, np.full((1, 1, 16, 16), 0.5, np.float32)
    _refused(lambda: be.huber_loss(a, a, delta=NAN), "huber_loss", "delta", "positive")
    _refused(lambda: be.smooth_l1_loss(a, a, beta=NAN), "smooth_l1_loss", "beta", ">= 0")
    _refused(lambda: be.ssim(a, a, sigma=NAN), "ssim", "sigma", "positive")
    _refused(lambda: be.ssim(a, a, data_range=NAN), "ssim", "data_range", "positive")
    _refused(lambda: be.psnr(a, a, data_range=NAN), "psnr", "data_range", "positive")
    for fn, kw in ((F.huber_loss, {"delta": NAN}), (F.smooth_l1_loss, {"beta": NAN})):  # what torch does
        with pytest.raises(RuntimeError):
            fn(torch.from_numpy(a), torch.from_numpy(a), **kw)
    # infinite thresholds are accepted, as torch
    b = np.linspace(-3, 3, 256, dtype=np.float32).reshape(a.shape)
    for name, kw in (("huber_loss", {"delta": float("inf")}), ("smooth_l1_loss", {"beta": float("inf")})):
        want = getattr(F, name)(torch.from_numpy(a), torch.from_numpy(b), **kw).item()
        np.testing.assert_allclose(float(np.asarray(getattr(be, name)(a, b, **kw))), want, rtol=1e-5)


def test_bce_nan_input_refused_as_torch(backend_target):
    x, t = np.array([NAN, 0.5], np.float32), np.array([0.0, 1.0], np.float32)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(torch.from_numpy(x), torch.from_numpy(t))
    for reduction in ("mean", "none"):
        _refused(lambda: backend_target.binary_cross_entropy(x, t, reduction=reduction),
                 "binary_cross_entropy", "input", "between 0 and 1")


# ---- 6. ANYDEVICE_MAX_TENSOR_MB on every op's planned output -------------------------------------
SIZE_CASES = [
    (lambda be: be.huber_loss(np.ones((2000, 1), np.float32), np.ones((1, 2000), np.float32)), "huber_loss"),
    (lambda be: be.mse_loss(np.ones((2000, 1), np.float32), np.ones((1, 2000), np.float32)), "mse_loss"),
    (lambda be: be.l1_loss(np.ones((2000, 1), np.float32), np.ones((1, 2000), np.float32)), "l1_loss"),
    (lambda be: be.smooth_l1_loss(np.ones((2000, 1), np.float32), np.ones((1, 2000), np.float32)), "smooth_l1_loss"),
    (lambda be: be.binary_cross_entropy(np.full((1, 2000), 0.5, np.float32), np.ones((1, 2000), np.float32),
                                        np.ones((2000, 1), np.float32)), "binary_cross_entropy"),
    (lambda be: be.pad(np.ones((1, 1), np.float32), (3000,) * 4), "pad"),
    (lambda be: be.linear(np.ones((2000, 4), np.float32), np.ones((2000, 4), np.float32)), "linear"),
    (lambda be: be.linear(np.ones((2000, 4), np.float32), np.ones(4, np.float32), np.ones((2000, 1), np.float32)),
     "linear"),
    (lambda be: be.add(np.ones((2000, 1), np.float32), np.ones((1, 2000), np.float32)), "add"),
    (lambda be: be.matmul(np.ones((4, 2000, 1), np.float32), np.ones((1, 2000), np.float32)), "matmul"),
    (lambda be: be.conv2d(np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1), np.float32), padding=1000),
     "conv2d"),
    (lambda be: be.conv_transpose2d(np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 2, 2), np.float32),
                                    stride=2, output_padding=1, dilation=3000), "conv_transpose2d"),
]


@pytest.mark.parametrize("case", range(len(SIZE_CASES)))
def test_size_limit_applies_to_every_op(backend_target, monkeypatch, case):
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "8")
    call, op = SIZE_CASES[case]
    _refused(lambda: call(backend_target), op, "output", "over the limit ANYDEVICE_MAX_TENSOR_MB=8")


# ---- 7. converter nodes never alias their input ---------------------------------------------------
def _node(name, **kw):
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    return NODE_CLASS_MAPPINGS[name]().run(**kw)["result"][0]


def _host(out):
    if isinstance(out, dict):
        return out["samples"] if "samples" in out else out["tensor"]
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes() and sa.nbytes() and sb.nbytes()


IMAGE_SHAPES = [(1, 1, 1, 1), (1, 1, 1, 3), (2, 4, 5, 1), (1, 6, 7, 3), (3, 1, 1, 4), (0, 2, 2, 3)]
MASK_SHAPES = [(1, 1), (1, 1, 1), (4, 5), (2, 4, 5), (3, 1, 7), (0, 3, 3)]
TENSOR_SHAPES = [(1, 1, 1, 1), (1, 3, 4, 5), (2, 1, 4, 4), (4, 5), (2, 4, 5)]
CONVERTERS = (
    [("AnyDeviceImageToTensor", "image", s, {"layout": lay}) for s in IMAGE_SHAPES for lay in ("NCHW", "NHWC")]
    + [("AnyDeviceTensorSource", "image", s, {"mode": "image"}) for s in IMAGE_SHAPES]
    + [("AnyDeviceMaskToTensor", "mask", s, {"layout": lay}) for s in MASK_SHAPES for lay in ("NCHW", "NHW")]
    + [("AnyDeviceLatentToTensor", "latent", s, {}) for s in [(1, 4, 8, 8), (1, 1, 1, 1), (2, 4, 3, 2, 2)]]
    + [("AnyDeviceTensorToImage", "tensor", s, {}) for s in TENSOR_SHAPES if len(s) == 4 or len(s) == 3]
    + [("AnyDeviceTensorToImage", "tensor", (1, 1, 2, 2), {"layout": "NHWC"})]
    + [("AnyDeviceTensorToMask", "tensor", s, {}) for s in TENSOR_SHAPES]
    + [("AnyDeviceTensorToLatent", "tensor", s, {}) for s in [(1, 4, 8, 8), (1, 1, 1, 1), (4, 2, 2)]]
)


@pytest.mark.parametrize("case", CONVERTERS, ids=lambda c: f"{c[0][9:]}-{c[1]}{c[2]}-{c[3]}")
def test_converter_output_never_aliases_input(case):
    name, arg, shape, kw = case
    t = torch.rand(shape)
    value = {"samples": t} if arg == "latent" else {"tensor": t} if arg == "tensor" else t
    before = t.clone()
    out = _host(_node(name, **{arg: value}, **kw))
    assert not _overlap(out, t), f"{name}: output shares memory with the input"
    assert not np.shares_memory(out.numpy(), t.numpy())
    if out.numel():
        out.fill_(-7.0)  # writing into the output leaves the input as it was
    assert torch.equal(t, before)


@pytest.mark.parametrize("name,arg,kw", [("AnyDeviceMaskToTensor", "mask", {}),
                                         ("AnyDeviceMaskToTensor", "mask", {"layout": "NHW"}),
                                         ("AnyDeviceImageToTensor", "image", {}),
                                         ("AnyDeviceImageToTensor", "image", {"layout": "NHWC"}),
                                         ("AnyDeviceTensorSource", "image", {"mode": "image"})])
@pytest.mark.parametrize("c", [1, 3])
def test_converter_of_a_computed_value_never_aliases_it(backend_target, name, arg, kw, c):
    """A value an AnyDevice node made (its device copy is remembered) converts without sharing memory."""
    src = torch.rand(2, 5, 6, c)
    made = _node("AnyDeviceActivation", input=src if arg == "image" else src[..., 0], activation="relu",
                 device={"name": backend_target.name})
    before = made.clone()
    out = _host(_node(name, **{arg: made}, **kw))
    assert not _overlap(out, made)
    out.fill_(-7.0)
    assert torch.equal(made, before)


# ---- 8. cache files of the wrong JSON type ---------------------------------------------------------
@pytest.mark.parametrize("content", ["null", "[1, 2]", '"x"', "{", '{"K": null}', '{"K": [1, 2]}',
                                     '{"K": {"gemm_cpu.cl": null}}'])
def test_json_store_of_wrong_type_is_rebuilt(tmp_path, caplog, content):
    from anydevice.backend.devices.runtime import JsonStore
    from anydevice.backend.system import store
    monkey = store.JsonStore._warned
    path = tmp_path / "s.json"
    path.write_text(content)
    s = JsonStore(path)
    with caplog.at_level(logging.WARNING, "anydevice"):
        data = s.read()
        assert isinstance(data, dict) and all(isinstance(v, dict) for v in data.values())
        assert isinstance(s.section("K"), dict)
        s.update("K", {"ok": True})
    assert json.loads(path.read_text())["K"]["ok"] is True
    if "gemm_cpu" not in content:
        assert any("rebuilding" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)
    monkey.discard(str(path))


@pytest.mark.parametrize("content", ["null", "[1, 2]", "{KEY: null}", "{KEY: [1, 2]}", '{KEY: "x"}',
                                     '{KEY: {"gemm_cpu.cl": null, "misc.cl": [1]}}'])
@pytest.mark.parametrize("fname", ["devices.json", "tune.json"])
def test_damaged_opencl_cache_keeps_opencl_working(tmp_path, monkeypatch, fname, content):
    pytest.importorskip("pyopencl")
    from anydevice.backend import list_backends
    from anydevice.backend.system import registry
    from anydevice.backend.devices import opencl as opencl_backend
    from anydevice.backend.devices.opencl import device
    if not any(i.name == "opencl" and i.available for i in list_backends()):
        pytest.skip("no OpenCL device")
    monkeypatch.setenv("ANYDEVICE_CACHE_DIR", str(tmp_path))
    key = device._device_key(device._enumerate()[0][2])
    (tmp_path / "opencl").mkdir()
    (tmp_path / "opencl" / fname).write_text(content.replace("KEY", json.dumps(key)))
    info = registry._probe_spec(next(s for s in registry.SPECS if s.name == "opencl"))
    assert info.available, info.reason
    be = opencl_backend.create("opencl", 0)
    np.testing.assert_allclose(be.matmul(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)), 4.0)


# ---- 3. empty inputs to conv2d: torch's result or torch's refusal -----------------------------------
def test_conv_empty_inputs_as_torch(backend_target):
    be = backend_target
    w, b = np.ones((3, 2, 3, 3), np.float32), np.ones(3, np.float32)
    for shape, kw in (((0, 2, 5, 5), {}), ((0, 2, 5, 5), {"padding": 1, "padding_mode": "reflect"})):
        want = F.conv2d(torch.zeros(shape), torch.from_numpy(w), torch.from_numpy(b), padding=kw.get("padding", 0))
        assert np.shape(be.conv2d(np.zeros(shape, np.float32), w, b, **kw)) == tuple(want.shape)
    for shape in ((1, 2, 0, 5), (3, 2, 5, 0), (2, 0, 5)):  # torch refuses an empty image, whatever the padding
        with pytest.raises(RuntimeError):
            F.conv2d(torch.zeros(shape), torch.ones(3, shape[-3], 3, 3), padding=2)
        _refused(lambda: be.conv2d(np.zeros(shape, np.float32), np.ones((3, shape[-3], 3, 3), np.float32),
                                   padding=2), "conv2d", "input", "empty image")


@pytest.mark.parametrize("kw", [{}, {"kernel_size": 4}, {"kernel_size": 4, "padding_mode": "zeros"},
                                {"padding": "valid", "preset": "sobel_x"}, {"transposed": True}])
@pytest.mark.parametrize("shape", [(3, 0, 5), (3, 5, 0), (0, 5)])
def test_conv_node_on_an_empty_mask_says_so(kw, shape):
    with pytest.raises(AnyDeviceError) as info:
        _node("AnyDeviceConv2D", input=torch.zeros(shape), device={"name": "numpy"}, **kw)
    msg = str(info.value)
    assert msg.startswith("Conv2D (AnyDevice): input 'input' = 'MASK of shape"), msg
    assert "empty image" in msg and "larger" not in msg, msg


# ---- 4. a node's huge kernel is refused before it is built -------------------------------------------
@pytest.mark.parametrize("kw", [{"preset": "box_blur"}, {"preset": "gaussian"}, {"preset": "identity"},
                                {"kernel_source": "random"},
                                {"kernel_source": "random", "channel_mode": "grouped", "out_channels": 6, "groups": 3},
                                {"kernel_source": "random", "channel_mode": "grouped", "transposed": True}])
def test_conv_node_huge_kernel_refused_before_allocating(kw, monkeypatch):
    import tracemalloc
    # the limit as on a 16-24 GiB machine (the default follows free memory: 128 GiB machines allow it)
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "8192")
    tracemalloc.start()
    try:
        with pytest.raises(AnyDeviceError) as info:
            _node("AnyDeviceConv2D", input=torch.rand(2, 8, 8, 3), kernel_size=50000, device={"name": "numpy"}, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(info.value)
    assert msg.startswith("Conv2D (AnyDevice): input 'kernel_size' = 50000: would build a "), msg
    assert "over the limit" in msg and "ANYDEVICE_MAX_TENSOR_MB" in msg
    assert peak < 64 * 2**20  # nothing of the kernel's size was allocated
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")  # the setting is the one limit
    with pytest.raises(AnyDeviceError, match="'kernel_size' = 400: would build"):
        _node("AnyDeviceConv2D", input=torch.rand(1, 8, 8, 3), kernel_size=400, device={"name": "numpy"}, **kw)


# ---- 2. huge stride / dilation / padding: computed as torch does (small results) -------------------
HUGE_CONV = [  # (input shape, weight shape, kwargs)
    ((1, 2, 5, 5), (3, 2, 3, 3), {"stride": 2**40}),
    ((1, 2, 5, 5), (3, 2, 1, 1), {"dilation": 2**40}),
    ((1, 1, 1, 1), (1, 1, 1, 1), {"padding": 2**31, "stride": 2**31}),
    ((2, 2, 3, 6), (4, 1, 1, 3), {"padding": (2**31, 1), "stride": (2**31, 1), "groups": 2}),
    ((1, 1, 3, 3), (2, 1, 1, 1), {"padding": 2**32, "stride": 2**33}),  # no output reaches the input
    ((2, 4, 4), (2, 1, 3, 3), {"stride": (1, 2**35), "padding": 1, "groups": 2}),  # unbatched
    ((1, 2, 6, 7), (2, 2, 3, 3), {"stride": 2**32, "padding": 1, "padding_mode": "reflect"}),
    ((1, 1, 4, 9), (1, 1, 1, 3), {"stride": (1, 2**32 + 4), "padding": (0, 2**32)}),  # one output, inside
    ((1, 2, 9, 9), (2, 2, 3, 3), {"stride": (2**32 + 4, 3), "padding": (2**32, 1)}),
]


@pytest.mark.parametrize("case", range(len(HUGE_CONV)))
def test_huge_conv_geometry_computed_as_torch(backend_target, case):
    sx, sw, kw = HUGE_CONV[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(sx).astype(np.float32)
    w = rng.standard_normal(sw).astype(np.float32)
    b = rng.standard_normal(sw[0]).astype(np.float32)
    x0 = x.copy()
    tkw = dict(kw)
    mode = tkw.pop("padding_mode", "zeros")
    xt = torch.from_numpy(x)
    if mode != "zeros":  # torch's padding_mode is nn.Conv2d's: pad first
        p = tkw.pop("padding")
        xt = F.pad(xt, (p,) * 4, mode=mode)
    want = F.conv2d(xt, torch.from_numpy(w), torch.from_numpy(b), **tkw).numpy()
    got = backend_target.conv2d(x, w, b, **kw)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.array_equal(x, x0)


HUGE_CONV_T = [  # (input, weight, kwargs, the same with values torch takes: it computes these in 32 bits)
    ((1, 2, 1, 1), (2, 3, 3, 3), {"stride": 2**40}, {"stride": 1}),
    ((1, 2, 1, 4), (2, 1, 3, 1), {"stride": (2**40, 2), "output_padding": (5, 1)},
     {"stride": (6, 2), "output_padding": (5, 1)}),
    ((1, 2, 3, 3), (2, 1, 1, 1), {"dilation": 2**40, "stride": 2}, {"stride": 2}),
]


@pytest.mark.parametrize("case", range(len(HUGE_CONV_T)))
def test_huge_conv_transpose_geometry_computed_as_torch(backend_target, case):
    sx, sw, kw, same = HUGE_CONV_T[case]
    rng = np.random.default_rng(case)
    x, w = rng.standard_normal(sx).astype(np.float32), rng.standard_normal(sw).astype(np.float32)
    with pytest.raises(RuntimeError):  # torch 2.13 truncates these to 32 bits and refuses them
        F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), **kw)
    want = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), **same).numpy()
    got = backend_target.conv_transpose2d(x, w, **kw)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_huge_conv_geometry_the_kernels_cannot_take_is_refused(backend_target):
    be = backend_target
    x, w = np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32)
    # every output row reads two taps 2**40 apart: nothing to trim, too large for 32-bit indexing
    _refused(lambda: be.conv2d(x, w, padding=2**40, dilation=2**40), "conv2d", "dilation", "32-bit")
    _refused(lambda: be.conv2d(x, np.ones((1, 1, 2, 2), np.float32), stride=2**31, padding=2**31 - 1,
                               dilation=2**31), "conv2d", "dilation", "32-bit")
    _refused(lambda: be.conv_transpose2d(np.ones((1, 1, 2, 2), np.float32), w[..., :1, :1], stride=2**40,
                                         padding=2**39),
             "conv_transpose2d", "stride", "32-bit")


# ---- torch's testing utilities freeze the cuDNN switches (found on an H100 run) -------------------
def test_fp32_switch_works_when_torch_froze_the_flags():
    """Importing torch.testing._internal (the OpInfo replay does) calls
    torch.backends.disable_global_flags(); the torch-cuda backend's FP32 switch must still work."""
    from anydevice.backend.devices.torch.backend import TorchBackend
    b = torch.backends
    frozen = b.flags_frozen()
    b.disable_global_flags()
    try:
        before = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
        with TorchBackend._FP32(torch):
            assert (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32) == (False, False)
        assert (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32) == before
    finally:
        if not frozen:
            setattr(b, "__allow_nonbracketed_mutation_flag", True)
