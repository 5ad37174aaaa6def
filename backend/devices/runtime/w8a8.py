"""The portable W8A8 kernels' (kernels/w8a8.cu) build options and launch geometry, shared by the CUDA
backend and the OpenCL GPU family (the math: ops/w8a8.py)."""
from __future__ import annotations

#: the file and its kernels
FILE, ROWS, GEMM = "w8a8.cu", "ad_w8a8_rows", "ad_w8a8_gemm"
#: the one build: a 64x64 output tile, 4x4 outputs an item (16x16 items), K steps of 32 int8,
#: 256 items per row quantization group
MACROS = {"BLOCK": 256, "TM": 64, "TN": 64, "TK": 32, "WM": 4, "WN": 4}


def ldq(K: int) -> int:
    """Row length of the quantized activations (K padded with zeros to a multiple of TK)."""
    tk = MACROS["TK"]
    return -(-K // tk) * tk


def rows_launch(M: int) -> tuple[tuple, tuple]:
    """(groups, group size) of ad_w8a8_rows: one group a row."""
    return (M,), (MACROS["BLOCK"],)


def gemm_launch(M: int, N: int) -> tuple[tuple, tuple]:
    """(groups, group size) of ad_w8a8_gemm: dim 0 along N, dim 1 along M."""
    c = MACROS
    return (-(-N // c["TN"]), -(-M // c["TM"])), (c["TN"] // c["WN"], c["TM"] // c["WM"])
