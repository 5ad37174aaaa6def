#!/usr/bin/env python3
"""CI compile check for the CUDA kernels, no GPU needed.

Builds every CUDA kernel source the CUDA backend compiles -- the portable GPU-family files
(kernels/*_gpu.cl, found dynamically) and the CUDA-only kernels/*.cu, each exactly as the backend
assembles it (``devices.cuda.kernel_source``: prelude_cuda.cuh + the file with its
``#include "x.h"`` lines expanded by backend/devices/runtime/kernel_source.py, so no -I is needed and a header
change reaches every file that includes it) -- in every macro configuration the backend ships
(``devices.cuda.shipped_configs``;
a file it does not list is built with its defaults), for sm_80 and sm_90 cubins and compute_90
PTX. Prints registers, stack and spills per kernel; fails on a compile error (with the compiler
log) and on any register spill in the GEMM/conv kernels.

Compiler: ``nvcc`` when on PATH (one ``-fatbin`` call per source and configuration with
``-Xptxas -v``), else NVRTC through ctypes (libnvrtc from the CUDA toolkit or from the PyPI wheel
``nvidia-cuda-nvrtc-cu12`` / ``nvidia-cuda-nvrtc``), with ``--ptxas-options=-v``.

    python tools/cuda_compile_check.py [--compiler auto|nvcc|nvrtc] [--jobs N] [--kernels-dir DIR]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import ctypes.util
import glob
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("sm_80", "sm_90")
PTX_ARCH = "compute_90"
#: spilled bytes allowed in a build that caps registers on purpose (MIN_BLOCKS)
CAPPED_SPILL = 128
#: kernels whose register spills fail the check (the GEMM/conv inner loops)
MAIN_KERNEL = re.compile(r"gemm|conv")


def _backend_module():
    """backend.devices.cuda, imported without running the pack's ComfyUI __init__ (and without CuPy)."""
    pkg = "anydevice_compile_check"
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(ROOT)]
        sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.backend.devices.cuda")


@dataclass
class KernelInfo:
    kernel: str
    arch: str
    registers: int = -1
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0


@dataclass
class Result:
    fname: str
    macros: dict
    ok: bool
    log: str
    kernels: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.macros.items())) or "(defaults)"


def discover(kernels_dir: Path) -> list[str]:
    """CUDA kernel sources: the portable *_gpu.cl files and the CUDA-only *.cu files."""
    portable = sorted(Path(p).name for p in glob.glob(str(kernels_dir / "*_gpu.cl")))
    cuda = sorted(Path(p).name for p in glob.glob(str(kernels_dir / "*.cu")))
    return portable + cuda


def jobs_for(kernels_dir: Path) -> list[tuple[str, dict]]:
    cb = _backend_module()
    shipped = cb.shipped_configs()
    out = []
    for fname in discover(kernels_dir):
        cfgs = list(shipped.get(fname, []))
        if fname.endswith("_gpu.cl") and {} not in cfgs:
            cfgs.insert(0, {})  # the file's own defaults (what OpenCL builds without options)
        for cfg in cfgs or [{}]:
            out.append((fname, cfg))
    return out


def parse_ptxas(log: str) -> list[KernelInfo]:
    infos: list[KernelInfo] = []
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
        if m:
            cur = KernelInfo(m.group(1), m.group(2))
            infos.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur.registers = int(m.group(1))
            m2 = re.search(r"(\d+) bytes smem", line)
            if m2:
                cur.smem = int(m2.group(1))
    return infos


# ---- nvcc ------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def compile_nvcc(nvcc: str, src: str, fname: str, macros: dict, tmp: Path) -> tuple[bool, str]:
    cb = _backend_module()
    stem = f"{Path(fname).stem}_{abs(hash(tuple(sorted(macros.items())))):x}"
    cu = tmp / f"{stem}.cu"
    cu.write_text(src)
    cmd = [nvcc, "-fatbin", "-Xptxas", "-v", "-o", str(tmp / f"{stem}.fatbin")]
    for arch in ARCHS:
        cmd += ["-gencode", f"arch=compute_{arch[3:]},code={arch}"]
    cmd += ["-gencode", f"arch={PTX_ARCH},code={PTX_ARCH}"]
    cmd += list(cb.build_options(macros)) + [str(cu)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode == 0, (p.stdout + p.stderr)


# ---- NVRTC through ctypes -----------------------------------------------------------------
_nvrtc = None


def load_nvrtc():
    """libnvrtc from the CUDA toolkit, the nvidia-cuda-nvrtc* wheels, or the loader path."""
    global _nvrtc
    if _nvrtc is not None:
        return _nvrtc
    cands = []
    for base in sys.path:
        for sub in ("nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"):
            cands += sorted(glob.glob(os.path.join(base, sub, "libnvrtc.so*")))
    cands += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        cands.append(found)
    for path in cands:
        if "builtins" in path or ".alt." in path:
            continue
        try:
            d = os.path.dirname(path)
            for b in sorted(glob.glob(os.path.join(d, "libnvrtc-builtins.so*"))):
                if ".alt." not in b:  # preload so libnvrtc's dlopen by soname finds it
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            _nvrtc = ctypes.CDLL(path)
            return _nvrtc
        except OSError:
            continue
    return None


def compile_nvrtc(src: str, fname: str, macros: dict) -> tuple[bool, str]:
    cb = _backend_module()
    lib = load_nvrtc()
    logs, ok = [], True
    for target in ARCHS + (PTX_ARCH,):
        prog = ctypes.c_void_p()
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), fname.encode(), 0, None, None)
        if rc:
            return False, f"nvrtcCreateProgram failed ({rc})"
        opts = [f"--gpu-architecture={target}".encode()] + [o.encode() for o in cb.build_options(macros)]
        if target.startswith("sm_"):
            opts.append(b"--ptxas-options=-v")
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc == 0 and target.startswith("sm_"):
            size = ctypes.c_size_t()
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            if size.value == 0:
                rc, log = -1, log + "\n(no CUBIN produced)"
        # NVRTC logs the entry name without the arch; tag it so the parser sees it per arch
        log = re.sub(r"Compiling entry function '([^']+)'(?! for)", rf"Compiling entry function '\1' for '{target}'",
                     log)
        logs.append(f"[{target}] {log}")
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        if rc:
            ok = False
            break
    return ok, "\n".join(logs)


def compiler_choice(pref: str = "auto") -> tuple[str, str | None]:
    if pref in ("auto", "nvcc"):
        nvcc = find_nvcc()
        if nvcc:
            return "nvcc", nvcc
        if pref == "nvcc":
            raise SystemExit("nvcc not found")
    if load_nvrtc() is None:
        raise SystemExit("neither nvcc nor libnvrtc found: install the CUDA toolkit, or "
                         "pip install nvidia-cuda-nvrtc-cu12")
    return "nvrtc", None


# ---- driver ---------------------------------------------------------------------------------
def run_check(kernels_dir: Path | str | None = None, compiler: str = "auto", jobs: int | None = None,
              log=print) -> tuple[bool, list[Result], list[str]]:
    """Compile everything; returns (ok, results, problems)."""
    cb = _backend_module()
    kdir = Path(kernels_dir) if kernels_dir else cb.KERNELS_DIR
    kind, nvcc = compiler_choice(compiler)
    work = jobs_for(kdir)
    log(f"CUDA compile check: {len(work)} source/configuration builds with {kind} "
        f"({nvcc or 'libnvrtc'}), targets {', '.join(ARCHS)} + {PTX_ARCH} PTX")
    t0 = time.time()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="anydevice_cc_") as tmp:
        def one(item):
            fname, macros = item
            t = time.time()
            try:
                src = cb.kernel_source(fname, kdir)
            except (OSError, ValueError) as exc:  # a missing or misnamed #include
                return Result(fname, macros, False, f"source assembly failed: {exc}", [], 0.0)
            if kind == "nvcc":
                ok, text = compile_nvcc(nvcc, src, fname, macros, Path(tmp))
            else:
                ok, text = compile_nvrtc(src, fname, macros)
            return Result(fname, macros, ok, text, parse_ptxas(text) if ok else [], time.time() - t)

        n = jobs or os.cpu_count() or 2
        with cf.ThreadPoolExecutor(max_workers=n) as ex:
            results = list(ex.map(one, work))
    problems = []
    for r in results:
        if not r.ok:
            problems.append(f"compile error in {r.fname} [{r.label}]:\n{r.log}")
            continue
        for k in r.kernels:
            # a register cap (MIN_BLOCKS: __launch_bounds__) may cost some spilled bytes (L1-cached): measured
            # and chosen (runtime/conv_gemm.py's _O_WW), so up to CAPPED_SPILL bytes pass there
            allowed = CAPPED_SPILL if "MIN_BLOCKS" in r.macros else 0
            if MAIN_KERNEL.search(k.kernel) and max(k.spill_stores, k.spill_loads) > allowed:
                problems.append(f"register spills in {k.kernel} ({r.fname} [{r.label}], {k.arch}): "
                                f"{k.spill_stores} B stores, {k.spill_loads} B loads")
        archs = {k.arch for k in r.kernels}
        missing = [a for a in ARCHS if a not in archs]
        if missing:
            problems.append(f"{r.fname} [{r.label}]: no ptxas report for {', '.join(missing)}")
    log(format_table(results))
    log(f"{len(results)} builds in {time.time() - t0:.1f} s; "
        f"{'OK' if not problems else f'{len(problems)} problem(s)'}")
    for p in problems:
        log("FAIL: " + p)
    return not problems, results, problems


def format_table(results: list[Result]) -> str:
    head = f"{'file':<24} {'kernel':<22} {'arch':<6} {'regs':>4} {'stack':>5} {'spill st/ld':>11} {'smem':>6}  config"
    lines = [head, "-" * len(head)]
    for r in results:
        if not r.ok:
            lines.append(f"{r.fname:<24} {'COMPILE ERROR':<22} {'':<6} {'':>4} {'':>5} {'':>11} {'':>6}  {r.label}")
            continue
        for k in r.kernels:
            lines.append(f"{r.fname:<24} {k.kernel:<22} {k.arch:<6} {k.registers:>4} {k.stack:>5} "
                         f"{f'{k.spill_stores}/{k.spill_loads}':>11} {k.smem:>6}  {r.label}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiler", default="auto", choices=("auto", "nvcc", "nvrtc"))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--kernels-dir", default=None)
    args = ap.parse_args(argv)
    ok, _, _ = run_check(args.kernels_dir, args.compiler, args.jobs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
