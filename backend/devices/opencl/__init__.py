"""OpenCL backend: the pack's own kernels (kernels/*.cl) through pyopencl, on any OpenCL device.

Two kernel families, chosen by device type (``ANYDEVICE_OPENCL_FAMILY=cpu|gpu`` forces one):

* CPU family (CPU devices such as PoCL): GEMM on packed operands, each work item holding a
  block of C in float16 vectors (12 x 32 with AVX-512, 6 x 16 twice with AVX2 or narrower: the
  defaults follow the vector width, tuning.py), K walked in cache blocks (kernels/gemm_cpu.cl); direct
  convolutions for small reductions and im2col-into-packed-panels + GEMM otherwise; a
  phase-decomposed direct transposed convolution (kernels/conv_cpu.cl).
* GPU family: the CUDA backend's kernels built as OpenCL C: kernels/conv_gemm_cuda.cu (tiled,
  double-buffered GEMM / implicit-GEMM conv with split K; tiles and plan in runtime/conv_gemm.py)
  and misc_cuda.cu's direct conv for few output channels per group.

Elementwise, copy, pad and reduction kernels (kernels/elementwise.cl) serve both families.

Data stays on the device as ``CLArray`` (shape + pooled buffer + element offset, always
C-contiguous); buffers come from a per-backend pool and go back to it when the last array that
references them is dropped. The queue is in-order, so a buffer returned to the pool while a
kernel still reads it can only be overwritten by commands queued after that kernel.

Every GEMM-like reduction sums in two levels (partial sums folded into totals every 64-256
values of k) and reductions use Neumaier-compensated sums, so long sums keep FP32 precision.

Caches (under ``ANYDEVICE_CACHE_DIR``, default ``~/.cache/anydevice``, folder ``opencl/``):
built program binaries keyed by device, driver version, source hash and build options
(corrupt or stale entries are rebuilt), the device check results and the auto-tune results.
Auto-tuning (``ANYDEVICE_OPENCL_TUNE=1``; off by default) times a few GEMM variants per shape
class for at most 10 s and stores the winner per device and driver.

Layout: ``device.py`` (enumeration, probe, build check, ``create``), ``backend.py`` (the device
object and its non-GEMM ops), ``linalg.py`` (GEMM and convolutions), ``memory.py`` (arrays and the
buffer pool), ``programs.py`` (built programs), ``params.py`` (codes, thresholds, tunables),
``tuning.py`` (the tunables by vector width, the stored tuning and the auto-tuner). The
program binaries, tuning store and kernel signatures are the shared runtime's (``backend/runtime``).
"""
from __future__ import annotations

from .backend import OpenCLBackend
from .device import (_describe, _device_key, _enumerate, _is_gpu, _usable, cache_root, probe, selfcheck_identity,
                     usable_device)
from .memory import BufferPool, CLArray
from .params import KFILES, SIGS
from .programs import ProgramCache
from ..runtime.binaries import MAGIC as _MAGIC


def create(name: str = "opencl", index: int = 0, family: str | None = None,
           limits: dict | None = None) -> OpenCLBackend:
    """The OpenCL backend on the ``index``-th usable device (``family``: force the "cpu" or "gpu"
    kernel family; ``limits``: a smaller group size / local memory than the device's, to emulate a
    small GPU)."""
    return OpenCLBackend(usable_device(index), index=index, family=family, limits=limits)


__all__ = ["OpenCLBackend", "BufferPool", "CLArray", "ProgramCache", "KFILES", "SIGS", "_MAGIC", "_describe",
           "_device_key", "_enumerate", "_is_gpu", "_usable", "cache_root", "create", "probe", "selfcheck_identity",
           "usable_device"]
