/* misc_cuda.cu: the CUDA backend's elementwise kernels, compiled as prelude_cuda.cuh + this file
 * for CUDA/HIP. Written in the portable subset (kernels/README.md), so prelude_opencl.h + this
 * file also builds as OpenCL C: that is how tests/test_portable_kernels.py exercises the kernels'
 * logic on PoCL. Math functions go through the AD_* macros below (CUDA's float spellings vs
 * OpenCL's overloads).
 *
 * kernel ad_pad(x, y, planes, H, W, top, left, OH, OW, mode)
 *   y (planes, OH, OW) = x (planes, H, W) padded by top/left (bottom/right follow from OH/OW);
 *   mode 0 zeros, 1 reflect, 2 replicate, 3 circular (torch.nn.functional.pad semantics).
 *   launch: 1-D, any geometry (grid-stride loop over planes*OH*OW), group size BLOCK.
 * kernel ad_unary(x, y, n, op, p0, p1, flags)
 *   y[i] = op(x[i]) for contiguous x, y of n elements; op codes as UNARY_CODES in
 *   backend/cuda_backend.py; p0/p1 the op's parameters (alpha, slope, beta/threshold, min/max);
 *   flags bit 0/1: clamp has min/max. NaN and Inf propagate as in torch.
 *   launch: 1-D, any geometry (grid-stride loop), group size BLOCK.
 * kernel ad_direct_conv(x, w, bias, has_bias, y, N, C, H, W, Cout, CinG, CoutG, KH, KW, OH, OW,
 *                       sh, sw, ph, pw, dh, dw, transposed)
 *   Direct (one thread per output element) conv2d, or conv_transpose2d when `transposed`, for
 *   convolutions with few output channels per group (depthwise, SSIM's blur), where a GEMM tile
 *   would be mostly empty. x (N, C, H, W), y (N, Cout, OH, OW), w (Cout, CinG, KH, KW) or, when
 *   transposed, (C, CoutG, KH, KW); all contiguous. Taps are summed per input channel and the
 *   channel sums accumulated separately (two-level, for long sums).
 *   launch: 1-D, any geometry (grid-stride loop), group size BLOCK.
 */
#ifndef BLOCK
#define BLOCK 256
#endif

#ifdef ANYDEVICE_OPENCL
#define AD_FABS(x) fabs(x)
#define AD_EXP(x) exp(x)
#define AD_EXPM1(x) expm1(x)
#define AD_LOG(x) log(x)
#define AD_LOG1P(x) log1p(x)
#define AD_SQRT(x) sqrt(x)
#define AD_TANH(x) tanh(x)
#define AD_ERFC(x) erfc(x)
#else
#define AD_FABS(x) fabsf(x)
#define AD_EXP(x) expf(x)
#define AD_EXPM1(x) expm1f(x)
#define AD_LOG(x) logf(x)
#define AD_LOG1P(x) log1pf(x)
#define AD_SQRT(x) sqrtf(x)
#define AD_TANH(x) tanhf(x)
#define AD_ERFC(x) erfcf(x)
#endif

/* grid-stride loop over [0, total) with 64-bit indices, for any 1-D launch geometry */
#define GRID_STRIDE_LOOP(idx, total) \
    for (OFF_T idx = (OFF_T)GID0; idx < (total); idx += (OFF_T)NGRP0 * LSZ0)

KERNEL void ad_pad(const GLOBAL float* RESTRICT x, GLOBAL float* RESTRICT y, const int planes,
                   const int H, const int W, const int top, const int left, const int OH,
                   const int OW, const int mode)
{
    const OFF_T total = (OFF_T)planes * OH * OW;
    GRID_STRIDE_LOOP(idx, total) {
        const int ow = (int)(idx % OW);
        const OFF_T t = idx / OW;
        const int oh = (int)(t % OH);
        const OFF_T plane = t / OH;
        int ih = oh - top, iw = ow - left;
        float v = 0.0f;
        if (mode == 0) {
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[(plane * H + ih) * W + iw];
        } else {
            if (mode == 1) {            /* reflect (pad < size, checked by the contract) */
                ih = ih < 0 ? -ih : ih;
                ih = ih >= H ? 2 * (H - 1) - ih : ih;
                iw = iw < 0 ? -iw : iw;
                iw = iw >= W ? 2 * (W - 1) - iw : iw;
            } else if (mode == 2) {     /* replicate */
                ih = ih < 0 ? 0 : (ih >= H ? H - 1 : ih);
                iw = iw < 0 ? 0 : (iw >= W ? W - 1 : iw);
            } else {                    /* circular (pad <= size) */
                ih = ((ih % H) + H) % H;
                iw = ((iw % W) + W) % W;
            }
            v = x[(plane * H + ih) * W + iw];
        }
        y[idx] = v;
    }
}

/* op codes: keep in sync with UNARY_CODES in backend/cuda_backend.py */
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

DEVICE_FN float ad_unary_op(const float x, const int op, const float p0, const float p1,
                            const int flags)
{
    switch (op) {
    case OP_ABS: return AD_FABS(x);
    case OP_NEG: return -x;
    case OP_EXP: return AD_EXP(x);
    case OP_LOG: return AD_LOG(x);
    case OP_SQRT: return AD_SQRT(x);
    case OP_RELU: return x < 0.0f ? 0.0f : x;   /* NaN and -0 pass through, as torch */
    case OP_SIGMOID: return 1.0f / (1.0f + AD_EXP(-x));
    case OP_TANH: return AD_TANH(x);
    case OP_GELU: return 0.5f * x * AD_ERFC(-x * 0.70710678118654752440f);
    case OP_GELU_TANH: {
        /* 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)): no cancellation where tanh(u) -> -1, so it
         * does not depend on tanh saturating to exactly -1 (PoCL's tanhf(-20) is -0.99999994,
         * which made 0.5 x (1 + tanh(u)) -3e-6 at x = -100 and -3e12 at x = -1e20, torch: -0) */
        const float inner = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
        return x / (1.0f + AD_EXP(-2.0f * inner));
    }
    case OP_SILU: return x / (1.0f + AD_EXP(-x));
    case OP_ELU: return x > 0.0f ? x : p0 * AD_EXPM1(x);
    case OP_LEAKY_RELU: return x > 0.0f ? x : x * p0;
    case OP_SOFTPLUS: {
        const float bx = x * p0;
        return bx > p1 ? x : AD_LOG1P(AD_EXP(bx)) / p0;
    }
    case OP_CLAMP: {
        float v = x;                      /* NaN stays NaN; min > max gives max, as torch */
        if ((flags & 1) && v < p0) v = p0;
        if ((flags & 2) && v > p1) v = p1;
        return v;
    }
    default: return x;
    }
}

KERNEL void ad_unary(const GLOBAL float* RESTRICT x, GLOBAL float* RESTRICT y, const OFF_T n,
                     const int op, const float p0, const float p1, const int flags)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = ad_unary_op(x[i], op, p0, p1, flags);
}

KERNEL void ad_direct_conv(const GLOBAL float* RESTRICT x, const GLOBAL float* RESTRICT w,
                           const GLOBAL float* RESTRICT bias, const int has_bias,
                           GLOBAL float* RESTRICT y, const int N, const int C, const int H,
                           const int W, const int Cout, const int CinG, const int CoutG,
                           const int KH, const int KW, const int OH, const int OW, const int sh,
                           const int sw, const int ph, const int pw, const int dh, const int dw,
                           const int transposed)
{
    const OFF_T total = (OFF_T)N * Cout * OH * OW;
    GRID_STRIDE_LOOP(idx, total) {
        const int ow = (int)(idx % OW);
        OFF_T t = idx / OW;
        const int oh = (int)(t % OH);
        t /= OH;
        const int co = (int)(t % Cout);
        const int n = (int)(t / Cout);
        const int g = co / CoutG;
        const int m = co - g * CoutG;
        float tot = 0.0f;
        for (int c = 0; c < CinG; c++) {
            const int ci = g * CinG + c;
            const GLOBAL float* xp = x + ((OFF_T)n * C + ci) * H * W;
            const GLOBAL float* wp = transposed ? w + ((OFF_T)ci * CoutG + m) * KH * KW
                                                : w + ((OFF_T)co * CinG + c) * KH * KW;
            float acc = 0.0f;
            for (int kh = 0; kh < KH; kh++) {
                int ih;
                if (transposed) {
                    const int ihn = oh + ph - kh * dh;
                    if (ihn < 0) continue;
                    ih = ihn / sh;
                    if (ih * sh != ihn || ih >= H) continue;
                } else {
                    ih = oh * sh - ph + kh * dh;
                }
                const int row_in = transposed || (ih >= 0 && ih < H);
                for (int kw = 0; kw < KW; kw++) {
                    int iw;
                    if (transposed) {
                        const int iwn = ow + pw - kw * dw;
                        if (iwn < 0) continue;
                        iw = iwn / sw;
                        if (iw * sw != iwn || iw >= W) continue;
                    } else {
                        /* a tap on the zero padding still multiplies its weight by 0, as torch
                         * does: an Inf/NaN weight makes NaN there too */
                        iw = ow * sw - pw + kw * dw;
                        if (!row_in || iw < 0 || iw >= W) {
                            acc = FMA(0.0f, wp[kh * KW + kw], acc);
                            continue;
                        }
                    }
                    acc = FMA(xp[(OFF_T)ih * W + iw], wp[kh * KW + kw], acc);
                }
            }
            tot += acc;
        }
        y[idx] = tot + (has_bias ? bias[co] : 0.0f);
    }
}
