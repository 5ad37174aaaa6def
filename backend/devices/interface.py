"""The device interface: what a device implements for the op contract (``ops/contract.py``).

``Device`` is the abstract class every backend derives from (through ``contract.Backend``, which
holds the shared ops built on these methods). It has three parts:

- the required primitives (``abstractmethod``): conversion to and from NumPy, layout, and compute.
  A device class that leaves one out cannot be instantiated;
- primitives with a working default (torch conversion through NumPy, ``_shape``, ``_mm`` through
  ``_bmm``, row bands of the chunked convs, allocation): a device overrides them where it has
  something faster;
- optional fused kernels (``_adam_step``, ``_conv2d_weight_grad``, ...): they raise
  ``NotImplementedError`` here, and a device that implements one names it in its capability set
  (``caps.fused``). Shared code asks ``be.caps``, never ``getattr`` or the backend's name.

``Capabilities`` also carries the per-device tunables that shared code reads (the conv speed
estimate that decides chunking, the fewest kernel taps that take the FFT conv) and the dtypes a
device computes in and stores.
"""
from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..system.errors import AnyDeviceError

#: a device's own array (``Device.native_types``)
Array = Any

#: every optional kernel a device can declare in ``Capabilities.fused``, with what it means
FUSED_KERNELS = {
    "adam_step": "_adam_step: one fused Adam/AdamW parameter update (learn/optim.py)",
    "conv_weight_grad": "_conv2d_weight_grad: conv2d's weight gradient (ops/convgrad.py)",
    "conv_input_grad": "_conv2d_input_grad: conv2d's input gradient (ops/convgrad.py)",
    "all_finite": "_all_finite: whether a device array holds no inf or NaN (ops/bigconv.py)",
    "write_rows": "_write_rows: host rows written in place into a device array (ops/bigconv.py)",
    "attention": "_attention_fused: scaled_dot_product_attention of a block of query rows, online softmax "
                 "(ops/attention.py)",
    "winograd": "no method: 3x3 stride-1 ungrouped convs with many channels run Winograd F(2x2, 3x3), 2.25x "
                "fewer multiplies (ops/bigconv.py estimates their time so)",
    "fft_conv": "no method: the host FFT conv pays off on this device (ops/bigconv.py)",
    "half_weights": "no method: _conv2d and _linear take a weight stored in float16/bfloat16 as it is "
                    "(the kernels convert in registers; no float32 copy of the weight)",
    "w8a8": "_linear_w8a8: linear with dynamic W8A8 quantization, int8 x int8 in int32 (ops/w8a8.py; the "
            "others run its host composite)",
    "half_elementwise": "no method: _unary and _binary take float16/bfloat16 arrays (all of one dtype) as "
                        "they are stored and return that dtype (computed in float32, rounded once)",
    "half_movement": "no method: _permute, _expand, _slice, _slice1, _cat and _contiguous take float16/bfloat16 "
                     "arrays as they are stored and move the 16-bit values unchanged (nothing converted)",
    "half_norm": "no method: _norm_rows takes a float16/bfloat16 input as it is stored (its result is float32); "
                 "_norm_rows_affine (\"norm_affine\") the input, weight and bias (its result in their dtype)",
    "half_gemm": "no method: _mm takes float16/bfloat16 operands as they are stored (a plain 2-D matmul's "
                 "activation as well as its weight; packed to float32 panels by the GEMM, result float32)",
    "norm_affine": "_norm_rows_affine: _norm_rows with the norm's per-channel weight and bias (and a compiled "
                   "graph's GroupNorm + SiLU pair's silu) applied in the same pass, in the input's dtype "
                   "(layer_norm, group_norm; ops/layers.py)",
    "batch_norm": "_batch_norm_train, _batch_norm_grad: batch_norm in training mode (the batch's statistics, "
                  "torch's running statistics update) and its backward, each in one pass over a channel "
                  "(ops/layers.py, learn/autograd/rules_layers.py)",
    "cross_entropy": "_cross_entropy_rows, _cross_entropy_grad: cross_entropy with class-index targets (no class "
                     "weights, no label smoothing) and its backward, each in one pass over the positions "
                     "(ops/layers.py, learn/autograd/rules_math.py)",
    "conv_prelu": "_conv2d_prelu: a compiled graph's conv2d whose one reader is a PReLU, the PReLU applied in the "
                  "conv's own pass where its path allows (compile/aten_ops.py)",
    "prelu": "_prelu_fused: torch's prelu (a slope per channel) in one pass (ops/layers.py _prelu)",
    "graph_replay": "_capture, _launch_graph, _copy_into, _graph_valid (and _graph_checks where a recording keeps "
                    "data-dependent checks): a compiled graph's device work captured once (a CUDA graph; OpenCL: a "
                    "recorded command list) and replayed by later calls of the same signature (compile/replay.py)",
    "replay": "record, recording, _pair_buffers, _assign, _forget_values: the commands a piece of host code "
              "queues, recorded while it runs and enqueued again from prepared arguments without it (training "
              "steps: learn/replay.py; devices/opencl/replay.py)",
    "half_attention": "no method: _attention_fused takes the key and value (kt, v) of a half model's attention as "
                      "they are stored (scaled_dot_product_attention keeps them half; its result is float32)",
    "half_linear": "no method: _linear takes a float16/bfloat16 input as it is stored (the contract keeps it so where "
                   "the result has its dtype); the result is float32, or that dtype where the weight is half of it too",
    "half_conv": "no method: _conv2d takes a float16/bfloat16 input as it is stored (the device converts it "
                 "where a path does not read it so); its result is float32 or the input's dtype",
    "linear_weight": "no method: _linear reads its (N, K) weight as stored at least as fast as _mm reads the weight's "
                     "transpose, so a compiled graph keeps a linear weight as it is rather than its folded transpose "
                     "(compile/lowering.py: matmul's b as quant.Transposed, the product through _linear)",
}


@dataclass(frozen=True)
class Capabilities:
    """What one device can do: dtypes, optional fused kernels and the tunables shared code reads."""

    #: dtype names the device computes in
    compute_dtypes: frozenset = frozenset({"float32"})
    #: dtype names the device stores arrays in (``to_device(..., dtype=...)`` refuses the others)
    storage_dtypes: frozenset = frozenset({"float32"})
    #: names of the optional kernels the device implements (keys of ``FUSED_KERNELS``)
    fused: frozenset = field(default_factory=frozenset)
    #: quantized weight formats (ops/quant.py) the device keeps packed and its linear / conv2d read in
    #: their kernels (``_from_quant``); a weight in another format is dequantized for the op that uses it
    quant_formats: frozenset = field(default_factory=frozenset)
    #: conv multiply-adds per second, (few channels: depthwise-like, many: GEMM-like), measured and
    #: rounded down; only decides whether a conv is cut into chunks. None: a GPU's rate
    #: (``ops/bigconv.DEFAULT_MACS_PER_S``)
    macs_per_s: tuple | None = None
    #: the fewest kernel taps (KH*KW) that take the FFT conv where ``fused`` has "fft_conv"
    fft_min_taps: int = 1 << 30


class Device(abc.ABC):
    """A device: the primitives the shared ops (``contract.Backend``) are built on.

    Arrays are the device's own (``native_types``); shapes are tuples of ints; every primitive
    returns a new array or a read-only view and never writes into its inputs. Primitives compute in
    float32; a device that stores half dtypes (``caps.storage_dtypes``) converts with ``_cast``, and the
    contract hands primitives float32 arrays only (ops/dtypes.py).
    """

    #: the device's array types (an input of one of these types is used as it is)
    native_types: tuple[type, ...] = ()
    #: what the device can do (an instance may replace it, e.g. by the device it found)
    caps: Capabilities = Capabilities()
    #: whether GEMMs and convs may use TF32 tensor cores (ANYDEVICE_ALLOW_TF32; the self-check's bar follows)
    tf32: bool = False

    @property
    def capabilities(self) -> Capabilities:
        """The capability set (``caps``)."""
        return self.caps

    # ---- conversion (required) -------------------------------------------------------------
    @abc.abstractmethod
    def _from_numpy(self, a: np.ndarray, dtype: str = "float32") -> Array:
        """A float32 NumPy array -> a native array stored as ``dtype`` (may share memory; never written)."""

    @abc.abstractmethod
    def _to_numpy(self, x: Array) -> np.ndarray:
        """A native array -> a float32 NumPy array."""

    # ---- layout (required) -----------------------------------------------------------------
    @abc.abstractmethod
    def _reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        """x with a new shape of the same size (a view where the layout allows it)."""

    @abc.abstractmethod
    def _permute(self, x: Array, axes: tuple[int, ...]) -> Array:
        """x with its dims permuted (a copy or a read-only view)."""

    @abc.abstractmethod
    def _expand(self, x: Array, shape: tuple[int, ...]) -> Array:
        """x broadcast to ``shape`` (materialised if the device needs it)."""

    @abc.abstractmethod
    def _concat_channels(self, parts: list[Array], n: int, c: int, h: int, w: int) -> Array:
        """k arrays (n, c, h, w) stacked into (n, k*c, h, w)."""

    @abc.abstractmethod
    def _slice1(self, x: Array, i: int) -> Array:
        """x[:, i] of a 5-D (n, k, ...) array."""

    @abc.abstractmethod
    def _slice(self, x: Array, dim: int, start: int, length: int, step: int) -> Array:
        """x[..., start:start + length*step:step] along ``dim`` (in range; a view where it can)."""

    @abc.abstractmethod
    def _cat(self, parts: list[Array], dim: int) -> Array:
        """Same-rank arrays concatenated along ``dim`` (a new array)."""

    @abc.abstractmethod
    def _contiguous(self, x: Array) -> Array:
        """x in C order (x itself when it already is)."""

    @abc.abstractmethod
    def _where(self, c: Array, a: Array, b: Array) -> Array:
        """a where c != 0 (NaN counts as true) else b; c, a, b broadcast (a new array)."""

    # ---- compute (required) ----------------------------------------------------------------
    @abc.abstractmethod
    def _bmm(self, a: Array, b: Array) -> Array:
        """a (Ba, M, K) @ b (Bb, K, N) with Ba, Bb in {1, B} -> (B, M, N)."""

    @abc.abstractmethod
    def _conv2d(self, x: Array, w: Array, bias: Array | None, stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int) -> Array:
        """Zero-padded conv2d of x (N, C, H, W) by w; pads = (top, bottom, left, right); bias None or (Cout,)."""

    @abc.abstractmethod
    def _conv_transpose2d(self, x: Array, w: Array, bias: Array | None, stride: tuple[int, int],
                          padding: tuple[int, int], output_padding: tuple[int, int], dilation: tuple[int, int],
                          groups: int) -> Array:
        """torch's conv_transpose2d of a 4-D x with checked, paired arguments."""

    @abc.abstractmethod
    def _pad(self, x: Array, pads: tuple[int, int, int, int], mode: str) -> Array:
        """x padded by (top, bottom, left, right) on its last two dims (reflect/replicate/circular/zeros)."""

    @abc.abstractmethod
    def _window2d(self, x: Array, mode: str, rows: tuple, cols: tuple) -> Array:
        """x (..., H, W) -> (..., OH, OW) through a row and a column tap table (ops/windows.py):
        (idx int32 (O, T), wgt float32 (O, T)), idx -1 skipping a tap; mode "sum" (weighted sum of
        valid taps) or "max" (NaN propagating, -inf where no tap is valid)."""

    @abc.abstractmethod
    def _unary(self, op: str, x: Array, **params) -> Array:
        """An elementwise op of ``plans.UNARY_OPS`` with its checked parameters."""

    @abc.abstractmethod
    def _binary(self, op: str, a: Array, b: Array) -> Array:
        """An op of ``plans.BINARY_OPS`` (or a comparison); a, b native arrays or Python floats
        (not both floats), broadcasting as torch."""

    @abc.abstractmethod
    def _reduce(self, op: str, x: Array, dims: tuple[int, ...], keepdim: bool) -> Array:
        """sum/mean/max/min/prod... of ``plans.REDUCE_OPS`` over ``dims`` (float32 result)."""

    # ---- primitives with a default ---------------------------------------------------------
    def _from_torch(self, t, dtype: str = "float32"):
        """A torch tensor -> a native array stored as ``dtype`` (default: through NumPy)."""
        import torch
        return self._from_numpy(t.detach().to("cpu", dtype=torch.float32).numpy(), dtype)

    def _wrap_host(self, a: np.ndarray):
        """A native float32 array that uses the memory of ``a`` (a float32 NumPy array) as it is, no copy,
        or None where the device cannot (the default: the caller copies then, ``_from_numpy``). Asked only
        by ``to_device(..., share=True)``, whose caller promises that nobody writes ``a`` while the result
        lives (the compiled weights: a weight written in place gets a new version and is asked for again);
        the result holds ``a`` (and so the memory under it) for as long as it exists, and no op writes it."""
        return None

    def _from_quant(self, q):
        """A host ``ops.quant.QTensor`` in one of ``caps.quant_formats`` -> the device's packed form, which
        ``_linear`` and ``_conv2d`` take as their weight (and ``_dequant`` converts). Asked only for those
        formats."""
        raise NotImplementedError(f"{type(self).__name__} keeps no quantized weights")

    def _dequant(self, w):
        """A weight in the device's packed quantized form -> a float32 native array (for an op whose
        kernels do not read the format; a copy for that op only)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no quantized weights")

    def _to_torch(self, x, like):
        """A native array -> a float32 torch tensor on ``like``'s device (default: through NumPy)."""
        import torch
        a = self._to_numpy(x)
        out = torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape))  # keeps 0-d results 0-d
        return out if like.device.type == "cpu" else out.to(like.device)

    def _shape(self, x) -> tuple[int, ...]:
        """The shape of a native array."""
        return tuple(x.shape)

    def _mm(self, a, b):
        """a (M, K) @ b (K, N) (default: through ``_bmm``)."""
        M, N = self._shape(a)[0], self._shape(b)[1]
        y = self._bmm(self._reshape(a, (1,) + self._shape(a)), self._reshape(b, (1,) + self._shape(b)))
        return self._reshape(y, (M, N))

    def _empty(self, shape: tuple[int, ...], dtype: str = "float32"):
        """An uninitialised native array of ``shape`` stored as ``dtype`` (default: through NumPy)."""
        return self._from_numpy(np.empty(tuple(shape), np.float32), dtype)

    def _band_rows(self, x, a: int, b: int):
        """x[:, :, a:b] of a 4-D array (a chunked conv's row band)."""
        return x[:, :, a:b]

    def _band_batch(self, x, a: int, b: int):
        """x[a:b] along the first dim (a chunked conv's batch part)."""
        return x[a:b]

    def _band_cat(self, parts: list, axis: int):
        """The chunked conv's parts joined along ``axis``."""
        return self._cat(parts, axis)

    def _precision(self):
        """A context manager for the device's full float32 precision (vendor libraries that default
        to TF32 turn it off inside)."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for queued device work (used by benchmarks)."""

    def device_free_bytes(self) -> int | None:
        """Free memory on the device in bytes, or None where the device's memory is the host's RAM (the
        default; system/memstat reads the host then)."""
        return None

    def torch_device(self):
        """The torch device PyTorch runs on for the same hardware (benchmarks compare against it): the CPU
        unless a device says otherwise."""
        import torch
        return torch.device("cpu")

    @property
    def device(self) -> str:
        """Human-readable device description."""
        return "unknown device"

    # ---- optional fused kernels (declared in caps.fused) -----------------------------------
    def _adam_step(self, param, grad, m, v, vmax, w: float, lerp_form: bool, beta2: float, omb2: float,
                   bc2_sqrt: float, eps: float, neg_step: float) -> tuple:
        """"adam_step": one Adam update -> new (param, exp_avg, exp_avg_sq, max_exp_avg_sq or None)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'adam_step'")

    def _conv2d_weight_grad(self, x, gy, wshape: tuple, stride: tuple, pads: tuple, dilation: tuple,
                            groups: int):
        """"conv_weight_grad": conv2d's gW (Cout, Cin/G, KH, KW), or None to take the shared path."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'conv_weight_grad'")

    def _conv2d_input_grad(self, gy, w, in_hw: tuple, stride: tuple, pads: tuple, dilation: tuple,
                           groups: int):
        """"conv_input_grad": conv2d's gx (N, Cin, H, W), or None to take the shared path."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'conv_input_grad'")

    def _norm_rows_affine(self, x, eps: float, w, b, groups: int, inner: int, act: str | None = None):
        """"norm_affine": each row of the contiguous (rows, n) ``x`` normalised as ``_norm_rows``, then
        ``* w[ch] + b[ch]`` (w, b None or flat arrays of x's dtype; ch = (row % groups) * (len / groups) +
        column // inner), then the activation ``act`` (None or "silu"), in one pass, in x's dtype; or None to
        take the composite path."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'norm_affine'")

    def _batch_norm_train(self, x, w, b, rm, rv, momentum: float, eps: float):
        """"batch_norm": batch_norm in training mode of the float32 (N, C, L) ``x`` -> (y of x's shape, new
        running mean, new running var), the last two None when ``rm`` or ``rv`` is None (w, b, rm, rv: None or
        flat (C,) float32; the update as torch's, the variance unbiased); or None to take the composite."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'batch_norm'")

    def _batch_norm_grad(self, gy, x, w, eps: float, need_input: bool):
        """"batch_norm": the backward of ``_batch_norm_train`` for dL/dy ``gy`` (x's shape) -> (dL/dx, or None
        unless ``need_input``; dL/dw (C,); dL/db (C,)); or None to take the composite."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'batch_norm'")

    def _cross_entropy_rows(self, x, t, ignore_index: int):
        """"cross_entropy": -log_softmax(x)[t] at each position of the float32 (N, C, L) ``x`` (the classes along
        C) -> (N * L,), 0 where the host int64 class index ``t`` (N * L,) is ignore_index; or None (the
        composite runs)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'cross_entropy'")

    def _cross_entropy_grad(self, x, t, ignore_index: int, gy, per_position: bool, den: float):
        """"cross_entropy": dL/dx (x's shape) of ``_cross_entropy_rows`` for dL/dloss ``gy`` (one value, or
        (N * L,) with ``per_position``) divided by ``den``; or None (the composite runs)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'cross_entropy'")

    def _conv2d_prelu(self, x, w, b, stride, padding, dilation, groups: int, slope):
        """"conv_prelu": prelu(conv2d(x, w, b, stride, padding, dilation, groups), slope) of native arrays, the
        PReLU inside the conv's pass where it can be (the result as the two ops give it)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'conv_prelu'")

    def _prelu_fused(self, x, w, C: int, inner: int):
        """"prelu": x > 0 ? x : x * w[(i // inner) % C] (i the flat index; w (C,) of x's dtype, C 1: one slope)
        in one pass, in x's dtype; or None to take the composite path."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'prelu'")

    def _capture(self, fn):
        """"graph_replay": (graph, fn()): fn's device work recorded, not run, into a graph of its own memory
        (its results live there); raises where fn transfers, synchronises or cannot be recorded. A device that
        records while the work runs (OpenCL) may return (None, fn()): the work ran, its results are valid, no
        graph was kept (``_capture_reason`` says why)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'graph_replay'")

    def _launch_graph(self, graph) -> None:
        """"graph_replay": run a ``_capture``d graph once more (queued, on the device's current stream)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'graph_replay'")

    def _copy_into(self, dst, src) -> None:
        """"graph_replay": write ``src``'s values into ``dst`` (same shape and dtype; queued)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'graph_replay'")

    def _graph_valid(self, graph) -> bool:
        """"graph_replay": whether a captured graph may still run (False after the device let its memory go)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'graph_replay'")

    def _capture_reason(self) -> str:
        """"graph_replay": why the last ``_capture`` that returned no graph kept none."""
        return ""

    def _graph_checks(self, graph) -> bool:
        """"graph_replay": whether the data-dependent checks a capture assumed held in the last launch (waits for
        it where there are any); False: its outputs may be wrong, the graph runs op by op. A capture that keeps
        none (a CUDA graph): True."""
        return True

    def record(self, inputs: dict | None = None):
        """"replay": a context manager yielding a recording of the commands its block queues (``inputs``:
        name -> host array the block uploads; ``replay(inputs)`` uploads new ones in their place)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'replay'")

    def recording(self):
        """"replay": the recording open on the calling thread, or None."""
        return None

    def _all_finite(self, x) -> bool:
        """"all_finite": True when x holds no inf and no NaN."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'all_finite'")

    def _write_rows(self, out, start: int, rows: np.ndarray) -> None:
        """"write_rows": float32 host rows written into ``out`` (an ``_empty`` array) from element ``start``."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'write_rows'")

    def kernel_launches(self) -> int | None:
        """Kernels this device has launched since it was made (``anydevice bench --model``'s launches per
        call); None where the device does not count them (default)."""
        return None

    def _memory_peak(self, reset: bool = False) -> int | None:
        """The most bytes this device's arrays held at once since the last ``reset`` (which starts a new
        count from what is held now); None where the device does not count (default)."""
        return None

    def _attention_fused(self, q, kt, v, mask, scale: float, causal: bool, row0: int = 0):
        """"attention": softmax(q @ kt * scale + mask) @ v without the score matrix in memory; q (..., L, E),
        kt = k^T (..., E, S), v (..., S, Ev), mask None or additive float broadcast to (..., L, S), causal:
        query i sees keys j <= row0 + i (q: the rows from row0 of the whole query). The (..., L, Ev)
        output, or None to take the composite path."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'attention'")

    def _linear_w8a8(self, x, wq, b):
        """"w8a8": linear_w8a8 of float32 x (..., K) by the device's packed int8 weight wq (N, K) (+ b (N,)):
        rows of x quantized at run time, int32 products, scales in the epilogue (ops/w8a8.py's math). Never
        asked for an empty product (no rows, outputs or inputs: linear_w8a8 runs the host composite then)."""
        raise NotImplementedError(f"{type(self).__name__} has no fused kernel 'w8a8'")

    # ---- dtypes ------------------------------------------------------------------------------
    def _dtype(self, x: Array) -> str:
        """The dtype name ``x`` is stored as (ops/dtypes.py; float32 unless the device stores others)."""
        from ..ops import dtypes
        return dtypes.of(x) or dtypes.FLOAT32

    def _cast(self, x: Array, dtype: str) -> Array:
        """x stored as ``dtype`` (a dtype of ``caps.storage_dtypes``), rounded to nearest even; x itself when
        it already is (default: through NumPy; a device with a conversion kernel overrides it)."""
        if self._dtype(x) == dtype:
            return x
        return self._from_numpy(self._to_numpy(x), dtype)

    def _storage_dtype(self, op: str, dtype) -> str:
        """The dtype name to store as (None: float32), refused with an AnyDeviceError naming the op,
        'dtype' and the value when the device cannot store it."""
        if dtype is None:
            return "float32"
        from ..ops import dtypes
        name = dtypes.name(dtype)
        if name not in self.caps.storage_dtypes:
            raise AnyDeviceError(op, "dtype", dtype, f"is not a dtype the {getattr(self, 'name', 'device')} "
                                 f"device stores (it stores {', '.join(sorted(self.caps.storage_dtypes))})")
        return name
