"""Which half tile and K split each conv of the SD1.5-shaped UNet runs fastest with, on a lent GPU: every conv
shape of one UNet step (hooked on the CPU), in float16, through the CUDA backend's own kernel (ad_conv_gemm's
HALF_IO branch) with the planner's choice and with every tile of TILES[arch]["half"] x K split, against
PyTorch's cuDNN conv in float16. Prints a table per shape and the step's totals (weighted by how often each
shape runs): what a better tile choice would win, and what is left to cuDNN.

    python3 tools/gpu_half_sweep.py [--dtype float16|bfloat16] [--reps 20] > half_sweep.txt
"""
from __future__ import annotations

import argparse
import collections
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    import cupy as cp
    from anydevice.backend import get_backend
    from anydevice.backend.bench.model import CASES
    from anydevice.backend.ops.plans import conv2d_geometry
    be = get_backend("cuda")
    case = next(c for c in CASES if c.key == "unet")
    model = case.build(False)
    xs = case.inputs(False, torch.Generator().manual_seed(0))
    shapes: collections.Counter = collections.Counter()

    def hook(m, inp, out):
        shapes[(tuple(inp[0].shape), tuple(m.weight.shape), tuple(m.stride), tuple(m.padding), m.bias is not None)] += 1
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.inference_mode():
        model(*xs)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[a.dtype]
    half = 1 if a.dtype == "float16" else 2
    tiles = be._tiles.get("half") or []
    print(f"{be.device}; {len(shapes)} conv shapes, {sum(shapes.values())} convs a step; {a.dtype}; tiles "
          + " | ".join(f"{t['TILE_M']}x{t['TILE_N']}x{t['TILE_K']} {t['WPT_M']}x{t['WPT_N']}" for t in tiles), flush=True)

    def timed(fn, graph=False):
        """ms a call: CUDA events around ``reps`` calls; graph: the calls captured once as a CUDA graph and
        the graph launched (kernel time without the host's per-launch cost), plain launches where the
        capture fails"""
        fn()
        cp.cuda.Device().synchronize()
        if graph:
            try:
                st = cp.cuda.Stream(non_blocking=True)
                with st:
                    st.begin_capture()
                    for _ in range(a.reps):
                        fn()
                    gr = st.end_capture()
                gr.launch(st)
                st.synchronize()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(st)
                gr.launch(st)
                e1.record(st)
                e1.synchronize()
                return cp.cuda.get_elapsed_time(e0, e1) / a.reps
            except Exception as exc:  # noqa: BLE001 - timed plainly instead
                print(f"  (graph capture failed: {type(exc).__name__}: {exc})", flush=True)
                cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(a.reps):
            fn()
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / a.reps

    tot = collections.Counter()
    for (xsh, wsh, st, pd, has_b), cnt in sorted(shapes.items(), key=lambda kv: -kv[1] * kv[0][1][0]):
        try:
            g = conv2d_geometry(xsh, wsh, st, (pd[0], pd[0], pd[1], pd[1]), (1, 1), 1)
            tx = torch.randn(*xsh, device="cuda", dtype=tdt)
            tw = (torch.randn(*wsh, device="cuda") / (wsh[1] * wsh[2] * wsh[3]) ** 0.5).to(tdt)
            tb = torch.randn(wsh[0], device="cuda", dtype=tdt) if has_b else None
            x = be.to_device(tx.float(), "sweep", "x", dtype=a.dtype)
            w = be.to_device(tw.float(), "sweep", "w", dtype=a.dtype)
            b32 = None if tb is None else be.to_device(tb.float(), "sweep", "b")
            y = be._empty((g.N, g.Cout, g.OH, g.OW), a.dtype)
            M, Ntot, K = g.CoutG, g.N * g.OH * g.OW, g.CinG * g.KH * g.KW
            cfg0, ks0 = be._plan(tiles, M, Ntot, 1, K)
            t_plan = timed(lambda: be._own_conv(x, w, b32, y, g, 0, "half", half=half), True)
            t_cudnn = timed(lambda: torch.nn.functional.conv2d(tx, tw, tb, st, pd))
            t_api = timed(lambda: be.conv2d(x, w, None if b32 is None else be._cast(b32, a.dtype), st, pd))
            best = (t_plan, "planner")
            rows = []
            for cfg in tiles:
                for ks in (1, 2, 3, 4, 6, 8):
                    if ks > 1 and K // ks < 64:
                        continue
                    t = timed(lambda: be._own_conv(x, w, b32, y, g, 0, "half", cfg=cfg, ksplit=ks, half=half), True)
                    tag = f"{cfg['TILE_M']}x{cfg['TILE_N']} k{ks}"
                    rows.append(f"{tag} {t * 1e3:.0f}")
                    if t < best[0]:
                        best = (t, tag)
            print(f"x{cnt:<3} {xsh} * {wsh} s{st[0]} p{pd[0]}: M {M} N {Ntot} K {K}; planner "
                  f"{cfg0['TILE_M']}x{cfg0['TILE_N']} k{ks0} {t_plan * 1e3:.0f} us (conv2d call {t_api * 1e3:.0f}); "
                  f"best {best[1]} {best[0] * 1e3:.0f} us; cuDNN {t_cudnn * 1e3:.0f} us | " + " ".join(rows), flush=True)
            tot["planner"] += cnt * t_plan
            tot["best"] += cnt * best[0]
            tot["cudnn"] += cnt * t_cudnn
            tot["api"] += cnt * t_api
        except Exception as exc:  # one shape's failure is reported, the others still run
            print(f"x{cnt} {xsh} * {wsh}: {type(exc).__name__}: {exc}", flush=True)
    print("planner / best: the kernels alone (CUDA graphs); conv2d call and cuDNN: plain calls, host included")
    print("step totals (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in tot.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
