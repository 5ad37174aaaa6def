/* norm_split_cuda.cu: the CUDA backend's fused row norm (norm_cuda.cu's formulas) with each row split over S
 * blocks, for few rows of many values: a group norm has N * G rows, and one block a row (norm_cuda.cu) used 32
 * of an H200's 132 SMs on the SD1.x VAE decoder's rows of 0.26-1 M values (518 us a norm, 15.5 of its 96 GPU
 * milliseconds in float16). Three launches, each over rows * S blocks of NB threads; block k is part
 * s = k % S of row r = k / S, the values [s * P, min(n, (s + 1) * P)) with P = ceil(n / S):
 *
 * kernel ad_norm_split_sum(x, ws, rows, n, S)
 *   ws[k] = the part's sum (float64).
 * kernel ad_norm_split_dev(x, ws, wq, rows, n, S)
 *   m = (ws[r * S] + ... + ws[r * S + S - 1]) / n, split as norm_cuda.cu splits it (mean = float(m),
 *   corr = float(m - mean)); wq[k] = the part's sum of ((x - mean) - corr)^2 (float64).
 * kernel ad_norm_split_apply(x, y, w, b, ws, wq, flags, rows, n, S, groups, cpg, inner, eps)
 *   var = float(sum of the row's wq / n), rstd = 1 / sqrt(var + eps); the part of y as norm_cuda.cu writes it
 *   (affine with flags 1 w, 2 b; silu with 4; channel (r % groups) * cpg + i / inner; x's dtype XT).
 *
 * Written in the portable subset (local-memory tree sums, half_portable.h), so it also builds as OpenCL C:
 * test_norms_pocl.py runs the backend's split path against it on PoCL. NB: a power of two. */
#ifndef XT
#define XT 0
#endif
#ifndef NB
#define NB 256
#endif
#if (NB & (NB - 1)) || NB > 1024
#error "norm_split_cuda.cu: NB a power of two, at most 1024"
#endif
#ifdef ANYDEVICE_OPENCL
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define NS_LOCAL_PTR __local  /* a pointer into local memory (CUDA's shared memory needs no qualifier) */
#else
#define NS_LOCAL_PTR
#endif

#include "elementwise_math.h"
#if XT
#include "half_portable.h"
#define X_T unsigned short
#define NS_LD(h) HP_LD(XT, h)
#define NS_ST(f) HP_ST(XT, f)
#else
#define X_T float
#define NS_LD(v) (v)
#define NS_ST(v) (v)
#endif

/* the sum of every thread's v (all threads get it) */
DEVICE_FN double ns_block_sum(double v, NS_LOCAL_PTR double* red)
{
    red[LID0] = v;
    BARRIER();
    for (int o = NB / 2; o > 0; o >>= 1) {
        if (LID0 < o) red[LID0] += red[LID0 + o];
        BARRIER();
    }
    const double t = red[0];
    BARRIER();
    return t;
}

/* row r's mean from its parts' sums, split as norm_cuda.cu splits it */
DEVICE_FN void ns_mean(const GLOBAL double* ws, const int r, const int S, const int n, float* mean, float* corr)
{
    double t = 0.0;
    for (int j = 0; j < S; j++) t += ws[r * S + j];
    const double m = t / (double)n;
    *mean = (float)m;
    *corr = (float)(m - (double)(*mean));
}

#define NS_PART()                                                   \
    const int k = GRP0, r = k / S, s = k - r * S;                   \
    const OFF_T part = ((OFF_T)n + S - 1) / S;                      \
    const OFF_T i0 = (OFF_T)s * part;                               \
    const OFF_T i1 = (OFF_T)n < i0 + part ? (OFF_T)n : i0 + part;   \
    const GLOBAL X_T* xr = x + (OFF_T)r * n;

KERNEL void ad_norm_split_sum(const GLOBAL X_T* RESTRICT x, GLOBAL double* RESTRICT ws, const int rows,
                              const int n, const int S)
{
    LOCAL double red[NB];
    if (GRP0 >= rows * S) return;
    NS_PART()
    double acc = 0.0;
    for (OFF_T i = i0 + LID0; i < i1; i += NB) acc += (double)NS_LD(xr[i]);
    acc = ns_block_sum(acc, red);
    if (LID0 == 0) ws[k] = acc;
}

KERNEL void ad_norm_split_dev(const GLOBAL X_T* RESTRICT x, const GLOBAL double* RESTRICT ws,
                              GLOBAL double* RESTRICT wq, const int rows, const int n, const int S)
{
    LOCAL double red[NB];
    if (GRP0 >= rows * S) return;
    NS_PART()
    float mean, corr;
    ns_mean(ws, r, S, n, &mean, &corr);
    double acc = 0.0;
    for (OFF_T i = i0 + LID0; i < i1; i += NB) {
        const float d = (NS_LD(xr[i]) - mean) - corr;
        acc += (double)(d * d);
    }
    acc = ns_block_sum(acc, red);
    if (LID0 == 0) wq[k] = acc;
}

KERNEL void ad_norm_split_apply(const GLOBAL X_T* RESTRICT x, GLOBAL X_T* RESTRICT y, const GLOBAL X_T* RESTRICT w,
                                const GLOBAL X_T* RESTRICT b, const GLOBAL double* RESTRICT ws,
                                const GLOBAL double* RESTRICT wq, const int flags, const int rows, const int n,
                                const int S, const int groups, const int cpg, const int inner, const float eps)
{
    if (GRP0 >= rows * S) return;
    NS_PART()
    float mean, corr;
    ns_mean(ws, r, S, n, &mean, &corr);
    double q = 0.0;
    for (int j = 0; j < S; j++) q += wq[r * S + j];
    const float var = (float)(q / (double)n);
    const float rstd = 1.0f / AD_SQRT(var + eps);
    const int ch0 = (r % groups) * cpg;
    GLOBAL X_T* yr = y + (OFF_T)r * n;
    for (OFF_T i = i0 + LID0; i < i1; i += NB) {
        float v = ((NS_LD(xr[i]) - mean) - corr) * rstd;
        const int ch = ch0 + (int)(i / inner);
        if (flags & 1) v *= NS_LD(w[ch]);
        if (flags & 2) v += NS_LD(b[ch]);
        if (flags & 4) v = ad_mul_sigmoid(v, v);
        yr[i] = NS_ST(v);
    }
}
