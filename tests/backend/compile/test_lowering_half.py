"""Compiled models stored in float16 / bfloat16 (compile_module(..., dtype=)): weights, inputs and every
device op's result are stored in the dtype, each op computes in float32.

Bound (why 3x): the model run exactly (float64) on its inputs and weights rounded to the dtype is off
from the exact float32 model by e_w, what rounding them implies. A model run in half also rounds each op's
result: an error of the same kind and size at every layer, so its total error is a small multiple of e_w;
3x e_w is the bar (measured: 1.7x for both dtypes, the same error as PyTorch's own float16/bfloat16 run of
the model on the host, which is too slow to be the reference at real size). Weights take half the bytes.
"""
from __future__ import annotations

import copy

import pytest
import torch

from anydevice.backend import compile as C
from anydevice.backend import get_backend
from anydevice.backend.compile.lowering import Weights

from compile_models import conv_attention_model

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _model():
    return conv_attention_model(0)


def _exact(m, x):
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", ["numpy", "opencl", "cpu", "cuda"])
def test_compiled_model_in_half(name, dtype):
    try:
        be = get_backend(name)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"backend {name} unavailable: {exc}")
    m, tdt = _model(), DTYPES[dtype]
    x = torch.randn(2, 4, 12, 12, generator=torch.Generator().manual_seed(1))
    exact = _exact(m, x)
    rounded = copy.deepcopy(m)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(tdt).float())
    e_w = float((_exact(rounded, x.to(tdt).float()) - exact).norm() / exact.norm())
    for cache in (Weights.of(be, "float32"), Weights.of(be, dtype)):  # shared per backend: only this model's
        cache.clear()
    f32 = C.compile_module(m, be)
    half = C.compile_module(m, be, dtype=dtype)
    with torch.no_grad():
        y32, y = f32(x), half(x)
    assert y.dtype == torch.float32 and y.shape == exact.shape  # returned in the traced dtype
    err = float((y.double() - exact).norm() / exact.norm())
    assert err <= 3 * e_w, f"{dtype} on {name}: error {err:.3g} > 3 x {e_w:.3g}"
    assert float((y32.double() - exact).norm() / exact.norm()) < 1e-5
    assert not half.graphs[0].stats.fallbacks, half.graphs[0].stats.fallbacks  # every op on the device
    if be.kind == "own":  # the pack's own devices store the weights in half: half the bytes
        n32, n16 = Weights.of(be, "float32").nbytes, Weights.of(be, dtype).nbytes
        assert n16 * 2 == n32 > 0


def test_compile_dtype_is_checked():
    from anydevice.backend import AnyDeviceError
    with pytest.raises(AnyDeviceError, match="dtype"):
        C.compile_module(_model(), "numpy", dtype="float64")
