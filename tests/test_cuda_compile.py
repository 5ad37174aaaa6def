"""CI compile check of the CUDA kernels (no GPU needed): every CUDA kernel source and shipped
configuration builds for sm_80, sm_90 and compute_90 PTX without register spills in the GEMM/conv
kernels. Uses nvcc when on PATH, else NVRTC (libnvrtc) through ctypes; skips when neither exists."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
