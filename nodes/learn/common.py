"""What the learning nodes share: the network and labels types, the model folder, batches in and
out of a network, shape reports and the learning nodes' base class."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch

from ...backend import AnyDeviceError
from ...backend.learn.layers import LAYERS
from ...backend.learn.network import Network
from ..base.common import NodeError, PackNode, Timer, kind_of, parse_ints, raw
from ..base.resident import DeviceTensor

log = logging.getLogger("anydevice")


NETWORK = "ANYDEVICE_NETWORK"
LABELS = "ANYDEVICE_LABELS"
LOSS_MAP = "LOSS_MAP"
CATEGORY = "AnyDevice/train"
SEED_MAX = 0xFFFFFFFFFFFFFFFF
MODEL_FOLDER = "anydevice"
#: the most loss values a Train node's ui payload carries (longer runs are thinned for the curve)
CURVE_POINTS = 400

_NET_TIP = "The network so far (from a Network Input or another layer node). Without it the layer starts a new network."
_TARGET_TYPES = "IMAGE,MASK,LATENT,TENSOR," + LABELS


# ---------------------------------------------------------------------------------------------
# models/anydevice: ComfyUI's folder_paths when it is there
# ---------------------------------------------------------------------------------------------
def register_model_folder() -> None:
    """Register ``models/anydevice`` (``.safetensors``) with ComfyUI's folder_paths, once."""
    fp = sys.modules.get("folder_paths")
    if fp is None:
        return
    try:
        if MODEL_FOLDER not in fp.folder_names_and_paths:
            fp.folder_names_and_paths[MODEL_FOLDER] = ([os.path.join(fp.models_dir, MODEL_FOLDER)], {".safetensors"})
    except Exception as exc:  # noqa: BLE001 - loading the pack must never fail on this
        log.warning("AnyDevice: could not register models/%s with ComfyUI: %s", MODEL_FOLDER, exc)


register_model_folder()


_NO_ANSWER = object()


def _from_folder_paths(ask):
    """``ask(folder_paths)`` with ComfyUI's folder_paths; _NO_ANSWER without ComfyUI or where it fails
    (the callers then look in ./models/anydevice themselves)."""
    fp = sys.modules.get("folder_paths")
    if fp is not None:
        try:
            return ask(fp)
        except Exception:  # noqa: BLE001
            pass
    return _NO_ANSWER


def model_dirs() -> list[Path]:
    """Where networks are saved (the first) and looked up."""
    dirs = _from_folder_paths(lambda fp: [Path(p) for p in fp.get_folder_paths(MODEL_FOLDER)])
    return [Path.cwd() / "models" / MODEL_FOLDER] if dirs is _NO_ANSWER else dirs


def network_files() -> list[str]:
    files = _from_folder_paths(lambda fp: sorted(fp.get_filename_list(MODEL_FOLDER)))
    if files is not _NO_ANSWER:
        return files
    out = set()
    for d in model_dirs():
        if d.is_dir():
            for p in d.rglob("*.safetensors"):
                out.add(p.relative_to(d).as_posix())
    return sorted(out)


def network_path(name: str) -> Path | None:
    def full_path(fp):
        p = fp.get_full_path(MODEL_FOLDER, name)
        return Path(p) if p else None

    path = _from_folder_paths(full_path)
    if path is not _NO_ANSWER:
        return path
    for d in model_dirs():
        p = (d / name).resolve()
        if os.path.commonpath((str(d.resolve()), str(p))) == str(d.resolve()) and p.is_file():
            return p
    return None


# ---------------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------------
def _network(value, node: str, arg: str = "network", required: bool = False) -> Network:
    if value is None:
        if required:
            raise NodeError(node, arg, None, "is required: connect a layer node, Network Input, Train or Load Network")
        return Network.empty()
    if not isinstance(value, Network):
        raise NodeError(node, arg, type(value).__name__, "must be a network from an AnyDevice learning node")
    return value


def _labels(value):
    """The class labels in ``value`` as an int64 NumPy array, or None when it holds no labels."""
    if torch.is_tensor(value) and not value.is_floating_point() and not value.is_complex():
        return value.detach().cpu().to(torch.int64).numpy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        return value.astype(np.int64)
    return None


def to_batch(value, node: str, arg: str) -> tuple[np.ndarray, str]:
    """A training batch as float32 NumPy: IMAGE/MASK/LATENT as (N, C, H, W), a TENSOR as it is
    ((N, F) features or (N, C, H, W)); and the value's kind."""
    kind = kind_of(value, node, arg)
    t = raw(value, kind).detach().to("cpu", torch.float32)
    if kind == "IMAGE":
        t = t.permute(0, 3, 1, 2)
    elif kind == "MASK":
        t = t.reshape((1, 1) + tuple(t.shape)) if t.ndim == 2 else t.unsqueeze(1)
    elif kind == "LATENT":
        if t.ndim != 4:
            raise NodeError(node, arg, tuple(t.shape), "LATENT samples must be [B, C, H, W] here")
    elif t.ndim < 2:
        raise NodeError(node, arg, f"TENSOR of shape {tuple(t.shape)}",
                        "needs a batch dim first: (N, F) features or (N, C, H, W)")
    return np.ascontiguousarray(t.numpy(), dtype=np.float32), kind


def from_batch(y: np.ndarray, kind: str, like):
    """A network output (N, ...) as a value of ``kind`` where its shape fits that kind, else a TENSOR."""
    t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
    if kind == "IMAGE" and t.ndim == 4:
        return t.permute(0, 2, 3, 1).contiguous()
    if kind == "MASK" and t.ndim == 4 and t.shape[1] == 1:
        return t[:, 0].contiguous()
    if kind == "LATENT" and t.ndim == 4:
        out = dict(like)
        out["samples"] = t
        return out
    return DeviceTensor.from_host(t)


def _shape_text(s) -> str:
    return "[" + ", ".join(str(int(v)) for v in s) + "]"


def _layer_text(layer: dict) -> str:
    return LAYERS.of(layer).node_text(layer)


def shape_report(net: Network, node: str, arg: str = "network") -> tuple[list[str], tuple | None]:
    """Lines for the node (the last layer and its output shape when the input shape is known), and
    the output shape. A layer that does not take its input is a NodeError naming it."""
    if net.in_shape is None:
        n = len(net.layers)
        last = _layer_text(net.layers[-1]) if n else "no layers"
        return [f"{n} layer{'s' if n != 1 else ''}: last {last}",
                "shapes: once the chain starts at a Network Input"], None
    try:
        shapes = net.shapes(net.in_shape)
    except AnyDeviceError as exc:
        raise _net_error(node, arg, exc) from exc
    out = shapes[-1] if shapes else net.in_shape
    lines = [f"input {_shape_text(net.in_shape)}"]
    if net.layers:
        lines = [f"layer {len(net.layers) - 1}: {_layer_text(net.layers[-1])}", f"-> {_shape_text(out)}"]
    return lines, out


def _net_error(node: str, arg: str, exc: AnyDeviceError) -> NodeError:
    """A network's own error (a layer whose shapes do not chain) said by the node: the layer and the shapes."""
    if exc.arg and str(exc.arg).startswith("layer "):
        err = NodeError(node, arg, exc.arg, f"input {_shape_text(exc.value) if isinstance(exc.value, tuple) else exc.value}"
                        f": {exc.reason}")
    else:
        err = NodeError(node, arg, exc.arg, str(exc))
    err.backend_op = exc.op
    return err


def _host_ui(ms: float, lines: list[str], device: str = "CPU (network spec)", **extra) -> dict:
    info = {"backend": "host", "device": device, "ms": round(ms, 3)}
    info.update(extra)
    return {"anydevice": [info], "text": lines}


def _network_out(net: Network, node: str, t: Timer, arg: str = "network") -> dict:
    """What a node that builds a network returns: the network, and its shape lines on the node (the
    output shape in the badge once it is known)."""
    lines, out = shape_report(net, node, arg)
    extra = {"shape": list(out)} if out is not None else {}
    return {"ui": _host_ui(t.ms(), lines, **extra), "result": (net,)}


def _sample_shape(text) -> tuple[int, ...]:
    """Network Input's shape text as one sample's shape: 1 to 3 sizes >= 1 (ValueError otherwise)."""
    dims = parse_ints(text, "shape", allow_empty=False)
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError("must be 1 to 3 sizes >= 1 (C, H, W or F)")
    return tuple(dims)


# =================================================================================================
class _LearnNode(PackNode):
    CATEGORY = CATEGORY


class _NetworkNode(_LearnNode):
    """A node whose one output is a network."""

    RETURN_TYPES = (NETWORK,)
    RETURN_NAMES = ("network",)
