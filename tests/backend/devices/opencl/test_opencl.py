"""OpenCL-specific tests: device choice and override, broken devices, the program cache, the
buffer pool, device-resident chains and the host<->device transfer share. Skipped, with the
reason, without pyopencl or an OpenCL device; the shared precision suite covers the ops on both
kernel families (``opencl`` and ``opencl-gpu-family``)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from anydevice.backend.devices import opencl as ob

_PROBE = ob.probe("opencl")
needs_device = pytest.mark.skipif(not _PROBE["available"],
                                  reason=f"opencl backend unavailable: {_PROBE['reason']}")
from repo_paths import ROOT  # noqa: E402


@pytest.fixture(scope="module")
def be():
    return ob.create("opencl", 0)


def _relerr(y, ref):
    y = np.asarray(y, np.float64)
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-300))


# ---- probe / device choice -------------------------------------------------------------------
def test_probe_never_raises_and_has_fields():
    res = ob.probe("opencl")
    assert set(res) >= {"available", "reason", "devices"}
    if res["available"]:
        assert res["devices"] and res["priority"] in (50, 60)
    else:
        assert res["reason"]


def test_probe_without_pyopencl(monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "pyopencl" or name.startswith("pyopencl."):
            raise ImportError("No module named 'pyopencl'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    monkeypatch.delitem(sys.modules, "pyopencl", raising=False)
    res = ob.probe("opencl")
    assert not res["available"] and "pyopencl" in res["reason"]


@needs_device
def test_priority_follows_device_type():
    devs = ob._enumerate()
    assert _PROBE["priority"] == (50 if ob._is_gpu(devs[0][2]) else 60)


@needs_device
def test_device_override(monkeypatch):
    pi, di, dev = ob._enumerate()[0]
    monkeypatch.setenv("ANYDEVICE_OPENCL_DEVICE", f"{pi}:{di}")
    res = ob.probe("opencl")
    assert res["available"] and res["devices"] == [ob._describe(dev)]
    monkeypatch.setenv("ANYDEVICE_OPENCL_DEVICE", "97:3")
    res = ob.probe("opencl")
    assert not res["available"] and "97:3" in res["reason"]
    monkeypatch.setenv("ANYDEVICE_OPENCL_DEVICE", "junk")
    assert not ob.probe("opencl")["available"]


@needs_device
def test_family_choice(monkeypatch, be):
    assert be.family == ("gpu" if ob._is_gpu(be.dev) else "cpu")
    monkeypatch.setenv("ANYDEVICE_OPENCL_FAMILY", "gpu")
    assert ob.create("opencl", 0).family == "gpu"
    monkeypatch.setenv("ANYDEVICE_OPENCL_FAMILY", "cpu")
    assert ob.create("opencl", 0).family == "cpu"
    monkeypatch.setenv("ANYDEVICE_OPENCL_FAMILY", "fpga")
    with pytest.raises(Exception, match="ANYDEVICE_OPENCL_FAMILY='fpga': must be one of cpu, gpu"):
        ob.create("opencl", 0)


@needs_device
def test_broken_device_marked_unavailable(monkeypatch, tmp_path):
    """A device whose test build fails (as the pocl-binary-distribution wheel's 'unknown target
    CPU generic') is marked unavailable, with the build log in the reason, also for later probes."""
    monkeypatch.setenv("ANYDEVICE_CACHE_DIR", str(tmp_path))

    def broken_build(self, source, options=""):
        raise RuntimeError("OpenCL build failed: BUILD_PROGRAM_FAILURE\nerror: unknown target CPU 'generic'")
    monkeypatch.setattr(ob.ProgramCache, "build", broken_build)
    with pytest.raises(RuntimeError, match="unknown target CPU 'generic'"):
        ob.create("opencl", 0)
    res = ob.probe("opencl")
    if len(ob._enumerate()) == 1:
        assert not res["available"]
        assert "unknown target CPU 'generic'" in res["reason"]
    monkeypatch.undo()


# ---- caches ---------------------------------------------------------------------------------
_WARM = """
import sys, time, importlib.util
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("anydevice", r"{root}/__init__.py",
                                              submodule_search_locations=[r"{root}"])
mod = importlib.util.module_from_spec(spec); sys.modules["anydevice"] = mod; spec.loader.exec_module(mod)
from anydevice.backend.devices import opencl as ob
import numpy as np
import pyopencl
t_pkg = time.perf_counter() - t0  # the pack's own imports (torch through the nodes) are not ours
t0 = time.perf_counter()
be = ob.create("opencl", 0)
y = be.to_numpy(be.relu(be.to_device(np.arange(-4, 4, dtype=np.float32))))
assert y.tolist() == [0, 0, 0, 0, 0, 1, 2, 3]
print("READY", time.perf_counter() - t0, be.programs.stats["builds"], be.programs.stats["disk_hits"], t_pkg)
"""


def _run_fresh(cache_dir):
    env = dict(os.environ, ANYDEVICE_CACHE_DIR=str(cache_dir), POCL_CACHE_DIR=str(cache_dir / "pocl"))
    (cache_dir / "pocl").mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", _WARM.format(root=ROOT)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("READY")][-1].split()
    return float(line[1]), int(line[2]), int(line[3]), float(line[4])


@needs_device
def test_disk_cache_warm_start(tmp_path, be):
    """A second process starts on the caches the first filled: the pack's stored binaries, or (PoCL)
    PoCL's own kernel cache, whose programs the pack does not store (programs._driver_caches_code)."""
    cold, builds, _, _ = _run_fresh(tmp_path)
    assert builds >= 1
    warm, builds2, hits, t_pkg = _run_fresh(tmp_path)
    print(f"\ncreate + first op in a fresh process: cold cache {cold:.2f} s, warm cache {warm:.3f} s "
          f"(package import before it: {t_pkg:.2f} s)")
    if be.programs.store_binaries:
        assert builds2 == 0 and hits >= 2
    else:  # rebuilt from source on PoCL's warm cache; nothing of ours on disk
        assert hits == 0 and not any((tmp_path / "opencl").rglob("*.bin"))
    assert warm < 2.0  # target <= 1 s; loose because other processes share the CPU


@needs_device
def test_pocl_programs_are_not_stored(monkeypatch, tmp_path, be):
    """PoCL generates native code kernel by kernel at first launch and caches it itself; its programs'
    binaries are not fetched (that generates every kernel of the program at once) unless its own cache
    is off (POCL_KERNEL_CACHE=0)."""
    monkeypatch.setenv("ANYDEVICE_CACHE_DIR", str(tmp_path))
    pocl = "Portable Computing Language" in be.dev.platform.name
    assert ob.ProgramCache(be.ctx, be.dev).store_binaries == (not pocl)
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    assert ob.ProgramCache(be.ctx, be.dev).store_binaries
    monkeypatch.delenv("POCL_KERNEL_CACHE")
    src = "__kernel void k(__global float *x) { x[get_global_id(0)] = 4.0f; }\n"
    pc = ob.ProgramCache(be.ctx, be.dev)
    assert pc.build(src, "") is not None
    assert pc.path_for(pc.digest(src, "")).exists() == (not pocl)


@needs_device
def test_corrupt_cache_entry_is_rebuilt(monkeypatch, tmp_path, be):
    monkeypatch.setenv("ANYDEVICE_CACHE_DIR", str(tmp_path))
    src = "__kernel void k(__global float *x) { x[get_global_id(0)] = 3.0f; }\n"
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")  # (PoCL's programs are stored only without its own cache)
    pc = ob.ProgramCache(be.ctx, be.dev)
    pc.build(src, "")
    path = pc.path_for(pc.digest(src, ""))
    assert path.exists()
    for damage in (b"garbage", path.read_bytes()[:-100] + b"x" * 100):
        path.write_bytes(damage)
        pc2 = ob.ProgramCache(be.ctx, be.dev)
        prg = pc2.build(src, "")
        assert pc2.stats["rebuilt_corrupt"] == 1 and pc2.stats["builds"] == 1
        assert prg is not None and path.read_bytes().startswith(ob._MAGIC)
    pc3 = ob.ProgramCache(be.ctx, be.dev)
    pc3.build(src, "")
    assert pc3.stats["disk_hits"] == 1 and pc3.stats["builds"] == 0


# ---- buffers and device residency ---------------------------------------------------------------
@needs_device
def test_buffer_pool_reuse(be):
    x = be.to_device(np.ones((64, 64), np.float32))
    be.relu(x)
    gc.collect()
    hits0, misses0 = be.pool.hits, be.pool.misses
    for _ in range(20):
        y = be.relu(x)
        del y
    assert be.pool.misses == misses0  # every result buffer came from the pool
    assert be.pool.hits >= hits0 + 20


@needs_device
def test_pool_never_hands_out_live_buffers(be):
    xs = [be.to_device(np.full((1000,), i, np.float32)) for i in range(8)]
    views = [be._reshape(x, (10, 100)) for x in xs]
    del xs
    gc.collect()
    ys = [be.neg(v) for v in views]  # allocations while the views hold the blocks
    for i, (v, y) in enumerate(zip(views, ys)):
        assert np.all(be.to_numpy(v) == i) and np.all(be.to_numpy(y) == -i)
    ids = {id(v.block.buf) for v in views} | {id(y.block.buf) for y in ys}
    assert len(ids) == 16


@needs_device
def test_device_resident_chain(be, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 20, 20)).astype(np.float32)
    w1 = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((3, 8, 3, 3)).astype(np.float32) * 0.2
    dx, dw1, dw2 = be.to_device(x), be.to_device(w1), be.to_device(w2)
    downloads = []
    real = be._to_numpy
    monkeypatch.setattr(be, "_to_numpy", lambda a: downloads.append(a.shape) or real(a))
    h = be.relu(be.conv2d(dx, dw1, padding=1))
    y = be.gelu(be.conv2d(h, dw2, padding=1))
    loss = be.mse_loss(y, be.to_device(np.zeros_like(x[:, :3])))
    assert isinstance(h, ob.CLArray) and isinstance(y, ob.CLArray) and isinstance(loss, ob.CLArray)
    assert downloads == []
    monkeypatch.undo()
    import torch
    F = torch.nn.functional
    t = lambda a: torch.from_numpy(a).double()  # noqa: E731
    ref = F.mse_loss(F.gelu(F.conv2d(F.relu(F.conv2d(t(x), t(w1), padding=1)), t(w2), padding=1)),
                     torch.zeros(2, 3, 20, 20, dtype=torch.float64))
    assert _relerr(be.to_numpy(loss), ref.numpy()) < 1e-6
    # a NumPy first input gives NumPy back, a torch one gives torch back
    assert isinstance(be.relu(x), np.ndarray)
    assert isinstance(be.relu(torch.from_numpy(x)), torch.Tensor)


@needs_device
def test_no_write_into_inputs_device_arrays(be):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 8, 8)).astype(np.float32)
    w = rng.standard_normal((5, 5, 3, 3)).astype(np.float32)
    da, dw = be.to_device(a), be.to_device(w)
    for fn in (lambda: be.conv2d(da, dw, padding=1), lambda: be.relu(da), lambda: be.add(da, da),
               lambda: be.sum(da, (1, 2)), lambda: be.pad(da, (1, 1, 1, 1), "reflect"),
               lambda: be.conv_transpose2d(da, dw, stride=2), lambda: be.matmul(da, da)):
        fn()
    assert np.array_equal(be.to_numpy(da), a) and np.array_equal(be.to_numpy(dw), w)


@needs_device
def test_small_and_empty_shapes(be):
    assert be.to_numpy(be.matmul(np.ones((3, 0), np.float32), np.ones((0, 2), np.float32))).tolist() == [[0, 0]] * 3
    assert be.relu(np.zeros((0, 4), np.float32)).shape == (0, 4)
    assert float(be.sum(np.zeros((0,), np.float32))) == 0.0
    assert np.isnan(float(be.mean(np.zeros((0,), np.float32))))


# ---- transfers ------------------------------------------------------------------------------
@needs_device
def test_transfer_fraction_of_image_chain(be):
    """conv -> activation -> conv -> activation -> loss on a 1x3x1024x1024 image from NumPy:
    the host<->device copies must stay a small share of the chain's time. Only meaningful where
    device buffers live in host memory (CPU devices): on a discrete GPU the PCIe upload of the
    12 MB image outweighs five fast kernels (58% on an H100 with NVIDIA's OpenCL driver)."""
    if not be.is_cpu_device:
        pytest.skip("transfer share is a host-memory-device property; this OpenCL device is a discrete GPU")
    rng = np.random.default_rng(0)
    img = rng.random((1, 3, 1024, 1024), dtype=np.float32)
    w1 = (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((3, 16, 3, 3)) * 0.1).astype(np.float32)
    target = rng.random((1, 3, 1024, 1024), dtype=np.float32)

    def chain(timed):
        t = {"transfer": 0.0}

        def up(a):
            t0 = time.perf_counter()
            d = be.to_device(a)
            t["transfer"] += time.perf_counter() - t0
            return d
        t_all = time.perf_counter()
        x, a, b, tg = up(img), up(w1), up(w2), up(target)
        y = be.relu(be.conv2d(x, a, padding=1))
        y = be.sigmoid(be.conv2d(y, b, padding=1))
        loss = be.mse_loss(y, tg)
        be.synchronize()
        t0 = time.perf_counter()
        val = float(be.to_numpy(loss))
        t["transfer"] += time.perf_counter() - t0
        t["total"] = time.perf_counter() - t_all
        return val, t

    chain(False)  # builds and first launches
    best = None
    for _ in range(3):
        _, t = chain(True)
        frac = t["transfer"] / t["total"]
        best = frac if best is None else min(best, frac)
    print(f"\nimage chain: total {t['total'] * 1e3:.1f} ms, transfers {t['transfer'] * 1e3:.1f} ms, "
          f"transfer share {best:.1%} (best of 3)")
    assert best <= 0.35  # target 20%; loose because other processes share the CPU


# ---- CPU-family conv path choice and the Winograd path --------------------------------------
@pytest.fixture(scope="module")
def cpu_be():
    return ob.create("opencl", 0, family="cpu")


def _path(be, xs, ws, stride=1, padding=1, dilation=1, groups=1):
    N, C, H, W = xs
    KH, KW = ws[2:]
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    OW = (W + 2 * pw - dilation * (KW - 1) - 1) // stride + 1
    return be._conv_path(xs, ws[0], KH, KW, (stride, stride), (dilation, dilation), groups, OW, (ph, ph, pw, pw))


@needs_device
@pytest.mark.parametrize("xs,ws,kw,path", [
    ((32, 512, 7, 7), (512, 512, 3, 3), {}, "winograd"),            # bench "conv 32x512"
    ((1, 16, 512, 512), (16, 16, 3, 3), {}, "winograd"),            # bench "image conv 1x16"
    ((1, 3, 1024, 1024), (16, 3, 3, 3), {}, "direct"),              # bench "image conv 1x3": 3 channels, wide rows
    ((32, 16, 7, 7), (1, 16, 3, 3), {}, "winograd"),                # bench "conv 32x16": few outputs (0.72 / 0.88 ms)
    ((32, 512, 7, 7), (512, 512, 3, 3), {"stride": 2}, "gemm"),     # seed k3 s2 p1
    ((32, 512, 7, 7), (512, 512, 1, 1), {"padding": 0}, "gemm"),    # seed k1: under POINTWISE_MIN_PIXELS
    ((2, 320, 64, 64), (320, 320, 1, 1), {"padding": 0}, "pointwise"),  # (test_linalg_pointwise.py)
    ((32, 512, 7, 7), (512, 512, 1, 1), {}, "gemm"),                # padded 1x1
    ((32, 512, 7, 7), (512, 512, 7, 7), {"stride": 2, "padding": 3}, "gemm"),
    ((1, 64, 9, 7), (64, 32, 3, 3), {"groups": 2}, "gemm"),         # grouped: never Winograd
    ((1, 64, 40, 40), (64, 64, 3, 3), {"dilation": 2}, "direct"),
    # (wide vectors, narrow vectors: AVX-512 takes wino_fused from 8 input channels, AVX2 Winograd from 16 channels on
    # both sides)
    ((16, 32, 64, 64), (32, 32, 3, 3), {}, "winograd"),             # the denoiser's convs
    ((2, 64, 64, 64), (64, 64, 3, 3), {}, "winograd"),
    ((1, 32, 256, 256), (32, 32, 3, 3), {}, "winograd"),            # under WINOGRAD_MIN_CH channels
    ((16, 32, 64, 64), (16, 32, 3, 3), {}, "winograd"),
    ((16, 16, 64, 64), (32, 16, 3, 3), {}, "winograd"),
    ((16, 8, 64, 64), (8, 8, 3, 3), {}, ("winograd", "direct")),
    ((16, 3, 64, 64), (32, 3, 3, 3), {}, ("winograd", "direct")),   # 3 channels on rows the direct kernel pads
    ((1, 64, 256, 256), (64, 64, 3, 3), {}, "winograd"),            # the compact upscaler's convs
    ((2, 128, 64, 64), (128, 128, 3, 3), {}, "winograd"),           # K over DIRECT_MAX_K
    ((1, 1280, 8, 8), (1280, 1280, 3, 3), {}, "gemm"),              # 16 tiles: under WINOGRAD_MIN_TILES
    ((1, 128, 512, 512), (3, 128, 3, 3), {}, "winograd"),           # few output channels: the VAE's conv_out
    ((1, 320, 64, 64), (4, 320, 3, 3), {}, "winograd"),             # the UNet's conv_out
    ((1, 32, 64, 64), (3, 32, 3, 3), {}, ("winograd", "direct")),   # (K within DIRECT_MAX_K: direct on AVX2)
    ((4, 3, 16, 16), (3, 3, 3, 3), {}, "gemm"),                     # (few inputs too: as before)
    ((2, 1280, 8, 8), (1280, 1280, 3, 3), {}, "winograd"),          # 32 tiles
    ((1, 1280, 7, 9), (1280, 1280, 3, 3), {"padding": (1, 0)}, "gemm"),  # 4 x 4 tiles (OH 7, OW 7)
])
@pytest.mark.parametrize("width", [16, 8])
def test_cpu_conv_path_choice(cpu_be, monkeypatch, xs, ws, kw, path, width):
    monkeypatch.setattr(type(cpu_be), "vector_width", property(lambda self: width))
    want = path if isinstance(path, str) else path[width == 8]
    assert _path(cpu_be, xs, ws, **kw) == want


@needs_device
@pytest.mark.parametrize("xs,ws,padding", [
    ((1, 32, 9, 10), (40, 32, 3, 3), 1), ((2, 33, 13, 8), (32, 33, 3, 3), (1, 0)),
    ((3, 48, 5, 2), (64, 48, 3, 3), 1), ((1, 64, 1, 1), (32, 64, 3, 3), 1),
    ((2, 40, 11, 7), (33, 40, 3, 3), 0), ((1, 40, 3, 3), (33, 40, 3, 3), 0),
    ((2, 36, 12, 15), (70, 36, 3, 3), (0, 1)), ((5, 32, 7, 7), (32, 32, 3, 3), 1),
    ((1, 128, 20, 17), (3, 128, 3, 3), 1), ((2, 80, 9, 12), (4, 80, 3, 3), 1), ((1, 96, 8, 8), (1, 96, 3, 3), 0),
])
def test_winograd_matches_float64(cpu_be, monkeypatch, xs, ws, padding):
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.uniform(-1, 1, ws[0]).astype(np.float32)
    calls = []
    real = cpu_be._conv2d_winograd
    monkeypatch.setattr(cpu_be, "_conv2d_winograd", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(cpu_be, "_conv_path", lambda *a: "winograd")  # the kernels at any channel count
    for bias in (b, None):
        y = cpu_be.to_numpy(cpu_be.conv2d(x, w, bias, padding=padding))
        ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                       None if bias is None else torch.from_numpy(bias).double(), 1, padding).numpy()
        assert y.shape == ref.shape
        assert _relerr(y, ref) < 1e-6
    assert len(calls) == 2  # the Winograd path really ran


@needs_device
def test_winograd_chunked_tiles(cpu_be, monkeypatch):
    """A workspace budget smaller than the tile set: several tile chunks, same result."""
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (3, 32, 19, 21)).astype(np.float32)
    w = (rng.standard_normal((48, 32, 3, 3)) / 17).astype(np.float32)
    b = rng.uniform(-1, 1, 48).astype(np.float32)
    monkeypatch.setenv("ANYDEVICE_WORKSPACE_MB", "0.5")  # ~64 tiles per chunk, 330 tiles
    monkeypatch.setattr(cpu_be, "_conv_path", lambda *a: "winograd")
    y = cpu_be.to_numpy(cpu_be.conv2d(x, w, b, padding=1))
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), torch.from_numpy(b).double(),
                   1, 1).numpy()
    assert _relerr(y, ref) < 1e-6


# ---- float16 stores and gelu: the kernels' own conversions and erfc (kernels/elementwise.cl, prelude) ------
@needs_device
def test_float16_rounding_equals_torch_on_sampled_bit_patterns(be):
    """f32_to_f16 (the casts and every half store of the elementwise kernels) rounds as torch does:
    every 4099th float32 bit pattern (signs, subnormals, overflow to Inf included) and the edges."""
    import torch
    u = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = [0x7f800000, 0xff800000, 0x47800000, 0x477fefff, 0x477ff000, 0x477fffff, 0x38800000, 0x387fffff,
             0x387ff000, 0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x80000000, 0, 0x00000001, 0x3f800000]
    x = np.concatenate([u, np.array(edges, np.uint32)]).view(np.float32)
    ref = torch.from_numpy(x.copy()).to(torch.float16)
    h = be._cast(be.to_device(x), "float16")
    got = np.asarray(be.to_numpy(h)).astype(np.float16)  # half values (exact in float32 too)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), ref.numpy()[~nan].view(np.uint16))
    assert np.isnan(got[nan]).all()
    # the elementwise kernels store through the same rounding: y = x + 0 in float16 is x rounded
    xs = x[np.isfinite(x) & (np.abs(x) < 60000)][:200000]
    y = be.add(be.to_device(xs, dtype="float16"), 0.0)
    np.testing.assert_array_equal(np.asarray(be.to_numpy(y)).astype(np.float16), xs.astype(np.float16))


_HALF_IO_TEST = """
#include "half_io.h"
__kernel void f2h(__global const float *x, __global ushort *h, __global ushort *hv, __global ushort *bv,
                  __global ushort *bs)
{
    const int i = get_global_id(0);
    h[i] = f32_to_f16(x[i]); bs[i] = f32_to_bf16(x[i]);
    if (i % 16 == 0) { vstore16(f32_to_f16_16(vload16(0, x + i)), 0, hv + i);
                       vstore16(f32_to_bf16_16(vload16(0, x + i)), 0, bv + i); }
}
__kernel void h2f(__global const ushort *h, __global float *y, __global float *yv)
{
    const int i = get_global_id(0);
    y[i] = ad_f16_to_f32(h[i]);
    if (i % 16 == 0) vstore16(ad_f16_to_f32_16(convert_uint16(vload16(0, h + i))), 0, yv + i);
}
"""


@needs_device
def test_half_io_vector_conversions_equal_the_scalar_ones_and_torch(be):
    """kernels/half_io.h: the 16-lane conversions the GEMM's half stores (f32_to_f16_16, f32_to_bf16_16) and
    Winograd's half input transform (ad_f16_to_f32_16) use give the scalar conversions' bits, which are
    torch's: sampled float32 patterns and edges (rounding, subnormals, overflow, NaN), all 65536 halves."""
    import pyopencl as cl
    import torch
    prog = cl.Program(be.ctx, _HALF_IO_TEST).build(options=["-I", str(ROOT / "kernels")])
    mf = cl.mem_flags
    u = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = [0x7f800000, 0xff800000, 0x47800000, 0x477fefff, 0x477ff000, 0x477fffff, 0x38800000, 0x387fffff,
             0x33000000, 0x33000001, 0x80000000, 0, 1, 0x3f800000, 0x7fc00000, 0xffc00001]
    x = np.concatenate([u, np.array(edges, np.uint32)])
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.uint32)]).view(np.float32)
    n = len(x)
    xb = cl.Buffer(be.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    outs = [np.empty(n, np.uint16) for _ in range(4)]
    bufs = [cl.Buffer(be.ctx, mf.WRITE_ONLY, 2 * n) for _ in outs]
    prog.f2h(be.queue, (n,), None, xb, *bufs)
    for o, b in zip(outs, bufs):
        cl.enqueue_copy(be.queue, o, b)
    h, hv, bv, bs = outs
    np.testing.assert_array_equal(hv, h)
    np.testing.assert_array_equal(bv, bs)
    nan = np.isnan(x)
    ref = torch.from_numpy(x.copy())
    np.testing.assert_array_equal(h[~nan], ref.to(torch.float16).numpy()[~nan].view(np.uint16))
    np.testing.assert_array_equal(bs[~nan], ref.to(torch.bfloat16).view(torch.int16).numpy()[~nan].view(np.uint16))
    assert np.isnan(h.view(np.float16)[nan].astype(np.float32)).all() and (bs[nan] & 0x7f80 == 0x7f80).all()
    hall = np.arange(65536, dtype=np.uint16)
    hb = cl.Buffer(be.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=hall)
    y, yv = np.empty(65536, np.float32), np.empty(65536, np.float32)
    yb, yvb = cl.Buffer(be.ctx, mf.WRITE_ONLY, 4 * 65536), cl.Buffer(be.ctx, mf.WRITE_ONLY, 4 * 65536)
    prog.h2f(be.queue, (65536,), None, hb, yb, yvb)
    cl.enqueue_copy(be.queue, y, yb)
    cl.enqueue_copy(be.queue, yv, yvb)
    np.testing.assert_array_equal(yv.view(np.uint32), y.view(np.uint32))
    ok = ~np.isnan(hall.view(np.float16))
    np.testing.assert_array_equal(y[ok].view(np.uint32), hall.view(np.float16)[ok].astype(np.float32).view(np.uint32))
    assert np.isnan(y[~ok]).all()


@needs_device
def test_gelu_is_accurate_value_by_value(be):
    """gelu = x/2 erfc(-x/sqrt 2) with the prelude's ad_erfc: each value within 1e-5 (relative) of float64
    on [-10, 10] (beyond 2e-6 only where the float32 rounding of -x/sqrt 2 itself moves erfc's tail),
    erfc's tail kept (no 1 + erf cancellation), Inf / NaN as torch's float64."""
    x = np.linspace(-10, 10, 400001).astype(np.float32)
    from math import erfc, sqrt
    ref = np.array([0.5 * float(v) * erfc(-float(v) / sqrt(2)) for v in x])
    y = np.asarray(be.to_numpy(be.gelu(x)), np.float64)
    m = np.abs(ref) > 1e-30
    rel = np.abs(y - ref)[m] / np.abs(ref[m])
    assert rel.max() <= 1e-5, (rel.max(), x[m][rel.argmax()])
    assert rel[np.abs(x[m]) <= 3].max() <= 2e-6, rel[np.abs(x[m]) <= 3].max()
    assert y[0] < 0 and abs(y[0] / ref[0] - 1) < 1e-4  # gelu(-10) = -7.6e-23: the tail is there
    s = np.asarray(be.to_numpy(be.gelu(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32))))
    assert s[0] == np.inf and (s[1] == 0 or np.isnan(s[1])) and np.isnan(s[2]) and s[3] == 0


@needs_device
def test_half_weight_loads_are_exact_for_all_65536_patterns(be):
    """weight_load.h's LOADW for float16 (WDT 1: ad_f16_to_f32, integer steps) gives every half bit pattern's
    float32 value bit for bit as NumPy's float16 -> float32 does (subnormals, Inf, NaN payloads, -0)."""
    import pyopencl as cl
    from anydevice.backend.devices.runtime.kernel_source import expand_includes
    src = ("#define WDT 1\n" + expand_includes("weight_load.h") +
           "\n__kernel void k(__global const ushort *p, __global float *y) "
           "{ const long i = get_global_id(0); const float v = LOADW(p, i); y[i] = v; }\n")
    prg = cl.Program(be.ctx, src).build()
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    mf = cl.mem_flags
    bh = cl.Buffer(be.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=h)
    by = cl.Buffer(be.ctx, mf.WRITE_ONLY, 4 * h.size)
    prg.k(be.queue, (h.size,), None, bh, by)
    y = np.empty(h.size, np.float32)
    cl.enqueue_copy(be.queue, y, by, is_blocking=True)
    np.testing.assert_array_equal(y.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))


# ---- reductions (kernels/elementwise.cl reduce_ori) ------------------------------------------------
@needs_device
@pytest.mark.parametrize("shape,dims", [((16, 32, 64, 64), (0, 2, 3)), ((7, 1000), (1,)), ((3, 65), (1,)),
                                        ((5, 63), (1,)), ((2, 3, 4099), (2,))])
def test_row_sums_are_compensated(be, shape, dims):
    """Contiguous rows of 64 or more are summed sixteen lanes at a time, each lane compensated, and the
    lanes folded compensated: as exact as the scalar chains on ill-conditioned rows (large values that
    cancel, small ones that remain), against float64; Inf and NaN propagate as in torch."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., ::2] *= 1e6  # big values...
    x[..., 1::2] = -x[..., ::2][..., : x[..., 1::2].shape[-1]] + rng.standard_normal(x[..., 1::2].shape).astype(np.float32)
    y = np.asarray(be.to_numpy(be.sum(be.to_device(x), dims)), np.float64)
    ref = x.astype(np.float64).sum(axis=dims)
    # compensated: within a few roundings of the result, plus eps^2 of the magnitudes summed (a plain float32
    # sum of these rows is off by about eps * sum |x|, 1e6 times more)
    tol = 4 * 2.0**-24 * np.abs(ref) + 2.0**-40 * np.abs(x.astype(np.float64)).sum(axis=dims)
    assert (np.abs(y - ref) <= tol).all(), float(np.max(np.abs(y - ref) / tol))
    if x.shape[-1] >= 64:
        z = x.copy()
        z.reshape(-1, x.shape[-1])[0, 5] = np.inf
        z.reshape(-1, x.shape[-1])[-1, 7] = np.nan
        got = np.asarray(be.to_numpy(be.sum(be.to_device(z), (len(shape) - 1,))))
        ref2 = z.astype(np.float64).sum(axis=-1)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref2))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref2))
