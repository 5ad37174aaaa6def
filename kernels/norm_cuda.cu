/* The CUDA backend's fused row norm with its affine ("norm_affine", backend/devices/cuda/norms.py):
   each row of the contiguous (rows, n) x normalised, (x - mean) / sqrt(biased var + eps) (two passes
   over the row, as ops/layers.py's composite), then * w[ch] + b[ch] with ch = (row % groups) * cpg +
   column / inner (layer_norm: groups 1, inner 1; group_norm: the group's channels), then silu where
   flags & 4, written in x's dtype (rounded once). flags: 1 w given, 2 b given.
   XT: 0 float32, 1 float16, 2 bfloat16 (x, w, b and y all of it). The sums are float64 (the composite's
   reductions are: a group of nearly equal values loses its small deviations to a float32 sum's rounding of
   the mean), the deviations and the result float32. The mean is split as the composite's corrected
   two-pass statistics (_centered): mean = float(m), corr = float(m - mean), d = (x - mean) - corr, so the
   rounding of the mean to float32 shifts no deviation (2e-6 normwise on groups of 2 close values). One block of NB threads a row: per-thread partial sums,
   then the warps' shuffles and one shared slot per warp.
   Launch: groups (rows), group size (NB). */
#include "elementwise_math.h"
#ifndef XT
#define XT 0
#endif
#ifndef NB
#define NB 512
#endif
#if NB % 32 || NB > 1024
#error "ad_norm_rows_affine: NB a multiple of 32, at most 1024"
#endif
#if XT
#include "half_cuda.h"
#define X_T unsigned short
#define nr_ld(h) AD_H2F(XT, h)
#define nr_st(f) AD_F2H(XT, f)
#else
#define X_T float
#define nr_ld(v) (v)
#define nr_st(v) (v)
#endif

/* the sum of every thread's v (all threads get it; red: NB / 32 + 1 doubles) */
DEVICE_FN double nr_block_sum(double v, double* red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = LID0 >> 5, lane = LID0 & 31;
    if (lane == 0) red[w] = v;
    BARRIER();
    if (w == 0) {
        double t = lane < NB / 32 ? red[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) red[NB / 32] = t;
    }
    BARRIER();
    const double t = red[NB / 32];
    BARRIER();  /* red is free for the next sum */
    return t;
}

KERNEL __launch_bounds__(NB) void ad_norm_rows_affine(const GLOBAL X_T* RESTRICT x, GLOBAL X_T* RESTRICT y,
                                                      const GLOBAL X_T* RESTRICT w, const GLOBAL X_T* RESTRICT b,
                                                      const int flags, const int rows, const int n, const int groups,
                                                      const int cpg, const int inner, const float eps)
{
    LOCAL double red[NB / 32 + 1];
    const int row = GRP0;
    if (row >= rows) return;
    const GLOBAL X_T* xr = x + (OFF_T)row * n;
    GLOBAL X_T* yr = y + (OFF_T)row * n;
    double s = 0.0;
    for (int i = LID0; i < n; i += NB) s += (double)nr_ld(xr[i]);
    const double mean64 = nr_block_sum(s, red) / (double)n;
    const float mean = (float)mean64, corr = (float)(mean64 - (double)mean);
    double q = 0.0;
    for (int i = LID0; i < n; i += NB) {
        const float d = (nr_ld(xr[i]) - mean) - corr;
        q += (double)(d * d);
    }
    const float var = (float)(nr_block_sum(q, red) / (double)n);
    const float rstd = 1.0f / AD_SQRT(var + eps);
    const int ch0 = (row % groups) * cpg;
    for (int i = LID0; i < n; i += NB) {
        float v = ((nr_ld(xr[i]) - mean) - corr) * rstd;
        const int ch = ch0 + i / inner;
        if (flags & 1) v *= nr_ld(w[ch]);
        if (flags & 2) v += nr_ld(b[ch]);
        if (flags & 4) v = ad_mul_sigmoid(v, v);
        yr[i] = nr_st(v);
    }
}
