"""What every ``anydevice bench`` mode shares: the row, PyTorch's device and sync for a backend,
the FP32/TF32 switch, the table and the loop over backends and cases."""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

log = logging.getLogger("anydevice")


@dataclass
class Row:
    backend: str
    device: str
    case: str
    ms: float
    torch_ms: float
    gflops: float
    torch_gflops: float
    ratio: float          # torch time / backend time (> 1: backend faster)
    first_ms: float
    reps: int
    per_call_us: bool
    #: the dtype the row computes in or stores its weights as (float32, float16, bfloat16; the quantized
    #: formats name theirs); not part of ``case``
    dtype: str = "float32"
    #: this row's time over the float16 row of the same backend and case (set by ``run_rows`` where that
    #: row was measured in the same run: a quantized weight's cost against half precision)
    cost_vs_float16: float | None = None


def machine_line() -> str:
    """What the numbers were measured on: the CPU's model, the vector ISA PyTorch's kernels use on it
    (AVX2, AVX512, ...; the pack's CPU kernels are tuned by it) and the cores."""
    import os
    import platform
    import torch
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    try:
        isa = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older PyTorch
        isa = "unknown"
    return f"machine: {model}; ISA {isa}; {os.cpu_count()} CPUs"


def _torch_device_for(be):
    """The torch device PyTorch's side runs on for ``be`` (the device interface says which)."""
    return be.torch_device()


def _sync_torch(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def format_rows(rows) -> str:
    head = (f"{'backend':<9}{'case':<44}{'dtype':<14}{'ms':>9}{'torch ms':>10}{'GFLOPS':>9}{'torch':>9}{'ratio':>7}"
            f"{'first ms':>10}{'x f16':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.per_call_us:
            lines.append(f"{r.backend:<9}{r.case:<44}{r.dtype:<14}{r.ms * 1e3:>7.1f}us{r.torch_ms * 1e3:>8.1f}us"
                         f"{'':>9}{'':>9}{r.ratio:>7.2f}{r.first_ms:>10.1f}{_vs16(r)}")
        else:
            lines.append(f"{r.backend:<9}{r.case:<44}{r.dtype:<14}{r.ms:>9.2f}{r.torch_ms:>10.2f}{r.gflops:>9.1f}"
                         f"{r.torch_gflops:>9.1f}{r.ratio:>7.2f}{r.first_ms:>10.1f}{_vs16(r)}")
    return "\n".join(lines)


def _vs16(r) -> str:
    return f"{r.cost_vs_float16:>7.2f}" if r.cost_vs_float16 is not None else f"{'':>7}"


def _cost_vs_float16(rows) -> None:
    """Each row's time over the float16 row of the same backend and case, where one was measured."""
    half = {(r.backend, r.case): r.ms for r in rows if r.dtype == "float16"}
    for r in rows:
        h = half.get((r.backend, r.case))
        if h and r.dtype != "float16":
            r.cost_vs_float16 = r.ms / h


def set_tf32(on: bool) -> None:
    """FP32 against FP32 (default) or TF32 against TF32: PyTorch's switches and the pack's own."""
    import os
    import torch
    from ..devices.torch.backend import switches_mutable
    os.environ["ANYDEVICE_ALLOW_TF32"] = "1" if on else "0"
    with switches_mutable(torch.backends):
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def run_rows(names, cases, run, json_path=None, label=None, extra=None) -> int:
    """The bench loop every mode shares: for each backend named, ``run(be, case)`` for each case
    (a row, or None to skip it), a failing case reported (by ``label(case)``, default its name) and
    the others measured; each row printed as it comes (and ``extra(row)``'s line under it), then
    the table (and the JSON file). Returns the exit status: 1 if a case failed."""
    from .. import get_backend
    rows, failures = [], 0
    for name in names:
        be = get_backend(name)
        print(f"\n{be.name}: {be.device}", flush=True)
        for case in cases:
            try:
                row = run(be, case)
            except Exception as exc:  # report and go on: one failing case must not hide the others
                log.error("%s / %s failed: %s", name, label(case) if label else case.name, exc)
                failures += 1
                continue
            if row is None:
                continue
            rows.append(row)
            print(format_rows([row]).splitlines()[-1], flush=True)
            if extra:
                print(extra(row), flush=True)
    _cost_vs_float16(rows)
    print("\n" + format_rows(rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
        print(f"wrote {json_path}")
    return 1 if failures else 0
