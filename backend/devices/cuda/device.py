"""CUDA / ROCm devices through CuPy: the registry probe (cheap, never raising) and ``create``."""
from __future__ import annotations

from .tiles import INSTALL_HINT


def _cupy():
    import cupy
    return cupy


def probe(name: str = "cuda") -> dict:
    """{available, reason, devices, kind}; cheap (no kernel builds) and never raising."""
    out = {"available": False, "reason": "", "devices": [], "kind": "own"}
    try:
        try:
            cp = _cupy()
        except ImportError:
            out["reason"] = INSTALL_HINT if name == "cuda" else \
                "CuPy not installed (for ROCm: pip install cupy-rocm-5-0, or CuPy built from source for ROCm)"
            return out
        except Exception as exc:  # a broken CuPy install (missing CUDA libraries, ...)
            out["reason"] = f"CuPy import failed ({type(exc).__name__}: {exc})"
            return out
        hip = bool(getattr(cp.cuda.runtime, "is_hip", False))
        if name == "rocm" and not hip:
            out["reason"] = f"CuPy {cp.__version__} is built for CUDA, not ROCm"
            return out
        if name == "cuda" and hip:
            out["reason"] = f"CuPy {cp.__version__} is built for ROCm (use rocm)"
            return out
        try:
            n = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:
            out["reason"] = f"no {'ROCm' if hip else 'CUDA'} device or driver ({type(exc).__name__}: {exc})"
            return out
        if n < 1:
            out["reason"] = f"no {'ROCm' if hip else 'CUDA'} device visible to CuPy"
            return out
        devs = []
        for i in range(n):
            props = cp.cuda.runtime.getDeviceProperties(i)
            devs.append(_describe(cp, props, hip))
        out.update(available=True, devices=devs)
    except Exception as exc:
        out["reason"] = f"probing {name} failed: {type(exc).__name__}: {exc}"
    return out


def _describe(cp, props, hip) -> str:
    dev = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if hip:
        arch = props.get("gcnArchName", b"")
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        return f"{dev} ({arch or 'gfx'}) via the pack's own HIP kernels (CuPy {cp.__version__}, hipRTC)"
    return (f"{dev} (sm_{props['major']}{props['minor']}) via the pack's own CUDA kernels "
            f"(CuPy {cp.__version__}, NVRTC)")


def selfcheck_identity(name: str = "cuda", index: int = 0) -> dict:
    """Who a self-check verdict belongs to (backend/system/selfcheck.py): the device (with CuPy's version
    and whether TF32 is allowed), the driver, runtime and compiler versions, and the kernel files
    the backend builds; cheap (no kernel builds)."""
    from ...system import config
    from .tiles import MISC, OWN_GEMM
    cp = _cupy()
    rt = cp.cuda.runtime
    hip = bool(getattr(rt, "is_hip", False))
    props = rt.getDeviceProperties(index)
    tf32 = config.tf32_allowed() and not hip and int(props["major"]) >= 8
    try:
        rtc = ".".join(map(str, cp.cuda.nvrtc.getVersion()))
    except Exception:
        rtc = "?"
    return {"device": _describe(cp, props, hip) + (" [TF32 allowed]" if tf32 else ""),
            "driver": f"driver {rt.driverGetVersion()}, runtime {rt.runtimeGetVersion()}, RTC {rtc}",
            "sources": [(OWN_GEMM[0], "cuda", True), (MISC, "cuda", True)]}
