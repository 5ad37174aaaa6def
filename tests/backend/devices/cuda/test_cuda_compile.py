"""CI compile check of the CUDA kernels (no GPU needed): every CUDA kernel source and shipped
configuration builds for sm_80, sm_90 and compute_90 PTX without register spills in the GEMM/conv
kernels. Uses nvcc when on PATH, else NVRTC (libnvrtc) through ctypes; skips when neither exists.

Also the source assembly all compilers share (backend/devices/runtime/kernel_source.py): prelude + file with its
``#include "x.h"`` lines expanded once each, ``#line`` markers pointing at the right file."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from anydevice.backend.devices.runtime import kernel_source as ks

from repo_paths import ROOT  # noqa: E402


def _tool():
    name = "anydevice_cuda_compile_check_tool"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "cuda_compile_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _have_compiler(tool) -> bool:
    return tool.find_nvcc() is not None or tool.load_nvrtc() is not None


def test_discovers_portable_and_cuda_sources():
    tool = _tool()
    names = tool.discover(ROOT / "kernels")
    assert "conv_gemm_cuda.cu" in names and "misc_cuda.cu" in names
    assert all(n.endswith("_gpu.cl") or n.endswith(".cu") for n in names)
    jobs = tool.jobs_for(ROOT / "kernels")
    # every shipped configuration of a present file is built
    shipped = tool._backend_module().shipped_configs()
    for fname, cfgs in shipped.items():
        if (ROOT / "kernels" / fname).exists():
            for cfg in cfgs:
                assert (fname, cfg) in jobs


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'gemm_gpu' for 'sm_80'
ptxas info    : Function properties for gemm_gpu
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8192 bytes smem, 440 bytes cmem[0]"""
    (k,) = _tool().parse_ptxas(log)
    assert (k.kernel, k.arch, k.registers, k.stack, k.spill_stores, k.spill_loads, k.smem) == \
        ("gemm_gpu", "sm_80", 255, 8, 4, 12, 8192)


def test_compile_error_is_reported(tmp_path):
    tool = _tool()
    if not _have_compiler(tool):
        pytest.skip("no nvcc on PATH and no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    (kdir / "prelude_cuda.cuh").write_text((ROOT / "kernels" / "prelude_cuda.cuh").read_text())
    (kdir / "broken_gpu.cl").write_text("KERNEL void broken_gpu(GLOBAL float* x) { x[0] = undefined_name; }\n")
    lines = []
    ok, results, problems = tool.run_check(kdir, log=lines.append)
    assert not ok
    assert any("broken_gpu.cl" in p and "undefined_name" in p for p in problems)


def test_all_cuda_kernels_compile_without_spills():
    tool = _tool()
    if not _have_compiler(tool):
        pytest.skip("no nvcc on PATH and no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    lines = []
    ok, results, problems = tool.run_check(log=lines.append)
    print("\n".join(lines))
    assert ok, "\n".join(problems)
    built = {r.fname for r in results}
    for name in tool.discover(ROOT / "kernels"):
        assert name in built
    kernels = {k.kernel for r in results for k in r.kernels}
    assert {"ad_conv_gemm", "ad_unary", "ad_pad", "ad_direct_conv"} <= kernels


# ---- source assembly (backend/devices/runtime/kernel_source.py) ------------------------------------------------
def _kdir(tmp_path, files: dict):
    kdir = tmp_path / "kernels dir"  # a space in the path: no compiler ever sees it
    kdir.mkdir()
    for name, text in files.items():
        (kdir / name).write_text(text)
    return kdir


def test_includes_expanded_once_with_line_markers(tmp_path):
    kdir = _kdir(tmp_path, {
        "prelude_opencl.h": "#define OCL 1\n", "prelude_cuda.cuh": "#define CU 1\n",
        "b.h": "int b_once;\n",
        "a.h": '#include "b.h"\nint a_once;\n',
        "main_gpu.cl": '// main\n#include "a.h"\n  #  include "b.h"  // again\nint main_body;\n',
    })
    src = ks.kernel_source("main_gpu.cl", "cuda", kdir)
    assert src.count("int b_once;") == 1 and src.count("int a_once;") == 1 and "#define CU 1" in src
    assert "#define OCL" not in src and not [ln for ln in src.splitlines() if ln.lstrip().startswith("#include")]
    lines = src.splitlines()
    # main_body is line 4 of main_gpu.cl: so must the last #line marker before it count
    i = lines.index("int main_body;")
    j = max(k for k in range(i) if lines[k].startswith("#line"))
    num, name = lines[j].split()[1:]
    assert (int(num) + (i - j - 1), name) == (4, '"main_gpu.cl"'), lines[j:i + 1]
    assert ks.kernel_source("main_gpu.cl", "opencl", kdir).count("#define OCL 1") == 1
    no_prelude = ks.kernel_source("main_gpu.cl", "opencl", kdir, prelude=False)
    assert "#define OCL" not in no_prelude and "int a_once;" in no_prelude
    # a file may name its prelude itself (elementwise.cl does): still once
    (kdir / "self.cl").write_text('#include "prelude_opencl.h"\nint s;\n')
    assert ks.kernel_source("self.cl", "opencl", kdir).count("#define OCL 1") == 1
    assert ks.kernel_source("self.cl", "opencl", kdir, prelude=False).count("#define OCL 1") == 1


def test_include_errors(tmp_path):
    kdir = _kdir(tmp_path, {"prelude_cuda.cuh": "", "m.cu": '#include "missing.h"\n',
                            "up.cu": '#include "../x.h"\n'})
    with pytest.raises(FileNotFoundError, match="missing.h"):
        ks.kernel_source("m.cu", "cuda", kdir)
    with pytest.raises(ValueError, match="kernels folder"):
        ks.kernel_source("up.cu", "cuda", kdir)
    with pytest.raises(ValueError):
        ks.kernel_source("m.cu", "metal", kdir)


def test_every_kernel_source_assembles():
    """Every kernel file, for each API its backend builds it for: no include left, the prelude
    once, each shared header in the files that use it."""
    kdir = ROOT / "kernels"
    for f in sorted(kdir.glob("*.c[lu]")):
        for api in ("opencl", "cuda") if f.name.endswith("_gpu.cl") or f.suffix == ".cu" else ("opencl",):
            src = ks.kernel_source(f.name, api, kdir)
            assert "#include" not in "\n".join(ln for ln in src.splitlines() if not ln.startswith("/*")), f
            assert src.count("#define ANYDEVICE_PRELUDE_H") == 1, (f, api)
    for f, api in (("elementwise.cl", "opencl"), ("misc_cuda.cu", "cuda"), ("misc_cuda.cu", "opencl")):
        assert "DEVICE_FN_INLINE float ad_unary_op(" in ks.kernel_source(f, api, kdir)


def test_compile_error_in_header_names_the_header(tmp_path):
    """The #line markers: nvcc / NVRTC report an error in an included header at its own line."""
    tool = _tool()
    if not _have_compiler(tool):
        pytest.skip("no nvcc on PATH and no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    kdir = _kdir(tmp_path, {
        "prelude_cuda.cuh": (ROOT / "kernels" / "prelude_cuda.cuh").read_text(),
        "bad.h": "/* line 1 */\n/* line 2 */\nDEVICE_FN float bad(void) { return undefined_in_header; }\n",
        "hdr_gpu.cl": '#include "bad.h"\nKERNEL void hdr_gpu(GLOBAL float* x) { x[0] = bad(); }\n',
    })
    ok, results, problems = tool.run_check(kdir, log=lambda *_: None)
    assert not ok
    text = "\n".join(problems)
    assert "undefined_in_header" in text and ("bad.h(3)" in text or "bad.h:3" in text), text
    (kdir / "hdr_gpu.cl").write_text('#include "gone.h"\n')
    ok, results, problems = tool.run_check(kdir, log=lambda *_: None)
    assert not ok and any("gone.h" in p and "source assembly failed" in p for p in problems)
