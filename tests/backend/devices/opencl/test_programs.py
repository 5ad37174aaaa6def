"""Every OpenCL program of the pack builds as OpenCL C 1.2 (`-cl-std=CL1.2`): the language of the
devices that have no 2.0/3.0 compiler (Apple's OpenCL, older Intel and ARM GPUs). Without a
`-cl-std` option a driver compiles OpenCL C 1.x anyway; this keeps the kernels inside it.
Built on whatever OpenCL device is here (PoCL in CI), with each file's default build options."""
from __future__ import annotations

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
