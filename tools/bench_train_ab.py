"""Before/after timing of `anydevice bench --train` cases in one process (docs/notes/trainspeed.md).

    python tools/bench_train_ab.py BEFORE_ROOT AFTER_ROOT BACKENDS CASES ROUNDS [BUDGET_S] [OUT.json]

tools/bench_ab.py for the training step: both checkouts are loaded as packages (under two names)
and each case is timed with bench_train's own ``bench_train_case`` (alternating blocks with
PyTorch, medians), before and after alternating, round after round, so both see the same host
load; prints every row, then per (backend, case, version) the median and range of our ms and of
the ratio, and the load average.
"""
from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ab import load, runs  # noqa: E402


def main(argv) -> int:
    before_root, after_root, backends, cases, rounds = argv[:5]
    budget = float(argv[5]) if len(argv) > 5 else 2.0
    versions = {}
    for v, root in (("before", before_root), ("after", after_root)):
        be_mod, _ = load("ad_" + v, root)
        versions[v] = (be_mod, importlib.import_module("ad_" + v + ".backend.bench.train"))
    bes = {(v, b): mods[0].get_backend(b) for v, mods in versions.items() for b in backends.split(",")}
    rows = []
    for r, b, cname, v, bt in runs(versions, backends, cases, rounds):
        case = next(c for c in bt.cases() if cname in c.name)
        row = bt.bench_train_case(bes[(v, b)], case, budget)
        rows.append(dict(round=r, version=v, backend=b, case=case.name, ms=row.ms,
                         torch_ms=row.torch_ms, ratio=row.ratio, load=os.getloadavg()[0]))
        print(f"r{r} {b:7s} {case.name[:34]:34s} {v:6s} ms {row.ms:9.2f} torch {row.torch_ms:9.2f} "
              f"ratio {row.ratio:5.2f} load {os.getloadavg()[0]:.2f}", flush=True)
    for key in sorted({(x["backend"], x["case"], x["version"]) for x in rows}):
        sel = [x for x in rows if (x["backend"], x["case"], x["version"]) == key]
        ms, ra, tms = [x["ms"] for x in sel], [x["ratio"] for x in sel], [x["torch_ms"] for x in sel]
        print(f"{key[0]:7s} {key[1][:34]:34s} {key[2]:6s} ms median {statistics.median(ms):.2f} "
              f"({min(ms):.2f}-{max(ms):.2f}) torch {statistics.median(tms):.2f} "
              f"ratio median {statistics.median(ra):.2f} ({min(ra):.2f}-{max(ra):.2f})")
    print("load average", os.getloadavg())
    if len(argv) > 6:
        Path(argv[6]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
