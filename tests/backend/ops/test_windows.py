"""Window ops (backend/ops/windows.py): max_pool2d, avg_pool2d, adaptive_avg/max_pool2d and
interpolate on every backend, against torch in float64 on the same float32 inputs: normwise
relative error <= 1e-6, NaN and Inf positions exact, inputs never written, and every bad argument
refused with an AnyDeviceError naming it before any kernel runs (where torch refuses it too)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import AnyDeviceError
from anydevice.backend.ops.windows import interp_table, pool_table

from precision_helpers import check, t64, tol_for


def _data(shape, seed=0, specials=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:  # a few NaN and +-Inf, so their positions in the result are checked too
        flat = x.reshape(-1)
        pos = rng.choice(flat.size, size=max(3, flat.size // 60), replace=False)
        flat[pos[0::3]] = np.nan
        flat[pos[1::3]] = np.inf
        flat[pos[2::3]] = -np.inf
    return x


def _run(be, op, x, **kw):
    before = x.copy()
    y = getattr(be, op)(x, **kw)
    assert np.array_equal(x, before, equal_nan=True), f"{op} wrote into its input"
    ref = getattr(F, op)(t64(x), **kw)
    check(be.to_numpy(y), ref, f"{be.name} {op} {x.shape} {kw}", tol_for(be))
    return y


MAX_POOL = [  # (shape, kwargs)
    ((2, 3, 17, 23), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 17, 23), dict(kernel_size=2)),
    ((1, 2, 16, 16), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), dilation=2, ceil_mode=True)),
    ((3, 11, 9), dict(kernel_size=3, stride=1, padding=1)),
    ((2, 4, 13, 13), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True)),
    ((1, 1, 8, 40), dict(kernel_size=(1, 7), stride=(1, 5), dilation=(1, 3))),
]


@pytest.mark.parametrize("shape,kw", MAX_POOL)
def test_max_pool2d(backend_target, shape, kw):
    _run(backend_target, "max_pool2d", _data(shape), **kw)
    _run(backend_target, "max_pool2d", _data(shape, 1, specials=True), **kw)


AVG_POOL = [
    ((2, 3, 17, 23), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 17, 23), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((2, 3, 17, 23), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 2, 15, 16), dict(kernel_size=(4, 2), stride=(3, 1), padding=(2, 1), ceil_mode=True)),
    ((1, 2, 15, 16), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, divisor_override=5)),
    ((3, 10, 12), dict(kernel_size=2)),
    ((1, 1, 9, 9), dict(kernel_size=9)),
]


@pytest.mark.parametrize("shape,kw", AVG_POOL)
def test_avg_pool2d(backend_target, shape, kw):
    _run(backend_target, "avg_pool2d", _data(shape), **kw)
    _run(backend_target, "avg_pool2d", _data(shape, 1, specials=True), **kw)


ADAPTIVE = [((2, 3, 17, 23), (5, 7)), ((2, 3, 17, 23), 1), ((1, 2, 9, 10), (13, 30)),
            ((3, 12, 12), (None, 5)), ((1, 1, 64, 48), (7, 7))]


@pytest.mark.parametrize("shape,size", ADAPTIVE)
@pytest.mark.parametrize("op", ["adaptive_avg_pool2d", "adaptive_max_pool2d"])
def test_adaptive_pool2d(backend_target, op, shape, size):
    _run(backend_target, op, _data(shape), output_size=size)
    _run(backend_target, op, _data(shape, 1, specials=True), output_size=size)


INTERP = [  # (shape, kwargs)
    ((2, 3, 9, 11), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 9, 11), dict(size=(13, 51), mode="nearest")),
    ((2, 3, 9, 11), dict(scale_factor=0.6, mode="nearest")),
    ((2, 3, 9, 11), dict(scale_factor=(1.7, 0.45), mode="nearest", recompute_scale_factor=True)),
    ((2, 3, 9, 11), dict(size=(13, 51), mode="nearest-exact")),
    ((2, 3, 9, 11), dict(scale_factor=2.5, mode="nearest-exact")),
    ((2, 3, 9, 11), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 9, 11), dict(scale_factor=2, mode="bilinear", align_corners=True)),
    ((2, 3, 9, 11), dict(size=(4, 30), mode="bilinear")),
    ((2, 3, 9, 11), dict(scale_factor=(0.3, 1.3), mode="bilinear", recompute_scale_factor=True)),
    ((1, 2, 9, 11), dict(size=(1, 1), mode="bilinear", align_corners=True)),
    ((2, 3, 9, 11), dict(size=(20, 7), mode="bicubic")),
    ((2, 3, 9, 11), dict(scale_factor=1.7, mode="bicubic", align_corners=True)),
    ((2, 3, 9, 11), dict(scale_factor=0.5, mode="bicubic")),
    ((2, 3, 9, 11), dict(size=(5, 6), mode="area")),
    ((2, 3, 9, 11), dict(scale_factor=0.5, mode="area")),
    ((2, 3, 12), dict(scale_factor=2, mode="linear")),
    ((2, 3, 12), dict(size=7, mode="linear", align_corners=True)),
    ((2, 3, 12), dict(size=29, mode="nearest")),
    ((2, 3, 12), dict(size=5, mode="area")),
    ((0, 3, 9, 11), dict(scale_factor=2, mode="bilinear")),
]


@pytest.mark.parametrize("shape,kw", INTERP)
def test_interpolate(backend_target, shape, kw):
    _run(backend_target, "interpolate", _data(shape), **kw)
    if shape[0]:
        _run(backend_target, "interpolate", _data(shape, 1, specials=True), **kw)


def test_torch_input_gives_torch_output(backend_target):
    be = backend_target
    x = torch.from_numpy(_data((1, 2, 8, 8)))
    y = be.max_pool2d(x, 2)
    assert isinstance(y, torch.Tensor) and y.shape == (1, 2, 4, 4)
    assert torch.equal(y.cpu(), F.max_pool2d(x, 2))
    y = be.interpolate(x, scale_factor=2, mode="bilinear")
    check(y.cpu(), F.interpolate(x.double(), scale_factor=2, mode="bilinear"))


def test_tables_follow_torch_formulas():
    idx, wgt = interp_table(4, 8, "linear", False, None)  # 2x: weights 1/4, 3/4; source clamped at 0
    assert idx[:3].tolist() == [[0, 1], [0, 1], [0, 1]] and idx[-1].tolist() == [3, 3]
    assert np.allclose(wgt[0], [1, 0]) and np.allclose(wgt[1], [0.75, 0.25]) and np.allclose(wgt[2], [0.25, 0.75])
    idx, wgt = pool_table(5, 3, 3, 2, 1, 1)  # max 3x3 s2 p1 over 5: the padding tap skipped
    assert idx.tolist() == [[0, 1, -1], [1, 2, 3], [3, 4, -1]]
    idx, wgt = interp_table(6, 3, "cubic", False, None)
    assert np.allclose(wgt.sum(1), 1.0)


BAD = [  # (op, input shape, kwargs, argument the error names, torch refuses it too)
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=0), "kernel_size", True),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=2, stride=0), "stride", True),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=3, padding=2), "padding", True),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=2, dilation=0), "dilation", True),
    ("max_pool2d", (1, 1, 2, 2), dict(kernel_size=3), "input", True),
    ("max_pool2d", (8, 8), dict(kernel_size=2), "input", True),
    ("max_pool2d", (1, 0, 8, 8), dict(kernel_size=2), "input", True),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=2, return_indices=True), "return_indices", False),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=2, divisor_override=0), "divisor_override", True),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=(2, 2, 2)), "kernel_size", True),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=2, padding=-1), "padding", True),
    ("adaptive_avg_pool2d", (1, 1, 8, 8), dict(output_size=-1), "output_size", True),
    ("adaptive_max_pool2d", (1, 1, 8, 8), dict(output_size=2, return_indices=True), "return_indices", False),
    ("adaptive_avg_pool2d", (1, 8, 8, 8, 8), dict(output_size=2), "input", True),
    ("interpolate", (1, 1, 8, 8), dict(), "size", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, scale_factor=2), "size", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, mode="nearest", align_corners=True), "align_corners", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, mode="cubic"), "mode", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, mode="linear"), "mode", True),
    ("interpolate", (1, 8, 8), dict(size=4, mode="bilinear"), "mode", True),
    ("interpolate", (1, 1, 8, 8), dict(size=(4, 4, 4)), "size", True),
    ("interpolate", (1, 1, 8, 8), dict(size=0), "size", True),
    ("interpolate", (1, 1, 8, 8), dict(scale_factor=0.05), "scale_factor", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, recompute_scale_factor=True), "recompute_scale_factor", True),
    ("interpolate", (1, 1, 8, 8), dict(size=4, mode="bilinear", antialias=True), "antialias", False),
]


@pytest.mark.parametrize("op,shape,kw,arg,torch_refuses", BAD)
def test_bad_arguments(backend_target, monkeypatch, op, shape, kw, arg, torch_refuses):
    be = backend_target

    def no_kernel(*a, **k):
        raise AssertionError("a kernel ran before the arguments were checked")
    monkeypatch.setattr(be, "_window2d", no_kernel)
    x = np.zeros(shape, np.float32)
    with pytest.raises(AnyDeviceError) as info:
        getattr(be, op)(x, **kw)
    assert info.value.op == op and info.value.arg == arg, str(info.value)
    if torch_refuses:
        with pytest.raises((RuntimeError, ValueError, TypeError, NotImplementedError)):
            getattr(F, op)(torch.from_numpy(x), **kw)
