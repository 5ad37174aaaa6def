"""The activation layer: ``activation(name, **params)``, one of torch's elementwise activations (or softmax).

relu, leaky_relu(negative_slope), elu(alpha), gelu(approximate), silu, sigmoid, tanh,
softplus(beta, threshold), softmax(dim=1). Its parameters are the function's, not trained weights.
"""
from __future__ import annotations

from ...ops import plans
from .base import LAYERS, Layer
from .settings import MAX_INT, _choice, _err, _float, _is_int, _unknown

#: each activation's settings and their defaults (torch's)
ACTIVATION_PARAMS = {"relu": {}, "sigmoid": {}, "tanh": {}, "silu": {},
                     "leaky_relu": {"negative_slope": 0.01}, "elu": {"alpha": 1.0},
                     "gelu": {"approximate": "none"}, "softplus": {"beta": 1.0, "threshold": 20.0},
                     "softmax": {"dim": 1}}
#: the torch.nn module of each
_TORCH_NAMES = {"relu": "ReLU", "leaky_relu": "LeakyReLU", "elu": "ELU", "gelu": "GELU", "silu": "SiLU",
                "sigmoid": "Sigmoid", "tanh": "Tanh", "softplus": "Softplus", "softmax": "Softmax"}


@LAYERS.register
class Activation(Layer):
    """``activation(name, **params)``: the function ``name`` with its settings (ACTIVATION_PARAMS)."""

    type = "activation"

    def normalize(self, c, w, where, depth):
        name = c.pop("name", None)
        _choice(w, "name", name, tuple(ACTIVATION_PARAMS))
        allowed = ACTIVATION_PARAMS[name]
        _unknown(w, c, tuple(allowed), name)
        p = dict(allowed)
        p.update(c)
        for k, v in p.items():
            if k == "approximate":
                _choice(w, k, v, ("none", "tanh"))
            elif k == "dim":
                if not _is_int(v) or abs(v) > MAX_INT:
                    raise _err(w, k, v, f"must be an int (a dim, -{MAX_INT} to {MAX_INT})")
                p[k] = int(v)
            elif k in ("beta",):
                p[k] = _float(w, k, v, 0.0, lo_open=True)
            else:
                p[k] = _float(w, k, v)
        return {"type": self.type, "name": name, **p}

    @staticmethod
    def _params(layer) -> dict:
        return {k: v for k, v in layer.items() if k not in ("type", "name")}

    def out_shape(self, layer, s, path):
        if layer["name"] == "softmax":
            plans.normalize_dims("softmax", layer["dim"], len(s))
        return tuple(s)

    def forward(self, layer, x, key, run):
        return run.apply(layer["name"], x, be=run.be, **self._params(layer))

    def to_torch(self, layer, s, seq):
        import torch
        return getattr(torch.nn, _TORCH_NAMES[layer["name"]])(**self._params(layer))

    def describe(self, layer):
        cfg = ", ".join(f"{k}={v}" for k, v in layer.items() if k not in ("type", "name"))
        return f"{layer['name']}({cfg})"

    def short(self, layer):
        return layer["name"]

    def node_text(self, layer):
        return layer["name"]

    def widgets(self, choice=None):
        # the Activation Layer node's widgets are named as the settings (activation picks the name)
        return ("activation",) + tuple(ACTIVATION_PARAMS.get(choice, ()))
