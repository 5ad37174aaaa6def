/* GPU-family conv_transpose2d as an implicit GEMM, portable subset (prelude + body).

   out[n, g*CoutG + m, oh, ow] = bias + sum over (ci, kh, kw) of
       x[n, g*CinG + ci, ih, iw] * w[g*CinG + ci, m, kh, kw]
   where ih = (oh + ph - kh*dh) / sh when that division is exact and 0 <= ih < H (same for iw).
   The GEMM is M = CoutG, N = OH*OW (one image), K = CinG*KH*KW with the invalid taps read as 0.
   Tiles, register microkernel and two-level accumulation: gemm_tile.h.

   kernel conv_transpose2d_gpu(const float *x, OFF_T x_off, const float *w, OFF_T w_off,
                               float *y, OFF_T y_off, const float *bias, int has_bias,
                               int C, int H, int W, int CoutG, int CinG, int KH, int KW, int G,
                               int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw)
     x (N, C, H, W), w (C, CoutG, KH, KW), y (N, G*CoutG, OH, OW), contiguous float32.
   Launch geometry: groups (ceil(OH*OW/BN), ceil(CoutG/BM), N*G), group size (BN/TN, BM/TM, 1)
                    = (16, 16, 1) with the defaults. GRP2 = n*G + g.
   Tunables (-D): BM, BN, BK, TM, TN, KP (gemm_tile.h).
*/
#include "gemm_tile.h"

KERNEL void conv_transpose2d_gpu(const GLOBAL float *RESTRICT x, const OFF_T x_off,
                                 const GLOBAL float *RESTRICT w, const OFF_T w_off,
                                 GLOBAL float *RESTRICT y, const OFF_T y_off,
                                 const GLOBAL float *RESTRICT bias, const int has_bias,
                                 const int C, const int H, const int W, const int CoutG, const int CinG,
                                 const int KH, const int KW, const int G, const int OH, const int OW,
                                 const int sh, const int sw, const int ph, const int pw, const int dh, const int dw)
{
    CONV_TILE_BEGIN();
    const GLOBAL float *wb = w + w_off + (OFF_T)g * CinG * CoutG * KHW;   /* (CinG, CoutG, KHW) of group g */

    for (int k0 = 0; k0 < K; k0 += BK) {
        FOR_TILE_ELEMS(BM, kk, mm) {
            const int m = m_blk + mm, k = k0 + kk;
            float v = 0.0f;
            if (m < CoutG && k < K) {
                const int ci = k / KHW, r = k - ci * KHW;
                v = wb[((OFF_T)ci * CoutG + m) * KHW + r];
            }
            As[kk][mm] = v;
        }
        FOR_TILE_ELEMS(BN, kk, pp) {
            const int p = n_blk + pp, k = k0 + kk;
            float v = 0.0f;
            if (p < P && k < K) {
                const int ci = k / KHW, r = k - ci * KHW;
                const int kh = r / KW, kw = r - kh * KW;
                const int oh = p / OW, ow = p - oh * OW;
                const int th = oh + ph - kh * dh, tw = ow + pw - kw * dw;
                if (th >= 0 && tw >= 0) {
                    const int ih = th / sh, iw = tw / sw;
                    if (ih * sh == th && iw * sw == tw && ih < H && iw < W)
                        v = xb[((OFF_T)ci * H + ih) * W + iw];
                }
            }
            Bs[kk][pp] = v;
        }
        GEMM_TILE_STEP();
    }
    CONV_TILE_STORE();
}
