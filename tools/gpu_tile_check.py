"""Ragged-shape correctness of ad_conv_gemm tiles on a GPU, through CUDA (CuPy) and through the
OpenCL driver (tests/conformance/test_portable_kernels.py's runner), each against float64. Prints one line per
(path, tile, shape). Used when a tile passes on PoCL but not on a GPU driver.

    python3 tools/gpu_tile_check.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "tools"))
from gpu_probe import _load_pack  # noqa: E402

_load_pack()
import torch  # noqa: E402
from anydevice.backend.devices import cuda as cb  # noqa: E402

WW = cb._O_WW
VARIANTS = {
    "WW": WW,
    "WW no WARP_N": {k: v for k, v in WW.items() if k != "WARP_N"},
    "WW no MIN_BLOCKS": {k: v for k, v in WW.items() if k != "MIN_BLOCKS"},
    "WW TILE_K 8": {**WW, "TILE_K": 8},
    "WW KP 128": {**WW, "KP": 128},
    "128x128x16 8x8 two-level": dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8),
    "O_L": cb._O_L,
}
SHAPES = [(37, 45, 29), (130, 200, 70), (129, 131, 33), (256, 256, 64), (1000, 1000, 1000)]


def rel(y, ref):
    y = torch.as_tensor(np.asarray(y)).double()
    return float((y - ref).norm() / ref.norm())


def main():
    rng = np.random.default_rng(0)
    cases = []
    for M, N, K in SHAPES:
        A = rng.standard_normal((1, M, K)).astype(np.float32)
        B = rng.standard_normal((1, K, N)).astype(np.float32)
        cases.append((M, N, K, A, B, torch.from_numpy(A).double() @ torch.from_numpy(B).double()))
    try:
        import cupy as cp
        be = cb.create("cuda", 0)
        for name, cfg in VARIANTS.items():
            for M, N, K, A, B, ref in cases:
                try:
                    y = be._gemm(cp.asarray(A), cp.asarray(B), cfg=cfg, ksplit=1)
                    print(f"cuda   {name:<28}{M}x{N}x{K:<8} err {rel(cp.asnumpy(y), ref):.2e}", flush=True)
                except Exception as exc:
                    print(f"cuda   {name:<28}{M}x{N}x{K:<8} FAILED {type(exc).__name__}: {str(exc)[:200]}")
    except Exception as exc:
        print("cuda path unavailable:", exc)
    import test_portable_kernels as t
    run = t.Runner()
    print("opencl device:", run.queue.device.name, "|", run.queue.device.platform.name,
          run.queue.device.platform.version, "|", run.queue.device.version)
    for name, cfg in VARIANTS.items():
        cfg = {k: v for k, v in cfg.items() if k != "MIN_BLOCKS"}
        for M, N, K, A, B, ref in cases:
            try:
                k = run.kernel("conv_gemm_cuda.cu", "ad_conv_gemm", {**cfg, "IS_GEMM": 1, "TRANS_A": 0, "TRANS_B": 0})
                wg = k.get_work_group_info(__import__("pyopencl").kernel_work_group_info.WORK_GROUP_SIZE,
                                           run.queue.device)
                y = t.own_gemm(run, A, B, 0, 0, M, N, K, 1, True, True, cfg)
                print(f"opencl {name:<28}{M}x{N}x{K:<8} err {rel(y, ref):.2e}  (max group {wg})", flush=True)
            except Exception as exc:
                print(f"opencl {name:<28}{M}x{N}x{K:<8} FAILED {type(exc).__name__}: {str(exc)[:200]}")


if __name__ == "__main__":
    main()
