"""The layer nodes: Network Input, one node per layer kind and Residual, each appending to the network
it is given and saying its output shape."""
from __future__ import annotations

import dataclasses

from ...backend import AnyDeviceError
from ...backend.learn import network as _netmod
from ...backend.learn.layers import LAYERS
from ...backend.learn.network import Network
from ..base.common import DATA, NodeError, Timer, parsed
from ..base.widgets import Bool, Choice, Float, Int, Text
from .common import (NETWORK, _NET_TIP, _NetworkNode, _host_ui, _network, _network_out, _sample_shape,
                           _shape_text, to_batch)


class AnyDeviceNetworkInput(_NetworkNode):
    DISPLAY = "Network Input (AnyDevice)"
    DESCRIPTION = ("Starts a network and fixes its input shape, so the layer nodes after it can say their output "
                   "shapes and refuse a layer that does not fit. The shape comes from an example input (IMAGE, "
                   "MASK, LATENT or TENSOR: one sample of it) or from the shape text.")
    OUTPUT_TOOLTIPS = ("An empty network with its input shape; connect the first layer node.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"shape": Text("3, 32, 32",
                                           "One sample's shape: C, H, W for images (or F for features). Ignored when "
                                           "an example is connected.")},
                "optional": {"example": (DATA, {"tooltip": "An input like the ones the network will get; its "
                                                           "shape (one sample) is used."})}}

    @classmethod
    def VALIDATE_INPUTS(cls, shape=None):
        if shape is not None:
            try:
                _sample_shape(shape)
            except ValueError as exc:
                return cls.fail("shape", shape, str(exc))
        return True

    def _run(self, shape="3, 32, 32", example=None):
        node = self.DISPLAY
        t = Timer()
        if example is not None:
            x, _ = to_batch(example, node, "example")
            s = (1,) + tuple(x.shape[1:])
        else:
            s = (1,) + parsed(node, "shape", shape, _sample_shape)
        net = dataclasses.replace(Network.empty(), in_shape=s)
        return {"ui": _host_ui(t.ms(), [f"input {_shape_text(s)}"], shape=list(s)), "result": (net,)}


class _LayerNode(_NetworkNode):
    """A node that appends one layer: ``_layer(**widgets)`` gives (type, config).

    Where a widget (``CHOICE``: an activation's name, a pool's kind, a conv's padding) picks what
    the layer is, the page shows only the widgets that apply to its value: the layer class says
    which (``Layer.widgets``), and ``widget_uses`` serves them as the choice widget's
    ``anydevice_uses`` option, which web/anydevice.js hides the others by."""

    OUTPUT_TOOLTIPS = ("The network with this layer appended.",)
    WIDGETS: dict = {}
    #: the layer type it appends; None where the CHOICE widget's value is the type (Norm Layer)
    LAYER: str | None = None
    #: the widget whose value decides which of the others apply, or None: they all do
    CHOICE: str | None = None

    @classmethod
    def widget_uses(cls) -> dict:
        """{each value of the CHOICE widget: the widgets that apply to it}, naming only the widgets
        that do not apply to every value (the others are always shown); {} without a CHOICE."""
        if cls.CHOICE is None:
            return {}
        used = {c: [w for w in cls.WIDGETS if w in LAYERS[cls.LAYER or c].widgets(c)]
                for c in cls.WIDGETS[cls.CHOICE][0]}
        always = set.intersection(*(set(u) for u in used.values()))
        return {c: [w for w in u if w not in always] for c, u in used.items()}

    @classmethod
    def INPUT_TYPES(cls):
        required = dict(cls.WIDGETS)
        uses = cls.widget_uses()
        if uses:
            typ, opts = required[cls.CHOICE]
            required[cls.CHOICE] = (typ, {**opts, "anydevice_uses": uses})
        return {"required": required, "optional": {"network": (NETWORK, {"tooltip": _NET_TIP})}}

    def _layer(self, **w) -> tuple[str, dict]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _append(self, net: Network, **w) -> Network:
        typ, cfg = self._layer(**w)
        try:
            return net.add(typ, **cfg)
        except AnyDeviceError as exc:  # a setting the layer refuses: name the widget
            arg = exc.arg if exc.arg in self.WIDGETS else None
            raise NodeError(self.DISPLAY, arg or "settings", exc.value, exc.reason or str(exc)) from exc

    def _run(self, network=None, **w):
        node = self.DISPLAY
        t = Timer()
        return _network_out(self._append(_network(network, node), **w), node, t)


class AnyDeviceConvLayer(_LayerNode):
    DISPLAY = "Conv Layer (AnyDevice)"
    DESCRIPTION = ("A 2-D convolution layer (torch.nn.Conv2d): in_channels from its input, trained weights and bias. "
                   "A 1x1 conv is a per-pixel linear map of the channels (a colour matrix).")
    LAYER = "conv2d"
    CHOICE = "padding"
    WIDGETS = {
        "out_channels": Int(16, 1, 4096, "Output channels."),
        "kernel_size": Int(3, 1, 31, "Kernel height and width."),
        "stride": Int(1, 1, 16, "Step between kernel positions."),
        "padding": Choice(["same", "valid", "explicit"], "same",
                          "same: output size = input size (stride 1); valid: none; explicit: padding_size on every "
                          "side."),
        "padding_size": Int(1, 0, 64, "Pixels of padding on each side when padding is explicit."),
        "padding_mode": Choice(["zeros", "reflect", "replicate", "circular"], "zeros",
                               "How the border is filled (reflect suits image filters)."),
        "dilation": Int(1, 1, 16, "Spacing between kernel taps."),
        "groups": Int(1, 1, 4096, "Groups; must divide the input and output channels (= channels: depthwise)."),
        "bias": Bool(True, "A trained bias per output channel."),
    }

    def _layer(self, out_channels, kernel_size, stride, padding, padding_size, padding_mode, dilation, groups, bias):
        pad = int(padding_size) if padding == "explicit" else padding
        return "conv2d", dict(out_channels=int(out_channels), kernel_size=int(kernel_size), stride=int(stride),
                              padding=pad, dilation=int(dilation), groups=int(groups), bias=bool(bias),
                              padding_mode=padding_mode)


class AnyDeviceLinearLayer(_LayerNode):
    DISPLAY = "Linear Layer (AnyDevice)"
    DESCRIPTION = "A fully connected layer (torch.nn.Linear) on (N, F) features; put a Flatten Layer before it on images."
    LAYER = "linear"
    WIDGETS = {"out_features": Int(10, 1, 65536, "Output features."),
               "bias": Bool(True, "A trained bias per output feature.")}

    def _layer(self, out_features, bias):
        return "linear", dict(out_features=int(out_features), bias=bool(bias))


class AnyDeviceActivationLayer(_LayerNode):
    DISPLAY = "Activation Layer (AnyDevice)"
    DESCRIPTION = "An activation layer: relu, leaky_relu, elu, gelu, silu, sigmoid, tanh, softplus or softmax."
    LAYER = "activation"
    CHOICE = "activation"
    WIDGETS = {
        "activation": Choice(list(_netmod.ACTIVATION_PARAMS), "relu", "The function."),
        "negative_slope": Float(0.01, -100.0, 100.0, 0.001, "leaky_relu: slope for negative inputs."),
        "alpha": Float(1.0, -100.0, 100.0, 0.01, "elu: the value the negative side approaches."),
        "approximate": Choice(["none", "tanh"], "none", "gelu: exact or the tanh approximation."),
        "dim": Int(1, -4, 3, "softmax: the dim (1: the channels / classes)."),
    }

    def _layer(self, activation, negative_slope, alpha, approximate, dim):
        p = {"leaky_relu": {"negative_slope": float(negative_slope)}, "elu": {"alpha": float(alpha)},
             "gelu": {"approximate": approximate}, "softmax": {"dim": int(dim)}}.get(activation, {})
        return "activation", dict(name=activation, **p)


class AnyDeviceNormLayer(_LayerNode):
    DISPLAY = "Norm Layer (AnyDevice)"
    DESCRIPTION = ("A normalisation layer: batch_norm (running statistics, trained), group_norm, layer_norm or "
                   "instance_norm, with a trained scale and shift.")
    CHOICE = "kind"
    WIDGETS = {
        "kind": Choice(["batch_norm", "group_norm", "layer_norm", "instance_norm"], "batch_norm",
                       "Which normalisation."),
        "num_groups": Int(4, 1, 4096, "group_norm: groups; must divide the channels."),
        "eps": Float(1e-5, 0.0, 1.0, 1e-6, "Added to the variance.", round=False),
        "momentum": Float(0.1, 0.0, 1.0, 0.01, "batch_norm: running statistics update rate."),
        "affine": Bool(True, "A trained scale and shift per channel."),
    }

    def _layer(self, kind, num_groups, eps, momentum, affine):
        cfg = {"eps": float(eps)}
        cfg["elementwise_affine" if kind == "layer_norm" else "affine"] = bool(affine)
        if kind == "group_norm":
            cfg["num_groups"] = int(num_groups)
        if kind == "batch_norm":
            cfg["momentum"] = float(momentum)
        return kind, cfg


class AnyDevicePoolLayer(_LayerNode):
    DISPLAY = "Pool Layer (AnyDevice)"
    DESCRIPTION = "Max or average pooling, or adaptive pooling to a fixed output size."
    LAYER = "pool"
    CHOICE = "kind"
    WIDGETS = {
        "kind": Choice(list(_netmod.POOL_KINDS), "max", "max / avg: a window; adaptive: an output size."),
        "kernel_size": Int(2, 1, 64, "max / avg: the window."),
        "stride": Int(0, 0, 64, "max / avg: the step (0: the kernel size)."),
        "padding": Int(0, 0, 32, "max / avg: padding on each side (at most half the kernel)."),
        "output_size": Int(1, 1, 1024, "adaptive: output height and width."),
    }

    def _layer(self, kind, kernel_size, stride, padding, output_size):
        if kind.startswith("adaptive"):
            return "pool", dict(kind=kind, output_size=int(output_size))
        return "pool", dict(kind=kind, kernel_size=int(kernel_size), stride=int(stride) or None, padding=int(padding))


class AnyDeviceUpsampleLayer(_LayerNode):
    DISPLAY = "Upsample Layer (AnyDevice)"
    DESCRIPTION = "Resizes (N, C, H, W) by a scale factor (torch.nn.Upsample)."
    LAYER = "upsample"
    WIDGETS = {"scale_factor": Float(2.0, 0.05, 16.0, 0.05, "Output size = input size x this."),
               "mode": Choice(list(_netmod.UPSAMPLE_MODES), "nearest", "Interpolation.")}

    def _layer(self, scale_factor, mode):
        return "upsample", dict(scale_factor=float(scale_factor), mode=mode)


class AnyDeviceDropoutLayer(_LayerNode):
    DISPLAY = "Dropout Layer (AnyDevice)"
    DESCRIPTION = "Drops a fraction p of the values in training (seeded masks); passes everything when applied."
    LAYER = "dropout"
    WIDGETS = {"p": Float(0.5, 0.0, 1.0, 0.01, "Drop probability.")}

    def _layer(self, p):
        return "dropout", dict(p=float(p))


class AnyDeviceFlattenLayer(_LayerNode):
    DISPLAY = "Flatten Layer (AnyDevice)"
    DESCRIPTION = "(N, C, H, W) -> (N, C*H*W), before Linear Layers."
    LAYER = "flatten"
    WIDGETS = {}

    def _layer(self):
        return "flatten", {}


class AnyDeviceResidual(_NetworkNode):
    DISPLAY = "Residual (AnyDevice)"
    DESCRIPTION = ("Appends a residual block y = x + body(x) to the trunk network. Build the body as its own chain "
                   "of layer nodes (without a Network Input); its output must have its input's shape.")
    OUTPUT_TOOLTIPS = ("The trunk with the residual block appended.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"body": (NETWORK, {"tooltip": "The block's layers (a chain of layer nodes)."})},
                "optional": {"network": (NETWORK, {"tooltip": _NET_TIP})}}

    def _run(self, body, network=None):
        node = self.DISPLAY
        t = Timer()
        b = _network(body, node, "body", required=True)
        if not b.layers:
            raise NodeError(node, "body", "an empty network", "needs at least one layer")
        try:
            net = _network(network, node).residual(dataclasses.replace(b, in_shape=None))
        except AnyDeviceError as exc:
            raise NodeError(node, "body", exc.value, exc.reason or str(exc)) from exc
        return _network_out(net, node, t, "body")
