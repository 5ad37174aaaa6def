"""Models from ComfyUI-GGUF's own loaders ("Unet Loader (GGUF)") through "Model on AnyDevice", packed.

ComfyUI-GGUF (city96) builds the model with its ``GGMLOps``: every weight is a ``GGMLTensor`` (a torch
tensor subclass: the file's bytes, uint8, with ``tensor_type`` — a ``gguf.GGMLQuantizationType`` —,
``tensor_shape`` — the logical shape — and ``patches`` — the LoRA patches its ``GGUFModelPatcher`` puts on
the weight instead of changing it), and each layer dequantizes its weight with torch ops for every call.
Compiled as it is, those torch ops and the tensor subclass would reach torch.compile.

:class:`GGMLBridge` gives the compiled module (a ``share_copy`` of the diffusion model) plain tensors
instead, and :meth:`GGMLBridge.refresh` (run before every ``apply_model`` call, outside torch.compile)
keeps them in step with the original's weights:

* a Linear / Conv2d whose weight is a block format the pack reads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and has
  no patch: the weight is the same bytes as a plain uint8 tensor (no copy), and the layer's forward calls
  ``torch.ops.anydevice.quant_linear`` / ``quant_conv2d`` (backend/compile/quant_ops.py), so the device's
  kernels read the blocks packed;
* a patched weight (a LoRA), or a format the pack does not read (K-quants, BF16 blocks): ComfyUI-GGUF's own
  ``get_weight`` (dequantize, then ``comfy.lora.calculate_weight``) gives a float32 weight, computed once
  per weight and patch set, and the layer runs in float (torch.compile sees the dtype change and
  recompiles; taking the patch off gives the packed weight back);
* any other GGMLTensor (F32 / F16 tensors, biases, norms): the same memory as a plain tensor.

Nothing of ComfyUI-GGUF is imported: its tensors are recognised by their attributes.
"""
from __future__ import annotations

import logging
import types

import torch

from .gguf import PackedConv2d, PackedLinear

log = logging.getLogger("anydevice")

#: ComfyUI-GGUF's tensor_type names of the block formats the pack's kernels read -> ops/quant.py's names
PACKED_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1"}
#: ComfyUI's per-layer attributes the copy takes from its original at each refresh (comfy.ops / model_patcher)
HOOKS = ("weight_function", "bias_function", "comfy_cast_weights", "prev_comfy_cast_weights")
#: tensor types whose data is already a float tensor (ComfyUI-GGUF's TORCH_COMPATIBLE_QTYPES)
FLOAT_TYPES = {None, "F32", "F16"}


def type_name(t) -> str | None:
    """A GGMLTensor's ``tensor_type`` name ("Q8_0", "F32"...), None for a plain tensor."""
    tt = getattr(t, "tensor_type", None)
    return None if tt is None else str(getattr(tt, "name", tt))


def is_ggml(t) -> bool:
    return isinstance(t, torch.Tensor) and hasattr(t, "tensor_type") and hasattr(t, "tensor_shape")


def _plain(t: torch.Tensor) -> torch.nn.Parameter:
    """The same memory as a plain (not subclassed) tensor, as a parameter without grad."""
    return torch.nn.Parameter(t.as_subclass(torch.Tensor).detach(), requires_grad=False)


def _packable(m) -> bool:
    """A Linear, or a Conv2d with zero padding given as numbers (what quant_conv2d takes)."""
    if isinstance(m, torch.nn.Linear):
        return True
    return isinstance(m, torch.nn.Conv2d) and m.padding_mode == "zeros" and not isinstance(m.padding, str)


def _forward(self, x, *args, **kwargs):
    """The forward of a bridged Linear / Conv2d: packed bytes through the quant op, else in float (the
    pack's own GGUF layers' two calls, gguf.PackedLinear / PackedConv2d, on this module's quant_fmt /
    quant_shape)."""
    ops = PackedLinear if isinstance(self, torch.nn.Linear) else PackedConv2d
    w, b = self.weight, self.bias
    if w.dtype == torch.uint8:
        return ops._quant_op(self, x, w, b)
    return ops._float_op(self, x, w.to(x.dtype), None if b is None else b.to(x.dtype))


class GGMLBridge:
    """The bridged copy of a ComfyUI-GGUF model: ``pairs`` of (original module, copy module) whose
    parameters hold GGMLTensors; the copies have their own parameter dicts, filled by :meth:`refresh`."""

    def __init__(self, pairs, float_dtype=torch.float32):
        self.pairs = pairs
        self.float_dtype = float_dtype  # what a weight dequantized here is kept in (the model's compute dtype)
        self._cache: dict = {}  # (module id, name) -> (key, the original tensor, its patches, its value here)
        self.float_weights = 0  # weights that ran in float at the last refresh (patched or unread formats)

    def refresh(self) -> None:
        """Make each copy's parameters match its original's (outside torch.compile, before a call). A cached
        value is reused while the original is the same tensor on the same memory (a move to another
        device, or ComfyUI-GGUF releasing its file mapping, gives new memory) with the same patch objects
        and weight functions."""
        cache, floats = {}, 0
        for orig, c in self.pairs:
            for attr in HOOKS:  # ComfyUI's per-layer hooks (lowvram patches, weight wrappers): the original's
                if attr in orig.__dict__:
                    c.__dict__[attr] = orig.__dict__[attr]
            # the bridged forward does not run the hooks: its weights get them here (other layers run ComfyUI's
            # own forward on the copy, which applies them)
            fns = (tuple(getattr(orig, "weight_function", None) or ()), tuple(getattr(orig, "bias_function", None) or ())) \
                if getattr(c, "quant_fmt", None) else ((), ())
            for name, v in orig._parameters.items():
                if not is_ggml(v):
                    c._parameters[name] = v
                    continue
                tn, patches = type_name(v), list(getattr(v, "patches", None) or [])
                f = fns[0] if name == "weight" else fns[1] if name == "bias" else ()
                key = (tn, v.device, v.data_ptr(), tuple(v.tensor_shape), f)
                slot = (id(c), name)
                old = self._cache.get(slot)
                if old is not None and old[0] == key and old[1] is v and len(old[2]) == len(patches) and \
                        all(a is b for a, b in zip(old[2], patches)):
                    val = old[3]
                elif not patches and not f and (tn in FLOAT_TYPES or (name == "weight" and tn in PACKED_TYPES
                                                                      and getattr(c, "quant_fmt", None))):
                    val = _plain(v)
                elif not patches and not f and tn == "BF16":  # the bytes are bfloat16 values: a view
                    val = _plain(v.as_subclass(torch.Tensor).view(torch.bfloat16).reshape(tuple(v.tensor_shape)))
                else:  # patched, hooked, or a format the kernels do not read: ComfyUI-GGUF's own float weight
                    with torch.no_grad():
                        w = orig.get_weight(v, torch.float32)
                        w = w.as_subclass(torch.Tensor) if type(w) is not torch.Tensor else w
                        for fn in f:
                            w = fn(w)
                    val = torch.nn.Parameter(w.reshape(tuple(v.tensor_shape)).to(self.float_dtype), requires_grad=False)
                if val.dtype != torch.uint8 and tn not in FLOAT_TYPES:
                    floats += 1
                cache[slot] = (key, v, patches, val)
                c._parameters[name] = val
        self._cache = cache
        if floats != self.float_weights:
            log.info("AnyDevice: %d of the GGUF model's quantized weights run in %s (patched by a LoRA, or a format "
                     "the kernels do not read); the others stay packed", floats, str(self.float_dtype)[6:])
        self.float_weights = floats


def _pairs(orig: torch.nn.Module, copy: torch.nn.Module, out: list) -> None:
    for k, m in orig._modules.items():
        if m is not None:
            _pairs(m, copy._modules[k], out)
    if any(is_ggml(v) for v in orig._parameters.values()):
        out.append((orig, copy))


def bridge(original: torch.nn.Module, copy: torch.nn.Module, float_dtype=None) -> GGMLBridge | None:
    """A :class:`GGMLBridge` for ``copy`` (a ``share_copy`` of ``original``), or None when ``original`` holds
    no GGMLTensor. The copy's bridged modules get their own parameter dicts and, where the weight is packed
    in a format the pack reads, the bridged forward; the original is not changed. ``float_dtype``: what a
    weight that runs in float is kept in (default float32; the model's dtype where it runs in half)."""
    pairs: list = []
    _pairs(original, copy, pairs)
    if not pairs:
        return None
    from ...backend.compile import quant_ops
    quant_ops.register()
    for orig, c in pairs:
        c._parameters = dict(orig._parameters)
        fmt = PACKED_TYPES.get(type_name(orig._parameters.get("weight")))
        if fmt is not None and _packable(orig):
            c.quant_fmt = fmt
            c.quant_shape = tuple(int(s) for s in orig._parameters["weight"].tensor_shape)
            c.forward = types.MethodType(_forward, c)
    b = GGMLBridge(pairs, float_dtype if float_dtype in (torch.float16, torch.bfloat16) else torch.float32)
    b.refresh()
    return b
