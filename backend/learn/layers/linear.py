"""The fully connected layer: ``linear(out_features, bias=True)`` (torch.nn.Linear), on (N, F) features.

in_features comes from the input's last dim; the weight (out, in) and bias are initialised as
torch's nn.Linear initialises them (backend/learn/init.py, seeded per layer).
"""
from __future__ import annotations

from ...system.errors import AnyDeviceError
from .base import LAYERS, Layer, layer_seed, need_dims
from .settings import _bool, _int, _required, _unknown


@LAYERS.register
class Linear(Layer):
    """``linear(out_features, bias=True)``."""

    type = "linear"
    size_keys = ("out_features",)
    size_arg = "out_features"
    weighted = True

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("out_features", "bias"), self.type)
        _required(w, c, "out_features")
        return self.fits_alone(w, {"type": self.type, "out_features": _int(w, "out_features", c["out_features"]),
                                   "bias": _bool(w, "bias", c.get("bias", True))})

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (2,), "2-D (N, F): put a flatten layer before it")
        if s[-1] < 1:
            raise AnyDeviceError("linear", "input", tuple(s), "has no features")
        return tuple(s[:-1]) + (layer["out_features"],)

    def param_shapes(self, layer, key, x):
        ps = {key + ".weight": (layer["out_features"], x[-1])}
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_features"],)
        return ps, {}

    def param_names(self, layer, key):
        return [key + ".weight"] + ([key + ".bias"] if layer["bias"] else []), []

    def min_params(self, layer):
        return layer["out_features"] * (2 if layer["bias"] else 1)

    def has_params(self, layer):
        return True

    def needs_shape(self, layer):
        return True

    def init_params(self, layer, key, x, shapes, seed):
        from .. import init as _init
        w, b = _init.linear_params(layer["out_features"], x[-1], layer["bias"], layer_seed(seed, key))
        made = {key + ".weight": w}
        if b is not None:
            made[key + ".bias"] = b
        return made

    def forward(self, layer, x, key, run):
        return run.apply("linear", x, run.P[key + ".weight"], run.P.get(key + ".bias"), be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.Linear(s[-1], layer["out_features"], layer["bias"])

    def node_text(self, layer):
        return f"linear -> {layer['out_features']}"

    def widgets(self, choice=None):
        return ("out_features", "bias")
