"""Inside a real ComfyUI server: malformed matrix and kernel text is refused when the prompt is queued
(400, custom_validation_failed, nothing runs), and Load Labeled Images reads only inside the input
folders (a folder elsewhere refused at validation, saying nothing about it; the bundled sets and a
set in ComfyUI's input folder listed, validated and run)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

import e2e_helpers as H
from anydevice.nodes import NODE_CLASS_MAPPINGS as N

_comfy, _why = H.comfy_dir()
pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def srv():
    if _comfy is None:
        pytest.skip(_why or "no ComfyUI")
    return H.server()


def _defaults(name, **kw) -> dict:
    spec = N[name].INPUT_TYPES()["required"]
    return {**{k: v[1]["default"] for k, v in spec.items() if "default" in v[1]}, **kw}


def _image():
    return {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": 0x336699}}


def _refused(srv, prompt) -> list[dict]:
    code, r = srv.post_prompt(prompt)
    assert code == 400, r
    return [e for ne in r["node_errors"].values() for e in ne["errors"]]


@pytest.mark.parametrize("name,mode,widget", [("AnyDeviceConv2D", "kernel_source", "kernel_text"),
                                              ("AnyDeviceLinear", "source", "matrix")])
@pytest.mark.parametrize("bad", ["1 2; 3", "nan", "[[1,2],[3]]", ""])
def test_malformed_text_fails_comfyuis_validation(srv, name, mode, widget, bad):
    prompt = {"1": _image(), "2": {"class_type": name, "inputs": _defaults(name, input=["1", 0],
                                                                           **{mode: "text", widget: bad})},
              "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}}}
    errs = _refused(srv, prompt)
    assert {e["type"] for e in errs} == {"custom_validation_failed"}, errs
    assert widget in {e["extra_info"]["input_name"] for e in errs}
    assert all(f"{N[name].DISPLAY}: input '{widget}' = {bad!r}: " in e["details"] for e in errs), errs
    prompt["2"]["inputs"][mode] = "preset"  # the text is not parsed in that mode: the prompt runs
    assert srv.run(prompt)["status"]["status_str"] == "success"


def test_malformed_tensor_source_text_fails_validation(srv):
    prompt = {"1": {"class_type": "AnyDeviceTensorSource", "inputs": _defaults("AnyDeviceTensorSource", mode="text",
                                                                               text="1 2; 3")},
              "2": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["1", 0]}}}
    errs = _refused(srv, prompt)
    assert all("Tensor Source (AnyDevice): input 'text' = '1 2; 3': is ragged" in e["details"] for e in errs), errs


def _labeled(folder):
    return {"1": {"class_type": "AnyDeviceLoadLabeledImages", "inputs": {"folder": folder, "size": 0,
                                                                       "channels": "rgb"}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}


def test_load_labeled_images_reads_only_inside_the_input_folder(srv, tmp_path):
    secret = tmp_path / "secret"
    for c in ("alpha", "beta"):
        (secret / c).mkdir(parents=True)
        Image.fromarray(np.full((4, 4, 3), 7, np.uint8)).save(secret / c / "1.png")
    mine = srv.tmp / "input" / "e2e_sets" / "mine"
    shutil.copytree(secret, mine, dirs_exist_ok=True)
    (srv.tmp / "input" / "e2e_link").unlink(missing_ok=True)
    (srv.tmp / "input" / "e2e_link").symlink_to(secret, target_is_directory=True)
    info = srv.get("/object_info/AnyDeviceLoadLabeledImages", timeout=60)
    folders = info["AnyDeviceLoadLabeledImages"]["input"]["required"]["folder"]
    assert {"digits/train", "digits/test", "e2e_sets/mine"} <= set(folders[0]), folders
    assert "e2e_link" not in folders[0]
    for name in ("/etc", str(secret), "../secret", "e2e_link", "e2e_sets/../../x"):
        errs = _refused(srv, _labeled(name))
        assert [e["type"] for e in errs] == ["custom_validation_failed"], errs
        assert errs[0]["details"].endswith("must name a folder inside the input folders: a name relative to it, "
                                           "without '..' (as ComfyUI's image loaders take names)"), errs
        assert "alpha" not in json.dumps(errs) and "class" not in errs[0]["details"]
    for name, classes in (("digits/test", 10), ("e2e_sets/mine", 2), (str(mine), 2)):
        hist = srv.run(_labeled(name))
        assert hist["status"]["status_str"] == "success", hist["status"]
        assert hist["outputs"]["1"]["text"][0].split(", ")[1] == f"{classes} classes"
