"""The CUDA backend's device object: device and stream context (PyTorch's current stream), DLPack
conversion, elementwise ops and reductions, kernel builds, and tile tuning. GEMM and convolutions
are in ``linalg.py``, the fused attention in ``attention.py``."""
from __future__ import annotations

import math
import os
import sys
import threading
import time

import numpy as np

from ...system import config
from ...ops import dtypes
from ...ops.quant import FORMATS, DeviceQuant
from ...ops.contract import Backend, Capabilities, tf32_allowed, unary_kernel_args
from ...ops.plans import conv2d_geometry
from ..runtime import JsonStore, cache_dir, pack_args
from .attention import CudaAttention
from .device import _cupy, _describe
from .graphs import CudaGraphs
from .halfops import CudaHalfOps
from .norms import CudaNorms
from .linalg import CudaLinalg
from .w8a8 import CudaW8A8
from .tiles import BLOCK, CACHE_NAME, DEQUANT, MISC, _cdiv, _size_class, _tiles_for, build_options, kernel_source


#: NumPy / CuPy dtype letter -> the stored dtype: float16, bfloat16 kept as uint16 bits; all else float32
_DTYPE_OF_CHAR = {"e": dtypes.FLOAT16, "H": dtypes.BFLOAT16}


class CudaQuant(DeviceQuant):
    """A quantized weight packed as it is stored (ops/quant.py: ``fmt``, logical ``shape``): its bytes
    (``data``, a CuPy uint8 array) and, for int8 / fp8, ``scale`` (CuPy float32, one per ``rowlen``
    elements). ad_conv_gemm decodes it in its tile loads (WQA / WQB); ``_dequant`` converts it."""
    __slots__ = ("fmt", "shape", "data", "scale", "rowlen", "size", "nbytes", "__weakref__")

    def __init__(self, fmt: str, shape, data, scale=None, rowlen: int = 0):
        self._init(fmt, shape, data.nbytes, scale, rowlen)
        self.data = data


class CudaBackend(CudaLinalg, CudaW8A8, CudaAttention, CudaGraphs, CudaNorms, CudaHalfOps, Backend):
    kind = "own"
    # float16 as CuPy's float16, bfloat16 as uint16 bit patterns (CuPy has no bfloat16); computed in float32;
    # quantized weights kept packed (CudaQuant) and decoded by the GEMM / conv kernel's tile loads
    # half weights and GEMM / conv operands are read as stored: two of one dtype run on the f16/bf16 tensor
    # cores (sm_80+: the "half" tiles; a conv writes its result in their dtype), others as float32; half
    # elementwise ops load and store 16 bits (halfops.py), half values are moved as they are
    caps = Capabilities(fused=frozenset({"all_finite", "attention", "w8a8", "graph_replay", "half_weights",
                                         "half_gemm", "half_conv", "half_attention", "norm_affine",
                                         "half_norm", "half_elementwise", "half_movement"}),
                        storage_dtypes=frozenset(dtypes.FLOATS),
                        quant_formats=frozenset(FORMATS))

    def __init__(self, name: str = "cuda", index: int = 0):
        super().__init__(index, name)
        self.cp = cp = _cupy()
        self.hip = bool(getattr(cp.cuda.runtime, "is_hip", False))
        n = cp.cuda.runtime.getDeviceCount()
        if not 0 <= index < n:
            raise ValueError(f"device index {index} out of range ({n} device(s))")
        props = cp.cuda.runtime.getDeviceProperties(index)
        self._desc = _describe(cp, props, self.hip)
        self.cc = (int(props["major"]), int(props["minor"]))
        self.arch = "hip" if self.hip else f"sm_{self.cc[0]}{self.cc[1]}"
        self.sm_count = int(props["multiProcessorCount"])
        self.native_types = (cp.ndarray,)
        self.tf32 = tf32_allowed() and not self.hip and self.cc >= (8, 0)
        self._tiles = _tiles_for(self.arch)
        self._mods: dict = {}
        self._lock = threading.RLock()
        self._streams: dict = {}
        self._tuned = self._load_tuned()
        self._plan_cache: dict = {}
        self._arg_cache: dict = {}
        self._launch_cache: dict = {}   # call signature -> recorded launch (linalg._own_launch)
        self._geo_cache: dict = {}      # conv arguments -> ConvGeometry
        # read once (per-call os.environ lookups showed in the host-side profile)
        self._forced_ksplit = config.get("ANYDEVICE_CUDA_KSPLIT")  # None: chosen per problem
        self._dummy = None
        os.environ.setdefault("CUPY_CACHE_DIR", str(cache_dir("cupy")))
        self._enter()

    @property
    def device(self) -> str:
        return self._desc + (", TF32 tensor cores allowed" if self.tf32 else "")

    # ---- device / stream context ----------------------------------------------------------
    def _enter(self):
        """Make this device current and CuPy's current stream PyTorch's current stream (the capturing
        stream while this thread records a CUDA graph: graphs.py)."""
        cp = self.cp
        cp.cuda.Device(self.index).use()
        if self._capture_state is not None and self._capturing():
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            if not torch.cuda.is_initialized():
                return
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # one C call (the profile's
            ptr = raw(self.index) if raw else torch.cuda.current_stream(self.index).cuda_stream  # top item)
        except Exception:
            return
        cur = cp.cuda.get_current_stream()
        if cur.ptr == ptr:
            return
        st = self._streams.get(ptr)
        if st is None:
            st = cp.cuda.Stream.null if ptr == 0 else cp.cuda.ExternalStream(ptr)
            self._streams[ptr] = st
        st.use()

    def _inputs(self, op, optional=("bias",), **arrays):
        self._enter()
        return super()._inputs(op, optional, **arrays)

    def synchronize(self):
        self._no_capture("a synchronisation")
        self.cp.cuda.Device(self.index).synchronize()

    def free_memory(self):
        """Give CuPy's pooled blocks back to the driver (e.g. when ComfyUI unloads models)."""
        self._retire_graphs()  # recorded graphs run no more and let their pools go (graphs.py)
        with self.cp.cuda.Device(self.index):
            self.cp.get_default_memory_pool().free_all_blocks()

    def torch_device(self):
        import torch
        return torch.device("cuda", self.index) if torch.cuda.is_available() else torch.device("cpu")

    def device_free_bytes(self) -> int:
        """The GPU's free memory plus the blocks CuPy's pool holds free (ANYDEVICE_MAX_TENSOR_MB's
        default is a share of it)."""
        with self.cp.cuda.Device(self.index):
            free, _total = self.cp.cuda.runtime.memGetInfo()
            return int(free) + int(self.cp.get_default_memory_pool().free_bytes())

    # ---- conversion / layout ----------------------------------------------------------------
    def _from_numpy(self, a, dtype="float32"):
        self._no_capture("an upload")
        self._enter()
        if dtype != "float32":  # rounded on the host, uploaded as 16-bit words
            return self.cp.asarray(np.asarray(dtypes.host_store(np.asarray(a, np.float32), dtype)).view(
                np.float16 if dtype == dtypes.FLOAT16 else np.uint16))
        return self.cp.asarray(a, dtype=self.cp.float32)

    def _from_quant(self, q):
        """A host QTensor's bytes (and scales) uploaded as they are: the kernels decode them."""
        self._no_capture("an upload")
        self._enter()
        data = self.cp.asarray(np.ascontiguousarray(q.data))
        scale = None if q.scale is None else self.cp.asarray(q.scale, dtype=self.cp.float32)
        return CudaQuant(q.fmt, q.shape, data, scale, q.rowlen)

    def _dequant(self, w):
        """A CudaQuant's float32 values (kernels/dequant.cu; a copy for one op)."""
        self._enter()
        out = self._empty(w.shape)
        if out.size:
            fn = self._function(DEQUANT[0], DEQUANT[1], {"WQ": FORMATS[w.fmt].code})
            self._launch_1d(fn, out.size, pack_args(DEQUANT[1], (w.data, out, out.size, *self._wq(w))))
        return out

    def _wq(self, w) -> tuple:
        """The scale buffer and row length ad_conv_gemm / ad_dequant take for ``w`` (a quantized int8 /
        fp8 weight's; else any buffer and 0)."""
        if isinstance(w, CudaQuant) and w.scale is not None:
            return w.scale, w.rowlen
        return self._null(), 0

    def _to_numpy(self, x):
        self._no_capture("a download")
        self._enter()
        a = self.cp.asnumpy(x)
        if a.dtype == np.float16:
            return a.astype(np.float32)
        return dtypes.from_bf16(a) if a.dtype == np.uint16 else a

    def _dtype(self, x):
        # by the dtype's one-letter code: str(dtype) went through NumPy's name machinery, 2 us a call and
        # seven calls an op (a fifth of a small conv's host time on the H200)
        return _DTYPE_OF_CHAR.get(x.dtype.char, dtypes.FLOAT32)

    def _cast(self, x, dtype):
        """float32 <-> float16 / bfloat16 on the GPU, bfloat16 by its bits (nearest even): a contiguous array in
        one launch of elementwise_half_cuda.cu, others (strided views; ROCm) through CuPy's elementwise ops."""
        cp, have = self.cp, self._dtype(x)
        if have == dtype:
            return x
        self._enter()
        if (not self.hip and dtypes.FLOAT32 in (have, dtype) and x.dtype.char in "feH"
                and x.flags.c_contiguous and x.size):
            return self._cast_half(x, have, dtype)  # one launch (halfops.py)
        if have == dtypes.BFLOAT16:
            x = (x.astype(cp.uint32) << 16).view(cp.float32)
        elif have == dtypes.FLOAT16:
            x = x.astype(cp.float32)
        if dtype == dtypes.FLOAT16:
            return x.astype(cp.float16)
        if dtype == dtypes.BFLOAT16:
            u = cp.ascontiguousarray(x).view(cp.uint32)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
            return cp.where(cp.isnan(x), ((u >> 16) | 0x40).astype(cp.uint16), r)
        return x

    def _from_torch(self, t, dtype="float32"):
        if dtype != "float32":  # float32 on the GPU first, then rounded there
            return self._cast(self._from_torch(t), dtype)
        torch = sys.modules["torch"]
        self._no_capture("an upload")
        t = t.detach()
        if t.device.type != "cuda":
            return self._from_numpy(t.to(torch.float32).numpy())
        self._enter()
        if t.dtype != torch.float32:  # float16/bfloat16/int/bool: converted by torch on the GPU
            t = t.to(torch.float32)
        if t.is_conj():
            t = t.resolve_conj()
        arr = self.cp.from_dlpack(t)
        if arr.device.id != self.index:
            with self.cp.cuda.Device(self.index):
                arr = self.cp.array(arr, copy=True)
        return arr

    def _to_torch(self, x, like):
        torch = sys.modules["torch"]
        self._no_capture("a download")
        if like.device.type == "cuda":
            self._enter()
            t = torch.from_dlpack(self._contig(x))
            return t if t.device == like.device else t.to(like.device)
        a = self._to_numpy(x)
        return torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape))

    def _reshape(self, x, shape):
        return x.reshape(tuple(shape))

    def _permute(self, x, axes):
        return x.transpose(tuple(axes))

    def _expand(self, x, shape):
        return self.cp.broadcast_to(x, tuple(shape))

    def _concat_channels(self, parts, n, c, h, w):
        return self.cp.concatenate(parts, axis=1)

    def _slice1(self, x, i):
        return x[:, i]

    # ---- kernels ----------------------------------------------------------------------------
    def _function(self, fname: str, kname: str, macros: dict):
        key = (fname, kname, tuple(sorted(macros.items())))
        fn = self._mods.get(key)
        if fn is None:
            with self._lock:
                fn = self._mods.get(key)
                if fn is None:
                    mkey = (fname, key[2])  # one module per source and build options, any kernel of it
                    mod = self._mods.get(mkey)
                    if mod is None:
                        mod = self.cp.RawModule(code=kernel_source(fname), options=build_options(macros))
                        self._mods[mkey] = mod
                    fn = mod.get_function(kname)
                    self._mods[key] = fn
        return fn

    def _misc(self, kname):
        return self._function(MISC, kname, {"BLOCK": BLOCK})

    def _launch_1d(self, fn, total, args):
        grid = max(1, min(_cdiv(total, BLOCK), self.sm_count * 32))
        fn((grid,), (BLOCK,), args)

    def _all_finite(self, x) -> bool:
        """No Inf or NaN in ``x`` (one CuPy reduction)."""
        self._no_capture("a device-to-host read")
        return bool(self.cp.isfinite(x).all())

    def _empty(self, shape, dtype="float32"):
        kind = {dtypes.FLOAT16: self.cp.float16, dtypes.BFLOAT16: self.cp.uint16}.get(dtype, self.cp.float32)
        return self.cp.empty(tuple(shape), dtype=kind)

    def _null(self):
        if self._dummy is None:
            self._dummy = self.cp.zeros((1,), dtype=self.cp.float32)
        return self._dummy

    def _contig(self, x):
        """``x`` as a contiguous float32 array (a float16 / bfloat16 one converted)."""
        if x.dtype.char == "H":  # bfloat16 bits (uint16): by value, not as integers
            x = self._cast(x, dtypes.FLOAT32)
        y = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        return y if y.shape == x.shape else y.reshape(x.shape)  # CuPy makes 0-d arrays 1-d

    # ---- elementwise ------------------------------------------------------------------------
    def _pad(self, x, pads, mode):
        x = self._contig(x)
        t, b, l, r = pads
        *lead, H, W = x.shape
        OH, OW = H + t + b, W + l + r
        y = self._empty((*lead, OH, OW))
        if y.size == 0:
            return y
        planes = math.prod(lead)
        code = {"zeros": 0, "reflect": 1, "replicate": 2, "circular": 3}[mode]
        self._launch_1d(self._misc("ad_pad"), y.size,
                        pack_args("ad_pad", (x, y, planes, H, W, t, l, OH, OW, code)))
        return y

    def _window2d(self, x, mode, rows, cols):
        (ri, rw), (ci, cw) = rows, cols
        x = self._contig(x)
        *lead, H, W = x.shape
        OH, OW, T, S = ri.shape[0], ci.shape[0], ri.shape[1], ci.shape[1]
        y = self._empty((*lead, OH, OW))
        if y.size == 0:
            return y
        P = math.prod(lead)
        tabs = [self._table_array(a) for a in (ri, rw, ci, cw)]
        # the common small windows (bilinear 2x2, bicubic 4x4, 3x3 pooling) unrolled at build time
        spec = T if T == S and T <= 4 else 0
        fn = self._function("window.cu", "ad_window2d", {"BLOCK": BLOCK, "WT": spec, "WS": spec})
        L = 128 if OW > 64 else 64
        grid = (max(1, min(_cdiv(OW, L), 1024)), max(1, min(P * OH, 65535)))
        fn(grid, (L, 1), pack_args("ad_window2d", (x, y, *tabs, P, H, W, OH, OW, T, S, int(mode == "max"))))
        return y

    def _table_array(self, a):
        """A window table (small host array) on the device, cached by content."""
        cache = self.__dict__.setdefault("_tables", {})
        key = (self.index, a.dtype.str, a.shape, a.tobytes())
        arr = cache.get(key)
        if arr is None:
            self._no_capture("an upload")
            if len(cache) > 256:
                cache.clear()
            arr = self.cp.asarray(np.ascontiguousarray(a))
            self._count("constants", a.nbytes)
            cache[key] = arr
        return arr

    def _unary(self, op, x, **p):
        dtype = self._dtype(x)
        if dtype != dtypes.FLOAT32:  # "half_elementwise": in x's dtype (halfops.py)
            return self._unary_half(op, x, dtype, **p)
        x = self._contig(x)
        y = self._empty(x.shape)
        if y.size == 0:
            return y
        code, p0, p1, has_min, has_max = unary_kernel_args(op, p)
        self._launch_1d(self._misc("ad_unary"), y.size,
                        pack_args("ad_unary", (x, y, y.size, code, p0, p1, has_min | has_max << 1)))
        return y

    def _binary(self, op, a, b):
        cp = self.cp
        dts = {self._dtype(v) for v in (a, b) if isinstance(v, cp.ndarray)}
        if dts != {dtypes.FLOAT32}:
            if len(dts) == 1:  # "half_elementwise": arrays of one half dtype (halfops.py)
                return self._binary_half(op, a, b, dts.pop())
            a, b = (self._cast(v, dtypes.FLOAT32) if isinstance(v, cp.ndarray) else v for v in (a, b))
        a = np.float32(a) if isinstance(a, float) else a
        b = np.float32(b) if isinstance(b, float) else b
        fn = {"add": cp.add, "sub": cp.subtract, "mul": cp.multiply, "div": cp.true_divide,
              "pow": cp.power, "minimum": cp.minimum, "maximum": cp.maximum}.get(op)
        if not isinstance(a, cp.ndarray):  # scalar first
            a = cp.full((), a, dtype=cp.float32)
        if not isinstance(b, cp.ndarray):
            b = cp.full((), b, dtype=cp.float32)
        if fn is None:  # comparisons: float32 1.0 / 0.0 (NaN as in torch and elementwise_math.h)
            return self._compare(op, a, b)
        return fn(a, b, dtype=cp.float32)

    def _compare(self, op, a, b):
        """Comparisons on order-preserving integer keys of the float bits: CuPy's float compares
        flush denormals to zero (1e-38 == 0 measured on an H100), torch's do not. -0 and +0 get the
        same key; a NaN on either side makes every comparison false but ne."""
        cp = self.cp

        def key(x):
            i = cp.ascontiguousarray(x).view(cp.int32)
            return cp.where(i < 0, np.int32(-2**31) - i, i)

        ka, kb = key(a), key(b)
        nan = cp.isnan(a) | cp.isnan(b)
        r = {"eq": cp.equal, "ne": cp.equal, "lt": cp.less, "le": cp.less_equal, "gt": cp.greater,
             "ge": cp.greater_equal}[op](ka, kb) & ~nan
        return (~r if op == "ne" else r).astype(cp.float32)

    def _slice(self, x, dim, start, length, step):
        return x[(slice(None),) * dim + (slice(start, start + (length - 1) * step + 1 if length else start, step),)]

    def _cat(self, parts, dim):
        return self.cp.concatenate(parts, axis=dim)

    def _where(self, c, a, b):
        return self.cp.where(c != 0, a, b).astype(self.cp.float32, copy=False)

    def _contiguous(self, x):
        """``x`` contiguous: float32 as ``_contig``, a half array in its dtype ("half_movement")."""
        return self._contig(x) if self._dtype(x) == dtypes.FLOAT32 else self.cp.ascontiguousarray(x)

    def _reduce(self, op, x, dims, keepdim):
        cp = self.cp
        if len(dims) == 0:
            return x.astype(cp.float32, copy=True)
        if op in ("sum", "mean"):
            f = cp.sum if op == "sum" else cp.mean
            return f(x, axis=dims, dtype=cp.float64, keepdims=keepdim).astype(cp.float32)
        f = cp.amax if op == "max" else cp.amin
        return self._contig(f(x, axis=dims, keepdims=keepdim))

    # ---- tuning -----------------------------------------------------------------------------
    def _load_tuned(self) -> dict:
        return self._tiles_store().section(self._cache_key())

    @staticmethod
    def _tiles_store() -> JsonStore:
        return JsonStore(cache_dir() / CACHE_NAME)

    def _cache_key(self) -> str:
        return f"{self._desc.split(' via ')[0]}|{self.arch}|cupy{self.cp.__version__}"

    def tune(self, shapes=None, repeats: int = 5) -> dict:
        """Time every candidate tile for GEMM/conv problem sizes; store the winners on disk.

        shapes: list of ("gemm", M, N, K) / ("conv2d", x_shape, w_shape, stride, padding)."""
        cp = self.cp
        self._enter()
        shapes = shapes or [("gemm", 4096, 4096, 4096), ("gemm", 1024, 1024, 1024),
                            ("conv2d", (32, 512, 7, 7), (512, 512, 3, 3), 1, 1),
                            ("conv2d", (1, 128, 256, 256), (128, 128, 3, 3), 1, 1)]
        results = {}
        for spec in shapes:
            if spec[0] == "gemm":
                _, M, N, K = spec
                a = cp.random.standard_normal((1, M, K), dtype=cp.float32)
                b = cp.random.standard_normal((1, K, N), dtype=cp.float32)
                family = self._family("gemm")
                run = lambda cfg: self._gemm(a, b, cfg=cfg, family=family)  # noqa: E731
                key = f"{family}:gemm:{_size_class(M, N, 1)}"
            else:
                _, xs, ws, s, p = spec
                x = cp.random.standard_normal(xs, dtype=cp.float32)
                w = cp.random.standard_normal(ws, dtype=cp.float32)
                g = conv2d_geometry(xs, ws, (s, s), (p, p, p, p), (1, 1), 1)
                OH, OW = g.OH, g.OW
                y = self._empty((xs[0], ws[0], OH, OW))
                family = self._family("conv2d")
                run = lambda cfg: self._own_conv(x, w, None, y, g, 0, family, cfg=cfg)  # noqa: E731
                key = f"{family}:conv2d:{_size_class(ws[0], xs[0] * OH * OW, 1)}"
            best = None
            for cfg in self._tiles["own_conv" if family == "own" and spec[0] != "gemm" else family]:
                try:
                    run(cfg)
                    self.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(repeats):
                        run(cfg)
                    self.synchronize()
                    dt = (time.perf_counter() - t0) / repeats
                except Exception:
                    continue
                if best is None or dt < best[0]:
                    best = (dt, cfg)
            if best:
                results[key] = best[1]
        self._tuned.update(results)
        self._plan_cache.clear()
        self._launch_cache.clear()
        self._tiles_store().update(self._cache_key(), results)
        return results


