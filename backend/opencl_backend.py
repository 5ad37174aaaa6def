"""OpenCL backend: the pack's own kernels (kernels/*.cl) through pyopencl, on any OpenCL device.

Two kernel families, chosen by device type (``ANYDEVICE_OPENCL_FAMILY=cpu|gpu`` forces one):

* CPU family (CPU devices such as PoCL): GEMM on packed operands, each work item holding an
  8x32 block of C in float16 vectors, K walked in cache blocks (kernels/gemm_cpu.cl); direct
  convolutions for small reductions and im2col-into-packed-panels + GEMM otherwise; a
  phase-decomposed direct transposed convolution (kernels/conv_cpu.cl).
* GPU family: local-memory tiled GEMM and implicit-GEMM convolutions written in the portable
  subset (kernels/gemm_gpu.cl, conv2d_gpu.cl, conv_transpose2d_gpu.cl), shared with the CUDA backend.

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
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from .contract import (UNARY_KERNEL_CODES, Backend, conv_output_size, conv_transpose_output_size,
                       unary_kernel_args, workspace_budget_bytes)
from .kernel_source import kernel_source

log = logging.getLogger("anydevice")

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"
F32 = np.float32
_MAGIC = b"ADCL1\n"
TUNE_BUDGET_S = 10.0

UNARY_CODES = UNARY_KERNEL_CODES
BINARY_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "minimum": 5, "maximum": 6}
PAD_CODES = {"zeros": 0, "reflect": 1, "replicate": 2, "circular": 3}

#: CPU family: direct conv when CinG*KH*KW is at most this (and the rows are wide enough)
DIRECT_MAX_K = 576
#: CPU family: matmuls below this many multiply-adds use the one-launch gemm_small kernel
SMALL_GEMM_MACS = 48 * 48 * 48
#: CPU family: rows of k one packing work item copies (PK in gemm_cpu.cl / conv_cpu.cl)
PACK_K = 64
#: CPU family: Winograd F(2x2,3x3) for 3x3 stride-1 ungrouped convs with at least this many
#: input and output channels (below it the transforms cost more than the multiplies saved)
WINO_MIN_CH = 32
#: CPU family: 32-tile groups one wino_out work item transforms (OB in winograd_cpu.cl)
WINO_OB = 4


def _cl():
    import pyopencl as cl
    return cl


def cache_root() -> Path:
    base = os.environ.get("ANYDEVICE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "anydevice")
    return Path(base) / "opencl"


def _device_key(dev) -> str:
    p = dev.platform
    return "|".join(str(v) for v in (p.name, p.version, dev.name, dev.vendor, dev.version, dev.driver_version))


def _describe(dev) -> str:
    cl = _cl()
    kind = "GPU" if dev.type & cl.device_type.GPU else "CPU" if dev.type & cl.device_type.CPU else "accelerator"
    return f"{dev.name.strip()} ({kind}, {dev.platform.name.strip()}, driver {dev.driver_version})"


def _is_gpu(dev) -> bool:
    return bool(dev.type & _cl().device_type.GPU)


# ----------------------------------------------------------------------------------------------
# small JSON stores (device checks, tuning) with atomic writes; never fatal
# ----------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except Exception:
        return {}


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except Exception as exc:  # a read-only cache folder must not break anything
        log.debug("opencl: could not write %s: %s", path, exc)


def _checks_path() -> Path:
    return cache_root() / "devices.json"


def _record_check(dev, ok: bool, reason: str) -> None:
    path = _checks_path()
    data = _read_json(path)
    data[_device_key(dev)] = {"ok": ok, "reason": reason[-4000:]}
    _write_json(path, data)


# ----------------------------------------------------------------------------------------------
# device enumeration / probe
# ----------------------------------------------------------------------------------------------
def _enumerate():
    """[(platform_index, device_index, device)] in preference order (GPUs first), honouring
    ANYDEVICE_OPENCL_DEVICE=platform:device. Raises RuntimeError with a reason when none."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except Exception as exc:
        raise RuntimeError(f"no OpenCL platform (ICD loader found none: {exc})") from None
    if not platforms:
        raise RuntimeError("no OpenCL platform installed (no ICD)")
    found = []
    for pi, p in enumerate(platforms):
        try:
            devs = p.get_devices()
        except Exception:
            devs = []
        for di, d in enumerate(devs):
            found.append((pi, di, d))
    if not found:
        raise RuntimeError("OpenCL platform(s) present but no device")
    env = os.environ.get("ANYDEVICE_OPENCL_DEVICE", "").strip()
    if env:
        try:
            pi, _, di = env.partition(":")
            pi, di = int(pi), int(di or 0)
        except ValueError:
            raise RuntimeError(f"ANYDEVICE_OPENCL_DEVICE={env!r} must be platform:device numbers") from None
        sel = [f for f in found if f[0] == pi and f[1] == di]
        if not sel:
            raise RuntimeError(f"ANYDEVICE_OPENCL_DEVICE={env}: no such device "
                               f"(have {', '.join(f'{a}:{b}' for a, b, _ in found)})")
        return sel
    return sorted(found, key=lambda f: (not _is_gpu(f[2]), f[0], f[1]))


def _usable():
    """(usable devices, reasons for known-bad ones) using only the on-disk check results."""
    checks = _read_json(_checks_path())
    good, bad = [], []
    for pi, di, d in _enumerate():
        rec = checks.get(_device_key(d))
        if rec is not None and not rec.get("ok", True):
            bad.append(f"{_describe(d)}: {rec.get('reason', 'failed its kernel build check')}")
        else:
            good.append((pi, di, d))
    return good, bad


def probe(name: str = "opencl") -> dict:
    """Registry probe: cheap (no kernel builds; reads cached device checks) and never raising."""
    try:
        import pyopencl  # noqa: F401
    except Exception as exc:
        return {"available": False, "reason": f"pyopencl not installed ({type(exc).__name__}: {exc})",
                "devices": []}
    try:
        good, bad = _usable()
    except Exception as exc:
        return {"available": False, "reason": str(exc), "devices": []}
    if not good:
        return {"available": False, "reason": "; ".join(bad) or "no usable OpenCL device", "devices": []}
    return {"available": True, "reason": "", "devices": [_describe(d) for _, _, d in good],
            "priority": 50 if _is_gpu(good[0][2]) else 60,
            "notes": "; ".join(bad)}


def create(name: str = "opencl", index: int = 0, family: str | None = None) -> "OpenCLBackend":
    good, bad = _usable()
    if not good:
        raise RuntimeError("; ".join(bad) or "no usable OpenCL device")
    if index >= len(good):
        raise RuntimeError(f"OpenCL device index {index} out of range ({len(good)} usable)")
    return OpenCLBackend(good[index][2], index=index, family=family)


def test_variants():
    """Extra test targets: the same device forced onto the GPU kernel family."""
    return [("opencl-gpu-family", lambda: create("opencl", 0, family="gpu"))]


# ----------------------------------------------------------------------------------------------
# program cache
# ----------------------------------------------------------------------------------------------
class ProgramCache:
    """Built programs, in memory and on disk (binary keyed by device, driver, source, options)."""

    def __init__(self, ctx, dev):
        self.ctx, self.dev = ctx, dev
        self.key = _device_key(dev)
        self.mem: dict[str, object] = {}
        self.stats = {"disk_hits": 0, "builds": 0, "rebuilt_corrupt": 0}
        self.lock = threading.Lock()

    def path_for(self, digest: str) -> Path:
        return cache_root() / "programs" / f"{digest}.bin"

    def digest(self, source: str, options: str) -> str:
        h = hashlib.sha256()
        for part in (self.key, options, source):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def build(self, source: str, options: str = ""):
        cl = _cl()
        d = self.digest(source, options)
        with self.lock:
            if d in self.mem:
                return self.mem[d]
            path = self.path_for(d)
            prg = None
            if path.exists():
                try:
                    raw = path.read_bytes()
                    if not raw.startswith(_MAGIC):
                        raise ValueError("bad header")
                    sha, payload = raw[len(_MAGIC):len(_MAGIC) + 64], raw[len(_MAGIC) + 64:]
                    if hashlib.sha256(payload).hexdigest().encode() != sha:
                        raise ValueError("checksum mismatch")
                    low = cl._cl._Program(self.ctx, [self.dev], [payload])
                    low.build(options.encode(), [self.dev])
                    prg = cl.Program(low)
                    self.stats["disk_hits"] += 1
                except Exception as exc:
                    log.debug("opencl: cache entry %s unusable (%s); rebuilding", path.name, exc)
                    self.stats["rebuilt_corrupt"] += 1
                    try:
                        path.unlink()
                    except OSError:
                        pass
                    prg = None
            if prg is None:
                t0 = time.perf_counter()
                low = cl._cl._Program(self.ctx, source)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        low.build(options.encode(), [self.dev])
                except Exception as exc:
                    try:
                        blog = low.get_build_info(self.dev, cl.program_build_info.LOG)
                    except Exception:
                        blog = ""
                    raise RuntimeError(f"OpenCL build failed: {exc}\n{blog}".strip()) from None
                self.stats["builds"] += 1
                log.debug("opencl: built program %s in %.2f s", d[:10], time.perf_counter() - t0)
                prg = cl.Program(low)
                try:
                    payload = low.get_info(cl.program_info.BINARIES)[0]
                    if payload:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        tmp = path.with_suffix(f".{os.getpid()}.tmp")
                        tmp.write_bytes(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + bytes(payload))
                        os.replace(tmp, path)
                except Exception as exc:
                    log.debug("opencl: could not store program binary: %s", exc)
            self.mem[d] = prg
            return prg


# ----------------------------------------------------------------------------------------------
# device arrays and the buffer pool
# ----------------------------------------------------------------------------------------------
class _Block:
    """One pooled buffer; goes back to the pool when the last array referencing it is dropped."""
    __slots__ = ("buf", "nbytes", "pool")

    def __init__(self, buf, nbytes, pool):
        self.buf, self.nbytes, self.pool = buf, nbytes, pool

    def __del__(self):
        pool = self.pool
        if pool is not None:
            try:
                pool.release(self.buf, self.nbytes)
            except Exception:
                pass


class BufferPool:
    """Size-bucketed free lists of cl.Buffer. A buffer is only here while no _Block holds it."""

    def __init__(self, ctx, limit_bytes: int):
        self.ctx = ctx
        self.limit = limit_bytes
        self.free: dict[int, list] = {}
        self.pooled = 0
        self.hits = 0
        self.misses = 0
        self.lock = threading.Lock()

    @staticmethod
    def bucket(nbytes: int) -> int:
        nbytes = max(64, int(nbytes))
        if nbytes <= 4096:
            return 1 << (nbytes - 1).bit_length()
        step = 1 << max(12, (nbytes - 1).bit_length() - 3)  # 8 buckets per power of two
        return -(-nbytes // step) * step

    def alloc(self, nbytes: int) -> _Block:
        size = self.bucket(nbytes)
        with self.lock:
            lst = self.free.get(size)
            if lst:
                buf = lst.pop()
                self.pooled -= size
                self.hits += 1
                return _Block(buf, size, self)
            self.misses += 1
        cl = _cl()
        try:
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
        except Exception:
            self.clear()
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size)
        return _Block(buf, size, self)

    def release(self, buf, size: int) -> None:
        with self.lock:
            if self.pooled + size <= self.limit:
                self.free.setdefault(size, []).append(buf)
                self.pooled += size
                return
        buf.release()

    def clear(self) -> None:
        with self.lock:
            for lst in self.free.values():
                for b in lst:
                    b.release()
            self.free.clear()
            self.pooled = 0


class CLArray:
    """A C-contiguous float32 array in an OpenCL buffer (read-only once made; ops never write it)."""
    __slots__ = ("shape", "block", "offset", "size", "__weakref__")
    dtype = np.dtype(np.float32)

    def __init__(self, shape, block: _Block, offset: int = 0):
        self.shape = tuple(int(s) for s in shape)
        self.block = block
        self.offset = int(offset)
        self.size = math.prod(self.shape)

    @property
    def buffer(self):
        return self.block.buf

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def __repr__(self):
        return f"CLArray(shape={self.shape}, offset={self.offset})"


def _contig_strides(shape):
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def _collapse(shape, *stride_sets):
    """Drop size-1 dims and merge dims that are contiguous in every stride set."""
    dims = [(s, [st[i] for st in stride_sets]) for i, s in enumerate(shape) if s != 1]
    if not dims:
        return (1,), [(1,) for _ in stride_sets]
    out = [dims[0]]
    for s, st in dims[1:]:
        ps, pst = out[-1]
        if all(pst[j] == st[j] * s for j in range(len(st))):
            out[-1] = (ps * s, st)
        else:
            out.append((s, st))
    shape2 = tuple(s for s, _ in out)
    return shape2, [tuple(st[j] for _, st in out) for j in range(len(stride_sets))]


def _direct_spec(KH, KW, sh, sw, dh, dw) -> dict:
    """Build options that specialise the CPU direct conv kernels on their geometry: only for the
    common square kernels with stride 1-2 and no dilation (a few builds in all); others {}."""
    if KH == KW and KH <= 7 and sh == sw and sh <= 2 and dh == dw == 1:
        return {"SPEC_KH": KH, "SPEC_KW": KW, "SPEC_SH": sh, "SPEC_SW": sw, "SPEC_DH": 1, "SPEC_DW": 1}
    return {}


# ----------------------------------------------------------------------------------------------
# the backend
# ----------------------------------------------------------------------------------------------
# scalar argument dtypes (None = buffer) of every kernel, by name
_I, _L, _F = np.int32, np.int64, np.float32
SIGS = {
    "probe_kernel": [None],
    "unary": [None, _L, None, _L, _L, _L, _I, _F, _F, _I, _I],
    "binary_flat": [None, _L, None, _L, None, _L, _L, _L, _I, _I, _F, _F],
    "binary_nd": [None, _L, None, _L, None, _L, _L, _L, _I, None],
    "copy_nd": [None, _L, None, _L, _L, _L, None],
    "pad2d": [None, _L, None, _L, _I, _I, _I, _I, _I, _I, _I],
    "reduce_ori": [None, _L, None, _L, _L, _L, _L, _L, _L, _I, _F],
    "gemm_small": [_I, _I, _I, None, _L, _I, _I, _L, None, _L, _I, _I, _L, None, _L, None, _I, _I],
    "pack_a": [_I, _I, None, _L, _I, _I, _L, None],
    "pack_b": [_I, _I, None, _L, _I, _I, _L, None],
    "gemm_cpu": [_I, _I, _I, None, _L, None, _L, None, _L, _I, _L, None, _I, _I, _I, _L, _I],
    "im2col_pack": [None, _L, None] + [_I] * 16,
    "conv2d_direct": [None, _L, None, _L, None, _L, None, _I] + [_I] * 17,
    "conv_t2d_direct": [None, _L, None, _L, None, _L, None, _I] + [_I] * 17,
    "wino_filter": [None, _L, None, _I, _I, None],
    "wino_in": [None, _L, None] + [_I] * 9 + [None],
    "wino_out": [None, _I, _L, None, _L, None, _I] + [_I] * 7,
    "gemm_gpu": [_I, _I, _I, None, _L, _I, _I, _L, None, _L, _I, _I, _L, None, _L, _I, _L, None, _I, _I, _L],
    "conv2d_gpu": [None, _L, None, _L, None, _L, None, _I] + [_I] * 16,
    "conv_transpose2d_gpu": [None, _L, None, _L, None, _L, None, _I] + [_I] * 16,
}
#: kernel name -> (source file, portable?)
KFILES = {
    "unary": ("elementwise.cl", False), "binary_flat": ("elementwise.cl", False),
    "binary_nd": ("elementwise.cl", False), "copy_nd": ("elementwise.cl", False),
    "pad2d": ("elementwise.cl", False), "reduce_ori": ("elementwise.cl", False),
    "gemm_small": ("elementwise.cl", False),
    "pack_a": ("gemm_cpu.cl", False), "pack_b": ("gemm_cpu.cl", False), "gemm_cpu": ("gemm_cpu.cl", False),
    "im2col_pack": ("conv_cpu.cl", False), "conv2d_direct": ("conv_cpu.cl", False),
    "conv_t2d_direct": ("conv_cpu.cl", False),
    "wino_filter": ("winograd_cpu.cl", False), "wino_in": ("winograd_cpu.cl", False),
    "wino_out": ("winograd_cpu.cl", False),
    "gemm_gpu": ("gemm_gpu.cl", True), "conv2d_gpu": ("conv2d_gpu.cl", True),
    "conv_transpose2d_gpu": ("conv_transpose2d_gpu.cl", True),
}
PROBE_SRC = "__kernel void probe_kernel(__global float *x) { x[get_global_id(0)] = 2.0f * x[get_global_id(0)] + 1.0f; }\n"

#: default tunables per family/file
DEFAULT_TUNE = {
    "gemm_cpu.cl": {"MR": 12, "MSUB": 4, "KC": 256, "KP": 128},
    "gemm_gpu.cl": {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "KP": 128},
    "conv2d_gpu.cl": {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "KP": 128},
    "conv_transpose2d_gpu.cl": {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "KP": 128},
}


class OpenCLBackend(Backend):
    name = "opencl"
    kind = "own"
    native_types = (CLArray,)

    def __init__(self, dev, index: int = 0, family: str | None = None):
        super().__init__(index)
        cl = _cl()
        self.cl = cl
        self.dev = dev
        fam = (family or os.environ.get("ANYDEVICE_OPENCL_FAMILY", "")).strip().lower()
        if fam not in ("", "cpu", "gpu"):
            raise RuntimeError(f"ANYDEVICE_OPENCL_FAMILY={fam!r} must be cpu or gpu")
        self.family = fam or ("gpu" if _is_gpu(dev) else "cpu")
        self.is_cpu_device = not _is_gpu(dev)
        self.ctx = cl.Context([dev])
        self.queue = cl.CommandQueue(self.ctx, dev)
        self.programs = ProgramCache(self.ctx, dev)
        self.compute_units = max(1, int(dev.max_compute_units))
        limit = min(int(dev.global_mem_size) // 4, 2 << 30)
        self.pool = BufferPool(self.ctx, limit)
        self._kernels: dict[tuple, object] = {}
        self._meta_cache: dict[tuple, object] = {}
        self._sources: dict[str, str] = {}
        self._tune = _read_json(cache_root() / "tune.json").get(_device_key(dev), {})
        self._tune_spent = 0.0
        self._lock = threading.RLock()
        self.delegated: list[str] = []  # ops handed to the host (none at present)
        self._check_device()

    # ---- device check -------------------------------------------------------------------
    def _check_device(self) -> None:
        """Build (or load from the disk cache) and run a tiny kernel; a failure marks the device."""
        cl = self.cl
        try:
            prg = self.programs.build(PROBE_SRC, "")
            k = cl.Kernel(prg, "probe_kernel")
            host = np.arange(4, dtype=F32)
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
            k.set_args(buf)
            cl.enqueue_nd_range_kernel(self.queue, k, (4,), None)
            out = np.empty(4, F32)
            cl.enqueue_copy(self.queue, out, buf, is_blocking=True)
            if not np.array_equal(out, 2 * host + 1):
                raise RuntimeError(f"test kernel computed {out.tolist()} instead of {(2 * host + 1).tolist()}")
        except Exception as exc:
            reason = f"kernel build check failed on {_describe(self.dev)}: {exc}"
            _record_check(self.dev, False, reason)
            raise RuntimeError(reason) from None
        checks = _read_json(_checks_path())
        if not checks.get(_device_key(self.dev), {}).get("ok"):
            _record_check(self.dev, True, "")

    # ---- description ---------------------------------------------------------------------
    @property
    def device(self) -> str:
        return f"{_describe(self.dev)} [{self.family} kernel family]"

    def synchronize(self) -> None:
        self.queue.finish()

    def warmup(self, op: str, *args, **kw):
        """Run an op once (building and loading its kernels) and wait for it."""
        out = getattr(self, op)(*args, **kw)
        self.synchronize()
        return out

    # ---- kernels ---------------------------------------------------------------------------
    def _source(self, fname: str, portable: bool) -> str:
        src = self._sources.get(fname)
        if src is None:
            src = kernel_source(fname, "opencl", KERNEL_DIR, prelude=portable)
            self._sources[fname] = src
        return src

    def tunables(self, fname: str, shape_class: str = "") -> dict:
        """Build-time tunables: defaults, overridden by stored tuning results for this device."""
        params = dict(DEFAULT_TUNE.get(fname, {}))
        key = f"{fname}:{shape_class}"
        if (shape_class and key not in self._tune and fname == "gemm_cpu.cl"
                and os.environ.get("ANYDEVICE_OPENCL_TUNE", "0") not in ("0", "", "false", "no")):
            self._autotune_gemm_cpu(shape_class)
        params.update(self._tune.get(fname, {}))
        params.update(self._tune.get(key, {}))
        return params

    def _autotune_gemm_cpu(self, shape_class: str) -> None:
        """Time a few gemm_cpu variants on a problem of this shape class (<= TUNE_BUDGET_S in all,
        shared by every class tuned in this process); store the winner on disk."""
        key = f"gemm_cpu.cl:{shape_class}"
        self._tune[key] = {}  # no recursion, and a failure is not retried
        left = TUNE_BUDGET_S - self._tune_spent
        if left <= 0.5:
            return
        size = {"s": 64, "m": 512, "l": 1024}
        M, N, K = (size[c] for c in shape_class)
        rng = np.random.default_rng(0)
        a = self._from_numpy(rng.standard_normal((M, K), dtype=np.float32))
        b = self._from_numpy(rng.standard_normal((K, N), dtype=np.float32))
        cands = [{}, {"MR": 8, "MSUB": 4, "KC": 128}, {"MR": 14, "MSUB": 2}, {"MSUB": 8},
                 {"KC": 512, "KP": 256}]
        t_start = time.perf_counter()
        best, best_t = None, float("inf")
        log.info("anydevice opencl: auto-tuning gemm_cpu for shape class %s (budget %.1f s)", shape_class, left)
        for i, cand in enumerate(cands):
            if time.perf_counter() - t_start > left:
                break
            params = dict(DEFAULT_TUNE["gemm_cpu.cl"], **cand)
            self._tune[key] = params
            try:
                self._gemm(M, N, K, 1, a, 0, K, 1, 0, b, 0, N, 1, 0)
                self.synchronize()
                t0 = time.perf_counter()
                self._gemm(M, N, K, 1, a, 0, K, 1, 0, b, 0, N, 1, 0)
                self.synchronize()
                dt = time.perf_counter() - t0
            except Exception as exc:
                log.info("anydevice opencl: tune candidate %s failed: %s", cand, exc)
                continue
            log.info("anydevice opencl: tune %d/%d %s: %.2f GFLOPS", i + 1, len(cands), params,
                     2.0 * M * N * K / dt / 1e9)
            if dt < best_t:
                best, best_t = params, dt
        self._tune_spent += time.perf_counter() - t_start
        self._tune[key] = best or {}
        if best:
            path = cache_root() / "tune.json"
            data = _read_json(path)
            data.setdefault(_device_key(self.dev), {})[key] = best
            _write_json(path, data)
            log.info("anydevice opencl: tuned %s -> %s", key, best)

    def _kernel(self, name: str, params: dict | None = None):
        fname, portable = KFILES[name]
        if params is None:
            params = DEFAULT_TUNE.get(fname, {})
        key = (name, tuple(sorted(params.items())))
        k = self._kernels.get(key)
        if k is None:
            opts = " ".join(f"-D{a}={b}" for a, b in sorted(params.items()))
            prg = self.programs.build(self._source(fname, portable), opts)
            k = self.cl.Kernel(prg, name)
            k.set_scalar_arg_dtypes(SIGS[name])
            self._kernels[key] = k
        return k

    def _run(self, name, gsize, lsize, *args, params=None):
        if any(g == 0 for g in gsize):
            return
        with self._lock:  # a Kernel's arguments are shared state
            k = self._kernel(name, params)
            k(self.queue, gsize, lsize, *args)

    def _meta(self, values) -> object:
        key = tuple(int(v) for v in values)
        buf = self._meta_cache.get(key)
        if buf is None:
            if len(self._meta_cache) > 512:
                self._meta_cache.clear()
            arr = np.asarray(key, dtype=np.int64)
            cl = self.cl
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=arr)
            self._meta_cache[key] = buf
        return buf

    def _flat_geometry(self, n: int):
        """(global size, local size, chunk) for the flat elementwise kernels."""
        if self.is_cpu_device:
            chunk = max(4096, -(-n // (8 * self.compute_units)))
            return (-(-n // chunk),), (1,), chunk
        return (-(-n // 256) * 256,), (256,), 1

    # ---- allocation / conversion --------------------------------------------------------
    def _empty(self, shape) -> CLArray:
        shape = tuple(int(s) for s in shape)
        return CLArray(shape, self.pool.alloc(4 * max(1, math.prod(shape))), 0)

    def _from_numpy(self, a):
        a = np.asarray(a, dtype=F32, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        out = self._empty(a.shape)
        if a.size:
            self.cl.enqueue_copy(self.queue, out.buffer, a, is_blocking=True)
        return out

    def _to_numpy(self, x):
        out = np.empty(x.shape, F32)
        if out.size:
            self.cl.enqueue_copy(self.queue, out, x.buffer, src_offset=4 * x.offset, is_blocking=True)
        return out

    def _shape(self, x):
        return x.shape

    def _reshape(self, x, shape):
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot reshape {x.shape} to {shape}")
        return CLArray(shape, x.block, x.offset)

    def _copy_strided(self, src: CLArray, s_off, shape, sstr, dst: CLArray, d_off, dstr):
        n = math.prod(shape)
        if n == 0:
            return
        shape2, (s2, d2) = _collapse(shape, sstr, dstr)
        if len(shape2) == 1 and s2[0] == 1 and d2[0] == 1:
            self.cl.enqueue_copy(self.queue, dst.buffer, src.buffer, byte_count=4 * n,
                                 src_offset=4 * s_off, dst_offset=4 * d_off)
            return
        meta = self._meta((len(shape2),) + shape2 + s2 + d2)
        g, l, chunk = self._flat_geometry(n)
        self._run("copy_nd", g, l, src.buffer, s_off, dst.buffer, d_off, n, chunk, meta)

    def _permute(self, x, axes):
        axes = tuple(int(a) for a in axes)
        if axes == tuple(range(len(axes))):
            return x
        st = _contig_strides(x.shape)
        shape = tuple(x.shape[a] for a in axes)
        out = self._empty(shape)
        self._copy_strided(x, x.offset, shape, tuple(st[a] for a in axes), out, 0, _contig_strides(shape))
        return out

    def _expand(self, x, shape):
        shape = tuple(int(s) for s in shape)
        if shape == x.shape:
            return x
        src_shape = (1,) * (len(shape) - x.ndim) + x.shape
        st = _contig_strides(src_shape)
        sstr = tuple(0 if (s == 1 and t != 1) else st[i] for i, (s, t) in enumerate(zip(src_shape, shape)))
        out = self._empty(shape)
        self._copy_strided(x, x.offset, shape, sstr, out, 0, _contig_strides(shape))
        return out

    def _concat_channels(self, parts, n, c, h, w):
        k = len(parts)
        out = self._empty((n, k * c, h, w))
        inner = c * h * w
        for i, p in enumerate(parts):
            self._copy_strided(p, p.offset, (n, inner), (inner, 1), out, i * inner, (k * inner, 1))
        return out

    def _slice1(self, x, i):
        n, k = x.shape[:2]
        rest = x.shape[2:]
        inner = math.prod(rest)
        if n == 1:
            return CLArray((1,) + rest, x.block, x.offset + i * inner)
        out = self._empty((n,) + rest)
        self._copy_strided(x, x.offset + i * inner, (n, inner), (k * inner, 1), out, 0, (inner, 1))
        return out

    def _fill(self, out: CLArray, value: float = 0.0):
        if out.size:
            self.cl.enqueue_fill_buffer(self.queue, out.buffer, np.float32(value), 4 * out.offset, 4 * out.size)

    # ---- elementwise ------------------------------------------------------------------------
    def _unary(self, op, x, **p):
        out = self._empty(x.shape)
        n = x.size
        if n == 0:
            return out
        code, p0, p1, f0, f1 = unary_kernel_args(op, p)
        g, l, chunk = self._flat_geometry(n)
        self._run("unary", g, l, x.buffer, x.offset, out.buffer, 0, n, chunk, code, p0, p1, f0, f1)
        return out

    def _binary(self, op, a, b):
        code = BINARY_CODES[op]
        if not isinstance(a, CLArray) or not isinstance(b, CLArray):
            t = b if isinstance(b, CLArray) else a
            out = self._empty(t.shape)
            n = t.size
            if n:
                g, l, chunk = self._flat_geometry(n)
                if isinstance(a, CLArray):
                    self._run("binary_flat", g, l, a.buffer, a.offset, a.buffer, a.offset, out.buffer, 0,
                              n, chunk, code, 2, 0.0, float(b))
                else:
                    self._run("binary_flat", g, l, b.buffer, b.offset, b.buffer, b.offset, out.buffer, 0,
                              n, chunk, code, 1, float(a), 0.0)
            return out
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        out = self._empty(shape)
        n = out.size
        if n == 0:
            return out
        g, l, chunk = self._flat_geometry(n)
        if a.shape == b.shape:
            self._run("binary_flat", g, l, a.buffer, a.offset, b.buffer, b.offset, out.buffer, 0,
                      n, chunk, code, 0, 0.0, 0.0)
            return out

        def bstrides(s):
            s = (1,) * (len(shape) - len(s)) + s
            st = _contig_strides(s)
            return tuple(0 if (d == 1 and t != 1) else st[i] for i, (d, t) in enumerate(zip(s, shape)))
        shape2, (sa, sb, _) = _collapse(shape, bstrides(a.shape), bstrides(b.shape), _contig_strides(shape))
        meta = self._meta((len(shape2),) + shape2 + sa + sb)
        self._run("binary_nd", g, l, a.buffer, a.offset, b.buffer, b.offset, out.buffer, 0, n, chunk, code, meta)
        return out

    # ---- padding ----------------------------------------------------------------------------
    def _pad(self, x, pads, mode):
        t, bo, l, r = pads
        lead = x.shape[:-2]
        H, W = x.shape[-2:]
        OH, OW = H + t + bo, W + l + r
        out = self._empty(lead + (OH, OW))
        P = math.prod(lead)
        if out.size == 0:
            return out
        self._run("pad2d", (OH, P), (1, 1) if self.is_cpu_device else None, x.buffer, x.offset, out.buffer, 0,
                  H, W, OH, OW, t, l, PAD_CODES[mode])
        return out

    # ---- reductions -----------------------------------------------------------------------
    def _reduce_pass(self, x: CLArray, O, R, I, opcode, scale) -> CLArray:
        """x viewed (O, R, I) -> (O, I)."""
        parts = 1
        if O * I < 4 * self.compute_units and R >= 16384:
            parts = min(256, -(-R // 4096))
        L = -(-R // parts)
        cpu = self.is_cpu_device
        lsz = (1, 1) if cpu else None
        if parts == 1:
            out = self._empty((O, I))
            self._run("reduce_ori", (I, O), lsz, x.buffer, x.offset, out.buffer, 0, O, R, I, 1, max(L, 1),
                      opcode, scale)
            return out
        tmp = self._empty((O, parts, I))
        self._run("reduce_ori", (I, O * parts), lsz, x.buffer, x.offset, tmp.buffer, 0, O, R, I, parts, L,
                  opcode, 1.0)
        out = self._empty((O, I))
        self._run("reduce_ori", (I, O), lsz, tmp.buffer, 0, out.buffer, 0, O, parts, I, 1, parts, opcode, scale)
        return out

    def _reduce(self, op, x, dims, keepdim):
        shape = x.shape
        if len(dims) == 0:
            out = self._empty(shape)
            self._copy_strided(x, x.offset, shape, _contig_strides(shape), out, 0, _contig_strides(shape))
            return out
        out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else \
            tuple(s for i, s in enumerate(shape) if i not in dims)
        count = math.prod(shape[d] for d in dims)
        opcode = {"sum": 0, "mean": 0, "max": 1, "min": 2}[op]
        if math.prod(out_shape) == 0:
            return self._empty(out_shape)
        # runs of consecutive reduced dims, reduced from the last run to the first
        runs = []
        for d in sorted(dims):
            if runs and runs[-1][1] == d:
                runs[-1][1] = d + 1
            else:
                runs.append([d, d + 1])
        cur = x
        cur_shape = list(shape)
        for ri, (s, e) in enumerate(reversed(runs)):
            O = math.prod(cur_shape[:s])
            R = math.prod(cur_shape[s:e])
            I = math.prod(cur_shape[e:])
            last = ri == len(runs) - 1
            scale = (1.0 / count if count else float("inf")) if (op == "mean" and last) else 1.0
            if R == 0 and op == "mean":
                scale = float("nan")
            cur = self._reduce_pass(cur, O, R, I, opcode, scale)
            cur_shape = cur_shape[:s] + [1] * (e - s) + cur_shape[e:]
        return self._reshape(cur, out_shape)

    # ---- matmul ------------------------------------------------------------------------------
    def _gemm(self, M, N, K, batches, A, a_off, sam, sak, a_bs, B, b_off, sbk, sbn, b_bs, out_shape=None):
        """C (batches, M, N) contiguous = A . B with strided operands (strides in elements)."""
        out = self._empty(out_shape or (batches, M, N))
        if out.size == 0:
            return out
        if K == 0:
            self._fill(out, 0.0)
            return out
        if self.family == "gpu":
            self._run("gemm_gpu", (-(-N // 64) * 16, -(-M // 64) * 16, batches), (16, 16, 1),
                      M, N, K, A.buffer, a_off, sam, sak, a_bs, B.buffer, b_off, sbk, sbn, b_bs,
                      out.buffer, 0, N, M * N, out.buffer, 0, 1 << 30, 0,
                      params=self.tunables("gemm_gpu.cl"))
            return out
        if M * N * K <= SMALL_GEMM_MACS:
            rows = max(1, min(M, 2048 // max(1, N * K)))
            self._run("gemm_small", (1, -(-M // rows), batches), (1, 1, 1) if self.is_cpu_device else None,
                      M, N, K, A.buffer, a_off, sam, sak, a_bs, B.buffer, b_off, sbk, sbn, b_bs,
                      out.buffer, 0, out.buffer, 0, rows)
            return out
        params = self.tunables("gemm_cpu.cl", self._shape_class(M, N, K))
        mr, msub = params["MR"], params["MSUB"]
        ba = batches if a_bs else 1
        bb = batches if b_bs else 1
        mt, nt = -(-M // mr), -(-N // 32)
        Ap = self._empty((ba, mt * mr * K))
        Bp = self._empty((bb, nt * 32 * K))
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        self._run("pack_a", (kb, mt, ba), cpu_l, M, K, A.buffer, a_off, sam, sak, a_bs, Ap.buffer, params=params)
        self._run("pack_b", (kb, nt, bb), cpu_l, N, K, B.buffer, b_off, sbk, sbn, b_bs, Bp.buffer, params=params)
        self._run("gemm_cpu", (-(-M // (mr * msub)), nt, batches), cpu_l,
                  M, N, K, Ap.buffer, (mt * mr * K) if ba > 1 else 0, Bp.buffer, (nt * 32 * K) if bb > 1 else 0,
                  out.buffer, 0, N, M * N, out.buffer, 0, 0, 1 << 30, 0, 0, params=params)
        return out

    def _copy_of(self, x: CLArray) -> CLArray:
        out = self._empty(x.shape)
        self._copy_strided(x, x.offset, (x.size,), (1,), out, 0, (1,))
        return out

    @staticmethod
    def _shape_class(M, N, K) -> str:
        def b(v):
            return "s" if v < 128 else "m" if v < 1024 else "l"
        return b(M) + b(N) + b(K)

    def _mm(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        return self._gemm(M, N, K, 1, a, a.offset, K, 1, 0, b, b.offset, N, 1, 0, out_shape=(M, N))

    def _bmm(self, a, b):
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        if Bb == 1 and Ba > 1:
            y = self._gemm(Ba * M, N, K, 1, a, a.offset, K, 1, 0, b, b.offset, N, 1, 0)
            return self._reshape(y, (B, M, N))
        return self._gemm(M, N, K, B, a, a.offset, K, 1, M * K if Ba > 1 else 0,
                          b, b.offset, N, 1, K * N if Bb > 1 else 0)

    def _linear(self, x, w, b):
        sx, sw = x.shape, w.shape
        if len(sw) != 2:
            return super()._linear(x, w, b)
        rows, K = math.prod(sx[:-1]), sx[-1]
        Nout = sw[0]
        self._check_size("linear", (rows, Nout))
        y = self._gemm(rows, Nout, K, 1, x, x.offset, K, 1, 0, w, w.offset, 1, K, 0,
                       out_shape=sx[:-1] + (Nout,))
        return y if b is None else self._binary("add", y, b)

    # ---- convolution --------------------------------------------------------------------
    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        N, C, H, W = x.shape
        Cout, CinG, KH, KW = w.shape
        sh, sw = stride
        dh, dw = dilation
        pt, pb, pl, pr = pads
        OH = conv_output_size(H, KH, sh, pt + pb, dh)
        OW = conv_output_size(W, KW, sw, pl + pr, dw)
        G = groups
        CoutG = Cout // G
        out = self._empty((N, Cout, OH, OW))
        if out.size == 0:
            return out
        if bias is not None and bias.offset:
            bias = self._copy_of(bias)
        hb = int(bias is not None)
        bbuf = bias.buffer if hb else out.buffer
        K = CinG * KH * KW
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, pt, pl, dh, dw)
        if self.family == "gpu":
            self._run("conv2d_gpu", (-(-(OH * OW) // 64) * 16, -(-CoutG // 64) * 16, N * G), (16, 16, 1),
                      x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo,
                      params=self.tunables("conv2d_gpu.cl"))
            return out
        path = self._conv_path(x.shape, Cout, KH, KW, stride, dilation, G, OW)
        if path == "winograd" and self._conv2d_winograd(x, w, bias, out, pt, pl):
            return out
        if path == "winograd":  # Inf/NaN: Winograd's transforms mix a tile (Inf - Inf = NaN)
            path = "direct" if K <= DIRECT_MAX_K and OW >= 24 else "gemm"
        if path == "direct" and not self._all_finite(w):
            path = "gemm"  # Inf/NaN weights: torch multiplies them by the zero padding (-> NaN); im2col does too
        if path == "direct":
            ncob = -(-CoutG // 8)
            self._run("conv2d_direct", (-(-OW // 32), OH, N * G * ncob), (1, 1, 1),
                      x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob,
                      params=_direct_spec(KH, KW, sh, sw, dh, dw))
            return out
        # im2col into packed panels + GEMM, in column chunks that fit the workspace budget
        P = OH * OW
        total = N * P
        per_col = 4 * K * G
        chunk = max(32, (workspace_budget_bytes() // max(1, per_col)) // 32 * 32)
        chunk = min(chunk, -(-total // 32) * 32)
        params = self.tunables("gemm_cpu.cl", self._shape_class(CoutG, chunk, K))
        mr, msub = params["MR"], params["MSUB"]
        mt = -(-CoutG // mr)
        Ap = self._empty((G, mt * mr * K))
        cpu_l = (1, 1, 1)
        kb = -(-K // PACK_K)
        self._run("pack_a", (kb, mt, G), cpu_l, CoutG, K, w.buffer, w.offset, K, 1, CoutG * K, Ap.buffer,
                  params=params)
        for c0 in range(0, total, chunk):
            nc = min(chunk, total - c0)
            nt = -(-nc // 32)
            Bp = self._empty((G, nt * 32 * K))
            self._run("im2col_pack", (kb, nt, G), cpu_l, x.buffer, x.offset, Bp.buffer,
                      C, H, W, CinG, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw, c0, nc)
            self._run("gemm_cpu", (-(-CoutG // (mr * msub)), nt, G), cpu_l,
                      CoutG, nc, K, Ap.buffer, mt * mr * K, Bp.buffer, nt * 32 * K,
                      out.buffer, 0, P, CoutG * P, bbuf, hb, CoutG, P, Cout * P, c0, params=params)
        return out

    def _all_finite(self, a) -> bool:
        """No Inf or NaN in ``a``: sum(a * 0) is 0, or NaN when there is one (one scalar read back)."""
        z = self._reduce("sum", self._binary("mul", a, 0.0), tuple(range(len(a.shape))), False)
        return bool(np.isfinite(self._to_numpy(z)).all())

    def _conv_path(self, xshape, Cout, KH, KW, stride, dilation, groups, OW) -> str:
        """CPU family: which conv2d path a geometry takes ("winograd", "direct" or "gemm")."""
        C = xshape[1]
        K = (C // groups) * KH * KW
        if (KH, KW) == (3, 3) and math.prod(xshape) < 2**31 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 \
                and C >= WINO_MIN_CH and Cout >= WINO_MIN_CH \
                and 16 * 4 * (-(-Cout // 16) * 16) * C <= workspace_budget_bytes():
            return "winograd"
        if K <= DIRECT_MAX_K and OW >= 24:
            return "direct"
        return "gemm"

    def _conv2d_winograd(self, x, w, bias, out, pt, pl):
        """Winograd F(2x2, 3x3) (kernels/winograd_cpu.cl): filter transform straight into packed-A
        panels, input transform straight into packed-B panels (tile chunks within the workspace
        budget), 16 batched gemm_cpu products, output transform adding the bias.

        The two transforms also flag an Inf/NaN among the values they read (a transformed sum that is
        not finite; a finite overflow flags too); returns False then, and the caller recomputes ``out``
        on an exact path. One 4-byte read-back at the end replaces separate finiteness passes."""
        N, C, H, W = x.shape
        Cout = w.shape[0]
        _, _, OH, OW = out.shape
        th, tw = -(-OH // 2), -(-OW // 2)
        total = N * th * tw
        params = self.tunables("gemm_cpu.cl", self._shape_class(Cout, min(total, 1024), C))
        mr, msub = params["MR"], params["MSUB"]
        wparams = dict(params, PK=PACK_K, OB=WINO_OB)
        mt = -(-Cout // mr)
        cpu_l = (1, 1)
        Up = self._empty((16, mt * mr * C))
        flag = self._empty((1,))
        self.cl.enqueue_fill_buffer(self.queue, flag.buffer, np.int32(0), 0, 4)
        self._run("wino_filter", (-(-C // PACK_K), mt), cpu_l, w.buffer, w.offset, Up.buffer, Cout, C,
                  flag.buffer, params=wparams)
        hb = int(bias is not None)
        bbuf = bias.buffer if hb else out.buffer
        per_tile = 4 * 16 * (C + Cout)
        chunk = max(32, (workspace_budget_bytes() // per_tile) // 32 * 32)
        chunk = min(chunk, -(-total // 32) * 32)
        for t0 in range(0, total, chunk):
            ntl = min(chunk, total - t0)
            nt = -(-ntl // 32)
            Vp = self._empty((16, nt * 32 * C))
            self._run("wino_in", (-(-C // PACK_K), nt), cpu_l, x.buffer, x.offset, Vp.buffer,
                      C, H, W, pt, pl, th, tw, t0, ntl, flag.buffer, params=wparams)
            Mb = self._empty((16, Cout, ntl))
            self._run("gemm_cpu", (-(-Cout // (mr * msub)), nt, 16), (1, 1, 1),
                      Cout, ntl, C, Up.buffer, mt * mr * C, Vp.buffer, nt * 32 * C,
                      Mb.buffer, 0, ntl, Cout * ntl, Mb.buffer, 0, 0, 1 << 30, 0, 0, params=params)
            self._run("wino_out", (-(-nt // WINO_OB), Cout), cpu_l, Mb.buffer, ntl, Cout * ntl,
                      out.buffer, 0, bbuf, hb, Cout, OH, OW, th, tw, t0, ntl, params=wparams)
        bad = np.zeros(1, np.int32)
        self.cl.enqueue_copy(self.queue, bad, flag.buffer, is_blocking=True)
        return not bad[0]

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        N, C, H, W = x.shape
        _, CoutG, KH, KW = w.shape
        G = groups
        CinG = C // G
        sh, sw = stride
        ph, pw = padding
        dh, dw = dilation
        OH = conv_transpose_output_size(H, KH, sh, ph, output_padding[0], dh)
        OW = conv_transpose_output_size(W, KW, sw, pw, output_padding[1], dw)
        out = self._empty((N, CoutG * G, OH, OW))
        if out.size == 0:
            return out
        if bias is not None and bias.offset:
            bias = self._copy_of(bias)
        hb = int(bias is not None)
        bbuf = bias.buffer if hb else out.buffer
        geo = (C, H, W, CoutG, CinG, KH, KW, G, OH, OW, sh, sw, ph, pw, dh, dw)
        if self.family == "gpu":
            self._run("conv_transpose2d_gpu", (-(-(OH * OW) // 64) * 16, -(-CoutG // 64) * 16, N * G),
                      (16, 16, 1), x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo,
                      params=self.tunables("conv_transpose2d_gpu.cl"))
            return out
        ncob = -(-CoutG // 8)
        J = -(-OW // sw)
        self._run("conv_t2d_direct", (-(-J // 32), OH * sw, N * G * ncob), (1, 1, 1),
                  x.buffer, x.offset, w.buffer, w.offset, out.buffer, 0, bbuf, hb, *geo, ncob,
                  params=_direct_spec(KH, KW, sh, sw, dh, dw))
        return out
