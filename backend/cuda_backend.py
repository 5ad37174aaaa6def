"""The CUDA / ROCm backend (registry module name); the code is the package ``backend/cuda/``."""
from .cuda import *  # noqa: F401,F403
from .cuda import __all__, __getattr__  # noqa: F401
