"""Reverse-mode autograd over the op contract (tape.py), the backward rules of every op
(rules_*.py) and nothing of torch's autograd (ComfyUI runs nodes in inference mode)."""
from .tape import (  # noqa: F401
    F, RULES, NON_DIFFERENTIABLE, Ctx, Var, apply, backward, grad, is_grad_enabled, no_grad, rule, sum_to)
from . import rules_math, rules_conv, rules_layers  # noqa: F401,E402  (registers the rules)

__all__ = ["F", "RULES", "Ctx", "Var", "apply", "backward", "grad", "is_grad_enabled", "no_grad", "rule",
           "sum_to"]
