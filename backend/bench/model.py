"""``anydevice bench --model``: whole ComfyUI models through ``torch.compile(backend="anydevice")``
against PyTorch eager on the same device, measured in the same run.

Cases (random weights, ``torch.inference_mode`` on both sides, as ComfyUI runs them):

* the SD1.x VAE decoder (``model_zoo.sd_vae_decoder``: ComfyUI's Decoder, SD1.x config) on a
  1x4x64x64 latent -> 1x3x512x512 image;
* the RealESRGAN compact upscaler (``model_zoo.compact_upscaler``: SRVGGNetCompact, 64 features,
  16 convolutions, x4, PReLU) on a 1x3x256x256 image -> 1x3x1024x1024;
* one denoising step of the SD1.5-shaped UNet (``model_zoo.sd15_unet``: ~860 M parameters) on a
  1x4x64x64 latent, a timestep and a 1x77x768 context.

Each case runs in every dtype of ``--dtype`` (default float32 and float16) the backend stores: the model
compiled with ``options={"dtype": ...}`` (weights and activations stored in it, each op computed in
float32). A quantized format of ops/quant.py as ``--dtype`` (int8, q8_0, q4_0, ...) compiles with
``options={"dtype": "float16", "weights": fmt}``: the matmul / conv weights quantized, the rest and the
activations in float16; ``rel_err`` is then the quantization's error against float32, and
``cost_vs_float16`` the row's time over the float16 row's. PyTorch's side is eager float32 on the CPU (its float16 is far too slow there), on a GPU eager
in the same dtype.

The definitions are the pack's own (backend/model_zoo.py), so the bench needs neither ComfyUI nor
spandrel; tests/backend/bench/test_model.py checks them against the real classes where those are installed.

Per backend (``--backend``, repeatable; default: those of cuda, opencl, numpy that are available) and
case (``--case`` filters by name): a fresh model is compiled with ``options={"device": backend}``; the
first call is timed on its own (``first_ms``: dynamo tracing, lowering, weight upload, kernel builds),
then PyTorch eager's first call (``torch_first_ms``), then ``--reps`` (default 3; 2 with ``--quick``)
timed calls of each, interleaved (the order swaps every repeat, so drift hits both sides alike), and
the medians are compared: ``ratio`` = PyTorch's time / ours (> 1: ours faster). Our call takes and
returns CPU tensors, so its time includes the input upload and the output download (what a ComfyUI
node pays); PyTorch's input is already on its device. Where a call is under 2 s, one more untimed call
of each side precedes the timed ones. "GFLOPS" counts the convolutions (torch.utils.flop_counter).

Rows are bench.py's ``Row`` plus: ``torch_first_ms``, ``fallbacks`` (host fallback op calls per
call, from ``compile.report``; ``fallback_ops`` names them), ``uploads`` / ``downloads`` /
``bytes_up`` / ``bytes_down`` per call (weights excluded: they are uploaded once, ``weights_mb``),
``graphs``, ``eager_fallbacks``, ``rel_err`` (normwise relative difference from eager's output),
``dtype``, ``weights_mb`` (device-resident weight bytes), ``peak_mb`` (the device's peak during one call:
the OpenCL pool's live bytes; on NumPy the resident weights plus tracemalloc's peak of the call; None where
neither counts), ``streamed_mb`` (weight bytes uploaded per call: the weights past the device budget,
ANYDEVICE_DEVICE_MB), ``launches`` (kernels launched per call, where the device counts them: the OpenCL
backend; fusion shows there), ``moved_mb`` (MiB the device ops read and wrote per call: each op's device
operands and result, report.COUNT_MOVED), ``replayed`` (the share of calls a recorded device graph served)
and every timed call (``times_ms``, ``torch_times_ms``).
``--quick`` runs narrow models on small inputs (a smoke run: the tests use it), not the real sizes.
"""
from __future__ import annotations

import copy
import gc
import logging
import statistics
import time
from dataclasses import dataclass, field

from .rows import Row, _sync_torch, _torch_device_for, machine_line

log = logging.getLogger("anydevice")

#: the backends measured when ``--backend`` is not given (those available, in this order)
DEFAULT_BACKENDS = ("cuda", "opencl", "numpy")


@dataclass
class ModelCase:
    key: str            # short name ("vae", "upscaler")
    title: str          # what the row's "case" starts with
    build: object       # quick: bool -> torch module (fresh random weights)
    shape: tuple        # the real input shape
    quick_shape: tuple  # --quick
    uniform: bool = False  # input in [0, 1) (an image) instead of standard normal (a latent)
    #: the other inputs after the first: (quick, generator) -> tuple of tensors
    extra: object = None

    def inputs(self, quick: bool, gen) -> tuple:
        import torch
        shape = self.quick_shape if quick else self.shape
        x = torch.rand(shape, generator=gen) if self.uniform else torch.randn(shape, generator=gen)
        return (x,) + (tuple(self.extra(quick, gen)) if self.extra else ())

    def name(self, quick: bool) -> str:
        s = self.quick_shape if quick else self.shape
        return f"{self.title} {'x'.join(map(str, s))}" + (" (quick)" if quick else "")


def _vae(quick: bool):
    from .model_zoo import sd_vae_decoder
    return sd_vae_decoder(seed=0, ch=32) if quick else sd_vae_decoder(seed=0)


def _upscaler(quick: bool):
    from .model_zoo import compact_upscaler
    return compact_upscaler(seed=0, num_feat=16, num_conv=4) if quick else compact_upscaler(seed=0)


def _unet(quick: bool):
    from .model_zoo import sd15_unet
    return sd15_unet(seed=0, model_channels=32, context_dim=32, num_heads=2) if quick else sd15_unet(seed=0)


def _unet_extra(quick: bool, gen):
    """A timestep and the text context (77 tokens, 768 wide; --quick: 8 x 32)."""
    import torch
    return torch.tensor([500.0]), torch.randn((1, 8, 32) if quick else (1, 77, 768), generator=gen)


CASES = [
    ModelCase("vae", "SD1.x VAE decoder", _vae, (1, 4, 64, 64), (1, 4, 8, 8)),
    ModelCase("upscaler", "compact upscaler x4", _upscaler, (1, 3, 256, 256), (1, 3, 16, 16), uniform=True),
    ModelCase("unet", "SD1.5 UNet step", _unet, (1, 4, 64, 64), (1, 4, 8, 8), extra=_unet_extra),
]
#: the dtypes measured when ``--dtype`` is not given (those the backend stores)
DEFAULT_DTYPES = ("float32", "float16")


@dataclass
class ModelRow(Row):
    torch_first_ms: float = 0.0
    fallbacks: float = 0.0          # host fallback op calls per call
    fallback_ops: dict = field(default_factory=dict)
    uploads: float = 0.0            # per call (the input; weights excluded)
    downloads: float = 0.0          # per call (the output)
    bytes_up: float = 0.0           # per call
    bytes_down: float = 0.0         # per call
    graphs: int = 0
    eager_fallbacks: int = 0
    weights_mb: float = 0.0         # device-resident weight bytes (uploaded once, at the first call)
    peak_mb: float | None = None    # the device's peak during one call (None: the device does not count)
    streamed_mb: float = 0.0        # weight bytes uploaded per call (past the device budget)
    launches: float | None = None   # kernels launched per call (None: the device does not count)
    moved_mb: float = 0.0           # MiB the device ops read and wrote per call (their operands and results)
    replayed: float = 0.0           # share of the calls served by a recorded device graph (compile/replay.py)
    rel_err: float = 0.0            # ours vs PyTorch eager, normwise
    times_ms: list = field(default_factory=list)        # every timed call, ours
    torch_times_ms: list = field(default_factory=list)  # and PyTorch's


def model_flops(model, inputs) -> float:
    """FLOPs of one forward pass (convolutions, matmuls), counted on fake tensors (nothing runs)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    try:
        fc = FlopCounterMode(display=False)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, fc, torch.no_grad():
            model(*[mode.from_tensor(t) for t in inputs])
        return float(fc.get_total_flops())
    except Exception as exc:  # noqa: BLE001 - only the GFLOPS column needs it
        log.warning("bench --model: could not count the FLOPs (%s)", exc)
        return 0.0


def _per_call(after: dict, before: dict) -> dict:
    calls = max(after["calls"] - before["calls"], 1)
    ta, tb = after["transfers"], before["transfers"]
    fb = {k: (v - before["fallbacks"].get(k, 0)) / calls for k, v in after["fallbacks"].items()
          if v - before["fallbacks"].get(k, 0)}
    return {"fallbacks": sum(fb.values()), "fallback_ops": fb,
            **{k: (ta[k] - tb[k]) / calls for k in ("uploads", "downloads", "bytes_up", "bytes_down", "bytes_streamed")}}


def _peak_mb(be, call, weights_bytes: int):
    """The device's peak during one ``call()``, MiB: the backend's own count (Device._memory_peak: the
    OpenCL pool), else on NumPy the resident weights plus tracemalloc's peak of the call; None otherwise."""
    if be._memory_peak(reset=True) is not None:
        call()
        return be._memory_peak() / 2**20
    if be.name != "numpy":
        return None
    import tracemalloc
    tracemalloc.start()
    try:
        call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (weights_bytes + peak) / 2**20


def bench_model_case(be, case: ModelCase, quick: bool = False, reps: int = 3, dtype: str = "float32") -> ModelRow:
    """One row: ``case`` compiled for ``be`` in ``dtype`` against PyTorch eager on the backend's torch device
    (float32 on the CPU, ``dtype`` on a GPU)."""
    import torch
    from .. import compile as adc
    torch._dynamo.reset()
    model = case.build(quick)
    gen = torch.Generator().manual_seed(0)
    xs = case.inputs(quick, gen)
    tdev = _torch_device_for(be)
    # a quantized format (ops/quant.py): the matmul / conv weights in it, the rest and the activations in
    # float16 (float32 where the backend stores no half)
    act, wq = _activation_and_weights(be, dtype)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(act) if tdev.type != "cpu" else None
    eager = model if tdev.type == "cpu" else copy.deepcopy(model).to(tdev, dtype=tdt)
    xts = [x.to(tdev, dtype=tdt) if tdt is not None and x.is_floating_point() else x.to(tdev) for x in xs]
    flops = model_flops(model, xs)
    compiled = torch.compile(model, backend="anydevice", options={"device": be, "dtype": act, "weights": wq})
    weights = adc.Weights.of(be, act, wq)
    weights.clear()

    def ours():
        return compiled(*xs)

    def theirs():
        y = eager(*xts)
        _sync_torch(tdev)
        return y

    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            y = ours()
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            ye = theirs()
            torch_first = time.perf_counter() - t0
            ref = ye.detach().double().cpu()
            rel_err = float((y.double() - ref).norm() / max(float(ref.norm()), 1e-30))
            del y, ye, ref
            weights_mb = adc.report(compiled)["weights_bytes"] / 2**20
            peak = _peak_mb(be, ours, int(weights_mb * 2**20))
            from ..compile.report import COUNT_MOVED
            m_before = adc.report(compiled)["moved"]
            COUNT_MOVED[0] = True  # this call counts the bytes its ops move (untimed: a few us an op)
            try:
                t0 = time.perf_counter()
                ours()
                one = time.perf_counter() - t0
            finally:
                COUNT_MOVED[0] = False
            moved_mb = (adc.report(compiled)["moved"] - m_before) / 2**20
            r_before = adc.report(compiled)
            l_before = be.kernel_launches()
            if one < 2.0:  # cheap enough: settle both sides once more
                theirs()
                ours()
            tb, tt = [], []
            for i in range(max(1, reps)):
                order = ((ours, tb), (theirs, tt)) if i % 2 == 0 else ((theirs, tt), (ours, tb))
                for call, times in order:
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
            rep = adc.report(compiled)
            l_after = be.kernel_launches()
        per = _per_call(rep, r_before)
        ncalls = max(rep["calls"] - r_before["calls"], 1)
        per["moved_mb"] = moved_mb
        per["replayed"] = (rep["replayed"] - r_before["replayed"]) / ncalls
        launches = None if l_before is None else (l_after - l_before) / ncalls
        mb, mt = statistics.median(tb), statistics.median(tt)
        return ModelRow(be.name, be.device, case.name(quick), mb * 1e3, mt * 1e3, flops / mb / 1e9,
                        flops / mt / 1e9, mt / mb, first * 1e3, len(tb), False, dtype,
                        torch_first_ms=torch_first * 1e3, graphs=int(rep["graphs"]),
                        eager_fallbacks=int(rep["eager_fallbacks"]), weights_mb=weights_mb, peak_mb=peak,
                        streamed_mb=per.pop("bytes_streamed") / 2**20, launches=launches,
                        rel_err=rel_err, times_ms=[t * 1e3 for t in tb], torch_times_ms=[t * 1e3 for t in tt],
                        **per)
    finally:
        del compiled, eager, model
        torch._dynamo.reset()
        gc.collect()
        try:
            weights.clear()
        except Exception:  # noqa: BLE001 - freeing is best effort
            pass


def _activation_and_weights(be, dtype: str) -> tuple:
    """(activation dtype, quantized weight format or None) of a row's ``dtype``."""
    from ..ops.quant import FORMATS
    if dtype in FORMATS:
        return ("float16" if "float16" in be.caps.storage_dtypes else "float32"), dtype
    return dtype, None


def format_extra(r: ModelRow) -> str:
    fb = f"{r.fallbacks:g}" + (f" ({', '.join(sorted(r.fallback_ops))})" if r.fallback_ops else "")
    return (f"    first call {r.first_ms / 1e3:.2f} s (torch {r.torch_first_ms / 1e3:.2f} s); host fallbacks/call {fb}; "
            f"uploads/call {r.uploads:g} ({r.bytes_up / 2 ** 20:.2f} MiB), downloads/call {r.downloads:g} "
            f"({r.bytes_down / 2 ** 20:.2f} MiB); graphs {r.graphs}; {r.dtype}: weights {r.weights_mb:.1f} MiB, "
            f"peak {'-' if r.peak_mb is None else f'{r.peak_mb:.1f} MiB'}, streamed {r.streamed_mb:.1f} MiB/call; "
            f"kernels/call {'-' if r.launches is None else f'{r.launches:g}'}; moved {r.moved_mb:.0f} MiB/call"
            f"{f' (replayed {r.replayed:.0%})' if r.replayed else ''}; "
            f"rel. err vs eager {r.rel_err:.1e}\n"
            f"    calls (ms): ours {' '.join(f'{t:.0f}' for t in r.times_ms)}; "
            f"torch {' '.join(f'{t:.0f}' for t in r.torch_times_ms)}")


def add_arguments(p) -> None:
    """``--model`` and ``--reps`` for ``anydevice bench`` (bench.add_arguments calls this)."""
    p.add_argument("--model", action="store_true",
                   help="time whole models compiled with torch.compile(backend='anydevice') against "
                        "PyTorch eager: the SD1.x VAE decoder (64x64 latent) and the compact upscaler "
                        "(256x256 image); --quick: narrow models on small inputs")
    p.add_argument("--dtype", action="append", default=None, metavar="DTYPE",
                   help="--model: the dtypes to store each model in (float32, float16, bfloat16, or a quantized "
                        "weight format: int8, q8_0, q4_0, q4_1, q5_0, q5_1, float8_e4m3fn, float8_e5m2, with "
                        "float16 activations; repeatable or comma-separated; default float32 and float16)")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="--model: timed calls per side (default 3, --quick 2); the medians are compared")


def _check_dtype(d: str) -> str:
    from ..ops import dtypes as _dt
    from ..ops.quant import FORMATS
    return d if d in FORMATS else _dt.check("anydevice bench", "--dtype", d)


def default_backends() -> list[str]:
    from .. import list_backends
    avail = {i.name for i in list_backends() if i.available}
    return [n for n in DEFAULT_BACKENDS if n in avail]


def main(args) -> int:
    """The ``--model`` rows for every backend of ``--backend`` (default :func:`default_backends`),
    cases filtered by ``--case`` (matched against the row names and "vae"/"upscaler")."""
    import torch
    quick = bool(getattr(args, "quick", False))
    reps = getattr(args, "reps", None) or (2 if quick else 3)
    names = getattr(args, "backend", None) or default_backends()
    sel = getattr(args, "case", None)
    cases = [c for c in CASES if not sel or any(s in c.name(quick) or s == c.key for s in sel)]
    asked = [_check_dtype(d.strip()) for a in (getattr(args, "dtype", None) or [",".join(DEFAULT_DTYPES)])
             for d in a.split(",") if d.strip()]
    runs = [(c, d) for c in cases for d in dict.fromkeys(asked)]
    print(machine_line())
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; whole models, torch.compile("
          f"backend='anydevice') vs PyTorch eager (float32 on the CPU), inference mode; ratio = torch time / ours, same run, "
          f"interleaved, median of {reps} (> 1: ours faster); our time includes the input upload and the "
          f"output download")
    from .rows import run_rows
    def run(be, cd):
        case, dtype = cd
        if _activation_and_weights(be, dtype)[0] not in be.caps.storage_dtypes:
            print(f"  {case.name(quick)} in {dtype}: skipped ({be.name} stores {', '.join(sorted(be.caps.storage_dtypes))})")
            return None
        return bench_model_case(be, case, quick, reps, dtype)
    return run_rows(names, runs, run, getattr(args, "json", None),
                    label=lambda cd: f"{cd[0].name(quick)} in {cd[1]}", extra=format_extra)
