/* Cross entropy with integer class targets, fused (backend/devices/opencl/losses.py: capability
   "cross_entropy"; ops/layers.py cross_entropy and learn/autograd/rules_math.py's rule take it). x is a
   contiguous float32 array viewed (N, C, L): the classes along C (stride L); position r = n * L + l has the
   class index t[r] (int64; ``ignore``: no loss, no gradient). One work item a position. The log-softmax is
   the composite's (ops/layers.py _log_softmax): m = max over the classes, s = x - m,
   lse = log(sum(exp(s))), logp = s - lse. Launch: global (N * L). */

/* m and lse of the classes of one position (xp: its first class, classes L apart) */
inline void ce_lse(const __global float *xp, const long C, const long L, float *pm, float *plse)
{
    float m = -INFINITY;
    for (long j = 0; j < C; j++) {
        const float v = xp[j * L];
        m = (v > m || isnan(v)) ? v : m;  /* torch's max: NaN wins */
    }
    float s = 0.0f;
    for (long j = 0; j < C; j++) s += exp(xp[j * L] - m);
    *pm = m;
    *plse = log(s);
}

/* loss[r] = -logp[r, t[r]], 0 where t[r] is ``ignore`` */
__kernel void ce_rows(__global const float *x, const long x_off, __global const long *t,
                      __global float *loss, const long loss_off, const long N, const long C, const long L,
                      const long ignore)
{
    const long r = get_global_id(0);
    if (r >= N * L) return;
    const long n = r / L;
    const __global float *xp = x + x_off + n * C * L + (r - n * L);
    const long tr = t[r];
    float v = 0.0f;
    if (tr != ignore) {
        float m, lse;
        ce_lse(xp, C, L, &m, &lse);
        v = -((xp[tr * L] - m) - lse);
    }
    loss[loss_off + r] = v;
}

/* dL/dx for dL/dloss = gy: gx[r, j] = g * (exp(logp[r, j]) - [j == t[r]]) with g = gy[r] (``per_pos``: the
   reduction "none") or gy[0], divided by ``den`` (the number of counted targets for "mean", else 1), 0 where
   t[r] is ``ignore`` -- the composite's log_softmax backward of where(onehot, -g, 0). */
__kernel void ce_grad(__global const float *x, const long x_off, __global const long *t,
                      __global const float *gy, const long gy_off, const int per_pos, const float den,
                      __global float *gx, const long gx_off, const long N, const long C, const long L,
                      const long ignore)
{
    const long r = get_global_id(0);
    if (r >= N * L) return;
    const long n = r / L, o = n * C * L + (r - n * L);
    const __global float *xp = x + x_off + o;
    __global float *gp = gx + gx_off + o;
    const long tr = t[r];
    const float g = tr == ignore ? 0.0f : gy[gy_off + (per_pos ? r : 0)] / den;
    float m, lse;
    ce_lse(xp, C, L, &m, &lse);
    for (long j = 0; j < C; j++) {
        const float p = exp((xp[j * L] - m) - lse);
        gp[j * L] = g * (j == tr ? p - 1.0f : p);
    }
}
