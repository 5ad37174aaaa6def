"""A value's numbers on a backend, in the layout an op wants, and an op's result back as a value.

Layouts (the same rules as before, now applied to the backend's own arrays, so nothing visits the
host on the way):

* ``raw``: the value's own layout (IMAGE [B,H,W,C], MASK [B,H,W] or [H,W], LATENT [B,C,H,W] or
  [B,C,T,H,W], TENSOR as it is);
* ``nchw``: [N,C,H,W], what convolutions and image metrics use (IMAGE permuted, MASK with a channel
  dim, video LATENT frames as batch entries, TENSOR [H,W] / [C,H,W] with leading 1s);
* ``last``: channels last, what per-pixel ops such as Linear use.

Reshapes cost nothing; a permute is one device copy, remembered next to the value's raw copy (see
``resident``) so the next node that wants the same layout finds it.
"""
from __future__ import annotations

import numpy as np
import torch

from . import resident as R
from .common import NodeError, preview_image, raw
from .resident import DeviceTensor


def as_tensor_value(value) -> DeviceTensor:
    """A TENSOR input as a DeviceTensor (a plain {"tensor": t} dict is wrapped, t untouched)."""
    return value if isinstance(value, DeviceTensor) else DeviceTensor.from_host(value["tensor"])


def shape_of(value, kind: str) -> tuple[int, ...]:
    """The shape of the value's numbers in its own layout (nothing is downloaded)."""
    if kind == "TENSOR":
        return tuple(value.shape) if isinstance(value, DeviceTensor) else tuple(value["tensor"].shape)
    return tuple(raw(value, kind).shape)


def _copied(kind: str, layout: str, ndim: int) -> bool:
    """Whether ``layout`` of a value of this kind and rank is a permuted copy (else a free reshape)."""
    return (kind == "IMAGE" and layout == "nchw") or (kind == "LATENT" and (layout == "last" or ndim == 5))


def _last_perm(nd: int) -> tuple[int, ...]:
    return (0,) + tuple(range(2, nd)) + (1,)


def to_layout(be, x, kind: str, layout: str, node: str = "", arg: str = "input"):
    """Raw array ``x`` of a value of ``kind`` in ``layout``."""
    s = tuple(be._shape(x))
    if layout == "raw":
        return x
    if layout == "last":
        if kind == "LATENT":
            return be._permute(x, _last_perm(len(s)))
        return be._reshape(x, s + (1,)) if kind == "MASK" else x
    if kind == "IMAGE":
        return be._permute(x, (0, 3, 1, 2))
    if kind == "MASK":
        return be._reshape(x, (1, 1) + s if len(s) == 2 else (s[0], 1) + s[1:])
    if kind == "LATENT":
        if len(s) == 5:  # video latents [B, C, T, H, W]: frames become batch entries
            b, c, f, h, w = s
            return be._reshape(be._permute(x, (0, 2, 1, 3, 4)), (b * f, c, h, w))
        if len(s) != 4:
            raise NodeError(node, arg, x, "LATENT samples must be [B,C,H,W] or [B,C,T,H,W]")
        return x
    if len(s) == 4:  # TENSOR
        return x
    if len(s) in (2, 3):
        return be._reshape(x, (1,) * (4 - len(s)) + s)
    raise NodeError(node, arg, x, "needs 2 to 4 dims ([H,W], [C,H,W] or [N,C,H,W]) for this operation")


def nchw_shape(s: tuple, kind: str, node: str = "", arg: str = "input") -> tuple[int, ...]:
    """The shape ``to_layout(..., "nchw")`` gives a value of this kind and raw shape (same errors)."""
    s = tuple(int(v) for v in s)
    if kind == "IMAGE":
        return (s[0], s[3], s[1], s[2])
    if kind == "MASK":
        return (1, 1) + s if len(s) == 2 else (s[0], 1) + s[1:]
    if kind == "LATENT" and len(s) == 5:
        return (s[0] * s[2], s[1]) + s[3:]
    if len(s) == 4:
        return s
    if kind == "TENSOR" and len(s) in (2, 3):
        return (1,) * (4 - len(s)) + s
    what = "LATENT samples must be [B,C,H,W] or [B,C,T,H,W]" if kind == "LATENT" else \
        "needs 2 to 4 dims ([H,W], [C,H,W] or [N,C,H,W]) for this operation"
    raise NodeError(node, arg, _Shaped(s), what)


class _Shaped:
    """Stands for a tensor of this shape in an error message (errors show tensors by their shape)."""

    def __init__(self, shape):
        self.shape = shape


def from_layout(be, y, kind: str, layout: str, src: tuple, node: str = ""):
    """Inverse of ``to_layout``: ``y`` in the raw layout of a value of ``kind`` whose input had shape ``src``."""
    s = tuple(be._shape(y))
    if layout == "raw":
        return y
    if layout == "last":
        if kind == "LATENT":
            perm = _last_perm(len(s))
            return be._permute(y, tuple(perm.index(i) for i in range(len(s))))
        return be._reshape(y, s[:-1]) if kind == "MASK" and s[-1] == 1 else y
    if kind == "IMAGE":
        return be._permute(y, (0, 2, 3, 1))
    if kind == "MASK":
        if s[1] != 1:
            raise NodeError(node, "output", s, f"has {s[1]} channels but a MASK has 1; convert to a TENSOR "
                                               "first or keep one output channel")
        return be._reshape(y, s[2:] if len(src) == 2 and s[0] == 1 else (s[0],) + s[2:])
    if kind == "LATENT":
        if len(src) == 5:
            b, f = src[0], src[2]
            return be._permute(be._reshape(y, (b, f) + s[1:]), (0, 2, 1, 3, 4))
        return y
    if len(src) == 3 and s[0] == 1:  # TENSOR: back to the rank it came in with where the dims allow
        return be._reshape(y, s[1:])
    if len(src) == 2 and s[0] == 1 and s[1] == 1:
        return be._reshape(y, s[2:])
    return y


def data(value, kind: str, be, layout: str = "raw", node: str = "", name: str = "input", arg: str = "input"):
    """The value's numbers on ``be`` in ``layout``: no transfer when they are already there.

    ``name`` is the node input (for layout errors), ``arg`` the op argument it feeds (for conversion
    errors, which the node restates in its own words)."""
    if kind == "TENSOR":
        return to_layout(be, as_tensor_value(value).native(be, arg), kind, layout, node, name)
    t = raw(value, kind)
    x = R.find_copy(t, be, layout)
    if x is None:
        x = to_layout(be, R.device_array(be, t, arg), kind, layout, node, name)
        if _copied(kind, layout, t.ndim):
            R.add_copy(t, be, layout, x)
    return x


def result(be, y, kind: str, like, layout: str = "raw", node: str = ""):
    """An op's result ``y`` (an array on ``be`` in ``layout``) as a value of ``kind``, shaped like
    ``like`` (LATENT keeps its other keys). TENSOR stays on the device; IMAGE, MASK and LATENT are
    downloaded once, and their device arrays remembered for the next AnyDevice node."""
    src = shape_of(like, kind)
    r = from_layout(be, y, kind, layout, src, node)
    if kind == "TENSOR":
        return DeviceTensor(r, be)
    host = R.host_tensor(be, r)
    R.add_copy(host, be, "raw", r)
    if _copied(kind, layout, len(src)):
        R.add_copy(host, be, layout, y)
    if kind == "LATENT":
        out = dict(like)
        out["samples"] = host
        return out
    return host


def wrap(be, y, kind: str, like):
    """A result computed in the value's own layout, as that kind again when its rank fits the kind;
    otherwise (e.g. a full reduction of an IMAGE) as a TENSOR."""
    nd = len(be._shape(y))
    if (kind == "IMAGE" and nd == 4) or (kind == "MASK" and nd in (2, 3)) or \
            (kind == "LATENT" and nd == len(shape_of(like, kind))):
        return result(be, y, kind, like)
    return DeviceTensor(y, be)


def out_shape(value) -> list[int]:
    """The shape of a node's output value, for its badge."""
    if isinstance(value, DeviceTensor):
        return list(value.shape)
    if isinstance(value, dict):
        return list(value["samples"].shape)
    return list(value.shape)


def numbers(be, arrays) -> list[float]:
    """Several 0-d (or 1-element) arrays on ``be`` as floats, with one download."""
    if len(arrays) == 1:
        a = be.to_numpy(arrays[0])
    else:
        parts = [be._reshape(x, (1, 1, 1, 1)) for x in arrays]
        a = be.to_numpy(be._concat_channels(parts, 1, 1, 1, 1))
    return [float(v) for v in np.asarray(a, np.float32).reshape(-1)]


def preview(be, d) -> torch.Tensor:
    """An [N,C,H,W] array on ``be`` as an IMAGE to look at: 3 channels as RGB, else the channel mean
    as grey (made on the device, downloaded once, remembered like any IMAGE a node made)."""
    n, c, h, w = (int(v) for v in be._shape(d))
    if n * c * h * w == 0:  # nothing to compute: the host does it as it always did
        return preview_image(R.host_tensor(be, d))
    if c == 3:
        img = be._permute(d, (0, 2, 3, 1))
    else:
        img = be._expand(be._reshape(be.mean(d, 1, keepdim=True), (n, h, w, 1)), (n, h, w, 3))
    host = R.host_tensor(be, img)
    R.add_copy(host, be, "raw", img)
    return host
