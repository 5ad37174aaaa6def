/* GPU-family conv_transpose2d as an implicit GEMM, portable subset (prelude + body).

   out[n, g*CoutG + m, oh, ow] = bias + sum over (ci, kh, kw) of
       x[n, g*CinG + ci, ih, iw] * w[g*CinG + ci, m, kh, kw]
   where ih = (oh + ph - kh*dh) / sh when that division is exact and 0 <= ih < H (same for iw).
   The GEMM is M = CoutG, N = OH*OW (one image), K = CinG*KH*KW with the invalid taps read as 0.
   Tiles, register microkernel and two-level accumulation: gemm_tile.h.

   kernel conv_transpose2d_gpu(x, x_off, w, w_off, y, y_off, bias, has_bias, C, H, W, CoutG, CinG,
                               KH, KW, G, OH, OW, sh, sw, ph, pw, dh, dw)
     as conv2d_gpu (CONV_TILE_ARGS in gemm_tile.h), with w (C, CoutG, KH, KW) and the transposed
     conv's stride, padding and dilation.
   Launch geometry: groups (ceil(OH*OW/BN), ceil(CoutG/BM), N*G), group size (BN/TN, BM/TM, 1)
                    = (16, 16, 1) with the defaults. GRP2 = n*G + g.
   Tunables (-D): BM, BN, BK, TM, TN, KP (gemm_tile.h).
*/
#include "gemm_tile.h"

/* the input pixel that reaches output row/column offset (th, tw) = (oh + ph - kh*dh, ow + pw - kw*dw):
   (th/sh, tw/sw) where both divisions are exact and inside the input, else none (0) */
DEVICE_FN float conv_t_gather(const GLOBAL float *xb, const int ci, const int th, const int tw,
                              const int H, const int W, const int sh, const int sw)
{
    if (th < 0 || tw < 0) return 0.0f;
    const int ih = th / sh, iw = tw / sw;
    return (ih * sh == th && iw * sw == tw && ih < H && iw < W) ? xb[((OFF_T)ci * H + ih) * W + iw] : 0.0f;
}
#define CONV_GATHER(ci, kh, kw, oh, ow) \
    conv_t_gather(xb, ci, (oh) + ph - (kh) * dh, (ow) + pw - (kw) * dw, H, W, sh, sw)

KERNEL void conv_transpose2d_gpu(CONV_TILE_ARGS(ph, pw))
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
        CONV_FILL_B(k0)
        GEMM_TILE_STEP();
    }
    CONV_TILE_STORE();
}
