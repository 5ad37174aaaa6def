"""Bad input gets one clear error (AnyDeviceError) naming the op, the argument and the value,
before any kernel runs, on every backend; and the registry never raises on probing."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice import backend
from anydevice.backend import AnyDeviceError
from anydevice.backend.system import registry

X = np.zeros((1, 4, 8, 8), np.float32)
W = np.zeros((6, 4, 3, 3), np.float32)

CASES = [
    # (call, op, arg, fragment of the reason)
    (lambda be: be.conv2d(X, W, stride=0), "conv2d", "stride", "positive"),
    (lambda be: be.conv2d(X, W, stride=(1, -2)), "conv2d", "stride", "positive"),
    (lambda be: be.conv2d(X, W, padding=-1), "conv2d", "padding", ">= 0"),
    (lambda be: be.conv2d(X, W, dilation=0), "conv2d", "dilation", "positive"),
    (lambda be: be.conv2d(X, W, padding="bogus"), "conv2d", "padding", "same"),
    (lambda be: be.conv2d(X, W, stride=2, padding="same"), "conv2d", "padding", "strided"),
    (lambda be: be.conv2d(X, np.zeros((6, 2, 3, 3), np.float32), groups=3), "conv2d", "groups", "divide"),
    (lambda be: be.conv2d(X, np.zeros((6, 3, 3, 3), np.float32)), "conv2d", "weight", "input channels"),
    (lambda be: be.conv2d(X, np.zeros((6, 4, 11, 3), np.float32)), "conv2d", "weight", "larger than the padded input"),
    (lambda be: be.conv2d(X[0, 0], W), "conv2d", "input", "4-D"),
    (lambda be: be.conv2d(X, W[0]), "conv2d", "weight", "4-D"),
    (lambda be: be.conv2d(X, W, np.zeros(5, np.float32)), "conv2d", "bias", "shape"),
    (lambda be: be.conv2d(X, W, padding=8, padding_mode="reflect"), "conv2d", "padding", "reflect"),
    (lambda be: be.conv2d(X, W, padding_mode="mirror"), "conv2d", "padding_mode", "must be one of"),
    (lambda be: be.conv2d(X, W, groups=0), "conv2d", "groups", "positive"),
    (lambda be: be.conv2d(X, W, stride=1.5), "conv2d", "stride", "int"),
    (lambda be: be.conv_transpose2d(X, np.zeros((4, 2, 3, 3), np.float32), stride=1, output_padding=1),
     "conv_transpose2d", "output_padding", "smaller"),
    (lambda be: be.conv_transpose2d(X, np.zeros((3, 2, 3, 3), np.float32)), "conv_transpose2d", "weight", "input channels"),
    (lambda be: be.conv_transpose2d(X, np.zeros((4, 2, 3, 3), np.float32), padding=-1), "conv_transpose2d", "padding", ">= 0"),
    (lambda be: be.matmul(np.zeros((3, 4)), np.zeros((5, 2))), "matmul", "other", "inner dimensions"),
    (lambda be: be.matmul(np.zeros((2, 3, 4)), np.zeros((3, 4, 2))), "matmul", "other", "broadcast"),
    (lambda be: be.matmul(np.float32(1.0), np.zeros(3)), "matmul", "input", "at least 1 dimension"),
    (lambda be: be.linear(np.zeros((2, 3)), np.zeros((4, 5))), "linear", "input", "in_features"),
    (lambda be: be.add(np.zeros((2, 3)), np.zeros((4,))), "add", "other", "broadcast"),
    (lambda be: be.sum(np.zeros((2, 3)), 2), "sum", "dim", "out of range"),
    (lambda be: be.max(np.zeros((2, 3)), (0, 0)), "max", "dim", "twice"),
    (lambda be: be.softmax(np.zeros((2, 3)), 5), "softmax", "dim", "out of range"),
    (lambda be: be.activation("swish", X), "activation", "name", "unknown activation"),
    (lambda be: be.loss("cosine", X, X), "loss", "name", "unknown loss"),
    (lambda be: be.unary("cbrt", X), "unary", "op", "unknown op"),
    (lambda be: be.elu(X, alpha="big"), "elu", "alpha", "number"),
    (lambda be: be.clamp(X), "clamp", "min", "at least one"),
    (lambda be: be.gelu(X, approximate="fast"), "gelu", "approximate", "must be one of"),
    (lambda be: be.mse_loss(np.zeros((2, 3)), np.zeros((4, 3))), "mse_loss", "target", "broadcast"),
    (lambda be: be.mse_loss(X, X, reduction="avg"), "mse_loss", "reduction", "must be one of"),
    (lambda be: be.binary_cross_entropy(X + 2, X), "binary_cross_entropy", "input", "between 0 and 1"),
    (lambda be: be.binary_cross_entropy(X, X[0]), "binary_cross_entropy", "target", "same shape"),
    (lambda be: be.ssim(X, X), "ssim", "input", "window_size"),
    (lambda be: be.psnr(X, X, data_range=0), "psnr", "data_range", "positive"),
    (lambda be: be.pad(X, (-5, -5, 0, 0)), "pad", "pad", "crops"),
    (lambda be: be.conv2d(np.zeros((1, 2, 3), np.complex64), W), "conv2d", "input", "complex"),
    (lambda be: be.conv2d("picture", W), "conv2d", "input", "NumPy array"),
    (lambda be: be.conv2d(np.zeros((2, 0, 5, 5), np.float32), np.zeros((4, 0, 3, 3), np.float32)), "conv2d", "weight", "empty"),
    (lambda be: be.conv2d(np.zeros((1, 4, 0, 5), np.float32), W, padding=1), "conv2d", "input", "empty image"),
    (lambda be: be.conv_transpose2d(np.zeros((2, 0, 4, 5), np.float32), np.zeros((0, 3, 3, 3), np.float32)),
     "conv_transpose2d", "weight", "empty"),
    (lambda be: be.linear(np.ones((3, 4), np.float32), np.ones(4, np.float32), np.ones(5, np.float32)), "linear", "bias", "broadcast"),
    (lambda be: be.unary("rsqrt", X, eps=1.0), "rsqrt", "eps", "unknown parameter"),
    (lambda be: be.var(X, 4), "var", "dim", "out of range"),
    (lambda be: be.std(X, (1, 1)), "std", "dim", "twice"),
    (lambda be: be.var(X, correction="one"), "var", "correction", "number"),
    (lambda be: be.log_softmax(X, 4), "log_softmax", "dim", "out of range"),
    (lambda be: be.log_softmax(X, None), "log_softmax", "dim", "must be an int"),
    (lambda be: be.layer_norm(X, (7,)), "layer_norm", "normalized_shape", "last dims"),
    (lambda be: be.layer_norm(X, (4, 8, 8, 8, 1)), "layer_norm", "normalized_shape", "last dims"),
    (lambda be: be.layer_norm(X, ()), "layer_norm", "normalized_shape", "non-empty"),
    (lambda be: be.layer_norm(X, 8.0), "layer_norm", "normalized_shape", "ints"),
    (lambda be: be.layer_norm(X, (8, 8), weight=np.ones(8, np.float32)), "layer_norm", "weight", "shape (8, 8)"),
    (lambda be: be.layer_norm(X, 8, bias=np.ones((8, 1), np.float32)), "layer_norm", "bias", "shape (8,)"),
    (lambda be: be.layer_norm(X, 8, eps=-1e-5), "layer_norm", "eps", ">= 0"),
    (lambda be: be.layer_norm(X, 8, eps="small"), "layer_norm", "eps", "number"),
    (lambda be: be.group_norm(X, 3), "group_norm", "num_groups", "divide"),
    (lambda be: be.group_norm(X, 0), "group_norm", "num_groups", "positive"),
    (lambda be: be.group_norm(X, 2.0), "group_norm", "num_groups", "positive int"),
    (lambda be: be.group_norm(X[0, 0, 0], 1), "group_norm", "input", "at least 2 dims"),
    (lambda be: be.group_norm(X, 2, np.ones(3, np.float32)), "group_norm", "weight", "shape (4,)"),
    (lambda be: be.group_norm(X, 2, None, np.ones((4, 1), np.float32)), "group_norm", "bias", "shape (4,)"),
    (lambda be: be.group_norm(X, 2, eps=float("inf")), "group_norm", "eps", "finite"),
    (lambda be: be.rms_norm(X, (8, 7)), "rms_norm", "normalized_shape", "last dims"),
    (lambda be: be.rms_norm(X, 8, np.ones(7, np.float32)), "rms_norm", "weight", "shape (8,)"),
    (lambda be: be.rms_norm(X, 8, eps=float("nan")), "rms_norm", "eps", "finite"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_input_gives_clear_error(backend_target, case):
    call, op, arg, fragment = CASES[case]
    with pytest.raises(AnyDeviceError) as info:
        call(backend_target)
    msg = str(info.value)
    assert msg.startswith(f"{op}: argument '{arg}' = "), msg
    assert fragment in msg, msg
    assert isinstance(info.value, ValueError)


def test_huge_result_refused_not_oom(backend_target, monkeypatch):
    monkeypatch.setenv("ANYDEVICE_MAX_TENSOR_MB", "1")
    with pytest.raises(AnyDeviceError, match="output.*over the limit"):
        backend_target.matmul(np.zeros((1024, 1), np.float32), np.zeros((1, 1024), np.float32))
    big = np.zeros((512, 1024), np.float32)  # 2 MiB: the normalisations check their output too
    for call in (lambda be: be.layer_norm(big, 1024), lambda be: be.group_norm(big, 4),
                 lambda be: be.rms_norm(big, 1024)):
        with pytest.raises(AnyDeviceError, match="output.*over the limit"):
            call(backend_target)


def test_conv_workspace_is_chunked(monkeypatch):
    """Convs whose scratch exceeds the budget run in chunks and give the same result."""
    be = backend.get_backend("numpy")
    from anydevice.backend.devices.numpy import common as numpy_backend
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 64, 64)).astype(np.float32)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    wt = rng.standard_normal((8, 4, 4, 4)).astype(np.float32)
    xc = rng.standard_normal((3, 64, 6, 6)).astype(np.float32)  # channels-last path
    wc = rng.standard_normal((8, 64, 3, 3)).astype(np.float32)
    full = (be.conv2d(x, w, padding=1), be.conv_transpose2d(x, wt, stride=2, padding=1), be.conv2d(xc, wc, padding=1))
    monkeypatch.setattr(numpy_backend, "CHUNK_BYTES", 4096)
    monkeypatch.setenv("ANYDEVICE_WORKSPACE_MB", "0.01")
    small = (be.conv2d(x, w, padding=1), be.conv_transpose2d(x, wt, stride=2, padding=1), be.conv2d(xc, wc, padding=1))
    for a, b in zip(full, small):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_list_backends_names_all_seven_with_reasons():
    infos = {i.name: i for i in backend.list_backends()}
    assert set(registry.CORE_NAMES) <= set(infos)
    for i in infos.values():
        assert i.available or i.reason, f"{i.name} unavailable without a reason"
        assert isinstance(i.priority, int)
    assert infos["numpy"].available


def test_unknown_and_unavailable_backend_by_name():
    with pytest.raises(AnyDeviceError, match="unknown backend"):
        backend.get_backend("tpu")
    with pytest.raises(AnyDeviceError, match="index"):
        backend.get_backend("numpy:x")
    unavailable = [i for i in backend.list_backends() if not i.available]
    for i in unavailable:
        with pytest.raises(AnyDeviceError, match="backend unavailable"):
            backend.get_backend(i.name)


def test_env_override_and_auto(monkeypatch):
    monkeypatch.setattr(registry.REGISTRY, "auto", None)
    monkeypatch.setenv("ANYDEVICE_BACKEND", "cpu")
    assert backend.get_backend().name == "cpu"
    monkeypatch.setattr(registry.REGISTRY, "auto", None)
    monkeypatch.delenv("ANYDEVICE_BACKEND")
    best = next(i for i in backend.list_backends() if i.available)
    # the best by priority, except that PyTorch's CUDA path goes before the own CUDA kernels
    want = "torch-cuda" if best.name == "cuda" and best.kind == "own" else best.name
    assert backend.get_backend().name == want
    monkeypatch.setattr(registry.REGISTRY, "auto", None)
    monkeypatch.setenv("ANYDEVICE_PREFER_OWN", "1")
    assert backend.get_backend().name == best.name
    monkeypatch.setattr(registry.REGISTRY, "auto", None)


def test_probe_never_raises(monkeypatch):
    """A backend module whose import or probe blows up is a backend marked unavailable."""
    bad = registry.BackendSpec("broken", 5, "broken", (("no_such_backend_module", "x"),))
    info = registry._probe_spec(bad)
    assert not info.available and "not part of this build" in info.reason

    class Boom:
        @staticmethod
        def probe(name):
            raise RuntimeError("driver exploded")
    real = registry._import
    monkeypatch.setattr(registry, "_import", lambda m: Boom if m == "boom" else real(m))
    info = registry._probe_spec(registry.BackendSpec("boom", 5, "boom", (("boom", "boom"),)))
    assert not info.available and "driver exploded" in info.reason
