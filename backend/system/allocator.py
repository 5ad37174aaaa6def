"""The host allocator's thresholds (glibc's malloc), fixed once when a host-compute backend starts.

By default glibc serves blocks from 128 KiB up with mmap, raises that threshold as such blocks are freed
(up to 32 MiB) and trims the heap's free top past twice the threshold: a training step's temporaries
(a few hundred KiB to a few MiB each, allocated and freed a hundred times a step) then keep going back
to the kernel and page-faulting in again. Fixed thresholds keep them in the heap. Measured on the
2-core AMD EPYC, alternating processes: the NumPy digits CNN step 4.7-5.3 -> 3.5-3.6 ms, the residual
denoiser step 390-410 -> 350-370 ms; the denoiser's step frees several 8-9 MiB arrays at once, so a 64 MiB
trim threshold still gave memory back every step: 256 MiB took its process CPU time from 610-660 to 510-540 ms
a step (1 GiB: 545-575, no better). The heap keeps at most TRIM_BYTES of free memory at its top;
blocks over MMAP_BYTES (model weights) are still mapped and unmapped on their own.

Not applied where the user set malloc's own variables (GLIBC_TUNABLES, MALLOC_*_), where the C library
is not glibc, or with ANYDEVICE_MALLOC_TUNE=0.
"""
from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading

from . import config

log = logging.getLogger("anydevice")

#: mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: blocks of at most this many bytes come from the heap
MMAP_BYTES = 32 << 20
#: the heap gives its free top back to the kernel past this many bytes
TRIM_BYTES = 256 << 20

_lock = threading.Lock()
_state: list = []  # the outcome, once: a line for the log


def _user_set() -> bool:
    return any(k == "GLIBC_TUNABLES" or (k.startswith("MALLOC_") and k.endswith("_")) for k in os.environ)


def tune() -> str:
    """Fix glibc's mmap and trim thresholds (once per process); what was done, as a line."""
    with _lock:
        if _state:
            return _state[0]
        if not config.get("ANYDEVICE_MALLOC_TUNE"):
            why = "left as it is (ANYDEVICE_MALLOC_TUNE=0)"
        elif _user_set():
            why = "left as it is (malloc's own variables are set)"
        elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            why = "left as it is (not glibc)"
        else:
            try:
                libc = ctypes.CDLL("libc.so.6")
                ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1
                why = (f"mmap threshold {MMAP_BYTES >> 20} MiB, trim threshold {TRIM_BYTES >> 20} MiB" if ok
                       else "mallopt refused the thresholds")
            except (OSError, AttributeError) as exc:
                why = f"left as it is ({exc})"
        _state.append(why)
    log.debug("AnyDevice: host allocator: %s", why)
    return why
