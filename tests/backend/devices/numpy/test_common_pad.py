"""numpy/common.zero_pad against numpy.pad's constant mode: values (Inf and NaN kept), a new array every time
(also for zero widths: never the input), and the NumPy backend's _pad taking it for float32 zeros."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.devices.numpy.common import zero_pad


@pytest.mark.parametrize("shape", [(3, 4), (2, 1, 5, 7), (64, 16, 8, 8), (1, 2, 3, 1, 1), (2, 0, 4, 4)])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (1, 1, 1, 1), (2, 0, 0, 3), (0, 5, 1, 0), (3, 2, 4, 1)])
def test_zero_pad_matches_numpy_pad(shape, pads):
    rng = np.random.default_rng(len(shape) + sum(pads))
    x = rng.standard_normal(shape).astype(np.float32)
    if x.size:
        x.flat[0], x.flat[-1] = np.inf, np.nan
    t, b, l, r = pads
    ref = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(t, b), (l, r)])
    got = zero_pad(x, t, b, l, r)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    assert not np.shares_memory(got, x)
    # into a given view (colconv's padded flat rows): the same values, the border overwritten too
    out = np.full(ref.shape, 7.0, np.float32)
    assert zero_pad(x, t, b, l, r, out=out) is out
    np.testing.assert_array_equal(out, ref)


def test_backend_pad_takes_it_for_float32_zeros(monkeypatch):
    from anydevice.backend.devices.numpy import backend as nb
    calls = []
    monkeypatch.setattr(nb, "zero_pad", lambda *a: calls.append(a) or zero_pad(*a))
    be = nb.NumpyBackend(0)
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = be._pad(x, (1, 0, 2, 1), "zeros")
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (0, 0), (1, 0), (2, 1)]))
    assert len(calls) == 1
    y = be._pad(x, (1, 1, 1, 1), "reflect")  # other modes: numpy.pad
    np.testing.assert_array_equal(y, np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], mode="reflect"))
    assert len(calls) == 1


@pytest.mark.parametrize("shape", [(64, 16, 8, 8), (3, 5, 7), (1, 2, 3, 4, 5), (1024, 3, 2)])
def test_channel_sums_match_float64(shape):
    """The NumPy backend's sum over every axis but dim 1 (conv bias gradients: a ones GEMV, then float64)."""
    from anydevice.backend import get_backend
    from anydevice.backend.devices.numpy.common import ones
    be = get_backend("numpy")
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32) + 2
    dims = (0,) + tuple(range(2, len(shape)))
    ref = x.astype(np.float64).sum(axis=dims)
    got = be._reduce("sum", x, dims, False)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    x[0, 0] = np.inf
    assert np.isinf(be._reduce("sum", x, dims, False)[0])
    assert ones(5).tolist() == [1.0] * 5 and not ones(5).flags.writeable
