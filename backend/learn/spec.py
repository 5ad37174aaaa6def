"""Reading a network's spec: the JSON text ``Network.spec_json`` writes (and netio.py keeps in a
file's metadata), untrusted, checked before anything is made.

    {"format": "anydevice.network/1", "layers": [{"type": "conv2d", ...}, ...], "in_shape": [1, 3, 32, 32]}

``read_spec`` refuses, with an AnyDeviceError naming the layer (index and type), the setting and
its value: text longer than MAX_SPEC_CHARS, JSON nested deeper than MAX_JSON_DEPTH or with more than
MAX_LAYERS layers (both found without recursion, before a layer is looked at), unknown keys, another
format, any malformed layer, and weights that would be over the memory limit for the smallest input.
"""
from __future__ import annotations

import json

from .layers import LAYERS, layer_from_dict
from .layers.settings import MAX_DEPTH, MAX_INT, MAX_LAYERS, _err, _is_int, _mem, _over_limit

FORMAT = "anydevice.network/1"
#: the longest layer spec (JSON text) read
MAX_SPEC_CHARS = 4 << 20
#: the deepest JSON a spec may nest (top object, layers list, layer dict, two more per residual
#: block, a setting's list): anything deeper is refused before a layer is looked at
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 6


def check_in_shape(in_shape) -> tuple:
    """``in_shape`` as a tuple of ints: (N, C, H, W) or (N, F), 2 to 8 dims of 0 to MAX_INT."""
    if not isinstance(in_shape, (tuple, list)) or not 2 <= len(in_shape) <= 8 \
            or not all(_is_int(v) and 0 <= v <= MAX_INT for v in in_shape):
        raise _err("shapes", "in_shape", in_shape, f"must be (N, C, H, W) or (N, F): ints from 0 to {MAX_INT}")
    return tuple(int(v) for v in in_shape)


def count_layers(layers) -> int:
    """How many layers there are, the ones in residual bodies included."""
    total = 0
    for x in layers:
        body = LAYERS.of(x).body(x)
        total += 1 + (count_layers(body) if body is not None else 0)
    return total


def check_spec(layers, where: str) -> None:
    """The whole network's limits that no single layer shows: the layer count, and the weights of
    all layers together even for the smallest input."""
    n = count_layers(layers)
    if n > MAX_LAYERS:
        raise _err(where, "layers", n, f"a network has at most {MAX_LAYERS} layers")
    need = 4 * sum(LAYERS.of(x).min_params(x) for x in layers)
    over = _over_limit(need) if need else None
    if over:
        raise _err(where, "layers", f"<{len(layers)} layers>", f"their weights need at least {need // 4} float32 "
                   f"parameters ({_mem(need)}) whatever the input, over {over}")


def json_extent(value) -> tuple[int, int]:
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


def read_spec(s, op: str = "from_spec_json") -> tuple[tuple, tuple | None]:
    """(canonical layers, input shape or None) of spec text ``s``; AnyDeviceError (op ``network
    <op>``...) for anything malformed or too large (the module's docstring lists what)."""
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
    deepest, count = json_extent(d)
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
    layers = tuple(layer_from_dict(x, f"layer {i}") for i, x in enumerate(d["layers"]))
    check_spec(layers, "spec")
    in_shape = d.get("in_shape")
    return layers, (None if in_shape is None else check_in_shape(in_shape))
