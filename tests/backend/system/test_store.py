"""Damaged cache files (backend/system/store.py, read by backend/system/selfcheck.py and
backend/devices/opencl/device.py): whatever is wrong with ``selfcheck.json`` or ``opencl/devices.json`` under
``ANYDEVICE_CACHE_DIR`` (bytes that are not UTF-8, text that is not JSON or is cut short, JSON of
the wrong shape, entries of the wrong type), the backends come up available, the file is written
again valid (its sound sections kept) and one warning names it. The backend part runs on the real
OpenCL backend (skipped, with the reason, without one); built kernels stay in the usual cache."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from anydevice.backend import get_backend, list_backends
from anydevice.backend.system import registry, selfcheck
from anydevice.backend.devices.runtime import JsonStore

KEY = "KEY"  # stands for the entry of the device under test
GOOD = {"ok": True, "reason": ""}

#: (id, the file's bytes): every way a cache file was seen or can be damaged
DAMAGES = [
    ("not-utf8", b"\x9a\x00\xff{\"a\": 1}"),
    ("utf16", json.dumps({KEY: GOOD}).encode("utf-16")),
    ("not-json", b"{ not json"),
    ("truncated", b'{"KEY": {"ok": tr'),
    ("empty", b""),
    ("nul-bytes", b"\x00" * 64),
    ("list", b"[1, 2]"),
    ("number", b"42"),
    ("null", b"null"),
    ("string", b'"x"'),
    ("deep", b"[" * 100000 + b"]" * 100000),
    ("section-list", b'{"KEY": [1, 2]}'),
    ("section-number", b'{"KEY": 5}'),
    ("entry-ok-number", b'{"KEY": {"ok": 0, "reason": 5}}'),
    ("entry-ok-string", b'{"KEY": {"ok": "yes", "reason": ""}}'),
    ("entry-ok-null", b'{"KEY": {"ok": null}}'),
    ("entry-reason-list", b'{"KEY": {"ok": false, "reason": ["no"]}}'),
    ("entry-no-ok", b'{"KEY": {"reason": "x"}}'),
]
#: a sound section stored next to the damaged one: kept by the rebuild (when the file could be read)
OTHER = ("other device", {"ok": True, "reason": ""})


def _one_section(content: bytes) -> bool:
    """Whether the damage is to one section of a readable file (the others are kept)."""
    try:
        return isinstance(json.loads(content.decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False


def _with_other(content: bytes) -> bytes:
    """The damage with a sound section beside it, where the damage is to one section."""
    if not _one_section(content):
        return content
    return content[:1] + json.dumps(OTHER[0]).encode() + b": " + json.dumps(OTHER[1]).encode() + b", " + content[1:]


def _warnings_naming(caplog, path) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and str(path) in r.getMessage()]


# ---- the store alone (no device needed) -----------------------------------------------------------
@pytest.mark.parametrize("content", [c for _, c in DAMAGES], ids=[i for i, _ in DAMAGES])
def test_damaged_store_rebuilt_with_one_warning(tmp_path, caplog, content):
    path = tmp_path / "s.json"
    path.write_bytes(_with_other(content))
    s = JsonStore(path, fields={"ok": bool, "reason": str}, required=("ok",))
    with caplog.at_level(logging.WARNING, "anydevice"):
        first = s.read()
        assert s.read() == first and s.section(KEY) == {}
        s.update(KEY, {"ok": True, "reason": ""})
    assert KEY not in first and all(v == GOOD for v in first.values())
    assert len(_warnings_naming(caplog, path)) == 1, caplog.records
    assert "corrupt" in _warnings_naming(caplog, path)[0]
    data = json.loads(path.read_bytes().decode("utf-8"))
    want = {KEY: GOOD}
    if _one_section(content):  # one damaged section: the other one is kept
        want[OTHER[0]] = OTHER[1]
    assert data == want


def test_damaged_store_rewritten_on_read(tmp_path, caplog):
    """A read alone rewrites the damaged file (with what could be read of it)."""
    path = tmp_path / "s.json"
    path.write_bytes(_with_other(b'{"KEY": {"ok": 0}}'))
    with caplog.at_level(logging.WARNING, "anydevice"):
        assert JsonStore(path, fields={"ok": bool}).read() == {OTHER[0]: OTHER[1]}
        assert json.loads(path.read_text("utf-8")) == {OTHER[0]: OTHER[1]}
        assert JsonStore(path, fields={"ok": bool}).read() == {OTHER[0]: OTHER[1]}
    assert len(_warnings_naming(caplog, path)) == 1


def test_sound_store_untouched(tmp_path, caplog):
    path = tmp_path / "s.json"
    text = json.dumps({KEY: {"ok": False, "reason": "no"}, "x": {"ok": True, "extra": [1]}})
    path.write_text(text, encoding="utf-8")
    mtime = path.stat().st_mtime_ns
    with caplog.at_level(logging.WARNING, "anydevice"):
        assert JsonStore(path, fields={"ok": bool, "reason": str}, required=("ok",)).read() == json.loads(text)
    assert path.read_text("utf-8") == text and path.stat().st_mtime_ns == mtime
    assert not caplog.records


def test_unwritable_cache_folder_warns_once(tmp_path, caplog, monkeypatch):
    path = tmp_path / "s.json"
    path.write_bytes(b"\x9a")
    s = JsonStore(path)
    monkeypatch.setattr(JsonStore, "_write", lambda self, data: False)  # a read-only folder
    with caplog.at_level(logging.WARNING, "anydevice"):
        assert [s.read(), s.read(), s.section("a")] == [{}, {}, {}]
    assert len(_warnings_naming(caplog, path)) == 1
    JsonStore._warned.discard(str(path))


# ---- the backends on a damaged cache folder ----------------------------------------------------------
@pytest.fixture
def cache(monkeypatch, tmp_path):
    """ANYDEVICE_CACHE_DIR in tmp_path (built kernels from the usual cache), a fresh registry, and
    the keys of the OpenCL device's entries in devices.json and selfcheck.json."""
    pytest.importorskip("pyopencl")
    from anydevice.backend.devices.opencl import device, programs
    from anydevice.backend.devices import opencl as opencl_backend
    probe = opencl_backend.probe("opencl")
    if not probe["available"]:
        pytest.skip(f"opencl backend unavailable: {probe['reason']}")
    real_root = device.cache_root()
    for var in ("ANYDEVICE_BACKEND", "ANYDEVICE_SELFCHECK", "ANYDEVICE_OPENCL_FAMILY", "ANYDEVICE_OPENCL_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ANYDEVICE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(programs, "cache_root", lambda: real_root)
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())  # the process's own comes back after
    monkeypatch.setattr(selfcheck, "_memo", {})
    dev_key = device._device_key(device._usable()[0][0][2])
    check_key, _ = selfcheck._subject("opencl", 0, opencl_backend, "opencl")
    (tmp_path / "opencl").mkdir()
    return {"devices": (tmp_path / "opencl" / "devices.json", dev_key),
            "selfcheck": (tmp_path / selfcheck.STORE_NAME, check_key)}


@pytest.mark.parametrize("content", [c for _, c in DAMAGES], ids=[i for i, _ in DAMAGES])
def test_backends_come_up_on_damaged_cache_files(cache, caplog, content):
    for path, key in cache.values():
        path.write_bytes(_with_other(content).replace(b'"KEY"', json.dumps(key).encode()))
    with caplog.at_level(logging.WARNING, "anydevice"):
        infos = {i.name: i for i in list_backends(refresh=True)}
        for name in ("opencl", "numpy", "cpu"):
            assert infos[name].available, (name, infos[name].reason)
        be = get_backend("opencl")
        y = be.to_numpy(be.matmul(np.ones((5, 3), np.float32), np.full((3, 4), 2.0, np.float32)))
        np.testing.assert_array_equal(y, np.full((5, 4), 6.0, np.float32))
        assert get_backend("numpy").name == "numpy"
        assert registry.selfcheck_status(registry._probe_all()["opencl"]) == "passed"
    for what, (path, key) in cache.items():
        assert len(_warnings_naming(caplog, path)) == 1, (what, [r.getMessage() for r in caplog.records])
        data = json.loads(path.read_bytes().decode("utf-8"))  # written again, valid
        assert isinstance(data, dict) and data[key]["ok"] is True and data[key]["reason"] == "", (what, data)
        assert all(isinstance(v, dict) and isinstance(v.get("ok"), bool) for v in data.values())
        if _one_section(content):
            assert data[OTHER[0]] == OTHER[1]  # the sound section was kept
            assert set(data) == {key, OTHER[0]}
        else:
            assert set(data) == {key}
    verdict = json.loads(cache["selfcheck"][0].read_text("utf-8"))[cache["selfcheck"][1]]
    assert {k: type(v) for k, v in verdict.items()} == {k: (v if isinstance(v, type) else float)
                                                       for k, v in selfcheck.VERDICT_FIELDS.items()}
