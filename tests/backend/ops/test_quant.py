"""Quantized weight formats on the host (backend/ops/quant.py) against their references: the ``gguf``
package's quantizers and NumPy dequantizer (byte for byte and value for value) and torch's float8
dtypes (all 256 bit patterns)."""
import numpy as np
import pytest

from anydevice.backend.ops import quant
from anydevice.backend.system.errors import AnyDeviceError

GGUF_FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]


def _sample(shape, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    a.reshape(-1)[:32] = 0.0  # an all-zero block: d = 0
    a.reshape(-1)[32:64] *= 1e4  # a block of large values
    return a


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
@pytest.mark.parametrize("shape", [(64, 96), (8, 4, 3, 3), (3, 320)])
def test_gguf_blocks_match_the_gguf_package(fmt, shape):
    gguf = pytest.importorskip("gguf", reason="the gguf package (PyPI) is the reference")
    a = _sample(shape)
    q = quant.quantize(a, fmt)
    t = getattr(gguf.GGMLQuantizationType, fmt.upper())
    assert q.data.size == quant.FORMATS[fmt].nbytes(a.size) == q.nbytes
    flat = a.reshape(-1, 32)
    ref = gguf.quants.quantize(flat, t).reshape(-1)
    np.testing.assert_array_equal(q.data, ref)
    deq = gguf.quants.dequantize(q.data.reshape(flat.shape[0], -1), t).reshape(shape)
    np.testing.assert_array_equal(q.dequantize(), deq)
    assert q.dequantize().dtype == np.float32
    # the quantization error is what the format allows: half a step of the block's scale
    err = np.abs(q.dequantize() - a).reshape(-1, 32).max(axis=1)
    span = np.abs(a).reshape(-1, 32).max(axis=1)
    bits = 8 if fmt == "q8_0" else 4 if fmt.startswith("q4") else 5
    assert (err <= span / (2 ** (bits - 1) - 1) * 1.01 + 1e-6).all()


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_decoding_matches_torch_on_every_bit_pattern(fmt):
    torch = pytest.importorskip("torch")
    bits = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(bits.copy()).view(getattr(torch, fmt)).float().numpy()
    got = quant.fp8_decode(fmt, bits)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[~np.isnan(got)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "int8"])
def test_scaled_formats(fmt):
    torch = pytest.importorskip("torch")
    a = _sample((48, 40), 1)
    q = quant.quantize(a, fmt)
    if fmt == "int8":
        assert q.scale.shape == (48,) and q.rowlen == 40
        ref = q.data.view(np.int8).reshape(a.shape).astype(np.float64) * q.scale[:, None]
        assert np.abs(q.dequantize() - a).max() <= np.abs(a).max() / 127 / 2 * 1.01
    else:
        assert q.scale.shape == (1,) and q.rowlen == a.size
        ref = torch.from_numpy(q.data.copy()).view(getattr(torch, fmt)).double().numpy().reshape(a.shape) * q.scale[0]
        # torch's own rounding to the format (nearest even) gives the same bits
        tbits = torch.from_numpy(a / q.scale[0]).to(getattr(torch, fmt)).view(torch.uint8).numpy().reshape(-1)
        np.testing.assert_array_equal(q.data, tbits)
    np.testing.assert_allclose(q.dequantize(), ref.astype(np.float32), rtol=0, atol=0)


def test_bad_input_names_what_is_wrong():
    with pytest.raises(AnyDeviceError, match="not a multiple of q8_0's block of 32"):
        quant.quantize(np.ones((3, 5), np.float32), "q8_0")
    with pytest.raises(AnyDeviceError, match="is not one of"):
        quant.quantize(np.ones((32,), np.float32), "q3_x")
    with pytest.raises(AnyDeviceError, match="Inf or NaN"):
        quant.quantize(np.full((32,), np.inf, np.float32), "q4_0")
    with pytest.raises(AnyDeviceError, match="needs 34 bytes"):
        quant.QTensor("q8_0", (32,), np.zeros(33, np.uint8))
    q = quant.quantize(np.ones((2, 32), np.float32), "q8_0")
    assert not q.data.flags.writeable  # read-only once made
