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


def create(name: str = "cuda", index: int = 0):
    from .backend import CudaBackend
    return CudaBackend(name, index)


def _describe(cp, props, hip) -> str:
    dev = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    if hip:
        arch = props.get("gcnArchName", b"")
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        return f"{dev} ({arch or 'gfx'}) via the pack's own HIP kernels (CuPy {cp.__version__}, hipRTC)"
    return (f"{dev} (sm_{props['major']}{props['minor']}) via the pack's own CUDA kernels "
            f"(CuPy {cp.__version__}, NVRTC)")
