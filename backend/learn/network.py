"""A neural network as a value: layer specs, weights, and the forward pass through the autograd tape.

``Network`` is immutable (ComfyUI passes it between nodes and caches it): every change returns a
new one. Layers are JSON-able dicts ``{"type": ..., **config}`` with torch's names; the weights are
float32 host arrays keyed as ``torch.nn.Sequential`` keys them (``"0.weight"``, ``"0.bias"``, a
residual block's body ``"3.body.0.weight"``), the batch-norm running statistics ``buffers`` keyed
the same way (``"1.running_mean"``, ``"1.running_var"``).

    net = (Network.empty()
           .add("conv2d", out_channels=16, kernel_size=3, padding=1)
           .add("activation", name="relu")
           .residual(Network.empty().add("conv2d", out_channels=16, kernel_size=3, padding=1))
           .add("pool", kind="adaptive_avg", output_size=1)
           .add("flatten")
           .add("linear", out_features=10))
    net = net.initialized((1, 3, 32, 32), seed=0)     # torch's default init, seeded (init.py)
    y = net.forward(be, images)                       # an autograd Var on be's device
    net.to_torch()                                    # the same architecture and weights in torch

Layer types (inputs are (N, C, H, W) images or (N, F) features; N is any batch size):

- ``conv2d(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
  padding_mode="zeros")``: in_channels from the input; padding may be "same" / "valid".
- ``conv_transpose2d(out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
  bias=True, dilation=1)``: in_channels from the input (weight (in, out/groups, kH, kW)).
- ``linear(out_features, bias=True)``: in_features from the input's last dim.
- ``activation(name, **params)``: relu, leaky_relu(negative_slope), elu(alpha),
  gelu(approximate), silu, sigmoid, tanh, softplus(beta, threshold), softmax(dim=1).
- ``batch_norm(eps=1e-5, momentum=0.1, affine=True)``: BatchNorm2d on 4-D, BatchNorm1d on 2-D
  input; running statistics in ``buffers`` (updated by training, used in evaluation).
- ``group_norm(num_groups, eps=1e-5, affine=True)``.
- ``layer_norm(eps=1e-5, elementwise_affine=True)``: over every dim but the batch (C, H, W), as
  ``nn.LayerNorm(x.shape[1:])``.
- ``instance_norm(eps=1e-5, affine=False)``: InstanceNorm2d (no running statistics).
- ``pool(kind, kernel_size=None, stride=None, padding=0, output_size=None)``: kind max / avg
  (kernel_size, stride, padding) or adaptive_avg / adaptive_max (output_size).
- ``upsample(scale_factor, mode="nearest", align_corners=None)``.
- ``dropout(p=0.5)``: only in training; the mask is seeded (``forward(seed=)``), not torch's stream.
- ``flatten``: (N, ...) -> (N, prod(...)).
- ``residual(body)``: y = x + body(x), body a list of layers (``Network.residual(net)``).

A spec may come from a file (netio.py), so it is untrusted: every setting is checked (ints within
2**31 - 1, floats finite and within float32's range, no unknown settings or keys), residual blocks
nest at most ``MAX_DEPTH`` (64) deep, a network has at most ``MAX_LAYERS`` layers, and every size
is checked against the memory limit (ANYDEVICE_MAX_TENSOR_MB, default half the free memory) before
anything is made: a layer's weights when it is made (for its smallest input), all weights once the
input shape is known (``param_shapes``, ``initialized``), one sample's layer outputs in ``shapes``,
the batch's on the backend's device in ``forward``. Each refusal is an AnyDeviceError naming the
layer by index and type ("layer 3.body.0 (conv2d)"), the setting and its value.

What each kind of layer is (its settings, shapes, parameters, init, forward, torch module) is its
class in ``backend/learn/layers/`` (the registry ``LAYERS``); reading a spec's JSON is
``backend/learn/spec.py``. This module holds the Network value and the walks over its layers.
"""
from __future__ import annotations

import json
import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..system.errors import AnyDeviceError
from .layers import (ACTIVATION_PARAMS, LAYER_TYPES, LAYERS, POOL_KINDS, UPSAMPLE_MODES, Run,  # noqa: F401
                           layer_seed, layer_shape, normalize_layer, settings_text, where_of)
from .layers.base import layer_from_dict
from .layers.settings import (MAX_DEPTH, MAX_FLOAT, MAX_INT, MAX_LAYERS, OP, _err, _is_int, _mem,  # noqa: F401
                                    _over_limit, _two)
from .spec import FORMAT, MAX_JSON_DEPTH, MAX_SPEC_CHARS, check_in_shape, check_spec, read_spec  # noqa: F401

# the names this module has always had (netio, train, bench_train, the tests import them from here)
_layer_shape, _where, _settings_text, _layer_from_dict, _check_in_shape, _check_spec = \
    layer_shape, where_of, settings_text, layer_from_dict, check_in_shape, check_spec

__all__ = ["Network", "layer_seed", "normalize_layer", "param_names", "LAYER_TYPES", "LAYERS", "ACTIVATION_PARAMS",
           "POOL_KINDS", "UPSAMPLE_MODES", "FORMAT", "MAX_DEPTH", "MAX_LAYERS", "MAX_SPEC_CHARS", "MAX_JSON_DEPTH",
           "MAX_INT", "MAX_FLOAT"]


#: Network -> {(input shape, parameter shapes): the layers' output shapes} of shapes() that passed
_SHAPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# ---- the value ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Network:
    """A network: its layers (canonical dicts, residual bodies inside their blocks), parameters and
    buffers (None / {} until ``initialized``) and the input shape they were made for. Immutable."""

    layers: tuple = ()
    params: dict | None = None
    buffers: dict = field(default_factory=dict)
    #: the input shape the parameters were made for (set by ``initialized``), or None
    in_shape: tuple | None = None

    # ---- building ----------------------------------------------------------------------------
    @staticmethod
    def empty() -> "Network":
        return Network()

    def add(self, type: str, **config) -> "Network":
        """A new network with one more layer (settings checked; AnyDeviceError naming the setting).
        The parameters are kept; the new layer's are made by ``initialized``."""
        layer = normalize_layer(type, config, f"layer {len(self.layers)}")
        layers = self.layers + (layer,)
        check_spec(layers, f"layer {len(self.layers)} ({type})")
        return Network(layers, self.params, self.buffers, self.in_shape)

    def residual(self, body: "Network") -> "Network":
        """A new network with a residual block appended: y = x + body(x)."""
        if not isinstance(body, Network):
            raise _err("residual", "body", body, "must be a Network")
        return self.add("residual", body=list(body.layers))

    def with_params(self, params, buffers=None) -> "Network":
        """The same layers with these parameters (and buffers): float32 arrays (NumPy, torch or
        autograd Vars, which are kept as they are). Checked against the shapes the layers need
        where the input shape is known."""
        p = {k: _param_value(k, v) for k, v in dict(params).items()} if params is not None else None
        b = {k: _param_value(k, v) for k, v in dict(buffers if buffers is not None else self.buffers).items()}
        net = Network(self.layers, p, b, self.in_shape)
        if self.in_shape is not None and p is not None:
            net._check_params(self.in_shape)
        return net

    # ---- shapes ------------------------------------------------------------------------------
    def shapes(self, in_shape: tuple) -> list[tuple]:
        """Each layer's output shape for input ``in_shape``; AnyDeviceError naming the layer (its
        index and type) where a layer does not take its input."""
        in_shape = check_in_shape(in_shape)
        key = (in_shape, None if self.params is None else
               tuple((k, getattr(v, "shape", None)) for k, v in self.params.items()))
        memo = _SHAPES.setdefault(self, {})
        if key in memo:  # checked before (a training step asks each step)
            return list(memo[key])
        out = []
        s = in_shape
        for i, layer in enumerate(self.layers):
            s = layer_shape(layer, s, str(i))
            out.append(s)
        # one sample's outputs must fit (a batch is split to fit, by predict; train checks a step)
        _check_outputs(self.layers, (1,) + in_shape[1:] if in_shape[0] > 1 else in_shape)
        if self.params is not None:
            self._check_fits(in_shape)
        if len(memo) > 16:
            memo.clear()
        memo[key] = tuple(out)
        return out

    def _check_fits(self, in_shape):
        """The parameters fit this input (a conv's in_channels, a linear's in_features...); their
        sizes are not checked against the memory limit (they are there already)."""
        ps, _ = self.param_shapes(in_shape, check_memory=False)
        for k, shape in ps.items():
            have = self.params.get(k)
            if have is not None and tuple(_shape_of(have)) != tuple(shape):
                key = k.rsplit(".", 1)[0]
                layer = _layer_at(self.layers, key)
                made = f" (made for input {self.in_shape})" if self.in_shape is not None else ""
                raise AnyDeviceError(OP, where_of(key, layer), tuple(in_shape),
                                     f"its {k.rsplit('.', 1)[1]} has shape {tuple(_shape_of(have))}{made}; this "
                                     f"input needs {tuple(shape)}")

    def out_shape(self, in_shape) -> tuple:
        s = self.shapes(in_shape)
        return s[-1] if s else check_in_shape(in_shape)

    def param_shapes(self, in_shape, check_memory: bool = True) -> tuple[dict, dict]:
        """({param name: shape}, {buffer name: shape}) for input ``in_shape``, in torch's order.
        ``check_memory``: AnyDeviceError naming the layer where its parameters, or all of them
        together, would be over the memory limit (so ``initialized`` makes nothing that large)."""
        in_shape = check_in_shape(in_shape)
        ps, bs = {}, {}
        _walk_shapes(self.layers, in_shape, "", ps, bs, check_memory)
        return ps, bs

    def num_params(self) -> int:
        return sum(math.prod(_shape_of(v)) for v in (self.params or {}).values())

    def _check_params(self, in_shape):
        ps, bs = self.param_shapes(in_shape)
        for names, have, what in ((ps, self.params or {}, "params"), (bs, self.buffers, "buffers")):
            for k, shape in names.items():
                if k not in have:
                    raise _err("with_params", what, k, "is missing")
                if tuple(_shape_of(have[k])) != tuple(shape):
                    raise _err("with_params", k, tuple(_shape_of(have[k])),
                               f"must have shape {tuple(shape)} for input {tuple(in_shape)}")
            for k in have:
                if k not in names:
                    raise _err("with_params", what, k, "no layer has this parameter")

    # ---- parameters --------------------------------------------------------------------------
    def initialized(self, in_shape: tuple, seed: int) -> "Network":
        """Parameters for input ``in_shape``: PyTorch's default initialisation (backend/learn/init.py)
        seeded per layer from ``seed``; parameters already there (of the right shape) are kept.
        Norm layers start at weight 1, bias 0, running mean 0 and variance 1."""
        if not _is_int(seed) or seed < 0:
            raise _err("initialized", "seed", seed, "must be an int >= 0")
        in_shape = check_in_shape(in_shape)
        ps, bs = self.param_shapes(in_shape)
        have = dict(self.params or {})
        params = {}
        made = {}
        by_layer, owner = {}, {}
        for k in ps:
            by_layer.setdefault(k.rsplit(".", 1)[0], []).append(k)
        for layer, key, x_shape in _param_layers(self.layers, in_shape, ""):
            names = by_layer.get(key, [])
            owner[key] = layer
            if all(k in have and tuple(_shape_of(have[k])) == tuple(ps[k]) for k in names):
                continue
            made.update(LAYERS.of(layer).init_params(layer, key, x_shape, {k: ps[k] for k in names}, seed))
        for k, shape in ps.items():
            v = have[k] if k in have and tuple(_shape_of(have[k])) == tuple(shape) else made[k]
            params[k] = _param_value(k, v)
        buffers = {}
        for k, shape in bs.items():
            old = self.buffers.get(k)
            if old is not None and tuple(_shape_of(old)) == tuple(shape):
                buffers[k] = old
            else:
                layer = owner[k.rsplit(".", 1)[0]]
                buffers[k] = LAYERS.of(layer).init_buffer(k, shape)
        return Network(self.layers, params, buffers, tuple(in_shape))

    def param_vars(self, be, requires_grad: bool = True) -> dict:
        """{name: autograd Var on ``be``} of every parameter, in torch's order (uploaded once)."""
        from .autograd import Var
        if self.params is None:
            raise _err("param_vars", "params", None, "the network has no parameters yet: call initialized() first")
        out = {}
        for k, v in self.params.items():
            if isinstance(v, Var) and v.be is be and v.requires_grad == requires_grad:
                out[k] = v
            else:
                out[k] = Var(be, _for(be, v), requires_grad=requires_grad, name=k)
        return out

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, be, x, training: bool = False, seed: int | None = None, *, params=None,
                buffers=None, return_buffers: bool = False):
        """The network on ``x`` (a Var, or an array of the input shape) on backend ``be``: an
        autograd Var, recorded where the parameters are Vars that require gradients (pass
        ``params=net.param_vars(be)``, or a network whose params are such Vars).

        ``training``: batch norm uses the batch's statistics, dropout drops (masks seeded from
        ``seed`` and the layer). ``return_buffers``: also return the updated running statistics
        ({name: native array}; in evaluation, the ones used)."""
        from .autograd import Var
        P = params if params is not None else self.params
        if P is None and _has_params(self.layers):
            raise _err("forward", "params", None, "the network has no parameters yet: call initialized() first")
        P = {k: (v if isinstance(v, Var) and v.be is be else Var(be, _for(be, v), name=k))
             for k, v in (P or {}).items()}
        B = dict(buffers if buffers is not None else self.buffers)
        B = {k: (v.data if isinstance(v, Var) and v.be is be else _for(be, v)) for k, v in B.items()}
        if not isinstance(x, Var):
            x = Var(be, x, name="input")
        # before any work: the layer whose shapes do not chain, whose output would be over the
        # memory limit on be's device, or whose weights are missing
        self.shapes(x.shape)
        _check_outputs(self.layers, tuple(x.shape), be)
        _check_present(self.layers, P, B)
        new_b: dict = {}
        y = _run(self.layers, be, x, "", P, B, new_b, bool(training), seed)
        if return_buffers:
            out_b = {k: new_b.get(k, v) for k, v in B.items()}
            return y, out_b
        return y

    __call__ = forward

    # ---- description -------------------------------------------------------------------------
    def describe(self, in_shape: tuple | None = None) -> str:
        """One line per layer: index, type and settings, output shape when the input shape is known
        (``in_shape`` or the one the network was initialised for), parameter count."""
        in_shape = in_shape if in_shape is not None else self.in_shape
        shapes = None
        if in_shape is not None:
            try:
                shapes = self.shapes(in_shape)
            except AnyDeviceError:
                shapes = None
        ps = {}
        if in_shape is not None and shapes is not None:
            ps, _ = self.param_shapes(in_shape, check_memory=False)
        lines = []
        head = f"input {tuple(in_shape)}" if in_shape is not None else "input shape not set"
        lines.append(head)
        _describe(self.layers, "", shapes, ps, lines, 0)
        total = sum(math.prod(s) for s in ps.values()) if ps else (self.num_params() if self.params else 0)
        lines.append(f"{total} parameters" + ("" if self.params is not None else " (not initialised)"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        kinds = ", ".join(_short(layer) for layer in self.layers)
        return f"Network([{kinds}]{', initialised' if self.params is not None else ''})"

    # ---- torch -------------------------------------------------------------------------------
    def to_torch(self, dtype=None):
        """``torch.nn.Sequential`` with the same architecture and weights (float32 unless ``dtype``);
        a residual block is a module with a ``body`` Sequential. Needs the parameters."""
        import torch
        if _needs_shape(self.layers):
            if self.params is None and _has_params(self.layers):
                raise _err("to_torch", "params", None, "the network has no parameters yet: call initialized() first")
            if self.in_shape is None:
                raise _err("to_torch", "in_shape", None, "the input shape is unknown: call initialized(in_shape, "
                           "seed) (it keeps the parameters there are)")
        seq = _torch_seq(self.layers, self.in_shape)
        state = {k: torch.from_numpy(np.array(_host(v), np.float32)) for k, v in (self.params or {}).items()}
        state.update({k: torch.from_numpy(np.array(_host(v), np.float32)) for k, v in self.buffers.items()})
        missing, unexpected = seq.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise _err("to_torch", "params", sorted(missing or unexpected), "do not match the torch modules")
        if dtype is not None:
            seq = seq.to(dtype)
        return seq

    # ---- JSON --------------------------------------------------------------------------------
    def spec_json(self) -> str:
        """The layers (and the input shape, where known) as JSON; no weights (netio.py saves those)."""
        d = {"format": FORMAT, "layers": list(self.layers)}
        if self.in_shape is not None:
            d["in_shape"] = list(self.in_shape)
        return json.dumps(d, sort_keys=False)

    @staticmethod
    def from_spec_json(s: str) -> "Network":
        """The network a spec (``spec_json``'s text; untrusted: a saved file's) describes, without
        parameters. Refused with an AnyDeviceError naming the layer (index and type), the setting and
        its value: anything malformed, residual blocks nested deeper than MAX_DEPTH, more than
        MAX_LAYERS layers, and any size over the memory limit (a layer's weights even for the
        smallest input; with the input shape, every layer's weights and one sample's outputs),
        all before anything is made."""
        layers, in_shape = read_spec(s, "from_spec_json")
        net = Network(layers, None, {}, None)
        if in_shape is not None:
            net.shapes(in_shape)        # chains, one sample's outputs fit
            net.param_shapes(in_shape)  # the weights fit
        return Network(layers, None, {}, in_shape)


# ---- helpers ----------------------------------------------------------------------------------
def _shape_of(v):
    return tuple(v.shape)


def _host(v) -> np.ndarray:
    from .autograd import Var
    if isinstance(v, Var):
        return v.numpy()
    if type(v).__module__.startswith("torch"):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def _for(be, v):
    """A parameter as handed to ``be``: a Var's array (host numbers where it is on another backend);
    PyTorch backends get a writable copy of a read-only host array (torch.as_tensor would share it
    and warn that it is not writable)."""
    from .autograd import Var
    if isinstance(v, Var):
        if v.be is be:
            return v.data
        v = v.numpy()
    if isinstance(v, np.ndarray) and not v.flags.writeable and be.kind == "vendor":
        return np.array(v)
    return v


def _param_value(k, v):
    """A parameter kept as a float32 host array (a private copy), or a Var as it is."""
    from .autograd import Var
    if isinstance(v, Var):
        return v
    a = _host(v)
    if a.dtype.kind not in "fiu":
        raise _err("with_params", k, a, "must be a float array")
    a = np.array(a, dtype=np.float32, copy=True)
    a.flags.writeable = False
    return a


def _layer_at(layers, key: str) -> dict:
    """The layer a parameter prefix such as "3.body.0" names."""
    parts = key.split(".")
    layer = layers[int(parts[0])]
    i = 1
    while i < len(parts):
        layer = layer["body"][int(parts[i + 1])]
        i += 2
    return layer


# ---- the walks over the layers (a residual body's layers are walked where its block is) ----------
def _bodies(layer):
    return LAYERS.of(layer).body(layer)


def _param_layers(layers, s, prefix):
    """(layer, key, input shape) of every layer with parameters or buffers, in order, recursing."""
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        kind = LAYERS.of(layer)
        body = kind.body(layer)
        if body is not None:
            yield from _param_layers(body, s, key + ".body.")
        elif kind.weighted:
            yield layer, key, s
        s = layer_shape(layer, s, key)


def _walk_shapes(layers, s, prefix, ps, bs, check_memory=True):
    """Every parameter's and buffer's shape into ps / bs, in torch's order. ``check_memory``: each
    layer's are checked against the memory limit before the next (naming the layer), then all of
    them together."""
    for layer, key, x in _param_layers(layers, s, prefix):
        p, b = LAYERS.of(layer).param_shapes(layer, key, x)
        need = 4 * sum(math.prod(v) for v in list(p.values()) + list(b.values()))
        over = _over_limit(need) if need and check_memory else None
        if over:
            made = ", ".join(f"{k.rsplit('.', 1)[1]} {v}" for k, v in list(p.items()) + list(b.items()))
            raise AnyDeviceError(OP, where_of(key, layer), tuple(x), f"its parameters ({made}; "
                                 f"{settings_text(layer)}) would need {_mem(need)} of float32, over {over}")
        ps.update(p)
        bs.update(b)
    need = 4 * (sum(math.prod(v) for v in ps.values()) + sum(math.prod(v) for v in bs.values()))
    over = _over_limit(need) if need and check_memory else None
    if over:
        raise AnyDeviceError(OP, "parameters", tuple(s), f"the network's {len(ps) + len(bs)} parameter and buffer "
                             f"tensors would need {_mem(need)} of float32 together, over {over}")


def param_names(layers, prefix: str = "") -> tuple[list, list]:
    """([param names], [buffer names]) the layers have whatever their input, in torch's order."""
    ps, bs = [], []
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        body = _bodies(layer)
        p, b = param_names(body, key + ".body.") if body is not None else LAYERS.of(layer).param_names(layer, key)
        ps += p
        bs += b
    return ps, bs


def _walk_outputs(layers, s, prefix):
    """(key, layer, input shape, output shape) of every layer, a residual body's before its block."""
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        body = _bodies(layer)
        if body is not None:
            yield from _walk_outputs(body, s, key + ".body.")
        out = layer_shape(layer, s, key)
        yield key, layer, s, out
        s = out


def _check_outputs(layers, in_shape, be=None) -> None:
    """Every layer's output (residual bodies' included) for input ``in_shape`` fits the memory limit
    of ``be``'s device (the host's without one); else AnyDeviceError naming the first layer over it,
    the settings that make it large, and the size, before any work."""
    outs = list(_walk_outputs(layers, tuple(in_shape), ""))
    if not outs:
        return
    largest = max(math.prod(o[3]) for o in outs)
    if not _over_limit(4 * largest, be):
        return
    for key, layer, s, out in outs:
        need = 4 * math.prod(out)
        over = _over_limit(need, be)
        if over:
            what = f" ({settings_text(layer)})" if settings_text(layer) else ""
            raise AnyDeviceError(OP, where_of(key, layer), tuple(s), f"its output {tuple(out)}{what} would need "
                                 f"{_mem(need)} of float32, over {over}")


def _check_present(layers, P, B) -> None:
    """Every parameter and buffer the layers use is there (a file without weights, a partial dict)."""
    ps, bs = param_names(layers)
    for names, have, what in ((ps, P, "parameters"), (bs, B, "buffers")):
        for k in names:
            if k not in have:
                key = k.rsplit(".", 1)[0]
                held = f"it has {len(have)} {what}" if have else f"it has no {what} at all (no weights)"
                raise AnyDeviceError(OP, where_of(key, _layer_at(layers, key)), k, f"the network has no {k!r} "
                                     f"({held}): train it, or load a file that holds its weights")


def _any_layer(layers, ask: str) -> bool:
    """Whether any layer, inside residual bodies too, answers yes to its class's ``ask`` method."""
    for layer in layers:
        body = _bodies(layer)
        if _any_layer(body, ask) if body is not None else getattr(LAYERS.of(layer), ask)(layer):
            return True
    return False


def _has_params(layers) -> bool:
    """Whether any layer needs parameters or buffers to run."""
    return _any_layer(layers, "has_params")


def _needs_shape(layers) -> bool:
    """Whether the torch modules need the input shape (channels, features, normalised shape)."""
    return _any_layer(layers, "needs_shape")


def _short(layer) -> str:
    return LAYERS.of(layer).short(layer)


def _describe(layers, prefix, shapes, ps, lines, depth):
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        n = sum(math.prod(v) for k, v in ps.items() if k.rsplit(".", 1)[0] == key)
        shape = f" -> {shapes[i]}" if shapes is not None else ""
        count = f"  [{n} params]" if n else ""
        lines.append(f"{'  ' * depth}{key} {LAYERS.of(layer).describe(layer)}{shape}{count}")
        body = _bodies(layer)
        if body is not None:
            _describe(body, key + ".body.", None if shapes is None else _body_shapes(body, shapes[i]), ps, lines,
                      depth + 1)


def _body_shapes(body, s):
    """The output shapes of a residual body's layers (its input shape is the block's output's)."""
    out = []
    for j, b in enumerate(body):
        s = layer_shape(b, s, str(j))
        out.append(s)
    return out


def _run(layers, be, x, prefix, P, B, new_b, training, seed):
    """The layers on Var ``x``: each layer's forward, in order (``new_b`` gets updated statistics)."""
    from .autograd import apply

    def run_body(body, y, body_prefix):
        return _run(body, be, y, body_prefix, P, B, new_b, training, seed)

    ctx = Run(be, P, B, new_b, training, seed, apply, run_body)
    for i, layer in enumerate(layers):
        x = LAYERS.of(layer).forward(layer, x, f"{prefix}{i}", ctx)
    return x


def _torch_seq(layers, s):
    """``torch.nn.Sequential`` of the layers' modules on input shape ``s`` (None where not needed)."""
    import torch
    mods = []
    for i, layer in enumerate(layers):
        mods.append(LAYERS.of(layer).to_torch(layer, s, _torch_seq))
        s = layer_shape(layer, s, str(i)) if s is not None else None
    return torch.nn.Sequential(*mods)
