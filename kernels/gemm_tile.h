/* gemm_tile.h: the tiled-GEMM core of the portable GPU-family kernels, written once (portable
   subset, needs the prelude). Included by gemm_gpu.cl, conv2d_gpu.cl and conv_transpose2d_gpu.cl,
   which differ only in how they fill the tiles (strided A/B, im2col gather, transposed-conv
   gather) and where they store C.

   A work group computes a BM x BN block of C = A . B; its (BN/TN) x (BM/TM) threads each own a
   TM x TN register block, rows ty + i*GTY and columns tx + j*GTX (i < TM, j < TN). K is walked
   in BK steps through group-shared tiles As[BK][BM] (A, k-major) and Bs[BK][BN].
   Two-level accumulation: the register partial sums acc are folded into the register totals tot
   every KP values of k, so long K keeps FP32 precision (one accumulator over K = 4608 loses
   about 2x; tests/test_portable_kernels.py).

   Tunables (-D, defaults below): BM, BN (C block per group), BK (k step), TM, TN (per-thread
   block), KP (fold interval, a multiple of BK). Requirements: (BM/TM)*(BN/TN) threads must
   divide BK*BM and BK*BN. Launch: group size (BN/TN, BM/TM, 1) = (16, 16, 1) with the defaults.

   Use, in a kernel body:
       GEMM_TILE_BEGIN();                       ids tx, ty, tid, m_blk, n_blk; tiles; zeroed sums
       for (int k0 = 0; k0 < K; k0 += BK) {
           FOR_TILE_ELEMS(BM, kk, mm) As[kk][mm] = (A at row m_blk + mm, k k0 + kk, or 0);
           FOR_TILE_ELEMS(BN, kk, nn) Bs[kk][nn] = (B at k k0 + kk, column n_blk + nn, or 0);
           GEMM_TILE_STEP();                    barrier, TM x TN FMAs per k, barrier, fold
       }
       for (int i = 0; i < TM; i++) ... GEMM_ROW(i), GEMM_COL(j), GEMM_RESULT(i, j) (epilogue)
*/
#ifndef ANYDEVICE_GEMM_TILE_H
#define ANYDEVICE_GEMM_TILE_H

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

#define GTX (BN / TN)       /* threads along n */
#define GTY (BM / TM)       /* threads along m */
#define NTHR (GTX * GTY)    /* threads per group */

#if (BM % TM) || (BN % TN) || ((BK * BM) % NTHR) || ((BK * BN) % NTHR)
#error "gemm_tile.h: the threads ((BM/TM)*(BN/TN)) must divide BK*BM and BK*BN"
#endif
#if (KP % BK) || (KP < BK)
#error "gemm_tile.h: KP must be a multiple of BK"
#endif

/* group-shared tiles, thread ids, the C block's origin, zeroed register sums */
#define GEMM_TILE_BEGIN()                                                                       \
    LOCAL float As[BK][BM];                                                                     \
    LOCAL float Bs[BK][BN];                                                                     \
    const int tx = LID0, ty = LID1;                                                             \
    const int tid = ty * GTX + tx;                                                              \
    const int n_blk = GRP0 * BN, m_blk = GRP1 * BM;                                             \
    float acc[TM][TN];          /* partial sums of the current KP block of k */                 \
    float tot[TM][TN];          /* sum of the folded blocks */                                  \
    for (int i = 0; i < TM; i++)                                                                \
        for (int j = 0; j < TN; j++) { acc[i][j] = 0.0f; tot[i][j] = 0.0f; }                     \
    int since_fold = 0

/* this thread's share of a BK x ROWS tile: element (kk, rr), kk < BK, rr < ROWS, consecutive
   threads on consecutive rr; the statement after it runs once per element */
#define FOR_TILE_ELEMS(ROWS, kk, rr)                                                            \
    for (int e_ = tid; e_ < BK * (ROWS); e_ += NTHR)                                             \
        for (int kk = e_ / (ROWS), rr = e_ - kk * (ROWS), once_ = 1; once_; once_ = 0)

/* one k step on the filled tiles: the register microkernel (a TM x TN outer product per k),
   then the fold of acc into tot every KP values of k */
#define GEMM_TILE_STEP()                                                                        \
    do {                                                                                        \
        BARRIER();                                                                              \
        for (int kk = 0; kk < BK; kk++) {                                                       \
            float a_[TM], b_[TN];                                                               \
            for (int i = 0; i < TM; i++) a_[i] = As[kk][ty + i * GTY];                           \
            for (int j = 0; j < TN; j++) b_[j] = Bs[kk][tx + j * GTX];                           \
            for (int i = 0; i < TM; i++)                                                        \
                for (int j = 0; j < TN; j++) acc[i][j] = FMA(a_[i], b_[j], acc[i][j]);           \
        }                                                                                       \
        BARRIER();                                                                              \
        since_fold += BK;                                                                       \
        if (since_fold >= KP) {                                                                 \
            since_fold = 0;                                                                     \
            for (int i = 0; i < TM; i++)                                                        \
                for (int j = 0; j < TN; j++) { tot[i][j] += acc[i][j]; acc[i][j] = 0.0f; }      \
        }                                                                                       \
    } while (0)

/* epilogue: this thread's C element (i, j), i < TM, j < TN, is row GEMM_ROW(i), column GEMM_COL(j) */
#define GEMM_ROW(i) (m_blk + ty + (i) * GTY)
#define GEMM_COL(j) (n_blk + tx + (j) * GTX)
#define GEMM_RESULT(i, j) (tot[i][j] + acc[i][j])

/* ---- the implicit-GEMM convolutions (conv2d_gpu.cl, conv_transpose2d_gpu.cl) ----------------
   M = CoutG (rows: output channels of group g), N = OH*OW (columns: pixels of image n),
   K = CinG*KH*KW (ci, kh, kw); group index GRP2 = n*G + g. Both kernels take CONV_TILE_ARGS
   (PH, PW name the padding: pt, pl in conv2d_gpu, ph, pw in conv_transpose2d_gpu), which the
   macros below use by name; CONV_TILE_BEGIN adds n, g, P, KHW, K and xb (image n, group g's
   first input channel) to GEMM_TILE_BEGIN's names.
     x (N, C, H, W) at x + x_off, y (N, G*CoutG, OH, OW) at y + y_off, contiguous float32;
     bias[G*CoutG] added when has_bias; w at w + w_off, laid out as the kernel says. */
#define CONV_TILE_ARGS(PH, PW)                                                                  \
    const GLOBAL float *RESTRICT x, const OFF_T x_off, const GLOBAL float *RESTRICT w,          \
    const OFF_T w_off, GLOBAL float *RESTRICT y, const OFF_T y_off,                             \
    const GLOBAL float *RESTRICT bias, const int has_bias, const int C, const int H,            \
    const int W, const int CoutG, const int CinG, const int KH, const int KW, const int G,      \
    const int OH, const int OW, const int sh, const int sw, const int PH, const int PW,         \
    const int dh, const int dw

#define CONV_TILE_BEGIN()                                                                       \
    GEMM_TILE_BEGIN();                                                                          \
    const int n = GRP2 / G, g = GRP2 - n * G;                                                   \
    const int P = OH * OW;                                                                      \
    const int KHW = KH * KW;                                                                    \
    const int K = CinG * KHW;                                                                   \
    const GLOBAL float *xb = x + x_off + ((OFF_T)n * C + (OFF_T)g * CinG) * H * W

/* the B tile: the implicit im2col matrix of image n, group g. CONV_GATHER(ci, kh, kw, oh, ow),
   defined by the kernel, is the input value tap (ci, kh, kw) brings to output pixel (oh, ow),
   0 where it falls on the padding or between strides. */
#define CONV_FILL_B(k0)                                                                         \
    FOR_TILE_ELEMS(BN, kk, pp) {                                                                \
        const int p = n_blk + pp, k = (k0) + kk;                                                \
        float v = 0.0f;                                                                         \
        if (p < P && k < K) {                                                                   \
            const int ci = k / KHW, r = k - ci * KHW;                                           \
            const int kh = r / KW, kw = r - kh * KW;                                            \
            const int oh = p / OW, ow = p - oh * OW;                                            \
            v = CONV_GATHER(ci, kh, kw, oh, ow);                                                \
        }                                                                                       \
        Bs[kk][pp] = v;                                                                         \
    }

/* y[n, g*CoutG + m, p] = C(m, p) + bias[g*CoutG + m] (y contiguous (N, G*CoutG, OH, OW)) */
#define CONV_TILE_STORE()                                                                       \
    do {                                                                                        \
        GLOBAL float *yb = y + y_off + ((OFF_T)n * G * CoutG + (OFF_T)g * CoutG) * P;           \
        for (int i = 0; i < TM; i++) {                                                          \
            const int m = GEMM_ROW(i);                                                          \
            if (m >= CoutG) continue;                                                           \
            const float bv = has_bias ? bias[g * CoutG + m] : 0.0f;                             \
            for (int j = 0; j < TN; j++) {                                                      \
                const int p = GEMM_COL(j);                                                      \
                if (p < P) yb[(OFF_T)m * P + p] = GEMM_RESULT(i, j) + bv;                       \
            }                                                                                   \
        }                                                                                       \
    } while (0)

#endif
