"""Host<->device transfer counters, kept by every backend (``contract.Backend`` inherits them).

The counting itself happens in the base class's conversion paths (``Backend.to_device``,
``Backend.to_numpy``, an op's result handed back as a torch tensor or a NumPy array, and
``read_check``), the one way values cross between the host and a device, so every backend counts
the same way without code of its own:

* ``uploads`` / ``bytes_up``: host arrays (NumPy, CPU torch tensors, Python numbers) made native;
* ``downloads`` / ``bytes_down``: native arrays handed back to the host;
* ``constants`` / ``bytes_constants``: uploads of constant parameters the caller marks as such
  (``to_device(..., constant=True)``: a conv kernel, a colour matrix, a bias, SSIM's window), which
  a caller can keep on the device and upload once per content;
* ``checks``: reads of a few numbers an op or a node decides on (an Inf/NaN flag, a range check).

Backends whose native arrays are host memory (NumPy, PyTorch on the CPU: ``host_memory``) move
nothing, so they count nothing. Reads a backend makes inside its own kernels (e.g. the OpenCL
Winograd path's 4-byte Inf/NaN flag) are not conversions and are not counted.
"""
from __future__ import annotations

import sys

import numpy as np

TRANSFER_KEYS = ("uploads", "downloads", "bytes_up", "bytes_down", "constants", "bytes_constants", "checks")
_BYTES = {"uploads": "bytes_up", "downloads": "bytes_down", "constants": "bytes_constants"}
_TOTALS = dict.fromkeys(TRANSFER_KEYS, 0)


def transfer_totals() -> dict:
    """Every backend's counters together since start-up (``reset_transfers`` does not reset them)."""
    return dict(_TOTALS)


def _on_host(x) -> bool:
    """A NumPy array or a CPU torch tensor (a value already in host memory)."""
    if isinstance(x, np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and x.device.type == "cpu"


class TransferCounts:
    """The counters of one backend (mixed into ``contract.Backend``)."""

    @property
    def host_memory(self) -> bool:
        """Native arrays live in host memory (NumPy, PyTorch CPU): conversions are no transfers."""
        if "_host_memory" not in self.__dict__:
            self._host_memory = _on_host(self._from_numpy(np.zeros(1, np.float32)))
        return self._host_memory

    def transfers(self) -> dict:
        """The counters (``TRANSFER_KEYS``) since the last ``reset_transfers``."""
        return dict(self.__dict__.get("_counts") or dict.fromkeys(TRANSFER_KEYS, 0))

    def reset_transfers(self) -> None:
        self._counts = dict.fromkeys(TRANSFER_KEYS, 0)

    def _count(self, key: str, nbytes: int = 0, moved: bool = True) -> None:
        """One transfer of ``nbytes``; ``moved`` False (or a host-memory backend): nothing moved."""
        if not moved or self.host_memory:
            return
        for counts in (self.__dict__.setdefault("_counts", dict.fromkeys(TRANSFER_KEYS, 0)), _TOTALS):
            counts[key] += 1
            if key in _BYTES:
                counts[_BYTES[key]] += int(nbytes)

    def read_check(self, x) -> np.ndarray:
        """A few numbers an op or a node decides on (a range, an Inf/NaN flag): counted as a check,
        not as a download of a value."""
        self._count("checks", 0, not _on_host(x))
        if isinstance(x, np.ndarray):
            return x
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            return x.detach().to("cpu").numpy()
        return self._to_numpy(x)
