"""The OpenCL backend's device object and its non-GEMM ops: kernels (through the shared runtime's
program cache and signature table), allocation and transfers, elementwise ops, pad, reductions.
GEMM and convolutions are in ``linalg.py``."""
from __future__ import annotations

import logging
import math
import threading

import numpy as np

from ...system import config
from ...ops import dtypes
from ...ops.quant import FORMATS
from ...ops.contract import Backend, Capabilities, unary_kernel_args
from .adam import CLAdam
from .attention import CLAttention
from ..runtime.kernel_source import kernel_source
from .device import _checks, _cl, _cpu_macs_per_s, _describe, _device_key, _is_gpu, _record_check
from .gpu_linalg import CLGpuLinalg
from .linalg import LinalgOps
from .w8a8 import CLW8A8
from .memory import BufferPool, CLArray, CLHalf, CLQuant, _collapse, _contig_strides
from .storage import CLStorage
from .params import BINARY_CODES, F32, FUSED, HALF_CODES, KERNEL_DIR, KFILES, PAD_CODES, PROBE_SRC, SIGS
from .programs import ProgramCache
from .wgrad import CLWeightGrad
from .winograd import CLWinograd
from .norms import CLNorms
from .losses import CLLosses
from .graphs import CLGraphs
from .replay import CLReplay
from .tuning import CLTuning
from .warm import CLWarm

log = logging.getLogger("anydevice")


class OpenCLBackend(CLStorage, LinalgOps, CLWinograd, CLGpuLinalg, CLNorms, CLLosses, CLW8A8, CLWeightGrad, CLAdam, CLAttention, CLWarm,
                    CLReplay, CLGraphs, CLTuning, Backend):
    """The op contract in the pack's OpenCL kernels: elementwise, layout and reductions here, GEMM and conv in
    linalg.py (GPU family: gpu_linalg.py), conv gradients in wgrad.py, Adam in adam.py, attention in attention.py."""

    name = "opencl"
    kind = "own"
    native_types = (CLArray, CLHalf, CLQuant)

    def __init__(self, dev, index: int = 0, family: str | None = None, limits: dict | None = None):
        super().__init__(index)
        cl = _cl()
        self.cl = cl
        self.dev = dev
        fam = (family or config.get("ANYDEVICE_OPENCL_FAMILY") or "").strip().lower()
        if fam not in ("", "cpu", "gpu"):
            raise RuntimeError(f"kernel family {fam!r} must be cpu or gpu")
        self.family = fam or ("gpu" if _is_gpu(dev) else "cpu")
        self.is_cpu_device = not _is_gpu(dev)
        cpu = frozenset({"winograd"}) if self.family == "cpu" else frozenset()
        cpu |= frozenset({"fft_conv"}) if self.family == "cpu" and self.is_cpu_device else frozenset()
        # compiled graphs replayed (graphs.py) by the GPU family, where a kernel's per-op Python is the cost; on a
        # CPU device the host queues while the same cores run the kernels (PoCL, compact upscaler: 497 against
        # 501 ms a call op by op) and a recording would pin every intermediate (411 MB there)
        cpu |= frozenset({"graph_replay"}) if self.family == "gpu" else frozenset()
        # float16 / bfloat16 stored as 16-bit words (vload_half/vstore_half are core OpenCL), computed in float32
        self.caps = Capabilities(fused=FUSED | cpu, macs_per_s=(4.0e9, _cpu_macs_per_s(dev)), fft_min_taps=577,
                                 storage_dtypes=frozenset(dtypes.FLOATS), quant_formats=frozenset(FORMATS))
        self._launches = 0
        self.ctx = cl.Context([dev])
        self._main_queue = cl.CommandQueue(self.ctx, dev)  # (``queue``: warm.py)
        self.programs = ProgramCache(self.ctx, dev)
        self.compute_units = max(1, int(dev.max_compute_units))
        # the group size and group-shared memory the GPU family plans within; ``limits`` ({"max_group": n,
        # "local_bytes": n}) lowers them (the tests emulate a small GPU, e.g. 64 work items and 8 KiB, on PoCL)
        lim = limits or {}
        self.max_group = max(1, min(int(dev.max_work_group_size), int(lim.get("max_group", 1 << 30))))
        self.local_bytes = max(0, min(int(dev.local_mem_size), int(lim.get("local_bytes", 1 << 40))))
        limit = min(int(dev.global_mem_size) // 4, 2 << 30)  # on a CPU device also a share of free RAM
        self.pool = BufferPool(self.ctx, limit, host_ram=self.is_cpu_device)
        self._kernels: dict[tuple, object] = {}
        self._meta_cache: dict[tuple, object] = {}
        self._sources: dict[str, str] = {}
        self._tune = self._tune_store().section(_device_key(dev))
        self._tune_spent = 0.0
        self._lock = threading.RLock()
        self._check_device()

    # ---- device check -------------------------------------------------------------------
    def _check_device(self) -> None:
        """Build (or load from the disk cache) and run a tiny kernel; a failure marks the device."""
        cl = self.cl
        try:
            prg = self.programs.build(PROBE_SRC, "")
            k = cl.Kernel(prg, "probe_kernel")
            host = np.arange(4, dtype=F32)
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
            k.set_args(buf)
            cl.enqueue_nd_range_kernel(self.queue, k, (4,), None)
            out = np.empty(4, F32)
            cl.enqueue_copy(self.queue, out, buf, is_blocking=True)
            if not np.array_equal(out, 2 * host + 1):
                raise RuntimeError(f"test kernel computed {out.tolist()} instead of {(2 * host + 1).tolist()}")
        except Exception as exc:
            reason = f"kernel build check failed on {_describe(self.dev)}: {exc}"
            _record_check(self.dev, False, reason)
            raise RuntimeError(reason) from None
        if not _checks().section(_device_key(self.dev)).get("ok"):
            _record_check(self.dev, True, "")

    # ---- description ---------------------------------------------------------------------
    @property
    def device(self) -> str:
        tiles = f", {self.vector_width}-wide float vectors" if self.family == "cpu" and self.is_cpu_device else ""
        return f"{_describe(self.dev)} [{self.family} kernel family{tiles}]"

    def synchronize(self) -> None:
        self.queue.finish()

    def free_memory(self) -> None:
        """Give the buffer pool's free buffers back to the driver (arrays in use stay); recorded compiled
        graphs run no more (graphs.py: their buffers come back as they are dropped)."""
        self._retire_graphs()
        self.pool.clear()

    def torch_device(self):
        """An OpenCL GPU next to a CUDA/ROCm PyTorch: compared on that GPU; else the CPU."""
        import torch
        if not self.is_cpu_device and torch.cuda.is_available():
            return torch.device("cuda", 0)
        return torch.device("cpu")

    def device_free_bytes(self) -> int | None:
        """A GPU's global memory less the pool's buffers in use (OpenCL has no free-memory query);
        None on a CPU device, whose memory is the host's RAM."""
        if self.is_cpu_device:
            return None
        return max(0, int(self.dev.global_mem_size) - self.pool.live)

    # ---- kernels ---------------------------------------------------------------------------
    def _source(self, fname: str, portable: bool) -> str:
        src = self._sources.get(fname)
        if src is None:
            src = kernel_source(fname, "opencl", KERNEL_DIR, prelude=portable)
            self._sources[fname] = src
        return src

    def _kernel(self, name: str, params: dict | None = None):
        fname, portable = KFILES[name]
        if params is None:
            params = self.default_tunables(fname)
        key = (name, tuple(sorted(params.items())))
        k = self._kernels.get(key)
        if k is None:
            opts = " ".join(f"-D{a}={b}" for a, b in sorted(params.items()))
            prg = self.programs.build(self._source(fname, portable), opts)
            k = self.cl.Kernel(prg, name)
            k.set_scalar_arg_dtypes(SIGS[name])
            self._kernels[key] = k
        return k

    def kernel_launches(self) -> int:
        return self._launches

    def _run(self, name, gsize, lsize, *args, params=None):
        if any(g == 0 for g in gsize):
            return
        self._launches += self._counted()  # (a statistic: an increment lost to a race does not matter)
        with self._lock:  # a Kernel's arguments are shared state
            k = self._kernel(name, params)
            rec = self._rec
            k(self.queue, gsize, lsize, *(args if rec is None else rec.launch(k, name, gsize, lsize, args)))

    def _meta(self, values) -> object:
        key = tuple(int(v) for v in values)
        buf = self._meta_cache.get(key)
        if buf is None:
            if len(self._meta_cache) > 512:
                self._meta_cache.clear()
            arr = np.asarray(key, dtype=np.int64)
            cl = self.cl
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=arr)
            self._meta_cache[key] = buf
        return buf

    def _group(self, want: int = 256) -> int:
        """The largest power of two <= ``want`` that the device's group size (``max_group``) allows."""
        n = max(1, min(want, self.max_group))
        return 1 << (n.bit_length() - 1)

    def _flat_geometry(self, n: int):
        """(global size, local size, chunk) for the flat elementwise kernels."""
        if self.is_cpu_device:
            chunk = max(4096, -(-n // (8 * self.compute_units)))
            return (-(-n // chunk),), (1,), chunk
        wg = self._group()
        return (-(-n // wg) * wg,), (wg,), 1

    def _contiguous(self, x):
        """x itself: every CLArray is dense in C order (views are offsets into a buffer)."""
        return x

    def _write_rows(self, out, start, rows):
        """Host float32 rows written into ``out`` from its element ``start`` (one blocking copy)."""
        self._q_upload(out.buffer, np.ascontiguousarray(rows, F32), 4 * (out.offset + start))

    def _shape(self, x):
        return x.shape

    def _reshape(self, x, shape):
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != x.size:
            raise ValueError(f"cannot reshape {x.shape} to {shape}")
        return self._view(x, shape, x.offset)

    def _copy_strided(self, src: CLArray, s_off, shape, sstr, dst: CLArray, d_off, dstr):
        """Elements of ``src`` to ``dst`` (strides in elements); both float32, or both of one half dtype
        (16-bit words moved as they are)."""
        n = math.prod(shape)
        if n == 0:
            return
        dtype = self._dtype(src)
        if self._dtype(dst) != dtype:
            raise TypeError(f"copy between {dtype} and {self._dtype(dst)} arrays")
        item = src.ITEM
        shape2, (s2, d2) = _collapse(shape, sstr, dstr)
        if len(shape2) == 1 and s2[0] == 1 and d2[0] == 1:
            self._q_copy(dst.buffer, src.buffer, byte_count=item * n, src_offset=item * s_off, dst_offset=item * d_off)
            return
        meta = self._meta((len(shape2),) + shape2 + s2 + d2)
        g, l, chunk = self._flat_geometry(n)
        self._run("copy_nd", g, l, src.buffer, s_off, dst.buffer, d_off, n, chunk, meta, params=self._hdt(dtype))

    def _view(self, x, shape, offset):
        """A view of ``x``'s buffer: ``shape`` from element ``offset``, of x's dtype."""
        if isinstance(x, CLHalf):
            return CLHalf(tuple(shape), x.block, x.dtype, offset)
        return CLArray(tuple(shape), x.block, offset)

    def _permute(self, x, axes):
        axes = tuple(int(a) for a in axes)
        if axes == tuple(range(len(axes))):
            return x
        st = _contig_strides(x.shape)
        shape = tuple(x.shape[a] for a in axes)
        out = self._empty(shape, self._dtype(x))
        self._copy_strided(x, x.offset, shape, tuple(st[a] for a in axes), out, 0, _contig_strides(shape))
        return out

    def _expand(self, x, shape):
        shape = tuple(int(s) for s in shape)
        if shape == x.shape:
            return x
        src_shape = (1,) * (len(shape) - x.ndim) + x.shape
        st = _contig_strides(src_shape)
        sstr = tuple(0 if (s == 1 and t != 1) else st[i] for i, (s, t) in enumerate(zip(src_shape, shape)))
        out = self._empty(shape, self._dtype(x))
        self._copy_strided(x, x.offset, shape, sstr, out, 0, _contig_strides(shape))
        return out

    def _concat_channels(self, parts, n, c, h, w):
        k = len(parts)
        out = self._empty((n, k * c, h, w), self._dtype(parts[0]))
        inner = c * h * w
        for i, p in enumerate(parts):
            self._copy_strided(p, p.offset, (n, inner), (inner, 1), out, i * inner, (k * inner, 1))
        return out

    def _slice1(self, x, i):
        n, k = x.shape[:2]
        rest = x.shape[2:]
        inner = math.prod(rest)
        if n == 1:
            return self._view(x, (1,) + rest, x.offset + i * inner)
        out = self._empty((n,) + rest, self._dtype(x))
        self._copy_strided(x, x.offset + i * inner, (n, inner), (k * inner, 1), out, 0, (inner, 1))
        return out

    def _piece(self, x, i0, i1, j0, j1, r0, r1):
        n, c, h, w = x.shape  # the pieces ssim takes are contiguous spans: a view
        return CLArray((i1 - i0, j1 - j0, r1 - r0, w), x.block, x.offset + ((i0 * c + j0) * h + r0) * w)

    def _fill(self, out: CLArray, value: float = 0.0):
        if out.size:
            self._q_fill(out.buffer, np.float32(value), 4 * out.offset, 4 * out.size)

    # ---- elementwise ------------------------------------------------------------------------
    @staticmethod
    def _hdt(dtype: str) -> dict:
        """The elementwise kernels' build option for arrays stored as ``dtype`` ({} for float32)."""
        return {"HDT": HALF_CODES[dtype]} if dtype != "float32" else {}

    def _unary(self, op, x, **p):
        """y = op(x); a half x gives a half y (loaded and stored as 16-bit words: HDT, elementwise.cl)."""
        dtype = self._dtype(x)
        out = self._empty(x.shape, dtype)
        n = x.size
        if n == 0:
            return out
        code, p0, p1, f0, f1 = unary_kernel_args(op, p)
        g, l, chunk = self._flat_geometry(n)
        self._run("unary", g, l, x.buffer, x.offset, out.buffer, 0, n, chunk, code, p0, p1, f0, f1,
                  params=self._hdt(dtype))
        return out

    def _binary(self, op, a, b):
        """a op b with broadcasting, either side a number; two arrays of one half dtype give that dtype
        (loaded and stored as 16-bit words), mixed dtypes are computed in float32."""
        code = BINARY_CODES[op]
        if len({self._dtype(v) for v in (a, b) if isinstance(v, self.native_types)}) > 1:
            a, b = (self._f32(v) if isinstance(v, CLHalf) else v for v in (a, b))
        dtype = self._dtype(a if isinstance(a, self.native_types) else b)
        hdt = self._hdt(dtype)
        if not isinstance(a, self.native_types) or not isinstance(b, self.native_types):
            t = b if isinstance(b, self.native_types) else a
            out = self._empty(t.shape, dtype)
            n = t.size
            if n:
                g, l, chunk = self._flat_geometry(n)
                if isinstance(a, self.native_types):
                    self._run("binary_flat", g, l, a.buffer, a.offset, a.buffer, a.offset, out.buffer, 0,
                              n, chunk, code, 2, 0.0, float(b), params=hdt)
                else:
                    self._run("binary_flat", g, l, b.buffer, b.offset, b.buffer, b.offset, out.buffer, 0,
                              n, chunk, code, 1, float(a), 0.0, params=hdt)
            return out
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
        out = self._empty(shape, dtype)
        n = out.size
        if n == 0:
            return out
        g, l, chunk = self._flat_geometry(n)
        if a.shape == b.shape:
            self._run("binary_flat", g, l, a.buffer, a.offset, b.buffer, b.offset, out.buffer, 0,
                      n, chunk, code, 0, 0.0, 0.0, params=hdt)
            return out

        def bstrides(s):
            s = (1,) * (len(shape) - len(s)) + s
            st = _contig_strides(s)
            return tuple(0 if (d == 1 and t != 1) else st[i] for i, (d, t) in enumerate(zip(s, shape)))
        shape2, (sa, sb, _) = _collapse(shape, bstrides(a.shape), bstrides(b.shape), _contig_strides(shape))
        meta = self._meta((len(shape2),) + shape2 + sa + sb)
        self._run("binary_nd", g, l, a.buffer, a.offset, b.buffer, b.offset, out.buffer, 0, n, chunk, code, meta,
                  params=hdt)
        return out

    def _slice(self, x, dim, start, length, step):
        shape = x.shape
        outer, n, inner = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
        out_shape = shape[:dim] + (length,) + shape[dim + 1:]
        if math.prod(out_shape) == 0 or (outer == 1 and (step == 1 or length == 1)):
            return self._view(x, out_shape, x.offset + start * inner)  # one contiguous run: a view
        out = self._empty(out_shape, self._dtype(x))
        self._copy_strided(x, x.offset + start * inner, (outer, length, inner), (n * inner, step * inner, 1),
                           out, 0, (length * inner, inner, 1))
        return out

    def _cat(self, parts, dim):
        shape = parts[0].shape
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
        total = sum(p.shape[dim] for p in parts)
        dtype = self._dtype(parts[0])
        if any(self._dtype(p) != dtype for p in parts):  # a half part beside one the contract uploaded as float32
            parts, dtype = [self._f32(p) for p in parts], "float32"
        out = self._empty(shape[:dim] + (total,) + shape[dim + 1:], dtype)
        pos = 0
        for p in parts:
            k = p.shape[dim] * inner
            self._copy_strided(p, p.offset, (outer, k), (k, 1), out, pos, (total * inner, 1))
            pos += k
        return out

    def _where(self, c, a, b):
        shape = tuple(np.broadcast_shapes(c.shape, a.shape, b.shape))
        out = self._empty(shape)
        n = out.size
        if n == 0:
            return out
        if all(t.size == n or t.size == 1 for t in (c, a, b)):
            # each operand the output's n contiguous elements or one element: where_flat
            scalars = sum(bit for t, bit in ((c, 1), (a, 2), (b, 4)) if t.size == 1 and n != 1)
            g, l, chunk = self._flat_geometry(n)
            self._run("where_flat", g, l, c.buffer, c.offset, a.buffer, a.offset, b.buffer, b.offset,
                      out.buffer, 0, n, chunk, scalars)
            return out

        def bstrides(s):
            s = (1,) * (len(shape) - len(s)) + s
            st = _contig_strides(s)
            return tuple(0 if (d == 1 and t != 1) else st[i] for i, (d, t) in enumerate(zip(s, shape)))
        shape2, (sc, sa, sb, _) = _collapse(shape, bstrides(c.shape), bstrides(a.shape), bstrides(b.shape),
                                            _contig_strides(shape))
        meta = self._meta((len(shape2),) + shape2 + sc + sa + sb)
        g, l, chunk = self._flat_geometry(n)
        self._run("where_nd", g, l, c.buffer, c.offset, a.buffer, a.offset, b.buffer, b.offset, out.buffer, 0,
                  n, chunk, meta)
        return out

    # ---- padding ----------------------------------------------------------------------------
    def _pad(self, x, pads, mode):
        t, bo, l, r = pads
        lead = x.shape[:-2]
        H, W = x.shape[-2:]
        OH, OW = H + t + bo, W + l + r
        out = self._empty(lead + (OH, OW))
        P = math.prod(lead)
        if out.size == 0:
            return out
        self._run("pad2d", (OH, P), (1, 1) if self.is_cpu_device else None, x.buffer, x.offset, out.buffer, 0,
                  H, W, OH, OW, t, l, PAD_CODES[mode])
        return out

    def _window2d(self, x, mode, rows, cols):
        (ri, rw), (ci, cw) = rows, cols
        lead, (H, W) = x.shape[:-2], x.shape[-2:]
        OH, OW, T, S = ri.shape[0], ci.shape[0], ri.shape[1], ci.shape[1]
        out = self._empty(lead + (OH, OW))
        if out.size == 0:
            return out
        P = math.prod(lead)
        xs = self._at0(x, x.offset, x.size)
        if self.family == "gpu":
            tabs = [self._table_buffer(a) for a in (ri, rw, ci, cw)]
            spec = T if T == S and T <= 4 else 0
            wg = self._group(64)
            self._run("ad_window2d", (-(-OW // wg) * wg, min(P * OH, 1 << 24)), (wg, 1), xs.buffer, out.buffer,
                      *tabs, P, H, W, OH, OW, T, S, int(mode == "max"), params={"WT": spec, "WS": spec})
            return out
        # CPU family: one output per work item, groups of L x R items (PoCL runs a group as one
        # vectorised loop and pays per group); small windows unrolled, index checks dropped where a
        # table has no skipped tap (max: a skipped tap is replaced by one of its row's others)
        ri, dense_r = _dense_table(ri, mode)
        ci, dense_c = _dense_table(ci, mode)
        m = int(mode == "max")
        tabs = [self._table_buffer(a) for a in (ri, rw, ci, cw)]
        spec = {"WT": T if T <= 4 else 0, "WS": S if S <= 4 else 0, "DENSE_R": dense_r, "DENSE_C": dense_c}
        # separable where it saves gathers: columns into a scratch t (P, H, OW), then the rows with
        # contiguous loads (ad_window_rows: whole rows per work item); same sums in the same order
        if T > 1 and H * S + OH * T // 4 < OH * T * S:
            t = self._empty((P, H, OW))
            self._window_px(xs, t, tabs, P, H, W, H, OW, 1, S, m, {**spec, "WT": 1, "IDENT_R": 1})
            rows = P * OH
            self._run("ad_window_rows", (min(rows, 64 * self.compute_units),), (1,), t.buffer, out.buffer,
                      tabs[0], tabs[1], P, H, OW, OH, T, m)
        else:
            self._window_px(xs, out, tabs, P, H, W, OH, OW, T, S, m, spec)
        return out

    def _window_px(self, x, out, tabs, P, H, W, OH, OW, T, S, m, params):
        """CPU family: ad_window2d_px, one output per work item, in groups of up to 64 along a row
        (PoCL runs a group's items as one vectorised loop)."""
        L = min(self._group(64), 1 << max(0, (OW - 1).bit_length()))
        self._run("ad_window2d_px", (-(-OW // L) * L, OH, P), (L, 1, 1), x.buffer, out.buffer,
                  *tabs, P, H, W, OH, OW, T, S, m, params=params)

    def _table_buffer(self, a):
        """A window table (small host array) as a read-only constant buffer, cached by content."""
        cache = self.__dict__.setdefault("_tables", {})
        key = (a.dtype.str, a.shape, a.tobytes())
        buf = cache.get(key)
        if buf is None:
            if len(cache) > 256:
                cache.clear()
            cl = self.cl
            host = np.ascontiguousarray(a)
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
            self._count("constants", host.nbytes)
            cache[key] = buf
        return buf

    # ---- reductions -----------------------------------------------------------------------
    def _reduce_pass(self, x: CLArray, O, R, I, opcode, scale) -> CLArray:
        """x viewed (O, R, I) -> (O, I)."""
        parts = 1
        if O * I < 4 * self.compute_units and R >= 16384:
            parts = min(256, -(-R // 4096))
        L = -(-R // parts)
        cpu = self.is_cpu_device
        lsz = (1, 1) if cpu else None
        if parts == 1:
            out = self._empty((O, I))
            self._run("reduce_ori", (I, O), lsz, x.buffer, x.offset, out.buffer, 0, O, R, I, 1, max(L, 1),
                      opcode, scale)
            return out
        tmp = self._empty((O, parts, I))
        self._run("reduce_ori", (I, O * parts), lsz, x.buffer, x.offset, tmp.buffer, 0, O, R, I, parts, L,
                  opcode, 1.0)
        out = self._empty((O, I))
        self._run("reduce_ori", (I, O), lsz, tmp.buffer, 0, out.buffer, 0, O, parts, I, 1, parts, opcode, scale)
        return out

    def _softmax_rows(self, s):
        """attention's exp(s - row max) in place and the rows' sums (at least 1), one kernel
        launch (CPU family)."""
        if self.family != "cpu":
            return None
        rows, n = s.shape
        t = self._empty((rows, 1))
        self._run("softmax_rows", (rows,), (1,), s.buffer, s.offset, s.buffer, s.offset, t.buffer, 0,
                  1, rows, n, 1)
        return s, t

    def _reduce(self, op, x, dims, keepdim):
        shape = x.shape
        if len(dims) == 0:
            out = self._empty(shape)
            self._copy_strided(x, x.offset, shape, _contig_strides(shape), out, 0, _contig_strides(shape))
            return out
        out_shape = tuple(1 if i in dims else s for i, s in enumerate(shape)) if keepdim else \
            tuple(s for i, s in enumerate(shape) if i not in dims)
        count = math.prod(shape[d] for d in dims)
        opcode = {"sum": 0, "mean": 0, "max": 1, "min": 2}[op]
        if math.prod(out_shape) == 0:
            return self._empty(out_shape)
        # runs of consecutive reduced dims, reduced from the last run to the first
        runs = []
        for d in sorted(dims):
            if runs and runs[-1][1] == d:
                runs[-1][1] = d + 1
            else:
                runs.append([d, d + 1])
        cur = x
        cur_shape = list(shape)
        for ri, (s, e) in enumerate(reversed(runs)):
            O = math.prod(cur_shape[:s])
            R = math.prod(cur_shape[s:e])
            I = math.prod(cur_shape[e:])
            last = ri == len(runs) - 1
            scale = (1.0 / count if count else float("inf")) if (op == "mean" and last) else 1.0
            if R == 0 and op == "mean":
                scale = float("nan")
            cur = self._reduce_pass(cur, O, R, I, opcode, scale)
            cur_shape = cur_shape[:s] + [1] * (e - s) + cur_shape[e:]
        return self._reshape(cur, out_shape)


def _dense_table(idx, mode):
    """(idx, 1) when the table has no skipped tap, or (for max, where a repeated tap changes
    nothing) each row's skipped taps replaced by its first valid one; else (idx, 0)."""
    valid = idx >= 0
    if valid.all():
        return idx, 1
    if mode != "max" or not valid.any(axis=1).all():
        return idx, 0
    first = idx[np.arange(idx.shape[0]), valid.argmax(axis=1)]
    return np.where(valid, idx, first[:, None]).astype(np.int32), 1
