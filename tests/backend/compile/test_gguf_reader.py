"""backend/compile/gguf_reader.py: GGUF files written by the ``gguf`` package read back exactly (quantized
tensors dequantize as gguf's own dequantizer does, shapes in torch order, metadata equal, the same as
gguf.GGUFReader), and malformed files fail fast with AnyDeviceError naming the problem."""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest

from anydevice.backend.compile.gguf_reader import read_gguf
from anydevice.backend.ops import dtypes
from anydevice.backend.ops.quant import QTensor
from anydevice.backend.system.errors import AnyDeviceError

QUANT = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
SHAPES = [(320, 640), (8, 4, 2, 32), (64,)]


def _gguf():
    return pytest.importorskip("gguf", reason="the gguf package writes the reference files")


def _write(gguf, path, tensors, meta=(), alignment=None):
    w = gguf.GGUFWriter(str(path), "test")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value in meta:  # (value, GGUFValueType), a list, a string or a uint32
        if isinstance(value, tuple):
            w.add_key_value(key, *value)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)
    for name, arr, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    gguf = _gguf()
    rng = np.random.default_rng(0)
    T = gguf.GGMLQuantizationType
    tensors = []
    for q in QUANT:
        for i, shape in enumerate(SHAPES):
            tensors.append((f"{q.lower()}.{i}", rng.standard_normal(shape).astype(np.float32), T[q]))
    tensors += [("f32", rng.standard_normal((3, 5, 7)).astype(np.float32), None),
                ("conv.f16", rng.standard_normal((64, 32, 3, 3)).astype(np.float16), None),
                ("bf16", rng.standard_normal((16, 48)).astype(np.float32), T.BF16),
                ("i32", np.arange(-6, 6, dtype=np.int32).reshape(3, 4), None),
                ("i8", np.arange(-3, 3, dtype=np.int8), None)]
    V = gguf.GGUFValueType
    meta = [("general.name", "tiny"), ("n", 7), ("neg", (-5, V.INT64)), ("big", (2 ** 63, V.UINT64)),
            ("ratio", (0.25, V.FLOAT32)), ("pi", (3.141592653589793, V.FLOAT64)), ("flag", (True, V.BOOL)),
            ("byte", (200, V.UINT8)), ("words", ["a", "bé", ""]), ("ints", [1, -2, 3]),
            ("floats", [0.5, 1.5]), ("bools", [True, False]), ("nested", [[1, 2], [3]])]
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    _write(gguf, path, tensors, meta, alignment=64)
    return gguf, path, tensors, meta


def test_tensors_match_gguf_dequantize_and_torch_order(model):
    gguf, path, tensors, _ = model
    f = read_gguf(path)
    assert list(f.tensors) == [t[0] for t in tensors] and f.alignment == 64 and f.version == 3
    ref = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for name, arr, qtype in tensors:
        got = f.tensors[name]
        assert ref[name].shape.tolist()[::-1] == list(arr.shape)
        if qtype is not None and qtype.name in QUANT:
            assert isinstance(got, QTensor) and got.fmt == qtype.name.lower() and got.shape == arr.shape
            want = gguf.quants.dequantize(gguf.quants.quantize(arr, qtype), qtype)
            np.testing.assert_array_equal(got.dequantize(), want)
            np.testing.assert_array_equal(got.data, ref[name].data.reshape(-1))
            assert not got.data.flags.writeable
        elif name == "bf16":
            assert isinstance(got, dtypes.BF16) and got.shape == arr.shape
            want = gguf.quants.dequantize(gguf.quants.quantize(arr, qtype), qtype)
            np.testing.assert_array_equal(dtypes.from_bf16(got), want)
            np.testing.assert_array_equal(got, dtypes.to_bf16(arr))
        else:
            assert got.dtype == arr.dtype and got.shape == arr.shape and not got.flags.writeable
            np.testing.assert_array_equal(got, arr)
            np.testing.assert_array_equal(got, ref[name].data.reshape(arr.shape))
        assert f.types[name] == ref[name].tensor_type.name


def test_metadata_values(model):
    gguf, path, _, meta = model
    f = read_gguf(path)
    want = {k: (v[0] if isinstance(v, tuple) else v) for k, v in meta}
    for k, v in want.items():
        assert f.metadata[k] == v and type(f.metadata[k]) is type(v), k
    assert f.metadata["general.architecture"] == "test" and f.metadata["general.alignment"] == 64
    r = gguf.GGUFReader(str(path))
    for k in ("general.name", "n", "ints", "words", "pi"):
        assert r.get_field(k).contents() == f.metadata[k]


def test_skip_unsupported_and_v2(tmp_path):
    p = tmp_path / "k.gguf"
    p.write_bytes(_file([("ok", [32], 0, 0), ("k", [256], 12, 128)], data=bytes(128 + 144), version=2))
    with pytest.raises(AnyDeviceError, match=r"'k'.*Q4_K is not supported \(supported: .*Q8_0"):
        read_gguf(p)
    f = read_gguf(p, skip_unsupported=True)
    assert list(f.tensors) == ["ok"] and f.skipped == ["k"] and f.types["k"] == "Q4_K" and f.version == 2


# ---- malformed files (hand-built, no gguf needed) ------------------------------------------------
def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _file(tensors=(), kv=b"", n_kv=0, data=b"", version=3, n_tensors=None, magic=b"GGUF", align=32):
    """A GGUF file: tensors as (name, ne innermost-first, ggml type, offset)."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors, n_kv) + kv
    for name, ne, t, off in tensors:
        head += _s(name.encode()) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", t, off)
    return head + bytes(-len(head) % align) + data


CASES = {
    "bad magic": (_file(magic=b"GGML"), r"not a GGUF file"),
    "truncated header": (_file([("w", [32], 0, 0)], data=bytes(128))[:30], r"tensor count.*truncated"),
    "truncated tensor info": (_file([("w", [32], 0, 0)], data=bytes(128))[:54],
                              r"offset of tensor 'w'.*truncated"),
    "truncated data": (_file([("w", [8, 4], 0, 0)], data=bytes(100)), r"tensor 'w'.*outside the file"),
    "huge tensor count": (_file(n_tensors=2 ** 60), r"tensor count.*claims 1152921504606846976 items"),
    "huge metadata count": (_file(n_kv=2 ** 62), r"metadata count.*claims"),
    "huge string length": (_file(kv=struct.pack("<Q", 2 ** 40) + b"xx", n_kv=1),
                           r"metadata key #0 length.*claims 1099511627776"),
    "huge array count": (_file(kv=_s(b"a") + struct.pack("<IIQ", 9, 8, 2 ** 50), n_kv=1), r"'a' count.*claims"),
    "offset past the end": (_file([("w", [4], 0, 2 ** 40)], data=bytes(32)), r"tensor 'w'.*outside the file"),
    "unaligned offset": (_file([("w", [4], 0, 3)], data=bytes(64)), r"not a multiple of the alignment"),
    "duplicate names": (_file([("w", [4], 0, 0), ("w", [4], 0, 0)], data=bytes(32)), r"tensor 'w'.*appears twice"),
    "duplicate keys": (_file(kv=(_s(b"k") + struct.pack("<IB", 0, 1)) * 2, n_kv=2), r"'k'.*appears twice"),
    "unsupported type": (_file([("w", [256], 12, 0)], data=bytes(144)), r"Q4_K is not supported"),
    "unknown type": (_file([("w", [32], 99, 0)], data=bytes(64)), r"type 99 is not supported"),
    "unknown value type": (_file(kv=_s(b"k") + struct.pack("<IB", 77, 0), n_kv=1), r"unknown value type 77"),
    "bad utf-8": (_file(kv=_s(b"\xff\xfe") + struct.pack("<IB", 0, 0), n_kv=1), r"not valid UTF-8"),
    "too many dims": (_file([("w", [1] * 5, 0, 0)], data=bytes(32)), r"5 dimensions"),
    "block row": (_file([("w", [16, 2], 8, 0)], data=bytes(64)), r"rows of 16, not a multiple"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), r"big-endian"),
    "version 1": (_file(version=1), r"version 1.*not supported"),
    "deep nesting": (_file(kv=_s(b"a") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20 + bytes(8), n_kv=1),
                     r"nests arrays"),
    "bad alignment": (_file(kv=_s(b"general.alignment") + struct.pack("<II", 4, 3), n_kv=1), r"power of two"),
    "empty": (b"", r"too short"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_files_fail_fast(tmp_path, case):
    blob, pattern = CASES[case]
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    t = time.perf_counter()
    with pytest.raises(AnyDeviceError, match=pattern) as e:
        read_gguf(p)
    assert time.perf_counter() - t < 1.0
    assert e.value.op == "GGUF" and e.value.arg == str(p)


def test_missing_file(tmp_path):
    with pytest.raises(AnyDeviceError, match="cannot be read"):
        read_gguf(tmp_path / "nope.gguf")


def test_valid_hand_built_file_and_zero_sized_tensor(tmp_path):
    data = np.arange(8, dtype=np.float32).tobytes() + bytes(24)
    p = tmp_path / "ok.gguf"
    p.write_bytes(_file([("w", [4, 2], 0, 0), ("e", [0, 3], 1, 32)], data=data))
    f = read_gguf(p)
    np.testing.assert_array_equal(f.tensors["w"], np.arange(8, dtype=np.float32).reshape(2, 4))
    assert f.tensors["e"].shape == (3, 0) and f.tensors["e"].dtype == np.float16


def test_big_file_is_mapped_not_read(tmp_path):
    """A 2 GiB tensor (a sparse file) opens at once: the data is mapped, never read at open."""
    p = tmp_path / "big.gguf"
    n = 2 ** 29
    p.write_bytes(_file([("big", [n], 0, 0)]))
    with open(p, "r+b") as fh:
        fh.truncate(p.stat().st_size + 4 * n)
    t = time.perf_counter()
    f = read_gguf(p)
    assert time.perf_counter() - t < 1.0
    big = f.tensors["big"]
    assert big.shape == (n,) and not big.flags.owndata and not big.flags.writeable and big[-1] == 0
