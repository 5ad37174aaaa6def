"""Browser test (Playwright + Debian chromium) against the real ComfyUI server: each UI workflow from
the Templates API is loaded into the canvas, queued from the page, and must show its badges and
readouts with the headless runner's numbers and no console errors from the pack. Screenshots go to
test-artifacts/."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import e2e_helpers as H
from anydevice.nodes import runner

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "example_workflows" / "api"
CHROMIUM = "/usr/bin/chromium"

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

FIT_VIEW = """() => {
  const ns = app.graph._nodes;
  let x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
  for (const n of ns) {
    x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - 60);
    x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
  }
  const el = app.canvas.canvas;
  const w = el.clientWidth || 1600, h = el.clientHeight || 1000;
  const s = Math.max(0.62, Math.min(w / (x1 - x0 + 60), (h - 60) / (y1 - y0 + 60), 1.0));  // < 0.6 hides text
  app.canvas.ds.scale = s;
  app.canvas.ds.offset = [30 / s - x0, 60 / s - y0];
  app.canvas.setDirty(true, true);
}"""

STATE = """() => app.graph._nodes.filter(n => (n.type || '').startsWith('AnyDevice')).map(n => ({
  id: String(n.id), type: n.type, state: n.anydevice ? JSON.parse(JSON.stringify(n.anydevice)) : null,
  height: n.size[1]}))"""


@pytest.fixture(scope="module")
def srv():
    return H.server()


@pytest.fixture(scope="module")
def page(srv):
    messages = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        pg = browser.new_page(viewport={"width": 1920, "height": 1080})
        pg.on("console", lambda m: messages.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        pg.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
        pg.goto(srv.url + "/")
        pg.wait_for_function("window.app && window.app.graph && window.comfyAPI && window.comfyAPI.api", timeout=120_000)
        pg.wait_for_timeout(1500)
        pg.evaluate("""() => {
            window.__ad = {done: {}, errors: {}};
            const api = window.comfyAPI.api.api;
            api.addEventListener('execution_success', e => { window.__ad.done[e.detail.prompt_id] = 'success'; });
            api.addEventListener('execution_error', e => {
                window.__ad.done[e.detail.prompt_id] = 'error'; window.__ad.errors[e.detail.prompt_id] = e.detail; });
        }""")
        pg.messages = messages
        yield pg
        browser.close()


def test_extension_is_loaded(page, srv):
    names = page.evaluate("() => (app.extensions || []).map(e => e.name)")
    assert "AnyDevice.Readouts" in names
    assert not [m for m in page.messages if "anydevice" in m.lower()], page.messages


TEMPLATES = sorted(p.stem for p in API.glob("*.json"))


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_runs_in_the_browser(page, srv, name, tmp_path):
    listing = srv.get("/api/workflow_templates")
    assert name in listing[H.PACK_NAME]
    wf = srv.get(f"/api/workflow_templates/{H.PACK_NAME}/{name}.json")
    before = len(page.messages)
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)
    page.wait_for_timeout(300)
    # the graph the page would queue (widgets_values -> inputs) must equal the API twin
    api_from_ui = page.evaluate("async () => (await app.graphToPrompt()).output")
    twin = json.loads((API / f"{name}.json").read_text())
    for nid, node in twin.items():
        assert api_from_ui[nid]["class_type"] == node["class_type"]
        for k, v in node["inputs"].items():
            assert api_from_ui[nid]["inputs"].get(k) == v, (name, nid, k)
    # queue from the page (its client_id gets the `executed` events)
    cid = page.evaluate("window.comfyAPI.api.api.clientId")
    code, r = srv.post_prompt(api_from_ui, client_id=cid)
    assert code == 200, r
    pid = r["prompt_id"]
    page.wait_for_function(f"window.__ad.done[{json.dumps(pid)}]", timeout=120_000)
    assert page.evaluate(f"window.__ad.done[{json.dumps(pid)}]") == "success", page.evaluate("window.__ad.errors")
    hist = srv.wait_history(pid)
    try:
        page.wait_for_function(
            "() => app.graph._nodes.filter(n => (n.type||'').startsWith('AnyDevice'))"
            ".every(n => n.anydevice && n.anydevice.badge)", timeout=30_000)
    except Exception:
        missing = [n for n in page.evaluate(STATE) if not (n["state"] or {}).get("badge")]
        raise AssertionError(f"no badge on {missing}; history outputs for {sorted(hist['outputs'])}")
    page.evaluate(FIT_VIEW)
    page.wait_for_timeout(500)
    H.ARTIFACTS.mkdir(exist_ok=True)
    shot = H.ARTIFACTS / f"browser_{name}.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000

    local = runner.run_prompt(twin, output_dir=tmp_path, workflow_path=API / f"{name}.json")
    for n in page.evaluate(STATE):
        s = n["state"]
        assert s and s["badge"]["backend"] and s["badge"]["ms"] >= 0, n
        badge = dict(s["badge"])
        badge.pop("cached", None)
        assert badge == hist["outputs"][n["id"]]["anydevice"][0]
        if n["type"] == "AnyDeviceLoss":
            assert s["loss"][0]["value"] == pytest.approx(local.ui[n["id"]]["loss"][0]["value"], rel=1e-4, abs=1e-6)
        if n["type"] == "AnyDeviceTensorInfo":
            assert s["info"][0]["shape"] == local.ui[n["id"]]["info"][0]["shape"]
            assert s["info"][0]["mean"] == pytest.approx(local.ui[n["id"]]["info"][0]["mean"], rel=1e-4, abs=1e-5)
        if n["type"] in ("AnyDeviceConv2D", "AnyDeviceLinear"):
            assert s["kernel"][0]["slices"], n
        if n["type"] == "AnyDeviceDeviceSelect":
            assert s["status"]["ok"] and s["status"]["text"].startswith(("numpy", "cpu", "auto"))
    new = H.pack_console_errors(page.messages[before:])
    assert not new, new


def test_no_console_errors_at_all(page):
    # runs last in this module: every error the page logged, less the known harmless ones
    assert not H.pack_console_errors(page.messages), page.messages
