"""A safe, NumPy-only reader of GGUF files (llama.cpp / ComfyUI-GGUF weights): ``read_gguf(path)``.

Layout (little-endian; versions 2 and 3)::

    "GGUF"  u32 version  u64 n_tensors  u64 n_kv
    n_kv x      key: string, u32 value type, value
    n_tensors x name: string, u32 n_dims, n_dims x u64 ne (innermost first), u32 ggml type, u64 offset
    padding to ``general.alignment`` (default 32), then the data; each offset is relative to it

A string is a u64 length and UTF-8 bytes; an array a u32 item type, a u64 count and the items
(arrays may nest). ``ne`` is ggml's order, innermost dimension first: the torch shape is its reverse,
and ggml's blocks (32 elements for Q4_0 .. Q8_0) run along ``ne[0]``, so a block never crosses a row.

Values: quantized types in ``quant.GGUF_TYPES`` become ``QTensor`` (their bytes are our formats, as
they are), F32/F16/F64 NumPy float arrays, BF16 ``dtypes.BF16`` bit arrays, I8..I64 integer arrays.
All are read-only views of one ``np.memmap`` of the file: nothing is read until used.

The file is untrusted. Every count and length is checked against the bytes left before anything is
allocated or looped over (a count needs at least its minimum encoded size per item), nesting is
bounded, offsets must be aligned and every tensor's data must lie inside the file; duplicate keys or
tensor names, unknown value types, bad UTF-8, more than 4 dims and unsupported ggml types (K-quants,
IQ*, ...) are refused. Only ``AnyDeviceError("GGUF", <file>, ...)`` escapes, naming what is wrong.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..ops import quant
from ..ops.dtypes import BF16
from ..system.errors import AnyDeviceError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4      #: ggml's GGML_MAX_DIMS
MAX_NESTING = 8   #: arrays of arrays

#: ggml type value -> name (for messages; the values ggml has used)
GGML_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_2", 5: "Q4_3", 6: "Q5_0", 7: "Q5_1",
              8: "Q8_0", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
              15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
              21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64",
              28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}
#: ggml type value -> NumPy dtype of the unquantized types (BF16: uint16 bits)
PLAIN = {0: "<f4", 1: "<f2", 28: "<f8", 24: "i1", 25: "<i2", 26: "<i4", 27: "<i8", 30: "<u2"}
SUPPORTED = sorted(GGML_NAMES[t] for t in (*PLAIN, *quant.GGUF_TYPES))

#: metadata value type -> struct format of the scalars (7: bool, 8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFFile:
    """What ``read_gguf`` found: ``metadata`` (key -> int, float, bool, str or list), ``tensors``
    (name -> QTensor or read-only array, in file order, torch shapes), ``types`` (name -> ggml type
    name, skipped tensors included), ``skipped`` (names of unsupported tensors left out)."""
    path: str
    version: int
    alignment: int
    data_offset: int
    metadata: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    types: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)


class _Reader:
    """A cursor over the file's bytes; every read checks the bytes left first."""

    def __init__(self, name: str, buf: np.ndarray):
        self.name, self.buf, self.size, self.pos = name, buf, buf.size, 0

    def fail(self, what, reason: str):
        raise AnyDeviceError("GGUF", self.name, what, reason)

    def need(self, n: int, what: str):
        if n < 0 or n > self.size - self.pos:
            self.fail(what, f"needs {n} bytes at offset {self.pos} but the file has "
                            f"{max(self.size - self.pos, 0)} left (truncated or corrupt)")

    def take(self, n: int, what: str) -> np.ndarray:
        self.need(n, what)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what).tobytes())[0]

    def count(self, min_item: int, what: str) -> int:
        """A u64 count of items of at least ``min_item`` bytes each, checked against the bytes left."""
        n = self.scalar("Q", what)
        if n * min_item > self.size - self.pos:
            self.fail(what, f"claims {n} items of at least {min_item} bytes but only "
                            f"{self.size - self.pos} bytes follow (truncated or corrupt)")
        return n

    def string(self, what: str) -> str:
        n = self.count(1, f"{what} length")
        try:
            return self.take(n, what).tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(what, f"is not valid UTF-8 ({e.reason} at byte {e.start})")

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype != _ARRAY:
            self.fail(what, f"has unknown value type {vtype}")
        if depth >= MAX_NESTING:
            self.fail(what, f"nests arrays more than {MAX_NESTING} deep")
        itype = self.scalar("I", f"{what} item type")
        if itype in _SCALARS:
            fmt = _SCALARS[itype]
            n = self.count(struct.calcsize(fmt), f"{what} count")
            raw = self.take(n * struct.calcsize(fmt), what)
            if itype == 7:
                return [bool(b) for b in raw.tolist()]
            return np.frombuffer(raw.tobytes(), "<" + fmt).tolist()
        if itype not in (_STRING, _ARRAY):
            self.fail(what, f"has arrays of unknown value type {itype}")
        n = self.count(8 if itype == _STRING else 12, f"{what} count")
        return [self.value(itype, f"{what}[{i}]", depth + 1) for i in range(n)]


def read_gguf(path, skip_unsupported: bool = False) -> GGUFFile:
    """Read a GGUF file's metadata and tensor table and map its tensors (no data is copied).

    A tensor of a ggml type this pack cannot use raises, unless ``skip_unsupported``: then it is left
    out of ``tensors`` and listed in ``skipped``. Any problem with the file raises AnyDeviceError
    (op "GGUF", argument the file name)."""
    name = os.fspath(path)
    try:
        size = os.path.getsize(name)
        if size < 24:
            raise AnyDeviceError("GGUF", name, f"{size} bytes", "is too short for a GGUF header (24 bytes)")
        buf = np.memmap(name, dtype=np.uint8, mode="r").view(np.ndarray)
    except OSError as e:
        raise AnyDeviceError("GGUF", name, None, f"cannot be read: {e.strerror or e}") from None
    try:
        return _parse(_Reader(name, buf), skip_unsupported)
    except AnyDeviceError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError, struct.error) as e:
        raise AnyDeviceError("GGUF", name, None, f"is corrupt ({type(e).__name__}: {e})") from None


def _parse(r: _Reader, skip_unsupported: bool) -> GGUFFile:
    magic = r.take(4, "magic").tobytes()
    if magic != MAGIC:
        r.fail(f"magic {magic!r}", "is not a GGUF file (the first 4 bytes must be b'GGUF')")
    version = r.scalar("I", "version")
    if version not in VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        if swapped in (1, 2, 3):
            r.fail(f"version {swapped}", "is a big-endian GGUF file; only little-endian files are supported")
        r.fail(f"version {version}", f"is not supported (supported: {', '.join(map(str, VERSIONS))})")
    n_tensors = r.count(24, "tensor count")   # name length 8, n_dims 4, type 4, offset 8
    n_kv = r.count(13, "metadata count")      # key length 8, type 4, a 1-byte value
    meta = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        if key in meta:
            r.fail(f"metadata key {key!r}", "appears twice")
        meta[key] = r.value(r.scalar("I", f"type of {key!r}"), f"metadata {key!r}")
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(align) is not int or align <= 0 or align & (align - 1):
        r.fail(f"general.alignment {align!r}", "must be a positive power of two")
    infos = []
    for i in range(n_tensors):
        tname = r.string(f"tensor name #{i}")
        n_dims = r.scalar("I", f"dims of tensor {tname!r}")
        if n_dims > MAX_DIMS:
            r.fail(f"tensor {tname!r}", f"has {n_dims} dimensions (at most {MAX_DIMS})")
        ne = [r.scalar("Q", f"shape of tensor {tname!r}") for _ in range(n_dims)]
        ttype = r.scalar("I", f"type of tensor {tname!r}")
        offset = r.scalar("Q", f"offset of tensor {tname!r}")
        infos.append((tname, tuple(reversed(ne)), ttype, offset))
    data_offset = -(-r.pos // align) * align
    if data_offset > r.size:
        r.fail("data section", f"starts at {data_offset}, past the end of the file ({r.size} bytes)")
    out = GGUFFile(r.name, version, align, data_offset, meta)
    for tname, shape, ttype, offset in infos:
        if tname in out.types:
            r.fail(f"tensor {tname!r}", "appears twice")
        tn = GGML_NAMES.get(ttype, f"type {ttype}")
        out.types[tname] = tn
        if ttype not in PLAIN and ttype not in quant.GGUF_TYPES:
            if skip_unsupported:
                out.skipped.append(tname)
                continue
            r.fail(f"tensor {tname!r}", f"{tn} is not supported (supported: {', '.join(SUPPORTED)})")
        out.tensors[tname] = _tensor(r, out, tname, shape, ttype, offset)
    return out


def _tensor(r: _Reader, f: GGUFFile, tname: str, shape: tuple, ttype: int, offset: int):
    numel = 1
    for d in shape:
        numel *= d
    fmt = quant.FORMATS[quant.GGUF_TYPES[ttype]] if ttype in quant.GGUF_TYPES else None
    if fmt is not None:
        if not shape or shape[-1] % fmt.block:
            r.fail(f"tensor {tname!r} {shape}", f"has rows of {shape[-1] if shape else 1}, not a multiple "
                                                  f"of {GGML_NAMES[ttype]}'s block of {fmt.block}")
        nbytes = numel // fmt.block * fmt.block_bytes
    else:
        nbytes = numel * np.dtype(PLAIN[ttype]).itemsize
    if offset % f.alignment:
        r.fail(f"tensor {tname!r}", f"has offset {offset}, not a multiple of the alignment {f.alignment}")
    start = f.data_offset + offset
    if start + nbytes > r.size:
        r.fail(f"tensor {tname!r} {shape}", f"data [{start}, {start + nbytes}) lies outside the file "
                                            f"({r.size} bytes)")
    raw = r.buf[start:start + nbytes]
    if fmt is not None:
        return quant.QTensor(fmt.name, shape, raw)
    arr = raw.view(PLAIN[ttype]).reshape(shape)
    return arr.view(BF16) if ttype == 30 else arr
