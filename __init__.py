"""AnyDevice Compute Nodes: neural-network and tensor nodes for ComfyUI on any device.

ComfyUI imports this file: it reads NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS and
WEB_DIRECTORY. The compute code lives in ``backend/`` and works without ComfyUI.
"""
from . import backend  # noqa: F401  (first: it sets BLAS threading up before NumPy loads)
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
