"""Linear and conv2d with a packed quantized weight, as torch custom ops (namespace ``anydevice``):

    torch.ops.anydevice.quant_linear(x, data, scale, bias, fmt, shape)
    torch.ops.anydevice.quant_conv2d(x, data, scale, bias, fmt, shape, stride, padding, dilation, groups)

``data`` is the weight's packed bytes (a uint8 tensor, ops/quant.py's layout for ``fmt``: a GGUF file's
blocks as they are), ``scale`` the float32 row scales of the scaled formats (int8, fp8; None for the
GGUF blocks), ``shape`` the weight's logical shape. A model whose layers call these ops keeps its
weights packed in memory:

* eagerly (any torch device, CUDA included) the op dequantizes the weight with torch ops
  (:func:`dequantize`, a port of ``quant.dequantize``), in float32, then runs F.linear / F.conv2d in
  x's dtype: the weight is a float tensor only for that one op (as ComfyUI-GGUF's layers do);
* compiled (``torch.compile(backend="anydevice")`` / ``compile_module``) the op is one node of the ATen
  graph, lowered to ``be.linear`` / ``be.conv2d`` with the packed weight: its bytes become a ``QTensor``
  (a zero-copy view of the host tensor) kept by the ``Weights`` cache (``Weights.packed``: by tensor
  identity and version) in the device's packed form (``be.to_device_quant``); the uint8 tensor is never
  uploaded as float. ``Lowered`` hands these tensors to the lowering as :class:`HostRef` (``packed_nodes``).

``register()`` defines the ops (once) and adds their lowerings to ``aten_ops.LOWERINGS``.
"""
from __future__ import annotations

import math

from ..ops import quant
from ..system.errors import AnyDeviceError

NAMESPACE = "anydevice"
#: op name -> the argument indices of the packed weight's tensors (data, scale)
PACKED_SLOTS = {"quant_linear": (1, 2), "quant_conv2d": (1, 2)}
_registered = []


def _torch():
    import torch
    return torch


# ---- dequantizing with torch ops (any device) -------------------------------------------------
def _check(op, data, scale, fmt, shape):
    f = quant.FORMATS.get(fmt)
    if f is None:
        raise AnyDeviceError(op, "fmt", fmt, f"is not one of {', '.join(quant.FORMATS)}")
    numel = math.prod(int(s) for s in shape)
    if numel % f.block or data.numel() != f.nbytes(numel):
        raise AnyDeviceError(op, "data", f"{data.numel()} bytes",
                             f"{fmt} weight of shape {tuple(shape)} needs {f.nbytes(numel)} bytes")
    if f.scaled and (scale is None or scale.numel() == 0 or numel % scale.numel()):
        raise AnyDeviceError(op, "scale", None if scale is None else f"{scale.numel()} values",
                             f"{fmt} needs one float32 scale per row of the weight {tuple(shape)}")
    return f, numel


def dequantize(data, scale, fmt: str, shape, op: str = "dequantize"):
    """The float32 values (a tensor on ``data``'s device) of a packed weight: ``quant.dequantize`` in
    torch ops, value for value."""
    torch = _torch()
    f, numel = _check(op, data, scale, fmt, shape)
    data = data.reshape(-1).contiguous()
    if data.dtype != torch.uint8:
        raise AnyDeviceError(op, "data", str(data.dtype), "must be a uint8 tensor of the packed bytes")
    if f.scaled:
        if fmt == "int8":
            v = data.view(torch.int8).float()
        else:
            v = data.view(getattr(torch, fmt)).float()
        s = scale.reshape(-1).float()
        return (v.reshape(s.numel(), -1) * s[:, None]).reshape(tuple(shape))
    b = data.reshape(-1, f.block_bytes)
    d = b[:, 0:2].contiguous().view(torch.float16).float()
    if fmt == "q8_0":
        out = d * b[:, 2:].contiguous().view(torch.int8).float()
    else:
        qs = b[:, -16:]
        q = torch.cat([qs & 15, qs >> 4], dim=1)
        if fmt in ("q5_0", "q5_1"):
            at = 2 if fmt == "q5_0" else 4
            qh = b[:, at:at + 4]  # little-endian u32: bit i is bit i % 8 of byte i // 8
            bits = torch.arange(8, device=data.device, dtype=torch.uint8)
            hi = ((qh[:, :, None] >> bits) & 1).reshape(-1, 32)
            q = q | (hi << 4)
        q = q.float()
        if fmt == "q4_0":
            out = d * (q - 8)
        elif fmt == "q5_0":
            out = d * (q - 16)
        else:  # q4_1 / q5_1: d * q + m
            out = d * q + b[:, 2:4].contiguous().view(torch.float16).float()
    return out.reshape(tuple(shape))


# ---- the ops ----------------------------------------------------------------------------------
def _conv_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def register() -> None:
    """Define ``anydevice::quant_linear`` / ``anydevice::quant_conv2d`` and their lowerings (once)."""
    if _registered:
        return
    torch = _torch()
    F = torch.nn.functional

    @torch.library.custom_op(f"{NAMESPACE}::quant_linear", mutates_args=(), schema=(
        "(Tensor x, Tensor data, Tensor? scale, Tensor? bias, str fmt, int[] shape) -> Tensor"))
    def quant_linear(x, data, scale, bias, fmt, shape):
        w = dequantize(data, scale, fmt, shape, op="quant_linear").to(x.dtype)
        return F.linear(x, w, None if bias is None else bias.to(x.dtype))

    @quant_linear.register_fake
    def _(x, data, scale, bias, fmt, shape):
        return x.new_empty((*x.shape[:-1], shape[0]))

    @torch.library.custom_op(f"{NAMESPACE}::quant_conv2d", mutates_args=(), schema=(
        "(Tensor x, Tensor data, Tensor? scale, Tensor? bias, str fmt, int[] shape, int[] stride, "
        "int[] padding, int[] dilation, int groups) -> Tensor"))
    def quant_conv2d(x, data, scale, bias, fmt, shape, stride, padding, dilation, groups):
        w = dequantize(data, scale, fmt, shape, op="quant_conv2d").to(x.dtype)
        return F.conv2d(x, w, None if bias is None else bias.to(x.dtype), stride, padding, dilation, groups)

    @quant_conv2d.register_fake
    def _(x, data, scale, bias, fmt, shape, stride, padding, dilation, groups):
        hw = [_conv_out(x.shape[-2 + i], shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
        return x.new_empty((*x.shape[:-3], shape[0], *hw))

    def setup(ctx, inputs, output):
        x, data, scale, bias = inputs[:4]
        ctx.save_for_backward(data, scale)
        ctx.rest, ctx.x_shape, ctx.x_dtype, ctx.has_bias = inputs[4:], x.shape, x.dtype, bias is not None

    def linear_backward(ctx, g):  # the packed weight is a constant: gradients for x and bias only
        data, scale = ctx.saved_tensors
        fmt, shape = ctx.rest
        w = dequantize(data, scale, fmt, shape, op="quant_linear").to(g.dtype)
        gb = g.reshape(-1, g.shape[-1]).sum(0) if ctx.has_bias else None
        return g @ w, None, None, gb, None, None

    def conv2d_backward(ctx, g):
        data, scale = ctx.saved_tensors
        fmt, shape, stride, padding, dilation, groups = ctx.rest
        w = dequantize(data, scale, fmt, shape, op="quant_conv2d").to(g.dtype)
        gx = torch.nn.grad.conv2d_input(ctx.x_shape, w, g, stride, padding, dilation, groups)
        gb = g.sum((0, 2, 3)) if ctx.has_bias else None
        return gx, None, None, gb, None, None, None, None, None, None

    quant_linear.register_autograd(linear_backward, setup_context=setup)
    quant_conv2d.register_autograd(conv2d_backward, setup_context=setup)

    from . import aten_ops
    aten_ops.LOWERINGS[torch.ops.anydevice.quant_linear.default] = _lower_linear
    aten_ops.LOWERINGS[torch.ops.anydevice.quant_conv2d.default] = _lower_conv2d
    _registered.append(True)


# ---- lowering -----------------------------------------------------------------------------------
class HostRef:
    """A packed weight's host tensor handed to a lowering as it is (not uploaded): ``t`` and its
    version key (None: not a weight, converted for this call only)."""
    __slots__ = ("t", "vkey")

    def __init__(self, t, vkey=None):
        self.t, self.vkey = t, vkey


def packed_nodes(nodes, kind: dict) -> set:
    """The graph's nodes that only these ops read, as their packed weight's data / scale: handed to the
    lowering as ``HostRef`` (``Lowered``'s ``dev``), never uploaded as float arrays."""
    out = set()
    for n in nodes:
        if kind.get(n) not in ("static", "const", "input") or not n.users:
            continue
        ok = True
        for u in n.users:
            name = getattr(getattr(u.target, "_schema", None), "name", "")
            slots = PACKED_SLOTS.get(name.split("::")[-1]) if name.startswith(f"{NAMESPACE}::") else None
            if slots is None or kind.get(u) != "lower" or u.kwargs or \
                    any(a is n for i, a in enumerate(u.args) if i not in slots):
                ok = False
                break
        if ok:
            out.add(n)
    return out


def _host_array(t):
    """A host tensor's values as NumPy (a view where it is a CPU tensor)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().numpy()


def qtensor(data, scale, fmt: str, shape, op: str = "anydevice compile") -> "quant.QTensor":
    """The packed weight's QTensor: a view of the tensor's bytes (copied only off the CPU)."""
    f, numel = _check(op, data, scale, fmt, shape)
    if not f.scaled:
        return quant.QTensor(fmt, shape, _host_array(data))
    return quant.QTensor(fmt, shape, _host_array(data), _host_array(scale.float()), rowlen=numel // scale.numel())


def _packed(cx, data, scale, fmt, shape):
    from .aten_ops import Unsupported
    if not isinstance(data, HostRef) or (scale is not None and not isinstance(scale, HostRef)):
        raise Unsupported("the packed weight is not a host tensor the graph only reads as this op's weight")
    st = None if scale is None else scale.t
    if data.vkey is None:  # not a weight: converted for this call
        return cx.be.to_device_quant(qtensor(data.t, st, fmt, shape))
    vkey = (data.vkey, None if scale is None else scale.vkey, fmt, tuple(int(s) for s in shape))
    return cx.owner.weights.packed(data.t, st, vkey, lambda: qtensor(data.t, st, fmt, shape), cx.owner.count)


def _lower_linear(cx, x, data, scale, bias, fmt, shape):
    return cx.be.linear(x, _packed(cx, data, scale, fmt, shape), bias)


def _lower_conv2d(cx, x, data, scale, bias, fmt, shape, stride, padding, dilation, groups):
    from .aten_ops import Unsupported
    if len(shape) != 4:
        raise Unsupported(f"a conv2d weight of shape {tuple(shape)}")
    w = _packed(cx, data, scale, fmt, shape)
    return cx.be.conv2d(x, w, bias, [int(v) for v in stride], [int(v) for v in padding],
                        [int(v) for v in dilation], int(groups))
