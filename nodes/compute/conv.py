"""The Conv2D node: conv2d / conv_transpose2d of an IMAGE, MASK, LATENT or TENSOR with a preset, typed,
random or given kernel."""
from __future__ import annotations

import numpy as np

from ...backend.ops import quant
from ...backend.system import cancel
from ...backend.ops.plans import check_groups, conv_image, pair, planned, same_pads
from . import presets as P
from ..base.common import (ANY, DATA, DEVICE_INPUT, WEIGHTS, NodeError, Progress, Timer, badge, check_constant, kind_of,
                     parse_matrix, resolve_backend, validate_texts)
from ..base.resident import constant
from ..base.values import data, nchw_shape, result, shape_of
from .base import ComputeNode, SEED_MAX, _DATA_TIP, _kernel_ui, _weights_value


# =================================================================================================
class AnyDeviceConv2D(ComputeNode):
    DISPLAY = "Conv2D (AnyDevice)"
    DESCRIPTION = ("2-D convolution (PyTorch conv2d / conv_transpose2d semantics) of an IMAGE, MASK, LATENT "
                   "or TENSOR. Kernel from a preset (blur, gaussian, sharpen, sobel, laplacian, emboss), a matrix "
                   "typed as text, seeded random init or a WEIGHTS input. 'depthwise' applies the kernel to each "
                   "channel on its own, the usual way an image filter is applied.")
    RETURN_TYPES = (ANY,)
    RETURN_NAMES = ("output",)
    OUTPUT_TOOLTIPS = ("The filtered input, of the same type.",)
    KERNEL_SOURCES = ["preset", "text", "random", "weights"]
    CHANNEL_MODES = ["depthwise", "grouped"]
    PADDINGS = ["same", "valid", "explicit"]
    PAD_MODES = ["auto", "reflect", "zeros", "replicate", "circular"]

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "input": (DATA, {"tooltip": _DATA_TIP}),
                "kernel_source": (cls.KERNEL_SOURCES, {
                    "default": "preset", "tooltip": "Where the kernel comes from."}),
                "preset": (list(P.KERNEL_PRESETS), {
                    "default": "gaussian",
                    "tooltip": "Kernel preset; identity, box_blur and gaussian follow kernel_size, the others are 3x3."}),
                "kernel_size": ("INT", {"default": 5, "min": 1, "max": 63,
                                        "tooltip": "Size of sized presets and of random kernels."}),
                "sigma": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 100.0, "step": 0.01,
                                    "tooltip": "Standard deviation of the gaussian preset, in pixels."}),
                "kernel_text": ("STRING", {"multiline": True, "default": "-1 0 1\n-2 0 2\n-1 0 1",
                                           "tooltip": "Kernel when kernel_source is text: rows on new lines "
                                                      "(or ';'), numbers separated by spaces or commas."}),
                "init_seed": ("INT", {"default": 0, "min": 0, "max": SEED_MAX,
                                 "tooltip": "Seed of the random kernel (PyTorch's nn.Conv2d init range); it does not change between runs."}),
                "channel_mode": (cls.CHANNEL_MODES, {
                    "default": "depthwise",
                    "tooltip": "depthwise: the kernel filters every channel on its own (groups = channels, "
                               "channels kept). grouped: use groups and out_channels (a 2-D kernel is "
                               "applied to and summed over the channels of each group)."}),
                "out_channels": ("INT", {"default": 8, "min": 1, "max": 1024,
                                         "tooltip": "Output channels in grouped mode."}),
                "groups": ("INT", {"default": 1, "min": 1, "max": 1024,
                                   "tooltip": "Groups in grouped mode; must divide the input and output channels."}),
                "stride": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Step between kernel positions."}),
                "padding": (cls.PADDINGS, {"default": "same",
                                           "tooltip": "same: output size = input size (stride 1); valid: no "
                                                      "padding; explicit: padding_size on every side."}),
                "padding_size": ("INT", {"default": 0, "min": 0, "max": 256,
                                         "tooltip": "Pixels of padding on each side when padding is explicit."}),
                "dilation": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "Spacing between kernel taps."}),
                "padding_mode": (cls.PAD_MODES, {
                    "default": "auto",
                    "tooltip": "How the border is filled. auto: reflect for IMAGE, MASK and LATENT, zeros for "
                               "TENSOR. Transposed convolutions always pad with zeros."}),
                "bias": ("FLOAT", {"default": 0.0, "min": -1e6, "max": 1e6, "step": 0.01,
                                   "tooltip": "A constant added to every output channel."}),
                "transposed": ("BOOLEAN", {"default": False,
                                           "tooltip": "Transposed convolution (upsampling with stride > 1)."}),
                "output_padding": ("INT", {"default": 0, "min": 0, "max": 63,
                                           "tooltip": "Transposed only: extra rows/columns on one side of the "
                                                      "output; must be smaller than stride or dilation."}),
            },
            "optional": {
                "weights": (WEIGHTS, {"tooltip": "Kernel (and bias) from a Weights (AnyDevice) node: 2-D (kH, kW) or "
                                                 "4-D (out, in/groups, kH, kW)."}),
                "device": DEVICE_INPUT,
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, kernel_source=None, kernel_text=None):
        """kernel_text where kernel_source is text, by the parser the node runs. ComfyUI flags each
        input VALIDATE_INPUTS takes and skips its own checks for them, so kernel_source is checked
        against its choices here; ComfyUI checks the other widgets against INPUT_TYPES, and the rules
        between widgets that the backend checks are checked at run time, naming the widget at fault."""
        return validate_texts(cls, ("kernel_source", kernel_source, cls.KERNEL_SOURCES),
                              [("kernel_text", kernel_text, ("text",), parse_matrix)])

    ARGS = {"input": "input", "stride": "stride", "dilation": "dilation", "groups": "groups",
            "output_padding": "output_padding", "padding_mode": "padding_mode", "mode": "padding_mode"}

    def _kernel(self, kernel_source, preset, kernel_size, sigma, kernel_text, init_seed, weights):
        """(2-D kernel or None, 4-D weight or None, bias or None, label, input name)."""
        node = self.DISPLAY
        if kernel_source == "preset":
            try:
                return P.kernel_preset(preset, int(kernel_size), float(sigma)), None, None, preset, "preset"
            except ValueError as exc:
                raise NodeError(node, "preset", preset, str(exc)) from None
        if kernel_source == "text":
            try:
                return parse_matrix(kernel_text), None, None, "text", "kernel_text"
            except ValueError as exc:
                raise NodeError(node, "kernel_text", kernel_text, str(exc)) from None
        if kernel_source == "random":
            return None, None, None, f"random (init_seed {init_seed})", "kernel_size"
        if kernel_source == "weights":
            w, b = _weights_value(weights, node)
            if quant.is_quantized(w):  # a 4-D one stays packed; a 2-D kernel is broadcast, so dequantized
                w = w.dequantize() if w.ndim == 2 else w
            else:
                w = w.numpy()
            if w.ndim == 2:
                return w, None, (None if b is None else b.numpy()), "weights", "weights"
            if w.ndim != 4:
                raise NodeError(node, "weights", tuple(w.shape), "a conv weight must be 2-D (kH, kW) or 4-D")
            return None, w, (None if b is None else b.numpy()), "weights", "weights"
        raise NodeError(node, "kernel_source", kernel_source, "must be preset, text, random or weights")

    def _run(self, input, kernel_source="preset", preset="gaussian", kernel_size=5, sigma=1.0,
             kernel_text="", init_seed=0, channel_mode="depthwise", out_channels=8, groups=1, stride=1,
             padding="same", padding_size=0, dilation=1, padding_mode="auto", bias=0.0, transposed=False,
             output_padding=0, weights=None, device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        kind = kind_of(input, node, "input")
        xshape = nchw_shape(shape_of(input, kind), kind, node, "input")
        n, c, h, w_ = xshape
        op = "conv_transpose2d" if transposed else "conv2d"
        if kernel_source == "random" or (kernel_source == "preset" and preset in P.SIZED_KERNELS):
            # the size check before the node builds a (kernel_size, kernel_size) kernel for every channel
            k = int(kernel_size)
            self.arg_inputs.update(weight="kernel_size")
            oc, gs = int(out_channels), max(1, int(groups))
            lead = (c, 1) if channel_mode != "grouped" else (c, max(1, oc // gs)) if transposed else (oc, max(1, c // gs))
            planned(op, lead + (k, k), "weight", be)
            # and in the dtype each is generated in, before it is: the seeded init draws the whole
            # weight in float64, the gaussian preset computes its 2-D kernel in float64
            if kernel_source == "random":
                check_constant(node, "kernel_size", kernel_size, lead + (k, k), np.float64, "random kernel")
            elif preset == "gaussian":
                check_constant(node, "kernel_size", kernel_size, (k, k), np.float64, "gaussian kernel")
        k2, w4, wbias, label, karg = self._kernel(kernel_source, preset, kernel_size, sigma, kernel_text, init_seed,
                                                  weights)
        sized = kernel_source == "random" or (kernel_source == "preset" and preset in P.SIZED_KERNELS)
        size_arg = "kernel_size" if sized else karg
        # the backend's arguments that no widget sets one to one, for this call
        pad_arg = "padding_size" if padding == "explicit" else size_arg
        self.arg_inputs.update(weight=size_arg, padding=pad_arg, pad=pad_arg,
                         groups="groups" if channel_mode == "grouped" else "channel_mode")
        if wbias is not None:
            self.arg_inputs["bias"] = ("weights", f"bias of shape {tuple(np.shape(wbias))}")
        k = int(kernel_size)
        if k2 is not None and w4 is None and channel_mode in self.CHANNEL_MODES:  # the 2-D kernel for every channel
            gs = max(1, int(groups))
            lead = (c, 1) if channel_mode == "depthwise" else \
                (c, int(out_channels) // gs) if transposed else (int(out_channels), c // gs)
            arg = size_arg if channel_mode == "depthwise" else "out_channels"
            shown = {"kernel_size": kernel_size, "kernel_text": kernel_text, "preset": preset,
                     "out_channels": out_channels, "weights": f"weight of shape {k2.shape}"}[arg]
            check_constant(node, arg, shown, lead + k2.shape, np.float32, "kernel")
        if channel_mode == "depthwise":
            g = c
            if w4 is not None:
                weight = w4
            elif k2 is not None:
                weight = np.array(np.broadcast_to(k2, (c, 1) + k2.shape))
            else:
                weight = P.seeded_uniform(init_seed, (c, 1, k, k), k * k)
        elif channel_mode == "grouped":
            g, oc = groups, int(out_channels)
            check_groups(op, g, c)  # before the weight's shape is made from them
            check_groups(op, g, oc, "out_channels={}")
            if w4 is not None:
                weight = w4
            elif transposed:
                shape = (c, oc // g)
                weight = (np.array(np.broadcast_to(k2, shape + k2.shape)) if k2 is not None
                          else P.seeded_uniform(init_seed, shape + (k, k), (oc // g) * k * k))
            else:
                shape = (oc, c // g)
                weight = (np.array(np.broadcast_to(k2, shape + k2.shape)) if k2 is not None
                          else P.seeded_uniform(init_seed, shape + (k, k), (c // g) * k * k))
        else:
            raise NodeError(node, "channel_mode", channel_mode, "must be depthwise or grouped")
        if not quant.is_quantized(weight):
            weight = np.asarray(weight, np.float32)
        cout = weight.shape[1] * g if transposed else weight.shape[0]
        bvec = None if wbias is None else np.asarray(wbias, np.float32).reshape(-1)
        if bias:
            bvec = (np.zeros(cout, np.float32) if bvec is None else bvec) + np.float32(bias)
        mode = padding_mode
        if mode == "auto":
            mode = "zeros" if kind == "TENSOR" else "reflect"
        kh, kw = weight.shape[-2:]
        # 'same' at stride 1 goes to the backend as it is (its conv2d_plan pads; an even kernel's extra zero row
        # at the end, as torch does); a strided 'same' (torch has none) and an even kernel's reflect/replicate/
        # circular one pad by the same amounts on the device (be.pad: a too-small input's error names pad),
        # and a transposed one crops its output on the device (be.narrow)
        if padding == "same":
            pads = same_pads(kh, kw, pair(op, "dilation", dilation, minimum=1))
        elif padding == "valid":
            pads = (0, 0, 0, 0)
        else:
            ph, pw = pair(op, "padding", padding_size, minimum=0)
            pads = (ph, ph, pw, pw)
        if n == 0:
            raise NodeError(node, "input", f"shape {xshape}", "is an empty batch: there is nothing to filter")
        conv_image(op, xshape)  # an empty image is refused as torch does, before the node pads it
        pbar = Progress(n)
        t = Timer()
        # the whole batch in one call: the backend keeps its scratch within workspace_budget_bytes()
        x, wd, bd = data(input, kind, be, "nchw", node), constant(be, weight), constant(be, bvec)
        if transposed:  # 'same': the conv2d 'same' amount before; an even kernel's extra row is cropped
            y = be.conv_transpose2d(x, wd, bd, stride=stride, padding=(pads[0], pads[2]),
                                    output_padding=output_padding, groups=g, dilation=dilation)
            if padding == "same":  # on the device (narrow), where the output is larger (stride 1, even kernels)
                for dim, size in ((-2, max(1, h * stride)), (-1, max(1, w_ * stride))):
                    if be._shape(y)[dim] > size:
                        y = be.narrow(y, dim, 0, size)
        elif padding == "same" and stride == 1 and (mode == "zeros" or (pads[0], pads[2]) == (pads[1], pads[3])):
            y = be.conv2d(x, wd, bd, stride=stride, padding="same", dilation=dilation, groups=g, padding_mode=mode)
        elif pads[0] == pads[1] and pads[2] == pads[3]:
            y = be.conv2d(x, wd, bd, stride=stride, padding=(pads[0], pads[2]), dilation=dilation,
                          groups=g, padding_mode=mode)
        else:
            xp = be.pad(x, (pads[2], pads[3], pads[0], pads[1]), "constant" if mode == "zeros" else mode)
            y = be.conv2d(xp, wd, bd, stride=stride, padding=0, dilation=dilation, groups=g)
        cancel.check()  # a cancel during the op's last chunk ends here, before the long result conversion
        out = result(be, y, kind, input, "nchw", node)
        ms = t.ms(be)
        for _ in range(n):  # progress counts images
            pbar.step()
        ui = badge(be, ms, op="conv_transpose2d" if transposed else "conv2d", shape=list(be._shape(y)))
        shown = weight if k2 is None or channel_mode != "depthwise" else k2
        ui["kernel"] = [_kernel_ui(shown, label)]
        return {"ui": ui, "result": (out,)}
