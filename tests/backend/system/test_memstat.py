"""Memory as a user feels it: the peak RSS of a process running an op (CPU backends), the default
result limit following the free memory, the OpenCL buffer pool's bound, idle trim and ComfyUI hooks.

Peaks: a child process (``os.wait4`` gives its ``ru_maxrss``, the figure
``getrusage(RUSAGE_CHILDREN)`` reports) builds its inputs in place, then runs the op; the same
child without the op is the baseline. The op's extra peak must stay within 3 x (inputs + outputs).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from anydevice import backend as B
from anydevice.backend.system import config, memstat
from anydevice.backend.ops import contract
from anydevice.backend.devices.numpy import backend as NB
from anydevice.backend.system.errors import AnyDeviceError

from repo_paths import ROOT  # noqa: E402
AVAILABLE = {i.name for i in B.list_backends() if i.available}
CPU_BACKENDS = [b for b in ("numpy", "cpu", "opencl") if b in AVAILABLE]
MB = 2 ** 20

_PRE = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("anydevice", {str(ROOT / "__init__.py")!r},
                                              submodule_search_locations=[{str(ROOT)!r}])
m = importlib.util.module_from_spec(spec); sys.modules["anydevice"] = m; spec.loader.exec_module(m)
import numpy as np, torch
from anydevice import backend as B
from anydevice.nodes import NODE_CLASS_MAPPINGS as N
"""


def peak_rss(code: str) -> float:
    """Peak RSS (bytes) of a child process running ``code`` after the pack's imports."""
    env = {**os.environ, "COMFYUI_DIR": "none"}
    env.pop("ANYDEVICE_MAX_TENSOR_MB", None)
    p = subprocess.Popen([sys.executable, "-c", _PRE + code], env=env, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    assert status == 0, err[-2000:]
    return usage.ru_maxrss * 1024


_baselines: dict[str, float] = {}


def extra_peak(setup: str, op: str) -> float:
    """Peak RSS of setup + op less that of setup alone."""
    if setup not in _baselines:
        _baselines[setup] = peak_rss(setup)
    return peak_rss(setup + "\n" + op) - _baselines[setup]


def _setup(be: str, shape, image=False) -> str:
    """Inputs x, y of ``shape`` built in place (no temporaries: the baseline's peak is its end state)."""
    make = "torch.empty({s}).uniform_(generator=g)" if image else "torch.empty({s}).uniform_(generator=g).numpy()"
    return f"""
be = B.get_backend({be!r})
g = torch.Generator().manual_seed(0)
x = {make.format(s=shape)}
y = {make.format(s=shape)}
y *= 0.05; y += x
"""


# ---------------------------------------------------------------------------------------------
# peaks (scaled-down versions of the cases: 2 x 1024^2 RGB images, 2048^2 GELU)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("be", CPU_BACKENDS)
def test_ssim_node_peak(be):
    """The Loss node's SSIM on two 2x1024x1024x3 IMAGEs: inputs 2 images, outputs the error map."""
    img = 2 * 1024 * 1024 * 3 * 4
    extra = extra_peak(_setup(be, (2, 1024, 1024, 3), image=True),
                       f'N["AnyDeviceLoss"]().run(prediction=x, target=y, loss="ssim", device={{"name": {be!r}}})')
    assert extra <= 3 * (2 * img + img), f"{be}: {extra / MB:.0f} MB over the baseline"


@pytest.mark.parametrize("be", CPU_BACKENDS)
def test_ssim_op_peak(be):
    """be.ssim on two 2x3x1024x1024 arrays (a scalar out): was 19-32x one of them; now at most
    their device copies (OpenCL on PoCL: host RAM) and a few chunks' scratch."""
    inp = 2 * 3 * 1024 * 1024 * 4
    extra = extra_peak(_setup(be, (2, 3, 1024, 1024)), "v = be.ssim(x, y)")
    assert extra <= 3 * (2 * inp), f"{be}: {extra / MB:.0f} MB over the baseline"


def test_numpy_gelu_peak():
    """numpy GELU of a 2048^2 array: was 14x its input, now input + output and a few MB."""
    n = 2048 * 2048 * 4
    setup = _setup("numpy", (2048, 2048))
    for approx in ("none", "tanh"):
        extra = extra_peak(setup, f"z = be.gelu(x, approximate={approx!r})")
        assert extra <= 3 * (n + n), f"gelu {approx}: {extra / MB:.0f} MB over the baseline"
        assert extra <= 2.5 * n, f"gelu {approx}: {extra / MB:.0f} MB over the baseline"


# ---------------------------------------------------------------------------------------------
# chunked results are the unchunked ones
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 4, 40, 37), (2, 3, 60, 50), (1, 1, 200, 33), (70, 31)])
def test_ssim_chunks_same_result(backend_target, shape, monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.random(shape, dtype=np.float32)
    y = np.clip(x + 0.1 * rng.random(shape, dtype=np.float32), 0, 1).astype(np.float32)
    be = backend_target
    ref = float(np.asarray(be.to_numpy(be.ssim(x, y, window_size=7))))  # one piece
    for chunk in (500, 2100, 7000):  # row bands, planes, batch items
        monkeypatch.setattr(contract, "ssim_chunk_elements", lambda total, c=chunk: c)
        got = float(np.asarray(be.to_numpy(be.ssim(x, y, window_size=7))))
        assert abs(got - ref) <= 1e-6, (chunk, got, ref)
        assert abs(float(np.asarray(be.to_numpy(be.ssim(x, x, window_size=7)))) - 1.0) < 1e-6


def test_gelu_blocks_same_result(monkeypatch):
    be = B.get_backend("numpy")
    x = np.random.default_rng(0).standard_normal((37, 101), dtype=np.float32) * 4
    ref = {a: be.gelu(x, approximate=a) for a in ("none", "tanh")}
    monkeypatch.setattr(NB, "BLOCK", 64)
    for a in ("none", "tanh"):
        assert np.array_equal(be.gelu(x, approximate=a), ref[a])
        xt = x.T  # not contiguous
        assert np.array_equal(be.gelu(xt, approximate=a), ref[a].T)


# ---------------------------------------------------------------------------------------------
# ANYDEVICE_MAX_TENSOR_MB's default follows the free memory
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_free(monkeypatch):
    """The host reports ``free["bytes"]``; readings are counted."""
    free = {"bytes": 1 << 30, "reads": 0}

    def host():
        free["reads"] += 1
        return free["bytes"]
    monkeypatch.delenv("ANYDEVICE_MAX_TENSOR_MB", raising=False)
    monkeypatch.setattr(memstat, "host_available_bytes", host)
    memstat.forget()
    yield free
    memstat.forget()


def test_default_limit_follows_free_memory(fake_free):
    be = B.get_backend("numpy")
    assert config.max_tensor_bytes(be) == (1 << 30) // 2
    with pytest.raises(AnyDeviceError) as info:  # 1024 x 160 K floats = 640 MiB > half of 1 GiB
        be.matmul(np.zeros((1024, 1), np.float32), np.zeros((1, 160 * 1024), np.float32))
    msg = str(info.value)
    assert msg.startswith("matmul: argument 'output' = (1024, 163840): result would need 640.0 MiB"), msg
    assert "over the limit of 512.0 MiB (half of the 1.0 GiB free in host RAM" in msg, msg
    assert "ANYDEVICE_MAX_TENSOR_MB" in msg


def test_explicit_setting_wins(fake_free, monkeypatch):
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "100000")
    assert config.max_tensor_bytes(B.get_backend("numpy")) == 100000 * MB
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    with pytest.raises(AnyDeviceError, match="over the limit ANYDEVICE_MAX_TENSOR_MB=1"):
        B.get_backend("numpy").matmul(np.zeros((1024, 1), np.float32), np.zeros((1, 1024), np.float32))


def test_reading_is_cached(fake_free):
    be = B.get_backend("numpy")
    a = np.ones((4, 4), np.float32)
    for _ in range(50):
        be.matmul(a, a)
    assert fake_free["reads"] == 1  # small results: one reading a second
    fake_free["bytes"] = 4 << 30
    assert config.max_tensor_bytes(be) == (1 << 30) // 2  # still the cached reading
    assert config.max_tensor_bytes(be, want=256 << 20) == 2 << 30  # a large request reads again
    assert fake_free["reads"] == 2


def test_reading_expires(fake_free, monkeypatch):
    monkeypatch.setattr(memstat, "TTL_S", 0.05)
    be = B.get_backend("numpy")
    config.max_tensor_bytes(be)
    fake_free["bytes"] = 2 << 30
    time.sleep(0.1)
    assert config.max_tensor_bytes(be) == 1 << 30


def test_host_reading_is_real():
    free = memstat.host_available_bytes()
    assert 0 < free <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_gpu_readings_use_the_device():
    class FakeGPU:
        name, index = "cuda", 0

        def device_free_bytes(self):
            return 3 << 30
    memstat.forget()
    assert memstat.default_tensor_limit(FakeGPU()) == (3 << 29, 3 << 30, "cuda:0")
    memstat.forget()


def test_empty_image_limit_names_free_memory(fake_free):
    from anydevice.nodes.headless import core_nodes
    why = core_nodes._image_bytes(64, 4096, 4096, 3)
    assert "over the limit of 512 MB: half of the 1024 MB free in host RAM (ANYDEVICE_MAX_TENSOR_MB)" in why


# ---------------------------------------------------------------------------------------------
# the OpenCL buffer pool: bounded, emptied when idle and when asked
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def cl_backend():
    if "opencl" not in AVAILABLE:
        pytest.skip("no OpenCL device")
    be = B.get_backend("opencl")
    be.free_memory()
    yield be
    be.free_memory()


def test_pool_bounded_by_free_host_ram(cl_backend, fake_free):
    pool = cl_backend.pool
    if not pool.host_ram:
        pytest.skip("OpenCL device is a GPU")
    fake_free["bytes"] = 64 * MB  # the pool may keep 4 MB
    memstat.forget()
    xs = [cl_backend.to_device(np.ones((1024, 1024), np.float32)) for _ in range(3)]  # 4 MB each
    del xs
    assert 0 < pool.pooled <= 4 * MB


def test_pool_keeps_other_sizes_while_the_host_has_room(cl_backend, fake_free):
    """A model's sizes alternate (activations, workspaces): with RAM to spare, a miss of one size
    leaves the pooled buffers of other sizes in place, so the next call finds them (it used to give
    them back on every miss, and every call allocated and page-faulted its working set again)."""
    pool = cl_backend.pool
    if not pool.host_ram:
        pytest.skip("OpenCL device is a GPU")
    fake_free["bytes"] = 1 << 30  # the pool may keep 64 MB
    memstat.forget()
    def one_after_the_other():
        a = cl_backend.to_device(np.ones((1024, 1024), np.float32))       # 4 MB
        assert float(cl_backend.to_numpy(a).sum()) == 1024 * 1024
        del a
        b = cl_backend.to_device(np.ones((1536, 1024), np.float32))       # 6 MB
        assert float(cl_backend.to_numpy(b).mean()) == 1.0
        del b

    one_after_the_other()  # two misses
    hits, misses = pool.hits, pool.misses
    for _ in range(3):
        one_after_the_other()
    assert (pool.hits - hits, pool.misses - misses) == (6, 0)


def test_pool_gives_other_sizes_back_when_the_host_is_short(cl_backend, fake_free):
    pool = cl_backend.pool
    if not pool.host_ram:
        pytest.skip("OpenCL device is a GPU")
    fake_free["bytes"] = 1 << 30
    memstat.forget()
    a = cl_backend.to_device(np.ones((1024, 1024), np.float32))  # 4 MB, then pooled
    del a
    assert pool.pooled >= 4 * MB
    fake_free["bytes"] = 12 * MB  # less than twice the next request plus the pooled bytes
    memstat.forget()
    b = cl_backend.to_device(np.ones((1536, 1024), np.float32))  # a 6 MB miss: the 4 MB buffer goes back
    assert pool.pooled == 0
    assert float(cl_backend.to_numpy(b).mean()) == 1.0


@pytest.mark.parametrize("earlier_timer", [False, True])
def test_pool_emptied_when_idle(cl_backend, monkeypatch, earlier_timer):
    """Idle IDLE_S seconds: the pool gives its buffers back. A timer armed before with a longer
    IDLE_S (the default 10 s, by an earlier test) is replaced when IDLE_S is lowered: the suite's
    order used to decide whether this waited 10 s or 0.2 s."""
    pool = cl_backend.pool
    if earlier_timer:
        monkeypatch.setattr(pool, "IDLE_S", 10.0)
        x = cl_backend.add(cl_backend.to_device(np.ones((64, 64), np.float32)), 1.0)
        del x
        assert pool.pooled > 0
    monkeypatch.setattr(pool, "IDLE_S", 0.2)
    a = cl_backend.add(cl_backend.to_device(np.ones((256, 256), np.float32)), 1.0)
    del a
    assert pool.pooled > 0
    deadline = time.monotonic() + 5
    while pool.pooled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.pooled == 0
    b = cl_backend.to_numpy(cl_backend.add(cl_backend.to_device(np.ones((4, 4), np.float32)), 1.0))
    assert (b == 2).all()  # the pool works after a trim


def test_pool_kept_while_busy(cl_backend, monkeypatch):
    pool = cl_backend.pool
    monkeypatch.setattr(pool, "IDLE_S", 0.5)
    x = cl_backend.to_device(np.ones((64, 64), np.float32))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.8:  # an op every 50 ms: never idle for 0.5 s
        y = cl_backend.add(x, 1.0)
        del y
        assert pool.pooled > 0
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# ComfyUI's model_management hooks
# ---------------------------------------------------------------------------------------------
def _fake_mm(free=10 << 30):
    mm = types.SimpleNamespace(calls=[])
    mm.soft_empty_cache = lambda force=False: mm.calls.append(("soft_empty_cache", force))
    mm.free_memory = lambda need, device, keep_loaded=[]: mm.calls.append(("free_memory", need, device)) or []
    mm.get_free_memory = lambda dev=None, torch_free_too=False: free
    return mm


def test_hooks_harmless_without_comfyui():
    from anydevice.nodes.base import memory_hooks
    if "comfy.model_management" not in sys.modules:
        assert memory_hooks.install() is False


def test_hooks_release_pools(cl_backend, monkeypatch):
    from anydevice.nodes.base import memory_hooks, resident
    mm = _fake_mm()
    orig = mm.soft_empty_cache, mm.free_memory
    assert memory_hooks.install(mm) and memory_hooks.install(mm)  # twice: wrapped once
    assert getattr(mm.soft_empty_cache, "_anydevice_hook") is orig[0]
    released = []
    monkeypatch.setattr(resident, "release_all", lambda: released.append(1))

    def pooled():
        a = cl_backend.add(cl_backend.to_device(np.ones((128, 128), np.float32)), 1.0)
        del a
        assert cl_backend.pool.pooled > 0

    pooled()
    mm.soft_empty_cache(True)
    assert cl_backend.pool.pooled == 0 and mm.calls[-1] == ("soft_empty_cache", True)
    pooled()
    assert mm.free_memory(1 << 20, "cpu") == []
    assert cl_backend.pool.pooled == 0 and mm.calls[-1] == ("free_memory", 1 << 20, "cpu")
    assert not released  # enough free after ComfyUI's own unloading: the device copies stay
    mm.free_memory(1e30, "cpu")  # unload_all_models: still short, so they go too
    assert released
    memory_hooks.uninstall(mm)
    assert (mm.soft_empty_cache, mm.free_memory) == orig


def test_nodes_import_installs_hooks():
    """The pack's node import hooks an already imported comfy.model_management."""
    code = _PRE.replace("import numpy as np, torch", """import types, numpy as np, torch
mm = types.ModuleType("comfy.model_management")
mm.soft_empty_cache = lambda force=False: None
mm.free_memory = lambda need, device, keep_loaded=[]: []
sys.modules["comfy"] = types.ModuleType("comfy"); sys.modules["comfy.model_management"] = mm""", 1)
    code += "\nassert hasattr(mm.soft_empty_cache, '_anydevice_hook') and hasattr(mm.free_memory, '_anydevice_hook')\n"
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "COMFYUI_DIR": "none"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
