"""The headless runner: every API twin runs and its outputs are checked against PyTorch references;
core-node support, refusals, file naming, the CLI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from anydevice.nodes.compute import presets as P
from anydevice import cli
from anydevice.nodes.headless import core_nodes, runner

import e2e_helpers as H

from repo_paths import ROOT  # noqa: E402
WF = ROOT / "example_workflows"
API = WF / "api"
PHOTO = WF / "input" / "photo.png"
ALL_TWINS = sorted(p.stem for p in API.glob("*.json"))
#: the twins the headless runner can run (vae_decode_anydevice needs ComfyUI's VAELoader: tests/e2e/test_model_e2e.py)
TWINS = H.runnable_twins()


def photo() -> torch.Tensor:
    return torch.from_numpy(np.asarray(Image.open(PHOTO).convert("RGB"), np.float32) / 255.0)[None]


def png(path) -> np.ndarray:
    return np.asarray(Image.open(path)).astype(np.int16)


def to_png(x: torch.Tensor) -> np.ndarray:
    return np.clip(255.0 * x[0].numpy(), 0, 255).astype(np.uint8).astype(np.int16)


def saved(res, prefix):
    files = [s for s in res.saved if s["filename"].startswith(prefix + "_")]
    assert len(files) == 1, res.saved
    return png(files[0]["path"])


def dw(x_nhwc, k, mode="reflect"):
    """Depthwise 'same' conv of an IMAGE with a 2-D kernel, as Conv2D's defaults do it."""
    k = torch.as_tensor(k)
    kh, kw = k.shape
    x = x_nhwc.permute(0, 3, 1, 2)
    c = x.shape[1]
    x = F.pad(x, ((kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2), mode=mode)
    return F.conv2d(x, k.expand(c, 1, kh, kw), groups=c).permute(0, 2, 3, 1)


def psnr(a, b):
    return float(10 * torch.log10(1.0 / F.mse_loss(a, b)))


def loss_values(res):
    return {res_title: ui["loss"][0]["value"] for res_title, ui in
            ((nid, ui) for nid, ui in res.ui.items()) if "loss" in ui}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Each API twin run once through the runner (module-scoped: they take a few seconds together)."""
    out = {}
    for name in TWINS:
        d = tmp_path_factory.mktemp(name)
        prompt = runner.load_workflow(API / f"{name}.json")
        out[name] = (prompt, runner.run_prompt(prompt, output_dir=d, workflow_path=API / f"{name}.json"))
    return out


def test_there_are_six_twins_each_with_a_ui_workflow_and_thumbnail():
    assert len(TWINS) >= 6
    assert set(ALL_TWINS) - set(TWINS) == {"vae_decode_anydevice"}  # the only one that needs ComfyUI
    for name in ALL_TWINS:
        ui = json.loads((WF / f"{name}.json").read_text())
        assert ui["nodes"] and "links" in ui
        assert (WF / f"{name}.jpg").is_file()
        api = json.loads((API / f"{name}.json").read_text())
        assert {n["class_type"] for n in api.values()} == {n["type"] for n in ui["nodes"]}
        assert len(api) == len(ui["nodes"])
    assert PHOTO.is_file() and PHOTO.stat().st_size <= 300_000


def test_ui_workflows_widget_values_match_the_api_twin():
    from anydevice.nodes import NODE_CLASS_MAPPINGS as N
    for name in ALL_TWINS:
        ui = json.loads((WF / f"{name}.json").read_text())
        api = json.loads((API / f"{name}.json").read_text())
        for node in ui["nodes"]:
            if node["type"] not in N:
                continue
            spec = N[node["type"]].INPUT_TYPES()
            widgets = [k for s in ("required", "optional") for k, v in spec.get(s, {}).items()
                       if isinstance(v[0], list) or v[0] in ("INT", "FLOAT", "STRING", "BOOLEAN")]
            vals = list(node["widgets_values"])
            for w in widgets:
                v = vals.pop(0)
                assert api[str(node["id"])]["inputs"][w] == v, (name, node["id"], w)
                if w == "seed":
                    assert vals.pop(0) == "fixed"
            assert not vals


def test_edge_detection(ran):
    _, res = ran["edge_detection"]
    x = photo()
    g = x @ torch.tensor(P.COLOR_PRESETS["grayscale"][0]).T
    gx, gy = dw(g, P.kernel_preset("sobel_x")), dw(g, P.kernel_preset("sobel_y"))
    mag = torch.sqrt(gx ** 2 + gy ** 2)
    norm = (mag - mag.min()) / (mag.max() - mag.min())
    out = saved(res, "anydevice_edges")
    assert out.shape == (256, 256, 3)
    assert np.abs(out - to_png(norm)).max() <= 1
    info = next(u["info"][0] for u in res.ui.values() if "info" in u)
    assert info["kind"] == "IMAGE" and info["shape"] == [1, 256, 256, 3]
    assert info["max"] == pytest.approx(float(mag.max()), rel=1e-4) and info["min"] >= 0


def test_blur_sharpen_metrics(ran):
    prompt, res = ran["blur_sharpen_metrics"]
    x = photo()
    blur = dw(x, P.kernel_preset("gaussian", 7, 2.0))
    sharp = dw(blur, P.kernel_preset("sharpen")).clamp(0, 1)
    by_title = {prompt[nid]["_meta"]["title"]: ui["loss"][0]["value"] for nid, ui in res.ui.items() if "loss" in ui}
    assert by_title["PSNR blurred"] == pytest.approx(psnr(blur, x), rel=1e-4)
    assert by_title["PSNR sharpened"] == pytest.approx(psnr(sharp, x), rel=1e-4)
    assert 20 < by_title["PSNR blurred"] < 40
    assert 0 < by_title["SSIM blurred"] < by_title["SSIM sharpened"] < 1
    assert by_title["PSNR sharpened"] > by_title["PSNR blurred"]
    assert np.abs(saved(res, "anydevice_blurred") - to_png(blur)).max() <= 1
    assert np.abs(saved(res, "anydevice_sharpened") - to_png(sharp)).max() <= 1


def test_color_grading(ran):
    _, res = ran["color_grading"]
    x = photo()
    sepia = (x @ torch.tensor(P.COLOR_PRESETS["sepia"][0]).T).clamp(0, 1)
    gray = x @ torch.tensor(P.COLOR_PRESETS["grayscale"][0]).T
    warm = (x @ torch.tensor([[1.15, 0.05, 0], [0, 1.0, 0], [0, 0.05, 0.8]]).T
            + torch.tensor([0.02, 0, -0.02])).clamp(0, 1)
    assert np.abs(saved(res, "anydevice_sepia") - to_png(sepia)).max() <= 1
    g = saved(res, "anydevice_grayscale")
    assert np.abs(g - to_png(gray)).max() <= 1 and (g[..., 0] == g[..., 2]).all()
    assert np.abs(saved(res, "anydevice_warm") - to_png(warm)).max() <= 1


def test_random_cnn_features(ran):
    _, res = ran["random_cnn_features"]
    x = photo().permute(0, 3, 1, 2)
    w1 = torch.from_numpy(P.seeded_uniform(1, (8, 3, 3, 3), 27))
    b1 = torch.from_numpy(P.seeded_uniform(2, (8,), 27))
    a1 = F.relu(F.conv2d(x, w1, b1, stride=2, padding=1))
    w2 = torch.from_numpy(P.seeded_uniform(2, (16, 8, 3, 3), 72))
    a2 = F.gelu(F.conv2d(a1, w2, stride=2, padding=1))
    info = next(u["info"][0] for u in res.ui.values() if "info" in u)
    assert info["kind"] == "TENSOR" and info["shape"] == [1, 16, 64, 64]
    assert info["mean"] == pytest.approx(float(a2.mean()), rel=1e-3, abs=1e-5)

    def grid(a):
        lo = a.amin(dim=(2, 3), keepdim=True)
        hi = a.amax(dim=(2, 3), keepdim=True)
        a = (a - lo) / (hi - lo).clamp_min(1e-12)
        n, c, h, w = a.shape
        cols = int(np.ceil(np.sqrt(c)))
        rows = int(np.ceil(c / cols))
        a = torch.cat([a, a.new_zeros(n, rows * cols - c, h, w)], 1)
        g = a.reshape(n, rows, cols, h, w).permute(0, 1, 3, 2, 4).reshape(n, rows * h, cols * w, 1)
        return g.expand(-1, -1, -1, 3)

    l1, l2 = saved(res, "anydevice_cnn_layer1"), saved(res, "anydevice_cnn_layer2")
    assert l1.shape == (3 * 128, 3 * 128, 3) and l2.shape == (4 * 64, 4 * 64, 3)
    assert np.abs(l1 - to_png(grid(a1))).max() <= 1
    assert np.abs(l2 - to_png(grid(a2))).max() <= 2


def test_two_backends_agree(ran):
    prompt, res = ran["two_backends_agree"]
    by_title = {prompt[nid]["_meta"]["title"]: ui["loss"][0]["value"] for nid, ui in res.ui.items() if "loss" in ui}
    assert by_title["MSE A vs B (~0)"] < 1e-10
    assert by_title["L1 A vs B (~0)"] < 1e-5
    used = {ui["anydevice"][0]["backend"] for nid, ui in res.ui.items()
            if prompt[nid]["class_type"] == "AnyDeviceConv2D"}
    assert used == {"numpy", "cpu"}
    x = photo()
    ref = torch.tanh(dw(x, P.kernel_preset("gaussian", 5, 1.5))) @ torch.tensor(P.COLOR_PRESETS["sepia"][0]).T
    assert np.abs(saved(res, "anydevice_backend_a") - to_png(ref)).max() <= 1


def test_latent_filter(ran):
    prompt, res = ran["latent_filter"]
    infos = {prompt[nid]["_meta"]["title"]: ui["info"][0] for nid, ui in res.ui.items() if "info" in ui}
    empty = infos["filtered empty latent"]
    assert empty["kind"] == "LATENT" and empty["shape"] == [1, 4, 32, 32]
    assert empty["min"] == pytest.approx(0.25) and empty["max"] == pytest.approx(0.25)
    blurred = next(v for k, v in infos.items() if k != "filtered empty latent")
    z = torch.from_numpy(P.seeded_tensor(3, (1, 4, 32, 32), "normal"))
    k = torch.from_numpy(P.kernel_preset("gaussian", 5, 1.0))
    ref = F.conv2d(F.pad(z, (2, 2, 2, 2), mode="reflect"), k.expand(4, 1, 5, 5), groups=4)
    assert blurred["kind"] == "LATENT" and blurred["shape"] == [1, 4, 32, 32]
    assert blurred["mean"] == pytest.approx(float(ref.mean()), abs=1e-5)
    assert blurred["max"] == pytest.approx(float(ref.max()), rel=1e-4)
    assert saved(res, "anydevice_latent").shape == (64, 64, 3)


# ---------------------------------------------------------------------------------------------
def test_cli_main_prints_backend_times_and_paths(tmp_path, capsys):
    rc = cli.run_main([str(API / "color_grading.json"), "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "backend: using " in out
    assert "Linear (AnyDevice)" in out and " ms" in out
    for prefix in ("anydevice_sepia", "anydevice_grayscale", "anydevice_warm"):
        assert (tmp_path / f"{prefix}_00001_.png").is_file()
        assert f"saved: {tmp_path / (prefix + '_00001_.png')}" in out
    # ComfyUI's counter: a second run adds _00002_
    assert cli.run_main([str(API / "color_grading.json"), "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "anydevice_sepia_00002_.png").is_file()


def test_cli_input_override(tmp_path, capsys):
    img = tmp_path / "small.png"
    Image.new("RGB", (40, 30), (255, 0, 0)).save(img)
    rc = cli.run_main([str(API / "color_grading.json"), "--input", str(img), "--output-dir", str(tmp_path / "o")])
    assert rc == 0
    g = png(tmp_path / "o" / "anydevice_grayscale_00001_.png")
    assert g.shape == (30, 40, 3) and abs(int(g[0, 0, 0]) - round(0.299 * 255)) <= 1


def test_anydevice_run_through_the_cli_entry(tmp_path):
    code = ("import sys; sys.path.insert(0, 'tests'); import conftest; from anydevice.cli import main; "
            f"sys.exit(main(['run', {str(API / 'latent_filter.json')!r}, '--output-dir', {str(tmp_path)!r}, '--json']))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)  # stdout holds the JSON alone (`anydevice run WF --json | jq`)
    assert "anydevice run" in p.stderr and "saved: " in p.stderr
    assert summary["saved"][0]["filename"] == "anydevice_latent_00001_.png"
    assert any("info" in ui for ui in summary["ui"].values())


def test_core_nodes_empty_image_and_preview(tmp_path):
    prompt = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 6, "batch_size": 2, "color": 0xFF8000}},
        "2": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
    }
    res = runner.run_prompt(prompt, output_dir=tmp_path)
    info = res.ui["2"]["info"][0]
    assert info["shape"] == [2, 6, 8, 3] and info["max"] == 1.0 and info["min"] == 0.0
    assert len(res.saved) == 2 and all(s["type"] == "temp" for s in res.saved)
    assert png(res.saved[0]["path"])[0, 0].tolist() == [255, 128, 0]


def test_only_needed_nodes_run(tmp_path):
    prompt = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "AnyDeviceConv2D", "inputs": {"input": ["1", 0], "kernel_source": "text",
                                                          "kernel_text": "1"}},
        "3": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1", 0]}},
    }
    res = runner.run_prompt(prompt, output_dir=tmp_path)
    assert set(res.results) == {"1", "3"}


def test_refuses_other_core_nodes(tmp_path, capsys):
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
        "2": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1", 0]}}}))
    assert cli.run_main([str(wf)]) == 1
    err = capsys.readouterr().err
    assert "CheckpointLoaderSimple" in err and "needs ComfyUI" in err


def test_refuses_the_vae_twin_saying_run_it_inside_comfyui(tmp_path, capsys):
    wf = API / "vae_decode_anydevice.json"
    assert cli.run_main([str(wf)]) == 1
    err = capsys.readouterr().err
    for ct in ("VAELoader", "VAEEncode", "VAEDecode"):
        assert f"{ct}: node '{ct}' needs ComfyUI" in err, err
    assert "run this workflow inside ComfyUI" in err, err
    with pytest.raises(Exception, match="run this workflow inside ComfyUI"):
        runner.run_prompt(runner.load_workflow(wf), output_dir=tmp_path / "out", workflow_path=wf)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing ran


def test_refuses_ui_format(capsys):
    assert cli.run_main([str(WF / "edge_detection.json")]) == 2
    assert "UI-format" in capsys.readouterr().err


def test_bad_widget_and_execution_errors(tmp_path, capsys):
    prompt = json.loads((API / "edge_detection.json").read_text())
    prompt["3"]["inputs"]["stride"] = 0
    wf = tmp_path / "bad.json"
    wf.write_text(json.dumps(prompt))
    assert cli.run_main([str(wf), "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "#3 Conv2D (AnyDevice): input 'stride' = 0" in err
    prompt["3"]["inputs"]["stride"] = 1
    prompt["3"]["inputs"].update(kernel_source="text", kernel_text="1 2\n3")
    wf.write_text(json.dumps(prompt))
    assert cli.run_main([str(wf), "--output-dir", str(tmp_path)]) == 1
    assert "input 'kernel_text'" in capsys.readouterr().err and True
    prompt["3"]["inputs"].update(kernel_source="preset", preset="gaussian", kernel_size=63)
    wf.write_text(json.dumps(prompt))
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (8, 8)).save(tiny)
    assert cli.run_main([str(wf), "--input", str(tiny), "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "#3 Conv2D (AnyDevice): input 'kernel_size' = 63" in err


def test_missing_image_file(tmp_path, capsys):
    prompt = json.loads((API / "color_grading.json").read_text())
    prompt["1"]["inputs"]["image"] = "nope.png"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(prompt))
    assert cli.run_main([str(wf), "--output-dir", str(tmp_path)]) == 1
    assert "nope.png" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# misuse: every problem is one line naming node id, class, input and value; exit code non-zero
# ---------------------------------------------------------------------------------------------
def empty_image(**kw):
    return {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0, **kw}}


def preview(link):
    return {"class_type": "PreviewImage", "inputs": {"images": link}}


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("anydevice run: error: "), err
    assert "Traceback" not in err
    return lines[0]


def run_wf(tmp_path, prompt, *extra):
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(prompt))
    return cli.run_main([str(wf), "--output-dir", str(tmp_path / "out"), *extra])


MISUSE = {
    "negative link index": ({"1": empty_image(), "2": preview(["1", -5])},
                            "#2 PreviewImage: input 'images' = ['1', -5]: a link's output index must be"),
    "link index -1": ({"1": empty_image(), "2": preview(["1", -1])}, "input 'images' = ['1', -1]"),
    "link index past the outputs": ({"1": empty_image(), "2": preview(["1", 3])},
                                    "input 'images' = ['1', 3]: uses output 3 of node 1 (EmptyImage), which has 1"),
    "link to a missing node": ({"2": preview(["9", 0])}, "input 'images' = ['9', 0]: links to missing node '9'"),
    "link of three": ({"1": empty_image(), "2": preview(["1", 0, 0])}, "a link must be [node_id, output_index]"),
    "class_type not a string": ({"1": {"class_type": 5, "inputs": {}}},
                                "#1: class_type = 5: must be a node class name"),
    "inputs as a list": ({"1": {"class_type": "PreviewImage", "inputs": [1, 2]}},
                         "#1 PreviewImage: inputs = [1, 2]: must be an object"),
    "node not an object": ({"1": [1], "2": preview(["1", 0])}, "#1: must be an object"),
    "width over ComfyUI's max": ({"1": empty_image(width=65536), "2": preview(["1", 0])},
                                "#1 EmptyImage: input 'width' = 65536: must be <= 16384"),
    "negative width": ({"1": empty_image(width=-5), "2": preview(["1", 0])},
                       "#1 EmptyImage: input 'width' = -5: must be >= 1"),
    "width not a number": ({"1": empty_image(width="wide"), "2": preview(["1", 0])},
                           "#1 EmptyImage: input 'width' = 'wide': must be an INT value"),
    "batch over ANYDEVICE_MAX_TENSOR_MB": ({"1": empty_image(width=16384, height=16384, batch_size=64),
                                           "2": preview(["1", 0])}, "free in host RAM (ANYDEVICE_MAX_TENSOR_MB)"),
    "pack node without its widgets": ({"1": empty_image(), "2": preview(["3", 0]), "3": {
        "class_type": "AnyDeviceActivation", "inputs": {"input": ["1", 0]}}},
        "#3 Activation (AnyDevice): required inputs 'activation', 'negative_slope', 'alpha',"),
    "link of the wrong type": ({"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
                                                                                  "batch_size": 1}},
                                "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                                                                           "filename_prefix": "x"}}},
                               "#2 SaveImage: input 'images' = ['1', 0]: node 1 output 0 is LATENT, but this input "
                               "takes IMAGE"),
    "required input missing": ({"1": empty_image(), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}},
                               "#2 SaveImage: required input 'filename_prefix' is missing"),
    "cycle": ({"1": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["2", 0]}},
               "2": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1", 0]}}},
              "the workflow has a cycle through nodes"),
    "absolute image path": ({"1": {"class_type": "LoadImage", "inputs": {"image": str(PHOTO)}}, "2": preview(["1", 0])},
                            "#1 LoadImage: input 'image' = "),
}


@pytest.mark.parametrize("case", sorted(MISUSE))
def test_misuse_is_one_line_naming_the_node(case, tmp_path, capsys):
    prompt, fragment = MISUSE[case]
    assert run_wf(tmp_path, prompt) != 0
    line = one_error_line(capsys.readouterr().err)
    assert fragment in line, line
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


def test_combo_checked_against_input_types(tmp_path, capsys):
    spec = runner.PACK_NODES["AnyDeviceActivation"].INPUT_TYPES()["required"]
    inputs = {k: v[1]["default"] for k, v in spec.items() if k != "input"}
    prompt = {"1": empty_image(), "2": {"class_type": "AnyDeviceActivation",
                                        "inputs": {**inputs, "input": ["1", 0], "activation": "nope"}},
              "3": preview(["2", 0])}
    assert run_wf(tmp_path, prompt) == 1
    assert "#2 Activation (AnyDevice): input 'activation' = 'nope': must be one of relu" in \
        one_error_line(capsys.readouterr().err)


def test_load_image_stays_inside_the_input_folders(tmp_path, capsys):
    """ComfyUI refuses image names that leave its input folder; so does the runner (no read)."""
    private = tmp_path / "elsewhere" / "private.png"
    private.parent.mkdir()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(private)
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for name in ("../../../elsewhere/private.png", "../../../../elsewhere/private.png", "input/../../x.png",
                 str(private)):
        wf = deep / "wf.json"
        wf.write_text(json.dumps({"1": {"class_type": "LoadImage", "inputs": {"image": name}},
                                  "2": preview(["1", 0])}))
        assert cli.run_main([str(wf), "--output-dir", str(tmp_path / "out")]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert "#1 LoadImage: input 'image' = '" in line and "must name a file inside the input folders" in line
    # a subfolder inside an input folder is fine, and --input loads any file
    (deep / "sub").mkdir()
    Image.new("RGB", (4, 4)).save(deep / "sub" / "ok.png")
    wf.write_text(json.dumps({"1": {"class_type": "LoadImage", "inputs": {"image": "sub/ok.png"}},
                              "2": preview(["1", 0])}))
    assert cli.run_main([str(wf), "--output-dir", str(tmp_path / "out")]) == 0
    assert cli.run_main([str(wf), "--input", str(private), "--output-dir", str(tmp_path / "out")]) == 0


def test_missing_image_lists_each_folder_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the workflow's folder is also the current one
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"1": {"class_type": "LoadImage", "inputs": {"image": "nope.png"}},
                              "2": preview(["1", 0])}))
    assert cli.run_main([str(wf)]) == 1
    line = one_error_line(capsys.readouterr().err)
    looked = line.split("looked in ")[1].split(")")[0].split(", ")
    assert len(looked) == len(set(looked)) and str(tmp_path.resolve()) in looked


def test_widgets_are_converted_as_comfyui_converts_them(tmp_path):
    """width "16" is 16 and filename_prefix 5 is "5", as ComfyUI's validation converts them."""
    res = runner.run_prompt({"1": empty_image(width="16"),
                             "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": 5}}},
                            output_dir=tmp_path)
    assert [s["filename"] for s in res.saved] == ["5_00001_.png"]
    assert png(res.saved[0]["path"]).shape == (8, 16, 3)


def test_a_1500_node_chain_runs(tmp_path):
    spec = runner.PACK_NODES["AnyDeviceActivation"].INPUT_TYPES()["required"]
    widgets = {k: v[1]["default"] for k, v in spec.items() if k != "input"}
    prompt = {"1": empty_image(width=2, height=2, color=0x808080)}
    for i in range(2, 1502):
        prompt[str(i)] = {"class_type": "AnyDeviceActivation", "inputs": {**widgets, "input": [str(i - 1), 0],
                                                                          "device": ["0", 0]}}
    prompt["0"] = {"class_type": "AnyDeviceDeviceSelect", "inputs": {"device": "numpy"}}
    prompt["1502"] = {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1501", 0]}}
    res = runner.run_prompt(prompt, output_dir=tmp_path)
    assert len(res.results) == 1503
    assert res.ui["1502"]["info"][0]["max"] == pytest.approx(128 / 255, abs=1e-6)


@pytest.mark.parametrize("content, fragment", [
    (b'{"1": {"class_type": "EmptyImage" "inputs": {}}}', "not valid JSON: Expecting ',' delimiter at line 1 column"),
    (b"", "the file is empty, not a JSON workflow"),
    (b"  \n", "the file is empty, not a JSON workflow"),
    (b'{"1": "\xff\xfe"}', "not a JSON workflow: byte 7 (0xff) is not UTF-8 text"),
    (b"[1, 2]", "is not an API-format workflow"),
    (b"[" * 100000, "not valid JSON"),
])
def test_broken_workflow_files_name_the_file(tmp_path, capsys, content, fragment):
    wf = tmp_path / "broken.json"
    wf.write_bytes(content)
    assert cli.run_main([str(wf)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(wf) in line and fragment in line


def test_utf8_bom_is_accepted(tmp_path):
    wf = tmp_path / "bom.json"
    wf.write_bytes(b"\xef\xbb\xbf" + json.dumps({"1": empty_image(), "2": preview(["1", 0])}).encode())
    assert cli.run_main([str(wf), "--output-dir", str(tmp_path / "out")]) == 0


def test_output_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli.run_main([str(API / "color_grading.json"), "--output-dir", str(afile)]) == 2
    assert f"output folder {afile}: is a file, not a folder" in one_error_line(capsys.readouterr().err)


def test_node_errors_are_one_line_and_verbose_shows_the_traceback(tmp_path, capsys, monkeypatch):
    def boom(self, ctx, **_):
        raise RuntimeError("device lost\nsecond line")
    monkeypatch.setattr(core_nodes.EmptyImage, "run", boom)
    prompt = {"1": empty_image(), "2": preview(["1", 0])}
    assert run_wf(tmp_path, prompt) == 1
    assert one_error_line(capsys.readouterr().err).endswith("#1 EmptyImage: RuntimeError: device lost second line")
    assert run_wf(tmp_path, prompt, "-v") == 1
    assert "Traceback" in capsys.readouterr().err


def test_json_summary_alone_on_stdout(tmp_path, capsys):
    assert run_wf(tmp_path, {"1": empty_image(), "2": preview(["1", 0])}, "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["saved"][0]["type"] == "temp"
    assert "backend: " in err and "saved: " in err


def test_runner_prints_nan_inf_warnings(tmp_path, capsys):
    """A node whose output has NaN/Inf: the run goes on (PyTorch semantics) and the runner says so."""
    wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
          "2": {"class_type": "AnyDeviceTensorOps", "inputs": {"a": ["1", 0], "op": "log", "scalar": 0.0,
                                                               "clamp_min": 0.0, "clamp_max": 1.0, "dims": "",
                                                               "keepdim": False}},
          "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(wf))
    from anydevice import cli
    rc = cli.main(["run", str(path), "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert rc == 0
    assert "warning: Tensor Ops (AnyDevice): output has 0 NaN and 192 Inf values" in out.out + out.err


def _labeled(folder):
    return {"1": {"class_type": "AnyDeviceLoadLabeledImages",
                  "inputs": {"folder": folder, "size": 0, "channels": "rgb"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "set"}}}


def test_load_labeled_images_reads_only_inside_the_input_folders(tmp_path, capsys):
    """As LoadImage's names: a folder outside the input folders is refused when the workflow is
    validated, saying nothing about it; nothing is read or saved. A set in an input folder runs."""
    from anydevice.backend.system.errors import short
    secret = tmp_path / "elsewhere" / "secret"
    for c in ("alpha", "beta", "gamma"):
        (secret / c).mkdir(parents=True)
        Image.new("RGB", (4, 4), (1, 2, 3)).save(secret / c / "1.png")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "link").symlink_to(secret, target_is_directory=True)
    wf = deep / "wf.json"
    for name in ("/etc", str(secret), "../../../elsewhere/secret", "link", str(deep / "link"), "input/../../x"):
        wf.write_text(json.dumps(_labeled(name)))
        assert cli.run_main([str(wf), "--output-dir", str(tmp_path / "out")]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert line == (f"anydevice run: error: #1 Load Labeled Images (AnyDevice): input 'folder' = {short(name)}: "
                        "must name a folder inside the input folders: a name relative to it, without '..' (as "
                        "ComfyUI's image loaders take names)"), line
        assert not (tmp_path / "out").exists()
    # the runner's input folders are the node's: a set next to the workflow (its input/) runs, by name
    # or by an absolute path inside it
    shutil.copytree(secret, deep / "input" / "mine")
    for name in ("mine", str(deep / "input" / "mine")):
        res = runner.run_prompt(_labeled(name), output_dir=tmp_path / "ok", workflow_path=wf)
        assert len(res.saved) == 3 and res.results["1"][2] == "alpha\nbeta\ngamma"
    spec = runner.PACK_NODES["AnyDeviceLoadLabeledImages"].INPUT_TYPES()["required"]["folder"]
    assert "mine" not in spec[0]  # listed only while the runner runs that workflow

