"""The SD1.5 UNet at its real size (random weights, ~860 M parameters, tensors past 2**24 elements)
through what "Model on AnyDevice" installs: the guarded torch.compile(backend="anydevice") module,
one denoising step on an 8x8 latent (the weights are what is big), weights made under
``torch.inference_mode()`` as ComfyUI makes them.

The first real SD1.5 UNet crashed here (the weight fingerprint's float32 index past 2**24
elements); a tiny UNet never showed it. ComfyUI's own UNetModel through the node itself runs in
tests/nodes/models/test_compiled.py (under ComfyUI's python, where a ComfyUI checkout is found).

One backend (numpy: no kernel builds), about a minute and a half on two cores.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from anydevice.backend import compile as adc  # noqa: E402
from anydevice.backend import get_backend, list_backends
from anydevice.backend.system import versions  # noqa: E402
from anydevice.backend.bench.model_zoo import sd15_unet  # noqa: E402
from anydevice.nodes.models import compiled as mn  # noqa: E402

DEVICE = os.environ.get("ANYDEVICE_UNET_DEVICE", "numpy")  # the GPU session runs it on cuda


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def unet():
    if not any(i.name == DEVICE and i.available for i in list_backends()):
        pytest.skip(f"backend {DEVICE} is not available here")
    with torch.inference_mode():
        m = sd15_unet(seed=0)
    g = torch.Generator().manual_seed(1)
    x, c = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 77, 768, generator=g)
    ts = torch.tensor([999.0, 500.0])
    with torch.inference_mode():
        ref = m(x, ts, c)
    yield m, (x, ts, c), ref
    adc.Weights.of(get_backend(DEVICE)).clear()


def test_sd15_unet_one_step_through_the_guarded_module(unet, monkeypatch):
    m, args, ref = unet
    be = get_backend(DEVICE)
    sizes = [p.numel() for p in m.parameters()]
    assert sum(sizes) == 859_520_964 and max(sizes) == 29_491_200 > 2**24
    assert m.output_blocks[0][0].in_layers[2].weight.is_inference()
    gd = mn.guard(m, be, "Model on AnyDevice", "diffusion model", input="model")
    with torch.inference_mode():
        out = gd(*args)
    assert gd.failed is None and out.shape == (2, 4, 8, 8)
    assert rel(out, ref) < 2e-5, rel(out, ref)
    rep = adc.report(gd.compiled)
    assert rep["fallbacks"] == {} and rep["eager_fallbacks"] == 0 and rep["graphs"] == 1, rep

    # the next steps under ComfyUI's patch state (what the node's APPLY_MODEL wrapper passes): no
    # weight uploaded again, and after the first trusted step no weight read at all
    w = adc.Weights.of(be)
    uploads = w.uploads
    reads = []
    real = versions.fingerprint
    monkeypatch.setattr(versions, "fingerprint", lambda t: reads.append(t.numel()) or real(t))
    with torch.inference_mode(), versions.trusted(("comfy", "patches-A")):
        gd(*args)
        first_reads = len(reads)
        reads.clear()
        out2 = gd(*args)
    assert w.uploads == uploads and first_reads > 600 and reads == []
    assert torch.equal(out2, out)

    # a weight patch written in place (ComfyUI's copy_to_param) comes with a new patch state: seen
    big = m.output_blocks[0][0].in_layers[2].weight
    with torch.inference_mode():
        saved = big.clone()
        big.mul_(1.5)
        try:
            with versions.trusted(("comfy", "patches-B")):
                out3 = gd(*args)
            ref3 = m(*args)
        finally:
            big.copy_(saved)
    assert w.uploads == uploads + 1
    assert rel(out3, ref3) < 2e-5 and rel(out3, out) > 1e-4


def test_a_second_guard_for_the_same_module_and_backend_is_the_same(unet):
    m, _, _ = unet
    be = get_backend(DEVICE)
    a = mn.guard(m, be, "Model on AnyDevice", "diffusion model", input="model")
    assert mn.guard(m, be, "Model on AnyDevice", "diffusion model", input="model") is a
    import copy
    assert copy.deepcopy({"guards": [a]})["guards"][0] is a  # ComfyUI deep-copies model_options per clone
