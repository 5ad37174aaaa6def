"""Where a whole model's call goes on a lent GPU: the SD1.5-shaped UNet step compiled for one backend,
one call under torch.profiler (CUPTI sees every CUDA kernel in the process, CuPy's included) and
cProfile, next to PyTorch eager in the same dtype.

    python3 tools/gpu_model_profile.py --backend cuda --dtype float16 --case unet > profile.txt
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import sys
import time
import traceback


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dtype", action="append")
    ap.add_argument("--case", default="unet")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from anydevice.backend import compile as _adc  # noqa: F401 - registers torch.compile(backend="anydevice")
    from anydevice.backend import get_backend
    from anydevice.backend.bench.model import CASES, _activation_and_weights
    be = get_backend(a.backend)
    case = next(c for c in CASES if c.key == a.case)
    for dtype in a.dtype or ["float16"]:
        print(f"===== {case.name(a.quick)} on {a.backend} ({be.device}) in {dtype}", flush=True)
        try:
            torch._dynamo.reset()
            model = case.build(a.quick)
            xs = case.inputs(a.quick, torch.Generator().manual_seed(0))
            act, wq = _activation_and_weights(be, dtype)
            tdev = be.torch_device()
            tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(act)
            eager = copy.deepcopy(model).to(tdev, dtype=tdt)
            xts = [x.to(tdev, dtype=tdt) if tdt is not None and x.is_floating_point() else x.to(tdev) for x in xs]
            compiled = torch.compile(model, backend="anydevice", options={"device": be, "dtype": act, "weights": wq})
            with torch.inference_mode():
                for _ in range(2):
                    compiled(*xs)
                    eager(*xts)
                sync = torch.cuda.synchronize if tdev.type == "cuda" else (lambda: None)
                sync()
                for label, fn in (("ours", lambda: compiled(*xs)), ("torch eager", lambda: (eager(*xts), sync()))):
                    t0 = time.perf_counter()
                    for _ in range(3):
                        fn()
                    wall = (time.perf_counter() - t0) / 3
                    with profile(activities=[ProfilerActivity.CUDA] if tdev.type == "cuda" else [ProfilerActivity.CPU]) as prof:
                        fn()
                    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
                    gpu_us = sum(e.device_time for e in evs) if evs and hasattr(evs[0], "device_time") else \
                        sum(e.cuda_time for e in evs)
                    print(f"--- {label}: wall {wall * 1e3:.2f} ms per call; {len(evs)} GPU kernels/copies, "
                          f"{gpu_us / 1e3:.2f} ms of GPU time", flush=True)
                    try:
                        tab = prof.key_averages().table(sort_by="self_device_time_total", row_limit=a.top)
                    except Exception:  # noqa: BLE001 - older profiler keys
                        tab = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=a.top)
                    print(tab, flush=True)
                pr = cProfile.Profile()
                pr.enable()
                compiled(*xs)
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
                print("--- ours, host (cProfile, one call)\n" + "\n".join(s.getvalue().splitlines()[:a.top + 12]), flush=True)
            del compiled, eager, model
        except Exception:  # noqa: BLE001 - report and go on to the next dtype
            traceback.print_exc()
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
