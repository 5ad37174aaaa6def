"""nodes/models/gguf.py without ComfyUI: the state dict a GGUF file gives (prefix stripped,
comfy.gguf.orig_shape applied, quantized weights PackedWeight with the logical shape), errors naming
the file, and the packed layers (PackedLayer on torch's Linear / Conv2d): their forward equals the
dequantized weight's, compiled on OpenCL the weights stay packed (CLQuant), and ComfyUI's patcher
protocol (convert_weight / set_weight, weight_function) applies a patch to the dequantized weight."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile import quant_ops
from anydevice.backend.compile.lowering import Weights
from anydevice.backend.ops import quant
from anydevice.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
from anydevice.nodes.base.common import NodeError
from anydevice.nodes.models import gguf as G

gguf = pytest.importorskip("gguf")
import gguf_sd15  # noqa: E402

quant_ops.register()


def _weights(seed=0):
    g = np.random.default_rng(seed)
    return {
        "model.diffusion_model.conv.weight": g.standard_normal((16, 16, 3, 3)).astype(np.float32) / 12,  # shape-fixed
        "model.diffusion_model.conv.bias": g.standard_normal(16).astype(np.float32),
        "model.diffusion_model.fc.weight": g.standard_normal((32, 256)).astype(np.float32) / 16,  # Q8_0, rows of 256 already
        "model.diffusion_model.fc.bias": g.standard_normal(32).astype(np.float32),
        "model.diffusion_model.small.weight": g.standard_normal((4, 8)).astype(np.float32),  # F32 (32 values)
    }


@pytest.fixture
def small_file(tmp_path):
    w = _weights()
    path = tmp_path / "small.gguf"
    info = gguf_sd15.write(w, path)
    return path, w, info


def test_node_is_registered_with_tooltips():
    assert NODE_DISPLAY_NAME_MAPPINGS["AnyDeviceGGUFLoader"] == "Load GGUF Model (AnyDevice)"
    cls = NODE_CLASS_MAPPINGS["AnyDeviceGGUFLoader"]
    spec = cls.INPUT_TYPES()["required"]["gguf_name"]
    assert spec[0] == [G.NONE_FOUND]  # no ComfyUI here: no folders
    assert spec[1]["tooltip"] and cls.OUTPUT_TOOLTIPS[0] and cls.RETURN_TYPES == ("MODEL",)


def test_state_dict_strips_the_prefix_and_applies_orig_shape(small_file):
    path, w, info = small_file
    # the conv weight was stored as ComfyUI-GGUF stores it: rows of 256, its shape in the metadata
    assert info["model.diffusion_model.conv.weight"] == ("Q8_0", (9, 256), (16, 16, 3, 3))
    assert info["model.diffusion_model.fc.weight"] == ("Q8_0", (32, 256), None)
    assert info["model.diffusion_model.small.weight"][0] == "F32"
    sd, meta = G.gguf_state_dict(str(path))
    assert meta["general.architecture"] == "sd1"
    assert set(sd) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias", "small.weight"}
    conv, fc = sd["conv.weight"], sd["fc.weight"]
    assert isinstance(conv, G.PackedWeight) and conv.fmt == "q8_0"
    assert conv.shape == (16, 16, 3, 3) and conv.ndim == 4 and conv.size(1) == 16
    assert fc.shape == (32, 256) and fc.packed().dtype == torch.uint8 and fc.packed().numel() == 32 * 256 // 32 * 34
    # the bytes are gguf's own Q8_0: dequantized they are the weights to Q8_0's precision, exactly as
    # ops/quant.py quantizes them
    for key, t in (("conv.weight", conv), ("fc.weight", fc)):
        ref = w["model.diffusion_model." + key]
        q = quant.quantize(ref, "q8_0")
        np.testing.assert_array_equal(t.packed().numpy(), q.data)
        d = quant_ops.dequantize(t.packed(), None, "q8_0", t.shape)
        assert float(np.abs(d.numpy() - ref).max()) <= np.abs(ref).max() / 127
    assert not isinstance(sd["small.weight"], G.PackedWeight) and sd["small.weight"].dtype == torch.float32
    np.testing.assert_array_equal(sd["conv.bias"].numpy(), w["model.diffusion_model.conv.bias"])


def test_bad_files_are_node_errors_naming_the_file(tmp_path, small_file):
    path, _, _ = small_file
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(path.read_bytes()[:200])
    with pytest.raises(NodeError, match=r"Load GGUF Model \(AnyDevice\): input 'gguf_name' = 'broken.gguf': "
                                        r"is not a GGUF file this node can read: .*truncated"):
        G.gguf_state_dict(str(bad), "Load GGUF Model (AnyDevice)")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, really")
    with pytest.raises(NodeError, match="'junk.gguf'.*first 4 bytes must be b'GGUF'"):
        G.gguf_state_dict(str(junk))
    # an orig_shape whose size is not the tensor's
    w = gguf.GGUFWriter(str(tmp_path / "lie.gguf"), "sd1")
    w.add_array("comfy.gguf.orig_shape.x.weight", [3, 5])
    w.add_tensor("x.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(NodeError, match=r"'lie.gguf'.*tensor 'x.weight' of shape \(4, 32\) cannot have the original "
                                        r"shape \(3, 5\)"):
        G.gguf_state_dict(str(tmp_path / "lie.gguf"))


class Linear(G.PackedLinear, torch.nn.Linear):
    pass


class Conv2d(G.PackedConv2d, torch.nn.Conv2d):
    pass


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = Conv2d(16, 16, 3, padding=1)
        self.fc = Linear(256, 32)
        self.small = Linear(8, 4, bias=False)

    def forward(self, x):
        y = F.silu(self.conv(x))           # (N, 16, 8, 8)
        y = self.fc(y.reshape(-1, 256))     # (N*2, 32)
        return self.small(y[:, :8])


def _net(path):
    sd, _ = G.gguf_state_dict(str(path))
    m = Net().eval()
    m.load_state_dict(sd)
    return m, sd


def _reference(sd, x):
    """float64 with the weights dequantized by ops/quant.py."""
    def deq(t):
        if isinstance(t, G.PackedWeight):
            return torch.from_numpy(quant.QTensor(t.fmt, t.shape, t.packed().numpy()).dequantize()).double()
        return t.double()
    y = F.silu(F.conv2d(x.double(), deq(sd["conv.weight"]), sd["conv.bias"].double(), padding=1))
    y = F.linear(y.reshape(-1, 256), deq(sd["fc.weight"]), sd["fc.bias"].double())
    return F.linear(y[:, :8], deq(sd["small.weight"]))


def _x():
    return torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(4))


def test_packed_layers_load_and_run_the_dequantized_weights(small_file):
    m, sd = _net(small_file[0])
    assert m.conv.weight.dtype == torch.uint8 and m.conv.quant_shape == (16, 16, 3, 3) and m.conv.packed_now()
    assert m.fc.weight.dtype == torch.uint8 and not m.small.packed_now()
    x = _x()
    with torch.no_grad():
        y = m(x)
        ref = _reference(sd, x)
    assert float((y.double() - ref).norm() / ref.norm()) <= 1e-6


def test_packed_layers_compiled_on_opencl_keep_the_weights_packed(small_file):
    try:
        be = get_backend("opencl")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"opencl unavailable: {exc}")
    m, sd = _net(small_file[0])
    x = _x()
    Weights.of(be).clear()
    t = torch.compile(m, backend="anydevice", options={"device": be})
    with torch.no_grad():
        y = t(x)
        eager = m(x)
    assert float((y - eager).norm() / eager.norm()) <= 2e-6
    rep = C.report(t)
    assert rep["fallbacks"] == {} and rep["eager_fallbacks"] == 0
    kinds = [type(e[2]).__name__ for e in Weights.of(be)._entries.values()]
    if "q8_0" in be.caps.quant_formats:
        assert kinds.count("CLQuant") == 2, kinds
    packed = sd["conv.weight"].packed().numel() + sd["fc.weight"].packed().numel()
    assert rep["weights_bytes"] == packed + 4 * (16 + 32 + 4 * 8)


def test_patcher_protocol_applies_a_patch_to_the_dequantized_weight(small_file):
    """What ComfyUI's ModelPatcher.patch_weight_to_device does with a layer that has convert_weight /
    set_weight (model_patcher.get_key_weight), and unpatch_model after it; and the low-VRAM path's
    weight_function (LowVramPatch: convert_func, then set_func(return_weight=True))."""
    m, sd = _net(small_file[0])
    x = _x()
    fc = m.fc
    packed = fc.weight
    delta = torch.randn(32, 256, generator=torch.Generator().manual_seed(9)) * 0.01
    # patch_weight_to_device: temp = weight.to(float32, copy=True); convert; calculate_weight; set_func
    temp = fc.convert_weight(packed.to(torch.float32, copy=True), inplace=True)
    fc.set_weight(temp + delta, inplace_update=False, seed=1)
    assert fc.weight.dtype == torch.float32 and not fc.packed_now()
    with torch.no_grad():
        y = m(x)
    sd_patched = dict(sd, **{"fc.weight": temp.double() + delta.double()})
    ref = _reference(sd_patched, x)
    assert float((y.double() - ref).norm() / ref.norm()) <= 1e-6
    # unpatch_model: set_attr_param(model, key, backup) puts the packed parameter back
    fc.weight = packed
    assert fc.packed_now()
    with torch.no_grad():
        assert float((m(x).double() - _reference(sd, x)).norm()) <= 1e-6 * float(_reference(sd, x).norm())
    # low VRAM: a weight function on the float weight, per forward
    fc.weight_function = [lambda w: fc.set_weight(fc.convert_weight(w.to(torch.float32, copy=True)) + delta,
                                                  return_weight=True)]
    with torch.no_grad():
        y2 = m(x)
    assert fc.packed_now()  # the packed weight stays; the patch is applied per forward
    assert float((y2.double() - ref).norm() / ref.norm()) <= 1e-6
    with pytest.raises(ValueError, match="cannot be patched in place"):
        fc.set_weight(temp, inplace_update=True)
