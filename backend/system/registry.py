"""The one registry that knows every backend.

Each backend lives in its own module exposing two functions:

* ``probe(name) -> {"available": bool, "reason": str, "devices": [str, ...], "priority": int?}``
  cheap (no kernel builds) and never raising;
* ``create(name, index) -> Backend``.

A registry entry may list several implementations (``impls``); the first whose probe says
available serves the name, and the reasons of those skipped are kept (so ``cuda`` can be the
pack's own CuPy kernels, or PyTorch's CUDA path with the reason CuPy was skipped).

Auto choice: lowest priority number among the available entries, i.e.
CUDA > ROCm > XPU > MPS > OpenCL GPU > OpenCL CPU > NumPy > PyTorch CPU, except that where
PyTorch itself has the NVIDIA GPU (``torch-cuda``) it goes before the pack's own CUDA kernels:
measured on an H100 (README, speed) cuBLAS/cuDNN are faster on most ops, so the own kernels lead
only where PyTorch has no CUDA (``ANYDEVICE_PREFER_OWN=1`` puts them first anyway).
``ANYDEVICE_BACKEND=name[:index]`` overrides it; a value that names no backend, or one that
cannot run here, is a ``config.ConfigError`` naming the variable (never silently another backend).

An own-kernel backend runs its self-check (selfcheck.py) on first use here; one that fails is
marked unavailable with the reason and the automatic choice moves on.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import threading
from dataclasses import dataclass, field

from . import config
from .errors import AnyDeviceError
from .specs import CORE_NAMES, SPECS, BackendSpec, known_names, parse_name  # noqa: F401 (the registry's names)

log = logging.getLogger("anydevice")

#: what to do where PyTorch is missing (the nodes, `anydevice bench` and the torch backends need it)
INSTALL_TORCH = ("install PyTorch: pip install torch (a CPU-only build, much smaller: "
                 "pip install torch --index-url https://download.pytorch.org/whl/cpu)")


@dataclass
class BackendInfo:
    name: str
    available: bool
    reason: str
    device: str
    priority: int
    title: str
    kind: str = ""          # "own" kernels or "vendor" (PyTorch)
    module: str = ""        # module that serves it
    devices: list[str] = field(default_factory=list)
    notes: str = ""         # e.g. why a preferred implementation was skipped

    def as_dict(self) -> dict:
        return dict(self.__dict__)


_lock = threading.RLock()
_infos: dict[str, BackendInfo] | None = None
_instances: dict[tuple[str, int], object] = {}
_auto: str | None = None
_failed: dict[str, str] = {}  # name -> reason creation failed (so auto moves on)
_unchecked: set[tuple[str, int]] = set()  # instances created while the self-check was deferred
_local = threading.local()


def _import(module: str):
    """A device package of backend/ (``devices.opencl``): its ``probe`` and ``create``."""
    return importlib.import_module(f"..{module}", __package__)


def _probe_spec(spec: BackendSpec) -> BackendInfo:
    skipped = []
    for module, impl_name in spec.impls:
        try:
            mod = _import(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.endswith(module):
                if len(spec.impls) == 1:
                    skipped.append(f"{module}: not part of this build")
            else:
                skipped.append(f"{module}: needs {exc.name} ({exc})")
            continue
        except Exception as exc:  # a broken optional dependency must not break start-up
            skipped.append(f"{module}: import failed ({type(exc).__name__}: {exc})")
            continue
        try:
            res = mod.probe(impl_name)
        except Exception as exc:
            res = {"available": False, "reason": f"probe raised {type(exc).__name__}: {exc}"}
        if res.get("available"):
            devices = list(res.get("devices") or [])
            return BackendInfo(
                name=spec.name, available=True, reason="", device=devices[0] if devices else "",
                priority=int(res.get("priority", spec.priority)), title=spec.title,
                kind=res.get("kind", "vendor" if module == "devices.torch" else "own"),
                module=module, devices=devices, notes="; ".join(skipped))
        skipped.append(f"{module}: {res.get('reason') or 'unavailable'}")
    reason = skipped[-1].split(": ", 1)[-1] if len(skipped) == 1 else "; ".join(skipped)
    return BackendInfo(name=spec.name, available=False, reason=reason, device="",
                       priority=spec.priority, title=spec.title)


def _probe_all(refresh: bool = False) -> dict[str, BackendInfo]:
    global _infos, _auto
    with _lock:
        if _infos is None or refresh:
            _infos = {s.name: _probe_spec(s) for s in SPECS}
            for name, why in _failed.items():
                info = _infos.get(name)
                if info is not None:
                    info.available, info.reason = False, why
            if refresh:
                _auto = None
        return _infos


def list_backends(refresh: bool = False, include_aliases: bool = False) -> list[BackendInfo]:
    """Every known backend, best first, each with availability and the reason when unavailable."""
    infos = _probe_all(refresh)
    out = [i for i in infos.values() if include_aliases or i.name in CORE_NAMES or i.available]
    return sorted(out, key=lambda i: (not i.available, i.priority))


#: own-kernel backend -> the PyTorch path tried before it by the automatic choice
VENDOR_FIRST = {"cuda": "torch-cuda"}


def _auto_order() -> list[BackendInfo]:
    """Available backends in the order the automatic choice tries them."""
    infos = [i for i in list_backends(include_aliases=True) if i.available]
    by_name = {i.name: i for i in infos}
    prefer_own = config.prefer_own()
    order: list[BackendInfo] = []
    for info in infos:
        alt = by_name.get(VENDOR_FIRST.get(info.name, ""))
        if alt is not None and info.kind == "own" and not prefer_own and alt not in order:
            order.append(alt)
        if info not in order:
            order.append(info)
    return order


def auto_name() -> str:
    """The backend auto picks: ANYDEVICE_BACKEND if set, else the best available. A setting that
    names no backend or one that cannot start here raises config.ConfigError (not cached)."""
    global _auto
    with _lock:
        if _auto is not None and not _deferred() and parse_name(_auto) in _unchecked:
            try:  # chosen while the self-check was deferred (start-up): it runs now
                get_backend(_auto)
            except AnyDeviceError:  # it failed: _auto is reset and the choice moves on
                pass
        if _auto is not None:
            return _auto
        env = config.backend_override()
        if env is not None:
            try:
                get_backend(env)
            except AnyDeviceError as exc:
                raise config.ConfigError("ANYDEVICE_BACKEND", env, exc.reason or str(exc)) from None
            _auto = env
            return _auto
        for info in _auto_order():
            try:
                get_backend(info.name)
            except Exception as exc:  # e.g. a device that lists but cannot build kernels
                log.warning("backend %s unusable, trying the next: %s", info.name, exc)
                continue
            _auto = info.name
            return _auto
        _auto = "numpy"
        return _auto


def get_backend(name: str | None = None):
    """The backend for ``name`` ("cuda", "opencl:1", ...); None or "auto" gives the auto choice."""
    if name is None or name == "auto":
        name = auto_name()
    if not isinstance(name, str):
        raise AnyDeviceError("get_backend", "name", name, "must be a string such as 'numpy' or 'opencl:0'")
    base, index = parse_name(name)
    with _lock:
        key = (base, index)
        if key in _instances:
            if key in _unchecked and not _deferred():
                _selfcheck(name, key, _instances[key])
            return _instances[key]
        infos = _probe_all()
        info = infos.get(base)
        if info is None:
            raise AnyDeviceError("get_backend", "name", name,
                                 f"unknown backend; known: {', '.join(known_names())}")
        if not info.available:
            raise AnyDeviceError("get_backend", "name", name, f"backend unavailable: {info.reason}")
        if info.devices and index >= len(info.devices):
            raise AnyDeviceError("get_backend", "name", name,
                                 f"device index {index} out of range ({len(info.devices)} device(s))")
        impl_name = dict((m, n) for m, n in _spec(base).impls)[info.module]
        try:
            backend = _import(info.module).create(impl_name, index)
        except AnyDeviceError:
            raise
        except Exception as exc:
            why = f"could not start: {type(exc).__name__}: {exc}"
            _failed[base] = why
            info.available, info.reason = False, why
            raise AnyDeviceError("get_backend", "name", name, why) from exc
        _instances[key] = backend
        _unchecked.add(key)
        _selfcheck(name, key, backend, run=not _deferred())
        return backend


def _selfcheck(name: str, key: tuple[str, int], backend, run: bool = True) -> None:
    """The backend proves itself on first use (selfcheck.py; ``run=False``: only a cached failure
    counts). On failure it is dropped and the error raised; device 0 is marked unavailable with
    the reason, so the automatic choice moves on to the next backend."""
    global _auto
    from . import selfcheck
    base, index = key
    info = _probe_all()[base]
    impl_name = dict(_spec(base).impls)[info.module]
    why = selfcheck.verdict(backend, info, _import(info.module), impl_name, index, run=run)
    if run or why:
        _unchecked.discard(key)
    if why:
        _instances.pop(key, None)
        if index == 0:
            _failed[base] = why
            info.available, info.reason = False, why
        if _auto is not None and parse_name(_auto) == key:
            _auto = None
        raise AnyDeviceError("get_backend", "name", name, why)


@contextlib.contextmanager
def deferred_selfcheck():
    """Within it (ComfyUI start-up: the load-time choice and its log line) backends are created
    without running their self-check; it runs on their first ``get_backend`` after it. A cached
    failed verdict still counts at once."""
    _local.defer = getattr(_local, "defer", 0) + 1
    try:
        yield
    finally:
        _local.defer -= 1


def _deferred() -> bool:
    return getattr(_local, "defer", 0) > 0


def selfcheck_status(info: BackendInfo, index: int = 0) -> str:
    """The self-check verdict ``anydevice devices`` shows ("" where there is none); never raises."""
    if not info.module:
        return ""
    try:
        from . import selfcheck
        impl_name = dict(_spec(info.name).impls)[info.module]
        return selfcheck.status(info, _import(info.module), impl_name, index)
    except Exception as exc:
        return f"unknown ({type(exc).__name__}: {exc})"


def _spec(name: str) -> BackendSpec:
    return next(s for s in SPECS if s.name == name)


def describe() -> str:
    """One line: the auto choice and the others, for logs."""
    chosen = auto_name()
    parts = []
    for info in list_backends():
        mark = "*" if info.name == parse_name(chosen)[0] else ""
        parts.append(f"{mark}{info.name}" + ("" if info.available else " (unavailable)"))
    b = get_backend(chosen)
    return f"using {b.name} on {b.device}; backends: {', '.join(parts)}"
