"""Built OpenCL programs: in memory, and as binaries in the shared runtime's BinaryStore (keyed by
device, driver, source and options; a corrupt entry is rebuilt)."""
from __future__ import annotations

import logging
import os
import threading
import time
import warnings

from ..runtime import BinaryStore, program_digest
from .device import _cl, _device_key, cache_root

log = logging.getLogger("anydevice")


def _driver_caches_code(dev) -> bool:
    """True for PoCL with its kernel cache on (POCL_KERNEL_CACHE, the default). PoCL generates a kernel's
    native code at its first launch and keeps it in its own cache. Asking it for a program's binary
    makes it generate every kernel of the program at once: 5.9 s for elementwise.cl on a 2-core EPYC,
    at first use. A rebuild from source on its warm cache costs about 50 ms more than loading a stored
    binary, so PoCL's programs are not stored here."""
    try:
        pocl = "Portable Computing Language" in dev.platform.name
    except Exception:  # noqa: BLE001 - an odd driver: store as before
        return False
    return pocl and os.environ.get("POCL_KERNEL_CACHE", "1") != "0"


def quiet(options: str) -> str:
    """Build options with ``-w`` (OpenCL's "inhibit all warning messages"): PoCL's in-process compiler
    prints its diagnostics' count ("102 warnings generated.") straight to the process's stderr (the
    terminal, ComfyUI's log) where the CPU has no AVX-512 (clang's -Wpsabi on float16 arguments); errors
    still come back in the build log. Not part of a program's digest (the code is the same)."""
    return f"{options} -w".strip()


class ProgramCache:
    """Built programs, in memory and on disk (binary keyed by device, driver, source, options)."""

    def __init__(self, ctx, dev):
        self.ctx, self.dev = ctx, dev
        self.key = _device_key(dev)
        self.mem: dict[str, object] = {}
        self.stats = {"disk_hits": 0, "builds": 0, "rebuilt_corrupt": 0}
        self.lock = threading.Lock()
        self.store_binaries = not _driver_caches_code(dev)

    def path_for(self, digest: str):
        return self.store().path_for(digest)

    def store(self) -> BinaryStore:
        return BinaryStore(cache_root() / "programs")

    def digest(self, source: str, options: str) -> str:
        return program_digest(self.key, source, options)

    def _build_log(self, low) -> str:
        """The device's build log of the program ``low`` ("" where the driver gives none)."""
        try:
            return low.get_build_info(self.dev, _cl().program_build_info.LOG) or ""
        except Exception:  # noqa: BLE001 - the log only explains; it never fails a build
            return ""

    def build(self, source: str, options: str = ""):
        cl = _cl()
        d = self.digest(source, options)
        with self.lock:
            if d in self.mem:
                return self.mem[d]
            store = self.store()
            prg = None
            existed = store.path_for(d).exists()
            payload = store.load(d)
            if payload is None and existed:
                self.stats["rebuilt_corrupt"] += 1
            if payload is not None:
                try:
                    low = cl._cl._Program(self.ctx, [self.dev], [payload])
                    low.build(quiet(options).encode(), [self.dev])
                    prg = cl.Program(low)
                    self.stats["disk_hits"] += 1
                except Exception as exc:
                    log.debug("opencl: cached binary %s did not load (%s); rebuilding", d[:10], exc)
                    self.stats["rebuilt_corrupt"] += 1
                    store.drop(d)
                    prg = None
            if prg is None:
                t0 = time.perf_counter()
                low = cl._cl._Program(self.ctx, source)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        low.build(quiet(options).encode(), [self.dev])
                except Exception as exc:
                    raise RuntimeError(f"OpenCL build failed: {exc}\n{self._build_log(low)}".strip()) from None
                self.stats["builds"] += 1
                blog = self._build_log(low).strip()
                if blog:
                    log.debug("opencl: build log of %s: %s", d[:10], blog[:4000])
                log.debug("opencl: built program %s in %.2f s", d[:10], time.perf_counter() - t0)
                prg = cl.Program(low)
                try:
                    if self.store_binaries:
                        store.save(d, bytes(low.get_info(cl.program_info.BINARIES)[0] or b""))
                except Exception as exc:
                    log.debug("opencl: could not store program binary: %s", exc)
            self.mem[d] = prg
            return prg

