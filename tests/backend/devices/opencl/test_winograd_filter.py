"""wino_filter (kernels/winograd_cpu.cl): U = G g Gt of every (output, input) channel pair, written as gemm_cpu's
packed-A panels [alpha][panel][Cin][MR], against float64 for every panel height MR the GEMM tunables give (one vector
of 4, 8 or 16 lanes per MR, the valid lanes stored), with a partial last panel, weights stored in half or quantized
(converted as read: the transform of the float32 values), and the Inf/NaN flag."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import dtypes, quant

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import winograd
    from anydevice.backend.devices.opencl.params import PACK_K
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])


def _panels(w64, mr):
    """The float64 U of w (Cout, Cin, 3, 3) in wino_filter's layout, (16, panels * Cin * MR), zero rows past Cout."""
    cout, cin = w64.shape[:2]
    u = np.einsum("ak,oikl,bl->aboi", G, w64, G).reshape(16, cout, cin)
    mt = -(-cout // mr)
    pad = np.zeros((16, mt * mr, cin))
    pad[:, :cout] = u
    return pad.reshape(16, mt, mr, cin).transpose(0, 1, 3, 2).reshape(16, -1)


def _filter(w, cout, cin, mr, c0=0):
    flag = BE._empty((1,))
    BE._q_fill(flag.buffer, np.int32(0), 0, 4)
    params = {"MR": mr, "MSUB": 4, "PK": PACK_K, "OB": winograd.WINO_OB}
    up = BE._wino_u(w, c0, cout, cin, mr, params, flag)
    return BE.to_numpy(up).reshape(16, -1), int(BE.to_numpy(flag).view(np.int32)[0])


@pytest.mark.parametrize("mr", [1, 2, 3, 4, 5, 6, 7, 8, 12, 14, 16])
@pytest.mark.parametrize("cout,cin", [(48, 70), (37, 130), (6, 3), (1, 200)])
def test_filter_panels_match_float64(mr, cout, cin):
    rng = np.random.default_rng(mr * 1000 + cout + cin)
    w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
    u, bad = _filter(BE.to_device(w), cout, cin, mr)
    ref = _panels(w.astype(np.float64), mr)
    assert u.shape == ref.shape
    assert np.abs(u - ref).max() <= 2e-7 * max(1.0, np.abs(ref).max())
    assert bad == 0


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "q8_0", "q4_0"])
@pytest.mark.parametrize("mr", [4, 6, 8])
def test_compressed_weight_is_the_transform_of_its_values(kind, mr):
    rng = np.random.default_rng(21)
    w = rng.standard_normal((40, 64, 3, 3)).astype(np.float32)
    if kind in quant.FORMATS:
        q = quant.quantize(w.reshape(40, -1), kind)
        wd, wf = BE.reshape(BE.to_device_quant(q), (40, 64, 3, 3)), q.dequantize().reshape(w.shape)
    else:
        wd, wf = BE.to_device(w, dtype=kind), dtypes.round_to(w, kind)
    u, bad = _filter(wd, 40, 64, mr)
    np.testing.assert_array_equal(u, _filter(BE.to_device(wf), 40, 64, mr)[0])
    assert bad == 0


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("mr", [6, 8])
def test_inf_or_nan_weight_sets_the_flag(value, mr):
    rng = np.random.default_rng(22)
    w = rng.standard_normal((13, 20, 3, 3)).astype(np.float32)
    w[12, 19, 2, 1] = value  # in the last, partial panel
    assert _filter(BE.to_device(w), 13, 20, mr)[1] != 0
