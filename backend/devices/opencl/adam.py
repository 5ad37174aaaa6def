"""The OpenCL device's fused Adam / AdamW step (the fused kernel "adam_step" of devices/interface.py,
called by learn/optim.py): kernels/elementwise.cl's adam_step."""
from __future__ import annotations


class CLAdam:
    """One Adam update of one parameter in one launch (a mixin of OpenCLBackend)."""

    def _adam_step(self, param, grad, m, v, vmax, w, lerp_form, beta2, omb2, bc2_sqrt, eps, neg_step):
        """One Adam update of one parameter in one launch (kernels/elementwise.cl's adam_step, the
        unfused ops' float32 arithmetic in their order): returns new (param, exp_avg, exp_avg_sq,
        max_exp_avg_sq or None); vmax None: no amsgrad. The inputs are never written."""
        n = param.size
        shape = param.shape
        po, mo, vo = self._empty(shape), self._empty(shape), self._empty(shape)
        vmo = self._empty(shape) if vmax is not None else None
        if n:
            g, l, chunk = self._flat_geometry(n)
            vm = vmax if vmax is not None else v
            self._run("adam_step", g, l, param.buffer, param.offset, grad.buffer, grad.offset, m.buffer, m.offset,
                      v.buffer, v.offset, vm.buffer, vm.offset, po.buffer, mo.buffer, vo.buffer,
                      (vmo if vmo is not None else vo).buffer, n, chunk, w, int(lerp_form), beta2, omb2, bc2_sqrt,
                      eps, neg_step, int(vmax is not None))
        return po, mo, vo, vmo
