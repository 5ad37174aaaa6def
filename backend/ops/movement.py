"""Data movement and selection as device ops (a mixin of ``Backend``): reshape/view, permute,
transpose, expand/broadcast_to, narrow, slicing with steps, cat, stack, split, chunk, contiguous;
where and the comparisons. No op goes through the host.

Views: reshape/view, permute, transpose, expand, broadcast_to, narrow, slice, split, chunk and
contiguous (of a contiguous input) return views of a float32 input where the backend's layout
allows it (NumPy, PyTorch and CuPy arrays always; OpenCL's contiguous ``CLArray`` for reshape and
for slices that are one contiguous run, at an offset; other OpenCL layouts are copied on the
device). An input converted to float32 (another dtype, a host array for a device backend) is never
aliased. cat, stack, where and the comparisons always return new arrays.

Comparisons return float32 1.0 / 0.0 (torch returns bool; the contract is float32-only); NaN
compares as in torch (only ``ne`` is true). ``where`` treats a nonzero (or NaN) condition as true
and selects, so the unselected side's Inf / NaN never reach the result.
"""
from __future__ import annotations

import numpy as np

from ..system.errors import AnyDeviceError
from . import dtypes
from .kinds import Kind, _kind
from .plans import (COMPARE_OPS, broadcast_shapes, is_scalar, cat_plan, chunk_sizes, expand_shape, known, narrow_args,
                    one_dim, permute_dims, slice_args, split_sizes, stack_plan, view_shape, _tensor_list)


def pair_method(family: str, op: str):
    """The method ``op(self, input, other)`` that is ``self.<family>(op, input, other)``: e.g.
    ``be.eq(a, b)`` is ``be.compare("eq", a, b)``, ``be.add(a, b)`` is ``be.binary("add", a, b)``."""
    def method(self, input, other):
        return getattr(self, family)(op, input, other)
    method.__name__ = method.__qualname__ = op
    method.__doc__ = f"``{family}('{op}', input, other)``."
    return method


class MovementOps:
    """Data movement and selection (torch names, arguments and defaults)."""

    # primitives: _slice, _cat, _where, _contiguous (devices/interface.py)

    def _moved(self, op, **arrays):
        """``_inputs`` of a movement op: a half native of the result dtype stays as stored where the device
        moves half values unchanged ("half_movement")."""
        return self._inputs(op, _half=tuple(arrays), _cap="half_movement", **arrays)

    # ---- shape -----------------------------------------------------------------------------
    def reshape(self, input, shape):
        """torch.reshape: one dim may be -1 (inferred). A view where the layout allows it."""
        op = "reshape"
        kind, like, x = self._inputs(op, input=input, _stored=("input",))  # half stays half: a new shape only
        new = view_shape(op, self._shape(x), shape)
        return self._out(self._reshape(x, new), kind, like)

    def view(self, input, *shape):
        """Tensor.view, as reshape (``view(x, 2, 3)`` or ``view(x, (2, 3))``); where torch's view
        refuses a layout it cannot view, this copies, as reshape."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        kind, like, x = self._inputs("view", input=input, _stored=("input",))
        new = view_shape("view", self._shape(x), shape)
        return self._out(self._reshape(x, new), kind, like)

    def permute(self, input, dims):
        """torch.permute (a view; OpenCL: a copy)."""
        op = "permute"
        kind, like, x = self._moved(op, input=input)
        axes = permute_dims(op, len(self._shape(x)), dims)
        return self._out(self._permute(x, axes) if axes else x, kind, like)

    def transpose(self, input, dim0, dim1):
        """torch.transpose: swap two dims (a view; OpenCL: a copy)."""
        op = "transpose"
        kind, like, x = self._moved(op, input=input)
        nd = len(self._shape(x))
        d0, d1 = one_dim(op, nd, dim0, "dim0"), one_dim(op, nd, dim1, "dim1")
        axes = list(range(nd))
        if not nd:
            return self._out(x, kind, like)
        axes[d0], axes[d1] = axes[d1], axes[d0]
        return self._out(self._permute(x, tuple(axes)), kind, like)

    def expand(self, input, *sizes):
        """Tensor.expand: size-1 dims repeated, -1 keeps a dim, new dims in front
        (``expand(x, 2, 3)`` or ``expand(x, (2, 3))``). A view (OpenCL: materialised)."""
        if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer)):
            sizes = sizes[0]
        return self._expand_op("expand", input, sizes)

    def broadcast_to(self, input, size):
        """torch.broadcast_to, as expand."""
        return self._expand_op("broadcast_to", input, size)

    def _expand_op(self, op, input, sizes):
        kind, like, x = self._moved(op, input=input)
        shape = expand_shape(op, self._shape(x), sizes)
        self._check_size(op, shape)
        y = x if shape == tuple(self._shape(x)) else self._expand(x, shape)
        return self._out(y, kind, like)

    def contiguous(self, input):
        """Tensor.contiguous: the input in C order (itself when it already is, as torch)."""
        kind, like, x = self._moved("contiguous", input=input)
        return self._out(self._contiguous(x), kind, like)

    # ---- slicing ---------------------------------------------------------------------------
    def narrow(self, input, dim, start, length):
        """torch.narrow: ``length`` elements from ``start`` (negative counts from the end) along dim."""
        op = "narrow"
        kind, like, x = self._moved(op, input=input)
        d, start, length = narrow_args(op, self._shape(x), dim, start, length)
        return self._out(self._slice(x, d, start, length, 1), kind, like)

    def slice(self, input, dim=0, start=None, stop=None, step=1):
        """x[..., start:stop:step] along ``dim`` (Python's clamping of start and stop; step >= 1,
        as torch, which refuses steps <= 0)."""
        op = "slice"
        kind, like, x = self._moved(op, input=input)
        d, s, n, st = slice_args(op, self._shape(x), dim, start, stop, step)
        return self._out(self._slice(x, d, s, n, st), kind, like)

    def split(self, tensor, split_size_or_sections, dim=0):
        """torch.split: a tuple of views of parts of ``split_size`` (the last smaller) or of the
        listed sizes along dim."""
        kind, like, x = self._moved("split", tensor=tensor)
        d, sizes = split_sizes("split", self._shape(x), split_size_or_sections, dim)
        return self._parts(x, d, sizes, kind, like)

    def chunk(self, input, chunks, dim=0):
        """torch.chunk: up to ``chunks`` views of ceil(n / chunks) elements along dim."""
        kind, like, x = self._moved("chunk", input=input)
        d, sizes = chunk_sizes("chunk", self._shape(x), chunks, dim)
        return self._parts(x, d, sizes, kind, like)

    def _parts(self, x, d, sizes, kind, like):
        out, start = [], 0
        for n in sizes:
            out.append(self._out(self._slice(x, d, start, n, 1), kind, like))
            start += n
        return tuple(out)

    # ---- joining ---------------------------------------------------------------------------
    def _list_inputs(self, op, tensors):
        _tensor_list(op, "tensors", tensors)
        kind, like, *xs = self._moved(op, **{f"tensors[{i}]": t for i, t in enumerate(tensors)})
        return kind, like, xs

    def cat(self, tensors, dim=0):
        """torch.cat: along an existing dim; 1-D empty tensors are skipped as torch does."""
        op = "cat"
        kind, like, xs = self._list_inputs(op, tensors)
        d, shape, keep = cat_plan(op, [self._shape(x) for x in xs], dim)
        self._check_size(op, shape)
        return self._out(self._cat([xs[i] for i in keep], d), kind, like)

    def stack(self, tensors, dim=0):
        """torch.stack: along a new dim."""
        op = "stack"
        kind, like, xs = self._list_inputs(op, tensors)
        d, shape = stack_plan(op, [self._shape(x) for x in xs], dim)
        self._check_size(op, shape)
        one = shape[:d] + (1,) + shape[d + 1:]
        return self._out(self._cat([self._reshape(x, one) for x in xs], d), kind, like)

    # ---- selection -------------------------------------------------------------------------
    def where(self, condition, input, other):
        """torch.where(condition, input, other): input where condition is nonzero (True), else
        other; all three broadcast, input/other may be Python numbers. A real select: Inf / NaN
        on the unselected side never show."""
        op = "where"
        kind, like, c = self._inputs(op, condition=condition)
        a = self._operand(op, "input", input)
        b = self._operand(op, "other", other)
        for v in (input, other):  # the result is of the values' kind, also where the condition is a host mask
            if kind == "numpy" and not is_scalar(v) and _kind(v, self) != "numpy":
                kind, like = _kind(v, self), v
        kind = Kind(kind, dtypes.promote([self._value_dtype(input), self._value_dtype(other)]))
        shape = broadcast_shapes(op, self._shape(c), self._shape(a), ("condition", "input"))
        shape = broadcast_shapes(op, shape, self._shape(b), ("condition", "other"))
        self._check_size(op, shape)
        return self._out(self._where(c, a, b), kind, like)

    def _operand(self, op, arg, v):
        if is_scalar(v):
            return self.to_device(np.float32(v), op, arg, constant=True)
        return self.to_device(v, op, arg)

    def compare(self, op: str, input, other):
        """eq, ne, lt, le, gt, ge by name: float32 1.0 where true, 0.0 where false (torch: bool)."""
        known("compare", "op", op, COMPARE_OPS, "comparison")
        return self._elementwise2(op, input, other)

    eq, ne, lt, le, gt, ge = (pair_method("compare", op) for op in ("eq", "ne", "lt", "le", "gt", "ge"))

    # ---- pad's cropping (contract.pad) -----------------------------------------------------
    def _crop2(self, x, t, b, l, r):
        """x (..., H, W) with t, b, l, r >= 0 elements cut off its last two dims (a view)."""
        H, W = self._shape(x)[-2:]
        nd = len(self._shape(x))
        if t or b:
            x = self._slice(x, nd - 2, t, H - t - b, 1)
        if l or r:
            x = self._slice(x, nd - 1, l, W - l - r, 1)
        return x

    def _pad_crop(self, x4, pads, mode):
        """contract.pad's body with any pads: negative amounts crop (torch: constant and
        circular crop first, reflect and replicate pad first). Always a new array."""
        pos = tuple(max(p, 0) for p in pads)
        neg = tuple(max(-p, 0) for p in pads)
        if not any(neg):
            return self._pad(x4, pos, mode)
        if mode in ("zeros", "circular"):
            return self._pad(self._contiguous(self._crop2(x4, *neg)), pos, mode)
        return self._crop2(self._pad(x4, pos, mode), *neg)
