/* CPU-family W8A8 linear (OpenCL only; no local memory): dynamic int8 activations x int8 weight,
   int32 accumulation, scales in the epilogue (backend/ops/w8a8.py defines the math).

   w8a8_rows_cpu: one work item per row of x (M, K) float32: sx[m] = absmax/127 (1 for a zero row, NaN
     for a row with Inf/NaN), the row quantized (round half away from zero) into gemm's packed A:
     Ap [ceil(M/MR)][K][MR] int32 (rows past M zero). Launch global (ceil(M/MR)*MR), local 1.
   w8a8_pack_b: the int8 weight (N, K) row-major (ops/quant.py int8 bytes) into Bp [ceil(N/32)][K][32] char,
     zero padded. Launch global (ceil(K/PK), ceil(N/32)), local (1, 1).
   w8a8_gemm_cpu: one work item a (MR*MSUB) x 32 block of y: per k, two char16 loads of B widened to
     int16 and MR int32 broadcasts of A, int32 multiply-adds into 2*MR int16 accumulators. PoCL's
     LLVM (target skylake-avx512: no VNNI) turns the widened product into vpmulld + vpaddd (checked in
     the kernel cache's .so); vpmaddwd / vpdpwssd are not formed from OpenCL C. K in cache blocks of KC
     (the B panel stays in L1 across the MSUB sub-tiles); int32 sums are exact, no folding needed.
     Epilogue y[m, n] = (sx[m] * sw[n]) * (float)acc + bias[n].
     Launch global (ceil(M/(MR*MSUB)), ceil(N/32)), local (1, 1). */
#ifndef MR
#define MR 12
#endif
#ifndef MSUB
#define MSUB 4
#endif
#ifndef KC
#define KC 256
#endif
#ifndef PK
#define PK 64
#endif
#define TN 32

__kernel void w8a8_rows_cpu(__global const float *x, const long x_off, __global int *Ap, __global float *sx,
                            const int M, const int K)
{
    const int m = get_global_id(0);
    __global int *dst = Ap + (long)(m / MR) * K * MR + (m % MR);
    if (m >= M) {
        for (int k = 0; k < K; k++) dst[(long)k * MR] = 0;
        return;
    }
    const __global float *row = x + x_off + (long)m * K;
    float amax = 0.0f;
    int bad = 0;
    for (int k = 0; k < K; k++) {
        const float a = fabs(row[k]);
        bad |= !isfinite(a);
        amax = a > amax ? a : amax;
    }
    const float s = bad ? NAN : (amax > 0.0f ? amax / 127.0f : 1.0f);
    sx[m] = s;
    const float d = bad ? 1.0f : s;
    for (int k = 0; k < K; k++) {
        const float v = bad ? 0.0f : row[k] / d;
        const float r = trunc(v + copysign(0.5f, v));
        dst[(long)k * MR] = (int)clamp(r, -127.0f, 127.0f);
    }
}

__kernel void w8a8_pack_b(__global const char *W, __global char *Bp, const int N, const int K)
{
    const int k0 = get_global_id(0) * PK, nt = get_global_id(1);
    if (k0 >= K) return;
    const int k1 = min(K, k0 + PK);
    __global char *dst = Bp + (long)nt * K * TN + (long)k0 * TN;
    const int valid = min(TN, N - nt * TN);
    for (int j = 0; j < TN; j++) {
        const __global char *src = W + (long)(nt * TN + j) * K;
        if (j < valid)
            for (int k = k0; k < k1; k++) dst[(k - k0) * TN + j] = src[k];
        else
            for (int k = k0; k < k1; k++) dst[(k - k0) * TN + j] = 0;
    }
}

#include "unroll_mr.h"

#define DECL(i) int16 c##i##0 = tp[2*(i)], c##i##1 = tp[2*(i)+1];
#define STEP(i) { const int av = ap[i]; c##i##0 += av * b0; c##i##1 += av * b1; }
#define KEEP(i) tp[2*(i)] = c##i##0; tp[2*(i)+1] = c##i##1;

__kernel void w8a8_gemm_cpu(__global const int *Ap, __global const char *Bp, __global const float *sx,
                            __global const float *sw, __global const float *bias, const int has_bias,
                            __global float *C, const int M, const int N, const int K)
{
    const int m0 = get_global_id(0) * (MR * MSUB);
    const int nt = get_global_id(1), n0 = nt * TN;
    if (m0 >= M) return;
    const __global char *Bpanel = Bp + (long)nt * K * TN;
    const int nvalid = min(TN, N - n0);
    const int nsub = min(MSUB, (M - m0 + MR - 1) / MR);
    int16 tot[MSUB][MR][2];
    for (int s = 0; s < MSUB; s++)
        for (int i = 0; i < MR; i++) { tot[s][i][0] = (int16)(0); tot[s][i][1] = (int16)(0); }
    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = min(K, k0 + KC);
        for (int s = 0; s < nsub; s++) {
            int16 *tp = &tot[s][0][0];
            R(DECL)
            const __global char *bp = Bpanel + (long)k0 * TN;
            const __global int *ap = Ap + (long)(m0 / MR + s) * K * MR + (long)k0 * MR;
            for (int k = k0; k < k1; k++, bp += TN, ap += MR) {
                const int16 b0 = convert_int16(vload16(0, bp)), b1 = convert_int16(vload16(1, bp));
                R(STEP)
            }
            R(KEEP)
        }
    }
    float t[TN], scw[TN], bv[TN];
    for (int j = 0; j < TN; j++) {
        scw[j] = j < nvalid ? sw[n0 + j] : 0.0f;
        bv[j] = (has_bias && j < nvalid) ? bias[n0 + j] : 0.0f;
    }
    for (int s = 0; s < nsub; s++) {
        for (int i = 0; i < MR; i++) {
            const int m = m0 + s * MR + i;
            if (m >= M) break;
            const float sm = sx[m];
            vstore16(convert_float16(tot[s][i][0]), 0, t); vstore16(convert_float16(tot[s][i][1]), 1, t);
            __global float *cp = C + (long)m * N + n0;
            for (int j = 0; j < nvalid; j++) cp[j] = (sm * scw[j]) * t[j] + bv[j];
        }
    }
}
