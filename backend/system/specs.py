"""The backends the pack knows, one line each: name, priority of the automatic choice (lower
first), title, and the device modules that serve it (tried in order: the pack's own kernels before
the vendor path). The registry probes and creates them; settings check backend names against it."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import AnyDeviceError


@dataclass(frozen=True)
class BackendSpec:
    name: str
    priority: int
    title: str
    #: (device package inside backend/, name passed to its probe/create)
    impls: tuple[tuple[str, str], ...]


SPECS: list[BackendSpec] = [
    BackendSpec("cuda", 10, "NVIDIA GPU", (("devices.cuda", "cuda"), ("devices.torch", "cuda"))),
    BackendSpec("rocm", 20, "AMD GPU (ROCm)", (("devices.cuda", "rocm"), ("devices.torch", "rocm"))),
    BackendSpec("xpu", 30, "Intel GPU (XPU)", (("devices.torch", "xpu"),)),
    BackendSpec("mps", 40, "Apple GPU (MPS)", (("devices.torch", "mps"),)),
    BackendSpec("opencl", 50, "OpenCL device (own kernels)", (("devices.opencl", "opencl"),)),
    BackendSpec("numpy", 70, "CPU, NumPy (own code)", (("devices.numpy", "numpy"),)),
    BackendSpec("cpu", 80, "CPU, PyTorch", (("devices.torch", "cpu"),)),
    BackendSpec("torch-cuda", 90, "NVIDIA GPU, PyTorch/cuDNN", (("devices.torch", "torch-cuda"),)),
    BackendSpec("torch-rocm", 91, "AMD GPU, PyTorch/MIOpen", (("devices.torch", "torch-rocm"),)),
]
#: the names every listing shows even when unavailable; the torch-* aliases show when available
CORE_NAMES = ("cuda", "rocm", "xpu", "mps", "opencl", "numpy", "cpu")


def known_names() -> list[str]:
    return [s.name for s in SPECS]


def parse_name(name: str) -> tuple[str, int]:
    base, _, idx = name.strip().partition(":")
    if idx and not idx.isdigit():
        raise AnyDeviceError("get_backend", "name", name, "device index after ':' must be a number")
    return base.lower(), int(idx or 0)
