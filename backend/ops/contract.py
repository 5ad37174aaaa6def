"""The op contract every backend implements.

``Backend`` holds everything that is the same for every device: converting inputs (NumPy arrays,
torch tensors, the backend's own device arrays) to float32, validating arguments with PyTorch's
rules *before* any kernel runs, computing output shapes, and the composite ops (linear, softmax,
losses, PSNR, SSIM; the layer ops of layers.py) built from the backend's primitives. A backend
module subclasses it and implements the primitives (the ``_`` methods listed under "primitives"
below) for its device.

Semantics follow PyTorch exactly (argument names, defaults, broadcasting, output shapes).
Compute is float32: float16, bfloat16, float64, integer and bool inputs are converted to float32
and the result is float32.

The result comes back in the kind the first array input had: a NumPy array, a torch tensor (on
that tensor's device), or the backend's own device array (so chains of ops stay on the device).
No op ever writes into an input.

Transfers: the conversion paths here count every host<->device copy (``transfers.py``).
"""
from __future__ import annotations

import math

import numpy as np

from ..system.errors import AnyDeviceError
from ..system.memstat import plans_on_self
from .attention import AttentionOps
from . import dtypes
from .convert import Conversion
from .layers import LayerOps
from .movement import MovementOps, pair_method
from .w8a8 import W8A8Ops
from .windows import WindowOps
from ..devices.interface import Capabilities, Device  # noqa: F401
from ..system.transfers import TRANSFER_KEYS, TransferCounts, transfer_totals  # noqa: F401
# argument checks and shape plans live in plans/ (one module per op family); the names other modules import from here stay here
from .plans import (  # noqa: F401
    is_scalar,
    ACTIVATIONS, BINARY_OPS, LOSSES, PADDING_MODES, REDUCE_OPS, UNARY_OPS, UNARY_PARAMS, _check_unary_params,
    bce_range, broadcast_shapes, check_reduction, check_size, conv2d_plan, conv_transpose2d_plan, known,
    linear_shapes, loss_threshold, matmul_plan, pad_plan, pair_shapes, positive, reduce_dims, softmax_dim,
    ssim_args, ssim_shape)

_FLOAT32 = np.dtype(np.float32)

#: op codes of the unary kernels, shared by kernels/elementwise.cl (OpenCL) and kernels/misc_cuda.cu
UNARY_KERNEL_CODES = {"abs": 0, "neg": 1, "exp": 2, "log": 3, "sqrt": 4, "relu": 5, "sigmoid": 6,
                      "tanh": 7, "gelu": 8, "gelu_tanh": 9, "silu": 10, "elu": 11, "leaky_relu": 12,
                      "softplus": 13, "clamp": 14, "rsqrt": 15, "erf": 16, "sin": 17, "cos": 18}


def unary_kernel_args(op: str, p: dict) -> tuple[int, float, float, int, int]:
    """(code, p0, p1, has_min, has_max) for the unary kernels, from checked unary parameters."""
    p0 = p1 = 0.0
    has_min = has_max = 0
    if op == "gelu" and p.get("approximate", "none") == "tanh":
        op = "gelu_tanh"
    elif op == "elu":
        p0 = p["alpha"]
    elif op == "leaky_relu":
        p0 = p["negative_slope"]
    elif op == "softplus":
        p0, p1 = p["beta"], p["threshold"]
    elif op == "clamp":
        has_min, has_max = int(p["min"] is not None), int(p["max"] is not None)
        p0 = p["min"] if has_min else 0.0
        p1 = p["max"] if has_max else 0.0
    return UNARY_KERNEL_CODES[op], p0, p1, has_min, has_max


from ..system.config import max_tensor_bytes, tf32_allowed, workspace_budget_bytes  # noqa: E402,F401  (moved; re-exported)
from . import bigconv  # noqa: E402  (conv2d's separable / FFT / chunked dispatch)


def gaussian_window(window_size: int, sigma: float) -> np.ndarray:
    x = np.arange(window_size, dtype=np.float64) - (window_size - 1) / 2.0
    g = np.exp(-(x * x) / (2.0 * sigma * sigma))
    return g / g.sum()


#: the fewest elements (per input) an ssim chunk has; smaller inputs are done in one piece
SSIM_MIN_CHUNK = 1 << 18


def ssim_chunk_elements(total: int) -> int:
    """Elements of each input one ssim chunk covers: 1/32 of the input, at least SSIM_MIN_CHUNK,
    at most what keeps a chunk's scratch (~64 arrays of its size, with a conv's im2col) in
    ANYDEVICE_WORKSPACE_MB."""
    cap = max(SSIM_MIN_CHUNK, workspace_budget_bytes() // (4 * 64))
    return max(SSIM_MIN_CHUNK, min(cap, total // 32))


#: unary ops without parameters, each a Backend method named as torch's (``be.relu(x)``)
_PLAIN_UNARY = tuple(op for op in UNARY_OPS if op not in UNARY_PARAMS)


def _unary_method(op: str):
    def method(self, input):
        return self.unary(op, input)
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"torch.{op}, elementwise (``unary('{op}', input)``)."
    return method


#: the mixin of those methods (``be.relu(x)`` is ``be.unary("relu", x)``)
_UnaryMethods = type("_UnaryMethods", (), {op: _unary_method(op) for op in _PLAIN_UNARY})


# ----------------------------------------------------------------------------------------------
@plans_on_self  # each op runs with its plans checking sizes against this backend's device (memstat.planning)
class Backend(Conversion, LayerOps, W8A8Ops, WindowOps, MovementOps, AttentionOps, _UnaryMethods, TransferCounts, Device):
    """The shared ops: validation, conversion and composite ops on top of the ``Device`` primitives
    (devices/interface.py). A device class derives from it and implements the primitives."""

    name = "base"
    #: "own" for the pack's own kernels, "vendor" for PyTorch
    kind = "own"

    def __init__(self, index: int = 0, name: str | None = None):
        self.index = index
        if name is not None:
            self.name = name

    def __repr__(self) -> str:
        return f"<AnyDevice backend {self.name}:{self.index} on {self.device}>"

    def _check_size(self, op: str, shape) -> None:
        from ..system.config import tensor_limit
        check_size(op, shape, *tensor_limit(self, 4 * math.prod(shape)))

    # ---- matmul / linear ------------------------------------------------------------------
    def matmul(self, input, other):
        """torch.matmul: 1-D, 2-D and batched operands with broadcast batch dims."""
        # a 2-D weight stored in half (a compiled model's transposed linear weight) is read as it is by
        # devices whose GEMM reads half ("half_weights"): the plain 2-D product only
        plain = all(isinstance(v, self.native_types) and len(self._shape(v)) == 2 for v in (input, other))
        # and where the GEMM packs half operands ("half_gemm"), the activation too: no float32 copy of it
        keep = (("other", "input") if "half_gemm" in self.caps.fused else ("other",)) if plain else ()
        kind, like, a, b = self._inputs("matmul", input=input, other=other, _keep=keep)
        y = self._matmul(a, b)
        return self._out(y, kind, like)

    def _matmul(self, a, b, op="matmul"):
        sa, sb = self._shape(a), self._shape(b)
        if len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]:  # fast path: plain 2-D product
            self._check_size(op, (sa[0], sb[1]))
            return self._mm(a, b)
        plan = matmul_plan(op, sa, sb)
        batch = plan.batch
        B = math.prod(batch)
        a3 = self._batch3(a, plan.a_shape, batch, B)
        b3 = self._batch3(b, plan.b_shape, batch, B)
        y = self._bmm(a3, b3)
        return self._reshape(y, plan.out_shape)

    def _batch3(self, x, shape2, batch, B):
        own = shape2[:-2]
        if math.prod(own) == 1:
            return self._reshape(x, (1,) + shape2[-2:])
        if tuple((1,) * (len(batch) - len(own)) + own) != batch:
            x = self._expand(self._reshape(x, shape2), batch + shape2[-2:])
        return self._reshape(x, (B,) + shape2[-2:])

    def linear(self, input, weight, bias=None):
        """torch.nn.functional.linear: y = input @ weight.T + bias."""
        op = "linear"
        # a half input stays half where the device's _linear reads it ("half_linear") and the result has its dtype
        keep = ("weight",)
        if "half_linear" in self.caps.fused and isinstance(input, self.native_types):
            dt = self._value_dtype(input)
            if dt in dtypes.HALF and dtypes.promote(
                    [self._value_dtype(v) for v in (input, weight, bias) if v is not None]) == dt:
                keep = ("weight", "input")
        kind, like, x, w, b = self._inputs(op, input=input, weight=weight, bias=bias, _keep=keep)
        linear_shapes(op, self._shape(x), self._shape(w), None if b is None else self._shape(b))
        y = self._linear(x, w, b)
        return self._out(y, kind, like)

    def _linear(self, x, w, b):
        sx, sw = self._shape(x), self._shape(w)
        if len(sw) == 1:
            y = self._matmul(x, w, "linear")
        else:
            rows = math.prod(sx[:-1])
            self._check_size("linear", (rows, sw[0]))
            y = self._bmm(self._reshape(x, (1, rows, sx[-1])), self._reshape(self._permute(w, (1, 0)), (1, sw[1], sw[0])))
            y = self._reshape(y, sx[:-1] + (sw[0],))
        return y if b is None else self._binary("add", y, b)

    # ---- convolution ----------------------------------------------------------------------
    def conv2d(self, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               padding_mode="zeros"):
        """torch.nn.functional.conv2d (plus nn.Conv2d's padding_mode)."""
        return self._conv2d_planned(input, weight, bias, stride, padding, dilation, groups, padding_mode)[0]

    def _conv2d_planned(self, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                        padding_mode="zeros"):
        """conv2d, and the plan it ran by (the autograd tape hands it to the backward rule)."""
        op = "conv2d"
        # a half input of the result's dtype stays half where the device's conv reads it ("half_conv")
        kind, like, x, w, b = self._inputs(op, input=input, weight=weight, bias=bias, _keep=("weight",),
                                           _half=("input",), _cap="half_conv")
        plan = conv2d_plan(op, self._shape(x), self._shape(w), None if b is None else self._shape(b),
                           stride, padding, dilation, groups, padding_mode)
        unbatched = plan.unbatched
        if unbatched:
            x = self._reshape(x, (1,) + self._shape(x))
        pads = plan.pads
        if self._dtype(x) != "float32" and ((padding_mode != "zeros" and any(pads)) or any(plan.out_pads)
                                            or plan.picks != (None, None)):
            x = self._cast(x, "float32")  # the padded and reach paths compute on float32
        if padding_mode != "zeros" and any(pads):
            x = self._pad(x, pads, padding_mode)
            pads = (0, 0, 0, 0)
        if any(plan.out_pads) or plan.picks != (None, None):  # huge geometry (plans.conv_reach)
            y = self._conv_reach(x, w, b, plan, pads, groups)
        else:  # separable / FFT / chunked (bigconv.py)
            y = bigconv.conv2d(self, x, w, b, plan.stride, pads, plan.dilation, groups)
        if unbatched:
            y = self._reshape(y, self._shape(y)[1:])
        return self._out(y, kind, like), plan

    def _conv_reach(self, x, w, b, plan, pads, groups):
        """conv2d on the outputs that can reach the input, zeros around them, then the bias."""
        t, bo, l, r = plan.out_pads
        n, cout = self._shape(x)[0], self._shape(w)[0]
        oh, ow = plan.out_shape[-2:]
        if t + bo >= oh or l + r >= ow:  # nothing reaches the input
            y = self.to_device(np.zeros((n, cout, oh, ow), np.float32), "conv2d", "output", constant=True)
        else:
            y = self._conv2d(x, w, None, plan.stride, pads, plan.dilation, groups)
            for dim, pick in enumerate(plan.picks):
                if pick is not None:  # keep output ``pick`` along H (dim 0) or W (dim 1)
                    s = self._shape(y)
                    lead, rest = math.prod(s[:2 + dim]), math.prod(s[3 + dim:])
                    y = self._slice1(self._reshape(y, (lead, s[2 + dim], rest, 1, 1)), pick)
                    y = self._reshape(y, s[:2 + dim] + (1,) + s[3 + dim:])
            if any(plan.out_pads):
                y = self._pad(y, plan.out_pads, "zeros")
        return y if b is None else self._binary("add", y, self._reshape(b, (cout, 1, 1)))

    def conv_transpose2d(self, input, weight, bias=None, stride=1, padding=0, output_padding=0,
                         groups=1, dilation=1):
        """torch.nn.functional.conv_transpose2d (argument order as torch's)."""
        return self._conv_transpose2d_planned(input, weight, bias, stride, padding, output_padding, groups,
                                              dilation)[0]

    def _conv_transpose2d_planned(self, input, weight, bias=None, stride=1, padding=0, output_padding=0,
                                  groups=1, dilation=1):
        """conv_transpose2d, and the plan it ran by (for the backward rule, as _conv2d_planned)."""
        op = "conv_transpose2d"
        kind, like, x, w, b = self._inputs(op, input=input, weight=weight, bias=bias)
        plan = conv_transpose2d_plan(op, self._shape(x), self._shape(w),
                                     None if b is None else self._shape(b),
                                     stride, padding, output_padding, groups, dilation)
        if plan.unbatched:
            x = self._reshape(x, (1,) + self._shape(x))
        y = bigconv.chunked_transpose(self, self._conv_transpose2d, x, w, b, plan.stride, plan.padding,
                                      plan.output_padding, plan.dilation, groups)
        if plan.unbatched:
            y = self._reshape(y, self._shape(y)[1:])
        return self._out(y, kind, like), plan

    def pad(self, input, pad, mode="constant"):
        """torch.nn.functional.pad for the last two dims, pad = (left, right, top, bottom).

        Modes: constant (zeros), reflect, replicate, circular. Negative amounts crop, as torch's."""
        op = "pad"
        kind, like, x = self._inputs(op, input=input)
        shape = self._shape(x)
        pads, mode = pad_plan(op, shape, pad, mode)
        lead = shape[:-2]
        x4 = self._reshape(x, (math.prod(lead), 1) + shape[-2:])
        y = self._pad_crop(x4, pads, mode)
        y = self._reshape(y, lead + self._shape(y)[-2:])
        return self._out(y, kind, like)

    # ---- elementwise ------------------------------------------------------------------------
    def unary(self, op: str, input, **params):
        known("unary", "op", op, UNARY_OPS, "op")
        params = _check_unary_params(op, params)
        kind, like, x = self._inputs(op, input=input, _same=("input",))
        return self._out(self._unary(op, x, **params), kind, like)

    # abs, neg, exp, log, sqrt, relu, sigmoid, tanh, silu, rsqrt, erf, sin, cos: see _PLAIN_UNARY below

    def gelu(self, input, approximate="none"):
        return self.unary("gelu", input, approximate=approximate)

    def elu(self, input, alpha=1.0):
        return self.unary("elu", input, alpha=alpha)

    def leaky_relu(self, input, negative_slope=0.01):
        return self.unary("leaky_relu", input, negative_slope=negative_slope)

    def softplus(self, input, beta=1.0, threshold=20.0):
        return self.unary("softplus", input, beta=beta, threshold=threshold)

    def clamp(self, input, min=None, max=None):
        return self.unary("clamp", input, min=min, max=max)

    def softmax(self, input, dim=-1):
        op = "softmax"
        kind, like, x = self._inputs(op, input=input)
        return self._out(self._softmax(x, softmax_dim(op, dim, len(self._shape(x)))), kind, like)

    def _softmax(self, x, d):
        shape = self._shape(x)
        if len(shape) == 0:  # a 0-d softmax is 1 (NaN stays NaN)
            return self._binary("add", self._binary("mul", x, 0.0), 1.0)
        if math.prod(shape) == 0:
            return self._binary("add", x, 0.0)  # empty in, empty out
        m = self._reduce("max", x, (d,), True)
        e = self._unary("exp", self._binary("sub", x, m))
        return self._binary("div", e, self._reduce("sum", e, (d,), True))

    def activation(self, name: str, input, **params):
        """Dispatch by name: relu, leaky_relu, elu, gelu, silu, sigmoid, tanh, softplus, softmax."""
        known("activation", "name", name, ACTIVATIONS, "activation")
        if name == "softmax":
            return self.softmax(input, **params)
        return self.unary(name, input, **params)

    def binary(self, op: str, input, other):
        known("binary", "op", op, BINARY_OPS, "op")
        return self._elementwise2(op, input, other)

    def _elementwise2(self, op: str, input, other):
        """A binary op or comparison with torch's broadcasting; either side may be a number."""
        a_scalar, b_scalar = is_scalar(input), is_scalar(other)
        if a_scalar and b_scalar:
            raise AnyDeviceError(op, "input", input, "at least one argument must be a tensor")
        same = ("input", "other")  # half operands of the result's dtype stay half where the device's kernels take them
        if a_scalar:
            kind, like, b = self._inputs(op, other=other, _same=same)
            a = float(input)
        elif b_scalar:
            kind, like, a = self._inputs(op, input=input, _same=same)
            b = float(other)
        else:
            kind, like, a, b = self._inputs(op, input=input, other=other, _same=same)
            broadcast_shapes(op, self._shape(a), self._shape(b))  # checks the result's size too
        return self._out(self._binary(op, a, b), kind, like)

    add, sub, mul, div, minimum, maximum = (pair_method("binary", op)
                                            for op in ("add", "sub", "mul", "div", "minimum", "maximum"))
    def pow(self, input, exponent): return self.binary("pow", input, exponent)  # torch's name for the 2nd argument

    # ---- reductions -------------------------------------------------------------------------
    def reduce(self, op: str, input, dim=None, keepdim=False):
        known("reduce", "op", op, REDUCE_OPS, "reduction")
        kind, like, x = self._inputs(op, input=input)
        dims = reduce_dims(op, self._shape(x), dim)
        return self._out(self._reduce(op, x, dims, bool(keepdim)), kind, like)

    def sum(self, input, dim=None, keepdim=False): return self.reduce("sum", input, dim, keepdim)
    def mean(self, input, dim=None, keepdim=False): return self.reduce("mean", input, dim, keepdim)

    def max(self, input, dim=None, keepdim=False):
        """torch.amax semantics: values only; dim None reduces everything."""
        return self.reduce("max", input, dim, keepdim)

    def min(self, input, dim=None, keepdim=False):
        """torch.amin semantics."""
        return self.reduce("min", input, dim, keepdim)

    # ---- losses and image metrics -------------------------------------------------------
    def _pair_inputs(self, op, input, target, same_shape=False):
        kind, like, a, b = self._inputs(op, input=input, target=target)
        pair_shapes(op, self._shape(a), self._shape(b), same_shape)
        return kind, like, a, b

    def _reduction(self, op, x, reduction):
        if reduction == "mean":
            return self._reduce("mean", x, tuple(range(len(self._shape(x)))), False)
        if reduction == "sum":
            return self._reduce("sum", x, tuple(range(len(self._shape(x)))), False)
        return x

    def mse_loss(self, input, target, reduction="mean"):
        check_reduction("mse_loss", reduction)
        kind, like, a, b = self._pair_inputs("mse_loss", input, target)
        d = self._binary("sub", a, b)
        return self._out(self._reduction("mse_loss", self._binary("mul", d, d), reduction), kind, like)

    def l1_loss(self, input, target, reduction="mean"):
        check_reduction("l1_loss", reduction)
        kind, like, a, b = self._pair_inputs("l1_loss", input, target)
        d = self._unary("abs", self._binary("sub", a, b))
        return self._out(self._reduction("l1_loss", d, reduction), kind, like)

    def smooth_l1_loss(self, input, target, reduction="mean", beta=1.0):
        op = "smooth_l1_loss"
        beta = loss_threshold(op, "beta", beta, reduction)
        kind, like, a, b = self._pair_inputs(op, input, target)
        ad = self._unary("abs", self._binary("sub", a, b))
        if beta == 0:
            loss = ad
        else:  # 0.5 m^2 / beta + (|d| - m), m = min(|d|, beta)
            m = self._binary("minimum", ad, beta)
            loss = self._binary("add", self._binary("mul", self._binary("mul", m, m), 0.5 / beta),
                                self._binary("sub", ad, m))
        return self._out(self._reduction(op, loss, reduction), kind, like)

    def huber_loss(self, input, target, reduction="mean", delta=1.0):
        op = "huber_loss"
        delta = loss_threshold(op, "delta", delta, reduction)
        kind, like, a, b = self._pair_inputs(op, input, target)
        ad = self._unary("abs", self._binary("sub", a, b))
        m = self._binary("minimum", ad, delta)  # 0.5 m^2 + delta (|d| - m)
        loss = self._binary("mul", self._binary("mul", m, m), 0.5)
        if delta != math.inf:  # delta = inf: the quadratic part only (inf * 0 would be NaN)
            loss = self._binary("add", loss, self._binary("mul", self._binary("sub", ad, m), delta))
        return self._out(self._reduction(op, loss, reduction), kind, like)

    def binary_cross_entropy(self, input, target, weight=None, reduction="mean"):
        op = "binary_cross_entropy"
        check_reduction(op, reduction)
        kind, like, a, b = self._pair_inputs(op, input, target, same_shape=True)
        wt = None if weight is None else self.to_device(weight, op, "weight")
        if wt is not None:  # before any work: the shape and the size of the weighted loss
            broadcast_shapes(op, self._shape(a), self._shape(wt), ("input", "weight"))
        empty = math.prod(self._shape(a)) == 0
        lo = 0.0 if empty else float(self.read_check(self._reduce("min", a, tuple(range(len(self._shape(a)))), False)))
        hi = 0.0 if empty else float(self.read_check(self._reduce("max", a, tuple(range(len(self._shape(a)))), False)))
        bce_range(op, self._shape(a), lo, hi)
        log_a = self._unary("clamp", self._unary("log", a), min=-100.0, max=None)
        log_1a = self._unary("clamp", self._unary("log", self._binary("sub", 1.0, a)), min=-100.0, max=None)
        # -(t * log(x) + (1 - t) * log(1 - x))
        loss = self._unary("neg", self._binary("add", self._binary("mul", b, log_a),
                                                self._binary("mul", self._binary("sub", 1.0, b), log_1a)))
        if wt is not None:
            loss = self._binary("mul", loss, wt)
        return self._out(self._reduction(op, loss, reduction), kind, like)

    def psnr(self, input, target, data_range=1.0):
        """Peak signal-to-noise ratio in dB over the whole tensor: 10 log10(range^2 / mse)."""
        op = "psnr"
        data_range = positive(op, "data_range", data_range)
        kind, like, a, b = self._pair_inputs(op, input, target, same_shape=True)
        d = self._binary("sub", a, b)
        mse = self._reduction(op, self._binary("mul", d, d), "mean")
        # 10 log10(r^2/mse) = 10/ln10 * (2 ln r - ln mse)
        y = self._binary("mul", self._binary("sub", 2.0 * math.log(data_range), self._unary("log", mse)),
                         10.0 / math.log(10.0))
        return self._out(y, kind, like)

    def ssim(self, input, target, data_range=1.0, window_size=11, sigma=1.5, k1=0.01, k2=0.03):
        """Structural similarity (Wang et al. 2004): Gaussian window, no padding, per channel, mean.

        input/target are (N, C, H, W), (C, H, W) or (H, W). Large inputs are done in chunks (groups
        of whole channel planes, or row bands of one plane, overlapping by window_size - 1 rows) so
        the scratch memory stays a fraction of the inputs (``ssim_chunk_elements``)."""
        op = "ssim"
        data_range, sigma = ssim_args(op, data_range, window_size, sigma)
        kind, like, a, b = self._pair_inputs(op, input, target, same_shape=True)
        shape4 = ssim_shape(op, self._shape(a), window_size)
        n, c, h, w = shape4
        planes, ws = n * c, window_size
        oh, ow = h - ws + 1, w - ws + 1
        g = gaussian_window(ws, sigma).astype(np.float32)
        wv = self.to_device(np.ascontiguousarray(np.broadcast_to(g.reshape(1, 1, -1, 1), (5, 1, ws, 1))),
                            op, "window", constant=True)
        wh = self.to_device(np.ascontiguousarray(np.broadcast_to(g.reshape(1, 1, 1, -1), (5, 1, 1, ws))),
                            op, "window", constant=True)
        consts = ((k1 * data_range) ** 2, (k2 * data_range) ** 2)
        chunk = ssim_chunk_elements(planes * h * w)
        if planes * h * w <= chunk:  # one piece: the ssim map's mean as one reduction
            m = self._ssim_map(self._reshape(a, (planes, 1, h, w)), self._reshape(b, (planes, 1, h, w)),
                               wv, wh, consts)
            return self._out(self._reduction(op, m, "mean"), kind, like)
        a, b = self._reshape(a, shape4), self._reshape(b, shape4)
        if c * h * w <= chunk:  # pieces of whole batch items
            step = chunk // (c * h * w)
            pieces = [(i, min(n, i + step), 0, c, 0, h) for i in range(0, n, step)]
        elif h * w <= chunk:  # groups of whole planes of one batch item
            step = chunk // (h * w)
            pieces = [(i, i + 1, j, min(c, j + step), 0, h) for i in range(n) for j in range(0, c, step)]
        else:  # row bands of one plane: `band` output rows from band + ws - 1 input rows
            band = max(1, chunk // w - (ws - 1))
            pieces = [(i, i + 1, j, j + 1, r, min(oh, r + band) + ws - 1)
                      for i in range(n) for j in range(c) for r in range(0, oh, band)]
        total = None
        for i0, i1, j0, j1, r0, r1 in pieces:
            k = (i1 - i0) * (j1 - j0)
            xa = self._reshape(self._piece(a, i0, i1, j0, j1, r0, r1), (k, 1, r1 - r0, w))
            xb = self._reshape(self._piece(b, i0, i1, j0, j1, r0, r1), (k, 1, r1 - r0, w))
            m = self._ssim_map(xa, xb, wv, wh, consts)
            del xa, xb
            s = self._reduce("sum", m, (0, 1, 2, 3), False)
            total = s if total is None else self._binary("add", total, s)
            del m, s
        y = self._binary("div", total, float(planes * oh * ow))
        return self._out(y, kind, like)

    def _ssim_map(self, a, b, wv, wh, consts):
        """The ssim map (k, 1, h - ws + 1, w - ws + 1) of k single-channel planes (k, 1, h, w)."""
        k, _, h, w = self._shape(a)
        # stack x, y, x*x, y*y, x*y on the channel dim and blur all 5 channels at once
        stack = self._concat_channels([a, b, self._binary("mul", a, a), self._binary("mul", b, b),
                                       self._binary("mul", a, b)], k, 1, h, w)
        blur = self._conv2d(stack, wv, None, (1, 1), (0, 0, 0, 0), (1, 1), 5)
        del stack
        blur = self._conv2d(blur, wh, None, (1, 1), (0, 0, 0, 0), (1, 1), 5)
        oh, ow = self._shape(blur)[2:]
        mu_x, mu_y, exx, eyy, exy = [self._reshape(self._slice1(blur, i), (k, 1, oh, ow)) for i in range(5)]
        del blur
        c1, c2 = consts
        mu_xy = self._binary("mul", mu_x, mu_y)
        mu_xx = self._binary("mul", mu_x, mu_x)
        mu_yy = self._binary("mul", mu_y, mu_y)
        del mu_x, mu_y
        s_xy = self._binary("sub", exy, mu_xy)
        s_xx = self._binary("sub", exx, mu_xx)
        s_yy = self._binary("sub", eyy, mu_yy)
        del exx, eyy, exy
        num = self._binary("mul", self._binary("add", self._binary("mul", mu_xy, 2.0), c1),
                           self._binary("add", self._binary("mul", s_xy, 2.0), c2))
        del mu_xy, s_xy
        den = self._binary("mul", self._binary("add", self._binary("add", mu_xx, mu_yy), c1),
                           self._binary("add", self._binary("add", s_xx, s_yy), c2))
        del mu_xx, mu_yy, s_xx, s_yy
        return self._binary("div", num, den)

    def _piece(self, x, i0, i1, j0, j1, r0, r1):
        """x[i0:i1, j0:j1, r0:r1] of a 4-D array, where the rows and channels not taken make it one
        contiguous span of a contiguous x (ssim's chunks; a view where the backend has them)."""
        return x[i0:i1, j0:j1, r0:r1]

    def loss(self, name: str, input, target, **params):
        """Dispatch by name: mse, l1, smooth_l1, huber, bce, psnr, ssim."""
        table = {"mse": self.mse_loss, "l1": self.l1_loss, "smooth_l1": self.smooth_l1_loss,
                 "huber": self.huber_loss, "bce": self.binary_cross_entropy, "psnr": self.psnr,
                 "ssim": self.ssim}
        known("loss", "name", name, LOSSES, "loss")
        return table[name](input, target, **params)
