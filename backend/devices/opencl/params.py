"""OpenCL backend constants: op codes, path thresholds, default tunables, and which source file and
signature each kernel has (from the shared runtime's one table)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...ops.contract import UNARY_KERNEL_CODES
from ..runtime import KERNELS, cl_scalar_dtypes


KERNEL_DIR = Path(__file__).resolve().parents[3] / "kernels"
F32 = np.float32
TUNE_BUDGET_S = 10.0

#: the OpenCL device's optional kernels (the CPU kernel family adds "winograd", on a CPU device "fft_conv" too)
FUSED = frozenset({"replay", "adam_step", "conv_weight_grad", "conv_input_grad", "all_finite", "write_rows", "attention",
                   "half_weights", "half_elementwise", "half_movement", "half_norm", "half_gemm", "half_linear",
                   "half_conv", "norm_affine", "prelu", "w8a8", "batch_norm", "cross_entropy", "conv_prelu",
                   "linear_weight"})

UNARY_CODES = UNARY_KERNEL_CODES
BINARY_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "minimum": 5, "maximum": 6,
                "eq": 7, "ne": 8, "lt": 9, "le": 10, "gt": 11, "ge": 12}
PAD_CODES = {"zeros": 0, "reflect": 1, "replicate": 2, "circular": 3}
#: the storage codes of the kernels' WDT (weight_load.h), HDT (elementwise.cl) and XDT / YDT (half_io.h) build options
HALF_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

#: CPU family: direct conv when CinG*KH*KW is at most this (and the rows are wide enough)
DIRECT_MAX_K = 576
#: conv2d_direct: rows of at most this many 32-column output tiles get their input columns zero-padded
#: once (every tile then loads with vectors), when the padded copy takes at most DIRECT_PAD_MAX_BYTES
#: (measured here: 1.5-1.9x faster at 64 and 128 columns, and then faster than Winograd up to 64
#: channels; slower from 256 columns, where few tiles cross an edge)
DIRECT_PAD_MAX_TILES = 4
DIRECT_PAD_MAX_BYTES = 256 << 20
#: CPU family: matmuls below this many multiply-adds use the one-launch gemm_small kernel
SMALL_GEMM_MACS = 48 * 48 * 48
#: CPU family: rows of k one packing work item copies (PK in gemm_cpu.cl / conv_cpu.cl)
PACK_K = 64
#: CPU family: the most bytes of float32 panels a weight stored in half or quantized is packed to at once
#: (GEMM, im2col conv and Winograd take its rows or columns in slices: no float32 copy of the whole weight)
WEIGHT_PANEL_BYTES = 16 << 20
#: CPU family: 32-tile groups one wino_out work item transforms (OB in winograd_cpu.cl)
WINO_OB = 4


#: the OpenCL backend's kernels: name -> (source file, portable?) and scalar dtypes, both from the
#: runtime's signature table (portable GPU-family files get the OpenCL prelude)
OPENCL_KERNELS = ("unary", "cast_from_f32", "cast_to_f32", "binary_flat", "binary_nd", "copy_nd", "where_nd", "pad2d", "reduce_ori", "norm_rows", "norm_rows_aff", "norm_rows_wg", "softmax_rows", "softmax_tile", "gemm_small",
                  "pack_a", "pack_b", "gemm_cpu", "im2col_pack", "conv2d_direct", "conv_t2d_direct",
                  "wino_filter", "wino_in", "wino_out", "wino_fused", "wino_gy", "wino_wgemm", "wino_wgrad_out", "ad_conv_gemm", "ad_splitk_reduce", "ad_direct_conv",
                  "ad_window2d", "ad_window2d_px", "ad_window_rows", "att_cpu", "att_cpu_rows", "ad_attention",
                  "ad_dequant", "ad_w8a8_rows", "ad_w8a8_gemm", "w8a8_rows_cpu", "w8a8_pack_b", "w8a8_gemm_cpu")
#: portable sources (built with the OpenCL prelude): the CUDA backend's kernels, as OpenCL C
KFILES = {k: (KERNELS[k].file, KERNELS[k].file.endswith(".cu")) for k in OPENCL_KERNELS}
SIGS = {k: cl_scalar_dtypes(k) for k in OPENCL_KERNELS + ("probe_kernel",)}
PROBE_SRC = "__kernel void probe_kernel(__global float *x) { x[get_global_id(0)] = 2.0f * x[get_global_id(0)] + 1.0f; }\n"

# ---- the CPU family's GEMM and conv paths (opencl/linalg.py reads them; tests set them on linalg) ----
#: CPU devices with narrow vectors (AVX2): 3x3 convs with at least this many channels on both sides take Winograd
WINOGRAD_NARROW_MIN_CH = 16
#: CPU devices with wide vectors (AVX-512): 3x3 stride-1 convs of at most WINO_FUSED_MAX_C input channels take
#: Winograd (wino_fused) from 8 input channels, or fewer on rows the direct kernel pads (_conv_path). 2-core Intel Xeon
#: with AVX-512, medians of 11 alternating in one process, direct -> Winograd: 1x16x512^2 16 -> 16 7.48 -> 4.87 ms
#: (PyTorch 5.6-17), 16x32x64^2 -> 32 7.42 -> 4.01, 1x64x128^2 64 -> 64 6.59 -> 3.04, 1x8x256^2 8 -> 8 2.66 -> 0.72-1.13,
#: 16x3x64^2 -> 32 1.80 -> 0.87, 16x32x64^2 -> 3 3.05 -> 1.94; 1x3x1024^2 -> 16 6.13 direct against 6.57
WINOGRAD_WIDE = True
#: CPU family: Winograd from this many 2x2 output tiles in all (the filter transform, 16 values an input and output
#: channel pair, is paid once a call; under it im2col's GEMM takes less). 2-core AVX2 EPYC, medians of 7 in one process,
#: Winograd against im2col: 1x1280x8^2 1280 -> 1280 (16 tiles) 30.1 / 22.3 ms, 1x2560x8^2 59.1 / 44.8; 2x1280x8^2 (32)
#: 29.6 / 40.1, 1x1280x16^2 (64) 44.5 / 68.4
WINOGRAD_MIN_TILES = 32
#: CPU-family attention: column tiles of 32 one gemm_cpu work item computes in s = q k^T (K = E
#: is short, so one tile a work item spent more on PoCL's per-group cost than on the product)
ATT_NL = 8
#: CPU family, gemm_cpu in two 16-column passes (NH 2: AVX2): _gemm packs B as two K x 16 halves a panel (gemm_cpu.cl's
#: BH), so a pass reads its rows contiguously. 2-core AVX2 EPYC, medians in one process: 1000^2 14.2 -> 13.8 ms,
#: 1024^2 16.7 -> 16.1, 2000^2 120.0 -> 117.5, 2048^2 145.3 -> 132.9. _gemm's own packing (pack_b) and the unfused
#: Winograd's V (wino_in: 1x320x64^2 320 -> 320 29.4 -> 26.4 ms), and im2col_pack (the conv GEMM path).
GEMM_B_HALVES = True
#: CPU family: gemm_cpu reads a float32 A stored row by row (one for every batch: a matmul's, a linear layer's input, an
#: im2col or 1x1 conv's weight) as it is (AU: six row streams), no pack_a pass. 2-core AVX2 EPYC, paired runs in one
#: process: 1x1280x16^2 s2 conv 22.7 -> 14.8 ms, 1x1280x8^2 21.7 -> 14.6, 1x640x32^2 s2 20.8 -> 18.9, linear
#: 4096 x 320 -> 320 8.7 -> 8.1, matmul 2048^2 119 -> 115-118; SD1.5 UNet step 6.79 -> 6.64 s (medians of 6)
GEMM_A_UNPACKED = True
#: ... except on wide vectors (AVX-512) where A is used by at least this many column tiles of 32 (all batches and
#: chunks): pack_a's pass (4 x 4 blocks transposed in registers) then costs less than the row streams do in gemm_cpu,
#: whose packed rows are prefetched (PFA). 2-core Intel Xeon with AVX-512, medians of 9-21 alternating in one process
#: with PyTorch: matmul 2048^2 row streams 58.8 ms (gemm_cpu 55.7) -> packed 56.4 (52.0); 1024^2 (32 tiles) level,
#: 7.34 / 7.33 (gemm_cpu 6.84 / 6.51, pack_a 0.42)
GEMM_A_PACK_MIN_TILES = 48
#: CPU family: _gemm packs B and runs gemm_cpu in column chunks of about this many bytes of packed panels (all
#: batches), so that a chunk is still in cache when gemm_cpu reads it, where B is larger (0: B packed whole).
#: 2-core AVX2 EPYC, medians of 11 in one process: a 1x1 conv 1x256x512^2 -> 128 (268 MB of B) 359 -> 260 ms
#: (4 MiB 271); 2x320x64^2 and matmul 2048^2 / 4096^2 level
GEMM_B_CHUNK_BYTES = 8 << 20
#: CPU family: 1x1 convs (stride 1, no padding, one group, at least POINTWISE_MIN_PIXELS an image; the input within the
#: workspace budget) as _gemm's batched GEMM, an image a batch: B packed straight from x (pack_b, in halves), the bias
#: in gemm_cpu's epilogue. They took the direct kernel (K up to DIRECT_MAX_K: DCO x 32 tiles, 8 accumulators on AVX2)
#: or im2col. 2-core AVX2 EPYC, medians of 7 in one process, direct / im2col -> this (PyTorch):
#: 2x320x64^2 320 -> 320 57.5 / 26.8 -> 14.5 ms (20.3), 2x320x64^2 320 -> 640 54.5 / 35.0 -> 27.1 (50.1),
#: 2x1280x16^2 1280 -> 1280 22.3 / 16.7 -> 13.9 (12.1), 1x512x256^2 512 -> 256 265 / 270 -> 164 (267),
#: 8x64x56^2 64 -> 256 15.1 / 13.0 -> 9.5 (34.4). Under 64 pixels an image (32x512x7^2: 9.2 against im2col's 8.9)
#: the partial 32-column panel of every image costs what the packing saves.
POINTWISE_GEMM = True
#: CPU family: a linear layer of at most LINEAR_TRANSPOSED_MAX_ROWS input rows and at least LINEAR_TRANSPOSED_RATIO
#: times as many outputs (a text encoder's 77 tokens, a UNet's 8^2 and 16^2 levels) as y^T = w x^T: the float32 weight
#: read as stored (gemm_cpu's A; its pack was a pass over the whole weight for few rows: 9 of 35 ms for 256 x 1280 ->
#: 10240), only x packed, the result stored transposed, the bias in the epilogue. 2-core Intel Xeon with AVX-512, medians
#: of 11 alternating in one process (PyTorch): 256 x 1280 -> 10240 32.0 -> 25.1 ms (23.2), 77 x 768 -> 3072 3.18 -> 1.97
#: (1.35), 77 x 4096 -> 4096 19.4 -> 14.3 (10.3), 256 x 5120 -> 1280 16.5 -> 12.2 (9.9), 320 x 1024 -> 2048 6.11 ->
#: 5.66; 512 rows level (512 x 640 -> 5120 15.2 / 14.6, 512 x 1280 -> 1280 6.04 / 6.13), 1024 rows slower
LINEAR_TRANSPOSED = True
LINEAR_TRANSPOSED_MAX_ROWS = 384
LINEAR_TRANSPOSED_RATIO = 2
POINTWISE_MIN_PIXELS = 64

#: gemm_cpu's work order (build option GM, gemm_grouped): where packed A is over twice this many bytes, its row blocks
#: go in groups of about this many bytes, each group taken down one column tile at a time, so that the group's A stays
#: in L3 while the B panels stream (row blocks fastest streamed all of A once a column tile: 16 MiB at 2048^2).
#: 2-core AVX2 EPYC, medians of 13 alternating with PyTorch and a control: 2048^2 141.3 -> 129.7 ms; 4096^2 1004 ->
#: 902 (6 MiB groups: 964; baseline timed first); 1024^2 and linear shapes with A under 8 MiB level. 0: off
GEMM_GROUP_BYTES = 3 << 20


#: the same on wide vectors (AVX-512), in bytes of the device's local memory (PoCL: a core's L2): groups that stay in
#: L2. 2-core Intel Xeon with AVX-512 (2 MiB L2 a core), medians of 15 alternating in one process: 1000^2 6.93 -> 6.55
#: ms, 1024^2 7.87 -> 7.19 (groups of 4 row blocks, 768 KiB; 2: level, 8 and 16: 3-6% slower than 4), 2048^2 level
GEMM_GROUP_L2_FRACTION = 0.5


#: gemm_cpu on wide vectors (the backend's gemm_one_block_k): K over KC and up to this many in one block of KC = this
#: (KP 256), not KC and a short tail (K = 320: 256 + 64). 2-core Intel Xeon with AVX-512, medians of 11-15 alternating in
#: one process: 2x320x64^2 320 -> 320 (Winograd, its 16 products K = 320) 31.6 -> 28.6 ms (a later run on a noisier
#: host: 36.5 -> 36.2, 37.7 -> 36.8), linear 4096 x 320 -> 320 3.38 -> 3.29 (3.69 -> 3.54), 1024^2 x 512 4.44 -> 4.28;
#: 4096 x 320 -> 1280 and 4096 x 512 -> 512 level
GEMM_ONE_BLOCK_K = 512


def gemm_grouped(params: dict, rows: int, K: int, col_tiles: int, group_bytes: int | None = None,
                 one_block_k: int = 0) -> dict:
    """gemm_cpu's build options for a product of ``rows`` rows, K deep, over ``col_tiles`` column tiles (a launch's
    dimension 1): GM, a power of two (few builds), where A is over two groups of ``group_bytes`` (the backend's
    gemm_group_bytes); KC = ``one_block_k`` where K is over KC and within it (the backend's gemm_one_block_k)."""
    if one_block_k and params["KC"] < K <= one_block_k:
        params = dict(params, KC=one_block_k, KP=max(params["KP"], 256))
    group_bytes = GEMM_GROUP_BYTES if group_bytes is None else group_bytes
    block = 4 * params["MR"] * params["MSUB"] * max(1, K)  # bytes of one row block's packed A
    g = group_bytes // block
    g = min(64, 1 << (max(1, g).bit_length() - 1))  # (under 2 blocks, K is so long that one A panel fills L2)
    big = -(-rows // (params["MR"] * params["MSUB"])) * block > 2 * group_bytes
    return dict(params, GM=g) if group_bytes and g >= 2 and col_tiles > 1 and big else params


#: default tunables per family/file
DEFAULT_TUNE = {
    # PFB / PFA: gemm_cpu's prefetches of B's and packed A's rows ahead (gemm_cpu.cl)
    "gemm_cpu.cl": {"MR": 12, "MSUB": 4, "KC": 256, "KP": 128, "PFB": 32, "PFA": 64},
    "w8a8_cpu.cl": {"MR": 12, "MSUB": 4, "KC": 256, "PK": PACK_K},
    "conv_cpu.cl": {"DCO": 8, "TN": 32},  # the direct kernels' tile: output channels x columns
    # wino_wgemm's register tile (output x input channels), tiles a vector step and fold interval (32-tile groups)
    "winograd_wgrad_cpu.cl": {"PK": PACK_K, "RM": 4, "RN": 2, "VW": 16, "KG": 8},
}
#: on a CPU device whose float vectors are at most 8 wide (AVX2: 16 ymm registers; tuning.py): gemm_cpu's
#: 32-column tile in two passes of 6 x 16 (measured on a 2-core AVX2 EPYC, 1000-2048 squared, medians of 7
#: alternating with PyTorch: 0.99-1.05 of its GFLOPS; MR 12 x 32: 0.40-0.48); the direct convs' tile of 4
#: output channels (8 spilled every accumulator: 16x3x64^2 -> 32 6.5 -> 3.2-3.5 ms, 16x32x64^2 -> 3 11.8 ->
#: 4.8-7.0, 16x16x64^2 -> 32 21.8 -> 10.8-14.9) x 16 columns (TN; 4 x 32 still spilled 7 of its 16 accumulators
#: and the weight offsets; 4 x 16 keeps 8 accumulators, the input and the broadcast in registers: same process,
#: medians of 5-9 blocks, 1x16x512^2 16 -> 16 28 -> 17-22 ms, 1x3x1024^2 3 -> 16 27 -> 20, 16 -> 3 9.9 -> 5.6,
#: 1x8x256^2 8 -> 8 3.6 -> 1.3; 3, 5 and 6 x 16 slower or even)
NARROW_TUNE = {
    "gemm_cpu.cl": {"MR": 6, "MSUB": 4, "NH": 2, "KC": 512, "KP": 256},
    "conv_cpu.cl": {"DCO": 4, "TN": 16},
    "winograd_wgrad_cpu.cl": {"PK": PACK_K, "RM": 4, "RN": 2, "VW": 8, "KG": 8},
}



def _direct_spec(KH, KW, sh, sw, dh, dw) -> dict:
    """Build options that specialise the CPU direct conv kernels on their geometry: only for the
    common square kernels with stride 1-2 and no dilation (a few builds in all); others {}."""
    if KH == KW and KH <= 7 and sh == sw and sh <= 2 and dh == dw == 1:
        return {"SPEC_KH": KH, "SPEC_KW": KW, "SPEC_SH": sh, "SPEC_SW": sw, "SPEC_DH": 1, "SPEC_DW": 1}
    return {}



# ---- conv2d weight gradient (backend/ops/convgrad.py, kernels/conv_grad_cpu.cl) -------------------------
#: registered here (not in the shared runtime table): an OpenCL-only packing kernel
KFILES["wgrad_pack_b"] = ("conv_grad_cpu.cl", False)
SIGS["wgrad_pack_b"] = [None, np.int64, None] + [np.int32] * 16
KFILES["col2im_gather"] = ("conv_grad_cpu.cl", False)
SIGS["col2im_gather"] = [None, np.int64, None, np.int64] + [np.int32] * 13 + [np.int64, np.int32]
KFILES["wgrad_pack_x"] = ("conv_grad_cpu.cl", False)
SIGS["wgrad_pack_x"] = [None, np.int64, None] + [np.int32] * 8

# ---- Adam / AdamW step (backend/learn/optim.py, kernels/elementwise.cl's adam_step) ----------------------
KFILES["adam_step"] = ("elementwise.cl", False)
SIGS["adam_step"] = [None, np.int64] * 5 + [None] * 4 + [np.int64, np.int64, np.float32, np.int32] + \
    [np.float32] * 5 + [np.int32]

# ---- where with contiguous / one-element operands (kernels/elementwise.cl's where_flat) ------------
KFILES["prelu_ch"] = ("elementwise.cl", False)
SIGS["prelu_ch"] = [None, np.int64] * 3 + [np.int64] * 4
KFILES["where_flat"] = ("elementwise.cl", False)
SIGS["where_flat"] = [None, np.int64] * 4 + [np.int64, np.int64, np.int32]

# ---- batch norm in training mode, fused (kernels/batchnorm.cl; norms.py) ---------------------------------
KFILES["bn_train"] = ("batchnorm.cl", False)
SIGS["bn_train"] = [None, np.int64] * 7 + [np.int64] * 3 + [np.float32] * 5 + [np.int32]
KFILES["bn_grad"] = ("batchnorm.cl", False)
SIGS["bn_grad"] = [None, np.int64] * 5 + [np.int64] * 3 + [np.float32] * 2 + [np.int32]

# ---- cross entropy with class-index targets, fused (kernels/loss.cl; losses.py) ---------------------------
KFILES["ce_rows"] = ("loss.cl", False)
SIGS["ce_rows"] = [None, np.int64, None, None, np.int64] + [np.int64] * 4
KFILES["ce_grad"] = ("loss.cl", False)
SIGS["ce_grad"] = [None, np.int64, None, None, np.int64, np.int32, np.float32, None, np.int64] + [np.int64] * 4
