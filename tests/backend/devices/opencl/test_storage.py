"""Shared float32 weights on a CPU OpenCL device (backend/devices/opencl/storage.py ``_wrap_host``,
memory.py ``_HostBlock``): ``to_device(..., share=True)`` (the compiled weights, ``Weights._upload``) wraps a
float32, C-contiguous, aligned host array or CPU tensor in place (``CL_MEM_USE_HOST_PTR``) instead of
copying it. Proven by a write to the tensor after the upload that the device array (and a kernel reading
it) sees; a half upload, a misaligned or a non-contiguous tensor and an upload without ``share`` still copy;
the wrapped block never enters the pool nor its live bytes; a compiled model gives what the copying path
gives; compiling a ~200 MB float32 model grows the process's RSS by much less than the model.
Skipped without PoCL (or another CPU OpenCL device)."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend.compile.lowering import Weights

from compile_models import conv_attention_model

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import memory
    BE = opencl.create("opencl", 0)
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
if not BE.is_cpu_device:
    pytest.skip("the OpenCL device is not the CPU: weights are copied", allow_module_level=True)


def _weight(t):
    return BE.to_device(t, "compile", "weight", constant=True, share=True)


def _wrapped(a) -> bool:
    return isinstance(a.block, memory._HostBlock)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


def test_a_float32_weight_shares_the_tensors_memory():
    t = torch.randn(256, 130)
    a = _weight(t)
    assert _wrapped(a) and a.block.host.ctypes.data == t.data_ptr() == a.buffer.get_host_array(
        t.numel(), np.float32).ctypes.data
    old = float(t[3, 5])
    try:
        t[3, 5] = 7.5  # (a test only: the caller promises not to write a shared weight)
        assert BE.to_numpy(a)[3, 5] == 7.5
        assert BE.to_numpy(BE.mul(a, 2.0))[3, 5] == 15.0  # a kernel reads the tensor's memory
    finally:
        t[3, 5] = old
    np.testing.assert_array_equal(BE.to_numpy(a), t.numpy())


def _aligned(values: np.ndarray) -> np.ndarray:
    """``values`` copied to a BE.WRAP_ALIGN-aligned float32 array (NumPy's own are 16-byte aligned)."""
    raw = np.empty(values.size + BE.WRAP_ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % BE.WRAP_ALIGN) // 4
    out = raw[skip:skip + values.size].reshape(values.shape)
    out[...] = values
    return out


def test_a_float32_numpy_array_is_shared_too():
    h = _aligned(np.random.default_rng(0).standard_normal((40, 70)))
    a = _weight(h)
    assert _wrapped(a) and a.block.host.ctypes.data == h.ctypes.data
    np.testing.assert_array_equal(BE.to_numpy(a), h)


def _copied(t, a, **kw):
    assert not _wrapped(a) and isinstance(a.block, memory._Block)
    np.testing.assert_array_equal(BE.to_numpy(a), np.asarray(t, np.float32), **kw)


def test_without_share_or_in_half_it_is_a_copy():
    t = torch.randn(64, 50)
    _copied(t, BE.to_device(t, "compile", "weight", constant=True))
    h = BE.to_device(t, "compile", "weight", constant=True, dtype="float16", share=True)
    assert isinstance(h, memory.CLHalf) and isinstance(h.block, memory._Block)
    np.testing.assert_array_equal(BE.to_numpy(h), t.numpy().astype(np.float16).astype(np.float32))
    bf = BE.to_device(t, "compile", "weight", constant=True, dtype="bfloat16", share=True)
    assert isinstance(bf.block, memory._Block)


def test_a_misaligned_or_non_contiguous_tensor_is_copied():
    base = torch.randn(4096)
    off = next(i for i in range(1, 16) if (base.data_ptr() + 4 * i) % BE.WRAP_ALIGN)
    t = base[off:off + 2048]
    assert t.is_contiguous() and t.data_ptr() % BE.WRAP_ALIGN
    _copied(t, _weight(t))
    nt = torch.randn(48, 80).t()
    assert not nt.is_contiguous()
    _copied(nt.contiguous(), _weight(nt))
    h = np.random.default_rng(1).standard_normal((30, 40)).astype(np.float32)[:, ::2]
    _copied(h, _weight(h))
    _copied(torch.arange(12.0, dtype=torch.float64), _weight(torch.arange(12.0, dtype=torch.float64)))
    p = torch.nn.Parameter(torch.randn(32, 32))  # a parameter is a plain tensor: shared
    assert _wrapped(_weight(p))


def test_off_the_cpu_device_or_switched_off_it_is_a_copy():
    t = torch.randn(100, 10)
    BE.share_host = False
    try:
        _copied(t, _weight(t))
    finally:
        del BE.share_host
    BE.is_cpu_device = False
    try:
        _copied(t, _weight(t))
    finally:
        BE.is_cpu_device = True


def test_the_wrapped_block_never_enters_the_pool():
    pool = BE.pool
    gc.collect()
    t = torch.randn(1000, 100)
    live, wrapped = pool.live, pool.wrapped
    a = _weight(t)
    assert pool.live == live and pool.wrapped == wrapped + t.numel() * 4
    pool.clear()  # ComfyUI asking for memory: the wrapped weight stays as it is
    np.testing.assert_array_equal(BE.to_numpy(a), t.numpy())
    view = BE.reshape(a, (100, 1000))  # a view holds the block (and the host memory) too
    del a
    gc.collect()
    assert pool.wrapped == wrapped + t.numel() * 4
    del view
    gc.collect()
    assert pool.wrapped == wrapped and pool.live == live
    assert all(buf is not None for lst in pool.free.values() for buf in lst)
    assert pool.pooled == sum(size * len(lst) for size, lst in pool.free.items())
    assert not any(isinstance(b, memory._HostBlock) for lst in pool.free.values() for b in lst)


def test_the_weights_cache_still_lets_the_tensor_go():
    w = Weights(BE)
    pool = BE.pool
    t = torch.randn(300, 30)
    wrapped = pool.wrapped
    a = w.get(t)
    assert _wrapped(a) and len(w) == 1 and pool.wrapped == wrapped + t.numel() * 4
    del a, t  # the device array holds the memory, not the tensor object: the weak reference fires
    gc.collect()
    assert len(w) == 0 and pool.wrapped == wrapped


def _run(m, x, share: bool):
    Weights.of(BE).clear()
    BE.share_host = share
    try:
        with torch.inference_mode():
            return C.compile_module(m, device=BE)(x)
    finally:
        del BE.share_host
        Weights.of(BE).clear()


def test_a_compiled_model_gives_what_the_copying_path_gives():
    m = conv_attention_model(0)
    x = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(1))
    wrapped = BE.pool.wrapped
    Weights.of(BE).clear()
    with torch.inference_mode():
        f = C.compile_module(m, device=BE)
        shared = f(x)
        assert BE.pool.wrapped > wrapped  # the weights are in place
    del f
    copied = _run(m, x, share=False)
    err = float((shared - copied).abs().max() / copied.abs().max())
    assert err <= 1e-6, err
    with torch.no_grad():
        ref = m(x)
    assert float((shared - ref).norm() / ref.norm()) <= 1e-5


def test_compiling_a_200mb_model_does_not_copy_it():
    torch.manual_seed(0)
    small = torch.nn.Sequential(torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.SiLU()).eval()
    _run(small, torch.randn(1, 512, 4, 4), share=True)  # kernels built before the measure
    # convs: their weights are used as they are (a linear's weight is folded through aten.t into a
    # transposed host copy, uploaded as a constant: not shared)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(512, 512, 3, padding=1), torch.nn.SiLU())
                              for _ in range(22)]).eval()
    model_mb = sum(p.numel() * 4 for p in m.parameters()) / 2**20
    assert model_mb > 190
    x = torch.randn(1, 512, 4, 4)
    gc.collect()
    before = _rss_mb()
    Weights.of(BE).clear()
    with torch.inference_mode():
        f = C.compile_module(m, device=BE)
        y = f(x)
        grown = _rss_mb() - before
        assert BE.pool.wrapped >= model_mb * 2**20 * 0.99  # every weight in place
    del f
    Weights.of(BE).clear()
    print(f"RSS before {before:.0f} MB, after compiling and running the {model_mb:.0f} MB model "
          f"{before + grown:.0f} MB (+{grown:.0f} MB)")
    assert grown < model_mb / 4, (before, grown, model_mb)
    with torch.no_grad():
        ref = m(x)
    assert float((y - ref).norm() / ref.norm()) <= 1e-5
