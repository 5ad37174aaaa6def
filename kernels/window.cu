/* window.cu: pooling and resampling through index/weight tables (backend/windows.py), in the
 * portable subset (kernels/README.md): prelude_cuda.cuh + this file for CUDA/HIP, prelude_opencl.h
 * + this file as OpenCL C for both OpenCL kernel families.
 *
 * kernel ad_window2d(x, y, ridx, rwgt, cidx, cwgt, planes, H, W, OH, OW, T, S, mode)
 *   y (planes, OH, OW) from x (planes, H, W), both contiguous. Row table ridx/rwgt (OH, T), column
 *   table cidx/cwgt (OW, S); an index -1 is a skipped tap. mode 0 (sum):
 *     y[p, oh, ow] = sum_i rwgt[oh, i] * (sum_j cwgt[ow, j] * x[p, ridx[oh, i], cidx[ow, j]])
 *   over valid taps (torch's bilinear order: the column sum first); mode 1 (max): the max over
 *   valid taps, a NaN propagating as in torch's max_pool2d, -inf where no tap is valid.
 *   Build options WT / WS (> 0) fix T / S at compile time (unrolled tap loops).
 *   launch: 2-D; dim 0 over ow (any number of groups, grid-stride), dim 1 over planes*OH rows
 *   (grid-stride over groups: any count, e.g. <= 65535 for CUDA).
 */
#ifndef WT
#define WT 0
#endif
#ifndef WS
#define WS 0
#endif

#ifdef ANYDEVICE_OPENCL
#define AD_NEG_INF (-INFINITY)
#else
#define AD_NEG_INF (-__int_as_float(0x7f800000))
#endif

KERNEL void ad_window2d(const GLOBAL float* RESTRICT x, GLOBAL float* RESTRICT y,
                        const GLOBAL int* RESTRICT ridx, const GLOBAL float* RESTRICT rwgt,
                        const GLOBAL int* RESTRICT cidx, const GLOBAL float* RESTRICT cwgt,
                        const int planes, const int H, const int W, const int OH, const int OW,
                        const int T_, const int S_, const int mode)
{
    const int T = WT > 0 ? WT : T_;
    const int S = WS > 0 ? WS : S_;
    const OFF_T rows = (OFF_T)planes * OH;
    for (OFF_T r = GRP1; r < rows; r += NGRP1) {
        const int oh = (int)(r % OH);
        const GLOBAL float* xp = x + (r / OH) * H * (OFF_T)W;
        GLOBAL float* yr = y + r * OW;
        for (int ow = GRP0 * LSZ0 + LID0; ow < OW; ow += NGRP0 * LSZ0) {
            float acc = mode ? AD_NEG_INF : 0.0f;
            for (int i = 0; i < T; ++i) {
                const int h = ridx[oh * T + i];
                if (h < 0)
                    continue;
                const GLOBAL float* xr = xp + (OFF_T)h * W;
                if (mode == 0) {
                    float s = 0.0f;
                    for (int j = 0; j < S; ++j) {
                        const int w = cidx[ow * S + j];
                        if (w >= 0)
                            s += cwgt[ow * S + j] * xr[w];
                    }
                    acc += rwgt[oh * T + i] * s;
                } else {
                    for (int j = 0; j < S; ++j) {
                        const int w = cidx[ow * S + j];
                        if (w >= 0) {
                            const float v = xr[w];
                            if (v > acc || AD_ISNAN(v))
                                acc = v;
                        }
                    }
                }
            }
            yr[ow] = acc;
        }
    }
}
