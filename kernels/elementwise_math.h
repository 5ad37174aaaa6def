/* elementwise_math.h: the elementwise math of both APIs, written once in the portable subset
 * (kernels/README.md; needs the prelude). Included by elementwise.cl (OpenCL kernels unary,
 * binary_flat, binary_nd, pad2d) and misc_cuda.cu (CUDA kernels ad_unary, ad_pad), so the two
 * backends compute the same function; tests/conformance/test_portable_kernels.py holds both to torch
 * (float64) element by element on NaN, Inf, signed zeros, overflow and cancellation inputs.
 *
 * Semantics, as torch:
 *   NaN inputs give NaN for every op; clamp with a NaN bound gives NaN, and with min > max
 *   gives max; relu(-0) and leaky_relu(-0) are -0; minimum/maximum propagate NaN from either
 *   operand.
 * Accuracy: sigmoid, silu and gelu(approximate="tanh") are all x * sigmoid(t) (ad_mul_sigmoid),
 *   computed without overflow or cancellation: gelu_tanh's 0.5 x (1 + tanh(u)) cancels where
 *   tanh(u) -> -1 (x = -5: 35 % off, x = -6: 0 instead of -8.4e-11), and 1 / (1 + exp(-x))
 *   overflows to 0 where torch's sigmoid(-90) is 8.2e-40; tanh is exactly +-1 where float32
 *   rounds it there.
 */
#ifndef ANYDEVICE_ELEMENTWISE_MATH_H
#define ANYDEVICE_ELEMENTWISE_MATH_H

/* grid-stride loop over [0, total) with 64-bit indices, for any 1-D launch geometry (the elementwise kernels
   of misc_cuda.cu and elementwise_half_cuda.cu) */
#define GRID_STRIDE_LOOP(idx, total) \
    for (OFF_T idx = (OFF_T)GID0; idx < (total); idx += (OFF_T)NGRP0 * LSZ0)

/* ---- unary ops: codes as UNARY_KERNEL_CODES in backend/ops/contract.py ------------------------- */
#define OP_ABS 0
#define OP_NEG 1
#define OP_EXP 2
#define OP_LOG 3
#define OP_SQRT 4
#define OP_RELU 5
#define OP_SIGMOID 6
#define OP_TANH 7
#define OP_GELU 8
#define OP_GELU_TANH 9
#define OP_SILU 10
#define OP_ELU 11
#define OP_LEAKY_RELU 12
#define OP_SOFTPLUS 13
#define OP_CLAMP 14
#define OP_RSQRT 15
#define OP_ERF 16
#define OP_SIN 17
#define OP_COS 18
/* X(op) for every op code: a kernel can specialise its loop per op (elementwise.cl) */
#define AD_UNARY_OPS(X) X(OP_ABS) X(OP_NEG) X(OP_EXP) X(OP_LOG) X(OP_SQRT) X(OP_RELU) X(OP_SIGMOID) \
    X(OP_TANH) X(OP_GELU) X(OP_GELU_TANH) X(OP_SILU) X(OP_ELU) X(OP_LEAKY_RELU) X(OP_SOFTPLUS) X(OP_CLAMP) \
    X(OP_RSQRT) X(OP_ERF) X(OP_SIN) X(OP_COS)
/* clamp's flags: which bounds are given */
#define CLAMP_HAS_MIN 1
#define CLAMP_HAS_MAX 2

/* tanh, exactly +-1 from |x| >= 9.1 on: correctly rounded float32 tanh is +-1 from |x| = 9.011
 * (13 ln 2) on; some tanhf, PoCL's among them, stop at 1 - ulp there (tanh(20.5) = 0.99999994) */
DEVICE_FN_INLINE float ad_tanh(const float x)
{
    return AD_FABS(x) >= 9.1f ? AD_COPYSIGN(1.0f, x) : AD_TANH(x);
}

/* x * sigmoid(t) = x / (1 + exp(-t)); below t = -80, where exp(-t) nears float32's overflow
 * (Inf from t = -88.7 on, which made the result 0), x exp(t) / (1 + exp(t)) = x exp(t) (1 + exp(t)
 * is 1 there), so the result keeps its digits down to float32's denormals */
DEVICE_FN_INLINE float ad_mul_sigmoid(const float x, const float t)
{
    const int mid = t >= -80.0f;
    const float e = AD_EXP(mid ? -t : t);    /* one exp: vectorised loops evaluate both sides */
    return mid ? x / (1.0f + e) : x * e;
}

/* y = op(x); p0/p1: elu alpha, leaky_relu slope, softplus beta/threshold, clamp min/max (the
 * bounds that flags name) */
DEVICE_FN_INLINE float ad_unary_op(const float x, const int op, const float p0, const float p1, const int flags)
{
    switch (op) {
    case OP_ABS: return AD_FABS(x);
    case OP_NEG: return -x;
    case OP_EXP: return AD_EXP(x);
    case OP_LOG: return AD_LOG(x);
    case OP_SQRT: return AD_SQRT(x);
    case OP_RELU: return x < 0.0f ? 0.0f : x;            /* NaN and -0 pass through */
    case OP_SIGMOID: return ad_mul_sigmoid(1.0f, x);
    case OP_TANH: return ad_tanh(x);
    case OP_GELU: return 0.5f * x * AD_ERFC(-x * 0.70710678118654752440f);
    case OP_GELU_TANH: {                                  /* 0.5 x (1 + tanh(u)) = x sigmoid(2u) */
        const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
        return ad_mul_sigmoid(x, 2.0f * u);
    }
    case OP_SILU: return ad_mul_sigmoid(x, x);
    case OP_ELU: return x > 0.0f ? x : p0 * AD_EXPM1(x);
    case OP_LEAKY_RELU: return x > 0.0f ? x : x * p0;
    case OP_SOFTPLUS: {
        const float bx = x * p0;
        if (bx > p1) return x;
        /* exp of the exact product: bx's rounding error lo (by FMA) enters as exp(bx)(1 + lo);
         * without it a large |bx| costs |bx| * 6e-8 relative (1e-6 at bx = -25 on NVIDIA's exp) */
        const float lo = FMA(x, p0, -bx);
        const float e = AD_EXP(bx);
        return AD_LOG1P(e > 0.0f && e < 3.0e38f ? FMA(e, lo, e) : e) / p0;
    }
    case OP_CLAMP: {
        float v = x;
        if ((flags & CLAMP_HAS_MIN) && (v < p0 || AD_ISNAN(p0))) v = p0;
        if ((flags & CLAMP_HAS_MAX) && (v > p1 || AD_ISNAN(p1))) v = p1;
        return v;
    }
    case OP_RSQRT: return AD_RSQRT(x);                    /* rsqrt(+-0) = +-Inf, rsqrt(x < 0) = NaN */
    case OP_ERF: return AD_ERF(x);
    case OP_SIN: return AD_SIN(x);
    case OP_COS: return AD_COS(x);
    default: return x;
    }
}

/* ---- binary ops: codes as BINARY_CODES in backend/devices/opencl/ (used by elementwise.cl;
 * the CUDA backend's binary ops are CuPy's, whose minimum/maximum propagate NaN alike) ------- */
#define BOP_ADD 0
#define BOP_SUB 1
#define BOP_MUL 2
#define BOP_DIV 3
#define BOP_POW 4
#define BOP_MIN 5
#define BOP_MAX 6
/* comparisons (torch.eq ... ge): 1.0f / 0.0f; NaN compares false except in ne */
#define BOP_EQ 7
#define BOP_NE 8
#define BOP_LT 9
#define BOP_LE 10
#define BOP_GT 11
#define BOP_GE 12

DEVICE_FN_INLINE float ad_binary_op(const int op, const float a, const float b)
{
    switch (op) {
    case BOP_ADD: return a + b;
    case BOP_SUB: return a - b;
    case BOP_MUL: return a * b;
    case BOP_DIV: return a / b;
    case BOP_POW: return AD_POW(a, b);
    case BOP_MIN: return (a < b || AD_ISNAN(a)) ? a : b;
    case BOP_EQ: return a == b ? 1.0f : 0.0f;
    case BOP_NE: return a != b ? 1.0f : 0.0f;
    case BOP_LT: return a < b ? 1.0f : 0.0f;
    case BOP_LE: return a <= b ? 1.0f : 0.0f;
    case BOP_GT: return a > b ? 1.0f : 0.0f;
    case BOP_GE: return a >= b ? 1.0f : 0.0f;
    default: return (a > b || AD_ISNAN(a)) ? a : b;
    }
}

/* ---- padding (torch.nn.functional.pad) ----------------------------------------------------- */
#define PAD_ZEROS 0
#define PAD_REFLECT 1
#define PAD_REPLICATE 2
#define PAD_CIRCULAR 3

/* the input index that output position i (counted from the input's first element, so negative
 * inside the leading pad) reads along an axis of n elements, or -1 where the output is 0.
 * reflect needs pad < n, circular pad <= n (checked by the contract). */
DEVICE_FN int ad_pad_index(int i, const int n, const int mode)
{
    if (mode == PAD_REFLECT) {
        i = i < 0 ? -i : i;
        return i >= n ? 2 * (n - 1) - i : i;
    }
    if (mode == PAD_REPLICATE) return i < 0 ? 0 : (i >= n ? n - 1 : i);
    if (mode == PAD_CIRCULAR) {
        i %= n;
        return i < 0 ? i + n : i;
    }
    return (i < 0 || i >= n) ? -1 : i;
}

#endif
