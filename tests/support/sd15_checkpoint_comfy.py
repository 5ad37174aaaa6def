"""Writes an SD1.5-architecture checkpoint with random weights, run under ComfyUI's own python (cwd: the
ComfyUI checkout, or ``COMFYUI_DIR``): ``python tests/support/sd15_checkpoint_comfy.py PATH``. Prints one line
``RESULT {json}``.

Everything is ComfyUI's own: the SD15 model config (``comfy.model_detection.model_config_from_unet_config``
of the UNet config ComfyUI's detection gives an SD1.5 checkpoint, which must come back as
``comfy.supported_models.SD15``), its BaseModel (``cfg.get_model``) in a ModelPatcher, the CLIP-L text
encoder (``comfy.sd.CLIP(target=cfg.clip_target())``), the SD1.x VAE (``comfy.sd.VAE`` from
tests/support/model_nodes_comfy.random_sd1_vae_state_dict, the random VAE of the VAE workflow), saved by
``comfy.sd.save_checkpoint`` in ComfyUI's checkpoint key layout (what CheckpointLoaderSimple loads and
detects as SD15). float32, about 4.3 GB.

ComfyUI builds its models with ``comfy.ops`` layers that leave the weights uninitialised (torch.empty):
:func:`randomize` fills every parameter, seeded, so that activations stay O(1): weights ~ N(0, 1/fan_in),
biases ~ N(0, 0.02**2), GroupNorm/LayerNorm weights ~ 1 + N(0, 0.05**2) and biases ~ N(0, 0.02**2).
tests/support/e2e_helpers.write_random_sd15_checkpoint runs it (the tests/e2e/test_sd15_e2e.py checkpoint).
"""
from __future__ import annotations

import json
import logging
import math
import sys
import time

import model_nodes_comfy as mnc  # noqa: F401 - ComfyUI on sys.path, its args parsed off and --cpu set

import torch  # noqa: E402

import comfy.model_detection  # noqa: E402
import comfy.model_management  # noqa: E402
import comfy.model_patcher  # noqa: E402
import comfy.sd  # noqa: E402
import comfy.supported_models  # noqa: E402

#: what comfy.model_detection detects for an SD1.5 checkpoint (its SD15 config in
#: unet_config_from_diffusers_unet, dtype left out: float32)
SD15_UNET_CONFIG = {
    "use_checkpoint": False, "image_size": 32, "out_channels": 4, "use_spatial_transformer": True,
    "legacy": False, "adm_in_channels": None, "in_channels": 4, "model_channels": 320,
    "num_res_blocks": [2, 2, 2, 2], "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0], "channel_mult": [1, 2, 4, 4],
    "transformer_depth_middle": 1, "use_linear_in_transformer": False, "context_dim": 768, "num_heads": 8,
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "use_temporal_attention": False, "use_temporal_resblock": False,
}
NORMS = (torch.nn.GroupNorm, torch.nn.LayerNorm)


def randomize(module: torch.nn.Module, seed: int) -> int:
    """Every parameter of ``module`` (but 0-dim ones, e.g. CLIP's logit_scale, which ComfyUI sets)
    drawn from a generator seeded with ``seed``, in ``named_modules`` order. Returns how many
    parameters it set."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for _, m in module.named_modules():
            norm = isinstance(m, NORMS)
            for name, p in m.named_parameters(recurse=False):
                if p.ndim == 0:
                    continue
                if norm and name == "weight":
                    p.normal_(1.0, 0.05, generator=g)
                elif p.ndim >= 2:
                    p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()), generator=g)
                else:
                    p.normal_(0.0, 0.02, generator=g)
                n += p.numel()
    return n


def build(seed: int = 0):
    """(model patcher, CLIP, VAE, model config) of the random SD1.5 model."""
    cpu = torch.device("cpu")
    cfg = comfy.model_detection.model_config_from_unet_config(dict(SD15_UNET_CONFIG))
    if type(cfg) is not comfy.supported_models.SD15:
        raise RuntimeError(f"ComfyUI takes the SD1.5 UNet config for {type(cfg).__name__}, not SD15")
    model = cfg.get_model({}, device=cpu)
    randomize(model.diffusion_model, seed)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    clip = comfy.sd.CLIP(target=cfg.clip_target(), model_options={"dtype": torch.float32, "load_device": cpu,
                                                                   "offload_device": cpu, "initial_device": cpu})
    randomize(clip.cond_stage_model, seed + 1)
    vae = comfy.sd.VAE(sd=mnc.random_sd1_vae_state_dict(seed + 2))
    return patcher, clip, vae, cfg


def write(path: str, seed: int = 0) -> dict:
    t0 = time.time()
    patcher, clip, vae, cfg = build(seed)
    t_build = time.time() - t0
    dm = patcher.model.diffusion_model
    # what CheckpointLoaderSimple will see: ComfyUI's detection of these UNet weights
    detected = comfy.model_detection.model_config_from_unet(dm.state_dict(), "")
    if type(detected) is not comfy.supported_models.SD15:
        raise RuntimeError(f"ComfyUI detects the random UNet as {type(detected).__name__}, not SD15")
    t1 = time.time()
    comfy.sd.save_checkpoint(path, patcher, clip, vae)
    return {"path": path, "unet_params": sum(p.numel() for p in dm.parameters()),
            "clip_params": sum(p.numel() for p in clip.cond_stage_model.parameters()),
            "vae_params": sum(p.numel() for p in vae.first_stage_model.parameters()),
            "model_type": patcher.model.model_type.name, "config": type(cfg).__name__,
            "build_s": round(t_build, 1), "save_s": round(time.time() - t1, 1)}


def main():
    logging.basicConfig(level=logging.WARNING)
    if len(sys.argv) != 2:
        raise SystemExit("usage: sd15_checkpoint_comfy.py PATH")
    print("RESULT " + json.dumps(write(sys.argv[1])), flush=True)


if __name__ == "__main__":
    main()
