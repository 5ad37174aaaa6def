"""What the compute nodes share: their base class (NaN and Inf in outputs reported), the weights
input and the kernel grid a node shows."""
from __future__ import annotations

import numpy as np
import torch

from ...backend.ops import quant
from ..base.common import ANY, DATA, DEVICE_INPUT, WEIGHTS, NodeError, PackNode, cpu_f32


SEED_MAX = 0xFFFFFFFFFFFFFFFF
_DATA_TIP = "An IMAGE, MASK, LATENT or TENSOR; the output is of the same type."


def _kernel_ui(w: np.ndarray, label: str, limit: int = 8) -> dict:
    """Up to ``limit`` 2-D slices of a weight, each at most 15x15, for the node's kernel grid (a quantized
    weight shows its dequantized values)."""
    w = w.dequantize() if quant.is_quantized(w) else np.asarray(w, np.float32)
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
    """A node whose outputs the backend computed: NaN and Inf in them are reported.

    Its inputs: ``input`` (an IMAGE, MASK, LATENT or TENSOR; ``input_tip``), its widgets
    (``widgets()``), then the optional WEIGHTS input where it takes one (``weights_tip``) and the
    DEVICE input. A node with other inputs says its own INPUT_TYPES."""

    CATEGORY = "AnyDevice/nn"
    WARN_NONFINITE = True
    #: one output, of the input's type (a node with other outputs says its own)
    RETURN_TYPES = (ANY,)
    RETURN_NAMES = ("output",)
    input_tip = _DATA_TIP
    #: the optional WEIGHTS input's tooltip; None: the node takes no WEIGHTS
    weights_tip: str | None = None

    @classmethod
    def widgets(cls) -> dict:
        """The node's widgets, after ``input``."""
        return {}

    @classmethod
    def INPUT_TYPES(cls):
        weights = {} if cls.weights_tip is None else {"weights": (WEIGHTS, {"tooltip": cls.weights_tip})}
        return {"required": {"input": (DATA, {"tooltip": cls.input_tip}), **cls.widgets()},
                "optional": {**weights, "device": DEVICE_INPUT}}


def _weights_value(weights, node: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if weights is None:
        raise NodeError(node, "weights", None, "source is 'weights' but no WEIGHTS input is connected")
    if not isinstance(weights, dict) or "weight" not in weights:
        raise NodeError(node, "weights", type(weights).__name__, "must come from a Weights (AnyDevice) node")
    w = weights["weight"]  # a quantized weight (Weights' quantize) stays a QTensor: the backend reads it packed
    return (w if quant.is_quantized(w) else cpu_f32(w)), (None if weights.get("bias") is None else cpu_f32(weights["bias"]))
