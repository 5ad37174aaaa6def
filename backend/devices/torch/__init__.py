"""The PyTorch backends (cpu, cuda, rocm, xpu, mps and the torch-* aliases): the vendor path, the
op contract through PyTorch's own kernels (PyTorch is imported when a backend is probed or made)."""
from .backend import TorchBackend, create, probe

__all__ = ["TorchBackend", "create", "probe"]
