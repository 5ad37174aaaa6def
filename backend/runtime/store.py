"""The cache folder and small JSON stores with atomic, process-safe writes.

Writes go to a uniquely named temporary file in the same folder and replace the store in one
``os.replace`` (readers never see half a file); concurrent writers (two ComfyUI processes tuning
at once) serialise on a lock file and merge their section into what is on disk at that moment.
A store that cannot be parsed is rebuilt, with a warning naming the file. Nothing here raises:
a read-only or full cache folder only costs the cache.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("anydevice")

_LOCK_WAIT_S = 2.0
_STALE_LOCK_S = 30.0


def cache_dir(sub: str = "") -> Path:
    """``ANYDEVICE_CACHE_DIR`` (default ``~/.cache/anydevice``), optionally a sub-folder of it."""
    from .. import config
    base = config.get("ANYDEVICE_CACHE_DIR") or Path(os.path.expanduser("~")) / ".cache" / "anydevice"
    return base / sub if sub else base


class _FileLock:
    """A lock file created with O_EXCL (works on POSIX and Windows); waits at most _LOCK_WAIT_S,
    breaks a lock older than _STALE_LOCK_S (a crashed writer), and gives up silently."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")
        self.held = False

    def __enter__(self):
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
                self.held = True
                return self
            except FileExistsError:
                try:
                    if time.time() - self.path.stat().st_mtime > _STALE_LOCK_S:
                        self.path.unlink()
                        continue
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    return self  # write unlocked rather than not at all
                time.sleep(0.01)
            except OSError:
                return self

    def __exit__(self, *exc):
        if self.held:
            try:
                self.path.unlink()
            except OSError:
                pass
        return False


class JsonStore:
    """A JSON object on disk: ``read()`` the whole, ``section(key)`` one entry, ``update(key, values)``
    merges ``values`` into entry ``key`` and writes atomically."""

    _warned: set = set()
    _lock = threading.Lock()

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.debug("anydevice: cannot read %s: %s", self.path, exc)
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
        except ValueError as exc:
            self._warn(str(exc))
            return {}
        bad = [k for k, v in data.items() if not isinstance(v, dict)]
        if bad:  # every section is an object: a section of another type is dropped and rebuilt
            self._warn(f"section {bad[0]!r} is a JSON {type(data[bad[0]]).__name__}, not an object")
            data = {k: v for k, v in data.items() if k not in bad}
        return data

    def _warn(self, why: str) -> None:
        if str(self.path) not in self._warned:
            self._warned.add(str(self.path))
            log.warning("anydevice: cache file %s is corrupt (%s); rebuilding it", self.path, why)

    def section(self, key: str) -> dict:
        value = self.read().get(key, {})
        return value if isinstance(value, dict) else {}

    def update(self, key: str, values: dict) -> None:
        with self._lock, _FileLock(self.path):
            data = self.read()
            entry = data.get(key)
            if not isinstance(entry, dict):
                entry = data[key] = {}
            entry.update(values)
            self._write(data)

    def _write(self, data: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except Exception as exc:  # a read-only cache folder must not break anything
            log.debug("anydevice: could not write %s: %s", self.path, exc)
            try:
                os.unlink(tmp)  # noqa: F821 (set when mkstemp succeeded)
            except Exception:
                pass
