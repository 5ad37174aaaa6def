"""Shared plumbing for the AnyDevice nodes: socket types, value kinds, layouts, devices, errors,
progress and the ``ui`` payload the web extension draws.

Values the nodes pass around (float32):

* IMAGE  CPU torch tensor [B, H, W, C], 0..1 (ComfyUI's own type)
* MASK   CPU torch tensor [B, H, W] (or [H, W])
* LATENT dict {"samples": [B, C, H, W], ...other keys kept}
* TENSOR ``resident.DeviceTensor``: the backend's own array, its backend and shape; a dict whose
         one key "tensor" gives a CPU torch tensor when asked (a dict, so it can never be mistaken
         for an IMAGE or a MASK at run time; a plain {"tensor": torch tensor} is accepted too)
* WEIGHTS dict {"weight": tensor, "bias": tensor or None}
* DEVICE dict {"name": "numpy" | "cpu" | "cuda:1" | "auto" ...}

IMAGE, MASK and LATENT values an AnyDevice node made keep their device copy in ``resident`` (found
by the tensor's identity and ``_version``), so the next AnyDevice node does not upload them again.

Nothing here does math: every number a node computes goes through ``backend``.
"""
from __future__ import annotations

import copy
import inspect
import logging
import math
import re
import sys
import time
from typing import Any

import numpy as np
import torch

from ...backend import AnyDeviceError, get_backend, list_backends
from ...backend.ops.contract import TRANSFER_KEYS, transfer_totals
from ...backend.system.errors import short
from ...backend.system import registry as _registry
from ...backend.system import cancel as _cancel
from . import resident
from .resident import DeviceTensor

log = logging.getLogger("anydevice")

CATEGORY = "AnyDevice"


class AnyType(str):
    """A socket type equal to every other type (ComfyUI's validator honours ``__ne__``)."""

    def __ne__(self, other):  # noqa: D105
        return False

    __hash__ = str.__hash__


#: output type of generic nodes: they return the kind they were given
ANY = AnyType("*")
#: input type of generic nodes (a comma list: ComfyUI accepts any overlap, the frontend too)
DATA = "IMAGE,MASK,LATENT,TENSOR"
TENSOR = "TENSOR"
WEIGHTS = "WEIGHTS"
DEVICE = "DEVICE"

KINDS = ("IMAGE", "MASK", "LATENT", "TENSOR")

DEVICE_INPUT = (DEVICE, {"tooltip": "Backend to run on, from a DeviceSelect (AnyDevice) node. "
                                    "Without it the backend chosen when ComfyUI started runs."})


class NodeError(AnyDeviceError):
    """An error that names the node, the input (a widget or a socket) and the value."""

    noun = "input"


def restate(node: str, exc: AnyDeviceError, table: dict[str, tuple[str, Any]]) -> NodeError:
    """A backend error said in the node's words, from its parts (never by editing its text).

    ``table`` maps the op's arguments to ``(node input, value shown)``. The error names the input
    that sets the argument at fault (the error's alternative side first, when the node sets that
    argument: the window of an ssim rather than the images it does not fit); the other arguments
    its reason refers to are named the same way. An argument the node does not set keeps the
    backend's message behind the node's name."""
    for arg, _value, reason in ([exc.alt] if exc.alt else []) + [(exc.arg, exc.value, exc.reason)]:
        if arg in table:
            name, shown = table[arg]
            err = NodeError(node, name, shown, exc.fill(reason, {
                a: (n, v if isinstance(v, str) else short(v)) for a, (n, v) in table.items()}))
            break
    else:
        err = NodeError(node, None, None, str(exc))
        err.arg, err.value = exc.arg, exc.value
    err.backend_op = exc.op
    return err


def describe(value):
    """An input's value as an error shows it: data as its kind and shape, other values as they are."""
    if isinstance(value, DeviceTensor):
        return f"TENSOR of shape {value.shape}"
    if isinstance(value, dict) and torch.is_tensor(value.get("weight")):
        return f"weight of shape {tuple(value['weight'].shape)}"
    if torch.is_tensor(value) or isinstance(value, dict):
        try:
            kind = kind_of(value, "", "")
        except NodeError:
            return value
        return f"{kind} of shape {tuple(raw(value, kind).shape)}"
    return value


def _on_device(value):
    """(backend, array) where an output's numbers were computed on a device, else None."""
    if isinstance(value, DeviceTensor):
        return value.native_or_none() if value.resident else None
    t = value.get("samples") if isinstance(value, dict) else value
    found = resident.any_copy(t) if torch.is_tensor(t) else None
    return None if found is None or "raw" not in found[1] else (found[0], found[1]["raw"])


def nonfinite_counts(value, dev=...) -> tuple[int, int]:
    """(NaN count, Inf count) of an output (a tensor, a LATENT/TENSOR value or a number). Numbers a
    node computed on a device are checked there (sum(x * 0) is 0, or NaN when x holds an Inf or a
    NaN): one 4-byte read, counted as a check; the host copy is counted only when there is something
    to count (a TENSOR's numbers are downloaded only then). ``dev``: ``_on_device(value)`` when the
    caller has it already."""
    if dev is ...:
        dev = _on_device(value)
    if dev is not None:
        be, x = dev
        if np.isfinite(be.read_check(be.sum(be.mul(x, 0.0)))).all():
            return 0, 0
    if isinstance(value, dict):
        value = value["samples"] if "samples" in value else value.get("tensor")
    if isinstance(value, (int, float)):
        return int(math.isnan(value)), int(math.isinf(value))
    if not torch.is_tensor(value) or not value.is_floating_point():
        return 0, 0
    t = value.detach().to("cpu")
    a = t.numpy() if t.dtype in (torch.float32, torch.float64, torch.float16) else t.float().numpy()
    if np.isfinite(a).all():  # NumPy: one pass on this thread (torch's pool stalls on a busy machine)
        return 0, 0
    return int(np.isnan(a).sum()), int(np.isinf(a).sum())


def release_device_memory() -> None:
    """Drop every device copy the nodes keep between runs (a TENSOR's numbers move to its host
    copy), then give each backend's pooled memory back (``free_memory()``; OpenCL: its buffer
    pool). Call it where the host application asks for memory; the budget (ANYDEVICE_RESIDENT_MB)
    evicts least recently used copies the same way on its own."""
    resident.release_all()


# ---------------------------------------------------------------------------------------------
# value kinds and layouts
# ---------------------------------------------------------------------------------------------
def kind_of(value, node: str, arg: str) -> str:
    """IMAGE, MASK, LATENT or TENSOR for a value arriving on a DATA input."""
    if isinstance(value, DeviceTensor):
        return "TENSOR"
    if isinstance(value, dict):
        if "samples" in value and torch.is_tensor(value["samples"]):
            return "LATENT"
        if "tensor" in value and torch.is_tensor(value["tensor"]):
            return "TENSOR"
        raise NodeError(node, arg, f"dict with keys {sorted(value)}", "is not a LATENT or a TENSOR")
    if torch.is_tensor(value):
        if value.ndim == 4:
            return "IMAGE"
        if value.ndim in (2, 3):
            return "MASK"
        raise NodeError(node, arg, value, "a plain tensor must be an IMAGE [B,H,W,C] or a MASK [B,H,W]")
    if value is None:
        raise NodeError(node, arg, None, "is required: connect an IMAGE, MASK, LATENT or TENSOR")
    raise NodeError(node, arg, type(value).__name__, "must be an IMAGE, MASK, LATENT or TENSOR")


def raw(value, kind: str) -> torch.Tensor:
    """The tensor inside a value, in its own layout."""
    if kind == "LATENT":
        return value["samples"]
    if kind == "TENSOR":
        return value["tensor"]
    return value


def cpu_f32(t) -> torch.Tensor:
    """A CPU float32 tensor (a new one if a conversion is needed; never modified in place)."""
    if not torch.is_tensor(t):
        t = torch.as_tensor(np.asarray(t))
    return t.detach().to("cpu", torch.float32)


def to_nchw(value, kind: str, node: str = "", arg: str = "input") -> torch.Tensor:
    """A view of a host value as [N, C, H, W] (the nodes do this on the device: ``values.to_layout``)."""
    t = raw(value, kind)
    if kind == "IMAGE":
        return t.permute(0, 3, 1, 2)
    if kind == "MASK":
        return t.reshape((1, 1) + tuple(t.shape)) if t.ndim == 2 else t.unsqueeze(1)
    if kind == "LATENT":
        if t.ndim == 5:  # video latents [B, C, T, H, W]: frames become batch entries
            b, c, f, h, w = t.shape
            return t.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        if t.ndim != 4:
            raise NodeError(node, arg, t, "LATENT samples must be [B,C,H,W] or [B,C,T,H,W]")
        return t
    # TENSOR
    if t.ndim == 4:
        return t
    if t.ndim == 3:
        return t.unsqueeze(0)
    if t.ndim == 2:
        return t.reshape((1, 1) + tuple(t.shape))
    raise NodeError(node, arg, t, "needs 2 to 4 dims ([H,W], [C,H,W] or [N,C,H,W]) for this operation")


def preview_image(t_nchw: torch.Tensor) -> torch.Tensor:
    """[N,C,H,W] -> an IMAGE to look at: 3 channels as RGB, else the channel mean as grey."""
    t = cpu_f32(t_nchw)
    if t.shape[1] != 3:
        t = t.mean(dim=1, keepdim=True).expand(-1, 3, -1, -1)
    return t.permute(0, 2, 3, 1).contiguous()


# ---------------------------------------------------------------------------------------------
# text parsing (widget values; used by VALIDATE_INPUTS and at run time)
# ---------------------------------------------------------------------------------------------
_ROW_SPLIT = re.compile(r"[;\n]+")
_COL_SPLIT = re.compile(r"[,\s]+")


def parse_matrix(text: str) -> np.ndarray:
    """"1 0 -1; 2 0 -2" or one row a line (commas or spaces), or JSON-ish [[1, 0], [0, 1]].

    Raises ValueError with a readable reason for empty, ragged or non-numeric text."""
    if not isinstance(text, str):
        raise ValueError("must be text")
    s = text.strip()
    if s.startswith("["):  # [[1,2],[3,4]] or [1,2,3]
        inner = s
        if s.startswith("[[") and s.endswith("]]"):
            inner = s[1:-1]
        inner = re.sub(r"\]\s*,?\s*\[", ";", inner).strip("[] \n")
        s = inner
    rows = [r.strip() for r in _ROW_SPLIT.split(s) if r.strip()]
    if not rows:
        raise ValueError("is empty; type numbers, rows separated by ';' or new lines")
    out = []
    for i, row in enumerate(rows, 1):
        vals = []
        for j, tok in enumerate([t for t in _COL_SPLIT.split(row) if t], 1):
            try:
                v = float(tok)
            except ValueError:
                raise ValueError(f"row {i}, entry {j} ({tok!r}) is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"row {i}, entry {j} ({tok!r}) is not a finite number")
            vals.append(v)
        if out and len(vals) != len(out[0]):
            raise ValueError(f"is ragged: row {i} has {len(vals)} values but row 1 has {len(out[0])}")
        out.append(vals)
    return np.asarray(out, dtype=np.float32)


def parse_vector(text: str) -> np.ndarray | None:
    """"0.1 0.2 0.3" -> float32 vector; empty text -> None."""
    if not isinstance(text, str) or not text.strip():
        return None
    return parse_matrix(text.replace(";", " ").replace("\n", " ")).reshape(-1)


def parse_ints(text: str, what: str = "value", allow_empty: bool = True) -> tuple[int, ...]:
    """"1, 3, 64" -> (1, 3, 64). Raises ValueError."""
    if not isinstance(text, str):
        raise ValueError("must be text")
    toks = [t for t in re.split(r"[,\sx×]+", text.strip().strip("()[]")) if t]
    if not toks:
        if allow_empty:
            return ()
        raise ValueError(f"is empty; give the {what} as comma-separated integers")
    out = []
    for t in toks:
        try:
            out.append(int(t))
        except ValueError:
            raise ValueError(f"{t!r} is not an integer") from None
    return tuple(out)


def validate_texts(cls, mode: tuple[str, Any, list], texts) -> str | bool:
    """A VALIDATE_INPUTS result for text widgets that a mode combo decides on, through the parsers
    the node runs, so malformed text is refused when the prompt is queued.

    ``mode``: (input name, value, choices). ComfyUI skips its own combo check for an input that
    VALIDATE_INPUTS takes, so the mode is checked against its choices here. ``texts``: (input name,
    value, the modes that parse it or None for every mode, parse): text is refused only where the
    chosen mode parses it (parse raises ValueError with the reason). A widget fed by a link arrives
    as None and is accepted (and with a linked mode, any text: the node checks it when it runs)."""
    name, value, choices = mode
    if value is not None and value not in choices:
        return cls.fail(name, value, f"must be one of {', '.join(map(str, choices))}")
    for arg, text, modes, parse in texts:
        if text is None or (modes is not None and value not in modes):
            continue
        try:
            parse(text)
        except ValueError as exc:
            return cls.fail(arg, text, str(exc))
    return True


# ---------------------------------------------------------------------------------------------
# constants a node builds itself (kernels, matrices, tensors sized by a widget)
# ---------------------------------------------------------------------------------------------
def parsed(node: str, arg: str, text, parse, *args):
    """``parse(text, *args)``: a widget's value read by its parser (the one VALIDATE_INPUTS uses), a
    ValueError restated as a NodeError naming node, input and value."""
    try:
        return parse(text, *args)
    except ValueError as exc:
        raise NodeError(node, arg, text, str(exc)) from None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def check_constant(node: str, arg: str, value, shape, dtype=np.float32, what: str = "array") -> None:
    """Before a node builds a constant of ``shape``: refuse it, naming the input ``arg`` that sizes it
    and its ``value``, when one array of it in ``dtype`` (the dtype it is generated in: a seeded init
    draws float64 before its float32 copy) is over the tensor limit (ANYDEVICE_MAX_TENSOR_MB, or half
    the host's free memory). Nothing of that size is allocated."""
    from ...backend.system.config import tensor_limit  # noqa: PLC0415
    shape = tuple(int(v) for v in shape)
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    limit, free, where = tensor_limit(None, nbytes)
    if nbytes > limit:
        raise NodeError(node, arg, value, f"would build a {shape} {what} of {_gib(nbytes)} in {dt.name}, over the "
                                          f"limit of {_gib(limit)}" + (" (ANYDEVICE_MAX_TENSOR_MB)" if free is None else
                                          f" (half of the {_gib(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets "
                                          "another)"))


# ---------------------------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------------------------
_LOAD_TIME: str | None = None


def load_time_backend_name() -> str:
    """The backend picked when the pack was loaded (used when no DEVICE input is connected)."""
    global _LOAD_TIME
    if _LOAD_TIME is None:
        try:
            _LOAD_TIME = _registry.auto_name()
        except Exception:  # noqa: BLE001 - never break loading
            _LOAD_TIME = "numpy"
    return _LOAD_TIME


def device_choices() -> tuple[list[str], dict[str, str]]:
    """Combo values ("auto" first, then every backend, extra devices as name:i) and a status
    line for each (device, or 'unavailable: reason')."""
    names, status = ["auto"], {}
    try:
        auto = load_time_backend_name()
        infos = list_backends()
    except Exception as exc:  # noqa: BLE001
        return ["auto"], {"auto": f"backend listing failed: {exc}"}
    status["auto"] = f"the backend picked at start-up: {auto}"
    for info in infos:
        names.append(info.name)
        status[info.name] = info.device if info.available else f"unavailable: {info.reason}"
        for i, dev in enumerate(info.devices[1:] if info.available else [], 1):
            names.append(f"{info.name}:{i}")
            status[f"{info.name}:{i}"] = dev
    return names, status


def resolve_backend(device, node: str):
    """The backend for an optional DEVICE input value (the registry says why a name cannot run)."""
    name = None
    if isinstance(device, dict):
        name = device.get("name")
    elif isinstance(device, str):
        name = device
    elif device is not None:
        raise NodeError(node, "device", type(device).__name__, "must come from a DeviceSelect (AnyDevice) node")
    auto = name in (None, "auto")
    if auto:
        name = load_time_backend_name()
    try:
        return get_backend(name)
    except AnyDeviceError as exc:
        global _LOAD_TIME
        if auto and _LOAD_TIME == name:  # the start-up choice failed its self-check on first use
            _LOAD_TIME = None
            if load_time_backend_name() != name:  # the automatic choice moved on
                return resolve_backend(None, node)
        raise NodeError(node, "device", name, exc.reason or str(exc)) from exc


# ---------------------------------------------------------------------------------------------
# progress, timing, ui
# ---------------------------------------------------------------------------------------------
class Progress:
    """ComfyUI's ProgressBar when ComfyUI is present (each update is also an interrupt check)."""

    _tried_import = False  # a failed import is not retried on every node (it searched sys.path each time)

    def __init__(self, total: int):
        self.total = max(1, int(total))
        self.bar = None
        utils = sys.modules.get("comfy.utils")
        if utils is None and not Progress._tried_import:
            Progress._tried_import = True
            try:
                import comfy.utils as utils  # noqa: PLC0415 - optional, only inside ComfyUI
            except Exception:  # noqa: BLE001 - ImportError outside ComfyUI
                utils = None
        if utils is not None:
            try:
                self.bar = utils.ProgressBar(self.total)
            except Exception:  # noqa: BLE001
                self.bar = None

    def step(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)


def comfy_cancel_hooks() -> bool:
    """Inside ComfyUI: register its interrupt check as the backend's cancel checker (long ops call it
    between chunks, so Cancel stops them). Returns whether ComfyUI's model_management is there."""
    mm = sys.modules.get("comfy.model_management")
    fn = getattr(mm, "throw_exception_if_processing_interrupted", None) if mm is not None else None
    if fn is None:
        return False
    if _cancel.get_checker() is not fn:
        _cancel.set_checker(fn)
    return True


class _ChunkProgress:
    """cancel.set_progress target during a node's run: ComfyUI's ProgressBar over a long op's chunks."""

    def __init__(self):
        self.bar = None

    def __call__(self, done: int, total: int):
        utils = sys.modules.get("comfy.utils")
        if utils is None:
            return
        if self.bar is None or self.bar.total != total:
            self.bar = utils.ProgressBar(total)
        self.bar.update_absolute(done, total)


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    def ms(self, backend=None) -> float:
        if backend is not None:
            try:
                backend.synchronize()
            except Exception:  # noqa: BLE001
                pass
        return (time.perf_counter() - self.t0) * 1000.0


_DEVICE_TEXT: dict[int, str] = {}


def badge(backend, ms: float, **extra) -> dict:
    """The ui payload every node returns; web/anydevice.js draws it as a badge."""
    device = _DEVICE_TEXT.get(id(backend))
    if device is None:  # a backend's description does not change (and some query the driver for it)
        device = _DEVICE_TEXT[id(backend)] = backend.device
    info = {"backend": backend.name, "device": device, "ms": round(float(ms), 3)}
    info.update(extra)
    return {"anydevice": [info]}


def shape_str(t) -> str:
    return "[" + ", ".join(str(int(s)) for s in (t if isinstance(t, tuple) else t.shape)) + "]"


# ---------------------------------------------------------------------------------------------
# base class
# ---------------------------------------------------------------------------------------------
class PackNode:
    """V1 node base: ``run`` wraps ``_run`` so every backend error names this node, the input at
    fault and its value, and (``WARN_NONFINITE``) NaN or Inf in the outputs are reported."""

    DISPLAY = "AnyDevice node"
    FUNCTION = "run"
    CATEGORY = CATEGORY
    #: the table a backend error is restated with: op argument -> the node input that sets it. ``run``
    #: runs ``_run`` on a copy of the node for the call, whose ``arg_inputs`` starts as a copy of it
    #: and where ``_run`` may point an argument at another input for the call, by name or as (input
    #: name, value shown) where the input holds more than the argument: the node itself holds no
    #: per-run state
    ARGS: dict[str, str] = {}
    #: log and show on the node how many NaN and Inf values its outputs hold
    WARN_NONFINITE = False

    def run(self, **kwargs):
        call = copy.copy(self)  # this run's own arg_inputs, so concurrent or later runs never see them
        call.arg_inputs = dict(self.ARGS)
        before = transfer_totals()
        in_comfy = comfy_cancel_hooks()
        if in_comfy:
            _cancel.set_progress(_ChunkProgress())
        try:
            resident.budget_bytes()  # a bad ANYDEVICE_RESIDENT_MB is said before anything runs
            out = call._run(**kwargs)
        except NodeError:
            raise
        except AnyDeviceError as exc:
            raise restate(self.DISPLAY, exc, call._table(kwargs)) from exc
        finally:
            if in_comfy:
                _cancel.set_progress(None)
        if self.WARN_NONFINITE:
            self._warn_nonfinite(out)
        after = transfer_totals()  # this run's host<->device transfers, on every backend it used
        out["ui"]["anydevice"][0].update({k: after[k] - before[k] for k in TRANSFER_KEYS})
        return out

    def _table(self, kwargs) -> dict[str, tuple[str, Any]]:
        """op argument -> (input, value shown) for this call (inputs not given take their defaults)."""
        call = inspect.signature(self._run).bind_partial(**kwargs)
        call.apply_defaults()
        return {arg: where if isinstance(where, tuple) else (where, describe(call.arguments.get(where)))
                for arg, where in self.arg_inputs.items()}

    def _warn_nonfinite(self, out: dict) -> None:
        """NaN and Inf stay (PyTorch semantics) but are said: a log line and the badge's ``warning``."""
        names = self.RETURN_NAMES
        found = []
        entry = out["ui"]["anydevice"][0]
        for name, value in zip(names, out["result"]):
            t = Timer()
            dev = _on_device(value)
            nan, inf = nonfinite_counts(value, dev)
            if dev is not None:  # a check on the device is device work: part of the node's op time
                entry["ms"] = round(entry["ms"] + t.ms(), 3)
            if nan or inf:
                what = "output" if len(names) == 1 else f"output '{name}'"
                found.append(f"{what} has {nan:,} NaN and {inf:,} Inf values")
        if found:
            text = "; ".join(found)
            log.warning("%s: %s", self.DISPLAY, text)
            entry["warning"] = text

    def _run(self, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def fail(cls, arg: str, value, reason: str) -> str:
        """A VALIDATE_INPUTS message naming node, input and value."""
        return str(NodeError(cls.DISPLAY, arg, value, reason))
