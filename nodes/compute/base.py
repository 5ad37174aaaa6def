"""What the compute nodes share: their base class (NaN and Inf in outputs reported), the weights
input and the kernel grid a node shows."""
from __future__ import annotations

import numpy as np
import torch

from ..base.common import ANY, NodeError, PackNode, cpu_f32


SEED_MAX = 0xFFFFFFFFFFFFFFFF
_DATA_TIP = "An IMAGE, MASK, LATENT or TENSOR; the output is of the same type."


def _kernel_ui(w: np.ndarray, label: str, limit: int = 8) -> dict:
    """Up to ``limit`` 2-D slices of a weight, each at most 15x15, for the node's kernel grid."""
    w = np.asarray(w, np.float32)
    if w.ndim == 2:
        slices = [w]
    else:
        flat = w.reshape(-1, w.shape[-2], w.shape[-1])
        slices = [flat[i] for i in range(min(limit, flat.shape[0]))]
    out = []
    for s in slices:
        s = s[:15, :15]
        out.append({"rows": int(s.shape[0]), "cols": int(s.shape[1]),
                    "values": [round(float(v), 5) for v in s.reshape(-1)]})
    return {"label": label, "shape": list(w.shape), "slices": out}


class ComputeNode(PackNode):
    """A node whose outputs the backend computed: NaN and Inf in them are reported."""

    CATEGORY = "AnyDevice/nn"
    WARN_NONFINITE = True
    #: one output, of the input's type (a node with other outputs says its own)
    RETURN_TYPES = (ANY,)
    RETURN_NAMES = ("output",)


def _weights_value(weights, node: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if weights is None:
        raise NodeError(node, "weights", None, "source is 'weights' but no WEIGHTS input is connected")
    if not isinstance(weights, dict) or "weight" not in weights:
        raise NodeError(node, "weights", type(weights).__name__, "must come from a Weights (AnyDevice) node")
    return cpu_f32(weights["weight"]), (None if weights.get("bias") is None else cpu_f32(weights["bias"]))
