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
"""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field

import numpy as np

from .errors import AnyDeviceError
from . import plans

OP = "network"
FORMAT = "anydevice.network/1"

LAYER_TYPES = ("conv2d", "conv_transpose2d", "linear", "activation", "batch_norm", "group_norm", "layer_norm",
               "instance_norm", "pool", "upsample", "dropout", "flatten", "residual")
ACTIVATION_PARAMS = {"relu": {}, "sigmoid": {}, "tanh": {}, "silu": {},
                     "leaky_relu": {"negative_slope": 0.01}, "elu": {"alpha": 1.0},
                     "gelu": {"approximate": "none"}, "softplus": {"beta": 1.0, "threshold": 20.0},
                     "softmax": {"dim": 1}}
POOL_KINDS = ("max", "avg", "adaptive_avg", "adaptive_max")
UPSAMPLE_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


# ---- config checks ----------------------------------------------------------------------------
#: residual blocks nest at most this deep (a block in a block ... in a block): every walk over the
#: layers recurses into the bodies, so a deeper spec is refused before it could exhaust the stack
MAX_DEPTH = 64
#: the most layers a network may have, the ones in residual bodies included
MAX_LAYERS = 10000
#: the longest layer spec (JSON text) read
MAX_SPEC_CHARS = 4 << 20
#: the deepest JSON a spec may nest (top object, layers list, layer dict, two more per residual
#: block, a setting's list): anything deeper is refused before a layer is looked at
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 6
#: the largest int setting (channels, features, kernel sizes, strides, paddings...) and input size
MAX_INT = 2**31 - 1
#: float settings must fit float32 (the kernels take them as such): 1e308 is refused, not made inf
MAX_FLOAT = float(np.finfo(np.float32).max)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _err(where: str, arg: str, value, reason: str) -> AnyDeviceError:
    try:
        return AnyDeviceError(f"{OP} {where}", arg, value, reason)
    except RecursionError:  # a value nested too deep to show
        return AnyDeviceError(f"{OP} {where}", arg, f"<{type(value).__name__} nested too deep to show>", reason)


def _int(where, arg, v, minimum=1) -> int:
    if not _is_int(v) or v < minimum:
        raise _err(where, arg, v, f"must be an int >= {minimum}")
    if v > MAX_INT:
        raise _err(where, arg, v, f"must be an int <= {MAX_INT}")
    return int(v)


def _pair(where, arg, v, minimum=1):
    """An int or a pair of ints (kept as given: int, or a 2-list)."""
    if _is_int(v):
        return _int(where, arg, v, minimum)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(_is_int(e) and e >= minimum for e in v):
        if max(v) > MAX_INT:
            raise _err(where, arg, v, f"must be ints <= {MAX_INT}")
        return [int(e) for e in v]
    raise _err(where, arg, v, f"must be an int >= {minimum} or a pair of them")


def _float(where, arg, v, lo=None, hi=None, lo_open=False) -> float:
    try:
        ok = _is_num(v) and math.isfinite(float(v))
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        raise _err(where, arg, v, "must be a finite number")
    v = float(v)
    if abs(v) > MAX_FLOAT:
        raise _err(where, arg, v, f"must be within float32's range (at most {MAX_FLOAT:.4g} in magnitude)")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _err(where, arg, v, f"must be {'>' if lo_open else '>='} {lo}")
    if hi is not None and v > hi:
        raise _err(where, arg, v, f"must be <= {hi}")
    return v


def _bool(where, arg, v) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise _err(where, arg, v, "must be true or false")
    return bool(v)


def _choice(where, arg, v, choices):
    if not isinstance(v, str) or v not in choices:
        raise _err(where, arg, v, f"must be one of {', '.join(map(str, choices))}")
    return v


def _unknown(where, config, known, owner):
    for k in config:
        if k not in known:
            raise _err(where, k, config[k], f"unknown setting; {owner} takes {', '.join(known) or 'none'}")


def normalize_layer(type: str, config: dict, where: str | None = None, depth: int = 0) -> dict:
    """The canonical layer dict (every setting, defaults filled in) after checking ``config``;
    AnyDeviceError naming the layer (``where``, e.g. "layer 3.body.0", and its type), the setting and
    its value otherwise. ``depth``: how many residual blocks hold this layer (at most MAX_DEPTH).
    A conv or linear layer whose weights alone would be over the memory limit whatever its input
    is refused here, before anything is made."""
    where = where or "add"
    if not isinstance(type, str) or type not in LAYER_TYPES:
        raise _err(where, "type", type, f"unknown layer type; known: {', '.join(LAYER_TYPES)}")
    w = f"{where} ({type})"
    c = dict(config)
    if type == "conv2d":
        _unknown(w, c, ("out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias",
                        "padding_mode"), type)
        if "out_channels" not in c or "kernel_size" not in c:
            raise _err(w, "out_channels" if "out_channels" not in c else "kernel_size", None, "is required")
        padding = c.get("padding", 0)
        if isinstance(padding, str):
            _choice(w, "padding", padding, ("same", "valid"))
        else:
            padding = _pair(w, "padding", padding, 0)
        out = {"type": type, "out_channels": _int(w, "out_channels", c["out_channels"]),
               "kernel_size": _pair(w, "kernel_size", c["kernel_size"]),
               "stride": _pair(w, "stride", c.get("stride", 1)), "padding": padding,
               "dilation": _pair(w, "dilation", c.get("dilation", 1)),
               "groups": _int(w, "groups", c.get("groups", 1)), "bias": _bool(w, "bias", c.get("bias", True)),
               "padding_mode": _choice(w, "padding_mode", c.get("padding_mode", "zeros"), plans.PADDING_MODES)}
        if out["out_channels"] % out["groups"]:
            raise _err(w, "groups", out["groups"], f"must divide out_channels={out['out_channels']}")
        if padding == "same" and out["stride"] not in (1, [1, 1]):
            raise _err(w, "padding", padding, "'same' is not supported for strided convolutions")
        return _fits_alone(w, out)
    if type == "conv_transpose2d":
        _unknown(w, c, ("out_channels", "kernel_size", "stride", "padding", "output_padding", "groups", "bias",
                        "dilation"), type)
        if "out_channels" not in c or "kernel_size" not in c:
            raise _err(w, "out_channels" if "out_channels" not in c else "kernel_size", None, "is required")
        out = {"type": type, "out_channels": _int(w, "out_channels", c["out_channels"]),
               "kernel_size": _pair(w, "kernel_size", c["kernel_size"]),
               "stride": _pair(w, "stride", c.get("stride", 1)), "padding": _pair(w, "padding", c.get("padding", 0), 0),
               "output_padding": _pair(w, "output_padding", c.get("output_padding", 0), 0),
               "groups": _int(w, "groups", c.get("groups", 1)), "bias": _bool(w, "bias", c.get("bias", True)),
               "dilation": _pair(w, "dilation", c.get("dilation", 1))}
        if out["out_channels"] % out["groups"]:
            raise _err(w, "groups", out["groups"], f"must divide out_channels={out['out_channels']}")
        return _fits_alone(w, out)
    if type == "linear":
        _unknown(w, c, ("out_features", "bias"), type)
        if "out_features" not in c:
            raise _err(w, "out_features", None, "is required")
        return _fits_alone(w, {"type": type, "out_features": _int(w, "out_features", c["out_features"]),
                               "bias": _bool(w, "bias", c.get("bias", True))})
    if type == "activation":
        name = c.pop("name", None)
        _choice(w, "name", name, tuple(ACTIVATION_PARAMS))
        allowed = ACTIVATION_PARAMS[name]
        _unknown(w, c, tuple(allowed), name)
        p = dict(allowed)
        p.update(c)
        for k, v in p.items():
            if k == "approximate":
                _choice(w, k, v, ("none", "tanh"))
            elif k == "dim":
                if not _is_int(v) or abs(v) > MAX_INT:
                    raise _err(w, k, v, f"must be an int (a dim, -{MAX_INT} to {MAX_INT})")
                p[k] = int(v)
            elif k in ("beta",):
                p[k] = _float(w, k, v, 0.0, lo_open=True)
            else:
                p[k] = _float(w, k, v)
        return {"type": type, "name": name, **p}
    if type in ("batch_norm", "group_norm", "layer_norm", "instance_norm"):
        aff = {"layer_norm": "elementwise_affine"}.get(type, "affine")
        known = ("eps", aff) + {"batch_norm": ("momentum",), "group_norm": ("num_groups",)}.get(type, ())
        _unknown(w, c, known, type)
        out = {"type": type}
        if type == "group_norm":
            if "num_groups" not in c:
                raise _err(w, "num_groups", None, "is required")
            out["num_groups"] = _int(w, "num_groups", c["num_groups"])
        out["eps"] = _float(w, "eps", c.get("eps", 1e-5), 0.0)
        if type == "batch_norm":
            out["momentum"] = _float(w, "momentum", c.get("momentum", 0.1), 0.0, 1.0)
        out[aff] = _bool(w, aff, c.get(aff, type != "instance_norm"))
        return out
    if type == "pool":
        _unknown(w, c, ("kind", "kernel_size", "stride", "padding", "output_size"), type)
        kind = _choice(w, "kind", c.get("kind", "max"), POOL_KINDS)
        if kind.startswith("adaptive"):
            for arg in ("kernel_size", "stride", "padding"):
                if c.get(arg) is not None and not (arg == "padding" and _is_int(c[arg]) and c[arg] == 0):
                    raise _err(w, arg, c[arg], f"is not used by {kind} pooling (it takes output_size)")
            if "output_size" not in c:
                raise _err(w, "output_size", None, f"is required for {kind} pooling")
            return {"type": type, "kind": kind, "output_size": _pair(w, "output_size", c["output_size"])}
        if c.get("output_size") is not None:
            raise _err(w, "output_size", c["output_size"], f"is only for adaptive pooling ({kind} takes kernel_size)")
        if c.get("kernel_size") is None:
            raise _err(w, "kernel_size", None, f"is required for {kind} pooling")
        k = _pair(w, "kernel_size", c["kernel_size"])
        s = c.get("stride")
        s = k if s is None else _pair(w, "stride", s)
        p = _pair(w, "padding", c.get("padding", 0), 0)
        kk, pp = (k, k) if _is_int(k) else k, (p, p) if _is_int(p) else p
        if pp[0] > kk[0] // 2 or pp[1] > kk[1] // 2:
            raise _err(w, "padding", p, f"must be at most half of kernel_size {k}")
        return {"type": type, "kind": kind, "kernel_size": k, "stride": s, "padding": p}
    if type == "upsample":
        _unknown(w, c, ("scale_factor", "mode", "align_corners"), type)
        if "scale_factor" not in c:
            raise _err(w, "scale_factor", None, "is required")
        sf = c["scale_factor"]
        if isinstance(sf, (tuple, list)) and len(sf) == 2:
            sf = [_float(w, "scale_factor", v, 0.0, lo_open=True) for v in sf]
        else:
            sf = _float(w, "scale_factor", sf, 0.0, lo_open=True)
        mode = _choice(w, "mode", c.get("mode", "nearest"), UPSAMPLE_MODES)
        ac = c.get("align_corners")
        if ac is not None:
            ac = _bool(w, "align_corners", ac)
            if mode not in ("bilinear", "bicubic"):
                raise _err(w, "align_corners", ac, "only applies to bilinear and bicubic")
        return {"type": type, "scale_factor": sf, "mode": mode, "align_corners": ac}
    if type == "dropout":
        _unknown(w, c, ("p",), type)
        return {"type": type, "p": _float(w, "p", c.get("p", 0.5), 0.0, 1.0)}
    if type == "flatten":
        _unknown(w, c, (), type)
        return {"type": type}
    # residual
    _unknown(w, c, ("body",), type)
    if depth >= MAX_DEPTH:
        raise _err(w, "depth", depth + 1, f"residual blocks may nest at most {MAX_DEPTH} deep")
    body = c.get("body")
    if isinstance(body, Network):
        body = list(body.layers)
    if not isinstance(body, (list, tuple)) or not body:
        raise _err(w, "body", body, "must be a non-empty list of layers")
    if len(body) > MAX_LAYERS:
        raise _err(w, "body", f"<{len(body)} layers>", f"a network has at most {MAX_LAYERS} layers")
    path = where[len("layer "):] if where.startswith("layer ") else where
    return {"type": type, "body": [_layer_from_dict(b, f"layer {path}.body.{i}", depth + 1)
                                   for i, b in enumerate(body)]}


def _layer_from_dict(d, where: str, depth: int = 0) -> dict:
    if not isinstance(d, dict) or "type" not in d:
        raise _err(where, "layer", d, "must be a dict with a 'type'")
    cfg = {k: v for k, v in d.items() if k != "type"}
    return normalize_layer(d["type"], cfg, where, depth)


# ---- sizes: every one checked against the memory limit before anything is made -----------------
#: the settings that make a layer's weights or output large, named where a size is refused
_SIZE_KEYS = {"conv2d": ("out_channels", "kernel_size", "stride", "padding", "dilation", "groups"),
              "conv_transpose2d": ("out_channels", "kernel_size", "stride", "padding", "output_padding", "dilation",
                                   "groups"),
              "linear": ("out_features",), "upsample": ("scale_factor", "mode"),
              "pool": ("kind", "kernel_size", "stride", "padding", "output_size"), "residual": ()}


def _settings_text(layer) -> str:
    keys = _SIZE_KEYS.get(layer["type"])
    if keys is None:
        keys = [k for k in layer if k != "type"]
    return ", ".join(f"{k}={layer[k]!r}" for k in keys if layer.get(k) is not None)


def _mem(nbytes: int) -> str:
    return f"{nbytes / 2**40:.1f} TiB" if nbytes >= 2**40 else plans._mem(nbytes)


def _over_limit(need: int, be=None) -> str | None:
    """None where ``need`` bytes fit the tensor limit (ANYDEVICE_MAX_TENSOR_MB; unset, half the memory
    free on ``be``'s device, the host's without one), else that limit as an error says it."""
    from .config import tensor_limit
    limit, free, where = tensor_limit(be, need)
    if need <= limit:
        return None
    if free is None:
        return f"the limit ANYDEVICE_MAX_TENSOR_MB={limit / 2**20:g}"
    return f"the limit of {_mem(limit)} (half of the {_mem(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"


def _min_params(layer) -> int:
    """The fewest parameters a layer can have whatever its input (1 input channel / feature per group)."""
    t = layer["type"]
    if t in ("conv2d", "conv_transpose2d"):
        kh, kw = _two(layer["kernel_size"])
        return layer["out_channels"] * kh * kw + (layer["out_channels"] if layer["bias"] else 0)
    if t == "linear":
        return layer["out_features"] * (2 if layer["bias"] else 1)
    if t == "residual":
        return sum(_min_params(b) for b in layer["body"])
    return 0


def _fits_alone(where: str, layer: dict) -> dict:
    """``layer`` where its weights fit the host's tensor limit even for the smallest input, else
    AnyDeviceError naming the setting that makes them large, its value and the size."""
    need = 4 * _min_params(layer)
    over = _over_limit(need)
    if over:
        arg = "out_features" if layer["type"] == "linear" else "out_channels"
        raise _err(where, arg, layer[arg], f"its weights ({_settings_text(layer)}) need at least "
                   f"{need // 4} float32 parameters ({_mem(need)}) whatever its input, over {over}")
    return layer


def _count_layers(layers) -> int:
    return sum(1 + (_count_layers(x["body"]) if x["type"] == "residual" else 0) for x in layers)


def _json_extent(value) -> tuple[int, int]:
    """(deepest nesting, number of dicts with a "type") of parsed JSON, walked without recursion and
    stopping once past MAX_JSON_DEPTH."""
    deepest, layers = 0, 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            layers += "type" in v
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            break
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return deepest, layers


def _two(v):
    return (v, v) if _is_int(v) or isinstance(v, float) else tuple(v)


def layer_seed(seed: int, key: str) -> int:
    """The init seed of the layer whose parameters are named ``key.*``: derived from the network's
    seed and the name, so adding a layer leaves the others' initial weights as they were. The whole
    seed counts (its words past the low 32 bits follow the name, so seeds below 2**32 keep the
    weights they always gave)."""
    seed = int(seed)
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, zlib.crc32(key.encode())] +
                                      ([seed >> 32] if seed >> 32 else [])).generate_state(1)[0])


# ---- the value ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Network:
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
        _check_spec(layers, f"layer {len(self.layers)} ({type})")
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
        in_shape = _check_in_shape(in_shape)
        out = []
        s = in_shape
        for i, layer in enumerate(self.layers):
            s = _layer_shape(layer, s, str(i))
            out.append(s)
        # one sample's outputs must fit (a batch is split to fit, by predict; train checks a step)
        _check_outputs(self.layers, (1,) + in_shape[1:] if in_shape[0] > 1 else in_shape)
        if self.params is not None:
            self._check_fits(in_shape)
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
                raise AnyDeviceError(OP, _where(key, layer), tuple(in_shape),
                                     f"its {k.rsplit('.', 1)[1]} has shape {tuple(_shape_of(have))}{made}; this "
                                     f"input needs {tuple(shape)}")

    def out_shape(self, in_shape) -> tuple:
        s = self.shapes(in_shape)
        return s[-1] if s else _check_in_shape(in_shape)

    def param_shapes(self, in_shape, check_memory: bool = True) -> tuple[dict, dict]:
        """({param name: shape}, {buffer name: shape}) for input ``in_shape``, in torch's order.
        ``check_memory``: AnyDeviceError naming the layer where its parameters, or all of them
        together, would be over the memory limit (so ``initialized`` makes nothing that large)."""
        in_shape = _check_in_shape(in_shape)
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
        """Parameters for input ``in_shape``: PyTorch's default initialisation (backend/init.py)
        seeded per layer from ``seed``; parameters already there (of the right shape) are kept.
        Norm layers start at weight 1, bias 0, running mean 0 and variance 1."""
        from . import init as _init
        if not _is_int(seed) or seed < 0:
            raise _err("initialized", "seed", seed, "must be an int >= 0")
        in_shape = _check_in_shape(in_shape)
        ps, bs = self.param_shapes(in_shape)
        have = dict(self.params or {})
        params = {}
        made = {}
        for layer, key, x_shape in _param_layers(self.layers, in_shape, ""):
            t = layer["type"]
            names = [k for k in ps if k.rsplit(".", 1)[0] == key]
            if all(k in have and tuple(_shape_of(have[k])) == tuple(ps[k]) for k in names):
                continue
            if t == "conv2d":
                kh, kw = _two(layer["kernel_size"])
                w, b = _init.conv2d_params(layer["out_channels"], x_shape[1] // layer["groups"], kh, kw,
                                           layer["bias"], layer_seed(seed, key))
                made[key + ".weight"] = w
                if b is not None:
                    made[key + ".bias"] = b
            elif t == "conv_transpose2d":
                # torch's ConvTranspose2d: fan_in is weight.size(1) * kH * kW = out/groups * kH * kW
                kh, kw = _two(layer["kernel_size"])
                cog = layer["out_channels"] // layer["groups"]
                w, _ = _init.conv2d_params(x_shape[1], cog, kh, kw, False, layer_seed(seed, key))
                made[key + ".weight"] = w
                if layer["bias"]:
                    bb = _init.bias_bound(cog * kh * kw)
                    made[key + ".bias"] = _init.uniform(np.random.default_rng(layer_seed(seed, key + ".bias")),
                                                        (layer["out_channels"],), -bb, bb)
            elif t == "linear":
                w, b = _init.linear_params(layer["out_features"], x_shape[-1], layer["bias"], layer_seed(seed, key))
                made[key + ".weight"] = w
                if b is not None:
                    made[key + ".bias"] = b
            else:  # norms
                for k in names:
                    made[k] = (np.ones if k.endswith(".weight") else np.zeros)(ps[k], np.float32)
        for k, shape in ps.items():
            v = have[k] if k in have and tuple(_shape_of(have[k])) == tuple(shape) else made[k]
            params[k] = _param_value(k, v)
        buffers = {}
        for k, shape in bs.items():
            old = self.buffers.get(k)
            if old is not None and tuple(_shape_of(old)) == tuple(shape):
                buffers[k] = old
            else:
                buffers[k] = (np.ones if k.endswith("running_var") else np.zeros)(shape, np.float32)
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
        op = "from_spec_json"
        if not isinstance(s, (str, bytes, bytearray)):
            raise _err(op, "spec", type(s).__name__, "must be JSON text")
        if len(s) > MAX_SPEC_CHARS:
            raise _err(op, "spec", f"<{len(s)} characters>", f"is longer than the {MAX_SPEC_CHARS} characters a "
                       "spec may have")
        try:
            d = json.loads(s)
        except RecursionError:
            raise _err(op, "spec", s, f"nests too deep to read (residual blocks may nest at most {MAX_DEPTH} "
                       "deep)") from None
        except (TypeError, ValueError) as exc:
            raise _err(op, "spec", s, f"is not valid JSON: {exc}") from None
        deepest, count = _json_extent(d)
        if deepest > MAX_JSON_DEPTH:
            raise _err(op, "spec", s, f"nests more than {MAX_JSON_DEPTH} levels deep (residual blocks may nest "
                       f"at most {MAX_DEPTH} deep)")
        if count > MAX_LAYERS:
            raise _err(op, "spec", s, f"has {count} layers; a network has at most {MAX_LAYERS}")
        if isinstance(d, list):
            d = {"layers": d}
        if not isinstance(d, dict) or not isinstance(d.get("layers"), list):
            raise _err(op, "spec", s, "must be a JSON object with a 'layers' list")
        for k in d:
            if k not in ("format", "layers", "in_shape"):
                raise _err(op, k, d[k], "unknown key; a spec has format, layers and in_shape")
        if "format" in d and d["format"] != FORMAT:
            raise _err(op, "format", d["format"], f"must be {FORMAT!r} (the only spec format read)")
        layers = tuple(_layer_from_dict(x, f"layer {i}") for i, x in enumerate(d["layers"]))
        _check_spec(layers, "spec")
        in_shape = d.get("in_shape")
        net = Network(layers, None, {}, None)
        if in_shape is not None:
            in_shape = _check_in_shape(in_shape)
            net.shapes(in_shape)        # chains, one sample's outputs fit
            net.param_shapes(in_shape)  # the weights fit
        return Network(layers, None, {}, in_shape)


# ---- helpers ----------------------------------------------------------------------------------
def _check_in_shape(in_shape) -> tuple:
    if not isinstance(in_shape, (tuple, list)) or not 2 <= len(in_shape) <= 8 \
            or not all(_is_int(v) and 0 <= v <= MAX_INT for v in in_shape):
        raise _err("shapes", "in_shape", in_shape, f"must be (N, C, H, W) or (N, F): ints from 0 to {MAX_INT}")
    return tuple(int(v) for v in in_shape)


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
    if isinstance(v, np.ndarray) and not v.flags.writeable and getattr(be, "kind", "") == "vendor":
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


def _has_params(layers) -> bool:
    for layer in layers:
        t = layer["type"]
        if t in ("conv2d", "conv_transpose2d", "linear", "batch_norm") \
                or (t in ("group_norm", "instance_norm") and layer["affine"]) \
                or (t == "layer_norm" and layer["elementwise_affine"]):
            return True
        if t == "residual" and _has_params(layer["body"]):
            return True
    return False


def _needs_shape(layers) -> bool:
    """Whether the torch modules need the input shape (channels, features, normalised shape)."""
    for layer in layers:
        t = layer["type"]
        if t in ("conv2d", "conv_transpose2d", "linear", "batch_norm", "group_norm", "layer_norm", "instance_norm"):
            return True
        if t == "residual" and _needs_shape(layer["body"]):
            return True
    return False


def _short(layer) -> str:
    t = layer["type"]
    if t == "activation":
        return layer["name"]
    if t == "residual":
        return "residual(" + ", ".join(_short(b) for b in layer["body"]) + ")"
    if t == "pool":
        return f"{layer['kind']}_pool"
    return t


def _layer_at(layers, key: str) -> dict:
    """The layer a parameter prefix such as "3.body.0" names."""
    parts = key.split(".")
    layer = layers[int(parts[0])]
    i = 1
    while i < len(parts):
        layer = layer["body"][int(parts[i + 1])]
        i += 2
    return layer


def _where(path: str, layer: dict) -> str:
    return f"layer {path} ({layer['type']})"


def _layer_shape(layer: dict, s: tuple, path: str) -> tuple:
    """The output shape of one layer on input shape s (AnyDeviceError naming the layer)."""
    t = layer["type"]
    try:
        return _layer_shape_inner(layer, s, path)
    except AnyDeviceError as exc:
        if exc.op == OP and exc.arg and exc.arg.startswith("layer "):
            raise
        what = _settings_text(layer) if t != "residual" else ""
        raise AnyDeviceError(OP, _where(path, layer), tuple(s), f"does not take this input"
                             f"{f' ({what})' if what else ''}: {exc}") from None


def _need(layer, s, ndims, what):
    if len(s) not in ndims:
        raise AnyDeviceError(layer["type"], "input", tuple(s), f"must be {what}")


def _layer_shape_inner(layer, s, path):
    t = layer["type"]
    if t == "conv2d":
        _need(layer, s, (4,), "4-D (N, C, H, W)")
        kh, kw = _two(layer["kernel_size"])
        c = s[1]
        if c % layer["groups"]:
            raise AnyDeviceError("conv2d", "groups", layer["groups"], f"must divide the input's {c} channels")
        plan = plans.conv2d_plan("conv2d", s, (layer["out_channels"], c // layer["groups"], kh, kw), None,
                                 layer["stride"], layer["padding"], layer["dilation"], layer["groups"],
                                 layer["padding_mode"])
        return tuple(plan.out_shape)
    if t == "conv_transpose2d":
        _need(layer, s, (4,), "4-D (N, C, H, W)")
        kh, kw = _two(layer["kernel_size"])
        g = layer["groups"]
        plan = plans.conv_transpose2d_plan("conv_transpose2d", s, (s[1], layer["out_channels"] // g, kh, kw), None,
                                           layer["stride"], layer["padding"], layer["output_padding"], g,
                                           layer["dilation"])
        return tuple(plan.out_shape)
    if t == "linear":
        _need(layer, s, (2,), "2-D (N, F): put a flatten layer before it")
        if s[-1] < 1:
            raise AnyDeviceError("linear", "input", tuple(s), "has no features")
        return tuple(s[:-1]) + (layer["out_features"],)
    if t == "activation":
        if layer["name"] == "softmax":
            plans.normalize_dims("softmax", layer["dim"], len(s))
        return tuple(s)
    if t == "batch_norm":
        _need(layer, s, (2, 3, 4), "2-D, 3-D or 4-D (N, C, ...)")
        return tuple(s)
    if t in ("group_norm", "instance_norm"):
        if t == "instance_norm":
            _need(layer, s, (4,), "4-D (N, C, H, W)")
        else:
            plans.group_norm_shape("group_norm", s, layer["num_groups"])
        return tuple(s)
    if t == "layer_norm":
        return tuple(s)
    if t == "pool":
        _need(layer, s, (4,), "4-D (N, C, H, W)")
        if layer["kind"].startswith("adaptive"):
            return tuple(plans.adaptive_plan(layer["kind"] + "_pool2d", s, layer["output_size"]))
        op = f"{layer['kind']}_pool2d"
        return tuple(plans.pool2d_plan(op, s, layer["kernel_size"], layer["stride"], layer["padding"]).out_shape)
    if t == "upsample":
        _need(layer, s, (4,), "4-D (N, C, H, W)")
        sf = layer["scale_factor"]
        plan = plans.interpolate_plan("interpolate", s, None, tuple(sf) if isinstance(sf, list) else sf,
                                      layer["mode"], layer["align_corners"], None, False)
        return tuple(plan.out_shape)
    if t == "dropout":
        return tuple(s)
    if t == "flatten":
        return (s[0], math.prod(s[1:]))
    # residual
    out = tuple(s)
    for j, b in enumerate(layer["body"]):
        out = _layer_shape(b, out, f"{path}.body.{j}")
    if out != tuple(s):
        raise AnyDeviceError(OP, _where(path, layer), tuple(s),
                             f"its body's output {out} must have the input's shape {tuple(s)} (y = x + body(x))")
    return tuple(s)


def _param_layers(layers, s, prefix):
    """(layer, key, input shape) of every layer with parameters or buffers, in order, recursing."""
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        t = layer["type"]
        if t == "residual":
            yield from _param_layers(layer["body"], s, key + ".body.")
        elif t in ("conv2d", "conv_transpose2d", "linear", "batch_norm", "group_norm", "layer_norm", "instance_norm"):
            yield layer, key, s
        s = _layer_shape(layer, s, key)


def _walk_shapes(layers, s, prefix, ps, bs, check_memory=True):
    """Every parameter's and buffer's shape into ps / bs, in torch's order. ``check_memory``: each
    layer's are checked against the memory limit before the next (naming the layer), then all of
    them together."""
    for layer, key, x in _param_layers(layers, s, prefix):
        p, b = _layer_param_shapes(layer, key, x)
        need = 4 * sum(math.prod(v) for v in list(p.values()) + list(b.values()))
        over = _over_limit(need) if need and check_memory else None
        if over:
            made = ", ".join(f"{k.rsplit('.', 1)[1]} {v}" for k, v in list(p.items()) + list(b.items()))
            raise AnyDeviceError(OP, _where(key, layer), tuple(x), f"its parameters ({made}; {_settings_text(layer)}) "
                                 f"would need {_mem(need)} of float32, over {over}")
        ps.update(p)
        bs.update(b)
    need = 4 * (sum(math.prod(v) for v in ps.values()) + sum(math.prod(v) for v in bs.values()))
    over = _over_limit(need) if need and check_memory else None
    if over:
        raise AnyDeviceError(OP, "parameters", tuple(s), f"the network's {len(ps) + len(bs)} parameter and buffer "
                             f"tensors would need {_mem(need)} of float32 together, over {over}")


def _layer_param_shapes(layer, key, x) -> tuple[dict, dict]:
    """({param name: shape}, {buffer name: shape}) of one layer on input shape x."""
    t = layer["type"]
    ps, bs = {}, {}
    if t == "conv2d":
        kh, kw = _two(layer["kernel_size"])
        ps[key + ".weight"] = (layer["out_channels"], x[1] // layer["groups"], kh, kw)
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_channels"],)
    elif t == "conv_transpose2d":
        kh, kw = _two(layer["kernel_size"])
        ps[key + ".weight"] = (x[1], layer["out_channels"] // layer["groups"], kh, kw)
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_channels"],)
    elif t == "linear":
        ps[key + ".weight"] = (layer["out_features"], x[-1])
        if layer["bias"]:
            ps[key + ".bias"] = (layer["out_features"],)
    elif t == "layer_norm":
        if layer["elementwise_affine"]:
            ps[key + ".weight"] = tuple(x[1:])
            ps[key + ".bias"] = tuple(x[1:])
    else:
        if layer["affine"]:
            ps[key + ".weight"] = (x[1],)
            ps[key + ".bias"] = (x[1],)
        if t == "batch_norm":
            bs[key + ".running_mean"] = (x[1],)
            bs[key + ".running_var"] = (x[1],)
    return ps, bs


def param_names(layers, prefix: str = "") -> tuple[list, list]:
    """([param names], [buffer names]) the layers have whatever their input, in torch's order."""
    ps, bs = [], []
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        t = layer["type"]
        if t == "residual":
            p, b = param_names(layer["body"], key + ".body.")
            ps += p
            bs += b
            continue
        if t in ("conv2d", "conv_transpose2d", "linear"):
            ps += [key + ".weight"] + ([key + ".bias"] if layer["bias"] else [])
        elif layer.get("affine") or layer.get("elementwise_affine"):
            ps += [key + ".weight", key + ".bias"]
        if t == "batch_norm":
            bs += [key + ".running_mean", key + ".running_var"]
    return ps, bs


def _walk_outputs(layers, s, prefix):
    """(key, layer, input shape, output shape) of every layer, a residual body's before its block."""
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        if layer["type"] == "residual":
            yield from _walk_outputs(layer["body"], s, key + ".body.")
        out = _layer_shape(layer, s, key)
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
            what = f" ({_settings_text(layer)})" if _settings_text(layer) else ""
            raise AnyDeviceError(OP, _where(key, layer), tuple(s), f"its output {tuple(out)}{what} would need "
                                 f"{_mem(need)} of float32, over {over}")


def _check_present(layers, P, B) -> None:
    """Every parameter and buffer the layers use is there (a file without weights, a partial dict)."""
    ps, bs = param_names(layers)
    for names, have, what in ((ps, P, "parameters"), (bs, B, "buffers")):
        for k in names:
            if k not in have:
                key = k.rsplit(".", 1)[0]
                held = f"it has {len(have)} {what}" if have else f"it has no {what} at all (no weights)"
                raise AnyDeviceError(OP, _where(key, _layer_at(layers, key)), k, f"the network has no {k!r} "
                                     f"({held}): train it, or load a file that holds its weights")


def _check_spec(layers, where: str) -> None:
    """The whole network's limits that no single layer shows: the layer count, and the weights of
    all layers together even for the smallest input."""
    n = _count_layers(layers)
    if n > MAX_LAYERS:
        raise _err(where, "layers", n, f"a network has at most {MAX_LAYERS} layers")
    need = 4 * sum(_min_params(x) for x in layers)
    over = _over_limit(need) if need else None
    if over:
        raise _err(where, "layers", f"<{len(layers)} layers>", f"their weights need at least {need // 4} float32 "
                   f"parameters ({_mem(need)}) whatever the input, over {over}")


def _describe(layers, prefix, shapes, ps, lines, depth):
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        cfg = ", ".join(f"{k}={v}" for k, v in layer.items() if k not in ("type", "body"))
        label = layer["name"] if layer["type"] == "activation" else layer["type"]
        if layer["type"] == "activation":
            cfg = ", ".join(f"{k}={v}" for k, v in layer.items() if k not in ("type", "name"))
        n = sum(math.prod(v) for k, v in ps.items() if k.rsplit(".", 1)[0] == key)
        shape = f" -> {shapes[i]}" if shapes is not None else ""
        count = f"  [{n} params]" if n else ""
        lines.append(f"{'  ' * depth}{key} {label}({cfg}){shape}{count}")
        if layer["type"] == "residual":
            _describe(layer["body"], key + ".body.", None if shapes is None else
                      _body_shapes(layer["body"], shapes[i]), ps, lines, depth + 1)


def _body_shapes(body, s):
    """The output shapes of a residual body's layers (its input shape is the block's output's)."""
    out = []
    for j, b in enumerate(body):
        s = _layer_shape(b, s, str(j))
        out.append(s)
    return out


def _dropout_seed(seed, key):
    return None if seed is None else layer_seed(seed, "dropout:" + key)


def _run(layers, be, x, prefix, P, B, new_b, training, seed):
    from .autograd import apply
    for i, layer in enumerate(layers):
        key = f"{prefix}{i}"
        t = layer["type"]
        if t == "conv2d":
            x = apply("conv2d", x, P[key + ".weight"], P.get(key + ".bias"), stride=layer["stride"],
                      padding=layer["padding"], dilation=layer["dilation"], groups=layer["groups"],
                      padding_mode=layer["padding_mode"], be=be)
        elif t == "conv_transpose2d":
            x = apply("conv_transpose2d", x, P[key + ".weight"], P.get(key + ".bias"), stride=layer["stride"],
                      padding=layer["padding"], output_padding=layer["output_padding"], groups=layer["groups"],
                      dilation=layer["dilation"], be=be)
        elif t == "linear":
            x = apply("linear", x, P[key + ".weight"], P.get(key + ".bias"), be=be)
        elif t == "activation":
            params = {k: v for k, v in layer.items() if k not in ("type", "name")}
            x = apply(layer["name"], x, be=be, **params)
        elif t == "batch_norm":
            rm, rv = B[key + ".running_mean"], B[key + ".running_var"]
            w, b = P.get(key + ".weight"), P.get(key + ".bias")
            if training:
                y, nm, nv = apply("batch_norm", x, rm, rv, w, b, training=True, momentum=layer["momentum"],
                                  eps=layer["eps"], return_stats=True, be=be)
                new_b[key + ".running_mean"] = nm.data
                new_b[key + ".running_var"] = nv.data
                x = y
            else:
                x = apply("batch_norm", x, rm, rv, w, b, training=False, eps=layer["eps"], be=be)
        elif t == "group_norm":
            x = apply("group_norm", x, layer["num_groups"], P.get(key + ".weight"), P.get(key + ".bias"),
                      eps=layer["eps"], be=be)
        elif t == "instance_norm":
            x = apply("group_norm", x, x.shape[1], P.get(key + ".weight"), P.get(key + ".bias"),
                      eps=layer["eps"], be=be)
        elif t == "layer_norm":
            x = apply("layer_norm", x, tuple(x.shape[1:]), P.get(key + ".weight"), P.get(key + ".bias"),
                      eps=layer["eps"], be=be)
        elif t == "pool":
            kind = layer["kind"]
            if kind == "max":
                x = apply("max_pool2d", x, layer["kernel_size"], layer["stride"], layer["padding"], be=be)
            elif kind == "avg":
                x = apply("avg_pool2d", x, layer["kernel_size"], layer["stride"], layer["padding"], be=be)
            else:
                x = apply(f"{kind}_pool2d", x, layer["output_size"], be=be)
        elif t == "upsample":
            sf = layer["scale_factor"]
            x = apply("interpolate", x, scale_factor=tuple(sf) if isinstance(sf, list) else sf, mode=layer["mode"],
                      align_corners=layer["align_corners"], be=be)
        elif t == "dropout":
            if training and layer["p"] > 0:
                x = apply("dropout", x, p=layer["p"], training=True, seed=_dropout_seed(seed, key), be=be)
        elif t == "flatten":
            s = x.shape
            x = apply("reshape", x, (s[0], math.prod(s[1:])), be=be)
        elif t == "residual":
            body = _run(layer["body"], be, x, key + ".body.", P, B, new_b, training, seed)
            x = apply("add", x, body, be=be)
        else:  # pragma: no cover - normalize_layer refuses unknown types
            raise _err("forward", "type", t, "unknown layer type")
    return x


# ---- torch ------------------------------------------------------------------------------------
_TORCH_CLASSES: dict = {}


def _residual_class():
    cls = _TORCH_CLASSES.get("Residual")
    if cls is None:
        import torch

        class Residual(torch.nn.Module):
            """y = x + body(x)"""

            def __init__(self, body):
                super().__init__()
                self.body = body

            def forward(self, x):
                return x + self.body(x)

        cls = _TORCH_CLASSES["Residual"] = Residual
    return cls


def _torch_seq(layers, s):
    import torch
    nn = torch.nn
    mods = []
    for i, layer in enumerate(layers):
        t = layer["type"]
        if t == "conv2d":
            pad = layer["padding"]
            mods.append(nn.Conv2d(s[1], layer["out_channels"], _two(layer["kernel_size"]), _two(layer["stride"]),
                                  pad if isinstance(pad, str) else _two(pad), _two(layer["dilation"]),
                                  layer["groups"], layer["bias"], layer["padding_mode"]))
        elif t == "conv_transpose2d":
            mods.append(nn.ConvTranspose2d(s[1], layer["out_channels"], _two(layer["kernel_size"]),
                                           _two(layer["stride"]), _two(layer["padding"]),
                                           _two(layer["output_padding"]), layer["groups"], layer["bias"],
                                           _two(layer["dilation"])))
        elif t == "linear":
            mods.append(nn.Linear(s[-1], layer["out_features"], layer["bias"]))
        elif t == "activation":
            name = layer["name"]
            p = {k: v for k, v in layer.items() if k not in ("type", "name")}
            cls = {"relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "elu": nn.ELU, "gelu": nn.GELU, "silu": nn.SiLU,
                   "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "softplus": nn.Softplus, "softmax": nn.Softmax}[name]
            mods.append(cls(**p))
        elif t == "batch_norm":
            cls = nn.BatchNorm2d if len(s) == 4 else nn.BatchNorm1d
            mods.append(cls(s[1], eps=layer["eps"], momentum=layer["momentum"], affine=layer["affine"]))
        elif t == "group_norm":
            mods.append(nn.GroupNorm(layer["num_groups"], s[1], eps=layer["eps"], affine=layer["affine"]))
        elif t == "instance_norm":
            mods.append(nn.InstanceNorm2d(s[1], eps=layer["eps"], affine=layer["affine"]))
        elif t == "layer_norm":
            mods.append(nn.LayerNorm(tuple(s[1:]), eps=layer["eps"], elementwise_affine=layer["elementwise_affine"]))
        elif t == "pool":
            kind = layer["kind"]
            if kind == "max":
                mods.append(nn.MaxPool2d(_two(layer["kernel_size"]), _two(layer["stride"]), _two(layer["padding"])))
            elif kind == "avg":
                mods.append(nn.AvgPool2d(_two(layer["kernel_size"]), _two(layer["stride"]), _two(layer["padding"])))
            elif kind == "adaptive_avg":
                mods.append(nn.AdaptiveAvgPool2d(_two(layer["output_size"])))
            else:
                mods.append(nn.AdaptiveMaxPool2d(_two(layer["output_size"])))
        elif t == "upsample":
            sf = layer["scale_factor"]
            mods.append(nn.Upsample(scale_factor=tuple(sf) if isinstance(sf, list) else sf, mode=layer["mode"],
                                    align_corners=layer["align_corners"]))
        elif t == "dropout":
            mods.append(nn.Dropout(layer["p"]))
        elif t == "flatten":
            mods.append(nn.Flatten())
        elif t == "residual":
            mods.append(_residual_class()(_torch_seq(layer["body"], s)))
        s = _layer_shape(layer, s, str(i)) if s is not None else None
    return nn.Sequential(*mods)
