"""Built program binaries on disk, keyed by device, driver, source hash and build options.

Each entry is ``MAGIC + sha256(payload) + payload``; an entry whose header or checksum does not
match is dropped (and the caller rebuilds), so a truncated or corrupt file never reaches a driver.
Writes are atomic (unique temporary file + ``os.replace``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("anydevice")

MAGIC = b"ADCL1\n"


def program_digest(device_key: str, source: str, options: str) -> str:
    """The cache key of one build: device (name, vendor, driver...), options and source text."""
    h = hashlib.sha256()
    for part in (device_key, options, source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


class BinaryStore:
    def __init__(self, folder: Path | str):
        self.folder = Path(folder)

    def path_for(self, digest: str) -> Path:
        return self.folder / f"{digest}.bin"

    def load(self, digest: str) -> bytes | None:
        """The stored payload, or None (absent, or corrupt: then the entry is removed)."""
        path = self.path_for(digest)
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        try:
            if not raw.startswith(MAGIC):
                raise ValueError("bad header")
            sha, payload = raw[len(MAGIC):len(MAGIC) + 64], raw[len(MAGIC) + 64:]
            if hashlib.sha256(payload).hexdigest().encode() != sha:
                raise ValueError("checksum mismatch")
            return payload
        except ValueError as exc:
            log.debug("anydevice: cache entry %s unusable (%s); rebuilding", path.name, exc)
            self.drop(digest)
            return None

    def drop(self, digest: str) -> None:
        try:
            self.path_for(digest).unlink()
        except OSError:
            pass

    def save(self, digest: str, payload: bytes) -> None:
        if not payload:
            return
        path = self.path_for(digest)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(payload).hexdigest().encode() + bytes(payload))
            os.replace(tmp, path)
        except Exception as exc:
            log.debug("anydevice: could not store program binary: %s", exc)
