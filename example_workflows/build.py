"""Regenerates the example workflows: UI format (``*.json``, listed by ComfyUI under Templates >
Custom Nodes), their API-format twins (``api/*.json``, for ``anydevice run`` and ``POST /prompt``)
and the ``.jpg`` thumbnails (made by running each twin with the headless runner).

    python3 example_workflows/build.py            # from the repository root

The graphs are written once here, so the UI and API files cannot drift apart.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _load_pack():
    if "anydevice" not in sys.modules:
        spec = importlib.util.spec_from_file_location("anydevice", ROOT / "__init__.py",
                                                      submodule_search_locations=[str(ROOT)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["anydevice"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["anydevice"]


_load_pack()
from anydevice.nodes import NODE_CLASS_MAPPINGS as PACK  # noqa: E402

# core nodes: (widget names, widget defaults, output (name, type) list, socket inputs (name, type))
CORE = {
    "LoadImage": (["image", "upload"], ["photo.png", "image"], [("IMAGE", "IMAGE"), ("MASK", "MASK")], []),
    "SaveImage": (["filename_prefix"], ["ComfyUI"], [], [("images", "IMAGE")]),
    "PreviewImage": ([], [], [], [("images", "IMAGE")]),
    "EmptyImage": (["width", "height", "batch_size", "color"], [512, 512, 1, 0], [("IMAGE", "IMAGE")], []),
    "EmptyLatentImage": (["width", "height", "batch_size"], [512, 512, 1], [("LATENT", "LATENT")], []),
}
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")


def _spec(ct):
    """(widgets [(name, default)], sockets [(name, type)], outputs [(name, type)])."""
    if ct in CORE:
        names, defaults, outs, socks = CORE[ct]
        return list(zip(names, defaults)), socks, outs
    cls = PACK[ct]
    spec = cls.INPUT_TYPES()
    widgets, socks = [], []
    for section in ("required", "optional"):
        for name, entry in spec.get(section, {}).items():
            typ, opts = entry[0], entry[1] if len(entry) > 1 else {}
            if isinstance(typ, list):
                widgets.append((name, opts.get("default", typ[0])))
            elif typ in WIDGET_TYPES:
                widgets.append((name, opts.get("default")))
            else:
                socks.append((name, str(typ)))
    outs = [(n, str(t)) for n, t in zip(cls.RETURN_NAMES, cls.RETURN_TYPES)]
    return widgets, socks, outs


class Out:
    def __init__(self, node, slot):
        self.node, self.slot = node, slot


class Node:
    def __init__(self, graph, nid, ct, title, values, col, row):
        self.graph, self.id, self.ct, self.title, self.values = graph, nid, ct, title, values
        self.col, self.row = col, row

    def __getitem__(self, slot):
        return Out(self, slot)


class Graph:
    def __init__(self, name, note):
        self.name, self.note, self.nodes = name, note, []

    def add(self, ct, *, title=None, col=0, row=0, **values):
        widgets, socks, _ = _spec(ct)
        known = {n for n, _ in widgets} | {n for n, _ in socks}
        bad = set(values) - known
        assert not bad, f"{ct}: unknown inputs {bad}"
        n = Node(self, len(self.nodes) + 1, ct, title, values, col, row)
        self.nodes.append(n)
        return n

    # ---- API format -------------------------------------------------------------------------
    def api(self) -> dict:
        out = {}
        for n in self.nodes:
            widgets, socks, _ = _spec(n.ct)
            inputs = {}
            for name, default in widgets:
                if name == "upload":
                    continue
                inputs[name] = n.values.get(name, default)
            for name, _t in socks:
                v = n.values.get(name)
                if isinstance(v, Out):
                    inputs[name] = [str(v.node.id), v.slot]
            title = n.title or (PACK[n.ct].DISPLAY if n.ct in PACK else n.ct)
            out[str(n.id)] = {"inputs": inputs, "class_type": n.ct, "_meta": {"title": title}}
        return out

    @staticmethod
    def _height(n) -> int:
        widgets, socks, outs = _spec(n.ct)
        nw = len(widgets) + sum(1 for w, _ in widgets if w == "seed")
        h = 40 + 24 * (nw + max(len(socks), len(outs)))
        if any(isinstance(n.values.get(w, d), str) and "\n" in n.values.get(w, d) for w, d in widgets):
            h += 90
        if n.ct in ("AnyDeviceLoss", "AnyDeviceTensorInfo", "AnyDeviceConv2D", "AnyDeviceLinear"):
            h += 60  # the readout area under the widgets
        if n.ct in ("SaveImage", "PreviewImage", "LoadImage"):
            h = max(h, 330)
        return h

    # ---- UI (litegraph) format ----------------------------------------------------------------
    def ui(self, layout: dict | None = None) -> dict:
        """The UI-format workflow. ``layout`` (a saved UI workflow of this graph) keeps its node
        positions and sizes and its saved view: the bundled layouts are laid out by hand for a
        1600x1000 window (docs/FRONTEND.md), and a rebuild must not undo that."""
        links, nodes = [], []
        out_links = {}
        for n in self.nodes:
            _, socks, _ = _spec(n.ct)
            for slot, (name, _t) in enumerate(socks):
                v = n.values.get(name)
                if isinstance(v, Out):
                    _, _, souts = _spec(v.node.ct)
                    lid = len(links) + 1
                    links.append([lid, v.node.id, v.slot, n.id, slot, souts[v.slot][1]])
                    out_links.setdefault((v.node.id, v.slot), []).append(lid)
        link_to = {(lk[3], lk[4]): lk[0] for lk in links}
        heights = {n.id: self._height(n) for n in self.nodes}
        ypos = {}
        for col in {n.col for n in self.nodes}:
            y = 60
            for n in sorted((n for n in self.nodes if n.col == col), key=lambda n: n.row):
                ypos[n.id] = y
                y += heights[n.id] + 90
        for order, n in enumerate(self.nodes):
            widgets, socks, outs = _spec(n.ct)
            wv = []
            for name, default in widgets:
                wv.append(n.values.get(name, default))
                if name in ("seed", "noise_seed"):
                    wv.append("fixed")  # the frontend's control_after_generate widget
            inputs = [{"name": name, "type": t, "link": link_to.get((n.id, i))} for i, (name, t) in enumerate(socks)]
            outputs = [{"name": name, "type": t, "links": out_links.get((n.id, i), []), "slot_index": i}
                       for i, (name, t) in enumerate(outs)]
            node = {"id": n.id, "type": n.ct, "pos": [40 + 340 * n.col, ypos[n.id]],
                    "size": [310, heights[n.id]], "flags": {}, "order": order, "mode": 0,
                    "inputs": inputs, "outputs": outputs,
                    "properties": {"Node name for S&R": n.ct, "cnr_id": "anydevice"},
                    "widgets_values": wv}
            if n.title:
                node["title"] = n.title
            nodes.append(node)
        ds = {"scale": 0.75, "offset": [20, 20]}
        if layout:
            saved = {nd.get("id"): nd for nd in layout.get("nodes", [])}
            for node in nodes:
                old = saved.get(node["id"])
                if old and old.get("type") == node["type"]:
                    node["pos"], node["size"] = old.get("pos", node["pos"]), old.get("size", node["size"])
            ds = layout.get("extra", {}).get("ds", ds)
        return {"last_node_id": len(self.nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
                "groups": [], "config": {},
                "extra": {"ds": ds, "anydevice_note": self.note},
                "version": 0.4}


# =================================================================================================
def graphs() -> list[Graph]:
    out = []

    g = Graph("edge_detection", "Sobel x and y on a grey photo, combined as sqrt(gx^2 + gy^2) and scaled to 0..1.")
    img = g.add("LoadImage", image="photo.png", col=0)
    gray = g.add("AnyDeviceLinear", title="Grayscale", input=img[0], source="preset", preset="grayscale", col=1)
    gx = g.add("AnyDeviceConv2D", title="Sobel X", input=gray[0], kernel_source="preset", preset="sobel_x", col=2)
    gy = g.add("AnyDeviceConv2D", title="Sobel Y", input=gray[0], kernel_source="preset", preset="sobel_y", col=2,
               row=1)
    gx2 = g.add("AnyDeviceTensorOps", title="gx^2", a=gx[0], op="pow", scalar=2.0, col=3)
    gy2 = g.add("AnyDeviceTensorOps", title="gy^2", a=gy[0], op="pow", scalar=2.0, col=3, row=1)
    s = g.add("AnyDeviceTensorOps", title="gx^2 + gy^2", a=gx2[0], b=gy2[0], op="add", col=4)
    mag = g.add("AnyDeviceTensorOps", title="magnitude", a=s[0], op="sqrt", col=4, row=1)
    norm = g.add("AnyDeviceTensorOps", title="normalize 0..1", a=mag[0], op="normalize", col=5)
    g.add("AnyDeviceTensorInfo", input=mag[0], col=5, row=1)
    g.add("SaveImage", images=norm[0], filename_prefix="anydevice_edges", col=6)
    out.append(g)

    g = Graph("blur_sharpen_metrics", "Gaussian blur, then sharpen, each scored against the original by PSNR and SSIM.")
    img = g.add("LoadImage", image="photo.png", col=0)
    blur = g.add("AnyDeviceConv2D", title="Gaussian blur", input=img[0], kernel_source="preset", preset="gaussian",
                 kernel_size=7, sigma=2.0, col=1)
    sharp = g.add("AnyDeviceConv2D", title="Sharpen", input=blur[0], kernel_source="preset", preset="sharpen", col=2,
                  row=1)
    clamp = g.add("AnyDeviceTensorOps", title="clamp 0..1", a=sharp[0], op="clamp", clamp_min=0.0, clamp_max=1.0,
                  col=3, row=1)
    g.add("AnyDeviceLoss", title="PSNR blurred", prediction=blur[0], target=img[0], loss="psnr", col=2)
    g.add("AnyDeviceLoss", title="SSIM blurred", prediction=blur[0], target=img[0], loss="ssim", col=3)
    g.add("AnyDeviceLoss", title="PSNR sharpened", prediction=clamp[0], target=img[0], loss="psnr", col=4, row=1)
    g.add("AnyDeviceLoss", title="SSIM sharpened", prediction=clamp[0], target=img[0], loss="ssim", col=4)
    g.add("SaveImage", images=blur[0], filename_prefix="anydevice_blurred", col=5)
    g.add("SaveImage", images=clamp[0], filename_prefix="anydevice_sharpened", col=5, row=1)
    out.append(g)

    g = Graph("color_grading", "Colour matrices with Linear: sepia, grayscale and a warm matrix typed as text with a bias.")
    img = g.add("LoadImage", image="photo.png", col=0)
    sep = g.add("AnyDeviceLinear", title="Sepia", input=img[0], source="preset", preset="sepia", col=1)
    sepc = g.add("AnyDeviceTensorOps", title="clamp 0..1", a=sep[0], op="clamp", col=2)
    gray = g.add("AnyDeviceLinear", title="Grayscale", input=img[0], source="preset", preset="grayscale", col=1, row=1)
    warm = g.add("AnyDeviceLinear", title="Warm (text matrix)", input=img[0], source="text",
                 matrix="1.15 0.05 0\n0 1.0 0\n0 0.05 0.8", bias="0.02 0 -0.02", col=1, row=2)
    warmc = g.add("AnyDeviceTensorOps", title="clamp 0..1", a=warm[0], op="clamp", col=2, row=2)
    g.add("SaveImage", images=sepc[0], filename_prefix="anydevice_sepia", col=3)
    g.add("SaveImage", images=gray[0], filename_prefix="anydevice_grayscale", col=3, row=1)
    g.add("SaveImage", images=warmc[0], filename_prefix="anydevice_warm", col=3, row=2)
    out.append(g)

    g = Graph("random_cnn_features", "A small random CNN (two strided conv layers with ReLU/GELU) and its feature maps.")
    img = g.add("LoadImage", image="photo.png", col=0)
    t = g.add("AnyDeviceImageToTensor", image=img[0], col=1)
    w1 = g.add("AnyDeviceWeights", title="conv1 weights", source="random", shape="8, 3, 3, 3", init_seed=1, bias="random",
               col=1, row=1)
    c1 = g.add("AnyDeviceConv2D", title="conv1 3->8 /2", input=t[0], weights=w1[0], kernel_source="weights",
               channel_mode="grouped", groups=1, stride=2, padding="explicit", padding_size=1, padding_mode="zeros",
               col=2)
    a1 = g.add("AnyDeviceActivation", title="ReLU", input=c1[0], activation="relu", col=3)
    c2 = g.add("AnyDeviceConv2D", title="conv2 8->16 /2", input=a1[0], kernel_source="random", kernel_size=3, init_seed=2,
               channel_mode="grouped", out_channels=16, groups=1, stride=2, padding="explicit", padding_size=1,
               padding_mode="zeros", col=4)
    a2 = g.add("AnyDeviceActivation", title="GELU", input=c2[0], activation="gelu", col=5)
    f1 = g.add("AnyDeviceTensorToImage", title="conv1 maps", tensor=a1[0], mode="channel_grid", normalize=True,
               col=4, row=1)
    f2 = g.add("AnyDeviceTensorToImage", title="conv2 maps", tensor=a2[0], mode="channel_grid", normalize=True,
               col=6)
    g.add("AnyDeviceTensorInfo", input=a2[0], col=6, row=1)
    g.add("SaveImage", images=f1[0], filename_prefix="anydevice_cnn_layer1", col=5, row=1)
    g.add("SaveImage", images=f2[0], filename_prefix="anydevice_cnn_layer2", col=7)
    out.append(g)

    g = Graph("two_backends_agree", "The same graph on two backends (NumPy kernels and PyTorch); the Loss between "
                                    "them is ~0. Pick another backend (cuda, opencl, ...) on either DeviceSelect.")
    img = g.add("LoadImage", image="photo.png", col=0)
    da = g.add("AnyDeviceDeviceSelect", title="Backend A", device="numpy", col=0, row=1)
    db = g.add("AnyDeviceDeviceSelect", title="Backend B", device="cpu", col=0, row=2)
    ya = img[0]
    yb = img[0]
    for i, (dev, row) in enumerate(((da, 0), (db, 2))):
        c = g.add("AnyDeviceConv2D", title="blur " + "AB"[i], input=img[0], preset="gaussian", kernel_size=5,
                  sigma=1.5, device=dev[0], col=1, row=row)
        a = g.add("AnyDeviceActivation", title="tanh " + "AB"[i], input=c[0], activation="tanh", device=dev[0],
                  col=2, row=row)
        lin = g.add("AnyDeviceLinear", title="sepia " + "AB"[i], input=a[0], source="preset", preset="sepia",
                    device=dev[0], col=3, row=row)
        if i == 0:
            ya = lin
        else:
            yb = lin
    g.add("AnyDeviceLoss", title="MSE A vs B (~0)", prediction=ya[0], target=yb[0], loss="mse", col=4, row=1)
    g.add("AnyDeviceLoss", title="L1 A vs B (~0)", prediction=ya[0], target=yb[0], loss="l1", col=5, row=1)
    g.add("SaveImage", images=ya[0], filename_prefix="anydevice_backend_a", col=4)
    out.append(g)

    g = Graph("latent_filter", "Conv2D on a LATENT: a random latent blurred per channel, and an empty latent plus "
                               "a bias; the other LATENT keys are kept.")
    src = g.add("AnyDeviceTensorSource", title="random latent", mode="random_normal", shape="1, 4, 32, 32", seed=3,
                col=0)
    lat = g.add("AnyDeviceTensorToLatent", tensor=src[0], col=1)
    blur = g.add("AnyDeviceConv2D", title="blur latent", input=lat[0], preset="gaussian", kernel_size=5, sigma=1.0,
                 col=2)
    info = g.add("AnyDeviceTensorInfo", input=blur[0], col=3)
    back = g.add("AnyDeviceLatentToTensor", latent=info[0], col=4)
    view = g.add("AnyDeviceTensorToImage", title="latent channels", tensor=back[0], mode="channel_grid",
                 normalize=True, col=5)
    g.add("SaveImage", images=view[0], filename_prefix="anydevice_latent", col=6)
    empty = g.add("EmptyLatentImage", width=256, height=256, batch_size=1, col=0, row=1)
    box = g.add("AnyDeviceConv2D", title="box blur + bias", input=empty[0], preset="box_blur", kernel_size=3,
                bias=0.25, col=2, row=1)
    g.add("AnyDeviceTensorInfo", title="filtered empty latent", input=box[0], col=3, row=1)
    out.append(g)
    return out


def _thumbnail(saved: list[dict], dest: Path) -> None:
    from PIL import Image
    photo = Image.open(HERE / "input" / "photo.png").convert("RGB")
    tiles = [Image.open(s["path"]).convert("RGB") for s in saved if s["type"] == "output"] or [photo]
    if len(tiles) == 1 and tiles[0].size != photo.size:
        tiles = [tiles[0]]
    tiles = tiles[:3]
    size = 160
    sheet = Image.new("RGB", (size * len(tiles), size), (24, 24, 24))
    for i, t in enumerate(tiles):
        scale = size / max(t.size)
        t = t.resize((max(1, round(t.width * scale)), max(1, round(t.height * scale))),
                     Image.NEAREST if scale > 1 else Image.LANCZOS)
        sheet.paste(t, (i * size + (size - t.width) // 2, (size - t.height) // 2))
    sheet.save(dest, "JPEG", quality=82)


def write_graph(g, default_layout=None, show_text=False) -> None:
    """Writes one workflow: the UI file (keeping a saved layout's positions, else default_layout's),
    its API twin, and a thumbnail of what the headless runner saves when it runs the twin (with
    show_text, the nodes' ui text printed too)."""
    from anydevice.nodes.headless import runner
    (HERE / "api").mkdir(exist_ok=True)
    ui_path = HERE / f"{g.name}.json"
    layout = json.loads(ui_path.read_text()) if ui_path.exists() else default_layout
    ui_path.write_text(json.dumps(g.ui(layout), indent=1) + "\n")
    api = g.api()
    (HERE / "api" / f"{g.name}.json").write_text(json.dumps(api, indent=1) + "\n")
    tmp = Path(tempfile.mkdtemp(prefix="anydevice_thumb_"))
    try:
        res = runner.run_prompt(api, output_dir=tmp, workflow_path=HERE / "api" / f"{g.name}.json")
        _thumbnail(res.saved, HERE / f"{g.name}.jpg")
        for nid, ui in res.ui.items() if show_text else ():
            if ui.get("text"):
                print(f"  #{nid} {api[nid]['class_type']}: {'; '.join(ui['text'])}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {g.name}.json, api/{g.name}.json, {g.name}.jpg")


def main() -> int:
    for g in graphs():
        write_graph(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
