"""Headless runner: ``anydevice run WORKFLOW.json [--input IMAGE] [--output-dir DIR]``.

Runs an API-format workflow (ComfyUI's "Export (API)") made of this pack's nodes plus the core nodes
LoadImage, SaveImage, PreviewImage, EmptyImage and EmptyLatentImage, without a ComfyUI install.
Validation and execution follow ComfyUI's rules: only nodes that an output node needs run, in
dependency order; widget values are checked (VALIDATE_INPUTS, min/max, combos) before anything runs.
Saved files are named as ComfyUI names them: ``<prefix>_00001_.png``.
"""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import NODE_CLASS_MAPPINGS as PACK_NODES
from .common import check_widgets

log = logging.getLogger("anydevice")

PACK_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_INPUTS = PACK_ROOT / "example_workflows" / "input"


class WorkflowError(Exception):
    """A workflow that cannot run here; the message says why (node id, class, input)."""


class NodeFailed(Exception):
    """A node raised while running; the message is "#id <the node's own message>"."""

    def __init__(self, node_id: str, class_type: str, exc: Exception):
        super().__init__(f"#{node_id} {exc}")
        self.node_id, self.class_type, self.original = node_id, class_type, exc


# ---------------------------------------------------------------------------------------------
# the core nodes the runner does itself (with Pillow), matching ComfyUI's behaviour
# ---------------------------------------------------------------------------------------------
class _Ctx:
    def __init__(self, output_dir: Path, input_image: Path | None, search: list[Path]):
        self.output_dir = output_dir
        self.input_image = input_image
        self.search = search
        self.saved: list[dict] = []


def _save_path(output_dir: Path, filename_prefix: str, width: int, height: int):
    """folder_paths.get_save_image_path: (folder, filename, counter, subfolder)."""
    filename_prefix = filename_prefix.replace("%width%", str(width)).replace("%height%", str(height))
    subfolder = os.path.dirname(os.path.normpath(filename_prefix))
    filename = os.path.basename(os.path.normpath(filename_prefix))
    full = output_dir / subfolder
    if os.path.commonpath((str(output_dir.resolve()), str(full.resolve()))) != str(output_dir.resolve()):
        raise WorkflowError(f"filename_prefix {filename_prefix!r} points outside the output folder")
    full.mkdir(parents=True, exist_ok=True)

    def map_filename(name):
        plen = len(filename)
        prefix = name[:plen + 1]
        try:
            digits = int(name[plen + 1:].split("_")[0])
        except ValueError:
            digits = 0
        return digits, prefix

    try:
        counter = max(d for d, p in map(map_filename, os.listdir(full))
                      if os.path.normcase(p[:-1]) == os.path.normcase(filename) and p[-1:] == "_") + 1
    except ValueError:
        counter = 1
    return full, filename, counter, subfolder


def _save_images(ctx: _Ctx, images, filename_prefix: str, kind: str, folder: Path):
    from PIL import Image
    if not torch.is_tensor(images) or images.ndim != 4:
        raise WorkflowError(f"images must be an IMAGE [B,H,W,C], got {type(images).__name__}")
    full, filename, counter, subfolder = _save_path(folder, filename_prefix, images.shape[2], images.shape[1])
    results = []
    for batch_number, image in enumerate(images):
        i = 255.0 * image.cpu().numpy()
        img = Image.fromarray(np.clip(i, 0, 255).astype(np.uint8))
        name = filename.replace("%batch_num%", str(batch_number))
        file = f"{name}_{counter:05}_.png"
        img.save(full / file, compress_level=4 if kind == "output" else 1)
        results.append({"filename": file, "subfolder": subfolder, "type": kind})
        ctx.saved.append({"path": str(full / file), "filename": file, "subfolder": subfolder, "type": kind})
        counter += 1
    return {"ui": {"images": results}, "result": ()}


class LoadImage:
    RETURN_TYPES = ("IMAGE", "MASK")
    INPUTS = {"image": "STRING"}

    def run(self, ctx: _Ctx, image, **_):
        from PIL import Image, ImageOps
        path = ctx.input_image or _find_input(image, ctx.search)
        img = Image.open(path)
        img = ImageOps.exif_transpose(img)
        if img.mode == "I":
            img = img.point(lambda i: i * (1 / 255))
        rgb = np.array(img.convert("RGB")).astype(np.float32) / 255.0
        out = torch.from_numpy(rgb)[None]
        if "A" in img.getbands():
            mask = 1.0 - torch.from_numpy(np.array(img.getchannel("A")).astype(np.float32) / 255.0)
        else:
            mask = torch.zeros((64, 64), dtype=torch.float32)
        return (out, mask.unsqueeze(0))


class SaveImage:
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    INPUTS = {"images": "IMAGE", "filename_prefix": "STRING"}

    def run(self, ctx: _Ctx, images, filename_prefix="ComfyUI", **_):
        return _save_images(ctx, images, filename_prefix, "output", ctx.output_dir)


class PreviewImage:
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    INPUTS = {"images": "IMAGE"}

    def run(self, ctx: _Ctx, images, **_):
        prefix = "ComfyUI_temp_" + "".join(random.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
        return _save_images(ctx, images, prefix, "temp", ctx.output_dir / "temp")


class EmptyImage:
    RETURN_TYPES = ("IMAGE",)
    INPUTS = {"width": "INT", "height": "INT", "batch_size": "INT", "color": "INT"}

    def run(self, ctx: _Ctx, width=512, height=512, batch_size=1, color=0, **_):
        r = torch.full([batch_size, height, width, 1], ((color >> 16) & 0xFF) / 0xFF)
        g = torch.full([batch_size, height, width, 1], ((color >> 8) & 0xFF) / 0xFF)
        b = torch.full([batch_size, height, width, 1], (color & 0xFF) / 0xFF)
        return (torch.cat((r, g, b), dim=-1),)


class EmptyLatentImage:
    RETURN_TYPES = ("LATENT",)
    INPUTS = {"width": "INT", "height": "INT", "batch_size": "INT"}

    def run(self, ctx: _Ctx, width=512, height=512, batch_size=1, **_):
        return ({"samples": torch.zeros([batch_size, 4, height // 8, width // 8])},)


CORE_NODES = {c.__name__: c for c in (LoadImage, SaveImage, PreviewImage, EmptyImage, EmptyLatentImage)}


def _find_input(name: str, search: list[Path]) -> Path:
    p = Path(name)
    if p.is_absolute() and p.is_file():
        return p
    for d in search:
        if (d / name).is_file():
            return d / name
    where = ", ".join(str(d) for d in search)
    raise WorkflowError(f"LoadImage: input 'image' = {name!r}: file not found (looked in {where}); "
                        "pass --input PATH")


# ---------------------------------------------------------------------------------------------
# loading, validation, execution
# ---------------------------------------------------------------------------------------------
def load_workflow(path) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and "prompt" in data and isinstance(data["prompt"], dict):
        data = data["prompt"]
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise WorkflowError(f"{path} is a UI-format workflow; open it in ComfyUI and use "
                            "Workflow > Export (API), or run its twin in example_workflows/api/")
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "class_type" in v for v in data.values()):
        raise WorkflowError(f"{path} is not an API-format workflow ({{id: {{class_type, inputs}}}})")
    return data


def _title(prompt, nid) -> str:
    cls = prompt[nid]["class_type"]
    return f"#{nid} {cls}"


def _is_link(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], (str, int)) and isinstance(v[1], int)


def _is_output(cls) -> bool:
    return getattr(cls, "OUTPUT_NODE", False) is True


def validate(prompt: dict) -> list[str]:
    """Everything wrong with the prompt, as messages; [] when it can run."""
    errors = []
    for nid, node in prompt.items():
        ct = node["class_type"]
        if ct not in PACK_NODES and ct not in CORE_NODES:
            errors.append(f"{_title(prompt, nid)}: node '{ct}' needs ComfyUI (the headless runner supports this "
                          f"pack's nodes and {', '.join(CORE_NODES)}); run this workflow inside ComfyUI")
    if errors:
        return errors
    if not any(_is_output(PACK_NODES.get(n["class_type"]) or CORE_NODES[n["class_type"]]) for n in prompt.values()):
        return ["the workflow has no output node (SaveImage, PreviewImage, Loss, Tensor Info)"]
    try:
        needed = _order(prompt)
    except WorkflowError as exc:
        return [str(exc)]
    for nid in needed:  # as ComfyUI: only what an output node needs is validated and run
        node = prompt[nid]
        ct = node["class_type"]
        inputs = node.get("inputs", {})
        for name, v in inputs.items():
            if _is_link(v):
                src = str(v[0])
                if src not in prompt:
                    errors.append(f"{_title(prompt, nid)}: input '{name}' links to missing node {src}")
                    continue
                scls = PACK_NODES.get(prompt[src]["class_type"]) or CORE_NODES.get(prompt[src]["class_type"])
                if scls is not None and v[1] >= len(scls.RETURN_TYPES):
                    errors.append(f"{_title(prompt, nid)}: input '{name}' uses output {v[1]} of node {src}, "
                                  f"which has {len(scls.RETURN_TYPES)}")
        if ct in PACK_NODES:
            cls = PACK_NODES[ct]
            spec = cls.INPUT_TYPES()
            for name in spec.get("required", {}):
                if name not in inputs:
                    errors.append(f"{_title(prompt, nid)}: required input '{name}' is missing")
            widgets = {k: v for k, v in inputs.items() if not _is_link(v)}
            r = check_widgets(cls, widgets)
            if r is not True:
                errors.append(f"#{nid} {r}")
                continue
            vfn = getattr(cls, "VALIDATE_INPUTS", None)
            if vfn is not None:
                import inspect
                params = inspect.getfullargspec(vfn).args[1:]
                kw = {k: (None if _is_link(inputs[k]) else inputs[k]) for k in params if k in inputs}
                r = vfn(**kw)
                if r is not True:
                    errors.append(f"#{nid} {r}")
        else:
            for name in CORE_NODES[ct].INPUTS:
                if name not in inputs and name in ("images", "image"):
                    errors.append(f"{_title(prompt, nid)}: required input '{name}' is missing")
    return errors


def _order(prompt: dict) -> list[str]:
    """Nodes the output nodes need, dependencies first (ComfyUI runs nothing else)."""
    outputs = [nid for nid, n in prompt.items()
               if _is_output(PACK_NODES.get(n["class_type"]) or CORE_NODES[n["class_type"]])]
    order, state = [], {}

    def visit(nid, path):
        if state.get(nid) == 2:
            return
        if state.get(nid) == 1:
            raise WorkflowError(f"the workflow has a cycle through nodes {' -> '.join(path + [nid])}")
        state[nid] = 1
        for name, v in prompt[nid].get("inputs", {}).items():
            if _is_link(v):
                if str(v[0]) not in prompt:
                    raise WorkflowError(f"{_title(prompt, nid)}: input '{name}' links to missing node {v[0]}")
                visit(str(v[0]), path + [nid])
        state[nid] = 2
        order.append(nid)

    for nid in sorted(outputs, key=lambda s: (len(s), s)):
        visit(nid, [])
    return order


@dataclass
class RunResult:
    backend: str = ""
    results: dict = field(default_factory=dict)   # node id -> result tuple
    ui: dict = field(default_factory=dict)        # node id -> ui dict (as /history outputs)
    times_ms: dict = field(default_factory=dict)  # node id -> wall ms
    saved: list = field(default_factory=list)     # [{path, filename, subfolder, type}]


def run_prompt(prompt: dict, output_dir=None, input_image=None, workflow_path=None, echo=None) -> RunResult:
    """Validate and run an API-format prompt. Raises WorkflowError (with every problem) or the
    node's own error (prefixed with the node id)."""
    echo = echo or (lambda *_: None)
    errors = validate(prompt)
    if errors:
        raise WorkflowError("the workflow failed validation:\n  " + "\n  ".join(errors))
    output_dir = Path(output_dir or "output").resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    search = []
    if workflow_path is not None:
        wd = Path(workflow_path).resolve().parent
        search += [wd, wd / "input", wd.parent / "input"]
    search += [Path.cwd(), Path.cwd() / "input", EXAMPLE_INPUTS]
    ctx = _Ctx(output_dir, Path(input_image).resolve() if input_image else None, search)
    if ctx.input_image is not None and not ctx.input_image.is_file():
        raise WorkflowError(f"--input {input_image}: file not found")
    from ..backend import describe
    out = RunResult(backend=describe())
    echo(f"backend: {out.backend}")
    for nid in _order(prompt):
        node = prompt[nid]
        ct = node["class_type"]
        kwargs = {}
        for name, v in node.get("inputs", {}).items():
            kwargs[name] = out.results[str(v[0])][v[1]] if _is_link(v) else v
        t0 = time.perf_counter()
        try:
            if ct in PACK_NODES:
                cls = PACK_NODES[ct]
                spec = cls.INPUT_TYPES()
                known = {**spec.get("required", {}), **spec.get("optional", {})}
                r = getattr(cls(), cls.FUNCTION)(**{k: v for k, v in kwargs.items() if k in known})
            else:
                r = CORE_NODES[ct]().run(ctx, **kwargs)
        except WorkflowError as exc:
            raise WorkflowError(f"#{nid}: {exc}") from exc
        except Exception as exc:
            raise NodeFailed(nid, ct, exc) from exc
        ms = (time.perf_counter() - t0) * 1000
        if isinstance(r, dict):
            out.results[nid] = tuple(r.get("result", ()))
            if r.get("ui"):
                out.ui[nid] = r["ui"]
        else:
            out.results[nid] = tuple(r)
        out.times_ms[nid] = ms
        title = getattr(PACK_NODES.get(ct), "DISPLAY", ct)
        badge = (r.get("ui") or {}).get("anydevice", [{}])[0] if isinstance(r, dict) else {}
        where = f" [{badge['backend']}]" if badge.get("backend") else ""
        extra = ""
        if isinstance(r, dict) and r.get("ui", {}).get("text"):
            extra = "  " + "; ".join(r["ui"]["text"])
        echo(f"  #{nid:<3} {title:<30} {ms:9.2f} ms{where}{extra}")
    out.saved = ctx.saved
    return out


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("workflow", help="API-format workflow JSON (ComfyUI: Workflow > Export (API))")
    parser.add_argument("--input", metavar="IMAGE", default=None,
                        help="image file every LoadImage node loads (default: the file each names, looked up next "
                             "to the workflow, in ./input and in the pack's example_workflows/input)")
    parser.add_argument("--output-dir", metavar="DIR", default="output",
                        help="where SaveImage writes (PreviewImage writes to DIR/temp); default ./output")
    parser.add_argument("--json", action="store_true", help="print a JSON summary (backend, times, ui, files) last")


def main(args) -> int:
    if isinstance(args, (list, tuple)):
        import argparse
        p = argparse.ArgumentParser(prog="anydevice run", description=__doc__.split("\n")[0])
        add_arguments(p)
        args = p.parse_args(list(args))
    try:
        prompt = load_workflow(args.workflow)
    except (OSError, json.JSONDecodeError, WorkflowError) as exc:
        print(f"anydevice run: {exc}", file=sys.stderr)
        return 2
    print(f"anydevice run {args.workflow}")
    try:
        res = run_prompt(prompt, output_dir=args.output_dir, input_image=args.input, workflow_path=args.workflow,
                         echo=print)
    except WorkflowError as exc:
        print(f"anydevice run: {exc}", file=sys.stderr)
        return 1
    except NodeFailed as exc:  # a node's own error: the message names node, input and value
        print(f"anydevice run: error: {exc}", file=sys.stderr)
        return 1
    print(f"total: {sum(res.times_ms.values()):.1f} ms in {len(res.times_ms)} nodes")
    for s in res.saved:
        print(f"saved: {s['path']}")
    if getattr(args, "json", False):
        print(json.dumps({"backend": res.backend, "times_ms": res.times_ms, "ui": _jsonable(res.ui),
                          "saved": res.saved}))
    return 0


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x
