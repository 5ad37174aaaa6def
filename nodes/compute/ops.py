"""The compute nodes: Linear, Conv2D, Activation, Loss, TensorOps. Thin adapters over ``backend``.

Conv2D lives in conv_node.py, the base class they share in compute_base.py."""
from __future__ import annotations

import math

import numpy as np

from ...backend import ACTIVATIONS, LOSSES
from ...backend.ops import quant
from ...backend.ops.plans import normalize_dims
from . import presets as P
from ..base.common import (DATA, DEVICE_INPUT, NodeError, Progress, Timer, badge, check_constant, kind_of,
                     parse_ints, parse_matrix, parse_vector, parsed, resolve_backend, validate_texts)
from ..base.widgets import Bool, Choice, Float, Int, Text, outputs
from ..base.resident import constant
from ..base.values import data, from_layout, numbers, out_shape, preview, result, shape_of, to_layout, wrap
from .base import ComputeNode, SEED_MAX, _DATA_TIP, _kernel_ui, _weights_value
from .conv import AnyDeviceConv2D


# =================================================================================================
class AnyDeviceLinear(ComputeNode):
    DISPLAY = "Linear (AnyDevice)"
    ARGS = {"input": "input", "bias": "bias"}
    DESCRIPTION = ("y = x @ W.T + b. On a TENSOR it acts on the last dim; on an IMAGE, MASK or LATENT it "
                   "acts on each pixel's channels (a colour matrix). W comes from a preset (grayscale, "
                   "sepia, ...), seeded random init, a matrix typed as text, or a WEIGHTS input.")
    OUTPUT_TOOLTIPS = ("The result, of the same type as the input.",)
    SOURCES = ["preset", "random", "text", "weights"]
    weights_tip = "W (and b) from a Weights (AnyDevice) node when source is weights."

    @classmethod
    def widgets(cls):
        return {
            "source": Choice(cls.SOURCES, "preset",
                             "Where W comes from: a colour preset, seeded random init (PyTorch's nn.Linear "
                             "range), the matrix text, or the WEIGHTS input."),
            "preset": Choice(list(P.LINEAR_PRESETS), "sepia",
                             "Colour matrix for 3-channel inputs (identity fits any channel count)."),
            "out_features": Int(3, 1, 4096, "Output channels / features when source is random."),
            "init_seed": Int(0, 0, SEED_MAX,
                             "Seed of the random init (same seed, same weights everywhere; it does not change "
                             "between runs)."),
            "matrix": Text("0.393 0.769 0.189\n0.349 0.686 0.168\n0.272 0.534 0.131",
                           "W when source is text: one row per output channel, numbers separated by spaces or "
                           "commas, rows by new lines or ';'.", multiline=True),
            "bias": Text("",
                         "Optional bias b: one number per output (or one for all); empty for none. Added to a "
                         "preset's or WEIGHTS' own bias."),
        }

    @classmethod
    def VALIDATE_INPUTS(cls, source=None, matrix=None, bias=None):
        """The text widgets, by the parsers the node runs: matrix where source is text, bias always.
        ComfyUI flags each input VALIDATE_INPUTS takes and skips its own checks for them, so source
        (which says whether matrix is parsed) is checked against its choices here; the other
        widgets ComfyUI checks against INPUT_TYPES itself."""
        return validate_texts(cls, ("source", source, cls.SOURCES),
                              [("matrix", matrix, ("text",), parse_matrix), ("bias", bias, None, parse_vector)])

    def _run(self, input, source="preset", preset="sepia", out_features=3, init_seed=0, matrix="", bias="",
             weights=None, device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        kind = kind_of(input, node, "input")
        src = shape_of(input, kind)
        last = src + (1,) if kind == "MASK" else (src[:1] + src[2:] + src[1:2] if kind == "LATENT" else src)
        in_f = int(last[-1]) if last else 0
        b = None
        warg = {"preset": "preset", "random": "out_features", "text": "matrix", "weights": "weights"}.get(source)
        if source == "preset":
            if preset == "identity":  # one row per input channel
                check_constant(node, "preset", preset, (in_f, in_f), np.float32, "identity matrix")
            w, b = parsed(node, "preset", preset, P.color_preset, in_f)
        elif source == "random":  # the seeded init draws in float64 before its float32 copy
            check_constant(node, "out_features", out_features, (int(out_features), in_f), np.float64, "random matrix")
            w = P.seeded_uniform(init_seed, (int(out_features), in_f), in_f)
        elif source == "text":
            w = parsed(node, "matrix", matrix, parse_matrix)
        elif source == "weights":
            wt, bt = _weights_value(weights, node)
            w, b = (wt if quant.is_quantized(wt) else wt.numpy()), (None if bt is None else bt.numpy())
            if w.ndim != 2:
                raise NodeError(node, "weights", tuple(w.shape), "a Linear weight must be 2-D (out, in)")
        else:
            raise NodeError(node, "source", source, "must be preset, random, text or weights")
        self.arg_inputs["weight"] = (warg, f"W of shape {tuple(w.shape)}")
        extra = parsed(node, "bias", bias, parse_vector)
        out_f = w.shape[0]
        if extra is not None:
            if extra.size not in (1, out_f):
                raise NodeError(node, "bias", bias, f"needs 1 or {out_f} numbers (one per output), got {extra.size}")
            extra = np.broadcast_to(extra, (out_f,)).astype(np.float32)
            b = extra if b is None else (np.asarray(b, np.float32) + extra)
        if source == "weights" and b is not None:
            self.arg_inputs["bias"] = ("weights", f"bias of shape {np.asarray(b).shape}")
        if kind == "MASK" and out_f != 1:
            raise NodeError(node, warg, f"W of shape {tuple(w.shape)}", "a MASK has 1 channel, so W needs 1 output row")
        pbar = Progress(1)
        t = Timer()
        y = be.linear(data(input, kind, be, "last", node), constant(be, w), constant(be, b))
        out = wrap(be, from_layout(be, y, kind, "last", src, node), kind, input)
        ms = t.ms(be)
        pbar.step()
        ui = badge(be, ms, op="linear", shape=out_shape(out))
        ui["kernel"] = [_kernel_ui(w, f"W {w.shape[0]}x{w.shape[1]}")]
        return {"ui": ui, "result": (out,)}


# =================================================================================================
class AnyDeviceActivation(ComputeNode):
    DISPLAY = "Activation (AnyDevice)"
    DESCRIPTION = ("Element-wise activation (PyTorch semantics): relu, leaky_relu, elu, gelu, silu, sigmoid, tanh, "
                   "softplus, or softmax over a dim.")
    OUTPUT_TOOLTIPS = ("The activated input, of the same type.",)

    @classmethod
    def widgets(cls):
        return {
            "activation": Choice(list(ACTIVATIONS), "relu", "The function to apply."),
            "negative_slope": Float(0.01, -100.0, 100.0, 0.001, "leaky_relu: slope for negative inputs."),
            "alpha": Float(1.0, -100.0, 100.0, 0.01, "elu: value the negative side approaches."),
            "approximate": Choice(["none", "tanh"], "none", "gelu: exact or tanh approximation."),
            "beta": Float(1.0, 0.001, 1000.0, 0.01, "softplus: sharpness beta."),
            "threshold": Float(20.0, 0.0, 1000.0, 0.1, "softplus: above beta*x > threshold the output is x."),
            "dim": Int(-1, -8, 7,
                       "softmax: the dim, in the input's own layout (IMAGE [B,H,W,C]: -1 is the channels; LATENT "
                       "[B,C,H,W]: 1 is the channels)."),
        }

    ARGS = {"input": "input", "name": "activation", "dim": "dim", "negative_slope": "negative_slope",
            "alpha": "alpha", "approximate": "approximate", "beta": "beta", "threshold": "threshold"}

    def _run(self, input, activation="relu", negative_slope=0.01, alpha=1.0, approximate="none", beta=1.0,
             threshold=20.0, dim=-1, device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        kind = kind_of(input, node, "input")
        params = {"leaky_relu": {"negative_slope": negative_slope}, "elu": {"alpha": alpha},
                  "gelu": {"approximate": approximate}, "softplus": {"beta": beta, "threshold": threshold},
                  "softmax": {"dim": dim}}.get(activation, {})
        t = Timer()
        y = be.activation(activation, data(input, kind, be, "raw", node), **params)
        out = wrap(be, y, kind, input)
        ms = t.ms(be)
        Progress(1).step()
        return {"ui": badge(be, ms, op=activation), "result": (out,)}


# =================================================================================================
LOSS_NAMES = list(LOSSES)


class AnyDeviceLoss(ComputeNode):
    DISPLAY = "Loss (AnyDevice)"
    DESCRIPTION = ("Compares a prediction with a target: mse, l1, huber, smooth_l1, bce (PyTorch semantics, mean "
                   "reduction), PSNR in dB or SSIM. Shows the value on the node and outputs it as a FLOAT, "
                   "plus an error map (|prediction - target|, scaled to its maximum) as an IMAGE.")
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS = outputs(
        ("FLOAT", "value", "The loss or metric value."),
        ("IMAGE", "error_map", "|prediction - target| scaled so its maximum is white."))
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "prediction": (DATA, {"tooltip": "An IMAGE, MASK, LATENT or TENSOR."}),
                "target": (DATA, {"tooltip": "Same kind; it must broadcast with the prediction (the same shape "
                                             "for bce, psnr and ssim)."}),
                "loss": Choice(LOSS_NAMES, "mse", "The loss or image metric."),
                "delta": Float(1.0, 0.0001, 1e6, 0.01, "huber: delta; smooth_l1: beta."),
                "data_range": Float(1.0, 0.0001, 1e6, 0.01, "psnr and ssim: the value range (1.0 for images)."),
                "window_size": Int(11, 1, 63, "ssim: the Gaussian window size (odd).", step=2),
                "sigma": Float(1.5, 0.01, 100.0, 0.01, "ssim: the Gaussian window's sigma."),
            },
            "optional": {"device": DEVICE_INPUT},
        }

    # no VALIDATE_INPUTS: ComfyUI checks the widgets against INPUT_TYPES; the loss's own rules (an odd
    # window that fits the images, shapes that match) are the backend's, said with these widget names
    ARGS = {"input": "prediction", "target": "target", "name": "loss", "delta": "delta", "beta": "delta",
            "data_range": "data_range", "window_size": "window_size", "sigma": "sigma"}

    def _run(self, prediction, target, loss="mse", delta=1.0, data_range=1.0, window_size=11, sigma=1.5,
             device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        kp = kind_of(prediction, node, "prediction")
        kt = kind_of(target, node, "target")
        typed = kp != "TENSOR" and kt != "TENSOR"
        layout = "nchw" if typed or loss == "ssim" else "raw"
        params = {"huber": {"delta": delta}, "smooth_l1": {"beta": delta}, "psnr": {"data_range": data_range},
                  "ssim": {"data_range": data_range, "window_size": window_size, "sigma": sigma}}.get(loss, {})
        pbar = Progress(2)
        t = Timer()
        p = data(prediction, kp, be, layout, node, "prediction", "input")
        q = data(target, kt, be, layout, node, "target", "target")
        v = be.loss(loss, p, q, **params)
        pbar.step()
        d = be.abs(be.sub(p, q))
        dshape = be._shape(d)
        # the value and the peak error come back together: one download
        value, peak = numbers(be, [v, be.max(d)]) if math.prod(dshape) else (numbers(be, [v])[0], 0.0)
        if peak > 0:
            d = be.div(d, peak)
        if len(dshape) != 4:
            d = to_layout(be, d, "TENSOR", "nchw") if 2 <= len(dshape) <= 4 else \
                be._reshape(d, (1, 1, 1, math.prod(dshape)))
        emap = preview(be, d)
        ms = t.ms(be)
        pbar.step()
        ui = badge(be, ms, op=loss)
        ui["loss"] = [{"name": loss, "value": value, "max_abs_error": peak}]
        ui["text"] = [f"{loss} = {value:.6g}"]
        return {"ui": ui, "result": (value, emap)}


# =================================================================================================
BINARY = ["add", "sub", "mul", "div", "pow", "min", "max", "matmul"]
UNARY = ["abs", "neg", "sqrt", "exp", "log", "clamp", "normalize"]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"]
_BIN_MAP = {"min": "minimum", "max": "maximum"}
_RED_MAP = {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "max", "reduce_min": "min"}


class AnyDeviceTensorOps(ComputeNode):
    DISPLAY = "Tensor Ops (AnyDevice)"
    CATEGORY = "AnyDevice/tensor"
    DESCRIPTION = ("Tensor maths with PyTorch broadcasting: add, sub, mul, div, pow, min, max, matmul against input "
                   "b or a scalar; abs, neg, sqrt, exp, log, clamp, normalize (to 0..1); and sum/mean/max/min over "
                   "dims. Two IMAGE/MASK/LATENT inputs are lined up channel-first so an IMAGE times a MASK works.")
    OUTPUT_TOOLTIPS = ("The result: the type of input a when its shape still fits, else a TENSOR.",)

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "a": (DATA, {"tooltip": "First operand: " + _DATA_TIP}),
                "op": Choice(BINARY + UNARY + REDUCE, "add", "The operation."),
                "scalar": Float(1.0, -1e9, 1e9, 0.01, "Second operand of a binary op when b is not connected."),
                "clamp_min": Float(0.0, -1e9, 1e9, 0.01, "clamp: lower bound."),
                "clamp_max": Float(1.0, -1e9, 1e9, 0.01, "clamp: upper bound."),
                "dims": Text("",
                             "Reductions and normalize: dims to reduce over, e.g. '1' or '1, 2', in a's own layout "
                             "(IMAGE [B,H,W,C]); empty means all."),
                "keepdim": Bool(True, "Reductions: keep reduced dims as size 1."),
            },
            "optional": {
                "b": (DATA, {"tooltip": "Second operand of a binary op (overrides scalar)."}),
                "device": DEVICE_INPUT,
            },
        }

    ARGS = {"input": "a", "other": "b", "dim": "dims", "min": "clamp_min", "max": "clamp_max"}

    @classmethod
    def VALIDATE_INPUTS(cls, dims=None):
        """Only the widget checked here (ComfyUI flags each input VALIDATE_INPUTS takes, and checks
        the others against INPUT_TYPES itself); clamp_min <= clamp_max is checked for clamp at run time."""
        if dims is not None:
            try:
                parse_ints(dims, "dims")
            except ValueError as exc:
                return cls.fail("dims", dims, str(exc))
        return True

    def _run(self, a, op="add", scalar=1.0, clamp_min=0.0, clamp_max=1.0, dims="", keepdim=True, b=None,
             device=None):
        node = self.DISPLAY
        be = resolve_backend(device, node)
        ka = kind_of(a, node, "a")
        dim_t = parsed(node, "dims", dims, parse_ints, "dims")
        dim = dim_t if dim_t else None
        t = Timer()
        if op in BINARY:
            if b is None:
                if op == "matmul":
                    raise NodeError(node, "b", None, "matmul needs a tensor on input 'b'")
                self.arg_inputs["other"] = "scalar"
                y = be.binary(_BIN_MAP.get(op, op), data(a, ka, be, "raw", node, "a"), float(scalar))
                out = wrap(be, y, ka, a)
            else:
                kb = kind_of(b, node, "b")
                canon = ka != "TENSOR" and kb != "TENSOR" and op != "matmul"
                layout = "nchw" if canon else "raw"
                xa = data(a, ka, be, layout, node, "a", "input")
                xb = data(b, kb, be, layout, node, "b", "other")
                if op == "matmul":
                    y = be.matmul(xa, xb)
                else:
                    y = be.binary(_BIN_MAP.get(op, op), xa, xb)
                out = result(be, y, ka, a, "nchw", node) if canon else wrap(be, y, ka, a)
        elif op in UNARY:
            x = data(a, ka, be, "raw", node, "a")
            if op == "clamp":
                if clamp_min > clamp_max:
                    raise NodeError(node, "clamp_min", clamp_min, f"is larger than clamp_max ({clamp_max})")
                y = be.clamp(x, clamp_min, clamp_max)
            elif op == "normalize":
                lo = be.min(x, dim, keepdim=True)
                hi = be.max(x, dim, keepdim=True)
                y = be.div(be.sub(x, lo), be.maximum(be.sub(hi, lo), 1e-12))
            else:
                y = be.unary(op, x)
            out = wrap(be, y, ka, a)
        elif op in REDUCE:
            x = data(a, ka, be, "raw", node, "a")
            y = be.reduce(_RED_MAP[op], x, dim, keepdim=bool(keepdim))
            xs = shape_of(a, ka)
            axes = normalize_dims(op, dim, len(xs))
            want = [1 if i in axes else s for i, s in enumerate(xs)] if keepdim else \
                [s for i, s in enumerate(xs) if i not in axes]
            out = wrap(be, be._reshape(y, tuple(want)), ka, a)  # some backends give a 0-d result as [1]
        else:
            raise NodeError(node, "op", op, f"must be one of {', '.join(BINARY + UNARY + REDUCE)}")
        ms = t.ms(be)
        Progress(1).step()
        return {"ui": badge(be, ms, op=op, shape=out_shape(out)), "result": (out,)}


COMPUTE_NODES = [AnyDeviceLinear, AnyDeviceConv2D, AnyDeviceActivation, AnyDeviceLoss, AnyDeviceTensorOps]
