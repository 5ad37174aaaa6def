"""The convolution layers: ``conv2d`` (torch.nn.Conv2d) and ``conv_transpose2d`` (torch.nn.ConvTranspose2d).

Both take in_channels from their input (N, C, H, W) and have a weight and, unless ``bias`` is off, a
bias, initialised as torch's modules initialise theirs (backend/learn/init.py, seeded per layer).
"""
from __future__ import annotations

import numpy as np

from ...ops import plans
from ...system.errors import AnyDeviceError
from .base import LAYERS, Layer, layer_seed, need_dims
from .settings import _bool, _choice, _err, _int, _pair, _required, _two, _unknown


class _Conv(Layer):
    """What both convolutions share: the weight and bias, their fewest parameters, the size check."""

    size_arg = "out_channels"
    weighted = True

    def param_names(self, layer, key):
        return [key + ".weight"] + ([key + ".bias"] if layer["bias"] else []), []

    def min_params(self, layer):
        kh, kw = _two(layer["kernel_size"])
        return layer["out_channels"] * kh * kw + (layer["out_channels"] if layer["bias"] else 0)

    def has_params(self, layer):
        return True

    def needs_shape(self, layer):
        return True

    @staticmethod
    def _groups_divide(w, out):
        if out["out_channels"] % out["groups"]:
            raise _err(w, "groups", out["groups"], f"must divide out_channels={out['out_channels']}")


@LAYERS.register
class Conv2d(_Conv):
    """``conv2d(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
    padding_mode="zeros")``: padding may also be "same" / "valid"."""

    type = "conv2d"
    size_keys = ("out_channels", "kernel_size", "stride", "padding", "dilation", "groups")

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias",
                        "padding_mode"), self.type)
        _required(w, c, "out_channels", "kernel_size")
        padding = c.get("padding", 0)
        if isinstance(padding, str):
            _choice(w, "padding", padding, ("same", "valid"))
        else:
            padding = _pair(w, "padding", padding, 0)
        out = {"type": self.type, "out_channels": _int(w, "out_channels", c["out_channels"]),
               "kernel_size": _pair(w, "kernel_size", c["kernel_size"]),
               "stride": _pair(w, "stride", c.get("stride", 1)), "padding": padding,
               "dilation": _pair(w, "dilation", c.get("dilation", 1)),
               "groups": _int(w, "groups", c.get("groups", 1)), "bias": _bool(w, "bias", c.get("bias", True)),
               "padding_mode": _choice(w, "padding_mode", c.get("padding_mode", "zeros"), plans.PADDING_MODES)}
        self._groups_divide(w, out)
        if padding == "same" and out["stride"] not in (1, [1, 1]):
            raise _err(w, "padding", padding, "'same' is not supported for strided convolutions")
        return self.fits_alone(w, out)

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (4,), "4-D (N, C, H, W)")
        kh, kw = _two(layer["kernel_size"])
        c = s[1]
        if c % layer["groups"]:
            raise AnyDeviceError("conv2d", "groups", layer["groups"], f"must divide the input's {c} channels")
        plan = plans.conv2d_plan("conv2d", s, (layer["out_channels"], c // layer["groups"], kh, kw), None,
                                 layer["stride"], layer["padding"], layer["dilation"], layer["groups"],
                                 layer["padding_mode"])
        return tuple(plan.out_shape)

    def param_shapes(self, layer, key, x):
        kh, kw = _two(layer["kernel_size"])
        ps = {key + ".weight": (layer["out_channels"], x[1] // layer["groups"], kh, kw)}
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_channels"],)
        return ps, {}

    def init_params(self, layer, key, x, shapes, seed):
        from .. import init as _init
        kh, kw = _two(layer["kernel_size"])
        w, b = _init.conv2d_params(layer["out_channels"], x[1] // layer["groups"], kh, kw, layer["bias"],
                                   layer_seed(seed, key))
        made = {key + ".weight": w}
        if b is not None:
            made[key + ".bias"] = b
        return made

    def forward(self, layer, x, key, run):
        return run.apply("conv2d", x, run.P[key + ".weight"], run.P.get(key + ".bias"), stride=layer["stride"],
                         padding=layer["padding"], dilation=layer["dilation"], groups=layer["groups"],
                         padding_mode=layer["padding_mode"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        pad = layer["padding"]
        return torch.nn.Conv2d(s[1], layer["out_channels"], _two(layer["kernel_size"]), _two(layer["stride"]),
                               pad if isinstance(pad, str) else _two(pad), _two(layer["dilation"]),
                               layer["groups"], layer["bias"], layer["padding_mode"])

    def node_text(self, layer):
        k = layer["kernel_size"]
        k = f"{k}x{k}" if isinstance(k, int) else f"{k[0]}x{k[1]}"
        extra = "" if layer["padding_mode"] == "zeros" else f" {layer['padding_mode']}"
        return f"conv {k} -> {layer['out_channels']}{extra}"

    def widgets(self, choice=None):
        # the Conv Layer node's padding widget: same / valid / explicit (then padding_size)
        return (("out_channels", "kernel_size", "stride", "padding")
                + (("padding_size",) if choice == "explicit" else ())
                + (("padding_mode",) if choice != "valid" else ()) + ("dilation", "groups", "bias"))


@LAYERS.register
class ConvTranspose2d(_Conv):
    """``conv_transpose2d(out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
    bias=True, dilation=1)``: weight (in, out/groups, kH, kW)."""

    type = "conv_transpose2d"
    size_keys = ("out_channels", "kernel_size", "stride", "padding", "output_padding", "dilation", "groups")

    def normalize(self, c, w, where, depth):
        _unknown(w, c, ("out_channels", "kernel_size", "stride", "padding", "output_padding", "groups", "bias",
                        "dilation"), self.type)
        _required(w, c, "out_channels", "kernel_size")
        out = {"type": self.type, "out_channels": _int(w, "out_channels", c["out_channels"]),
               "kernel_size": _pair(w, "kernel_size", c["kernel_size"]),
               "stride": _pair(w, "stride", c.get("stride", 1)), "padding": _pair(w, "padding", c.get("padding", 0), 0),
               "output_padding": _pair(w, "output_padding", c.get("output_padding", 0), 0),
               "groups": _int(w, "groups", c.get("groups", 1)), "bias": _bool(w, "bias", c.get("bias", True)),
               "dilation": _pair(w, "dilation", c.get("dilation", 1))}
        self._groups_divide(w, out)
        return self.fits_alone(w, out)

    def out_shape(self, layer, s, path):
        need_dims(layer, s, (4,), "4-D (N, C, H, W)")
        kh, kw = _two(layer["kernel_size"])
        g = layer["groups"]
        plan = plans.conv_transpose2d_plan("conv_transpose2d", s, (s[1], layer["out_channels"] // g, kh, kw), None,
                                           layer["stride"], layer["padding"], layer["output_padding"], g,
                                           layer["dilation"])
        return tuple(plan.out_shape)

    def param_shapes(self, layer, key, x):
        kh, kw = _two(layer["kernel_size"])
        ps = {key + ".weight": (x[1], layer["out_channels"] // layer["groups"], kh, kw)}
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_channels"],)
        return ps, {}

    def init_params(self, layer, key, x, shapes, seed):
        # torch's ConvTranspose2d: fan_in is weight.size(1) * kH * kW = out/groups * kH * kW
        from .. import init as _init
        kh, kw = _two(layer["kernel_size"])
        cog = layer["out_channels"] // layer["groups"]
        w, _ = _init.conv2d_params(x[1], cog, kh, kw, False, layer_seed(seed, key))
        made = {key + ".weight": w}
        if layer["bias"]:
            bb = _init.bias_bound(cog * kh * kw)
            made[key + ".bias"] = _init.uniform(np.random.default_rng(layer_seed(seed, key + ".bias")),
                                                (layer["out_channels"],), -bb, bb)
        return made

    def forward(self, layer, x, key, run):
        return run.apply("conv_transpose2d", x, run.P[key + ".weight"], run.P.get(key + ".bias"),
                         stride=layer["stride"], padding=layer["padding"], output_padding=layer["output_padding"],
                         groups=layer["groups"], dilation=layer["dilation"], be=run.be)

    def to_torch(self, layer, s, seq):
        import torch
        return torch.nn.ConvTranspose2d(s[1], layer["out_channels"], _two(layer["kernel_size"]),
                                        _two(layer["stride"]), _two(layer["padding"]),
                                        _two(layer["output_padding"]), layer["groups"], layer["bias"],
                                        _two(layer["dilation"]))

