"""ComfyUI nodes: thin adapters over ``backend/``.

Every node class is named ``AnyDevice<Name>``, shows as "<Name> (AnyDevice)" (the model nodes: "<Kind> on
AnyDevice") and sits under the
``AnyDevice/...`` categories. ``runner.py`` runs API-format workflows of these nodes without ComfyUI.
"""
from __future__ import annotations

import logging

try:
    import torch  # noqa: F401  (the nodes pass torch tensors; say so before anything else fails)
except ModuleNotFoundError as _exc:
    if _exc.name != "torch":
        raise
    from ..backend.system.registry import INSTALL_TORCH
    raise ModuleNotFoundError(f"the AnyDevice nodes need PyTorch: {INSTALL_TORCH}", name="torch") from None

from .compute.ops import COMPUTE_NODES
from .learn.dataset import DATASET_NODES
from .tensors.nodes import HELPER_NODES
from .models.compiled import MODEL_NODES
from .models.gguf import GGUF_NODES
from .learn.network import NETWORK_NODES
from .compute.norm import NORM_NODES
from .compute.windows import WINDOW_NODES

log = logging.getLogger("anydevice")

ALL_NODES = COMPUTE_NODES + HELPER_NODES + WINDOW_NODES + NORM_NODES + DATASET_NODES + NETWORK_NODES + MODEL_NODES + GGUF_NODES
NODE_CLASS_MAPPINGS: dict = {cls.__name__: cls for cls in ALL_NODES}
NODE_DISPLAY_NAME_MAPPINGS: dict = {cls.__name__: cls.DISPLAY for cls in ALL_NODES}

_logged = False


def log_backend_choice() -> None:
    """One log line at load: the chosen backend and device, and the others."""
    global _logged
    if _logged:
        return
    _logged = True
    name = "numpy"
    try:
        from ..backend import describe
        from ..backend.system import registry
        from .base.common import load_time_backend_name
        with registry.deferred_selfcheck():  # start-up: a backend's self-check runs on its first use
            name = load_time_backend_name()
            log.info("AnyDevice: %s", describe())
    except Exception as exc:  # noqa: BLE001 - loading the pack must never fail on this
        # e.g. ANYDEVICE_BACKEND naming no backend (config.ConfigError names the variable)
        log.warning("AnyDevice: %s; nodes without a DEVICE input run on %s", exc, name)


log_backend_choice()

from .base import memory_hooks  # noqa: E402

memory_hooks.install()  # inside ComfyUI: give pooled memory back when it asks; otherwise nothing

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
