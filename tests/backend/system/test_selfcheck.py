"""The self-check (backend/system/selfcheck.py): an own-kernel backend proves itself on first use through
the registry before it is trusted. Runs on the real OpenCL backend here (skipped, with the
reason, without an OpenCL device); a subclass of it whose conv2d is wrong stands in for a
miscompiling driver. The verdict store is a temporary file; built kernels stay in the usual cache."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from anydevice.backend.system import config, registry, selfcheck
from anydevice.backend.devices import opencl as ob
from anydevice.backend.system.errors import AnyDeviceError

_PROBE = ob.probe("opencl")
needs_opencl = pytest.mark.skipif(not _PROBE["available"],
                                  reason=f"opencl backend unavailable: {_PROBE['reason']}")
from repo_paths import ROOT  # noqa: E402


class WrongConv(ob.OpenCLBackend):
    """A test double of a miscompiled conv kernel: conv2d gives twice the right values."""

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        y = super()._conv2d(x, w, bias, stride, pads, dilation, groups)
        return self._binary("add", y, y)


def _module(cls=ob.OpenCLBackend, driver: str | None = None):
    """The opencl registry module, creating ``cls`` and (optionally) reporting another driver."""
    def create(name="opencl", index=0):
        return cls(ob._usable()[0][index][2], index=index)

    def ident(name="opencl", index=0):
        out = ob.selfcheck_identity(name, index)
        return dict(out, driver=driver) if driver else out
    return SimpleNamespace(probe=ob.probe, create=create, selfcheck_identity=ident)


@pytest.fixture
def reg(monkeypatch, tmp_path):
    """A fresh registry (restored afterwards), the verdicts in tmp_path, and the check's runs counted."""
    for var in ("ANYDEVICE_BACKEND", "ANYDEVICE_SELFCHECK", "ANYDEVICE_PREFER_OWN", "ANYDEVICE_OPENCL_FAMILY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(registry, "REGISTRY", registry.Registry())  # the process's own comes back after
    monkeypatch.setattr(selfcheck, "_memo", {})
    monkeypatch.setattr(selfcheck, "cache_dir", lambda sub="": tmp_path)
    calls = []
    real_run = selfcheck.run_cases

    def counting(backend, tolerance=selfcheck.TOLERANCE):
        calls.append(type(backend).__name__)
        return real_run(backend, tolerance)
    monkeypatch.setattr(selfcheck, "run_cases", counting)
    real_import = registry._import
    ns = SimpleNamespace(calls=calls, store=tmp_path / selfcheck.STORE_NAME, module=None)

    def use(module):
        """Serve the opencl registry name from ``module`` (a fresh registry again)."""
        ns.module = module
        monkeypatch.setattr(registry, "_import", lambda m: module if m == "devices.opencl" else real_import(m))
        reset()

    def reset():
        """What a new process sees: no instances, no in-memory verdicts (the file stays)."""
        registry.REGISTRY.reset()
        selfcheck._memo.clear()
    ns.use, ns.reset = use, reset
    return ns


def _from_opencl_on(monkeypatch):
    """Make the automatic choice start at opencl (a GPU machine has CUDA first)."""
    real = registry._auto_order

    first = [i.name for i in real()]
    allowed = set(first[first.index("opencl"):]) if "opencl" in first else set(first)

    def from_opencl():
        return [i for i in real() if i.name in allowed]

    monkeypatch.setattr(registry, "_auto_order", from_opencl)
    return [i.name for i in registry._auto_order()]


# ---- the reference and the cases -----------------------------------------------------------------
def test_reference_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    for op, shapes, kw in selfcheck.CASES:
        args = [None if s is None else rng.standard_normal(s) for s in shapes]
        t = [None if a is None else torch.from_numpy(a) for a in args]
        want = torch.matmul(*t) if op == "matmul" else getattr(torch.nn.functional, op)(*t, **kw)
        np.testing.assert_allclose(selfcheck._reference(op, args, kw), want.numpy(), rtol=1e-12, atol=1e-12)


def test_numpy_backend_passes_the_cases():
    """NumPy is trusted (never checked by the registry), and would pass anyway."""
    assert selfcheck.run_cases(registry.get_backend("numpy")) == (True, "")


@needs_opencl
def test_real_opencl_passes_and_is_quick(reg):
    be = registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend"]
    entry = next(iter(json.loads(reg.store.read_text()).values()))
    assert entry["ok"] is True and entry["reason"] == "" and entry["driver"] and len(entry["sources"]) == 64
    assert registry.selfcheck_status(registry._probe_all()["opencl"]) == "passed"
    import time
    selfcheck.run_cases(be)  # warm: kernels built
    t0 = time.perf_counter()
    assert selfcheck.run_cases(be) == (True, "")
    assert time.perf_counter() - t0 < 1.0  # a few hundred ms at most (tens here), excluding builds


@needs_opencl
def test_check_does_not_count_as_transfers(reg):
    from anydevice.backend.system.transfers import transfer_totals
    before = transfer_totals()
    be = registry.get_backend("opencl")
    assert reg.calls and not any(be.transfers().values())
    assert transfer_totals() == before


# ---- a failing backend ---------------------------------------------------------------------------
@needs_opencl
def test_broken_backend_rejected_and_next_chosen(reg, monkeypatch, caplog):
    reg.use(_module(WrongConv))
    order = _from_opencl_on(monkeypatch)
    assert order[0] == "opencl" and len(order) > 1
    be = registry.get_backend()
    assert be.name == order[1] and reg.calls == ["WrongConv"]
    info = registry._probe_all()["opencl"]
    assert not info.available
    assert "failed its self-check" in info.reason and "conv2d" in info.reason and "normwise error" in info.reason
    assert "self-check" in caplog.text and "FAILED" in caplog.text
    with pytest.raises(AnyDeviceError, match="failed its self-check"):
        registry.get_backend("opencl")
    assert all(i.name != "opencl" or not i.available for i in registry.list_backends(refresh=True))
    assert registry.selfcheck_status(info).startswith("failed: conv2d")
    # ANYDEVICE_BACKEND naming it: a ConfigError naming the variable, with the reason
    reg.reset()
    monkeypatch.setenv("ANYDEVICE_BACKEND", "opencl")
    with pytest.raises(config.ConfigError, match="ANYDEVICE_BACKEND='opencl'.*failed its self-check"):
        registry.auto_name()


@needs_opencl
def test_off_setting(reg, monkeypatch):
    reg.use(_module(WrongConv))
    monkeypatch.setenv("ANYDEVICE_SELFCHECK", "0")
    assert registry.get_backend("opencl").name == "opencl" and reg.calls == []
    assert registry.selfcheck_status(registry._probe_all()["opencl"]) == "off (ANYDEVICE_SELFCHECK=0)"
    monkeypatch.setenv("ANYDEVICE_SELFCHECK", "maybe")
    assert any(e.var == "ANYDEVICE_SELFCHECK" for e in config.check())


def test_trusted_backends_are_not_checked(reg):
    registry.get_backend("numpy")
    infos = registry._probe_all()
    assert registry.selfcheck_status(infos["numpy"]) == "skipped (NumPy on the host, trusted)"
    if infos["cpu"].available:
        registry.get_backend("cpu")
        assert registry.selfcheck_status(infos["cpu"]) == "skipped (PyTorch path, trusted)"
    assert reg.calls == [] and not reg.store.exists()


# ---- the cached verdict ----------------------------------------------------------------------------
@needs_opencl
def test_cached_verdict_reused(reg):
    reg.use(_module())
    assert reg.calls == [] and registry.selfcheck_status(registry._probe_all()["opencl"]) == selfcheck.NOT_RUN
    registry.get_backend("opencl")
    registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend"]
    reg.reset()  # a new process: the verdict comes from the file
    registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend"]
    # a cached failure is reused too: rejected without running again
    reg.use(_module(WrongConv))
    reg.store.unlink()
    with pytest.raises(AnyDeviceError, match="failed its self-check"):
        registry.get_backend("opencl")
    reg.reset()
    with pytest.raises(AnyDeviceError, match="failed its self-check"):
        registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend", "WrongConv"]


@needs_opencl
def test_cache_invalidated_by_sources_and_driver(reg, monkeypatch):
    reg.use(_module())
    registry.get_backend("opencl")
    assert len(reg.calls) == 1
    reg.reset()
    real_hash = selfcheck.source_hash
    monkeypatch.setattr(selfcheck, "source_hash", lambda sources: "0" + real_hash(sources)[1:] + "x")
    registry.get_backend("opencl")
    assert len(reg.calls) == 2
    reg.use(_module(driver="PoCL 99.0 (updated)"))
    registry.get_backend("opencl")
    assert len(reg.calls) == 3
    reg.reset()
    registry.get_backend("opencl")
    assert len(reg.calls) == 3  # one entry per device, now for the new driver
    assert len(json.loads(reg.store.read_text())) == 1


def test_source_hash_follows_every_kernel_file_and_header(tmp_path, monkeypatch):
    """The hash covers what is compiled: an edit to a file, or to a header it includes, changes it."""
    from anydevice.backend.devices.runtime import kernel_source
    from anydevice.backend.devices.opencl.params import KFILES
    kdir = tmp_path / "kernels"
    shutil.copytree(kernel_source.KERNELS_DIR, kdir)
    monkeypatch.setattr(kernel_source, "KERNELS_DIR", kdir)
    sources = [(f, "opencl", portable) for f, portable in KFILES.values()]
    h0 = selfcheck.source_hash(sources)
    assert selfcheck.source_hash(list(reversed(sources))) == h0
    header = kdir / "prelude_opencl.h"
    header.write_text(header.read_text() + "\n/* edited */\n")
    h1 = selfcheck.source_hash(sources)
    assert h1 != h0
    kfile = kdir / KFILES["gemm_cpu"][0]
    kfile.write_text(kfile.read_text() + "\n/* edited */\n")
    assert selfcheck.source_hash(sources) not in (h0, h1)


def test_cuda_identity_without_a_gpu(monkeypatch):
    """The CUDA backend's identity (device, driver/runtime/NVRTC versions, its two kernel files)
    from a stand-in CuPy: a new driver is a new verdict."""
    from anydevice.backend.devices.cuda import device as cdev
    rt = SimpleNamespace(is_hip=False, driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 12080,
                         getDeviceProperties=lambda i: {"name": b"NVIDIA H100", "major": 9, "minor": 0})
    cp = SimpleNamespace(__version__="14.2.0", cuda=SimpleNamespace(runtime=rt, nvrtc=SimpleNamespace(
        getVersion=lambda: (12, 8))))
    monkeypatch.setattr(cdev, "_cupy", lambda: cp)
    ident = cdev.selfcheck_identity("cuda", 0)
    assert "H100" in ident["device"] and "sm_90" in ident["device"]
    assert ident["driver"] == "driver 13000, runtime 12080, RTC 12.8"
    assert {f for f, _, _ in ident["sources"]} == {"conv_gemm_cuda.cu", "misc_cuda.cu"}
    assert len(selfcheck.source_hash(ident["sources"])) == 64
    monkeypatch.setenv("ANYDEVICE_ALLOW_TF32", "1")
    assert cdev.selfcheck_identity("cuda", 0)["device"].endswith("[TF32 allowed]")


@needs_opencl
def test_corrupt_cache_file_rebuilt(reg, caplog):
    reg.use(_module())
    reg.store.write_text("{ not json")
    registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend"]
    data = json.loads(reg.store.read_text())
    assert [e["ok"] for e in data.values()] == [True]
    reg.reset()
    reg.store.write_text(json.dumps({next(iter(data)): {"ok": "garbage"}}))  # a damaged entry
    registry.get_backend("opencl")
    assert reg.calls == ["OpenCLBackend"] * 2


# ---- never at import or start-up ------------------------------------------------------------------
@needs_opencl
def test_deferred_at_startup_then_run_on_first_use(reg, monkeypatch):
    reg.use(_module(WrongConv))
    order = _from_opencl_on(monkeypatch)
    with registry.deferred_selfcheck():  # what the nodes do while ComfyUI loads them
        assert registry.auto_name() == "opencl"
        registry.describe()
    assert reg.calls == []
    be = registry.get_backend()  # first use: the check runs, fails, auto moves on
    assert reg.calls == ["WrongConv"] and be.name == order[1] and registry.auto_name() == order[1]
    # a cached failure counts at start-up at once (nothing runs)
    reg.reset()
    with registry.deferred_selfcheck():
        assert registry.auto_name() == order[1]
    assert reg.calls == ["WrongConv"]


@needs_opencl
def test_nodes_auto_moves_on_when_the_startup_choice_fails(reg, monkeypatch):
    pytest.importorskip("torch")
    from anydevice.nodes.base import common
    reg.use(_module(WrongConv))
    order = _from_opencl_on(monkeypatch)
    monkeypatch.setattr(common, "_LOAD_TIME", None)
    with registry.deferred_selfcheck():
        assert common.load_time_backend_name() == "opencl"
    assert common.resolve_backend(None, "Conv2d").name == order[1]
    assert common._LOAD_TIME == order[1]


@needs_opencl
def test_not_run_at_import_or_comfyui_startup(tmp_path):
    pytest.importorskip("torch")
    code = f"""
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("anydevice", r"{ROOT}/__init__.py",
                                              submodule_search_locations=[r"{ROOT}"])
mod = importlib.util.module_from_spec(spec); sys.modules["anydevice"] = mod; spec.loader.exec_module(mod)
nodes = mod.NODE_CLASS_MAPPINGS  # what ComfyUI reads at start-up (the nodes log the backend choice)
for cls in nodes.values():
    cls.INPUT_TYPES()
from anydevice.backend.system import selfcheck
print("RESULT", os.path.exists(os.path.join(r"{tmp_path}", "selfcheck.json")), len(selfcheck._memo))
"""
    env = dict(os.environ, ANYDEVICE_CACHE_DIR=str(tmp_path), COMFYUI_DIR="none")
    env.pop("ANYDEVICE_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT False 0" in out.stdout, out.stdout[-2000:]


@needs_opencl
def test_auto_name_after_startup_runs_the_deferred_check(reg, monkeypatch):
    """auto_name() itself (describe() uses it) checks a start-up choice before handing it out."""
    reg.use(_module(WrongConv))
    order = _from_opencl_on(monkeypatch)
    with registry.deferred_selfcheck():
        assert registry.auto_name() == "opencl"
    assert registry.auto_name() == order[1] and reg.calls == ["WrongConv"]
    assert registry.describe().startswith(f"using {order[1]}")
