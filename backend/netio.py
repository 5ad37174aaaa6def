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
import os
import struct

import numpy as np

from .errors import AnyDeviceError
from .network import Network, _host

LAYERS_KEY = "anydevice.layers"
BUFFERS_KEY = "anydevice.buffers"
#: the largest header read (safetensors' own limit is 100 MB)
MAX_HEADER = 100 << 20
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


def read_tensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({name: float32 array (integers as int64)}, metadata) of any safetensors file."""
    op = "load"
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as exc:
        raise AnyDeviceError(op, "path", path, f"cannot be read: {exc.strerror or exc}") from None
    if len(blob) < 8:
        raise AnyDeviceError(op, "path", path, "is not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER or 8 + n > len(blob):
        raise AnyDeviceError(op, "path", path, f"is not a safetensors file (header length {n} does not fit the "
                             f"{len(blob)}-byte file)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AnyDeviceError(op, "path", path, f"is not a safetensors file (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise AnyDeviceError(op, "path", path, "is not a safetensors file (header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise AnyDeviceError(op, "path", path, "has a __metadata__ that is not an object")
    data = memoryview(blob)[8 + n:]
    out = {}
    for k, info in header.items():
        try:
            dt = _DTYPES[info["dtype"]]
            shape = tuple(int(v) for v in info["shape"])
            b, e = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise AnyDeviceError(op, "path", path, f"tensor {k!r} has a bad entry {info!r} (dtypes read: "
                                 f"{', '.join(_DTYPES)})") from None
        count = int(np.prod(shape)) if shape else 1
        if any(v < 0 for v in shape) or not 0 <= b <= e <= len(data) or e - b != count * dt.itemsize:
            raise AnyDeviceError(op, "path", path, f"tensor {k!r}: offsets {[b, e]} do not hold a {info['dtype']} "
                                 f"{list(shape)} inside the {len(data)} data bytes")
        a = np.frombuffer(data[b:e], dtype=dt).reshape(shape)
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif dt.kind in "iub":
            a = a.astype(np.int64)
        out[k] = np.array(a, dtype=np.float32 if a.dtype.kind == "f" else np.int64)
    return out, {str(k): str(v) for k, v in meta.items()}


def load(path) -> Network:
    """The Network saved at ``path`` (by ``save``, or any safetensors file whose metadata holds the
    layer spec under "anydevice.layers" and whose tensors are the parameters by torch's names)."""
    tensors, meta = read_tensors(path)
    spec = meta.get(LAYERS_KEY)
    if spec is None:
        raise AnyDeviceError("load", "path", os.fspath(path), f"has no layer spec (metadata {LAYERS_KEY!r}): "
                             "not a network saved by AnyDevice")
    net = Network.from_spec_json(spec)
    try:
        buffer_names = set(json.loads(meta.get(BUFFERS_KEY, "[]")))
    except ValueError:
        buffer_names = set()
    buffer_names |= {k for k in tensors if k.endswith((".running_mean", ".running_var"))}
    params = {k: v for k, v in tensors.items() if k not in buffer_names and v.dtype.kind == "f"}
    buffers = {k: v for k, v in tensors.items() if k in buffer_names and v.dtype.kind == "f"}
    if net.in_shape is not None:  # order as the layers make them (torch's), checked against them
        ps, bs = net.param_shapes(net.in_shape)
        order = [k for k in ps if k in params] + [k for k in params if k not in ps]
        params = {k: params[k] for k in order}
        buffers = {k: buffers[k] for k in [k for k in bs if k in buffers] + [k for k in buffers if k not in bs]}
    try:
        return net.with_params(params, buffers)
    except AnyDeviceError as exc:
        raise AnyDeviceError("load", "path", os.fspath(path), f"its tensors do not fit its layers: {exc}") from None
