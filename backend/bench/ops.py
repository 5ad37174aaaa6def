"""``anydevice bench``: GFLOPS per case and the ratio to PyTorch measured in the same run.

This machine's speed drifts (2x over minutes on shared hosts), so only same-run ratios mean
anything: the backend and PyTorch on the same device run in alternating short blocks, and the
ratio is PyTorch's median time over the backend's (> 1: the backend is faster). Each block starts
with one untimed call, so neither side is timed while the other's idle worker threads are still
spinning: libgomp's workers spin after every PyTorch call and, measured here, slowed the next
NumPy GEMM by a third when the two strictly alternated. Inputs are put on the device first
(``to_device``) and results stay there, so transfers are not measured; the first call of each case
is timed on its own and reported as ``first ms`` (kernel builds, PoCL's per-launch-size code
generation, caches warming up).
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..ops.dtypes import FLOATS
from .rows import Row, _sync_torch, _torch_device_for, run_rows, machine_line

log = logging.getLogger("anydevice")


@dataclass
class Case:
    name: str
    op: str               # "matmul" | "conv2d" | "conv_transpose2d"
    a: tuple
    b: tuple
    kw: dict
    flops: float
    per_call_us: bool = False  # report microseconds per call instead of GFLOPS
    gpu_only: bool = False     # only measured on GPU backends (too slow to be useful on a CPU)
    #: any other op: make(rng) -> (list of float32 input arrays, extra kwargs); the op is then called
    #: as be.<op>(*inputs, **kw, **extra) and PyTorch as torch_fn(*tensors, **kw, **extra), where
    #: torch_fn is "F.<name>" (torch.nn.functional) or "torch.<name>"; a and b are then unused
    make: object = None
    torch_fn: str = ""
    #: how the weight (the second input) is stored: float32, float16, bfloat16 or a quantized format of
    #: ops/quant.py (the row's ``dtype``; PyTorch's side is float32 on the CPU, the same values dequantized);
    #: "w8a8": the weight in int8 and the op's W8A8 form (``linear_w8a8``: activations quantized at run time)
    dtype: str = "float32"


def _conv_flops(x, w, stride=1, padding=0, groups=1):
    n, c, h, wd = x
    co, cig, kh, kw = w
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    return 2.0 * n * co * oh * ow * cig * kh * kw


def _convt_flops(x, w):
    n, ci, h, wd = x
    _, cog, kh, kw = w
    return 2.0 * n * ci * h * wd * cog * kh * kw


CASES = [
    Case("matmul 100", "matmul", (100, 100), (100, 100), {}, 2 * 100 ** 3),
    Case("matmul 500", "matmul", (500, 500), (500, 500), {}, 2 * 500 ** 3),
    Case("matmul 1000", "matmul", (1000, 1000), (1000, 1000), {}, 2 * 1000 ** 3),
    Case("matmul 1024", "matmul", (1024, 1024), (1024, 1024), {}, 2 * 1024 ** 3),
    Case("matmul 2000", "matmul", (2000, 2000), (2000, 2000), {}, 2 * 2000 ** 3),
    Case("matmul 2048", "matmul", (2048, 2048), (2048, 2048), {}, 2 * 2048 ** 3),
    Case("matmul 4096", "matmul", (4096, 4096), (4096, 4096), {}, 2 * 4096 ** 3, gpu_only=True),
    Case("conv 32x512x7x7 * 512x512x3x3 p1", "conv2d", (32, 512, 7, 7), (512, 512, 3, 3), {"padding": 1},
         _conv_flops((32, 512, 7, 7), (512, 512, 3, 3), 1, 1)),
    Case("conv 32x16x7x7 * 1x16x3x3 p1", "conv2d", (32, 16, 7, 7), (1, 16, 3, 3), {"padding": 1},
         _conv_flops((32, 16, 7, 7), (1, 16, 3, 3), 1, 1)),
    Case("image conv 1x3x1024^2 * 16x3x3x3 p1", "conv2d", (1, 3, 1024, 1024), (16, 3, 3, 3), {"padding": 1},
         _conv_flops((1, 3, 1024, 1024), (16, 3, 3, 3), 1, 1)),
    Case("image conv 1x16x512^2 * 16x16x3x3 p1", "conv2d", (1, 16, 512, 512), (16, 16, 3, 3), {"padding": 1},
         _conv_flops((1, 16, 512, 512), (16, 16, 3, 3), 1, 1)),
    Case("conv_transpose 1x16x256^2 * 16x8x4x4 s2 p1", "conv_transpose2d", (1, 16, 256, 256), (16, 8, 4, 4),
         {"stride": 2, "padding": 1}, _convt_flops((1, 16, 256, 256), (16, 8, 4, 4))),
    Case("matmul 4x4 (per call)", "matmul", (4, 4), (4, 4), {}, 2 * 4 ** 3, per_call_us=True),
]
#: the seed document's six convs (input 32x512x7x7, weights 512x512xkxk), measured on GPUs
SEED_CONVS = [(3, 1, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0), (1, 2, 0), (7, 2, 3)]
CASES += [
    Case(f"seed conv k{k} s{s} p{p}", "conv2d", (32, 512, 7, 7), (512, 512, k, k), {"stride": s, "padding": p},
         _conv_flops((32, 512, 7, 7), (512, 512, k, k), s, p), gpu_only=True)
    for k, s, p in SEED_CONVS if (k, s, p) != (3, 1, 1)  # k3 s1 p1 is the "conv 32x512" case above
]
# ---- layer-op cases: pooling, interpolate, group_norm ----
CASES += [  # "GFLOPS" of these: the arithmetic per output (a rough rate, the ratio is what counts)
    Case("group_norm 1x512x64x64 g32", "group_norm", (), (), {"num_groups": 32}, 8.0 * 512 * 64 * 64,
         make=lambda rng: ([rng.standard_normal((1, 512, 64, 64), dtype=np.float32)], {}),
         torch_fn="F.group_norm"),
    Case("bilinear 2x upsample 1x128x256x256", "interpolate", (), (),
         {"scale_factor": 2, "mode": "bilinear"}, 6.0 * 128 * 512 * 512,
         make=lambda rng: ([rng.standard_normal((1, 128, 256, 256), dtype=np.float32)], {}),
         torch_fn="F.interpolate"),
    Case("max_pool2d 3x3 s2 p1 32x64x112x112", "max_pool2d", (), (),
         {"kernel_size": 3, "stride": 2, "padding": 1}, 9.0 * 32 * 64 * 56 * 56,
         make=lambda rng: ([rng.standard_normal((32, 64, 112, 112), dtype=np.float32)], {}),
         torch_fn="F.max_pool2d"),
]

# ---- attention cases ----
CASES += [
    Case("attention 1x8x4096x64", "scaled_dot_product_attention", (), (), {}, 4.0 * 8 * 4096 * 4096 * 64,
         make=lambda rng: ([rng.standard_normal((1, 8, 4096, 64)).astype(np.float32) for _ in range(3)], {}),
         torch_fn="F.scaled_dot_product_attention"),
    Case("attention 1x8x4096x40", "scaled_dot_product_attention", (), (), {}, 4.0 * 8 * 4096 * 4096 * 40,
         make=lambda rng: ([rng.standard_normal((1, 8, 4096, 40)).astype(np.float32) for _ in range(3)], {}),
         torch_fn="F.scaled_dot_product_attention"),
]

# ---- big-kernel cases (separable / FFT convolution) ----
def _bigkernel_make(k: int, kind: str):
    """1x3x1024^2 image, depthwise k x k kernel: gaussian (sigma k/6, separable) or random (not)."""
    def make(rng):
        x = rng.standard_normal((1, 3, 1024, 1024)).astype(np.float32)
        if kind == "gaussian":
            t = np.arange(k, dtype=np.float64) - (k - 1) / 2.0
            g = np.exp(-(t * t) / (2.0 * (k / 6.0) ** 2))
            w = np.broadcast_to(np.outer(g, g) / np.outer(g, g).sum(), (3, 1, k, k)).astype(np.float32)
        else:
            w = (rng.standard_normal((3, 1, k, k)) / k).astype(np.float32)
        return [x, w], {"groups": 3}
    return make


CASES += [
    Case(f"depthwise 1x3x1024^2 {kind} k{k} p{k // 2}", "conv2d", (), (), {"padding": k // 2},
         2.0 * 3 * 1024 * 1024 * k * k, make=_bigkernel_make(k, kind), torch_fn="F.conv2d")
    for k in (15, 31, 63) for kind in ("gaussian", "random")
]


# ---- weight storage: a 4096x4096 linear weight stored in each dtype / quantized format ----
#: the formats of the quantized-weight rows (ops/quant.py), after the float32 and float16 rows; "w8a8": the int8
#: weight with dynamic int8 activations (``be.linear_w8a8``, ops/w8a8.py; PyTorch's side: float32 linear)
WEIGHT_DTYPES = ("float32", "float16", "int8", "q8_0", "q4_0", "float8_e4m3fn", "w8a8")


def _linear_make(rows: int, n: int = 4096, k: int = 4096):
    def make(rng):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        return [x, w], {}
    return make


CASES += [
    Case(f"linear 4096x4096 weight, batch {rows}", "linear", (), (), {}, 2.0 * rows * 4096 * 4096,
         make=_linear_make(rows), torch_fn="F.linear", dtype=dt)
    for rows in (77, 4096) for dt in WEIGHT_DTYPES
]


def _stored_weight(be, w: np.ndarray, dtype: str):
    """(the weight as the backend keeps it in ``dtype``, its values as float32 for PyTorch's side)."""
    from ..ops import dtypes, quant
    if dtype == "float32":
        return be.to_device(w), w
    if dtype in dtypes.FLOATS:
        return be.to_device(w, dtype=dtype), dtypes.round_to(w, dtype)
    q = quant.quantize(w, "int8" if dtype == "w8a8" else dtype, op="anydevice bench")
    return be.to_device_quant(q), q.dequantize()


def bench_case(be, case: Case, budget_s: float = 0.6, max_reps: int = 200) -> Row:
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(0)
    if case.make is not None:
        arrays, extra = case.make(rng)
        kw = {**case.kw, **extra}
        mod, _, name = case.torch_fn.partition(".")
        tfn = getattr(F if mod == "F" else torch, name)
    else:
        a = rng.standard_normal(case.a).astype(np.float32)
        b = (rng.standard_normal(case.b) / np.sqrt(np.prod(case.b[1:]) if len(case.b) > 2 else 1)).astype(np.float32)
        arrays, kw = [a, b], case.kw
        tfn = {"matmul": torch.matmul, "conv2d": F.conv2d, "conv_transpose2d": F.conv_transpose2d}[case.op]
    tdev = _torch_device_for(be)
    nargs = [be.to_device(x) for x in arrays]
    if case.dtype != "float32":  # the weight stored in the row's dtype; PyTorch gets its values
        nargs[1], arrays[1] = _stored_weight(be, arrays[1], case.dtype)
    targs = [torch.from_numpy(np.ascontiguousarray(x)).to(tdev) for x in arrays]
    fn = getattr(be, case.op + "_w8a8" if case.dtype == "w8a8" else case.op)

    def run_backend():
        fn(*nargs, **kw)
        be.synchronize()

    def run_torch():
        tfn(*targs, **kw)
        _sync_torch(tdev)

    t0 = time.perf_counter()
    run_backend()
    first = time.perf_counter() - t0
    with torch.no_grad():
        run_torch()
        run_backend()
        # calls per timing sample, so tiny ops are not dominated by timer resolution
        t0 = time.perf_counter()
        run_backend()
        one = max(time.perf_counter() - t0, 1e-7)
        inner = 1 if one > 2e-3 else int(min(1000, max(1, 2e-3 / one)))
        reps = int(min(max_reps, max(3, budget_s / (one * inner))))
        block = 3 if reps >= 9 else 1
        tb_, tt_ = [], []
        for _ in range(-(-reps // block)):
            for call, times in ((run_backend, tb_), (run_torch, tt_)):
                call()  # untimed: lets the other side's spinning threads settle
                for _ in range(block):
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        call()
                    times.append((time.perf_counter() - t0) / inner)
    mb, mt = statistics.median(tb_), statistics.median(tt_)
    return Row(be.name, be.device, case.name, mb * 1e3, mt * 1e3, case.flops / mb / 1e9,
               case.flops / mt / 1e9, mt / mb, first * 1e3, reps, case.per_call_us, case.dtype)


def main(args) -> int:
    """The op rows (``anydevice bench`` without --train / --model)."""
    import torch
    from .. import list_backends
    tf32 = bool(getattr(args, "tf32", False))
    names = args.backend or [i.name for i in list_backends() if i.available]
    cases = [c for c in CASES if not args.case or any(s in c.name for s in args.case)]
    budget = 0.25 if args.quick else 0.8
    print(machine_line())
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; ratio = torch time / backend "
          f"time, same run, alternating blocks (> 1: backend faster); {'TF32' if tf32 else 'FP32'} on both sides")
    def run(be, case):
        if case.gpu_only and _torch_device_for(be).type == "cpu":
            return None
        if case.dtype in FLOATS and case.dtype not in be.caps.storage_dtypes:
            return None
        return bench_case(be, case, budget)

    return run_rows(names, cases, run, getattr(args, "json", None), label=_label)


def _label(case) -> str:
    return case.name if case.dtype == "float32" else f"{case.name} in {case.dtype}"
