"""The window nodes: Resize (interpolate) and Pool (max / avg / adaptive pooling). Thin adapters
over ``backend`` (windows.py): the value goes to the backend in (N, C, H, W), one op, and comes
back as the kind it came in as."""
from __future__ import annotations

from ..base.common import NodeError, Progress, Timer, badge, kind_of, resolve_backend
from ..base.widgets import Bool, Choice, Float, Int
from .ops import ComputeNode
from ..base.values import data, nchw_shape, out_shape, result, shape_of

_DATA_TIP = "An IMAGE, MASK, LATENT or TENSOR (resized over its last two dims, or an IMAGE's height and width)."


def _nchw(node, input, device):
    be = resolve_backend(device, node)
    kind = kind_of(input, node, "input")
    n = nchw_shape(shape_of(input, kind), kind, node, "input")[0]
    if n == 0:
        raise NodeError(node, "input", f"shape {shape_of(input, kind)}", "is an empty batch: there is nothing to resize")
    return be, kind, data(input, kind, be, "nchw", node)


# =================================================================================================
class AnyDeviceResize(ComputeNode):
    DISPLAY = "Resize (AnyDevice)"
    DESCRIPTION = ("Resize an IMAGE, MASK, LATENT or TENSOR with PyTorch's interpolate: nearest, nearest-exact, "
                   "bilinear, bicubic or area, to a target width and height or by a scale factor. Values follow "
                   "PyTorch exactly (bicubic may overshoot the input's range, as in PyTorch).")
    OUTPUT_TOOLTIPS = ("The resized input, of the same type.",)
    MODES = ["bilinear", "bicubic", "nearest", "nearest-exact", "area"]
    input_tip = _DATA_TIP

    @classmethod
    def widgets(cls):
        return {
            "mode": Choice(cls.MODES, "bilinear",
                           "Interpolation: bilinear, bicubic (A = -0.75), nearest (floor of the scaled position), "
                           "nearest-exact (rounded, like PIL), area (the mean of each output pixel's footprint, "
                           "for shrinking)."),
            "target": Choice(["scale_factor", "size"], "scale_factor",
                             "scale_factor: output = floor(input size x scale_factor); size: width and height."),
            "scale_factor": Float(2.0, 0.01, 64.0, 0.01,
                                  "Factor on both height and width when target is scale_factor."),
            "width": Int(512, 1, 16384, "Output width in pixels when target is size."),
            "height": Int(512, 1, 16384, "Output height in pixels when target is size."),
            "align_corners": Bool(False,
                                  "bilinear and bicubic: align the corner pixels' centres (PyTorch's "
                                  "align_corners); ignored by the other modes."),
        }

    ARGS = {"input": "input", "mode": "mode", "size": "width", "scale_factor": "scale_factor",
            "align_corners": "align_corners", "output": "scale_factor"}

    def _run(self, input, mode="bilinear", target="scale_factor", scale_factor=2.0, width=512, height=512,
             align_corners=False, device=None):
        node = self.DISPLAY
        if target not in ("scale_factor", "size"):
            raise NodeError(node, "target", target, "must be scale_factor or size")
        be, kind, x = _nchw(node, input, device)
        if target == "size":
            self.arg_inputs["output"] = "width"
            kw = {"size": (int(height), int(width))}
        else:
            kw = {"scale_factor": float(scale_factor)}
        corners = bool(align_corners) if mode in ("bilinear", "bicubic") else None
        t = Timer()
        y = be.interpolate(x, mode=mode, align_corners=corners, **kw)
        out = result(be, y, kind, input, "nchw", node)
        ms = t.ms(be)
        Progress(1).step()
        return {"ui": badge(be, ms, op="interpolate", shape=out_shape(out)), "result": (out,)}


# =================================================================================================
class AnyDevicePool(ComputeNode):
    DISPLAY = "Pool (AnyDevice)"
    DESCRIPTION = ("Pooling of an IMAGE, MASK, LATENT or TENSOR over its height and width (PyTorch semantics): "
                   "max or avg over kernel_size windows every stride pixels, or adaptive max / avg to a fixed "
                   "output width and height.")
    OUTPUT_TOOLTIPS = ("The pooled input, of the same type.",)
    POOLS = ["max", "avg", "adaptive_max", "adaptive_avg"]
    input_tip = _DATA_TIP

    @classmethod
    def widgets(cls):
        return {
            "pool": Choice(cls.POOLS, "max",
                           "max / avg: max_pool2d / avg_pool2d with the window below; adaptive_max / "
                           "adaptive_avg: windows chosen to give output_width x output_height."),
            "kernel_size": Int(2, 1, 256, "Window size (max and avg)."),
            "stride": Int(0, 0, 256, "Step between windows; 0 means kernel_size (PyTorch's default)."),
            "padding": Int(0, 0, 128,
                           "Implicit padding on every side (at most kernel_size / 2); max pooling ignores it, avg "
                           "counts it as zeros if count_include_pad."),
            "dilation": Int(1, 1, 64, "max only: spacing between taps."),
            "ceil_mode": Bool(False, "Round the output size up (a last, partial window), as PyTorch."),
            "count_include_pad": Bool(True, "avg only: the padding counts in each window's mean."),
            "output_width": Int(8, 1, 16384, "adaptive pools: output width."),
            "output_height": Int(8, 1, 16384, "adaptive pools: output height."),
        }

    ARGS = {"input": "input", "kernel_size": "kernel_size", "stride": "stride", "padding": "padding",
            "dilation": "dilation", "output_size": "output_width", "output": "output_width"}

    def _run(self, input, pool="max", kernel_size=2, stride=0, padding=0, dilation=1, ceil_mode=False,
             count_include_pad=True, output_width=8, output_height=8, device=None):
        node = self.DISPLAY
        if pool not in self.POOLS:
            raise NodeError(node, "pool", pool, f"must be one of {', '.join(self.POOLS)}")
        be, kind, x = _nchw(node, input, device)
        st = None if int(stride) == 0 else int(stride)
        if pool in ("max", "avg"):
            self.arg_inputs["input"] = ("kernel_size", kernel_size)  # too small an input for the window
        t = Timer()
        if pool == "max":
            y = be.max_pool2d(x, int(kernel_size), st, int(padding), int(dilation), bool(ceil_mode))
        elif pool == "avg":
            y = be.avg_pool2d(x, int(kernel_size), st, int(padding), bool(ceil_mode), bool(count_include_pad))
        elif pool == "adaptive_max":
            y = be.adaptive_max_pool2d(x, (int(output_height), int(output_width)))
        else:
            y = be.adaptive_avg_pool2d(x, (int(output_height), int(output_width)))
        out = result(be, y, kind, input, "nchw", node)
        ms = t.ms(be)
        Progress(1).step()
        return {"ui": badge(be, ms, op=pool + "_pool2d", shape=out_shape(out)), "result": (out,)}


WINDOW_NODES = [AnyDeviceResize, AnyDevicePool]
