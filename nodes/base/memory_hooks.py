"""AnyDevice gives memory back when ComfyUI asks for it.

Inside ComfyUI, ``install()`` (run when the pack's nodes load) wraps two functions of
``comfy.model_management``:

- ``soft_empty_cache``: first every backend in use gives its pooled free memory back (the OpenCL
  buffer pool, host RAM on PoCL; CuPy's memory pool), then ComfyUI's own.
- ``free_memory(memory_required, device, ...)``: the pools first (ComfyUI then unloads fewer
  models), then ComfyUI's; if that still leaves less than ``memory_required`` free, the device
  copies AnyDevice keeps between nodes go too (``common.release_device_memory``).

Without ComfyUI (``comfy.model_management`` not imported: the runner, the tests, the CLI) it does
nothing; it never imports ComfyUI itself. A failure in a hook is logged, never raised into ComfyUI.
"""
from __future__ import annotations

import functools
import logging
import sys

log = logging.getLogger("anydevice")

_MARK = "_anydevice_hook"


def release_pools() -> None:
    """Every backend made so far gives its pooled free memory back (arrays in use stay)."""
    from ...backend.system import memstat, registry
    from .resident import free_backend_memory
    for be in registry.live_backends():
        try:
            free_backend_memory(be)
        except Exception as exc:  # noqa: BLE001 - never fail ComfyUI's memory management
            log.debug("AnyDevice: freeing the pool of %r failed: %s", be, exc)
    memstat.forget()


def release_all() -> None:
    """The pools and the device copies kept between nodes (TENSORs move to their host copies)."""
    from .common import release_device_memory
    try:
        release_device_memory()
    except Exception as exc:  # noqa: BLE001
        log.debug("AnyDevice: releasing device copies failed: %s", exc)
    release_pools()


def _soft_empty_cache(orig):
    @functools.wraps(orig)
    def soft_empty_cache(*args, **kwargs):
        release_pools()
        return orig(*args, **kwargs)
    setattr(soft_empty_cache, _MARK, orig)
    return soft_empty_cache


def _free_memory(orig, mm):
    @functools.wraps(orig)
    def free_memory(memory_required, device, *args, **kwargs):
        release_pools()
        out = orig(memory_required, device, *args, **kwargs)
        try:
            short = mm.get_free_memory(device) < memory_required
        except Exception:  # noqa: BLE001
            short = False
        if short:
            release_all()
        return out
    setattr(free_memory, _MARK, orig)
    return free_memory


def install(mm=None) -> bool:
    """Hook ComfyUI's model_management (``mm``; default: the imported one, if any). True when the
    hooks are in place (also when they already were)."""
    mm = mm if mm is not None else sys.modules.get("comfy.model_management")
    if mm is None:
        return False
    try:
        for name, wrap in (("soft_empty_cache", _soft_empty_cache),
                           ("free_memory", lambda f: _free_memory(f, mm))):
            fn = getattr(mm, name, None)
            if callable(fn) and not hasattr(fn, _MARK):
                setattr(mm, name, wrap(fn))
    except Exception as exc:  # noqa: BLE001 - loading the pack must never fail on this
        log.warning("AnyDevice: could not hook ComfyUI's memory management: %s", exc)
        return False
    log.debug("AnyDevice: hooked comfy.model_management free_memory and soft_empty_cache")
    return True


def uninstall(mm=None) -> None:
    """Undo ``install`` (tests)."""
    mm = mm if mm is not None else sys.modules.get("comfy.model_management")
    if mm is None:
        return
    for name in ("soft_empty_cache", "free_memory"):
        fn = getattr(mm, name, None)
        orig = getattr(fn, _MARK, None)
        if orig is not None:
            setattr(mm, name, orig)
