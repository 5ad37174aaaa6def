"""nodes/models/gguf.py inside ComfyUI (COMFYUI_DIR, found as tests/support/e2e_helpers.py finds it; skipped
without it), in ComfyUI's own python (tests/support/gguf_comfy.py): a tiny SD1.5-config UNet written as a
GGUF file (tests/support/gguf_sd15.py: Q8_0, shape-fixed rows of 256 with comfy.gguf.orig_shape), listed by
"Load GGUF Model (AnyDevice)" and built from its state dict and layers; the reference is ComfyUI's own model of the same weights
dequantized. One apply_model call each: eager, through "Model on AnyDevice" (opencl), with a LoRA-like
patch on a packed conv and linear weight, and after the patch is taken off."""
from __future__ import annotations


import pytest

import e2e_helpers as H
from repo_paths import TESTS

_comfy, _why = H.comfy_dir()
SUPPORT = TESTS / "support"
BACKEND = "opencl"


def _comfy_run(*args, timeout=900):
    return H.run_in_comfy(_comfy, TESTS / "support" / "gguf_comfy.py", *args, log_name="gguf_comfy.log", timeout=timeout)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import gguf_sd15
    return gguf_sd15.tiny_comfy_case(_comfy, _why, tmp_path_factory.mktemp("gguf_comfy"), BACKEND, _comfy_run,
                                     lambda path: (path, BACKEND))


def test_loader_lists_the_file_and_builds_the_model_with_packed_layers(results):
    r = results
    assert r["listed"], "the .gguf file is not in the node's list"
    q8 = sum(1 for v in r["info"].values() if v[0] == "Q8_0")
    assert sum(1 for v in r["info"].values() if v[2] is not None) > 0  # some weights stored in rows of 256
    assert r["packed_layers"] == q8 > 10, (r["packed_layers"], q8)
    # ComfyUI's detection does not know the tiny config: a node error naming the file (the e2e test loads SD1.5)
    assert r["node_error"].startswith("Load GGUF Model (AnyDevice): input 'gguf_name' = 'tiny_q8_0.gguf': is no "
                                      "diffusion model ComfyUI recognises (architecture 'sd1')"), r["node_error"]


def test_eager_and_compiled_equal_the_dequantized_model(results):
    r = results
    assert r["eager_rel"] <= 1e-5, r["eager_rel"]
    assert r["compiled_rel"] <= 1e-4, r["compiled_rel"]
    assert r["fallbacks"] == {} and r["eager_fallbacks"] == 0, r["fallbacks"]


def test_compiled_model_keeps_the_weights_packed(results):
    r = results
    assert r["packed_entries"] == r["packed_layers"], (r["packed_entries"], r["packed_layers"])
    if "q8_0" in r["quant_formats"]:
        assert "CLQuant" in r["entry_kinds"], r["entry_kinds"]
    # the packed weights' bytes (34 per 32 values) are what the device holds for them, not float32's
    assert r["packed_bytes"] < 0.27 * r["float_bytes_of_packed"]
    assert r["packed_bytes"] <= r["weights_bytes"] < r["packed_bytes"] + 0.2 * r["float_bytes_of_packed"], r


def test_lora_patch_applies_to_packed_layers_and_comes_off(results):
    r = results
    assert r["patch_changed"] > 1e-3, r["patch_changed"]  # the patch matters
    assert r["eager_patched_rel"] <= 1e-5, r["eager_patched_rel"]
    assert r["compiled_patched_rel"] <= 1e-4, r["compiled_patched_rel"]
    assert r["compiled_unpatched_rel"] <= 1e-4 and r["eager_unpatched_rel"] <= 1e-5, r
    assert r["repacked_layers"] == r["packed_layers"]
