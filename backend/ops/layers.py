"""Layer ops real networks need, as composites of the backend primitives (a mixin of ``Backend``).

Each op is named and called as its ``torch`` / ``torch.nn.functional`` counterpart and follows its
semantics; like every op of the contract (contract.py) it checks its arguments (plans/) before any
kernel runs, computes in float32 and returns the kind of array its first input was. Built only from
``_reduce`` / ``_binary`` / ``_unary`` / ``_reshape``, so every backend runs them at once; sums
accumulate as the backend's ``_reduce("sum")`` does (float64 on NumPy and OpenCL).

batch_norm never writes into running_mean / running_var (torch's does in training mode): with
``return_stats=True`` it returns the updated statistics instead. Class-index targets of the losses
are integers, taken on the host (the contract's device arrays are float32), checked there and
uploaded as float32 indices; the picking happens on the device with a select (where), so an
unpicked class's -Inf never makes 0 * -Inf = NaN.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from ..system.errors import AnyDeviceError
from .plans import (batch_norm_args, check_reduction, class_dim, correction_arg, dropout_args, group_norm_shape,
                    index_targets, label_smoothing_arg, norm_eps, normalized_dims, prob_targets, reduce_dims,
                    softmax_dim)


class LayerOps:
    """var, std, log_softmax, the normalisations (layer_norm, group_norm, rms_norm, batch_norm),
    cross_entropy, nll_loss and dropout."""

    # ---- statistics -----------------------------------------------------------------------
    def var(self, input, dim=None, *, correction=1, keepdim=False):
        """torch.var: sum((x - mean)^2) / max(0, count - correction) over ``dim`` (None: all)."""
        return self._stat("var", input, dim, correction, keepdim)

    def std(self, input, dim=None, *, correction=1, keepdim=False):
        """torch.std: the square root of var."""
        return self._stat("std", input, dim, correction, keepdim)

    def _stat(self, op, input, dim, correction, keepdim):
        correction = correction_arg(op, correction)
        kind, like, x = self._inputs(op, input=input)
        dims = reduce_dims(op, self._shape(x), dim)
        y = self._var(x, dims, correction, bool(keepdim))
        return self._out(self._unary("sqrt", y) if op == "std" else y, kind, like)

    def _centered(self, x, dims):
        """x - mean(x over dims), corrected two-pass (Chan, Golub and LeVeque): d = x - m is exact
        where it cancels, and subtracting mean(d) removes the error of m's rounding to float32,
        which would otherwise shift every d by up to ulp(m) / 2 (2.6e-6 normwise on layer norms
        of 2 close values)."""
        d = self._binary("sub", x, self._reduce("mean", x, dims, True))
        return self._binary("sub", d, self._reduce("mean", d, dims, True))

    def _var(self, x, dims, correction, keepdim):
        d = self._centered(x, dims)
        count = math.prod(self._shape(x)[i] for i in dims)
        # 0 / 0 = NaN and s / 0 = Inf where count <= correction, as torch
        return self._binary("div", self._reduce("sum", self._binary("mul", d, d), dims, keepdim),
                            float(max(count - correction, 0.0)))

    # ---- log_softmax ----------------------------------------------------------------------
    def log_softmax(self, input, dim=-1):
        """torch.nn.functional.log_softmax: x - max - log(sum(exp(x - max))) along ``dim``."""
        op = "log_softmax"
        kind, like, x = self._inputs(op, input=input)
        d = softmax_dim(op, dim, len(self._shape(x)))
        shape = self._shape(x)
        if len(shape) == 0:  # log(softmax) of a 0-d tensor is 0 (NaN and +-Inf give NaN)
            return self._out(self._binary("sub", x, x), kind, like)
        return self._out(self._log_softmax(x, d), kind, like)

    def _log_softmax(self, x, d):
        if math.prod(self._shape(x)) == 0:
            return self._binary("add", x, 0.0)
        s = self._binary("sub", x, self._reduce("max", x, (d,), True))
        lse = self._unary("log", self._reduce("sum", self._unary("exp", s), (d,), True))
        return self._binary("sub", s, lse)

    # ---- normalisations -------------------------------------------------------------------
    def layer_norm(self, input, normalized_shape, weight=None, bias=None, eps=1e-5):
        """torch.nn.functional.layer_norm over the trailing dims ``normalized_shape`` names."""
        op = "layer_norm"
        eps = norm_eps(op, eps)
        kind, like, x, w, b = self._inputs(op, ("weight", "bias"), input=input, weight=weight, bias=bias,
                                           _half=("input", "weight", "bias"), _cap="half_norm")
        dims = normalized_dims(op, self._shape(x), normalized_shape, *self._shapes(w, b))
        self._check_size(op, self._shape(x))
        y = self._norm_affine(x, len(dims), eps, w, b, 1, 1)
        if y is None:
            y = self._affine(self._normalize(x, dims, eps), w, b)
        return self._out(y, kind, like)

    def group_norm(self, input, num_groups, weight=None, bias=None, eps=1e-5):
        """torch.nn.functional.group_norm on (N, C, *): each of num_groups channel groups per sample."""
        return self._group_norm_act(input, num_groups, weight, bias, eps)

    def _group_norm_act(self, input, num_groups, weight=None, bias=None, eps=1e-5, act=None):
        """group_norm, then the activation ``act`` (None or "silu": a compiled graph's GroupNorm + SiLU
        pair), in one pass on a device with "norm_affine" (rounded once), else as the two ops."""
        op = "group_norm"
        eps = norm_eps(op, eps)
        kind, like, x, w, b = self._inputs(op, ("weight", "bias"), input=input, weight=weight, bias=bias,
                                           _half=("input", "weight", "bias"), _cap="half_norm")
        shape = self._shape(x)
        grouped = group_norm_shape(op, shape, num_groups, *self._shapes(w, b))
        self._check_size(op, shape)
        y = self._norm_affine(self._reshape(x, grouped), 1, eps, w, b, num_groups, math.prod(shape[2:]), act)
        if y is not None:
            return self._out(self._reshape(y, shape), kind, like)
        y = self._reshape(self._normalize(self._reshape(x, grouped), (2,), eps), shape)
        per_channel = (shape[1],) + (1,) * (len(shape) - 2)  # weight and bias scale channels
        w = None if w is None else self._reshape(w, per_channel)
        b = None if b is None else self._reshape(b, per_channel)
        y = self._out(self._affine(y, w, b), kind, like)
        return y if act is None else self.unary(act, y)  # the two ops, each rounded as its own op

    def rms_norm(self, input, normalized_shape, weight=None, eps=None):
        """torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) * weight; eps None is float32's
        machine epsilon (torch: that of the input's dtype; the pack computes in float32)."""
        op = "rms_norm"
        eps = norm_eps(op, eps, float(np.finfo(np.float32).eps))
        kind, like, x, w = self._inputs(op, ("weight", "bias"), input=input, weight=weight)
        dims = normalized_dims(op, self._shape(x), normalized_shape, *self._shapes(w))
        self._check_size(op, self._shape(x))
        ms = self._reduce("mean", self._binary("mul", x, x), dims, True)
        y = self._binary("mul", x, self._unary("rsqrt", self._binary("add", ms, eps)))
        return self._out(self._affine(y, w, None), kind, like)

    def _shapes(self, *arrays):
        return tuple(None if a is None else self._shape(a) for a in arrays)

    def _normalize(self, x, dims, eps):
        """(x - mean) / sqrt(biased var + eps) over dims (as var, in two passes). Trailing dims go
        to the backend's fused ``_norm_rows`` where it has one (None: this composite)."""
        shape = self._shape(x)
        k = len(shape) - len(dims)
        if tuple(dims) == tuple(range(k, len(shape))) and math.prod(shape):
            rows, n = math.prod(shape[:k]), math.prod(shape[k:])
            y = self._norm_rows(self._reshape(x, (rows, n)), eps)
            if y is not None:
                return self._reshape(y, shape)
        if self._dtype(x) != "float32":  # a half input ("half_norm") the fused kernel did not take
            x = self._cast(x, "float32")
        d = self._centered(x, dims)
        var = self._reduce("mean", self._binary("mul", d, d), dims, True)
        return self._binary("mul", d, self._unary("rsqrt", self._binary("add", var, eps)))

    def _norm_affine(self, x, ndims, eps, w, b, groups, inner, act=None):
        """``x`` normalised over its last ``ndims`` dims (as ``_normalize``) and the norm's affine applied
        (w, b per channel: see Device._norm_rows_affine for ``groups`` and ``inner``), then ``act``, in one
        pass on a device with "norm_affine"; None where it has none or declines (the caller composes)."""
        if "norm_affine" not in self.caps.fused or (w is None and b is None and act is None):
            return None
        shape = self._shape(x)
        k = len(shape) - ndims
        rows, n = math.prod(shape[:k]), math.prod(shape[k:])
        if rows * n == 0:
            return None
        flat = [None if v is None else self._reshape(v, (math.prod(self._shape(v)),)) for v in (w, b)]
        y = self._norm_rows_affine(self._reshape(x, (rows, n)), eps, *flat, groups, inner, act)
        return None if y is None else self._reshape(y, shape)

    def _norm_rows(self, x, eps):
        """Each row of the contiguous (rows, n) ``x`` normalised as ``_normalize``'s composite, in
        one fused pass, float32; None where the backend has no such kernel (the composite runs). A device
        with "half_norm" takes a half ``x`` as it is stored."""
        return None

    def _prelu(self, x, w):
        """torch's prelu of native arrays: where(x > 0, x, x * w), ``w`` one slope or one per channel (dim 1);
        in one pass on a device with "prelu", else the three ops."""
        s, nw = self._shape(x), math.prod(self._shape(w))
        C = s[1] if len(s) >= 2 else 1
        if "prelu" in self.caps.fused and nw in (1, C) and math.prod(s) and self._dtype(x) == self._dtype(w):
            y = self._prelu_fused(x, self._reshape(w, (nw,)), nw, math.prod(s[2:]))
            if y is not None:
                return y
        if nw != 1 and len(s) >= 2:
            w = self.reshape(w, (C,) + (1,) * (len(s) - 2))
        return self.where(self.gt(x, 0.0), x, self.mul(x, w))

    def _affine(self, y, w, b):
        y = y if w is None else self._binary("mul", y, w)
        return y if b is None else self._binary("add", y, b)

    # ---- batch_norm -----------------------------------------------------------------------
    def batch_norm(self, input, running_mean, running_var, weight=None, bias=None, training=False,
                   momentum=0.1, eps=1e-5, *, return_stats=False):
        """torch.nn.functional.batch_norm on (N, C, *). training: the batch's statistics over every
        dim but C (biased variance); else running_mean / running_var.

        Deviation: torch updates running_mean / running_var in place in training mode; here no op
        writes into an input. ``return_stats=True`` returns ``(y, new_running_mean,
        new_running_var)`` with torch's update rule (new = (1 - momentum) * old + momentum * batch
        statistic, the variance unbiased); in evaluation mode, or for None running stats, those
        are copies of the inputs (or None)."""
        op = "batch_norm"
        kind, like, x, rm, rv, w, b = self._inputs(op, ("running_mean", "running_var", "weight", "bias"),
                                                    input=input, running_mean=running_mean,
                                                    running_var=running_var, weight=weight, bias=bias)
        shape = self._shape(x)
        momentum, eps = batch_norm_args(op, shape, *self._shapes(rm, rv, w, b), bool(training), momentum, eps)
        self._check_size(op, shape)
        per = (shape[1],) + (1,) * (len(shape) - 2)
        col = (lambda v: None if v is None else self._reshape(v, per))
        fused = self._batch_norm_fused(shape, x, w, b, rm if return_stats else None, rv if return_stats else None,
                                       momentum, eps) \
            if training else None
        if fused is not None:
            y, rm, rv = fused
            if not return_stats:
                return self._out(y, kind, like)
            return tuple(None if v is None else self._out(v, kind, like) for v in (y, rm, rv))
        if training:
            dims = (0,) + tuple(range(2, len(shape)))
            m = self._reduce("mean", x, dims, True)
            d0 = self._binary("sub", x, m)
            c = self._reduce("mean", d0, dims, True)   # corrected two-pass, as _centered
            d = self._binary("sub", d0, c)
            var = self._reduce("mean", self._binary("mul", d, d), dims, True)
            y = self._binary("mul", d, self._unary("rsqrt", self._binary("add", var, eps)))
        else:
            y = self._binary("mul", self._binary("sub", x, col(rm)),
                             self._unary("rsqrt", self._binary("add", col(rv), eps)))
        y = self._affine(y, col(w), col(b))
        if not return_stats:
            return self._out(y, kind, like)
        if training and rm is not None:
            count = shape[0] * math.prod(shape[2:])
            mean = self._reshape(self._binary("add", m, c), (shape[1],))
            unbiased = self._binary("mul", self._reshape(var, (shape[1],)), count / max(count - 1, 1))
            rm = self._binary("add", self._binary("mul", rm, 1.0 - momentum), self._binary("mul", mean, momentum))
            rv = self._binary("add", self._binary("mul", rv, 1.0 - momentum),
                              self._binary("mul", unbiased, momentum))
        else:
            rm = None if rm is None else self._binary("mul", rm, 1.0)  # copies: never an input
            rv = None if rv is None else self._binary("mul", rv, 1.0)
        return tuple(None if v is None else self._out(v, kind, like) for v in (y, rm, rv))

    def _batch_norm_fused(self, shape, x, w, b, rm, rv, momentum, eps):
        """batch_norm in training mode in one pass on a device with "batch_norm": (y, new rm, new rv), the
        last two None without rm (or rv); None where the device has none or declines (the composite runs)."""
        if "batch_norm" not in self.caps.fused or not math.prod(shape) or (rm is None) != (rv is None):
            return None
        N, C, L = shape[0], shape[1], math.prod(shape[2:])
        r = self._batch_norm_train(self._reshape(x, (N, C, L)), w, b, rm, rv, momentum, eps)
        if r is None:
            return None
        y, rm, rv = r
        return self._reshape(y, shape), rm, rv

    def _cross_entropy_fused(self, x, t, cd, ignore_index, reduction):
        """cross_entropy of class indices ``t`` (host int64), no class weights or smoothing, in one pass on a
        device with "cross_entropy" (then a sum for "sum" and "mean": the mean divides by the number of
        targets not ignored, as torch's); None where the device has none or declines."""
        shape = self._shape(x)
        if "cross_entropy" not in self.caps.fused or not math.prod(shape):
            return None
        N, C, L = math.prod(shape[:cd]), shape[cd], math.prod(shape[cd + 1:])
        loss = self._cross_entropy_rows(self._reshape(x, (N, C, L)), np.asarray(t).reshape(-1), ignore_index)
        if loss is None or reduction == "none":
            return loss if loss is None else self._reshape(loss, shape[:cd] + shape[cd + 1:])
        total = self._reduce("sum", loss, (0,), False)
        if reduction == "sum":
            return total
        return self._binary("div", total, float(np.count_nonzero(np.asarray(t) != ignore_index)))

    # ---- dropout --------------------------------------------------------------------------
    def dropout(self, input, p=0.5, training=True, inplace=False, *, seed=None):
        """torch.nn.functional.dropout: in training, each element is zeroed with probability p
        and the rest scaled by 1 / (1 - p) (x * noise, as torch: a dropped Inf gives NaN).

        The mask is drawn on the host with ``numpy.random.default_rng(seed)`` and uploaded: the
        same seed gives the same mask (not torch's random stream); seed None draws a fresh one.
        inplace=True is refused (no op writes into an input). Not training: a copy of the input."""
        op = "dropout"
        p = dropout_args(op, p, training, inplace, seed)
        kind, like, x = self._inputs(op, input=input)
        shape = self._shape(x)
        self._check_size(op, shape)
        if not training or p == 0.0:
            return self._out(self._binary("mul", x, 1.0), kind, like)
        keep = np.random.default_rng(seed).random(shape) >= p
        noise = keep.astype(np.float32) / np.float32(1.0 - p) if p < 1.0 else np.zeros(shape, np.float32)
        return self._out(self._binary("mul", x, self.to_device(noise, op, "mask")), kind, like)

    # ---- cross_entropy / nll_loss ---------------------------------------------------------
    def _class_indices(self, op, target):
        """Integer class indices on the host (int64), or None for a float target (probabilities)."""
        from .kinds import _is_torch_tensor
        if _is_torch_tensor(target):
            if target.is_floating_point() or target.is_complex():
                return None
            if target.dtype is sys.modules["torch"].bool:
                raise AnyDeviceError(op, "target", target, "must hold integer class indices or float probabilities")
            self._count("downloads", target.element_size() * target.numel(), target.device.type != "cpu")
            return target.detach().to("cpu").numpy().astype(np.int64)
        if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
            return np.asarray(target, dtype=np.int64)
        a = target if isinstance(target, (np.ndarray, list, tuple)) else None
        if a is None and isinstance(target, self.native_types):
            dt = getattr(target, "dtype", np.float32)
            if np.dtype(dt).kind not in "iu":
                return None
            self._count("downloads", np.dtype(dt).itemsize * math.prod(self._shape(target)))
            return np.asarray(self._to_numpy(target)).astype(np.int64)
        if a is None:
            return None  # to_device names the bad type
        a = np.asarray(a)
        if a.dtype.kind in "iu":
            return a.astype(np.int64, copy=False)  # (read only: an int64 batch stays itself, so a recorded
            # upload of it is bound to the batch, devices/opencl/replay.py)
        if a.dtype.kind == "b":
            raise AnyDeviceError(op, "target", a, "must hold integer class indices or float probabilities")
        return None

    def _pick(self, op, x, t, cd, ignore_index, w):
        """(picked, wpos): x at each target's class (0 where ignored) and that class's weight
        (1 without weights; 0 where ignored), both of the target's shape, picked by a select."""
        shape = self._shape(x)
        C = shape[cd]
        valid = t != ignore_index
        tf = np.where(valid, t, -1).astype(np.float32)           # -1: no class matches
        td = self.to_device(tf.reshape(shape[:cd] + (1,) + shape[cd + 1:]), op, "target")
        classes = (C,) + (1,) * (len(shape) - cd - 1)
        iota = self.to_device(np.arange(C, dtype=np.float32).reshape(classes), op, "classes", constant=True)
        mask = self._binary("eq", td, iota)
        zero = self.to_device(np.zeros((), np.float32), op, "zero", constant=True)
        picked = self._reduce("sum", self._where(mask, x, zero), (cd,), False)
        if w is None:
            wpos = self.to_device(valid.astype(np.float32), op, "target")
        else:
            wpos = self._reduce("sum", self._where(mask, self._reshape(w, classes), zero), (cd,), False)
        return picked, wpos

    def _neg(self, x):
        """-x as x * -1 (exact; keeps 0-d results arrays on every backend)."""
        return self._binary("mul", x, -1.0)

    def _all(self, x):
        return self._reduce("sum", x, tuple(range(len(self._shape(x)))), False)

    def nll_loss(self, input, target, weight=None, ignore_index=-100, reduction="mean"):
        """torch.nn.functional.nll_loss: -weight[t] * input[n, t] per target (0 where t is
        ignore_index); mean divides by the sum of the targets' weights. input (C), (N, C) or
        (N, C, d1, ...); target integer class indices of shape (), (N) or (N, d1, ...)."""
        op = "nll_loss"
        check_reduction(op, reduction)
        t = self._class_indices(op, target)
        if t is None:
            raise AnyDeviceError(op, "target", target, "must hold integer class indices")
        kind, like, x, w = self._inputs(op, ("weight",), input=input, weight=weight)
        shape = self._shape(x)
        cd = class_dim(op, shape)
        index_targets(op, shape, t, ignore_index, *self._shapes(w))
        picked, wpos = self._pick(op, x, t, cd, int(ignore_index), w)
        loss = self._neg(self._binary("mul", wpos, picked))
        if reduction == "mean":
            loss = self._binary("div", self._all(loss), self._all(wpos))
        elif reduction == "sum":
            loss = self._all(loss)
        return self._out(loss, kind, like)

    def cross_entropy(self, input, target, weight=None, ignore_index=-100, reduction="mean",
                      label_smoothing=0.0):
        """torch.nn.functional.cross_entropy: log_softmax over the class dim (0 for an unbatched
        (C) input, else 1), then nll_loss for integer class-index targets, or
        -sum(weight * target * log_softmax) over the classes for float class-probability targets
        (the input's shape; mean divides by the number of positions). label_smoothing as torch."""
        op = "cross_entropy"
        check_reduction(op, reduction)
        eps = label_smoothing_arg(op, label_smoothing)
        t = self._class_indices(op, target)
        if t is None:
            kind, like, x, tp, w = self._inputs(op, ("weight",), input=input, target=target, weight=weight)
            shape = self._shape(x)
            prob_targets(op, shape, self._shape(tp), *self._shapes(w))
        else:
            kind, like, x, w = self._inputs(op, ("weight",), input=input, weight=weight)
            shape = self._shape(x)
            index_targets(op, shape, t, ignore_index, *self._shapes(w))
        cd = class_dim(op, shape)
        C = shape[cd]
        self._check_size(op, shape)
        if t is not None and w is None and eps == 0:
            loss = self._cross_entropy_fused(x, t, cd, int(ignore_index), reduction)
            if loss is not None:
                return self._out(loss, kind, like)
        logp = self._log_softmax(x, cd)
        classes = (C,) + (1,) * (len(shape) - cd - 1)
        if t is None:
            if eps > 0:
                tp = self._binary("add", self._binary("mul", tp, 1.0 - eps), eps / C)
            prod = self._binary("mul", logp, tp)
            if w is not None:
                prod = self._binary("mul", prod, self._reshape(w, classes))
            loss = self._neg(self._reduce("sum", prod, (cd,), False))
            if reduction == "mean":
                loss = self._binary("div", self._all(loss), float(math.prod(shape) // C if C else 0))
            elif reduction == "sum":
                loss = self._all(loss)
            return self._out(loss, kind, like)
        picked, wpos = self._pick(op, logp, t, cd, int(ignore_index), w)
        loss = self._neg(self._binary("mul", wpos, picked))
        if eps > 0:
            sm = logp if w is None else self._binary("mul", logp, self._reshape(w, classes))
            smooth = self._neg(self._reduce("sum", sm, (cd,), False))
            valid = self.to_device((t != int(ignore_index)).astype(np.float32), op, "target")
            zero = self.to_device(np.zeros((), np.float32), op, "zero", constant=True)
            smooth = self._where(valid, smooth, zero)
        if reduction != "none":
            loss = self._all(loss)
            smooth = self._all(smooth) if eps > 0 else None
            if reduction == "mean":
                den = self._all(wpos)
                loss = self._binary("div", loss, den)
                smooth = self._binary("div", smooth, den) if eps > 0 else None
        if eps > 0:
            loss = self._binary("add", self._binary("mul", loss, 1.0 - eps), self._binary("mul", smooth, eps / C))
        return self._out(loss, kind, like)
