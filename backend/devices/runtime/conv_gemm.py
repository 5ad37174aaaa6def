"""The CUDA kernel ``kernels/conv_gemm_cuda.cu`` (``ad_conv_gemm``) as any GPU backend runs it:
tiles measured on an H100, the kernel's build modes, when 16-byte loads apply, and the plan that
picks a tile and a K split per problem. The CUDA backend and the OpenCL GPU family (the same file
built as OpenCL C through the preludes) both use these."""
from __future__ import annotations

# own FP32, measured on an H100 (tools/gpu_probe.py): 128x64 tiles with 8x4 per thread are the
# fastest (two groups per SM; an 8x8 thread tile's registers allow only one), TILE_K 16 for GEMMs
# and 8 for convs (half the im2col gathers per step); 64x64x16 where 128x64 leaves SMs idle and K
# is too short to split. ``_plan`` picks tile and K split per problem from these.
_O_L = dict(TILE_M=128, TILE_N=64, TILE_K=16, WPT_M=8, WPT_N=4)
_O_M = dict(TILE_M=128, TILE_N=64, TILE_K=8, WPT_M=8, WPT_N=4)
_O_S = dict(TILE_M=64, TILE_N=64, TILE_K=16, WPT_M=4, WPT_N=4)
_O_X = dict(TILE_M=128, TILE_N=128, TILE_K=8, WPT_M=8, WPT_N=8)
# one accumulator (KP=0): 8x8 per thread in half the registers of the two-level sum, two groups of
# 256 threads per SM; the plan keeps each K slice at most SINGLE_CHAIN long for the precision
_O_W = dict(TILE_M=128, TILE_N=128, TILE_K=8, WPT_M=8, WPT_N=8, KP=0)
_O_W16 = dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8, KP=0)
# the H100's GEMM tile: one accumulator, registers capped for two groups per SM (a few bytes of
# spills in some modes, still the fastest), lanes warp-tiled 8x4: 0.76 -> 0.85 of cuBLAS at 4096
_O_WW = dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8, KP=0, MIN_BLOCKS=2, WARP_N=8)
_T_L = dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8, SMEM_PAD=8, USE_TF32=1)
_T_M = dict(TILE_M=128, TILE_N=64, TILE_K=16, WPT_M=8, WPT_N=4, SMEM_PAD=8, USE_TF32=1)
_T_S = dict(TILE_M=64, TILE_N=64, TILE_K=16, WPT_M=4, WPT_N=4, SMEM_PAD=8, USE_TF32=1)
# half operands on the tensor cores (CUDA, HALF_IO: 1 float16 / 2 bfloat16, set per call; f16/bf16
# mma.sync.m16n8k16): the TF32 tiles' warp layout, TILE_K 16, rows of 16 + 8 halves (conflict-free
# fragment reads). Not measured yet (first build 2026-11-28).
_H_L = dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8, SMEM_PAD=8, HALF_IO=1)
_H_M = dict(TILE_M=128, TILE_N=64, TILE_K=16, WPT_M=8, WPT_N=4, SMEM_PAD=8, HALF_IO=1)
_H_S = dict(TILE_M=64, TILE_N=64, TILE_K=16, WPT_M=4, WPT_N=4, SMEM_PAD=8, HALF_IO=1)

#: relative FMA throughput of a thread tile (WPT_M, WPT_N, one accumulator) against 8x4 with two,
#: from the H100 sweep
TILE_EFFICIENCY = {(8, 4, False): 1.0, (4, 4, False): 0.8, (8, 8, False): 0.9, (4, 8, False): 0.8,
                   (8, 8, True): 1.2}  # _O_WW: 3.2-3.4 ms at 4096 against 4.0 for 128x64x16
#: the half tiles' (HALF_IO: scalar 16-bit loads, mma.sync) relative speed, smallest K slice and split cost,
#: fitted to the H200 sweep of the SD1.5 UNet's 35 conv shapes in float16 (tools/gpu_half_sweep.py,
#: 2026-11-28): the planner's choices there take 14.9 ms a step where the H100-fitted FP32 figures chose
#: 15.7 (every tile's best: 14.6; cuDNN 6.9)
HALF_TILE_EFFICIENCY = {(8, 8): 0.5, (8, 4): 1.0, (4, 4): 1.2}
HALF_MIN_KSLICE = 128
HALF_SPLIT_COST = 64.0
#: longest K slice of a one-accumulator tile (KP=0): a float32 sum of 1024 products stays at about
#: 6e-7 relative (Frobenius) error, 4096 at 1.1e-6 (cuBLAS FP32's own figure)
SINGLE_CHAIN = 1024
#: a K slice is at least this long (shorter slices lost to their fixed costs on the H100)
MIN_KSLICE = 512
#: own-kernel modes (build options besides the tile) the backend compiles; VEC_A / VEC_B (16-byte
#: loads) are added when the operands allow them (``_vec_ok``)
OWN_MODES = (
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=0),
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=1),
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0, VEC_A=1, VEC_B=1), dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0, VEC_A=1),
    dict(IS_GEMM=1, TRANS_A=1, TRANS_B=0, VEC_B=1), dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1, VEC_A=1),
    dict(IS_GEMM=0, CONV_TRANSPOSED=0), dict(IS_GEMM=0, CONV_TRANSPOSED=1),
    dict(IS_GEMM=0, CONV_TRANSPOSED=0, VEC_A=1), dict(IS_GEMM=0, CONV_TRANSPOSED=1, VEC_A=1),
)
#: the modes half operands run in (HALF_IO): a conv writes its result in their dtype (C_HALF), a GEMM in
#: float32 (its caller adds a bias and rounds once); no 16-byte loads
HALF_MODES = (dict(IS_GEMM=0, CONV_TRANSPOSED=0, C_HALF=1),
              dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=0),
              dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=1))
#: the modes a quantized weight runs in (``quant_mode`` adds its format: WQB / WQA): linear's
#: B = W^T (TRANS_B; A the activations, contiguous, with or without 16-byte loads) and conv2d's A
#: (no 16-byte loads: decoded element by element)
QUANT_MODES = (dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1), dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1, VEC_A=1),
               dict(IS_GEMM=0, CONV_TRANSPOSED=0))
#: split K over at most this many slices when the output tiles alone do not fill the GPU
MAX_KSPLIT = 8


def quant_mode(mode: dict, code: int) -> dict:
    """``mode`` with its quantized operand's format code: conv mode's A (WQA), GEMM mode's B (WQB)."""
    return dict(mode, **({"WQB": code} if mode["IS_GEMM"] else {"WQA": code}))
def vec_fits(cfg: dict, which: str) -> bool:
    """Whether a tile can load operand ``which`` ("A" or "B") as 16-byte vectors: every thread
    loads whole vectors (ad_conv_gemm's VEC_A / VEC_B #error conditions)."""
    threads = (cfg["TILE_M"] // cfg["WPT_M"]) * (cfg["TILE_N"] // cfg["WPT_N"])
    if which == "A":
        return cfg["TILE_K"] % 4 == 0 and (cfg["TILE_M"] * cfg["TILE_K"]) % (4 * threads) == 0
    return cfg["TILE_N"] % 4 == 0 and (cfg["TILE_N"] * cfg["TILE_K"]) % (4 * threads) == 0


def mode_fits(cfg: dict, mode: dict) -> bool:
    if (mode.get("VEC_A") and mode.get("WQA")) or (mode.get("VEC_B") and mode.get("WQB")):
        return False  # a quantized operand is decoded element by element
    if (mode.get("WQA") or mode.get("WQB")) and cfg.get("MIN_BLOCKS"):
        return False  # registers capped for two groups an SM: the decoder's (int8 / fp8 row scales) spill
    return (not mode.get("VEC_A") or vec_fits(cfg, "A")) and (not mode.get("VEC_B") or vec_fits(cfg, "B"))


def _mode_macros(mode: dict) -> dict:
    """Build options of one own-kernel mode: VEC_A/VEC_B/WQA/WQB only when set (so the older cache keys hold)."""
    return {k: v for k, v in mode.items() if not (k in ("VEC_A", "VEC_B", "WQA", "WQB") and not v)}




def _cdiv(a, b):
    return -(-a // b)


def operand_layout(rows: int, cols: int, s_row: int, s_col: int) -> tuple[bool, int, int]:
    """(usable, row stride, column stride) of a GEMM operand for ad_conv_gemm, which reads one of
    the two inner dims with unit stride (it picks the matching load layout): usable when one of them
    has stride 1 or size 1; size-1 dims get the canonical stride, so the layout choice is reliable."""
    usable = s_col == 1 or s_row == 1 or rows == 1 or cols == 1
    if cols == 1:
        s_col = 1
    elif rows == 1:
        s_row = 1 if s_col != 1 else cols
    return usable, s_row, s_col


def conv_args(g) -> tuple:
    """ad_conv_gemm's 15 convolution arguments (C, H, W, Cg, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW,
    Cout) from a plans.ConvGeometry."""
    return (g.C, g.H, g.W, g.CinG, g.KH, g.KW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW, g.Cout)


def kchunk_for(K: int, ksplit: int, cfg: dict) -> tuple[int, int]:
    """(slices, slice length): slices of whole TILE_K steps covering K."""
    kchunk = _cdiv(_cdiv(K, max(1, ksplit)), cfg["TILE_K"]) * cfg["TILE_K"]
    return (_cdiv(K, kchunk) if K else 1), max(kchunk, cfg["TILE_K"])


def tile_threads(cfg: dict) -> int:
    """Work items (threads) of one group of ``cfg``'s tile."""
    return (cfg["TILE_M"] // cfg["WPT_M"]) * (cfg["TILE_N"] // cfg["WPT_N"])


def tile_shared_bytes(cfg: dict) -> int:
    """Group-shared bytes of ``cfg``'s tile: the double-buffered As and Bs tiles of the kernel, each row
    padded by SMEM_PAD floats (the kernel's default 4); half tiles (HALF_IO): [row][k] halves."""
    pad = cfg.get("SMEM_PAD", 4)
    if cfg.get("HALF_IO"):
        return 2 * 2 * (cfg["TILE_M"] + cfg["TILE_N"]) * (cfg["TILE_K"] + pad)
    return 4 * 2 * cfg["TILE_K"] * (cfg["TILE_M"] + pad + cfg["TILE_N"] + pad)


def plan(cands: list, M: int, N: int, Z: int, K: int, units: int, forced: int | None = None) -> tuple[dict, int]:
    """(tile, K slices) with the least modelled time on ``units`` compute units (SMs): waves of
    groups (groups per unit from the tile's registers) x one group's FMAs / the tile's measured
    efficiency, plus the split's reduction pass. Slices are at least MIN_KSLICE long; ``forced``
    fixes the split."""
    best = None
    for cfg in cands:
        tm, tn, tk = cfg["TILE_M"], cfg["TILE_N"], cfg["TILE_K"]
        blocks = _cdiv(M, tm) * _cdiv(N, tn) * Z
        threads = tile_threads(cfg)
        one = cfg.get("KP", 1) == 0
        acc = (1 if one else 2) * cfg["WPT_M"] * cfg["WPT_N"]
        regs = min(255, acc + (56 if one else 64))  # accumulators + operands, as compiled
        if cfg.get("MIN_BLOCKS"):
            regs = min(regs, 65536 // (threads * cfg["MIN_BLOCKS"]))  # __launch_bounds__ caps them
        slots = max(1, units) * max(1, min(2048 // threads, 65536 // (threads * regs)))
        half = bool(cfg.get("HALF_IO"))
        if half:
            eff = HALF_TILE_EFFICIENCY.get((cfg["WPT_M"], cfg["WPT_N"]), 0.8)
        else:
            eff = TILE_EFFICIENCY.get((cfg["WPT_M"], cfg["WPT_N"], one), 0.8)
        least = _cdiv(K, SINGLE_CHAIN) if one else 1  # slices a single accumulator needs
        min_slice, split_cost = (HALF_MIN_KSLICE, HALF_SPLIT_COST) if half else (MIN_KSLICE, 16.0)
        if forced:
            splits = [max(least, min(forced, _cdiv(K, tk)))]
        else:
            splits = range(least, max(least, min(MAX_KSPLIT, K // min_slice)) + 1)
        for ks in splits:
            kslice = _cdiv(_cdiv(K, ks), tk) * tk
            t = _cdiv(blocks * ks, slots) * tm * tn * kslice / eff
            if ks > 1:
                t += split_cost * M * N * Z * ks / slots  # workspace write + ordered reduction
            if best is None or t < best[0] * 0.999:
                best = (t, cfg, ks)
    return best[1], best[2]
