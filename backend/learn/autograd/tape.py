"""Reverse-mode autograd over the op contract, on the backend's own device.

ComfyUI runs nodes under ``torch.inference_mode()``, so training cannot lean on torch's autograd.
This tape records the contract ops (``Backend`` methods, by name) applied to ``Var`` values and
replays their backward rules (``rules_*.py``, registered with ``@rule``) in reverse order. Values
and gradients are the backend's native arrays: a chain of ops and its backward stay on the device.

    from anydevice.backend import get_backend; from anydevice.backend.learn import autograd as ag
    be = get_backend("opencl")
    x = ag.Var(be, images)                              # a constant (NumPy, torch or native)
    w = ag.Var(be, w0, requires_grad=True)
    y = ag.F.conv2d(x, w, None, padding=1)              # any contract op, by its Backend name
    loss = ag.F.mse_loss(y, target)
    loss.backward()                                     # w.grad: a native array of w's shape
    gw, = ag.grad(loss, [w])                            # or: gradients returned, nothing kept

A backward rule receives a ``Ctx`` (the backend, the op's arguments bound to their names with
tensors as native arrays, the output) and the output gradient, and returns a dict: argument name
-> gradient (a native array, or a list of them for list arguments such as ``cat``'s tensors;
None for no gradient). Gradients of broadcast inputs may be returned at the broadcast shape: the
tape sums them to the input's shape (``sum_to``).

As in torch, a backward frees the graph it ran through: a second backward that reaches it raises
("Trying to backward through the graph a second time") unless the first was given
``retain_graph=True``, and then it accumulates into ``.grad`` again. (torch raises only at ops
that kept tensors for their backward; the tape raises at any op already run back through.)
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...system.errors import AnyDeviceError
from ...system.memstat import planning

_GRAD_ENABLED = contextvars.ContextVar("anydevice_grad_enabled", default=True)

#: op name -> backward rule ``fn(ctx, gy) -> {arg name: gradient}``
RULES: dict[str, Callable] = {}
#: ops whose outputs never carry a gradient (comparisons, integer results)
NON_DIFFERENTIABLE: set[str] = {"eq", "ne", "lt", "le", "gt", "ge", "compare"}


#: multi-output ops whose rule follows the first output's gradient only (batch_norm's updated running
#: statistics carry none): the rule gets that gradient alone, and nothing flows without it
FIRST_ONLY = frozenset({"batch_norm"})


def rule(*ops: str):
    """Register a backward rule for one or more contract ops (by ``Backend`` method name)."""
    def deco(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


@contextlib.contextmanager
def no_grad():
    """Ops inside record nothing (evaluation, optimizer updates)."""
    token = _GRAD_ENABLED.set(False)
    try:
        yield
    finally:
        _GRAD_ENABLED.reset(token)


def is_grad_enabled() -> bool:
    return _GRAD_ENABLED.get()


# ----------------------------------------------------------------------------------------------
class Var:
    """A value on a backend's device, optionally recorded for gradients.

    ``data``: the native array. ``grad``: the accumulated gradient after ``backward()`` (a native
    array) for leaves with ``requires_grad``. Arithmetic operators map to contract ops."""

    __slots__ = ("be", "data", "requires_grad", "grad", "_node", "_index", "name", "__weakref__")
    __array_priority__ = 1000  # numpy operands defer to Var's reflected operators

    def __init__(self, be, data, requires_grad: bool = False, name: str | None = None):
        self.be = be
        self.data = data if isinstance(data, be.native_types) and not _is_host(data) \
            else be.to_device(data, "Var", name or "data")
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._node: Node | None = None
        self._index = 0
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.be._shape(self.data))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def numpy(self) -> np.ndarray:
        return np.asarray(self.be.to_numpy(self.data))

    def item(self) -> float:
        return float(self.numpy().reshape(-1)[0])

    def detach(self) -> "Var":
        return Var(self.be, self.data)

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every reachable leaf's ``.grad`` that requires it. As in
        torch, the graph is freed: a second backward through it is an error unless the first was
        given ``retain_graph=True``."""
        backward([self], None if gradient is None else [gradient], accumulate=True, retain_graph=retain_graph)

    def __repr__(self) -> str:
        flag = ", requires_grad" if self.requires_grad else ""
        op = f", from {self._node.op}" if self._node is not None else ""
        return f"Var(shape={self.shape}{flag}{op}, on {self.be.name})"

    # arithmetic (torch's operators); a number on either side stays a number
    def __add__(self, o): return apply("add", self, o)
    def __radd__(self, o): return apply("add", o, self)
    def __sub__(self, o): return apply("sub", self, o)
    def __rsub__(self, o): return apply("sub", o, self)
    def __mul__(self, o): return apply("mul", self, o)
    def __rmul__(self, o): return apply("mul", o, self)
    def __truediv__(self, o): return apply("div", self, o)
    def __rtruediv__(self, o): return apply("div", o, self)
    def __pow__(self, o): return apply("pow", self, o)
    def __matmul__(self, o): return apply("matmul", self, o)
    def __rmatmul__(self, o): return apply("matmul", o, self)
    def __neg__(self): return apply("neg", self)


@dataclass
class Ctx:
    """What a backward rule sees of one recorded op."""
    be: Any
    op: str
    #: every argument bound to its name (defaults applied); tensors as native arrays, lists of
    #: tensors as lists of native arrays, numbers and options as given
    args: dict
    #: the op's result: a native array, or a tuple/list of them (None entries kept)
    out: Any
    #: argument name -> True where that argument (or, for a list, any element) needs a gradient
    needs: dict = field(default_factory=dict)
    #: anything a rule wants to keep between calls (rarely needed)
    extra: dict = field(default_factory=dict)

    def __getitem__(self, name):
        return self.args[name]


class Node:
    __slots__ = ("op", "ctx", "parents", "n_out", "out_shapes")

    def __init__(self, op, ctx, parents, n_out, out_shapes):
        self.op = op
        self.ctx = ctx
        #: [(arg name, list position or None, Var)] for every Var argument
        self.parents = parents
        self.n_out = n_out
        self.out_shapes = out_shapes


# ----------------------------------------------------------------------------------------------
def _is_host(x) -> bool:
    return isinstance(x, np.ndarray) and not getattr(x, "_anydevice_native", False)


def _backend_of(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, Var):
            return v.be
        if isinstance(v, (list, tuple)):
            for e in v:
                if isinstance(e, Var):
                    return e.be
    return None


_SIGS: dict[tuple[type, str], inspect.Signature] = {}


def _signature(be, op: str) -> inspect.Signature:
    key = (type(be), op)
    sig = _SIGS.get(key)
    if sig is None:
        fn = getattr(be, op, None)
        if fn is None or op.startswith("_"):
            raise AnyDeviceError("autograd", "op", op, "is not an op of the contract")
        sig = _SIGS[key] = inspect.signature(fn)
    return sig


class _Binder:
    """An op's arguments bound to its parameter names, as ``Signature.bind`` + ``apply_defaults`` (which
    cost ~10 us an op): for signatures of plain parameters only (no ``*args`` / ``**kwargs``); anything
    unusual (a missing or unknown argument) is left to ``Signature.bind``, which raises its own error."""
    __slots__ = ("names", "defaults", "npos")

    def __init__(self, sig: inspect.Signature):
        ps = list(sig.parameters.values())
        self.names = tuple(p.name for p in ps)
        self.defaults = {p.name: p.default for p in ps if p.default is not inspect.Parameter.empty}
        self.npos = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in ps)

    def bind(self, args, kwargs) -> dict | None:
        """{name: value} in the signature's order, or None (then Signature.bind decides)."""
        if len(args) > self.npos:
            return None
        got = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k in got or k not in self.names:
                return None
            got[k] = v
        out = {}
        for n in self.names:
            if n in got:
                out[n] = got[n]
            elif n in self.defaults:
                out[n] = self.defaults[n]
            else:
                return None
        return out


def _binder(be, op: str):
    """The op's _Binder, or None where its signature has ``*args`` / ``**kwargs`` (view, expand...)."""
    key = (type(be), op)
    b = _BINDERS.get(key, _BINDERS)
    if b is _BINDERS:
        sig = _signature(be, op)
        plain = all(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                    for p in sig.parameters.values())
        b = _BINDERS[key] = _Binder(sig) if plain else None
    return b


_BINDERS: dict = {}


def _tensorish(be, v) -> bool:
    """A floating-point array argument, uploaded once so a backward rule can reuse it. Integer
    arrays (class indices) are left as given: the op reads them itself."""
    if isinstance(v, np.ndarray):
        return v.dtype.kind == "f"
    if isinstance(v, be.native_types):
        return True
    if type(v).__module__.startswith("torch") and hasattr(v, "is_floating_point"):
        return bool(v.is_floating_point())
    return False


#: ops whose forward makes a plan the backward rule reads: op -> the contract method that runs the op and
#: returns (result, plan), so the plan is made once and handed over (rules_conv reads ctx.extra["plan"])
PLANNED = {"conv2d": "_conv2d_planned", "conv_transpose2d": "_conv_transpose2d_planned"}


def apply(op: str, /, *args, be=None, **kwargs):
    """Run contract op ``op`` (a ``Backend`` method name) on Vars, arrays and options; record it
    when an input requires a gradient. Returns a Var (or a tuple of Vars for multi-output ops)."""
    be = be or _backend_of(args, kwargs)
    if be is None:
        raise AnyDeviceError("autograd", "inputs", op, "no Var among the inputs: pass be=")
    binder = _binder(be, op)
    arguments = None if binder is None else binder.bind(args, kwargs)
    sig = _signature(be, op)
    if arguments is None:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise AnyDeviceError(op, "arguments", f"{len(args)} positional, {sorted(kwargs)}", str(exc)) from None
        bound.apply_defaults()
        arguments = bound.arguments
    natives: dict = {}
    parents = []
    needs: dict = {}
    for name, v in arguments.items():
        if isinstance(v, Var):
            if v.be is not be:
                raise AnyDeviceError(op, name, v, f"is on backend {v.be.name}, the op runs on {be.name}")
            natives[name] = v.data
            if v.requires_grad:
                parents.append((name, None, v))
                needs[name] = True
        elif isinstance(v, (list, tuple)) and v and any(isinstance(e, Var) for e in v):
            items = []
            for i, e in enumerate(v):
                if isinstance(e, Var):
                    items.append(e.data)
                    if e.requires_grad:
                        parents.append((name, i, e))
                        needs[name] = True
                elif _tensorish(be, e):
                    items.append(be.to_device(e, op, name))
                else:
                    items.append(e)
            natives[name] = type(v)(items) if isinstance(v, tuple) else items
        elif v is not None and _tensorish(be, v):
            natives[name] = be.to_device(v, op, name)  # once: the rule reuses it
        else:
            natives[name] = v
    record = bool(parents) and _GRAD_ENABLED.get() and op not in NON_DIFFERENTIABLE
    if record and op == "dropout" and natives.get("seed") is None:
        # a fresh mask each call, as seed=None promises, and one the backward rule can redraw
        natives["seed"] = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> 1)
    plan = None
    if record and op in PLANNED:  # the forward's plan goes to the backward rule (ctx.extra["plan"])
        with planning(be):
            out, plan = _call(getattr(be, PLANNED[op]), sig, natives)
    elif binder is not None:  # plain parameters: by name
        out = getattr(be, op)(**natives)
    else:
        out = _call(getattr(be, op), sig, natives)
    if record and op not in RULES:
        raise AnyDeviceError(op, "input", "a Var that requires grad",
                             f"op {op!r} has no backward rule yet; wrap it in autograd.no_grad()")
    multi = isinstance(out, (tuple, list))
    outs = list(out) if multi else [out]
    node = None
    if record:
        ctx = Ctx(be, op, natives, out, needs)
        if plan is not None:
            ctx.extra["plan"] = plan
        node = Node(op, ctx, parents, len(outs), [None if o is None else tuple(be._shape(o)) for o in outs])
    wrapped = []
    for i, o in enumerate(outs):
        if o is None:
            wrapped.append(None)
            continue
        var = Var(be, o, requires_grad=record)
        if record:
            var._node, var._index = node, i
        wrapped.append(var)
    return tuple(wrapped) if multi else wrapped[0]


def _call(fn, sig: inspect.Signature, natives: dict):
    """Call ``fn`` with the bound arguments: positionally up to a ``*args`` parameter (view,
    expand), by keyword after it."""
    args, kwargs = [], {}
    star = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values())
    for name, p in sig.parameters.items():
        if name not in natives:
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(natives[name])
            star = False
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(natives[name])
        elif star and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            args.append(natives[name])
        else:
            kwargs[name] = natives[name]
    return fn(*args, **kwargs)


class _Functional:
    """``F.conv2d(x, w, ...)`` == ``apply("conv2d", x, w, ...)``."""

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)

        def fn(*args, **kwargs):
            return apply(op, *args, **kwargs)
        fn.__name__ = op
        return fn


F = _Functional()


# ----------------------------------------------------------------------------------------------
def sum_to(be, g, shape: tuple[int, ...]):
    """Sum a broadcast gradient ``g`` down to ``shape`` (torch's sum_to_size)."""
    gs = tuple(be._shape(g))
    shape = tuple(shape)
    if gs == shape:
        return g
    lead = len(gs) - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and gs[i + lead] != 1)
    if dims:
        g = be.sum(g, dim=dims, keepdim=True)
    return be.reshape(g, shape)


def _topo(roots: list[Var]) -> list[Node]:
    order, seen = [], set()
    stack = [(r._node, False) for r in roots if r._node is not None]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for _, _, v in node.parents:
            if v._node is not None and id(v._node) not in seen:
                stack.append((v._node, False))
    order.reverse()  # outputs first
    return order


def _accumulate(be, store: dict, key, g):
    prev = store.get(key)
    store[key] = g if prev is None else be.add(prev, g)


def _zeros(be, shape):
    return be.to_device(np.zeros(shape, np.float32), "backward", "zeros", constant=True)


def backward(outputs: list[Var], gradients=None, inputs: list[Var] | None = None,
             accumulate: bool = False, retain_graph: bool = False):
    """Back-propagate from ``outputs`` (seeded with ``gradients``, ones for a single element).

    ``inputs`` given: return their gradients (None where unreachable). ``accumulate``: add into
    ``.grad`` of every leaf that requires a gradient (``Var.backward``). The tape is freed unless
    ``retain_graph``."""
    if not outputs:
        return []
    be = outputs[0].be
    grads: dict = {}  # (id(node), out index) or ("leaf", id(var)) -> gradient
    leaves: dict[int, Var] = {}
    for i, out in enumerate(outputs):
        g = None if gradients is None else gradients[i]
        if g is None:
            if math.prod(out.shape) != 1:
                raise AnyDeviceError("backward", "gradient", out.shape,
                                     "is needed for an output of more than one element")
            g = be.to_device(np.ones(out.shape, np.float32), "backward", "seed", constant=True)
        elif isinstance(g, Var):
            g = g.data
        else:
            g = be.to_device(g, "backward", "gradient")
        if out._node is None:
            if out.requires_grad:
                _accumulate(be, grads, ("leaf", id(out)), g)
                leaves[id(out)] = out
            continue
        _accumulate(be, grads, (id(out._node), out._index), g)
    for node in _topo(outputs):
        gys = [grads.pop((id(node), i), None) for i in range(node.n_out)]
        if all(g is None for g in gys):
            continue
        if node.n_out == 1:
            gy = gys[0]
        elif node.op in FIRST_ONLY:  # the other outputs carry no gradient: no zeros made for them
            if gys[0] is None:
                continue
            gy = gys[0]
        else:  # unused outputs of a multi-output op get zeros where a rule needs them
            gy = [g if g is not None or s is None else _zeros(be, s) for g, s in zip(gys, node.out_shapes)]
        if node.ctx is None:
            raise AnyDeviceError("backward", "graph", f"freed at op {node.op!r}",
                                 "Trying to backward through the graph a second time: the first backward freed "
                                 "it; pass retain_graph=True to the first backward (Var.backward(retain_graph=True)) "
                                 "to run it again")
        result = RULES[node.op](node.ctx, gy) or {}
        for name, pos, var in node.parents:
            g = result.get(name)
            if g is not None and pos is not None:
                g = g[pos]
            if g is None:
                continue
            g = sum_to(be, g, var.shape)
            if var._node is None:
                _accumulate(be, grads, ("leaf", id(var)), g)
                leaves[id(var)] = var
            else:
                _accumulate(be, grads, (id(var._node), var._index), g)
        if not retain_graph:
            _free(node)
    if accumulate:
        for key, var in leaves.items():
            g = grads.get(("leaf", key))
            if g is not None and var.requires_grad:
                var.grad = g if var.grad is None else be.add(var.grad, g)
    if inputs is not None:
        return [grads.get(("leaf", id(v))) if v._node is None else None for v in inputs]
    return None


def _free(node: Node) -> None:
    """Drop what ``node`` kept for its backward (backward ran through it). The node stays in its
    outputs' ``_node``, so a second backward that reaches it raises, as torch's does; its inputs are
    let go, so the values below it are freed as before."""
    node.ctx = None
    node.parents = []


def grad(output: Var, inputs: list[Var], gradient=None, retain_graph: bool = False) -> list:
    """Gradients of ``output`` with respect to the leaf Vars ``inputs`` (native arrays; None for
    inputs ``output`` does not depend on). Nothing is accumulated into ``.grad``."""
    return backward([output], None if gradient is None else [gradient], inputs=inputs,
                    retain_graph=retain_graph)
