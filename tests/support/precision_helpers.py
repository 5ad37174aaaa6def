"""The precision suite's measures (tests/conformance/test_precision.py), shared with the op tests
that hold the same bar: normwise relative error against a float64 reference, NaN/Inf positions
exact, inputs never written, the hypothesis settings.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from hypothesis import HealthCheck, settings

TOL = 1e-6
#: The PyTorch-backed backends (``kind == "vendor"``: ``cpu``, ``torch-*``) are PyTorch's vendor
#: libraries, not the pack's code, and are held to what PyTorch promises for float32 instead:
#: torch.testing's float32 tolerance (rtol 1.3e-6 per element) leaves room above 1e-6 normwise,
#: and the libraries pick their kernels by hardware. Measured on the seed convs against float64:
#: oneDNN on CPU 1.3e-7..3.9e-7 with AVX-512 but 1.3e-6..2.6e-6 with AVX2; cuDNN on an H100
#: 1.05e-6..2.1e-6 (TF32 off). The pack's own kernels keep TOL.
VENDOR_TOL = 5e-6


def tol_for(be) -> float:
    return VENDOR_TOL if be.kind == "vendor" else TOL
HYP = settings(max_examples=int(__import__("os").environ.get("ANYDEVICE_HYPOTHESIS_EXAMPLES", "25")),
               deadline=None, derandomize=True, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large])


def relerr(y, ref) -> float:
    y = np.asarray(y.detach().numpy() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
    ref = np.asarray(ref.detach().numpy() if isinstance(ref, torch.Tensor) else ref, dtype=np.float64)
    assert y.shape == ref.shape, f"shape {y.shape} != reference {ref.shape}"
    nan_y, nan_r = np.isnan(y), np.isnan(ref)
    assert (nan_y == nan_r).all(), f"NaN positions differ ({nan_y.sum()} vs reference {nan_r.sum()})"
    inf_r = np.isinf(ref)
    assert (np.isinf(y) == inf_r).all() and (y[inf_r] == ref[inf_r]).all(), "Inf positions differ"
    fin = ~(nan_r | inf_r)
    num = np.linalg.norm(y[fin] - ref[fin])
    den = np.linalg.norm(ref[fin])
    if den == 0:
        return 0.0 if num <= 1e-30 else float("inf")
    return float(num / den)


def check(y, ref, what="", tol=TOL):
    err = relerr(y, ref)
    assert err <= tol, f"{what}: normwise relative error {err:.3g} > {tol}"
    return err


def within_ulp(out, ref, tdt, slack=0.0) -> bool:
    """Half results (torch tensors) against a reference rounded to the half dtype ``tdt``: every value equal
    (Inf included, NaN where NaN) or within one ulp of the dtype (subnormals: one step), plus ``slack``."""
    fi = torch.finfo(tdt)
    close = (out - ref).abs() <= fi.eps * ref.abs() + fi.smallest_normal * fi.eps + slack
    return bool(((out == ref) | close | (out.isnan() & ref.isnan())).all())


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float32)).double()



def _snapshot(*arrays):
    return [a.clone() if isinstance(a, torch.Tensor) else a.copy() for a in arrays]


def _assert_unchanged(before, after):
    for b, a in zip(before, after):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), "an input tensor was modified"
        else:
            np.testing.assert_array_equal(a, b, err_msg="an input array was modified")


def random_mask(rng, shape, kind):
    """An attention mask of ``shape``: bool (True takes part, 60%) or additive float (30% -inf)."""
    if kind == "bool":
        return rng.random(shape) > 0.4
    mask = rng.standard_normal(shape).astype(np.float32)
    mask[rng.random(shape) < 0.3] = -np.inf
    return mask


#: attention cases (query, key, value) both the fused kernels' tests take, each file adding its long ones
ATTENTION_SHAPES = [
    ((1, 2, 7, 8), (1, 2, 7, 8), (1, 2, 7, 8)),              # L == S
    ((2, 3, 17, 16), (2, 3, 33, 16), (2, 3, 33, 8)),         # L != S, Ev != E
    ((1, 1, 45, 40), (1, 1, 29, 40), (1, 1, 29, 40)),        # head dim 40, L > S
    ((3, 19, 5), (3, 23, 5), (3, 23, 7)),                    # odd dims, 3-D
    ((1, 2, 1, 64), (1, 2, 100, 64), (1, 2, 100, 64)),       # one query
    ((1, 2, 9, 12), (1, 2, 1, 12), (1, 2, 1, 3)),            # one key (S = 1)
    ((2, 1, 6, 4), (1, 3, 10, 4), (2, 3, 10, 1)),            # broadcast batch dims, Ev = 1
]


def opencl_device():
    """(device, context, queue) on PoCL where it is there (else the first OpenCL device), or on the
    platform named like ``ANYDEVICE_TEST_OPENCL_PLATFORM``; the test is skipped, saying why, without one."""
    import pyopencl as cl
    import pytest
    try:
        devs = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as exc:
        pytest.skip(f"no OpenCL platform ({exc})")
    if not devs:
        pytest.skip("no OpenCL device")
    want = os.environ.get("ANYDEVICE_TEST_OPENCL_PLATFORM")  # e.g. "NVIDIA" on a lent GPU machine
    if want:
        devs = [d for d in devs if want.lower() in d.platform.name.lower()]
        if not devs:
            pytest.skip(f"no OpenCL platform named like ANYDEVICE_TEST_OPENCL_PLATFORM={want!r}")
    pocl = [d for d in devs if "Portable Computing Language" in d.platform.name]
    dev = (pocl or devs)[0]
    ctx = cl.Context([dev])
    return dev, ctx, cl.CommandQueue(ctx)
