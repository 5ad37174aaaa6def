"""The CUDA backend's mixins run without a GPU: a stand-in base whose kernels are the CUDA sources built as
OpenCL C (prelude_opencl.h + the file) on PoCL and launched through pyopencl with the (groups, group size)
CuPy would get, NumPy arrays standing in for CuPy's (copied to buffers and back around each launch).
Used by tests/backend/devices/cuda/test_attention_kernel.py and test_halfops_pocl.py."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices import cuda as cuda_backend
from anydevice.backend.devices.runtime import cl_scalar_dtypes
from anydevice.backend.devices.runtime.kernel_source import kernel_source


class FakeCp:
    """What the CUDA mixins use of CuPy, as NumPy."""
    ndarray = np.ndarray
    float32 = np.float32
    float64 = np.float64
    ascontiguousarray = staticmethod(np.ascontiguousarray)
    broadcast_to = staticmethod(np.broadcast_to)
    empty = staticmethod(np.empty)


#: the stored dtype -> the NumPy dtype the CUDA backend keeps it as (bfloat16: its bits as uint16)
NP_OF = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32}


def stored(t, dtype: str):
    """a torch tensor as the CUDA backend stores ``dtype`` (float32, float16, or bfloat16's bits as uint16)"""
    import torch
    t = t.contiguous()
    if dtype == "bfloat16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return t.to(getattr(torch, dtype)).numpy()


def value(a, dtype: str):
    """a stored array (``stored``) as a float64 torch tensor"""
    import torch
    a = np.ascontiguousarray(a)
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).double()
    return torch.from_numpy(a.astype(np.float64))


class PoclStandIn:
    """``_function`` of a CUDA mixin on PoCL; ``launches`` records (file, kernel, macros, grid, block)."""

    def __init__(self, cl):
        devs = [d for p in cl.get_platforms() for d in p.get_devices()]
        pocl = [d for d in devs if "Portable Computing Language" in d.platform.name]
        self.cl, self.dev = cl, (pocl or devs)[0]
        self.ctx = cl.Context([self.dev])
        self.queue = cl.CommandQueue(self.ctx)
        self.launches: list = []
        self._kernels: dict = {}

    def _function(self, fname, kname, macros):
        cl = self.cl
        key = (fname, kname, tuple(sorted(macros.items())))
        k = self._kernels.get(key)
        if k is None:
            src = kernel_source(fname, "opencl", cuda_backend.KERNELS_DIR)
            prg = cl.Program(self.ctx, src).build(options=" ".join(cuda_backend.build_options(macros)))
            k = self._kernels[key] = cl.Kernel(prg, kname)
            k.set_scalar_arg_dtypes(cl_scalar_dtypes(kname))

        def launch(grid, block, args):
            self.launches.append((fname, kname, dict(macros), grid, block))
            mf = cl.mem_flags
            bufs = {i: cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                                 hostbuf=a if a.size else np.zeros(1, np.float32))
                    for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.ndim}
            k(self.queue, (grid[0] * block[0],), (block[0],), *(bufs.get(i, a) for i, a in enumerate(args)))
            for i, b in bufs.items():
                if args[i].size and args[i].flags.writeable:
                    cl.enqueue_copy(self.queue, args[i], b)
            self.queue.finish()

        launch.max_threads_per_block = 1024
        return launch

    def _dtype(self, x):
        return {"float16": "float16", "uint16": "bfloat16"}.get(str(x.dtype), "float32")

    def _empty(self, shape, dtype="float32"):
        return np.empty(tuple(shape), NP_OF[dtype])

    def _enter(self):
        pass

    def launched(self) -> list:
        """the kernel names launched so far"""
        return [entry[1] for entry in self.launches]


def standin(cls):
    """A ``cls`` (a PoclStandIn mixin) on this machine's OpenCL, or the test skipped with the reason."""
    cl = pytest.importorskip("pyopencl", reason="pyopencl not installed")
    try:
        return cls(cl)
    except Exception as exc:  # no OpenCL device here
        pytest.skip(f"no OpenCL device: {exc}")
