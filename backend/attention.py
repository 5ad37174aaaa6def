"""scaled_dot_product_attention in query blocks (a mixin of ``Backend``): the score matrix of
a block at a time, so long sequences stay within the workspace budget.
"""
from __future__ import annotations


class AttentionOps:
    """Attention (filled in by the layer-ops work)."""
