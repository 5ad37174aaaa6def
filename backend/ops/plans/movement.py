"""Data movement and selection: views, permutes, narrow/slice, cat/stack/split, crops, comparisons
(ops/movement.py)."""
from __future__ import annotations

import math

from ...system.errors import AnyDeviceError
from .args import _is_int


# ---- data movement and selection (movement.py) ---------------------------------------------------

#: comparisons (movement.py): float32 1.0 / 0.0 results (torch: bool)
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")


def crop_check(op: str, hw, pads, mode, value) -> None:
    """pad with negative amounts (cropping), torch's rules: constant and circular crop first (the
    crop may empty a dim but not go past it), reflect and replicate pad first and may not leave a
    negative size, nor an empty output (torch: a (left, right) pad must leave W >= 1, a 4-tuple
    H >= 1 or W >= 1); circular may not wrap past the cropped size (torch reads uninitialised
    memory there)."""
    (h, w), (t, b, l, r) = tuple(hw), pads
    outs = (h + t + b, w + l + r)
    if mode in ("reflect", "replicate") and (min(outs) < 0 or (outs[1] < 1 if len(value) == 2 else max(outs) < 1)):
        raise AnyDeviceError(op, "pad", value, f"leaves an empty output ({outs[0]}x{outs[1]} of {h}x{w})")
    for size, lo, hi in ((h, t, b), (w, l, r)):
        kept = size + min(lo, 0) + min(hi, 0)
        if mode in ("zeros", "circular") and kept < 0:
            raise AnyDeviceError(op, "pad", value, f"crops {-min(lo, 0) - min(hi, 0)} elements off a dim of {size}")
        if mode == "circular" and max(lo, hi) > kept:
            raise AnyDeviceError(op, "pad", value, f"circular padding of {max(lo, hi)} wraps past the "
                                                   f"{kept} elements left after cropping")


def _int_seq(op, arg, value):
    seq = [value] if _is_int(value) else list(value) if isinstance(value, (tuple, list)) else None
    if seq is None or not all(_is_int(v) for v in seq):
        raise AnyDeviceError(op, arg, value, "must be an int or a sequence of ints")
    return [int(v) for v in seq]


def view_shape(op: str, shape, new_shape, arg: str = "shape") -> tuple:
    """reshape/view's target shape with its one -1 inferred (torch's rules)."""
    dims = _int_seq(op, arg, new_shape)
    n = math.prod(shape)
    if dims.count(-1) > 1:
        raise AnyDeviceError(op, arg, new_shape, "only one dim can be -1")
    if any(d < -1 for d in dims):
        raise AnyDeviceError(op, arg, new_shape, "sizes must be >= 0 (or -1 for one inferred dim)")
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        if rest == 0 or n % rest:
            raise AnyDeviceError(op, arg, new_shape, f"is invalid for an input of {n} elements",
                                 refs={"input": tuple(shape)})
        dims[dims.index(-1)] = n // rest
    if math.prod(dims) != n:
        raise AnyDeviceError(op, arg, new_shape, f"is invalid for an input of {n} elements",
                             refs={"input": tuple(shape)})
    return tuple(dims)


def one_dim(op: str, ndim: int, dim, arg: str = "dim", extra: int = 0) -> int:
    """One dim of a tensor with ``ndim`` dims (``extra`` = 1: stack's new dim), as an axis >= 0."""
    if not _is_int(dim):
        raise AnyDeviceError(op, arg, dim, "must be an int")
    rank = max(ndim + extra, 1)
    if not -rank <= dim < rank:
        raise AnyDeviceError(op, arg, dim, f"out of range for a tensor with {ndim} dims (expected "
                                           f"[{-rank}, {rank - 1}])")
    return int(dim) % rank


def permute_dims(op: str, ndim: int, dims) -> tuple[int, ...]:
    dims_ = _int_seq(op, "dims", dims)
    if len(dims_) != ndim:
        raise AnyDeviceError(op, "dims", dims, f"must name each of the input's {ndim} dims once")
    out = tuple(one_dim(op, ndim, d, "dims") for d in dims_)
    if len(set(out)) != len(out):
        raise AnyDeviceError(op, "dims", dims, "names a dim twice")
    return out


def expand_shape(op: str, shape, sizes, arg: str = "size") -> tuple:
    """expand/broadcast_to: the new shape (-1 keeps a dim; new dims go in front)."""
    sizes_ = _int_seq(op, arg, sizes)
    shape = tuple(shape)
    lead = len(sizes_) - len(shape)
    if lead < 0:
        raise AnyDeviceError(op, arg, sizes, f"has fewer dims than the input's {len(shape)}",
                             refs={"input": shape})
    out = []
    for i, s in enumerate(sizes_):
        if i < lead:
            if s < 0:
                raise AnyDeviceError(op, arg, sizes, "a new leading dim must be >= 0 (-1 is not allowed there)")
            out.append(s)
            continue
        have = shape[i - lead]
        if s == -1:
            s = have
        if s < 0 or (have != 1 and s != have):
            raise AnyDeviceError(op, arg, sizes, f"cannot expand {{input}}'s dim {i - lead} of size {have} to {s}",
                                 refs={"input": shape})
        out.append(s)
    return tuple(out)


def _sliceable(op, shape):
    if len(shape) == 0:
        raise AnyDeviceError(op, "input", tuple(shape), "cannot be sliced: it is 0-d")


def narrow_args(op: str, shape, dim, start, length) -> tuple[int, int, int]:
    """narrow: (dim, start >= 0, length)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    if not _is_int(start) or not -n <= start <= n:
        raise AnyDeviceError(op, "start", start, f"must be an int in [{-n}, {n}] (dim {d} has size {n})")
    start = int(start) % n if n and start < 0 else int(start)
    if not _is_int(length) or length < 0 or start + length > n:
        raise AnyDeviceError(op, "length", length, f"must be an int >= 0 with start + length <= {n} "
                                                   f"(start {start}, dim {d} has size {n})")
    return d, start, int(length)


def slice_args(op: str, shape, dim, start, stop, step) -> tuple[int, int, int, int]:
    """x[..., start:stop:step] along dim, Python's clamping: (dim, start, length, step)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    for arg, v in (("start", start), ("stop", stop)):
        if v is not None and not _is_int(v):
            raise AnyDeviceError(op, arg, v, "must be an int or None")
    if not _is_int(step) or step <= 0:
        raise AnyDeviceError(op, "step", step, "must be a positive int (torch refuses steps <= 0)")
    s, _, st = slice(start, stop, int(step)).indices(shape[d])
    return d, s, len(range(*slice(start, stop, int(step)).indices(shape[d]))), st


def _tensor_list(op, arg, tensors):
    if not isinstance(tensors, (tuple, list)) or not tensors:
        raise AnyDeviceError(op, arg, type(tensors).__name__ if not isinstance(tensors, (tuple, list)) else tensors,
                             "must be a non-empty sequence of tensors")


def cat_plan(op: str, shapes, dim) -> tuple[int, tuple, list[int]]:
    """cat: (dim, output shape, the indices of the parts that take part: torch skips 1-D empty
    tensors (legacy) when another part has more dims)."""
    shapes = [tuple(s) for s in shapes]
    keep = [i for i, s in enumerate(shapes) if s != (0,)]
    if not keep:
        keep = [0]
    ref = shapes[keep[0]]
    if len(ref) == 0:
        raise AnyDeviceError(op, f"tensors[{keep[0]}]", ref, "a 0-d tensor cannot be concatenated")
    d = one_dim(op, len(ref), dim)
    total = 0
    for i in keep:
        s = shapes[i]
        if len(s) != len(ref) or s[:d] + s[d + 1:] != ref[:d] + ref[d + 1:]:
            raise AnyDeviceError(op, f"tensors[{i}]", s, f"must match {{first}} in every dim but dim {d}",
                                 refs={"first": ref})
        total += s[d]
    return d, ref[:d] + (total,) + ref[d + 1:], keep


def stack_plan(op: str, shapes, dim) -> tuple[int, tuple]:
    shapes = [tuple(s) for s in shapes]
    ref = shapes[0]
    d = one_dim(op, len(ref), dim, extra=1)
    for i, s in enumerate(shapes):
        if s != ref:
            raise AnyDeviceError(op, f"tensors[{i}]", s, "must have the shape of {first}", refs={"first": ref})
    return d, ref[:d] + (len(shapes),) + ref[d:]


def split_sizes(op: str, shape, split_size_or_sections, dim) -> tuple[int, list[int]]:
    """split: (dim, the sizes of the parts along it)."""
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    v = split_size_or_sections
    if _is_int(v):
        if v < 0 or (v == 0 and n):
            raise AnyDeviceError(op, "split_size_or_sections", v, f"must be positive (0 only for an empty dim; "
                                                                 f"dim {d} has size {n})")
        if n == 0:
            return d, [0]
        return d, [min(v, n - i) for i in range(0, n, v)]
    if isinstance(v, (tuple, list)) and all(_is_int(s) and s >= 0 for s in v) and v:
        if sum(v) != n:
            raise AnyDeviceError(op, "split_size_or_sections", v, f"must sum to the size {n} of dim {d}")
        return d, [int(s) for s in v]
    raise AnyDeviceError(op, "split_size_or_sections", v, "must be an int or a non-empty list of ints >= 0")


def chunk_sizes(op: str, shape, chunks, dim) -> tuple[int, list[int]]:
    """chunk: torch's sizes (ceil(n / chunks) each, the last smaller; maybe fewer parts)."""
    if not _is_int(chunks) or chunks < 1:
        raise AnyDeviceError(op, "chunks", chunks, "must be a positive int")
    _sliceable(op, shape)
    d = one_dim(op, len(shape), dim)
    n = shape[d]
    if n == 0:
        return d, [0] * int(chunks)
    step = -(-n // chunks)
    return d, [min(step, n - i) for i in range(0, n, step)]
