"""Device residency: the numbers a node computed stay on its backend until something asks for them
on the host.

* TENSOR values are ``DeviceTensor``s: the backend's own array, the backend that owns it and the
  shape. ``value["tensor"]`` (or ``value.to_torch()``) is a CPU float32 torch tensor, downloaded the
  first time something asks for it. A node on the same backend takes the array as it is; a node on
  another backend converts it once (the host copy and that backend's upload are both remembered).
* IMAGE, MASK and LATENT values stay CPU torch tensors (ComfyUI's core nodes read them there). The
  device array a node computed one from, or uploaded it to, is remembered here and found by the
  tensor's identity and its ``_version``: writing into the tensor in place (``add_``, ``copy_``,
  slice assignment) bumps ``_version``, so the next AnyDevice node uploads the new values.
* Every device array kept this way, and the small constant arrays the nodes make (kernels, weights,
  biases), counts against ``ANYDEVICE_RESIDENT_MB`` (default 1024). Past it the least recently used
  go first: a TENSOR's array is downloaded into its host copy, a remembered copy or constant is
  dropped, and the backend gives the freed memory back (``free_memory()``, or the OpenCL buffer
  pool's ``clear()``). ``release_all()`` does that for every array at once.

Backends whose arrays are host memory (NumPy, PyTorch on the CPU) keep nothing here: there is
nothing to upload or download, so nothing to remember.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import threading
import weakref
from collections import OrderedDict

import numpy as np
import torch

from ...backend.ops import quant
from ...backend.system import config
from ...backend.system.versions import tensor_version

ENV = "ANYDEVICE_RESIDENT_MB"


def budget_bytes() -> int:
    """ANYDEVICE_RESIDENT_MB in bytes (backend/system/config.py parses it; a bad value names the variable)."""
    return config.get(ENV)


# ---------------------------------------------------------------------------------------------
# the least-recently-used list of every kept device array
# ---------------------------------------------------------------------------------------------
_lock = threading.RLock()
_lru: OrderedDict = OrderedDict()   # key -> (nbytes, backend, evict)
_total = 0
_dead: list = []                    # keys and copy entries whose owner was collected
_ids = itertools.count()


def nbytes_of(be, x) -> int:
    return 4 * math.prod(be._shape(x))


def resident_bytes() -> int:
    """Bytes of device memory kept between nodes now (all backends)."""
    with _lock:
        _drain()
        return _total


def _add(key, nbytes: int, be, evict) -> None:
    global _total
    _pop(key)
    _lru[key] = (int(nbytes), be, evict)
    _total += int(nbytes)


def _pop(key) -> None:
    global _total
    item = _lru.pop(key, None)
    if item is not None:
        _total -= item[0]


def _touch(key) -> None:
    if key in _lru:
        _lru.move_to_end(key)


def _drain() -> None:
    """Forget what weakref callbacks reported dead (they only append, so they never race a change)."""
    while _dead:
        item = _dead.pop()
        if isinstance(item, _Entry):
            item.drop()
        else:
            _pop(item)


def trim(budget: int | None = None) -> None:
    """Evict least recently used arrays until the kept bytes fit ``budget`` (default: the setting)."""
    global _total
    budget = budget_bytes() if budget is None else budget
    freed = {}
    while True:
        with _lock:
            _drain()
            if _total <= budget or not _lru:
                break
            _key, (n, be, evict) = _lru.popitem(last=False)
            _total -= n
        evict()
        freed[id(be)] = be
    for be in freed.values():
        free_backend_memory(be)


def free_backend_memory(be) -> None:
    """The backend's pooled free memory back to the driver: ``free_memory()`` where the backend has
    it (CUDA: CuPy's pool), else the OpenCL buffer pool's ``clear()``; host backends have neither."""
    fn = getattr(be, "free_memory", None)
    if callable(fn):
        fn()
        return
    pool = getattr(be, "pool", None)
    if pool is not None and callable(getattr(pool, "clear", None)):
        pool.clear()


def release_all() -> None:
    """Every kept device array goes (TENSORs to their host copies), then every backend in use gives
    its pooled memory back."""
    trim(0)
    from ...backend.system import registry
    for be in registry.live_backends():
        free_backend_memory(be)


def version_of(t):
    """What changes when ``t`` is replaced or written in place: ``backend/versions.tensor_version``
    (the data pointer, shape, dtype and ``_version``; tensors made under ``torch.inference_mode()``,
    as ComfyUI runs every node, keep no counter: a fingerprint of 64 spread elements and a strided
    sum stands in, which catches whole-tensor writes; a write that touches none of the sampled
    elements goes unseen)."""
    return tensor_version(t)


# ---------------------------------------------------------------------------------------------
# device copies of host tensors (IMAGE, MASK, LATENT samples, host TENSORs), by identity + _version
# ---------------------------------------------------------------------------------------------
class _Entry:
    """The device arrays of one host tensor: {(backend, layout): array}, valid for one _version."""
    __slots__ = ("tid", "ref", "version", "arrays", "token")

    def __init__(self, t: torch.Tensor):
        self.tid, self.version, self.arrays, self.token = id(t), version_of(t), {}, next(_ids)
        self.ref = weakref.ref(t, lambda _r, e=self: _dead.append(e))

    def key(self, be):
        return ("copy", self.token, id(be))

    def drop(self, be=None) -> None:
        """Forget the arrays on ``be`` (all backends: None), and the entry when none are left."""
        for b, layout in [k for k in self.arrays if be is None or k[0] is be]:
            del self.arrays[(b, layout)]
            _pop(self.key(b))
        if not self.arrays and _copies.get(self.tid) is self:
            del _copies[self.tid]


_copies: dict[int, _Entry] = {}


def _entry(t: torch.Tensor, create: bool = False) -> _Entry | None:
    e = _copies.get(id(t))
    if e is not None and (e.ref() is not t or e.version != version_of(t)):  # another tensor, or written to
        e.drop()
        e = None
    if e is None and create:
        e = _copies[id(t)] = _Entry(t)
    return e


def find_copy(t: torch.Tensor, be, layout: str = "raw"):
    """The array remembered for host tensor ``t`` on ``be`` in ``layout``, if still valid."""
    with _lock:
        _drain()
        e = _entry(t)
        x = None if e is None else e.arrays.get((be, layout))
        if x is not None:
            _touch(e.key(be))
        return x


def add_copy(t: torch.Tensor, be, layout: str, x) -> None:
    """Remember ``x`` as ``t``'s numbers on ``be`` in ``layout`` (for t's current _version)."""
    if be.host_memory:
        return
    with _lock:
        _drain()
        e = _entry(t, create=True)
        e.arrays[(be, layout)] = x
        n = sum(nbytes_of(be, a) for (b, _), a in e.arrays.items() if b is be)
        _add(e.key(be), n, be, lambda e=e, be=be: e.drop(be))
    trim()


def any_copy(t: torch.Tensor):
    """(backend, {layout: array}) of a valid device copy of ``t``, or None."""
    with _lock:
        _drain()
        e = _entry(t)
        if e is None or not e.arrays:
            return None
        be = next(iter(e.arrays))[0]
        return be, {layout: a for (b, layout), a in e.arrays.items() if b is be}


def device_array(be, t: torch.Tensor, arg: str = "input"):
    """Host tensor ``t`` as an array on ``be``: the remembered copy, or one upload (remembered)."""
    x = find_copy(t, be)
    if x is None:
        x = be.to_device(t, "to_device", arg)
        add_copy(t, be, "raw", x)
    return x


def host_tensor(be, x) -> torch.Tensor:
    """A new CPU float32 torch tensor of native array ``x`` (one download on a device backend)."""
    a = np.require(be.to_numpy(x), np.float32, ["C", "W"])
    return torch.from_numpy(a)


_consts: dict = {}


def constant(be, a):
    """A small constant array (kernel, weight, bias) on ``be``, uploaded once per content. A quantized weight
    (ops/quant.py QTensor) is handed over packed (``be.to_device_quant``; kept per content too)."""
    if a is None:
        return None
    if isinstance(a, quant.QTensor):
        return _quant_constant(be, a)
    a = np.ascontiguousarray(a, np.float32)
    if be.host_memory:
        return be.to_device(a, "constant", "weight", constant=True)
    key = (id(be), a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest())
    return _cached_constant(be, key, a.nbytes, lambda: be.to_device(a, "constant", "weight", constant=True))


def _cached_constant(be, key, nbytes: int, upload):
    """The constant cached under ``key`` (touched), else ``upload()``'s result, cached and counted."""
    with _lock:
        _drain()
        x = _consts.get(key)
        if x is not None:
            _touch(("const",) + key)
            return x
    x = upload()  # outside the lock: an upload
    with _lock:
        have = _consts.get(key)
        if have is not None:  # another thread made it meanwhile: one copy is kept and counted
            return have
        _consts[key] = x
        _add(("const",) + key, nbytes, be, lambda k=key: _consts.pop(k, None))
    trim()
    return x


def _quant_constant(be, q):
    """``constant`` for a quantized weight: the backend's packed form (a QTensor itself where the backend
    keeps none: it dequantizes per op), once per content."""
    if be.host_memory:
        return be.to_device_quant(q)
    h = hashlib.blake2b(q.data.tobytes(), digest_size=16)
    if q.scale is not None:
        h.update(q.scale.tobytes())
    return _cached_constant(be, (id(be), q.fmt, q.shape, h.digest()), q.nbytes, lambda: be.to_device_quant(q))


# ---------------------------------------------------------------------------------------------
# the TENSOR value
# ---------------------------------------------------------------------------------------------
class DeviceTensor(dict):
    """A TENSOR: the backend's own array (``backend``, ``shape``), or a host torch tensor.

    It is a dict with the one key ``"tensor"`` (so it is never mistaken for an IMAGE or a MASK, and
    code that reads ``value["tensor"]`` keeps working): reading that key downloads the array once
    and keeps the CPU float32 tensor. Writing into that tensor in place makes it the value's truth
    (its ``_version`` moves), and the device array is dropped.
    """

    def __init__(self, native=None, backend=None, host: torch.Tensor | None = None):
        super().__init__()
        self._native = native
        self.backend = backend if native is not None else None
        self._host = host
        self._host_version = None if host is None else version_of(host)
        self.shape = tuple(int(s) for s in (backend._shape(native) if native is not None else host.shape))
        self._key = ("tensor", next(_ids))
        if self.resident:
            ref = weakref.ref(self, lambda _r, k=self._key: _dead.append(k))
            with _lock:
                _drain()
                _add(self._key, nbytes_of(backend, native), backend,
                     lambda ref=ref: ref() is not None and ref()._offload())
            trim()

    @classmethod
    def from_host(cls, t: torch.Tensor) -> "DeviceTensor":
        return cls(host=t)

    @property
    def dtype(self) -> torch.dtype:
        """float32 for computed values; a host tensor's own dtype for one given as it is."""
        return self._host.dtype if self._host is not None else torch.float32

    @property
    def resident(self) -> bool:
        """The numbers live in a device array (not host memory)."""
        return self._native is not None and not self.backend.host_memory

    def _fresh(self) -> None:
        h = self._host
        if h is not None and self._native is not None and version_of(h) != self._host_version:
            self._drop_native()  # the host copy was written to: it is the value now
            self.shape = tuple(h.shape)

    def _drop_native(self) -> None:
        with _lock:
            _pop(self._key)
        self._native = self.backend = None

    def _offload(self) -> None:
        """Evicted: keep the numbers on the host only."""
        if self._native is not None:
            self.to_torch()
            self._native = self.backend = None

    def to_torch(self) -> torch.Tensor:
        """The CPU torch tensor (downloaded on first use; float32 for every computed TENSOR)."""
        self._fresh()
        if self._host is None:
            self._host = host_tensor(self.backend, self._native)
            self._host_version = version_of(self._host)
        return self._host

    def native(self, be, arg: str = "input"):
        """The numbers as an array on ``be``: as they are when they live there, else converted once."""
        self._fresh()
        if self._native is not None and self.backend is be:
            with _lock:
                _touch(self._key)
            return self._native
        return device_array(be, self.to_torch(), arg)

    def native_or_none(self):
        """(backend, array) when the numbers live on a backend, else None (nothing is converted)."""
        self._fresh()
        return None if self._native is None else (self.backend, self._native)

    # ---- the dict face: one key, "tensor" -------------------------------------------------
    def __getitem__(self, key):
        if key != "tensor":
            raise KeyError(key)
        return self.to_torch()

    def get(self, key, default=None):
        return self.to_torch() if key == "tensor" else default

    def __setitem__(self, key, value):
        if key != "tensor" or not torch.is_tensor(value):
            raise TypeError("a TENSOR value holds one torch tensor under 'tensor'")
        self._drop_native()
        self._host, self._host_version, self.shape = value, version_of(value), tuple(value.shape)

    def __contains__(self, key):
        return key == "tensor"

    def __iter__(self):
        return iter(("tensor",))

    def __len__(self):
        return 1

    def keys(self):
        return ["tensor"]

    def values(self):
        return [self.to_torch()]

    def items(self):
        return [("tensor", self.to_torch())]

    def _read_only(self, *_a, **_k):
        raise TypeError("a TENSOR value holds one torch tensor under 'tensor'; set value['tensor'] to change it")

    update = setdefault = pop = popitem = clear = _read_only

    def copy(self):
        return DeviceTensor(self._native, self.backend, self._host) if self._native is not None \
            else DeviceTensor(host=self.to_torch())

    def __reduce__(self):  # pickle / deepcopy: the host numbers (a device array does not travel)
        return (DeviceTensor.from_host, (self.to_torch(),))

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = None

    def __repr__(self):
        where = self.backend.name if self.resident else "host"
        return f"DeviceTensor(shape={list(self.shape)}, on={where})"
