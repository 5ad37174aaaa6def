"""The one gradient check every backward rule is tested with (issue 13).

``check_grad(be, op, tensors, torch_fn, params)``: runs contract op ``op`` through the autograd
tape on backend ``be`` (float32) and ``torch_fn`` under torch autograd in float64 from the same
float32-rounded inputs, back-propagates the same random output gradient through both, and asserts
the normwise relative error ||ours - torch|| / ||torch|| <= rtol for the output and for the
gradient of every input named in ``wrt``.

    check_grad(be, "conv2d", {"input": x, "weight": w, "bias": b}, F.conv2d,
               {"stride": 2, "padding": 1})

``tensors``: argument name -> NumPy array (or a list of arrays, for cat/stack); ``params``: the
other keyword arguments, passed to both. ``wrt``: which tensors get gradients (default: every
floating-point one). ``torch_fn`` is called with the same keywords (tensors as float64 torch
tensors); ``torch_kwargs`` overrides keywords for torch only (names that differ).
"""
from __future__ import annotations

import numpy as np
import torch

from anydevice.backend.learn import autograd as ag


def normwise(ours: np.ndarray, ref: np.ndarray) -> float:
    ours = np.asarray(ours, np.float64).reshape(-1)
    ref = np.asarray(ref, np.float64).reshape(-1)
    if ours.shape != ref.shape:
        return float("inf")
    finite = np.isfinite(ref)
    if not np.array_equal(finite, np.isfinite(ours)) or not np.array_equal(ours[~finite], ref[~finite], equal_nan=True):
        return float("inf")
    num = np.linalg.norm(ours[finite] - ref[finite])
    den = np.linalg.norm(ref[finite])
    return float(num / den) if den > 0 else float(num)


def _as_list(v):
    return v if isinstance(v, (list, tuple)) else None


def check_grad(be, op, tensors: dict, torch_fn, params: dict | None = None, wrt=None, rtol: float = 1e-5,
               seed: int = 0, torch_kwargs: dict | None = None, check_output: bool = True):
    params = dict(params or {})
    rng = np.random.default_rng(seed)
    f32 = {k: ([np.asarray(e, np.float32) if np.asarray(e).dtype.kind == "f" else np.asarray(e) for e in v]
               if _as_list(v) is not None else
               (np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)))
           for k, v in tensors.items()}
    if wrt is None:
        wrt = [k for k, v in f32.items()
               if (_as_list(v) is None and v.dtype.kind == "f") or (_as_list(v) is not None and v[0].dtype.kind == "f")]
    # ours
    vars_ = {}
    for k, v in f32.items():
        if _as_list(v) is not None:
            vars_[k] = [ag.Var(be, e, requires_grad=k in wrt) for e in v]
        elif k in wrt:
            vars_[k] = ag.Var(be, v, requires_grad=True)
        else:
            vars_[k] = v if v.dtype.kind != "f" else ag.Var(be, v)
    out = ag.apply(op, be=be, **vars_, **params)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    gys = [None if o is None else rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    leaves = [e for k in wrt for e in (vars_[k] if isinstance(vars_[k], list) else [vars_[k]])]
    live = [(o, g) for o, g in zip(outs, gys) if o is not None]
    ours_out = [o.numpy() for o, _ in live]
    grads = ag.backward([o for o, _ in live], [g for _, g in live], inputs=leaves)
    # torch, float64
    tt = {}
    for k, v in f32.items():
        if _as_list(v) is not None:
            tt[k] = [torch.tensor(e.astype(np.float64), requires_grad=k in wrt) for e in v]
        elif v.dtype.kind == "f":
            tt[k] = torch.tensor(v.astype(np.float64), requires_grad=k in wrt)
        else:
            tt[k] = torch.tensor(v)
    tparams = dict(params)
    tparams.update(torch_kwargs or {})
    ref = torch_fn(**tt, **tparams)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    rlive = [r for r, o in zip(refs, outs) if o is not None]
    total = sum((r * torch.tensor(g.astype(np.float64))).sum() for r, (_, g) in zip(rlive, live))
    tleaves = [e for k in wrt for e in (tt[k] if isinstance(tt[k], list) else [tt[k]])]
    tgrads = torch.autograd.grad(total, tleaves, allow_unused=True)
    report = []
    if check_output:
        for i, (o, r) in enumerate(zip(ours_out, rlive)):
            err = normwise(o, r.detach().numpy())
            if not err <= rtol:
                report.append(f"output {i}: normwise error {err:.3g}")
    names = [f"{k}[{i}]" if isinstance(vars_[k], list) else k
             for k in wrt for i in range(len(vars_[k]) if isinstance(vars_[k], list) else 1)]
    for name, g, tg, leaf in zip(names, grads, tgrads, leaves):
        ref_g = np.zeros(leaf.shape) if tg is None else tg.numpy()
        ours_g = np.zeros(leaf.shape) if g is None else np.asarray(be.to_numpy(g))
        if ours_g.shape != ref_g.shape:
            report.append(f"grad {name}: shape {ours_g.shape} != torch's {ref_g.shape}")
            continue
        err = normwise(ours_g, ref_g)
        if not err <= rtol:
            report.append(f"grad {name}: normwise error {err:.3g}")
    assert not report, f"{op} on {be.name} {params}: " + "; ".join(report)
