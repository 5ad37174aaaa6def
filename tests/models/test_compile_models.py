"""Upscale architectures from spandrel (the library ComfyUI loads upscale models with), random
weights, through torch.compile(backend="anydevice"): against float64 eager, zero host fallbacks.
Run on numpy and opencl (the slow part is dynamo's tracing, the same for every backend)."""
from __future__ import annotations

import pytest
import torch

from anydevice.backend import compile as adc

import compile_models as cm
from compile_models import _fresh_dynamo, ref64, rel  # noqa: F401 (_fresh_dynamo: an autouse fixture)
from conftest import TARGETS

CHEAP = [t[0] for t in TARGETS if t[0] in ("numpy", "opencl", "cuda")]


@pytest.mark.parametrize("device", CHEAP)
@pytest.mark.parametrize("arch,shape", [("rrdbnet", (1, 3, 12, 10)), ("compact", (1, 3, 16, 12)),
                                        ("swinir", (1, 3, 10, 12))])
def test_spandrel_arch(arch, shape, device):
    m = getattr(cm, arch)()
    x = torch.rand(*shape)
    ref = ref64(m, x)
    c = torch.compile(m, backend="anydevice", options={"device": device})
    with torch.inference_mode():
        y = c(x)
    assert y.shape == ref.shape == (1, 3, 2 * shape[2], 2 * shape[3])
    assert rel(y, ref) <= 1e-5
    r = adc.report(c)
    assert r["fallbacks"] == {}, r
    assert r["calls"] == 1 and r["eager_fallbacks"] == 0
