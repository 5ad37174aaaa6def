// The check behind docs/notes/dedupe.md (not a test of the suite): drives web/anydevice.js and
// web/anydevice_train.js of one tree with a fake DOM, app and api through node creation, widget
// changes, executed outputs, live training events, a cached prompt's history and a failing history
// read, and prints everything they produce as JSON. Two trees give the same output when the
// frontend behaves the same. Usage (node 18+):
//   for v in old new; do mkdir -p /tmp/wc/$v/ext/pack /tmp/wc/$v/scripts
//     echo 'export const app = globalThis.__app;' > /tmp/wc/$v/scripts/app.js
//     echo 'export const api = globalThis.__api;' > /tmp/wc/$v/scripts/api.js
//     echo '{"type":"module"}' > /tmp/wc/$v/package.json; done
//   git show 8841cfc:web/anydevice.js > /tmp/wc/old/ext/pack/anydevice.js   # and anydevice_train.js
//   cp web/*.js /tmp/wc/new/ext/pack/; cp docs/notes/dedupe_webcheck.mjs /tmp/wc/check.mjs
//   echo '{"type":"module"}' > /tmp/wc/package.json
//   node /tmp/wc/check.mjs /tmp/wc/old > old.json; node /tmp/wc/check.mjs /tmp/wc/new > new.json; cmp old.json new.json
// Drives web/anydevice.js + web/anydevice_train.js (a given checkout) with a fake DOM, app and api;
// prints a JSON dump of everything they produce (DOM, widget flags, sizes, badges, canvas calls, warnings).
import { pathToFileURL } from "node:url";
const dir = process.argv[2];
const LOG = [];
const WARN = [];
console.warn = (...a) => WARN.push(a.map((x) => (x instanceof Error ? "Error:" + x.message : String(x))).join(" "));

class El {
  constructor(tag) { this.tagName = tag.toUpperCase(); this.children = []; this.className = ""; this.dataset = {};
    this.style = {}; this._text = ""; this.id = ""; this.parent = null; this.title = ""; }
  get textContent() { return this.children.length ? this.children.map((c) => c.textContent).join("") : this._text; }
  set textContent(t) { this.children = []; this._text = String(t); }
  appendChild(c) {
    if (c.isFragment) { for (const k of [...c.children]) this.appendChild(k); c.children = []; return c; }
    if (c.parent) c.parent.children.splice(c.parent.children.indexOf(c), 1);
    c.parent = this; this.children.push(c); return c;
  }
  replaceChildren(...cs) { for (const c of this.children) c.parent = null; this.children = []; for (const c of cs) this.appendChild(c); }
  matches(sel) { return sel.startsWith(".") ? this.className.split(/\s+/).includes(sel.slice(1)) : this.tagName === sel.toUpperCase(); }
  querySelector(sel) { for (const c of this.children) { if (c.matches(sel)) return c; const r = c.querySelector(sel); if (r) return r; } return null; }
  get clientWidth() { return 0; }
  getContext() {
    if (!this._ctx) {
      const t = {};
      this._ctx = new Proxy(t, {
        get(o, k) {
          if (k in o) return o[k];
          if (k === "measureText") return (s) => ({ width: String(s).length * 6 });
          return (...a) => LOG.push(["ctx." + String(k), ...a.map((x) => (typeof x === "number" ? +x.toFixed(6) : x))]);
        },
        set(o, k, v) { o[k] = v; LOG.push(["ctx=" + String(k), v]); return true; },
      });
    }
    return this._ctx;
  }
  dump() { return { tag: this.tagName, cls: this.className, id: this.id || undefined, data: { ...this.dataset }, style: { ...this.style },
    title: this.title || undefined, w: this.width, h: this.height,
    text: this.children.length ? undefined : this._text, kids: this.children.map((c) => c.dump()) }; }
}
const head = new El("head");
globalThis.document = {
  head,
  createElement: (t) => new El(t),
  createDocumentFragment: () => Object.assign(new El("#frag"), { isFragment: true }),
  getElementById: (id) => head.children.find((c) => c.id === id) || null,
};
globalThis.window = { devicePixelRatio: 1 };

const listeners = {};
const HISTORY = {};
const api = {
  addEventListener(t, f) { (listeners[t] = listeners[t] || []).push(f); },
  async fetchApi(url) { const id = decodeURIComponent(url.split("/").pop()); return { ok: true, json: async () => ({ [id]: HISTORY[id] }) }; },
};
const nodes = new Map();
const graph = { getNodeById: (id) => nodes.get(typeof id === "number" ? id : Number(id)) || null, setDirtyCanvas: () => LOG.push(["graph dirty"]) };
const exts = [];
const app = { graph, canvas: { graph }, registerExtension: (e) => exts.push(e) };
globalThis.__app = app; globalThis.__api = api;
const emit = (t, detail) => (listeners[t] || []).forEach((f) => f({ detail }));
const tick = () => new Promise((r) => setTimeout(r, 0));

for (const f of ["anydevice.js", "anydevice_dom.js", "anydevice_train.js"]) {
  try { await import(pathToFileURL(`${dir}/ext/pack/${f}`).href); } catch (e) { if (!String(e).includes("Cannot find module")) throw e; }
}

const DEFS = {
  AnyDeviceConv2D: [["kernel_source", "preset"], ["preset", "gaussian"], ["kernel_size", 5], ["sigma", 1.2], ["kernel_text", "1 2; 3 4"],
    ["init_seed", 0], ["channel_mode", "same"], ["out_channels", 3], ["groups", 1], ["padding", "same"], ["padding_size", 1],
    ["padding_mode", "reflect"], ["transposed", false], ["output_padding", 0]],
  AnyDeviceLinear: [["source", "preset"], ["preset", "invert"], ["out_features", 3], ["init_seed", 0], ["matrix", ""]],
  AnyDeviceDeviceSelect: [["device", "numpy"]],
  AnyDeviceLoss: [["loss", "ssim"], ["delta", 1], ["data_range", 1], ["window_size", 11], ["sigma", 1.5]],
  AnyDeviceTrainNetwork: [["loss", "mse"], ["steps", 5]],
  AnyDeviceConvLayer: [["out_channels", 8]],
  AnyDeviceApplyNetwork: [["batch_size", 4]],
};
const types = {};
for (const name of Object.keys(DEFS)) {
  const T = function () {};
  T.prototype = {};
  const nodeData = { name, input: { required: name === "AnyDeviceDeviceSelect" ? { device: [["numpy"], { anydevice_status: { numpy: "ready", opencl: "unavailable: none" } }] } : {} } };
  for (const e of exts) await e.beforeRegisterNodeDef(T, nodeData);
  types[name] = T;
}
let nextId = 1;
function make(name) {
  const n = Object.create(types[name].prototype);
  Object.assign(n, { type: name, comfyClass: name, id: nextId++, badges: [], size: [200, 100], graph, inputs: [{ name: "b", link: null }] });
  n.widgets = DEFS[name].map(([wn, v]) => ({ name: wn, value: v, options: {} }));
  n.addDOMWidget = function (wn, type, el, opts) { const w = { name: wn, type, element: el, options: opts }; this.widgets.push(w); return w; };
  n.computeSize = function () {
    let h = 30;
    for (const w of this.widgets) {
      if (w.computeSize) { h += w.computeSize()[1]; continue; }
      if (w.hidden) continue;
      h += w.element ? w.options.getHeight() : 24;
    }
    return [180, h];
  };
  n.setSize = function (s) { this.size = s.slice(); LOG.push(["setSize", this.id, ...s]); };
  n.setDirtyCanvas = function () { LOG.push(["dirty", this.id]); };
  nodes.set(n.id, n);
  n.onNodeCreated && n.onNodeCreated();
  return n;
}
const all = Object.keys(DEFS).map(make);
const byType = Object.fromEntries(all.map((n) => [n.type, n]));
for (const n of all) n.onConfigure && n.onConfigure({});
const snap = [];
function dumpAll(tag) {
  snap.push([tag, all.map((n) => ({ id: n.id, type: n.type, size: n.size,
    widgets: n.widgets.map((w) => ({ name: w.name, value: w.value, hidden: w.hidden, oh: w.options && w.options.hidden,
      ser: w.serialize, oser: w.options && w.options.serialize, panel: w.options && w.options.hideInPanel, label: w.label,
      cs: w.computeSize ? w.computeSize() : null, el: w.element ? w.element.dump() : null,
      hgt: w.options && w.options.getHeight ? [w.options.getHeight(), w.options.getMinHeight(), w.options.getMaxHeight()] : null })),
    badges: n.badges.map((b) => { const x = typeof b === "function" ? b() : b; return { text: x.text, bg: x.bgColor, fg: x.fgColor, vis: x.visible }; }),
    ad: JSON.parse(JSON.stringify(n.anydevice || null)), adt: JSON.parse(JSON.stringify(n.anydevice_train || null)) })),
    head.children.map((c) => [c.id, c.textContent]), LOG.splice(0), WARN.splice(0)]);
}
dumpAll("created");
// widget changes
const conv = byType.AnyDeviceConv2D;
for (const [wn, v] of [["kernel_source", "text"], ["kernel_text", "1 0 -1; 2 0 -2; 1 0 -1"], ["padding", "explicit"], ["kernel_source", "random"]]) {
  const w = conv.widgets.find((x) => x.name === wn); w.value = v; w.callback && w.callback(v);
}
const ds = byType.AnyDeviceDeviceSelect; ds.widgets[0].value = "opencl"; ds.widgets[0].callback && ds.widgets[0].callback("opencl");
const loss = byType.AnyDeviceLoss; loss.widgets[0].value = "huber"; loss.widgets[0].callback && loss.widgets[0].callback("huber");
dumpAll("widgets");
emit("execution_start", { prompt_id: "p1" });
conv.onExecuted({ anydevice: [{ backend: "opencl", device: "Portable Computing Language device name", ms: 12.3456, warning: "output has 3 NaN and 0 Inf values" }],
  kernel: [{ label: "random 3x3", shape: [3, 3], slices: [{ rows: 3, cols: 3, values: [1, -2, 0.5, 0.001, 1e-5, 123, 0, -0.25, 7] }] }] });
byType.AnyDeviceLinear.onExecuted({ anydevice: [{ backend: "host", device: "", ms: 0.0123 }], info: [{ kind: "TENSOR", shape: [1, 3], dtype: "float32", min: -1e-6, max: 123456.7, mean: 0.333333333 }] });
loss.onExecuted({ anydevice: [{ backend: "numpy", device: "CPU", ms: 250.4 }], loss: [{ name: "huber", value: 0.0123456789 }] });
const tr = byType.AnyDeviceTrainNetwork;
emit("anydevice.train", { node: String(tr.id), step: 0, steps: 0, loss: null, start: true });
for (let i = 1; i <= 5; i++) emit("anydevice.train", { node: String(tr.id), step: i, steps: 5, loss: 1 / (i ** 3 + 0.3) });
dumpAll("training");
tr.onExecuted({ anydevice: [{ backend: "numpy", device: "CPU", ms: 99 }], text: ["mse 0.008 after 5 steps (adam, lr 0.001)"],
  train_curve: [{ loss: [1, 0.125, 0.037, 0.0156, 0.008], steps: 5, name: "mse", stopped: null }] });
tr.onResize && tr.onResize();
byType.AnyDeviceConvLayer.onExecuted({ anydevice: [{ backend: "host", device: "CPU (network spec)", ms: 0.1 }], text: ["layer 0: conv 3x3 -> 8", "-> [1, 8, 32, 32]"] });
dumpAll("executed");
// a second prompt: ConvLayer and Apply cached (only in the history)
emit("execution_start", { prompt_id: "p2" });
HISTORY.p2 = { outputs: { [byType.AnyDeviceApplyNetwork.id]: { anydevice: [{ backend: "numpy", device: "CPU", ms: 5 }], text: ["output [4, 10]", "accuracy 75.00% (3/4)"] },
  [byType.AnyDeviceConvLayer.id]: { anydevice: [{ backend: "host", device: "CPU (network spec)", ms: 0.2 }], text: ["layer 0: conv 3x3 -> 8"] },
  [loss.id]: { anydevice: [{ backend: "numpy", device: "CPU", ms: 1 }], loss: [{ name: "huber", value: 2 }] } } };
loss.onExecuted({ anydevice: [{ backend: "numpy", device: "CPU", ms: 3 }], loss: [{ name: "huber", value: 3 }] });
emit("execution_success", { prompt_id: "p2" });
for (let i = 0; i < 5; i++) await tick();
dumpAll("cached");
HISTORY.p3 = { outputs: { 999: {} } };
api.fetchApi = async () => { throw new Error("offline"); };
emit("execution_success", { prompt_id: "p3" });
for (let i = 0; i < 5; i++) await tick();
dumpAll("offline");
process.stdout.write(JSON.stringify({ exts: exts.map((e) => e.name), snap }, null, 1));
