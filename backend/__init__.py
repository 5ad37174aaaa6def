"""AnyDevice compute backends, usable without ComfyUI.

    from anydevice import backend            # or `import backend` from the repository root
    backend.list_backends()                   # every backend, available or with its reason
    be = backend.get_backend()                # the auto choice (ANYDEVICE_BACKEND overrides)
    y = be.conv2d(x, w, stride=2, padding=1)  # PyTorch semantics, float32, x: NumPy or torch

Every backend implements the op contract in ``contract.Backend``; see README.md for the list.

Public: exactly ``__all__``, plus the submodules ``autograd`` and ``optim`` (imported on first use),
``compile``, ``network`` (Network) and ``train`` (train, predict, TrainResult); everything else is
private and may change without notice (README, "Public API").

Threads (README, "Thread safety"): the registry may be used from any thread (one instance per name
and index); a Backend's ops may be called from several threads at once (OpenCL serialises its
launches on one queue); a compiled module is compiled in one thread, then may be called from
several; the cancel checker is process-wide. Not safe: writing one array from two threads, training
one Network from two threads.
"""
from .system import threads as _threads

_threads.prepare_blas_env()  # before NumPy loads, where it has not yet (see threads.py)

from .ops.contract import (  # noqa: E402
    ACTIVATIONS, BINARY_OPS, LOSSES, PADDING_MODES, REDUCE_OPS, UNARY_OPS, Backend, conv2d_plan,
    conv_transpose2d_plan)
from .system.errors import AnyDeviceError  # noqa: E402
from .system.registry import BackendInfo, auto_name, describe, get_backend, list_backends  # noqa: E402

__all__ = [
    "AnyDeviceError", "Backend", "BackendInfo", "list_backends", "get_backend", "auto_name", "describe",
    "conv2d_plan", "conv_transpose2d_plan",
    "ACTIVATIONS", "BINARY_OPS", "LOSSES", "PADDING_MODES", "REDUCE_OPS", "UNARY_OPS",
]

#: public submodules, imported on first use (``from anydevice.backend import autograd, optim``);
#: autograd and optim live deeper in the package
_LAZY = {"autograd": ".learn.autograd", "optim": ".learn.optim", "compile": ".compile",
         "network": ".network", "train": ".train"}


def __getattr__(name):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return importlib.import_module(target, __name__)
