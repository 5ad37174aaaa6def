"""The bundled VAE workflow (example_workflows/api/vae_decode_anydevice.json: ComfyUI's VAELoader ->
"VAE on AnyDevice" -> VAEEncode of the photo -> VAEDecode -> SaveImage) in a real ComfyUI server
(COMFYUI_DIR; skipped without it), with a VAE file made from ComfyUI's SD1.x config with random
weights (tests/support/e2e_helpers.write_random_vae) in the server's throwaway vae folder. Its PNG is compared
with ComfyUI's own eager path (the same VAE, no AnyDevice node) within 1/255; then the models are
unloaded (POST /free) and the workflow runs again, loading and compiling afresh, to the same image."""
from __future__ import annotations

import importlib.util
import io
import json
import sys
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image

import e2e_helpers as H

from repo_paths import ROOT  # noqa: E402
WF = ROOT / "example_workflows"
API = WF / "api"
NAME = "vae_decode_anydevice"

_comfy, _why = H.comfy_dir()
pytestmark = [pytest.mark.e2e]
RUN_TIMEOUT = 900  # a first encode + decode compiles both graphs (numpy: about a minute each here)


def _builder():
    if "anydevice_wf_build_models" not in sys.modules:
        spec = importlib.util.spec_from_file_location("anydevice_wf_build_models", WF / "build_models.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["anydevice_wf_build_models"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["anydevice_wf_build_models"]


def test_vae_workflow_files_are_what_the_generator_makes():
    """UI workflow, API twin and thumbnail as example_workflows/build_models.py writes them."""
    bm = _builder()
    (g,) = bm.graphs()
    assert g.name == NAME and bm.VAE_FILE == H.RANDOM_VAE
    saved = json.loads((WF / f"{NAME}.json").read_text())
    made = g.ui(saved)
    assert made == saved
    assert json.loads((API / f"{NAME}.json").read_text()) == g.api()
    assert 0.6 <= saved["extra"]["ds"]["scale"] <= 1.0
    assert (WF / f"{NAME}.jpg").read_bytes()[:2] == b"\xff\xd8"
    api = g.api()
    assert [api[k]["class_type"] for k in sorted(api, key=int)] == [
        "LoadImage", "VAELoader", "AnyDeviceDeviceSelect", "AnyDeviceVAE", "VAEEncode", "VAEDecode", "SaveImage"]
    # the users' path: VAELoader, then our node, whose VAE both VAEEncode and VAEDecode use
    assert api["4"]["inputs"]["vae"] == ["2", 0] and api["5"]["inputs"]["vae"] == ["4", 0]
    assert api["6"]["inputs"]["vae"] == ["4", 0] and api["2"]["inputs"]["vae_name"] == H.RANDOM_VAE


def test_vae_twin_is_not_runnable_headless():
    assert NAME not in H.runnable_twins() and len(H.runnable_twins()) >= 6


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def srv():
    if _comfy is None:
        pytest.skip(_why or "no ComfyUI")
    s = H.server()
    try:
        H.write_random_vae(s)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return s


def twin(srv) -> dict:
    """The bundled API twin reading the photo at 64x64 (H.small_photo): the workflow as bundled, so
    the three runs (eager, ours, ours after unloading) cost seconds, not minutes, on a CPU."""
    prompt = json.loads((API / f"{NAME}.json").read_text())
    assert prompt["1"]["class_type"] == "LoadImage"
    prompt["1"]["inputs"]["image"] = H.small_photo(srv)
    return prompt


def eager_twin(prompt: dict) -> dict:
    """The same workflow through ComfyUI's own path: the VAE straight from VAELoader."""
    p = json.loads(json.dumps(prompt))
    for nid in ("5", "6"):
        p[nid]["inputs"]["vae"] = ["2", 0]
    del p["3"], p["4"]
    p["7"]["inputs"]["filename_prefix"] = "anydevice_vae_eager"
    return p


def png(srv, hist, nid="7") -> np.ndarray:
    (img,) = hist["outputs"][nid]["images"]
    return np.asarray(Image.open(io.BytesIO(srv.view(img))).convert("RGB")).astype(np.int16)


def _run(srv, prompt):
    code, r = srv.post_prompt(prompt)
    assert code == 200, json.dumps(r)[:3000]
    hist = srv.wait_history(r["prompt_id"], timeout=RUN_TIMEOUT)
    assert hist["status"]["status_str"] == "success", json.dumps(hist["status"])[:3000]
    return hist


@pytest.fixture(scope="module")
def runs(srv):
    prompt = twin(srv)
    out = {"eager": _run(srv, eager_twin(prompt))}
    t0 = time.time()
    out["anydevice"] = _run(srv, prompt)
    out["anydevice_s"] = time.time() - t0
    out["log_after_first"] = srv.log()
    return out


def test_vae_workflow_matches_comfyuis_eager_path(srv, runs):
    eager, ours = png(srv, runs["eager"]), png(srv, runs["anydevice"])
    assert ours.shape == eager.shape == (64, 64, 3)
    d = np.abs(ours - eager)
    assert d.max() <= 1, f"VAE on AnyDevice differs from eager by up to {d.max()}/255"
    assert 10 < eager.std()  # a random VAE's output: not a flat image (the comparison means something)
    badge = runs["anydevice"]["outputs"]["4"]["anydevice"][0]
    assert badge["backend"] and badge["op"] == "compile", badge
    assert "compiled for" in " ".join(runs["anydevice"]["outputs"]["4"]["text"]), runs["anydevice"]["outputs"]["4"]
    # no fallback to eager PyTorch and no host fallbacks said in the server log
    log = runs["log_after_first"]
    assert "cannot run on the AnyDevice backend" not in log, log[-3000:]
    assert "VAE on AnyDevice:" not in log, log[-3000:]
    (H.ARTIFACTS).mkdir(exist_ok=True)
    Image.fromarray(ours.astype(np.uint8)).save(H.ARTIFACTS / "vae_decode_anydevice_server.png")


def test_vae_workflow_after_unloading_models(srv, runs):
    """POST /free (unload models, drop the cache): VAELoader loads the file again, the node compiles the new
    VAE, and the image is the same."""
    req = urllib.request.Request(srv.url + "/free", json.dumps({"unload_models": True, "free_memory": True}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    prompt = twin(srv)
    prompt["7"]["inputs"]["filename_prefix"] = "anydevice_vae_again"
    hist = _run(srv, prompt)
    assert np.abs(png(srv, hist) - png(srv, runs["anydevice"])).max() <= 1
    cached = [m for m in hist["status"]["messages"] if m[0] == "execution_cached"]
    assert not cached or "4" not in cached[0][1]["nodes"], cached  # the node ran again


def test_vae_node_with_a_bad_vae_is_an_execution_error_naming_the_node(srv):
    """An empty VAE (what a checkpoint without one gives) cannot come from VAELoader; a bad device can: a
    DeviceSelect value the server does not list fails ComfyUI's validation, naming the input."""
    prompt = json.loads((API / f"{NAME}.json").read_text())
    prompt["3"]["inputs"]["device"] = "no-such-backend"
    code, r = srv.post_prompt(prompt)
    assert code == 400 and "3" in r.get("node_errors", {}), r
    assert "no-such-backend" in json.dumps(r["node_errors"]["3"])
