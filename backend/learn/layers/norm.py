"""The normalisation layers: ``batch_norm``, ``group_norm``, ``layer_norm`` and ``instance_norm``.

Each has a trained scale and shift (weight 1 and bias 0 to start) unless ``affine`` (layer_norm:
``elementwise_affine``) is off; batch_norm also keeps running statistics as buffers (mean 0 and
variance 1 to start), updated in training and used in evaluation.
"""
from __future__ import annotations

import numpy as np

from ...ops import plans
from .base import LAYERS, Layer, need_dims
from .settings import _bool, _float, _int, _required, _unknown


class _Norm(Layer):
    """What the norms share: eps, the affine switch, weight and bias per channel, the init."""

    weighted = True
    #: the name of its affine switch
    affine = "affine"
    #: its settings besides eps and the affine switch
    extra: tuple = ()
    #: the affine switch's default
    affine_default = True

    def normalize(self, c, w, where, depth):
        aff = self.affine
        _unknown(w, c, ("eps", aff) + self.extra, self.type)
        out = {"type": self.type}
        self._before_eps(c, w, out)
        out["eps"] = _float(w, "eps", c.get("eps", 1e-5), 0.0)
        self._after_eps(c, w, out)
        out[aff] = _bool(w, aff, c.get(aff, self.affine_default))
        return out

    def _before_eps(self, c, w, out):
        pass

    def _after_eps(self, c, w, out):
        pass

    def param_shapes(self, layer, key, x):
        ps = {}
        if layer[self.affine]:
            ps[key + ".weight"] = (x[1],)
            ps[key + ".bias"] = (x[1],)
        return ps, {}

    def param_names(self, layer, key):
        return ([key + ".weight", key + ".bias"] if layer[self.affine] else []), []

    def has_params(self, layer):
        return bool(layer[self.affine])

    def needs_shape(self, layer):
        return True

    def init_params(self, layer, key, x, shapes, seed):
        return {k: (np.ones if k.endswith(".weight") else np.zeros)(shapes[k], np.float32) for k in shapes}

    def widgets(self, choice=None):
        # the Norm Layer node: kind picks the type; affine sets affine / elementwise_affine
        return ("kind",) + self.extra + ("eps", "affine")


@LAYERS.register
class BatchNorm(_Norm):
    """``batch_norm(eps=1e-5, momentum=0.1, affine=True)``: BatchNorm2d on 4-D, BatchNorm1d on 2-D input."""

    type = "batch_norm"
    extra = ("momentum",)

    def _after_eps(self, c, w, out):
        out["momentum"] = _float(w, "momentum", c.get("momentum", 0.1), 0.0, 1.0)

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (2, 3, 4), "2-D, 3-D or 4-D (N, C, ...)")
        return tuple(s)

    def param_shapes(self, layer, key, x):
        ps, _ = super().param_shapes(layer, key, x)
        return ps, {key + ".running_mean": (x[1],), key + ".running_var": (x[1],)}

    def param_names(self, layer, key):
        ps, _ = super().param_names(layer, key)
        return ps, [key + ".running_mean", key + ".running_var"]

    def has_params(self, layer):
        return True

    def init_buffer(self, name, shape):
        return (np.ones if name.endswith("running_var") else np.zeros)(shape, np.float32)

    def forward(self, layer, x, key, run):
        rm, rv = run.B[key + ".running_mean"], run.B[key + ".running_var"]
        w, b = run.P.get(key + ".weight"), run.P.get(key + ".bias")
        if run.training:
            y, nm, nv = run.apply("batch_norm", x, rm, rv, w, b, training=True, momentum=layer["momentum"],
                                  eps=layer["eps"], return_stats=True, be=run.be)
            run.new_b[key + ".running_mean"] = nm.data
            run.new_b[key + ".running_var"] = nv.data
            return y
        return run.apply("batch_norm", x, rm, rv, w, b, training=False, eps=layer["eps"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        cls = torch.nn.BatchNorm2d if len(s) == 4 else torch.nn.BatchNorm1d
        return cls(s[1], eps=layer["eps"], momentum=layer["momentum"], affine=layer["affine"])


@LAYERS.register
class GroupNorm(_Norm):
    """``group_norm(num_groups, eps=1e-5, affine=True)``."""

    type = "group_norm"
    extra = ("num_groups",)

    def _before_eps(self, c, w, out):
        _required(w, c, "num_groups")
        out["num_groups"] = _int(w, "num_groups", c["num_groups"])

    def out_shape(self, layer, s, path):
        plans.group_norm_shape("group_norm", s, layer["num_groups"])
        return tuple(s)

    def forward(self, layer, x, key, run):
        return run.apply("group_norm", x, layer["num_groups"], run.P.get(key + ".weight"), run.P.get(key + ".bias"),
                         eps=layer["eps"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.GroupNorm(layer["num_groups"], s[1], eps=layer["eps"], affine=layer["affine"])


@LAYERS.register
class LayerNorm(_Norm):
    """``layer_norm(eps=1e-5, elementwise_affine=True)``: over every dim but the batch, as
    ``nn.LayerNorm(x.shape[1:])``."""

    type = "layer_norm"
    affine = "elementwise_affine"

    def param_shapes(self, layer, key, x):
        ps = {}
        if layer["elementwise_affine"]:
            ps[key + ".weight"] = tuple(x[1:])
            ps[key + ".bias"] = tuple(x[1:])
        return ps, {}

    def forward(self, layer, x, key, run):
        return run.apply("layer_norm", x, tuple(x.shape[1:]), run.P.get(key + ".weight"), run.P.get(key + ".bias"),
                         eps=layer["eps"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.LayerNorm(tuple(s[1:]), eps=layer["eps"], elementwise_affine=layer["elementwise_affine"])


@LAYERS.register
class InstanceNorm(_Norm):
    """``instance_norm(eps=1e-5, affine=False)``: InstanceNorm2d (no running statistics)."""

    type = "instance_norm"
    affine_default = False

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (4,), "4-D (N, C, H, W)")
        return tuple(s)

    def forward(self, layer, x, key, run):
        return run.apply("group_norm", x, x.shape[1], run.P.get(key + ".weight"), run.P.get(key + ".bias"),
                         eps=layer["eps"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.InstanceNorm2d(s[1], eps=layer["eps"], affine=layer["affine"])
