"""Helper nodes: DeviceSelect, Tensor source, Tensor Info, Weights and the TENSOR converters."""
from __future__ import annotations

import math

import numpy as np
import torch

from ...backend.ops import quant
from ...backend.system.errors import AnyDeviceError
from ..compute import presets as P
from ..base import resident as R
from ..base.common import (ANY, DATA, DEVICE, DEVICE_INPUT, TENSOR, WEIGHTS, NodeError, PackNode, Timer, badge,
                     check_constant, cpu_f32, device_choices, kind_of, load_time_backend_name, parse_ints, parse_matrix,
                     parse_vector, parsed, raw, resolve_backend, shape_str, to_nchw, validate_texts)
from ..base.widgets import Bool, Choice, Int, Text, outputs
from ..base.resident import DeviceTensor
from ..base.values import data, numbers, shape_of, to_layout

SEED_MAX = 0xFFFFFFFFFFFFFFFF
MAX_ELEMENTS = 1 << 28  # 1 GiB of float32: a typo in a shape must not take the machine down


def _host_badge(ms: float, **extra) -> dict:
    """Badge for nodes that only move data on the host (no backend op)."""
    info = {"backend": "host", "device": "CPU (data movement only)", "ms": round(ms, 3)}
    info.update(extra)
    return {"anydevice": [info]}


def _on_device(value):
    """(backend, raw array) of a TENSOR whose numbers live on a device; None for host numbers."""
    if not isinstance(value, DeviceTensor) or not value.resident:
        return None
    return value.native_or_none()


def _image_on_device(t: torch.Tensor, nchw: bool):
    """(backend, array) of an IMAGE's remembered device copy as [B,C,H,W] (nchw) or as it is, or None."""
    found = R.any_copy(t) if torch.is_tensor(t) and t.ndim == 4 else None
    if found is None:
        return None
    be, arrays = found
    if not nchw:
        return be, arrays["raw"] if "raw" in arrays else be._permute(arrays["nchw"], (0, 2, 3, 1))
    return be, arrays["nchw"] if "nchw" in arrays else be._permute(arrays["raw"], (0, 3, 1, 2))


def _to_host(be, x) -> torch.Tensor:
    """A converter's output from a device array: one download; its device copy is remembered."""
    host = R.host_tensor(be, x)
    R.add_copy(host, be, "raw", x)
    return host


# =================================================================================================
class AnyDeviceDeviceSelect(PackNode):
    DISPLAY = "Device Select (AnyDevice)"
    CATEGORY = "AnyDevice"
    DESCRIPTION = ("Picks the backend the connected compute nodes run on. 'auto' is the backend chosen at start-up "
                   "(ANYDEVICE_BACKEND overrides it). Unavailable backends are listed with the reason and cannot "
                   "run.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        (DEVICE, "device", "Connect to the device input of any AnyDevice compute node."))

    @classmethod
    def INPUT_TYPES(cls):
        names, status = device_choices()
        lines = "; ".join(f"{n}: {s}" for n, s in status.items())
        return {"required": {"device": (names, {
            "default": "auto",
            "tooltip": "Backend to run on. " + lines,
            # read by web/anydevice.js to show the status under the widget
            "anydevice_status": status,
        })}}

    @classmethod
    def VALIDATE_INPUTS(cls, device=None):
        """The one widget: whether the backend can run here is the registry's answer."""
        try:
            resolve_backend(device, cls.DISPLAY)
        except NodeError as exc:
            return str(exc)
        return True

    def _run(self, device="auto"):
        t = Timer()
        be = resolve_backend(device, self.DISPLAY)
        return {"ui": badge(be, t.ms(), op="select", selected=device),
                "result": ({"name": device, "backend": be.name, "device": be.device},)}


# =================================================================================================
def _check_shape(shape: tuple[int, ...]) -> str | None:
    if not shape:
        return "is empty; give comma-separated sizes such as 1, 3, 64, 64"
    if len(shape) > 8:
        return "has more than 8 dims"
    if min(shape) < 1:
        return "sizes must be positive"
    if math.prod(shape) > MAX_ELEMENTS:
        return f"has {math.prod(shape)} elements, over the limit of {MAX_ELEMENTS}"
    return None


def parse_shape(text) -> tuple[int, ...]:
    """A shape widget's sizes ("1, 3, 64, 64"); ValueError with the reason (the one parser of
    VALIDATE_INPUTS and the run)."""
    dims = parse_ints(text, "shape")
    why = _check_shape(dims)
    if why:
        raise ValueError(why)
    return dims


def _shape(text, node: str) -> tuple[int, ...]:
    return parsed(node, "shape", text, parse_shape)


class AnyDeviceTensorSource(PackNode):
    DISPLAY = "Tensor Source (AnyDevice)"
    CATEGORY = "AnyDevice/tensor"
    DESCRIPTION = ("Makes a TENSOR: seeded random (normal or uniform), zeros, ones, numbers typed as text, or an "
                   "IMAGE as [B, C, H, W].")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs((TENSOR, "tensor", "A float32 TENSOR on the CPU."))
    MODES = ["random_normal", "random_uniform", "zeros", "ones", "text", "image"]

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "mode": Choice(cls.MODES, "random_normal", "How to fill the tensor."),
                "shape": Text("1, 3, 64, 64", "Comma-separated sizes for random, zeros and ones."),
                "seed": Int(0, 0, SEED_MAX, "Seed for the random modes (same seed, same numbers everywhere)."),
                "text": Text("1 2 3\n4 5 6",
                             "Numbers for text mode: rows on new lines or ';' (a 2-D tensor; a single row gives a 1-D "
                             "tensor).", multiline=True),
            },
            "optional": {"image": ("IMAGE", {"tooltip": "Source for image mode; becomes [B, C, H, W]."})},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, mode=None, shape=None, text=None):
        """shape and text where the mode parses them (shape: random, zeros and ones; text: text), by
        the parsers the node runs. ComfyUI skips its own combo check for mode, taken here to know
        which text is parsed, so mode is checked against its choices here."""
        return validate_texts(cls, ("mode", mode, cls.MODES),
                              [("shape", shape, cls.MODES[:4], parse_shape), ("text", text, ("text",), parse_matrix)])

    def _run(self, mode="random_normal", shape="1, 3, 64, 64", seed=0, text="", image=None):
        node = self.DISPLAY
        t = Timer()
        if mode == "image":
            if image is None:
                raise NodeError(node, "image", None, "mode is image but no IMAGE is connected")
            dev = _image_on_device(image, nchw=True)
            if dev is not None:  # the IMAGE an AnyDevice node made: its device copy, nothing moves
                out = DeviceTensor(dev[1], dev[0])
                return {"ui": badge(dev[0], t.ms(dev[0]), shape=list(out.shape)), "result": (out,)}
            out = cpu_f32(image).permute(0, 3, 1, 2).clone(memory_format=torch.contiguous_format)  # never a view
        elif mode == "text":
            m = parsed(node, "text", text, parse_matrix)
            out = torch.from_numpy(m[0].copy() if m.shape[0] == 1 else m)
        else:
            dims = _shape(shape, node)
            if mode in self.MODES[:4]:  # every mode here makes the tensor in float32 directly
                check_constant(node, "shape", shape, dims, np.float32, "tensor")
            if mode == "zeros":
                out = torch.zeros(dims)
            elif mode == "ones":
                out = torch.ones(dims)
            elif mode in ("random_normal", "random_uniform"):
                out = torch.from_numpy(P.seeded_tensor(seed, dims, "normal" if mode == "random_normal" else "uniform"))
            else:
                raise NodeError(node, "mode", mode, f"must be one of {', '.join(self.MODES)}")
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (DeviceTensor.from_host(out),)}


# =================================================================================================
class AnyDeviceTensorInfo(PackNode):
    DISPLAY = "Tensor Info (AnyDevice)"
    CATEGORY = "AnyDevice/tensor"
    DESCRIPTION = ("Shows the type, shape, dtype, min, max and mean of an IMAGE, MASK, LATENT or TENSOR on the "
                   "node, with the backend that computed the statistics and the time; passes the input through.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        (ANY, "passthrough", "The input, unchanged."),
        ("STRING", "info", "The same facts as one line of text."))
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"input": (DATA, {"tooltip": "Anything to inspect: " + "IMAGE, MASK, LATENT or TENSOR."})},
                "optional": {"device": DEVICE_INPUT}}

    def _run(self, input, device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        kind = kind_of(input, node, "input")
        shape = shape_of(input, kind)
        dtype = input.dtype if isinstance(input, DeviceTensor) else raw(input, kind).dtype
        t = Timer()
        if math.prod(shape):  # the three statistics come back together: one download
            x = data(input, kind, be, "raw", node)
            lo, hi, mean = numbers(be, [be.min(x), be.max(x), be.mean(x)])
        else:
            lo = hi = mean = float("nan")
        ms = t.ms(be)
        info = {"kind": kind, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
                "min": lo, "max": hi, "mean": mean, "backend": be.name, "device": be.device, "ms": round(ms, 3)}
        text = (f"{kind} {shape_str(shape)} {info['dtype']} min={lo:.6g} max={hi:.6g} mean={mean:.6g} "
                f"[{be.name}, {ms:.2f} ms]")
        ui = badge(be, ms, op="stats")
        ui["info"] = [info]
        ui["text"] = [text]
        return {"ui": ui, "result": (input, text)}


def _parse_bias(text):
    """Weights' bias text: numbers (parse_vector), or None for empty text and for 'random' (which the
    node draws itself)."""
    if isinstance(text, str) and text.strip() == "random":
        return None
    return parse_vector(text)


# =================================================================================================
#: the Weights node's quantize choices (backend/ops/quant.py formats)
QUANTIZE = ["none", "q8_0", "int8", "q4_0", "q4_1", "q5_0", "q5_1", "float8_e4m3fn", "float8_e5m2"]


class AnyDeviceWeights(PackNode):
    DISPLAY = "Weights (AnyDevice)"
    CATEGORY = "AnyDevice/nn"
    DESCRIPTION = ("Makes WEIGHTS (a weight and an optional bias) for Linear or Conv2D: seeded random init of any "
                   "shape (PyTorch's default range), a matrix typed as text, or TENSOR inputs.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        (WEIGHTS, "weights", "Connect to the weights input of Linear or Conv2D."))
    SOURCES = ["random", "text", "tensor"]

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "source": Choice(cls.SOURCES, "random", "Where the weight comes from."),
                "shape": Text("8, 3, 3, 3",
                              "random: weight shape, (out, in) for Linear or (out, in/groups, kH, kW) for Conv2D."),
                "init_seed": Int(0, 0, SEED_MAX, "Seed of the random init (it does not change between runs)."),
                "matrix": Text("1 0 0\n0 1 0\n0 0 1",
                               "text: the weight matrix, rows on new lines or ';'.", multiline=True),
                "bias": Text("",
                             "Bias numbers (one per output), 'random' for a seeded random bias, or empty for none."),
            },
            "optional": {
                "weight": (TENSOR, {"tooltip": "tensor: the weight."}),
                "bias_tensor": (TENSOR, {"tooltip": "tensor: the bias (overrides the bias text)."}),
                "quantize": Choice(QUANTIZE, "none",
                                   "Store the weight quantized (the bias stays float32): q8_0 / q4_0 / q4_1 / q5_0 / "
                                   "q5_1 (GGUF blocks of 32 along the flattened weight: its size must be a multiple "
                                   "of 32), int8 (one scale per output), float8 (one scale). Linear and Conv2D keep "
                                   "it packed on the device and decode it in their kernels."),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, source=None, shape=None, matrix=None, bias=None):
        """The text widgets, by the parsers the node runs: shape where source is random, matrix where
        it is text, bias (numbers, 'random' or empty) always. ComfyUI flags each input VALIDATE_INPUTS
        takes and skips its own checks for them, so source is checked against its choices here."""
        return validate_texts(cls, ("source", source, cls.SOURCES),
                              [("shape", shape, ("random",), parse_shape), ("matrix", matrix, ("text",), parse_matrix),
                               ("bias", bias, None, _parse_bias)])

    def _run(self, source="random", shape="8, 3, 3, 3", init_seed=0, matrix="", bias="", weight=None, bias_tensor=None,
             quantize="none"):
        node = self.DISPLAY
        t = Timer()
        if source == "random":
            dims = _shape(shape, node)
            # the seeded init draws in float64 before its float32 copy
            check_constant(node, "shape", shape, dims, np.float64, "random weight")
            w = P.seeded_uniform(init_seed, dims, math.prod(dims[1:]) if len(dims) > 1 else 1)
        elif source == "text":
            w = parsed(node, "matrix", matrix, parse_matrix)
        elif source == "tensor":
            if not _is_tensor_value(weight):
                raise NodeError(node, "weight", None if weight is None else type(weight).__name__,
                                "source is tensor but no TENSOR is connected to 'weight'")
            w = cpu_f32(weight["tensor"]).numpy().copy()
        else:
            raise NodeError(node, "source", source, "must be random, text or tensor")
        out_f = int(w.shape[0]) if w.ndim >= 1 else 1
        b = None
        if bias_tensor is not None:
            b = cpu_f32(raw(bias_tensor, kind_of(bias_tensor, node, "bias_tensor"))).reshape(-1).numpy().copy()
        elif isinstance(bias, str) and bias.strip() == "random":
            fan_in = math.prod(w.shape[1:]) if w.ndim > 1 else 1
            b = P.seeded_uniform(int(init_seed) + 1, (out_f,), fan_in)
        else:
            b = parsed(node, "bias", bias, _parse_bias)
            if b is not None and b.size == 1:
                b = np.full((out_f,), b[0], np.float32)
        if b is not None and b.size != out_f:
            raise NodeError(node, "bias", bias if bias_tensor is None else "bias_tensor",
                            f"needs {out_f} values (one per output of the weight {tuple(w.shape)}), got {b.size}")
        wv = torch.from_numpy(np.ascontiguousarray(w, np.float32))
        if quantize not in (None, "", "none"):
            if quantize not in QUANTIZE:
                raise NodeError(node, "quantize", quantize, f"must be one of {', '.join(QUANTIZE)}")
            try:
                wv = quant.quantize(np.ascontiguousarray(w, np.float32), quantize, op=node)
            except AnyDeviceError as exc:
                raise NodeError(node, "quantize", quantize, f"cannot store the weight {tuple(w.shape)}: "
                                f"{exc.reason}") from None
        value = {"weight": wv, "bias": None if b is None else torch.from_numpy(np.ascontiguousarray(b, np.float32))}
        ui = _host_badge(t.ms(), shape=list(w.shape))
        if quantize not in (None, "", "none"):
            ui["text"] = [f"weight {tuple(w.shape)} stored as {quantize}: {wv.nbytes} bytes "
                          f"({wv.nbytes / (4 * max(1, w.size)):.2f}x float32)"]
        return {"ui": ui, "result": (value,)}


# =================================================================================================
class _ToTensor(PackNode):
    """An IMAGE, MASK or LATENT as a TENSOR: one input (``SOURCE`` = (name, type, tooltip)) and,
    where the kind has two layouts, a ``layout`` combo (``LAYOUTS`` = (choices, tooltip))."""
    CATEGORY = "AnyDevice/convert"
    RETURN_TYPES = (TENSOR,)
    RETURN_NAMES = ("tensor",)
    SOURCE: tuple = ()
    LAYOUTS: tuple | None = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.SOURCE and "OUTPUT_TOOLTIPS" not in cls.__dict__:
            cls.OUTPUT_TOOLTIPS = (f"The {cls.SOURCE[0]}'s numbers as a TENSOR.",)

    @classmethod
    def INPUT_TYPES(cls):
        name, typ, tip = cls.SOURCE
        req = {name: (typ, {"tooltip": tip})}
        if cls.LAYOUTS:
            choices, ltip = cls.LAYOUTS
            req["layout"] = Choice(choices, choices[0], ltip)
        return {"required": req}


class AnyDeviceImageToTensor(_ToTensor):
    DISPLAY = "Image to Tensor (AnyDevice)"
    DESCRIPTION = "An IMAGE [B, H, W, C] as a TENSOR, channel-first [B, C, H, W] (PyTorch layout) or as it is."
    SOURCE = ("image", "IMAGE", "The image to convert.")
    LAYOUTS = (["NCHW", "NHWC"], "NCHW: channel-first, as conv layers expect.")

    def _run(self, image, layout="NCHW"):
        t = Timer()
        dev = _image_on_device(image, nchw=layout == "NCHW")
        if dev is not None:  # the IMAGE an AnyDevice node made: its device copy, nothing moves
            out = DeviceTensor(dev[1], dev[0])
            return {"ui": badge(dev[0], t.ms(dev[0]), shape=list(out.shape)), "result": (out,)}
        x = cpu_f32(image)
        if x.ndim != 4:
            raise NodeError(self.DISPLAY, "image", x, "an IMAGE must be [B, H, W, C]")
        out = (x.permute(0, 3, 1, 2) if layout == "NCHW" else x).clone(memory_format=torch.contiguous_format)
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (DeviceTensor.from_host(out),)}


class AnyDeviceMaskToTensor(_ToTensor):
    DISPLAY = "Mask to Tensor (AnyDevice)"
    DESCRIPTION = "A MASK [B, H, W] as a TENSOR, [B, 1, H, W] (NCHW) or [B, H, W]."
    SOURCE = ("mask", "MASK", "The mask to convert.")
    LAYOUTS = (["NCHW", "NHW"], "NCHW adds a channel dim of 1.")

    def _run(self, mask, layout="NCHW"):
        t = Timer()
        found = R.any_copy(mask) if torch.is_tensor(mask) and mask.ndim in (2, 3) else None
        if found is not None and "raw" in found[1]:  # a MASK an AnyDevice node made: reshaped where it is
            be, s = found[0], tuple(mask.shape) if mask.ndim == 3 else (1,) + tuple(mask.shape)
            out = DeviceTensor(be._reshape(found[1]["raw"], (s[0], 1) + s[1:] if layout == "NCHW" else s), be)
            return {"ui": badge(be, t.ms(be), shape=list(out.shape)), "result": (out,)}
        x = cpu_f32(mask)
        if x.ndim == 2:
            x = x.unsqueeze(0)
        if x.ndim != 3:
            raise NodeError(self.DISPLAY, "mask", x, "a MASK must be [B, H, W] or [H, W]")
        out = (x.unsqueeze(1) if layout == "NCHW" else x).clone(memory_format=torch.contiguous_format)
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (DeviceTensor.from_host(out),)}


class AnyDeviceLatentToTensor(_ToTensor):
    DISPLAY = "Latent to Tensor (AnyDevice)"
    DESCRIPTION = "A LATENT's samples [B, C, H, W] as a TENSOR."
    OUTPUT_TOOLTIPS = ("The latent's samples as a TENSOR.",)
    SOURCE = ("latent", "LATENT", "The latent to convert.")

    def _run(self, latent):
        t = Timer()
        if not isinstance(latent, dict) or not torch.is_tensor(latent.get("samples")):
            raise NodeError(self.DISPLAY, "latent", type(latent).__name__, "a LATENT is a dict with 'samples'")
        found = R.any_copy(latent["samples"])
        if found is not None and "raw" in found[1]:  # samples an AnyDevice node made: their device copy
            out = DeviceTensor(found[1]["raw"], found[0])
            return {"ui": badge(found[0], t.ms(found[0]), shape=list(out.shape)), "result": (out,)}
        out = cpu_f32(latent["samples"]).clone()
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (DeviceTensor.from_host(out),)}


def _is_tensor_value(value) -> bool:
    return isinstance(value, DeviceTensor) or (isinstance(value, dict) and torch.is_tensor(value.get("tensor")))


def _tensor_arg(value, node, arg="tensor") -> torch.Tensor:
    if not _is_tensor_value(value):
        raise NodeError(node, arg, None if value is None else type(value).__name__, "must be a TENSOR")
    return cpu_f32(value["tensor"])


def _grid_on(be, t):
    """``_grid`` on a device array: the same tiling with the backend's pad, reshape and permute."""
    n, c, h, w = be._shape(t)
    cols = math.ceil(math.sqrt(c))
    rows = math.ceil(c / cols)
    if rows * cols - c:  # zero channels to fill the grid: padding the channel dim of [N, C, H*W]
        t = be.pad(be._reshape(t, (n, c, h * w)), (0, 0, 0, rows * cols - c))
    t = be._permute(be._reshape(t, (n, rows, cols, h, w)), (0, 1, 3, 2, 4))
    return be._reshape(t, (n, 1, rows * h, cols * w))


def _grid(t: torch.Tensor) -> torch.Tensor:
    """[N, C, H, W] -> [N, 1, rows*H, cols*W]: the channels tiled in a near-square grid."""
    n, c, h, w = t.shape
    cols = math.ceil(math.sqrt(c))
    rows = math.ceil(c / cols)
    pad = rows * cols - c
    if pad:
        t = torch.cat([t, t.new_zeros(n, pad, h, w)], 1)
    t = t.reshape(n, rows, cols, h, w).permute(0, 1, 3, 2, 4).reshape(n, 1, rows * h, cols * w)
    return t


class _FromTensor(PackNode):
    """A TENSOR as an IMAGE, MASK or LATENT: the ``tensor`` input (``TENSOR_TIP``) and the widgets of
    ``OPTIONS`` (name -> ComfyUI input spec), in order."""
    CATEGORY = "AnyDevice/convert"
    TENSOR_TIP = ""
    OPTIONS: dict = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tensor": (TENSOR, {"tooltip": cls.TENSOR_TIP}), **cls.OPTIONS}}


class AnyDeviceTensorToImage(_FromTensor):
    DISPLAY = "Tensor to Image (AnyDevice)"
    DESCRIPTION = ("A TENSOR as an IMAGE to look at. auto: 1 channel becomes grey, 3 (or 4) are RGB(A), other counts "
                   "are tiled as a grid of grey feature maps. normalize scales each image (or map) to 0..1.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(("IMAGE", "image", "An IMAGE [B, H, W, C]."))
    TENSOR_TIP = "[N, C, H, W], [C, H, W] or [H, W] (or channel-last with layout NHWC)."
    OPTIONS = {
        "mode": Choice(["auto", "channel_grid", "channels_as_batch"], "auto", "How channels become pixels."),
        "normalize": Bool(False,
                          "Scale each map to 0..1 (min to black, max to white) on the default backend."),
        "layout": Choice(["NCHW", "NHWC"], "NCHW", "How to read a 4-D tensor."),
    }

    def _run(self, tensor, mode="auto", normalize=False, layout="NCHW"):
        node = self.DISPLAY
        dev = _on_device(tensor)
        if dev is not None or (normalize and _is_tensor_value(tensor)):
            return self._on_device(tensor, dev, mode, normalize, layout)
        x = x_in = _tensor_arg(tensor, node)
        if layout == "NHWC" and x.ndim == 4:
            x = x.permute(0, 3, 1, 2)
        elif layout == "NHWC" and x.ndim == 3:
            x = x.permute(2, 0, 1)
        x = to_nchw({"tensor": x}, "TENSOR", node, "tensor")
        t = Timer()
        n, c, h, w = x.shape
        grid = mode == "channel_grid" or (mode == "auto" and c not in (1, 3, 4))
        if mode == "channels_as_batch":
            x = x.reshape(n * c, 1, h, w)
        # (normalize runs on a backend: such calls took _on_device above)
        if grid:
            x = _grid(x)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        out = x.permute(0, 2, 3, 1).contiguous()
        if out.untyped_storage().data_ptr() == x_in.untyped_storage().data_ptr():  # never a view of the (cached) input
            out = out.clone()
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (out,)}

    def _on_device(self, tensor, dev, mode, normalize, layout):
        """The same steps on the backend's arrays: normalize on the default backend, layout work where
        the numbers are; one download at the end."""
        node = self.DISPLAY
        t = Timer()
        be = resolve_backend(None, node) if normalize or dev is None else dev[0]
        x = data(tensor, "TENSOR", be)
        nd = len(be._shape(x))
        if layout == "NHWC" and nd in (3, 4):
            x = be._permute(x, (0, 3, 1, 2) if nd == 4 else (2, 0, 1))
        x = to_layout(be, x, "TENSOR", "nchw", node, "tensor")
        n, c, h, w = be._shape(x)
        grid = mode == "channel_grid" or (mode == "auto" and c not in (1, 3, 4))
        per_map = grid or mode == "channels_as_batch"
        if mode == "channels_as_batch":
            x = be._reshape(x, (n * c, 1, h, w))
        if normalize:
            dims = (2, 3) if per_map else (1, 2, 3)
            lo = be.min(x, dims, keepdim=True)
            hi = be.max(x, dims, keepdim=True)
            x = be.div(be.sub(x, lo), be.maximum(be.sub(hi, lo), 1e-12))
        if grid:
            x = _grid_on(be, x)
        n, c, h, w = be._shape(x)
        img = be._expand(be._reshape(x, (n, h, w, 1)), (n, h, w, 3)) if c == 1 else be._permute(x, (0, 2, 3, 1))
        out = _to_host(be, img)
        return {"ui": badge(be, t.ms(be), shape=list(out.shape)), "result": (out,)}


class AnyDeviceTensorToMask(_FromTensor):
    DISPLAY = "Tensor to Mask (AnyDevice)"
    DESCRIPTION = "A TENSOR as a MASK [B, H, W]: [H, W] and [B, H, W] as they are, one channel of [N, C, H, W]."
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(("MASK", "mask", "A MASK [B, H, W]."))
    TENSOR_TIP = "[H, W], [B, H, W] or [N, C, H, W]."
    OPTIONS = {"channel": Int(0, 0, 4095, "Which channel of a 4-D tensor.")}

    def _run(self, tensor, channel=0):
        node = self.DISPLAY
        t = Timer()
        dev = _on_device(tensor)
        if dev is not None and len(tensor.shape) in (2, 3, 4):  # reshaped or sliced where it is
            be, x = dev
            s = tuple(tensor.shape)
            if len(s) == 4:
                if not 0 <= channel < s[1]:
                    raise NodeError(node, "channel", channel, f"out of range for a tensor with {s[1]} channels")
                x = be._slice1(be._reshape(x, (s[0], s[1], 1) + s[2:]), channel)
            out = _to_host(be, be._reshape(x, (1 if len(s) == 2 else s[0],) + s[-2:]))
            return {"ui": badge(be, t.ms(be), shape=list(out.shape)), "result": (out,)}
        x = _tensor_arg(tensor, node)
        if x.ndim == 2:
            out = x.unsqueeze(0)
        elif x.ndim == 3:
            out = x.clone()
        elif x.ndim == 4:
            if not 0 <= channel < x.shape[1]:
                raise NodeError(node, "channel", channel, f"out of range for a tensor with {x.shape[1]} channels")
            out = x[:, channel]
        else:
            raise NodeError(node, "tensor", x, "a MASK needs a 2-D, 3-D or 4-D tensor")
        out = out.clone(memory_format=torch.contiguous_format)  # never a view of the (cached) input
        return {"ui": _host_badge(t.ms(), shape=list(out.shape)), "result": (out,)}


class AnyDeviceTensorToLatent(_FromTensor):
    DISPLAY = "Tensor to Latent (AnyDevice)"
    DESCRIPTION = "A 4-D TENSOR [B, C, H, W] (or 3-D [C, H, W]) as a LATENT {'samples': ...}."
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(("LATENT", "latent", "A LATENT."))
    TENSOR_TIP = "[B, C, H, W] or [C, H, W]."

    def _run(self, tensor):
        node = self.DISPLAY
        t = Timer()
        dev = _on_device(tensor)
        if dev is not None and len(tensor.shape) in (3, 4, 5):  # samples from the device array, one download
            be, x = dev
            s = tuple(tensor.shape)
            out = {"samples": _to_host(be, be._reshape(x, (1,) + s if len(s) == 3 else s))}
            return {"ui": badge(be, t.ms(be), shape=list(out["samples"].shape)), "result": (out,)}
        x = _tensor_arg(tensor, node)
        if x.ndim == 3:
            x = x.unsqueeze(0)
        if x.ndim not in (4, 5):
            raise NodeError(node, "tensor", x, "a LATENT needs [B, C, H, W]")
        out = {"samples": x.contiguous().clone()}
        return {"ui": _host_badge(t.ms(), shape=list(x.shape)), "result": (out,)}


HELPER_NODES = [AnyDeviceDeviceSelect, AnyDeviceTensorSource, AnyDeviceTensorInfo, AnyDeviceWeights,
                AnyDeviceImageToTensor, AnyDeviceMaskToTensor, AnyDeviceLatentToTensor, AnyDeviceTensorToImage,
                AnyDeviceTensorToMask, AnyDeviceTensorToLatent]
_ = (DATA, DEVICE_INPUT, load_time_backend_name)
