"""One class per layer kind, and the registry that maps type names to them (``LAYERS``).

``base.py`` has the Layer base class (every method's contract) and the registry; the kinds are in
modules by family: ``conv.py`` (conv2d, conv_transpose2d), ``linear.py``, ``activation.py``,
``norm.py`` (batch / group / layer / instance norm), ``pool.py``, ``shape.py`` (upsample, dropout,
flatten), ``residual.py``; ``settings.py`` is the vocabulary they check their settings with.
Importing this package registers every kind, in the order ``LAYER_TYPES`` lists them.
"""
from __future__ import annotations

from .base import LAYERS, Layer, Registry, Run, layer_from_dict, layer_seed, layer_shape, normalize_layer, \
    settings_text, where_of
from . import conv, linear, activation, norm, pool, shape, residual  # noqa: F401,E401 - they register
from .activation import ACTIVATION_PARAMS
from .pool import POOL_KINDS
from .shape import UPSAMPLE_MODES

#: every layer type, in the order errors list them
LAYER_TYPES = tuple(LAYERS)

__all__ = ["LAYERS", "LAYER_TYPES", "Layer", "Registry", "Run", "ACTIVATION_PARAMS", "POOL_KINDS", "UPSAMPLE_MODES",
           "layer_from_dict", "layer_seed", "layer_shape", "normalize_layer", "settings_text", "where_of"]
