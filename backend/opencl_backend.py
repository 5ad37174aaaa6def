"""The OpenCL backend (registry module name); the code is the package ``backend/opencl/``."""
from .opencl import *  # noqa: F401,F403
from .opencl import __all__  # noqa: F401
