"""CUDA / ROCm backend: the pack's own kernels, compiled at run time through CuPy (NVRTC / hipRTC).

Serves the registry names ``cuda`` and ``rocm`` (the registry falls back to PyTorch's path, with
the reason, when this module says unavailable; ``torch-cuda`` / ``torch-rocm`` always name
PyTorch/cuDNN). Native arrays are ``cupy.ndarray`` (float32).

* GEMM, conv2d and conv_transpose2d run the pack's CUDA kernel (kernels/conv_gemm_cuda.cu:
  double-buffered tiles, 16-byte loads, split K with an ordered reduction; tile and split chosen
  per problem from a model fitted on an H100), in FP32, or its TF32 tensor-core branch with
  ``ANYDEVICE_ALLOW_TF32=1`` on sm_80+. The OpenCL backend's GPU family builds the same kernel
  as OpenCL C.
  Convolutions with few output channels per group (depthwise, SSIM's blur) use a direct kernel
  (kernels/misc_cuda.cu).
* scaled_dot_product_attention: the fused kernel "attention" (kernels/attention.cu, the portable
  GPU-family kernel: shared-memory K^T / V tiles, online softmax; only the output in memory).
* Pad and unary ops are kernels of kernels/misc_cuda.cu; binary ops (broadcasting), concat and
  reductions (float64 accumulation for sum/mean) are CuPy's own kernels.
* torch tensors on the GPU come in and go out through DLPack (zero copy, never through the host);
  every op runs on PyTorch's current stream of the device (CuPy's current stream is set to it), so
  work queued by ComfyUI on a side stream is ordered correctly.
* Tile configurations: per compute capability candidates (``TILES``), chosen with the K split per
  problem (``CudaLinalg._plan``); ``CudaBackend.tune()`` times the candidates and stores the winners in
  ``$ANYDEVICE_CACHE_DIR/cuda_tiles.json`` (default ~/.cache/anydevice), read back at start.
  Compiled kernels go to CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``, by default
  ``$ANYDEVICE_CACHE_DIR/cupy``); memory comes from CuPy's memory pool.

This module imports without CuPy (``probe`` says why it is unavailable; the CI compile check
reads ``shipped_configs`` and ``kernel_source`` from here).

Layout: ``tiles.py`` (tile tables, modes, shipped configurations, source assembly; no CuPy
needed), ``device.py`` (probe, ``create``), ``backend.py`` (the device object: streams, DLPack,
conversion, elementwise, reductions, tuning), ``linalg.py`` (GEMM and convolutions: the plan
model and the launches), ``attention.py`` (the fused attention). Kernel signatures and the tuning store are the shared runtime's.
"""
from __future__ import annotations

from .device import _describe, probe, selfcheck_identity
from .tiles import (BLOCK, CACHE_NAME, DIRECT_MAX_COUT_G, GRID_YZ_MAX, INSTALL_HINT, KERNELS_DIR, MAX_KSPLIT,
                    MIN_KSLICE, MISC, OWN_GEMM, OWN_MODES, TILE_EFFICIENCY, TILES, UNARY_CODES, _O_L,
                    _O_M, _O_S, _O_W, _O_W16, _O_WW, _O_X, SINGLE_CHAIN, plan, _T_L, _T_M, _T_S, build_options, kernel_source, mode_fits,
                    shipped_configs, vec_fits)

__all__ = ["BLOCK", "CACHE_NAME", "DIRECT_MAX_COUT_G", "GRID_YZ_MAX", "INSTALL_HINT", "KERNELS_DIR", "MAX_KSPLIT",
           "MIN_KSLICE", "MISC", "OWN_GEMM", "OWN_MODES", "TILE_EFFICIENCY", "TILES", "UNARY_CODES",
           "_O_L", "_O_M", "_O_S", "_O_W", "_O_W16", "_O_WW", "_O_X", "SINGLE_CHAIN", "plan", "_T_L", "_T_M", "_T_S", "build_options",
           "kernel_source", "mode_fits", "shipped_configs", "vec_fits", "_describe", "create", "probe", "selfcheck_identity",
           "CudaBackend"]


def create(name: str = "cuda", index: int = 0):
    """The CUDA (or ROCm: ``name="rocm"``) backend on device ``index`` (needs CuPy)."""
    from .backend import CudaBackend
    return CudaBackend(name, index)


def __getattr__(name):
    # CudaBackend is imported on first use: the package (and the CI compile check) loads without CuPy
    if name == "CudaBackend":
        from .backend import CudaBackend
        return CudaBackend
    raise AttributeError(name)
