/* misc_cuda.cu: the CUDA backend's elementwise kernels, compiled as prelude_cuda.cuh + this file
 * for CUDA/HIP. Written in the portable subset (kernels/README.md), so prelude_opencl.h + this
 * file also builds as OpenCL C: that is how tests/conformance/test_portable_kernels.py exercises the kernels'
 * logic on PoCL. The pad and unary math is kernels/elementwise_math.h, which the OpenCL
 * backend's elementwise.cl includes too (one definition for both APIs).
 *
 * kernel ad_pad(x, y, planes, H, W, top, left, OH, OW, mode)
 *   y (planes, OH, OW) = x (planes, H, W) padded by top/left (bottom/right follow from OH/OW);
 *   mode 0 zeros, 1 reflect, 2 replicate, 3 circular (torch.nn.functional.pad semantics).
 *   launch: 1-D, any geometry (grid-stride loop over planes*OH*OW), group size BLOCK.
 * kernel ad_unary(x, y, n, op, p0, p1, flags)
 *   y[i] = ad_unary_op(x[i], ...) (elementwise_math.h) for contiguous x, y of n elements; op
 *   codes as UNARY_KERNEL_CODES in backend/ops/contract.py; p0/p1 the op's parameters (alpha, slope,
 *   beta/threshold, min/max); flags bit 0/1: clamp has min/max. NaN and Inf as in torch.
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

#include "elementwise_math.h"

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
        const int ih = ad_pad_index(oh - top, H, mode), iw = ad_pad_index(ow - left, W, mode);
        y[idx] = (ih < 0 || iw < 0) ? 0.0f : x[(plane * H + ih) * W + iw];
    }
}

KERNEL void ad_unary(const GLOBAL float* RESTRICT x, GLOBAL float* RESTRICT y, const OFF_T n,
                     const int op, const float p0, const float p1, const int flags)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = ad_unary_op(x[i], op, p0, p1, flags);
}

/* input index i of output o through tap k along one axis (size n): conv i = o*s - p + k*d;
 * transposed conv i = (o + p - k*d) / s where that divides. Returns whether i is a real input. */
DEVICE_FN int ad_tap(const int o, const int p, const int k, const int d, const int s, const int n,
                     const int transposed, int* i)
{
    if (!transposed) {
        *i = o * s - p + k * d;
        return *i >= 0 && *i < n;
    }
    const int t = o + p - k * d;
    *i = t >= 0 ? t / s : -1;
    return t >= 0 && *i * s == t && *i < n;
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
                const int row_in = ad_tap(oh, ph, kh, dh, sh, H, transposed, &ih);
                if (transposed && !row_in) continue;
                for (int kw = 0; kw < KW; kw++) {
                    int iw;
                    if (!row_in || !ad_tap(ow, pw, kw, dw, sw, W, transposed, &iw)) {
                        /* a conv tap on the zero padding still multiplies its weight by 0, as torch
                         * does: an Inf/NaN weight makes NaN there too (a transposed conv's skipped
                         * taps are not products at all) */
                        if (!transposed) acc = FMA(0.0f, wp[kh * KW + kw], acc);
                        continue;
                    }
                    acc = FMA(xp[(OFF_T)ih * W + iw], wp[kh * KW + kw], acc);
                }
            }
            tot += acc;
        }
        y[idx] = tot + (has_bias ? bias[co] : 0.0f);
    }
}
