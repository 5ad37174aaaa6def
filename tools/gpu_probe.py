"""GPU session helper: every kernel family and tile of the CUDA backend against cuDNN/cuBLAS.

Run on a machine with a CUDA GPU (the device tool's machine), from the repository root, with the
pack importable as ``anydevice``::

    python3 tools/gpu_probe.py [--quick] [--json FILE]

For the seed convs (32x512x7x7 * 512x512xkxk) and square GEMMs it times, with CUDA events (median
of repeated launches after warm-up), each family the backend can run (``own``: kernels/conv_gemm_cuda.cu
in FP32, every tile of ``SWEEP`` and K split of ``KSPLITS``; ``tf32``: its tensor-core branch,
with the backend's tiles), and PyTorch (cuDNN / cuBLAS) with TF32 off and on.
Every variant's result is checked against float64 on the GPU (relative Frobenius error), so a
fast but wrong variant shows as such. Prints one table; used to choose the default family and
tiles (the answer goes into ``TILES`` in backend/devices/cuda/).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _pack import load_pack as _load_pack  # noqa: E402  (gpu_tile_check.py imports it from here)


def _tag(cfg):
    short = {"TILE_M": "", "TILE_N": "x", "TILE_K": "x", "WPT_M": " ", "WPT_N": "x"}
    return "".join(f"{short[k]}{v}" if k in short else f" {k}={v}" for k, v in cfg.items() if k != "USE_TF32")


def variants(be, cb, families):
    """(family, cfg, ksplit or 0 for the backend's choice) to time."""
    out = []
    for family in families:
        if family == "own":
            cfgs = [dict(TILE_M=t[0], TILE_N=t[1], TILE_K=t[2], WPT_M=t[3], WPT_N=t[4], **(t[5] if len(t) > 5 else {}))
                    for t in SWEEP if not SWEEP_ONLY or t[5:] and "WARP_N" in t[5]]
            for cfg in cfgs:
                out += [(family, cfg, 0)] + [(family, cfg, ks) for ks in KSPLITS]
        else:
            out += [(family, cfg, 0) for cfg in be._tiles.get(family) or []]
    return out


def _time(cp, fn, reps):
    fn()
    cp.cuda.get_current_stream().synchronize()
    out = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        out.append(cp.cuda.get_elapsed_time(e0, e1))
    return statistics.median(out)


#: own FP32 tiles swept besides the backend's table (TILE_M, TILE_N, TILE_K, WPT_M, WPT_N)
#: (optional sixth item: extra build macros, e.g. KP=0 for one accumulator)
ONE = dict(KP=0, MIN_BLOCKS=2)
SWEEP = [(128, 64, 16, 8, 4), (128, 64, 8, 8, 4), (64, 64, 16, 4, 4),
         (128, 128, 16, 8, 8, ONE), (128, 128, 8, 8, 8, ONE), (128, 128, 16, 8, 8, dict(KP=0)),
         (128, 128, 16, 8, 8, dict(ONE, WARP_N=8)), (128, 128, 16, 8, 8, dict(ONE, WARP_N=4)),
         (128, 128, 8, 8, 8, dict(ONE, WARP_N=8)), (128, 128, 16, 8, 8, dict(KP=0, WARP_N=8)),
         (128, 64, 16, 8, 4, dict(WARP_N=8)), (128, 64, 8, 8, 4, dict(WARP_N=8)), (128, 64, 8, 8, 4, dict(WARP_N=4)),
         (64, 64, 16, 4, 4, dict(WARP_N=8)), (128, 64, 16, 8, 4, dict(ONE, WARP_N=8))]
KSPLITS = (1, 2, 4, 8)
SWEEP_ONLY = False  # --one-only: only the one-accumulator tiles


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--only", default="", help="comma list: gemm,seed")
    ap.add_argument("--families", default="own,tf32", help="comma list of own,tf32")
    ap.add_argument("--one-only", action="store_true", help="sweep only the warp-tiled tiles")
    ap.add_argument("--sizes", default="", help="comma list of GEMM sizes")
    args = ap.parse_args(argv)
    global SWEEP_ONLY
    SWEEP_ONLY = args.one_only
    _load_pack()
    import torch
    import torch.nn.functional as F
    from anydevice.backend.devices import cuda as cb

    be = cb.create("cuda", 0)
    cp = be.cp
    reps = 7 if args.quick else 25
    print(f"{be.device}; arch {be.arch}; {be.sm_count} SMs; torch {torch.__version__}; cupy {cp.__version__}")
    rows = []

    def rec(case, variant, ms, flops, err):
        rows.append(dict(case=case, variant=variant, ms=ms, tflops=flops / ms / 1e9 if ms else 0.0, err=err))
        print(f"{case:<26}{variant:<58}{ms:>9.3f} ms{flops / ms / 1e9 if ms else 0:>8.2f} TF  err {err:.2e}",
              flush=True)

    def relerr(y, ref):
        y = torch.as_tensor(y, device="cuda").double() if not isinstance(y, torch.Tensor) else y.double()
        return float((y - ref).norm() / ref.norm())

    only = set(filter(None, args.only.split(",")))
    families = [f for f in args.families.split(",") if f]
    # ---- GEMM ----------------------------------------------------------------------------------
    if not only or "gemm" in only:
        sizes = [int(v) for v in args.sizes.split(",") if v] or ([1024, 4096] if args.quick else [1024, 2048, 4096])
        for n in sizes:
            case = f"gemm {n}"
            flops = 2.0 * n ** 3
            ta = torch.randn(n, n, device="cuda")
            tb = torch.randn(n, n, device="cuda")
            ref = ta.double() @ tb.double()
            for tf in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf
                ms = _time(cp, lambda: torch.mm(ta, tb), reps)
                rec(case, f"torch cuBLAS {'TF32' if tf else 'FP32'}", ms, flops, relerr(torch.mm(ta, tb), ref))
            torch.backends.cuda.matmul.allow_tf32 = False
            a = cp.from_dlpack(ta).reshape(1, n, n)
            b = cp.from_dlpack(tb).reshape(1, n, n)
            for family, cfg, ks in variants(be, cb, families):
                tag = f"{family} {_tag(cfg)} ks{ks}"
                try:
                    fn = lambda: be._gemm(a, b, cfg=cfg, family=family, **({"ksplit": ks} if ks else {}))  # noqa: E731
                    y = fn()
                    ms = _time(cp, fn, reps)
                    rec(case, tag, ms, flops, relerr(y[0], ref))
                except Exception as exc:
                    print(f"{case:<26}{tag:<58} FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    traceback.print_exc(limit=3)
            try:
                fn = lambda: be.matmul(a[0], b[0])  # noqa: E731
                ms = _time(cp, fn, reps)
                rec(case, "backend.matmul (default choice)", ms, flops, relerr(fn(), ref))
            except Exception as exc:
                print(f"{case:<26}default FAILED {type(exc).__name__}: {exc}")
                traceback.print_exc(limit=4)
    # ---- seed convs ----------------------------------------------------------------------------
    if not only or "seed" in only:
        seeds = [(3, 1, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0), (1, 2, 0), (7, 2, 3)]
        for k, s, p in seeds:
            case = f"seed k{k} s{s} p{p}"
            g_ = torch.Generator(device="cuda").manual_seed(k * 100 + s * 10 + p)
            tx = torch.randn(32, 512, 7, 7, device="cuda", generator=g_)
            tw = torch.randn(512, 512, k, k, device="cuda", generator=g_) / (512 * k * k) ** 0.5
            ref = F.conv2d(tx.double(), tw.double(), stride=s, padding=p)
            OH = (7 + 2 * p - k) // s + 1
            flops = 2.0 * 32 * 512 * OH * OH * 512 * k * k
            for tf in (False, True):
                torch.backends.cudnn.allow_tf32 = tf
                ms = _time(cp, lambda: F.conv2d(tx, tw, stride=s, padding=p), reps)
                rec(case, f"torch cuDNN {'TF32' if tf else 'FP32'}", ms, flops,
                    relerr(F.conv2d(tx, tw, stride=s, padding=p), ref))
            torch.backends.cudnn.allow_tf32 = False
            x = cp.from_dlpack(tx)
            w = cp.from_dlpack(tw)
            from anydevice.backend.ops.plans import conv2d_geometry
            geo = conv2d_geometry((32, 512, 7, 7), (512, 512, k, k), (s, s), (p, p, p, p), (1, 1), 1)
            for family, cfg, ks in variants(be, cb, families):
                tag = f"{family} {_tag(cfg)} ks{ks}"
                y = be._empty((32, 512, OH, OH))
                try:
                    fn = lambda: be._own_conv(x, w, None, y, geo, 0, family, cfg=cfg, ksplit=ks)  # noqa: E731
                    y.fill(float("nan"))
                    fn()
                    err = relerr(y, ref)
                    ms = _time(cp, fn, reps)
                    rec(case, tag, ms, flops, err)
                except Exception as exc:
                    print(f"{case:<26}{tag:<58} FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    traceback.print_exc(limit=3)
            try:
                fn = lambda: be.conv2d(x, w, None, stride=s, padding=p)  # noqa: E731
                ms = _time(cp, fn, reps)
                rec(case, "backend.conv2d (default choice)", ms, flops, relerr(fn(), ref))
            except Exception as exc:
                print(f"{case:<26}default FAILED {type(exc).__name__}: {exc}")
                traceback.print_exc(limit=4)
    # ---- summary: best own variant vs torch FP32 / TF32 ------------------------------------------
    print("\nsummary (ratio = torch ms / best own ms; > 1: ours faster)")
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        for mode in ("FP32", "TF32"):
            t = [r for r in rs if r["variant"].startswith("torch") and r["variant"].endswith(mode)]
            fam = ("tf32",) if mode == "TF32" else ("own", "backend.matmul", "backend.conv2d")
            lim = 5e-3 if mode == "TF32" else 1e-5
            own = [r for r in rs if r["variant"].split(" ")[0] in fam and r["err"] <= lim]
            if t and own:
                best = min(own, key=lambda r: r["ms"])
                print(f"{case:<26}{mode}  torch {t[0]['ms']:.3f} ms  best {best['ms']:.3f} ms "
                      f"({best['variant']})  ratio {t[0]['ms'] / best['ms']:.2f}")
                d = [r for r in rs if r["variant"].startswith("backend.")]
                if d and mode == "FP32":
                    print(f"{case:<26}FP32  default choice {d[0]['ms']:.3f} ms ratio {t[0]['ms'] / d[0]['ms']:.2f} "
                          f"err {d[0]['err']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
