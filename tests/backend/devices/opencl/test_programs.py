"""Every OpenCL program of the pack builds as OpenCL C 1.2 (`-cl-std=CL1.2`): the language of the
devices that have no 2.0/3.0 compiler (Apple's OpenCL, older Intel and ARM GPUs). Without a
`-cl-std` option a driver compiles OpenCL C 1.x anyway; this keeps the kernels inside it.
Built on whatever OpenCL device is here (PoCL in CI), with each file's default build options."""
from __future__ import annotations

import time

import pytest

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl.params import DEFAULT_TUNE, KFILES
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

#: build options a file needs beyond its defaults (dequant.cu: a quantized format code)
EXTRA = {"dequant.cu": {"WQ": 3}}


@pytest.mark.parametrize("fname,portable", sorted(set(KFILES.values())))
def test_every_program_builds_as_opencl_c_1_2(fname, portable):
    import pyopencl as cl
    params = {**DEFAULT_TUNE.get(fname, {}), **EXTRA.get(fname, {})}
    opts = " ".join(f"-D{a}={b}" for a, b in sorted(params.items())) + " -cl-std=CL1.2"
    prg = cl.Program(BE.ctx, BE._source(fname, portable)).build(opts)
    names = prg.get_info(cl.program_info.KERNEL_NAMES).split(";")
    assert {k for k, (f, _) in KFILES.items() if f == fname} <= set(names)


def test_a_build_prints_nothing_to_the_terminal(capfd):
    """PoCL's in-process compiler writes its warning count ("102 warnings generated.") to fd 2 on a target
    without AVX-512; builds pass -w (programs.quiet), so a source with warnings builds silently."""
    from anydevice.backend.devices.opencl.programs import ProgramCache
    src = ("float16 f(float16 a, float16 b) { return a * b; }\n"  # -Wpsabi without AVX-512, others elsewhere
           "__kernel void noisy(__global float *y) { int unused; float16 v = f((float16)(y[1]), (float16)(y[2]));"
           " y[0] = v.s3 + 1.5; }\n"
           f"/* {time.time_ns()} */\n")  # a new source: PoCL compiles it (its cache would not)
    capfd.readouterr()
    prg = ProgramCache(BE.ctx, BE.dev).build(src, "-DNOISY_TEST=1")
    assert prg.noisy is not None
    out = capfd.readouterr()
    assert "warning" not in out.err and "warning" not in out.out, out
