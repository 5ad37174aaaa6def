"""The device copies of compiled models' weights (``Weights``: one cache per backend, dtype and quantized
format, uploaded once per tensor and version, streamed past the device budget) and which weights a graph
may quantize (the weight operand of a matmul, linear or conv; ops/quant.py)."""
from __future__ import annotations

import math
import sys
import weakref

from ..ops import quant
from ..ops.dtypes import ITEMSIZE
from ..system.versions import tensor_version
from .report import Counting


# ---- weights: uploaded once per tensor and version ----------------------------------------------
#: the share of the device's free memory the weights of compiled models may keep resident by default
DEVICE_SHARE = 0.5


def device_budget(be, held: int = 0) -> int:
    """Bytes the compiled models' weights may keep resident on ``be``'s device (each Weights cache):
    ANYDEVICE_DEVICE_MB, else DEVICE_SHARE of the device's free memory (memstat: the pack's own device,
    never ComfyUI's torch device); inside ComfyUI a quarter with --lowvram / --novram, less
    --reserve-vram. ``held``: the bytes the asking cache holds already (counted as free: they are its own).
    Weights past it stream (``Weights.get``)."""
    from ..system import config, memstat
    mb = config.get("ANYDEVICE_DEVICE_MB")
    if mb is not None:
        return int(mb)
    free, _where = memstat.free_bytes(be)
    share, reserve = DEVICE_SHARE, 0
    args = getattr(sys.modules.get("comfy.cli_args"), "args", None)  # inside ComfyUI only
    if args is not None:
        if getattr(args, "lowvram", False) or getattr(args, "novram", False):
            share = DEVICE_SHARE / 2
        reserve = int((getattr(args, "reserve_vram", None) or 0) * 2**30)
    return max(0, int((free + held) * share) - reserve)



def version_of(t):
    """What changes when ``t`` is replaced or written (``backend/system/versions.py``: data pointer, shape,
    dtype and ``_version``, or a content fingerprint for inference tensors, cheap inside a
    ``versions.trusted`` block)."""
    return tensor_version(t)


def _drop(entries: dict, gen: list, tid: int, ref) -> None:
    """A weight was garbage-collected: its device copy goes (when the entry is still that weight's)."""
    if entries.get(tid, [None])[0] is ref:
        entries.pop(tid, None)
        gen[0] += 1


class Weights:
    """The device copies of a backend's weights, by tensor identity + version.

    ``Weights.of(be).get(t)`` uploads ``t`` the first time, and again only when ``t`` changed
    (another tensor object at that id, written in place, replaced: a LoRA patch); copies go when the
    tensor is garbage-collected. Shared by every graph compiled for that backend, so recompiles
    (a new image size) and graph breaks reuse the same device weights."""

    _all: dict = {}

    @classmethod
    def of(cls, be, dtype: str = "float32", quant: str | None = None) -> "Weights":
        """The weights of ``be`` stored as ``dtype``, the matmul / conv weights quantized to ``quant``
        where given (one cache per backend, dtype and format)."""
        key = (id(be), dtype, quant)
        w = cls._all.get(key)
        if w is None or w.be is not be:
            w = cls._all[key] = cls(be, dtype, quant)
        return w

    def __init__(self, be, dtype: str = "float32", quant: str | None = None):
        self.be, self.dtype, self.quant = be, dtype, quant
        # id(t) -> [weak ref to t, its version (and whether quantized), device array, bytes]
        self._entries: dict[int, list] = {}
        self.uploads = 0
        #: raised whenever a device copy is dropped or replaced (a recorded graph that read one is stale)
        self._gen = [0]

    @property
    def generation(self) -> int:
        """Changes whenever a kept device copy is dropped or replaced (compile/replay.py)."""
        return self._gen[0]

    def get(self, t, vkey=None, count: Counting | None = None, quantize: bool = False):
        """``t``'s device copy; ``quantize``: a weight only a matmul or conv reads (``Lowered.quant_nodes``),
        stored in the cache's quantized format."""
        e = self._entries.get(id(t))
        if vkey is None:
            vkey = version_of(t)
        vkey = (vkey, bool(quantize and self.quant))
        if e is not None and e[0]() is t and e[1] == vkey:
            return e[2]
        if vkey[1]:
            return self._keep(t, e, vkey, lambda: quantized_upload(self.be, t, self.quant), None, count)
        return self._keep(t, e, vkey, lambda: self._upload(t), self.itemsize(t) * t.numel(), count)

    def _keep(self, t, e, vkey, upload, size, count):
        """``upload()``'s device array for ``t`` (``size`` bytes; None: its ``nbytes``), kept under ``vkey``
        while ``t`` lives, or for this use only past the device budget (streamed)."""
        held = self.nbytes
        a = upload()
        size = a.nbytes if size is None else size
        if e is None and held + size > device_budget(self.be, held):
            # past the budget: uploaded for this use only, and dropped by the graph after its last use
            if count is not None:
                count.transfer("streamed", size)
            return a
        self.uploads += 1
        if count is not None:
            count.transfer("constants", size)
        tid = id(t)
        ref = weakref.ref(t, lambda _r, tid=tid, d=self._entries, g=self._gen: _drop(d, g, tid, _r))
        if e is not None:
            self._gen[0] += 1
        self._entries[tid] = [ref, vkey, a, size]
        return a

    def packed(self, t, scale, vkey, build, count: Counting | None = None):
        """The device form of a weight kept packed in a uint8 tensor ``t`` (quant_ops: ``scale`` its row
        scales or None; ``build()`` makes its host QTensor): ``be.to_device_quant`` of it, by ``t``'s
        identity and ``vkey`` (``t``'s and ``scale``'s versions, the format and shape), as ``get``; its
        packed bytes count in ``nbytes``. The bytes are never uploaded as float."""
        e = self._entries.get(id(t))
        vkey = ("packed", vkey)
        if e is not None and e[0]() is t and e[1] == vkey:
            return e[2]
        return self._keep(t, e, vkey, lambda: self.be.to_device_quant(build()), None, count)

    def store(self, t) -> str | None:
        """The dtype a host tensor (not quantized) is stored in on the device: the cache's for a floating tensor where that
        is a half dtype; None (float32) otherwise."""
        return self.dtype if t.is_floating_point() and self.dtype != "float32" else None

    def itemsize(self, t) -> int:
        """Device bytes per element of ``t`` as ``store`` stores it."""
        dtype = self.store(t)
        return 4 if dtype is None else ITEMSIZE[dtype]

    def _upload(self, t):
        """A floating weight stored as the cache's dtype (float32 where the cache is float32). A float32 one
        may be wrapped, not copied (``share``: a device in host memory uses the tensor's memory; a weight
        written in place gets a new version, so ``get`` asks again, and nothing writes a device array)."""
        dtype = self.store(t)
        return self.be.to_device(t, "compile", "weight", constant=True, dtype=dtype, share=dtype is None)

    def clear(self) -> None:
        """Forget every device copy (the next call uploads again)."""
        self._gen[0] += 1
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the device copies held (each entry's, kept when it was made: ``get`` asks on every miss)."""
        return sum(e[3] for e in list(self._entries.values()))


def quantized_upload(be, t, fmt: str, transposed: bool = False):
    """A host weight quantized to ``fmt`` (ops/quant.py) and handed to ``be``: packed on the device where
    its kernels read the format, else the host QTensor (each op dequantizes it). ``transposed``: ``t`` is
    a linear weight's transpose (K, N), read by a matmul: the weight itself (N, K) is quantized (rows of
    K: GGUF's blocks, per-output-channel scales) and handed over as ``quant.Transposed``."""
    if transposed:
        return quant.Transposed(be.to_device_quant(quant.quantize(t.t(), fmt, op="compile")))
    return be.to_device_quant(quant.quantize(t, fmt, op="compile"))


def _is_transpose(n) -> bool:
    """Node ``n`` transposes a 2-D tensor (aten.t, permute [1, 0], transpose 0 1)."""
    name = getattr(getattr(n.target, "overloadpacket", None), "__name__", None)
    if name == "t":
        return True
    if name == "permute":
        return list(n.args[1]) == [1, 0]
    if name == "transpose":
        return sorted(int(d) % 2 for d in n.args[1:3]) == [0, 1]
    return False


def device_nbytes(be, a) -> int:
    """Device bytes of a graph's stored value (a quantized weight's packed bytes and scales)."""
    if quant.is_quantized(a):
        return a.nbytes
    return ITEMSIZE.get(be._dtype(a), 4) * math.prod(be._shape(a)) if isinstance(a, be.native_types) else 0


#: the ATen ops whose weight operand may be quantized: op name -> the argument index of the weight
QUANT_SLOTS = {"convolution": 1, "_convolution": 1, "mm": 1, "matmul": 1, "addmm": 2, "linear": 1}


def quantizable_use(n, x) -> bool:
    """Whether node ``n`` reads ``x`` only as the weight of a matmul / linear / (not transposed) conv."""
    name = getattr(getattr(n.target, "overloadpacket", None), "__name__", None)
    slot = QUANT_SLOTS.get(name)
    if slot is None or len(n.args) <= slot or n.args[slot] is not x or n.kwargs:
        return False
    if any(a is x for i, a in enumerate(n.args) if i != slot):
        return False
    if name in ("convolution", "_convolution"):
        return len(n.args) > 6 and not n.args[6]  # transposed convs dequantize: their weight stays as it is
    return True


_CASTS = ("_to_copy", "convert_element_type", "to", "clone", "contiguous")
#: torch float8 dtypes -> the quantized format that stores the same bits (with a scale)
FLOAT8 = {"torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}


def linear_transposes(be, nodes, kind: dict, users: dict, meta) -> set:
    """The folded transposes of a 2-D floating weight read only as a matmul's b (linear's w.T), where ``be``'s linear
    reads w as stored (``caps.fused`` "linear_weight"; else none): the graph keeps w and hands it over as
    quant.Transposed, so the product runs through the device's linear."""
    out = set()
    if "linear_weight" not in be.caps.fused:
        return out
    for x in nodes:
        m = meta(x)
        if kind.get(x) != "const" or x.op != "call_function" or not _is_transpose(x) or getattr(m, "dim", lambda: 0)() != 2 \
                or not m.is_floating_point() or not users.get(x):
            continue
        if all(kind.get(u) == "lower" and quantizable_use(u, x)
               and getattr(getattr(u.target, "overloadpacket", None), "__name__", None) in ("mm", "matmul", "addmm")
               for u in users[x]):
            out.add(x)
    return out


def quant_selection(nodes, kind: dict, users: dict, fmt: str | None, meta, is_tensor) -> set:
    """The static / folded nodes a graph stores in ``fmt``: floating, at least 2-D, storable in the format,
    and read only as the weight of a matmul, linear or (not transposed) conv."""
    out = set()
    if not fmt:
        return out
    for x, us in users.items():
        m = meta(x)
        if kind.get(x) in ("static", "const") and is_tensor(m) and m.is_floating_point() and m.dim() >= 2 \
                and quant.quantizable(tuple(m.shape), fmt) and all(kind.get(u) == "lower" and quantizable_use(u, x)
                                                                    for u in us):
            out.add(x)
    return out


def float8_chains(nodes, kind: dict, users: dict, meta) -> dict:
    """float8 weights kept as they are (ComfyUI's scaled-fp8 checkpoints: ``weight.to(dtype) *
    scale_weight``, maybe transposed, read only as a matmul / linear / conv weight): the node the weight
    slot reads -> (the float8 static node, the scale node or None, transposed). Such a weight is stored
    as its float8 bytes and one scale (ops/quant.py's float8 formats), lossless, wherever the device reads
    the format."""
    out = {}
    for w in nodes:
        m = meta(w)
        if kind.get(w) != "static" or str(getattr(m, "dtype", "")) not in FLOAT8 or getattr(m, "dim", lambda: 0)() < 2:
            continue
        cur, scale, transposed = w, None, False
        for _ in range(8):  # a short chain of casts, one scale multiply, a transpose
            us = users.get(cur, [])
            if len(us) != 1 or kind.get(us[0]) != "const":
                break
            u = us[0]
            name = getattr(getattr(u.target, "overloadpacket", None), "__name__", None)
            if name in _CASTS and u.args and u.args[0] is cur:
                cur = u
            elif name == "mul" and scale is None and len(u.args) == 2 and cur in u.args:
                other = u.args[1] if u.args[0] is cur else u.args[0]
                om = meta(other)
                if om is None or getattr(om, "numel", lambda: 2)() != 1 or kind.get(other) not in ("static", "const"):
                    break
                scale, cur = other, u
            elif _is_transpose(u) and not transposed and (meta(u) is not None and meta(u).dim() == 2):
                transposed, cur = True, u
            else:
                break
        if cur is not w and users.get(cur) and all(kind.get(u) == "lower" and quantizable_use(u, cur) for u in users[cur]):
            out[cur] = (w, scale, transposed)
    return out


def float8_upload(be, w, scale, transposed: bool):
    """A float8 weight (a host torch tensor) and its scale (a tensor or None) as a quantized weight on ``be``."""
    import torch
    t = w.detach().to("cpu").contiguous()
    fmt = FLOAT8[str(t.dtype)]
    s = 1.0 if scale is None else float(scale.detach().to("cpu").float().reshape(-1)[0])
    q = quant.QTensor(fmt, tuple(t.shape), t.view(torch.uint8).numpy(), [s], rowlen=t.numel())
    a = be.to_device_quant(q)
    return quant.Transposed(a) if transposed else a
