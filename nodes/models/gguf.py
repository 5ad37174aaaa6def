"""GGUF diffusion models (ComfyUI-GGUF's files) whose layers keep their weights packed:
"Load GGUF Model (AnyDevice)".

The file is read by ``backend/compile/gguf_reader.read_gguf`` (untrusted: every count and offset is
checked; a problem is a node error naming the file). Its tensors become a state dict as ComfyUI-GGUF's
loader makes it: the ``model.diffusion_model.`` prefix stripped, the logical shape of a weight that was
stored in rows of 256 taken from ``comfy.gguf.orig_shape.<name>``, a quantized weight a
:class:`PackedWeight` (its bytes, uint8, with the logical ``.shape`` ComfyUI's model detection reads),
F16 / F32 / BF16 tensors plain tensors. The MODEL is built by ComfyUI
(``comfy.sd.load_diffusion_model_state_dict`` with ``custom_operations`` = :func:`comfy_ops`), whose
Linear and Conv2d keep a packed weight as a uint8 parameter and call
``torch.ops.anydevice.quant_linear`` / ``quant_conv2d`` (backend/compile/quant_ops.py): eager ComfyUI
dequantizes per op (any torch device); "Model on AnyDevice" lowers the op to the device's linear /
conv2d with the weight packed (OpenCL, CUDA: decoded in the kernels).

LoRA and other weight patches: ComfyUI's patcher reads a packed weight through the layer's
``convert_weight`` (the bytes dequantized to float32), applies the patches (``comfy.lora.calculate_weight``)
and hands the result to ``set_weight``, which makes the patched float weight the layer's weight until the
patcher takes the patch off again (it puts the packed parameter back): a patched layer runs the float
weight, an unpatched one stays packed. Low-VRAM patching (``weight_function``: ``LowVramPatch``) is
applied per forward to the dequantized weight. A patcher that writes weights in place
(``weight_inplace_update``) cannot patch a packed weight: that is an error naming the layer.

ComfyUI is imported inside the functions that need it: the pack imports without it.
"""
from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch

from ...backend.ops import quant
from ...backend.ops.dtypes import BF16
from ...backend.system.errors import AnyDeviceError
from ..base.common import NodeError, PackNode, Timer
from ..base.widgets import outputs

log = logging.getLogger("anydevice")

CATEGORY = "AnyDevice/models"
PREFIX = "model.diffusion_model."
ORIG_SHAPE = "comfy.gguf.orig_shape."
#: the model folders the node lists .gguf files from (ComfyUI's folder_paths names)
FOLDERS = ("diffusion_models", "unet")
#: the folder_paths entry this node registers: those folders' paths, extension .gguf
GGUF_FOLDER = "anydevice_gguf"
NONE_FOUND = "(no .gguf file in models/unet or models/diffusion_models)"


def _quant_ops():
    """backend/compile/quant_ops (imported on first use, as compiled.py imports backend/compile), its ops
    registered."""
    from ...backend.compile import quant_ops
    quant_ops.register()
    return quant_ops


# ---- the state dict ------------------------------------------------------------------------------
class PackedWeight(torch.Tensor):
    """A quantized weight in a state dict: the packed bytes (a uint8 tensor) whose ``.shape`` is the
    weight's logical shape (what ComfyUI's model detection reads), with ``fmt`` (ops/quant.py's name).
    Torch ops on it give plain tensors of the bytes; ``packed()`` is that tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data: torch.Tensor, fmt: str, shape):
        t = torch.Tensor._make_subclass(cls, data, False)
        t.fmt = fmt
        t.logical_shape = torch.Size(int(s) for s in shape)
        return t

    @property
    def shape(self):
        return self.logical_shape

    def size(self, dim=None):
        return self.logical_shape if dim is None else self.logical_shape[dim]

    @property
    def ndim(self):
        return len(self.logical_shape)

    def dim(self):
        return len(self.logical_shape)

    def packed(self) -> torch.Tensor:
        """The bytes as a plain uint8 tensor (the same memory)."""
        return torch.Tensor.as_subclass(self, torch.Tensor)

    def __repr__(self):
        return f"PackedWeight({self.fmt}, shape={tuple(self.logical_shape)})"


def _tensor_of(a: np.ndarray) -> torch.Tensor:
    """A file's array as a torch tensor owning its memory (the file may change after it is read)."""
    if a.dtype == BF16:
        return torch.from_numpy(np.array(a.view(np.uint16))).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def gguf_state_dict(path: str, node: str = "gguf") -> tuple[dict, dict]:
    """(state dict, metadata) of a GGUF diffusion model, as ComfyUI-GGUF's loader gives it: the prefix
    ``model.diffusion_model.`` stripped, ``comfy.gguf.orig_shape.*`` applied, quantized weights
    ``PackedWeight``. Any problem with the file is a NodeError naming it."""
    from ...backend.compile.gguf_reader import read_gguf
    name = os.path.basename(path)
    try:
        f = read_gguf(path)
    except AnyDeviceError as exc:
        raise NodeError(node, "gguf_name", name, f"is not a GGUF file this node can read: {exc}") from None
    meta = f.metadata
    sd = {}
    for key, v in f.tensors.items():
        shape = meta.get(ORIG_SHAPE + key)
        if shape is not None:
            if not (isinstance(shape, list) and 1 <= len(shape) <= 4 and all(type(s) is int and s > 0 for s in shape)):
                raise NodeError(node, "gguf_name", name, f"metadata {ORIG_SHAPE + key} = {shape!r} is not a shape")
            if math.prod(shape) != math.prod(v.shape):
                raise NodeError(node, "gguf_name", name, f"tensor {key!r} of shape {tuple(v.shape)} cannot have "
                                                         f"the original shape {tuple(shape)} its metadata gives")
        if isinstance(v, quant.QTensor):
            t = PackedWeight(torch.from_numpy(np.array(v.data)), v.fmt, shape or v.shape)
        else:
            t = _tensor_of(v)
            if not t.is_floating_point():
                raise NodeError(node, "gguf_name", name, f"tensor {key!r} has integer type {f.types[key]}: "
                                                         "not a diffusion model's weight")
            if shape is not None:
                t = t.reshape(shape)
        k = key[len(PREFIX):] if key.startswith(PREFIX) else key
        if k in sd:
            raise NodeError(node, "gguf_name", name, f"tensor {k!r} appears twice (with and without {PREFIX!r})")
        sd[k] = t
    if not sd:
        raise NodeError(node, "gguf_name", name, "holds no tensors")
    return sd, meta


# ---- the layers ComfyUI builds the model with ------------------------------------------------------
class PackedLayer:
    """Mixin of a Linear / Conv2d that takes a ``PackedWeight`` from its state dict: the weight is then
    a uint8 parameter (the bytes) with ``quant_fmt`` / ``quant_shape``, and the forward calls
    quant_ops' op (``_quant_op``); a float weight (not packed, or patched) runs the layer as it is."""

    quant_fmt = None
    quant_shape = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        w = state_dict.get(prefix + "weight")
        if not isinstance(w, PackedWeight):
            self.quant_fmt = self.quant_shape = None
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        want = tuple(self.weight.shape)
        if tuple(w.shape) != want:
            error_msgs.append(f"size mismatch for {prefix}weight: the file's {w.fmt} weight has shape "
                              f"{tuple(w.shape)}, the layer's is {want}")
            return
        self.quant_float_dtype = self.weight.dtype
        self.weight = torch.nn.Parameter(w.packed(), requires_grad=False)
        self.quant_fmt, self.quant_shape = w.fmt, tuple(w.shape)
        b = state_dict.get(prefix + "bias")
        if b is not None:
            self.bias = torch.nn.Parameter(torch.Tensor.as_subclass(b, torch.Tensor).detach(), requires_grad=False)
        elif self.bias is not None:
            missing_keys.append(prefix + "bias")

    def packed_now(self) -> bool:
        return self.quant_fmt is not None and self.weight.dtype == torch.uint8

    # ComfyUI's patcher (model_patcher.get_key_weight): convert_weight / set_weight
    def convert_weight(self, weight, inplace=False, **kwargs):
        """The float32 values of a packed weight (the patcher passes the bytes as floats); a weight of the
        logical shape passes as it is."""
        if self.quant_shape is None or (tuple(weight.shape) == self.quant_shape and weight.dtype != torch.uint8):
            return weight
        return _quant_ops().dequantize(weight.to(torch.uint8), None, self.quant_fmt, self.quant_shape,
                                    op=type(self).__name__)

    def set_weight(self, weight, inplace_update=False, seed=None, return_weight=False, **kwargs):
        """The patched weight: returned (low-VRAM patches), or the layer's weight until the patcher
        puts the packed one back."""
        if return_weight:
            return weight
        if inplace_update:
            raise AnyDeviceError(f"{type(self).__name__} (a packed GGUF weight)", "weight", self.quant_fmt,
                                 "cannot be patched in place (weight_inplace_update): the packed bytes cannot "
                                 "hold the patched values; use a patcher without weight_inplace_update")
        dtype = getattr(self, "quant_float_dtype", torch.float32)
        self.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)

    def _packed_forward(self, x, *args, **kwargs):
        data, bias = self.weight, self.bias
        if data.device != x.device:
            data = data.to(x.device)
        if bias is not None and bias.device != x.device:
            bias = bias.to(x.device)
        wf, bf = getattr(self, "weight_function", []), getattr(self, "bias_function", [])
        if wf or bf:  # low-VRAM patches (LowVramPatch) and other weight functions: on the float weight
            w = self.convert_weight(data)
            for f in wf:
                w = f(w)
            if bias is not None:
                for f in bf:
                    bias = f(bias)
            return self._float_op(x, w.to(x.dtype), None if bias is None else bias.to(x.dtype))
        return self._quant_op(x, data, bias)

    def forward_comfy_cast_weights(self, input, *args, **kwargs):
        if not self.packed_now():
            return super().forward_comfy_cast_weights(input, *args, **kwargs)
        return self._packed_forward(input)

    def forward(self, *args, **kwargs):
        if not self.packed_now():
            return super().forward(*args, **kwargs)
        return self._packed_forward(*args, **kwargs)


class PackedLinear(PackedLayer):
    def _quant_op(self, x, data, bias):
        return torch.ops.anydevice.quant_linear(x, data, None, bias, self.quant_fmt, list(self.quant_shape))

    def _float_op(self, x, w, b):
        return torch.nn.functional.linear(x, w, b)


class PackedConv2d(PackedLayer):
    def _quant_op(self, x, data, bias):
        if self.padding_mode != "zeros" or isinstance(self.padding, str):
            w = self.convert_weight(data).to(x.dtype)
            return self._conv_forward(x, w, None if bias is None else bias.to(x.dtype))
        return torch.ops.anydevice.quant_conv2d(x, data, None, bias, self.quant_fmt, list(self.quant_shape),
                                                list(self.stride), list(self.padding), list(self.dilation),
                                                int(self.groups))

    def _float_op(self, x, w, b):
        return self._conv_forward(x, w, b)


_OPS = []


def comfy_ops():
    """ComfyUI's ``custom_operations`` for a GGUF model: comfy.ops.manual_cast whose Linear and Conv2d
    keep a packed weight packed (inside ComfyUI only)."""
    if not _OPS:
        import comfy.ops  # noqa: PLC0415 - inside ComfyUI only
        _quant_ops()

        class AnyDeviceGGUFOps(comfy.ops.manual_cast):
            class Linear(PackedLinear, comfy.ops.manual_cast.Linear):
                pass

            class Conv2d(PackedConv2d, comfy.ops.manual_cast.Conv2d):
                pass
        _OPS.append(AnyDeviceGGUFOps)
    return _OPS[0]


# ---- the node ----------------------------------------------------------------------------------------
def gguf_files() -> list[str]:
    """The .gguf files of ComfyUI's diffusion_models / unet folders (empty without ComfyUI)."""
    try:
        import folder_paths  # noqa: PLC0415 - inside ComfyUI only
    except ImportError:
        return []
    paths = []
    for key in FOLDERS:
        try:
            paths += [p for p in folder_paths.get_folder_paths(key) if p not in paths]
        except Exception:  # noqa: BLE001 - a ComfyUI without that folder name
            continue
    folder_paths.folder_names_and_paths[GGUF_FOLDER] = (paths, {".gguf"})
    return folder_paths.get_filename_list(GGUF_FOLDER)


class AnyDeviceGGUFLoader(PackNode):
    DISPLAY = "Load GGUF Model (AnyDevice)"
    CATEGORY = CATEGORY
    DESCRIPTION = ("Loads a GGUF diffusion model (ComfyUI-GGUF's files: Q8_0, Q5_1, Q5_0, Q4_1, Q4_0, F16, BF16, "
                   "F32 tensors) from models/unet or models/diffusion_models. The quantized weights stay packed in "
                   "memory: eager ComfyUI dequantizes each layer's weight for its op, and after \"Model on AnyDevice\" "
                   "the device's kernels read the packed weights. LoRAs apply (a patched layer runs in float). "
                   "K-quants are not supported.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("MODEL", "model", "The diffusion model, its quantized weights packed (connect to Model on AnyDevice, "
                           "LoRA loaders, KSampler)."))

    @classmethod
    def INPUT_TYPES(cls):
        files = gguf_files() or [NONE_FOUND]
        return {"required": {"gguf_name": (files, {"tooltip": "A .gguf diffusion model (UNet) file in ComfyUI's "
                                                              "models/unet or models/diffusion_models folder."})}}

    def _run(self, gguf_name):
        node = self.DISPLAY
        t = Timer()
        try:
            import comfy.sd  # noqa: PLC0415 - inside ComfyUI only
            import folder_paths  # noqa: PLC0415
        except ImportError as exc:
            raise NodeError(node, "gguf_name", gguf_name, f"needs ComfyUI ({exc})") from exc
        gguf_files()
        path = folder_paths.get_full_path(GGUF_FOLDER, gguf_name) if gguf_name != NONE_FOUND else None
        if path is None:
            raise NodeError(node, "gguf_name", gguf_name, "is not a .gguf file in models/unet or "
                                                          "models/diffusion_models")
        sd, meta = gguf_state_dict(path, node)
        packed = sum(1 for v in sd.values() if isinstance(v, PackedWeight))
        fmts = sorted({v.fmt for v in sd.values() if isinstance(v, PackedWeight)})
        held = sum(v.packed().numel() for v in sd.values() if isinstance(v, PackedWeight))
        total = len(sd)  # ComfyUI takes the entries out of sd as it loads them
        try:
            model = comfy.sd.load_diffusion_model_state_dict(sd, model_options={"custom_operations": comfy_ops()})
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            raise NodeError(node, "gguf_name", gguf_name, f"ComfyUI cannot build a model from it: "
                                                          f"{type(exc).__name__}: {exc}") from exc
        if model is None:
            raise NodeError(node, "gguf_name", gguf_name, "is no diffusion model ComfyUI recognises "
                                                          f"(architecture {meta.get('general.architecture')!r})")
        lines = [f"{gguf_name}: {meta.get('general.architecture', '?')}, {packed} packed weights "
                 f"({', '.join(fmts) or 'none'}, {held / 2**20:.1f} MiB), {total - packed} float tensors"]
        log.info("AnyDevice: %s", lines[0])
        ui = {"anydevice": [{"backend": "host", "device": "file", "ms": round(t.ms(), 3), "op": "load"}],
              "text": lines}
        return {"ui": ui, "result": (model,)}


GGUF_NODES = [AnyDeviceGGUFLoader]
