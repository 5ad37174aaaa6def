"""Data movement and selection as device ops (a mixin of ``Backend``): reshape/view, permute,
transpose, expand, slicing with steps, cat, stack, split, chunk, contiguous copies; where and the
comparisons. Views stay views where the layout allows it.
"""
from __future__ import annotations


class MovementOps:
    """Data movement and selection (filled in by the layer-ops work)."""
