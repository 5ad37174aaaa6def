"""Per-call times of a backend's conv entry points inside a real `anydevice bench --train` step.

    python tools/profile_convs.py [BACKEND] [CASE] [STEPS]

Wraps the backend's ``_conv2d``, ``_conv2d_input_grad`` and ``_conv2d_weight_grad`` (no synchronisation:
use it on host backends, numpy, or the OpenCL CPU family where the step is not replayed), runs two
untimed steps, then prints the step's median time and each (entry point, input shape, second operand's
shape)'s calls per step and median milliseconds, and their total. Compare with the same convs timed alone
(tools/bench_ab.py) to see what the step's context costs (docs/notes/trainspeed.md, eighth session).
"""
from __future__ import annotations

import collections
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pack import load_pack  # noqa: E402


def main(argv) -> int:
    bname = argv[0] if argv else "numpy"
    cname = argv[1] if len(argv) > 1 else "denoiser"
    steps = int(argv[2]) if len(argv) > 2 else 5
    load_pack(str(Path(__file__).resolve().parent.parent))
    import numpy as np
    bk = importlib.import_module("anydevice.backend")
    bt = importlib.import_module("anydevice.backend.bench.train")
    be = bk.get_backend(bname)
    rec = collections.defaultdict(list)
    for name in ("_conv2d", "_conv2d_input_grad", "_conv2d_weight_grad"):
        fn = getattr(be, name)

        def timed(*a, _fn=fn, _name=name, **k):
            t0 = time.perf_counter()
            r = _fn(*a, **k)
            rec[(_name, tuple(a[0].shape), tuple(getattr(a[1], "shape", ())))].append(time.perf_counter() - t0)
            return r
        setattr(be, name, timed)
    case = next(c for c in bt.cases() if cname in c.name)
    net = case.network.initialized(case.in_shape, seed=0)
    x, t = bt._data(case, np.random.default_rng(0))
    step = bt._our_step(be, case, net, x, t)
    step()
    step()
    rec.clear()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(f"{bname} {case.name}: step median {statistics.median(times) * 1e3:.1f} ms")
    total = 0.0
    for key, v in rec.items():
        per_step = len(v) // steps
        med = statistics.median(v) * 1e3
        total += med * per_step
        print(f"  {key[0]:22s} {str(key[1]):18s} {str(key[2]):16s} x{per_step}  {med:7.2f} ms")
    print(f"  convs per step {total:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
