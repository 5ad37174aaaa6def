"""backend/system/allocator.py: glibc's malloc thresholds fixed once, left alone where the user set malloc's
own variables, where ANYDEVICE_MALLOC_TUNE=0 or off glibc; the NumPy backend applies it when it starts."""
import platform

import pytest

from anydevice.backend.system import allocator


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(allocator, "_state", [])
    for k in ("GLIBC_TUNABLES", "ANYDEVICE_MALLOC_TUNE"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc")
def test_thresholds_are_fixed_once(fresh):
    line = allocator.tune()
    assert line == "mmap threshold 32 MiB, trim threshold 256 MiB"
    fresh.setenv("ANYDEVICE_MALLOC_TUNE", "0")
    assert allocator.tune() == line  # once per process


def test_left_alone_when_switched_off_or_set_by_the_user(fresh):
    fresh.setenv("ANYDEVICE_MALLOC_TUNE", "0")
    assert allocator.tune() == "left as it is (ANYDEVICE_MALLOC_TUNE=0)"
    fresh.setattr(allocator, "_state", [])
    fresh.delenv("ANYDEVICE_MALLOC_TUNE")
    fresh.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")
    assert allocator.tune() == "left as it is (malloc's own variables are set)"
    fresh.setattr(allocator, "_state", [])
    fresh.delenv("GLIBC_TUNABLES")
    fresh.setenv("MALLOC_ARENA_MAX_", "2")
    assert allocator.tune() == "left as it is (malloc's own variables are set)"


def test_the_numpy_backend_tunes_when_it_starts(fresh):
    from anydevice.backend.devices.numpy import backend as nb
    nb.create()
    assert allocator._state and allocator._state[0]
