"""Data movement and selection (backend/ops/movement.py) and pad's cropping, on every backend here,
against torch: reshape/view, permute, transpose, expand/broadcast_to, narrow, slice, split, chunk,
cat, stack, contiguous, where, eq/ne/lt/le/gt/ge, pad with negative amounts.

Data movement is exact: results must equal torch's bit for bit (NaN positions included). Inputs
are never changed; results alias an input only for the documented views."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend import AnyDeviceError
from movement_helpers import host, refused_before_kernels

NAN, INF = float("nan"), float("inf")


def same(be, y, ref):
    y = host(be, y)
    ref = ref.detach().cpu().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert y.shape == ref.shape, f"shape {y.shape} != {ref.shape}"
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ref.astype(np.float32))


def data(rng, shape, special=True):
    """float32 data with NaN, +-Inf and -0 sprinkled in."""
    x = rng.standard_normal(shape).astype(np.float32)
    if special and x.size >= 4:
        flat = x.reshape(-1)
        idx = rng.choice(x.size, 4, replace=False)
        flat[idx] = [NAN, INF, -INF, -0.0]
    return x


def seeded(seed, shape):
    """data() of ``shape`` from a generator seeded with ``seed``, and the same values as a torch tensor."""
    x = data(np.random.default_rng(seed), shape)
    return x, torch.from_numpy(x)


KINDS = ("numpy", "torch", "native")


def as_kind(be, x, kind):
    if kind == "numpy":
        return x
    if kind == "torch":
        return torch.from_numpy(x.copy())
    return be.to_device(x)


def run(be, kind, fn, *arrays):
    """fn on the arrays given as ``kind``; checks the inputs are unchanged; returns host results."""
    ins = [as_kind(be, a, kind) for a in arrays]
    before = [host(be, i).copy() for i in ins]
    y = fn(*ins)
    want = {"numpy": np.ndarray, "torch": torch.Tensor}.get(kind)
    for part in (y if isinstance(y, tuple) else (y,)):
        assert want is None or isinstance(part, want), type(part)  # the first input's kind
    for b, i in zip(before, ins):
        np.testing.assert_array_equal(host(be, i), b)
    return y


SHAPES = [(), (5,), (0,), (3, 4), (2, 0, 3), (2, 3, 4), (1, 3, 1, 5), (2, 1, 3, 2, 2)]


# ---- reshape / view ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_reshape_view(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(0)
    cases = [((2, 3, 4), (4, -1)), ((2, 3, 4), (24,)), ((2, 3, 4), (-1,)), ((2, 3, 4), (2, 1, 12)),
             ((), (1, 1)), ((5,), ()), ((1,), ()), ((0, 3), (3, 0)), ((0, 3), (-1, 5)), ((6,), 6), ((2, 3), [3, 2])]
    for shape, new in cases:
        if math_prod(shape) != 1 and new == ():
            continue
        x = data(rng, shape)
        y = run(be, kind, lambda a: be.reshape(a, new), x)
        same(be, y, torch.from_numpy(x).reshape(new))
        y = run(be, kind, lambda a: be.view(a, new), x)
        same(be, y, torch.from_numpy(x).reshape(new))
    x = data(rng, (2, 6))
    same(be, be.view(x, 3, 4), torch.from_numpy(x).view(3, 4))
    same(be, be.view(x, -1), torch.from_numpy(x).view(-1))


def math_prod(shape):
    return int(np.prod(shape)) if shape else 1


# ---- permute / transpose --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_permute_transpose(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        x = data(rng, shape)
        t = torch.from_numpy(x)
        nd = len(shape)
        perm = tuple(rng.permutation(nd).tolist())
        same(be, run(be, kind, lambda a: be.permute(a, perm), x), t.permute(perm))
        neg = tuple(p - nd for p in perm)
        same(be, run(be, kind, lambda a: be.permute(a, neg), x), t.permute(perm))
        if nd:
            for d0, d1 in ((0, -1), (-1, 0), (nd - 1, nd - 1), (0, nd // 2)):
                same(be, run(be, kind, lambda a: be.transpose(a, d0, d1), x), t.transpose(d0, d1))
        else:
            same(be, be.transpose(x, 0, -1), t.transpose(0, -1))


# ---- expand / broadcast_to ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_expand(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(2)
    cases = [((3, 1), (3, 4)), ((3, 1), (2, 3, 5)), ((1,), (0,)), ((), (2, 3)), ((3, 1), (-1, 4)),
             ((1, 3, 1), (2, -1, -1, 2)), ((2, 3), (2, 3)), ((1, 1), (0, 4)), ((2, 3), (0, 2, 3))]
    for shape, sizes in cases:
        x = data(rng, shape)
        ref = torch.from_numpy(x).expand(*sizes)
        same(be, run(be, kind, lambda a: be.expand(a, *sizes), x), ref)
        same(be, run(be, kind, lambda a: be.expand(a, sizes), x), ref)
        same(be, run(be, kind, lambda a: be.broadcast_to(a, sizes), x), ref)


# ---- narrow / slice -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_narrow(backend_target, kind):
    be = backend_target
    x, t = seeded(3, (4, 5, 6))
    for dim in (0, 1, 2, -1, -3):
        n = x.shape[dim]
        for start in (0, 1, -2, n - 1, n, -n):
            for length in (0, 1, 2, n):
                s = start % n if start < 0 else start
                if s + length > n:
                    continue
                same(be, run(be, kind, lambda a: be.narrow(a, dim, start, length), x),
                     t.narrow(dim, start, length))
    e = np.zeros((0, 3), np.float32)
    same(be, be.narrow(e, 0, 0, 0), torch.from_numpy(e).narrow(0, 0, 0))
    same(be, be.narrow(e, 1, 1, 2), torch.from_numpy(e).narrow(1, 1, 2))


@pytest.mark.parametrize("kind", KINDS)
def test_slice(backend_target, kind):
    be = backend_target
    x, t = seeded(4, (5, 6, 7))
    bounds = (None, 0, 1, 3, -2, -9, 9, 7)
    for dim in (0, 1, 2, -1, -2):
        for start in bounds:
            for stop in bounds:
                for step in (1, 2, 3, 10):
                    idx = (slice(None),) * (dim % 3) + (slice(start, stop, step),)
                    same(be, run(be, kind, lambda a: be.slice(a, dim, start, stop, step), x), t[idx])
    same(be, be.slice(x), t)
    same(be, be.slice(x, start=2), t[2:])
    e = np.zeros((2, 0), np.float32)
    same(be, be.slice(e, 1, 0, 5, 2), torch.from_numpy(e)[:, 0:5:2])


# ---- split / chunk -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_split_chunk(backend_target, kind):
    be = backend_target
    x, t = seeded(5, (7, 4, 5))

    def parts(ys, refs):
        assert isinstance(ys, tuple) and len(ys) == len(refs)
        for y, r in zip(ys, refs):
            same(be, y, r)

    for dim in (0, 1, -1):
        n = x.shape[dim]
        for size in (1, 2, 3, n, n + 4):
            parts(run(be, kind, lambda a: be.split(a, size, dim), x), t.split(size, dim))
        for chunks in (1, 2, 3, 5, 9):
            parts(run(be, kind, lambda a: be.chunk(a, chunks, dim), x), t.chunk(chunks, dim))
    parts(be.split(x, [2, 0, 5]), t.split([2, 0, 5]))
    parts(be.split(x, [1, 3], -2), t.split([1, 3], -2))
    e = np.zeros((0, 3), np.float32)
    parts(be.split(e, 2), torch.from_numpy(e).split(2))
    parts(be.split(e, 0), torch.from_numpy(e).split(0))
    parts(be.chunk(e, 3), torch.from_numpy(e).chunk(3))


# ---- cat / stack ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_cat_stack(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(6)
    for dim in (0, 1, 2, -1, -3):
        shapes = []
        for k in (2, 0, 3):
            s = [2, 3, 4]
            s[dim] = k
            shapes.append(tuple(s))
        xs = [data(rng, s) for s in shapes]
        ref = torch.cat([torch.from_numpy(a) for a in xs], dim)
        same(be, run(be, kind, lambda *a: be.cat(list(a), dim), *xs), ref)
    xs = [data(rng, (2, 3)) for _ in range(3)]
    for dim in (0, 1, 2, -1, -3):
        ref = torch.stack([torch.from_numpy(a) for a in xs], dim)
        same(be, run(be, kind, lambda *a: be.stack(a, dim), *xs), ref)
    # a single part, 0-d parts for stack, legacy empty 1-D parts for cat
    same(be, be.cat([xs[0]]), xs[0])
    zs = [np.array(1.5, np.float32), np.full((), NAN, np.float32)]
    same(be, be.stack(zs), torch.stack([torch.from_numpy(z) for z in zs]))
    e = np.zeros((0,), np.float32)
    same(be, be.cat([e, xs[0], e, xs[1]], 1), torch.cat([torch.from_numpy(a) for a in (e, xs[0], e, xs[1])], 1))
    same(be, be.cat([e, e]), torch.cat([torch.from_numpy(e)] * 2))
    # mixed kinds: the first decides the result's kind
    y = be.cat([torch.from_numpy(xs[0]), xs[1]])
    assert isinstance(y, torch.Tensor)
    same(be, y, np.concatenate(xs[:2]))


# ---- contiguous ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_contiguous(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(7)
    x = data(rng, (3, 4, 5))
    y = run(be, kind, lambda a: be.contiguous(be.transpose(a, 0, 2)), x)
    same(be, y, torch.from_numpy(x).transpose(0, 2).contiguous())
    if isinstance(y, np.ndarray):
        assert y.flags.c_contiguous
    if isinstance(y, torch.Tensor):
        assert y.is_contiguous()


# ---- where ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_where(backend_target, kind):
    be = backend_target
    rng = np.random.default_rng(8)
    cases = [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), (4,)), ((), (2, 3), ()), ((2, 1, 3), (4, 1), (1,)),
             ((0, 3), (3,), (1, 3)), ((5,), (), ())]
    for sc, sa, sb in cases:
        c = rng.integers(0, 2, sc).astype(np.float32)
        if c.size:
            c.reshape(-1)[0] = NAN  # NaN is true (torch: bool(nan) is True)
            c.reshape(-1)[-1] = -0.0  # -0 is false
        a, b = data(rng, sa), data(rng, sb)
        ref = torch.where(torch.from_numpy(c).bool(), torch.from_numpy(a), torch.from_numpy(b))
        same(be, run(be, kind, lambda cc, aa, bb: be.where(cc, aa, bb), c, a, b), ref)
    # the unselected side's Inf / NaN never show: a select, not arithmetic
    c = np.array([1, 0, 1, 0], np.float32)
    a = np.array([1, INF, NAN, -INF], np.float32)
    b = np.array([NAN, 2, -INF, 3], np.float32)
    same(be, run(be, kind, lambda cc, aa, bb: be.where(cc, aa, bb), c, a, b), np.array([1, 2, NAN, 3], np.float32))
    # Python numbers, bool conditions
    cb = np.array([[True, False, True]])
    x = data(rng, (2, 3))
    tx = torch.from_numpy(x)
    same(be, be.where(cb, x, 0.0), torch.where(torch.from_numpy(cb), tx, 0.0))
    same(be, be.where(cb, -1.5, x), torch.where(torch.from_numpy(cb), -1.5, tx))
    same(be, be.where(torch.from_numpy(cb), INF, NAN), torch.where(torch.from_numpy(cb), INF, NAN).float())


# ---- comparisons ---------------------------------------------------------------------------
CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", list(CMP))
def test_compare(backend_target, kind, op):
    be = backend_target
    vals = np.array([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 1e-38, 3.0], np.float32)
    a = np.repeat(vals, len(vals)).reshape(len(vals), len(vals))
    b = np.tile(vals, len(vals)).reshape(len(vals), len(vals))
    fn = getattr(be, op)
    ref = CMP[op](torch.from_numpy(a), torch.from_numpy(b)).float()
    same(be, run(be, kind, fn, a, b), ref)
    # broadcasting and Python numbers on either side
    col, row = vals.reshape(-1, 1), vals.reshape(1, -1)
    same(be, run(be, kind, fn, col, row), CMP[op](torch.from_numpy(col), torch.from_numpy(row)).float())
    for s in (0.0, 1.0, NAN, INF):
        same(be, run(be, kind, lambda x: fn(x, s), vals), CMP[op](torch.from_numpy(vals), s).float())
        same(be, run(be, kind, lambda x: fn(s, x), vals), CMP[op](torch.tensor(s), torch.from_numpy(vals)).float())
    e = np.zeros((0, 2), np.float32)
    same(be, fn(e, 1.0), np.zeros((0, 2), np.float32))
    same(be, be.compare(op, vals, 0.0), CMP[op](torch.from_numpy(vals), 0.0).float())


# ---- pad with negative amounts (cropping) --------------------------------------------------
PADS = [(-1, 2), (2, -1), (-1, -1), (-3, 1), (1, -4), (-1, 4), (3, -2), (0, -5), (-2, -3), (-5, 1),
        (-6, 2), (-1, 5), (5, -1), (-1, 2, -1, 1), (1, -1, -2, 2), (-2, -2, -1, -2), (0, 0, -4, 0), (-6, 0),
        (-5, 0, 0, 0), (-5, 0, -4, 0), (0, 0, -5, 0), (-2, -3, 0, 0), (0, 0, 1, -5)]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_crop(backend_target, mode):
    be = backend_target
    x, t = seeded(9, (2, 3, 4, 5))
    ran = 0
    for pad in PADS:
        try:  # torch pads a 4-D input's last dim only in constant mode: through a 3-D view
            tt = t.reshape(6, 4, 5) if len(pad) == 2 and mode != "constant" else t
            ref = F.pad(tt, pad, mode=mode).reshape(2, 3, *F.pad(tt, pad, mode=mode).shape[-2:])
        except RuntimeError:
            ref = None
        if mode == "circular" and ref is not None:
            # torch reads uninitialised memory where the wrap passes the cropped size: refused here
            kept = [(5 if i < 2 else 4) + min(pad[i], 0) + min(pad[i ^ 1], 0) for i in range(len(pad))]
            if any(pad[i] > kept[i] for i in range(len(pad))):
                ref = None
        if ref is None:
            with pytest.raises(AnyDeviceError) as ei:
                be.pad(x, pad, mode)
            assert ei.value.op == "pad" and ei.value.arg == "pad"
            continue
        for kind in KINDS:
            y = run(be, kind, lambda a: be.pad(a, pad, mode), x)
            same(be, y, ref)
            if kind == "numpy":
                assert not np.shares_memory(y, x)
        ran += 1
    assert ran >= 8


# ---- views and aliasing --------------------------------------------------------------------
VIEW_OPS = {
    "reshape": lambda be, a: be.reshape(a, (6, 4)),
    "view": lambda be, a: be.view(a, -1),
    "permute": lambda be, a: be.permute(a, (2, 0, 1)),
    "transpose": lambda be, a: be.transpose(a, 0, 1),
    "expand": lambda be, a: be.expand(a, 3, 2, 3, 4),
    "broadcast_to": lambda be, a: be.broadcast_to(a, (2, 2, 3, 4)),
    "narrow": lambda be, a: be.narrow(a, 1, 1, 2),
    "slice": lambda be, a: be.slice(a, 2, 0, None, 2),
    "split": lambda be, a: be.split(a, 2, 1)[1],
    "chunk": lambda be, a: be.chunk(a, 2, 0)[0],
    "contiguous": lambda be, a: be.contiguous(a),
}
COPY_OPS = {
    "cat": lambda be, a: be.cat([a, a], 0),
    "cat1": lambda be, a: be.cat([a]),
    "stack": lambda be, a: be.stack([a]),
    "where": lambda be, a: be.where(a, a, a),
    "eq": lambda be, a: be.eq(a, a),
    "pad": lambda be, a: be.pad(a, (0, 0, 0, 0)),
    "pad_crop": lambda be, a: be.pad(a, (-1, 0, 0, -1)),
}


def test_views_and_copies(backend_target):
    """numpy / torch float32 inputs: the documented view ops share the input's memory on the
    backends whose arrays are the input's kind (NumPy, PyTorch CPU); no other op ever does."""
    be = backend_target
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) + 1
    host_views = be.name == "numpy" or (be.kind == "vendor" and str(getattr(be, "dev", "")) == "cpu")
    for name, fn in VIEW_OPS.items():
        y = fn(be, x)
        if host_views and isinstance(y, np.ndarray):
            assert np.shares_memory(y, x), name
    for name, fn in COPY_OPS.items():
        for kind in ("numpy", "torch"):
            a = as_kind(be, x, kind)
            y = fn(be, a)
            if isinstance(y, np.ndarray):
                assert not np.shares_memory(y, x), name
            else:
                assert y.data_ptr() != a.data_ptr() or y.numel() == 0, name
    t = torch.from_numpy(x.copy())
    if be.kind == "vendor" and str(getattr(be, "dev", "")) == "cpu":
        assert be.reshape(t, (-1,)).data_ptr() == t.data_ptr()
        assert be.slice(t, 2, 1).data_ptr() == t.data_ptr() + 4
    d = be.to_device(x)
    if be.name == "opencl":
        v = be.narrow(d, 0, 1, 1)  # one contiguous run: an offset view of the same buffer
        assert v.block is d.block and v.offset == d.offset + 12
        assert be.cat([d]).block is not d.block


# ---- argument rules: checked before any kernel ---------------------------------------------
X = np.zeros((2, 3, 4), np.float32)
BAD = [
    (lambda be: be.reshape(X, (5, -1)), "reshape", "shape", "invalid"),
    (lambda be: be.reshape(X, (-1, -1)), "reshape", "shape", "only one"),
    (lambda be: be.reshape(X, (2, -2, 6)), "reshape", "shape", ">= 0"),
    (lambda be: be.reshape(X, "big"), "reshape", "shape", "ints"),
    (lambda be: be.view(X, 7), "view", "shape", "invalid"),
    (lambda be: be.permute(X, (0, 1)), "permute", "dims", "once"),
    (lambda be: be.permute(X, (0, 1, 1)), "permute", "dims", "twice"),
    (lambda be: be.permute(X, (0, 1, 3)), "permute", "dims", "out of range"),
    (lambda be: be.transpose(X, 0, 3), "transpose", "dim1", "out of range"),
    (lambda be: be.transpose(X, 0.0, 1), "transpose", "dim0", "int"),
    (lambda be: be.expand(X, 3, 4), "expand", "size", "fewer dims"),
    (lambda be: be.expand(X, 2, 5, 4), "expand", "size", "cannot expand"),
    (lambda be: be.expand(X, -1, 2, 3, 4), "expand", "size", "leading"),
    (lambda be: be.broadcast_to(X, (2, 3, -2)), "broadcast_to", "size", "cannot expand"),
    (lambda be: be.narrow(X, 1, 2, 2), "narrow", "length", "start + length"),
    (lambda be: be.narrow(X, 1, 4, 0), "narrow", "start", "[-3, 3]"),
    (lambda be: be.narrow(X, 3, 0, 1), "narrow", "dim", "out of range"),
    (lambda be: be.narrow(X, 0, 0, -1), "narrow", "length", ">= 0"),
    (lambda be: be.narrow(np.float32(1), 0, 0, 1), "narrow", "input", "0-d"),
    (lambda be: be.slice(X, 0, 0, 2, 0), "slice", "step", "positive"),
    (lambda be: be.slice(X, 0, 0, 2, -1), "slice", "step", "positive"),
    (lambda be: be.slice(X, 0, 0.5), "slice", "start", "int"),
    (lambda be: be.slice(X, -4), "slice", "dim", "out of range"),
    (lambda be: be.split(X, 0), "split", "split_size_or_sections", "positive"),
    (lambda be: be.split(X, [1, 2]), "split", "split_size_or_sections", "sum"),
    (lambda be: be.split(X, [3, -1]), "split", "split_size_or_sections", "ints"),
    (lambda be: be.chunk(X, 0), "chunk", "chunks", "positive"),
    (lambda be: be.cat([]), "cat", "tensors", "non-empty"),
    (lambda be: be.cat(X), "cat", "tensors", "sequence"),
    (lambda be: be.cat([X, X[:, :2, :1]], 1), "cat", "tensors[1]", "every dim but"),
    (lambda be: be.cat([X, X], 3), "cat", "dim", "out of range"),
    (lambda be: be.cat([np.float32(1), np.float32(2)]), "cat", "tensors[0]", "0-d"),
    (lambda be: be.cat([X, "x"]), "cat", "tensors[1]", "NumPy array"),
    (lambda be: be.stack([X, X[:1]]), "stack", "tensors[1]", "shape"),
    (lambda be: be.stack([X, X], 4), "stack", "dim", "out of range"),
    (lambda be: be.where(X, X, np.zeros((5,), np.float32)), "where", "other", "broadcast"),
    (lambda be: be.where(np.zeros((3,)), X, X), "where", "input", "broadcast"),
    (lambda be: be.where(X, "a", X), "where", "input", "NumPy array"),
    (lambda be: be.eq(X, np.zeros((5,))), "eq", "other", "broadcast"),
    (lambda be: be.gt(1.0, 2.0), "gt", "input", "tensor"),
    (lambda be: be.compare("cmp", X, X), "compare", "op", "unknown comparison"),
    (lambda be: be.pad(X, (-3, -2)), "pad", "pad", "crops"),
    (lambda be: be.pad(X, (0, -4), "reflect"), "pad", "pad", "empty output"),
    (lambda be: be.pad(X, (-4, 0), "replicate"), "pad", "pad", "empty output"),
    (lambda be: be.pad(X, (3, -2), "circular"), "pad", "pad", "wraps"),
    (lambda be: be.pad(X, (-5, 1), "circular"), "pad", "pad", "crops"),
    (lambda be: be.pad(X, (4, -1), "reflect"), "pad", "pad", "reflect padding"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments(backend_target, monkeypatch, case):
    refused_before_kernels(backend_target, monkeypatch, BAD[case],
                           ("_slice", "_cat", "_where", "_binary", "_pad", "_permute", "_expand", "_reshape",
                            "_contiguous"))


# ---- no host round trip ----------------------------------------------------------------------
def test_device_residency(backend_target):
    """On a device backend, device inputs stay there: no downloads, no uploads but constants."""
    be = backend_target
    if be.host_memory:
        pytest.skip("native arrays are host memory: nothing moves")
    rng = np.random.default_rng(10)
    d = be.to_device(data(rng, (3, 4, 5)))
    c = be.to_device((rng.uniform(size=(3, 4, 5)) > 0.5).astype(np.float32))
    be.reset_transfers()
    ys = [be.reshape(d, (12, 5)), be.permute(d, (2, 1, 0)), be.transpose(d, 0, 1), be.expand(d, 2, 3, 4, 5),
          be.narrow(d, 1, 1, 2), be.slice(d, 2, 0, None, 2), be.cat([d, d], -1), be.stack([d, d]),
          *be.split(d, 2, 1), *be.chunk(d, 2), be.contiguous(d), be.where(c, d, d),
          be.where(c, d, 0.0), be.eq(d, d), be.lt(d, 0.5), be.pad(d, (-1, 2, 1, -1), "reflect")]
    t = be.transfers()
    assert t["downloads"] == 0 and t["uploads"] == 0, t
    assert all(not isinstance(y, np.ndarray) for y in ys)
    # the losses read the integer targets on the host; the input stays on the device
    x = be.to_device(data(rng, (4, 5), special=False))
    be.reset_transfers()
    be.cross_entropy(x, np.array([0, 1, 2, 3]), label_smoothing=0.1)
    be.batch_norm(x, None, None, training=True)
    assert be.transfers()["downloads"] == 0


# ---- property: slicing, splitting and joining agree with torch on any shape ------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HYP = settings(max_examples=int(__import__("os").environ.get("ANYDEVICE_HYPOTHESIS_EXAMPLES", "25")),
               deadline=None, derandomize=True, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@HYP
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), dim=st.integers(-4, 3),
       start=st.none() | st.integers(-7, 7), stop=st.none() | st.integers(-7, 7), step=st.integers(1, 4),
       pieces=st.integers(1, 4))
def test_slice_split_cat_property(backend_target, shape, dim, start, stop, step, pieces):
    be = backend_target
    shape = tuple(shape)
    dim = dim % len(shape)
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 3.5
    t = torch.from_numpy(x)
    d = be.to_device(x)
    idx = (slice(None),) * dim + (slice(start, stop, step),)
    same(be, be.slice(d, dim, start, stop, step), t[idx])
    parts = be.chunk(d, pieces, dim)
    refs = t.chunk(pieces, dim)
    assert len(parts) == len(refs)
    for p, r in zip(parts, refs):
        same(be, p, r)
    same(be, be.cat(list(parts), dim), t)
    same(be, be.stack(list(parts[:1]) * 2, -1), torch.stack([refs[0]] * 2, -1))
    perm = tuple(reversed(range(len(shape))))
    same(be, be.reshape(be.permute(d, perm), (-1,)), t.permute(perm).reshape(-1))
