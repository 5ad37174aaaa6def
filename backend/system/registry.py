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
    return REGISTRY.probe_all(refresh)


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


class Registry:
    """The registry's state: what was probed, the live backends, the automatic choice, the names
    that failed to start and the instances whose self-check still waits. One instance per process
    (``REGISTRY``, used by the module's functions); ``reset()`` forgets everything, as a new
    process would (tests).

    Threads: every method may be called from any thread. ``_lock`` (re-entrant) guards the fields
    and is held only while reading or writing them, never while calling out (probing, creating a
    device, running the self-check); a finaliser never takes it. Creating one name and index is
    serialised by that key's own lock, held across its create and self-check, so threads asking for
    the same backend at once get the one instance while other names go on in parallel; probing
    all backends is serialised by ``_probe_lock``. Two threads making the automatic choice at once
    make the same one (each step is the same ``get_backend``)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._probe_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """What a new process sees: nothing probed, no instances, no choice, no failures (the
        self-check's stored verdicts stay: they are files, see selfcheck.py)."""
        with self._lock:
            self.infos: dict[str, BackendInfo] | None = None
            self.instances: dict[tuple[str, int], object] = {}
            self.auto: str | None = None
            self.failed: dict[str, str] = {}  # name -> reason creation failed (so auto moves on)
            self.unchecked: set[tuple[str, int]] = set()  # created while the self-check was deferred
            self._creating: dict[tuple[str, int], threading.RLock] = {}  # key -> its creation lock
            self._local = threading.local()  # per thread: the deferred_selfcheck depth

    # ---- probing ---------------------------------------------------------------------------------
    def probe_all(self, refresh: bool = False) -> dict[str, BackendInfo]:
        with self._lock:
            if self.infos is not None and not refresh:
                return self.infos
        with self._probe_lock:
            with self._lock:
                if self.infos is not None and not refresh:  # another thread probed meanwhile
                    return self.infos
            infos = {s.name: _probe_spec(s) for s in SPECS}  # outside _lock: probes import devices
            with self._lock:
                for name, why in self.failed.items():
                    info = infos.get(name)
                    if info is not None:
                        info.available, info.reason = False, why
                self.infos = infos
                if refresh:
                    self.auto = None
                return infos

    def live(self) -> list:
        """The backends created so far (a snapshot)."""
        with self._lock:
            return list(self.instances.values())

    # ---- the automatic choice --------------------------------------------------------------------
    def auto_name(self) -> str:
        with self._lock:
            auto = self.auto
            pending = auto is not None and not self.deferred() and parse_name(auto) in self.unchecked
        if pending:
            try:  # chosen while the self-check was deferred (start-up): it runs now
                self.get(auto)
            except AnyDeviceError:  # it failed: auto is reset and the choice moves on
                pass
            with self._lock:
                auto = self.auto
        if auto is not None:
            return auto
        env = config.backend_override()
        if env is not None:
            try:
                self.get(env)
            except AnyDeviceError as exc:
                raise config.ConfigError("ANYDEVICE_BACKEND", env, exc.reason or str(exc)) from None
            return self._chose(env)
        for info in _auto_order():
            try:
                self.get(info.name)
            except Exception as exc:  # e.g. a device that lists but cannot build kernels
                log.warning("backend %s unusable, trying the next: %s", info.name, exc)
                continue
            return self._chose(info.name)
        return self._chose("numpy")

    def _chose(self, name: str) -> str:
        with self._lock:
            if self.auto is None:
                self.auto = name
            return self.auto

    # ---- instances ---------------------------------------------------------------------------------
    def get(self, name: str | None = None):
        if name is None or name == "auto":
            name = self.auto_name()
        if not isinstance(name, str):
            raise AnyDeviceError("get_backend", "name", name, "must be a string such as 'numpy' or 'opencl:0'")
        key = parse_name(name)
        with self._lock:
            backend = self.instances.get(key)
            if backend is not None and key not in self.unchecked:
                return backend
            creating = self._creating.setdefault(key, threading.RLock())
        with creating:  # one creation (and self-check) of this name and index at a time
            with self._lock:
                backend = self.instances.get(key)
                check = backend is not None and key in self.unchecked and not self.deferred()
            if backend is not None:
                if check:
                    self._selfcheck(name, key, backend)
                return backend
            return self._create(name, key)

    def _create(self, name: str, key: tuple[str, int]):
        base, index = key
        info = self.probe_all().get(base)
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
            with self._lock:
                self.failed[base] = why
                info.available, info.reason = False, why
            raise AnyDeviceError("get_backend", "name", name, why) from exc
        deferred = self.deferred()
        with self._lock:
            self.instances[key] = backend
            self.unchecked.add(key)
        self._selfcheck(name, key, backend, run=not deferred)
        return backend

    def _selfcheck(self, name: str, key: tuple[str, int], backend, run: bool = True) -> None:
        """The backend proves itself on first use (selfcheck.py; ``run=False``: only a cached
        failure counts). On failure it is dropped and the error raised; device 0 is marked
        unavailable with the reason, so the automatic choice moves on to the next backend."""
        from . import selfcheck
        base, index = key
        info = self.probe_all()[base]
        impl_name = dict(_spec(base).impls)[info.module]
        why = selfcheck.verdict(backend, info, _import(info.module), impl_name, index, run=run)
        with self._lock:
            if run or why:
                self.unchecked.discard(key)
            if why:
                self.instances.pop(key, None)
                if index == 0:
                    self.failed[base] = why
                    info.available, info.reason = False, why
                if self.auto is not None and parse_name(self.auto) == key:
                    self.auto = None
        if why:
            raise AnyDeviceError("get_backend", "name", name, why)

    # ---- start-up -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def deferred_selfcheck(self):
        local = self._local  # the same object on the way out, even across a reset()
        local.defer = getattr(local, "defer", 0) + 1
        try:
            yield
        finally:
            local.defer -= 1

    def deferred(self) -> bool:
        return getattr(self._local, "defer", 0) > 0


#: the process's registry; the functions below are calls on it
REGISTRY = Registry()

def auto_name() -> str:
    """The backend auto picks: ANYDEVICE_BACKEND if set, else the best available. A setting that
    names no backend or one that cannot start here raises config.ConfigError (not cached)."""
    return REGISTRY.auto_name()


def get_backend(name: str | None = None):
    """The backend for ``name`` ("cuda", "opencl:1", ...); None or "auto" gives the auto choice.
    From any thread: one instance per name and index."""
    return REGISTRY.get(name)


def live_backends() -> list:
    """The backends created so far in this process (a snapshot; for memory hooks and reports)."""
    return REGISTRY.live()


def deferred_selfcheck():
    """Within it (ComfyUI start-up: the load-time choice and its log line) backends are created
    without running their self-check; it runs on their first ``get_backend`` after it. A cached
    failed verdict still counts at once. Per thread: another thread's calls are not deferred."""
    return REGISTRY.deferred_selfcheck()


def _deferred() -> bool:
    return REGISTRY.deferred()


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
