"""AnyDevice Compute Nodes: neural-network and tensor nodes for ComfyUI on any device.

ComfyUI imports this file and reads NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS and
WEB_DIRECTORY. The compute code lives in ``backend/`` and works without ComfyUI and without
PyTorch: the node mappings (which need PyTorch) load on first use, so ``from anydevice import
backend`` and ``anydevice devices`` work where only NumPy is installed.

Imported as a plain file rather than a package (pytest does that to a checkout whose folder name
is not a Python identifier, such as ``anydevice-main``), there is nothing to register: the
mappings are empty and nothing else is imported.
"""
WEB_DIRECTORY = "./web"

_NODE_MAPPINGS = ("NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS")

if __package__:
    from . import backend  # noqa: F401  (first: it sets BLAS threading up before NumPy loads)


def __getattr__(name: str):
    if name not in _NODE_MAPPINGS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if __package__:
        from . import nodes
        value = getattr(nodes, name)
    else:
        value = {}
    globals()[name] = value
    return value


__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
