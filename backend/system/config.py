"""Every ``ANYDEVICE_*`` environment setting in one place: its meaning, default and parser.

A setting is read when it is used (a test, or a user between two runs, may change it) and parsed
by the one parser here. A value that does not parse raises ``ConfigError``, whose message names
the variable and the value, e.g.::

    ANYDEVICE_WORKSPACE_MB='abc': must be a number of megabytes > 0 (default 256)

``check()`` parses every variable that is set (the ``anydevice`` command runs it before anything
else), ``unknown()`` lists ``ANYDEVICE_*`` names that are no setting (typos), and ``SETTINGS`` is
the table README.md documents.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import AnyDeviceError


class ConfigError(AnyDeviceError):
    """An ``ANYDEVICE_*`` variable with a value that cannot be used; names variable and value."""

    exit_code = 2

    def __init__(self, var: str, value, reason: str):
        super().__init__(f"{var}={value!r}", None, None, reason)
        self.var, self.arg, self.value = var, var, value


@dataclass(frozen=True)
class Setting:
    name: str
    default: str      # as documented ("" when the default is computed)
    meaning: str
    parse: Callable[[str], object]  # the raw text (stripped, never empty) -> the value; ValueError: why not
    dev: bool = False  # a setting of the test suite, not of the pack


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("must be 1 or 0 (or true/false, yes/no, on/off)")


def _megabytes_from(text: str, zero_ok: bool) -> int:
    """A number of megabytes, as bytes: > 0, or with ``zero_ok`` 0 or more."""
    why = "must be a number of megabytes, 0 or more" if zero_ok else "must be a number of megabytes > 0"
    try:
        mb = float(text)
    except ValueError:
        raise ValueError(why) from None
    if not math.isfinite(mb) or mb < 0 or (mb == 0 and not zero_ok):
        raise ValueError(why)
    return int(mb * 2**20) if zero_ok else max(1, int(mb * 2**20))


def _megabytes(text: str) -> int:
    return _megabytes_from(text, zero_ok=False)


def _megabytes_or_zero(text: str) -> int:
    return _megabytes_from(text, zero_ok=True)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("must be a whole number >= 1")
    return int(text)


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return text.lower()
    return parse


def _backend(text: str) -> str | None:
    """``name[:index]`` of a known backend, or "auto" (None: the automatic choice)."""
    from . import specs
    if text.lower() == "auto":
        return None
    try:
        base, _ = specs.parse_name(text)
    except AnyDeviceError as exc:
        raise ValueError(exc.reason) from None
    if base not in specs.known_names():
        raise ValueError(f"unknown backend; known: auto, {', '.join(specs.known_names())}")
    return text


def _device_pair(text: str) -> tuple[int, int]:
    pi, _, di = text.partition(":")
    if not pi.isdigit() or not (di.isdigit() or di == ""):
        raise ValueError("must be platform:device numbers, e.g. 0:1 (anydevice devices --all lists them)")
    return int(pi), int(di or 0)


def _path(text: str) -> Path:
    return Path(text).expanduser()


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("ANYDEVICE_BACKEND", "", "backend used where none is chosen: name[:index] (`opencl:1` is the "
            "second OpenCL device) or `auto` (default: the best available)", _backend),
    Setting("ANYDEVICE_PREFER_OWN", "0", "`1`: the automatic choice takes the pack's own CUDA kernels before "
            "`torch-cuda`", _flag),
    Setting("ANYDEVICE_NUM_THREADS", "", "threads of the NumPy backend's pool (default: the CPUs of the "
            "process)", _count),
    Setting("ANYDEVICE_WORKSPACE_MB", "256", "scratch memory one conv may take at once; larger work is "
            "chunked", _megabytes),
    Setting("ANYDEVICE_MAX_TENSOR_MB", "", "largest result an op (or the runner's EmptyImage) may produce; "
            "beyond it the op is refused with an error (default: half the memory free on the op's device: "
            "host RAM for numpy, cpu and OpenCL on a CPU, free GPU memory for GPUs; read at most once a "
            "second)", _megabytes),
    Setting("ANYDEVICE_RESIDENT_MB", "1024", "device memory that values may keep between AnyDevice nodes "
            "(TENSORs, device copies of IMAGE/MASK/LATENT, kernels and weights); past it the least "
            "recently used move to the host; 0 keeps nothing on a device between nodes", _megabytes_or_zero),
    Setting("ANYDEVICE_DEVICE_MB", "", "device memory a compiled model's weights may keep resident; the weights "
            "past it stay in host memory and are uploaded for each use and dropped after (slower, never out of "
            "memory). Default: half the memory free on the device when the model first runs; inside ComfyUI "
            "a quarter with --lowvram, less --reserve-vram", _megabytes_or_zero),
    Setting("ANYDEVICE_WINOGRAD_WEIGHTS_MB", "0", "host memory the OpenCL CPU family may keep compiled models' "
            "Winograd-transformed 3x3 conv weights in (16/9 of each weight), so each is transformed once instead "
            "of on every call: faster, at that much more memory; 0 keeps none", _megabytes_or_zero),
    Setting("ANYDEVICE_CACHE_DIR", "~/.cache/anydevice", "built kernels and tuning results", _path),
    Setting("ANYDEVICE_OPENCL_DEVICE", "", "`platform:device` for the OpenCL backend (default: first GPU, "
            "else first CPU)", _device_pair),
    Setting("ANYDEVICE_OPENCL_FAMILY", "", "force the `cpu` or `gpu` OpenCL kernel family (default: by "
            "device type)", _choice("cpu", "gpu")),
    Setting("ANYDEVICE_OPENCL_TUNE", "0", "`1`: time a few GEMM variants per shape class on first use (at "
            "most 10 s, logged), stored per device and driver", _flag),
    Setting("ANYDEVICE_SELFCHECK", "1", "`0`: skip the self-check an own-kernel backend runs on first use "
            "(GEMM and convs against a float64 reference; verdict cached per device, driver and kernels)", _flag),
    Setting("ANYDEVICE_ALLOW_TF32", "0", "`1`: TF32 tensor cores for GEMM/conv (faster, not FP32-exact) on "
            "the CUDA backends", _flag),
    Setting("ANYDEVICE_MALLOC_TUNE", "1", "`0`: leave glibc's malloc thresholds as they are; by default the NumPy "
            "backend fixes them when it starts (mmap from 32 MiB, heap trimmed past 64 MiB free: a step's "
            "temporaries stop page-faulting in again; backend/system/allocator.py)", _flag),
    Setting("ANYDEVICE_HUGE_PAGES", "1", "`0`: leave the OpenCL CPU device's buffers on the kernel's 4 KiB pages; by "
            "default buffers of 2 MiB or more ask for transparent huge pages (Linux, where THP is `madvise` or "
            "`always`; backend/devices/opencl/memory.py)", _flag),
    Setting("ANYDEVICE_GRAPHS", "1", "`0`: compiled models and training steps run op by op at every call; by "
            "default a device with graph replay (CUDA) records a graph's launches at the second call of a "
            "signature and replays them, and OpenCL replays recorded training steps", _flag),
    Setting("ANYDEVICE_CUDA_KSPLIT", "", "force the CUDA GEMM/conv kernel's K split (default: chosen per "
            "problem)", _count),
    Setting("ANYDEVICE_TEST_BACKENDS", "", "tests: only these backends (comma list)", _names, dev=True),
    Setting("ANYDEVICE_TEST_OPENCL_PLATFORM", "", "tests: the portable-kernel tests run on the OpenCL platform "
            "named like this (default: PoCL where it is there)", _names, dev=True),
    Setting("ANYDEVICE_UNET_DEVICE", "numpy", "tests: the backend the real-size SD1.5 UNet test runs on",
            _names, dev=True),
    Setting("ANYDEVICE_BROWSER", "", "tests: `quick` runs the browser tests' workflows on the first frontend "
            "configuration only", _choice("quick", "full"), dev=True),
    Setting("ANYDEVICE_HYPOTHESIS_EXAMPLES", "25", "tests: random cases per op", _count, dev=True),
    Setting("ANYDEVICE_UPDATE_DOCS", "0", "tests: `1` lets the training browser test rewrite docs/training.png",
            _flag, dev=True),
)}


def raw(name: str, environ=None) -> str:
    """The variable's text, stripped ("" when unset)."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not an AnyDevice setting")
    return (os.environ if environ is None else environ).get(name, "").strip()


#: (name, text) -> the parsed value, for values that cannot be changed by their user (the ops read
#: settings on every call: ANYDEVICE_MAX_TENSOR_MB by each size check)
_PARSED: dict = {}
_IMMUTABLE = (int, float, str, bool, tuple, frozenset, type(None))


def get(name: str, environ=None):
    """The parsed value of a setting, its default when unset or empty (None where the default
    is computed by its user). Raises ConfigError naming the variable and the value."""
    setting = SETTINGS[name]
    text = raw(name, environ)
    key = (name, text)
    hit = _PARSED.get(key, _PARSED)
    if hit is not _PARSED:
        return hit
    if not text:
        text = setting.default
        if not text:
            _PARSED[key] = None
            return None
    try:
        value = setting.parse(text)
        if isinstance(value, _IMMUTABLE) and len(_PARSED) < 4096:
            _PARSED[key] = value
        return value
    except ValueError as exc:
        reason = str(exc) + (f" (default {setting.default})" if setting.default else "")
        raise ConfigError(name, raw(name, environ), reason) from None


def check(environ=None) -> list[ConfigError]:
    """A ConfigError for every setting that is set to a value that does not parse."""
    errors = []
    for name in SETTINGS:
        try:
            get(name, environ)
        except ConfigError as exc:
            errors.append(exc)
    return errors


def unknown(environ=None) -> list[str]:
    """``ANYDEVICE_*`` variables that are set but are no setting (a typo, most likely)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.upper().startswith("ANYDEVICE_") and k.upper() not in SETTINGS)


# --- the settings the ops read (backend/ops/contract.py re-exports these three) -------------------
def tf32_allowed() -> bool:
    """ANYDEVICE_ALLOW_TF32=1: GEMMs and convs may use TF32 tensor cores (off by default, so every
    backend computes in full FP32, like torch.backends.cuda.matmul.allow_tf32 = False)."""
    return get("ANYDEVICE_ALLOW_TF32")


def workspace_budget_bytes() -> int:
    """Largest scratch buffer (im2col columns and the like) one op may allocate at once."""
    return get("ANYDEVICE_WORKSPACE_MB")


def max_tensor_bytes(backend=None, want: int = 0) -> int:
    """Largest single result an op may produce; beyond it the op is refused, not OOM-killed."""
    return tensor_limit(backend, want)[0]


def tensor_limit(backend=None, want: int = 0) -> tuple[int, int | None, str | None]:
    """(limit, free, where): ANYDEVICE_MAX_TENSOR_MB, free and where None; unset, a share of the
    memory free on the backend's device (the host without one), with that reading and its place."""
    limit = get("ANYDEVICE_MAX_TENSOR_MB")
    if limit is not None:
        return limit, None, None
    from .memstat import default_tensor_limit
    return default_tensor_limit(backend, want)


def prefer_own() -> bool:
    """ANYDEVICE_PREFER_OWN=1: the automatic choice puts the own CUDA kernels before torch-cuda."""
    return get("ANYDEVICE_PREFER_OWN")


def backend_override() -> str | None:
    """ANYDEVICE_BACKEND as ``name[:index]`` of a known backend; None when unset or "auto"."""
    return get("ANYDEVICE_BACKEND")
