"""PyTorch backend: the vendor path, serving cpu, cuda, rocm, xpu and mps through torch devices.

Each op is one call into torch.nn.functional (cuDNN / MIOpen / oneDNN / MPS underneath), so it adds
only the contract's validation to calling torch directly. Native arrays are torch tensors on the
backend's device; CPU inputs are moved there and results moved back to the input's device.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ...ops import dtypes
from ...ops.contract import Backend, Capabilities, tf32_allowed

#: registry name -> torch device type
DEVICE_TYPES = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps",
                "torch-cuda": "cuda", "torch-rocm": "cuda"}


def _torch():
    import torch
    return torch


def probe(name: str) -> dict:
    """Registry probe: {available, reason, devices}. Never raises."""
    ok, reason, devices = _probe(name)
    return {"available": ok, "reason": reason, "devices": devices}


def create(name: str, index: int) -> "TorchBackend":
    return TorchBackend(name, index)


def _probe(name: str) -> tuple[bool, str, list[str]]:
    """(available, reason, device descriptions) for a torch device type.

    Never raises: a missing torch, a CPU-only build or a missing driver is a reason."""
    try:
        torch = _torch()
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            return False, "PyTorch is not installed (pip install torch)", []
        return False, f"PyTorch not importable ({type(exc).__name__}: {exc})", []
    except Exception as exc:  # a broken install raising anything
        return False, f"PyTorch not importable ({type(exc).__name__}: {exc})", []
    try:
        dev = DEVICE_TYPES[name]
        if dev == "cpu":
            return True, "", [f"CPU via PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"]
        if dev == "cuda":
            hip = getattr(torch.version, "hip", None)
            want_hip = name.endswith("rocm")
            if want_hip and not hip:
                return False, f"PyTorch {torch.__version__} is not a ROCm build", []
            if not want_hip and hip:
                return False, f"PyTorch {torch.__version__} is a ROCm build (use rocm)", []
            if not want_hip and not torch.version.cuda:
                return False, f"PyTorch {torch.__version__} is a CPU-only build (no CUDA)", []
            if not torch.cuda.is_available():
                return False, "no GPU visible to PyTorch (driver missing or no device)", []
            return True, "", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if dev == "xpu":
            xpu = getattr(torch, "xpu", None)
            if xpu is None or not xpu.is_available():
                return False, "no Intel XPU visible to PyTorch (torch.xpu unavailable)", []
            return True, "", [xpu.get_device_name(i) for i in range(xpu.device_count())]
        if dev == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is None or not mps.is_available():
                return False, "no Apple MPS device (not macOS on Apple silicon, or PyTorch without MPS)", []
            return True, "", ["Apple GPU (MPS)"]
    except Exception as exc:
        return False, f"probing {name} failed: {type(exc).__name__}: {exc}", []
    return False, f"unknown torch device {name}", []


def switches_mutable(backends):
    """A context in which torch.backends' cuDNN switches may be set: torch's testing utilities
    freeze them (``disable_global_flags``); its own ``flags()`` context lifts that the same way."""
    allow = getattr(backends, "__allow_nonbracketed_mutation", None)
    return allow() if allow is not None else contextlib.nullcontext()


class TorchBackend(Backend):
    kind = "vendor"

    def __init__(self, name: str = "cpu", index: int = 0):
        super().__init__(index, name)
        self.torch = torch = _torch()
        dev_type = DEVICE_TYPES[name]
        self.dev = torch.device(dev_type if dev_type in ("cpu", "mps") else f"{dev_type}:{index}")
        self.native_types = ()  # every tensor goes through _from_torch (device + dtype check)
        # PyTorch's CPU conv speed (chunking estimate, devices/interface.py); a GPU's is the default
        self.caps = Capabilities(macs_per_s=(0.25e9, 2e10) if name == "cpu" else None,
                                 storage_dtypes=frozenset(dtypes.FLOATS))  # computed in float32 (the contract)
        self.F = torch.nn.functional
        self.f32 = torch.float32
        ok, _, names = _probe(name)
        self._desc = names[index] if ok and index < len(names) else str(self.dev)
        # PyTorch lets cuDNN convs use TF32 by default (and ComfyUI may turn it on for matmuls):
        # the pack computes in FP32 unless ANYDEVICE_ALLOW_TF32=1 says otherwise
        self.tf32 = tf32_allowed()

    class _FP32:
        """Within: cuDNN / cuBLAS in full FP32 (TF32 off), the caller's switches restored after."""

        def __init__(self, torch):
            self.b = torch.backends

        def __enter__(self):
            with switches_mutable(self.b):
                self.saved = (self.b.cudnn.allow_tf32, self.b.cuda.matmul.allow_tf32)
                self.b.cudnn.allow_tf32 = False
                self.b.cuda.matmul.allow_tf32 = False

        def __exit__(self, *exc):
            with switches_mutable(self.b):
                self.b.cudnn.allow_tf32, self.b.cuda.matmul.allow_tf32 = self.saved
            return False

    def _precision(self):
        import contextlib
        if self.dev.type != "cuda" or self.tf32:
            return contextlib.nullcontext()
        return self._FP32(self.torch)

    @property
    def device(self) -> str:
        # the CPU description already names PyTorch ("CPU via PyTorch 2.x (n threads)")
        return self._desc if " via PyTorch " in self._desc else f"{self._desc} via PyTorch {self.torch.__version__}"

    def device_free_bytes(self):
        """A CUDA/ROCm GPU's free memory plus what PyTorch's caching allocator holds free; None elsewhere
        (the CPU's is the host's RAM; MPS/XPU give no reading)."""
        if self.dev.type != "cuda":
            return None
        free, _total = self.torch.cuda.mem_get_info(self.dev)
        spare = self.torch.cuda.memory_reserved(self.dev) - self.torch.cuda.memory_allocated(self.dev)
        return int(free + max(0, spare))

    def torch_device(self):
        return self.dev

    def synchronize(self):
        t = self.dev.type
        if t == "cuda":
            self.torch.cuda.synchronize(self.dev)
        elif t == "xpu":
            self.torch.xpu.synchronize()
        elif t == "mps":
            self.torch.mps.synchronize()

    # ---- conversion -------------------------------------------------------------------------
    def _from_numpy(self, a, dtype="float32"):
        if any(st < 0 for st in a.strides):  # torch takes no negative strides (np.flip views)
            a = np.ascontiguousarray(a)
        t = self.torch.as_tensor(a, device=self.dev)
        return t if dtype == "float32" else t.to(dtypes.torch_dtype(dtype))

    def _from_torch(self, t, dtype="float32"):
        want = self.f32 if dtype == "float32" else dtypes.torch_dtype(dtype)
        if t.dtype is want and t.device == self.dev and not t.requires_grad:
            return t
        return t.detach().to(self.dev, dtype=want)

    def _to_numpy(self, x):
        x = x.detach().cpu()
        return (x.float() if x.dtype in (self.torch.float16, self.torch.bfloat16) else x).numpy()

    def _cast(self, x, dtype):
        want = dtypes.torch_dtype(dtype)
        return x if x.dtype is want else x.to(want)

    def _to_torch(self, x, like):
        return x if x.device == like.device else x.to(like.device)

    def _reshape(self, x, shape):
        return x.reshape(shape)

    def _permute(self, x, axes):
        return x.permute(*axes)

    def _expand(self, x, shape):
        return x.expand(*shape)

    def _concat_channels(self, parts, n, c, h, w):
        return self.torch.cat(parts, dim=1)

    def _slice1(self, x, i):
        return x[:, i]

    # ---- compute ----------------------------------------------------------------------------
    def _bmm(self, a, b):
        with self._precision():
            return self.torch.matmul(a, b)

    def _mm(self, a, b):
        with self._precision():
            return self.torch.mm(a, b)

    def _linear(self, x, w, b):
        if w.dim() == 1:  # F.linear refuses a 1-D weight with a bias: the generic matmul + add path
            return super()._linear(x, w, b)
        with self._precision():
            return self.F.linear(x, w, b)

    def _pad(self, x, pads, mode):
        t, b, l, r = pads
        mode = {"zeros": "constant"}.get(mode, mode)
        return self.F.pad(x, (l, r, t, b), mode=mode)

    def _window2d(self, x, mode, rows, cols):
        (ri, rw), (ci, cw) = rows, cols
        y = self._window_axis(x, ci, cw, -1, mode)  # columns first: the smaller gather
        return self._window_axis(y, ri, rw, -2, mode)

    def _window_axis(self, x, idx, wgt, axis, mode):
        """One table along ``axis``: per tap, gather (index_select), weight and accumulate; skipped
        taps (idx -1) are masked out, so a NaN there never reaches the sum."""
        torch = self.torch
        shape = list(x.shape)
        shape[axis] = idx.shape[0]
        if idx.size == 0 or x.numel() == 0:
            return x.new_zeros(shape)
        ti = torch.as_tensor(idx.astype(np.int64), device=self.dev)
        tw = torch.as_tensor(np.array(wgt), device=self.dev)
        bshape = (-1, 1) if axis == -2 else (-1,)
        acc = None
        for j in range(idx.shape[1]):
            valid = ti[:, j] >= 0
            src = torch.index_select(x, x.dim() + axis, ti[:, j].clamp(min=0))
            keep = valid.reshape(bshape)
            if mode == "max":
                src = src.masked_fill(~keep, float("-inf"))
                acc = src if acc is None else torch.maximum(acc, src)
            else:
                src = (src * tw[:, j].reshape(bshape)).masked_fill(~keep, 0.0)
                acc = src if acc is None else acc + src
        return acc

    def _conv2d(self, x, w, bias, stride, pads, dilation, groups):
        t, b, l, r = pads
        with self._precision():
            if t == b and l == r:
                return self.F.conv2d(x, w, bias, stride, (t, l), dilation, groups)
            x = self.F.pad(x, (l, r, t, b))
            return self.F.conv2d(x, w, bias, stride, 0, dilation, groups)

    def _conv_transpose2d(self, x, w, bias, stride, padding, output_padding, dilation, groups):
        with self._precision():
            return self.F.conv_transpose2d(x, w, bias, stride, padding, output_padding, groups, dilation)

    def _unary(self, op, x, **p):
        torch, F = self.torch, self.F
        if op == "clamp":
            return torch.clamp(x, p["min"], p["max"])
        if op == "gelu":
            return F.gelu(x, approximate=p["approximate"])
        if op == "elu":
            return F.elu(x, p["alpha"])
        if op == "leaky_relu":
            return F.leaky_relu(x, p["negative_slope"])
        if op == "softplus":
            return F.softplus(x, p["beta"], p["threshold"])
        fn = {"abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "log": torch.log,
              "sqrt": torch.sqrt, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
              "silu": F.silu, "rsqrt": torch.rsqrt, "erf": torch.erf, "sin": torch.sin,
              "cos": torch.cos}[op]
        return fn(x)

    def _binary(self, op, a, b):
        torch = self.torch
        if op in ("minimum", "maximum"):  # torch.minimum takes tensors only
            if not isinstance(a, torch.Tensor):
                a = torch.tensor(a, dtype=torch.float32, device=self.dev)
            if not isinstance(b, torch.Tensor):
                b = torch.tensor(b, dtype=torch.float32, device=self.dev)
        fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
              "pow": torch.pow, "minimum": torch.minimum, "maximum": torch.maximum}.get(op)
        if fn is None:  # comparisons: float32 1.0 / 0.0
            cmp = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}[op]
            if not isinstance(a, torch.Tensor):
                a = torch.tensor(a, dtype=torch.float32, device=self.dev)
            return cmp(a, b).to(torch.float32)
        if not isinstance(a, torch.Tensor):  # scalar first: torch.sub(2.0, t) is not allowed
            a = torch.tensor(a, dtype=torch.float32, device=self.dev)
        return fn(a, b)

    def _slice(self, x, dim, start, length, step):
        return x[(slice(None),) * dim + (slice(start, start + (length - 1) * step + 1 if length else start, step),)]

    def _cat(self, parts, dim):
        return self.torch.cat(parts, dim=dim)

    def _where(self, c, a, b):
        return self.torch.where(c != 0, a, b)

    def _contiguous(self, x):
        return x.contiguous()

    def _reduce(self, op, x, dims, keepdim):
        torch = self.torch
        if len(dims) == 0:  # torch reads dim=() as "all dims"; reducing nothing is a copy
            return x.clone()
        if op == "sum":
            return torch.sum(x, dim=dims, keepdim=keepdim)
        if op == "mean":
            return torch.mean(x, dim=dims, keepdim=keepdim)
        if op == "max":
            return torch.amax(x, dim=dims, keepdim=keepdim)
        return torch.amin(x, dim=dims, keepdim=keepdim)
