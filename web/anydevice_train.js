// AnyDevice learning nodes: the live loss curve of Train Network and the shape lines of the layer nodes
// (and the text line of the data-set loader and the model nodes).
//
// Both go into one DOM widget per learning node (`addDOMWidget`, never serialised, added last so
// `widgets_values` keep their order), which both of the frontend's renderers show: the classic
// LiteGraph canvas and the Vue node renderer (`Comfy.VueNodes.Enabled`).
// - Train Network sends an `anydevice.train` server event every 0.1 s of wall time and at the last
//   step ({node, step, steps, loss}; {start: true} before the first); the curve is redrawn as they come,
//   and replaced by the run's own `ui.train_curve` when the node finishes (so a reload or a cached
//   run still shows it).
// - Every learning node returns `ui.text` lines (layer and output shape, accuracy, saved file...),
//   shown above the curve.
// The widget, its base CSS, the node fitting and the prompt/history tracking are shared with
// web/anydevice.js through web/anydevice_dom.js.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { LINE, addReadoutWidget, chain, findWidget, fitNode, formatNumber, lineDiv, readoutCss,
  sizeReadout, watchPrompts } from "./anydevice_dom.js";

const EXT = "AnyDevice.Train";
const WIDGET = "anydevice_train";
const CURVE_H = 130;
const CSS_ID = "anydevice-train-css";
const TYPES = new Set(["AnyDeviceNetworkInput", "AnyDeviceConvLayer", "AnyDeviceLinearLayer",
  "AnyDeviceActivationLayer", "AnyDeviceNormLayer", "AnyDevicePoolLayer", "AnyDeviceUpsampleLayer",
  "AnyDeviceDropoutLayer", "AnyDeviceFlattenLayer", "AnyDeviceResidual", "AnyDeviceTrainNetwork",
  "AnyDeviceApplyNetwork", "AnyDeviceSaveNetwork", "AnyDeviceLoadNetwork", "AnyDeviceLayerWeights",
  "AnyDeviceImagePatches", "AnyDeviceLoadLabeledImages",
  // the model nodes: their one `ui.text` line (what was compiled for which backend)
  "AnyDeviceModel", "AnyDeviceVAE", "AnyDeviceUpscaleModel"]);

const CSS = readoutCss("anydevice-train", "adt-line") +
  `.anydevice-train canvas { display: block; width: 100%; height: ${CURVE_H}px; border-radius: 4px; }
`;

function fmt(v) {
  return formatNumber(v, 5);
}

function state(node) {
  return (node.anydevice_train = node.anydevice_train || { lines: [], losses: [], steps: 0, live: false });
}

function widgetOf(node) {
  return findWidget(node, WIDGET);
}

function isTrain(node) {
  return node.type === "AnyDeviceTrainNetwork" || node.comfyClass === "AnyDeviceTrainNetwork";
}

function height(node) {
  const s = state(node);
  const lines = s.lines.length; // a warning is in the pack's readout widget (web/anydevice.js)
  const curve = isTrain(node) ? CURVE_H + 4 : 0;
  const h = lines * LINE + curve;
  return h ? h + 8 : 0;
}

function drawCurve(node, canvas) {
  const s = state(node);
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(120, canvas.clientWidth || (node.size ? node.size[0] - 24 : 280));
  const h = CURVE_H;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#1b1f24";
  ctx.fillRect(0, 0, w, h);
  const L = s.losses.filter((v) => typeof v === "number" && isFinite(v));
  ctx.font = "11px sans-serif";
  ctx.textBaseline = "top";
  if (!L.length) {
    ctx.fillStyle = "#8a929c";
    ctx.fillText("loss curve: queue the workflow", 8, 8);
    return;
  }
  const pad = { l: 8, r: 8, t: 20, b: 8 };
  const positive = L.every((v) => v > 0);
  const lo0 = Math.min(...L), hi0 = Math.max(...L);
  const logScale = positive && hi0 / lo0 > 50;
  const f = (v) => (logScale ? Math.log10(v) : v);
  let lo = f(lo0), hi = f(hi0);
  if (hi - lo < 1e-12) { hi += 0.5; lo -= 0.5; }
  const total = Math.max(s.steps || 0, L.length);
  const X = (i) => pad.l + (total > 1 ? (i / (total - 1)) : 0) * (w - pad.l - pad.r);
  const Y = (v) => pad.t + (1 - (f(v) - lo) / (hi - lo)) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#2c333b";
  ctx.lineWidth = 1;
  for (let k = 0; k <= 4; k++) {
    const y = pad.t + (k / 4) * (h - pad.t - pad.b);
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
  }
  ctx.strokeStyle = s.stopped ? "#ff8a80" : "#4fc3f7";
  ctx.lineWidth = 1.6;
  ctx.beginPath();
  // the curve holds at most a few hundred points (the final ui payload is thinned the same way)
  const n = L.length;
  const stride = Math.max(1, Math.floor(n / 600));
  for (let i = 0; i < n; i += stride) {
    const x = X(s.thinned ? (i / Math.max(1, n - 1)) * (total - 1) : i), y = Y(L[i]);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  }
  ctx.stroke();
  ctx.fillStyle = "#e8eef7";
  const step = s.live ? s.step : total;
  const last = L[L.length - 1];
  ctx.fillText(`step ${step}/${total}   loss ${fmt(last)}${logScale ? "   (log scale)" : ""}`, pad.l, 4);
}

function render(node) {
  const w = widgetOf(node);
  if (!w || !w.element) return;
  const s = state(node);
  const el = w.element;
  const frag = document.createDocumentFragment();
  for (const t of s.lines) frag.appendChild(lineDiv(t, "adt-line"));
  let canvas = el.querySelector("canvas");
  if (isTrain(node)) {
    if (!canvas) {
      canvas = document.createElement("canvas");
      canvas.className = "anydevice-train-curve";
    }
    frag.appendChild(canvas);
  }
  el.replaceChildren(frag);
  el.dataset.steps = String(s.losses.length);
  sizeReadout(w, height(node));
  if (canvas) drawCurve(node, canvas);
}

let bump = 0;
function refresh(node) {
  try {
    render(node);
    const w = widgetOf(node);
    if (w) w.label = `anydevice train ${++bump}`; // wakes the Vue renderer's view of the widget
    fitNode(node, false); // grows the node when the lines or the curve need it
  } catch (e) {
    console.warn("[AnyDevice] training readout failed", e);
  }
}

function addWidget(node) {
  addReadoutWidget(node, { name: WIDGET, className: "anydevice-train", height, cssId: CSS_ID, css: CSS });
}

function findNode(id) {
  const g = app.graph;
  if (!g || id == null) return null;
  const sid = String(id);
  const last = sid.includes(":") ? sid.split(":").pop() : sid; // a node inside a subgraph: "outer:inner"
  let node = g.getNodeById ? (g.getNodeById(Number(last)) || g.getNodeById(last)) : null;
  if (!node && sid.includes(":") && app.canvas && app.canvas.graph && app.canvas.graph.getNodeById) {
    node = app.canvas.graph.getNodeById(Number(last)) || app.canvas.graph.getNodeById(last);
  }
  return node;
}

api.addEventListener("anydevice.train", (e) => {
  const d = e && e.detail;
  if (!d) return;
  const node = findNode(d.node);
  if (!node || !isTrain(node)) return;
  const s = state(node);
  if (d.start) {
    Object.assign(s, { losses: [], steps: 0, step: 0, live: true, thinned: false, stopped: null,
      lines: ["training…"] });
  } else {
    s.live = true;
    s.steps = d.steps;
    s.step = d.step;
    if (typeof d.loss === "number") s.losses.push(d.loss);
    s.lines = [`training: step ${d.step}/${d.steps}`];
  }
  // redraw the curve only (cheap) except on the first event, which may need the node to grow
  const w = widgetOf(node);
  const canvas = w && w.element && w.element.querySelector("canvas");
  if (canvas && !d.start && s.losses.length > 1) {
    const line = w.element.querySelector(".adt-line");
    if (line) line.textContent = s.lines[0];
    drawCurve(node, canvas);
    node.setDirtyCanvas?.(true, false);
  } else {
    refresh(node);
  }
});

function applyOutput(node, output) {
  const s = state(node);
  if (output && Array.isArray(output.text)) s.lines = output.text.map(String);
  const c = output && output.train_curve && output.train_curve[0];
  if (c) {
    s.losses = (c.loss || []).slice();
    s.steps = c.steps || s.losses.length;
    s.thinned = s.losses.length < s.steps;
    s.stopped = c.stopped || null;
    s.live = false;
  }
  refresh(node);
}

// ComfyUI sends no `executed` for nodes it took from its cache; their last ui is in the prompt's
// history, so their lines (and a cached Train node's curve) are filled from there.
function fillCached(id, output, promptId) {
  const node = findNode(id);
  if (!node || !TYPES.has(node.type)) return;
  const s = state(node);
  if (s.prompt === promptId) return;
  s.prompt = promptId;
  applyOutput(node, output);
}

const currentPrompt = watchPrompts(app, api, fillCached, "cached learning nodes");

app.registerExtension({
  name: EXT,
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!nodeData || !TYPES.has(nodeData.name)) return;
    chain(nodeType.prototype, "onNodeCreated", function () {
      addWidget(this);
      refresh(this);
    });
    chain(nodeType.prototype, "onExecuted", function (output) {
      state(this).prompt = currentPrompt();
      applyOutput(this, output);
    });
    chain(nodeType.prototype, "onResize", function () {
      const w = widgetOf(this);
      const canvas = w && w.element && w.element.querySelector("canvas");
      if (canvas) drawCurve(this, canvas);
    });
  },
});
