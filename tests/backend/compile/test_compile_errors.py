"""What a user sees when a compiled model goes wrong: errors naming the node, the op and the shapes
(never a bare exception on the sampler), eager fallbacks said once, cancel within a fraction of a
second inside a long graph, and a report per compiled model."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
import torch.nn as nn

from anydevice.backend.system import cancel
from anydevice.backend import get_backend
from anydevice.backend import compile as adc
from anydevice.nodes.models import compiled as mn
from anydevice.nodes.base.common import NodeError

from compile_models import _fresh_dynamo, ref64, rel  # noqa: F401 (_fresh_dynamo: an autouse fixture)


@pytest.fixture(autouse=True)
def _fallback_logs_as_before():
    """The fallbacks these tests cause (cumsum, erfcx) are logged once per process: leave that record
    as it was, so a later test still sees its own first log line."""
    import importlib
    report = importlib.import_module("anydevice.backend.compile.report")  # (compile.report is a function)
    logged = set(report._logged)
    yield
    report._logged.clear()
    report._logged.update(logged)


class _Boom(nn.Module):
    """A host-fallback op that fails at run time (cumsum runs through PyTorch on the host)."""

    def forward(self, x):
        return torch.cumsum(x * 2.0, dim=0)


def test_error_inside_a_compiled_graph_names_node_op_and_shapes(monkeypatch):
    m = _Boom()
    g = mn.guard(m, get_backend("numpy"), "Model on AnyDevice", "diffusion model", input="model")
    with torch.inference_mode():
        assert rel(g(torch.ones(3, 2)), ref64(m, torch.ones(3, 2))) == 0
    real = torch.ops.aten.cumsum.default

    def broken(*a, **k):
        raise IndexError("index 29491200 is out of bounds for dimension 0 with size 29491200")

    from anydevice.backend.compile import lowering
    orig_host = lowering.Lowered._host

    def host(self, n, host_fn, why):
        if n.target is real:
            return broken()
        return orig_host(self, n, host_fn, why)
    monkeypatch.setattr(lowering.Lowered, "_host", host)
    with torch.inference_mode(), pytest.raises(NodeError) as ei:
        g(torch.ones(3, 2))
    msg = str(ei.value)
    assert msg.startswith("Model on AnyDevice: input 'model' = 'diffusion model': failed on the device numpy")
    assert "aten.cumsum.default" in msg and "(3, 2) float32" in msg and "IndexError" in msg, msg
    assert g.failed is None  # an error at run time is said, the model is not switched to eager


def test_interrupt_passes_through_unwrapped():
    class InterruptProcessingException(Exception):
        pass

    def checker():
        raise InterruptProcessingException()
    m = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    g = mn.guard(m, get_backend("numpy"), "Model on AnyDevice", "diffusion model", input="model")
    with torch.inference_mode():
        g(torch.ones(2, 64))
    from anydevice.backend.compile import lowering
    cancel.set_checker(checker)
    try:
        old, lowering.CANCEL_EVERY = lowering.CANCEL_EVERY, 0.0
        lowering._runs.next_check = 0.0  # due now
        with torch.inference_mode(), pytest.raises(InterruptProcessingException):
            g(torch.ones(2, 64))
    finally:
        lowering.CANCEL_EVERY = old
        cancel.set_checker(None)


def test_cancel_lands_within_a_second_in_a_long_graph():
    """A graph of many device ops, cancelled from another thread while it runs: it stops within about
    CANCEL_EVERY of work (checked by elapsed time, not by op count)."""
    m = nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.SiLU()) for _ in range(40)])
    c = torch.compile(m, backend="anydevice", options={"device": "numpy"})
    x = torch.randn(1, 16, 96, 96)
    with torch.inference_mode():
        c(x)
        t0 = time.monotonic()
        c(x)
        one_call = time.monotonic() - t0
    flag = threading.Event()

    class Cancelled(Exception):
        pass

    def checker():
        if flag.is_set():
            raise Cancelled()
    cancel.set_checker(checker)
    try:
        threading.Timer(min(0.3, one_call / 3), flag.set).start()
        t0 = time.monotonic()
        with torch.inference_mode(), pytest.raises(Cancelled):
            for _ in range(1000):  # bounded: each call ~one_call seconds
                c(x)
        took = time.monotonic() - t0
    finally:
        cancel.set_checker(None)
    assert took < 0.3 + 1.0 + one_call / 10, (took, one_call)


def test_eager_fallback_is_said_once_naming_the_node(caplog):
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    be = get_backend("numpy")
    g = mn.Guarded(m, torch.compile(m, backend="anydevice", options={"device": be}, dynamic=False),
                   "Upscale Model on AnyDevice", "upscale model", be.name, "upscale_model")
    caplog.set_level(logging.WARNING, logger="anydevice")
    with torch._dynamo.config.patch(recompile_limit=1), torch.inference_mode():
        for s in (5, 6, 7):
            x = torch.randn(1, 3, s, s)
            assert rel(g(x), ref64(m, x)) <= 1e-5
    said = [r.getMessage() for r in caplog.records if "ran in PyTorch (eager" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("Upscale Model on AnyDevice: the upscale model"), said


def test_report_is_per_compiled_model():
    class A(nn.Module):
        def forward(self, x):
            return torch.special.erfcx(x).cumsum(0)

    class B(nn.Module):
        def forward(self, x):
            return x * 2 + 1
    a = torch.compile(A(), backend="anydevice", options={"device": "numpy"})
    b = torch.compile(B(), backend="anydevice", options={"device": "numpy"})
    x = torch.randn(5)
    a(x)
    b(x)
    assert set(adc.report(a)["fallbacks"]) == {"aten.special_erfcx.default", "aten.cumsum.default"}
    rb = adc.report(b)
    assert rb["fallbacks"] == {} and rb["graphs"] == 1 and rb["calls"] == 1, rb


def test_switching_backends_reuses_each_backends_compiled_module():
    m = nn.Sequential(nn.Linear(8, 8), nn.GELU()).eval()
    x = torch.randn(2, 8)
    bes = [get_backend("numpy"), get_backend("cpu")]
    seen = {}
    for i in range(12):  # past dynamo's recompile limit (8) were each switch a recompile
        be = bes[i % 2]
        g = mn.guard(m, be, "Model on AnyDevice", "diffusion model", input="model")
        assert seen.setdefault(be.name, g) is g
        with torch.inference_mode():
            assert rel(g(x), ref64(m, x)) <= 1e-5
    for be in bes:
        r = adc.report(seen[be.name].compiled)
        assert r["graphs"] == 1 and r["eager_fallbacks"] == 0, (be.name, r)
