"""The one runtime every compiled-kernel backend (OpenCL, CUDA, any future device) shares.

* ``store``: the cache folder and small JSON stores (tuning results, device checks) with atomic,
  process-safe writes; a corrupt file is rebuilt with a logged warning.
* ``binaries``: an on-disk store of built program binaries keyed by device, driver, source hash
  and build options, each entry checksummed (a corrupt entry is dropped and rebuilt).
* ``signatures``: one typed description of each kernel's arguments (which are buffers, which
  32/64-bit integers or floats) and the launch helpers built from it: the OpenCL scalar dtypes
  list and the CUDA argument tuple.

A backend module keeps only its device probing and its op code (README, "Adding a backend").
"""
from .binaries import BinaryStore, program_digest
from .signatures import KERNELS, KernelSig, cl_scalar_dtypes, pack_args
from ...system.store import JsonStore, cache_dir

__all__ = ["BinaryStore", "program_digest", "KERNELS", "KernelSig", "cl_scalar_dtypes", "pack_args",
           "JsonStore", "cache_dir"]
