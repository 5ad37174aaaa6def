"""The layers that move values without weights: ``upsample`` (torch.nn.Upsample), ``dropout`` and ``flatten``."""
from __future__ import annotations

import math

from ...ops import plans
from .base import LAYERS, Layer, layer_seed, need_dims
from .settings import _bool, _choice, _err, _float, _required, _unknown

UPSAMPLE_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def _scale(sf):
    """A scale_factor as the kernels and torch take it (a pair as a tuple)."""
    return tuple(sf) if isinstance(sf, list) else sf


@LAYERS.register
class Upsample(Layer):
    """``upsample(scale_factor, mode="nearest", align_corners=None)`` on (N, C, H, W)."""

    type = "upsample"
    size_keys = ("scale_factor", "mode")

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("scale_factor", "mode", "align_corners"), self.type)
        _required(w, c, "scale_factor")
        sf = c["scale_factor"]
        if isinstance(sf, (tuple, list)) and len(sf) == 2:
            sf = [_float(w, "scale_factor", v, 0.0, lo_open=True) for v in sf]
        else:
            sf = _float(w, "scale_factor", sf, 0.0, lo_open=True)
        mode = _choice(w, "mode", c.get("mode", "nearest"), UPSAMPLE_MODES)
        ac = c.get("align_corners")
        if ac is not None:
            ac = _bool(w, "align_corners", ac)
            if mode not in ("bilinear", "bicubic"):
                raise _err(w, "align_corners", ac, "only applies to bilinear and bicubic")
        return {"type": self.type, "scale_factor": sf, "mode": mode, "align_corners": ac}

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (4,), "4-D (N, C, H, W)")
        plan = plans.interpolate_plan("interpolate", s, None, _scale(layer["scale_factor"]),
                                      layer["mode"], layer["align_corners"], None, False)
        return tuple(plan.out_shape)

    def forward(self, layer, x, key, run):
        return run.apply("interpolate", x, scale_factor=_scale(layer["scale_factor"]), mode=layer["mode"],
                         align_corners=layer["align_corners"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.Upsample(scale_factor=_scale(layer["scale_factor"]), mode=layer["mode"],
                                 align_corners=layer["align_corners"])

    def node_text(self, layer):
        return f"upsample x{layer['scale_factor']} {layer['mode']}"

    def widgets(self, choice=None):
        return ("scale_factor", "mode")


@LAYERS.register
class Dropout(Layer):
    """``dropout(p=0.5)``: only in training; the mask is seeded (``forward(seed=)``), not torch's stream."""

    type = "dropout"

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("p",), self.type)
        return {"type": self.type, "p": _float(w, "p", c.get("p", 0.5), 0.0, 1.0)}

    def forward(self, layer, x, key, run):
        if run.training and layer["p"] > 0:
            seed = None if run.seed is None else layer_seed(run.seed, "dropout:" + key)
            return run.apply("dropout", x, p=layer["p"], training=True, seed=seed, be=run.be)
        return x

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.Dropout(layer["p"])

    def node_text(self, layer):
        return f"dropout p={layer['p']}"

    def widgets(self, choice=None):
        return ("p",)


@LAYERS.register
class Flatten(Layer):
    """``flatten``: (N, ...) -> (N, prod(...))."""

    type = "flatten"

    def normalize(self, c, w, where, depth):
        _unknown(w, c, (), self.type)
        return {"type": self.type}

    def out_shape(self, layer, s, path):
        return (s[0], math.prod(s[1:]))

    def forward(self, layer, x, key, run):
        s = x.shape
        return run.apply("reshape", x, (s[0], math.prod(s[1:])), be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.Flatten()
