"""The layer registry (backend/learn/layers) and what the layer nodes show from it.

The registry maps each layer type to one Layer class and refuses a second registration; the
modules stay small and never import backend/learn/network.py. Each layer node whose widgets depend on a
choice (Conv Layer's padding, Activation Layer's function, Norm and Pool Layer's kind) serves the
table the page hides the others by (the choice widget's ``anydevice_uses``), made from the layer
classes' ``widgets``; web/anydevice.js reads it as the Python says (checked with node where it is
installed). Hiding never reorders or drops a widget, so saved workflows' widgets_values still load.
"""
from __future__ import annotations

import ast
import json
import shutil
import subprocess

import pytest

from anydevice.backend.learn import network as netmod
from anydevice.backend.learn import layers as L
from anydevice.backend.learn.layers.base import Layer, Registry
from anydevice.nodes.learn import network as NN

from repo_paths import ROOT  # noqa: E402
LAYER_NODES = [c for c in NN.NETWORK_NODES if issubclass(c, NN._LayerNode)]


# ---- the registry ---------------------------------------------------------------------------------
def test_registry_holds_every_layer_type_in_the_order_errors_list_them():
    assert tuple(L.LAYERS) == ("conv2d", "conv_transpose2d", "linear", "activation", "batch_norm", "group_norm",
                               "layer_norm", "instance_norm", "pool", "upsample", "dropout", "flatten", "residual")
    assert netmod.LAYER_TYPES == L.LAYER_TYPES == tuple(L.LAYERS)
    for name in L.LAYERS:
        kind = L.LAYERS[name]
        assert isinstance(kind, Layer) and kind.type == name
        # every kind says how it is checked and what torch module it is
        assert type(kind).normalize is not Layer.normalize, name
        assert type(kind).to_torch is not Layer.to_torch, name


def test_registry_refuses_a_type_registered_twice():
    reg = Registry()

    @reg.register
    class A(Layer):
        type = "a"

    class B(Layer):
        type = "a"

    with pytest.raises(RuntimeError, match="duplicate registrations for layer type 'a'"):
        reg.register(B)
    assert type(reg["a"]) is A and len(reg) == 1
    with pytest.raises(RuntimeError, match="duplicate"):
        L.LAYERS.register(type(L.LAYERS["conv2d"]))

    class Nameless(Layer):
        pass

    with pytest.raises(RuntimeError, match="no layer type name"):
        reg.register(Nameless)
    assert "a" in reg and "b" not in reg and ["x"] not in reg


def test_network_module_keeps_its_names():
    """What tests, netio, train and bench_train import from backend/learn/network.py is still there."""
    for name in ("Network", "layer_seed", "normalize_layer", "param_names", "MAX_DEPTH", "MAX_LAYERS", "FORMAT",
                 "ACTIVATION_PARAMS", "POOL_KINDS", "UPSAMPLE_MODES", "_host", "_layer_at", "_mem", "_layer_shape",
                 "_two", "_param_layers"):
        assert hasattr(netmod, name), name
    assert netmod.layer_seed is L.layer_seed and netmod.normalize_layer is L.normalize_layer


def test_layer_text_comes_from_the_layer_classes():
    net = (netmod.Network.empty().add("conv2d", out_channels=8, kernel_size=[3, 5], padding_mode="reflect")
           .add("linear", out_features=4).add("activation", name="gelu").add("pool", kind="avg", kernel_size=2)
           .add("upsample", scale_factor=2.0).add("dropout", p=0.25).add("batch_norm").add("flatten")
           .residual(netmod.Network.empty().add("activation", name="relu").add("layer_norm")))
    assert [NN._layer_text(x) for x in net.layers] == [
        "conv 3x5 -> 8 reflect", "linear -> 4", "gelu", "avg pool", "upsample x2.0 nearest", "dropout p=0.25",
        "batch_norm", "flatten", "residual (2 layers)"]


def test_modules_are_small_and_never_import_network_py():
    learn = ROOT / "backend" / "learn"
    files = [learn / "network.py", learn / "spec.py"] + sorted((learn / "layers").rglob("*.py"))
    assert len(files) >= 11
    for f in files:
        assert len(f.read_text().splitlines()) < 600, f
        if "layers" not in f.parts and f.name != "spec.py":  # the layers and the spec reader stand below network.py
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                assert not any(n == "network" or n.endswith(".network") for n in names), (f, names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.endswith("network") for a in node.names), f


# ---- which widgets the layer nodes show -------------------------------------------------------------
def _shown(cls, choice) -> list[str]:
    """The widgets the page shows for ``choice`` of the node's choice widget (the served table)."""
    uses = cls.widget_uses()
    ruled = {w for names in uses.values() for w in names}
    return [w for w in cls.WIDGETS if w not in ruled or w in uses[choice]]


@pytest.mark.parametrize("cls", LAYER_NODES, ids=lambda c: c.__name__)
def test_layer_node_table_matches_its_layer_classes(cls):
    spec = cls.INPUT_TYPES()
    assert list(spec["required"]) == list(cls.WIDGETS)  # nothing removed, nothing reordered
    if cls.CHOICE is None:
        assert "anydevice_uses" not in json.dumps(spec)
        assert set(cls.WIDGETS) <= set(L.LAYERS[cls.LAYER].widgets())
        return
    uses = spec["required"][cls.CHOICE][1]["anydevice_uses"]
    assert uses == cls.widget_uses()
    choices = cls.WIDGETS[cls.CHOICE][0]
    assert list(uses) == list(choices)
    json.dumps(uses)  # served as JSON (ComfyUI's object_info)
    for c in choices:
        applies = L.LAYERS[cls.LAYER or c].widgets(c)
        assert _shown(cls, c) == [w for w in cls.WIDGETS if w in applies], c
    # every widget applies to some choice (none is hidden for good)
    assert set().union(*(_shown(cls, c) for c in choices)) == set(cls.WIDGETS)


def test_layer_nodes_show_only_the_widgets_their_choice_uses():
    act = NN.AnyDeviceActivationLayer
    assert _shown(act, "relu") == ["activation"]
    assert _shown(act, "leaky_relu") == ["activation", "negative_slope"]
    assert _shown(act, "elu") == ["activation", "alpha"]
    assert _shown(act, "gelu") == ["activation", "approximate"]
    assert _shown(act, "softmax") == ["activation", "dim"]
    assert _shown(act, "softplus") == ["activation"]  # beta and threshold are no widgets of the node
    conv = NN.AnyDeviceConvLayer
    everything = list(conv.WIDGETS)
    assert _shown(conv, "explicit") == everything
    assert _shown(conv, "same") == [w for w in everything if w != "padding_size"]
    assert _shown(conv, "valid") == [w for w in everything if w not in ("padding_size", "padding_mode")]
    pool = NN.AnyDevicePoolLayer
    assert _shown(pool, "max") == _shown(pool, "avg") == ["kind", "kernel_size", "stride", "padding"]
    assert _shown(pool, "adaptive_avg") == _shown(pool, "adaptive_max") == ["kind", "output_size"]
    norm = NN.AnyDeviceNormLayer
    assert _shown(norm, "batch_norm") == ["kind", "eps", "momentum", "affine"]
    assert _shown(norm, "group_norm") == ["kind", "num_groups", "eps", "affine"]
    assert _shown(norm, "layer_norm") == _shown(norm, "instance_norm") == ["kind", "eps", "affine"]


def test_hidden_widgets_still_make_the_same_layer():
    """A widget hidden for the choice is still passed (its value kept): the layer is as before."""
    conv = NN.AnyDeviceConvLayer()
    out = conv.run(out_channels=4, kernel_size=3, stride=1, padding="same", padding_size=7, padding_mode="zeros",
                   dilation=1, groups=1, bias=True)
    assert out["result"][0].layers[-1]["padding"] == "same"
    act = NN.AnyDeviceActivationLayer()
    out = act.run(activation="relu", negative_slope=0.3, alpha=2.0, approximate="tanh", dim=0)
    assert out["result"][0].layers[-1] == {"type": "activation", "name": "relu"}


_JS_CHECK = r"""
const src = require("fs").readFileSync(process.argv[1], "utf8");
const start = src.indexOf("function servedRules(");
const end = src.indexOf("\n}\n", start) + 3;
const servedRules = new Function(src.slice(start, end) + "; return servedRules;")();
const cases = JSON.parse(process.argv[2]);
const out = {};
for (const [name, nodeData, choice, values, widgets] of cases) {
  const { rules, choices } = servedRules(nodeData);
  out[name] = { choices, shown: {} };
  for (const value of values) {
    const v = {};
    for (const w of widgets) v[w] = w === choice ? value : 0;
    out[name].shown[value] = widgets.filter((w) => !rules[w] || rules[w](v));
  }
}
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is not installed")
def test_the_page_reads_the_served_table_as_python_says():
    """web/anydevice.js's servedRules, run by node on each layer node's INPUT_TYPES (as ComfyUI's
    object_info serves them), shows what the table says for every choice."""
    cases, want = [], {}
    for cls in LAYER_NODES:
        if cls.CHOICE is None:
            continue
        choices = cls.WIDGETS[cls.CHOICE][0]
        node_data = {"input": json.loads(json.dumps(cls.INPUT_TYPES()))}
        cases.append([cls.__name__, node_data, cls.CHOICE, choices, list(cls.WIDGETS)])
        want[cls.__name__] = {"choices": [cls.CHOICE], "shown": {c: _shown(cls, c) for c in choices}}
    assert len(cases) == 4
    r = subprocess.run(["node", "-e", _JS_CHECK, str(ROOT / "web" / "anydevice.js"), json.dumps(cases)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == want
