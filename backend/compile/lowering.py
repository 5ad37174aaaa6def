"""The interpreter of a traced ATen graph on an AnyDevice backend.

``Lowered(graph_module, backend, static)`` takes an ATen FX graph (from aot_autograd or make_fx)
and is called with the graph's flat inputs (boxed: one list). Per node:

* placeholders: a weight (``static``: a parameter or buffer) comes from the backend's ``Weights``
  cache (uploaded once per tensor and version); any other tensor input is uploaded once per call,
  when a device op first needs it; SymInts are plain ints at run time.
* constant subgraphs (nodes that read only weights, sizes and no input: a transposed linear weight,
  SwinIR's relative position bias gathered through its index, an attention mask built from the image
  size) are evaluated once on the host through PyTorch ("folded") and their results uploaded once;
  they are recomputed when a weight changes or the sizes they read do.
* ops in the lowering table (aten_ops.LOWERINGS) run on the device: every intermediate stays a native
  array; an array is dropped after its last use.
* any other op runs on the host through PyTorch: its device inputs are downloaded (with their traced
  dtype), the op runs, its result stays on the host until a device op needs it. Counted per op kind
  in the report, logged once per kind.

Storage dtype (``dtype``: float32 by default, or float16 / bfloat16): weights, inputs and folded
constants are stored on the device in it, and every device op's floating result is rounded to it, as a
model run in that dtype rounds each op's result; each op computes in float32 (ops/dtypes.py). Outputs are
downloaded once and returned in the traced dtype and device (a bf16 model gives bf16 results).
"""
from __future__ import annotations

import math
import operator
import threading
import time
import weakref

import numpy as np

from ..ops import quant as _quant
from ..system import cancel
from ..system.errors import AnyDeviceError
from . import aten_ops, quant_ops, replay
from .weights import (FLOAT8, Weights, _is_transpose, device_nbytes, float8_chains, float8_upload, linear_transposes,
                      quant_selection, quantized_upload, version_of)
from . import report as _report
from .report import Counting, Stats

#: every Lowered graph alive (report attribution)
GRAPHS: list = []
#: seconds between two cancel checks while a graph runs (a check is ComfyUI's interrupt flag)
CANCEL_EVERY = 0.1
_runs = threading.local()  # per thread: graphs run (n), when the next cancel check is due (next_check)


def runs_here() -> int:
    """How many Lowered graphs this thread has run (a caller compares it around a compiled call to
    see whether dynamo ran the module on the device at all, or eagerly: its recompile limit)."""
    return getattr(_runs, "n", 0)


def is_cancel_or_oom(exc: BaseException) -> bool:
    """A cancel (ComfyUI's InterruptProcessingException and its kin) or torch's out-of-memory
    error: ComfyUI handles both itself (the latter with its advice), so they pass unwrapped."""
    names = {c.__name__ for c in type(exc).__mro__}
    return "InterruptProcessingException" in names or "OutOfMemoryError" in names or \
        any("Interrupt" in n or "Cancel" in n for n in names)


def _passes_through(exc: BaseException) -> bool:
    """Exceptions a compiled graph re-raises as they are: the pack's own errors (they name the op
    already), a cancel or torch's out-of-memory error."""
    return isinstance(exc, AnyDeviceError) or is_cancel_or_oom(exc)


def _shapes(vals) -> str:
    out = []
    for v in vals if isinstance(vals, (list, tuple)) else (vals,):
        shape = getattr(v, "shape", None)
        if shape is not None:
            out.append(f"{tuple(shape)} {str(getattr(v, 'dtype', '')).replace('torch.', '')}".strip())
    return ", ".join(out) or "no tensors"


class AnyDeviceCompileError(AnyDeviceError):
    """A model the backend cannot take: an op with no fallback, a dtype the device cannot compute."""


class AnyDeviceRunError(AnyDeviceError):
    """A compiled graph's op failed on the device (e.g. a result over ANYDEVICE_MAX_TENSOR_MB)."""


def _torch():
    import torch
    return torch


# ---- the interpreter -------------------------------------------------------------------------------
class Dev:
    """A native array on the device (host values are torch tensors; this tells them apart, also on
    the PyTorch backends whose native arrays are tensors)."""
    __slots__ = ("a",)

    def __init__(self, a):
        self.a = a


class Pending:
    """An output of a graph being recorded: its device array ``a`` (read after the graph ran) and traced
    ``meta``; ``a`` None: ``meta`` is a folded host value (cloned per call)."""
    __slots__ = ("a", "meta")

    def __init__(self, a, meta):
        self.a, self.meta = a, meta


class _Ctx:
    __slots__ = ("be", "node", "out", "used", "op_name", "owner", "act")

    def constant(self, key, build):
        c = self.owner._consts
        if key not in c:
            arr = build()
            c[key] = self.be.to_device(arr, "compile", "constant", constant=True)
            self.owner.count.transfer("constants", arr.nbytes)
        return c[key]


def _op_name(target) -> str:
    name = getattr(target, "__name__", None) or str(target)
    s = str(target)
    return s if s.startswith("aten.") else name


def _meta(node):
    return node.meta.get("val", node.meta.get("example_value")) if hasattr(node, "meta") else None


def _is_tensor_meta(v) -> bool:
    torch = _torch()
    return isinstance(v, torch.Tensor)


def _nodes_in(x, out):
    from torch.fx import Node
    if isinstance(x, Node):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _nodes_in(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _nodes_in(y, out)
    return out


def _map(x, fn):
    from torch.fx import Node
    if isinstance(x, Node):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(_map(y, fn) for y in x)
    if isinstance(x, list):
        return [_map(y, fn) for y in x]
    if isinstance(x, dict):
        return {k: _map(v, fn) for k, v in x.items()}
    return x


def _size_ops():
    aten = _torch().ops.aten
    return {aten.sym_size, aten.sym_numel}


class Lowered:
    """A traced ATen graph, run on ``be``. Called boxed (one list of the graph's inputs)."""

    _boxed_call = True
    is_cancel_or_oom = staticmethod(is_cancel_or_oom)

    def __init__(self, gm, be, static=(), *, owner_ids=(), codes=(), name="graph", dtype=None, weights=None):
        torch = _torch()
        self.gm, self.be, self.name = gm, be, name
        #: the storage dtype of weights, inputs and device results (None: float32)
        self.dtype = None if dtype in (None, "float32") else be._storage_dtype("compile", dtype)
        #: the quantized format of the matmul / conv weights (ops/quant.py; None: stored as ``dtype``)
        self.quant = weights
        self.stats = Stats()
        self.count = Counting(self.stats)
        self.count.add("graphs")
        self._owners = [weakref.ref(t) for t in owner_ids]
        self.codes = set(codes)
        self.error: AnyDeviceError | None = None
        self.weights = Weights.of(be, self.dtype or "float32", self.quant)
        self._consts: dict = {}
        self._fold_key = None
        self._fold_host: dict = {}
        self._fold_dev: dict = {}
        gm.graph.eliminate_dead_code()
        nodes = list(gm.graph.nodes)
        self.nodes = nodes
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        self.static = {self.placeholders[i] for i in static if i < len(self.placeholders)}
        self.static_idx = sorted(i for i in static if i < len(self.placeholders))
        kind = {}  # node -> static | input | sym | const | lower | host | py | size | alias | output
        for i, n in enumerate(self.placeholders):
            m = _meta(n)
            kind[n] = "static" if n in self.static else ("input" if _is_tensor_meta(m) else "sym")
        folded = 0
        for n in nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                kind[n] = "output"
                continue
            if n.op == "get_attr":
                kind[n] = "const"
                continue
            ins = _nodes_in((n.args, n.kwargs), [])
            target = n.target
            if n.op != "call_function":
                self._refuse(n, f"{n.op} nodes have no fallback")
                kind[n] = "host"
                continue
            is_aten = isinstance(target, torch._ops.OpOverload)
            if isinstance(target, torch._ops.HigherOrderOperator) or not (is_aten or callable(target)):
                self._refuse(n, "has no fallback (a higher-order or unknown operator)")
                kind[n] = "host"
                continue
            seeded = is_aten and torch.Tag.nondeterministic_seeded in target.tags
            if all(kind[i] in ("static", "sym", "const") for i in ins) and not seeded and (is_aten or ins):
                kind[n] = "const"
                folded += 1
            elif is_aten and target.overloadpacket in _size_ops():
                kind[n] = "size"  # a size of an array: no transfer, no device work
            elif not is_aten:
                kind[n] = "py"  # operator.getitem, SymInt arithmetic: plain Python
            elif target in aten_ops.LOWERINGS:
                kind[n] = "lower"
                self._check_dtype(n)
            else:
                kind[n] = "host"
                self._check_host(n)
        self.kind = kind
        self.count.add("folded", folded)
        # weights and folded constants only a matmul / conv reads as its weight: quantized (``weights``)
        users: dict = {}
        for n in nodes:
            for x in _nodes_in((n.args, n.kwargs), []):
                users.setdefault(x, []).append(n)
        self.quant_nodes = quant_selection(nodes, kind, users, self.quant, _meta, _is_tensor_meta)
        self.act, self.alias = self._fused_acts(nodes, kind, users)
        # float8 weights (scaled-fp8 checkpoints) stay float8 where the device reads it
        self.float8 = {x: c for x, c in float8_chains(nodes, kind, users, _meta).items()
                       if FLOAT8[str(_meta(c[0]).dtype)] in be.caps.quant_formats}
        self.quant_nodes -= set(self.float8)
        self._fold_extra = {c[1] for c in self.float8.values() if c[1] is not None and kind[c[1]] == "const"}
        #: the uint8 weights only quant_ops' ops read (handed to them as HostRef: kept packed)
        self.packed_nodes = quant_ops.packed_nodes(nodes, kind)
        #: the quantized folded constants that are a weight's transpose (matmul's b = linear's w.T)
        self.quant_t = {x for x in self.quant_nodes if kind[x] == "const" and x.op == "call_function"
                        and _is_transpose(x) and _meta(x).dim() == 2}
        #: the other folded transposes of a 2-D weight only a matmul reads (uploaded as the weight: quant.Transposed)
        self.float_t = linear_transposes(be, nodes, kind, users, _meta) - self.quant_nodes - set(self.float8)
        # const nodes read by non-const nodes: the frontier uploaded (or kept on the host) per fold
        self.const_nodes = [n for n in nodes if kind[n] == "const"]
        # last use, to drop arrays as soon as possible
        last = {}
        for i, n in enumerate(nodes):
            for x in _nodes_in((n.args, n.kwargs), []):
                last[x] = i
        self.drop_after: dict[int, list] = {}
        for x, i in last.items():
            if kind.get(x) not in ("const", "static"):
                self.drop_after.setdefault(i, []).append(x)
        self.used = {}
        for n in nodes:
            idx = set()
            for u in n.users:
                if u.target is operator.getitem and isinstance(u.args[1], int):
                    idx.add(u.args[1])
                else:
                    idx.update(range(16))
            self.used[n] = idx
        self.calls = 0
        self.replays = replay.Replays.make(self)
        GRAPHS.append(weakref.ref(self))
        _report.ANY_COMPILED[0] = True

    @staticmethod
    def _fused_acts(nodes, kind, users):
        """({group_norm node: activation}, {activation node: the norm's result node}): a native_group_norm
        whose result (getitem 0, its mean and rstd unread) has one reader, an activation in
        aten_ops.FUSED_ACTS, runs both (the norm's lowering reads Lowered.act); the activation node
        then only takes the norm's result ("alias"). Likewise a convolution whose one reader is a PReLU
        of a weight (act ("prelu", the weight's node): compact upscalers' conv + PReLU pairs)."""
        aten = _torch().ops.aten
        acts = {getattr(aten, name).default: name for name in aten_ops.FUSED_ACTS}
        act, alias = {}, {}
        prelu = aten._prelu_kernel.default
        for n in nodes:
            if kind.get(n) == "lower" and n.target is aten.convolution.default:
                # a conv whose only reader is a PReLU of a weight: the conv's lowering applies it (cx.act)
                got = users.get(n, [])
                if len(got) == 1 and kind.get(got[0]) == "lower" and got[0].target is prelu \
                        and got[0].args[0] is n and len(got[0].args) == 2 and not got[0].kwargs \
                        and kind.get(got[0].args[1]) in ("static", "const"):
                    act[n] = ("prelu", got[0].args[1])
                    alias[got[0]] = n
                    kind[got[0]] = "alias"
                continue
            if kind.get(n) != "lower" or n.target is not aten.native_group_norm.default:
                continue
            got = users.get(n, [])
            if len(got) != 1 or got[0].target is not operator.getitem or got[0].args[1] != 0:
                continue
            readers = users.get(got[0], [])
            if len(readers) == 1 and kind.get(readers[0]) == "lower" and readers[0].target in acts \
                    and len(readers[0].args) == 1 and not readers[0].kwargs:
                act[n] = aten_ops.FUSED_ACTS[acts[readers[0].target]]
                alias[readers[0]] = got[0]
                kind[readers[0]] = "alias"
        return act, alias

    @property
    def owner_ids(self) -> set:
        """ids of the (still alive) weights this graph was compiled for."""
        return {id(t) for t in (r() for r in self._owners) if t is not None}

    # ---- checks at compile time (raised at the first call: the module stays usable) ---------------
    def _refuse(self, n, why):
        if self.error is None:
            self.error = AnyDeviceCompileError(
                "torch.compile(backend='anydevice')", "op", _op_name(n.target),
                f"{why}; the model cannot run on {self.be.name} (the original module is unchanged)")

    def _bad_dtype(self, v):
        torch = _torch()
        return isinstance(v, torch.Tensor) and (v.dtype.is_complex or v.dtype == torch.float64)

    def _check_dtype(self, n):
        vals = [_meta(n)] + [_meta(i) for i in _nodes_in((n.args, n.kwargs), [])]
        for v in vals:
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if self._bad_dtype(t):
                    self._refuse(n, f"works on dtype {t.dtype}, which {self.be.name} cannot compute (float32 "
                                    "device compute; float16 / bfloat16 / float32 models are supported)")
                    return

    def _check_host(self, n):
        v = _meta(n)
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if _is_tensor_meta(t) and t.dtype.is_complex:
                self._refuse(n, f"makes a {t.dtype} tensor, which {self.be.name} cannot compute")

    # ---- running ----------------------------------------------------------------------------------
    def __call__(self, args):
        if self.error is not None:
            raise self.error
        args = list(args)
        self.calls += 1
        self.count.add("calls")
        _runs.n = getattr(_runs, "n", 0) + 1
        torch = _torch()
        vkeys = {}
        for i in self.static_idx:
            if isinstance(args[i], torch.Tensor):
                vkeys[self.placeholders[i]] = version_of(args[i])
        if self.replays is not None:  # a recorded device graph of this signature (compile/replay.py)
            out = self.replays.call(self, args, vkeys)
            if out is not None:
                return out
        return self._run(args, vkeys)

    def _run(self, args, vkeys, inputs=None, pending=False, pins=None):
        """The graph interpreted op by op. ``inputs``: device arrays of input nodes (uploaded already);
        ``pending``: the outputs' device arrays are returned unread (``Pending``: a graph being recorded);
        ``pins``: a dict that collects the weights' and constants' device arrays the ops read."""
        torch = _torch()
        be, kind = self.be, self.kind
        env = {}
        for i, n in enumerate(self.placeholders):
            env[n] = args[i]
        if self.const_nodes:
            self._fold(env, vkeys)
        uploaded: dict = dict(inputs or {})
        downloaded: dict = {}

        def dev(x):
            a = dev_(x)
            if pins is not None and kind.get(x) in ("static", "const"):
                pins[id(a)] = a
            return a

        def dev_(x):
            """The native array of node x (uploaded once per call where it is a host tensor)."""
            if x in self._fold_dev:  # a folded constant on the device (its host value may be gone)
                return self._fold_dev[x]
            v = env[x] if x in env else self._fold_host.get(x)
            if isinstance(v, Dev):
                return v.a
            if not isinstance(v, torch.Tensor):
                return v
            if x in uploaded:
                return uploaded[x]
            k = kind[x]
            if x in self.packed_nodes:
                return quant_ops.HostRef(v, None if k == "input" else vkeys.get(x) or version_of(v))
            if k == "static":
                a = self.weights.get(v, vkeys.get(x), self.count, quantize=x in self.quant_nodes)
            elif k == "const":
                a = self._fold_dev.get(x)
                if a is None and x in self.float8:  # float8 bytes and their scale, as the checkpoint has them
                    w8, sc, tr = self.float8[x]
                    sv = None if sc is None else (env[sc] if sc in env else self._fold_host.get(sc))
                    a = self._fold_dev[x] = float8_upload(be, env[w8], sv, tr)
                    self.count.transfer("constants", a.nbytes)
                elif a is None and x in self.quant_nodes:  # a (transposed) linear weight, quantized
                    a = self._fold_dev[x] = quantized_upload(be, v, self.quant, x in self.quant_t)
                    self.count.transfer("constants", a.nbytes)
                elif a is None and x in self.float_t:  # a linear weight's transpose: the weight as stored, (N, K)
                    a = self._fold_dev[x] = _quant.Transposed(be.to_device(v.t(), "compile", "constant", constant=True,
                                                                           dtype=self.weights.store(v)))
                    self.count.transfer("constants", self.weights.itemsize(v) * v.numel())
                elif a is None:
                    a = self._fold_dev[x] = be.to_device(v, "compile", "constant", constant=True,
                                                         dtype=self.weights.store(v))
                    self.count.transfer("constants", self.weights.itemsize(v) * v.numel())
            else:
                a = self.upload_input(v, x.name)
            uploaded[x] = a
            return a

        def host(x):
            """Node x's value as a host torch tensor of its traced dtype (downloaded once per call)."""
            v = env[x] if x in env else self._fold_host.get(x)
            if not isinstance(v, Dev):
                return v
            if x in downloaded:
                return downloaded[x]
            t = self._download(v.a, _meta(x))
            downloaded[x] = t
            return t

        for i, n in enumerate(self.nodes):
            k = kind[n]
            # by elapsed time, across calls (a model of many short graphs checks as often as one long
            # one): a cancel lands within about CANCEL_EVERY of work
            if time.monotonic() >= getattr(_runs, "next_check", 0.0):
                cancel.check()
                _runs.next_check = time.monotonic() + CANCEL_EVERY
            try:
                if k in ("static", "input", "sym", "const"):
                    pass
                elif k == "output":
                    return self._outputs(n, env, host, pending)
                elif k == "py":
                    args_, kwargs_ = _map((n.args, n.kwargs), lambda x: env[x] if x in env else self._fold_host.get(x))
                    env[n] = n.target(*args_, **kwargs_)
                elif k == "lower":
                    env[n] = self._lower(n, dev, host)
                elif k == "alias":  # an activation its norm computed (_fused_acts)
                    env[n] = env[self.alias[n]]
                elif k == "size":
                    v = env[n.args[0]] if n.args[0] in env else self._fold_host.get(n.args[0])
                    shape = be._shape(v.a) if isinstance(v, Dev) else tuple(v.shape)
                    name = n.target.overloadpacket.__name__
                    env[n] = math.prod(shape) if name == "sym_numel" else shape[int(n.args[1])]
                else:
                    env[n] = self._host(n, host, why="not in the lowering table")
            except Exception as exc:  # noqa: BLE001 - said as the pack's error: the op, the node, the shapes
                if _passes_through(exc):
                    raise
                ins = [_meta(x) for x in _nodes_in((n.args, n.kwargs), [])]
                raise AnyDeviceRunError(
                    f"anydevice compile: {_op_name(n.target)} (node {n.name}) on {be.name}", None, None,
                    f"failed on inputs of shape {_shapes(ins)}: {type(exc).__name__}: {exc}") from exc
            for x in self.drop_after.get(i, ()):
                env.pop(x, None)
                uploaded.pop(x, None)
                downloaded.pop(x, None)
        raise AssertionError("graph without output")

    def upload_input(self, v, name: str):
        """A call's host input ``v`` on the device, stored as the graph's dtype (counted as an upload)."""
        a = self.be.to_device(v, "compile", name, dtype=self.weights.store(v))
        self.count.transfer("uploads", self.weights.itemsize(v) * v.numel())
        return a

    def _download(self, a, meta):
        torch = _torch()
        arr = self.be.to_numpy(a)
        self.count.transfer("downloads", 4 * arr.size)
        if self.be.host_memory or not arr.flags.writeable or not arr.flags.owndata:
            arr = np.array(arr, np.float32, order="C")  # the caller owns what it gets; device arrays stay intact
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        t = torch.from_numpy(arr.reshape(arr.shape))
        if meta is not None and _is_tensor_meta(meta):
            t = t.to(dtype=meta.dtype) if meta.dtype != torch.float32 else t
            if meta.device.type != "cpu" and meta.device.type != "meta":
                t = t.to(meta.device)
        return t

    def _lower(self, n, dev, host):
        fn = aten_ops.LOWERINGS[n.target]
        cx = _Ctx()
        cx.be, cx.node, cx.out, cx.used, cx.op_name, cx.owner = self.be, n, _meta(n), self.used[n], str(n.target), self
        cx.act = self.act.get(n)
        if isinstance(cx.act, tuple):  # (activation, its weight's node): the weight's value
            cx.act = (cx.act[0], _map(cx.act[1], dev))
        args, kwargs = _map((n.args, n.kwargs), dev)
        try:
            res = fn(cx, *args, **kwargs)
        except aten_ops.Unsupported as e:
            return self._host(n, host, why=str(e))
        except AnyDeviceError as e:
            raise AnyDeviceRunError(f"anydevice compile: {n.target} (node {n.name}) on {self.be.name}",
                                    None, None, str(e)) from e
        multi = isinstance(res, tuple)
        res = tuple(None if r is None else self._round(r) for r in res) if multi else self._round(res)
        if _report.COUNT_MOVED[0]:
            self.count.add("moved", self._nbytes((args, kwargs, res)))
        return tuple(None if r is None else Dev(r) for r in res) if multi else Dev(res)

    def _nbytes(self, x) -> int:
        """Device bytes of the native arrays in ``x`` (nested lists, tuples and dicts)."""
        if isinstance(x, (list, tuple)):
            return sum(self._nbytes(y) for y in x)
        if isinstance(x, dict):
            return sum(self._nbytes(y) for y in x.values())
        return device_nbytes(self.be, x) if isinstance(x, self.be.native_types) else 0

    @property
    def folded_bytes(self) -> int:
        """Device bytes of the folded constants this graph keeps (e.g. transposed linear weights)."""
        return sum(device_nbytes(self.be, a) for a in self._fold_dev.values())

    def _round(self, a):
        """A device op's float32 result stored in the graph's dtype (a model run in half rounds every op)."""
        if self.dtype is None or not isinstance(a, self.be.native_types) or self.be._dtype(a) != "float32":
            return a
        return self.be._cast(a, self.dtype)

    def _host(self, n, host, why):
        self.count.fallback(_op_name(n.target), why, self.be.name)
        args, kwargs = _map((n.args, n.kwargs), host)
        return n.target(*args, **kwargs)

    def _outputs(self, n, env, host, pending=False):
        torch = _torch()

        def out(x):
            v = env[x] if x in env else self._fold_host.get(x)
            if isinstance(v, Dev):
                return Pending(v.a, _meta(x)) if pending else host(x)
            if isinstance(v, torch.Tensor) and self.kind.get(x) == "const":
                return Pending(None, v) if pending else v.clone()  # a folded value: the caller may write into it
            if pending and isinstance(v, torch.Tensor):
                raise AnyDeviceRunError("anydevice compile", "output", x.name,
                                        "is a host tensor of this call: the graph is not recorded")
            return v
        return list(_map(n.args[0], out))

    def collect(self, outs):
        """A recorded graph's outputs (``_run(pending=True)``) read back: device arrays downloaded, folded
        values cloned."""
        def one(v):
            if isinstance(v, Pending):
                return v.meta.clone() if v.a is None else self._download(v.a, v.meta)
            if isinstance(v, (list, tuple)):
                return type(v)(one(y) for y in v)
            return v
        return [one(v) for v in outs]

    # ---- constant folding ----------------------------------------------------------------------
    def _fold(self, env, vkeys):
        torch = _torch()
        syms = tuple(env[n] for n in self.placeholders if self.kind[n] == "sym")
        key = (tuple(vkeys.get(n) for n in self.placeholders if n in vkeys), syms)
        if key == self._fold_key:
            return
        vals = {}

        def get(x):
            return vals[x] if x in vals else env[x]
        with torch.no_grad():
            for n in self.const_nodes:
                if n.op == "get_attr":
                    obj = self.gm
                    for part in n.target.split("."):
                        obj = getattr(obj, part)
                    vals[n] = obj
                    continue
                args, kwargs = _map((n.args, n.kwargs), get)
                vals[n] = n.target(*args, **kwargs)
        # keep what a non-constant node or the output reads
        keep = {}
        for n in self.nodes:
            if self.kind[n] != "const":
                for x in _nodes_in((n.args, n.kwargs), []):
                    if self.kind.get(x) == "const":
                        keep[x] = vals[x]
        for x in self._fold_extra:  # float8 weights' scales (read by float8_upload)
            keep[x] = vals[x]
        self._fold_host, self._fold_dev, self._fold_key = keep, {}, key
