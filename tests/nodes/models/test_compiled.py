"""The model nodes ("Model on AnyDevice", "VAE on AnyDevice", "Upscale Model on AnyDevice"), issue 14.

Without ComfyUI (the project's .venv): the Upscale Model node on spandrel's SRVGGNetCompact and RRDBNet
(random weights) inside spandrel's own ``ImageModelDescriptor`` (its module imported without spandrel's
package ``__init__``, as tests/support/compile_models.py imports the architectures), the VAE node on a VAE-like
object (the tests' VAE-style decoder and an encoder), weight refresh, fallback and errors.

With ComfyUI (COMFYUI_DIR, found as tests/support/e2e_helpers.py finds it; skipped without it): ComfyUI's own SD1.x
VAE built from its config with random weights, decoded and encoded through the VAE node, and a tiny
``UNetModel`` wrapped in a ModelPatcher sampled 2 steps with ComfyUI's own sampler through the MODEL node
(and again after a LoRA-like weight patch), and a spandrel model loaded by spandrel's ModelLoader through
the Upscale Model node and ComfyUI's own Upscale Image (using Model). Those run in a subprocess under ComfyUI's own python
(tests/support/model_nodes_comfy.py), because ComfyUI's python dependencies are not in .venv.
"""
from __future__ import annotations

import copy
import importlib
import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from anydevice.backend import compile as adc
from anydevice.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from anydevice.nodes.models import compiled as mn
from anydevice.nodes.base.common import NodeError

import compile_models as cm
from compile_models import _fresh_dynamo, rel  # noqa: F401 (_fresh_dynamo: an autouse fixture)
import e2e_helpers as H
from conftest import TARGETS

from repo_paths import SUPPORT  # noqa: E402
CHEAP = [t[0] for t in TARGETS if t[0] in ("numpy", "opencl")] or ["numpy"]
TOL = 1e-5


def descriptor(model, scale=2):
    """spandrel's ImageModelDescriptor around ``model`` (the real class, imported bare)."""
    cm.spandrel_arch("Compact", "SRVGG")  # sets up the bare spandrel package
    root = sys.modules["spandrel"].__path__[0]
    cm._bare_package("spandrel.__helpers", f"{root}/__helpers")
    md = importlib.import_module("spandrel.__helpers.model_descriptor")
    return md.ImageModelDescriptor(model, model.state_dict(), architecture=None, purpose="SR", tags=[],
                                   supports_half=True, supports_bfloat16=True, scale=scale, input_channels=3,
                                   output_channels=3)


def state(m) -> dict:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def same_state(m, before) -> bool:
    now = m.state_dict()
    return now.keys() == before.keys() and all(torch.equal(now[k], before[k]) for k in before)


# ---------------------------------------------------------------------------------------------
def test_the_three_nodes_are_registered_with_their_names():
    names = {"AnyDeviceModel": "Model on AnyDevice", "AnyDeviceVAE": "VAE on AnyDevice",
             "AnyDeviceUpscaleModel": "Upscale Model on AnyDevice"}
    for cls, display in names.items():
        assert NODE_DISPLAY_NAME_MAPPINGS[cls] == display
        node = NODE_CLASS_MAPPINGS[cls]
        spec = node.INPUT_TYPES()
        assert spec["optional"]["device"][0] == "DEVICE"
        (inp, (typ, opts)), = spec["required"].items()
        assert typ == node.RETURN_TYPES[0] and opts["tooltip"]
        assert node.CATEGORY == "AnyDevice/models"


# ---------------------------------------------------------------------------------------------
# Upscale Model on AnyDevice (spandrel descriptors, no ComfyUI)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", CHEAP)
@pytest.mark.parametrize("arch,shape", [("compact", (1, 3, 16, 12)), ("rrdbnet", (2, 3, 12, 10))])
def test_upscale_node_matches_eager(arch, shape, device):
    model = getattr(cm, arch)()
    desc = descriptor(model)
    before = state(model)
    x = torch.rand(*shape)
    with torch.inference_mode():
        ref = desc(x)
    out = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": device}, dtype="float32")
    new = out["result"][0]
    assert type(new) is type(desc) and new is not desc
    assert desc.model is model and not isinstance(desc.model, mn.Guarded)  # the input is unchanged
    assert isinstance(new.model, mn.Guarded) and new.model.original is model
    assert new.scale == desc.scale and new.input_channels == 3
    assert out["ui"]["anydevice"][0]["backend"] == device
    new.to("cpu").eval()  # what ComfyUI's Upscale Image (using Model) does with it
    with torch.inference_mode():
        y = new(x)
        y2 = new(x)
    assert y.shape == ref.shape == (shape[0], 3, shape[2] * 2, shape[3] * 2)
    assert rel(y, ref) <= TOL, rel(y, ref)
    assert torch.equal(y, y2)
    rep = adc.report(new.model.compiled)
    assert rep["fallbacks"] == {} and rep["eager_fallbacks"] == 0, rep
    assert rep["graphs"] >= 1 and rep["calls"] == 2
    assert mn.fallbacks_of(new.model) == []
    assert same_state(model, before)
    with torch.inference_mode():
        assert torch.equal(desc(x), ref)  # the original still runs as before


def test_upscale_weights_refresh_when_changed():
    """A weight changed in place (what ComfyUI's patcher does with inplace updates) and a weight
    replaced by a new Parameter (set_attr_param) are both seen by the next call."""
    model = cm.compact()
    desc = descriptor(model)
    new = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": "numpy"}, dtype="float32")["result"][0]
    x = torch.rand(1, 3, 12, 12)
    with torch.inference_mode():
        y0 = new(x)
    conv = model.body[0]
    with torch.no_grad():
        conv.weight.mul_(1.5)
    with torch.inference_mode():
        ref1, y1 = desc(x), new(x)
    assert rel(y1, ref1) <= TOL and rel(y1, y0) > 1e-3
    conv.weight = nn.Parameter(conv.weight.detach() * -1.0, requires_grad=False)
    with torch.inference_mode():
        ref2, y2 = desc(x), new(x)
    assert rel(y2, ref2) <= TOL and rel(y2, y1) > 1e-3
    assert adc.report(new.model.compiled)["fallbacks"] == {}


class _Spectral(nn.Module):
    """A model the backend cannot take: complex numbers (FFT)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.fft.ifft2(torch.fft.fft2(self.conv(x)) * 0.5).real


def test_upscale_model_the_backend_cannot_take_keeps_working(caplog):
    torch.manual_seed(0)
    model = _Spectral().eval()
    desc = descriptor(model, scale=1)
    new = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": "numpy"}, dtype="float32")["result"][0]
    x = torch.rand(1, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="anydevice"), torch.inference_mode():
        y = new(x)
        y2 = new(x)
        ref = desc(x)
    assert torch.allclose(y, ref) and torch.allclose(y2, ref)
    why = mn.fallbacks_of(new.model)
    assert len(why) == 1 and "upscale model" in why[0] and "complex" in why[0].lower(), why
    warned = [r.getMessage() for r in caplog.records if "Upscale Model on AnyDevice" in r.getMessage()]
    assert len(warned) == 1 and "runs as before" in warned[0], warned


def test_upscale_device_memory_limit_is_an_error_naming_the_node(monkeypatch):
    m = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 3, 3, padding=1)).eval()
    desc = descriptor(m, scale=1)
    new = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": "numpy"}, dtype="float32")["result"][0]
    x = torch.rand(1, 3, 96, 96)  # the first conv's output: 64*96*96*4 B = 2.25 MiB
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    with torch.inference_mode(), pytest.raises(NodeError) as ei:
        new(x)
    msg = str(ei.value)
    assert msg.startswith("Upscale Model on AnyDevice: ") and "2.2 MiB" in msg and "ANYDEVICE_MAX_TENSOR_MB=1" in msg, msg
    monkeypatch.delenv("ANYDEVICE_MAX_TENSOR_MB")
    with torch.inference_mode():
        assert rel(new(x), desc(x)) <= TOL  # within the limit again, it runs
    assert mn.fallbacks_of(new.model) == []


@pytest.mark.parametrize("value,fragment", [
    (torch.zeros(1, 3, 4, 4), "input 'upscale_model' = 'Tensor'"),
    (None, "input 'upscale_model' = 'NoneType'"),
    (nn.Conv2d(3, 3, 1), "input 'upscale_model' = 'Conv2d'"),
])
def test_upscale_bad_input(value, fragment):
    with pytest.raises(NodeError) as ei:
        NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=value)
    assert str(ei.value).startswith("Upscale Model on AnyDevice: ") and fragment in str(ei.value), str(ei.value)


def test_bad_device_names_the_device_input():
    desc = descriptor(cm.compact())
    with pytest.raises(NodeError) as ei:
        NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": "nonsense"}, dtype="float32")
    assert "input 'device' = 'nonsense'" in str(ei.value), str(ei.value)
    with pytest.raises(NodeError, match="DeviceSelect"):
        NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device=3)


# ---------------------------------------------------------------------------------------------
# VAE on AnyDevice on a VAE-like object (no ComfyUI), MODEL without ComfyUI
# ---------------------------------------------------------------------------------------------
class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)
        self.down = nn.Conv2d(16, 8, 3, stride=2, padding=1)

    def forward(self, x):
        return self.down(nn.functional.silu(self.norm(self.conv_in(x))))


class _AE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = _Encoder(), cm.Decoder()
        self.post = nn.Conv2d(4, 4, 1)

    def encode(self, x):
        return self.encoder(x)[:, :4]

    def decode(self, z):
        return self.decoder(self.post(z))


class _FakeVAE:
    """The parts of ComfyUI's VAE wrapper the node uses: first_stage_model (and a patcher)."""

    def __init__(self):
        torch.manual_seed(0)
        self.first_stage_model = _AE().eval()
        self.patcher = None

    def decode(self, z):
        return self.first_stage_model.decode(z)

    def encode(self, x):
        return self.first_stage_model.encode(x)


@pytest.mark.parametrize("device", CHEAP)
def test_vae_node_on_a_vae_like_object(device):
    vae = _FakeVAE()
    fsm = vae.first_stage_model
    before = state(fsm)
    new = NODE_CLASS_MAPPINGS["AnyDeviceVAE"]().run(vae=vae, device={"name": device}, dtype="float32")["result"][0]
    assert new is not vae and new.first_stage_model is not fsm
    assert vae.first_stage_model is fsm and not isinstance(vars(fsm).get("decoder"), mn.Guarded)
    assert isinstance(new.first_stage_model.decoder, mn.Guarded) and isinstance(new.first_stage_model.encoder, mn.Guarded)
    assert fsm.decoder is new.first_stage_model.decoder.original  # the weights are the original's
    assert new.first_stage_model.state_dict().keys() == fsm.state_dict().keys()
    z, x = torch.randn(1, 4, 8, 8), torch.rand(1, 3, 16, 16)
    with torch.inference_mode():
        ref_d, ref_e = vae.decode(z), vae.encode(x)
        y_d, y_e = new.decode(z), new.encode(x)
    assert rel(y_d, ref_d) <= TOL and rel(y_e, ref_e) <= TOL
    for g in (new.first_stage_model.decoder, new.first_stage_model.encoder):
        assert adc.report(g.compiled)["fallbacks"] == {}
    assert mn.fallbacks_of(new) == []
    assert same_state(fsm, before)


def test_vae_bad_input():
    for value, fragment in ((None, "'NoneType'"), (torch.zeros(2), "'Tensor'")):
        with pytest.raises(NodeError) as ei:
            NODE_CLASS_MAPPINGS["AnyDeviceVAE"]().run(vae=value)
        assert str(ei.value).startswith("VAE on AnyDevice: input 'vae' = " + fragment), str(ei.value)
    empty = _FakeVAE()
    empty.first_stage_model = None  # what ComfyUI's VAE holds for a checkpoint without one
    with pytest.raises(NodeError, match="VAE on AnyDevice: input 'vae'.*must be a VAE with a model"):
        NODE_CLASS_MAPPINGS["AnyDeviceVAE"]().run(vae=empty)


def test_model_bad_input():
    with pytest.raises(NodeError) as ei:
        NODE_CLASS_MAPPINGS["AnyDeviceModel"]().run(model=nn.Linear(2, 2))
    assert str(ei.value).startswith("Model on AnyDevice: input 'model' = 'Linear': must be a MODEL"), str(ei.value)


def test_share_copy_shares_weights_not_attributes():
    m = cm.decoder()
    c = mn.share_copy(m)
    assert c is not m and c.attn is not m.attn and c.attn.q.weight is m.attn.q.weight
    c.attn.flag = 1
    assert not hasattr(m.attn, "flag")
    m.attn.q.weight = nn.Parameter(torch.zeros_like(m.attn.q.weight))  # as the model patcher replaces one
    assert c.attn.q.weight is m.attn.q.weight


# ---------------------------------------------------------------------------------------------
# with ComfyUI: its own SD1.x VAE and a tiny UNetModel, in ComfyUI's python
# ---------------------------------------------------------------------------------------------
_comfy, _why = H.comfy_dir()


@pytest.fixture(scope="module")
def comfy_results():
    if _comfy is None:
        pytest.skip(_why)
    py = H._venv_python(_comfy)
    env = dict(os.environ, COMFYUI_DIR=str(_comfy), PYTHONUNBUFFERED="1")
    env.pop("ANYDEVICE_BACKEND", None)
    devices = ",".join(CHEAP)
    proc = subprocess.run([str(py), str(SUPPORT / "model_nodes_comfy.py"), devices], cwd=str(_comfy), env=env,
                          capture_output=True, text=True, timeout=1500)
    H.ARTIFACTS.mkdir(exist_ok=True)
    (H.ARTIFACTS / "model_nodes_comfy.log").write_text(proc.stdout + "\n" + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_comfyui_sd1_vae_through_the_node(comfy_results):
    r = comfy_results["vae"]
    assert r, "no VAE results"
    for dev, v in r.items():
        assert v["decode_rel"] <= TOL and v["encode_rel"] <= TOL, (dev, v)
        assert v["fallbacks"] == {} and v["eager_fallbacks"] == 0 and v["guard_fallbacks"] == [], (dev, v)
        assert v["attention_blocks_pytorch"] >= 1, (dev, v)
        assert v["graphs"] == 2, (dev, v)  # one decoder graph, one encoder graph: no graph breaks
        assert v["original_unchanged"] and v["original_attention_kept"], (dev, v)
        assert v["weight_uploads_second_decode"] == 0, (dev, v)  # weights stay on the device between calls


def test_comfyui_unet_sampled_through_the_model_node(comfy_results):
    r = comfy_results["unet"]
    assert r, "no UNet results"
    for dev, v in r.items():
        assert v["sample_rel"] <= TOL and v["apply_rel"] <= TOL and v["apply_calls"] == 1, (dev, v)
        # one graph (attention through attention_pytorch: no graph breaks, nothing left to eager PyTorch),
        # one call per step (cond and uncond batched)
        assert v["steps"] == 2 and v["calls"] == 2 and v["graphs"] == 1, (dev, v)
        assert v["fallbacks"] == {} and v["guard_fallbacks"] == [] and v["eager_fallbacks"] == 0, (dev, v)
        # per step only the inputs go up (latent, timestep, context) and the output comes down: the weights
        # were uploaded once, before (as constants of the graph), not per step
        assert v["transfers"]["uploads"] == 3 * v["calls"] and v["transfers"]["downloads"] == v["calls"], (dev, v)
        assert v["original_unchanged"], (dev, v)
        # a LoRA-like weight patch (ModelPatcher.add_patches) changes the compiled result as it does eager
        assert v["patched_rel"] <= TOL and v["patch_changed"] > 1e-3, (dev, v)
        assert v["after_unpatch_rel"] <= TOL, (dev, v)


def test_comfyui_unet_with_quantized_weights(comfy_results):
    """weights=q8_0: every conv / linear weight of the UNet quantized, the sample within the quantization's
    error of eager, a LoRA-like patch applied as eager applies it (to the float weight, quantized again) and
    taken off (the result before the patch, exactly); a scaled-fp8 UNet (ComfyUI's scaled_fp8_ops) keeps
    its float8 weights as float8 on the device and gives eager's result."""
    r = comfy_results["quant"]
    assert r, "no quantized-weight results"
    for dev, v in r.items():
        assert v["q8_0_fallbacks"] == {} and v["fp8_fallbacks"] == {}, (dev, v)
        assert v["q8_0_nodes"] >= 20, (dev, v)
        assert "quantized to q8_0" in v["q8_0_text"], (dev, v)
        assert 1e-6 < v["q8_0_rel"] < 2e-2, (dev, v)  # quantized (not exact), yet close
        assert v["q8_0_patch_changed"] > 1e-3 and v["q8_0_patched_rel"] < 2e-2, (dev, v)
        assert v["q8_0_unpatched_rel"] <= 1e-6, (dev, v)
        assert v["fp8_layers"] >= 10 and v["fp8_rel"] <= TOL, (dev, v)
        if dev == "opencl":  # the device reads float8: every scaled layer kept packed
            assert v["fp8_kept"] == v["fp8_layers"] and v["fp8_packed_formats"] == ["float8_e4m3fn"], (dev, v)


def test_comfyui_upscale_image_with_the_upscale_node(comfy_results):
    r = comfy_results["upscale"]
    assert r, "no upscale results"
    for dev, v in r.items():
        assert v["arch"] == "SRVGGNetCompact" and v["shapes"] == [[1, 80, 96, 3], [1, 104, 72, 3]], (dev, v)
        assert max(v["rel"]) <= TOL, (dev, v)
        assert v["fallbacks"] == {} and v["eager_fallbacks"] == 0 and v["guard_fallbacks"] == [], (dev, v)
        assert v["calls"] == 2 and v["original_unchanged"], (dev, v)
