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
