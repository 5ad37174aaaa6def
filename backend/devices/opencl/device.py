"""OpenCL devices: enumeration (ANYDEVICE_OPENCL_DEVICE), the registry probe, the per-device
build check remembered on disk, and ``create``."""
from __future__ import annotations

from pathlib import Path

from ...system import config
from ..runtime import JsonStore, cache_dir

def _cl():
    import pyopencl as cl
    return cl


def cache_root() -> Path:
    return cache_dir("opencl")


def _device_key(dev) -> str:
    p = dev.platform
    return "|".join(str(v) for v in (p.name, p.version, dev.name, dev.vendor, dev.version, dev.driver_version))


def _describe(dev) -> str:
    cl = _cl()
    kind = "GPU" if dev.type & cl.device_type.GPU else "CPU" if dev.type & cl.device_type.CPU else "accelerator"
    return f"{dev.name.strip()} ({kind}, {dev.platform.name.strip()}, driver {dev.driver_version})"


def _is_gpu(dev) -> bool:
    return bool(dev.type & _cl().device_type.GPU)


def _checks() -> JsonStore:
    """Per-device results of the kernel build check: {device key: {ok, reason}} (an entry of
    another shape is damage: the store drops it and rebuilds the file)."""
    return JsonStore(cache_root() / "devices.json", fields={"ok": bool, "reason": str}, required=("ok",))


def _record_check(dev, ok: bool, reason: str) -> None:
    _checks().update(_device_key(dev), {"ok": ok, "reason": reason[-4000:]})


# ----------------------------------------------------------------------------------------------
# device enumeration / probe
# ----------------------------------------------------------------------------------------------
def _enumerate():
    """[(platform_index, device_index, device)] in preference order (GPUs first), honouring
    ANYDEVICE_OPENCL_DEVICE=platform:device. Raises RuntimeError with a reason when none."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except Exception as exc:
        raise RuntimeError(f"no OpenCL platform (ICD loader found none: {exc})") from None
    if not platforms:
        raise RuntimeError("no OpenCL platform installed (no ICD)")
    found = []
    for pi, p in enumerate(platforms):
        try:
            devs = p.get_devices()
        except Exception:
            devs = []
        for di, d in enumerate(devs):
            found.append((pi, di, d))
    if not found:
        raise RuntimeError("OpenCL platform(s) present but no device")
    try:
        want = config.get("ANYDEVICE_OPENCL_DEVICE")
    except config.ConfigError as exc:
        raise RuntimeError(str(exc)) from None
    if want is not None:
        sel = [f for f in found if (f[0], f[1]) == want]
        if not sel:
            raise RuntimeError(f"ANYDEVICE_OPENCL_DEVICE={want[0]}:{want[1]}: no such device "
                               f"(have {', '.join(f'{a}:{b}' for a, b, _ in found)})")
        return sel
    return sorted(found, key=lambda f: (not _is_gpu(f[2]), f[0], f[1]))


def _usable():
    """(usable devices, reasons for known-bad ones) using only the on-disk check results."""
    checks = _checks().read()
    good, bad = [], []
    for pi, di, d in _enumerate():
        rec = checks.get(_device_key(d))
        if rec is not None and not rec.get("ok", True):
            bad.append(f"{_describe(d)}: {rec.get('reason', 'failed its kernel build check')}")
        else:
            good.append((pi, di, d))
    return good, bad


def probe(name: str = "opencl") -> dict:
    """Registry probe: cheap (no kernel builds; reads cached device checks) and never raising."""
    try:
        import pyopencl  # noqa: F401
    except Exception as exc:
        return {"available": False, "reason": f"pyopencl not installed ({type(exc).__name__}: {exc})",
                "devices": []}
    try:
        good, bad = _usable()
    except Exception as exc:
        return {"available": False, "reason": str(exc), "devices": []}
    if not good:
        return {"available": False, "reason": "; ".join(bad) or "no usable OpenCL device", "devices": []}
    return {"available": True, "reason": "", "devices": [_describe(d) for _, _, d in good],
            "priority": 50 if _is_gpu(good[0][2]) else 60,
            "notes": "; ".join(bad)}


def usable_device(index: int = 0):
    """The ``index``-th usable OpenCL device (RuntimeError saying why there is none)."""
    good, bad = _usable()
    if not good:
        raise RuntimeError("; ".join(bad) or "no usable OpenCL device")
    if index >= len(good):
        raise RuntimeError(f"OpenCL device index {index} out of range ({len(good)} usable)")
    return good[index][2]


def selfcheck_identity(name: str = "opencl", index: int = 0) -> dict:
    """Who a self-check verdict belongs to (backend/system/selfcheck.py): the device with its kernel
    family, its driver, and every kernel file the backend builds; cheap (no context, no builds)."""
    from .params import KFILES
    good, _ = _usable()
    dev = good[index][2]
    fam = config.get("ANYDEVICE_OPENCL_FAMILY") or ("gpu" if _is_gpu(dev) else "cpu")
    p = dev.platform
    return {"device": f"{dev.name.strip()} | {p.name.strip()} | {dev.vendor.strip()} [{fam} kernel family]",
            "driver": f"{p.version} | {dev.version} | {dev.driver_version}",
            "sources": [(fname, "opencl", portable) for fname, portable in KFILES.values()]}


def _cpu_macs_per_s(dev) -> float:
    """The conv/GEMM rate bigconv.chunked plans cancel chunks by (its first guess; then it times chunks): on a
    CPU device, a third of its FMA peak (compute units x float vector width x 2 FMA ports x clock), within
    [2e10, 2e11]. The fixed 2e10 made a 0.1 s conv look like 0.4 s, cut into row bands that each redid the
    weight's packing or Winograd transform; a GPU keeps 2e10 (chunk times are measured from there)."""
    try:
        if _is_gpu(dev):
            return 2e10
        width = max(1, int(dev.preferred_vector_width_float))
        rate = int(dev.max_compute_units) * width * 2 * int(dev.max_clock_frequency) * 1e6 / 3
    except Exception:  # noqa: BLE001 - a driver without the fields
        return 2e10
    return float(min(2e11, max(2e10, rate)))
