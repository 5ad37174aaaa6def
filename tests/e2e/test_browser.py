"""Browser tests (Playwright + Debian chromium) against a real ComfyUI server, for every frontend
found (the one the ComfyUI checkout pins, and e.g. comfyui-frontend-package 1.58 served with
``--front-end-root``; see tests/support/e2e_helpers.py) and both node renderers (the classic LiteGraph canvas
and the Vue node renderer, ``Comfy.VueNodes.Enabled``).

Each bundled UI workflow is loaded at its saved zoom in a 1600x1000 window (every node inside the
canvas, none under the minimap), queued from the page, and must show its badges and readouts with the
headless runner's numbers as text on the page. Also: widgets a mode does not use are hidden without
changing ``widgets_values``, the effective kernel shown before a run equals the Python presets, and
a NaN/Inf ``warning`` in the ui payload is shown on the node. Screenshots go to test-artifacts/.

``ANYDEVICE_BROWSER=quick`` (what CI sets when it is short of time) runs the workflows on the first
configuration only and two of them on the others.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import e2e_helpers as H
from anydevice.nodes.compute import presets as P
from anydevice.nodes.headless import runner

from repo_paths import ROOT  # noqa: E402
API = ROOT / "example_workflows" / "api"
UI = ROOT / "example_workflows"
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1600, "height": 1000}

_comfy, _why = H.comfy_dir()
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(_comfy is None, reason=_why or "no ComfyUI"),
    pytest.mark.skipif(sync_playwright is None, reason="the playwright Python package is not installed"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not found"),
]


def _version(v: str) -> tuple:
    try:
        return tuple(int(x) for x in v.split(".")[:2])
    except ValueError:
        return (0, 0)


def _configs():
    if _comfy is None:
        return [pytest.param(("none", None, "classic"), id="no-comfyui")]
    out = []
    for version, root in H.frontends(_comfy):
        for renderer in ("classic", "vue"):
            out.append(pytest.param((version, root, renderer), id=f"fe{version}-{renderer}"))
    return out


CONFIGS = _configs()
TEMPLATES = sorted(p.stem for p in API.glob("*.json"))
QUICK = os.environ.get("ANYDEVICE_BROWSER", "").lower() == "quick"
QUICK_TEMPLATES = ("blur_sharpen_metrics", "edge_detection")
#: templates the headless runner cannot run (ComfyUI's VAELoader...): compared to the server's own eager path
SERVER_ONLY = {"vae_decode_anydevice"}


def full_ui(cfg) -> bool:
    """Whether this renderer shows extension widgets and node badges at all. The Vue renderer of
    frontends before 1.30 (1.27's is a hidden experimental setting) renders no DOM widgets and no
    node badges for any node, core nodes included; there only hiding and running are checked."""
    version, _root, renderer = cfg
    return renderer == "classic" or _version(version) >= (1, 30)


@pytest.fixture(scope="module", params=CONFIGS)
def cfg(request):
    return request.param


@pytest.fixture(scope="module")
def srv(cfg):
    return H.server(cfg[1])


@pytest.fixture(scope="module")
def page(cfg, srv):
    messages = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        pg = browser.new_page(viewport=VIEWPORT)
        pg.on("console", lambda m: messages.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
        H.open_frontend(pg, srv.url, vue=cfg[2] == "vue")
        pg.evaluate("""() => {
            window.__ad = {done: {}, errors: {}};
            const api = window.comfyAPI.api.api;
            api.addEventListener('execution_success', e => { window.__ad.done[e.detail.prompt_id] = 'success'; });
            api.addEventListener('execution_error', e => {
                window.__ad.done[e.detail.prompt_id] = 'error'; window.__ad.errors[e.detail.prompt_id] = e.detail; });
        }""")
        pg.messages = messages
        pg.cfg = cfg
        yield pg
        browser.close()


def _tag(cfg) -> str:
    return f"fe{cfg[0]}-{cfg[2]}"


def shot(page, name: str) -> Path:
    H.ARTIFACTS.mkdir(exist_ok=True)
    path = H.ARTIFACTS / f"browser_{_tag(page.cfg)}_{name}.png"
    page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    return path


STATE = """() => app.graph._nodes.filter(n => (n.type || '').startsWith('AnyDevice')).map(n => {
  const w = (n.widgets || []).find(w => w.name === 'anydevice_readout');
  const b = n.anydevice_badges;
  return {id: String(n.id), type: n.type, state: n.anydevice ? JSON.parse(JSON.stringify(n.anydevice)) : null,
    readout: w && w.element ? w.element.innerText : null,
    readoutShown: !!(w && w.element && w.element.isConnected && w.element.checkVisibility &&
                     w.element.checkVisibility()),
    grids: w && w.element ? w.element.querySelectorAll('.ad-grid').length : 0,
    badge: b ? b.run.text : null, warnBadge: b ? b.warn.text : null,
    visible: (n.widgets || []).filter(w => !w.hidden).map(w => w.name),
    values: (n.widgets || []).map(w => w.value)};
})"""

# screen rectangles of every node (title and badges included) and of what covers the canvas
RECTS = """() => {
  const c = app.canvas, s = c.ds.scale, o = c.ds.offset, r = c.canvas.getBoundingClientRect();
  const vue = !!app.extensionManager.setting.get('Comfy.VueNodes.Enabled');
  const th = (window.LiteGraph && LiteGraph.NODE_TITLE_HEIGHT) || 30;
  const nodes = app.graph._nodes.map(n => {
    const el = vue && document.querySelector(`[data-node-id="${n.id}"]`);
    if (el) { const b = el.getBoundingClientRect(); return {id: n.id, x0: b.left, y0: b.top, x1: b.right, y1: b.bottom}; }
    const top = n.pos[1] - th - ((n.badges || []).length ? 22 : 0);
    return {id: n.id, x0: r.left + (n.pos[0] + o[0]) * s, y0: r.top + (top + o[1]) * s,
            x1: r.left + (n.pos[0] + n.size[0] + o[0]) * s, y1: r.top + (n.pos[1] + n.size[1] + o[1]) * s};
  });
  const box = (sel) => { const e = document.querySelector(sel); if (!e || !e.checkVisibility()) return null;
    const b = e.getBoundingClientRect(); return b.width ? {x0: b.left, y0: b.top, x1: b.right, y1: b.bottom} : null; };
  return {scale: s, nodes, canvas: {x0: r.left, y0: r.top, x1: r.right, y1: r.bottom},
          minimap: box('.litegraph-minimap'), sidebar: box('.side-tool-bar-container') || box('nav')};
}"""


def _overlap(a, b) -> bool:
    return b is not None and a["x0"] < b["x1"] and b["x0"] < a["x1"] and a["y0"] < b["y1"] and b["y0"] < a["y1"]


def load(page, wf: dict):
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)
    page.wait_for_timeout(600)


def queue(page, srv, timeout_ms: int = 120_000, inputs: dict | None = None) -> tuple[str, dict]:
    """Queues the page's graph as the page makes it (returned); ``inputs`` {node id: {input: value}}
    changes the queued copy only."""
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    cid = page.evaluate("window.comfyAPI.api.api.clientId")
    queued = json.loads(json.dumps(prompt))
    for nid, values in (inputs or {}).items():
        queued[nid]["inputs"].update(values)
    code, r = srv.post_prompt(queued, client_id=cid)
    assert code == 200, r
    pid = r["prompt_id"]
    page.wait_for_function(f"window.__ad.done[{json.dumps(pid)}]", timeout=timeout_ms)
    assert page.evaluate(f"window.__ad.done[{json.dumps(pid)}]") == "success", page.evaluate("window.__ad.errors")
    return pid, prompt


def test_extension_is_loaded(page, srv):
    names = page.evaluate("() => (app.extensions || []).map(e => e.name)")
    assert "AnyDevice.Readouts" in names
    assert not [m for m in page.messages if "anydevice" in m.lower()], page.messages


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_runs_in_the_browser(page, srv, name, tmp_path):
    cfg = page.cfg
    if QUICK and cfg != CONFIGS[0].values[0] and name not in QUICK_TEMPLATES:
        pytest.skip("ANYDEVICE_BROWSER=quick: this workflow runs on the first configuration only")
    listing = srv.get("/api/workflow_templates")
    assert name in listing[H.PACK_NAME]
    if name in SERVER_ONLY:
        try:
            H.write_random_vae(srv)
        except (RuntimeError, OSError) as exc:
            pytest.skip(f"{name} needs {H.RANDOM_VAE} in the server's vae folder, which could not be made: {exc}")
    wf = srv.get(f"/api/workflow_templates/{H.PACK_NAME}/{name}.json")
    before = len(page.messages)
    load(page, wf)
    # the graph the page would queue (widgets_values -> inputs) must equal the API twin
    twin = json.loads((API / f"{name}.json").read_text())
    # the VAE template runs on the photo at 64x64 (seconds, not minutes, on a CPU)
    small = {"1": {"image": H.small_photo(srv)}} if name in SERVER_ONLY else None
    pid, api_from_ui = queue(page, srv, 900_000 if name in SERVER_ONLY else 120_000, small)
    for nid, node in twin.items():
        assert api_from_ui[nid]["class_type"] == node["class_type"]
        for k, v in node["inputs"].items():
            assert api_from_ui[nid]["inputs"].get(k) == v, (name, nid, k)
    hist = srv.wait_history(pid)
    try:
        page.wait_for_function(
            "() => app.graph._nodes.filter(n => (n.type||'').startsWith('AnyDevice'))"
            ".every(n => n.anydevice && n.anydevice.badge)", timeout=30_000)
    except Exception:
        missing = [n for n in page.evaluate(STATE) if not (n["state"] or {}).get("badge")]
        raise AssertionError(f"no badge on {missing}; history outputs for {sorted(hist['outputs'])}")
    page.wait_for_timeout(800)
    shot(page, name)

    # laid out for a 1600x1000 window at the saved zoom: every node on the canvas, none under the minimap
    saved = wf["extra"]["ds"]
    rects = page.evaluate(RECTS)
    assert rects["scale"] == pytest.approx(saved["scale"], rel=1e-3)
    for n in rects["nodes"]:
        where = (name, n, rects)
        assert n["x0"] >= rects["canvas"]["x0"] - 1 and n["y0"] >= rects["canvas"]["y0"] - 1, where
        assert n["x1"] <= min(rects["canvas"]["x1"], VIEWPORT["width"]) + 1, where
        assert n["y1"] <= min(rects["canvas"]["y1"], VIEWPORT["height"]) + 1, where
        assert not _overlap(n, rects["minimap"]), ("under the minimap",) + where
        assert not _overlap(n, rects["sidebar"]), ("under the side bar",) + where

    if name in SERVER_ONLY:
        _compare_with_server_eager(srv, twin, hist, small)
        local = None
    else:
        local = runner.run_prompt(twin, output_dir=tmp_path, workflow_path=API / f"{name}.json")
    body = page.evaluate("() => document.body.innerText")
    for n in page.evaluate(STATE):
        s = n["state"]
        assert s and s["badge"]["backend"] and s["badge"]["ms"] >= 0, n
        badge = dict(s["badge"])
        badge.pop("cached", None)
        entry = dict(hist["outputs"][n["id"]]["anydevice"][0])
        entry.pop("warning", None)
        assert badge == entry
        assert n["badge"].startswith(s["badge"]["backend"] + " · "), n
        if not full_ui(cfg):
            continue
        if cfg[2] == "vue":  # node badges are DOM there
            assert n["badge"] in body, n
        if n["type"] in ("AnyDeviceLoss", "AnyDeviceTensorInfo", "AnyDeviceConv2D", "AnyDeviceLinear",
                         "AnyDeviceDeviceSelect"):
            assert n["readoutShown"], n
        if n["type"] == "AnyDeviceLoss":
            trained = any(v.get("class_type") == "AnyDeviceTrainNetwork" for v in twin.values())
            # (a trained network: the server's NumPy/BLAS build vs this venv's, amplified by training)
            assert s["loss"][0]["value"] == pytest.approx(local.ui[n["id"]]["loss"][0]["value"],
                                                          rel=1e-3 if trained else 1e-4, abs=1e-6)
            text = n["readout"].splitlines()[0]
            assert text.startswith(s["loss"][0]["name"] + " = ") and text in body, n
            assert float(text.split(" = ")[1]) == pytest.approx(s["loss"][0]["value"], rel=1e-3)  # 4+ digits shown
        if n["type"] == "AnyDeviceTensorInfo":
            assert s["info"][0]["shape"] == local.ui[n["id"]]["info"][0]["shape"]
            assert s["info"][0]["mean"] == pytest.approx(local.ui[n["id"]]["info"][0]["mean"], rel=1e-4, abs=1e-5)
            head = f"{s['info'][0]['kind']} [{', '.join(map(str, s['info'][0]['shape']))}] {s['info'][0]['dtype']}"
            assert head in n["readout"] and head in body, n
            assert "mean" in n["readout"], n
        if n["type"] in ("AnyDeviceConv2D", "AnyDeviceLinear"):
            assert s["kernel"][0]["slices"], n
            assert n["grids"] >= 1 and s["kernel"][0]["label"] in n["readout"], n
        if n["type"] == "AnyDeviceDeviceSelect":
            assert s["status"]["ok"] and s["status"]["text"].startswith(("numpy", "cpu", "auto"))
            assert s["status"]["text"] in body, n
    new = H.pack_console_errors(page.messages[before:])
    assert not new, new


def _compare_with_server_eager(srv, twin: dict, hist: dict, inputs: dict) -> None:
    """vae_decode_anydevice: the page's run vs the same VAE through ComfyUI's own path (no AnyDevice node,
    run by the server), PNGs within 1/255."""
    import io

    import numpy as np
    from PIL import Image
    eager = json.loads(json.dumps(twin))
    for nid, values in inputs.items():  # as the page's run was queued
        eager[nid]["inputs"].update(values)
    for nid in ("5", "6"):
        eager[nid]["inputs"]["vae"] = ["2", 0]
    del eager["3"], eager["4"]
    eager["7"]["inputs"]["filename_prefix"] = "anydevice_vae_eager_browser"
    ref = srv.run(eager)
    assert ref["status"]["status_str"] == "success", ref["status"]

    def img(h):
        (i,) = h["outputs"]["7"]["images"]
        return np.asarray(Image.open(io.BytesIO(srv.view(i))).convert("RGB")).astype(np.int16)

    a, b = img(hist), img(ref)
    assert a.shape == b.shape == (64, 64, 3) and np.abs(a - b).max() <= 1, (a.shape, np.abs(a - b).max())


WIDGET_ORDER = """(type) => {
  const n = LiteGraph.createNode(type);
  app.graph.add(n);
  return n.id;
}"""

SET = """([id, name, value]) => {
  const n = app.graph.getNodeById(id);
  const w = n.widgets.find(w => w.name === name);
  w.value = value;
  if (w.callback) w.callback(value, app.canvas, n);
  return (n.widgets || []).filter(w => !w.hidden).map(w => w.name);
}"""


def _node_state(page, nid):
    return page.evaluate("""(id) => { const n = app.graph.getNodeById(id);
      const ser = n.serialize();
      const w = (n.widgets || []).find(w => w.name === 'anydevice_readout');
      return {visible: (n.widgets || []).filter(w => !w.hidden).map(w => w.name),
              names: (n.widgets || []).map(w => w.name), values: ser.widgets_values, height: n.size[1],
              preview: n.anydevice && n.anydevice.preview ? n.anydevice.preview : null,
              readout: w && w.element ? w.element.innerText : null}; }""", nid)


def _vue_labels(page, nid) -> str:
    return page.evaluate("(id) => { const e = document.querySelector(`[data-node-id=\"${id}\"]`); "
                         "return e ? e.innerText : ''; }", nid)


def test_unused_widgets_are_hidden_and_values_keep_their_order(page):
    page.evaluate("() => app.graph.clear()")
    nid = page.evaluate(WIDGET_ORDER, "AnyDeviceConv2D")
    page.wait_for_timeout(300)
    st = _node_state(page, nid)
    all_names = ["kernel_source", "preset", "kernel_size", "sigma", "kernel_text", "init_seed", "channel_mode",
                 "out_channels", "groups", "stride", "padding", "padding_size", "dilation", "padding_mode", "bias",
                 "transposed", "output_padding"]
    assert st["names"][:17] == all_names  # nothing removed, nothing reordered
    assert st["values"][:17] == ["preset", "gaussian", 5, 1.0, "-1 0 1\n-2 0 2\n-1 0 1", 0, "depthwise", 8, 1, 1,
                                 "same", 0, 1, "auto", 0.0, False, 0]
    assert len(st["values"]) == 17  # the readout widget is not saved
    hidden = {"kernel_text", "init_seed", "out_channels", "groups", "padding_size", "output_padding"}
    assert set(all_names) - set(st["visible"]) == hidden, st["visible"]
    # the gaussian preset shows the gaussian, not the sobel text
    assert st["preview"]["label"].startswith("gaussian 5×5")
    if full_ui(page.cfg):
        assert "-2" not in st["readout"] and "gaussian 5×5" in st["readout"]
    if page.cfg[2] == "vue":
        page.wait_for_timeout(300)
        labels = _vue_labels(page, nid)
        assert "kernel_source" in labels and "kernel_text" not in labels and "output_padding" not in labels, labels
    shot(page, "conv2d_preset")

    vis = page.evaluate(SET, [nid, "kernel_source", "text"])
    assert "kernel_text" in vis and "preset" not in vis and "sigma" not in vis and "kernel_size" not in vis
    vis = page.evaluate(SET, [nid, "channel_mode", "grouped"])
    assert "out_channels" in vis and "groups" in vis
    vis = page.evaluate(SET, [nid, "transposed", True])
    assert "output_padding" in vis and "padding_mode" not in vis
    st = _node_state(page, nid)
    assert st["values"][:17] == ["text", "gaussian", 5, 1.0, "-1 0 1\n-2 0 2\n-1 0 1", 0, "grouped", 8, 1, 1,
                                 "same", 0, 1, "auto", 0.0, True, 0]
    assert st["preview"]["label"].startswith("text 3×3")
    if page.cfg[2] == "vue" and full_ui(page.cfg):  # 1.27's experimental Vue nodes do not follow later changes
        page.wait_for_timeout(300)
        assert "output_padding" in _vue_labels(page, nid)
    for name, value in (("kernel_source", "preset"), ("channel_mode", "depthwise"), ("transposed", False)):
        page.evaluate(SET, [nid, name, value])
    back = page.evaluate("(id) => { const n = app.graph.getNodeById(id); return [n.size[1], n.computeSize()[1]]; }", nid)
    assert back[0] == pytest.approx(back[1], abs=1)  # the node is fitted to what it shows

    # Linear in preset mode shows the preset's matrix, not the matrix text
    lid = page.evaluate(WIDGET_ORDER, "AnyDeviceLinear")
    page.wait_for_timeout(200)
    st = _node_state(page, lid)
    assert "matrix" not in st["visible"] and "out_features" not in st["visible"]
    assert st["values"] == ["preset", "sepia", 3, 0, "0.393 0.769 0.189\n0.349 0.686 0.168\n0.272 0.534 0.131", ""]
    page.evaluate(SET, [lid, "preset", "grayscale"])
    assert _node_state(page, lid)["preview"]["slices"][0]["values"][:3] == [0.299, 0.587, 0.114]
    assert "matrix" in page.evaluate(SET, [lid, "source", "text"])
    page.evaluate("() => app.graph.clear()")


def test_effective_kernel_matches_the_python_presets(page):
    page.evaluate("() => app.graph.clear()")
    nid = page.evaluate(WIDGET_ORDER, "AnyDeviceConv2D")
    for preset in P.KERNEL_PRESETS:
        for size, sigma in ((3, 1.0), (5, 1.0), (7, 2.0), (4, 0.7)):
            page.evaluate(SET, [nid, "preset", preset])
            page.evaluate(SET, [nid, "kernel_size", size])
            page.evaluate(SET, [nid, "sigma", sigma])
            pre = _node_state(page, nid)["preview"]
            want = P.kernel_preset(preset, size, sigma)
            assert pre["shape"] == list(want.shape), (preset, size)
            assert pre["slices"][0]["values"] == pytest.approx(want.reshape(-1).tolist(), abs=2e-5), (preset, size)
    lid = page.evaluate(WIDGET_ORDER, "AnyDeviceLinear")
    for preset in P.LINEAR_PRESETS:
        page.evaluate(SET, [lid, "preset", preset])
        pre = _node_state(page, lid)["preview"]
        w, b = P.color_preset(preset, 3)
        assert pre["slices"][0]["values"] == pytest.approx(w.reshape(-1).tolist(), abs=2e-5), preset
        assert (pre.get("bias") is None) == (b is None), preset
    page.evaluate("() => app.graph.clear()")


NAN_GRAPH = """() => {
  app.graph.clear();
  const mk = (type, x, y, values) => {
    const n = LiteGraph.createNode(type); n.pos = [x, y]; app.graph.add(n);
    for (const [k, v] of Object.entries(values || {})) {
      const w = n.widgets.find(w => w.name === k); w.value = v; if (w.callback) w.callback(v, app.canvas, n);
    }
    return n;
  };
  const img = mk('EmptyImage', 60, 120, {width: 16, height: 16, color: 0});
  const sub = mk('AnyDeviceTensorOps', 420, 120, {op: 'sub', scalar: 1.0});
  const log = mk('AnyDeviceTensorOps', 780, 120, {op: 'log'});
  const save = mk('SaveImage', 1140, 120, {filename_prefix: 'anydevice_nan'});
  img.connect(0, sub, 0); sub.connect(0, log, 0); log.connect(0, save, 0);
  app.canvas.ds.scale = 1; app.canvas.ds.offset = [0, 0]; app.canvas.setDirty(true, true);
  return log.id;
}"""


def test_nan_warning_is_shown_on_the_node(page, srv):
    nid = page.evaluate(NAN_GRAPH)
    page.wait_for_timeout(300)
    pid, prompt = queue(page, srv)
    assert prompt[str(nid)]["inputs"]["op"] == "log"
    hist = srv.wait_history(pid)
    entry = hist["outputs"][str(nid)]["anydevice"][0]
    page.wait_for_function(f"() => !!(app.graph.getNodeById({nid}).anydevice || {{}}).badge", timeout=30_000)
    page.wait_for_timeout(300)
    if entry.get("warning"):  # the nodes report NaN/Inf: the real message must be on the node
        st = [n for n in page.evaluate(STATE) if n["id"] == str(nid)][0]
        assert st["state"]["warning"] == entry["warning"]
        assert st["warnBadge"].startswith("⚠ ")
        if full_ui(page.cfg):
            assert entry["warning"] in st["readout"] and st["readoutShown"]
            assert entry["warning"] in page.evaluate("() => document.body.innerText")
        shot(page, "nan_warning")
    # the display, from a synthetic `executed` message (whether or not the nodes send `warning` yet)
    msg = dict(entry, warning="output has 12 NaN and 0 Inf values")
    page.evaluate("([id, msg]) => app.graph.getNodeById(id).onExecuted({anydevice: [msg]})", [nid, msg])
    page.wait_for_timeout(400)
    st = [n for n in page.evaluate(STATE) if n["id"] == str(nid)][0]
    assert st["state"]["warning"] == "output has 12 NaN and 0 Inf values"
    assert st["warnBadge"] == "⚠ NaN/Inf"
    assert "warning" not in st["state"]["badge"]
    if full_ui(page.cfg):
        assert st["readoutShown"] and "⚠ output has 12 NaN and 0 Inf values" in st["readout"]
        body = page.evaluate("() => document.body.innerText")
        assert "output has 12 NaN and 0 Inf values" in body
        if page.cfg[2] == "vue":
            assert "⚠ NaN/Inf" in body  # the badge
    shot(page, "nan_warning_synthetic")
    # a clean run clears it
    page.evaluate("([id, msg]) => app.graph.getNodeById(id).onExecuted({anydevice: [msg]})",
                  [nid, {k: v for k, v in entry.items() if k != "warning"}])
    st = [n for n in page.evaluate(STATE) if n["id"] == str(nid)][0]
    assert not st["state"]["warning"] and not st["warnBadge"]
    page.evaluate("() => app.graph.clear()")


def test_no_console_errors_at_all(page):
    # runs last for each configuration: every error the page logged, less the known harmless ones
    assert not H.pack_console_errors(page.messages), page.messages
