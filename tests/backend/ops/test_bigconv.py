"""Big kernels (separable and FFT conv2d paths), chunked cancellable convs, huge padding / stride /
dilation without materialised padding. Reference: PyTorch float64 on the same float32 inputs,
normwise relative error <= 1e-6 (the precision suite's bar)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anydevice.backend.ops import bigconv
from anydevice.backend.system import cancel
from anydevice.nodes.compute import presets

from precision_helpers import check, t64, tol_for


def gauss(k, sigma=None):
    return presets.kernel_preset("gaussian", k, sigma or k / 6.0)


def _ref(x, w, b, stride=1, padding=0, dilation=1, groups=1, mode="zeros"):
    xt = t64(x)
    if mode != "zeros":
        ph, pw = (padding, padding) if isinstance(padding, int) else padding
        xt = F.pad(xt, (pw, pw, ph, ph), mode=mode)
        padding = 0
    return F.conv2d(xt, t64(w), None if b is None else t64(b), stride, padding, dilation, groups).numpy()


@pytest.fixture
def spy(monkeypatch):
    """Counts of the separable and FFT paths taken."""
    seen = {"sep": 0, "fft": 0}
    sep, fft = bigconv._separable, bigconv._fft_conv

    def s(*a, **k):
        seen["sep"] += 1
        return sep(*a, **k)

    def f(*a, **k):
        seen["fft"] += 1
        return fft(*a, **k)
    monkeypatch.setattr(bigconv, "_separable", s)
    monkeypatch.setattr(bigconv, "_fft_conv", f)
    return seen


SEP_CASES = [  # (x shape, k, multiplier, stride, padding, dilation, mode, kernel)
    ((1, 3, 40, 37), 15, 1, 1, 7, 1, "zeros", "gaussian"),
    ((2, 3, 33, 41), 9, 1, (1, 2), (4, 3), (2, 1), "zeros", "gaussian"),
    ((1, 2, 30, 30), 7, 2, 2, 3, 1, "reflect", "box"),
    ((1, 3, 36, 28), 11, 1, 1, 5, 1, "circular", "outer"),
    ((1, 1, 45, 45), 31, 1, 1, 15, 1, "replicate", "gaussian"),
    ((1, 3, 24, 50), 7, 1, 3, 0, 2, "zeros", "outer"),
]


@pytest.mark.parametrize("xs,k,mult,stride,padding,dilation,mode,kind", SEP_CASES,
                         ids=[f"sep{i}-{c[6]}-{c[7]}" for i, c in enumerate(SEP_CASES)])
def test_separable_vs_torch64(backend_target, spy, xs, k, mult, stride, padding, dilation, mode, kind):
    rng = np.random.default_rng(k + xs[2])
    C = xs[1]
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    if kind == "gaussian":
        k2 = gauss(k)
    elif kind == "box":
        k2 = presets.kernel_preset("box_blur", k)
    else:  # any outer product, signs mixed
        k2 = np.outer(rng.standard_normal(k), rng.standard_normal(k)).astype(np.float32)
    w = np.stack([k2 * (1 + 0.1 * i) for i in range(C * mult)])[:, None].astype(np.float32)
    b = rng.uniform(-1, 1, C * mult).astype(np.float32)
    y = backend_target.conv2d(x, w, b, stride, padding, dilation, C, padding_mode=mode)
    check(y, _ref(x, w, b, stride, padding, dilation, C, mode), f"separable {kind} k{k}", tol_for(backend_target))
    if backend_target.kind == "own":
        assert spy["sep"] == 1


FFT_CASES = [  # (x shape, w shape, groups, stride, padding, dilation)
    ((1, 3, 48, 45), (3, 1, 25, 25), 3, 1, 12, 1),
    ((2, 2, 40, 52), (2, 1, 27, 23), 2, 2, (13, 11), 1),
    ((1, 3, 37, 41), (4, 3, 15, 15), 1, 1, 7, 1),
    ((1, 4, 44, 40), (4, 2, 17, 17), 2, (1, 2), 8, 1),
    ((1, 2, 50, 50), (2, 1, 13, 13), 2, 1, 12, 2),
    ((1, 3, 70, 40), (3, 1, 31, 31), 3, 1, 0, 1),
]


@pytest.mark.parametrize("xs,ws,groups,stride,padding,dilation", FFT_CASES,
                         ids=[f"fft{i}" for i in range(len(FFT_CASES))])
def test_fft_vs_torch64(backend_target, spy, xs, ws, groups, stride, padding, dilation):
    rng = np.random.default_rng(sum(ws) + xs[2])
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.uniform(-1, 1, ws[0]).astype(np.float32)
    y = backend_target.conv2d(x, w, b, stride, padding, dilation, groups)
    check(y, _ref(x, w, b, stride, padding, dilation, groups), f"fft {ws}", tol_for(backend_target))
    assert spy["sep"] == 0


def test_fft_taken_on_numpy(spy):
    from anydevice.backend import get_backend
    be = get_backend("numpy")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)
    w = rng.standard_normal((3, 1, 31, 31)).astype(np.float32)
    y = be.conv2d(x, w, None, 1, 15, 1, 3)
    assert spy["fft"] == 1
    check(y, _ref(x, w, None, 1, 15, 1, 3), "numpy fft")


def test_rank1_detection():
    assert bigconv.rank1_factors(gauss(63).astype(np.float64)[None]) is not None
    assert bigconv.rank1_factors(presets.kernel_preset("box_blur", 31).astype(np.float64)[None]) is not None
    assert bigconv.rank1_factors(np.zeros((1, 5, 5))) is not None
    rng = np.random.default_rng(1)
    assert bigconv.rank1_factors(rng.standard_normal((1, 15, 15))) is None
    near = gauss(15).astype(np.float64)
    near[3, 4] += 1e-4
    assert bigconv.rank1_factors(near[None]) is None


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_input_keeps_torch_semantics(backend_target, bad):
    x = np.ones((1, 3, 30, 30), np.float32)
    x[0, 1, 10, 12] = bad
    for w in (np.broadcast_to(gauss(15), (3, 1, 15, 15)).copy(),
              np.random.default_rng(2).standard_normal((3, 1, 25, 25)).astype(np.float32)):
        check(backend_target.conv2d(x, w, None, 1, 7, 1, 3), _ref(x, w, None, 1, 7, 1, 3), "non-finite",
              tol_for(backend_target))


# ---- chunks and cancellation -------------------------------------------------------------------
@pytest.fixture
def tiny_chunks(monkeypatch):
    """Every conv counts as long: chunks of a few rows (a GPU's modelled rate too)."""
    monkeypatch.setattr(cancel, "CHUNK_SECONDS", 1e-6)
    from anydevice.backend.devices.numpy import NumpyBackend
    monkeypatch.setattr(bigconv, "DEFAULT_MACS_PER_S", NumpyBackend.caps.macs_per_s)
    yield
    cancel.set_checker(None)
    cancel.set_progress(None)


CHUNK_CASES = [  # (x shape, w shape, groups, stride, padding, dilation)
    ((2, 3, 19, 23), (4, 3, 3, 3), 1, 1, 1, 1),
    ((1, 2, 21, 17), (2, 1, 5, 5), 2, 2, 2, 1),
    ((1, 3, 25, 20), (6, 3, 3, 4), 1, (2, 1), (3, 1), (2, 1)),
    ((3, 4, 9, 9), (4, 2, 3, 3), 2, 1, 0, 1),
]


@pytest.mark.parametrize("xs,ws,groups,stride,padding,dilation", CHUNK_CASES,
                         ids=[f"chunk{i}" for i in range(len(CHUNK_CASES))])
def test_chunked_conv_matches(backend_target, tiny_chunks, xs, ws, groups, stride, padding, dilation):
    rng = np.random.default_rng(sum(xs))
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = rng.uniform(-1, 1, ws).astype(np.float32)
    b = rng.uniform(-1, 1, ws[0]).astype(np.float32)
    seen = []
    cancel.set_progress(lambda d, t: seen.append((d, t)))
    y = backend_target.conv2d(x, w, b, stride, padding, dilation, groups)
    check(y, _ref(x, w, b, stride, padding, dilation, groups), "chunked conv2d", tol_for(backend_target))
    assert len(seen) > 1


class _Stop(Exception):
    pass


def _raise_after(k):
    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] > k:
            raise _Stop
    return fn, calls


@pytest.mark.parametrize("what", ["direct", "separable", "fft", "transpose"])
def test_checker_stops_long_op(backend_target, tiny_chunks, what):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (3, 3, 40, 40)).astype(np.float32)
    fn, calls = _raise_after(3)
    cancel.set_checker(fn)
    with pytest.raises(_Stop):
        if what == "direct":
            backend_target.conv2d(x, rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32), None, 1, 1)
        elif what == "separable":
            backend_target.conv2d(x, np.broadcast_to(gauss(9), (3, 1, 9, 9)).copy(), None, 1, 4, 1, 3)
        elif what == "fft":
            backend_target.conv2d(x, rng.standard_normal((3, 1, 25, 25)).astype(np.float32), None, 1, 12, 1, 3)
        else:
            backend_target.conv_transpose2d(np.concatenate([x, x]), rng.uniform(-1, 1, (3, 2, 3, 3)).astype(np.float32), None, 2, 1)
    assert 4 <= calls["n"] <= 4 + 2  # stopped at the first check after k chunks (FFT: one per busy worker)
    cancel.set_checker(None)


def test_no_checker_is_harmless():
    cancel.set_checker(None)
    cancel.check()
    assert list(cancel.chunks(5, 2)) == [(0, 2), (2, 4), (4, 5)]


# ---- chunks sized by elapsed time; a check in every stretch --------------------------------------
def test_sizer_halves_by_elapsed_time_and_grows_back_to_its_measured_size():
    s = cancel.Sizer(10, seconds=0.2)
    assert s.update(10, 0.05) == 40  # the probe: sized from the first chunk's rate
    assert s.update(40, 0.8) == 10  # 4x too slow (a CPU-heavy process started): halved twice
    assert s.update(10, 0.21) == 5
    assert s.update(5, 0.01) == 10  # fast again: doubled back, one step a chunk,
    assert s.update(10, 0.001) == 20
    assert s.update(20, 0.001) == 40
    assert s.update(40, 0.001) == 40  # never above the probe's size (few launch sizes)
    s = cancel.Sizer(10, seconds=0.2)
    assert s.update(10, 1e-6) == 10 * cancel.Sizer.MAX_GROWTH  # the probe extrapolates a little only
    s = cancel.Sizer(8, seconds=0.2, probe=False)
    assert s.update(8, 0.01) == 8  # without a probe the first size is the largest
    assert s.update(8, 1.0) == 1


def test_timed_chunks_shrink_when_a_chunk_takes_too_long(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(cancel, "_clock", lambda: now[0])
    calls = []
    cancel.set_checker(lambda: calls.append(1))
    got = []
    try:
        for a, b in cancel.timed_chunks(100, 16, seconds=0.2):
            got.append((a, b))
            now[0] += 0.1 if a < 32 else 0.04 * (b - a)  # from item 32 on, 6.4x slower
    finally:
        cancel.set_checker(None)
    assert got[:4] == [(0, 16), (16, 32), (32, 48), (48, 52)]  # 16 items took 0.64 s: 4 a chunk
    assert all(b - a == 4 for a, b in got[3:])
    assert [i for a, b in got for i in range(a, b)] == list(range(100))
    assert len(calls) == len(got) - 1  # a check before every chunk but the first


def test_run_parallel_raises_the_cancel_and_ends_the_sibling_tasks():
    """A task's check raises (and, as ComfyUI's, clears the flag): run_parallel raises it at once; the
    tasks running beside it end at their next check (Abandoned, not raised to the caller) and the
    tasks not started never start."""
    import threading
    import time
    from anydevice.backend.system import threads
    flag = threading.Event()

    def checker():
        if flag.is_set():
            flag.clear()
            raise _Stop
    started, finished = [], []

    def task(i):
        started.append(i)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            cancel.check()
            time.sleep(0.001)
        finished.append(i)
    cancel.set_checker(checker)
    timer = threading.Timer(0.1, flag.set)
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(_Stop):
            threads.run_parallel(task, range(8))
    finally:
        cancel.set_checker(None)
        timer.cancel()
    assert time.monotonic() - t0 < 2.0
    assert not finished and len(started) < 8


def _check_sites(monkeypatch):
    """Names of the functions that called cancel.check() (through the checker)."""
    import sys
    sites = []

    def checker():
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.endswith("cancel.py"):
            f = f.f_back
        sites.append(f.f_code.co_name if f is not None else "?")
    cancel.set_checker(checker)
    return sites


def test_fft_path_checks_in_every_stretch(backend_target, spy, monkeypatch):
    """The finiteness check, the download of the input, each pool task and the upload of the result
    are cut into chunks with a check between them (a 4096x4096 batch held each for seconds)."""
    monkeypatch.setattr(bigconv, "CHUNK_ELEMS", 200)  # a few rows of 64
    sites = _check_sites(monkeypatch)
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (2, 3, 40, 64)).astype(np.float32)
    w = rng.standard_normal((3, 1, 25, 25)).astype(np.float32)
    try:
        backend_target.conv2d(x, w, None, 1, 12, 1, 3)
    finally:
        cancel.set_checker(None)
    if not spy["fft"]:
        pytest.skip(f"{backend_target!r} does not take the FFT path")
    assert sites.count("_finite") + sites.count("<genexpr>") > 3
    assert sites.count("task") >= 2 * 3 * 4  # every group's task, before each of its stages
    if backend_target.name != "numpy":  # a device backend: the transfers too
        assert sites.count("_host_image") > 3 and sites.count("put") > 3


def test_chunks_do_not_change_the_numbers(backend_target, monkeypatch):
    """The same inputs give the same bits however the transfers and checks are cut (the FFT bands
    depend on the shapes only)."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (2, 3, 70, 64)).astype(np.float32)
    w = rng.standard_normal((3, 1, 31, 31)).astype(np.float32)
    b = rng.uniform(-1, 1, 3).astype(np.float32)
    y0 = np.array(backend_target.to_numpy(backend_target.conv2d(x, w, b, 1, 15, 1, 3)))
    monkeypatch.setattr(bigconv, "CHUNK_ELEMS", 100)
    y1 = np.array(backend_target.to_numpy(backend_target.conv2d(x, w, b, 1, 15, 1, 3)))
    assert y0.view(np.uint32).tolist() == y1.view(np.uint32).tolist()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_found_in_a_late_chunk(backend_target, monkeypatch, bad):
    monkeypatch.setattr(bigconv, "CHUNK_ELEMS", 64)
    x = np.ones((2, 3, 30, 30), np.float32)
    x[1, 2, 29, 29] = bad
    w = np.random.default_rng(2).standard_normal((3, 1, 25, 25)).astype(np.float32)
    check(backend_target.conv2d(x, w, None, 1, 7, 1, 3), _ref(x, w, None, 1, 7, 1, 3), "non-finite",
          tol_for(backend_target))


# ---- huge padding / stride / dilation: only what the output needs --------------------------------
def test_huge_padding_stride(backend_target):
    one = np.ones((1, 1, 1, 1), np.float32)
    y = backend_target.conv2d(one, one, None, stride=60000, padding=30000)
    ref = F.conv2d(t64(one), t64(one), None, 60000, 30000).numpy()
    assert np.asarray(y).shape == ref.shape == (1, 1, 2, 2)
    check(y, ref, "huge padding")


def test_huge_transpose_stride(backend_target):
    x = np.ones((1, 1, 2, 2), np.float32)
    w = np.ones((1, 1, 1, 1), np.float32)
    y = backend_target.conv_transpose2d(x, w, None, stride=60000, padding=29999)
    ref = F.conv_transpose2d(t64(x), t64(w), None, 60000, 29999).numpy()
    assert ref.shape == (1, 1, 3, 3)
    check(y, ref, "huge transpose stride")


def test_huge_dilation(backend_target):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (1, 2, 5, 6)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 2, 3, 2)).astype(np.float32)
    y = backend_target.conv2d(x, w, None, stride=1, padding=(50000, 40000), dilation=(50000, 40000))
    ref = F.conv2d(t64(x), t64(w), None, 1, (50000, 40000), (50000, 40000)).numpy()
    check(y, ref, "huge dilation")
    wt = rng.uniform(-1, 1, (2, 3, 2, 2)).astype(np.float32)
    y = backend_target.conv_transpose2d(x, wt, None, stride=1, padding=15000, dilation=30000)
    ref = F.conv_transpose2d(t64(x), t64(wt), None, 1, 15000, dilation=30000).numpy()
    check(y, ref, "huge transpose dilation")


def test_node_registers_comfyuis_interrupt_check(monkeypatch, tiny_chunks):
    """Inside ComfyUI (faked here) a node's run registers comfy.model_management's interrupt check,
    and a long conv in the node stops at the next chunk once it raises."""
    import sys
    import types
    import torch as _torch
    from anydevice.nodes import NODE_CLASS_MAPPINGS

    class Interrupted(Exception):
        pass
    state = {"calls": 0}

    def throw():
        state["calls"] += 1
        if state["calls"] > 2:
            raise Interrupted
    mm = types.ModuleType("comfy.model_management")
    mm.throw_exception_if_processing_interrupted = throw
    monkeypatch.setitem(sys.modules, "comfy", types.ModuleType("comfy"))
    monkeypatch.setitem(sys.modules, "comfy.model_management", mm)
    node = NODE_CLASS_MAPPINGS["AnyDeviceConv2D"]()
    img = _torch.rand(1, 48, 40, 3)
    with pytest.raises(Interrupted):
        node.run(input=img, kernel_source="random", kernel_size=15, init_seed=1, channel_mode="depthwise",
                 padding="same", padding_mode="zeros", device="numpy")
    assert cancel.get_checker() is throw and state["calls"] == 3
    assert cancel._progress is None  # the node's chunk progress is removed after its run


def test_winograd_devices_estimate_3x3_convs_by_their_multiplies():
    """A device with "winograd" runs 3x3 stride-1 convs with 2.25x fewer multiplies: bigconv's time estimate
    (which decides whether a conv is cut into cancel chunks) divides by that, for those geometries only."""
    from types import SimpleNamespace
    from anydevice.backend.ops.plans import conv2d_geometry
    plain = SimpleNamespace(caps=SimpleNamespace(fused=frozenset(), macs_per_s=(1e9, 1e10)))
    wino = SimpleNamespace(caps=SimpleNamespace(fused=frozenset({"winograd"}), macs_per_s=(1e9, 1e10)))
    g3 = conv2d_geometry((1, 1280, 32, 32), (1280, 1280, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    macs = 32 * 32 * 1280 * 1280 * 9
    assert bigconv._seconds(plain, macs, g3) == pytest.approx(macs / 1e10)
    assert bigconv._seconds(wino, macs, g3) == pytest.approx(macs / 1e10 / 2.25)
    for shape, stride, groups in [((1280, 1280, 3, 3), (2, 2), 1), ((1280, 1280, 1, 1), (1, 1), 1),
                                  ((1280, 1, 3, 3), (1, 1), 1280)]:
        g = conv2d_geometry((1, 1280, 32, 32), shape, stride, (1, 1, 1, 1), (1, 1), groups)
        assert bigconv._seconds(wino, macs, g) == bigconv._seconds(plain, macs, g)
    assert bigconv._seconds(wino, macs, g3, transposed=True) == bigconv._seconds(plain, macs, g3)
