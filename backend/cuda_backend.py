"""CUDA / ROCm backend: the pack's own kernels, compiled at run time through CuPy (NVRTC / hipRTC).

Serves the registry names ``cuda`` and ``rocm`` (the registry falls back to PyTorch's path, with
the reason, when this module says unavailable; ``torch-cuda`` / ``torch-rocm`` always name
PyTorch/cuDNN). Native arrays are ``cupy.ndarray`` (float32).

* GEMM, conv2d and conv_transpose2d run the shared portable GPU kernels (kernels/gemm_gpu.cl,
  conv2d_gpu.cl, conv_transpose2d_gpu.cl, the same files the OpenCL backend builds) compiled as
  ``prelude_cuda.cuh + body`` with ``cupy.RawModule(code=..., options=("-DNAME=v", ...))``.
  Convolutions with few output channels per group (depthwise, SSIM's blur) use a direct kernel
  (kernels/misc_cuda.cu). With ``ANYDEVICE_ALLOW_TF32=1`` (off by default, like
  ``torch.backends.cuda.matmul.allow_tf32``) on sm_80+ GEMM and convs use the TF32 tensor-core
  branch of kernels/conv_gemm_cuda.cu (``#if defined(ANYDEVICE_CUDA) && USE_TF32``), which is
  also the fallback when a portable file is missing.
* Pad and unary ops are kernels of kernels/misc_cuda.cu; binary ops (broadcasting), concat and
  reductions (float64 accumulation for sum/mean) are CuPy's own kernels.
* torch tensors on the GPU come in and go out through DLPack (zero copy, never through the host);
  every op runs on PyTorch's current stream of the device (CuPy's current stream is set to it), so
  work queued by ComfyUI on a side stream is ordered correctly.
* Tile configurations: per compute capability defaults (``TILES``), chosen per problem size so the
  grid fills the GPU; ``CudaBackend.tune()`` times the candidates and stores the winners in
  ``$ANYDEVICE_CACHE_DIR/cuda_tiles.json`` (default ~/.cache/anydevice), read back at start.
  Compiled kernels go to CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``, by default
  ``$ANYDEVICE_CACHE_DIR/cupy``); memory comes from CuPy's memory pool.

This module imports without CuPy (``probe`` says why it is unavailable; the CI compile check
reads ``shipped_configs`` and ``kernel_source`` from here).
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .contract import (UNARY_KERNEL_CODES, Backend, conv_output_size, conv_transpose_output_size,
                       tf32_allowed, unary_kernel_args)
from .kernel_source import kernel_source as _kernel_source

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"
INSTALL_HINT = "CuPy not installed (pip install cupy-cuda12x)"
CACHE_NAME = "cuda_tiles.json"

#: portable GPU-family kernels shared with OpenCL: op -> (file, kernel name)
PORTABLE = {
    "gemm": ("gemm_gpu.cl", "gemm_gpu"),
    "conv2d": ("conv2d_gpu.cl", "conv2d_gpu"),
    "conv_transpose2d": ("conv_transpose2d_gpu.cl", "conv_transpose2d_gpu"),
}
OWN_GEMM = ("conv_gemm_cuda.cu", "ad_conv_gemm")
MISC = "misc_cuda.cu"

# ---- tile configurations ------------------------------------------------------------------
# Candidates per architecture, largest tile first; at run time the largest whose grid has at
# least one group per SM is taken (unless tune() stored a winner). The CI compile check builds
# every configuration listed here (and fails on register spills).
_P_L = dict(BM=128, BN=64, BK=16, TM=8, TN=4, KP=128)    # portable: 256 threads, 8x4 per thread
_P_M = dict(BM=64, BN=64, BK=16, TM=4, TN=4, KP=128)     # the file's defaults
_P_S = dict(BM=32, BN=64, BK=16, TM=2, TN=4, KP=128)
# own FP32, measured on an H100 (tools/gpu_probe.py): 128x64 tiles with 8x4 per thread are the
# fastest (two groups per SM; an 8x8 thread tile's registers allow only one), TILE_K 16 for GEMMs
# and 8 for convs (half the im2col gathers per step); 64x64x16 where 128x64 leaves SMs idle and K
# is too short to split. ``_plan`` picks tile and K split per problem from these.
_O_L = dict(TILE_M=128, TILE_N=64, TILE_K=16, WPT_M=8, WPT_N=4)
_O_M = dict(TILE_M=128, TILE_N=64, TILE_K=8, WPT_M=8, WPT_N=4)
_O_S = dict(TILE_M=64, TILE_N=64, TILE_K=16, WPT_M=4, WPT_N=4)
_O_X = dict(TILE_M=128, TILE_N=128, TILE_K=8, WPT_M=8, WPT_N=8)
_T_L = dict(TILE_M=128, TILE_N=128, TILE_K=16, WPT_M=8, WPT_N=8, SMEM_PAD=8, USE_TF32=1)
_T_M = dict(TILE_M=128, TILE_N=64, TILE_K=16, WPT_M=8, WPT_N=4, SMEM_PAD=8, USE_TF32=1)
_T_S = dict(TILE_M=64, TILE_N=64, TILE_K=16, WPT_M=4, WPT_N=4, SMEM_PAD=8, USE_TF32=1)

#: arch ("sm_80", ...; "default" for any other) -> family -> candidate configs. "own" serves
#: GEMMs, "own_conv" convolutions (both FP32); "tf32" both, when TF32 is allowed.
TILES = {
    "default": {"portable": [_P_L, _P_M, _P_S], "own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": []},
    "sm_80": {"portable": [_P_L, _P_M, _P_S], "own": [_O_L, _O_S, _O_X], "own_conv": [_O_M, _O_S],
              "tf32": [_T_L, _T_M, _T_S]},
    "sm_86": {"portable": [_P_L, _P_M, _P_S], "own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": [_T_M, _T_S]},
    "sm_89": {"portable": [_P_L, _P_M, _P_S], "own": [_O_L, _O_S], "own_conv": [_O_M, _O_S], "tf32": [_T_M, _T_S]},
    "sm_90": {"portable": [_P_L, _P_M, _P_S], "own": [_O_L, _O_S], "own_conv": [_O_M, _O_S],
              "tf32": [_T_L, _T_M, _T_S]},
}
#: relative FMA throughput of a thread tile (WPT_M, WPT_N) against 8x4, from the H100 sweep
TILE_EFFICIENCY = {(8, 4): 1.0, (4, 4): 0.8, (8, 8): 0.9, (4, 8): 0.8}
#: a K slice is at least this long (shorter slices lost to their fixed costs on the H100)
MIN_KSLICE = 512
#: own-kernel modes (build options besides the tile) the backend compiles; VEC_A / VEC_B (16-byte
#: loads) are added when the operands allow them (``_vec_ok``)
OWN_MODES = (
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=0),
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1), dict(IS_GEMM=1, TRANS_A=1, TRANS_B=1),
    dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0, VEC_A=1, VEC_B=1), dict(IS_GEMM=1, TRANS_A=0, TRANS_B=0, VEC_A=1),
    dict(IS_GEMM=1, TRANS_A=1, TRANS_B=0, VEC_B=1), dict(IS_GEMM=1, TRANS_A=0, TRANS_B=1, VEC_A=1),
    dict(IS_GEMM=0, CONV_TRANSPOSED=0), dict(IS_GEMM=0, CONV_TRANSPOSED=1),
    dict(IS_GEMM=0, CONV_TRANSPOSED=0, VEC_A=1), dict(IS_GEMM=0, CONV_TRANSPOSED=1, VEC_A=1),
)
#: split K over at most this many slices when the output tiles alone do not fill the GPU
MAX_KSPLIT = 8
#: unary op codes of misc_cuda.cu
UNARY_CODES = UNARY_KERNEL_CODES
BLOCK = 256
#: convs with at most this many output channels per group use the direct kernel
DIRECT_MAX_COUT_G = 4
GRID_YZ_MAX = 65535


def vec_fits(cfg: dict, which: str) -> bool:
    """Whether a tile can load operand ``which`` ("A" or "B") as 16-byte vectors: every thread
    loads whole vectors (ad_conv_gemm's VEC_A / VEC_B #error conditions)."""
    threads = (cfg["TILE_M"] // cfg["WPT_M"]) * (cfg["TILE_N"] // cfg["WPT_N"])
    if which == "A":
        return cfg["TILE_K"] % 4 == 0 and (cfg["TILE_M"] * cfg["TILE_K"]) % (4 * threads) == 0
    return cfg["TILE_N"] % 4 == 0 and (cfg["TILE_N"] * cfg["TILE_K"]) % (4 * threads) == 0


def mode_fits(cfg: dict, mode: dict) -> bool:
    return (not mode.get("VEC_A") or vec_fits(cfg, "A")) and (not mode.get("VEC_B") or vec_fits(cfg, "B"))


def _mode_macros(mode: dict) -> dict:
    """Build options of one own-kernel mode: VEC_A/VEC_B only when set (so the older cache keys hold)."""
    return {k: v for k, v in mode.items() if not (k in ("VEC_A", "VEC_B") and not v)}


def _tiles_for(arch: str) -> dict:
    return TILES.get(arch, TILES["default"])


def shipped_configs() -> dict[str, list[dict]]:
    """Every (file -> list of -D macro sets) this backend may compile, for the CI compile check."""
    out: dict[str, list[dict]] = {}

    def add(fname, cfg):
        lst = out.setdefault(fname, [])
        if cfg not in lst:
            lst.append(cfg)

    for table in TILES.values():
        for cfg in table["portable"]:
            for fname, _ in PORTABLE.values():
                add(fname, dict(cfg))
        for cfg in table["own"] + table["own_conv"] + table["tf32"]:
            for mode in OWN_MODES:
                if mode_fits(cfg, mode):
                    add(OWN_GEMM[0], {**cfg, **_mode_macros(mode)})
    add(MISC, {"BLOCK": BLOCK})
    return out


def kernel_source(fname: str, kernels_dir: Path | str | None = None) -> str:
    """What is compiled for ``fname``: prelude_cuda.cuh + the file, includes expanded (kernel_source.py)."""
    return _kernel_source(fname, "cuda", kernels_dir or KERNELS_DIR)


def build_options(macros: dict) -> tuple[str, ...]:
    return tuple(f"-D{k}={v}" for k, v in sorted(macros.items()))


# ---- registry API ---------------------------------------------------------------------------
def _cupy():
    import cupy
    return cupy


def probe(name: str = "cuda") -> dict:
    """{available, reason, devices, kind}; cheap (no kernel builds) and never raising."""
    out = {"available": False, "reason": "", "devices": [], "kind": "own"}
    try:
        try:
            cp = _cupy()
        except ImportError:
            out["reason"] = INSTALL_HINT if name == "cuda" else \
                "CuPy not installed (for ROCm: pip install cupy-rocm-5-0, or CuPy built from source for ROCm)"
            return out
        except Exception as exc:  # a broken CuPy install (missing CUDA libraries, ...)
            out["reason"] = f"CuPy import failed ({type(exc).__name__}: {exc})"
            return out
        hip = bool(getattr(cp.cuda.runtime, "is_hip", False))
        if name == "rocm" and not hip:
            out["reason"] = f"CuPy {cp.__version__} is built for CUDA, not ROCm"
            return out
        if name == "cuda" and hip:
            out["reason"] = f"CuPy {cp.__version__} is built for ROCm (use rocm)"
            return out
        try:
            n = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:
            out["reason"] = f"no {'ROCm' if hip else 'CUDA'} device or driver ({type(exc).__name__}: {exc})"
            return out
        if n < 1:
            out["reason"] = f"no {'ROCm' if hip else 'CUDA'} device visible to CuPy"
            return out
        devs = []
        for i in range(n):
            props = cp.cuda.runtime.getDeviceProperties(i)
            devs.append(_describe(cp, props, hip))
        out.update(available=True, devices=devs)
    except Exception as exc:
        out["reason"] = f"probing {name} failed: {type(exc).__name__}: {exc}"
    return out


def create(name: str = "cuda", index: int = 0) -> "CudaBackend":
    return CudaBackend(name, index)


def _describe(cp, props, hip) -> str:
    dev = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if hip:
        arch = props.get("gcnArchName", b"")
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        return f"{dev} ({arch or 'gfx'}) via the pack's own HIP kernels (CuPy {cp.__version__}, hipRTC)"
    return (f"{dev} (sm_{props['major']}{props['minor']}) via the pack's own CUDA kernels "
            f"(CuPy {cp.__version__}, NVRTC)")


def cache_dir() -> Path:
    return Path(os.environ.get("ANYDEVICE_CACHE_DIR") or Path.home() / ".cache" / "anydevice")


def _cdiv(a, b):
    return -(-a // b)


# ---- the backend ----------------------------------------------------------------------------
class CudaBackend(Backend):
    kind = "own"

    def __init__(self, name: str = "cuda", index: int = 0):
        super().__init__(index)
        cp = _cupy()
        self.cp = cp
        self.name = name
        self.hip = bool(getattr(cp.cuda.runtime, "is_hip", False))
        n = cp.cuda.runtime.getDeviceCount()
        if not 0 <= index < n:
            raise ValueError(f"device index {index} out of range ({n} device(s))")
        props = cp.cuda.runtime.getDeviceProperties(index)
        self._desc = _describe(cp, props, self.hip)
        self.cc = (int(props["major"]), int(props["minor"]))
        self.arch = "hip" if self.hip else f"sm_{self.cc[0]}{self.cc[1]}"
        self.sm_count = int(props["multiProcessorCount"])
        self.native_types = (cp.ndarray,)
        self.tf32 = tf32_allowed() and not self.hip and self.cc >= (8, 0)
        self._tiles = _tiles_for(self.arch)
        self._mods: dict = {}
        self._lock = threading.RLock()
        self._streams: dict = {}
        self._tuned = self._load_tuned()
        self._plan_cache: dict = {}
        self._arg_cache: dict = {}
        # read once (per-call os.environ lookups showed in the host-side profile)
        self._forced_ksplit = os.environ.get("ANYDEVICE_CUDA_KSPLIT", "").strip()
        self._family_env = os.environ.get("ANYDEVICE_CUDA_FAMILY", "").strip().lower()
        self._dummy = None
        os.environ.setdefault("CUPY_CACHE_DIR", str(cache_dir() / "cupy"))
        self._enter()

    @property
    def device(self) -> str:
        return self._desc + (", TF32 tensor cores allowed" if self.tf32 else "")

    # ---- device / stream context ----------------------------------------------------------
    def _enter(self):
        """Make this device current and CuPy's current stream PyTorch's current stream."""
        cp = self.cp
        cp.cuda.Device(self.index).use()
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            if not torch.cuda.is_initialized():
                return
            ptr = torch.cuda.current_stream(self.index).cuda_stream
        except Exception:
            return
        cur = cp.cuda.get_current_stream()
        if cur.ptr == ptr:
            return
        st = self._streams.get(ptr)
        if st is None:
            st = cp.cuda.Stream.null if ptr == 0 else cp.cuda.ExternalStream(ptr)
            self._streams[ptr] = st
        st.use()

    def _inputs(self, op, **arrays):
        self._enter()
        return super()._inputs(op, **arrays)

    def synchronize(self):
        self.cp.cuda.Device(self.index).synchronize()

    def free_memory(self):
        """Give CuPy's pooled blocks back to the driver (e.g. when ComfyUI unloads models)."""
        self.cp.get_default_memory_pool().free_all_blocks()

    # ---- conversion / layout ----------------------------------------------------------------
    def _from_numpy(self, a):
        self._enter()
        return self.cp.asarray(a, dtype=self.cp.float32)

    def _to_numpy(self, x):
        self._enter()
        return self.cp.asnumpy(x)

    def _from_torch(self, t):
        torch = sys.modules["torch"]
        t = t.detach()
        if t.device.type != "cuda":
            return self._from_numpy(t.to(torch.float32).numpy())
        self._enter()
        if t.dtype != torch.float32:  # float16/bfloat16/int/bool: converted by torch on the GPU
            t = t.to(torch.float32)
        if t.is_conj():
            t = t.resolve_conj()
        arr = self.cp.from_dlpack(t)
        if arr.device.id != self.index:
            with self.cp.cuda.Device(self.index):
                arr = self.cp.array(arr, copy=True)
        return arr

    def _to_torch(self, x, like):
        torch = sys.modules["torch"]
        if like.device.type == "cuda":
            self._enter()
            t = torch.from_dlpack(self._contig(x))
            return t if t.device == like.device else t.to(like.device)
        a = self._to_numpy(x)
        return torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape))

    def _reshape(self, x, shape):
        return x.reshape(tuple(shape))

    def _permute(self, x, axes):
        return x.transpose(tuple(axes))

    def _expand(self, x, shape):
        return self.cp.broadcast_to(x, tuple(shape))

    def _concat_channels(self, parts, n, c, h, w):
        return self.cp.concatenate(parts, axis=1)

    def _slice1(self, x, i):
        return x[:, i]

    # ---- kernels ----------------------------------------------------------------------------
    def _function(self, fname: str, kname: str, macros: dict):
        key = (fname, kname, tuple(sorted(macros.items())))
        fn = self._mods.get(key)
        if fn is None:
            with self._lock:
                fn = self._mods.get(key)
                if fn is None:
                    mkey = (fname, key[2])  # one module per source and build options, any kernel of it
                    mod = self._mods.get(mkey)
                    if mod is None:
                        mod = self.cp.RawModule(code=kernel_source(fname), options=build_options(macros))
                        self._mods[mkey] = mod
                    fn = mod.get_function(kname)
                    self._mods[key] = fn
        return fn

    def _misc(self, kname):
        return self._function(MISC, kname, {"BLOCK": BLOCK})

    def _launch_1d(self, fn, total, args):
        grid = max(1, min(_cdiv(total, BLOCK), self.sm_count * 32))
        fn((grid,), (BLOCK,), args)

    def _empty(self, shape):
        return self.cp.empty(tuple(shape), dtype=self.cp.float32)

    def _null(self):
        if self._dummy is None:
            self._dummy = self.cp.zeros((1,), dtype=self.cp.float32)
        return self._dummy

    def _contig(self, x):
        y = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        return y if y.shape == x.shape else y.reshape(x.shape)  # CuPy makes 0-d arrays 1-d

    # ---- tile choice ------------------------------------------------------------------------
    def _family(self, op: str) -> str:
        """tf32 (when allowed), else the own FP32 kernel; ANYDEVICE_CUDA_FAMILY=portable runs the
        shared OpenCL/CUDA GPU-family kernels instead (measured on an H100: half the speed)."""
        if self.tf32 and self._tiles.get("tf32"):
            return "tf32"
        if self._family_env == "portable" and (KERNELS_DIR / PORTABLE[op][0]).exists():
            return "portable"
        return "own"

    def _choose(self, family: str, op: str, M: int, N: int, Z: int) -> dict:
        tuned = self._tuned.get(f"{family}:{op}:{_size_class(M, N, Z)}")
        cands = self._tiles[family] or TILES["default"][family]
        if tuned and tuned in cands:
            return tuned
        for cfg in cands:
            bm, bn = (cfg["BM"], cfg["BN"]) if family == "portable" else (cfg["TILE_M"], cfg["TILE_N"])
            if _cdiv(M, bm) * _cdiv(N, bn) * Z >= self.sm_count:
                return cfg
        return cands[-1]

    def _cands(self, family: str, op: str, M: int, N: int, Z: int) -> list:
        """Candidate tiles of the own kernel for an op: a tune() winner alone, else the table's."""
        tuned = self._tuned.get(f"{family}:{op}:{_size_class(M, N, Z)}")
        key = "own_conv" if family == "own" and op != "gemm" else family
        cands = self._tiles.get(key) or TILES["default"][key]
        return [tuned] if tuned and tuned in cands else list(cands)

    def _ksplit(self, cfg: dict, M: int, N: int, Z: int, K: int) -> int:
        """K slices for one tile (``_plan`` with a single candidate)."""
        return self._plan([cfg], M, N, Z, K)[1]

    def _plan(self, cands: list, M: int, N: int, Z: int, K: int) -> tuple[dict, int]:
        """(tile, K slices) for the own kernel: the pair with the least modelled time, where time
        = waves of groups (groups per SM from the tile's registers) x one group's FMAs / the
        tile's measured efficiency, plus the split's reduction pass. Slices are at least
        MIN_KSLICE long. ANYDEVICE_CUDA_KSPLIT=n forces the split."""
        pkey = (tuple(map(id, cands)), M, N, Z, K)
        hit = self._plan_cache.get(pkey)
        if hit is not None:
            return hit
        forced = self._forced_ksplit
        best = None
        for cfg in cands:
            tm, tn, tk = cfg["TILE_M"], cfg["TILE_N"], cfg["TILE_K"]
            blocks = _cdiv(M, tm) * _cdiv(N, tn) * Z
            threads = (tm // cfg["WPT_M"]) * (tn // cfg["WPT_N"])
            regs = min(255, 2 * cfg["WPT_M"] * cfg["WPT_N"] + 64)  # acc + tot + operands, as compiled
            slots = self.sm_count * max(1, min(2048 // threads, 65536 // (threads * regs)))
            eff = TILE_EFFICIENCY.get((cfg["WPT_M"], cfg["WPT_N"]), 0.8)
            if forced.isdigit() and int(forced) >= 1:
                splits = [max(1, min(int(forced), _cdiv(K, tk)))]
            else:
                splits = range(1, max(1, min(MAX_KSPLIT, K // MIN_KSLICE)) + 1)
            for ks in splits:
                kslice = _cdiv(_cdiv(K, ks), tk) * tk
                t = _cdiv(blocks * ks, slots) * tm * tn * kslice / eff
                if ks > 1:
                    t += 16.0 * M * N * Z * ks / slots  # workspace write + ordered reduction
                if best is None or t < best[0] * 0.999:
                    best = (t, cfg, ks)
        if len(self._plan_cache) > 4096:
            self._plan_cache.clear()
        self._plan_cache[pkey] = (best[1], best[2])
        return best[1], best[2]

    def _own_launch(self, macros: dict, cfg: dict, M: int, N: int, K: int, Z: int, args_a: tuple,
                    args_b: tuple, c_args: tuple, bias, conv: tuple, out, gemm_out: tuple, ksplit: int):
        """Launch ad_conv_gemm over Z problems (grid z chunks), split over K when ksplit > 1 (then
        into a workspace, and ad_splitk_reduce writes ``out``)."""
        cp = self.cp
        i32, i64 = np.int32, np.int64
        fn = self._function(OWN_GEMM[0], OWN_GEMM[1], macros)
        block = (cfg["TILE_N"] // cfg["WPT_N"], cfg["TILE_M"] // cfg["WPT_M"], 1)
        kchunk = _cdiv(_cdiv(K, ksplit), cfg["TILE_K"]) * cfg["TILE_K"]
        ksplit = _cdiv(K, kchunk) if K else 1
        per = max(1, GRID_YZ_MAX // ksplit)
        for z0 in range(0, Z, per):
            z1 = min(Z, z0 + per)
            a, sam, sak, a_bs = args_a(z0)
            b, sbk, sbn, b_bs = args_b(z0)
            c, ldc, c_bs, bs = c_args(z0)
            ws = c if ksplit == 1 else cp.empty((z1 - z0) * ksplit * M * N, dtype=cp.float32)
            grid = (_cdiv(N, cfg["TILE_N"]), _cdiv(M, cfg["TILE_M"]), (z1 - z0) * ksplit)
            # the scalar arguments as NumPy scalars, built once per geometry (per-call host cost)
            key = (M, N, K, sam, sak, a_bs, sbk, sbn, b_bs, ldc, c_bs, bias is not None, conv, ksplit, kchunk)
            tpl = self._arg_cache.get(key)
            if tpl is None:
                tpl = [i32(M), i32(N), i32(K), None, i32(sam), i32(sak), i64(a_bs),
                       None, i32(sbk), i32(sbn), i64(b_bs), None, i32(ldc), i64(c_bs),
                       None, i32(bias is not None), *(i32(v) for v in conv), i32(ksplit), i32(kchunk)]
                if len(self._arg_cache) > 4096:
                    self._arg_cache.clear()
                self._arg_cache[key] = tpl
            args = list(tpl)
            args[3], args[7], args[11], args[14] = a, b, ws, bs
            fn(grid, block, tuple(args))
            if ksplit > 1:
                red = self._function(OWN_GEMM[0], "ad_splitk_reduce", macros)
                is_gemm, OHW, Cout = gemm_out
                self._launch_1d(red, (z1 - z0) * M * N,
                                (ws, c, bs, i32(bias is not None), i32(ksplit), i32(z1 - z0), i32(M), i32(N),
                                 i32(ldc), i64(c_bs), i32(is_gemm), i32(OHW), i32(Cout)))
        return out

    # ---- matmul -----------------------------------------------------------------------------
    def _bmm(self, a, b):
        cp = self.cp
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        if B * M * N == 0 or K == 0:
            return cp.zeros((B, M, N), dtype=cp.float32)
        if Bb == 1 and Ba > 1 and a.flags.c_contiguous:  # one GEMM with the batch folded into M
            y = self._gemm(a.reshape(1, Ba * M, K), b)
            return y.reshape(B, M, N)
        return self._gemm(a, b)

    def _gemm(self, a, b, cfg=None, family=None, ksplit=None):
        """(Ba, M, K) @ (Bb, K, N), Ba/Bb in {1, B}, any strides (copied only when neither layout)."""
        cp = self.cp
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        B = max(Ba, Bb)
        family = family or self._family("gemm")
        own = family != "portable"
        a, sa = _strided(cp, a, own)
        b, sb = _strided(cp, b, own)
        a_bs = sa[0] if Ba > 1 else 0
        b_bs = sb[0] if Bb > 1 else 0
        c = self._empty((B, M, N))
        if own:
            if cfg is None:
                cfg, ks = self._plan(self._cands(family, "gemm", M, N, B), M, N, B, K)
                ksplit = ksplit or ks
            ta, tb = int(sa[2] != 1), int(sb[2] != 1)
            vec_a = int(not ta and vec_fits(cfg, "A") and _vec_ok(a, sa[1], a_bs, K))
            vec_b = int(not tb and vec_fits(cfg, "B") and _vec_ok(b, sb[1], b_bs, N))
            macros = {**cfg, **_mode_macros(dict(IS_GEMM=1, TRANS_A=ta, TRANS_B=tb, VEC_A=vec_a, VEC_B=vec_b))}
            return self._own_launch(macros, cfg, M, N, K, B,
                                    lambda z: (a[z:] if Ba > 1 else a, sa[1], sa[2], a_bs),
                                    lambda z: (b[z:] if Bb > 1 else b, sb[1], sb[2], b_bs),
                                    lambda z: (c[z:], N, M * N, self._null()),
                                    None, (0,) * 15, c, (1, 1, 1), ksplit or self._ksplit(cfg, M, N, B, K))
        cfg = cfg or self._choose(family, "gemm", M, N, B)
        for z0 in range(0, B, GRID_YZ_MAX):
            z1 = min(B, z0 + GRID_YZ_MAX)
            az = a[z0:z1] if Ba > 1 else a
            bz = b[z0:z1] if Bb > 1 else b
            cz = c[z0:z1]
            fname, kname = PORTABLE["gemm"]
            fn = self._function(fname, kname, cfg)
            grid = (_cdiv(N, cfg["BN"]), _cdiv(M, cfg["BM"]), z1 - z0)
            block = (cfg["BN"] // cfg["TN"], cfg["BM"] // cfg["TM"], 1)
            i32, i64 = np.int32, np.int64
            fn(grid, block, (i32(M), i32(N), i32(K),
                             az, i64(0), i32(sa[1]), i32(sa[2]), i64(a_bs),
                             bz, i64(0), i32(sb[1]), i32(sb[2]), i64(b_bs),
                             cz, i64(0), i32(N), i64(M * N),
                             self._null(), i32(0), i32(1 << 30), i64(0)))
        return c

    # ---- convolution ------------------------------------------------------------------------
    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        x, w = self._contig(x), self._contig(w)
        bias = None if bias is None else self._contig(bias)
        N, C, H, W = x.shape
        Cout, CinG, KH, KW = w.shape
        (sh, sw), (dh, dw), G = stride, dilation, groups
        t, b_, l, r = pads
        OH = conv_output_size(H, KH, sh, t + b_, dh)
        OW = conv_output_size(W, KW, sw, l + r, dw)
        y = self._empty((N, Cout, OH, OW))
        if y.size == 0:
            return y
        CoutG = Cout // G
        geo = dict(N=N, C=C, H=H, W=W, Cout=Cout, CinG=CinG, CoutG=CoutG, KH=KH, KW=KW, OH=OH, OW=OW,
                   sh=sh, sw=sw, ph=t, pw=l, dh=dh, dw=dw, G=G)
        if CoutG <= DIRECT_MAX_COUT_G:
            return self._direct(x, w, bias, y, geo, transposed=0)
        family = self._family("conv2d")
        if family == "portable":
            return self._portable_conv("conv2d", x, w, bias, y, geo)
        return self._own_conv(x, w, bias, y, geo, transposed=0, family=family)

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        x, w = self._contig(x), self._contig(w)
        bias = None if bias is None else self._contig(bias)
        N, C, H, W = x.shape
        _, CoutG, KH, KW = w.shape
        (sh, sw), (ph, pw), (dh, dw), G = stride, padding, dilation, groups
        OH = conv_transpose_output_size(H, KH, sh, ph, output_padding[0], dh)
        OW = conv_transpose_output_size(W, KW, sw, pw, output_padding[1], dw)
        Cout = CoutG * G
        y = self._empty((N, Cout, OH, OW))
        if y.size == 0:
            return y
        geo = dict(N=N, C=C, H=H, W=W, Cout=Cout, CinG=C // G, CoutG=CoutG, KH=KH, KW=KW, OH=OH, OW=OW,
                   sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, G=G)
        if CoutG <= DIRECT_MAX_COUT_G:
            return self._direct(x, w, bias, y, geo, transposed=1)
        family = self._family("conv_transpose2d")
        if family == "portable":
            return self._portable_conv("conv_transpose2d", x, w, bias, y, geo)
        # own kernel: weights re-laid out as (G, CoutG, CinG*KH*KW)
        wt = self.cp.ascontiguousarray(
            w.reshape(G, C // G, CoutG, KH * KW).transpose(0, 2, 1, 3)).reshape(Cout, C // G, KH, KW)
        return self._own_conv(x, wt, bias, y, geo, transposed=1, family=family)

    def _direct(self, x, w, bias, y, g, transposed):
        i32 = np.int32
        fn = self._misc("ad_direct_conv")
        args = (x, w, self._null() if bias is None else bias, i32(bias is not None), y,
                *(i32(g[k]) for k in ("N", "C", "H", "W", "Cout", "CinG", "CoutG", "KH", "KW", "OH", "OW",
                                      "sh", "sw", "ph", "pw", "dh", "dw")), i32(transposed))
        self._launch_1d(fn, y.size, args)
        return y

    def _portable_conv(self, op, x, w, bias, y, g, cfg=None):
        i32, i64 = np.int32, np.int64
        P = g["OH"] * g["OW"]
        N, G = g["N"], g["G"]
        cfg = cfg or self._choose("portable", op, g["CoutG"], P, N * G)
        fname, kname = PORTABLE[op]
        fn = self._function(fname, kname, cfg)
        per = max(1, GRID_YZ_MAX // G)  # images per launch (grid z = images * groups)
        block = (cfg["BN"] // cfg["TN"], cfg["BM"] // cfg["TM"], 1)
        b = self._null() if bias is None else bias
        for n0 in range(0, N, per):
            nb = min(N, n0 + per) - n0
            grid = (_cdiv(P, cfg["BN"]), _cdiv(g["CoutG"], cfg["BM"]), nb * G)
            fn(grid, block, (x, i64(n0 * g["C"] * g["H"] * g["W"]), w, i64(0),
                             y, i64(n0 * g["Cout"] * P), b, i32(bias is not None),
                             *(i32(g[k]) for k in ("C", "H", "W", "CoutG", "CinG", "KH", "KW", "G", "OH", "OW",
                                                   "sh", "sw", "ph", "pw", "dh", "dw"))))
        return y

    def _own_conv(self, x, w, bias, y, g, transposed, family, cfg=None, ksplit=None):
        M, Ntot, K = g["CoutG"], g["N"] * g["OH"] * g["OW"], g["CinG"] * g["KH"] * g["KW"]
        G = g["G"]
        if cfg is None:
            op = "conv_transpose2d" if transposed else "conv2d"
            cfg, ks = self._plan(self._cands(family, op, M, Ntot, G), M, Ntot, G, K)
            ksplit = ksplit or ks
        vec_a = int(vec_fits(cfg, "A") and K % 4 == 0 and (M * K) % 4 == 0 and w.data.ptr % 16 == 0)
        macros = {**cfg, **_mode_macros(dict(IS_GEMM=0, CONV_TRANSPOSED=int(transposed), VEC_A=vec_a))}
        HW, P = g["H"] * g["W"], g["OH"] * g["OW"]
        ks = ksplit or self._ksplit(cfg, M, Ntot, G, K)
        conv = tuple(g[k] for k in ("C", "H", "W", "CinG", "KH", "KW", "sh", "sw", "ph", "pw",
                                    "dh", "dw", "OH", "OW", "Cout"))
        # views starting at group g0 (the kernel indexes from these pointers with full strides)
        return self._own_launch(
            macros, cfg, M, Ntot, K, G,
            lambda g0: (w.reshape(-1)[g0 * M * K:], K, 1, M * K),
            lambda g0: (x.reshape(-1)[g0 * g["CinG"] * HW:], 0, 0, 0),
            lambda g0: (y.reshape(-1)[g0 * M * P:], 0, 0, self._null() if bias is None else bias[g0 * M:]),
            bias, conv, y, (0, P, g["Cout"]), ks)

    # ---- elementwise ------------------------------------------------------------------------
    def _pad(self, x, pads, mode):
        x = self._contig(x)
        t, b, l, r = pads
        *lead, H, W = x.shape
        OH, OW = H + t + b, W + l + r
        y = self._empty((*lead, OH, OW))
        if y.size == 0:
            return y
        planes = math.prod(lead)
        code = {"zeros": 0, "reflect": 1, "replicate": 2, "circular": 3}[mode]
        i32 = np.int32
        self._launch_1d(self._misc("ad_pad"), y.size,
                        (x, y, i32(planes), i32(H), i32(W), i32(t), i32(l), i32(OH), i32(OW), i32(code)))
        return y

    def _unary(self, op, x, **p):
        x = self._contig(x)
        y = self._empty(x.shape)
        if y.size == 0:
            return y
        code, p0, p1, has_min, has_max = unary_kernel_args(op, p)
        self._launch_1d(self._misc("ad_unary"), y.size,
                        (x, y, np.int64(y.size), np.int32(code), np.float32(p0), np.float32(p1),
                         np.int32(has_min | has_max << 1)))
        return y

    def _binary(self, op, a, b):
        cp = self.cp
        a = np.float32(a) if isinstance(a, float) else a
        b = np.float32(b) if isinstance(b, float) else b
        fn = {"add": cp.add, "sub": cp.subtract, "mul": cp.multiply, "div": cp.true_divide,
              "pow": cp.power, "minimum": cp.minimum, "maximum": cp.maximum}[op]
        if not isinstance(a, cp.ndarray):  # scalar first
            a = cp.full((), a, dtype=cp.float32)
        if not isinstance(b, cp.ndarray):
            b = cp.full((), b, dtype=cp.float32)
        return fn(a, b, dtype=cp.float32)

    def _reduce(self, op, x, dims, keepdim):
        cp = self.cp
        if len(dims) == 0:
            return x.astype(cp.float32, copy=True)
        if op in ("sum", "mean"):
            f = cp.sum if op == "sum" else cp.mean
            return f(x, axis=dims, dtype=cp.float64, keepdims=keepdim).astype(cp.float32)
        f = cp.amax if op == "max" else cp.amin
        return self._contig(f(x, axis=dims, keepdims=keepdim))

    # ---- tuning -----------------------------------------------------------------------------
    def _load_tuned(self) -> dict:
        try:
            data = json.loads((cache_dir() / CACHE_NAME).read_text())
            return data.get(self._cache_key(), {})
        except Exception:
            return {}

    def _cache_key(self) -> str:
        return f"{self._desc.split(' via ')[0]}|{self.arch}|cupy{self.cp.__version__}"

    def tune(self, shapes=None, repeats: int = 5) -> dict:
        """Time every candidate tile for GEMM/conv problem sizes; store the winners on disk.

        shapes: list of ("gemm", M, N, K) / ("conv2d", x_shape, w_shape, stride, padding)."""
        cp = self.cp
        self._enter()
        shapes = shapes or [("gemm", 4096, 4096, 4096), ("gemm", 1024, 1024, 1024),
                            ("conv2d", (32, 512, 7, 7), (512, 512, 3, 3), 1, 1),
                            ("conv2d", (1, 128, 256, 256), (128, 128, 3, 3), 1, 1)]
        results = {}
        for spec in shapes:
            if spec[0] == "gemm":
                _, M, N, K = spec
                a = cp.random.standard_normal((1, M, K), dtype=cp.float32)
                b = cp.random.standard_normal((1, K, N), dtype=cp.float32)
                family = self._family("gemm")
                run = lambda cfg: self._gemm(a, b, cfg=cfg, family=family)  # noqa: E731
                key = f"{family}:gemm:{_size_class(M, N, 1)}"
            else:
                _, xs, ws, s, p = spec
                x = cp.random.standard_normal(xs, dtype=cp.float32)
                w = cp.random.standard_normal(ws, dtype=cp.float32)
                OH = (xs[2] + 2 * p - ws[2]) // s + 1
                OW = (xs[3] + 2 * p - ws[3]) // s + 1
                y = self._empty((xs[0], ws[0], OH, OW))
                g = dict(N=xs[0], C=xs[1], H=xs[2], W=xs[3], Cout=ws[0], CinG=ws[1], CoutG=ws[0], KH=ws[2],
                         KW=ws[3], OH=OH, OW=OW, sh=s, sw=s, ph=p, pw=p, dh=1, dw=1, G=1)
                family = self._family("conv2d")
                if family == "portable":
                    run = lambda cfg: self._portable_conv("conv2d", x, w, None, y, g, cfg=cfg)  # noqa: E731
                    key = f"portable:conv2d:{_size_class(ws[0], OH * OW, xs[0])}"
                else:
                    run = lambda cfg: self._own_conv(x, w, None, y, g, 0, family, cfg=cfg)  # noqa: E731
                    key = f"{family}:conv2d:{_size_class(ws[0], xs[0] * OH * OW, 1)}"
            best = None
            for cfg in self._tiles["own_conv" if family == "own" and spec[0] != "gemm" else family]:
                try:
                    run(cfg)
                    self.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(repeats):
                        run(cfg)
                    self.synchronize()
                    dt = (time.perf_counter() - t0) / repeats
                except Exception:
                    continue
                if best is None or dt < best[0]:
                    best = (dt, cfg)
            if best:
                results[key] = best[1]
        self._tuned.update(results)
        self._plan_cache.clear()
        path = cache_dir() / CACHE_NAME
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = json.loads(path.read_text()) if path.exists() else {}
            data.setdefault(self._cache_key(), {}).update(results)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass
        return results


def _vec_ok(x, row_stride: int, batch_stride: int, inner: int) -> bool:
    """16-byte loads along the unit-stride dim: aligned base, row/batch strides and length all
    multiples of 4 floats."""
    return x.data.ptr % 16 == 0 and row_stride % 4 == 0 and batch_stride % 4 == 0 and inner % 4 == 0


def _size_class(M, N, Z) -> str:
    """Problem-size bucket for tuned tiles: log2 of the output elements per launch, and of M."""
    return f"{int(math.log2(max(1, M * N * Z)))}:{int(math.log2(max(1, M)))}"


def _strided(cp, x, own: bool):
    """(array, element strides) with the inner two strides usable by the kernels.

    The portable kernels take any non-negative strides; the own kernel needs one of the two inner
    dims to have unit stride (it picks the matching load layout)."""
    st = [s // 4 for s in x.strides]
    ok = all(s >= 0 for s in st) and all(s % 4 == 0 for s in x.strides) and max(st) < 2**31
    if own:
        ok = ok and (st[2] == 1 or st[1] == 1 or x.shape[1] == 1 or x.shape[2] == 1)
    if not ok:
        x = cp.ascontiguousarray(x)
        st = [s // 4 for s in x.strides]
    st = list(st)
    # size-1 dims may carry any stride; give them the canonical one so layout tests are reliable
    if x.shape[2] == 1:
        st[2] = 1
    elif x.shape[1] == 1:
        st[1] = 1 if st[2] != 1 else x.shape[2]
    return x, st
