"""The residual block: ``residual(body)``, y = x + body(x), body a non-empty list of layers.

Its body's parameters are named ``key.body.i.*`` (torch's names for a module with a ``body``
Sequential); blocks nest at most MAX_DEPTH deep.
"""
from __future__ import annotations

from ...system.errors import AnyDeviceError
from .base import LAYERS, Layer, layer_from_dict, layer_shape, where_of
from .settings import MAX_DEPTH, MAX_LAYERS, OP, _err, _unknown

_TORCH_CLASSES: dict = {}


def residual_class():
    """The torch module of a residual block (made once, on first use: torch is imported then)."""
    cls = _TORCH_CLASSES.get("Residual")
    if cls is None:
        import torch

        class Residual(torch.nn.Module):
            """y = x + body(x)"""

            def __init__(self, body):
                super().__init__()
                self.body = body

            def forward(self, x):
                return x + self.body(x)

        cls = _TORCH_CLASSES["Residual"] = Residual
    return cls


def _layers_of(body):
    """A body given as a Network (anything with a ``layers`` tuple) as its list of layers."""
    layers = getattr(body, "layers", None)
    if not isinstance(body, (list, tuple, dict)) and isinstance(layers, tuple):
        return list(layers)
    return body


@LAYERS.register
class Residual(Layer):
    """``residual(body)``: y = x + body(x); the body's output must have its input's shape."""

    type = "residual"
    size_keys = ()

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("body",), self.type)
        if depth >= MAX_DEPTH:
            raise _err(w, "depth", depth + 1, f"residual blocks may nest at most {MAX_DEPTH} deep")
        body = _layers_of(c.get("body"))
        if not isinstance(body, (list, tuple)) or not body:
            raise _err(w, "body", body, "must be a non-empty list of layers")
        if len(body) > MAX_LAYERS:
            raise _err(w, "body", f"<{len(body)} layers>", f"a network has at most {MAX_LAYERS} layers")
        path = where[len("layer "):] if where.startswith("layer ") else where
        return {"type": self.type, "body": [layer_from_dict(b, f"layer {path}.body.{i}", depth + 1)
                                            for i, b in enumerate(body)]}

    def body(self, layer):
        return layer["body"]

    def out_shape(self, layer, s, path):
        out = tuple(s)
        for j, b in enumerate(layer["body"]):
            out = layer_shape(b, out, f"{path}.body.{j}")
        if out != tuple(s):
            raise AnyDeviceError(OP, where_of(path, layer), tuple(s),
                                 f"its body's output {out} must have the input's shape {tuple(s)} (y = x + body(x))")
        return tuple(s)

    def min_params(self, layer):
        return sum(LAYERS.of(b).min_params(b) for b in layer["body"])

    def forward(self, layer, x, key, run):
        body = run.run(layer["body"], x, key + ".body.")
        return run.apply("add", x, body, be=run.be)

    def to_torch(self, layer, s, seq):
        return residual_class()(seq(layer["body"], s))

    def short(self, layer):
        return "residual(" + ", ".join(LAYERS.of(b).short(b) for b in layer["body"]) + ")"

    def node_text(self, layer):
        return f"residual ({len(layer['body'])} layers)"
