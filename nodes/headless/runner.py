"""Headless runner: ``anydevice run WORKFLOW.json [--input IMAGE] [--output-dir DIR]``.

Runs an API-format workflow (ComfyUI's "Export (API)") made of this pack's nodes plus the core nodes
LoadImage, SaveImage, PreviewImage, EmptyImage and EmptyLatentImage, without a ComfyUI install.
Validation and execution follow ComfyUI's rules: only nodes that an output node needs run, in
dependency order (found without recursion, so chains of any length run); before anything runs the
shape of every node, every link (existing node, output index >= 0, matching type) and every widget
value (converted as ComfyUI converts it, min/max and combos from INPUT_TYPES, VALIDATE_INPUTS) is
checked, and LoadImage names and Load Labeled Images folders must stay inside the input folders.
Every problem is one line naming node id, class, input and value. Saved files are named as ComfyUI
names them: ``<prefix>_00001_.png``.
"""
from __future__ import annotations

import inspect
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import NODE_CLASS_MAPPINGS as PACK_NODES
from ...backend.system.errors import short
from .core_nodes import CORE_NODES, WorkflowError, _Ctx, _display, _node_class
from ..base.inputs import input_folders, using_input_folders

log = logging.getLogger("anydevice")

class NodeFailed(Exception):
    """A node raised while running: "#id Class: the node's own message" (one line)."""

    exit_code = 1

    def __init__(self, node_id: str, class_type: str, exc: BaseException):
        title = _display(class_type)
        msg = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, MemoryError):
            msg = f"{title}: out of memory"
        elif not msg.startswith(title):  # the pack's own errors start with the node's name already
            msg = f"{title}: {msg}" if isinstance(exc, WorkflowError) else f"{title}: {type(exc).__name__}: {msg}"
        super().__init__(f"#{node_id} {msg}")
        self.node_id, self.class_type, self.original = node_id, class_type, exc


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def load_workflow(path) -> dict:
    """The API-format prompt in ``path``; WorkflowError (exit code 2) naming the file otherwise."""
    p = Path(path)
    if p.is_dir():
        raise WorkflowError(f"{path}: is a folder, not a workflow file", 2)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise WorkflowError(f"{path}: cannot read the workflow: {exc.strerror or exc}", 2) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise WorkflowError(f"{path}: not a JSON workflow: byte {exc.start} (0x{data[exc.start]:02x}) is not "
                            "UTF-8 text", 2) from None
    if not text.strip():
        raise WorkflowError(f"{path}: the file is empty, not a JSON workflow", 2)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkflowError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", 2) from None
    except RecursionError:
        raise WorkflowError(f"{path}: not valid JSON here: nested too deeply", 2) from None
    if isinstance(data, dict) and "prompt" in data and isinstance(data["prompt"], dict):
        data = data["prompt"]
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise WorkflowError(f"{path} is a UI-format workflow; open it in ComfyUI and use "
                            "Workflow > Export (API), or run its twin in example_workflows/api/", 2)
    if not isinstance(data, dict) or not any(isinstance(v, dict) and "class_type" in v for v in data.values()):
        raise WorkflowError(f"{path} is not an API-format workflow ({{id: {{class_type, inputs}}}})", 2)
    return data


# ---------------------------------------------------------------------------------------------
# validation, as ComfyUI's execution.validate_prompt does it
# ---------------------------------------------------------------------------------------------
_CONVERT = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}


def _is_link(v) -> bool:
    """ComfyUI reads every list input value as a link [node_id, output_index]."""
    return isinstance(v, list)


def _is_output(cls) -> bool:
    return getattr(cls, "OUTPUT_NODE", False) is True


def _spec(cls) -> tuple[dict, dict]:
    """(every input name -> its INPUT_TYPES entry, the required ones)."""
    types = cls.INPUT_TYPES()
    required = dict(types.get("required", {}))
    return {**required, **types.get("optional", {})}, required


def types_match(received, expected) -> bool:
    """ComfyUI's validate_node_input: equal (honouring a type's own __ne__), a '*' on either side,
    or comma lists that overlap."""
    if not received != expected:
        return True
    if not isinstance(received, str) or not isinstance(expected, str):
        return False
    got = {t.strip() for t in received.split(",")}
    want = {t.strip() for t in expected.split(",")}
    return "*" in got or "*" in want or bool(got & want)


def _type_name(t) -> str:
    return "a combo" if isinstance(t, (list, tuple)) else str(t)


def check_widget(where: str, entry, value, ranges: bool = True):
    """(the value as ComfyUI converts it, the problem or None) for a literal input value:
    INT/FLOAT/STRING/BOOLEAN conversion, then (``ranges``) min and max, combo membership. As in
    ComfyUI, an input the node's VALIDATE_INPUTS takes is converted only (``ranges=False``): the
    node checks the rest itself."""
    typ = entry[0]
    opts = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
    if isinstance(value, dict) and "__value__" in value:  # a list widget value, wrapped by the frontend
        value = value["__value__"]
    if isinstance(typ, (list, tuple)):
        if value in typ or not ranges:
            return value, None
        shown = ", ".join(map(str, typ[:12])) + (", ..." if len(typ) > 12 else "")
        return value, f"{where}: must be one of {shown}"
    convert = _CONVERT.get(typ)
    if convert is None:
        return value, None  # a socket type (IMAGE, ...) given a literal: the node says what it needs
    try:
        value = convert(value)
    except (TypeError, ValueError, OverflowError):
        return value, f"{where}: must be {'an' if typ[0] in 'AEIOU' else 'a'} {typ} value"
    if typ in ("INT", "FLOAT") and ranges:
        if not math.isfinite(value):
            return value, f"{where}: must be a finite number"
        if opts.get("min") is not None and value < opts["min"]:
            return value, f"{where}: must be >= {opts['min']}"
        if opts.get("max") is not None and value > opts["max"]:
            return value, f"{where}: must be <= {opts['max']}"
    return value, None


@dataclass
class _Step:
    nid: str
    class_type: str
    cls: type
    values: dict   # literal inputs, converted
    links: dict    # input name -> (source node id, output index)
    accepts: frozenset = frozenset()  # the inputs the node's INPUT_TYPES declare


def _structure(prompt) -> tuple[dict, list[str]]:
    """The prompt with string ids, and what is wrong with its shape (node objects, class_type,
    inputs), before anything that relies on it."""
    if not isinstance(prompt, dict) or not prompt:
        return {}, ["the workflow must be a non-empty object {id: {class_type, inputs}}"]
    prompt = {str(k): v for k, v in prompt.items()}
    problems = []
    for nid, node in prompt.items():
        if not isinstance(node, dict):
            problems.append(f"#{nid}: must be an object {{\"class_type\": ..., \"inputs\": {{...}}}}, "
                            f"got {type(node).__name__}")
            continue
        ct = node.get("class_type")
        if not isinstance(ct, str):
            problems.append(f"#{nid}: class_type = {short(ct)}: must be a node class name (a string)")
        elif _node_class(ct) is None:
            problems.append(f"#{nid} {ct}: node '{ct}' needs ComfyUI (the headless runner supports this pack's "
                            f"nodes and {', '.join(CORE_NODES)}); run this workflow inside ComfyUI")
        elif not isinstance(node.get("inputs", {}), dict):
            problems.append(f"#{nid} {_display(ct)}: inputs = {short(node['inputs'])}: must be an object "
                            "{name: value or [node_id, output_index]}")
    return prompt, problems


def _link_problem(prompt, v) -> str | None:
    if len(v) != 2:
        return "a link must be [node_id, output_index]"
    src, idx = v
    if isinstance(src, bool) or not isinstance(src, (str, int)) or str(src) not in prompt:
        return f"links to missing node {short(src)}"
    if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        return "a link's output index must be a whole number >= 0"
    outputs = _node_class(prompt[str(src)]["class_type"]).RETURN_TYPES
    if idx >= len(outputs):
        return f"uses output {idx} of node {src} ({prompt[str(src)]['class_type']}), which has {len(outputs)}"
    return None


def _sources(prompt, nid):
    """Ids of the existing nodes that ``nid``'s links point at, in input order."""
    for v in prompt[nid].get("inputs", {}).values():
        if _is_link(v) and len(v) == 2 and isinstance(v[0], (str, int)) and str(v[0]) in prompt:
            yield str(v[0])


def _order(prompt: dict) -> list[str]:
    """Nodes the output nodes need, dependencies first (ComfyUI runs nothing else). Iterative, so a
    chain of any length runs; a cycle is a WorkflowError."""
    outputs = [nid for nid, n in prompt.items() if _is_output(_node_class(n["class_type"]))]
    order, state = [], {}  # state: 1 on the current path, 2 done
    for root in sorted(outputs, key=lambda s: (len(s), s)):
        if root in state:
            continue
        state[root] = 1
        stack = [(root, _sources(prompt, root))]
        while stack:
            nid, pending = stack[-1]
            for src in pending:
                if state.get(src) == 1:
                    path = [n for n, _ in stack]
                    path = path[path.index(src):] + [src]
                    raise WorkflowError(f"the workflow has a cycle through nodes {' -> '.join(path)}")
                if src not in state:
                    state[src] = 1
                    stack.append((src, _sources(prompt, src)))
                    break
            else:
                stack.pop()
                state[nid] = 2
                order.append(nid)
    return order


def _check_node(prompt, nid, ctx: _Ctx) -> tuple[_Step, list[str]]:
    node = prompt[nid]
    ct = node["class_type"]
    cls = _node_class(ct)
    title = f"#{nid} {_display(ct)}"
    inputs = node.get("inputs", {})
    spec, required = _spec(cls)
    vfn = getattr(cls, "VALIDATE_INPUTS", None)
    own = set(inspect.getfullargspec(vfn).args[1:]) if vfn is not None else set()  # ComfyUI skips these
    problems, values, links = [], {}, {}
    missing = [f"'{name}'" for name in required if name not in inputs]
    if missing:
        problems.append(f"{title}: required input{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                        f"{'are' if len(missing) > 1 else 'is'} missing")
    for name, v in inputs.items():
        where = f"{title}: input '{name}' = {short(v)}"
        if _is_link(v):
            why = _link_problem(prompt, v)
            if why is None and name in spec:
                got = _node_class(prompt[str(v[0])]["class_type"]).RETURN_TYPES[v[1]]
                if not types_match(got, spec[name][0]):
                    why = (f"node {v[0]} output {v[1]} is {_type_name(got)}, but this input takes "
                           f"{_type_name(spec[name][0])}")
            if why:
                problems.append(f"{where}: {why}")
            else:
                links[name] = (str(v[0]), v[1])
        elif name in spec:  # ComfyUI converts every widget value; checks ranges of those VALIDATE_INPUTS does not take
            v, why = check_widget(where, spec[name], v, ranges=name not in own)
            if why:
                problems.append(why)
            values[name] = v
        else:
            values[name] = v
    step = _Step(nid, ct, cls, values, links, frozenset(spec))
    if problems:
        return step, problems
    try:
        if vfn is not None:
            r = vfn(**{k: (None if k in links else values[k]) for k in own if k in inputs})
            if r is not True:
                problems.append(f"#{nid} {r}" if str(r).startswith(_display(ct)) else f"{title}: {r}")
        if ct in CORE_NODES:
            r = cls.check(ctx, **values)
            if r:
                problems.append(f"{title}: {r}")
    except WorkflowError as exc:
        problems += [f"{title}: {p}" for p in exc.problems]
    except Exception as exc:  # noqa: BLE001 - a node's check that raises is a problem of that node
        problems.append(str(NodeFailed(nid, ct, exc)))
    return step, problems


def _plan(prompt, ctx: _Ctx) -> list[_Step]:
    """The steps to run, dependencies first; WorkflowError listing every problem otherwise."""
    prompt, problems = _structure(prompt)
    if problems:
        raise WorkflowError(problems)
    order = _order(prompt)  # as ComfyUI: only what an output node needs is validated and run
    if not order:
        raise WorkflowError("the workflow has no output node (SaveImage, PreviewImage, Loss, Tensor Info)")
    steps = []
    for nid in order:
        step, more = _check_node(prompt, nid, ctx)
        steps.append(step)
        problems += more
    if problems:
        raise WorkflowError(problems)
    return steps


# ---------------------------------------------------------------------------------------------
# execution
# ---------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    backend: str = ""
    results: dict = field(default_factory=dict)   # node id -> result tuple
    ui: dict = field(default_factory=dict)        # node id -> ui dict (as /history outputs)
    times_ms: dict = field(default_factory=dict)  # node id -> wall ms
    saved: list = field(default_factory=list)     # [{path, filename, subfolder, type}]


def _output_dir(output_dir) -> Path:
    d = Path(output_dir or "output")
    if d.exists() and not d.is_dir():
        raise WorkflowError(f"output folder {d}: is a file, not a folder", 2)
    return d.resolve()


def run_prompt(prompt: dict, output_dir=None, input_image=None, workflow_path=None, echo=None) -> RunResult:
    """Validate and run an API-format prompt. Raises WorkflowError (with every problem, one a
    line) or NodeFailed (a node's own error, prefixed with its id and name)."""
    echo = echo or (lambda *_: None)
    output_dir = _output_dir(output_dir)
    ctx = _Ctx(output_dir, Path(input_image).resolve() if input_image else None, input_folders(workflow_path))
    if ctx.input_image is not None and not ctx.input_image.is_file():
        raise WorkflowError(f"--input {input_image}: file not found", 2)
    # the pack's folder inputs (Load Labeled Images) list, validate and read in the same input
    # folders as LoadImage's names, for validation and execution alike
    with using_input_folders(ctx.search):
        return _run_steps(_plan(prompt, ctx), ctx, output_dir, echo)


def _run_steps(steps: list[_Step], ctx: _Ctx, output_dir: Path, echo) -> RunResult:
    """Run the validated ``steps`` in order (NodeFailed naming the first node that raises)."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WorkflowError(f"output folder {output_dir}: cannot create it: {exc.strerror or exc}", 2) from None
    from ...backend import describe
    out = RunResult(backend=describe())
    echo(f"backend: {out.backend}")
    for step in steps:
        kwargs = dict(step.values)
        for name, (src, idx) in step.links.items():
            kwargs[name] = out.results[src][idx]
        t0 = time.perf_counter()
        try:
            if step.class_type in PACK_NODES:
                r = getattr(step.cls(), step.cls.FUNCTION)(**{k: v for k, v in kwargs.items() if k in step.accepts})
            else:
                r = step.cls().run(ctx, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every node error is one line naming the node
            raise NodeFailed(step.nid, step.class_type, exc) from exc
        ms = (time.perf_counter() - t0) * 1000
        ui = (r.get("ui") or {}) if isinstance(r, dict) else {}
        out.results[step.nid] = tuple(r.get("result", ())) if isinstance(r, dict) else tuple(r)
        if ui:
            out.ui[step.nid] = ui
        out.times_ms[step.nid] = ms
        badge = ui.get("anydevice", [{}])[0]
        where = f" [{badge['backend']}]" if badge.get("backend") else ""
        extra = "  " + "; ".join(ui["text"]) if ui.get("text") else ""
        echo(f"  #{step.nid:<3} {_display(step.class_type):<30} {ms:9.2f} ms{where}{extra}")
        if badge.get("warning"):  # NaN/Inf in the node's output: said, never silent
            echo(f"       warning: {_display(step.class_type)}: {badge['warning']}")
    out.saved = ctx.saved
    return out
