"""The NumPy device's fused Adam / AdamW step (the fused kernel "adam_step" of devices/interface.py,
called by learn/optim.py)."""
from __future__ import annotations

import numpy as np

from .common import F32


class NumpyAdam:
    """One Adam update of one parameter as NumPy ufuncs (a mixin of NumpyBackend)."""

    def _adam_step(self, param, grad, m, v, vmax, w, lerp_form, beta2, omb2, bc2_sqrt, eps, neg_step):
        """One Adam update of one parameter as NumPy ufuncs into new buffers (no temporaries beyond
        one): the unfused ops' float32 operations in their order, each correctly rounded; returns new
        (param, exp_avg, exp_avg_sq, max_exp_avg_sq or None). The inputs are never written."""
        p, g, m, v = (np.asarray(a, F32) for a in (param, grad, m, v))
        w, beta2, omb2, bc2_sqrt, eps, neg_step = (F32(s) for s in (w, beta2, omb2, bc2_sqrt, eps, neg_step))
        tmp = np.empty(p.shape, F32)
        mo, vo, po = np.empty(p.shape, F32), np.empty(p.shape, F32), np.empty(p.shape, F32)
        with np.errstate(all="ignore"):
            np.subtract(g, m, out=tmp)
            np.multiply(tmp, w, out=tmp)
            np.add(g if lerp_form else m, tmp, out=mo)
            np.multiply(g, omb2, out=tmp)
            np.multiply(tmp, g, out=tmp)
            np.multiply(v, beta2, out=vo)
            np.add(vo, tmp, out=vo)
            vmo = None
            s = vo
            if vmax is not None:
                vmo = np.maximum(np.asarray(vmax, F32), vo)
                s = vmo
            np.sqrt(s, out=tmp)
            np.divide(tmp, bc2_sqrt, out=tmp)
            np.add(tmp, eps, out=tmp)
            np.multiply(mo, neg_step, out=po)
            np.divide(po, tmp, out=po)
            np.add(p, po, out=po)
        return po, mo, vo, vmo
