"""One typed description of every kernel's arguments, and the launch helpers built from it.

Each kernel is ``KernelSig(file, types)`` where ``types`` spells its arguments in order:
``b`` a buffer (OpenCL ``cl.Buffer`` / CUDA device array), ``i`` int32, ``l`` int64 (``OFF_T``
offsets and sizes), ``f`` float32. The OpenCL backend gets its ``set_scalar_arg_dtypes`` list from
it (``cl_scalar_dtypes``), the CUDA backend its argument tuple (``pack_args``), and the PoCL test
harness of the CUDA kernels both: a kernel launched by two backends is described once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_NP = {"i": np.int32, "l": np.int64, "f": np.float32}


@dataclass(frozen=True)
class KernelSig:
    file: str
    types: str   # one letter per argument: b (buffer), i (int32), l (int64), f (float32)

    def __post_init__(self):
        bad = set(self.types) - set("bilf")
        if bad:
            raise ValueError(f"kernel signature {self.types!r}: unknown argument types {sorted(bad)}")

    @property
    def nargs(self) -> int:
        return len(self.types)


def _s(file: str, *parts: str) -> KernelSig:
    return KernelSig(file, "".join(p.replace(" ", "") for p in parts))


#: kernel name -> signature. Portable kernels (built for OpenCL and CUDA) and backend-only ones.
KERNELS: dict[str, KernelSig] = {
    # OpenCL elementwise / reductions (kernels/elementwise.cl)
    "probe_kernel": _s("", "b"),
    "unary": _s("elementwise.cl", "b l b l l l i f f i i"),
    "binary_flat": _s("elementwise.cl", "b l b l b l l l i i f f"),
    "binary_nd": _s("elementwise.cl", "b l b l b l l l i b"),
    "copy_nd": _s("elementwise.cl", "b l b l l l b"),
    "cast_from_f32": _s("elementwise.cl", "b l b l l i"),
    "cast_to_f32": _s("elementwise.cl", "b l b l l i"),
    "where_nd": _s("elementwise.cl", "b l b l b l b l l l b"),
    "pad2d": _s("elementwise.cl", "b l b l i i i i i i i"),
    "reduce_ori": _s("elementwise.cl", "b l b l l l l l l i f"),
    "norm_rows": _s("elementwise.cl", "b l b l l l f f"),
    "norm_rows_wg": _s("elementwise.cl", "b l b l l l f f"),
    "norm_rows_aff": _s("elementwise.cl", "b l b l l l f f b l b l i l l l"),
    "softmax_rows": _s("elementwise.cl", "b l b l b l l l l i"),
    "softmax_tile": _s("elementwise.cl", "b l b l b l l l l i l"),
    "gemm_small": _s("elementwise.cl", "i i i b l i i l b l i i l b l b i i"),
    # fused attention, both OpenCL families (kernels/attention.cl): q, kt, v, mask, y, sizes
    "att_cpu": _s("attention.cl", "b l l l", "b l l l", "b l l l", "b l l l l i i", "b l", "i i i i f i"),
    "att_cpu_rows": _s("attention.cl", "b l l l", "b l l l", "b l l l", "b l l l l i i", "b l", "i i i i f i"),
    # OpenCL CPU family
    "pack_a": _s("gemm_cpu.cl", "i i b l i i l b b l"),
    "pack_b": _s("gemm_cpu.cl", "i i b l i i l b b l"),
    "gemm_cpu": _s("gemm_cpu.cl", "i i i b l b l b l i l b i i i l i"),
    "im2col_pack": _s("conv_cpu.cl", "b l b", "i" * 16),
    "conv2d_direct": _s("conv_cpu.cl", "b l b l b l b i", "i" * 17, "b"),
    "conv_t2d_direct": _s("conv_cpu.cl", "b l b l b l b i", "i" * 17),
    "wino_filter": _s("winograd_cpu.cl", "b l b i i b b l"),
    "wino_in": _s("winograd_cpu.cl", "b l b", "i" * 9, "b l l"),
    "wino_out": _s("winograd_cpu.cl", "b i l b l b i", "i" * 7, "b l i"),
    "wino_fused": _s("winograd_cpu.cl", "b l b l", "i" * 6, "b l b i", "i" * 7, "b l i b b"),
    "wino_gy": _s("winograd_wgrad_cpu.cl", "b l b", "i" * 7, "b i"),
    "wino_wgemm": _s("winograd_wgrad_cpu.cl", "b b i i i b l i"),
    "wino_wgrad_out": _s("winograd_wgrad_cpu.cl", "b i i i b l"),
    # GPU kernels: the CUDA backend's, also built as OpenCL C for the OpenCL GPU family
    "ad_conv_gemm": _s("conv_gemm_cuda.cu", "i i i b i i l b i i l b i l b i", "i" * 15, "i i", "b l b l"),
    "ad_splitk_reduce": _s("conv_gemm_cuda.cu", "b b b i i i i i i l i i i"),
    "ad_dequant": _s("dequant.cu", "b b l b l"),
    "ad_pad": _s("misc_cuda.cu", "b b", "i" * 8),
    "ad_unary": _s("misc_cuda.cu", "b b l i f f i"),
    "ad_direct_conv": _s("misc_cuda.cu", "b b b i b", "i" * 18),
    "ad_window2d": _s("window.cu", "b b b b b b", "i" * 8),
    "ad_window2d_px": _s("window.cu", "b b b b b b", "i" * 8),
    "ad_window_rows": _s("window.cu", "b b b b", "i" * 6),
    # W8A8 linear (backend/ops/w8a8.py): the portable kernels (CUDA, OpenCL GPU family; runtime/w8a8.py) and
    # the OpenCL CPU family's (kernels/w8a8_cpu.cl)
    "ad_w8a8_rows": _s("w8a8.cu", "b l b b i i i"),
    "ad_w8a8_gemm": _s("w8a8.cu", "b i b b b b i b i i i"),
    "w8a8_rows_cpu": _s("w8a8_cpu.cl", "b l b b i i"),
    "w8a8_pack_b": _s("w8a8_cpu.cl", "b b i i"),
    "w8a8_gemm_cpu": _s("w8a8_cpu.cl", "b b b b b i b i i i"),
    # fused attention, the GPU family (OpenCL and CUDA) in the portable subset (kernels/attention.cu): att_cpu's arguments
    "ad_attention": _s("attention.cu", "b l l l", "b l l l", "b l l l", "b l l l l i i", "b l", "i i i i f i"),
    "ad_norm_rows_affine": _s("norm_cuda.cu", "b b b b", "i i i i i i", "f"),
    "ad_norm_split_sum": _s("norm_split_cuda.cu", "b b", "i i i"),
    "ad_norm_split_dev": _s("norm_split_cuda.cu", "b b b", "i i i"),
    "ad_norm_split_apply": _s("norm_split_cuda.cu", "b b b b b b", "i i i i i i i", "f"),
    "ad_unary_h": _s("elementwise_half_cuda.cu", "b b l i f f i"),
    "ad_to_half": _s("elementwise_half_cuda.cu", "b b l"),
    "ad_from_half": _s("elementwise_half_cuda.cu", "b b l"),
    "ad_binary_h": _s("elementwise_half_cuda.cu", "b b b l i", "l l l l f"),
    "ad_attention_mma": _s("attention_mma.cu", "b l l l", "b l l l", "b l l l", "b l l l l i i", "b l", "i i i i f i"),
}


def cl_scalar_dtypes(name: str) -> list:
    """pyopencl's ``set_scalar_arg_dtypes`` list for a kernel (None for buffers)."""
    return [None if t == "b" else _NP[t] for t in KERNELS[name].types]


def pack_args(name: str, args) -> tuple:
    """A CUDA launch's argument tuple: scalars as the NumPy types the kernel declares, buffers as
    given. Raises ValueError naming the kernel when the count is wrong."""
    types = KERNELS[name].types
    if len(args) != len(types):
        raise ValueError(f"kernel {name} takes {len(types)} arguments, got {len(args)}")
    return tuple(a if t == "b" else _NP[t](a) for t, a in zip(types, args))
