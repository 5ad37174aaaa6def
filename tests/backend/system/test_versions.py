"""backend/system/versions.py: the one "did this tensor change" key (device copies of node values, compiled
models' weights), exact past 2**24 elements, and cheap inside a trusted epoch."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from anydevice.backend.system import versions  # noqa: E402
from anydevice.backend.compile import version_of  # noqa: E402
from anydevice.nodes.base import resident  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 2**24 - 1, 2**24 + 1, 2560 * 1280 * 9])
def test_sample_indices_are_exact_in_int64(n):
    idx = versions.sample_indices(n)
    k = min(64, n)
    assert idx.dtype == torch.int64 and idx.numel() == k
    assert int(idx[0]) == 0 and int(idx[-1]) == n - 1
    assert bool((idx[1:] >= idx[:-1]).all()) and int(idx.max()) < n
    if k > 1:
        assert idx.tolist() == [i * (n - 1) // (k - 1) for i in range(k)]


def test_inference_tensor_past_2_24_elements():
    """The SD1.5 UNet's output_blocks.0.0.in_layers.2.weight (29,491,200 elements) made under
    inference mode: the float32 linspace index used to round n - 1 up to n (IndexError)."""
    with torch.inference_mode():
        t = torch.zeros(2560 * 1280 * 9)
        v0 = version_of(t)
        assert v0 == resident.version_of(t) and v0[:3] == (t.data_ptr(), (2560 * 1280 * 9,), torch.float32)
        t[-1] = 1.0  # the last element is sampled
        v1 = version_of(t)
        t.mul_(3)
        v2 = version_of(t)
    assert len({v0, v1, v2}) == 3


def test_image_4096_inference_tensor():
    with torch.inference_mode():
        img = torch.rand(1, 4096, 4096, 3)
        v = resident.version_of(img)
        img.add_(1)
        assert resident.version_of(img) != v


def test_ordinary_tensor_uses_its_version_counter(monkeypatch):
    calls = []
    monkeypatch.setattr(versions, "fingerprint", lambda t: calls.append(1) or ())
    t = torch.zeros(10)
    v = versions.tensor_version(t)
    t.add_(1)
    assert versions.tensor_version(t) != v and calls == []


def test_trusted_epoch_reads_each_tensor_once(monkeypatch):
    real = versions.fingerprint
    calls = []
    monkeypatch.setattr(versions, "fingerprint", lambda t: calls.append(id(t)) or real(t))
    with torch.inference_mode():
        a, b = torch.ones(1000), torch.ones(50)
    versions.tensor_version(a)
    versions.tensor_version(a)
    assert len(calls) == 2  # no epoch: read each time
    calls.clear()
    with versions.trusted("e1"):
        k1 = versions.tensor_version(a)
        assert versions.tensor_version(a) == k1 and versions.tensor_version(b)
        assert sorted(calls) == sorted([id(a), id(b)])
    assert versions.current_epoch() is None
    calls.clear()
    with torch.inference_mode():
        a.mul_(2)  # written in place: the caller changes the epoch
    with versions.trusted("e2"):
        assert versions.tensor_version(a) != k1 and calls == [id(a)]


def test_memo_forgets_collected_tensors():
    import gc
    with torch.inference_mode():
        t = torch.ones(100)
    with versions.trusted("e"):
        versions.tensor_version(t)
    tid = id(t)
    assert tid in versions._memo
    del t
    gc.collect()
    assert tid not in versions._memo
