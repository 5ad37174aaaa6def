"""ComfyUI's own models on the pack's backends: "Model on AnyDevice", "VAE on AnyDevice" and
"Upscale Model on AnyDevice" (issue 14).

Each node takes a model ComfyUI loaded (MODEL, VAE, UPSCALE_MODEL) and returns a copy of it whose heavy
module runs through ``torch.compile(module, backend="anydevice", options={"device": <backend>})``
(``backend/compile``): the captured ATen graph runs on the chosen AnyDevice backend, weights are uploaded
once per model (and again only when ComfyUI's patcher replaces or changes them: LoRA, weight patches).
The input object is never changed (the copies are made as ComfyUI makes its clones):

* MODEL: ``model.clone()`` and an APPLY_MODEL wrapper that swaps the compiled ``diffusion_model`` in for
  each call, exactly as core's TorchCompileModel (``comfy_api.torch_helpers.set_torch_compile_wrapper``)
  does: same wrapper factory, same ``model_options["torch_compile_kwargs"]``; the compiled module is the
  guarded one described below. The clone's ``transformer_options["optimized_attention_override"]`` sends
  attention through ComfyUI's ``attention_pytorch`` (see :func:`pytorch_attention_override`).
* VAE: a ``copy.copy`` of the VAE wrapper with its own patcher clone and its own ``first_stage_model``
  object whose ``decoder`` and ``encoder`` are the compiled ones (the underlying weights are the
  original's: same parameter objects, so what the patcher does to them is seen). The compiled decoder and
  encoder run on a copy of the module tree (sharing the parameter and buffer dicts) whose attention
  blocks use ComfyUI's ``pytorch_attention`` (one graph, attention in query blocks on the device) instead
  of ``slice_attention`` (four graph breaks per call).
* UPSCALE_MODEL (a spandrel ``ImageModelDescriptor``): a ``copy.copy`` whose ``model`` is the guarded
  compiled module (``.to``/``.parameters`` reach the original weights).

Guarded: a model the backend cannot take at all (``AnyDeviceCompileError``: an op with no fallback,
complex or float64 compute) is said once in the log (a warning naming the node and why) at its first call,
and that copy runs the original module eagerly from then on (the model keeps working). An op that fails on the
device (``AnyDeviceRunError``, e.g. a result over ANYDEVICE_MAX_TENSOR_MB) is an error naming this node,
the op and the size asked for.

ComfyUI is imported lazily, inside the functions that need it: the pack imports without it (the
Upscale Model node works on any spandrel-like descriptor: an object with a ``model`` module).
"""
from __future__ import annotations

import copy
import logging

import torch

from .common import DEVICE_INPUT, NodeError, PackNode, Timer, badge, resolve_backend

log = logging.getLogger("anydevice")

CATEGORY = "AnyDevice/models"
COMPILE_KEY = "torch.compile"  # comfy_api.torch_helpers.torch_compile's key and kwargs name
TORCH_COMPILE_KWARGS = "torch_compile_kwargs"


def _compile_api():
    """backend/compile (imported on first use: it registers the dynamo backend)."""
    from ..backend import compile as adc
    return adc


def _torch_compile(module, be):
    adc = _compile_api()
    adc.register()
    return torch.compile(module, backend=adc.BACKEND_NAME, options={"device": be})


class Guarded(torch.nn.Module):
    """``original``'s forward through ``compiled``; on AnyDeviceCompileError the original, from then on.

    ``original`` is a registered submodule (``.to``, ``.parameters``, ``state_dict`` reach the real
    weights); the compiled module is not (its parameters are the same tensors)."""

    def __init__(self, original, compiled, node: str, what: str):
        super().__init__()
        self.original = original
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "what", what)
        object.__setattr__(self, "failed", None)  # why the backend refused the model, once it has

    def forward(self, *args, **kwargs):
        if self.failed is not None:
            return self.original(*args, **kwargs)
        adc = _compile_api()
        try:
            return self.compiled(*args, **kwargs)
        except adc.AnyDeviceCompileError as exc:
            object.__setattr__(self, "failed", str(exc))
            log.warning("%s: the %s cannot run on the AnyDevice backend, it runs as before (PyTorch, "
                        "uncompiled): %s", self.node, self.what, exc)
            return self.original(*args, **kwargs)
        except adc.AnyDeviceRunError as exc:
            raise NodeError(self.node, None, None, f"the {self.what} failed on the device: {exc}") from exc

    def __getattr__(self, name):
        """Other attributes are the original's (``dtype``, ``scale``...), as OptimizedModule forwards them."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_modules", {}).get("original")
            if original is None:
                raise
            return getattr(original, name)

    def extra_repr(self) -> str:
        return f"node={self.node!r}, what={self.what!r}, failed={self.failed is not None}"


def guard(original, be, node: str, what: str) -> Guarded:
    """``original`` compiled for backend ``be`` behind a :class:`Guarded`."""
    return Guarded(original, _torch_compile(original, be), node, what)


def fallbacks_of(obj) -> list[str]:
    """Why each guarded module in a node's output fell back to eager PyTorch (empty: none did)."""
    out = []
    seen = set()

    def visit(m):
        if isinstance(m, Guarded) and id(m) not in seen:
            seen.add(id(m))
            if m.failed is not None:
                out.append(f"{m.what}: {m.failed}")

    for m in _guards_of(obj):
        visit(m)
    return out


def _guards_of(obj) -> list:
    if isinstance(obj, Guarded):
        return [obj]
    found = []
    fsm = getattr(obj, "first_stage_model", None)
    if fsm is not None:
        found += [v for v in vars(fsm).values() if isinstance(v, Guarded)]
    model = getattr(obj, "_model", None) if not isinstance(obj, torch.nn.Module) else None
    if isinstance(model, Guarded):
        found.append(model)
    opts = getattr(obj, "model_options", None)
    if isinstance(opts, dict):
        found += list(opts.get("anydevice_guards", []))
    return found


# ---------------------------------------------------------------------------------------------
# copies of a module tree that share the weights
# ---------------------------------------------------------------------------------------------
def share_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module``'s tree: new module objects (their own attributes, their own child dicts)
    holding the **same** ``_parameters``/``_buffers`` dicts as the original's modules, so a weight the
    model patcher sets on the original (``set_attr_param``) is the copy's weight too. Attributes other
    than children, parameters and buffers are a snapshot of the original's."""
    new = copy.copy(module)
    new._modules = {k: (share_copy(v) if v is not None else None) for k, v in module._modules.items()}
    return new


def use_pytorch_attention(module: torch.nn.Module) -> int:
    """Set ComfyUI's VAE attention blocks in ``module`` (a share_copy) to ``pytorch_attention``: one
    scaled-dot-product op instead of slice_attention's loop with memory queries (graph breaks).
    Returns how many blocks it set."""
    try:
        import comfy.ldm.modules.diffusionmodules.model as vae_model  # noqa: PLC0415 - inside ComfyUI only
    except Exception:  # noqa: BLE001 - not ComfyUI's VAE (or no ComfyUI): nothing to set
        return 0
    fn = getattr(vae_model, "pytorch_attention", None)
    n = 0
    for m in module.modules():
        if fn is not None and isinstance(m, getattr(vae_model, "AttnBlock", ())) and \
                getattr(m, "optimized_attention", fn) is not fn:
            m.optimized_attention = fn  # the copy's own attribute: the original keeps its choice
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# the nodes
# ---------------------------------------------------------------------------------------------
def pytorch_attention_override(func, *args, **kwargs):
    """ComfyUI's ``transformer_options["optimized_attention_override"]``: every attention call of the
    diffusion model through ``attention_pytorch`` (one scaled-dot-product op, which the backend takes
    whole) instead of the CPU default sub-quadratic/split attention, whose memory queries (psutil) and
    Python loops break dynamo's graphs and leave those frames to eager PyTorch on the host."""
    from comfy.ldm.modules import attention  # noqa: PLC0415 - inside ComfyUI only
    return attention.attention_pytorch(*args, **kwargs)


class _ModelNode(PackNode):
    CATEGORY = CATEGORY
    ARGS: dict[str, str] = {}

    def _out(self, be, t, value, lines, op):
        ui = badge(be, t.ms(), op=op)
        ui["text"] = lines
        return {"ui": ui, "result": (value,)}


class AnyDeviceModel(_ModelNode):
    DISPLAY = "Model on AnyDevice"
    DESCRIPTION = ("Runs a diffusion model (MODEL) on an AnyDevice backend: its diffusion_model is compiled with "
                   "torch.compile(backend='anydevice') through the model patcher, as ComfyUI's TorchCompileModel "
                   "does. The first sampling step compiles (slow); weights go to the device once and again only "
                   "when a LoRA or weight patch changes them. The input MODEL is not changed. A model the backend "
                   "cannot take runs as before (PyTorch) with a warning in the log.")
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("A clone of the model whose diffusion model runs on the chosen backend.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL", {"tooltip": "The model from a checkpoint loader (LoRAs and other "
                                                            "patches before or after this node are kept)."})},
                "optional": {"device": DEVICE_INPUT}}

    def _run(self, model, device=None):
        node = self.DISPLAY
        if not (hasattr(model, "clone") and hasattr(model, "get_model_object") and
                hasattr(model, "add_wrapper_with_key")):
            raise NodeError(node, "model", type(model).__name__, "must be a MODEL (a ComfyUI model patcher)")
        be = resolve_backend(device, node)
        t = Timer()
        try:
            from comfy.patcher_extension import WrappersMP  # noqa: PLC0415 - inside ComfyUI only
            from comfy_api.torch_helpers.torch_compile import apply_torch_compile_factory  # noqa: PLC0415
        except ImportError as exc:
            raise NodeError(node, "model", type(model).__name__, f"needs ComfyUI ({exc})") from exc
        m = model.clone()
        key = "diffusion_model"
        original = m.get_model_object(key)
        if not isinstance(original, torch.nn.Module):
            raise NodeError(node, "model", type(original).__name__, "has no diffusion_model module to compile")
        g = guard(original, be, node, "diffusion model")
        # as comfy_api.torch_helpers.set_torch_compile_wrapper: replace other torch.compile wrappers,
        # swap the compiled module in for each apply_model call, keep the compile kwargs for reference
        m.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY)
        m.add_wrapper_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY, apply_torch_compile_factory({key: g}))
        m.model_options[TORCH_COMPILE_KWARGS] = {"backend": "anydevice", "options": {"device": be.name},
                                                 "mode": None, "fullgraph": False, "dynamic": None}
        m.model_options["anydevice_guards"] = [g]
        to = m.model_options.setdefault("transformer_options", {})
        to["optimized_attention_override"] = pytorch_attention_override
        lines = [f"diffusion model compiled for {be.name} at its first step"]
        return self._out(be, t, m, lines, "compile")


class AnyDeviceVAE(_ModelNode):
    DISPLAY = "VAE on AnyDevice"
    DESCRIPTION = ("Runs a VAE's decoder and encoder on an AnyDevice backend (torch.compile(backend='anydevice')). "
                   "Connect it after ComfyUI's Load VAE (or a checkpoint loader's VAE) and use the output with VAE "
                   "Decode / VAE Encode as usual. The first decode or encode compiles (slow); the weights go to the "
                   "device once. The input VAE is not changed. A VAE the backend cannot take runs as before "
                   "(PyTorch) with a warning in the log.")
    RETURN_TYPES = ("VAE",)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("A copy of the VAE whose decoder and encoder run on the chosen backend.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE", {"tooltip": "The VAE from Load VAE or a checkpoint loader."})},
                "optional": {"device": DEVICE_INPUT}}

    def _run(self, vae, device=None):
        node = self.DISPLAY
        fsm = getattr(vae, "first_stage_model", None)
        if not isinstance(fsm, torch.nn.Module):
            raise NodeError(node, "vae", type(vae).__name__,
                            "must be a VAE with a model (a checkpoint without a VAE gives an empty one)")
        parts = [p for p in ("decoder", "encoder") if isinstance(getattr(fsm, p, None), torch.nn.Module)]
        if not parts:
            raise NodeError(node, "vae", type(fsm).__name__, "has no decoder or encoder module to compile")
        be = resolve_backend(device, node)
        t = Timer()
        new = copy.copy(vae)
        new_fsm = copy.copy(fsm)  # its own object; children and weights are the original's
        attn = 0
        for p in parts:
            orig = getattr(fsm, p)
            tree = share_copy(orig)
            attn += use_pytorch_attention(tree)
            g = Guarded(orig, _torch_compile(tree, be), node, f"VAE {p}")
            object.__setattr__(new_fsm, p, g)  # an attribute of the copy only (shadows the child module)
        new.first_stage_model = new_fsm
        patcher = getattr(vae, "patcher", None)
        if patcher is not None and hasattr(patcher, "clone"):
            new.patcher = patcher.clone()  # the same weights, its own patches (as ComfyUI's clones)
        lines = [f"{' and '.join(parts)} compiled for {be.name} at the first use"]
        if attn:
            lines.append(f"{attn} attention block{'s' if attn != 1 else ''}: pytorch_attention")
        return self._out(be, t, new, lines, "compile")


class AnyDeviceUpscaleModel(_ModelNode):
    DISPLAY = "Upscale Model on AnyDevice"
    DESCRIPTION = ("Runs an upscale model (UPSCALE_MODEL from Load Upscale Model: ESRGAN, RealESRGAN compact, SwinIR "
                   "and the other spandrel architectures) on an AnyDevice backend (torch.compile(backend="
                   "'anydevice')). Use the output with Upscale Image (using Model). Each new tile size compiles "
                   "once; the weights go to the device once. The input model is not changed. A model the backend "
                   "cannot take runs as before (PyTorch) with a warning in the log.")
    RETURN_TYPES = ("UPSCALE_MODEL",)
    RETURN_NAMES = ("upscale_model",)
    OUTPUT_TOOLTIPS = ("A copy of the upscale model that runs on the chosen backend.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"upscale_model": ("UPSCALE_MODEL", {"tooltip": "The model from Load Upscale Model."})},
                "optional": {"device": DEVICE_INPUT}}

    def _run(self, upscale_model, device=None):
        node = self.DISPLAY
        inner = getattr(upscale_model, "model", None)
        if not isinstance(inner, torch.nn.Module) or isinstance(upscale_model, torch.nn.Module):
            raise NodeError(node, "upscale_model", type(upscale_model).__name__,
                            "must be an UPSCALE_MODEL from Load Upscale Model (a model descriptor with a .model)")
        if isinstance(inner, Guarded):  # already on AnyDevice: compile the original again for this device
            inner = inner.original
        be = resolve_backend(device, node)
        t = Timer()
        new = copy.copy(upscale_model)
        g = guard(inner, be, node, "upscale model")
        if "_model" in vars(new):  # spandrel's ModelBase keeps it as _model behind a read-only property
            new._model = g
        else:
            try:
                new.model = g
            except AttributeError as exc:
                raise NodeError(node, "upscale_model", type(upscale_model).__name__,
                                f"its model cannot be replaced in a copy ({exc})") from exc
        lines = [f"{type(inner).__name__} compiled for {be.name} at each new tile size"]
        return self._out(be, t, new, lines, "compile")


MODEL_NODES = [AnyDeviceModel, AnyDeviceVAE, AnyDeviceUpscaleModel]
