"""Did this host tensor change? One answer for the whole pack (device copies of node values in
nodes/base/resident.py, compiled models' weights in backend/compile).

``tensor_version(t)`` is a key that changes when ``t`` is replaced or written in place: its data
pointer, shape and dtype, plus

* ``t._version`` where the tensor keeps a version counter (an ordinary tensor: every in-place write
  bumps it), else
* a content fingerprint: tensors made under ``torch.inference_mode()`` (ComfyUI runs every node that
  way, and loads models that way) keep no counter. The fingerprint is 64 elements spread evenly over
  the tensor (indices computed in int64: exact past 2**24 elements) plus the float64 sum of every
  97th element. It catches whole-tensor writes (``add_``, ``mul_``, ``copy_``: what a weight patch
  does); a write that touches none of the sampled elements goes unseen. It reads about 1% of the
  tensor's memory: ~0.5 s for the ~860 M weights of an SD1.5 UNet on two cores.

``trusted(epoch)`` makes the fingerprint cheap where the caller knows when tensors are written: inside
``with trusted(epoch):`` a fingerprint computed before under the same ``epoch`` for the same tensor
(same object, data pointer, shape and dtype) is reused without reading the tensor. The model nodes
pass ComfyUI's patch state (the patcher's patch UUIDs and hooks) as the epoch: ComfyUI changes it
whenever it patches weights (LoRA, weight patches, hooks), so between patches a step reads no weight.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref

#: how many evenly spread elements the fingerprint samples, and the stride of its sum
SAMPLES = 64
SUM_STRIDE = 97

_epoch: contextvars.ContextVar = contextvars.ContextVar("anydevice_weights_epoch", default=None)
_memo: dict[int, tuple] = {}  # id(t) -> (weakref, base key, epoch, fingerprint)
_memo_lock = threading.Lock()


def sample_indices(n: int, k: int = SAMPLES):
    """``k`` indices spread evenly over ``range(n)``, first and last included, computed in int64
    (a float32 linspace rounds n - 1 up to n past 2**24 elements)."""
    import torch
    k = max(1, min(k, n))
    if k == 1:
        return torch.zeros(1, dtype=torch.int64)
    return torch.arange(k, dtype=torch.int64) * (n - 1) // (k - 1)


def fingerprint(t) -> tuple:
    """The content fingerprint of ``t`` (see the module docstring); () for an empty tensor."""
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if n == 0:
        return ()
    return (tuple(flat[sample_indices(n)].tolist()), float(flat[::SUM_STRIDE].double().sum()))


def _base(t) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.dtype)


def tensor_version(t) -> tuple:
    """A key that changes when ``t`` is replaced or written in place (see the module docstring)."""
    base = _base(t)
    try:
        return base + (t._version,)
    except RuntimeError:  # an inference tensor: no version counter
        pass
    epoch = _epoch.get()
    if epoch is None:
        return base + ("inference",) + fingerprint(t)
    tid = id(t)
    m = _memo.get(tid)
    if m is not None and m[0]() is t and m[1] == base and m[2] == epoch:
        return base + ("inference",) + m[3]
    fp = fingerprint(t)
    ref = weakref.ref(t, lambda r, tid=tid: _forget(tid, r))
    with _memo_lock:
        _memo[tid] = (ref, base, epoch, fp)
    return base + ("inference",) + fp


def _forget(tid: int, ref) -> None:
    """The memo entry of a collected tensor goes (a finaliser: a plain dict pop, no lock waited on
    while anything else is held)."""
    m = _memo.get(tid)
    if m is not None and m[0] is ref:
        _memo.pop(tid, None)


@contextlib.contextmanager
def trusted(epoch):
    """Within the block, tensors' fingerprints are reused while ``epoch`` (any hashable that changes
    whenever the caller's tensors are written in place) stays the same. None: no trust (read always)."""
    token = _epoch.set(epoch)
    try:
        yield
    finally:
        _epoch.reset(token)


def current_epoch():
    """The epoch of the innermost ``trusted`` block (None outside one)."""
    return _epoch.get()
