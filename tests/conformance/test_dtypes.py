"""The precision suite in float16 and bfloat16: PyTorch's OpInfo samples (test_opinfo.py's table, beside it)
replayed on every backend with their floating inputs as float16 / bfloat16 torch tensors.

Reference: the OpInfo's op run in float64 on the same (rounded) inputs, then rounded to the dtype, as
a float16/bfloat16 op that computes in float32 and rounds once gives it. Bar: torch.testing's
tolerances for that dtype (float16 rtol 1e-3, bfloat16 rtol 1.6e-2, atol 1e-5) element by element, NaN
and Inf positions exact; the result has the dtype torch gives (the inputs' own, ops/dtypes.promote) and
no input is written.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from anydevice.backend.ops import dtypes

import test_opinfo as O

#: samples per OpInfo in each dtype (evenly spaced over the float32 suite's)
PER_OP = 4
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _params():
    out = []
    for p in O._params():
        key, index = p.values
        if index < 0 or p.marks:
            continue
        n = len(O._SAMPLES[key][1])
        if index not in {int(round(i)) for i in np.linspace(0, n - 1, min(n, PER_OP))}:
            continue
        for name in DTYPES:
            out.append(pytest.param(key, index, name, id=f"{key}-{index}-{name}"))
    return out


def _half(v, dt):
    """The backend's argument: float32 arrays as torch tensors of ``dt`` (rounded), the rest as is."""
    if isinstance(v, np.ndarray) and v.dtype == np.float32:
        return torch.from_numpy(v.copy()).to(dt)
    if isinstance(v, (list, tuple)) and any(isinstance(i, np.ndarray) for i in v):
        return type(v)(_half(i, dt) for i in v)
    return v


def _rounded64(v, dt):
    """The reference's argument: the sample's float tensors rounded to ``dt``, in float64."""
    if isinstance(v, torch.Tensor):
        return v.detach().to(dt).double() if v.is_floating_point() else v.detach().clone()
    if isinstance(v, (list, tuple)) and any(isinstance(i, torch.Tensor) for i in v):
        return type(v)(_rounded64(i, dt) for i in v)
    return v


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


@pytest.mark.parametrize("key,index,name", _params())
def test_opinfo_sample_in_half(backend_target, key, index, name):
    dt = DTYPES[name]
    info, samples = O._SAMPLES[key]
    s = samples[index]
    args, kwargs = O._prepare(info.name, s)
    args = [_half(a, dt) for a in args]
    kwargs = {k: _half(v, dt) for k, v in kwargs.items()}
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    tensors += [a for v in args if isinstance(v, (list, tuple)) for a in v if isinstance(a, torch.Tensor)]
    if not tensors:
        pytest.skip("no floating input in this sample")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _first(info.op(_rounded64(s.input, dt), *[_rounded64(a, dt) for a in s.args],
                             **{k: _rounded64(v, dt) for k, v in s.kwargs.items()}))
    before = [t.clone() for t in tensors]
    y = _first(getattr(backend_target, O.OPS[info.name].method)(*args, **kwargs))
    for b, t in zip(before, tensors):
        assert torch.equal(b.view(torch.int16), t.view(torch.int16)), "an input was written"
    assert isinstance(y, torch.Tensor) and y.dtype == dt, f"result {getattr(y, 'dtype', type(y))}, expected {dt}"
    rtol, atol = dtypes.TOLERANCES[name]
    got, want = y.double(), ref.to(dt).double()
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    nan_w = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan_w), "NaN positions differ"
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf) and torch.equal(got[inf], want[inf]), "Inf positions differ"
    fin = ~(nan_w | inf)
    over = (got[fin] - want[fin]).abs() - (atol + rtol * want[fin].abs())
    assert over.numel() == 0 or float(over.max()) <= 0, \
        f"{key} sample {index} in {name}: {int((over > 0).sum())} of {over.numel()} elements past rtol {rtol}, atol {atol}"
