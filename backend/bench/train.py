"""``anydevice bench --train``: one full training step (forward, backward, Adam) per backend against
PyTorch eager autograd + ``torch.optim.Adam`` on the same device, measured in the same run.

Cases: the digits CNN of the acceptance test (conv-BN-ReLU x2, linear; 1x8x8 inputs, 10 classes,
cross entropy) at batch 64, and a small residual denoiser (conv 3->32, two residual blocks of
conv-ReLU-conv, conv 32->3; MSE) at batch 16 on 3x64x64 patches. Both sides start from the same
weights (``Network.to_torch``) and take the same batch every step. As in bench.py the two run in
alternating blocks, each block after one untimed step, and the ratio is PyTorch's median step
time over ours (> 1: ours faster). Rows are bench.py's ``Row``; "GFLOPS" counts 3x the forward
pass's multiply-adds of the convolutions and linear layers (forward, input and weight gradients).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from .rows import Row, _sync_torch, _torch_device_for, machine_line
from ..learn.network import Network


@dataclass
class TrainCase:
    name: str
    network: Network
    in_shape: tuple      # with the batch
    loss: str            # "cross_entropy" (targets: classes = the output's dim 1) or "mse"
    lr: float = 1e-3


def digits_cnn() -> Network:
    return (Network.empty()
            .add("conv2d", out_channels=16, kernel_size=3, padding=1).add("batch_norm").add("activation", name="relu")
            .add("conv2d", out_channels=32, kernel_size=3, stride=2, padding=1).add("batch_norm")
            .add("activation", name="relu").add("flatten").add("linear", out_features=10))


def residual_denoiser(width: int = 32, blocks: int = 2) -> Network:
    net = Network.empty().add("conv2d", out_channels=width, kernel_size=3, padding=1).add("activation", name="relu")
    for _ in range(blocks):
        net = net.residual(Network.empty().add("conv2d", out_channels=width, kernel_size=3, padding=1)
                           .add("activation", name="relu").add("conv2d", out_channels=width, kernel_size=3, padding=1))
    return net.add("conv2d", out_channels=3, kernel_size=3, padding=1)


def cases() -> list[TrainCase]:
    """The training steps measured (built when asked: nothing is built, and no setting read, on import)."""
    return [
        TrainCase("train digits CNN b64 (Adam)", digits_cnn(), (64, 1, 8, 8), "cross_entropy", 1e-2),
        TrainCase("train residual denoiser b16 3x64x64 (Adam)", residual_denoiser(), (16, 3, 64, 64), "mse", 1e-3),
    ]


def forward_flops(net: Network, in_shape) -> float:
    """Multiply-adds x 2 of the convolutions and linear layers of one forward pass."""
    total = 0.0

    def walk(layers, s):
        nonlocal total
        from ..learn.network import _layer_shape, _two
        for i, layer in enumerate(layers):
            out = _layer_shape(layer, s, str(i))
            if layer["type"] == "conv2d":
                kh, kw = _two(layer["kernel_size"])
                total += 2.0 * math.prod(out) * (s[1] // layer["groups"]) * kh * kw
            elif layer["type"] == "conv_transpose2d":
                kh, kw = _two(layer["kernel_size"])
                total += 2.0 * math.prod(s) * (out[1] // layer["groups"]) * kh * kw
            elif layer["type"] == "linear":
                total += 2.0 * math.prod(out) * s[-1]
            elif layer["type"] == "residual":
                walk(layer["body"], s)
            s = out
    walk(net.layers, tuple(in_shape))
    return total


def _data(case: TrainCase, rng):
    x = rng.standard_normal(case.in_shape).astype(np.float32)
    if case.loss == "cross_entropy":
        out = case.network.out_shape(case.in_shape)
        t = rng.integers(0, out[1], case.in_shape[0])
    else:
        t = (x + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)
    return x, t


def _our_step(be, case, net, x, t):
    """A closure running one training step on ``be`` (state kept across calls): train()'s step
    (learn/replay.py's TrainStep: recorded at the second step and replayed on a device with "replay"),
    the batch uploaded and the loss read back at each step, as train() does."""
    from ..learn import optim
    from ..learn.autograd import apply
    from ..learn.replay import TrainStep
    pvars = net.param_vars(be)
    opt = optim.make("adam", list(pvars.values()), lr=case.lr)
    op = "cross_entropy" if case.loss == "cross_entropy" else "mse_loss"
    ts = TrainStep(be, net, pvars, opt, {k: be.to_device(v) for k, v in net.buffers.items()},
                   lambda y, tb: apply(op, y, tb, be=be))

    def step():
        ts(x, t)
        be.synchronize()
    step.train_step = ts
    return step


def _torch_step(case, net, x, t, dev):
    import torch
    tnet = net.to_torch().to(dev).train()
    opt = torch.optim.Adam(tnet.parameters(), lr=case.lr)
    xt = torch.from_numpy(x).to(dev)
    tt = torch.from_numpy(np.asarray(t)).to(dev)
    fn = torch.nn.functional.cross_entropy if case.loss == "cross_entropy" else torch.nn.functional.mse_loss

    def step():
        opt.zero_grad()
        loss = fn(tnet(xt), tt)
        loss.backward()
        opt.step()
        _sync_torch(dev)
    return step


def bench_train_case(be, case: TrainCase, budget_s: float = 2.0, max_reps: int = 60) -> Row:
    rng = np.random.default_rng(0)
    net = case.network.initialized(case.in_shape, seed=0)
    x, t = _data(case, rng)
    tdev = _torch_device_for(be)
    ours = _our_step(be, case, net, x, t)
    theirs = _torch_step(case, net, x, t, tdev)
    t0 = time.perf_counter()
    ours()
    first = time.perf_counter() - t0
    theirs()
    ours()
    t0 = time.perf_counter()
    ours()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max_reps, max(3, budget_s / one)))
    block = 3 if reps >= 9 else 1
    tb, tt = [], []
    for _ in range(-(-reps // block)):
        for call, times in ((ours, tb), (theirs, tt)):
            call()  # untimed: the other side's spinning threads settle
            for _ in range(block):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
    mb, mt = statistics.median(tb), statistics.median(tt)
    flops = 3.0 * forward_flops(case.network, case.in_shape)
    return Row(be.name, be.device, case.name, mb * 1e3, mt * 1e3, flops / mb / 1e9, flops / mt / 1e9, mt / mb,
               first * 1e3, len(tb), False)


def add_arguments(p) -> None:
    """``--train`` for ``anydevice bench`` (bench.add_arguments calls this)."""
    p.add_argument("--train", action="store_true",
                   help="measure one training step (forward, backward, Adam) of the digits CNN and a residual "
                        "denoiser against PyTorch autograd + torch.optim.Adam instead of the op cases")


def main(args) -> int:
    """The ``--train`` rows for every backend named by ``--backend`` (default: every available one),
    cases filtered by ``--case``; ``--quick`` shortens the budget; ``--json FILE`` writes the rows."""
    import torch
    from .. import list_backends
    names = getattr(args, "backend", None) or [i.name for i in list_backends() if i.available]
    chosen = [c for c in cases() if not getattr(args, "case", None) or any(s in c.name for s in args.case)]
    budget = 0.8 if getattr(args, "quick", False) else 3.0
    print(machine_line())
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; one training step (forward, backward, "
          f"Adam); ratio = torch time / backend time, same run, alternating blocks (> 1: backend faster)")
    from .rows import run_rows
    return run_rows(names, chosen, lambda be, case: bench_train_case(be, case, budget), getattr(args, "json", None))
