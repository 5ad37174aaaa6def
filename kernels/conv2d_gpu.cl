/* GPU-family conv2d as an implicit GEMM, portable subset (prelude + body; OpenCL and NVRTC).

   out[n, g*CoutG + m, p] = bias + sum_k W[g*CoutG + m, k] * X(n, g, k, p)
     k = (ci, kh, kw) over CinG*KH*KW, p = (oh, ow) over OH*OW, zero padding (pt, pl), any
     stride/dilation, groups. Input x is (N, C, H, W), weight (Cout, CinG, KH, KW), out (N, Cout, OH, OW),
     all contiguous float32. Two-level accumulation as gemm_gpu.

   kernel conv2d_gpu(const float *x, OFF_T x_off, const float *w, OFF_T w_off, float *y, OFF_T y_off,
                     const float *bias, int has_bias,
                     int C, int H, int W, int CoutG, int CinG, int KH, int KW, int G,
                     int OH, int OW, int sh, int sw, int pt, int pl, int dh, int dw)
   Launch geometry: groups (ceil(OH*OW/BN), ceil(CoutG/BM), N*G), group size (BN/TN, BM/TM, 1)
                    = (16, 16, 1) with the defaults. GRP2 = n*G + g.
   Tunables (-D): BM, BN, BK, TM, TN, KP as gemm_gpu.
*/
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef BK
#define BK 16
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#ifndef KP
#define KP 128
#endif

#define GTX (BN / TN)
#define GTY (BM / TM)
#define NTHR (GTX * GTY)

KERNEL void conv2d_gpu(const GLOBAL float *RESTRICT x, const OFF_T x_off,
                       const GLOBAL float *RESTRICT w, const OFF_T w_off,
                       GLOBAL float *RESTRICT y, const OFF_T y_off,
                       const GLOBAL float *RESTRICT bias, const int has_bias,
                       const int C, const int H, const int W, const int CoutG, const int CinG,
                       const int KH, const int KW, const int G, const int OH, const int OW,
                       const int sh, const int sw, const int pt, const int pl, const int dh, const int dw)
{
    LOCAL float As[BK][BM];
    LOCAL float Bs[BK][BN];
    const int tx = LID0, ty = LID1;
    const int tid = ty * GTX + tx;
    const int n_blk = GRP0 * BN, m_blk = GRP1 * BM;
    const int ng = GRP2;
    const int n = ng / G, g = ng - n * G;
    const int P = OH * OW;
    const int KHW = KH * KW;
    const int K = CinG * KHW;
    const GLOBAL float *xb = x + x_off + ((OFF_T)n * C + (OFF_T)g * CinG) * H * W;
    const GLOBAL float *wb = w + w_off + (OFF_T)g * CoutG * K;

    float acc[TM][TN];
    float tot[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) { acc[i][j] = 0.0f; tot[i][j] = 0.0f; }

    int since = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BK * BM; e += NTHR) {
            const int kk = e / BM, mm = e - kk * BM;
            const int m = m_blk + mm, k = k0 + kk;
            As[kk][mm] = (m < CoutG && k < K) ? wb[(OFF_T)m * K + k] : 0.0f;
        }
        for (int e = tid; e < BK * BN; e += NTHR) {
            const int kk = e / BN, pp = e - kk * BN;
            const int p = n_blk + pp, k = k0 + kk;
            float v = 0.0f;
            if (p < P && k < K) {
                const int ci = k / KHW, r = k - ci * KHW;
                const int kh = r / KW, kw = r - kh * KW;
                const int oh = p / OW, ow = p - oh * OW;
                const int ih = oh * sh - pt + kh * dh, iw = ow * sw - pl + kw * dw;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    v = xb[((OFF_T)ci * H + ih) * W + iw];
            }
            Bs[kk][pp] = v;
        }
        BARRIER();
        for (int kk = 0; kk < BK; kk++) {
            float a[TM], bv[TN];
            for (int i = 0; i < TM; i++) a[i] = As[kk][ty + i * GTY];
            for (int j = 0; j < TN; j++) bv[j] = Bs[kk][tx + j * GTX];
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++) acc[i][j] = FMA(a[i], bv[j], acc[i][j]);
        }
        BARRIER();
        since += BK;
        if (since >= KP) {
            since = 0;
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++) { tot[i][j] += acc[i][j]; acc[i][j] = 0.0f; }
        }
    }
    GLOBAL float *yb = y + y_off + ((OFF_T)n * G * CoutG + (OFF_T)g * CoutG) * P;
    for (int i = 0; i < TM; i++) {
        const int m = m_blk + ty + i * GTY;
        if (m >= CoutG) continue;
        const float bv = has_bias ? bias[g * CoutG + m] : 0.0f;
        for (int j = 0; j < TN; j++) {
            const int p = n_blk + tx + j * GTX;
            if (p < P) yb[(OFF_T)m * P + p] = (tot[i][j] + acc[i][j]) + bv;
        }
    }
}
