"""A GGUF UNet through "Load GGUF Model (AnyDevice)" in a real ComfyUI server (COMFYUI_DIR; skipped
without it).

The GGUF file is the UNet of tests/e2e/test_sd15_e2e.py's random SD1.5 checkpoint
(e2e_helpers.write_random_sd15_checkpoint) written as ComfyUI-GGUF's tools write one
(tests/support/gguf_sd15.py: conv / linear weights Q8_0, those whose last dimension is not a multiple of
256 stored in rows of 256 with ``comfy.gguf.orig_shape.*``, 1-D and small tensors F32), in the server's
models/unet folder. Workflows (2 euler steps, cfg 4, 64x64, float32 model nodes, as test_sd15_e2e):

* gguf-opencl: Load GGUF Model -> Model on AnyDevice (opencl) -> KSampler -> VAE Decode -> Save Image,
  CLIP and VAE from the checkpoint;
* ckpt-opencl: the same with the checkpoint's own (float32) UNet: the reference. The GGUF image must be
  within PSNR >= 35 dB of it (the Q8_0 rounding of the weights is the only difference);
* gguf-eager: the GGUF model without Model on AnyDevice (ComfyUI runs the packed layers' custom ops
  eagerly, dequantizing per op): within 2/255 of gguf-opencl (the same weights, two implementations).

The AnyDevice runs must have no execution error, no traceback and no host fallback said in the log;
the loader's text names the packed weights. PSNRs and timings go to test-artifacts/gguf_e2e.json.
"""
from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

import e2e_helpers as H
import gguf_sd15
from test_sd15_e2e import FALLBACK_SAID, NEGATIVE, POSITIVE, _free, png

_comfy, _why = H.comfy_dir()
pytestmark = [pytest.mark.e2e]
GGUF_NAME = "anydevice_random_sd15_q8_0.gguf"
RUN_TIMEOUT = 900
MIN_PSNR = 35.0
TOL_EAGER = 2
MODEL_NODE, LOADER_NODE, SAVE_NODE = "6", "11", "10"
REPORT: dict = {"seconds": {}, "psnr_db": {}, "max_abs_diff": {}}


def _save_report():
    H.ARTIFACTS.mkdir(exist_ok=True)
    (H.ARTIFACTS / "gguf_e2e.json").write_text(json.dumps(REPORT, indent=1))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module")
def srv():
    if _comfy is None:
        pytest.skip(_why or "no ComfyUI")
    pytest.importorskip("gguf", reason="the gguf package writes the test's GGUF file")
    pytest.importorskip("safetensors", reason="safetensors reads the checkpoint's UNet")
    s = H.server()
    t0 = time.time()
    try:
        ckpt = H.write_random_sd15_checkpoint(s)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    unet = s.tmp / "models" / "unet"
    unet.mkdir(parents=True, exist_ok=True)
    path = unet / GGUF_NAME
    if not path.is_file():
        tmp = path.with_suffix(".part")
        info = gguf_sd15.write_from_checkpoint(ckpt, tmp)
        tmp.replace(path)
        REPORT["tensors"] = {t: sum(1 for v in info.values() if v[0] == t) for t in {v[0] for v in info.values()}}
        REPORT["shape_fixed"] = sum(1 for v in info.values() if v[2] is not None)
    REPORT["seconds"]["write_files"] = round(time.time() - t0, 1)
    yield s
    if s.alive():
        _free(s)


def prompt(source: str, device: str | None, prefix: str) -> dict:
    """``source``: "gguf" (the pack's loader), "city96" (ComfyUI-GGUF's "Unet Loader (GGUF)") or "ckpt" (the
    checkpoint's UNet); ``device`` None: no Model on AnyDevice."""
    model = [LOADER_NODE, 0] if source in ("gguf", "city96") else ["1", 0]
    p = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": H.RANDOM_SD15}},
        LOADER_NODE: {"class_type": "AnyDeviceGGUFLoader", "inputs": {"gguf_name": GGUF_NAME}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": POSITIVE, "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": NEGATIVE, "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {"class_type": "AnyDeviceDeviceSelect", "inputs": {"device": device}},
        MODEL_NODE: {"class_type": "AnyDeviceModel", "inputs": {"model": model, "device": ["5", 0], "dtype": "float32"}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": [MODEL_NODE, 0], "seed": 42, "steps": 2, "cfg": 4.0, "sampler_name": "euler",
            "scheduler": "normal", "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
            "denoise": 1.0}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["7", 0], "vae": ["1", 2]}},
        SAVE_NODE: {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": prefix}},
    }
    if source == "city96":
        p[LOADER_NODE] = {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": GGUF_NAME}}
    elif source != "gguf":
        del p[LOADER_NODE]
    if device is None:
        p["7"]["inputs"]["model"] = model
        del p["5"], p[MODEL_NODE]
    return p


_runs: dict = {}


def _run(srv, name: str, source: str, device: str | None) -> dict:
    if name in _runs:
        return _runs[name]
    start = len(srv.log())
    t0 = time.time()
    code, r = srv.post_prompt(prompt(source, device, f"anydevice_gguf_{name}"))
    assert code == 200, json.dumps(r)[:3000]
    hist = srv.wait_history(r["prompt_id"], timeout=RUN_TIMEOUT)
    REPORT["seconds"][f"run_{name}"] = round(time.time() - t0, 1)
    _save_report()
    log = srv.log()[start:]
    err = H.execution_error(hist)
    assert err is None and hist["status"]["status_str"] == "success", json.dumps(err or hist["status"])[:3000]
    assert "Traceback" not in log, log[-4000:]
    out = _runs[name] = {"hist": hist, "log": log, "image": png(srv, hist)}
    return out


def _opencl_available(srv):
    info = srv.get("/object_info/AnyDeviceDeviceSelect")["AnyDeviceDeviceSelect"]["input"]["required"]["device"]
    if "opencl" not in info[0] or info[1]["anydevice_status"].get("opencl", "").startswith("unavailable"):
        pytest.skip(f"backend opencl is not available in this server: {info[1]['anydevice_status'].get('opencl')}")


def test_gguf_loader_lists_the_file_and_packs_the_weights(srv):
    spec = srv.get("/object_info/AnyDeviceGGUFLoader")["AnyDeviceGGUFLoader"]["input"]["required"]["gguf_name"]
    assert GGUF_NAME in spec[0], spec
    _opencl_available(srv)
    run = _run(srv, "gguf-opencl", "gguf", "opencl")
    text = " ".join(run["hist"]["outputs"][LOADER_NODE]["text"])
    # SD1.5's UNet: every conv and linear weight of more than 1024 values is Q8_0 (a few hundred of them)
    m = re.search(r"(\d+) packed weights \(q8_0, ([\d.]+) MiB\), (\d+) float tensors", text)
    assert m, text
    # SD1.5's UNet: 860M values, nearly all in conv / linear weights: about 1.06 bytes per value as Q8_0
    n, mib, floats = int(m[1]), float(m[2]), int(m[3])
    assert n >= 200 and floats >= 100 and 800 < mib < 900, text
    assert "model_type EPS" in run["log"], run["log"][-3000:]


def test_gguf_model_on_opencl_matches_the_checkpoint(srv):
    _opencl_available(srv)
    ours = _run(srv, "gguf-opencl", "gguf", "opencl")
    ref = _run(srv, "ckpt-opencl", "ckpt", "opencl")
    for run in (ours, ref):
        said = [ln for ln in run["log"].splitlines() if any(s in ln for s in FALLBACK_SAID)]
        assert not said, said
    node = ours["hist"]["outputs"][MODEL_NODE]
    assert node["anydevice"][0]["backend"] == "opencl" and "compiled for opencl" in " ".join(node["text"]), node
    assert ours["image"].shape == ref["image"].shape == (64, 64, 3)
    assert ref["image"].std() > 8, "the reference image is flat: the comparison would mean nothing"
    p = psnr(ours["image"], ref["image"])
    REPORT["psnr_db"]["gguf_q8_0-vs-checkpoint"] = round(p, 2)
    REPORT["max_abs_diff"]["gguf_q8_0-vs-checkpoint"] = int(np.abs(ours["image"] - ref["image"]).max())
    _save_report()
    assert p >= MIN_PSNR, f"PSNR {p:.2f} dB from the checkpoint's image"
    assert p < 80, "identical images: the GGUF weights were not quantized?"


def test_gguf_model_eager_in_comfyui_matches_opencl(srv):
    _opencl_available(srv)
    ours = _run(srv, "gguf-opencl", "gguf", "opencl")
    eager = _run(srv, "gguf-eager", "gguf", None)
    d = np.abs(ours["image"] - eager["image"])
    REPORT["max_abs_diff"]["gguf-eager-vs-opencl"] = int(d.max())
    REPORT["psnr_db"]["gguf-eager-vs-opencl"] = round(psnr(ours["image"], eager["image"]), 2)
    _save_report()
    assert d.max() <= TOL_EAGER, f"eager and opencl differ by up to {d.max()}/255"


def test_comfyui_gguf_loader_model_runs_packed_on_opencl(srv):
    """ComfyUI-GGUF's own "Unet Loader (GGUF)" (GGMLTensor weights, GGMLOps layers; linked into the server
    where e2e_helpers.comfyui_gguf_dir finds it) -> Model on AnyDevice: its Q8_0 blocks stay packed (the node
    says so), no fallback, and the image equals the pack's own loader's (the same weights) to 2/255."""
    if srv.comfyui_gguf is None:
        pytest.skip(H.comfyui_gguf_dir(srv.comfy)[1])
    _opencl_available(srv)
    theirs = _run(srv, "city96-opencl", "city96", "opencl")
    ours = _run(srv, "gguf-opencl", "gguf", "opencl")
    said = [ln for ln in theirs["log"].splitlines() if any(s in ln for s in FALLBACK_SAID)]
    assert not said, said
    text = " ".join(theirs["hist"]["outputs"][MODEL_NODE]["text"])
    assert "ComfyUI-GGUF's packed weights kept packed" in text, text
    d = np.abs(theirs["image"] - ours["image"])
    REPORT["max_abs_diff"]["comfyui_gguf-vs-anydevice_loader"] = int(d.max())
    REPORT["psnr_db"]["comfyui_gguf-vs-anydevice_loader"] = round(psnr(theirs["image"], ours["image"]), 2)
    _save_report()
    assert d.max() <= TOL_EAGER, f"ComfyUI-GGUF's model and the pack's loader's differ by up to {d.max()}/255"
