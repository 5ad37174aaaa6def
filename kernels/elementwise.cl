/* Elementwise, copy, pad and reduction kernels (OpenCL C, both kernel families).

   The math (unary ops, binary ops, pad indices) is kernels/elementwise_math.h, shared with the
   CUDA backend's misc_cuda.cu; this file has the OpenCL backend's launch layouts around it.
   Work split for the flat kernels: work item g handles elements [g*chunk, min(n, g*chunk+chunk)).
   CPU devices use big chunks (few work items, contiguous runs); GPUs use chunk = 1. The flat
   loops are specialised per op (a switch around the loops, the op a constant in each), so each
   loop body is straight-line code the compiler can vectorise.
*/
#include "prelude_opencl.h"
#include "elementwise_math.h"

#include "half_io.h"  /* f32_to_f16, f32_to_bf16 */

/* the storage of unary / binary_flat / binary_nd's operands and result: float32 (HDT 0, the default), or
   float16 / bfloat16 (HDT 1 / 2: 16-bit words, each value converted in registers, the op computed in
   float32 and its result rounded once, as the contract's dtype rule says; half the bytes moved) */
#ifndef HDT
#define HDT 0
#endif
#if HDT == 0
typedef float hstore_t;
#define LDH(p, i) ((p)[i])
#define STH(p, i, v) ((p)[i] = (v))
#elif HDT == 1
typedef ushort hstore_t;
#define LDH(p, i) vload_half(0, (__global const half *)((p) + (i)))
#define STH(p, i, v) ((p)[i] = f32_to_f16(v))
#else
typedef ushort hstore_t;
#define LDH(p, i) as_float((uint)((p)[i]) << 16)
#define STH(p, i, v) ((p)[i] = f32_to_bf16(v))
#endif
/* 16 consecutive values of an hstore_t array as a float16 (norm_rows reads its input so), and stored */
#if HDT == 0
#define LDH16(p, i) vload16(0, (p) + (i))
#define STH16(p, i, v) vstore16((v), 0, (p) + (i))
#elif HDT == 1
#define LDH16(p, i) vload_half16(0, (__global const half *)((p) + (i)))
#define STH16(p, i, v) vstore16(f32_to_f16_16(v), 0, (p) + (i))
#else
#define LDH16(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#define STH16(p, i, v) vstore16(f32_to_bf16_16(v), 0, (p) + (i))
#endif

#define UNARY_CASE(OP) \
    case OP: for (long i = i0; i < i1; i++) STH(y, i, ad_unary_op(LDH(x, i), OP, p0, p1, flags)); break;

/* y = op(x) on n elements; f0/f1: clamp has min/max */
__kernel void unary(__global const hstore_t *x, const long x_off, __global hstore_t *y, const long y_off,
                    const long n, const long chunk, const int op, const float p0, const float p1,
                    const int f0, const int f1)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    const int flags = (f0 ? CLAMP_HAS_MIN : 0) | (f1 ? CLAMP_HAS_MAX : 0);
    x += x_off;
    y += y_off;
    switch (op) {
    AD_UNARY_OPS(UNARY_CASE)
    default: break;
    }
}

/* a switch over the binary ops around a loop CASE(OP, A, B) writes, the op a constant in each */
#define BIN_SWITCH(CASE, A, B) \
    switch (op) { \
    CASE(BOP_ADD, A, B) CASE(BOP_SUB, A, B) CASE(BOP_MUL, A, B) CASE(BOP_DIV, A, B) \
    CASE(BOP_POW, A, B) CASE(BOP_MIN, A, B) CASE(BOP_MAX, A, B) \
    CASE(BOP_EQ, A, B) CASE(BOP_NE, A, B) CASE(BOP_LT, A, B) CASE(BOP_LE, A, B) \
    CASE(BOP_GT, A, B) CASE(BOP_GE, A, B) \
    default: break; \
    }
/* y[i] over [i0, i1) (the flat kernels); yr[k] over k < run (binary_nd's contiguous runs) */
#define BIN_CASE(OP, A, B) case OP: for (long i = i0; i < i1; i++) STH(y, i, ad_binary_op(OP, (A), (B))); break;
#define BIN_RUN_CASE(OP, A, B) case OP: for (long k = 0; k < run; k++) STH(yr, k, ad_binary_op(OP, (A), (B))); break;
#define BIN_OPS(A, B) BIN_SWITCH(BIN_CASE, A, B)
#define BIN_RUN_OPS(A, B) BIN_SWITCH(BIN_RUN_CASE, A, B)

/* same-shape contiguous operands; mode 0: a, b arrays; 1: a is the scalar sa; 2: b is the scalar sb */
__kernel void binary_flat(__global const hstore_t *a, const long a_off, __global const hstore_t *b, const long b_off,
                          __global hstore_t *y, const long y_off, const long n, const long chunk,
                          const int op, const int mode, const float sa, const float sb)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    a += a_off; b += b_off; y += y_off;
    if (mode == 0) { BIN_OPS(LDH(a, i), LDH(b, i)) }
    else if (mode == 1) { BIN_OPS(sa, LDH(b, i)) }
    else { BIN_OPS(LDH(a, i), sb) }
}

/* the offsets of flat index i in two strided layouts of one shape:
   meta = [nd, shape[nd], stride_1[nd], stride_2[nd]] (strides in elements, 0 = broadcast) */
inline void nd_offsets(long i, __global const long *meta, long *o1, long *o2)
{
    const int nd = (int)meta[0];
    long r = i, s1 = 0, s2 = 0;
    for (int d = nd - 1; d >= 0; d--) {
        const long s = meta[1 + d];
        const long q = r / s, c = r - q * s;
        s1 += c * meta[1 + nd + d];
        s2 += c * meta[1 + 2 * nd + d];
        r = q;
    }
    *o1 = s1;
    *o2 = s2;
}

/* broadcasting: meta = [nd, shape[nd], astride[nd], bstride[nd]] */
__kernel void binary_nd(__global const hstore_t *a, const long a_off, __global const hstore_t *b, const long b_off,
                        __global hstore_t *y, const long y_off, const long n, const long chunk,
                        const int op, __global const long *meta)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    a += a_off; b += b_off; y += y_off;
    /* offsets once per run along the innermost dim, then strided steps (no divisions per element) */
    const int nd = (int)meta[0];
    const long inner = meta[nd], sa = meta[2 * nd], sb = meta[3 * nd];
    for (long i = i0; i < i1;) {
        long ao, bo;
        nd_offsets(i, meta, &ao, &bo);
        const long run = min(i1 - i, inner - i % inner);
        __global const hstore_t *ar = a + ao, *br = b + bo;
        __global hstore_t *yr = y + i;
        if (sa == 1 && sb == 0) {  /* a row against one value of b (x - mean, x * scale) */
            const float bv = LDH(br, 0);
            BIN_RUN_OPS(LDH(ar, k), bv)
        } else if (sa == 0 && sb == 1) {
            const float av = LDH(ar, 0);
            BIN_RUN_OPS(av, LDH(br, k))
        } else if (sa == 1 && sb == 1) {  /* two rows (a bias over the last dim) */
            BIN_RUN_OPS(LDH(ar, k), LDH(br, k))
        } else {
            for (long k = 0; k < run; k++)
                STH(y, i + k, ad_binary_op(op, LDH(a, ao + k * sa), LDH(b, bo + k * sb)));
        }
        i += run;
    }
}

/* torch.where: y = c != 0 ? a : b (a select: the other side's Inf/NaN never show; NaN c is true);
   meta = [nd, shape[nd], cstride[nd], astride[nd], bstride[nd]] (0 = broadcast) */
__kernel void where_nd(__global const float *c, const long c_off, __global const float *a, const long a_off,
                       __global const float *b, const long b_off, __global float *y, const long y_off,
                       const long n, const long chunk, __global const long *meta)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    const int nd = (int)meta[0];
    c += c_off; a += a_off; b += b_off; y += y_off;
    /* offsets once per run along the innermost dim, then strided steps (as binary_nd) */
    const long inner = meta[nd], sc = meta[2 * nd], sa = meta[3 * nd], sb = meta[4 * nd];
    for (long i = i0; i < i1;) {
        long r = i, co = 0, ao = 0, bo = 0;
        for (int d = nd - 1; d >= 0; d--) {
            const long s = meta[1 + d];
            const long q = r / s, k = r - q * s;
            co += k * meta[1 + nd + d];
            ao += k * meta[1 + 2 * nd + d];
            bo += k * meta[1 + 3 * nd + d];
            r = q;
        }
        const long run = min(i1 - i, inner - i % inner);
        for (long k = 0; k < run; k++)
            y[i + k] = c[co + k * sc] != 0.0f ? a[ao + k * sa] : b[bo + k * sb];
        i += run;
    }
}

/* strided copy: meta = [nd, shape[nd], sstride[nd], dstride[nd]]; built with HDT 1/2 it moves 16-bit words
   as they are (a half array's permute, slice or cat converts nothing) */
__kernel void copy_nd(__global const hstore_t *src, const long s_off, __global hstore_t *dst, const long d_off,
                      const long n, const long chunk, __global const long *meta)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    const int nd = (int)meta[0];
    const long inner = meta[nd], ss = meta[2 * nd], ds = meta[3 * nd];  /* the last dim and its strides */
    src += s_off; dst += d_off;
    /* runs along the last dim: the offsets' divisions once per run, not per element */
    for (long i = i0; i < i1;) {
        long so, dof;
        nd_offsets(i, meta, &so, &dof);
        const long run = min(i1 - i, inner - i % inner);
        __global const hstore_t *sr = src + so;
        __global hstore_t *dr = dst + dof;
        if (ss == 1 && ds == 1)
            for (long k = 0; k < run; k++) dr[k] = sr[k];
        else if (ds == 1)
            for (long k = 0; k < run; k++) dr[k] = sr[k * ss];
        else
            for (long k = 0; k < run; k++) dr[k * ds] = sr[k * ss];
        i += run;
    }
}

/* 2-D padding of (P, H, W) planes to (P, OH, OW); mode PAD_ZEROS, PAD_REFLECT, PAD_REPLICATE,
   PAD_CIRCULAR (ad_pad_index). One work item per output row: global (OH, P). */
__kernel void pad2d(__global const float *x, const long x_off, __global float *y, const long y_off,
                    const int H, const int W, const int OH, const int OW, const int top, const int left,
                    const int mode)
{
    const int oh = get_global_id(0);
    const long p = get_global_id(1);
    if (oh >= OH) return;
    const int ih = ad_pad_index(oh - top, H, mode);
    __global float *yr = y + y_off + (p * OH + oh) * (long)OW;
    if (ih < 0) { for (int ow = 0; ow < OW; ow++) yr[ow] = 0.0f; return; }
    const __global float *xr = x + x_off + (p * H + ih) * (long)W;
    for (int ow = 0; ow < OW; ow++) {
        const int iw = ad_pad_index(ow - left, W, mode);
        yr[ow] = iw < 0 ? 0.0f : xr[iw];
    }
}

/* reduction of x viewed as (O, R, I) over R, in P parts: y[o, p, i] = reduce over
   r in [p*L, min(R, p*L+L)) of x[o, r, i]. op 0 sum (Neumaier compensated), 1 max, 2 min.
   Launch: global (I, O*P). */
__kernel void reduce_ori(__global const float *x, const long x_off, __global float *y, const long y_off,
                         const long O, const long R, const long I, const long P, const long L,
                         const int op, const float scale)
{
    const long i = get_global_id(0);
    const long op_ = get_global_id(1);
    if (i >= I || op_ >= O * P) return;
    const long o = op_ / P, p = op_ - o * P;
    const long r0 = p * L, r1 = min(R, r0 + L);
    const __global float *xp = x + x_off + (o * R) * I + i;
    float res;
    if (op == 0) {
        /* four compensated (Neumaier) sums of interleaved elements: four independent dependency
           chains instead of one (the chain's latency bounds a long row), combined compensated */
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
        long r = r0;
#define AD_NEUMAIER(S, C, V) { const float v_ = (V), t_ = S + v_; \
                               C += fabs(S) >= fabs(v_) ? (S - t_) + v_ : (v_ - t_) + S; S = t_; }
        if (I == 1 && r1 - r0 >= 64) {
            /* a contiguous row: sixteen compensated sums in one vector (the branch a select), folded
               into the scalar chains below; a CPU runs it at its vector width, not one chain's latency */
            float16 vs = 0.0f, vc = 0.0f;
            for (; r + 16 <= r1; r += 16) {
                const float16 v = vload16(0, xp + r), t = vs + v;
                vc += select((v - t) + vs, (vs - t) + v, isgreaterequal(fabs(vs), fabs(v)));
                vs = t;
            }
            float ls[16], lc[16];
            vstore16(vs, 0, ls);
            vstore16(vc, 0, lc);
            for (int j = 0; j < 16; j += 4) {
                AD_NEUMAIER(s0, c0, ls[j]);
                AD_NEUMAIER(s1, c1, ls[j + 1]);
                AD_NEUMAIER(s2, c2, ls[j + 2]);
                AD_NEUMAIER(s3, c3, ls[j + 3]);
                c0 += lc[j]; c1 += lc[j + 1]; c2 += lc[j + 2]; c3 += lc[j + 3];
            }
        }
        for (; r + 4 <= r1; r += 4) {
            AD_NEUMAIER(s0, c0, xp[r * I]);
            AD_NEUMAIER(s1, c1, xp[(r + 1) * I]);
            AD_NEUMAIER(s2, c2, xp[(r + 2) * I]);
            AD_NEUMAIER(s3, c3, xp[(r + 3) * I]);
        }
        for (; r < r1; r++)
            AD_NEUMAIER(s0, c0, xp[r * I]);
        AD_NEUMAIER(s0, c0, s1);
        AD_NEUMAIER(s0, c0, s2);
        AD_NEUMAIER(s0, c0, s3);
#undef AD_NEUMAIER
        const float c = c0 + (c1 + c2 + c3);
        res = isfinite(s0) ? (s0 + c) * scale : s0 * scale;
    } else if (op == 1) {
        float m = -INFINITY;
        for (long r = r0; r < r1; r++) { const float v = xp[r * I]; m = (v > m || isnan(v)) ? v : m; if (isnan(m)) break; }
        res = m;
    } else {
        float m = INFINITY;
        for (long r = r0; r < r1; r++) { const float v = xp[r * I]; m = (v < m || isnan(v)) ? v : m; if (isnan(m)) break; }
        res = m;
    }
    y[y_off + (o * P + p) * I + i] = res;
}

/* Neumaier compensated addition of V into (S, C): scalar, float8 and float16 lanes. */
#define AD_NEUMAIER(S, C, V) { const float v_ = (V), t_ = S + v_; \
                               C += fabs(S) >= fabs(v_) ? (S - t_) + v_ : (v_ - t_) + S; S = t_; }
#define AD_NEUMAIER8(S, C, V) { const float8 t_ = S + V; \
                                C += select((V - t_) + S, (S - t_) + V, fabs(S) >= fabs(V)); S = t_; }
#define AD_NEUMAIER16(S, C, V) { const float16 t_ = S + V; \
                                 C += select((V - t_) + S, (S - t_) + V, fabs(S) >= fabs(V)); S = t_; }
/* blocked compensated sums of a contiguous row: 32 lanes (two float16s); each lane adds
   AD_BLK of its values plainly (relative error <= (AD_BLK - 1) eps of their absolute sum) and
   Neumaier-adds that partial into its running (s, c), so the compensation costs one step per
   AD_BLK values instead of one per value; the lanes are combined compensated at the end. */
#define AD_BLK 8
#define AD_LANES_TO(S0, S1, C0, C1, s, c) { \
    float sl_[32]; vstore16(S0, 0, sl_); vstore16(S1, 1, sl_); \
    for (int j_ = 0; j_ < 32; j_++) AD_NEUMAIER(s, c, sl_[j_]); \
    const float16 cc_ = C0 + C1; \
    const float8 c8_ = cc_.lo + cc_.hi; \
    c += ((c8_.s0 + c8_.s1) + (c8_.s2 + c8_.s3)) + ((c8_.s4 + c8_.s5) + (c8_.s6 + c8_.s7)); }

/* (s, q) = (sum(d), sum(d^2)) * inv_n over a contiguous row, d = x - A, blocked compensated
   (AD_BLK), a finite sum taken as (s + c). */
#define AD_DEV_SUMS(A, SM, QM) { \
    float16 S0 = 0.0f, S1 = 0.0f, C0 = 0.0f, C1 = 0.0f; \
    float16 Q0 = 0.0f, Q1 = 0.0f, D0 = 0.0f, D1 = 0.0f; \
    long i = 0; \
    for (; i + 32 * AD_BLK <= n; i += 32 * AD_BLK) { \
        float16 d0 = LDH16(xp, i) - (A), d1 = LDH16(xp, i + 16) - (A); \
        float16 p0 = d0, p1 = d1, q0 = d0 * d0, q1 = d1 * d1; \
        for (int k = 1; k < AD_BLK; k++) { \
            d0 = LDH16(xp, i + 32 * k) - (A); \
            d1 = LDH16(xp, i + 32 * k + 16) - (A); \
            p0 += d0; p1 += d1; \
            q0 += d0 * d0; q1 += d1 * d1; \
        } \
        AD_NEUMAIER16(S0, C0, p0); AD_NEUMAIER16(S1, C1, p1); \
        AD_NEUMAIER16(Q0, D0, q0); AD_NEUMAIER16(Q1, D1, q1); \
    } \
    for (; i + 32 <= n; i += 32) { \
        const float16 d0 = LDH16(xp, i) - (A), d1 = LDH16(xp, i + 16) - (A); \
        const float16 q0 = d0 * d0, q1 = d1 * d1; \
        AD_NEUMAIER16(S0, C0, d0); AD_NEUMAIER16(S1, C1, d1); \
        AD_NEUMAIER16(Q0, D0, q0); AD_NEUMAIER16(Q1, D1, q1); \
    } \
    float s = 0.0f, c = 0.0f, sq = 0.0f, cq = 0.0f; \
    for (; i < n; i++) { const float d = LDH(xp, i) - (A); AD_NEUMAIER(s, c, d); AD_NEUMAIER(sq, cq, d * d); } \
    AD_LANES_TO(S0, S1, C0, C1, s, c) \
    AD_LANES_TO(Q0, Q1, D0, D1, sq, cq) \
    SM = isfinite(s) ? (s + c) * inv_n : s * inv_n; \
    QM = isfinite(sq) ? (sq + cq) * inv_n : sq * inv_n; }

/* each row of x viewed (rows, n) normalised as layers.py's composite _normalize (the corrected
   two-pass mean and variance), one work item a row (CPU family), in two passes over the row
   (the second from cache: a row of up to 64K floats is 256 KB), as PyTorch's CPU group_norm:
   1. shifted sums: K = the mean of the row's first (up to) 256 values (any shift is exact in
      exact arithmetic; one near the mean keeps the cancellation small), d = x - K,
      m = mean(d), q = mean(d^2), var = q - m^2. Accepted when m^2 <= var / 4 (the
      cancellation loses at most a factor 1.25 in var's relative error): the mean K + m is split
      as a = float(K + m) and b = (K - a) + m, as the composite's mean a and correction b.
   2. otherwise (the shift far from the mean, non-finite values) one more pass about the
      accurate mean a = K + m: b = mean(x - a), q = mean((x - a)^2), var = q - b^2
      (= mean((d - b)^2), sum(d - b) = 0), the composite's corrected two-pass statistics.
   Then y = ((x - a) - b) * rsqrt(var + eps). The means are blocked compensated sums (AD_BLK)
   times the host's float32(1/n). Launch: global (rows). */
inline void norm_row_stats(const __global hstore_t *xp, const long n, const float inv_n, const float eps,
                           float *pa, float *pb, float *prs)
{
    const int nk = (int)min(n, 256L);
    float K = 0.0f;
    for (int i = 0; i < nk; i++) K += LDH(xp, i);
    K /= (float)nk;
    float m, q, a, b, v;
    AD_DEV_SUMS(K, m, q)
    v = q - m * m;
    if (isfinite(K) && isfinite(m) && isfinite(v) && m * m <= 0.25f * v) {
        a = K + m;
        b = (K - a) + m;
    } else {
        a = K + m;
        AD_DEV_SUMS(a, b, q)
        v = q - b * b;  /* >= 0 but for rounding; NaN stays NaN */
    }
    const float t = (v < 0.0f ? 0.0f : v) + eps;
    *pa = a;
    *pb = b;
    *prs = AD_RSQRT(t);
}

__kernel void norm_rows(__global const hstore_t *x, const long x_off, __global float *y, const long y_off,
                        const long rows, const long n, const float inv_n, const float eps)
{
    const long r = get_global_id(0);
    if (r >= rows) return;
    const __global hstore_t *xp = x + x_off + r * n;  /* float32, or half read as stored (HDT) */
    __global float *yp = y + y_off + r * n;
    float a, b, rs;
    norm_row_stats(xp, n, inv_n, eps, &a, &b, &rs);
    long i = 0;
    for (; i + 16 <= n; i += 16) vstore16(((LDH16(xp, i) - a) - b) * rs, 0, yp + i);
    for (; i < n; i++) yp[i] = ((LDH(xp, i) - a) - b) * rs;
}

/* norm_rows with the norm's affine fused (layer_norm, group_norm): y = norm(x) * w[ch] + bias[ch] (each
   when its flag bit is set: 1 w, 2 bias), then silu(y) with flag bit 4 (a GroupNorm + SiLU pair of a
   compiled graph), computed in float32 as the composite (a product, then a sum; silu as the unary kernel)
   and stored in x's dtype (HDT: rounded once). Channel of value i of row r: ch = (r % G) * cpr + i / inner
   (layer_norm: G 1, inner 1; group_norm: G groups of cpr channels of inner values). */
/* silu of each lane, as the unary kernel computes it (ad_mul_sigmoid, elementwise_math.h) */
#define NORM_SILU16(v) { float t_[16]; vstore16(v, 0, t_); \
                         for (int j_ = 0; j_ < 16; j_++) t_[j_] = ad_mul_sigmoid(t_[j_], t_[j_]); v = vload16(0, t_); }
__kernel void norm_rows_aff(__global const hstore_t *x, const long x_off, __global hstore_t *y, const long y_off,
                            const long rows, const long n, const float inv_n, const float eps,
                            __global const hstore_t *w, const long w_off, __global const hstore_t *bias,
                            const long b_off, const int flags, const long G, const long cpr, const long inner)
{
    const long r = get_global_id(0);
    if (r >= rows) return;
    w += w_off;
    bias += b_off;
    const __global hstore_t *xp = x + x_off + r * n;
    __global hstore_t *yp = y + y_off + r * n;
    float a, b, rs;
    norm_row_stats(xp, n, inv_n, eps, &a, &b, &rs);
    const long cb = (r % G) * cpr;
    const int hw = flags & 1, hb = flags & 2, silu = flags & 4;
    long i = 0;
    if (inner == 1) {  /* one channel a value: w and bias read along the row */
        for (; i + 16 <= n; i += 16) {
            float16 v = ((LDH16(xp, i) - a) - b) * rs;
            if (hw) v = v * LDH16(w, cb + i);
            if (hb) v = v + LDH16(bias, cb + i);
            if (silu) NORM_SILU16(v)
            STH16(yp, i, v);
        }
    } else if (inner % 16 == 0) {  /* each 16 values in one channel */
        for (; i + 16 <= n; i += 16) {
            const long ch = cb + i / inner;
            float16 v = ((LDH16(xp, i) - a) - b) * rs;
            if (hw) v = v * LDH(w, ch);
            if (hb) v = v + LDH(bias, ch);
            if (silu) NORM_SILU16(v)
            STH16(yp, i, v);
        }
    }
    for (; i < n; i++) {
        const long ch = cb + i / inner;
        float v = ((LDH(xp, i) - a) - b) * rs;
        if (hw) v = v * LDH(w, ch);
        if (hb) v = v + LDH(bias, ch);
        if (silu) v = ad_mul_sigmoid(v, v);
        STH(yp, i, v);
    }
}
#undef AD_DEV_SUMS

/* the exact softmax's numerators of each row of x viewed (B, M, n), as attention.py's composite:
   m = max(max(row), -FLT_MAX) (NaN if the row has one), e = exp(x - m) and t[b * M + i] =
   max(compensated sum of e, 1). e goes to y in gemm_cpu's packed-A layout with MR = mr rows a
   tile ([b][ceil(M/mr)][n][mr], the rows past M zeros), so the product e @ v needs no pack_a;
   mr = 1 is the plain (B, M, n) layout (y may then be x). One work item a row (CPU family).
   Launch: global (B * ceil(M/mr) * mr). */
__kernel void softmax_rows(__global const float *x, const long x_off, __global float *y, const long y_off,
                           __global float *t, const long t_off, const long B, const long M, const long n,
                           const int mr)
{
    const long mt = (M + mr - 1) / mr, mp = mt * mr;
    const long g = get_global_id(0);
    if (g >= B * mp) return;
    const long b = g / mp, i = g - b * mp;
    __global float *yp = y + y_off + ((b * mt + i / mr) * n) * mr + i % mr;
    long j = 0;
    if (i >= M) {
        for (j = 0; j < n; j++) yp[j * mr] = 0.0f;
        return;
    }
    const __global float *xp = x + x_off + (b * M + i) * n;
    float8 m8 = -INFINITY;
    int8 nan8 = 0;
    for (; j + 8 <= n; j += 8) { const float8 v = vload8(0, xp + j); m8 = fmax(m8, v); nan8 |= isnan(v); }
    float m = fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)), fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7)));
    int has_nan = any(nan8);
    for (; j < n; j++) { m = fmax(m, xp[j]); has_nan |= isnan(xp[j]); }
    m = has_nan ? NAN : fmax(m, -FLT_MAX);
    float8 s0 = 0.0f, s1 = 0.0f, c0 = 0.0f, c1 = 0.0f;
    for (j = 0; j + 16 <= n; j += 16) {
        const float8 e0 = exp(vload8(0, xp + j) - m), e1 = exp(vload8(0, xp + j + 8) - m);
        if (mr == 1) {
            vstore8(e0, 0, yp + j);
            vstore8(e1, 0, yp + j + 8);
        } else {
            __global float *d = yp + j * mr;
            d[0] = e0.s0; d[mr] = e0.s1; d[2 * mr] = e0.s2; d[3 * mr] = e0.s3;
            d[4 * mr] = e0.s4; d[5 * mr] = e0.s5; d[6 * mr] = e0.s6; d[7 * mr] = e0.s7;
            d += 8 * mr;
            d[0] = e1.s0; d[mr] = e1.s1; d[2 * mr] = e1.s2; d[3 * mr] = e1.s3;
            d[4 * mr] = e1.s4; d[5 * mr] = e1.s5; d[6 * mr] = e1.s6; d[7 * mr] = e1.s7;
        }
        AD_NEUMAIER8(s0, c0, e0); AD_NEUMAIER8(s1, c1, e1);
    }
    float s = 0.0f, c = 0.0f;
    for (; j < n; j++) { const float e = AD_EXP(xp[j] - m); yp[j * mr] = e; AD_NEUMAIER(s, c, e); }
    const float sl[16] = {s0.s0, s0.s1, s0.s2, s0.s3, s0.s4, s0.s5, s0.s6, s0.s7,
                          s1.s0, s1.s1, s1.s2, s1.s3, s1.s4, s1.s5, s1.s6, s1.s7};
    for (int q = 0; q < 16; q++) AD_NEUMAIER(s, c, sl[q]);
    const float8 cc = c0 + c1;
    c += ((cc.s0 + cc.s1) + (cc.s2 + cc.s3)) + ((cc.s4 + cc.s5) + (cc.s6 + cc.s7));
    const float tot = isfinite(s) ? s + c : s;
    t[t_off + b * M + i] = (tot > 1.0f || isnan(tot)) ? tot : 1.0f;
}

/* softmax_rows with mr > 1, a tile of mr (<= 16) rows a work item: each row's max first, then k
   outer and the tile's rows inner, so the packed-A stores run contiguously ([k][mr] blocks) and
   the mr rows are read as mr sequential streams. Same values as softmax_rows (per row: the same
   max and exps, a sixteen-chain compensated sum); the sums go to t[t_off + b * t_bs + i] (t_bs = M:
   (B, M); larger: rows of a longer (B, t_bs) array). Launch: global (B * ceil(M/mr)). */
__kernel void softmax_tile(__global const float *x, const long x_off, __global float *y, const long y_off,
                           __global float *t, const long t_off, const long B, const long M, const long n,
                           const int mr, const long t_bs)
{
    const long mt = (M + mr - 1) / mr;
    const long g = get_global_id(0);
    if (g >= B * mt) return;
    const long b = g / mt, i0 = (g - b * mt) * mr;
    const int rows = (int)min((long)mr, M - i0);
    const __global float *xt = x + x_off + (b * M + i0) * n;
    __global float *yt = y + y_off + (g * n) * mr;
    float mx[16];
    for (int r = 0; r < rows; r++) {
        const __global float *xp = xt + r * n;
        float8 m8 = -INFINITY;
        int8 nan8 = 0;
        long j = 0;
        for (; j + 8 <= n; j += 8) { const float8 v = vload8(0, xp + j); m8 = fmax(m8, v); nan8 |= isnan(v); }
        float m = fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)), fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7)));
        int has_nan = any(nan8);
        for (; j < n; j++) { m = fmax(m, xp[j]); has_nan |= isnan(xp[j]); }
        mx[r] = has_nan ? NAN : fmax(m, -FLT_MAX);
    }
    float16 s0[16], c0[16];
    for (int r = 0; r < rows; r++) { s0[r] = 0.0f; c0[r] = 0.0f; }
    long j = 0;
    for (; j + 16 <= n; j += 16) {
        __global float *d = yt + j * mr;
        for (int r = 0; r < rows; r++) {
            const float16 e0 = exp(vload16(0, xt + r * n + j) - mx[r]);
            d[r] = e0.s0; d[mr + r] = e0.s1; d[2 * mr + r] = e0.s2; d[3 * mr + r] = e0.s3;
            d[4 * mr + r] = e0.s4; d[5 * mr + r] = e0.s5; d[6 * mr + r] = e0.s6; d[7 * mr + r] = e0.s7;
            d[8 * mr + r] = e0.s8; d[9 * mr + r] = e0.s9; d[10 * mr + r] = e0.sa; d[11 * mr + r] = e0.sb;
            d[12 * mr + r] = e0.sc; d[13 * mr + r] = e0.sd; d[14 * mr + r] = e0.se; d[15 * mr + r] = e0.sf;
            float16 S = s0[r], C = c0[r];
            AD_NEUMAIER16(S, C, e0);
            s0[r] = S; c0[r] = C;
        }
        for (int r = rows; r < mr; r++)
            for (int q = 0; q < 16; q++) d[q * mr + r] = 0.0f;
    }
    for (int r = 0; r < mr; r++) {
        if (r >= rows) {
            for (long k = j; k < n; k++) yt[k * mr + r] = 0.0f;
            continue;
        }
        const __global float *xp = xt + r * n;
        const float m = mx[r];
        float s = 0.0f, c = 0.0f;
        for (long k = j; k < n; k++) { const float e = AD_EXP(xp[k] - m); yt[k * mr + r] = e; AD_NEUMAIER(s, c, e); }
        float sl[16];
        vstore16(s0[r], 0, sl);
        for (int q = 0; q < 16; q++) AD_NEUMAIER(s, c, sl[q]);
        const float8 cc = c0[r].lo + c0[r].hi;
        c += ((cc.s0 + cc.s1) + (cc.s2 + cc.s3)) + ((cc.s4 + cc.s5) + (cc.s6 + cc.s7));
        const float tot = isfinite(s) ? s + c : s;
        t[t_off + b * t_bs + i0 + r] = (tot > 1.0f || isnan(tot)) ? tot : 1.0f;
    }
}

/* norm_rows for the GPU family: a work group of NR_WG work items a row, each summing a strided
   share compensated (Neumaier), the shares combined compensated in a local-memory tree; the
   same three means and the same output formula. Launch: global (rows * NR_WG), local (NR_WG). */
#define NR_WG 256
__kernel void norm_rows_wg(__global const hstore_t *x, const long x_off, __global float *y, const long y_off,
                           const long rows, const long n, const float inv_n, const float eps)
{
    __local float ls[NR_WG], lc[NR_WG];
    const long r = get_group_id(0);
    const int l = (int)get_local_id(0);
    if (r >= rows) return;
    const __global hstore_t *xp = x + x_off + r * n;
    __global float *yp = y + y_off + r * n;
    float a = 0.0f, b = 0.0f, v = 0.0f;
    for (int mode = 0; mode < 3; mode++) {
        float s = 0.0f, c = 0.0f;
        for (long i0 = 0; i0 < n; i0 += NR_WG) {  /* a trip count uniform over the group (PoCL
                                                      crashed on per-item ones with rows < NR_WG) */
            const long i = i0 + l;
            const float xv = i < n ? LDH(xp, i) : 0.0f;
            const float d = (xv - a) - b;
            const float q = i >= n ? 0.0f : mode == 0 ? xv : mode == 1 ? xv - a : d * d;
            AD_NEUMAIER(s, c, q);
        }
        ls[l] = s;
        lc[l] = c;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int h = NR_WG / 2; h > 0; h >>= 1) {
            if (l < h) {
                float S = ls[l], C = lc[l] + lc[l + h];
                AD_NEUMAIER(S, C, ls[l + h]);
                ls[l] = S;
                lc[l] = C;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float S = ls[0], C = lc[0];
        const float res = isfinite(S) ? (S + C) * inv_n : S * inv_n;
        barrier(CLK_LOCAL_MEM_FENCE);  /* every item has read ls[0] before the next mode writes */
        if (mode == 0) a = res; else if (mode == 1) b = res; else v = res;
    }
    const float t = v + eps;
    const float rs = AD_RSQRT(t);
    for (long i0 = 0; i0 < n; i0 += NR_WG) {
        const long i = i0 + l;
        if (i < n) yp[i] = ((LDH(xp, i) - a) - b) * rs;
    }
}
#undef AD_LANES_TO
#undef AD_BLK
#undef AD_NEUMAIER8
#undef AD_NEUMAIER16
#undef AD_NEUMAIER

/* small matmul: one work item per C element, two-level summation. C[b] = A[b] . B[b] (+bias)
   A[m,k] = A[a_off + b*a_bs + m*sam + k*sak], B[k,n] = B[b_off + b*b_bs + k*sbk + n*sbn], C contiguous.
   Launch: global (N, M, batches). */
__kernel void gemm_small(const int M, const int N, const int K,
                         __global const float *A, const long a_off, const int sam, const int sak, const long a_bs,
                         __global const float *B, const long b_off, const int sbk, const int sbn, const long b_bs,
                         __global float *C, const long c_off, __global const float *bias, const int has_bias,
                         const int rows)
{
    /* one work item: rows [m0, m0 + rows) x all N columns of batch b (one launch, few work
       groups: PoCL's per-group cost dominates tiny products). Launch (1, ceil(M/rows), batches). */
    const int m0 = get_global_id(1) * rows, b = get_global_id(2);
    const int m1 = min(M, m0 + rows);
    for (int m = m0; m < m1; m++) {
        const __global float *ap = A + a_off + b * a_bs + (long)m * sam;
        for (int n = 0; n < N; n++) {
            const __global float *bp = B + b_off + b * b_bs + (long)n * sbn;
            float tot = 0.0f;
            for (int k0 = 0; k0 < K; k0 += 64) {
                const int k1 = min(K, k0 + 64);
                float acc = 0.0f;
                for (int k = k0; k < k1; k++) acc = fma(ap[(long)k * sak], bp[(long)k * sbk], acc);
                tot += acc;
            }
            if (has_bias) tot += bias[m];
            C[c_off + ((long)b * M + m) * N + n] = tot;
        }
    }
}

/* One Adam / AdamW step of one parameter (backend/learn/optim.py's formulas, torch's single-tensor
   float32 order of operations, every product and sum rounded on its own: FP_CONTRACT off and each
   step through ad_binary_op, exactly the ops the unfused path launches one by one):
     diff = g - m;  m' = lerp_form ? g + diff * w : m + diff * w
     v' = v * beta2 + (g * omb2) * g;  s = amsgrad ? max(vmax, v') : v'   (vmax' = s)
     p' = p + (m' * neg_step) / (sqrt(s) / bc2_sqrt + eps)
   Contiguous operands of n elements; outputs are new arrays (offset 0). */
__kernel void adam_step(__global const float *p, const long p_off, __global const float *g, const long g_off,
                        __global const float *m, const long m_off, __global const float *v, const long v_off,
                        __global const float *vm, const long vm_off,
                        __global float *po, __global float *mo, __global float *vo, __global float *vmo,
                        const long n, const long chunk, const float w, const int lerp_form, const float beta2,
                        const float omb2, const float bc2_sqrt, const float eps, const float neg_step,
                        const int amsgrad)
{
#pragma OPENCL FP_CONTRACT OFF
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    p += p_off; g += g_off; m += m_off; v += v_off; vm += vm_off;
    for (long i = i0; i < i1; i++) {
        const float gi = g[i], mi = m[i];
        const float diff = ad_binary_op(BOP_SUB, gi, mi);
        const float mn = ad_binary_op(BOP_ADD, lerp_form ? gi : mi, ad_binary_op(BOP_MUL, diff, w));
        const float vn = ad_binary_op(BOP_ADD, ad_binary_op(BOP_MUL, v[i], beta2),
                                      ad_binary_op(BOP_MUL, ad_binary_op(BOP_MUL, gi, omb2), gi));
        float s = vn;
        if (amsgrad) {
            s = ad_binary_op(BOP_MAX, vm[i], vn);
            vmo[i] = s;
        }
        const float denom = ad_binary_op(BOP_ADD, ad_binary_op(BOP_DIV, AD_SQRT(s), bc2_sqrt), eps);
        po[i] = ad_binary_op(BOP_ADD, p[i], ad_binary_op(BOP_DIV, ad_binary_op(BOP_MUL, mn, neg_step), denom));
        mo[i] = mn;
        vo[i] = vn;
    }
}

/* torch's prelu: y = x > 0 ? x : x * w[c] in one pass (the composite where(x > 0, x, x * w) is three), c = the
   channel of element i: (i / inner) % C (C 1: one slope). x, w and y stored as HDT. Flat chunks as `unary`;
   each run of one channel's values reads its slope once. */
__kernel void prelu_ch(__global const hstore_t *x, const long x_off, __global const hstore_t *w, const long w_off,
                       __global hstore_t *y, const long y_off, const long n, const long chunk, const long C,
                       const long inner)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    x += x_off; w += w_off; y += y_off;
    for (long i = i0; i < i1;) {
        const long q = i / inner;
        const float s = LDH(w, C == 1 ? 0 : q % C);
        const long e = min(i1, (q + 1) * inner);
        for (; i < e; i++) {
            const float v = LDH(x, i);
            STH(y, i, v > 0.0f ? v : v * s);
        }
    }
}

/* torch.where with every operand either contiguous of the output's n elements or one element
   (bit 0 / 1 / 2 of `scalars`: c / a / b is one element, read at its offset): where_nd's select
   without its per-element index arithmetic (the relu backward's where(y <= 0, 0, gy)). */
__kernel void where_flat(__global const float *c, const long c_off, __global const float *a, const long a_off,
                         __global const float *b, const long b_off, __global float *y, const long y_off,
                         const long n, const long chunk, const int scalars)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    c += c_off; a += a_off; b += b_off; y += y_off;
    if (scalars == 1) {
        const float cv = c[0];
        for (long i = i0; i < i1; i++) y[i] = cv != 0.0f ? a[i] : b[i];
    } else if (scalars == 2) {
        const float av = a[0];
        for (long i = i0; i < i1; i++) y[i] = c[i] != 0.0f ? av : b[i];
    } else if (scalars == 4) {
        const float bv = b[0];
        for (long i = i0; i < i1; i++) y[i] = c[i] != 0.0f ? a[i] : bv;
    } else if (scalars == 0) {
        for (long i = i0; i < i1; i++) y[i] = c[i] != 0.0f ? a[i] : b[i];
    } else {
        for (long i = i0; i < i1; i++) {
            const float cv = (scalars & 1) ? c[0] : c[i];
            y[i] = cv != 0.0f ? ((scalars & 2) ? a[0] : a[i]) : ((scalars & 4) ? b[0] : b[i]);
        }
    }
}

/* ---- dtype conversion: float32 <-> float16 / bfloat16 stored as 16-bit words -----------------
 * float16 through core vload_half / f32_to_f16 (storage only: no cl_khr_fp16 needed);
 * bfloat16 by bits, rounded to nearest even, a NaN kept a quiet NaN (as torch does). */
#define CHUNK_RANGE(n, chunk) \
    const long i0 = (long)get_global_id(0) * (chunk); \
    const long i1 = min((n), i0 + (chunk))

__kernel void cast_from_f32(__global const float *x, const long x_off, __global ushort *y, const long n,
                            const long chunk, const int to_bf16)
{
    CHUNK_RANGE(n, chunk);
    x += x_off;
    for (long i = i0; i < i1; ++i) {  /* the flag is uniform: the compiler unswitches the loop */
        if (to_bf16) y[i] = f32_to_bf16(x[i]);
        else y[i] = f32_to_f16(x[i]);
    }
}

__kernel void cast_to_f32(__global const ushort *x, const long x_off, __global float *y, const long n,
                          const long chunk, const int from_bf16)
{
    CHUNK_RANGE(n, chunk);
    x += x_off;
    for (long i = i0; i < i1; ++i)
        y[i] = from_bf16 ? as_float((uint)x[i] << 16) : vload_half((size_t)i, (__global const half *)x);
}
