"""Save and load a ``Network`` as a safetensors file, written and read with plain Python.

The format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length, a
JSON header ``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}`` padded with spaces to a multiple of 8, then the tensors' bytes
(little-endian, C order) back to back. The parameters and the batch-norm running statistics are
stored under their torch names ("0.weight", "3.body.0.bias", "1.running_mean"), so
``safetensors.torch.load_file`` gives a state dict ``net.to_torch()`` loads. The metadata holds the
layer spec JSON under ``"anydevice.layers"`` and the buffer names under ``"anydevice.buffers"``.

Reading accepts F32, F16, BF16 and F64 tensors (converted to float32) and integer tensors (such
as torch's ``num_batches_tracked``, which is skipped); anything malformed is refused with an
AnyDeviceError naming the file and what is wrong.
"""
from __future__ import annotations

import json
import math
import os
import stat
import struct

import numpy as np

from ..system.errors import AnyDeviceError, short
from .network import Network, _host, _layer_at, _mem, param_names

LAYERS_KEY = "anydevice.layers"
BUFFERS_KEY = "anydevice.buffers"
#: the largest header read (safetensors' own limit is 100 MB; a network's header is a few KB per
#: layer, and a parsed header takes several times its size in Python objects)
MAX_HEADER = 16 << 20
#: the most dims a tensor may have
MAX_DIMS = 8
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
           "U8": np.dtype("u1"), "BOOL": np.dtype("?")}


def save(network: Network, path, metadata: dict | None = None) -> str:
    """Write ``network`` (layers, parameters, buffers) to ``path`` (safetensors). ``metadata``:
    extra string entries for the header. Returns the path. Written to a temporary name first and
    renamed, so a failed write never leaves half a file under ``path``."""
    op = "save"
    if not isinstance(network, Network):
        raise AnyDeviceError(op, "network", network, "must be a Network")
    if network.params is None:
        raise AnyDeviceError(op, "network", network, "has no parameters yet: call initialized() first")
    meta = {}
    for k, v in dict(metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise AnyDeviceError(op, "metadata", {k: v}, "keys and values must be strings")
        if k in (LAYERS_KEY, BUFFERS_KEY):
            raise AnyDeviceError(op, "metadata", k, "is reserved for the network itself")
        meta[k] = v
    meta[LAYERS_KEY] = network.spec_json()
    meta[BUFFERS_KEY] = json.dumps(sorted(network.buffers))
    tensors = {}
    for k, v in list(network.params.items()) + list(network.buffers.items()):
        tensors[k] = np.ascontiguousarray(_host(v), dtype="<f4")
    header = {"__metadata__": meta}
    offset = 0
    for k in sorted(tensors):
        a = tensors[k]
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for k in sorted(tensors):
                f.write(tensors[k].tobytes())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise AnyDeviceError(op, "path", path, f"cannot be written: {exc.strerror or exc}") from None
    return path


def _fail(path, reason: str) -> AnyDeviceError:
    return AnyDeviceError("load", "path", path, reason)


def _depth(value, limit: int) -> int:
    """How deep parsed JSON nests (walked without recursion; stops once past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= limit:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _entry(path, name: str, info, data_len: int) -> tuple[np.dtype, tuple, int, int]:
    """(dtype, shape, begin, end) of one header entry, every field checked against the data's length."""
    what = f"tensor {name!r}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _fail(path, f"{what} has a bad entry {short(info)} (it needs exactly dtype, shape and data_offsets)")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise _fail(path, f"{what} has a bad entry: dtype {short(dtype)} is not one read ({', '.join(_DTYPES)})")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape):
        raise _fail(path, f"{what} has a bad entry: shape {short(shape)} must be a list of at most {MAX_DIMS} ints")
    if any(v < 0 for v in shape):
        raise _fail(path, f"{what} has a bad entry: shape {shape} has a negative size")
    if not isinstance(offsets, list) or len(offsets) != 2 \
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in offsets):
        raise _fail(path, f"{what} has a bad entry: data_offsets {short(offsets)} must be two ints [begin, end]")
    dt = _DTYPES[dtype]
    b, e = offsets
    need = math.prod(shape) * dt.itemsize
    if not 0 <= b <= e <= data_len:
        raise _fail(path, f"{what} ({dtype} {shape}): offsets {[b, e]} point outside the {data_len} data bytes "
                    "after the header")
    if e - b != need:
        raise _fail(path, f"{what}: offsets {[b, e]} do not hold a {dtype} {shape}: its shape needs {need} bytes, "
                    f"its data has {e - b}")
    return dt, tuple(shape), b, e


def read_tensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: float32 array (integers as int64)}, metadata) of any safetensors file.

    The file is untrusted: its header length, every entry's dtype, shape and offsets are checked
    against the file's size, and the arrays it would make against the memory limit, before any
    tensor is read; NaN or Inf weights are refused. AnyDeviceError naming the file and what is wrong."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        raise _fail(path, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise _fail(path, "is a directory, not a safetensors file")
    if not stat.S_ISREG(st.st_mode):
        raise _fail(path, "is not a regular file (a safetensors file is expected)")
    size = st.st_size
    try:
        with open(path, "rb") as f:
            return _read(path, f, size)
    except OSError as exc:
        raise _fail(path, f"cannot be read: {exc.strerror or exc}") from None


def _read(path, f, size):
    if size == 0:
        raise _fail(path, "is empty (0 bytes), not a safetensors file")
    head = f.read(8)
    if len(head) < 8:
        raise _fail(path, f"is not a safetensors file (its {len(head)} bytes are shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER:
        raise _fail(path, f"is not a safetensors file (header length {n} does not fit the {size}-byte file; "
                    f"a header has at most {MAX_HEADER} bytes)")
    if 8 + n > size:
        raise _fail(path, f"is not a safetensors file (header length {n} does not fit the {size}-byte file: it "
                    "points past the end)")
    text = f.read(n)
    if len(text) != n:
        raise _fail(path, f"was cut short while reading (header of {n} bytes, {len(text)} read)")
    try:
        header = json.loads(text.decode("utf-8"))
    except RecursionError:
        raise _fail(path, "is not a safetensors file (its header nests too deep)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"is not a safetensors file (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise _fail(path, "is not a safetensors file (header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _fail(path, f"has a __metadata__ that is a JSON {type(meta).__name__}, not an object")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise _fail(path, f"has a __metadata__ entry {short(k)} that is a JSON {type(v).__name__}, not a string")
    if _depth(header, 3) > 3:
        raise _fail(path, "is not a safetensors file (its header nests deeper than {name: {field: [...]}})")
    data_len = size - 8 - n
    entries = {k: _entry(path, k, info, data_len) for k, info in header.items()}
    # the arrays made (float32, integers as int64) must fit the memory limit, each and together
    from ..system.config import tensor_limit
    made = {k: math.prod(shape) * (8 if dt.kind in "iub" else 4) for k, (dt, shape, _, _) in entries.items()}
    total = sum(made.values())
    limit, free, where = tensor_limit(None, total)
    if total > limit:
        big = max(made, key=made.get)
        lim = f"ANYDEVICE_MAX_TENSOR_MB={limit / 2**20:g}" if free is None else \
            f"{_mem(limit)} (half of the {_mem(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"
        raise _fail(path, f"its {len(made)} tensors would need {_mem(total)} as float32 (the largest, {big!r} "
                    f"{list(entries[big][1])}, {_mem(made[big])}), over the limit of {lim}")
    out = {}
    for k, (dt, shape, b, e) in entries.items():
        f.seek(8 + n + b)
        raw = f.read(e - b)
        if len(raw) != e - b:
            raise _fail(path, f"was cut short while reading tensor {k!r} ({e - b} bytes, {len(raw)} read)")
        a = np.frombuffer(raw, dtype=dt).reshape(shape)
        if dt.kind == "f" and not np.isfinite(a).all():
            raise _fail(path, f"tensor {k!r} {list(shape)} holds {int((~np.isfinite(a)).sum())} NaN or Inf values")
        if header[k]["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif dt.kind in "iub":
            a = a.astype(np.int64)
        with np.errstate(over="ignore"):  # F64 beyond float32's range: refused just below
            a = np.array(a, dtype=np.float32 if a.dtype.kind == "f" else np.int64)
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise _fail(path, f"tensor {k!r} {list(shape)} holds {int((~np.isfinite(a)).sum())} values out of "
                        "float32's range (or NaN or Inf)")
        out[k] = a
    return out, dict(meta)


def load(path) -> Network:
    """The Network saved at ``path`` (by ``save``, or any safetensors file whose metadata holds the
    layer spec under "anydevice.layers" and whose tensors are the parameters by torch's names).
    The file is untrusted: its spec is checked as ``Network.from_spec_json`` checks one (sizes
    against the memory limit included), and its tensors must be exactly the ones the layers have:
    AnyDeviceError naming the file and, in its reason, the layer, tensor or setting and value."""
    tensors, meta = read_tensors(path)
    path = os.fspath(path)
    spec = meta.get(LAYERS_KEY)
    if spec is None:
        raise _fail(path, f"has no layer spec (metadata {LAYERS_KEY!r}): not a network saved by AnyDevice")
    try:
        net = Network.from_spec_json(spec)
    except AnyDeviceError as exc:
        raise _fail(path, f"its layer spec is refused: {exc}") from None
    try:
        buffer_names = json.loads(meta.get(BUFFERS_KEY, "[]"))
    except (ValueError, RecursionError):
        buffer_names = None
    if not isinstance(buffer_names, list) or not all(isinstance(k, str) for k in buffer_names):
        raise _fail(path, f"its metadata {BUFFERS_KEY!r} = {short(meta.get(BUFFERS_KEY))} is not a JSON list of "
                    "tensor names")
    buffer_names = set(buffer_names) | {k for k in tensors if k.endswith((".running_mean", ".running_var"))}
    params = {k: v for k, v in tensors.items() if k not in buffer_names and v.dtype.kind == "f"}
    buffers = {k: v for k, v in tensors.items() if k in buffer_names and v.dtype.kind == "f"}
    want_p, want_b = param_names(net.layers)
    for names, have, what in ((want_p, params, "parameter"), (want_b, buffers, "buffer")):
        for k in names:
            if k not in have:
                key = k.rsplit(".", 1)[0]
                layer = _layer_at(net.layers, key)
                why = "the file has no weights at all" if not params and not buffers else \
                    f"the file has {len(params)} parameter and {len(buffers)} buffer tensors, not this one"
                raise _fail(path, f"has no tensor {k!r}, the {k.rsplit('.', 1)[1]} of layer {key} ({layer['type']}) "
                            f"({why}): not a trained network")
        for k in have:
            if k not in names:
                raise _fail(path, f"its tensor {k!r} {list(have[k].shape)} is no {what} of its layers")
    if net.in_shape is not None:  # order as the layers make them (torch's), checked against them
        ps, bs = net.param_shapes(net.in_shape)
        order = [k for k in ps if k in params] + [k for k in params if k not in ps]
        params = {k: params[k] for k in order}
        buffers = {k: buffers[k] for k in [k for k in bs if k in buffers] + [k for k in buffers if k not in bs]}
    else:
        params = {k: params[k] for k in want_p}
    try:
        return net.with_params(params, buffers)
    except AnyDeviceError as exc:
        raise _fail(path, f"its tensors do not fit its layers: {exc}") from None
