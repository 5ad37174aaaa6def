/* GPU-family conv2d as an implicit GEMM, portable subset (prelude + body; OpenCL and NVRTC).

   out[n, g*CoutG + m, p] = bias + sum_k W[g*CoutG + m, k] * X(n, g, k, p)
     k = (ci, kh, kw) over CinG*KH*KW, p = (oh, ow) over OH*OW, zero padding (pt, pl), any
     stride/dilation, groups. Input x is (N, C, H, W), weight (Cout, CinG, KH, KW), out (N, Cout, OH, OW),
     all contiguous float32. Tiles, register microkernel and two-level accumulation: gemm_tile.h.

   kernel conv2d_gpu(const float *x, OFF_T x_off, const float *w, OFF_T w_off, float *y, OFF_T y_off,
                     const float *bias, int has_bias,
                     int C, int H, int W, int CoutG, int CinG, int KH, int KW, int G,
                     int OH, int OW, int sh, int sw, int pt, int pl, int dh, int dw)
   Launch geometry: groups (ceil(OH*OW/BN), ceil(CoutG/BM), N*G), group size (BN/TN, BM/TM, 1)
                    = (16, 16, 1) with the defaults. GRP2 = n*G + g.
   Tunables (-D): BM, BN, BK, TM, TN, KP (gemm_tile.h).
*/
#include "gemm_tile.h"

/* x[n, g*CinG + ci, ih, iw] (xb: image n, group g), 0 on the zero padding */
DEVICE_FN float conv2d_gather(const GLOBAL float *xb, const int ci, const int ih, const int iw,
                              const int H, const int W)
{
    return (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xb[((OFF_T)ci * H + ih) * W + iw] : 0.0f;
}
#define CONV_GATHER(ci, kh, kw, oh, ow) \
    conv2d_gather(xb, ci, (oh) * sh - pt + (kh) * dh, (ow) * sw - pl + (kw) * dw, H, W)

KERNEL void conv2d_gpu(CONV_TILE_ARGS(pt, pl))
{
    CONV_TILE_BEGIN();
    const GLOBAL float *wb = w + w_off + (OFF_T)g * CoutG * K;    /* (CoutG, K) of group g */

    for (int k0 = 0; k0 < K; k0 += BK) {
        FOR_TILE_ELEMS(BM, kk, mm) {
            const int m = m_blk + mm, k = k0 + kk;
            As[kk][mm] = (m < CoutG && k < K) ? wb[(OFF_T)m * K + k] : 0.0f;
        }
        CONV_FILL_B(k0)
        GEMM_TILE_STEP();
    }
    CONV_TILE_STORE();
}
