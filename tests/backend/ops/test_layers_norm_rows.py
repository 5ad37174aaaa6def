"""The fused row normalisation (``_norm_rows``: layer_norm / group_norm over trailing dims) on
data that steers its two paths: the one-pass shifted statistics (a shift near the mean) and the
second pass about the accurate mean (a shift far from the mean: the row's first values unlike the
rest), rows much longer than one block of partial sums and rows with odd lengths, means far
larger than the spread, constant rows, NaN / Inf. Each against PyTorch in float64 (1e-6
normwise, NaN / Inf positions exact) on every backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch.nn.functional as F

from precision_helpers import _assert_unchanged, _snapshot, check, t64


def _sky(rng, shape):
    """The first quarter of each group's values constant and far from the rest: the shift (the
    mean of a row's first 256 values) is far from the row's mean, so the exact second pass runs."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[:, :, : max(1, shape[2] // 4)] = 40.0
    return x


DATA = {
    "normal": lambda rng, s: rng.standard_normal(s).astype(np.float32),
    "mean 1e4": lambda rng, s: (1e4 + rng.standard_normal(s)).astype(np.float32),
    "mean 1e3 std 1e-2": lambda rng, s: (1e3 + 1e-2 * rng.standard_normal(s)).astype(np.float32),
    "positive uniform": lambda rng, s: (50 + 100 * rng.random(s)).astype(np.float32),
    "sky": _sky,
    "outliers": lambda rng, s: np.where(rng.random(s) < 1e-3, 1e4, rng.standard_normal(s)).astype(np.float32),
    "two close values": lambda rng, s: np.where(rng.random(s) < 0.5, 1.0, 1.0 + 2.0 ** -20).astype(np.float32),
}
#: (shape, groups): group sizes 16 * 4096 (the bench's 64K, halved), 4099 * 2 (no multiple of 32
#: or 256), 300, 35 and 12 (a tail only)
SHAPES = [((1, 32, 64, 64), 2), ((2, 4, 4099), 2), ((3, 6, 10, 10), 2), ((2, 10, 5, 7), 2), ((4, 6, 2), 3)]


@pytest.mark.parametrize("kind", list(DATA))
@pytest.mark.parametrize("shape,groups", SHAPES, ids=[f"{s}g{g}" for s, g in SHAPES])
def test_group_norm_paths(backend_target, kind, shape, groups):
    rng = np.random.default_rng(7)
    x = DATA[kind](rng, shape)
    snap = _snapshot(x)
    for eps in (1e-5, 0.0) if kind != "two close values" else (1e-5,):
        ref = F.group_norm(t64(x), groups, eps=eps).numpy()
        check(backend_target.group_norm(x, groups, eps=eps), ref, f"group_norm {kind} {shape} g{groups} eps={eps}")
    _assert_unchanged(snap, [x])


@pytest.mark.parametrize("kind", ["normal", "mean 1e4", "sky", "two close values"])
def test_layer_norm_paths(backend_target, kind):
    rng = np.random.default_rng(8)
    x = DATA[kind](rng, (3, 8, 33, 31))
    ref = F.layer_norm(t64(x), (33, 31)).numpy()
    check(backend_target.layer_norm(x, (33, 31)), ref, f"layer_norm {kind}")
    ref = F.layer_norm(t64(x), (8, 33, 31)).numpy()
    check(backend_target.layer_norm(x, (8, 33, 31)), ref, f"layer_norm {kind} 3 dims")


def test_norm_rows_constant_and_nonfinite(backend_target):
    """Constant groups give zeros; a NaN or an Inf makes its whole group NaN (as torch); the other
    groups are untouched by it."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 8, 40, 40)).astype(np.float32)
    x[0, 0:2] = 3.25          # group 0 of image 0: constant
    x[0, 2, 5, 7] = np.nan    # group 1: a NaN
    x[1, 4, 0, 0] = np.inf    # group 2 of image 1: an Inf among its first values (the shift)
    x[1, 7, 39, 39] = -np.inf  # group 3 of image 1: an Inf at its end
    ref = F.group_norm(t64(x), 4).numpy()
    y = backend_target.group_norm(x, 4)
    check(y, ref, "group_norm constant / NaN / Inf groups")
    y = np.asarray(y)  # numpy in, numpy out
    assert (y[0, 0:2] == 0).all()
    assert np.isnan(y[0, 2:4]).all() and np.isnan(y[1, 4:8]).all()
    assert np.isfinite(y[0, 4:8]).all() and np.isfinite(y[1, 0:4]).all()
