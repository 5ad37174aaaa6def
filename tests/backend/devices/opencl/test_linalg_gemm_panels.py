"""The CPU family's packed GEMM (kernels/gemm_cpu.cl) in both B panel layouts: K x 32 rows, and two K x 16
halves a panel (BH, which _gemm asks for where gemm_cpu runs in two 16-column passes, NH 2: AVX2), each
against float64 on shapes with partial row and column tiles, K past one cache block, batched operands
(B shared or per batch), a transposed B (pack_b's strided and row-by-row readers), a weight stored in
half or quantized (pack_b's converting readers) and im2col_pack's conv columns (kernels/panel_b.h), whatever the
machine's vector width; and B packed in column chunks (GEMM_B_CHUNK_BYTES) giving the whole-B bits."""
from __future__ import annotations

import numpy as np
import pytest

from anydevice.backend.ops import dtypes, quant

try:
    from anydevice.backend.devices import opencl
    from anydevice.backend.devices.opencl import linalg
    BE = opencl.create("opencl", 0, family="cpu")
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"OpenCL unavailable: {exc}", allow_module_level=True)

LAYOUTS = [(1, False), (2, False), (2, True)]  # (NH, BH)


@pytest.fixture(params=LAYOUTS, ids=lambda p: f"NH{p[0]}-{'halves' if p[1] else 'rows'}")
def layout(request, monkeypatch):
    nh, bh = request.param
    tunables = BE.tunables

    def forced(fname, shape_class=""):
        p = tunables(fname, shape_class)
        if fname == "gemm_cpu.cl":
            p = dict(p, NH=nh, MR=min(p["MR"], 6) if nh == 2 else p["MR"])  # NH 2: MR x 16 twice
        return p
    monkeypatch.setattr(BE, "tunables", forced)
    monkeypatch.setattr(linalg, "GEMM_B_HALVES", bh)
    built = []
    kernel = BE._kernel
    monkeypatch.setattr(BE, "_kernel", lambda name, params=None: (built.append((name, dict(params or {}))),
                                                                   kernel(name, params))[1])
    return nh, bh, built


def _check_layout(built, nh, bh):
    gemms = [p for name, p in built if name in ("gemm_cpu", "pack_b")]
    assert gemms and all(p.get("NH", 1) == nh and p.get("BH", 0) == int(bh) for p in gemms), built


@pytest.mark.parametrize("a_shape,b_shape", [((70, 300), (300, 45)), ((257, 513), (513, 130)), ((400, 1), (1, 300)),
                                             ((64, 1200), (1200, 96)), ((3, 40, 64), (64, 50)),
                                             ((3, 40, 64), (3, 64, 50))])
def test_matmul_matches_float64(layout, a_shape, b_shape):
    nh, bh, built = layout
    rng = np.random.default_rng(sum(a_shape) + sum(b_shape))
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    y = BE.to_numpy(BE.matmul(BE.to_device(a), BE.to_device(b)))
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 1e-5 * np.sqrt(a_shape[-1]) * max(1.0, np.abs(ref).max())
    _check_layout(built, nh, bh)


def test_transposed_b_matches_float64(layout):
    """B = w^T of a (N, K) weight: pack_b's row-by-row reader (sbk 1), and a strided view of it."""
    nh, bh, built = layout
    rng = np.random.default_rng(5)
    x = rng.standard_normal((90, 200)).astype(np.float32)
    w = rng.standard_normal((77, 200)).astype(np.float32)
    y = BE.to_numpy(BE.linear(BE.to_device(x), BE.to_device(w)))
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-5, atol=1e-4)
    _check_layout(built, nh, bh)


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "q8_0", "q4_0"])
def test_compressed_weight_is_its_float32_product(layout, kind):
    """pack_b's converting readers (a half or quantized row) write the same panel positions as the float32 one."""
    nh, bh, built = layout
    rng = np.random.default_rng(9)
    x = rng.standard_normal((60, 320)).astype(np.float32)
    w = rng.standard_normal((130, 320)).astype(np.float32)
    if kind in quant.FORMATS:
        q = quant.quantize(w, kind)
        wd, wf = BE.to_device_quant(q), q.dequantize()
    else:
        from anydevice.backend.ops import dtypes
        wd, wf = BE.to_device(w, dtype=kind), dtypes.round_to(w, kind)
    y = BE.to_numpy(BE.linear(BE.to_device(x), wd))
    np.testing.assert_array_equal(y, BE.to_numpy(BE.linear(BE.to_device(x), BE.to_device(wf))))
    _check_layout(built, nh, bh)


@pytest.mark.parametrize("xs,ws,kw", [((2, 40, 17, 13), (70, 40, 3, 3), {"stride": 2, "padding": 1}),
                                      ((1, 64, 9, 11), (48, 32, 3, 3), {"groups": 2, "padding": (1, 0)}),
                                      ((3, 24, 10, 10), (33, 24, 5, 5), {"padding": 2, "dilation": 1}),
                                      ((1, 700, 6, 6), (20, 700, 1, 1), {"stride": 2})])
def test_im2col_panels_match_float64(layout, monkeypatch, xs, ws, kw):
    """im2col_pack writes the conv's columns in the GEMM's panel layout (rows or halves: panel_b.h)."""
    import torch
    nh, bh, built = layout
    monkeypatch.setattr(BE, "_conv_path", lambda *a: "gemm")
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.uniform(-1, 1, ws[0]).astype(np.float32)
    y = BE.to_numpy(BE.conv2d(x, w, b, **kw))
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                     torch.from_numpy(b).double(), **kw).numpy()
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max()) * np.sqrt(np.prod(ws[1:]))
    packs = [p for name, p in built if name == "im2col_pack"]
    assert packs and all(p.get("BH", 0) == int(bh and nh == 2) for p in packs), built
    gemms = [p for name, p in built if name == "gemm_cpu"]
    assert gemms and all(p.get("NH", 1) == nh and p.get("BH", 0) == int(bh and nh == 2) for p in gemms)


@pytest.mark.parametrize("case", ["matmul", "batched", "shared_b", "conv1x1"])
def test_column_chunks_give_the_same_bits(monkeypatch, case):
    """B packed and multiplied in column chunks (GEMM_B_CHUNK_BYTES; the last one partial) gives the whole-B result
    bit for bit: each column's sums are the same."""
    rng = np.random.default_rng(17)
    if case == "matmul":
        a, b = rng.standard_normal((70, 96)), rng.standard_normal((96, 333))
        run = lambda: BE.matmul(BE.to_device(a.astype(np.float32)), BE.to_device(b.astype(np.float32)))
    elif case == "batched":
        a, b = rng.standard_normal((3, 40, 64)), rng.standard_normal((3, 64, 150))
        run = lambda: BE.matmul(BE.to_device(a.astype(np.float32)), BE.to_device(b.astype(np.float32)))
    elif case == "shared_b":
        a, b = rng.standard_normal((3, 40, 64)), rng.standard_normal((64, 150))
        run = lambda: BE.matmul(BE.to_device(a.astype(np.float32)), BE.to_device(b.astype(np.float32)))
    else:
        x, w = rng.standard_normal((2, 64, 12, 12)), rng.standard_normal((50, 64, 1, 1))
        bias = rng.standard_normal(50)
        run = lambda: BE.conv2d(x.astype(np.float32), w.astype(np.float32), bias.astype(np.float32))
    monkeypatch.setattr(linalg, "GEMM_B_CHUNK_BYTES", 0)
    whole = BE.to_numpy(run())
    launches = []
    real = BE._run
    monkeypatch.setattr(BE, "_run", lambda name, *a, **k: (launches.append(name), real(name, *a, **k))[1])
    monkeypatch.setattr(linalg, "GEMM_B_CHUNK_BYTES", 4 * 64 * 3 * 32)
    np.testing.assert_array_equal(BE.to_numpy(run()), whole)
    assert launches.count("gemm_cpu") >= 2 and launches.count("pack_b") == launches.count("gemm_cpu")


def test_gemm_grouped_rule():
    """GM (gemm_cpu's row blocks in groups) only where A is over two groups and there is more than one column tile;
    a power of two of at most 64; none where one row block's A is over half a group."""
    from anydevice.backend.devices.opencl import params as P
    p = {"MR": 6, "MSUB": 4}
    assert P.gemm_grouped(p, 2048, 2048, 64)["GM"] == 16  # 24 x 2048 floats a block: 16 blocks a group
    assert P.gemm_grouped(p, 8192, 320, 10)["GM"] == 64  # 409 blocks a group: at most 64
    assert "GM" not in P.gemm_grouped(p, 4096, 320, 10)  # A 5 MiB
    assert "GM" not in P.gemm_grouped(p, 1024, 1024, 32)  # A 4 MiB: under two groups
    assert "GM" not in P.gemm_grouped(p, 2048, 2048, 1)  # one column tile
    assert "GM" not in P.gemm_grouped(p, 1280, 23040, 2)  # a block's A is 2.2 MiB
    g = P.gemm_grouped(p, 3000, 1500, 8)["GM"]
    assert g & (g - 1) == 0


@pytest.mark.parametrize("case", ["matmul", "batched", "conv_s2", "winograd"])
def test_grouped_work_order_gives_the_same_bits(layout, monkeypatch, case):
    """gemm_cpu walking its row blocks in groups (GM, partial last group) computes every block as before: the same
    bits as row blocks fastest, and float64's values: _gemm's products, im2col's and the unfused Winograd's."""
    from anydevice.backend.devices.opencl import params as P
    nh, bh, built = layout
    rng = np.random.default_rng(23)
    if case in ("conv_s2", "winograd"):
        C, stride = (32, 2) if case == "conv_s2" else (160, 1)
        x, w, bias = rng.standard_normal((1, C, 20, 20)), rng.standard_normal((250, C, 3, 3)), rng.standard_normal(250)
        run = lambda: BE.conv2d(x.astype(np.float32), w.astype(np.float32), bias.astype(np.float32), stride, 1)
        K = C * 9 if case == "conv_s2" else C
        assert BE._conv_path(x.shape, 250, 3, 3, (stride, stride), (1, 1), 1, 20 // stride,
                             (1, 1, 1, 1)) == ("gemm" if case == "conv_s2" else "winograd")
    else:
        a = rng.standard_normal((3, 250, 300) if case == "batched" else (250, 300))
        b = rng.standard_normal((300, 333))
        run = lambda: BE.matmul(BE.to_device(a.astype(np.float32)), BE.to_device(b.astype(np.float32)))
        K = 300
    mr = BE.tunables("gemm_cpu.cl")["MR"]
    block = 4 * mr * BE.tunables("gemm_cpu.cl")["MSUB"] * K
    monkeypatch.setattr(P, "GEMM_GROUP_BYTES", 2 * block)  # groups of 2 blocks (250 rows: 6 or 11 blocks)
    built.clear()
    empty = BE._empty

    def poisoned(*a, **k):  # every new array NaN first (a pooled buffer may hold an earlier run's right values)
        arr = empty(*a, **k)
        if arr.size and BE._dtype(arr) == "float32":
            BE._fill(arr, float("nan"))
        return arr
    monkeypatch.setattr(BE, "_empty", poisoned)
    grouped = BE.to_numpy(run())
    monkeypatch.setattr(BE, "_empty", empty)
    assert any(p.get("GM") == 2 for name, p in built if name == "gemm_cpu"), built
    monkeypatch.setattr(P, "GEMM_GROUP_BYTES", 0)
    plain = BE.to_numpy(run())
    assert np.isfinite(grouped).all()
    np.testing.assert_array_equal(grouped, plain)
    if case in ("conv_s2", "winograd"):
        import torch
        ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias), stride, 1).numpy()
    else:
        ref = np.matmul(a, b)
    assert np.abs(grouped - ref).max() <= 1e-5 * np.sqrt(K) * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("case", ["matmul", "row_view", "shared_a", "linear", "conv_s2", "conv1x1", "batched_a"])
def test_unpacked_a_gives_the_packed_bits(layout, monkeypatch, case):
    """gemm_cpu reading a float32 A as stored (AU: no pack_a; rows past M clamped, never stored) gives pack_a's
    panels' bits and float64's values: a matmul (partial row blocks), a row view at an offset, one A for every
    batch, a linear layer, an im2col conv's weight and a 1x1 conv's; an A per batch is still packed."""
    nh, bh, built = layout
    rng = np.random.default_rng(29)
    if case in ("conv_s2", "conv1x1"):
        k, stride = (1, 1) if case == "conv1x1" else (3, 2)
        x, w, bias = rng.standard_normal((2, 24, 22, 22)), rng.standard_normal((77, 24, k, k)), rng.standard_normal(77)
        run = lambda: BE.conv2d(x.astype(np.float32), w.astype(np.float32), bias.astype(np.float32), stride, k // 2)
        import torch
        ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias),
                                         stride, k // 2).numpy()
        K = 24 * k * k
    else:
        a = rng.standard_normal((3, 70, 300) if case == "batched_a" else (70, 300) if case == "shared_a" else (260, 300))
        b = rng.standard_normal((3, 300, 333) if case in ("shared_a", "batched_a") else (300, 133))
        if case == "linear":
            wl, bl = rng.standard_normal((133, 300)), rng.standard_normal(133)
            run = lambda: BE.linear(BE.to_device(a.astype(np.float32)), BE.to_device(wl.astype(np.float32)),
                                    BE.to_device(bl.astype(np.float32)))
            ref = a @ wl.T + bl
        else:
            big = np.concatenate([rng.standard_normal((5, 300)), a]) if case == "row_view" else a
            run = lambda: BE.matmul(BE.narrow(BE.to_device(big.astype(np.float32)), 0, len(big) - len(a), len(a))
                                    if case == "row_view" else BE.to_device(a.astype(np.float32)),
                                    BE.to_device(b.astype(np.float32)))
            ref = np.matmul(a, b)
        K = 300
    monkeypatch.setattr(linalg, "GEMM_A_UNPACKED", False)
    packed = BE.to_numpy(run())
    monkeypatch.setattr(linalg, "GEMM_A_UNPACKED", True)
    built.clear()
    unpacked = BE.to_numpy(run())
    gemms = [p for name, p in built if name == "gemm_cpu"]
    assert gemms and all(p.get("AU", 0) == int(case != "batched_a") for p in gemms), built
    assert any(name == "pack_a" for name, _ in built) == (case == "batched_a"), built
    np.testing.assert_array_equal(unpacked, packed)
    assert np.abs(unpacked - ref).max() <= 1e-5 * np.sqrt(K) * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("shape", [((100, 301), (301, 130)), ((2, 48, 303), (2, 303, 70)), ((36, 64), (64, 200))])
def test_a_packed_for_many_column_tiles(layout, monkeypatch, shape):
    """On wide vectors an A used by GEMM_A_PACK_MIN_TILES column tiles or more is packed (pack_a's 4 x 4 register
    transposes, its scalar copy for partial row tiles and a K tail under 4) and its rows prefetched (PFA): the bits of
    the row streams (AU) and float64's values; on narrow vectors the rows are read as stored."""
    from anydevice.backend.devices.opencl import params as P
    nh, bh, built = layout
    monkeypatch.setattr(P, "GEMM_A_PACK_MIN_TILES", 3)
    rng = np.random.default_rng(41)
    a, b = rng.standard_normal(shape[0]), rng.standard_normal(shape[1])
    run = lambda: BE.to_numpy(BE.matmul(BE.to_device(a.astype(np.float32)), BE.to_device(b.astype(np.float32))))
    built.clear()
    packed = run()
    au = [p.get("AU", 0) for name, p in built if name == "gemm_cpu"]
    shared = a.ndim == 2
    assert au and all(x == int(shared and not BE.wide_vectors) for x in au), built
    assert any(name == "pack_a" for name, _ in built) == (BE.wide_vectors or not shared), built
    monkeypatch.setattr(P, "GEMM_A_PACK_MIN_TILES", 10 ** 6)
    np.testing.assert_array_equal(run(), packed)
    ref = np.matmul(a, b)
    assert np.abs(packed - ref).max() <= 1e-5 * np.sqrt(a.shape[-1]) * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("kind", ["float32", "float16", "bfloat16", "q8_0", "q4_0", "int8"])
@pytest.mark.parametrize("n,k", [(77, 203), (130, 67), (64, 5), (70, 320)])
def test_row_by_row_b_packs_the_panels_of_plain_b(layout, kind, n, k):
    """pack_b's row-by-row reader of B = w^T (sbk 1: 4 x 4 register transposes for whole 32-column tiles, a K tail
    under 4, the last partial tile value by value; quantized rows 4 columns' block runs at a time) packs the panels
    its reader of a plain (K, N) B packs: a linear layer's bits are the matmul's by w^T stored as such (float32 or
    half), or by the dequantized weight's transpose."""
    nh, bh, built = layout
    quantized = kind not in dtypes.FLOATS
    if quantized and k % 32:
        pytest.skip("block formats need rows of a multiple of 32")
    rng = np.random.default_rng(n + k)
    x = rng.standard_normal((90, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    if quantized:
        q = quant.quantize(w, kind, op="test")
        wd, wr = BE.to_device_quant(q), q.dequantize().astype(np.float64)
        y_plain = BE.to_numpy(BE.matmul(BE.to_device(x), BE.to_device(np.ascontiguousarray(wr.T.astype(np.float32)))))
    else:
        store = {} if kind == "float32" else {"dtype": kind}
        wd, wr = BE.to_device(w, **store), dtypes.round_to(w, kind).astype(np.float64)
        y_plain = BE.to_numpy(BE.matmul(BE.to_device(x), BE.to_device(np.ascontiguousarray(w.T), **store)))
    y = BE.to_numpy(BE.linear(BE.to_device(x), wd))
    np.testing.assert_array_equal(y, y_plain)
    np.testing.assert_allclose(y, x.astype(np.float64) @ wr.T, rtol=1e-5, atol=1e-4 * np.sqrt(k))
