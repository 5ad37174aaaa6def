"""Training a ``Network`` on a backend: mini-batches, a loss, the autograd tape, an optimizer.

    from anydevice.backend import get_backend
    from anydevice.backend.learn.network import Network
    from anydevice.backend.learn.train import train, predict
    be = get_backend("opencl")
    res = train(net, images, labels, be=be, loss="cross_entropy", optimizer="adam", lr=1e-3,
                epochs=10, batch_size=64, seed=0)
    res.network            # the trained Network (host float32 weights); the input is unchanged
    res.losses             # the loss of every step (the value minimised: -PSNR, 1 - SSIM)
    predict(res.network, be, test_images)   # evaluation-mode outputs as a NumPy array

Batches: each epoch a permutation of the samples from ``numpy.random.default_rng(seed)`` (one
generator for the whole run), cut into ``batch_size`` pieces in order; the last, smaller piece is
a step of its own unless it is a single sample left over by a ``batch_size`` of 2 or more. A
``batch_size`` of 1 trains on one sample a step; a network with batch norm where that gives one
value per channel (features, or a 1x1 map) is refused before any work, as torch refuses it. ``steps``
counts optimizer steps and runs through as many epochs as it takes; ``epochs`` counts passes
(exactly one of the two; neither is one epoch). The batches are drawn as the run goes
(``iter_batches``: one epoch's permutation at a time), so a run of any length starts at once in
constant memory. The initial weights (for a network without
parameters) come from ``seed`` (``Network.initialized``), dropout masks from ``seed`` and the step.
Same seed, backend and thread count: the same weights, bit for bit.

Everything is checked before any work (AnyDeviceError naming the argument): the learning rate,
the batch sizes of inputs and targets, the targets' shape against the network's output, class
indices against the number of classes, shapes that do not chain through the layers (naming the
layer), and the memory a step would hold (every layer's output and its gradient at the batch
size, the parameters with their gradients and optimizer state) against ANYDEVICE_MAX_TENSOR_MB
(default: half the device's free memory).

A loss that becomes NaN or Inf stops the run: the result holds the weights the last finite loss
was computed with, and ``stopped`` says so. ``on_step(step, total, loss)`` is called after every
step (progress, live curves: a caller that reports to a server paces it by wall time, as the
Train Network node does with ``cancel.Pacer``); whatever it raises ends the run and propagates (the
network passed in is never changed). ``cancel.check()`` (ComfyUI's interrupt) runs before every
step, from the first one: nothing is planned ahead, so a cancel ends the run within one step.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ..ops.plans.args import _is_int
from ..system import cancel
from ..system.errors import AnyDeviceError
from .network import Network, layer_seed
from .optim import OPTIMIZERS, learning_rate
from .replay import TrainStep

log = logging.getLogger("anydevice")

OP = "train"
LOSSES = ("mse", "l1", "smooth_l1", "huber", "bce", "psnr", "ssim", "cross_entropy")
_LOSS_OPS = {"mse": "mse_loss", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss", "huber": "huber_loss",
             "bce": "binary_cross_entropy", "psnr": "psnr", "ssim": "ssim", "cross_entropy": "cross_entropy"}
#: bytes a step holds per element of a layer output: the output, its gradient and the op's scratch
STEP_BYTES_PER_ACTIVATION = 3 * 4
#: bytes per parameter: the weight, its gradient and two optimizer moments (Adam)
STEP_BYTES_PER_PARAM = 4 * 4


@dataclass
class TrainResult:
    network: Network
    losses: list = field(default_factory=list)
    final_loss: float = float("nan")
    steps: int = 0
    #: why the run stopped early (a NaN/Inf loss), None when it ran every step
    stopped: str | None = None


def one_target_per_input(n_inputs: int, n_targets: int) -> str | None:
    """The rule that inputs and targets pair up, its one home (``train`` and the Train node): None
    where they do, else the reason."""
    if n_targets != n_inputs:
        return f"must hold one target per input: {n_inputs} inputs, {n_targets} targets (a batch of {n_inputs})"
    return None


def _as_array(x, arg):
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception:  # noqa: BLE001
            raise AnyDeviceError(OP, arg, x, "must be an array") from None
    return x


def iter_batches(n: int, batch_size: int, seed: int, steps: int | None = None, epochs: int | None = None):
    """The batches of a run, one at a time (index arrays; see the module docstring): one epoch's
    permutation is drawn when its first batch is needed, so a run of a billion steps starts at once
    and holds one permutation, never the whole plan."""
    rng = np.random.default_rng(seed)
    bs = min(batch_size, n)
    total = plan_steps(n, batch_size, steps, epochs)
    done = 0
    while done < total:
        perm = rng.permutation(n)
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            if len(idx) == 1 and bs > 1:  # the single sample left over by batches of 2 or more
                continue
            yield idx
            done += 1
            if done == total:
                return


def plan_steps(n: int, batch_size: int, steps: int | None = None, epochs: int | None = None) -> int:
    """How many batches (optimizer steps) a run has: ``steps``, or ``epochs`` (default 1) passes."""
    if steps is not None:
        return int(steps)
    return int(epochs or 1) * _steps_per_epoch(n, min(batch_size, n))


def batch_plan(n: int, batch_size: int, seed: int, steps: int | None = None, epochs: int | None = None) -> list:
    """The batches of a run as a list (``iter_batches``, all at once). Tests give a reference
    framework the same batches with it."""
    return list(iter_batches(n, batch_size, seed, steps, epochs))


def _steps_per_epoch(n, bs):
    full, rest = divmod(n, bs)  # a rest of 1 sample (bs >= 2) is dropped
    return full + (1 if rest >= 2 else 0)


def _one_value_batch_norm(network: Network, sample_shape) -> str | None:
    """The first batch_norm layer (its name, as the parameters are named) that a one-sample batch
    of ``sample_shape`` gives a single value per channel: torch refuses it in training (the batch
    variance of one value), and so does the contract's batch_norm."""
    from .network import _param_layers
    for layer, key, s in _param_layers(network.layers, (1,) + tuple(sample_shape), ""):
        if layer["type"] == "batch_norm" and math.prod(s[2:]) == 1:
            return key
    return None


def _activation_elements(layers, s) -> int:
    """Elements of every layer output (residual bodies included) for input shape s."""
    from .network import _layer_shape
    total = 0
    for i, layer in enumerate(layers):
        if layer["type"] == "residual":
            total += _activation_elements(layer["body"], s)
        s = _layer_shape(layer, s, str(i))
        total += math.prod(s)
    return total


def step_bytes(network: Network, in_shape) -> int:
    """About the memory one training step holds at input shape ``in_shape`` (batch included)."""
    ps, bs = network.param_shapes(in_shape)
    n_params = sum(math.prod(s) for s in ps.values()) + sum(math.prod(s) for s in bs.values())
    return (STEP_BYTES_PER_ACTIVATION * (_activation_elements(network.layers, tuple(in_shape)) + math.prod(in_shape))
            + STEP_BYTES_PER_PARAM * n_params)


def _mib(n):
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _check(network, inputs, targets, be, loss, optimizer, lr, weight_decay, steps, epochs, batch_size, seed,
           in_shape, loss_params):
    """Every check that can be made before any work; returns (inputs, targets, full in_shape, steps, epochs)."""
    if not isinstance(network, Network):
        raise AnyDeviceError(OP, "network", network, "must be a Network")
    if not network.layers:
        raise AnyDeviceError(OP, "network", network, "has no layers")
    if loss not in LOSSES:
        raise AnyDeviceError(OP, "loss", loss, f"must be one of {', '.join(LOSSES)}")
    if not isinstance(optimizer, str):
        raise AnyDeviceError(OP, "optimizer", optimizer, f"must be a name ({', '.join(OPTIMIZERS)})")
    learning_rate(OP, "lr", lr)
    v = weight_decay
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v < 0:
        raise AnyDeviceError(OP, "weight_decay", v, "must be a finite number >= 0")
    if steps is not None and epochs is not None:
        raise AnyDeviceError(OP, "steps", steps, f"give steps or epochs, not both (epochs={epochs})")
    if steps is None and epochs is None:
        epochs = 1
    if steps is not None and (not _is_int(steps) or steps < 1):
        raise AnyDeviceError(OP, "steps", steps, "must be an int >= 1")
    if epochs is not None and (not _is_int(epochs) or epochs < 1):
        raise AnyDeviceError(OP, "epochs", epochs, "must be an int >= 1")
    if not _is_int(batch_size) or batch_size < 1:
        raise AnyDeviceError(OP, "batch_size", batch_size, "must be an int >= 1")
    if not _is_int(seed) or seed < 0:
        raise AnyDeviceError(OP, "seed", seed, "must be an int >= 0")
    x = _as_array(inputs, "inputs")
    t = _as_array(targets, "targets")
    if x.dtype.kind not in "fiub" or x.ndim < 2:
        raise AnyDeviceError(OP, "inputs", x, "must be a float array of shape (N, C, H, W) or (N, F)")
    if x.shape[0] < 1:
        raise AnyDeviceError(OP, "inputs", x, "holds no samples")
    unpaired = one_target_per_input(x.shape[0], t.shape[0] if t.ndim else 0)
    if unpaired:
        raise AnyDeviceError(OP, "targets", t, unpaired)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise AnyDeviceError(OP, "inputs", x, "hold NaN or Inf")
    bs = min(batch_size, x.shape[0])
    if in_shape is not None:
        shp = tuple(in_shape)
        feat = shp[1:] if len(shp) == x.ndim else shp
        if tuple(feat) != tuple(x.shape[1:]):
            raise AnyDeviceError(OP, "in_shape", in_shape, f"does not match the inputs {tuple(x.shape)}")
    full = (bs,) + tuple(x.shape[1:])
    out = network.out_shape(full)  # names the layer whose shapes do not chain
    if bs == 1:  # every batch holds one sample: fine for every layer but batch norm on one value per channel
        bn = _one_value_batch_norm(network, x.shape[1:])
        if bn is not None:
            why = (f"batch norm needs at least 2 samples per batch in training: layer {bn} (batch_norm) would get "
                   f"one value per channel from one sample of shape {tuple(x.shape[1:])}")
            if x.shape[0] == 1:
                raise AnyDeviceError(OP, "inputs", x, f"hold a single sample, and {why}")
            raise AnyDeviceError(OP, "batch_size", batch_size, f"gives batches of one sample, and {why}. Use a "
                                 f"batch_size of 2 or more (there are {x.shape[0]} samples)")
    if network.params is not None and network.in_shape is None:
        network = network.initialized(full, seed)  # checks what is there against the layers
    if loss == "cross_entropy":
        if len(out) < 2:
            raise AnyDeviceError(OP, "loss", loss, f"needs class scores (N, C, ...) from the network; it gives {out}")
        C = out[1]
        if t.dtype.kind in "iu" or (t.dtype.kind == "f" and t.shape[1:] == tuple(out[2:])
                                    and np.array_equal(t, np.round(t))):
            want = tuple(out[2:])
            if tuple(t.shape[1:]) != want:
                dims = "".join(", " + str(v) for v in want)
                raise AnyDeviceError(OP, "targets", t, f"class indices must have shape (N{dims}) for the network's "
                                     f"output {out}")
            ti = t.astype(np.int64)
            bad = (ti < 0) | (ti >= C)
            if bad.any():
                v = int(ti[bad].reshape(-1)[0])
                raise AnyDeviceError(OP, "targets", t, f"class index {v} is out of range: the network gives {C} "
                                     f"classes (0..{C - 1})")
            t = ti
        else:
            if tuple(t.shape[1:]) != tuple(out[1:]):
                dims = "".join(", " + str(v) for v in out[2:])
                raise AnyDeviceError(OP, "targets", t, f"must be class indices of shape (N{dims}) or class "
                                     f"probabilities of the network's output shape (N, {', '.join(map(str, out[1:]))})")
            t = np.ascontiguousarray(t, dtype=np.float32)
    else:
        if t.dtype.kind not in "fiub":
            raise AnyDeviceError(OP, "targets", t, "must be a float array")
        if tuple(t.shape[1:]) != tuple(out[1:]):
            raise AnyDeviceError(OP, "targets", t, f"must have the network's output shape (N, "
                                 f"{', '.join(map(str, out[1:]))}) per sample; they are {tuple(t.shape[1:])}")
        t = np.ascontiguousarray(t, dtype=np.float32)
        if loss == "bce" and ((t < 0) | (t > 1)).any():
            raise AnyDeviceError(OP, "targets", t, "must be in [0, 1] for the bce loss")
        if loss == "ssim":
            from ..ops.plans import ssim_shape
            try:
                ssim_shape("ssim", out, int((loss_params or {}).get("window_size", 11)))
            except AnyDeviceError as exc:
                raise AnyDeviceError(OP, "loss", loss, f"does not fit the network's output {out}: {exc}") from None
    if t.dtype.kind == "f" and not np.isfinite(t).all():
        raise AnyDeviceError(OP, "targets", t, "hold NaN or Inf")
    # memory: one step's activations and gradients at this batch size, before anything is allocated
    from ..system.config import tensor_limit
    need = step_bytes(network, full)
    limit, free, where = tensor_limit(be, need)
    if need > limit:
        lim = f"ANYDEVICE_MAX_TENSOR_MB={limit >> 20}" if free is None else \
            f"{_mib(limit)} (half of the {_mib(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"
        raise AnyDeviceError(OP, "batch_size", batch_size, f"a training step would hold about {_mib(need)} (every "
                             f"layer's output and gradient for {bs} samples of {tuple(x.shape[1:])}), over the limit "
                             f"of {lim}; use a smaller batch_size")
    return x, t, full, steps, epochs


def _loss(be, name, pred, target, loss_params):
    from .autograd import apply
    p = dict(loss_params or {})
    if name == "psnr":
        return apply("neg", apply("psnr", pred, target, be=be, **p), be=be)
    if name == "ssim":
        return apply("sub", 1.0, apply("ssim", pred, target, be=be, **p), be=be)
    return apply(_LOSS_OPS[name], pred, target, be=be, **p)


def train(network: Network, inputs, targets, *, be, loss: str = "mse", optimizer: str = "adam", lr: float = 1e-3,
          weight_decay: float = 0.0, steps: int | None = None, epochs: int | None = None, batch_size: int = 16,
          seed: int = 0, in_shape=None, on_step=None, loss_params: dict | None = None,
          optimizer_params: dict | None = None) -> TrainResult:
    """Train ``network`` on (inputs, targets) on backend ``be`` (see the module docstring).

    ``loss_params``: extra arguments of the loss op (smooth_l1's beta, huber's delta, psnr/ssim's
    data_range, cross_entropy's label_smoothing...). ``optimizer_params``: the optimizer's own
    (momentum, betas, eps, nesterov...), as torch.optim names them."""
    x_all, t_all, full, steps, epochs = _check(network, inputs, targets, be, loss, optimizer, lr, weight_decay, steps,
                                               epochs, batch_size, seed, in_shape, loss_params)
    from . import optim

    net = network
    if net.params is None or net.in_shape is None:
        net = net.initialized(full, seed)  # keeps the parameters there are
    pvars = net.param_vars(be, requires_grad=True)
    names = list(pvars)
    opt = optim.make(optimizer, [pvars[k] for k in names], lr=lr, weight_decay=weight_decay,
                     **dict(optimizer_params or {}))
    buffers = {k: be.to_device(np.asarray(v, np.float32), OP, k) for k, v in net.buffers.items()}
    total = plan_steps(x_all.shape[0], batch_size, steps, epochs)
    plan = iter_batches(x_all.shape[0], batch_size, seed, steps, epochs)  # lazily: one epoch at a time
    losses: list[float] = []
    stopped = None
    done = 0
    # a step with a non-finite loss changes nothing (replay.py); its weights may hold what made it non-finite
    ts = TrainStep(be, net, pvars, opt, buffers, lambda pred, tb: _loss(be, loss, pred, tb, loss_params),
                   int((loss_params or {}).get("ignore_index", -100)))
    try:
        for step, idx in enumerate(plan, 1):
            cancel.check()
            value = ts(x_all[idx], t_all[idx], seed=layer_seed(seed, f"step {step}"))
            if not math.isfinite(value):
                what = "NaN" if math.isnan(value) else "Inf"
                stopped = (f"loss became {what} at step {step}: returned the weights of step {step - 1}" if step > 1
                           else f"loss became {what} at step 1: returned the initial weights")
                log.warning("AnyDevice train: %s", stopped)
                good = ts.previous()  # the weights step - 1 computed its finite loss with
                break
            losses.append(value)
            done = step
            if on_step is not None:
                on_step(step, total, value)
        if stopped is None:
            good = ts.current()
        params = {k: np.asarray(be.to_numpy(good[0][k]), np.float32) for k in names}
        bufs = {k: np.asarray(be.to_numpy(v), np.float32) for k, v in good[1].items()}
    finally:
        ts.close()
    result = net.with_params(params, bufs)
    return TrainResult(result, losses, losses[-1] if losses else float("nan"), done, stopped)


def quantized_params(network: Network, be, fmt: str) -> dict:
    """The network's parameters with every conv / linear weight (a ``*.weight`` of 2 or more dims that the
    format can store) quantized to ``fmt`` (ops/quant.py) and handed to ``be`` packed where it reads the
    format (``to_device_quant``), the others as they are: an evaluation-only copy for ``forward(params=)``."""
    from ..ops import quant
    if fmt not in quant.FORMATS:
        raise AnyDeviceError("predict", "weights", fmt, f"is not a quantized format: one of {', '.join(quant.FORMATS)}")
    out = {}
    for k, v in (network.params or {}).items():
        a = np.asarray(v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else v)
        if k.endswith(".weight") and a.ndim >= 2 and quant.quantizable(a.shape, fmt):
            out[k] = be.to_device_quant(quant.quantize(np.ascontiguousarray(a, np.float32), fmt, op="predict"))
        else:
            out[k] = v
    return out


def predict(network: Network, be, inputs, batch_size: int | None = None, weights: str | None = None) -> np.ndarray:
    """The network's evaluation-mode output on ``inputs`` (a NumPy array), in batches of
    ``batch_size`` (None: as many samples as keep the largest layer output within a quarter of
    ANYDEVICE_MAX_TENSOR_MB / the default limit, at most 256). ``weights``: a quantized format (ops/quant.py)
    the conv / linear weights run in (``quantized_params``; None: as they are)."""
    from .autograd import no_grad
    from .network import _layer_shape
    x = np.ascontiguousarray(_as_array(inputs, "inputs"), dtype=np.float32)
    if batch_size is None:
        from ..system.config import tensor_limit
        s, largest = (1,) + tuple(x.shape[1:]), math.prod(x.shape[1:])
        for i, layer in enumerate(network.layers):
            s = _layer_shape(layer, s, str(i))
            largest = max(largest, math.prod(s))
        limit = tensor_limit(be, 4 * largest)[0]
        batch_size = int(max(1, min(256, limit // (4 * 4 * max(largest, 1)))))
    if not _is_int(batch_size) or batch_size < 1:
        raise AnyDeviceError("predict", "batch_size", batch_size, "must be an int >= 1")
    params = None if weights in (None, "", "none") else quantized_params(network, be, weights)
    outs = []
    with no_grad():
        for s in range(0, x.shape[0], batch_size):
            outs.append(network.forward(be, x[s:s + batch_size], training=False, params=params).numpy())
    return np.concatenate(outs, 0) if outs else np.zeros((0,), np.float32)
