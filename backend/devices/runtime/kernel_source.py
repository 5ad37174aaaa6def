"""Assembly of the kernel sources in kernels/: the API's prelude + the file, with its
``#include "name.h"`` lines expanded here in Python.

Every place that compiles a kernel builds exactly this text: the OpenCL backend (pyopencl),
the CUDA backend (CuPy / NVRTC), the CUDA compile check (nvcc or NVRTC, tools/cuda_compile_check.py)
and the PoCL test harness (tests/conformance/test_portable_kernels.py). No compiler is given an include path:
the on-disk binary caches (pyopencl programs, CuPy's kernel cache) key on the source text, so a
change to a header rebuilds every kernel that includes it, and paths with spaces never reach a
compiler's command line.

Rules (kernels/README.md): only quoted includes of files in the kernels folder
(``#include "elementwise_math.h"``); each file is expanded once per source (as if every header had
``#pragma once``; the headers carry classic include guards too); ``#line`` markers keep compiler
messages pointing at the right file and line. The prelude counts as included, so a file may name
it (``#include "prelude_opencl.h"``) and still get it once; so do both preludes, so a portable header
that names the OpenCL one (quant_decode.h) gets nothing more in a CUDA source.
"""
from __future__ import annotations

import re
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parents[3] / "kernels"
#: API -> prelude file (the portable-subset macros, kernels/README.md)
PRELUDES = {"opencl": "prelude_opencl.h", "cuda": "prelude_cuda.cuh"}

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*(?://.*|/\*.*\*/[ \t]*)?$')


def expand_includes(fname: str, kernels_dir: Path | str | None = None, done: set | None = None) -> str:
    """The text of kernels/``fname`` with its quoted ``#include`` lines replaced by the included
    files (recursively, each file at most once: ``done`` holds the names already expanded)."""
    kdir = Path(kernels_dir) if kernels_dir else KERNELS_DIR
    done = set() if done is None else done
    done.add(fname)
    path = kdir / fname
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"kernel source {fname!r} not found in {kdir}") from None
    out: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _INCLUDE.match(line)
        if not m:
            out.append(line)
            continue
        inc = m.group(1)
        if "/" in inc or "\\" in inc or inc in ("", ".", ".."):
            raise ValueError(f'{fname}:{lineno}: #include "{inc}": only files of the kernels folder')
        if not (kdir / inc).is_file():
            raise FileNotFoundError(f'{fname}:{lineno}: #include "{inc}": no such file in {kdir}')
        if inc in done:
            out.append(f"/* #include \"{inc}\": already included */")
            continue
        out.append(f'#line 1 "{inc}"')
        out.append(expand_includes(inc, kdir, done))
        out.append(f'#line {lineno + 1} "{fname}"')
    return "\n".join(out) + "\n"


def kernel_source(fname: str, api: str, kernels_dir: Path | str | None = None, prelude: bool = True) -> str:
    """What is compiled for kernels/``fname`` on ``api`` ("opencl" or "cuda", which also serves
    HIP): the API's prelude (unless ``prelude`` is false) followed by the file with its includes
    expanded."""
    if api not in PRELUDES:
        raise ValueError(f"api must be one of {', '.join(PRELUDES)}, not {api!r}")
    done: set = set()
    parts = []
    if prelude:
        parts.append(expand_includes(PRELUDES[api], kernels_dir, done))
        done.update(PRELUDES.values())  # a shared header naming the other API's prelude gets none (same guard)
    parts.append(f'#line 1 "{fname}"\n' + expand_includes(fname, kernels_dir, done))
    return "\n".join(parts)
