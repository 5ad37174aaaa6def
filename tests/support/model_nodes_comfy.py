"""Run by tests/nodes/models/test_compiled.py under ComfyUI's own python (cwd: the ComfyUI checkout, argv[1]: the
AnyDevice backends to try, comma-separated). Prints one line ``RESULT {json}``.

* ComfyUI's SD1.x VAE (``comfy.sd.VAE`` from a state dict in ComfyUI's key layout: the SD1.x config,
  random weights) through "VAE on AnyDevice": decode and encode vs the same VAE eager.
* A tiny ``UNetModel`` (the SD1.5 model config with a small unet_config, random weights) in a
  ``ModelPatcher``, sampled 2 steps with ComfyUI's own sampler (comfy.sample.sample, euler, cfg 2)
  through "Model on AnyDevice" vs eager; then with a LoRA-like weight patch (add_patches, a "diff"),
  then without it again.

* Quantized weights (``quant_case``): the tiny UNet through "Model on AnyDevice" with weights=q8_0 (a LoRA-like
  patch applied and taken off), and a scaled-fp8 UNet made by ComfyUI's own scaled_fp8_ops.

* A RealESRGAN compact net loaded by spandrel's ModelLoader through "Upscale Model on AnyDevice", run by
  ComfyUI's own ImageUpscaleWithModel on two image sizes vs the original model.

``--write-vae PATH`` writes the random SD1.x VAE (ComfyUI's key layout, safetensors) to PATH instead
(tests/support/e2e_helpers.write_random_vae: the file the bundled VAE workflow loads).
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
COMFY = Path(os.environ.get("COMFYUI_DIR") or os.getcwd()).resolve()
sys.path.insert(0, str(COMFY))

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing(False)
import comfy.cli_args  # noqa: E402

comfy.cli_args.args.cpu = True
import torch  # noqa: E402

import comfy.model_management  # noqa: E402,F401
import comfy.model_patcher  # noqa: E402
import comfy.sample  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.supported_models  # noqa: E402


sys.path.append(str(ROOT / "tools"))
from _pack import load_pack  # noqa: E402  (the pack as ``anydevice``)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def randomize(module: torch.nn.Module, seed: int, out_gain: dict | None = None) -> None:
    """Random weights that keep activations O(1): weights ~ U(+-sqrt(3/fan_in)), biases small, norms 1/0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                bound = math.sqrt(3.0 / fan_in)
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            for k, gain in (out_gain or {}).items():
                if name.startswith(k):
                    p.mul_(gain)


SD1_VAE_KEYS_FROM = "decoder.conv_in.weight"


def random_sd1_vae_state_dict(seed: int = 0) -> dict:
    """An SD1.x VAE state dict in ComfyUI's (ldm) key layout, random weights (what VAELoader loads)."""
    from comfy.ldm.models.autoencoder import AutoencoderKL
    ddconfig = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 128,
                "ch_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0}
    m = AutoencoderKL(ddconfig=ddconfig, embed_dim=4)
    randomize(m, seed, {"decoder.conv_out": 0.3})
    return {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}


def vae_case(pack, be_name: str, sd: dict) -> dict:
    from anydevice.backend import compile as adc
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    from anydevice.nodes.models import compiled as mn
    import comfy.ldm.modules.diffusionmodules.model as vm
    vae = comfy.sd.VAE(sd=sd)
    fsm = vae.first_stage_model
    before = {k: v.clone() for k, v in fsm.state_dict().items()}
    attn_before = [m.optimized_attention for m in fsm.modules() if isinstance(m, vm.AttnBlock)]
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 4, 16, 16, generator=g)
    img = torch.rand(1, 128, 128, 3, generator=g)
    node = NODE_CLASS_MAPPINGS["AnyDeviceVAE"]()
    out = {}
    with torch.inference_mode():
        new = node.run(vae=vae, device={"name": be_name}, dtype="float32")["result"][0]
        ref_raw = fsm.decode(z)
        ref_img = vae.decode(z)
        ref_lat = vae.encode(img)
        y_raw = new.first_stage_model.decode(z)
        be = pack.backend.get_backend(be_name)
        n_w = len(adc.Weights.of(be))
        y_img = new.decode(z)
        out["weight_uploads_second_decode"] = len(adc.Weights.of(be)) - n_w
        y_lat = new.encode(img)
    guards = [new.first_stage_model.decoder, new.first_stage_model.encoder]
    reps = [adc.report(gd.compiled) for gd in guards]
    out.update({
        "decode_rel": rel(y_raw, ref_raw), "decode_image_rel": rel(y_img, ref_img),
        "decode_image_maxdiff": float((y_img - ref_img).abs().max()),
        "encode_rel": rel(y_lat, ref_lat), "image_shape": list(y_img.shape), "latent_shape": list(y_lat.shape),
        "fallbacks": {k: v for r in reps for k, v in r["fallbacks"].items()},
        "eager_fallbacks": sum(r["eager_fallbacks"] for r in reps), "graphs": sum(r["graphs"] for r in reps),
        "guard_fallbacks": mn.fallbacks_of(new),
        "attention_blocks_pytorch": sum(1 for m in guards[0].compiled._orig_mod.modules()
                                        if isinstance(m, vm.AttnBlock) and m.optimized_attention is vm.pytorch_attention),
        "original_unchanged": all(torch.equal(v, before[k]) for k, v in fsm.state_dict().items())
        and vae.first_stage_model is fsm and not isinstance(vars(fsm).get("decoder"), mn.Guarded),
        "original_attention_kept": [m.optimized_attention for m in fsm.modules()
                                    if isinstance(m, vm.AttnBlock)] == attn_before,
    })
    return out


TINY_UNET = {"use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
             "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 32,
             "num_res_blocks": [1, 1], "transformer_depth": [1, 1], "channel_mult": [1, 2],
             "transformer_depth_middle": 1, "use_linear_in_transformer": False, "context_dim": 32,
             "transformer_depth_output": [1, 1, 1, 1], "use_temporal_attention": False,
             "use_temporal_resblock": False}


def tiny_model_patcher(seed: int = 0):
    cfg = comfy.supported_models.SD15(dict(TINY_UNET))
    model = cfg.get_model({}, device=torch.device("cpu"))
    randomize(model.diffusion_model, seed, {"out.": 0.5})
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def sample(patcher, latent, cond, uncond, seed=3):
    noise = comfy.sample.prepare_noise(latent, seed)
    with torch.inference_mode():
        return comfy.sample.sample(patcher, noise, 2, 2.0, "euler", "normal", [[cond, {}]], [[uncond, {}]], latent,
                                   denoise=1.0, disable_pbar=True, seed=seed)


def unet_case(pack, be_name: str) -> dict:
    from anydevice.backend import compile as adc
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    from anydevice.nodes.models import compiled as mn
    base = tiny_model_patcher()
    dm = base.model.diffusion_model
    before = {k: v.clone() for k, v in dm.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    latent = torch.zeros(1, 4, 16, 16)
    cond, uncond = torch.randn(1, 8, 32, generator=g), torch.randn(1, 8, 32, generator=g)
    ref = sample(base, latent, cond, uncond)
    node = NODE_CLASS_MAPPINGS["AnyDeviceModel"]()
    with torch.inference_mode():
        m = node.run(model=base, device={"name": be_name}, dtype="float32")["result"][0]
    y = sample(m, latent, cond, uncond)
    gd = m.model_options["anydevice_guards"][0]
    rep = adc.report(gd.compiled)
    out = {"sample_rel": rel(y, ref), "steps": 2, "calls": rep["calls"], "fallbacks": rep["fallbacks"],
           "graphs": rep["graphs"], "eager_fallbacks": rep["eager_fallbacks"], "guard_fallbacks": mn.fallbacks_of(gd), "transfers": rep["transfers"],
           "torch_compile_kwargs": {k: v for k, v in m.model_options["torch_compile_kwargs"].items() if k != "options"}}
    # a LoRA-like patch: a "diff" on the first conv, through the patcher (the eager twin gets the same)
    key = "diffusion_model.input_blocks.0.0.weight"
    diff = torch.randn(dm.input_blocks[0][0].weight.shape, generator=g) * 0.2
    ref_p = base.clone()
    ref_p.add_patches({key: (diff,)}, 1.0)
    m_p = m.clone()
    m_p.add_patches({key: (diff,)}, 1.0)
    eager_p = sample(ref_p, latent, cond, uncond)
    y_p = sample(m_p, latent, cond, uncond)
    out["patched_rel"] = rel(y_p, eager_p)
    out["patch_changed"] = rel(y_p, y)
    y_again = sample(m, latent, cond, uncond)  # the patch is taken off again when the unpatched clone loads
    out["after_unpatch_rel"] = rel(y_again, ref)
    comfy.model_management.unload_all_models()
    # the model's own output (one apply_model call, the patcher's wrappers and transformer_options), a
    # sharper comparison than the sampled latent, where the noise dominates
    x = torch.randn(2, 4, 16, 16, generator=g)
    t = torch.tensor([500.0, 20.0])
    ctx = torch.cat([cond, uncond])
    calls0 = adc.report(gd.compiled)["calls"]
    with torch.inference_mode():
        comfy.model_management.load_models_gpu([m])
        a_ref = base.model.apply_model(x, t, c_crossattn=ctx)
        to = dict(m.model_options["transformer_options"])
        to["wrappers"] = m.wrappers  # as comfy.sampler_helpers.prepare_model_patcher merges them
        a_y = m.model.apply_model(x, t, c_crossattn=ctx, transformer_options=to)
    out["apply_rel"] = rel(a_y, a_ref)
    out["apply_calls"] = adc.report(gd.compiled)["calls"] - calls0
    out["graphs_after_patches"] = adc.report(gd.compiled)["graphs"]
    out["original_unchanged"] = all(torch.equal(v, before[k]) for k, v in dm.state_dict().items()) and \
        not base.model_options.get("anydevice_guards") and "torch_compile_kwargs" not in base.model_options and \
        "optimized_attention_override" not in base.model_options.get("transformer_options", {})
    return out


def quant_case(pack, be_name: str) -> dict:
    """Quantized weights through "Model on AnyDevice": (1) weights=q8_0 on the tiny UNet: sampled vs eager
    (the quantization's error), a LoRA-like patch applied (dequantize-patch-requantize: the patched float
    weight is quantized again) and taken off (the same result as before the patch); (2) a scaled-fp8 model
    made by ComfyUI's own scaled_fp8_ops (model_config.scaled_fp8, as its checkpoint loaders set it): its
    float8 weights stay float8 on the device (lossless), and the result is eager's."""
    from anydevice.backend import compile as adc
    from anydevice.backend.ops import quant
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    node = NODE_CLASS_MAPPINGS["AnyDeviceModel"]()
    g = torch.Generator().manual_seed(2)
    latent = torch.zeros(1, 4, 16, 16)
    cond, uncond = torch.randn(1, 8, 32, generator=g), torch.randn(1, 8, 32, generator=g)
    out = {}
    base = tiny_model_patcher()
    ref = sample(base, latent, cond, uncond)
    with torch.inference_mode():
        m = node.run(model=base, device={"name": be_name}, dtype="float32", weights="q8_0")["result"][0]
    y = sample(m, latent, cond, uncond)
    gd = m.model_options["anydevice_guards"][0]
    graphs = adc._graphs_of(gd.compiled)
    out["q8_0_rel"] = rel(y, ref)
    out["q8_0_nodes"] = sum(len(gr.quant_nodes) for gr in graphs)
    out["q8_0_text"] = " ".join(node.run(model=base, device={"name": be_name}, dtype="float32",
                                         weights="q8_0")["ui"]["text"])
    out["q8_0_fallbacks"] = adc.report(gd.compiled)["fallbacks"]
    key = "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"
    w = base.model.diffusion_model.input_blocks[1][1].transformer_blocks[0].attn1.to_q.weight
    diff = torch.randn(w.shape, generator=g) * 0.5
    ref_p, m_p = base.clone(), m.clone()
    ref_p.add_patches({key: (diff,)}, 1.0)
    m_p.add_patches({key: (diff,)}, 1.0)
    eager_p = sample(ref_p, latent, cond, uncond)
    y_p = sample(m_p, latent, cond, uncond)
    out["q8_0_patched_rel"] = rel(y_p, eager_p)
    out["q8_0_patch_changed"] = rel(y_p, y)
    out["q8_0_unpatched_rel"] = rel(sample(m, latent, cond, uncond), y)
    comfy.model_management.unload_all_models()
    torch._dynamo.reset()
    # (2) scaled fp8: ComfyUI's own ops, float8 weights and a scale_weight per linear layer
    cfg = comfy.supported_models.SD15(dict(TINY_UNET))
    cfg.scaled_fp8 = torch.float8_e4m3fn
    model = cfg.get_model({}, device=torch.device("cpu"))
    randomize(model.diffusion_model, 5, {"out.": 0.5})
    n8 = 0
    with torch.no_grad():
        for mod in model.diffusion_model.modules():
            if getattr(mod, "scale_weight", None) is not None:
                mod.scale_weight.fill_(0.75)
                n8 += 1
    cpu = torch.device("cpu")
    p8 = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    ref8 = sample(p8, latent, cond, uncond)
    with torch.inference_mode():
        m8 = node.run(model=p8, device={"name": be_name}, dtype="float32")["result"][0]
    y8 = sample(m8, latent, cond, uncond)
    g8 = m8.model_options["anydevice_guards"][0]
    graphs = adc._graphs_of(g8.compiled)
    out["fp8_layers"] = n8
    out["fp8_rel"] = rel(y8, ref8)
    out["fp8_kept"] = sum(len(gr.float8) for gr in graphs)
    out["fp8_packed_formats"] = sorted({a.fmt for gr in graphs for a in gr._fold_dev.values() if quant.is_quantized(a)})
    out["fp8_fallbacks"] = adc.report(g8.compiled)["fallbacks"]
    comfy.model_management.unload_all_models()
    return out


def upscale_case(pack, be_name: str) -> dict:
    """A RealESRGAN compact net (random weights) loaded from its state dict by spandrel's ModelLoader (as
    ComfyUI's Load Upscale Model does), through the node, run by ComfyUI's Upscale Image (using Model) on two
    image sizes, vs the same node with the original model."""
    from spandrel import ImageModelDescriptor, ModelLoader
    from spandrel.architectures.Compact.__arch.SRVGG import SRVGGNetCompact
    from comfy_extras.nodes_upscale_model import ImageUpscaleWithModel
    from anydevice.backend import compile as adc
    from anydevice.nodes import NODE_CLASS_MAPPINGS
    from anydevice.nodes.models import compiled as mn
    torch.manual_seed(0)
    net = SRVGGNetCompact(num_in_ch=3, num_out_ch=3, num_feat=16, num_conv=4, upscale=2, act_type="prelu")
    randomize(net, 5)
    desc = ModelLoader().load_from_state_dict(net.state_dict())
    assert isinstance(desc, ImageModelDescriptor)
    before = {k: v.clone() for k, v in desc.model.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    out = {"rel": [], "arch": type(desc.model).__name__}
    with torch.inference_mode():
        new = NODE_CLASS_MAPPINGS["AnyDeviceUpscaleModel"]().run(upscale_model=desc, device={"name": be_name}, dtype="float32")["result"][0]
        for h, w in ((40, 48), (52, 36)):
            img = torch.rand(1, h, w, 3, generator=g)
            ref = ImageUpscaleWithModel.execute(upscale_model=desc, image=img).result[0]
            y = ImageUpscaleWithModel.execute(upscale_model=new, image=img).result[0]
            out["rel"].append(rel(y, ref))
            out.setdefault("shapes", []).append(list(y.shape))
    rep = adc.report(new.model.compiled)
    out.update({"fallbacks": rep["fallbacks"], "eager_fallbacks": rep["eager_fallbacks"], "calls": rep["calls"],
                "guard_fallbacks": mn.fallbacks_of(new.model),
                "original_unchanged": desc.model is not new.model and not isinstance(desc.model, mn.Guarded)
                and all(torch.equal(v, before[k]) for k, v in desc.model.state_dict().items())})
    return out


def write_vae(path: str) -> None:
    """The random SD1.x VAE as a safetensors file in ComfyUI's key layout (what VAELoader loads)."""
    import safetensors.torch
    safetensors.torch.save_file(random_sd1_vae_state_dict(), path)


def main():
    logging.basicConfig(level=logging.WARNING)
    if len(sys.argv) > 2 and sys.argv[1] == "--write-vae":
        write_vae(sys.argv[2])
        return
    devices = [d for d in (sys.argv[1] if len(sys.argv) > 1 else "numpy").split(",") if d]
    pack = load_pack()
    from anydevice.backend import AnyDeviceError
    res = {"vae": {}, "unet": {}, "upscale": {}, "quant": {}, "skipped": {}, "torch": torch.__version__}
    sd = random_sd1_vae_state_dict()
    for d in devices:
        try:
            pack.backend.get_backend(d)
        except AnyDeviceError as exc:
            res["skipped"][d] = str(exc)
            continue
        torch._dynamo.reset()
        res["vae"][d] = vae_case(pack, d, sd)
        torch._dynamo.reset()
        res["unet"][d] = unet_case(pack, d)
        torch._dynamo.reset()
        res["upscale"][d] = upscale_case(pack, d)
        torch._dynamo.reset()
        res["quant"][d] = quant_case(pack, d)
        print(d, json.dumps({k: res[k][d] for k in ("vae", "unet", "upscale", "quant")}), file=sys.stderr, flush=True)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
