"""torch.compile on the pack's backends: ``torch.compile(model, backend="anydevice")``.

    from anydevice.backend import compile as adc
    adc.register()      # the dynamo backend "anydevice" (also done when this module is imported)
    m = torch.compile(module, backend="anydevice", options={"device": "opencl"})
    f = adc.compile_module(module, device="opencl")    # the same without dynamo
    adc.report(m)       # {"fallbacks": {aten op: count}, "transfers": {...}, "graphs": n, ...}
    adc.last_report()   # everything since reset_report()

The dynamo backend hands the captured graph to ``aot_module_simplified`` with PyTorch's core ATen
decompositions (less the ops the lowering table takes whole); the ATen graph it produces is run by
``lowering.Lowered`` on the chosen backend: every intermediate a native device array, inputs uploaded
once per call, weights once per model (``Weights``), outputs downloaded once. Ops outside the table
(aten_ops.LOWERINGS) run on the host through PyTorch, counted in the report.

Options (``options={...}`` of torch.compile, keyword arguments of compile_module):
  device   a backend name ("opencl", "numpy", "opencl:1", "auto") or a Backend instance;
           default: ANYDEVICE_BACKEND, else the automatic choice
  dynamic  compile_module only: accepted for symmetry; compile_module traces once per input
           signature (shapes, dtypes), so every size is exact and none falls back to eager.
           torch.compile's own ``dynamic=`` decides dynamo's shapes.
  dtype    float16 / bfloat16 (None: float32): weights, inputs and results stored on the device in it
  weights  a quantized format of ops/quant.py (int8, q8_0, q4_0, q4_1, q5_0, q5_1, float8_e4m3fn,
           float8_e5m2; None: as ``dtype``): the weights that only matmuls, linears and convs read are
           quantized on load and kept packed on a device that reads the format (its kernels decode them)

A model the backend cannot take (an op with no fallback, complex or float64 compute) raises
``AnyDeviceCompileError`` from the compiled callable; the original module is untouched and keeps
working. An op that fails on the device (a result over ANYDEVICE_MAX_TENSOR_MB) raises
``AnyDeviceRunError`` naming the ATen op and carrying the contract's message (with the size asked).
"""
from __future__ import annotations

import logging

from ..system.errors import AnyDeviceError
from . import aten_ops, report as _report
from .lowering import GRAPHS, AnyDeviceCompileError, AnyDeviceRunError, Lowered, Weights, version_of

__all__ = ["register", "compile_module", "report", "last_report", "reset_report", "Weights", "Lowered",
           "AnyDeviceCompileError", "AnyDeviceRunError", "LOWERINGS", "BACKEND_NAME", "backend_fn",
           "version_of"]

log = logging.getLogger("anydevice")
BACKEND_NAME = "anydevice"
LOWERINGS = aten_ops.LOWERINGS
OPTIONS = ("device", "dynamic", "dtype", "weights")


def _resolve(device):
    from ..system import registry
    from ..ops.contract import Backend
    if isinstance(device, Backend):
        return device
    if device is not None and not isinstance(device, str):
        raise AnyDeviceError("torch.compile(backend='anydevice')", "device", device,
                             "must be a backend name such as 'opencl' or a Backend")
    return registry.get_backend(device)


def _options(options) -> dict:
    opts = dict(options or {})
    for k in opts:
        if k not in OPTIONS:
            raise AnyDeviceError("torch.compile(backend='anydevice')", "options", k,
                                 f"unknown option; known: {', '.join(OPTIONS)}")
    opts.setdefault("device", None)
    opts.setdefault("dynamic", None)
    if opts.get("dtype") is not None:
        from ..ops import dtypes
        opts["dtype"] = dtypes.check("torch.compile(backend='anydevice')", "dtype", opts["dtype"])
    opts.setdefault("dtype", None)
    w = opts.get("weights")
    if w in (None, "none", "", "float32") or w == opts["dtype"]:
        opts["weights"] = None
    else:
        from ..ops.quant import FORMATS
        if w not in FORMATS:
            raise AnyDeviceError("torch.compile(backend='anydevice')", "weights", w,
                                 f"is not a quantized format: one of {', '.join(FORMATS)} (or None)")
    return opts


# ---- the dynamo backend --------------------------------------------------------------------------
def _static_indices(gm, example_inputs) -> list[int]:
    """Which of dynamo's graph inputs are parameters or buffers (the weights)."""
    import torch
    out = []
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, ex in enumerate(example_inputs):
        if isinstance(ex, torch.nn.Parameter):
            out.append(i)
            continue
        ga = phs[i].meta.get("grapharg") if i < len(phs) else None
        src = getattr(ga, "source", None)
        name = ""
        try:
            name = src.name() if callable(getattr(src, "name", None)) else str(src)
        except Exception:  # noqa: BLE001 - a source we cannot name is not a weight
            name = ""
        if "_parameters" in name or "_buffers" in name or type(src).__name__ in (
                "ParamBufferSource", "UnspecializedParamBufferSource"):
            out.append(i)
    return out


def _code_key(code) -> tuple:
    """A code object's key in the report: file, name and first line (two classes' ``forward`` in one
    file are two keys)."""
    return (code.co_filename, code.co_name, code.co_firstlineno)


def _current_codes() -> set:
    """The code object dynamo compiles now (report attribution of modules without weights)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        code = tx.f_code
        return {_code_key(code)}
    except Exception:  # noqa: BLE001 - only for the report
        return set()


def backend_fn(gm, example_inputs, options=None, **kwargs):
    """The dynamo backend: aot_autograd to an ATen graph, then ``Lowered`` on the chosen device."""
    from torch._functorch.aot_autograd import aot_module_simplified
    try:
        opts = _options(options)
        be = _resolve(opts["device"])
    except AnyDeviceError as exc:  # raised by the compiled callable, not wrapped by dynamo
        err = exc

        def refuse(*args, **kwargs):
            raise err
        return refuse
    _report.watch_recompile_limit()
    static = _static_indices(gm, example_inputs)
    owner_ids = [example_inputs[i] for i in static]
    codes = _current_codes()
    n_lifted = len(list(gm.parameters())) + len(list(gm.buffers()))
    owner_ids += list(gm.parameters()) + list(gm.buffers())
    statics = set(range(n_lifted)) | {n_lifted + i for i in static}

    def fw(fgm, ex):
        return Lowered(fgm, be, statics, owner_ids=owner_ids, codes=codes, name="dynamo", dtype=opts["dtype"],
                       weights=opts["weights"])

    def bw(fgm, ex):  # backward graphs run the same way (their ops mostly on the host)
        return Lowered(fgm, be, (), owner_ids=owner_ids, codes=codes, name="dynamo-backward")

    with aten_ops.keep_whole():
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw, bw_compiler=bw,
                                     decompositions=aten_ops.decompositions())


def register() -> None:
    """Register the dynamo backend "anydevice" (idempotent)."""
    from torch._dynamo.backends import registry as reg
    from . import quant_ops
    quant_ops.register()
    if BACKEND_NAME in reg._COMPILER_FNS or BACKEND_NAME in getattr(reg, "_BACKENDS", {}):
        return
    reg.register_backend(name=BACKEND_NAME)(backend_fn)


# ---- without dynamo ----------------------------------------------------------------------------------
class CompiledModule:
    """``compile_module``'s result: call it as the module; one traced graph per input signature."""

    def __init__(self, module, be, dynamic=None, dtype=None, weights=None):
        self.module, self.be, self.dynamic, self.dtype, self.weights = module, be, dynamic, dtype, weights
        self._graphs: dict = {}

    def _weights(self):
        named = dict(self.module.named_parameters(remove_duplicate=False))
        named.update(dict(self.module.named_buffers(remove_duplicate=False)))
        return list(named.keys()), list(named.values())

    def __call__(self, *args, **kwargs):
        import torch
        from torch.utils import _pytree as pytree
        flat, spec = pytree.tree_flatten((args, kwargs))
        names, params = self._weights()
        is_t = [isinstance(a, torch.Tensor) for a in flat]
        sig = (spec, tuple((tuple(a.shape), a.dtype, a.device.type) if t else ("py", repr(a))
                           for a, t in zip(flat, is_t)),
               tuple((tuple(p.shape), p.dtype) for p in params), tuple(names))
        entry = self._graphs.get(sig)
        if entry is None:
            entry = self._graphs[sig] = self._trace(names, params, flat, spec, is_t)
        lowered, out_spec = entry
        outs = lowered(list(params) + [a for a, t in zip(flat, is_t) if t])
        return pytree.tree_unflatten(outs, out_spec)

    def _trace(self, names, params, flat, spec, is_t):
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.func import functional_call, functionalize
        from torch.utils import _pytree as pytree
        n = len(params)
        tensors = [a for a, t in zip(flat, is_t) if t]
        out_spec = []

        def fn(*xs):
            p = dict(zip(names, xs[:n]))
            it = iter(xs[n:])
            full = [next(it) if t else a for a, t in zip(flat, is_t)]
            a, kw = pytree.tree_unflatten(full, spec)
            out = functional_call(self.module, p, tuple(a), kw)
            leaves, s = pytree.tree_flatten(out)
            out_spec.append(s)
            return leaves

        with torch.no_grad(), aten_ops.keep_whole():
            gm = make_fx(functionalize(fn, remove="mutations"), decomposition_table=aten_ops.decompositions(),
                         tracing_mode="fake")(*params, *tensors)
        lowered = Lowered(gm, self.be, range(n), owner_ids=params, name="compile_module", dtype=self.dtype,
                          weights=self.weights)
        return lowered, out_spec[-1]

    @property
    def graphs(self) -> list:
        return [g for g, _ in self._graphs.values()]


def compile_module(module, device=None, dynamic=None, dtype=None, weights=None):
    """``module`` run on the AnyDevice backend ``device`` without dynamo (make_fx traces it once per
    input signature). Returns a callable with the module's forward signature. ``dtype`` (float16 /
    bfloat16; None: float32) is the dtype weights and activations are stored in on the device;
    ``weights`` (a format of ops/quant.py: int8, q8_0, q4_0, ...; None: as ``dtype``) quantizes the
    weights of matmuls, linears and convs on load (kept packed on devices that read the format)."""
    opts = _options({"device": device, "dynamic": dynamic, "dtype": dtype, "weights": weights})
    return CompiledModule(module, _resolve(device), dynamic, opts["dtype"], opts["weights"])


# ---- reports -------------------------------------------------------------------------------------------
def _compile_options(obj):
    """The ``options`` torch.compile was given for ``obj`` (None where they cannot be found)."""
    o = getattr(getattr(obj, "dynamo_ctx", None), "callback", None)
    for _ in range(8):
        if o is None:
            return None
        kw = getattr(o, "kwargs", None)
        if isinstance(kw, dict) and "options" in kw:
            return kw["options"]
        o = getattr(o, "_torchdynamo_orig_backend", None) or getattr(o, "_compiler_fn", None) or \
            getattr(o, "compiler_fn", None)
    return None


def _graphs_of(obj) -> list:
    graphs = _graphs_of_any(obj)
    opts = _compile_options(obj)
    if opts is not None and "device" in opts:  # the same module compiled for two devices
        try:
            be = _resolve(opts["device"])
        except AnyDeviceError:
            return graphs
        graphs = [g for g in graphs if g.be is be]
    return graphs


def _graphs_of_any(obj) -> list:
    import torch
    if isinstance(obj, CompiledModule):
        return obj.graphs
    if isinstance(obj, Lowered):
        return [obj]
    live = [g for g in (r() for r in GRAPHS) if g is not None and g.name.startswith("dynamo")]
    mod = getattr(obj, "_orig_mod", obj)
    if isinstance(mod, torch.nn.Module):
        ids = {id(p) for p in mod.parameters()} | {id(b) for b in mod.buffers()}
        key = _code_key(type(mod).forward.__code__)
        return [g for g in live if (g.owner_ids & ids) or (not g.owner_ids and key in g.codes)]
    fn = getattr(obj, "_torchdynamo_orig_callable", obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    key = _code_key(code)
    return [g for g in live if key in g.codes]


def report(obj) -> dict:
    """What ``obj`` (a torch.compile'd module or function, or compile_module's result) did: host
    fallbacks per ATen op, transfers, graphs compiled, graph calls, folded constant ops, and the
    eager fallbacks (dynamo's recompile limit hit) seen since reset_report()."""
    graphs = _graphs_of(obj)
    out = _report.merge([g.stats for g in graphs])
    codes = set().union(*(g.codes for g in graphs)) if graphs else set()
    own = getattr(getattr(obj, "_orig_mod", None), "forward", None) or getattr(obj, "_torchdynamo_orig_callable", obj)
    code = getattr(own, "__code__", None)
    if code is not None:
        codes.add(_code_key(code))
    out["eager_fallbacks"] = sum(_report.LIMIT_HITS.get(k, 0) for k in codes)
    # device memory: the weights resident in the caches these graphs use (a cache is per backend and dtype,
    # shared with other models on it) and the constants they folded from weights, the bytes streamed per call are transfers["bytes_streamed"], and the
    # device's peak since it was last reset (None where the device does not count)
    caches = {id(g.weights): g.weights for g in graphs}
    out["weights_bytes"] = sum(w.nbytes for w in caches.values()) + sum(g.folded_bytes for g in graphs)
    peaks = [p for p in ({id(g.be): g.be for g in graphs}[k]._memory_peak() for k in {id(g.be) for g in graphs})
             if p is not None]
    out["device_peak_bytes"] = max(peaks) if peaks else None
    return out


def last_report() -> dict:
    """Everything compiled and run since reset_report()."""
    return _report.GLOBAL.as_dict()


def reset_report() -> None:
    _report.GLOBAL.reset()


try:
    register()
except ImportError:  # no torch: the module imports, torch.compile needs torch anyway
    pass
