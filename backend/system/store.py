"""The cache folder and small JSON stores with atomic, process-safe writes.

Writes go to a uniquely named temporary file in the same folder and replace the store in one
``os.replace`` (readers never see half a file); concurrent writers (two ComfyUI processes tuning
at once) serialise on a lock file and merge their section into what is on disk at that moment.
A damaged store (not UTF-8, not JSON, cut short, of the wrong shape, a section or field of the
wrong type) is rebuilt from what can be read of it, with one warning naming the file. Nothing here
raises: a read-only or full cache folder only costs the cache.
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
    from . import config
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
    merges ``values`` into entry ``key`` and writes atomically.

    Every section is an object; ``fields`` ({name: type or tuple of types}) gives the types of the
    fields a section may have, ``required`` the fields it must have. Whatever is wrong with the file
    (bytes that are not UTF-8, text that is not JSON or is cut short, JSON of another shape, a
    section or field of the wrong type) costs what cannot be read: the readable sections are kept,
    the file is written again without the rest, and one warning names the file."""

    _warned: set = set()
    _lock = threading.Lock()

    def __init__(self, path: Path | str, fields: dict | None = None, required: tuple = ()):
        self.path = Path(path)
        self.fields = dict(fields or {})
        self.required = tuple(required)

    def read(self) -> dict:
        data, why = self._load()
        if why:
            self._warn(why)
            self._rebuild()
        return data

    def _load(self) -> tuple[dict, str]:
        """(the sound sections of the file, what is wrong with it or "")."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, ""
        except OSError as exc:
            log.debug("anydevice: cannot read %s: %s", self.path, exc)
            return {}, ""
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return {}, f"not UTF-8 text: {exc}"
        except (ValueError, RecursionError) as exc:
            return {}, f"not JSON: {exc}"
        if not isinstance(data, dict):
            return {}, f"a JSON {type(data).__name__}, not an object"
        good, why = {}, ""
        for key, value in data.items():  # a section of another type is dropped and rebuilt
            bad = self._fault(value)
            if bad:
                why = why or f"section {key!r} {bad}"
            else:
                good[key] = value
        return good, why

    def _fault(self, section) -> str:
        """What is wrong with one section ("" when nothing)."""
        if not isinstance(section, dict):
            return f"is a JSON {type(section).__name__}, not an object"
        for name in self.required:
            if name not in section:
                return f"has no {name!r}"
        for name, types in self.fields.items():
            if name in section and not isinstance(section[name], types):
                return f"has {name!r} = {section[name]!r:.60} (a JSON {type(section[name]).__name__})"
        return ""

    def _rebuild(self) -> None:
        """Write the file again with its sound sections (read once more under the lock: another
        process may have replaced it meanwhile)."""
        with self._lock, _FileLock(self.path):
            data, why = self._load()
            if why and self._write(data):
                self._warned.discard(str(self.path))  # rebuilt: a new damage warns again

    def _warn(self, why: str) -> None:
        if str(self.path) not in self._warned:
            self._warned.add(str(self.path))
            log.warning("anydevice: cache file %s is corrupt (%s); rebuilding it", self.path, why)

    def section(self, key: str) -> dict:
        value = self.read().get(key, {})
        return value if isinstance(value, dict) else {}

    def update(self, key: str, values: dict) -> None:
        with self._lock, _FileLock(self.path):
            data, why = self._load()
            if why:
                self._warn(why)
            entry = data.get(key)
            if not isinstance(entry, dict):
                entry = data[key] = {}
            entry.update(values)
            if self._write(data):
                self._warned.discard(str(self.path))

    def _write(self, data: dict) -> bool:
        """Replace the file with ``data`` in one step; whether it was written."""
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            return True
        except Exception as exc:  # a read-only cache folder must not break anything
            log.debug("anydevice: could not write %s: %s", self.path, exc)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except Exception:
                    pass
            return False
