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

from ..base.common import DEVICE_INPUT, NodeError, PackNode, Timer, badge, resolve_backend
from ..base.widgets import Choice, outputs

log = logging.getLogger("anydevice")

CATEGORY = "AnyDevice/models"
COMPILE_KEY = "torch.compile"  # comfy_api.torch_helpers.torch_compile's key and kwargs name
TORCH_COMPILE_KWARGS = "torch_compile_kwargs"


def _compile_api():
    """backend/compile (imported on first use: it registers the dynamo backend)."""
    from ...backend import compile as adc
    return adc


def _torch_compile(module, be, dtype: str = "float32", weights: str | None = None):
    adc = _compile_api()
    adc.register()
    return torch.compile(module, backend=adc.BACKEND_NAME, options={"device": be, "dtype": dtype, "weights": weights})


#: the dtype widget's choices: what the weights and activations are stored in on the device
DTYPES = ["auto", "float32", "float16", "bfloat16"]
DTYPE_TIP = ("What the model's weights and activations are stored in on the device (each op computes in "
             "float32). auto: float16 (bfloat16 for a model ComfyUI runs in bfloat16) where the device stores "
             "half, else float32. Half takes half the memory and moves half the bytes.")


#: the weights widget's choices (Model on AnyDevice): "none", or a quantized format of backend/ops/quant.py
WEIGHT_FORMATS = ["none", "q8_0", "int8", "q4_0", "q4_1", "q5_0", "q5_1", "float8_e4m3fn", "float8_e5m2"]
WEIGHTS_TIP = ("Quantize the diffusion model's linear and conv weights when it goes to the device, and keep them "
               "packed there (the kernels decode them; no full-precision copy): q8_0 (GGUF 8-bit blocks, about "
               "0.27x float32's memory, nearly lossless), int8 (per output channel), q4_0 / q4_1 / q5_0 / q5_1 "
               "(GGUF 4/5-bit blocks, about 0.14-0.19x, visibly lossy), float8 (one scale per weight). The other "
               "weights and the activations stay in dtype. none: the weights are stored in dtype.")


def model_weights(weights: str, node: str) -> str | None:
    """The quantized format of the weights widget (None for "none"), or a NodeError naming the value."""
    if weights in (None, "", "none"):
        return None
    if weights not in WEIGHT_FORMATS:
        raise NodeError(node, "weights", weights, f"must be one of {', '.join(WEIGHT_FORMATS)}")
    return weights


def model_dtype(be, dtype: str, node: str, runs_in=None) -> str:
    """The storage dtype for a model node: ``dtype`` as chosen, checked against the backend; ``auto`` from
    the backend's own capabilities (never from ComfyUI's torch device) and the dtype ComfyUI runs the model
    in (``runs_in``: bfloat16 stays bfloat16)."""
    caps = be.caps.storage_dtypes
    if dtype == "auto":
        if be.kind != "own" or "float16" not in caps:
            return "float32"
        return "bfloat16" if runs_in == torch.bfloat16 and "bfloat16" in caps else "float16"
    if dtype not in DTYPES:
        raise NodeError(node, "dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    if dtype not in caps:
        raise NodeError(node, "dtype", dtype, f"is not a dtype the {be.name} backend stores (it stores "
                                              f"{', '.join(sorted(caps))})")
    return dtype


def _finite(out) -> bool:
    ts = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (list, tuple)) else [])
                                                      if isinstance(t, torch.Tensor)]
    return all(bool(torch.isfinite(t).all()) for t in ts if t.is_floating_point())


class Guarded(torch.nn.Module):
    """``original``'s forward through ``compiled``; on AnyDeviceCompileError the original, from then on.

    ``original`` is a registered submodule (``.to``, ``.parameters``, ``state_dict`` reach the real
    weights); the compiled module is not (its parameters are the same tensors)."""

    def __init__(self, original, compiled, node: str, what: str, device: str = "", input: str | None = None,
                 dtype: str = "float32", upcast=None):
        super().__init__()
        self.original = original
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "store_dtype", dtype)  # not "dtype": ComfyUI reads the model's own
        # a half model whose output overflows (inf / NaN) is run again, and from then on, in float32
        # (built by upcast()), as ComfyUI upcasts a VAE that overflows in float16
        object.__setattr__(self, "upcast", upcast)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "what", what)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "input", input)  # the node input the model came through (error messages)
        object.__setattr__(self, "failed", None)  # why the backend refused the model, once it has
        object.__setattr__(self, "eager_said", False)  # dynamo ran it eagerly, and the log said so

    def forward(self, *args, **kwargs):
        if self.failed is not None:
            return self.original(*args, **kwargs)
        adc = _compile_api()
        before = adc.lowering.runs_here()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure said in the node's words, or eager
            refused = _in_chain(exc, adc.AnyDeviceCompileError)
            if refused is not None or (_from_dynamo(exc) and _in_chain(exc, adc.AnyDeviceRunError) is None
                                       and not _passes(exc)):
                why = str(refused if refused is not None else exc).strip().splitlines()[0][:400]
                object.__setattr__(self, "failed", why)
                log.warning("%s: the %s cannot run on the AnyDevice backend %s, it runs as before (PyTorch, "
                            "uncompiled): %s", self.node, self.what, self.device, why)
                return self.original(*args, **kwargs)
            if _passes(exc):
                raise
            run = _in_chain(exc, adc.AnyDeviceRunError)
            detail = str(run) if run is not None else f"{type(exc).__name__}: {exc}"
            raise NodeError(self.node, self.input, self.what,
                            f"failed on the device {self.device} (inputs {_arg_shapes(args, kwargs)}): "
                            f"{detail}") from exc
        if self.upcast is not None and not _finite(out):
            log.warning("%s: the %s overflowed in %s on %s (inf or NaN): it runs in float32 from now on",
                        self.node, self.what, self.store_dtype, self.device)
            object.__setattr__(self, "compiled", self.upcast())
            object.__setattr__(self, "upcast", None)
            object.__setattr__(self, "store_dtype", "float32")
            return self.forward(*args, **kwargs)
        if adc.lowering.runs_here() == before and not self.eager_said:
            object.__setattr__(self, "eager_said", True)
            log.warning("%s: the %s ran in PyTorch (eager, on the host), not on the AnyDevice backend %s: "
                        "torch.compile gave up on it (its recompile limit, torch._dynamo.config.recompile_limit, "
                        "was hit); results are right, only slower", self.node, self.what, self.device)
        return out

    def __getattr__(self, name):
        """Other attributes are the original's (``dtype``, ``scale``...), as OptimizedModule forwards them."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_modules", {}).get("original")
            if original is None:
                raise
            return getattr(original, name)

    def __deepcopy__(self, memo):
        """Itself: ComfyUI deep-copies ``model_options`` for each clone of a patcher, and a guarded
        module is shared like the compiled modules in TorchCompileModel's wrapper (a copy would copy
        the whole model's weights)."""
        return self

    def extra_repr(self) -> str:
        return f"node={self.node!r}, what={self.what!r}, failed={self.failed is not None}"


def _in_chain(exc, cls):
    """The first exception of type ``cls`` in ``exc``'s cause/context chain (dynamo wraps what a
    backend raises while compiling), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, cls):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _from_dynamo(exc) -> bool:
    """Raised by torch.compile itself (tracing, aot_autograd): the model could not be compiled."""
    return type(exc).__module__.startswith(("torch._dynamo", "torch._functorch", "torch._inductor"))


def _passes(exc) -> bool:
    """A cancel or torch's out-of-memory error: re-raised as it is (ComfyUI handles both)."""
    return _compile_api().lowering.is_cancel_or_oom(exc)


def _arg_shapes(args, kwargs) -> str:
    shapes = [tuple(a.shape) for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    return ", ".join(str(s) for s in shapes) or "none"


class _GuardCache(dict):
    """The Guarded modules of one original module, by backend: kept on the module (a deep copy or a
    pickle of the module starts without them)."""

    def __deepcopy__(self, memo):
        return _GuardCache()

    def __reduce__(self):
        return (_GuardCache, ())


def _be_key(be) -> tuple:
    return (be.name, id(be))


def guard(original, be, node: str, what: str, input: str | None = None, module=None, dtype: str = "float32",
          upcast: bool = False, weights: str | None = None) -> Guarded:
    """``original`` compiled for backend ``be`` in storage dtype ``dtype`` behind a :class:`Guarded`: one per
    module, backend and dtype (kept on the module, so the node run again, or switched back to a backend it
    used before, reuses that compiled module and its graphs instead of compiling again). ``module``: what
    to compile in place of ``original`` (a share_copy of it), default ``original``. ``upcast``: a half
    model whose output overflows runs in float32 from then on."""
    cache = original.__dict__.setdefault("_anydevice_guards", _GuardCache())
    key = (_be_key(be), node, what, dtype, weights)
    g = cache.get(key)
    if g is None or g.failed is not None:
        target = original if module is None else module
        again = (lambda: _torch_compile(target, be)) if upcast and dtype != "float32" else None
        g = cache[key] = Guarded(original, _torch_compile(target, be, dtype, weights), node, what, be.name, input,
                                 dtype, again)
    return g


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


def ggml_bridge_of(original: torch.nn.Module, float_dtype=None):
    """(share_copy of ``original``, its GGMLBridge) for a model from ComfyUI-GGUF's loaders, made once per
    module and kept on it; None for any other model."""
    cache = original.__dict__.setdefault("_anydevice_guards", _GuardCache())  # not deep-copied
    got = cache.get("ggml")
    if got is None:
        from . import ggml_bridge  # noqa: PLC0415
        copy_ = share_copy(original)
        b = ggml_bridge.bridge(original, copy_, float_dtype)
        got = cache["ggml"] = (copy_, b) if b is not None else ()
    return got or None


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


def weights_epoch(base_model):
    """ComfyUI's patch state of ``base_model`` (a BaseModel): it changes whenever ComfyUI writes the
    weights in place (a LoRA or weight patch applied or taken off: ``current_weight_patches_uuid``;
    loading to a device or lowvram moves them to new tensors, which the tensor key sees anyway).
    Weight hooks (scheduled LoRA) rewrite weights in place per step without changing it: with hooks
    there is no epoch (None), and each step reads the weights' fingerprints."""
    patcher = getattr(base_model, "current_patcher", None)
    if patcher is not None and (getattr(patcher, "current_hooks", None) is not None or
                                getattr(patcher, "hook_patches", None)):
        return None
    return ("comfy", id(base_model), getattr(base_model, "current_weight_patches_uuid", None),
            bool(getattr(base_model, "model_lowvram", False)), getattr(base_model, "lowvram_patch_counter", 0))


def apply_model_wrapper(key: str, compiled, before=None):
    """The APPLY_MODEL wrapper: as comfy_api.torch_helpers' ``apply_torch_compile_factory`` (the
    compiled module swapped in for the call), and the weights trusted unchanged while ComfyUI's patch
    state is (``backend/versions.trusted``: no weight is re-read for a step between patches).
    ``before``: called first, outside torch.compile (a GGUF bridge's refresh)."""
    from ...backend.system import versions

    def wrapper(executor, *args, **kwargs):
        import comfy.utils  # noqa: PLC0415 - inside ComfyUI only
        if before is not None and getattr(compiled, "failed", None) is None:  # not once it runs eagerly
            before()
        base = executor.class_obj
        orig = comfy.utils.get_attr(base, key)
        comfy.utils.set_attr(base, key, compiled)
        try:
            with versions.trusted(weights_epoch(base)):
                return executor(*args, **kwargs)
        finally:
            comfy.utils.set_attr(base, key, orig)
    return wrapper


class _ModelNode(PackNode):
    """A node that takes one model and gives a copy of it that runs on the chosen backend: its input
    has the output's type and name (``RETURN_TYPES``, ``RETURN_NAMES``), and ``input_tip``."""

    CATEGORY = CATEGORY
    ARGS: dict[str, str] = {}
    input_tip = ""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {cls.RETURN_NAMES[0]: (cls.RETURN_TYPES[0], {"tooltip": cls.input_tip})},
                "optional": {"device": DEVICE_INPUT, "dtype": Choice(DTYPES, "auto", DTYPE_TIP)}}

    def _target(self, device, dtype, runs_in=None):
        """(backend, storage dtype, timer) for this run: the DEVICE input's backend (or the default) and
        the dtype widget resolved against it (``model_dtype``; ``runs_in``: the dtype ComfyUI runs the model in)."""
        be = resolve_backend(device, self.DISPLAY)
        return be, model_dtype(be, dtype, self.DISPLAY, runs_in), Timer()

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
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("MODEL", "model", "A clone of the model whose diffusion model runs on the chosen backend."))
    input_tip = "The model from a checkpoint loader (LoRAs and other patches before or after this node are kept)."

    @classmethod
    def INPUT_TYPES(cls):
        types = super().INPUT_TYPES()
        types["optional"]["weights"] = Choice(WEIGHT_FORMATS, "none", WEIGHTS_TIP)
        return types

    def _run(self, model, device=None, dtype="auto", weights="none"):
        node = self.DISPLAY
        wq = model_weights(weights, node)
        if not (hasattr(model, "clone") and hasattr(model, "get_model_object") and
                hasattr(model, "add_wrapper_with_key")):
            raise NodeError(node, "model", type(model).__name__, "must be a MODEL (a ComfyUI model patcher)")
        runs_in = getattr(getattr(model, "model", None), "get_dtype", lambda: None)()
        be, dtype, t = self._target(device, dtype, runs_in)
        try:
            from comfy.patcher_extension import WrappersMP  # noqa: PLC0415 - inside ComfyUI only
            import comfy.utils  # noqa: PLC0415,F401
        except ImportError as exc:
            raise NodeError(node, "model", type(model).__name__, f"needs ComfyUI ({exc})") from exc
        m = model.clone()
        key = "diffusion_model"
        original = m.get_model_object(key)
        if not isinstance(original, torch.nn.Module):
            raise NodeError(node, "model", type(original).__name__, "has no diffusion_model module to compile")
        bridged = ggml_bridge_of(original, runs_in)
        g = guard(original, be, node, "diffusion model", input="model", dtype=dtype, weights=wq,
                  module=None if bridged is None else bridged[0])
        # as comfy_api.torch_helpers.set_torch_compile_wrapper: replace other torch.compile wrappers,
        # swap the compiled module in for each apply_model call, keep the compile kwargs for reference
        m.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY)
        m.add_wrapper_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY,
                               apply_model_wrapper(key, g, None if bridged is None else bridged[1].refresh))
        m.model_options[TORCH_COMPILE_KWARGS] = {"backend": "anydevice",
                                                 "options": {"device": be.name, "dtype": dtype, "weights": wq},
                                                 "mode": None, "fullgraph": False, "dynamic": None}
        m.model_options["anydevice_guards"] = [g]
        to = m.model_options.setdefault("transformer_options", {})
        to["optimized_attention_override"] = pytorch_attention_override
        lines = [f"diffusion model compiled for {be.name} in {dtype}"
                 + (f", linear/conv weights quantized to {wq}" if wq else "")
                 + (", ComfyUI-GGUF's packed weights kept packed" if bridged is not None else "") + " at its first step"]
        return self._out(be, t, m, lines, "compile")


class AnyDeviceVAE(_ModelNode):
    DISPLAY = "VAE on AnyDevice"
    DESCRIPTION = ("Runs a VAE's decoder and encoder on an AnyDevice backend (torch.compile(backend='anydevice')). "
                   "Connect it after ComfyUI's Load VAE (or a checkpoint loader's VAE) and use the output with VAE "
                   "Decode / VAE Encode as usual. The first decode or encode compiles (slow); the weights go to the "
                   "device once. The input VAE is not changed. A VAE the backend cannot take runs as before "
                   "(PyTorch) with a warning in the log.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("VAE", "vae", "A copy of the VAE whose decoder and encoder run on the chosen backend."))
    input_tip = "The VAE from Load VAE or a checkpoint loader."

    def _run(self, vae, device=None, dtype="auto"):
        node = self.DISPLAY
        fsm = getattr(vae, "first_stage_model", None)
        if not isinstance(fsm, torch.nn.Module):
            raise NodeError(node, "vae", type(vae).__name__,
                            "must be a VAE with a model (a checkpoint without a VAE gives an empty one)")
        parts = [p for p in ("decoder", "encoder") if isinstance(getattr(fsm, p, None), torch.nn.Module)]
        if not parts:
            raise NodeError(node, "vae", type(fsm).__name__, "has no decoder or encoder module to compile")
        be, dtype, t = self._target(device, dtype, getattr(vae, "vae_dtype", None))
        new = copy.copy(vae)
        new_fsm = copy.copy(fsm)  # its own object; children and weights are the original's
        attn = 0
        for p in parts:
            orig = getattr(fsm, p)
            tree = share_copy(orig)
            attn += use_pytorch_attention(tree)
            g = guard(orig, be, node, f"VAE {p}", input="vae", module=tree, dtype=dtype, upcast=True)
            object.__setattr__(new_fsm, p, g)  # an attribute of the copy only (shadows the child module)
        new.first_stage_model = new_fsm
        patcher = getattr(vae, "patcher", None)
        if patcher is not None and hasattr(patcher, "clone"):
            new.patcher = patcher.clone()  # the same weights, its own patches (as ComfyUI's clones)
        lines = [f"{' and '.join(parts)} compiled for {be.name} in {dtype} at the first use"]
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
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("UPSCALE_MODEL", "upscale_model", "A copy of the upscale model that runs on the chosen backend."))
    input_tip = "The model from Load Upscale Model."

    def _run(self, upscale_model, device=None, dtype="auto"):
        node = self.DISPLAY
        inner = getattr(upscale_model, "model", None)
        if not isinstance(inner, torch.nn.Module) or isinstance(upscale_model, torch.nn.Module):
            raise NodeError(node, "upscale_model", type(upscale_model).__name__,
                            "must be an UPSCALE_MODEL from Load Upscale Model (a model descriptor with a .model)")
        if isinstance(inner, Guarded):  # already on AnyDevice: compile the original again for this device
            inner = inner.original
        be, dtype, t = self._target(device, dtype, next((p.dtype for p in inner.parameters()), None))
        new = copy.copy(upscale_model)
        g = guard(inner, be, node, "upscale model", input="upscale_model", dtype=dtype, upcast=True)
        if "_model" in vars(new):  # spandrel's ModelBase keeps it as _model behind a read-only property
            new._model = g
        else:
            try:
                new.model = g
            except AttributeError as exc:
                raise NodeError(node, "upscale_model", type(upscale_model).__name__,
                                f"its model cannot be replaced in a copy ({exc})") from exc
        lines = [f"{type(inner).__name__} compiled for {be.name} in {dtype} at each new tile size"]
        return self._out(be, t, new, lines, "compile")


MODEL_NODES = [AnyDeviceModel, AnyDeviceVAE, AnyDeviceUpscaleModel]
