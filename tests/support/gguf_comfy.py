"""Run by tests/nodes/models/test_gguf_comfy.py under ComfyUI's own python (cwd: the ComfyUI checkout).

``--write-sd PATH``: the tiny SD1.5-config UNet of model_nodes_comfy.py (random weights) as a safetensors
state dict with ComfyUI's checkpoint prefix ``model.diffusion_model.`` (the test turns it into a GGUF
file with the gguf package, which ComfyUI's venv lacks).

``GGUF_PATH BACKEND``: "Load GGUF Model (AnyDevice)" loads the file (its folder added to ComfyUI's
diffusion_models paths); the reference is the same state dict dequantized (ops/quant.py) and loaded by
ComfyUI with its own layers. Compared on one ``apply_model`` call: the GGUF model eager (the packed
layers' custom ops), through "Model on AnyDevice" on BACKEND (report: fallbacks, the packed weights in
the Weights caches, weights_bytes), and both with a LoRA-like patch (add_patches on a conv and a linear
weight) and after it is taken off again. Prints one line ``RESULT {json}``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import model_nodes_comfy as mnc  # noqa: F401 - ComfyUI on sys.path, its args parsed off and --cpu set

import torch  # noqa: E402

import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.supported_models  # noqa: E402
import folder_paths  # noqa: E402

PATCHED = ("diffusion_model.input_blocks.1.0.in_layers.2.weight",   # a conv, packed
           "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight")  # a linear, packed


def write_sd(path):
    from safetensors.torch import save_file
    dm = mnc.tiny_model_patcher().model.diffusion_model
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in dm.state_dict().items()}, path)


def build(sd, ops):
    """The tiny SD15 model (model_nodes_comfy.TINY_UNET) with ``ops`` as custom_operations, loaded from sd
    as comfy.sd.load_diffusion_model_state_dict loads a detected model."""
    cfg = comfy.supported_models.SD15(dict(mnc.TINY_UNET))
    cfg.custom_operations = ops
    cpu = torch.device("cpu")
    model = cfg.get_model({}, device=cpu)
    model.load_model_weights(sd, "")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def apply(patcher, x, t, ctx):
    with torch.inference_mode():
        comfy.model_management.load_models_gpu([patcher])
        to = dict(patcher.model_options.get("transformer_options", {}))
        to["wrappers"] = patcher.wrappers
        return patcher.model.apply_model(x, t, c_crossattn=ctx, transformer_options=to)


def inputs():
    """The tiny UNet's apply_model inputs (x, t, context) and the generator the patches are drawn from."""
    g = torch.Generator().manual_seed(2)
    return torch.randn(2, 4, 16, 16, generator=g), torch.tensor([500.0, 20.0]), torch.randn(2, 8, 32, generator=g), g


def on_anydevice(model, be_name: str):
    """Model on AnyDevice (float32) on ``model``: (the compiled MODEL, the node's ui), the Weights caches
    emptied so the first call's uploads are this model's."""
    from anydevice.backend.compile.weights import Weights
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    with torch.inference_mode():
        res = NODE_CLASS_MAPPINGS["AnyDeviceModel"]().run(model=model, device={"name": be_name}, dtype="float32")
    for w in list(Weights._all.values()):
        w.clear()
    return res["result"][0], res["ui"]


def compiled_report(cm, out: dict):
    """What Model on AnyDevice's guard and the Weights caches say after one call, into ``out``; the guard."""
    from anydevice.backend import compile as adc
    from anydevice.backend.compile.weights import Weights
    gd = cm.model_options["anydevice_guards"][0]
    rep = adc.report(gd.compiled)
    out["fallbacks"], out["eager_fallbacks"] = rep["fallbacks"], rep["eager_fallbacks"]
    out["weights_bytes"] = rep["weights_bytes"]
    entries = [e for w in Weights._all.values() for e in w._entries.values()]
    out["entry_kinds"] = sorted({type(e[2]).__name__ for e in entries})
    out["packed_entries"] = sum(1 for e in entries if e[1][0] == "packed")
    return gd


def patched(models, shapes, g, strength=1.0):
    """Clones of ``models`` with the same LoRA-like "diff" patch on the PATCHED weights (shapes: the state
    dict's, keys without ``diffusion_model.``)."""
    diffs = {k: (torch.randn(tuple(shapes[k[len("diffusion_model."):]].shape), generator=g) * 0.05,) for k in PATCHED}
    out = [m.clone() for m in models]
    for p in out:
        p.add_patches(diffs, strength)
    return out, diffs


def run(gguf_path: str, be_name: str) -> dict:
    mnc.load_pack()  # the pack as ``anydevice``
    from anydevice.backend.compile import quant_ops
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    from anydevice.nodes.models import gguf as G
    folder_paths.add_model_folder_path("diffusion_models", str(Path(gguf_path).parent))
    name = Path(gguf_path).name
    out = {"listed": name in NODE_CLASS_MAPPINGS["AnyDeviceGGUFLoader"].INPUT_TYPES()["required"]["gguf_name"][0]}
    # the node: ComfyUI's detection does not know the tiny config (the e2e test loads a real SD1.5 file)
    try:
        NODE_CLASS_MAPPINGS["AnyDeviceGGUFLoader"]().run(gguf_name=name)
    except ValueError as exc:
        out["node_error"] = str(exc)
    sd, _ = G.gguf_state_dict(gguf_path)
    packed_bytes = sum(v.packed().numel() for v in sd.values() if isinstance(v, G.PackedWeight))
    float_sd = {k: (quant_ops.dequantize(v.packed(), None, v.fmt, v.shape) if isinstance(v, G.PackedWeight) else v)
                for k, v in sd.items()}
    gm, ref = build(dict(sd), G.comfy_ops()), build(float_sd, None)
    dm = gm.model.diffusion_model
    out["packed_layers"] = sum(1 for m in dm.modules() if isinstance(m, G.PackedLayer) and m.packed_now())
    out["float_bytes_of_packed"] = sum(4 * m.weight.numel() for m in ref.model.diffusion_model.modules()
                                       if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and m.weight.numel() > 1024)
    out["packed_bytes"] = packed_bytes
    x, t, ctx, g = inputs()
    y_ref = apply(ref, x, t, ctx)
    out["eager_rel"] = mnc.rel(apply(gm, x, t, ctx), y_ref)
    cm, _ = on_anydevice(gm, be_name)
    out["compiled_rel"] = mnc.rel(apply(cm, x, t, ctx), y_ref)
    compiled_report(cm, out)
    # a LoRA-like patch ("diff") on a packed conv and a packed linear weight, on the reference alike
    (ref_p, g_p, c_p), _ = patched((ref, gm, cm), sd, g)
    y_ref_p = apply(ref_p, x, t, ctx)
    out["patch_changed"] = mnc.rel(y_ref_p, y_ref)
    out["eager_patched_rel"] = mnc.rel(apply(g_p, x, t, ctx), y_ref_p)
    out["compiled_patched_rel"] = mnc.rel(apply(c_p, x, t, ctx), y_ref_p)
    out["compiled_unpatched_rel"] = mnc.rel(apply(cm, x, t, ctx), y_ref)
    out["repacked_layers"] = sum(1 for m in dm.modules() if isinstance(m, G.PackedLayer) and m.packed_now())
    out["eager_unpatched_rel"] = mnc.rel(apply(gm, x, t, ctx), y_ref)
    return out


def import_city96(nodes_dir: str):
    """ComfyUI-GGUF (city96) imported from its folder as the package ``comfyui_gguf``: (ops, loader, nodes)."""
    import importlib.util
    d = Path(nodes_dir)
    spec = importlib.util.spec_from_file_location("comfyui_gguf", d / "__init__.py", submodule_search_locations=[str(d)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_gguf"] = mod
    spec.loader.exec_module(mod)
    from comfyui_gguf import loader, nodes, ops
    return ops, loader, nodes


def run_city96(gguf_path: str, be_name: str, nodes_dir: str) -> dict:
    """The GGUF file loaded by ComfyUI-GGUF's own loader (gguf_sd_loader, GGMLOps, GGUFModelPatcher, as its
    "Unet Loader (GGUF)" does, on the tiny config) through "Model on AnyDevice"; the reference is the
    dequantized state dict in ComfyUI's own layers."""
    mnc.load_pack()
    from anydevice.backend.compile import quant_ops
    from anydevice.nodes.models import gguf as G
    ops, loader, gnodes = import_city96(nodes_dir)
    sd = loader.gguf_sd_loader(gguf_path)
    types = {}
    for v in sd.values():
        n = getattr(getattr(v, "tensor_type", None), "name", "?")
        types[n] = types.get(n, 0) + 1
    ours, _ = G.gguf_state_dict(gguf_path)
    float_sd = {k: (quant_ops.dequantize(v.packed(), None, v.fmt, v.shape) if isinstance(v, G.PackedWeight) else v)
                for k, v in ours.items()}
    gp = gnodes.GGUFModelPatcher.clone(build(sd, ops.GGMLOps()))
    ref = build(float_sd, None)
    out = {"types": types, "ggml_layers": sum(1 for m in gp.model.diffusion_model.modules() if isinstance(m, ops.GGMLLayer)
                                              and m.is_ggml_quantized())}
    x, t, ctx, g = inputs()
    y_ref = apply(ref, x, t, ctx)
    out["eager_rel"] = mnc.rel(apply(gp, x, t, ctx), y_ref)
    cm, ui = on_anydevice(gp, be_name)
    out["node_text"] = ui["text"]
    out["compiled_rel"] = mnc.rel(apply(cm, x, t, ctx), y_ref)
    gd = compiled_report(cm, out)
    out["failed"] = gd.failed
    bridge = gd.original.__dict__["_anydevice_guards"]["ggml"][1]
    (ref_p, g_p, c_p), diffs = patched((ref, gp, cm), ours, g)
    y_ref_p = apply(ref_p, x, t, ctx)
    out["patch_changed"] = mnc.rel(y_ref_p, y_ref)
    out["eager_patched_rel"] = mnc.rel(apply(g_p, x, t, ctx), y_ref_p)
    out["compiled_patched_rel"] = mnc.rel(apply(c_p, x, t, ctx), y_ref_p)
    out["float_weights_patched"] = bridge.float_weights
    out["compiled_unpatched_rel"] = mnc.rel(apply(cm, x, t, ctx), y_ref)
    out["float_weights_unpatched"] = bridge.float_weights
    # the same patch again at another strength: new patch objects, the cached float weight must not be reused
    ref_h, c_h = ref.clone(), cm.clone()
    for p in (ref_h, c_h):
        p.add_patches(diffs, 0.5)
    y_ref_h = apply(ref_h, x, t, ctx)
    out["compiled_half_strength_rel"] = mnc.rel(apply(c_h, x, t, ctx), y_ref_h)
    out["failed_end"] = gd.failed
    out["input_untouched"] = all(type(m.weight).__name__ == "GGMLTensor" for m in gp.model.diffusion_model.modules()
                                 if isinstance(m, ops.GGMLLayer) and m.is_ggml_quantized())
    return out


def main():
    if sys.argv[1] == "--city96":
        os.environ.pop("ANYDEVICE_BACKEND", None)
        print("RESULT " + json.dumps(run_city96(*sys.argv[2:5])), flush=True)
        return
    if sys.argv[1] == "--write-sd":
        write_sd(sys.argv[2])
        print("RESULT {}", flush=True)
        return
    os.environ.pop("ANYDEVICE_BACKEND", None)
    print("RESULT " + json.dumps(run(sys.argv[1], sys.argv[2])), flush=True)


if __name__ == "__main__":
    main()
