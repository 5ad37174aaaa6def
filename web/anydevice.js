// AnyDevice Compute Nodes: what the nodes show beside their widgets.
//
// Everything here uses mechanisms that both of the frontend's renderers display (the classic
// LiteGraph canvas and the Vue node renderer, `Comfy.VueNodes.Enabled`):
// - a node badge (`node.badges`) on every pack node: backend, device and time of its last run, and a
//   red warning badge when the run reported NaN/Inf (`warning` in the ui payload);
// - a DOM widget (`addDOMWidget`, added last, never serialised) with the readouts: Loss value, Tensor
//   Info shape/dtype/min/max/mean, Device Select status, the warning line, and for Conv2D and Linear
//   the effective kernel (computed from the widgets before a run, the run's own kernel after it);
// - widgets the current mode does not use are hidden (`widget.hidden`); hiding never removes a
//   widget, so the order of `widgets_values` and the prompt stay as they were.
// The Python nodes feed this through their `ui` dict: {"anydevice": [{backend, device, ms, warning?}],
// "loss": [...], "info": [...], "kernel": [...]}.
// The DOM widget, its base CSS, the node fitting and the prompt/history tracking are shared with
// web/anydevice_train.js through web/anydevice_dom.js.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { LINE, addReadoutWidget as addDomReadout, chain, findWidget, fitNode, formatNumber, 
  lineDiv, readoutCss, sizeReadout, watchPrompts } from "./anydevice_dom.js";

const EXT = "AnyDevice.Readouts";
const READOUT = "anydevice_readout";
const CSS_ID = "anydevice-css";

// ---------------------------------------------------------------------------------------------
// formatting
// ---------------------------------------------------------------------------------------------
function fmt(v) {
  return formatNumber(v, 6);
}

function cellText(v) {
  if (!isFinite(v)) return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 100 || a < 1e-3) return v.toExponential(0);
  if (Number.isInteger(v)) return String(v);
  return (a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toFixed(3).replace(/^(-?)0\./, "$1."));
}

function fmtMs(ms) {
  if (typeof ms !== "number" || !isFinite(ms)) return String(ms);
  return ms >= 100 ? String(Math.round(ms)) : Number(ms.toPrecision(3)).toString();
}

function shortDevice(d) {
  if (!d) return "";
  return d.length > 18 ? d.slice(0, 17) + "…" : d;
}

// ---------------------------------------------------------------------------------------------
// which widgets each mode uses (mirrors nodes/compute/conv.py, nodes/compute/ops.py and nodes/tensors/nodes.py; the layer nodes
// serve theirs, see servedRules)
// ---------------------------------------------------------------------------------------------
const SIZED_KERNELS = ["identity", "box_blur", "gaussian"];
const BINARY = ["add", "sub", "mul", "div", "pow", "min", "max", "matmul"];
const REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"];
const SHAPED = ["random_normal", "random_uniform", "zeros", "ones"];

// widget name -> (widget values, node) => used?  Widgets not listed are always shown.
const USED = {
  AnyDeviceConv2D: {
    preset: (v) => v.kernel_source === "preset",
    kernel_size: (v) => v.kernel_source === "random" || (v.kernel_source === "preset" && SIZED_KERNELS.includes(v.preset)),
    sigma: (v) => v.kernel_source === "preset" && v.preset === "gaussian",
    kernel_text: (v) => v.kernel_source === "text",
    init_seed: (v) => v.kernel_source === "random",
    out_channels: (v) => v.channel_mode === "grouped",
    groups: (v) => v.channel_mode === "grouped",
    padding_size: (v) => v.padding === "explicit",
    padding_mode: (v) => v.padding !== "valid" && !v.transposed,
    output_padding: (v) => !!v.transposed,
  },
  AnyDeviceLinear: {
    preset: (v) => v.source === "preset",
    out_features: (v) => v.source === "random",
    init_seed: (v) => v.source === "random",
    matrix: (v) => v.source === "text",
  },
  AnyDeviceActivation: {
    negative_slope: (v) => v.activation === "leaky_relu",
    alpha: (v) => v.activation === "elu",
    approximate: (v) => v.activation === "gelu",
    beta: (v) => v.activation === "softplus",
    threshold: (v) => v.activation === "softplus",
    dim: (v) => v.activation === "softmax",
  },
  AnyDeviceLoss: {
    delta: (v) => v.loss === "huber" || v.loss === "smooth_l1",
    data_range: (v) => v.loss === "psnr" || v.loss === "ssim",
    window_size: (v) => v.loss === "ssim",
    sigma: (v) => v.loss === "ssim",
  },
  AnyDeviceTensorOps: {
    scalar: (v, node) => BINARY.includes(v.op) && !inputLinked(node, "b"),
    clamp_min: (v) => v.op === "clamp",
    clamp_max: (v) => v.op === "clamp",
    dims: (v) => REDUCE.includes(v.op) || v.op === "normalize",
    keepdim: (v) => REDUCE.includes(v.op),
  },
  AnyDeviceTensorSource: {
    shape: (v) => SHAPED.includes(v.mode),
    seed: (v) => v.mode === "random_normal" || v.mode === "random_uniform",
    text: (v) => v.mode === "text",
  },
  AnyDeviceWeights: {
    shape: (v) => v.source === "random",
    init_seed: (v) => v.source === "random" || (v.bias || "").trim() === "random",
    matrix: (v) => v.source === "text",
  },
};

// Nodes that serve their own table (the layer nodes, nodes/learn/layers.py): a choice widget's
// `anydevice_uses` option is {its value: [the widgets that apply to it]}; the widgets named under
// any value are shown only for the values that name them, the others always.
function servedRules(nodeData) {
  const rules = {};
  const choices = [];
  for (const section of ["required", "optional"]) {
    const inputs = (nodeData.input && nodeData.input[section]) || {};
    for (const [choice, spec] of Object.entries(inputs)) {
      const uses = spec && spec[1] && spec[1].anydevice_uses;
      if (!uses || typeof uses !== "object") continue;
      choices.push(choice);
      for (const name of new Set(Object.values(uses).flat())) {
        rules[name] = (v) => (uses[v[choice]] || []).includes(name);
      }
    }
  }
  return { rules, choices };
}

function inputLinked(node, name) {
  const inputs = node.inputs || [];
  const slot = inputs.findIndex((i) => i.name === name || (i.widget && i.widget.name === name));
  if (slot < 0) return false;
  if (typeof node.isInputConnected === "function") return !!node.isInputConnected(slot);
  return inputs[slot].link != null;
}

function widgetValues(node) {
  const v = {};
  for (const w of node.widgets || []) if (w && w.name) v[w.name] = w.value;
  return v;
}

const NO_ROW = () => [0, -4];

function hideOne(w, hide) {
  w.hidden = hide;
  if (w.options) w.options.hidden = hide; // the older Vue renderer reads options.hidden
  // Older canvases (frontend 1.27) skip hidden widgets when drawing but still give them a row
  // when laying the node out; a computeSize of [0, -4] takes the row away (the usual way).
  if (hide && w.computeSize !== NO_ROW) {
    w.anydevice_computeSize = Object.prototype.hasOwnProperty.call(w, "computeSize") ? w.computeSize : undefined;
    w.computeSize = NO_ROW;
  } else if (!hide && w.computeSize === NO_ROW) {
    if (w.anydevice_computeSize) w.computeSize = w.anydevice_computeSize;
    else delete w.computeSize;
    delete w.anydevice_computeSize;
  }
}

function setHidden(w, hide) {
  if (!!w.hidden === hide && !!(w.options && w.options.hidden) === hide) return false;
  hideOne(w, hide);
  // e.g. the control_after_generate widget of a seed
  for (const lw of w.linkedWidgets || []) hideOne(lw, hide);
  return true;
}

/** Hide the widgets the node's current mode does not use; true when something changed. */
function applyVisibility(node) {
  const rules = USED[node.type];
  if (!rules || !node.widgets) return false;
  const v = widgetValues(node);
  let changed = false;
  for (const w of node.widgets) {
    const rule = w && rules[w.name];
    if (!rule) continue;
    // a widget whose input socket is linked stays visible (the link is the value)
    const hide = !rule(v, node) && !inputLinked(node, w.name);
    changed = setHidden(w, hide) || changed;
  }
  return changed;
}

// ---------------------------------------------------------------------------------------------
// the effective kernel, from the widgets (mirrors nodes/compute/presets.py)
// ---------------------------------------------------------------------------------------------
const FIXED_KERNELS = {
  sharpen: [[0, -1, 0], [-1, 5, -1], [0, -1, 0]],
  sobel_x: [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]],
  sobel_y: [[-1, -2, -1], [0, 0, 0], [1, 2, 1]],
  laplacian: [[0, 1, 0], [1, -4, 1], [0, 1, 0]],
  emboss: [[-2, -1, 0], [-1, 1, 1], [0, 1, 2]],
};
const LUMA = [0.299, 0.587, 0.114];
const COLOR_PRESETS = {
  identity: [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
  grayscale: [LUMA, LUMA, LUMA],
  sepia: [[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]],
  swap_red_blue: [[0, 0, 1], [0, 1, 0], [1, 0, 0]],
  rotate_channels: [[0, 1, 0], [0, 0, 1], [1, 0, 0]],
  invert: [[-1, 0, 0], [0, -1, 0], [0, 0, -1]],
  desaturate_50: [[0.5 + 0.5 * LUMA[0], 0.5 * LUMA[1], 0.5 * LUMA[2]],
    [0.5 * LUMA[0], 0.5 + 0.5 * LUMA[1], 0.5 * LUMA[2]],
    [0.5 * LUMA[0], 0.5 * LUMA[1], 0.5 + 0.5 * LUMA[2]]],
  warm: [[1.1, 0, 0], [0, 1.0, 0], [0, 0, 0.85]],
  cool: [[0.85, 0, 0], [0, 1.0, 0], [0, 0, 1.1]],
};
const COLOR_BIAS = { invert: [1, 1, 1] };

function kernelPreset(name, size, sigma) {
  if (FIXED_KERNELS[name]) return FIXED_KERNELS[name];
  const n = Math.max(1, Math.floor(size) || 1);
  if (name === "identity") {
    const k = Array.from({ length: n }, () => new Array(n).fill(0));
    k[(n - 1) >> 1][(n - 1) >> 1] = 1;
    return k;
  }
  if (name === "box_blur") return Array.from({ length: n }, () => new Array(n).fill(1 / (n * n)));
  if (name === "gaussian") {
    if (!(sigma > 0)) return null;
    const g = [];
    for (let i = 0; i < n; i++) {
      const x = i - (n - 1) / 2;
      g.push(Math.exp(-(x * x) / (2 * sigma * sigma)));
    }
    let s = 0;
    for (const a of g) for (const b of g) s += a * b;
    return g.map((a) => g.map((b) => (a * b) / s));
  }
  return null;
}

function parseMatrix(text) {
  const rows = String(text || "").split(/[\n;]+/).map((r) => r.trim()).filter((r) => r);
  if (!rows.length) return null;
  const m = rows.map((r) => r.split(/[\s,]+/).filter((t) => t).map(Number));
  if (m.some((r) => r.length !== m[0].length || r.some((x) => !isFinite(x)))) return null;
  return m;
}

function kernelOf(m, label) {
  const rows = m.length, cols = m[0].length;
  const shown = m.slice(0, 15).map((r) => r.slice(0, 15));
  return { label, shape: [rows, cols], preview: true,
    slices: [{ rows: shown.length, cols: shown[0].length, values: shown.flat().map((x) => Math.round(x * 1e5) / 1e5) }] };
}

/** The kernel the node will use, from its widgets: {label, shape, slices} or {note} or null. */
function effectiveKernel(node) {
  const v = widgetValues(node);
  if (node.type === "AnyDeviceConv2D") {
    if (v.kernel_source === "preset") {
      const k = kernelPreset(v.preset, v.kernel_size, v.sigma);
      return k ? kernelOf(k, `${v.preset} ${k.length}×${k[0].length}`) : { note: `${v.preset}: no kernel` };
    }
    if (v.kernel_source === "text") {
      const k = parseMatrix(v.kernel_text);
      return k ? kernelOf(k, `text ${k.length}×${k[0].length}`) : { note: "kernel_text is not a matrix", bad: true };
    }
    if (v.kernel_source === "random") return { note: `random ${v.kernel_size}×${v.kernel_size} (seed ${v.init_seed}): run to see it` };
    if (v.kernel_source === "weights") return { note: "kernel from the WEIGHTS input: run to see it" };
  }
  if (node.type === "AnyDeviceLinear") {
    if (v.source === "preset" && COLOR_PRESETS[v.preset]) {
      const k = kernelOf(COLOR_PRESETS[v.preset], `W ${v.preset}${v.preset === "identity" ? " (fits any channel count)" : ""}`);
      if (COLOR_BIAS[v.preset]) k.bias = COLOR_BIAS[v.preset];
      return k;
    }
    if (v.source === "text") {
      const k = parseMatrix(v.matrix);
      return k ? kernelOf(k, `W ${k.length}×${k[0].length} (text)`) : { note: "matrix is not a matrix", bad: true };
    }
    if (v.source === "random") return { note: `random W (${v.out_features} outputs, seed ${v.init_seed}): run to see it` };
    if (v.source === "weights") return { note: "W from the WEIGHTS input: run to see it" };
  }
  return null;
}

function kernelKey(node) {
  const v = widgetValues(node);
  delete v[READOUT];
  return JSON.stringify(v);
}

// ---------------------------------------------------------------------------------------------
// node badges (both renderers draw `node.badges`; a thunk is re-evaluated when drawn)
// ---------------------------------------------------------------------------------------------
class AnyDeviceBadge {
  constructor(bgColor) {
    // own enumerable fields only: the Vue renderer binds them as NodeBadge props
    this.text = "";
    this.fgColor = "#e8eef7";
    this.bgColor = bgColor;
  }
  get height() { return 20; }
  get visible() { return !!this.text; }
  getWidth(ctx) {
    if (!this.text) return 0;
    const f = ctx.font;
    ctx.font = "12px sans-serif";
    const w = ctx.measureText(this.text).width + 12;
    ctx.font = f;
    return w;
  }
  draw(ctx, x, y) {
    if (!this.text) return;
    const w = this.getWidth(ctx);
    ctx.save();
    ctx.fillStyle = this.bgColor;
    ctx.beginPath();
    if (ctx.roundRect) ctx.roundRect(x, y, w, this.height, 5);
    else ctx.rect(x, y, w, this.height);
    ctx.fill();
    ctx.font = "12px sans-serif";
    ctx.fillStyle = this.fgColor;
    ctx.textBaseline = "middle";
    ctx.textAlign = "left";
    ctx.fillText(this.text, x + 6, y + this.height / 2 + 1);
    ctx.restore();
  }
}

function ensureBadges(node) {
  if (node.anydevice_badges || !Array.isArray(node.badges)) return;
  const run = new AnyDeviceBadge("#24466e");
  const warn = new AnyDeviceBadge("#b3261e");
  node.anydevice_badges = { run, warn };
  // The Vue renderer memoises a node's badges; reading the readout widget's label (reactive
  // widget state there) inside the thunk makes it re-read them when a run bumps the label.
  const touch = () => {
    const w = readoutWidget(node);
    if (w) void w.label;
  };
  node.badges.push(() => (touch(), warn));
  node.badges.push(() => (touch(), run));
}

function updateBadges(node) {
  const b = node.anydevice_badges;
  const s = node.anydevice || {};
  if (!b) return;
  const r = s.badge;
  b.run.text = r ? `${r.backend}${r.device ? " · " + shortDevice(r.device) : ""} · ${fmtMs(r.ms)} ms${r.cached ? " (cached)" : ""}` : "";
  b.run.bgColor = r && r.backend === "host" ? "#3a3a3a" : "#24466e";
  // the badge stays short (the readout has the whole message)
  const w = s.warning || "";
  b.warn.text = !w ? "" : /NaN|Inf/.test(w) ? "⚠ NaN/Inf" : "⚠ " + (w.length > 22 ? w.slice(0, 21) + "…" : w);
}

// ---------------------------------------------------------------------------------------------
// the readout DOM widget
// ---------------------------------------------------------------------------------------------
const CSS = readoutCss("anydevice-readout", "ad-line") +
  `.anydevice-readout .ad-big { font-weight: bold; color: #f4f4f4; }
.anydevice-readout .ad-dim { color: #b8b8b8; }
.anydevice-readout .ad-ok { color: #8fd18f; }
.anydevice-readout .ad-bad { color: #ff8a80; }
.anydevice-readout .ad-warning { font-weight: bold; color: #fff; background: #b3261e; border-radius: 4px;
  padding: 0 4px; }
.anydevice-readout .ad-slices { display: flex; gap: 6px; align-items: flex-start; }
.anydevice-readout .ad-grid { display: grid; gap: 1px; }
.anydevice-readout .ad-cell { font: 10px/1 monospace; color: #fff; text-shadow: 0 0 2px #000;
  display: flex; align-items: center; justify-content: center; overflow: hidden; }
`;

function valueColour(v, max) {
  const t = max > 0 ? Math.max(-1, Math.min(1, v / max)) : 0;
  if (t >= 0) {
    const c = Math.round(40 + 215 * t);
    return `rgb(${c},${Math.round(40 + 90 * t)},${Math.round(40 * (1 - t))})`;
  }
  const c = Math.round(40 + 215 * -t);
  return `rgb(${Math.round(40 * (1 + t))},${Math.round(40 + 120 * -t)},${c})`;
}

function readoutWidget(node) {
  return findWidget(node, READOUT);
}

/** {lines: [{text, cls}], kernel: {...} | null} from the node's state. */
function readoutModel(node) {
  const s = (node.anydevice = node.anydevice || {});
  const lines = [];
  if (s.warning) lines.push({ text: "⚠ " + s.warning, cls: "ad-warning" });
  for (const l of s.loss || []) lines.push({ text: `${l.name} = ${fmt(l.value)}`, cls: "ad-big" });
  for (const i of s.info || []) {
    lines.push({ text: `${i.kind} [${(i.shape || []).join(", ")}] ${i.dtype}`, cls: "ad-big" });
    lines.push({ text: `min ${fmt(i.min)}   max ${fmt(i.max)}   mean ${fmt(i.mean)}`, cls: "ad-dim" });
  }
  if (s.status) lines.push({ text: s.status.text, cls: s.status.ok ? "ad-ok" : "ad-bad" });
  let kernel = null;
  if (node.type === "AnyDeviceConv2D" || node.type === "AnyDeviceLinear") {
    const key = kernelKey(node);
    const ran = s.kernel && s.kernel[0];
    const pre = effectiveKernel(node);
    s.preview = pre;
    if (ran && (s.kernelKey === key || !pre || pre.note)) kernel = Object.assign({ ran: true }, ran);
    else if (pre && pre.note) lines.push({ text: pre.note, cls: pre.bad ? "ad-bad" : "ad-dim" });
    else kernel = pre;
  }
  return { lines, kernel };
}

function kernelLayout(k) {
  if (!k || !k.slices || !k.slices.length) return null;
  const maxDim = Math.max(...k.slices.map((s) => Math.max(s.rows, s.cols)));
  const numbers = k.slices.length === 1 && maxDim <= 7;
  const cell = numbers ? (maxDim <= 3 ? 34 : maxDim <= 5 ? 30 : 26) : Math.max(4, Math.min(16, Math.floor(96 / maxDim)));
  const h = maxDim * (cell + 1) + LINE + 4;
  return { cell, numbers, h };
}

function readoutHeight(node) {
  const m = readoutModel(node);
  const kl = kernelLayout(m.kernel);
  let h = m.lines.length * LINE + (kl ? kl.h : 0);
  return h ? h + 8 : 0;
}

function renderReadout(node) {
  const w = readoutWidget(node);
  if (!w || !w.element) return;
  const el = w.element;
  const m = readoutModel(node);
  const kl = kernelLayout(m.kernel);
  const frag = document.createDocumentFragment();
  for (const l of m.lines) frag.appendChild(lineDiv(l.text, "ad-line " + (l.cls || "")));
  if (kl) {
    const k = m.kernel;
    const bias = k.bias ? `  + b (${k.bias.map(fmt).join(", ")})` : "";
    frag.appendChild(lineDiv(`${k.ran ? "" : "preview: "}${k.label}  [${(k.shape || []).join("×")}]${bias}`,
      "ad-line ad-dim ad-kernel-label"));
    const wrap = document.createElement("div");
    wrap.className = "ad-slices";
    for (const s of k.slices) {
      const grid = document.createElement("div");
      grid.className = "ad-grid";
      grid.style.gridTemplateColumns = `repeat(${s.cols}, ${kl.cell}px)`;
      grid.style.gridAutoRows = `${kl.cell}px`;
      const max = Math.max(1e-12, ...s.values.map((x) => Math.abs(x)));
      for (const x of s.values) {
        const c = document.createElement("div");
        c.className = "ad-cell";
        c.style.background = valueColour(x, max);
        if (kl.numbers) c.textContent = cellText(x);
        c.title = String(x);
        grid.appendChild(c);
      }
      wrap.appendChild(grid);
    }
    frag.appendChild(wrap);
  }
  el.replaceChildren(frag);
  el.dataset.lines = String(m.lines.length);
  // nothing to show (a node without readouts before any warning): the widget itself is hidden
  sizeReadout(w, readoutHeight(node));
}

function addReadoutWidget(node) {
  return addDomReadout(node, { name: READOUT, className: "anydevice-readout", height: readoutHeight, cssId: CSS_ID,
    css: CSS });
}

// ---------------------------------------------------------------------------------------------
// updating a node
// ---------------------------------------------------------------------------------------------
let bump = 0;
function refresh(node, exact = false) {
  try {
    updateBadges(node);
    renderReadout(node);
    const w = readoutWidget(node);
    if (w) w.label = `anydevice ${++bump}`; // wakes the Vue renderer's badge/widget views
    fitNode(node, exact);
  } catch (e) {
    console.warn("[AnyDevice] readout update failed", e);
  }
}

function deviceStatus(node, statusMap) {
  const w = node.widgets && node.widgets.find((x) => x.name === "device");
  if (!w || !statusMap) return null;
  const text = statusMap[w.value] || "";
  return { text: `${w.value}: ${text}`, ok: !text.startsWith("unavailable") };
}

function applyOutput(node, output, cached) {
  try {
    const s = (node.anydevice = node.anydevice || {});
    const entry = output && output.anydevice && output.anydevice[0];
    if (entry) {
      s.badge = Object.assign({}, entry);
      delete s.badge.warning;
      s.warning = entry.warning || null;
    }
    if (s.badge) s.badge.cached = !!cached;
    if (output && output.loss) s.loss = output.loss;
    if (output && output.info) s.info = output.info;
    if (output && output.kernel) {
      s.kernel = output.kernel;
      s.kernelKey = kernelKey(node);
    }
    s.prompt = currentPrompt();
    s.runs = (s.runs || 0) + 1;
    refresh(node);
  } catch (e) {
    console.warn("[AnyDevice] readout update failed", e);
  }
}

function isPackNode(node) {
  return node && typeof node.type === "string" && node.type.startsWith("AnyDevice");
}

// ComfyUI does not re-send `executed` for cached intermediate nodes; their last `ui` is in the
// prompt's history, so fill those badges from there (marked "cached").
function fillCached(id, output, promptId) {
  const node = app.graph.getNodeById ? app.graph.getNodeById(Number(id)) || app.graph.getNodeById(id) : null;
  if (!isPackNode(node)) return;
  if (node.anydevice && node.anydevice.prompt === promptId) return;
  applyOutput(node, output, true);
}

const currentPrompt = watchPrompts(app, api, fillCached, "cached nodes");

app.registerExtension({
  name: EXT,
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!nodeData || typeof nodeData.name !== "string" || !nodeData.name.startsWith("AnyDevice")) return;
    const isDeviceSelect = nodeData.name === "AnyDeviceDeviceSelect";
    let statusMap = null;
    if (isDeviceSelect) {
      try {
        statusMap = nodeData.input.required.device[1].anydevice_status || null;
      } catch (e) {
        statusMap = null;
      }
    }
    const served = servedRules(nodeData);
    if (!USED[nodeData.name] && served.choices.length) USED[nodeData.name] = served.rules;
    const controls = new Set(Object.values(USED[nodeData.name] || {}).length
      ? ["kernel_source", "preset", "channel_mode", "padding", "transposed", "source", "activation", "loss", "op",
        "mode", "bias", "kernel_size", "sigma", "kernel_text", "matrix", "init_seed", "out_features",
        ...served.choices]
      : []);

    const update = (node, exact) => {
      if (isDeviceSelect) {
        const s = (node.anydevice = node.anydevice || {});
        s.status = deviceStatus(node, statusMap);
      }
      const changed = applyVisibility(node);
      refresh(node, exact || changed);
    };

    chain(nodeType.prototype, "onNodeCreated", function () {
      ensureBadges(this);
      // every pack node gets the (unsaved) readout widget: readouts, warnings, and in the Vue
      // renderer the reactive state that refreshes the badges; empty, it is hidden
      addReadoutWidget(this);
      const node = this;
      for (const w of this.widgets || []) {
        if (!w || !(controls.has(w.name) || (isDeviceSelect && w.name === "device"))) continue;
        const cb = w.callback;
        w.callback = function () {
          const r = cb ? cb.apply(this, arguments) : undefined;
          update(node, false);
          return r;
        };
      }
      update(this, true);
    });
    // after a saved workflow's widgets_values are in: hide for its modes, fit the node
    chain(nodeType.prototype, "onConfigure", function () {
      ensureBadges(this);
      update(this, true);
    });
    chain(nodeType.prototype, "onConnectionsChange", function () {
      if (applyVisibility(this)) refresh(this, true);
    });
    chain(nodeType.prototype, "onExecuted", function (output) {
      applyOutput(this, output, false);
    });
  },
});
