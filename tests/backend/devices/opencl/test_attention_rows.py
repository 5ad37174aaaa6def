"""The OpenCL CPU family's fused attention kernels (backend/devices/opencl/attention.py): att_cpu_rows (narrow
vectors, no mask, not causal: the scores as vectors over 16 query rows; on wide vectors the value pass over the rows
too, VR, for value dims that are not a multiple of 16) against torch in float64 on head dims, query and key counts
around its 16-row groups, 4- and 8-key passes and 32- and 64-key blocks, batch broadcasts, and Inf/NaN; a mask or
causal rows take att_cpu."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from anydevice.backend.devices import opencl
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _sdpa(monkeypatch, q, k, v, width=8, **kw):
    """The backend's attention on narrow vectors (as AVX2; ``width`` 16: wide, as AVX-512), and the kernels it
    launched."""
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: width))
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k_: (launched.append(name), run(name, *a, **k_))[1])
    kw = {n: BE.to_device(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
    y = BE.to_numpy(BE.scaled_dot_product_attention(*(BE.to_device(a) for a in (q, k, v)), **kw))
    monkeypatch.setattr(BE, "_run", run)
    return np.asarray(y, np.float64), launched


def _ref(q, k, v, **kw):
    t = lambda a: torch.from_numpy(a).double() if isinstance(a, np.ndarray) else a  # noqa: E731
    return F.scaled_dot_product_attention(t(q), t(k), t(v), **{n: t(a) for n, a in kw.items()}).numpy()


@pytest.mark.parametrize("E,Ev", [(64, 64), (40, 40), (1, 1), (3, 5), (80, 80), (160, 160), (24, 7), (128, 96), (256, 256)])
@pytest.mark.parametrize("L,S", [(1, 1), (5, 7), (17, 33), (70, 83), (64, 32), (100, 200)])
def test_rows_kernel_matches_float64(monkeypatch, E, Ev, L, S):
    from anydevice.backend.devices.opencl import attention
    monkeypatch.setattr(attention, "ROWS_MIN_L", 1)  # the kernel on any row count (the backend takes it from 8)
    rng = np.random.default_rng(E * 1000 + Ev * 10 + L + S)
    q = rng.standard_normal((2, 3, L, E)).astype(np.float32)
    k = (2 * rng.standard_normal((2, 3, S, E))).astype(np.float32)  # scores of a few units: a real softmax
    v = rng.standard_normal((2, 3, S, Ev)).astype(np.float32)
    got, launched = _sdpa(monkeypatch, q, k, v)
    assert "att_cpu_rows" in launched and "att_cpu" not in launched, launched
    ref = _ref(q, k, v)
    assert got.shape == ref.shape
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("E,Ev", [(40, 40), (64, 40), (16, 24), (72, 72), (8, 56), (100, 100), (32, 8), (1, 1), (80, 80),
                                  (64, 64), (24, 7), (128, 128), (160, 160)])
@pytest.mark.parametrize("L,S", [(8, 1), (17, 33), (70, 83), (64, 64), (100, 200)])
def test_wide_rows_kernel_matches_float64(monkeypatch, E, Ev, L, S):
    """Wide vectors: att_cpu_rows (two 16-row groups a score pass) for value dims up to 128, with the value pass over
    rows (VR) where the value dim is not a multiple of 16 and has a divisor of at least 8 up to 24 (VC), in blocks of 32
    keys where those pad fewer keys than 64; att_cpu for larger value dims."""
    from anydevice.backend.devices.opencl import attention
    rng = np.random.default_rng(E * 1000 + Ev * 10 + L + S)
    q = rng.standard_normal((2, 3, L, E)).astype(np.float32)
    k = (2 * rng.standard_normal((2, 3, S, E))).astype(np.float32)
    v = rng.standard_normal((2, 3, S, Ev)).astype(np.float32)
    got, launched = _sdpa(monkeypatch, q, k, v, width=16)
    p = attention.rows_params(E, Ev, False, S)
    assert p["G2"] == 2 and bool(p.get("VR")) == (Ev in (40, 24, 72, 56, 100, 8)), p
    assert p["KB"] == (32 if S in (1, 83, 200) else 64), p  # blocks of 32 keys where they pad fewer keys than 64
    want = "att_cpu_rows" if Ev <= 128 else "att_cpu"
    assert want in launched and ({"att_cpu", "att_cpu_rows"} - {want}).pop() not in launched, launched
    ref = _ref(q, k, v)
    assert got.shape == ref.shape
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


def test_rows_kernel_batch_broadcast_and_scale(monkeypatch):
    """k and v shared by the heads' batch entries (strides 0 over the outer batch), a scale of its own."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 4, 50, 40)).astype(np.float32)
    k = rng.standard_normal((1, 4, 45, 40)).astype(np.float32)
    v = rng.standard_normal((1, 4, 45, 40)).astype(np.float32)
    got, launched = _sdpa(monkeypatch, q, k, v, scale=0.3)
    assert "att_cpu_rows" in launched, launched
    ref = _ref(q, k, v, scale=0.3)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("width,ev", [(8, 16), (16, 40)])  # (wide vectors: the value pass over rows, VR)
def test_rows_kernel_inf_nan_like_torch(monkeypatch, width, ev):
    """A NaN query value, an infinite key value (its key's scores +-inf), a -inf value and a -inf query value: NaN
    and Inf where torch has them, the other rows within the bound."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 40, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 70, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 70, ev)).astype(np.float32)
    q[0, 0, 1, 2] = np.nan
    k[0, 1, 33, 0] = np.inf
    v[0, 0, 40, 1] = -np.inf
    q[0, 1, 20, 1] = -np.inf
    got, launched = _sdpa(monkeypatch, q, k, v, width=width)
    assert "att_cpu_rows" in launched, launched
    ref = _ref(q, k, v)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    assert np.abs(got[fin] - ref[fin]).max() <= 1e-5 * np.abs(ref[fin]).max()


def test_a_mask_or_causal_rows_take_att_cpu(monkeypatch):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 33, 24)).astype(np.float32) for _ in range(3))
    m = rng.standard_normal((33, 33)).astype(np.float32)
    got, launched = _sdpa(monkeypatch, q, k, v, attn_mask=m)
    assert "att_cpu" in launched and "att_cpu_rows" not in launched, launched
    ref = _ref(q, k, v, attn_mask=m)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)
    got, launched = _sdpa(monkeypatch, q, k, v, is_causal=True)
    assert "att_cpu" in launched and "att_cpu_rows" not in launched, launched
    ref = _ref(q, k, v, is_causal=True)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("L,want", [(1, "att_cpu"), (7, "att_cpu"), (8, "att_cpu_rows"), (40, "att_cpu_rows")])
def test_few_query_rows_take_att_cpu(monkeypatch, L, want):
    """Under ROWS_MIN_L query rows att_cpu_rows' 16-row groups would be mostly padding: att_cpu takes them."""
    rng = np.random.default_rng(L)
    q = rng.standard_normal((1, 2, L, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 50, 32)).astype(np.float32) for _ in range(2))
    got, launched = _sdpa(monkeypatch, q, k, v)
    other = ({"att_cpu", "att_cpu_rows"} - {want}).pop()
    assert want in launched and other not in launched, launched
    ref = _ref(q, k, v)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("step", [0.5, -0.5, 3.0])
def test_rows_kernel_moving_max(monkeypatch, step, width):
    """Scores that rise (or fall) by step a key, 16-96 a 32-key block: the running max moves every block, the rescale
    factor of the earlier blocks is tiny or underflows to 0."""
    rng = np.random.default_rng(11)
    L, S, E = 24, 150, 16
    q = np.zeros((1, 1, L, E), np.float32)
    q[..., 0] = 1.0 + 0.01 * rng.standard_normal(L)
    k = (0.01 * rng.standard_normal((1, 1, S, E))).astype(np.float32)
    k[..., 0] += step * np.arange(S) * np.sqrt(E)  # the score of key j about step * j
    v = rng.standard_normal((1, 1, S, 8)).astype(np.float32)
    got, launched = _sdpa(monkeypatch, q, k, v, width=width)
    assert "att_cpu_rows" in launched, launched
    ref = _ref(q, k, v)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)


@pytest.mark.parametrize("width", [8, 16])
def test_rows_kernel_all_minus_inf_row_like_att_cpu(monkeypatch, width):
    """A query row whose every score is -inf (a -inf query value against keys all positive there) gives zeros, as
    att_cpu and ops/attention.py's composite (the row max at least -FLT_MAX, the sum at least 1)."""
    from anydevice.backend.devices.opencl import attention
    rng = np.random.default_rng(13)
    q = rng.standard_normal((1, 1, 20, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 45, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 45, 8)).astype(np.float32)
    q[0, 0, 3, 0] = -np.inf
    k[..., 0] = np.abs(k[..., 0]) + 1.0
    rows, launched = _sdpa(monkeypatch, q, k, v, width=width)
    assert "att_cpu_rows" in launched, launched
    monkeypatch.setattr(attention, "CPU_ROWS", False)
    monkeypatch.setattr(attention, "CPU_ROWS_WIDE", False)
    old, launched = _sdpa(monkeypatch, q, k, v, width=width)
    assert "att_cpu" in launched and "att_cpu_rows" not in launched, launched
    assert np.all(rows[0, 0, 3] == 0) and np.array_equal(np.isfinite(rows), np.isfinite(old))
    others = np.arange(20) != 3
    assert np.abs(rows[0, 0, others] - old[0, 0, others]).max() <= 1e-6 * np.abs(old[0, 0, others]).max()


def test_rows_kernel_scales_q(monkeypatch):
    """The kernel's own q * scale (the ops layer passes 1.0 after scaling q itself): _attention_fused called directly."""
    monkeypatch.setattr(type(BE), "vector_width", property(lambda self: 8))
    rng = np.random.default_rng(17)
    q = rng.standard_normal((3, 40, 24)).astype(np.float32)
    k = rng.standard_normal((3, 70, 24)).astype(np.float32)
    v = rng.standard_normal((3, 70, 20)).astype(np.float32)
    launched = []
    run = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k_: (launched.append(name), run(name, *a, **k_))[1])
    y = BE._attention_fused(BE.to_device(q), BE.to_device(np.ascontiguousarray(k.transpose(0, 2, 1))), BE.to_device(v),
                            None, 0.37, False)
    got = np.asarray(BE.to_numpy(y), np.float64)
    monkeypatch.setattr(BE, "_run", run)
    assert launched == ["att_cpu_rows"], launched
    ref = _ref(q, k, v, scale=0.37)
    assert np.linalg.norm(got - ref) <= 2e-6 * np.linalg.norm(ref)
