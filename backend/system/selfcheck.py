"""A backend proves itself before it is trusted: the self-check.

On the first use of an own-kernel backend through the registry (``get_backend`` or the automatic
choice; never at import or ComfyUI start-up), a few GEMMs, convolutions and transposed
convolutions of awkward sizes (ragged against every tile, odd channel counts, stride, padding,
dilation, groups, depthwise) run on the device and are compared with a float64 NumPy reference
computed here on the host. The bound is normwise, ``||y - ref|| / ||ref|| <= TOLERANCE`` for each
case: a sanity check against miscompiled kernels and broken drivers, not the precision suite.
A warm run takes well under a second (the first also builds the kernels).

The verdict is cached per device + driver + kernel source hash (the kernels/ files the backend
builds, includes expanded) in ``$ANYDEVICE_CACHE_DIR/selfcheck.json``; a new driver or an edited
kernel runs it again, a corrupt file is rebuilt. A backend that fails is marked unavailable with
the reason and the automatic choice moves on to the next one; ``anydevice devices`` shows the
verdict. ``ANYDEVICE_SELFCHECK=0`` turns it off.

Trusted, never checked: the PyTorch paths (``kind == "vendor"``: cuBLAS/cuDNN/MIOpen/oneDNN are
tested by their vendors and by PyTorch's own suite) and the NumPy backend (host code on the same
NumPy the reference uses, no kernel compiler or device driver involved; also the last resort of
the automatic choice).

A backend module that can be checked exposes ``selfcheck_identity(name, index) -> {"device",
"driver", "sources"}``, cheap (no context, no builds): ``sources`` lists the kernels it builds as
``(file, api, prelude)`` for ``kernel_source.kernel_source``. A module without it is checked
on every start (nothing to key a cached verdict on).
"""
from __future__ import annotations

import hashlib
import logging
import time

import numpy as np

from . import config
from ..devices.runtime import JsonStore, cache_dir

log = logging.getLogger("anydevice")

#: normwise relative error each case must stay within (FP32 sums of at most ~600 products)
TOLERANCE = 1e-5
#: the same with TF32 tensor cores allowed (10-bit mantissa inputs)
TOLERANCE_TF32 = 5e-3
STORE_NAME = "selfcheck.json"
NOT_RUN = "not yet run"

#: in-process verdicts (key -> entry), also where the cache folder cannot be written
_memo: dict[str, dict] = {}


# ---- the cases --------------------------------------------------------------------------------
# (op, input shapes, keyword arguments). Shapes are ragged against the tiles (8/32/64/128), odd
# channel counts, every conv kind: strided+dilated, grouped, depthwise, a long reduction (K > 576
# takes the im2col/GEMM path on CPU OpenCL; 3x3 stride 1 with >= 32 channels takes Winograd).
CASES = (
    ("matmul", ((9, 17), (17, 11)), {}),
    ("matmul", ((67, 131), (131, 45)), {}),
    ("matmul", ((37, 2053), (2053, 29)), {}),  # long K: split-K and its ordered reduction on GPUs
    ("matmul", ((3, 33, 70), (70, 129)), {}),
    ("conv2d", ((2, 5, 19, 23), (7, 5, 3, 5), (7,)), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    ("conv2d", ((1, 6, 17, 13), (9, 2, 3, 3), (9,)), dict(stride=1, padding=1, groups=3)),
    ("conv2d", ((1, 67, 11, 13), (33, 67, 3, 3), None), dict(stride=1, padding=1)),
    ("conv2d", ((1, 67, 12, 11), (35, 67, 3, 3), (35,)), dict(stride=2, padding=1)),
    ("conv2d", ((2, 13, 15, 9), (13, 1, 5, 5), None), dict(padding=2, groups=13)),
    ("conv_transpose2d", ((2, 6, 9, 11), (6, 5, 4, 3), (5,)), dict(stride=(2, 3), padding=(1, 0),
                                                                   output_padding=(1, 2))),
    ("conv_transpose2d", ((1, 8, 7, 10), (8, 3, 3, 3), None), dict(stride=2, padding=1, dilation=2,
                                                                   groups=2)),
)


#: the cases and bounds themselves: a verdict made with other cases is run again
_CHECK_HASH = hashlib.sha256(repr((CASES, TOLERANCE, TOLERANCE_TF32)).encode()).hexdigest()[:16]


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv2d_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d in float64 (zero padding)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs, ws = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def conv_transpose2d_ref(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """torch.nn.functional.conv_transpose2d in float64 (w: in channels, out channels / groups, kh, kw)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = map(_pair, (stride, padding, output_padding, dilation))
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    eh, ew = (h - 1) * sh + dh * (kh - 1) + 1, (wd - 1) * sw + dw * (kw - 1) + 1
    full = np.zeros((n, og * groups, eh + oph, ew + opw))
    for g in range(groups):
        xs, ws = x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                full[:, g * og:(g + 1) * og, i * dh:i * dh + sh * (h - 1) + 1:sh,
                     j * dw:j * dw + sw * (wd - 1) + 1:sw] += np.einsum("nchw,co->nohw", xs, ws[:, :, i, j])
    y = full[:, :, ph:eh + oph - ph, pw:ew + opw - pw]
    if b is not None:
        y = y + np.asarray(b, np.float64)[None, :, None, None]
    return y


def _reference(op, args, kw):
    if op == "matmul":
        return np.matmul(np.asarray(args[0], np.float64), np.asarray(args[1], np.float64))
    return (conv2d_ref if op == "conv2d" else conv_transpose2d_ref)(*args, **kw)


def _describe_case(op, shapes, kw) -> str:
    names = ("x", "w", "bias")
    parts = [f"{n}{tuple(s)}" for n, s in zip(names, shapes) if s is not None]
    parts += [f"{k}={v}" for k, v in kw.items()]
    return f"{op} " + " ".join(parts)


#: seconds the self-check waits at most for the backend's warm-up thread (Device._warm_in_background)
WARM_JOIN_S = 30.0


def run_cases(backend, tolerance: float = TOLERANCE) -> tuple[bool, str]:
    """Run CASES on ``backend`` against the float64 reference: (passed, reason of the first failure)."""
    rng = np.random.default_rng(20240607)
    for op, shapes, kw in CASES:
        args = [None if s is None else rng.standard_normal(s).astype(np.float32) for s in shapes]
        what = _describe_case(op, shapes, kw)
        try:
            y = np.asarray(getattr(backend, op)(*args, **kw), np.float64)
        except Exception as exc:
            return False, f"{what} raised {type(exc).__name__}: {str(exc)[:500]}"
        ref = _reference(op, args, kw)
        if y.shape != ref.shape:
            return False, f"{what} gave shape {y.shape} instead of {ref.shape}"
        err = float(np.linalg.norm(y - ref) / max(float(np.linalg.norm(ref)), 1e-300))
        if not err <= tolerance:  # NaN fails too
            return False, f"{what}: normwise error {err:.3g} > {tolerance:g} against a float64 NumPy reference"
    return True, ""


# ---- who a verdict belongs to -----------------------------------------------------------------
def trusted(info) -> str:
    """Why a backend is not checked ("" when it is): PyTorch paths and NumPy are trusted."""
    if info.kind == "vendor":
        return "skipped (PyTorch path, trusted)"
    if info.name == "numpy":
        return "skipped (NumPy on the host, trusted)"
    return ""


def enabled() -> bool:
    return bool(config.get("ANYDEVICE_SELFCHECK"))


def source_hash(sources) -> str:
    """sha256 of what is compiled for each ``(file, api, prelude)``: the kernels/ files with their
    includes expanded (a change to a header changes it too)."""
    from ..devices.runtime.kernel_source import kernel_source
    h = hashlib.sha256()
    for fname, api, prelude in sorted(set(map(tuple, sources))):
        text = kernel_source(fname, api, prelude=prelude)
        h.update(f"{fname}\0{api}\0{prelude}\0".encode())
        h.update(text.encode())
    return h.hexdigest()


#: the fields of a stored verdict and their JSON types (a verdict with another is damage: rebuilt)
VERDICT_FIELDS = {"ok": bool, "reason": str, "driver": str, "sources": str, "check": str,
                  "seconds": (int, float), "when": str}


def _store() -> JsonStore:
    return JsonStore(cache_dir() / STORE_NAME, fields=VERDICT_FIELDS, required=("ok",))


def _subject(name: str, index: int, module, impl_name: str) -> tuple[str, dict] | None:
    """(store key, {"driver", "sources"}) for the backend; None when its module cannot say."""
    ident_fn = getattr(module, "selfcheck_identity", None)
    if ident_fn is None:
        return None
    ident = ident_fn(impl_name, index)
    return f"{name}|{ident['device']}", {"driver": str(ident["driver"]), "sources": source_hash(ident["sources"]),
                                         "check": _CHECK_HASH}


def _cached(key: str, want: dict) -> dict | None:
    """The stored verdict for key when it was made with the same driver and kernel sources."""
    for entry in (_store().section(key), _memo.get(key) or {}):
        if entry and all(entry.get(k) == v for k, v in want.items()) and isinstance(entry.get("ok"), bool):
            return entry
    return None


def verdict(backend, info, module, impl_name: str, index: int = 0, run: bool = True) -> str | None:
    """The registry's gate: None when the backend may be used (passed, trusted, off), else why not.
    Reuses a cached verdict; otherwise runs the check on ``backend`` and stores the result
    (``run=False``: only a cached failure counts, nothing runs)."""
    if trusted(info) or not enabled():
        return None
    try:
        subject = _subject(info.name, index, module, impl_name)
    except Exception as exc:  # e.g. a driver query that fails: check, but keep no verdict
        log.debug("anydevice: no self-check identity for %s: %s", info.name, exc)
        subject = None
    key, want = subject or (None, {})
    entry = _cached(key, want) if key else None
    if entry is None and not run:
        return None
    if entry is None:
        tf32 = bool(backend.tf32)
        counts = backend.transfers()
        t0 = time.perf_counter()
        warm = getattr(backend, "_warm_in_background", None)  # kernels built meanwhile (opencl/warm.py)
        warming = warm() if warm is not None else None
        ok, reason = run_cases(backend, TOLERANCE_TF32 if tf32 else TOLERANCE)
        if warming is not None:
            warming.join(WARM_JOIN_S)
        seconds = time.perf_counter() - t0
        _uncount(backend, counts)
        entry = dict(want, ok=ok, reason=reason, seconds=round(seconds, 3), when=time.strftime("%Y-%m-%d %H:%M:%S"))
        if key:
            _memo[key] = entry
            _store().update(key, entry)
        (log.info if ok else log.warning)(
            "anydevice: self-check of %s on %s %s in %.2f s (kernel builds included)%s", info.name,
            backend.device, "passed" if ok else "FAILED", seconds, f": {reason}" if reason else "")
    if entry["ok"]:
        return None
    return (f"failed its self-check on {backend.device}: {entry.get('reason') or 'wrong results'} "
            f"(a new driver runs it again; ANYDEVICE_SELFCHECK=0 skips it)")


def _uncount(backend, before: dict) -> None:
    """The check's own host<->device copies are no user's traffic: take them off the counters."""
    from . import transfers
    after = backend.transfers()
    backend._counts = dict(before)
    for k, v in after.items():
        transfers._TOTALS[k] -= v - before.get(k, 0)


def status(info, module, impl_name: str, index: int = 0) -> str:
    """What ``anydevice devices`` shows: passed / failed: reason / not yet run / skipped / off."""
    why = trusted(info)
    if why:
        return why
    if not enabled():
        return "off (ANYDEVICE_SELFCHECK=0)"
    try:
        subject = _subject(info.name, index, module, impl_name)
    except Exception as exc:
        return f"unknown ({type(exc).__name__}: {exc})"
    if subject is None:
        return "run on each first use (the backend names no device identity to cache it by)"
    entry = _cached(*subject)
    if entry is None:
        return NOT_RUN
    return "passed" if entry["ok"] else f"failed: {entry.get('reason') or 'wrong results'}"
