"""Optimizers over autograd ``Var`` parameters, on the backend's own device: torch.optim's SGD, Adam
and AdamW, with torch's arguments, defaults, checks and update rules.

    from anydevice.backend.learn import autograd as ag, optim
    w = ag.Var(be, w0, requires_grad=True)
    opt = optim.Adam([w], lr=1e-3)                # or optim.make("adam", [w], lr=1e-3)
    for x, t in batches:
        opt.zero_grad()
        ag.F.mse_loss(ag.F.linear(ag.Var(be, x), w), t).backward()
        opt.step()                                # w.data: a new native array

The updates are torch's single-tensor (``foreach=False``) formulas, in torch's float32 order of
operations, written with the contract's public ops (``be.add``, ``be.mul``, ``be.sqrt`` ...) on the
native arrays: parameters, gradients and optimizer state never leave the device. Numbers (the
learning rate, betas, bias corrections) are computed in Python float64 as torch computes them and
enter the float32 ops as float32 scalars, as torch's CPU kernels take them. The one difference
left: where torch's vectorised CPU kernels fuse a multiply and an add (``add(alpha=)``, ``lerp``),
these ops round the product first (at most one float32 rounding per op; tests/backend/learn/test_optim.py
measures the drift over 20 steps).

A step never writes into an array: each parameter's ``data`` (and each state buffer) is replaced
by a new array, so a caller holding the old array keeps its numbers.

``state_dict()`` is torch's layout with host NumPy copies: ``{"state": {index: {"step": float,
"exp_avg": ndarray, ...}}, "param_groups": [{"lr": ..., "params": [indices]}]}``;
``load_state_dict`` takes that, or a torch optimizer's own state_dict (tensors are converted).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from .autograd.tape import Var, no_grad
from ..ops.plans.args import _number
from ..system.errors import AnyDeviceError

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "OPTIMIZERS", "PRESETS", "make", "learning_rate"]

_F32 = np.float32


def learning_rate(op: str, arg: str, value, *, training: bool = True) -> float:
    """The learning-rate rule, its one home (the Train node, ``train`` and every optimizer): a number
    (not NaN), > 0 and finite for a training run; an optimizer takes what torch.optim takes (>= 0,
    ``training=False``)."""
    lr = _number(op, arg, value)
    if training and not (lr > 0.0 and math.isfinite(lr)):
        raise AnyDeviceError(op, arg, value, "must be > 0 and finite")
    if not lr >= 0.0:
        raise AnyDeviceError(op, arg, value, "Invalid learning rate: must be >= 0")
    return lr


def _nonnegative(op: str, group: dict, arg: str, name: str = "") -> float:
    """``group[arg]`` as a number, refused as torch refuses it below 0 ("Invalid <name> value")."""
    value = _number(op, arg, group[arg])
    if not value >= 0.0:
        raise AnyDeviceError(op, arg, group[arg], f"Invalid {name or arg} value: must be >= 0")
    return value


class Optimizer:
    """torch.optim.Optimizer's shape: ``param_groups`` (dicts holding "params" and the
    hyper-parameters, editable between steps as torch's), ``state`` (per parameter), ``step()``,
    ``zero_grad()``, ``state_dict()``, ``load_state_dict()``."""

    #: the per-parameter state buffers (native arrays) this optimizer keeps, by name
    BUFFERS: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict):
        op = type(self).__name__
        self.defaults = dict(defaults)
        if isinstance(params, Var):
            raise AnyDeviceError(op, "params", params,
                                 "must be an iterable of Vars (or of dicts holding 'params'), not one Var")
        groups = list(params)
        if not groups:
            raise AnyDeviceError(op, "params", groups, "optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups: list[dict] = []
        self.state: dict[int, dict] = {}  # id(param) -> state
        self.be = None
        seen: set[int] = set()
        for g in groups:
            self._add_group(op, g, seen)

    def _add_group(self, op: str, group: dict, seen: set) -> None:
        if not isinstance(group, dict) or "params" not in group:
            raise AnyDeviceError(op, "params", group, "every parameter group must be a dict holding 'params'")
        ps = group["params"]
        ps = [ps] if isinstance(ps, Var) else list(ps)
        for p in ps:
            if not isinstance(p, Var):
                raise AnyDeviceError(op, "params", p, "must hold autograd Vars")
            if not p.is_leaf:
                raise AnyDeviceError(op, "params", p, "can't optimize a non-leaf Var (one an op computed)")
            if not p.requires_grad:
                raise AnyDeviceError(op, "params", p, "holds a Var without requires_grad: it never gets a gradient")
            if id(p) in seen:
                raise AnyDeviceError(op, "params", p, "some parameters appear more than once")
            if self.be is None:
                self.be = p.be
            elif p.be is not self.be:
                raise AnyDeviceError(op, "params", p, f"is on backend {p.be.name}, the others on {self.be.name}")
            seen.add(id(p))
        full = dict(self.defaults)
        full.update({k: v for k, v in group.items() if k != "params"})
        self._check(full)
        full["params"] = ps
        self.param_groups.append(full)

    def _check(self, group: dict) -> None:
        """torch's argument checks (raised as AnyDeviceError naming the argument and the value)."""
        op = type(self).__name__
        learning_rate(op, "lr", group["lr"], training=False)
        _nonnegative(op, group, "weight_decay")

    # ---- torch's API --------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient (None, as torch's default; zeros with set_to_none=False)."""
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                p.grad = None if set_to_none else p.be.to_device(
                    np.zeros(p.shape, _F32), "zero_grad", "grad", constant=True)

    def step(self) -> None:
        """One update of every parameter that has a gradient (parameters without one are skipped)."""
        op = type(self).__name__
        with no_grad():
            for group in self.param_groups:
                self._check(group)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    grad = p.grad
                    if type(grad) is not type(p.data):  # a gradient set by hand (NumPy, torch)
                        grad = p.be.to_device(grad, op, "grad")
                    if tuple(p.be._shape(grad)) != p.shape:
                        raise AnyDeviceError(op, "grad", grad, f"has not the shape {p.shape} of its parameter")
                    state = self.state.setdefault(id(p), {})
                    p.data = self._update(p.be, p.data, grad, state, group)

    def _update(self, be, param, grad, state: dict, group: dict):
        raise NotImplementedError

    def _params(self) -> list[Var]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        """torch's layout, with host NumPy copies of the buffers and ``step`` as a float."""
        index = {id(p): i for i, p in enumerate(self._params())}
        state = {}
        for p in self._params():
            s = self.state.get(id(p))
            if not s:
                continue
            state[index[id(p)]] = {k: (v if isinstance(v, float) or v is None else
                                       np.array(self.be.to_numpy(v), dtype=_F32, copy=True))
                                   for k, v in s.items()}
        groups = []
        for g in self.param_groups:
            d = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
            d["params"] = [index[id(p)] for p in g["params"]]
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what ``state_dict()`` gave (or what a torch optimizer of the same kind gave):
        hyper-parameters per group and the state buffers, uploaded to the device."""
        op = type(self).__name__ + ".load_state_dict"
        try:
            saved_groups = list(state_dict["param_groups"])
            saved_state = dict(state_dict["state"])
        except (KeyError, TypeError):
            raise AnyDeviceError(op, "state_dict", state_dict, "must hold 'state' and 'param_groups'") from None
        if len(saved_groups) != len(self.param_groups):
            raise AnyDeviceError(op, "state_dict", f"{len(saved_groups)} parameter groups",
                                 f"this optimizer has {len(self.param_groups)}")
        by_index: dict = {}
        for mine, saved in zip(self.param_groups, saved_groups):
            if len(saved["params"]) != len(mine["params"]):
                raise AnyDeviceError(op, "state_dict", f"a group of {len(saved['params'])} parameters",
                                     f"the matching group here has {len(mine['params'])}")
            by_index.update(zip(saved["params"], mine["params"]))
        new_state: dict[int, dict] = {}
        for key, s in saved_state.items():
            p = by_index.get(key if not hasattr(key, "item") else key.item())
            if p is None:
                raise AnyDeviceError(op, "state_dict", key, "names a parameter no group holds")
            out = {}
            for name, v in s.items():
                if v is None:
                    out[name] = None
                elif name == "step":
                    out[name] = float(v.item() if hasattr(v, "item") else v)
                else:
                    a = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
                    if tuple(a.shape) != p.shape:
                        raise AnyDeviceError(op, name, a, f"has not the shape {p.shape} of its parameter")
                    out[name] = self.be.to_device(np.array(a, dtype=_F32, copy=True), op, name)
            new_state[id(p)] = out
        for mine, saved in zip(self.param_groups, saved_groups):
            for k in self.defaults:
                if k in saved:
                    mine[k] = tuple(saved[k]) if isinstance(saved[k], (list, tuple)) else saved[k]
            self._check(mine)
        self.state = new_state

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({opts}; {len(self._params())} parameters)"


# ----------------------------------------------------------------------------------------------
def _add_scaled(be, a, b, alpha: float):
    """torch's ``a.add(b, alpha=alpha)`` (alpha as float32; 1 exactly as a plain add)."""
    if alpha == 1.0:
        return be.add(a, b)
    return be.add(a, be.mul(b, alpha))


class SGD(Optimizer):
    """torch.optim.SGD (stochastic gradient descent, optionally with momentum / Nesterov)."""

    BUFFERS = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize})

    def _check(self, group):
        super()._check(group)
        op = type(self).__name__
        momentum = _nonnegative(op, group, "momentum")
        dampening = _number(op, "dampening", group["dampening"])
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise AnyDeviceError(op, "nesterov", group["nesterov"],
                                 "Nesterov momentum requires a momentum and zero dampening")

    def _update(self, be, param, grad, state, group):
        lr, wd = float(group["lr"]), float(group["weight_decay"])
        momentum, dampening = float(group["momentum"]), float(group["dampening"])
        if group["maximize"]:
            grad = be.neg(grad)
        if wd != 0:
            grad = _add_scaled(be, grad, param, wd)
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:  # the gradient itself: nothing here writes into an array, so no clone
                buf = grad
            else:
                buf = _add_scaled(be, be.mul(buf, momentum), grad, 1.0 - dampening)
            state["momentum_buffer"] = buf
            grad = _add_scaled(be, grad, buf, momentum) if group["nesterov"] else buf
        return _add_scaled(be, param, grad, -lr)


class Adam(Optimizer):
    """torch.optim.Adam (``weight_decay`` added to the gradient; AdamW decouples it)."""

    BUFFERS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False):
        super().__init__(params, {"lr": lr, "betas": tuple(betas) if isinstance(betas, (list, tuple)) else betas,
                                  "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                                  "maximize": maximize})

    def _check(self, group):
        super()._check(group)
        op = type(self).__name__
        _nonnegative(op, group, "eps", "epsilon")
        betas = group["betas"]
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise AnyDeviceError(op, "betas", betas, "must be a pair of numbers (beta1, beta2)")
        for i, b in enumerate(betas):
            if not 0.0 <= _number(op, "betas", b) < 1.0:
                raise AnyDeviceError(op, "betas", betas, f"Invalid beta parameter at index {i}: must be in [0, 1)")

    def _update(self, be, param, grad, state, group):
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        if not state:
            zeros = np.zeros(be._shape(param), _F32)
            state["step"] = 0.0
            state["exp_avg"] = be.to_device(zeros, "Adam", "exp_avg", constant=True)
            state["exp_avg_sq"] = be.to_device(zeros, "Adam", "exp_avg_sq", constant=True)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = be.to_device(zeros, "Adam", "max_exp_avg_sq", constant=True)
        if group["maximize"]:
            grad = be.neg(grad)
        state["step"] = step = state["step"] + 1.0
        if wd != 0:
            if self._decoupled:
                param = be.mul(param, 1.0 - lr * wd)
            else:
                grad = _add_scaled(be, grad, param, wd)
        # exp_avg.lerp_(grad, 1 - beta1): torch's lerp, the weight rounded to float32 first
        m, v = state["exp_avg"], state["exp_avg_sq"]
        w = _F32(1.0 - beta1)
        fused = be._adam_step if "adam_step" in be.caps.fused else None
        if fused is not None and type(grad) is type(param) and type(m) is type(param) \
                and type(v) is type(param) and (not group["amsgrad"] or state.get("max_exp_avg_sq") is not None):
            # the same float32 operations in the same order, in one pass (one launch on a device)
            bias_correction1 = 1 - beta1 ** step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
            neg_step = -step_size
            rec = be.recording() if "replay" in be.caps.fused else None
            if rec is not None:  # a recorded step (learn/replay.py): the step count moves on at each replay
                rec.on_replay(lambda s=state: s.__setitem__("step", s["step"] + 1.0))
                bias_correction2_sqrt = rec.cell(lambda s=state: (1 - beta2 ** s["step"]) ** 0.5)
                neg_step = rec.cell(lambda s=state: -(lr / (1 - beta1 ** s["step"])))
            vmax = state["max_exp_avg_sq"] if group["amsgrad"] else None
            lerp_form = abs(w) >= 0.5
            p, m, v, vmax = fused(param, grad, m, v, vmax, float(w - _F32(1.0)) if lerp_form else float(w),
                                  lerp_form, beta2, 1.0 - beta2, bias_correction2_sqrt, eps, neg_step)
            state["exp_avg"], state["exp_avg_sq"] = m, v
            if vmax is not None:
                state["max_exp_avg_sq"] = vmax
            return p
        rec = be.recording() if "replay" in be.caps.fused else None
        if rec is not None:
            rec.fail("Adam's unfused update (its bias corrections change every step)")
        diff = be.sub(grad, m)
        if abs(w) < 0.5:
            m = be.add(m, be.mul(diff, float(w)))
        else:
            m = be.add(grad, be.mul(diff, float(w - _F32(1.0))))
        # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): v*b2 + ((1-b2)*g)*g
        v = be.add(be.mul(v, beta2), be.mul(be.mul(grad, 1.0 - beta2), grad))
        state["exp_avg"], state["exp_avg_sq"] = m, v
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2 ** 0.5
        if group["amsgrad"]:
            vmax = state.get("max_exp_avg_sq")
            if vmax is None:  # amsgrad switched on between steps (torch would fail): start from v
                vmax = v
            vmax = be.maximum(vmax, v)
            state["max_exp_avg_sq"] = vmax
            denom = be.add(be.div(be.sqrt(vmax), bias_correction2_sqrt), eps)
        else:
            denom = be.add(be.div(be.sqrt(v), bias_correction2_sqrt), eps)
        # param.addcdiv_(exp_avg, denom, value=-step_size): p + ((-step_size * m) / denom)
        return be.add(param, be.div(be.mul(m, -step_size), denom))


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (``param *= 1 - lr * weight_decay``)."""

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


# ----------------------------------------------------------------------------------------------
#: the optimizers, as the Train node offers them (it reads this list): name -> (class, fixed keyword
#: arguments, a line for a tooltip); the node's momentum widget and ``make``'s keywords set the rest
OPTIMIZERS: dict[str, tuple[type, dict, str]] = {
    "adam": (Adam, {}, "Adam (betas 0.9, 0.999; eps 1e-8); weight decay added to the gradient"),
    "adamw": (AdamW, {}, "AdamW (betas 0.9, 0.999; eps 1e-8); decoupled weight decay"),
    "sgd": (SGD, {}, "plain SGD"),
}
#: shorthands ``make`` takes for an optimizer of OPTIMIZERS with some arguments set
PRESETS: dict[str, tuple[str, dict, str]] = {
    "sgd_momentum": ("sgd", {"momentum": 0.9}, "SGD with momentum 0.9"),
    "sgd_nesterov": ("sgd", {"momentum": 0.9, "nesterov": True}, "SGD with Nesterov momentum 0.9"),
}


def make(name: str, params, lr: float, weight_decay: float = 0.0, **kw) -> Optimizer:
    """The optimizer ``name`` (a key of OPTIMIZERS or PRESETS) over ``params``; ``kw`` adds or overrides its
    other arguments (betas, eps, momentum, amsgrad ...)."""
    base, preset, _ = PRESETS.get(name, (name, {}, ""))
    if base not in OPTIMIZERS:
        raise AnyDeviceError("optimizer", "name", name, f"must be one of {', '.join(OPTIMIZERS)}")
    cls, fixed, _ = OPTIMIZERS[base]
    args = dict(fixed, **preset)
    args.update(kw)
    return cls(params, lr=lr, weight_decay=weight_decay, **args)
