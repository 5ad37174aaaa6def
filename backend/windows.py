"""Window ops: pooling and resampling (a mixin of ``Backend``).

max_pool2d, avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d and interpolate, each named and
called as its ``torch.nn.functional`` counterpart. All of them are one backend primitive,
``_window2d``: every output pixel combines the input pixels named by a row table and a column
table (index and weight per tap, built once on the host by the op), as a weighted sum or a max.
"""
from __future__ import annotations


class WindowOps:
    """Pooling and interpolate (filled in by the layer-ops work)."""
