// AnyDevice Compute Nodes: on-node readouts.
// - every pack node: a badge above the title with backend, device and time of its last run
// - Loss: the value; Tensor Info: shape, dtype, min/max/mean; Conv2D and Linear: the kernel as a coloured grid
// - Device Select: the status (device, or why it is unavailable) of the chosen backend
// The Python nodes feed this through their `ui` dict: {"anydevice": [{backend, device, ms}], "loss": [...],
// "info": [...], "kernel": [...]}.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const EXT = "AnyDevice.Readouts";
const PAD = 6;
const LINE = 15;
const READOUT = "anydevice_readout";

function fmt(v) {
  if (typeof v !== "number" || !isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return Number(v.toPrecision(6)).toString();
}

function shortDevice(d) {
  if (!d) return "";
  return d.length > 34 ? d.slice(0, 33) + "…" : d;
}

// lines of text shown under the widgets, from the last `ui` payload
function readoutLines(node) {
  const s = node.anydevice || {};
  const lines = [];
  if (s.loss) {
    for (const l of s.loss) lines.push({ text: `${l.name} = ${fmt(l.value)}`, big: true });
  }
  if (s.info) {
    for (const i of s.info) {
      lines.push({ text: `${i.kind} [${i.shape.join(", ")}] ${i.dtype}`, big: true });
      lines.push({ text: `min ${fmt(i.min)}   max ${fmt(i.max)}   mean ${fmt(i.mean)}` });
    }
  }
  if (s.status) lines.push({ text: s.status.text, color: s.status.ok ? "#8fd18f" : "#ff8a80" });
  return lines;
}

function kernelBlock(node) {
  const k = node.anydevice && node.anydevice.kernel && node.anydevice.kernel[0];
  if (!k || !k.slices || !k.slices.length) return null;
  const maxDim = Math.max(...k.slices.map((s) => Math.max(s.rows, s.cols)));
  const cell = Math.max(3, Math.min(14, Math.floor(64 / maxDim)));
  const w = k.slices.map((s) => s.cols * cell + 6).reduce((a, b) => a + b, 0);
  const h = maxDim * cell + LINE + 4;
  return { k, cell, w, h };
}

function extraHeight(node) {
  const lines = readoutLines(node);
  const kb = kernelBlock(node);
  let h = 0;
  if (lines.length) h += lines.length * LINE + PAD;
  if (kb) h += kb.h + PAD;
  return h;
}

function fit(node) {
  node.anydevice_extra = extraHeight(node);
  try {
    const need = node.computeSize()[1];
    if (node.size[1] < need) node.setSize([node.size[0], need]);
  } catch (e) {
    // computeSize can fail on half-built nodes; the next draw fits again
  }
  node.setDirtyCanvas?.(true, true);
}

// A widget that reserves room under the other widgets for the readout; never serialised and never
// sent with the prompt (it is added last, so widgets_values indices are unchanged).
function addReadoutWidget(node) {
  if (!node.addCustomWidget || (node.widgets || []).some((w) => w.name === READOUT)) return;
  node.addCustomWidget({
    name: READOUT,
    type: "anydevice_readout",
    value: "",
    serialize: false,
    options: { serialize: false },
    computeSize(width) {
      return [width || 200, Math.max(4, extraHeight(node))];
    },
    draw(ctx, n, width, y) {
      try {
        drawReadout(n, ctx, y);
      } catch (e) {
        // drawing must never throw into the canvas loop
      }
    },
  });
}

function valueColour(v, max) {
  const t = max > 0 ? Math.max(-1, Math.min(1, v / max)) : 0;
  if (t >= 0) {
    const c = Math.round(40 + 215 * t);
    return `rgb(${c},${Math.round(40 + 90 * t)},${Math.round(40 * (1 - t))})`;
  }
  const c = Math.round(40 + 215 * -t);
  return `rgb(${Math.round(40 * (1 + t))},${Math.round(40 + 120 * -t)},${c})`;
}

function drawBadge(node, ctx) {
  const b = node.anydevice && node.anydevice.badge;
  if (!b) return;
  const text = `${b.backend}${b.device ? " · " + shortDevice(b.device) : ""} · ${fmt(b.ms)} ms${b.cached ? " (cached)" : ""}`;
  ctx.save();
  ctx.font = "11px sans-serif";
  const w = ctx.measureText(text).width + 10;
  const th = (window.LiteGraph && LiteGraph.NODE_TITLE_HEIGHT) || 30;
  const x = Math.max(0, node.size[0] - w);
  const y = -th - 18;
  ctx.fillStyle = b.backend === "host" ? "#3a3a3a" : "#24466e";
  ctx.beginPath();
  if (ctx.roundRect) ctx.roundRect(x, y, w, 16, 4);
  else ctx.rect(x, y, w, 16);
  ctx.fill();
  ctx.fillStyle = "#e8eef7";
  ctx.textBaseline = "middle";
  ctx.fillText(text, x + 5, y + 8);
  ctx.restore();
}

function drawReadout(node, ctx, top) {
  const lines = readoutLines(node);
  const kb = kernelBlock(node);
  if (!lines.length && !kb) return;
  let y = top + PAD / 2;
  ctx.save();
  ctx.textBaseline = "top";
  for (const l of lines) {
    ctx.font = l.big ? "bold 12px sans-serif" : "11px sans-serif";
    ctx.fillStyle = l.color || (l.big ? "#f0f0f0" : "#bbbbbb");
    ctx.fillText(l.text, 10, y, node.size[0] - 20);
    y += LINE;
  }
  if (kb) {
    y += PAD / 2;
    ctx.font = "11px sans-serif";
    ctx.fillStyle = "#bbbbbb";
    const label = `${kb.k.label}  [${kb.k.shape.join("×")}]`;
    ctx.fillText(label, 10, y, node.size[0] - 20);
    y += LINE + 2;
    let x = 10;
    for (const s of kb.k.slices) {
      const max = Math.max(1e-12, ...s.values.map((v) => Math.abs(v)));
      for (let r = 0; r < s.rows; r++) {
        for (let c = 0; c < s.cols; c++) {
          if (x + (c + 1) * kb.cell > node.size[0] - 4) continue;
          ctx.fillStyle = valueColour(s.values[r * s.cols + c], max);
          ctx.fillRect(x + c * kb.cell, y + r * kb.cell, kb.cell - 1, kb.cell - 1);
        }
      }
      x += s.cols * kb.cell + 6;
    }
  }
  ctx.restore();
}

function deviceStatus(node, statusMap) {
  const w = node.widgets && node.widgets.find((x) => x.name === "device");
  if (!w || !statusMap) return null;
  const text = statusMap[w.value] || "";
  return { text: `${w.value}: ${text}`, ok: !text.startsWith("unavailable") };
}

let currentPrompt = null;

function applyOutput(node, output, cached) {
  try {
    const s = (node.anydevice = node.anydevice || {});
    if (output && output.anydevice && output.anydevice[0]) s.badge = Object.assign({}, output.anydevice[0]);
    if (s.badge) s.badge.cached = !!cached;
    if (output && output.loss) s.loss = output.loss;
    if (output && output.info) s.info = output.info;
    if (output && output.kernel) s.kernel = output.kernel;
    s.prompt = currentPrompt;
    s.runs = (s.runs || 0) + 1;
    fit(node);
  } catch (e) {
    console.warn("[AnyDevice] readout update failed", e);
  }
}

function isPackNode(node) {
  return node && typeof node.type === "string" && node.type.startsWith("AnyDevice");
}

// ComfyUI does not re-send `executed` for cached intermediate nodes; their last `ui` is in the
// prompt's history, so fill those badges from there (marked "cached").
async function fillCached(promptId) {
  try {
    const res = await api.fetchApi(`/history/${encodeURIComponent(promptId)}`);
    if (!res.ok) return;
    const entry = (await res.json())[promptId];
    if (!entry || !entry.outputs || !app.graph) return;
    for (const [id, output] of Object.entries(entry.outputs)) {
      const node = app.graph.getNodeById ? app.graph.getNodeById(Number(id)) || app.graph.getNodeById(id) : null;
      if (!isPackNode(node)) continue;
      if (node.anydevice && node.anydevice.prompt === promptId) continue;
      applyOutput(node, output, true);
    }
  } catch (e) {
    console.warn("[AnyDevice] could not read the history for cached nodes", e);
  }
}

api.addEventListener("execution_start", (e) => {
  currentPrompt = e && e.detail ? e.detail.prompt_id : null;
});
api.addEventListener("execution_success", (e) => {
  const pid = e && e.detail ? e.detail.prompt_id : null;
  if (pid) fillCached(pid);
});

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

    const hasReadout = ["AnyDeviceLoss", "AnyDeviceTensorInfo", "AnyDeviceConv2D", "AnyDeviceLinear",
      "AnyDeviceDeviceSelect"].includes(nodeData.name);
    if (hasReadout) {
      const onNodeCreated = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function () {
        const r = onNodeCreated ? onNodeCreated.apply(this, arguments) : undefined;
        try {
          addReadoutWidget(this);
        } catch (e) {
          console.warn("[AnyDevice] could not add the readout area", e);
        }
        return r;
      };
    }

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      const r = onExecuted ? onExecuted.apply(this, arguments) : undefined;
      applyOutput(this, output, false);
      return r;
    };

    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      const r = onDrawForeground ? onDrawForeground.apply(this, arguments) : undefined;
      if (this.flags && this.flags.collapsed) return r;
      try {
        if (isDeviceSelect) {
          const st = deviceStatus(this, statusMap);
          const s = (this.anydevice = this.anydevice || {});
          const changed = !s.status || !st || s.status.text !== st.text;
          s.status = st;
          if (changed) fit(this);
        }
        drawBadge(this, ctx);
      } catch (e) {
        // drawing must never throw into the canvas loop
      }
      return r;
    };
  },
});
