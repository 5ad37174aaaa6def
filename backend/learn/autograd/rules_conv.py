"""Backward rules of linear, matmul, conv2d, conv_transpose2d and pad (tape.py's rule signature).

The convolution and pad gradients are computed by ``backend/ops/convgrad.py`` on the backend's own
primitives (its conv paths, GEMM and window kernels), so they stay on the device."""
from __future__ import annotations

import math

import numpy as np

from ...ops import convgrad
from ...system.errors import AnyDeviceError
from ...ops.plans import CONV_INDEX_MAX, conv2d_plan, conv_transpose2d_plan, pad_plan
from .tape import rule, sum_to


@rule("linear")
def _linear(ctx, gy):
    """y = x @ W.T + b: gx = gy @ W, gW = gy^T x (over every leading dim), gb = sum of gy."""
    be, x, w = ctx.be, ctx["input"], ctx["weight"]
    sx, sw = tuple(be._shape(x)), tuple(be._shape(w))
    out = {}
    rows = math.prod(sx[:-1])
    if len(sw) == 1:  # a vector weight: y = x @ w
        if ctx.needs.get("input"):
            out["input"] = be.mul(be.reshape(gy, tuple(be._shape(gy)) + (1,)), w)
        if ctx.needs.get("weight"):
            out["weight"] = be.reshape(be.matmul(be.reshape(gy, (1, rows)), be.reshape(x, (rows, sx[-1]))), sw)
    else:
        g2 = be.reshape(gy, (rows, sw[0]))
        if ctx.needs.get("input"):
            out["input"] = be.reshape(be.matmul(g2, w), sx)
        if ctx.needs.get("weight"):
            out["weight"] = be.matmul(be.transpose(g2, 0, 1), be.reshape(x, (rows, sx[-1])))
    if ctx.needs.get("bias"):
        out["bias"] = gy  # summed to the bias's shape by the tape
    return out


@rule("matmul")
def _matmul(ctx, gy):
    """torch.matmul: a 1-D operand is a row (input) or a column (other); batch dims broadcast, and
    the gradient of a broadcast operand is summed over them."""
    be, a, b = ctx.be, ctx["input"], ctx["other"]
    sa, sb = tuple(be._shape(a)), tuple(be._shape(b))
    a2 = sa if len(sa) > 1 else (1,) + sa
    b2 = sb if len(sb) > 1 else sb + (1,)
    batch = tuple(int(v) for v in np.broadcast_shapes(a2[:-2], b2[:-2]))
    M, K, N = a2[-2], a2[-1], b2[-1]
    g = be.reshape(gy, batch + (M, N))
    out = {}
    if ctx.needs.get("input"):
        if len(b2) == 2 and batch:  # b shared by every batch: one GEMM over the flattened rows
            ga = be.reshape(be.matmul(be.reshape(g, (-1, N)), be.transpose(be.reshape(b, b2), 0, 1)), batch + (M, K))
        else:
            ga = be.matmul(g, be.transpose(be.reshape(b, b2), -1, -2))
        out["input"] = be.reshape(sum_to(be, ga, a2), sa)
    if ctx.needs.get("other"):
        if len(a2) == 2 and batch:  # a shared: gb = sum over batches of a^T g_b = a^T [g_1 ... g_B]
            gt = be.reshape(be.permute(g, (len(batch),) + tuple(range(len(batch))) + (len(batch) + 1,)),
                            (M, -1))
            gb = be.reshape(be.matmul(be.transpose(be.reshape(a, a2), 0, 1), gt), (K,) + batch + (N,))
            gb = be.permute(gb, tuple(range(1, len(batch) + 1)) + (0, len(batch) + 1))
        elif len(b2) == 2 and batch:  # b 2-D, a batched: sum over batches as one GEMM of the flattened rows
            gb = be.matmul(be.transpose(be.reshape(a, (-1, K)), 0, 1), be.reshape(g, (-1, N)))
        else:
            gb = be.matmul(be.transpose(be.reshape(a, a2), -1, -2), g)
        out["other"] = be.reshape(sum_to(be, gb, b2), sb)
    return out


# ---- convolutions -------------------------------------------------------------------------------
def _forward_plan(ctx):
    """The forward's conv plan (plans.conv2d_plan / conv_transpose2d_plan): the tape hands the plan the
    forward ran by to the rule in ``ctx.extra["plan"]`` (tape.PLANNED), so the backward reads its
    geometry from the same object. Only a ctx made outside the tape (a rule called directly) has none:
    then it is made here, from the arguments and shapes (its size was checked by the forward)."""
    plan = ctx.extra.get("plan")
    if plan is None:
        be, b = ctx.be, ctx["bias"]
        shapes = (tuple(be._shape(ctx["input"])), tuple(be._shape(ctx["weight"])),
                  None if b is None else tuple(be._shape(b)))
        if ctx.op == "conv2d":
            plan = conv2d_plan("conv2d", *shapes, ctx["stride"], ctx["padding"], ctx["dilation"], ctx["groups"],
                               ctx["padding_mode"], size_check=False)
        else:
            plan = conv_transpose2d_plan(ctx.op, *shapes, ctx["stride"], ctx["padding"], ctx["output_padding"],
                                         ctx["groups"], ctx["dilation"], size_check=False)
        ctx.extra["plan"] = plan
    return plan


def _check_reach(op, stride, dilation, pads, hw):
    """The forward reduces geometries past 32-bit indexing (plans.conv_reach); their gradients
    would need the full padded extent: refused, naming the argument."""
    for arg, value in (("stride", stride), ("dilation", dilation), ("padding", pads)):
        if max(value) > CONV_INDEX_MAX // 4 or max(hw) + 2 * max(pads) > CONV_INDEX_MAX // 4:
            raise AnyDeviceError(op, arg, value, "is too large for the backward pass (at most "
                                 f"{CONV_INDEX_MAX // 4} with the input's size)")


def _batched(be, x, gy, sx):
    """An unbatched (C, H, W) input and its gradient as a batch of one; and whether they were."""
    if len(sx) != 3:
        return x, gy, False
    return be._reshape(x, (1,) + sx), be._reshape(gy, (1,) + tuple(be._shape(gy))), True


def _conv_grads(ctx, gy, op, stride, dilation, reach_pads, weight_grad, input_grad):
    """The frame both convolution rules share: the reach check, an unbatched input taken as a batch
    of one, then each gradient asked for. ``weight_grad(x, gy, sw)`` and ``input_grad(gy, w, x4)``
    are the op's own weight and input gradients, on the 4-D tensors."""
    be, x, w = ctx.be, ctx["input"], ctx["weight"]
    sx, sw = tuple(be._shape(x)), tuple(be._shape(w))
    _check_reach(op, stride, dilation, reach_pads, sx[-2:])
    x, gy, unbatched = _batched(be, x, gy, sx)
    x4 = tuple(be._shape(x))
    out = {}
    if ctx.needs.get("weight"):
        out["weight"] = weight_grad(x, gy, sw)
    if ctx.needs.get("input"):
        gx = input_grad(gy, w, x4)
        out["input"] = be._reshape(gx, sx) if unbatched else gx
    if ctx.needs.get("bias"):
        out["bias"] = convgrad.bias_grad(be, gy)
    return out


@rule("conv2d")
def _conv2d(ctx, gy):
    be = ctx.be
    stride, dilation, pads = _forward_plan(ctx).asked  # past _check_reach, what the forward ran with
    groups, mode = ctx["groups"], ctx["padding_mode"]
    padded = mode != "zeros" and any(pads)

    def weight_grad(x, gy, sw):
        if padded:  # the padded copy lives only for this call
            xp = be._pad(x, pads, mode)
            return convgrad.conv2d_weight_grad(be, xp, gy, sw, stride, (0, 0, 0, 0), dilation, groups)
        return convgrad.conv2d_weight_grad(be, x, gy, sw, stride, pads, dilation, groups)

    def input_grad(gy, w, x4):
        if padded:
            hp, wp = x4[2] + pads[0] + pads[1], x4[3] + pads[2] + pads[3]
            gxp = convgrad.conv2d_input_grad(be, gy, w, (hp, wp), stride, (0, 0, 0, 0), dilation, groups)
            return convgrad.pad_backward(be, gxp, x4, pads, mode)
        return convgrad.conv2d_input_grad(be, gy, w, x4[2:], stride, pads, dilation, groups)

    return _conv_grads(ctx, gy, "conv2d", stride, dilation, pads, weight_grad, input_grad)


@rule("conv_transpose2d")
def _conv_transpose2d(ctx, gy):
    be = ctx.be
    plan = _forward_plan(ctx)
    (stride, dilation), padding = plan.asked, plan.padding  # past _check_reach, what the forward ran with
    groups = ctx["groups"]

    def weight_grad(x, gy, sw):
        return convgrad.conv_transpose2d_weight_grad(be, x, gy, sw, stride, padding, dilation, groups)

    def input_grad(gy, w, x4):
        return convgrad.conv_transpose2d_input_grad(be, gy, w, x4[2:], stride, padding, dilation, groups)

    reach_pads = (padding[0], padding[0], padding[1], padding[1])
    return _conv_grads(ctx, gy, "conv_transpose2d", stride, dilation, reach_pads, weight_grad, input_grad)


@rule("pad")
def _pad(ctx, gy):
    be, x = ctx.be, ctx["input"]
    shape = tuple(be._shape(x))
    pads, mode = pad_plan("pad", shape, ctx["pad"], ctx["mode"])
    lead = shape[:-2]
    g4 = be._reshape(gy, (math.prod(lead), 1) + tuple(be._shape(gy))[-2:])
    gx = convgrad.pad_backward(be, g4, shape, pads, mode)
    return {"input": be._reshape(gx, shape)}
