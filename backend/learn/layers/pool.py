"""The pooling layer: ``pool(kind, kernel_size=None, stride=None, padding=0, output_size=None)`` on (N, C, H, W).

kind max / avg take a window (kernel_size, stride: the kernel size when not given, padding at most
half the kernel); adaptive_avg / adaptive_max take the output_size instead.
"""
from __future__ import annotations

from ...ops import plans
from .base import LAYERS, Layer, need_dims
from .settings import _choice, _err, _is_int, _pair, _two, _unknown

POOL_KINDS = ("max", "avg", "adaptive_avg", "adaptive_max")
#: the settings of a window pool; an adaptive pool takes output_size instead
_WINDOW = ("kernel_size", "stride", "padding")


@LAYERS.register
class Pool(Layer):
    """``pool(kind, ...)``: max / avg pooling over a window, or adaptive pooling to a size."""

    type = "pool"
    size_keys = ("kind", "kernel_size", "stride", "padding", "output_size")

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("kind",) + _WINDOW + ("output_size",), self.type)
        kind = _choice(w, "kind", c.get("kind", "max"), POOL_KINDS)
        if kind.startswith("adaptive"):
            for arg in _WINDOW:
                if c.get(arg) is not None and not (arg == "padding" and _is_int(c[arg]) and c[arg] == 0):
                    raise _err(w, arg, c[arg], f"is not used by {kind} pooling (it takes output_size)")
            if "output_size" not in c:
                raise _err(w, "output_size", None, f"is required for {kind} pooling")
            return {"type": self.type, "kind": kind, "output_size": _pair(w, "output_size", c["output_size"])}
        if c.get("output_size") is not None:
            raise _err(w, "output_size", c["output_size"], f"is only for adaptive pooling ({kind} takes kernel_size)")
        if c.get("kernel_size") is None:
            raise _err(w, "kernel_size", None, f"is required for {kind} pooling")
        k = _pair(w, "kernel_size", c["kernel_size"])
        s = c.get("stride")
        s = k if s is None else _pair(w, "stride", s)
        p = _pair(w, "padding", c.get("padding", 0), 0)
        kk, pp = (k, k) if _is_int(k) else k, (p, p) if _is_int(p) else p
        if pp[0] > kk[0] // 2 or pp[1] > kk[1] // 2:
            raise _err(w, "padding", p, f"must be at most half of kernel_size {k}")
        return {"type": self.type, "kind": kind, "kernel_size": k, "stride": s, "padding": p}

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (4,), "4-D (N, C, H, W)")
        if layer["kind"].startswith("adaptive"):
            return tuple(plans.adaptive_plan(layer["kind"] + "_pool2d", s, layer["output_size"]))
        op = f"{layer['kind']}_pool2d"
        return tuple(plans.pool2d_plan(op, s, layer["kernel_size"], layer["stride"], layer["padding"]).out_shape)

    def forward(self, layer, x, key, run):
        kind = layer["kind"]
        if kind.startswith("adaptive"):
            return run.apply(f"{kind}_pool2d", x, layer["output_size"], be=run.be)
        return run.apply(f"{kind}_pool2d", x, layer["kernel_size"], layer["stride"], layer["padding"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        nn = torch.nn
        kind = layer["kind"]
        if kind.startswith("adaptive"):
            cls = nn.AdaptiveAvgPool2d if kind == "adaptive_avg" else nn.AdaptiveMaxPool2d
            return cls(_two(layer["output_size"]))
        cls = nn.MaxPool2d if kind == "max" else nn.AvgPool2d
        return cls(_two(layer["kernel_size"]), _two(layer["stride"]), _two(layer["padding"]))

    def short(self, layer):
        return f"{layer['kind']}_pool"

    def node_text(self, layer):
        return f"{layer['kind']} pool"

    def widgets(self, choice=None):
        # the Pool Layer node's kind widget: a window (max / avg) or an output size (adaptive)
        return ("kind", "output_size") if str(choice).startswith("adaptive") else ("kind",) + _WINDOW
