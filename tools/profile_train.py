"""Per-phase / per-op profile of one `anydevice bench --train` step (docs/notes/trainspeed.md).

    python tools/profile_train.py [ROOT] [BACKENDS] [CASE] [STEPS]

ROOT (default: this checkout) is loaded as the package ``anydevice``; every op's forward
(autograd ``apply``), every backward rule, the conv-gradient helpers and the optimizer update are
timed with the backend synchronised before and after (so the sums are a little above a plain
step). Prints the phase totals and the per-op medians over STEPS steps.
"""
from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pack import load_pack as load  # noqa: E402


def main(argv):
    root = argv[0] if argv else str(Path(__file__).resolve().parent.parent)
    backends = (argv[1] if len(argv) > 1 else "opencl,numpy").split(",")
    cname = argv[2] if len(argv) > 2 else "denoiser"
    steps = int(argv[3]) if len(argv) > 3 else 5
    load(root)
    import importlib
    import numpy as np
    bk = importlib.import_module("anydevice.backend")
    bt = importlib.import_module("anydevice.backend.bench.train")
    tape = importlib.import_module("anydevice.backend.learn.autograd.tape")
    convgrad = importlib.import_module("anydevice.backend.ops.convgrad")
    optim = importlib.import_module("anydevice.backend.learn.optim")
    case = next(c for c in bt.cases() if cname in c.name)
    for bname in backends:
        be = bk.get_backend(bname)
        rec = collections.defaultdict(list)   # key -> per-step list of totals
        cur = collections.defaultdict(float)

        def timed(key, fn):
            def w(*a, **k):
                be.synchronize()
                t0 = time.perf_counter()
                r = fn(*a, **k)
                be.synchronize()
                cur[key] += time.perf_counter() - t0
                return r
            return w
        orig_call = tape._call
        tape._call = lambda fn, sig, natives: timed("fwd " + fn.__name__, orig_call)(fn, sig, natives)
        orig_rules = dict(tape.RULES)
        for op, fn in orig_rules.items():
            tape.RULES[op] = timed("bwd " + op, fn)
        saved = {}
        for name in ("conv2d_weight_grad", "conv2d_input_grad", "bias_grad"):
            saved[name] = getattr(convgrad, name)
            setattr(convgrad, name, timed("  cg " + name, saved[name]))
        orig_update = optim.Adam._update
        optim.Adam._update = lambda self, *a: timed("adam _update", orig_update)(self, *a)
        rng = np.random.default_rng(0)
        net = case.network.initialized(case.in_shape, seed=0)
        x, t = bt._data(case, rng)
        step = bt._our_step(be, case, net, x, t)
        # phases: wrap Var.backward and Optimizer.step
        ob, os_ = tape.Var.backward, optim.Optimizer.step
        tape.Var.backward = lambda self, *a: timed("PHASE backward", ob)(self, *a)
        optim.Optimizer.step = lambda self: timed("PHASE adam", os_)(self)
        step()
        step()
        totals = []
        for _ in range(steps):
            cur.clear()
            be.synchronize()
            t0 = time.perf_counter()
            step()
            totals.append(time.perf_counter() - t0)
            for k, v in cur.items():
                rec[k].append(v)
        tape.Var.backward, optim.Optimizer.step = ob, os_
        tape._call = orig_call
        tape.RULES.update(orig_rules)
        for name, fn in saved.items():
            setattr(convgrad, name, fn)
        optim.Adam._update = orig_update
        tot = statistics.median(totals) * 1e3
        print(f"== {bname} {case.name}: step median {tot:.1f} ms (min {min(totals)*1e3:.1f}, max {max(totals)*1e3:.1f})"
              " (instrumented, synchronised per op)")
        fw = sum(statistics.median(v) for k, v in rec.items() if k.startswith("fwd ")) * 1e3
        print(f"   forward ops total {fw:8.2f} ms")
        for k in sorted(rec, key=lambda k: -statistics.median(rec[k])):
            m = statistics.median(rec[k]) * 1e3
            print(f"   {k:32s} {m:8.2f} ms  ({100 * m / tot:5.1f}%)  range {min(rec[k])*1e3:.2f}-{max(rec[k])*1e3:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
