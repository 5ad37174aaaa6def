"""Malformed matrix, kernel and shape text is refused when the prompt is queued (VALIDATE_INPUTS, as
ComfyUI calls it, and the headless runner), through the parser the node runs, only where the chosen
mode parses the text: before any node upstream runs. A widget fed by a link (None) is accepted."""
from __future__ import annotations

import pytest

from anydevice.nodes import NODE_CLASS_MAPPINGS as N
from anydevice.nodes.headless import runner
from anydevice.nodes.base.common import NodeError, parse_matrix

MALFORMED = ["1 2; 3", "nan", "[[1,2],[3]]", ""]
#: (node, mode widget, the mode that parses the text, the text widget, other modes, valid text)
TEXT = [
    ("AnyDeviceConv2D", "kernel_source", "text", "kernel_text", ["preset", "random", "weights"], "1 2; 3 4"),
    ("AnyDeviceLinear", "source", "text", "matrix", ["preset", "random", "weights"], "[[1,0,0],[0,1,0],[0,0,1]]"),
    ("AnyDeviceWeights", "source", "text", "matrix", ["random", "tensor"], "1 0 0\n0 1 0\n0 0 1"),
    ("AnyDeviceTensorSource", "mode", "text", "text", ["random_normal", "zeros", "image"], "1, 2, 3; 4, 5, 6"),
]


def _reason(text) -> str:
    with pytest.raises(ValueError) as e:
        parse_matrix(text)
    return str(e.value)


@pytest.mark.parametrize("bad", MALFORMED)
@pytest.mark.parametrize("case", TEXT, ids=[c[0] for c in TEXT])
def test_validate_inputs_refuses_malformed_text_where_the_mode_parses_it(case, bad):
    name, mode, parsing, widget, others, good = case
    cls = N[name]
    expect = str(NodeError(cls.DISPLAY, widget, bad, _reason(bad)))
    assert expect.startswith(f"{cls.DISPLAY}: input '{widget}' = {bad!r}: ")
    assert cls.VALIDATE_INPUTS(**{mode: parsing, widget: bad}) == expect
    for other in others:  # a mode that does not parse the text does not refuse it
        assert cls.VALIDATE_INPUTS(**{mode: other, widget: bad}) is True
    assert cls.VALIDATE_INPUTS(**{mode: None, widget: bad}) is True  # the mode fed by a link: checked when run
    assert cls.VALIDATE_INPUTS(**{mode: parsing, widget: None}) is True  # the text fed by a link
    assert cls.VALIDATE_INPUTS(**{mode: parsing, widget: good}) is True


@pytest.mark.parametrize("case", TEXT, ids=[c[0] for c in TEXT])
def test_the_mode_is_checked_against_its_choices(case):
    """Taking the mode, VALIDATE_INPUTS makes ComfyUI skip its combo check for it: so it checks it."""
    name, mode, _, widget, _, good = case
    cls = N[name]
    choices = cls.INPUT_TYPES()["required"][mode][0]
    assert cls.VALIDATE_INPUTS(**{mode: "sideways", widget: good}) == \
        f"{cls.DISPLAY}: input '{mode}' = 'sideways': must be one of {', '.join(choices)}"
    assert all(cls.VALIDATE_INPUTS(**{mode: m}) is True for m in choices)


@pytest.mark.parametrize("name,mode,parsing,other", [
    ("AnyDeviceTensorSource", "mode", "zeros", "text"), ("AnyDeviceWeights", "source", "random", "text")])
def test_shape_text_is_refused_where_the_mode_parses_it(name, mode, parsing, other):
    cls = N[name]
    for bad, why in (("3, a", "'a' is not an integer"), ("", "is empty"), ("0, 3", "sizes must be positive"),
                     ("1,1,1,1,1,1,1,1,1", "more than 8 dims")):
        r = cls.VALIDATE_INPUTS(**{mode: parsing, "shape": bad})
        assert r.startswith(f"{cls.DISPLAY}: input 'shape' = {bad!r}: ") and why in r, r
        assert cls.VALIDATE_INPUTS(**{mode: other, "shape": bad}) is True


def test_bias_text_is_checked_in_every_mode():
    for name in ("AnyDeviceLinear", "AnyDeviceWeights"):
        cls = N[name]
        for source in cls.INPUT_TYPES()["required"]["source"][0]:
            assert cls.VALIDATE_INPUTS(source=source, bias="0.1 x") == \
                f"{cls.DISPLAY}: input 'bias' = '0.1 x': row 1, entry 2 ('x') is not a number"
            assert cls.VALIDATE_INPUTS(source=source, bias="") is True
    assert N["AnyDeviceWeights"].VALIDATE_INPUTS(source="random", bias=" random ") is True


# ---- the headless runner calls VALIDATE_INPUTS before anything runs ---------------------------------
def _widgets(name, **kw) -> dict:
    spec = N[name].INPUT_TYPES()["required"]
    return {**{k: v[1]["default"] for k, v in spec.items() if "default" in v[1]}, **kw}


def _image():
    return {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0x336699}}


def _workflow(name, mode, widget, text) -> tuple[dict, str]:
    """(a workflow whose node 3 is ``name`` with ``widget`` = ``text``, the node's id)."""
    preview = {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}
    if name == "AnyDeviceTensorSource":
        return {"3": {"class_type": name, "inputs": _widgets(name, **{mode: "text", widget: text})},
                "4": {"class_type": "AnyDeviceTensorInfo", "inputs": {"input": ["3", 0]}}}, "3"
    if name == "AnyDeviceWeights":  # Weights -> Linear(source weights) on an image
        return {"1": _image(),
                "2": {"class_type": name, "inputs": _widgets(name, shape="3, 3", **{mode: "text", widget: text})},
                "3": {"class_type": "AnyDeviceLinear", "inputs": _widgets(
                    "AnyDeviceLinear", input=["1", 0], source="weights", weights=["2", 0])},
                "4": preview}, "2"
    return {"1": _image(), "3": {"class_type": name, "inputs": _widgets(name, input=["1", 0],
                                                                         **{mode: "text", widget: text})},
            "4": preview}, "3"


@pytest.mark.parametrize("case", TEXT, ids=[c[0] for c in TEXT])
def test_runner_refuses_malformed_text_before_anything_runs(case, tmp_path):
    name, mode, _, widget, _, good = case
    display = N[name].DISPLAY
    for bad in MALFORMED:
        prompt, nid = _workflow(name, mode, widget, bad)
        with pytest.raises(runner.WorkflowError) as e:
            runner.run_prompt(prompt, output_dir=tmp_path / "out")
        assert e.value.problems == [f"#{nid} {display}: input '{widget}' = {bad!r}: {_reason(bad)}"]
        assert not (tmp_path / "out").exists()  # refused before any node ran
    prompt, nid = _workflow(name, mode, widget, good)
    res = runner.run_prompt(prompt, output_dir=tmp_path / "out")
    assert nid in res.results
    # text the chosen mode does not parse is not refused
    prompt, nid = _workflow(name, mode, widget, "nan")
    prompt[nid]["inputs"][mode] = "random" if name != "AnyDeviceTensorSource" else "zeros"
    if name == "AnyDeviceConv2D":
        prompt[nid]["inputs"]["kernel_size"] = 3
    assert nid in runner.run_prompt(prompt, output_dir=tmp_path / "out2").results


def test_runner_refuses_a_mode_outside_its_choices(tmp_path):
    prompt, _ = _workflow("AnyDeviceConv2D", "kernel_source", "kernel_text", "1")
    prompt["3"]["inputs"]["kernel_source"] = "sideways"
    with pytest.raises(runner.WorkflowError) as e:
        runner.run_prompt(prompt, output_dir=tmp_path)
    assert e.value.problems == ["#3 Conv2D (AnyDevice): input 'kernel_source' = 'sideways': must be one of preset, "
                                "text, random, weights"]


def test_runner_converts_text_as_comfyui_does(tmp_path):
    """ComfyUI converts a STRING widget with str() before VALIDATE_INPUTS sees it: 2 is the text '2'."""
    prompt, _ = _workflow("AnyDeviceConv2D", "kernel_source", "kernel_text", 2)
    res = runner.run_prompt(prompt, output_dir=tmp_path)
    assert res.ui["3"]["kernel"][0]["shape"] == [1, 1]
