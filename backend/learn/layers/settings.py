"""The vocabulary every layer kind checks its settings with (kept in ops/plans/args.py, beside the ops'
argument rules), and the limits a spec is held to.

A spec may come from a file, so it is untrusted: ints within 2**31 - 1, floats finite and within
float32's range, no unknown settings. Each refusal is an AnyDeviceError whose op is ``network
<where>`` (``where`` names the layer, e.g. "layer 3.body.0 (conv2d)"), naming the setting and its
value. Also the memory limit every size is checked against (``over_limit``) and how a size is said.
"""
from __future__ import annotations

from ...ops import plans
# the vocabulary itself lives with the ops' argument rules (ops/plans/args.py), one set of helpers for both
from ...ops.plans.args import (MAX_FLOAT, MAX_INT, SPEC_OP as OP, _bool, _choice, _err, _float, _int,  # noqa: F401
                               _is_int, _pair, _required, _two, _unknown)

#: residual blocks nest at most this deep (a block in a block ... in a block): every walk over the
#: layers recurses into the bodies, so a deeper spec is refused before it could exhaust the stack
MAX_DEPTH = 64
#: the most layers a network may have, the ones in residual bodies included
MAX_LAYERS = 10000


# ---- sizes ---------------------------------------------------------------------------------------
def _mem(nbytes: int) -> str:
    return f"{nbytes / 2**40:.1f} TiB" if nbytes >= 2**40 else plans._mem(nbytes)


def _over_limit(need: int, be=None) -> str | None:
    """None where ``need`` bytes fit the tensor limit (ANYDEVICE_MAX_TENSOR_MB; unset, half the memory
    free on ``be``'s device, the host's without one), else that limit as an error says it."""
    from ...system.config import tensor_limit
    limit, free, where = tensor_limit(be, need)
    if need <= limit:
        return None
    if free is None:
        return f"the limit ANYDEVICE_MAX_TENSOR_MB={limit / 2**20:g}"
    return f"the limit of {_mem(limit)} (half of the {_mem(free)} free in {where}; ANYDEVICE_MAX_TENSOR_MB sets another)"
