"""The NumPy device's where() on large arrays (backend/devices/numpy/backend.py ``_bitselect``): a bit
select on the values' uint32 views, bit-identical to np.where (NaN payloads, signed zeros, Inf),
with broadcasting and the zero operand of relu's gradient."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices.numpy.backend import WHERE_BITSELECT_MIN, _bitselect
from anydevice.backend import get_backend


def _special(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    f = x.reshape(-1)
    f[::7], f[3::11], f[5::13], f[1::17], f[2::19] = np.nan, np.inf, -np.inf, -0.0, 0.0
    f[4::23] = np.float32(1e-45)  # a subnormal
    return x


@pytest.mark.parametrize("cs,as_,bs", [((4, 32, 32, 32),) * 3, ((4, 32, 32, 32), (), (4, 32, 32, 32)),
                                       ((4, 1, 64, 64), (32, 1, 1), (4, 32, 64, 64)), ((300000,), (300000,), ()),
                                       ((4, 70000), (1, 70000), (4, 1))])
def test_bit_select_equals_np_where_bit_for_bit(cs, as_, bs):
    rng = np.random.default_rng(len(cs) + len(as_) + len(bs))
    c = _special(rng, cs)
    b = _special(rng, bs) if bs else np.float32(-0.0)
    for a in ((_special(rng, as_) if as_ else np.float32(1.5)), np.float32(0), np.float32(-0.0), 2.5):
        ref = np.asarray(np.where(c != 0, a, b), dtype=np.float32)
        assert ref.size >= WHERE_BITSELECT_MIN
        got = _bitselect(c, a, b, ref.shape)
        assert got.dtype == np.float32 and got.shape == ref.shape
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_backend_where_takes_it_and_leaves_its_inputs():
    be = get_backend("numpy")
    rng = np.random.default_rng(3)
    y, g = _special(rng, (8, 16, 32, 32)), _special(rng, (8, 16, 32, 32))
    y0, g0 = y.copy(), g.copy()
    got = np.asarray(be.to_numpy(be.where(be.le(be.to_device(y), 0.0), 0.0, be.to_device(g))))
    ref = np.where(y <= 0, np.float32(0), g).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    np.testing.assert_array_equal(y.view(np.uint32), y0.view(np.uint32))
    np.testing.assert_array_equal(g.view(np.uint32), g0.view(np.uint32))


@pytest.mark.parametrize("spin_safe", [False, True])
def test_products_openblas_would_thread_run_on_one_blas_thread_where_its_workers_spin(monkeypatch, spin_safe):
    """Where NumPy was loaded before the pack (OpenBLAS's workers spin ~70 ms after a threaded call), the
    products OpenBLAS would thread and the pack does not split (0.5-4 MFLOP) run on one BLAS thread; tiny ones
    and every product where the spin is short call BLAS as they are. The values are the float64 product's."""
    from anydevice.backend.devices.numpy import backend as NB, common
    from anydevice.backend.system import threads
    monkeypatch.setattr(threads, "BLAS_SPIN_SAFE", spin_safe)
    entered = []
    real = threads.single_threaded_blas
    monkeypatch.setattr(threads, "single_threaded_blas", lambda: (entered.append(1), real())[1])
    be = NB.NumpyBackend(0)
    rng = np.random.default_rng(2)
    for (m, k, n), threaded in (((8, 8, 8), False), ((64, 128, 96), True)):  # (a batch of 2: < PARALLEL_FLOPS)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        entered.clear()
        got = be._gemm(a, b)
        assert entered == ([1] if threaded and not spin_safe else [])
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
        entered.clear()
        got = be._bmm(a[None].repeat(2, 0), b[None].repeat(2, 0))
        assert entered == ([1] if threaded and not spin_safe else [])
        assert np.abs(got[1] - ref).max() <= 1e-5 * np.abs(ref).max()
    # the channel sums' GEMV: one BLAS thread from BLAS_THREADED_MIN values where the workers spin
    for shape, threaded in (((64, 16, 8, 8), False), ((16, 32, 64, 64), True)):
        x = rng.standard_normal(shape).astype(np.float32)
        entered.clear()
        got = common.channel_sums(x, np.float64)
        assert entered == ([1] if threaded and not spin_safe else [])
        np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-4)
