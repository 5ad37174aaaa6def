// AnyDevice: what the pack's two frontend extensions share (web/anydevice.js, the readouts and badges
// of every pack node; web/anydevice_train.js, the learning nodes' shape lines and loss curve).
//
// ComfyUI imports every .js in the web folder as an extension, this one too: it only exports
// (no registration, no listeners, no state, no ComfyUI import: the callers pass `app` and `api`),
// so importing it on its own does nothing. The two extensions import it as "./anydevice_dom.js".

/** px per readout line (both extensions' CSS use it). */
export const LINE = 16;

/** A number in a readout: `digits` significant digits, exponent form for the very small / large. */
export function formatNumber(v, digits) {
  if (typeof v !== "number" || !isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(3);
  return Number(v.toPrecision(digits)).toString();
}

/** Adds the stylesheet `css` to the page once (by its element id). */
export function injectCss(id, css) {
  if (document.getElementById(id)) return;
  const st = document.createElement("style");
  st.id = id;
  st.textContent = css;
  document.head.appendChild(st);
}

/** The CSS of a readout box `.root` and its one-line rows `.root .line`. */
export function readoutCss(root, line) {
  return `
.${root} { box-sizing: border-box; overflow: hidden; font: 12px/${LINE}px sans-serif; color: #ddd;
  padding: 2px 4px; pointer-events: none; }
.${root} .${line} { height: ${LINE}px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
`;
}

/** The node's widget called `name`, or undefined. */
export function findWidget(node, name) {
  return (node.widgets || []).find((w) => w && w.name === name);
}

/**
 * Adds the node's readout DOM widget `name` (a div of class `className`) unless it has one: added
 * last and never serialised (neither in widgets_values nor in the prompt), not in the properties
 * panel, its height `height(node)` in both renderers; the stylesheet `css` goes into the page with
 * the first one (id `cssId`). Returns the widget (the one already there, if any; undefined where
 * the frontend has no DOM widgets).
 */
export function addReadoutWidget(node, { name, className, height, cssId, css }) {
  if (!node.addDOMWidget || findWidget(node, name)) return findWidget(node, name);
  injectCss(cssId, css);
  const el = document.createElement("div");
  el.className = className;
  el.dataset.nodeType = node.type;
  const w = node.addDOMWidget(name, name, el, {
    serialize: false,
    hideOnZoom: false,
    margin: 4,
    getValue: () => "",
    setValue: () => {},
    getMinHeight: () => height(node),
    getMaxHeight: () => height(node),
    getHeight: () => height(node),
  });
  if (w) {
    w.serialize = false; // not in widgets_values (it is added last, so indices are unchanged anyway)
    if (w.options) {
      w.options.serialize = false; // not in the prompt
      w.options.hideInPanel = true;
    }
  }
  return w;
}

/** One readout line: a div of class `className` holding `text`. */
export function lineDiv(text, className) {
  const d = document.createElement("div");
  d.className = className;
  d.textContent = text;
  return d;
}

/** Sets the readout widget's height to `h` px; with nothing to show (h 0) the widget itself is hidden. */
export function sizeReadout(w, h) {
  w.element.style.height = `${h}px`;
  const hide = !h;
  if (!!w.hidden !== hide) {
    w.hidden = hide;
    if (w.options) w.options.hidden = hide;
  }
}

/** Grows the node to its computed size (`exact`: to exactly that height), then asks for a redraw. */
export function fitNode(node, exact) {
  try {
    const need = node.computeSize();
    if (exact ? Math.abs(node.size[1] - need[1]) > 1 : node.size[1] < need[1]) {
      node.setSize([Math.max(node.size[0], need[0]), need[1]]);
    }
  } catch (e) {
    // computeSize can fail on half-built nodes; the next update fits again
  }
  node.setDirtyCanvas?.(true, true);
  node.graph?.setDirtyCanvas?.(true, true);
}

/** Wraps obj[name] (a node callback): the old one runs first, then `fn`; a failing `fn` is logged. */
export function chain(obj, name, fn) {
  const prev = obj[name];
  obj[name] = function () {
    const r = prev ? prev.apply(this, arguments) : undefined;
    try {
      fn.apply(this, arguments);
    } catch (e) {
      console.warn(`[AnyDevice] ${name} failed`, e);
    }
    return r;
  };
}

/**
 * Follows the queue through `api`; returns a function giving the id of the prompt now running.
 * ComfyUI sends no `executed` for the nodes it took from its cache: their last ui is in the
 * prompt's history, so after each prompt that succeeded `cached(nodeId, output, promptId)` is
 * called for every node output there (a failure is logged as "could not read the history for
 * <what>").
 */
export function watchPrompts(app, api, cached, what) {
  let current = null;
  api.addEventListener("execution_start", (e) => {
    current = e && e.detail ? e.detail.prompt_id : null;
  });
  api.addEventListener("execution_success", (e) => {
    const pid = e && e.detail ? e.detail.prompt_id : null;
    if (pid) fillFromHistory(app, api, pid, cached, what);
  });
  return () => current;
}

async function fillFromHistory(app, api, promptId, cached, what) {
  try {
    const res = await api.fetchApi(`/history/${encodeURIComponent(promptId)}`);
    if (!res.ok) return;
    const entry = (await res.json())[promptId];
    if (!entry || !entry.outputs || !app.graph) return;
    for (const [id, output] of Object.entries(entry.outputs)) cached(id, output, promptId);
  } catch (e) {
    console.warn(`[AnyDevice] could not read the history for ${what}`, e);
  }
}
