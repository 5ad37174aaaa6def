"""The NumPy backend: the op contract in plain NumPy on the CPU (own code, no kernels to build)."""
from .backend import NumpyBackend, create, probe

__all__ = ["NumpyBackend", "create", "probe"]
