"""cross_entropy, nll_loss, dropout and batch_norm (backend/ops/layers.py) on every backend here,
against torch in float64 on the same float32 inputs: normwise relative error <= 1e-6, NaN and Inf
positions exact, inputs never changed, bad arguments refused before any kernel."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F


TOL = 1e-6
NAN, INF = float("nan"), float("inf")


from movement_helpers import host, refused_before_kernels  # noqa: E402
from precision_helpers import relerr  # noqa: E402


def check(be, y, ref, what=""):
    err = relerr(host(be, y), ref)
    tol = 5e-6 if be.kind == "vendor" and str(getattr(be, "dev", "cpu")) != "cpu" else TOL
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol}"


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).double()


def kinds(be, x):
    """The input as a NumPy array, a torch tensor and a device array."""
    return [x, torch.from_numpy(x.copy()), be.to_device(x)]


# ---- cross_entropy / nll_loss: class indices ------------------------------------------------
SHAPES = [(5,), (4, 5), (3, 4, 6), (2, 3, 4, 5), (0, 4), (0, 3, 2), (1, 1), (6, 1, 1)]


def make(rng, shape, ignore=-100, scale=3.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    cd = 0 if len(shape) == 1 else 1
    tshape = shape[:cd] + shape[cd + 1:]
    t = rng.integers(0, shape[cd], tshape)
    if t.size > 2:
        t.reshape(-1)[1] = ignore
    return x, t, cd


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy_indices(backend_target, reduction, label_smoothing):
    be = backend_target
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        for ignore in (-100, 0):
            x, t, cd = make(rng, shape, ignore)
            C = shape[cd]
            for weighted in (False, True):
                w = rng.uniform(0.2, 2.0, C).astype(np.float32) if weighted else None
                ref = F.cross_entropy(t64(x), torch.from_numpy(t), None if w is None else t64(w),
                                      ignore_index=ignore, reduction=reduction, label_smoothing=label_smoothing)
                for xi in kinds(be, x):
                    xs = host(be, xi).copy()
                    y = be.cross_entropy(xi, t, w, ignore_index=ignore, reduction=reduction,
                                         label_smoothing=label_smoothing)
                    check(be, y, ref, f"cross_entropy {shape} ignore={ignore} w={weighted}")
                    np.testing.assert_array_equal(host(be, xi), xs)
                    if isinstance(xi, torch.Tensor):
                        assert isinstance(y, torch.Tensor)
                    elif isinstance(xi, np.ndarray):
                        assert isinstance(y, np.ndarray)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(backend_target, reduction):
    be = backend_target
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        cd = 0 if len(shape) == 1 else 1
        C = shape[cd]
        for ignore in (-100, 1, 7):
            x, t, _ = make(rng, shape, ignore)
            if ignore >= C:  # an ignore_index no target uses
                t = np.where(t == ignore, 0, t)
            for weighted in (False, True):
                w = rng.uniform(0.2, 2.0, C).astype(np.float32) if weighted else None
                ref = F.nll_loss(t64(x), torch.from_numpy(t), None if w is None else t64(w),
                                 ignore_index=ignore, reduction=reduction)
                for tt in (t, torch.from_numpy(t), t.astype(np.int32)):
                    y = be.nll_loss(x, tt, w, ignore_index=ignore, reduction=reduction)
                    check(be, y, ref, f"nll_loss {shape} ignore={ignore} w={weighted}")


def test_losses_special_values(backend_target):
    """-Inf logits of unpicked classes never make 0 * -Inf = NaN; NaN stays in its own row;
    every target ignored gives NaN for mean (0 / 0) as torch."""
    be = backend_target
    x = np.array([[0.0, -INF, 1.0, -INF],
                  [-INF, 2.0, -INF, 0.5],
                  [NAN, 0.0, 1.0, 2.0],
                  [INF, 0.0, 1.0, 2.0],
                  [1.0, 1.0, -INF, 1.0]], np.float32)
    t = np.array([0, 3, 1, 2, 2])
    for reduction in ("none", "mean", "sum"):
        for ls in (0.0, 0.3):
            ref = F.cross_entropy(t64(x), torch.from_numpy(t), reduction=reduction, label_smoothing=ls)
            check(be, be.cross_entropy(x, t, reduction=reduction, label_smoothing=ls), ref, f"ce {reduction} {ls}")
        ref = F.nll_loss(t64(x), torch.from_numpy(t), reduction=reduction)
        check(be, be.nll_loss(x, t, reduction=reduction), ref, f"nll {reduction}")
    y = host(be, be.nll_loss(x, t, reduction="none"))
    assert np.isfinite(y[:4]).all() and y[4] == INF  # nll_loss picks: row 2's NaN is not picked
    y = host(be, be.cross_entropy(x, t, reduction="none"))
    assert np.isnan(y[[2, 3]]).all() and np.isfinite(y[[0, 1]]).all() and y[4] == INF
    allign = np.full(5, -100)
    for fn in (be.cross_entropy, be.nll_loss):
        assert np.isnan(host(be, fn(x, allign)))
        assert host(be, fn(x, allign, reduction="sum")) == 0
    e = np.zeros((0, 4), np.float32)
    assert np.isnan(host(be, be.cross_entropy(e, np.zeros(0, np.int64))))
    assert host(be, be.nll_loss(e, np.zeros(0, np.int64), reduction="none")).shape == (0,)


def test_unbatched_and_target_kinds(backend_target):
    be = backend_target
    rng = np.random.default_rng(2)
    x = rng.standard_normal(6).astype(np.float32)
    ref = F.cross_entropy(t64(x), torch.tensor(4))
    check(be, be.cross_entropy(x, 4), ref)
    check(be, be.cross_entropy(x, np.int64(4)), ref)
    check(be, be.cross_entropy(torch.from_numpy(x), torch.tensor(4)), ref)
    x2 = rng.standard_normal((3, 6)).astype(np.float32)
    check(be, be.cross_entropy(x2, [1, 5, 0]), F.cross_entropy(t64(x2), torch.tensor([1, 5, 0])))
    check(be, be.cross_entropy(x2, np.array([1, 5, 0], np.uint8)), F.cross_entropy(t64(x2), torch.tensor([1, 5, 0])))


# ---- cross_entropy: class probabilities -----------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
def test_cross_entropy_probabilities(backend_target, reduction, label_smoothing):
    be = backend_target
    rng = np.random.default_rng(3)
    for shape in [(5,), (4, 5), (3, 4, 6), (2, 3, 4, 5), (0, 4)]:
        x = (rng.standard_normal(shape) * 2).astype(np.float32)
        cd = 0 if len(shape) == 1 else 1
        p = rng.uniform(0, 1, shape).astype(np.float32)
        p = (p / np.maximum(p.sum(axis=cd, keepdims=True), 1e-6)).astype(np.float32)
        for weighted in (False, True):
            w = rng.uniform(0.2, 2.0, shape[cd]).astype(np.float32) if weighted else None
            ref = F.cross_entropy(t64(x), t64(p), None if w is None else t64(w), reduction=reduction,
                                  label_smoothing=label_smoothing)
            for xi, pi in zip(kinds(be, x), kinds(be, p)):
                y = be.cross_entropy(xi, pi, w, reduction=reduction, label_smoothing=label_smoothing)
                check(be, y, ref, f"cross_entropy probs {shape} w={weighted}")
    # torch's arithmetic: a 0 probability on a -Inf logit is NaN there (0 * -Inf), as torch
    x = np.array([[0.0, -INF, 1.0]], np.float32)
    p = np.array([[0.5, 0.0, 0.5]], np.float32)
    check(be, be.cross_entropy(x, p, reduction=reduction), F.cross_entropy(t64(x), t64(p), reduction=reduction))


# ---- dropout -------------------------------------------------------------------------------
def test_dropout(backend_target):
    be = backend_target
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    for p in (0.1, 0.5, 0.9):
        ys = [host(be, be.dropout(xi, p, seed=7)) for xi in kinds(be, x)]
        for y in ys[1:]:
            np.testing.assert_array_equal(y, ys[0])  # the same seed, the same mask, whatever the kind
        y = ys[0]
        kept = y != 0
        assert abs(kept.mean() - (1 - p)) < 0.03, p
        check(be, y[kept], x[kept].astype(np.float64) / (1 - p), f"dropout p={p}")
        other = host(be, be.dropout(x, p, seed=8))
        assert not np.array_equal(other != 0, kept)
    # not training, p = 0: equal copies; p = 1: x * 0 as torch (a dropped Inf is NaN)
    s = np.array([1.0, -0.0, INF, NAN, -2.0], np.float32)
    for y in (be.dropout(s, training=False), be.dropout(s, 0.0, seed=1)):
        np.testing.assert_array_equal(host(be, y), s)
        if isinstance(y, np.ndarray):
            assert not np.shares_memory(y, s)
    np.testing.assert_array_equal(host(be, be.dropout(s, 1.0)), F.dropout(torch.from_numpy(s), 1.0).numpy())
    assert host(be, be.dropout(np.zeros((0, 3), np.float32), 0.5)).shape == (0, 3)
    t = torch.from_numpy(x.copy())
    assert isinstance(be.dropout(t, 0.5, seed=1), torch.Tensor)
    np.testing.assert_array_equal(t.numpy(), x)


# ---- batch_norm ----------------------------------------------------------------------------
@pytest.mark.parametrize("training", [False, True])
def test_batch_norm(backend_target, training):
    be = backend_target
    rng = np.random.default_rng(5)
    for shape in [(4, 3), (2, 3, 7), (2, 3, 4, 5), (3, 2, 2, 2, 2)]:
        C = shape[1]
        x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
        rm = rng.standard_normal(C).astype(np.float32)
        rv = rng.uniform(0.5, 2.0, C).astype(np.float32)
        w = rng.uniform(0.5, 2.0, C).astype(np.float32)
        b = rng.standard_normal(C).astype(np.float32)
        for affine in (False, True):
            for momentum in (0.1, 0.7):
                RM, RV = t64(rm), t64(rv)
                ref = F.batch_norm(t64(x), RM, RV, t64(w) if affine else None, t64(b) if affine else None,
                                   training=training, momentum=momentum, eps=1e-3)
                args = (w, b) if affine else (None, None)
                for xi in kinds(be, x):
                    ins = [host(be, a).copy() for a in (xi, rm, rv)]
                    y = be.batch_norm(xi, rm, rv, *args, training=training, momentum=momentum, eps=1e-3)
                    check(be, y, ref, f"batch_norm {shape} training={training}")
                    y2, nrm, nrv = be.batch_norm(xi, rm, rv, *args, training=training, momentum=momentum,
                                                 eps=1e-3, return_stats=True)
                    check(be, y2, ref)
                    check(be, nrm, RM, "running_mean")
                    check(be, nrv, RV, "running_var")
                    for a, before in zip((xi, rm, rv), ins):
                        np.testing.assert_array_equal(host(be, a), before)  # never updated in place
                    if isinstance(nrm, np.ndarray):
                        assert not np.shares_memory(nrm, rm) and not np.shares_memory(nrv, rv)
    # training without running stats
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    if training:
        y, nrm, nrv = be.batch_norm(x, None, None, training=True, return_stats=True)
        check(be, y, F.batch_norm(t64(x), None, None, training=True))
        assert nrm is None and nrv is None
    # NaN in one channel stays in that channel
    x[0, 1, 0] = NAN
    rm, rv = np.zeros(2, np.float32), np.ones(2, np.float32)
    check(be, be.batch_norm(x, rm, rv, training=training),
          F.batch_norm(t64(x), t64(rm), t64(rv), training=training))


# ---- argument rules ------------------------------------------------------------------------
X = np.zeros((4, 5), np.float32)
T = np.array([0, 1, 2, 3])
BAD = [
    (lambda be: be.cross_entropy(X, np.array([0, 1, 5, 2])), "cross_entropy", "target", "out of bounds"),
    (lambda be: be.cross_entropy(X, np.array([0, 1, -1, 2])), "cross_entropy", "target", "out of bounds"),
    (lambda be: be.nll_loss(X, np.array([0, 1, 7, 2]), ignore_index=5), "nll_loss", "target", "out of bounds"),
    (lambda be: be.cross_entropy(X, np.array([0, 1, 2])), "cross_entropy", "target", "shape"),
    (lambda be: be.cross_entropy(X, np.zeros((4, 1), np.int64)), "cross_entropy", "target", "shape"),
    (lambda be: be.cross_entropy(X, np.zeros((4, 4), np.float32)), "cross_entropy", "target", "probabilities"),
    (lambda be: be.cross_entropy(X, T, weight=np.ones(4, np.float32)), "cross_entropy", "weight", "(5,)"),
    (lambda be: be.cross_entropy(X, np.zeros((4, 5), np.float32), weight=np.ones(3, np.float32)),
     "cross_entropy", "weight", "(5,)"),
    (lambda be: be.cross_entropy(X, T, label_smoothing=1.5), "cross_entropy", "label_smoothing", "between"),
    (lambda be: be.cross_entropy(X, T, label_smoothing="a"), "cross_entropy", "label_smoothing", "number"),
    (lambda be: be.cross_entropy(X, T, reduction="avg"), "cross_entropy", "reduction", "must be one of"),
    (lambda be: be.cross_entropy(X, T, ignore_index=1.5), "cross_entropy", "ignore_index", "int"),
    (lambda be: be.cross_entropy(np.float32(1), 0), "cross_entropy", "input", "at least 1 dim"),
    (lambda be: be.cross_entropy(np.zeros((4, 0), np.float32), np.zeros(4, np.int64)), "cross_entropy", "input",
     "class"),
    (lambda be: be.cross_entropy(X, np.array([True, False, True, True])), "cross_entropy", "target", "integer"),
    (lambda be: be.cross_entropy(X, torch.tensor([True, False, True, True])), "cross_entropy", "target", "integer"),
    (lambda be: be.nll_loss(X, np.zeros(4, np.float32)), "nll_loss", "target", "integer"),
    (lambda be: be.nll_loss(X, T, reduction="mean!"), "nll_loss", "reduction", "must be one of"),
    (lambda be: be.dropout(X, 1.5), "dropout", "p", "between 0 and 1"),
    (lambda be: be.dropout(X, -0.1), "dropout", "p", "between 0 and 1"),
    (lambda be: be.dropout(X, 0.5, inplace=True), "dropout", "inplace", "inplace=False"),
    (lambda be: be.dropout(X, 0.5, seed=-1), "dropout", "seed", "int"),
    (lambda be: be.dropout(X, 0.5, seed=1.5), "dropout", "seed", "int"),
    (lambda be: be.batch_norm(X, None, None), "batch_norm", "running_mean", "evaluation mode"),
    (lambda be: be.batch_norm(X, np.zeros(5), None), "batch_norm", "running_var", "evaluation mode"),
    (lambda be: be.batch_norm(X, np.zeros(4), np.ones(5)), "batch_norm", "running_mean", "(5,)"),
    (lambda be: be.batch_norm(X, np.zeros(5), np.ones(5), weight=np.ones(3)), "batch_norm", "weight", "(5,)"),
    (lambda be: be.batch_norm(X, np.zeros(5), np.ones(5), bias=np.ones((5, 1))), "batch_norm", "bias", "(5,)"),
    (lambda be: be.batch_norm(X[:1], None, None, training=True), "batch_norm", "input", "more than 1 value"),
    (lambda be: be.batch_norm(np.zeros(5), None, None, training=True), "batch_norm", "input", "at least 2 dims"),
    (lambda be: be.batch_norm(X, np.zeros(5), np.ones(5), eps=-1.0), "batch_norm", "eps", ">= 0"),
    (lambda be: be.batch_norm(X, np.zeros(5), np.ones(5), momentum=None), "batch_norm", "momentum", "number"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments(backend_target, monkeypatch, case):
    refused_before_kernels(backend_target, monkeypatch, BAD[case],
                           ("_where", "_binary", "_reduce", "_unary", "_reshape", "_slice", "_cat"))
