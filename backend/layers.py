"""Layer ops real networks need, as composites of the backend primitives (a mixin of ``Backend``).

Each op is named and called as its ``torch`` / ``torch.nn.functional`` counterpart and follows its
semantics; like every op of the contract (contract.py) it checks its arguments (plans.py) before any
kernel runs, computes in float32 and returns the kind of array its first input was. Built only from
``_reduce`` / ``_binary`` / ``_unary`` / ``_reshape``, so every backend runs them at once; sums
accumulate as the backend's ``_reduce("sum")`` does (float64 on NumPy and OpenCL).

batch_norm is not here: torch's updates running_mean / running_var in place in training mode,
which the contract's rule that no op writes into an input makes a design question.
"""
from __future__ import annotations

import math

import numpy as np

from .plans import (correction_arg, group_norm_shape, norm_eps, normalized_dims, reduce_dims,
                    softmax_dim)


class LayerOps:
    """var, std, log_softmax and the normalisations (layer_norm, group_norm, rms_norm)."""

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
        if math.prod(shape) == 0:
            return self._out(self._binary("add", x, 0.0), kind, like)
        s = self._binary("sub", x, self._reduce("max", x, (d,), True))
        lse = self._unary("log", self._reduce("sum", self._unary("exp", s), (d,), True))
        return self._out(self._binary("sub", s, lse), kind, like)

    # ---- normalisations -------------------------------------------------------------------
    def layer_norm(self, input, normalized_shape, weight=None, bias=None, eps=1e-5):
        """torch.nn.functional.layer_norm over the trailing dims ``normalized_shape`` names."""
        op = "layer_norm"
        eps = norm_eps(op, eps)
        kind, like, x, w, b = self._inputs(op, ("weight", "bias"), input=input, weight=weight, bias=bias)
        dims = normalized_dims(op, self._shape(x), normalized_shape, *self._shapes(w, b))
        self._check_size(op, self._shape(x))
        y = self._normalize(x, dims, eps)
        return self._out(self._affine(y, w, b), kind, like)

    def group_norm(self, input, num_groups, weight=None, bias=None, eps=1e-5):
        """torch.nn.functional.group_norm on (N, C, *): each of num_groups channel groups per sample."""
        op = "group_norm"
        eps = norm_eps(op, eps)
        kind, like, x, w, b = self._inputs(op, ("weight", "bias"), input=input, weight=weight, bias=bias)
        shape = self._shape(x)
        grouped = group_norm_shape(op, shape, num_groups, *self._shapes(w, b))
        self._check_size(op, shape)
        y = self._reshape(self._normalize(self._reshape(x, grouped), (2,), eps), shape)
        per_channel = (shape[1],) + (1,) * (len(shape) - 2)  # weight and bias scale channels
        w = None if w is None else self._reshape(w, per_channel)
        b = None if b is None else self._reshape(b, per_channel)
        return self._out(self._affine(y, w, b), kind, like)

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
        """(x - mean) / sqrt(biased var + eps) over dims (as var, in two passes)."""
        d = self._centered(x, dims)
        var = self._reduce("mean", self._binary("mul", d, d), dims, True)
        return self._binary("mul", d, self._unary("rsqrt", self._binary("add", var, eps)))

    def _affine(self, y, w, b):
        y = y if w is None else self._binary("mul", y, w)
        return y if b is None else self._binary("add", y, b)
