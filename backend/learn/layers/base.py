"""The Layer base class (what one kind of layer knows), the registry of kinds, and what dispatches
through it: checking a spec (``normalize_layer``), a layer's output shape (``layer_shape``), its
seed (``layer_seed``).

A layer is a JSON-able dict ``{"type": ..., **settings}`` (torch's names); the kind of layer it is
lives in ``LAYERS``, which maps each type name to one instance of its Layer class. The classes hold
no state: every method takes the canonical layer dict (``normalize``'s result). Registering a type
twice is refused, as PyTorch's decomposition tables refuse a second registration of an op.

    @LAYERS.register
    class Linear(Layer):
        type = "linear"
        ...
    LAYERS["linear"].out_shape(layer, (8, 32), "2")   # (8, out_features)
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...system.errors import AnyDeviceError
from .settings import OP, MAX_DEPTH, _err, _mem, _over_limit


class Layer:
    """One kind of layer. Subclasses set ``type`` and override what their kind has; the defaults
    are a layer without parameters that passes its input's shape through."""

    #: the type name a spec dict carries
    type: str = ""
    #: the settings that make its weights or output large, named where a size is refused (None: all)
    size_keys: tuple | None = None
    #: the setting named where its weights alone are over the memory limit (layers with weights)
    size_arg: str | None = None
    #: whether it may have parameters or buffers (walked by param_shapes and initialized)
    weighted: bool = False

    # ---- the spec ----------------------------------------------------------------------------
    def normalize(self, c: dict, w: str, where: str, depth: int) -> dict:
        """The canonical layer dict (every setting, defaults filled in) of settings ``c``;
        AnyDeviceError naming ``w`` ("layer 3 (conv2d)"), the setting and its value otherwise.
        ``where`` is the layer's name without its type, ``depth`` how many blocks hold it."""
        raise NotImplementedError

    def body(self, layer: dict) -> list | None:
        """The layers it holds (a residual block's body; parameters named ``key.body.i``), or None."""
        return None

    # ---- shapes and parameters ---------------------------------------------------------------
    def out_shape(self, layer: dict, s: tuple, path: str) -> tuple:
        """Its output shape on input shape ``s``; an AnyDeviceError where it does not take the input."""
        return tuple(s)

    def param_shapes(self, layer: dict, key: str, x: tuple) -> tuple[dict, dict]:
        """({param name: shape}, {buffer name: shape}) on input shape ``x``, names ``key.weight``..."""
        return {}, {}

    def param_names(self, layer: dict, key: str) -> tuple[list, list]:
        """([param names], [buffer names]) it has whatever its input, in torch's order."""
        return [], []

    def min_params(self, layer: dict) -> int:
        """The fewest parameters it can have whatever its input (1 input channel / feature per group)."""
        return 0

    def has_params(self, layer: dict) -> bool:
        """Whether it needs parameters or buffers to run (bodies are asked by the walk)."""
        return False

    def needs_shape(self, layer: dict) -> bool:
        """Whether its torch module needs the input shape (channels, features, normalised shape)."""
        return False

    # ---- values ------------------------------------------------------------------------------
    def init_params(self, layer: dict, key: str, x: tuple, shapes: dict, seed: int) -> dict:
        """Its initial parameters {name: float32 array} for input shape ``x`` (``shapes``: its
        parameters' shapes), drawn from ``layer_seed(seed, key...)`` as torch's default init."""
        return {}

    def init_buffer(self, name: str, shape: tuple) -> np.ndarray:
        """The initial value of its buffer ``name``."""
        return np.zeros(shape, np.float32)

    def forward(self, layer: dict, x, key: str, run: "Run"):
        """Its output Var on input Var ``x`` (``run``: the backend, parameters, mode and seed)."""
        return x

    def to_torch(self, layer: dict, s: tuple | None, seq: Callable):
        """The torch.nn module it is on input shape ``s`` (``seq(layers, s)`` makes a body's)."""
        raise NotImplementedError

    # ---- words -------------------------------------------------------------------------------
    def describe(self, layer: dict) -> str:
        """One line of it: its type and every setting, as ``Network.describe`` lists it."""
        cfg = ", ".join(f"{k}={v}" for k, v in layer.items() if k not in ("type", "body"))
        return f"{layer['type']}({cfg})"

    def short(self, layer: dict) -> str:
        """Its name in ``repr(network)``."""
        return layer["type"]

    def node_text(self, layer: dict) -> str:
        """What a layer node says of it ("conv 3x3 -> 16")."""
        return layer["type"]

    def widgets(self, choice=None) -> tuple:
        """The widgets of its layer node that apply to it where the node's choice widget (an
        activation's name, a pool's kind, a conv's padding) is ``choice``."""
        return ()

    # ---- helpers -----------------------------------------------------------------------------
    def fits_alone(self, w: str, layer: dict) -> dict:
        """``layer`` where its weights fit the host's tensor limit even for the smallest input, else
        AnyDeviceError naming the setting that makes them large, its value and the size."""
        need = 4 * self.min_params(layer)
        over = _over_limit(need)
        if over:
            arg = self.size_arg
            raise _err(w, arg, layer[arg], f"its weights ({settings_text(layer)}) need at least "
                       f"{need // 4} float32 parameters ({_mem(need)}) whatever its input, over {over}")
        return layer


@dataclass
class Run:
    """What a forward pass hands each layer: the backend, the parameter Vars ``P``, the buffers
    ``B`` (native arrays), ``new_b`` (updated running statistics go there), training mode, the
    dropout seed, autograd's ``apply``, and ``run(layers, x, prefix)`` for a body."""
    be: object
    P: dict
    B: dict
    new_b: dict
    training: bool
    seed: int | None
    apply: Callable
    run: Callable


class Registry:
    """Layer type name -> the one instance of its Layer class, in registration order."""

    def __init__(self):
        self._kinds: dict[str, Layer] = {}

    def register(self, cls):
        """Class decorator: register ``cls`` under ``cls.type``; a type registered twice is refused."""
        if not cls.type:
            raise RuntimeError(f"{cls.__name__} has no layer type name")
        if cls.type in self._kinds:
            raise RuntimeError(f"duplicate registrations for layer type {cls.type!r} "
                               f"({type(self._kinds[cls.type]).__name__} and {cls.__name__})")
        self._kinds[cls.type] = cls()
        return cls

    def __getitem__(self, name: str) -> Layer:
        return self._kinds[name]

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._kinds

    def __iter__(self):
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def of(self, layer: dict) -> Layer:
        """The kind of the layer dict ``layer``."""
        return self._kinds[layer["type"]]


#: every layer kind, filled by the family modules (conv.py, linear.py...) as the package loads
LAYERS = Registry()


# ---- what dispatches through the registry ------------------------------------------------------
def normalize_layer(type: str, config: dict, where: str | None = None, depth: int = 0) -> dict:
    """The canonical layer dict (every setting, defaults filled in) after checking ``config``;
    AnyDeviceError naming the layer (``where``, e.g. "layer 3.body.0", and its type), the setting and
    its value otherwise. ``depth``: how many residual blocks hold this layer (at most MAX_DEPTH).
    A conv or linear layer whose weights alone would be over the memory limit whatever its input
    is refused here, before anything is made."""
    where = where or "add"
    if type not in LAYERS:
        raise _err(where, "type", type, f"unknown layer type; known: {', '.join(LAYERS)}")
    return LAYERS[type].normalize(dict(config), f"{where} ({type})", where, depth)


def layer_from_dict(d, where: str, depth: int = 0) -> dict:
    """The canonical layer of a spec's layer dict ``d`` (untrusted), named ``where``."""
    if not isinstance(d, dict) or "type" not in d:
        raise _err(where, "layer", d, "must be a dict with a 'type'")
    cfg = {k: v for k, v in d.items() if k != "type"}
    return normalize_layer(d["type"], cfg, where, depth)


def settings_text(layer) -> str:
    """The settings that make ``layer`` large, as a refusal names them ("out_channels=16, ...")."""
    keys = LAYERS.of(layer).size_keys
    if keys is None:
        keys = [k for k in layer if k != "type"]
    return ", ".join(f"{k}={layer[k]!r}" for k in keys if layer.get(k) is not None)


def where_of(path: str, layer: dict) -> str:
    """A layer's name in errors: "layer 3.body.0 (conv2d)"."""
    return f"layer {path} ({layer['type']})"


def layer_shape(layer: dict, s: tuple, path: str) -> tuple:
    """The output shape of one layer on input shape s (AnyDeviceError naming the layer)."""
    try:
        return LAYERS.of(layer).out_shape(layer, s, path)
    except AnyDeviceError as exc:
        if exc.op == OP and exc.arg and exc.arg.startswith("layer "):
            raise
        what = settings_text(layer)
        raise AnyDeviceError(OP, where_of(path, layer), tuple(s), f"does not take this input"
                             f"{f' ({what})' if what else ''}: {exc}") from None


def need_dims(layer, s, ndims, what):
    """AnyDeviceError where input shape ``s`` has not one of ``ndims`` dims (``what`` says which)."""
    if len(s) not in ndims:
        raise AnyDeviceError(layer["type"], "input", tuple(s), f"must be {what}")


def layer_seed(seed: int, key: str) -> int:
    """The init seed of the layer whose parameters are named ``key.*``: derived from the network's
    seed and the name, so adding a layer leaves the others' initial weights as they were. The whole
    seed counts (its words past the low 32 bits follow the name, so seeds below 2**32 keep the
    weights they always gave)."""
    seed = int(seed)
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, zlib.crc32(key.encode())] +
                                      ([seed >> 32] if seed >> 32 else [])).generate_state(1)[0])


__all__ = ["Layer", "Run", "Registry", "LAYERS", "MAX_DEPTH", "normalize_layer", "layer_from_dict", "settings_text",
           "where_of", "layer_shape", "need_dims", "layer_seed"]
