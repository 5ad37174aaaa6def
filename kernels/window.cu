/* window.cu: pooling and resampling through index/weight tables (backend/ops/windows.py), in the
 * portable subset (kernels/README.md): prelude_cuda.cuh + this file for CUDA/HIP, prelude_opencl.h
 * + this file as OpenCL C for both OpenCL kernel families.
 *
 * kernel ad_window2d(x, y, ridx, rwgt, cidx, cwgt, planes, H, W, OH, OW, T, S, mode)
 *   y (planes, OH, OW) from x (planes, H, W), both contiguous. Row table ridx/rwgt (OH, T), column
 *   table cidx/cwgt (OW, S); an index -1 is a skipped tap. mode 0 (sum):
 *     y[p, oh, ow] = sum_i rwgt[oh, i] * (sum_j cwgt[ow, j] * x[p, ridx[oh, i], cidx[ow, j]])
 *   over valid taps (torch's bilinear order: the column sum first); mode 1 (max): the max over
 *   valid taps, a NaN propagating as in torch's max_pool2d, -inf where no tap is valid.
 *   Build options WT / WS (> 0) fix T / S at compile time (unrolled tap loops); DENSE_R / DENSE_C
 *   (1) promise that table has no -1 (no index checks); IDENT_R (1) reads the row table as the
 *   identity (the column pass of the separable path: x -> (cols) -> t -> ad_window_rows -> y).
 *   launch: 2-D; dim 0 over ow (any number of groups, grid-stride), dim 1 over planes*OH rows
 *   (grid-stride over groups: any count, e.g. <= 65535 for CUDA).
 * kernel ad_window2d_px(same arguments)
 *   The same, one output per work item (OpenCL CPU family): 3-D, global size >= (OW, OH, planes).
 */
#ifndef WT
#define WT 0
#endif
#ifndef WS
#define WS 0
#endif
#ifndef DENSE_R
#define DENSE_R 0
#endif
#ifndef DENSE_C
#define DENSE_C 0
#endif
#ifndef IDENT_R
#define IDENT_R 0
#endif

#ifdef ANYDEVICE_OPENCL
#define AD_NEG_INF (-INFINITY)
#else
#define AD_NEG_INF (-__int_as_float(0x7f800000))
#endif

/* tap checks the DENSE_* build options drop */
#if DENSE_R
#define AD_ROW_OK(h) 1
#else
#define AD_ROW_OK(h) ((h) >= 0)
#endif
#if DENSE_C
#define AD_COL_OK(w) 1
#else
#define AD_COL_OK(w) ((w) >= 0)
#endif

/* one output: row oh of a plane starting at xp, column ow (IDENT_R: row oh itself, weight 1) */
DEVICE_FN float ad_window_px(const GLOBAL float* RESTRICT xp, const GLOBAL int* RESTRICT ridx,
                             const GLOBAL float* RESTRICT rwgt, const GLOBAL int* RESTRICT cidx,
                             const GLOBAL float* RESTRICT cwgt, const int W, const int oh, const int ow,
                             const int T, const int S, const int mode)
{
    float acc = mode ? AD_NEG_INF : 0.0f;
#if IDENT_R
    const int nt = 1;
#else
    const int nt = T;
#endif
    for (int i = 0; i < nt; ++i) {
#if IDENT_R
        const int h = oh;
        const float wr = 1.0f;
#else
        const int h = ridx[oh * T + i];
        if (!AD_ROW_OK(h))
            continue;
        const float wr = rwgt[oh * T + i];
#endif
        const GLOBAL float* xr = xp + (OFF_T)h * W;
        if (mode == 0) {
            float s = 0.0f;
            for (int j = 0; j < S; ++j) {
                const int w = cidx[ow * S + j];
                if (AD_COL_OK(w))
                    s += cwgt[ow * S + j] * xr[w];
            }
            acc += wr * s;
        } else {
            for (int j = 0; j < S; ++j) {
                const int w = cidx[ow * S + j];
                if (AD_COL_OK(w)) {
                    const float v = xr[w];
                    acc = (v > acc || AD_ISNAN(v)) ? v : acc;
                }
            }
        }
    }
    return acc;
}

/* the arguments of ad_window2d and ad_window2d_px (runtime/signatures.py: 6 buffers, 8 ints) */
#define AD_WINDOW2D_ARGS const GLOBAL float* RESTRICT x, GLOBAL float* RESTRICT y, \
    const GLOBAL int* RESTRICT ridx, const GLOBAL float* RESTRICT rwgt, \
    const GLOBAL int* RESTRICT cidx, const GLOBAL float* RESTRICT cwgt, \
    const int planes, const int H, const int W, const int OH, const int OW, const int T_, const int S_, const int mode

KERNEL void ad_window2d(AD_WINDOW2D_ARGS)
{
    const int T = WT > 0 ? WT : T_;
    const int S = WS > 0 ? WS : S_;
    const OFF_T rows = (OFF_T)planes * OH;
    for (OFF_T r = GRP1; r < rows; r += NGRP1) {
        const int oh = (int)(r % OH);
        const GLOBAL float* xp = x + (r / OH) * H * (OFF_T)W;
        GLOBAL float* yr = y + r * OW;
        for (int ow = GRP0 * LSZ0 + LID0; ow < OW; ow += NGRP0 * LSZ0)
            yr[ow] = ad_window_px(xp, ridx, rwgt, cidx, cwgt, W, oh, ow, T, S, mode);
    }
}

/* the same, one output per work item and no loops over the launch (CPU devices: PoCL runs a work
 * group's items as one vectorised loop): dims 0, 1, 2 over ow, oh, planes */
KERNEL void ad_window2d_px(AD_WINDOW2D_ARGS)
{
    const int T = WT > 0 ? WT : T_;
    const int S = WS > 0 ? WS : S_;
    const int ow = GID0, oh = GID1, p = GID2;
    if (ow >= OW || oh >= OH || p >= planes)
        return;
    y[((OFF_T)p * OH + oh) * OW + ow] = ad_window_px(x + (OFF_T)p * H * W, ridx, rwgt, cidx, cwgt, W, oh, ow,
                                                     T, S, mode);
}

/* kernel ad_window_rows(t, y, ridx, rwgt, planes, H, W, OH, T, mode)
 *   The row pass alone: y (planes, OH, W) from t (planes, H, W) through the row table, as
 *   ad_window2d with the identity as column table (the same sums, in the same order). Each work
 *   item makes whole output rows, one contiguous (vectorisable) loop per tap.
 *   launch: 1-D, any geometry (grid-stride over the planes*OH rows). */
KERNEL void ad_window_rows(const GLOBAL float* RESTRICT t, GLOBAL float* RESTRICT y,
                           const GLOBAL int* RESTRICT ridx, const GLOBAL float* RESTRICT rwgt,
                           const int planes, const int H, const int W, const int OH, const int T,
                           const int mode)
{
    const OFF_T rows = (OFF_T)planes * OH;
    for (OFF_T r = (OFF_T)GID0; r < rows; r += (OFF_T)NGRP0 * LSZ0) {
        const int oh = (int)(r % OH);
        const GLOBAL float* tp = t + (r / OH) * H * (OFF_T)W;
        GLOBAL float* RESTRICT yr = y + r * W;
        int first = 1;
        for (int i = 0; i < T; ++i) {
            const int h = ridx[oh * T + i];
            if (h < 0)
                continue;
            const GLOBAL float* RESTRICT tr = tp + (OFF_T)h * W;
            const float wt = rwgt[oh * T + i];
            if (mode == 0) {
                if (first)
                    for (int w = 0; w < W; ++w)
                        yr[w] = 0.0f + wt * tr[w];
                else
                    for (int w = 0; w < W; ++w)
                        yr[w] += wt * tr[w];
            } else {
                if (first)
                    for (int w = 0; w < W; ++w)
                        yr[w] = tr[w];
                else
                    for (int w = 0; w < W; ++w) {
                        const float v = tr[w], a = yr[w];
                        yr[w] = (v > a || AD_ISNAN(v)) ? v : a;
                    }
            }
            first = 0;
        }
        if (first)
            for (int w = 0; w < W; ++w)
                yr[w] = mode ? AD_NEG_INF : 0.0f;
    }
}
