"""The CUDA kernel's configurations: tile tables per architecture (measured on an H100), the
kernel modes, which configurations ship (the CI compile check builds them all), how a source is
assembled and the problem-size helpers. Imports without CuPy."""
from __future__ import annotations

import math
from pathlib import Path

from ...ops.contract import UNARY_KERNEL_CODES
from ...ops.quant import FORMATS
from ..runtime.conv_gemm import (HALF_MODES, _H_L, _H_M, _H_S, MAX_KSPLIT, MIN_KSLICE, OWN_MODES, QUANT_MODES, TILE_EFFICIENCY, quant_mode, _O_L, _O_M, _O_S, _O_W, _O_W16, _O_WW, _O_X,  # noqa: F401
                                 _T_L, _T_M, _T_S, SINGLE_CHAIN, _cdiv, plan, _mode_macros, mode_fits, operand_layout, vec_fits)
from ..runtime.attention import shared_tile
from ..runtime import w8a8 as _w8a8
from ..runtime.kernel_source import kernel_source as _kernel_source

KERNELS_DIR = Path(__file__).resolve().parents[3] / "kernels"
INSTALL_HINT = "CuPy not installed (pip install cupy-cuda12x)"
CACHE_NAME = "cuda_tiles.json"

OWN_GEMM = ("conv_gemm_cuda.cu", "ad_conv_gemm")
MISC = "misc_cuda.cu"
HALF_EW = "elementwise_half_cuda.cu"  # unary / binary ops on float16 / bfloat16 as stored (XT 1 / 2)
#: a quantized weight's float32 values (kernels/dequant.cu, built per format: -DWQ=code)
DEQUANT = ("dequant.cu", "ad_dequant")
#: fused attention (kernels/attention.cu): file, kernel; the group (query rows) and key tile asked for
#: first (within the device's threads per block, the built kernel's limit and shared memory)
ATTENTION = ("attention.cu", "ad_attention")
ATT_WG, ATT_BK = 64, 32
#: the tensor-core attention (kernels/attention_mma.cu) for half kt and v: file, kernel, keys a tile, and the
#: largest head dims it takes (its registers: q fragments, scores, output accumulators)
ATTENTION_MMA = ("attention_mma.cu", "ad_attention_mma")
ATT_MMA_BKV, ATT_MMA_MAX_DIM = 64, 160
#: head dims (E = Ev) whose attention builds the compile check covers (SD1.5 40/80/160, SDXL 64, Flux 128)
ATT_HEAD_DIMS = (40, 64, 80, 128, 160)
#: static shared memory a block may declare (CUDA's 48 KiB; the device's own limit applies if less)
STATIC_SMEM = 48 * 1024

# ---- tile configurations ------------------------------------------------------------------
# Candidates per architecture (the tiles themselves: runtime/conv_gemm.py); at run time the plan
# picks tile and K split per problem (unless tune() stored a winner). The CI compile check builds
# every configuration listed here (and fails on register spills).
#: arch ("sm_80", ...; "default" for any other) -> family -> candidate configs. "own" serves
#: GEMMs, "own_conv" convolutions (both FP32); "tf32" both, when TF32 is allowed; "half" both, for
#: float16 / bfloat16 operands (f16/bf16 tensor cores, sm_80+; elsewhere they are computed as float32).
_HALF = [_H_L, _H_M, _H_S]
TILES = {
    "default": {"own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": [], "half": []},
    "sm_80": {"own": [_O_L, _O_S, _O_X], "own_conv": [_O_M, _O_S],
              "tf32": [_T_L, _T_M, _T_S], "half": _HALF},
    "sm_86": {"own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": [_T_M, _T_S], "half": _HALF},
    "sm_89": {"own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": [_T_M, _T_S], "half": _HALF},
    "sm_90": {"own": [_O_L, _O_S, _O_WW], "own_conv": [_O_M, _O_S],
              "tf32": [_T_L, _T_M, _T_S], "half": _HALF},
}
#: unary op codes of misc_cuda.cu
UNARY_CODES = UNARY_KERNEL_CODES
BLOCK = 256
#: convs with at most this many output channels per group use the direct kernel
DIRECT_MAX_COUT_G = 4
#: ... and with at most this many taps (CinG*KH*KW), or at least this many outputs an SM (linalg._direct_pays)
DIRECT_MAX_TAPS = 64
DIRECT_MIN_OUTPUTS_PER_SM = 2048
GRID_YZ_MAX = 65535


def _tiles_for(arch: str) -> dict:
    return TILES.get(arch, TILES["default"])


def shipped_configs() -> dict[str, list[dict]]:
    """Every (file -> list of -D macro sets) this backend may compile, for the CI compile check."""
    out: dict[str, list[dict]] = {}

    def add(fname, cfg):
        lst = out.setdefault(fname, [])
        if cfg not in lst:
            lst.append(cfg)

    for table in TILES.values():  # "own" tiles serve GEMMs, "own_conv" convolutions, "tf32" both
        for family, kinds in (("own", (1,)), ("own_conv", (0,)), ("tf32", (0, 1))):
            for cfg in table[family]:
                for mode in OWN_MODES:
                    if mode["IS_GEMM"] in kinds and mode_fits(cfg, mode):
                        add(OWN_GEMM[0], {**cfg, **_mode_macros(mode)})
                for mode in QUANT_MODES:  # a quantized weight read in the tile loads, per format
                    for fmt in FORMATS.values():
                        qm = quant_mode(mode, fmt.code)
                        if mode["IS_GEMM"] in kinds and mode_fits(cfg, qm):
                            add(OWN_GEMM[0], {**cfg, **_mode_macros(qm)})
        for cfg in table.get("half", []):  # float16 (HALF_IO=1) and bfloat16 (2) operands
            for mode in HALF_MODES:
                for kind in (1, 2):
                    add(OWN_GEMM[0], {**cfg, **mode, "HALF_IO": kind})
    add(MISC, {"BLOCK": BLOCK})
    for fmt in FORMATS.values():
        add(DEQUANT[0], {"WQ": fmt.code})
    for spec in range(5):  # window.cu: square windows up to 4x4 unrolled, 0 the generic build
        add("window.cu", {"BLOCK": BLOCK, "WT": spec, "WS": spec})
    for d in ATT_HEAD_DIMS:
        add(ATTENTION[0], {"E": d, "EV": d, "WG": ATT_WG, "BK": shared_tile(d, d, STATIC_SMEM, ATT_BK)})
    for d in ATT_HEAD_DIMS:  # half kt / v on the tensor cores: float16 / bfloat16, q float32 or half
        if d <= ATT_MMA_MAX_DIM:
            for hk in (1, 2):
                for qh in (0, 1):
                    add(ATTENTION_MMA[0], {"E": d, "EV": d, "HK": hk, "QH": qh, "KH": 1, "VH": 1, "BKV": ATT_MMA_BKV})
    for xt in (1, 2):  # half elementwise ops ("half_elementwise")
        add(HALF_EW, {"BLOCK": BLOCK, "XT": xt})
    for xt in (0, 1, 2):  # the fused row norm (norms.py), float32 / float16 / bfloat16, and its split rows
        add("norm_cuda.cu", {"XT": xt, "NB": 512})
        add("norm_split_cuda.cu", {"XT": xt, "NB": 256})
    add(_w8a8.FILE, dict(_w8a8.MACROS))  # W8A8 linear (the one build)
    return out


def kernel_source(fname: str, kernels_dir: Path | str | None = None) -> str:
    """What is compiled for ``fname``: prelude_cuda.cuh + the file, includes expanded (kernel_source.py)."""
    return _kernel_source(fname, "cuda", kernels_dir or KERNELS_DIR)


def build_options(macros: dict) -> tuple[str, ...]:
    return tuple(f"-D{k}={v}" for k, v in sorted(macros.items()))






def _vec_ok(x, row_stride: int, batch_stride: int, inner: int) -> bool:
    """16-byte loads along the unit-stride dim: aligned base, row/batch strides and length all
    multiples of 4 floats."""
    return x.data.ptr % 16 == 0 and row_stride % 4 == 0 and batch_stride % 4 == 0 and inner % 4 == 0


def _size_class(M, N, Z) -> str:
    """Problem-size bucket for tuned tiles: log2 of the output elements per launch, and of M."""
    return f"{int(math.log2(max(1, M * N * Z)))}:{int(math.log2(max(1, M)))}"


def _strided(cp, x):
    """(array, element strides) with the inner two strides usable by the kernel: one of the two
    inner dims must have unit stride (it picks the matching load layout); else a copy."""
    isz = x.itemsize
    st = [s // isz for s in x.strides]
    ok = all(s >= 0 for s in st) and all(s % isz == 0 for s in x.strides) and max(st) < 2**31
    usable, st[1], st[2] = operand_layout(x.shape[1], x.shape[2], st[1], st[2])
    if not (ok and usable):
        x = cp.ascontiguousarray(x)
        st = [s // isz for s in x.strides]
        _, st[1], st[2] = operand_layout(x.shape[1], x.shape[2], st[1], st[2])
    return x, st

