"""The thread-safety contract (README, "Thread safety"), tested with several threads at once.

- the registry: ``get_backend`` from many threads gives one instance per name and index (one
  create each), and ``reset()`` gives what a new process sees;
- a Backend instance: its ops may be called from several threads at once; each result equals the
  single-thread one (bit-identical on the numpy and opencl backends here; the contract promises
  1e-6 relative, since BLAS may split a reduction differently when another thread changed its
  thread count);
- a compiled module (``compile_module``): compiled in one thread, then called from several.

Every test runs its threads under hard bounds: a thread still running after ``TIMEOUT`` fails the
test (threads are daemons, so a hang never keeps pytest alive).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import e2e_helpers as H
from anydevice import backend
from anydevice.backend.system import registry

TIMEOUT = 120.0  # seconds for every thread of one test together
THREADS = 8


def _run_threads(fn, n=THREADS, timeout=TIMEOUT):
    """``fn(i)`` on ``n`` threads started together; their results in order. A thread that raised
    fails the test with its exception; one still running after ``timeout`` fails it too."""
    barrier = threading.Barrier(n)
    results, errors = [None] * n, [None] * n

    def body(i):
        try:
            barrier.wait(timeout)
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread)
            errors[i] = exc
    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"test-{i}") for i in range(n)]
    alive = H.start_and_join(threads, timeout)
    assert not alive, f"threads still running after {timeout} s: {alive}"
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def _available(name):
    return any(i.name == name and i.available for i in backend.list_backends())


OP_BACKENDS = [pytest.param(n, marks=pytest.mark.skipif(not _available(n), reason=f"{n} unavailable"))
               for n in ("numpy", "opencl")]


# ---- the registry -----------------------------------------------------------------------------------
@pytest.fixture
def fresh(monkeypatch):
    """A new process's registry (the process's own comes back afterwards)."""
    for var in ("ANYDEVICE_BACKEND", "ANYDEVICE_PREFER_OWN"):
        monkeypatch.delenv(var, raising=False)
    reg = registry.Registry()
    monkeypatch.setattr(registry, "REGISTRY", reg)
    return reg


def test_get_backend_from_many_threads_gives_one_instance_per_name(fresh, monkeypatch):
    """Creation is slowed down so the threads really race on it: still one create per name."""
    names = [n for n in ("numpy", "cpu", "opencl") if _available(n)]
    creates, real_import = [], registry._import

    def slow_import(module):
        mod = real_import(module)

        class Slow:
            probe = staticmethod(mod.probe)

            @staticmethod
            def create(impl, index):
                creates.append((impl, index))
                time.sleep(0.05)
                return mod.create(impl, index)
        for attr in ("selfcheck_identity",):
            if hasattr(mod, attr):
                setattr(Slow, attr, staticmethod(getattr(mod, attr)))
        return Slow
    monkeypatch.setattr(registry, "_import", slow_import)
    got = _run_threads(lambda i: [backend.get_backend(n) for n in (names[i % len(names):] + names[:i % len(names)])])
    for name in names:
        instances = {id(b) for row in got for b in row if b.name == name}
        assert len(instances) == 1, (name, len(instances))
    assert sorted(creates) == sorted(set(creates)) and len(creates) == len(names), creates
    assert set(fresh.instances) == {registry.parse_name(n) for n in names}
    assert [b.name for b in registry.live_backends()] and len(registry.live_backends()) == len(names)


def test_auto_choice_from_many_threads_is_one_backend(fresh):
    got = _run_threads(lambda i: (backend.auto_name(), backend.get_backend()))
    assert len({name for name, _ in got}) == 1 and len({id(b) for _, b in got}) == 1


def test_reset_gives_what_a_new_process_sees(fresh):
    be = backend.get_backend("numpy")
    backend.auto_name()
    assert fresh.instances and fresh.infos is not None and fresh.auto is not None
    fresh.reset()
    assert (fresh.instances, fresh.infos, fresh.auto, fresh.failed, fresh.unchecked) == ({}, None, None, {}, set())
    assert backend.get_backend("numpy") is not be  # a new instance, as in a new process


def test_deferred_selfcheck_is_per_thread(fresh):
    """Deferring in one thread (ComfyUI start-up) does not defer another thread's calls."""
    inside, seen = threading.Event(), []
    with registry.deferred_selfcheck():
        assert registry._deferred()
        _run_threads(lambda i: seen.append(registry._deferred()), n=2)
        inside.set()
    assert seen == [False, False] and not registry._deferred()


# ---- a Backend's ops from several threads --------------------------------------------------------------
def _inputs():
    rng = np.random.default_rng(7)
    return {
        "a": rng.standard_normal((96, 80), dtype=np.float32),
        "b": rng.standard_normal((80, 72), dtype=np.float32),
        "x": rng.standard_normal((2, 4, 20, 20), dtype=np.float32),
        "w": rng.standard_normal((6, 4, 3, 3), dtype=np.float32),
        "bias": rng.standard_normal((6,), dtype=np.float32),
    }


def _ops(be, t):
    return {
        "matmul": be.to_numpy(be.matmul(t["a"], t["b"])),
        "conv2d": be.to_numpy(be.conv2d(t["x"], t["w"], t["bias"], stride=1, padding=1)),
        "add": be.to_numpy(be.add(t["x"], t["x"][:, :1])),
    }


@pytest.mark.parametrize("name", OP_BACKENDS)
def test_ops_on_one_backend_from_many_threads_match_one_thread(name):
    be = backend.get_backend(name)
    t = _inputs()
    ref = _ops(be, t)

    def work(i):
        return [_ops(be, t) for _ in range(4)]
    for rounds in _run_threads(work):
        for got in rounds:
            for op, want in ref.items():
                scale = float(np.abs(want).max()) or 1.0
                np.testing.assert_allclose(got[op], want, rtol=1e-6, atol=1e-6 * scale, err_msg=f"{name} {op}")


@pytest.mark.parametrize("name", OP_BACKENDS)
def test_each_thread_its_own_data_on_one_backend(name):
    """Threads with different inputs on the same backend each get their own answer (no buffer of
    one thread's op reused by another's while live)."""
    be = backend.get_backend(name)
    rng = np.random.default_rng(3)
    data = [rng.standard_normal((64, 64), dtype=np.float32) for _ in range(THREADS)]
    refs = [be.to_numpy(be.matmul(d, d)) for d in data]

    def work(i):
        return [be.to_numpy(be.matmul(data[i], data[i])) for _ in range(6)]
    for i, outs in enumerate(_run_threads(work)):
        for got in outs:
            np.testing.assert_allclose(got, refs[i], rtol=1e-6, atol=1e-6 * float(np.abs(refs[i]).max()))


# ---- a compiled module --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OP_BACKENDS)
def test_compiled_module_called_from_many_threads(name):
    """Compiled (its first call, per input signature) in one thread; then called from several."""
    torch = pytest.importorskip("torch")
    from anydevice.backend import compile as adc
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 8 * 8, 5)).eval()
    f = adc.compile_module(mod, device=name)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = f(x).numpy().copy()
        eager = mod(x).numpy()
    np.testing.assert_allclose(ref, eager, rtol=1e-4, atol=1e-4)

    def work(i):
        with torch.no_grad():
            return [f(x).numpy().copy() for _ in range(3)]
    for outs in _run_threads(work, n=4):
        for got in outs:
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max()))
