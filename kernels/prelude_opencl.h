/* Portable-subset prelude for OpenCL C (see kernels/README.md). */
#ifndef ANYDEVICE_PRELUDE_H
#define ANYDEVICE_PRELUDE_H
#define ANYDEVICE_OPENCL 1
#define KERNEL __kernel
#define DEVICE_FN inline
/* a device function the compiler must inline (PoCL left the 20-case ad_unary_op a call per value inside
 * the gelu loop, which then ran scalar: 6x slower); CUDA's DEVICE_FN always inlines */
#define DEVICE_FN_INLINE inline __attribute__((always_inline))
#define GLOBAL __global
#define LOCAL __local
#define RESTRICT restrict
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define LID0 ((int)get_local_id(0))
#define LID1 ((int)get_local_id(1))
#define GRP0 ((int)get_group_id(0))
#define GRP1 ((int)get_group_id(1))
#define GRP2 ((int)get_group_id(2))
#define LSZ0 ((int)get_local_size(0))
#define LSZ1 ((int)get_local_size(1))
#define NGRP0 ((int)get_num_groups(0))
#define NGRP1 ((int)get_num_groups(1))
#define NGRP2 ((int)get_num_groups(2))
#define GID0 ((int)get_global_id(0))
#define GID1 ((int)get_global_id(1))
#define GID2 ((int)get_global_id(2))
#define FMA(a, b, c) fma((a), (b), (c))
#define OFF_T long
/* 16-byte vectors: LD4/ST4 load/store four floats at a 16-byte-aligned address */
#define LD4(p) vload4(0, (p))
#define ST4(p, v) vstore4((v), 0, (p))
#define MAKE4(a, b, c, d) ((float4)((a), (b), (c), (d)))
#define ALIGN16 __attribute__((aligned(16)))
/* float math: OpenCL's overloads (CUDA spells the float versions expf, ...) */
#define AD_FABS(x) fabs(x)
#define AD_EXP(x) exp(x)
#define AD_EXPM1(x) expm1(x)
#define AD_LOG(x) log(x)
#define AD_LOG1P(x) log1p(x)
#define AD_SQRT(x) sqrt(x)
#define AD_TANH(x) tanh(x)
#define AD_ERFC(x) ad_erfc(x)
#define AD_ERF(x) erf(x)
#define AD_RSQRT(x) rsqrt(x)
#define AD_SIN(x) sin(x)
#define AD_COS(x) cos(x)
#define AD_POW(x, y) pow((x), (y))
#define AD_COPYSIGN(x, y) copysign((x), (y))
#define AD_ISNAN(x) isnan(x)
/* erfc without the OpenCL library's: PoCL's erfc is scalar code (about 30 ns per value on a 2-core
 * AVX-512 EPYC, so gelu took 30x an add); this one vectorises. erfc(z) = t exp(-z^2 + P(t)),
 * t = 1 / (1 + z/2) (Numerical Recipes' erfcc, fractional error < 1.2e-7), with exp(-z^2) split as
 * exp(-z2) exp(z2 - z^2) (z2 = z*z rounded, its error by fma) so a large z loses nothing to z*z's rounding;
 * erfc(-z) = 2 - erfc(z). Max relative error 5.3e-7 on [-10, 10] (against math.erfc, float32 steps). */
DEVICE_FN_INLINE float ad_erfc(float x) {
    float z = fmin(fabs(x), 10.5f);  /* erfc(10.5) underflows float32 */
    float t = 1.0f / fma(0.5f, z, 1.0f);
    float p = fma(t, 0.17087277f, -0.82215223f);
    p = fma(t, p, 1.48851587f);
    p = fma(t, p, -1.13520398f);
    p = fma(t, p, 0.27886807f);
    p = fma(t, p, -0.18628806f);
    p = fma(t, p, 0.09678418f);
    p = fma(t, p, 0.37409196f);
    p = fma(t, p, 1.00002368f);
    p = fma(t, p, -1.26551223f);
    float z2 = z * z;
    float r = t * exp(-z2) * exp(p - fma(z, z, -z2));
    r = x >= 0.0f ? r : 2.0f - r;
    return isnan(x) ? x : r;
}
/* a float from its IEEE bits */
#define AD_BITS_TO_FLOAT(u) as_float((uint)(u))
#endif
