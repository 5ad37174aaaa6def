"""The Normalize node: instance, group, layer, RMS or batch normalisation of an IMAGE, MASK, LATENT or
TENSOR. A thin adapter over ``backend`` (layers.py), like the window nodes: the value goes to the
backend in (N, C, H, W), one op (plus an optional per-tensor scale and shift), and comes back as
the kind it came in as. The node has no learned weights."""
from __future__ import annotations

import math

from ..base.common import NodeError, Progress, Timer, badge, kind_of, resolve_backend
from ..base.widgets import Choice, Float, Int
from .ops import ComputeNode
from ..base.values import data, nchw_shape, out_shape, result, shape_of

_DATA_TIP = ("An IMAGE, MASK, LATENT or TENSOR, normalised channels-first as (N, C, H, W): an IMAGE's "
             "colour channels count as channels, like a LATENT's.")


# =================================================================================================
class AnyDeviceNormalize(ComputeNode):
    DISPLAY = "Normalize (AnyDevice)"
    DESCRIPTION = ("Normalise an IMAGE, MASK, LATENT or TENSOR to zero mean and unit variance (PyTorch semantics, "
                   "channels-first): instance over H,W per sample and channel; group over each group of "
                   "channels' C/G,H,W per sample; layer over C,H,W per sample; rms divides by the root mean "
                   "square over C,H,W per sample (no centring); batch over N,H,W per channel (the batch's own "
                   "statistics). Then output = normalised * scale + shift. A normalised IMAGE leaves 0..1 "
                   "(negative values): follow with a clamp or a Tensor Ops normalize to view it.")
    OUTPUT_TOOLTIPS = ("The normalised input, of the same type (an IMAGE's values leave 0..1).",)
    METHODS = ["instance", "group", "layer", "rms", "batch"]
    input_tip = _DATA_TIP

    @classmethod
    def widgets(cls):
        return {
            "method": Choice(cls.METHODS, "instance",
                             "instance: over H,W per sample and channel (instance_norm); group: over the channels "
                             "of each of num_groups groups and H,W per sample (group_norm); layer: over C,H,W per "
                             "sample (layer_norm); rms: x / sqrt(mean(x^2) + eps) over C,H,W per sample "
                             "(rms_norm); batch: over N,H,W per channel with the batch's statistics (batch_norm "
                             "in training mode, no running statistics)."),
            "num_groups": Int(1, 1, 4096,
                              "group only: number of channel groups; must divide the channel count (IMAGE 3, MASK "
                              "1, SD latents 4). 1 is layer norm, the channel count is instance norm."),
            "eps": Float(1e-5, 0.0, 1.0, 1e-6,
                         "Added to the variance (rms: to the mean square) before the square root, so a flat "
                         "region gives 0 rather than NaN.", round=False),
            "scale": Float(1.0, -1e6, 1e6, 0.01,
                           "Multiplies the normalised values (one number for the whole tensor; the node has no "
                           "learned weights)."),
            "shift": Float(0.0, -1e6, 1e6, 0.01,
                           "Added after scale (e.g. scale 0.25, shift 0.5 brings a normalised image back around "
                           "mid-grey)."),
        }

    ARGS = {"input": "input", "num_groups": "num_groups", "eps": "eps", "normalized_shape": "input"}

    def _run(self, input, method="instance", num_groups=1, eps=1e-5, scale=1.0, shift=0.0, device=None):
        node = self.DISPLAY
        if method not in self.METHODS:
            raise NodeError(node, "method", method, f"must be one of {', '.join(self.METHODS)}")
        be = resolve_backend(device, node)
        kind = kind_of(input, node, "input")
        src = shape_of(input, kind)
        shape = nchw_shape(src, kind, node, "input")
        if shape[0] == 0:
            raise NodeError(node, "input", f"{kind} of shape {src}", "is an empty batch: there is nothing to normalise")
        if math.prod(shape) == 0:
            raise NodeError(node, "input", f"{kind} of shape {src}", "is empty: there is nothing to normalise")
        c = shape[1]
        if method == "group" and c % int(num_groups):
            raise NodeError(node, "num_groups", num_groups,
                            f"must divide the input's {c} channels ({kind} of shape {src}, as (N, C, H, W) {shape})")
        if method == "batch" and shape[0] * shape[2] * shape[3] == 1:
            raise NodeError(node, "input", f"{kind} of shape {src}",
                            "method batch needs more than 1 value per channel (N x H x W is 1); use layer or rms")
        x = data(input, kind, be, "nchw", node)
        eps = float(eps)
        t = Timer()
        if method == "instance":
            y = be.group_norm(x, c, eps=eps)
        elif method == "group":
            y = be.group_norm(x, int(num_groups), eps=eps)
        elif method == "layer":
            y = be.layer_norm(x, shape[1:], eps=eps)
        elif method == "rms":
            y = be.rms_norm(x, shape[1:], eps=eps)
        else:
            y = be.batch_norm(x, None, None, training=True, eps=eps)
        if float(scale) != 1.0:
            y = be.mul(y, float(scale))
        if float(shift) != 0.0:
            y = be.add(y, float(shift))
        out = result(be, y, kind, input, "nchw", node)
        ms = t.ms(be)
        Progress(1).step()
        return {"ui": badge(be, ms, op=method + "_norm", shape=out_shape(out)), "result": (out,)}


NORM_NODES = [AnyDeviceNormalize]
