"""nodes/models/ggml_bridge.py with the real ComfyUI-GGUF (city96) inside a real ComfyUI (COMFYUI_DIR), in
ComfyUI's own python (tests/support/gguf_comfy.py ``--city96``). ComfyUI-GGUF is found at
``COMFYUI_GGUF_DIR``, else ``$COMFYUI_DIR/custom_nodes/ComfyUI-GGUF``; without it (or ComfyUI, or the gguf
package in ComfyUI's venv) the tests skip and say why.

The tiny SD1.5-config UNet of test_gguf_comfy.py, written as a Q8_0 GGUF file, is loaded by ComfyUI-GGUF's
own loader (``gguf_sd_loader``, ``GGMLOps`` layers, ``GGUFModelPatcher``: what its "Unet Loader (GGUF)"
node gives) and run through "Model on AnyDevice" (opencl); the reference is the dequantized state dict in
ComfyUI's own layers. One apply_model call each: compiled, with a LoRA-like patch on two weights (ComfyUI-GGUF
puts it on the GGMLTensor), after the patch is taken off."""
from __future__ import annotations


import pytest

import e2e_helpers as H
from repo_paths import TESTS

_comfy, _why = H.comfy_dir()
BACKEND = "opencl"


def _comfy_run(*args, timeout=900):
    return H.run_in_comfy(_comfy, TESTS / "support" / "gguf_comfy.py", *args, log_name="ggml_bridge.log", timeout=timeout)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import gguf_sd15
    nodes_dir, why = H.comfyui_gguf_dir(_comfy)
    if _comfy is not None and nodes_dir is None:
        pytest.skip(why)
    return gguf_sd15.tiny_comfy_case(_comfy, _why, tmp_path_factory.mktemp("ggml_bridge"), BACKEND, _comfy_run,
                                     lambda path: ("--city96", path, BACKEND, nodes_dir))


def test_comfyui_gguf_model_runs_compiled_with_its_blocks_packed(results):
    r = results
    q8 = sum(1 for v in r["info"].values() if v[0] == "Q8_0")
    assert r["types"]["Q8_0"] == q8 == r["ggml_layers"] > 10, r
    assert "ComfyUI-GGUF's packed weights kept packed" in r["node_text"][0]
    assert r["failed"] is None and r["fallbacks"] == {} and r["eager_fallbacks"] == 0, r
    # the model is the dequantized one, to float32 rounding (ComfyUI-GGUF's eager path dequantizes in half)
    assert r["compiled_rel"] <= 1e-5, r["compiled_rel"]
    assert r["eager_rel"] <= 2e-3, r["eager_rel"]
    # every Q8_0 weight reached the device packed (its bytes, no float copy)
    assert r["packed_entries"] == q8, (r["packed_entries"], q8)
    if "q8_0" in r["quant_formats"]:
        assert "CLQuant" in r["entry_kinds"], r["entry_kinds"]
    assert r["input_untouched"]


def test_comfyui_gguf_lora_patch_applies_and_comes_off(results):
    r = results
    assert r["patch_changed"] > 1e-3, r["patch_changed"]
    assert r["compiled_patched_rel"] <= 1e-4, r["compiled_patched_rel"]
    assert r["float_weights_patched"] >= 1  # the patched quantized weight runs in float (dequantize + patch)
    assert r["compiled_unpatched_rel"] <= 1e-5 and r["float_weights_unpatched"] == 0, r
    assert r["compiled_half_strength_rel"] <= 1e-4, r["compiled_half_strength_rel"]  # not the 1.0 patch again
    assert r["failed_end"] is None
