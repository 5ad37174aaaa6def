"""Before/after timing of `anydevice bench` cases in one process (docs/notes/layerspeed.md).

    python tools/bench_ab.py BEFORE_ROOT AFTER_ROOT BACKENDS CASES ROUNDS [OUT.json]

e.g. ``python tools/bench_ab.py /work/main . opencl,numpy group_norm,attention 3``. Both
checkouts are loaded as packages (under two names), and each case is timed with the bench's own
``bench_case`` (alternating blocks with PyTorch, medians), before and after alternating, round
after round, so both see the same host load; the rows (ms, PyTorch ms, ratio) are printed and
optionally written as JSON.
"""
from __future__ import annotations

import importlib
import json
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pack import load_pack  # noqa: E402


def load(name: str, root: str):
    load_pack(root, name)
    return importlib.import_module(name + ".backend"), importlib.import_module(name + ".backend.bench.ops")


def runs(versions, backends: str, cases: str, rounds):
    """(round, backend, case name, version, its bench module) in A/B order: the versions of a case
    one after the other, so both see the same machine load."""
    for r in range(int(rounds)):
        for b in backends.split(","):
            for cname in cases.split(","):
                for v, (_, bench) in versions.items():
                    yield r, b, cname, v, bench


def main(argv) -> int:
    before_root, after_root, backends, cases, rounds = argv[:5]
    versions = {"before": load("ad_before", before_root), "after": load("ad_after", after_root)}
    bes = {(v, b): mods[0].get_backend(b) for v, mods in versions.items() for b in backends.split(",")}
    rows = []
    for r, b, cname, v, bench in runs(versions, backends, cases, rounds):
        case = next(c for c in bench.CASES if cname in c.name)
        row = bench.bench_case(bes[(v, b)], case, 0.8)
        rows.append(dict(round=r, version=v, backend=b, case=case.name, ms=row.ms,
                         torch_ms=row.torch_ms, ratio=row.ratio))
        print(f"r{r} {b:7s} {case.name:34s} {v:6s} ms {row.ms:9.2f} torch {row.torch_ms:9.2f} "
              f"ratio {row.ratio:5.2f}", flush=True)
    for key in sorted({(x["backend"], x["case"], x["version"]) for x in rows}):
        sel = [x for x in rows if (x["backend"], x["case"], x["version"]) == key]
        ms, ra = [x["ms"] for x in sel], [x["ratio"] for x in sel]
        print(f"{key[0]:7s} {key[1]:34s} {key[2]:6s} ms median {statistics.median(ms):.2f} "
              f"({min(ms):.2f}-{max(ms):.2f}) ratio median {statistics.median(ra):.2f} ({min(ra):.2f}-{max(ra):.2f})")
    if len(argv) > 5:
        Path(argv[5]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
