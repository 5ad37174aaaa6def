/* conv_gemm_cuda.cu: the CUDA backend's own tiled SGEMM / implicit-GEMM convolution.
 *
 * Compiled as prelude_cuda.cuh + this file (NVRTC through cupy.RawModule, or nvcc in the CI
 * compile check). The FP32 branch uses only the portable subset (kernels/README.md); the
 * tensor-core branch (TF32 mma.sync, sm_80+) sits behind `#if defined(ANYDEVICE_CUDA) && USE_TF32`
 * with the portable code as the #else branch. Both branches have the same kernel name, arguments
 * and launch geometry, so the host side only changes the -DUSE_TF32 build option.
 *
 * The backend uses the shared portable GPU kernels (kernels/gemm_gpu.cl, conv2d_gpu.cl) when they
 * are present and this kernel otherwise, and always for the TF32 path.
 *
 * kernel ad_conv_gemm(M, N, K,
 *                     A, sam, sak, sa_batch,          A(m, k) = A[z*sa_batch + m*sam + k*sak]
 *                     B, sbk, sbn, sb_batch,          B(k, n) (GEMM mode only)
 *                     C, ldc, sc_batch,               C(m, n) = C[z*sc_batch + m*ldc + n] (GEMM mode)
 *                     bias, has_bias,                 conv mode: bias[z*M + m]
 *                     Cin, H, W, Cg, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, Cout)
 *   C = A @ B for each z. GEMM mode (IS_GEMM=1): z is the batch index.
 *   Conv mode (IS_GEMM=0): z is the group g, A the group's weights (M = Cout/groups rows,
 *   K = Cg*KH*KW), B the virtual im2col matrix of the input x (N = batch*OH*OW columns, gathered
 *   on the fly, zero padding included), C the output (batch, Cout, OH, OW).
 *   CONV_TRANSPOSED=1: conv_transpose2d as the same implicit GEMM: A the group's weights
 *   re-laid out as (Cout/groups, Cg*KH*KW), B(k, p) the input pixel that tap k maps onto output
 *   pixel p (zero where the stride skips it); sh/sw/ph/pw/dh/dw are the transposed conv's.
 * launch: groups (ceil(N/TILE_N), ceil(M/TILE_M), batch or groups),
 *         group size (TILE_N/WPT_N, TILE_M/WPT_M).
 * macros: TILE_M, TILE_N, TILE_K, WPT_M, WPT_N, SMEM_PAD, TRANS_A (A stored k-major: sam > sak),
 *         TRANS_B (B stored n-major, GEMM mode), IS_GEMM, CONV_TRANSPOSED, USE_TF32,
 *         KP (FP32 branch: two-level accumulation, the register partial sums are folded into
 *         register totals every KP values of k, so long K keeps FP32 precision; a multiple of
 *         TILE_K).
 * The FP32 branch and the loaders are portable: prelude_opencl.h + this file builds as OpenCL C,
 * which is how tests/test_portable_kernels.py exercises them on PoCL.
 */
#ifndef TILE_M
#define TILE_M 128
#endif
#ifndef TILE_N
#define TILE_N 128
#endif
#ifndef TILE_K
#define TILE_K 8
#endif
#ifndef WPT_M
#define WPT_M 8
#endif
#ifndef WPT_N
#define WPT_N 8
#endif
#ifndef SMEM_PAD
#define SMEM_PAD 4
#endif
#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef IS_GEMM
#define IS_GEMM 1
#endif
#ifndef CONV_TRANSPOSED
#define CONV_TRANSPOSED 0
#endif
#ifndef USE_TF32
#define USE_TF32 0
#endif
#ifndef KP
#define KP 128
#endif

#define TM (TILE_M / WPT_M)           /* threads along m */
#define TN (TILE_N / WPT_N)           /* threads along n */
#define NT (TM * TN)                  /* threads per group */
#define A_LOADS ((TILE_M * TILE_K) / NT)
#define B_LOADS ((TILE_N * TILE_K) / NT)

#if (TILE_M % WPT_M) || (TILE_N % WPT_N) || ((TILE_M * TILE_K) % NT) || ((TILE_N * TILE_K) % NT)
#error "ad_conv_gemm: tile sizes must divide evenly among the threads"
#endif
#if (KP % TILE_K) || (KP < TILE_K)
#error "ad_conv_gemm: KP must be a multiple of TILE_K"
#endif
#if TRANS_A
#if NT % TILE_M
#error "ad_conv_gemm: TRANS_A needs TILE_M to divide the thread count"
#endif
#else
#if NT % TILE_K
#error "ad_conv_gemm: TILE_K must divide the thread count"
#endif
#endif
#if !IS_GEMM || !TRANS_B
#if NT % TILE_N
#error "ad_conv_gemm: TILE_N must divide the thread count"
#endif
#endif

/* ---- tile loaders (shared by both branches) ------------------------------------------------
 * A: element i of this thread is tile position (am, ak); B: (bk, bn). The mappings keep
 * consecutive threads on consecutive addresses of the operand's layout. */
#if TRANS_A
#define A_POS(i, tid, am, ak) { am = (tid) % TILE_M; ak = (tid) / TILE_M + (i) * (NT / TILE_M); }
#else
#define A_POS(i, tid, am, ak) { ak = (tid) % TILE_K; am = (tid) / TILE_K + (i) * (NT / TILE_K); }
#endif
#if IS_GEMM && TRANS_B
#define B_POS(i, tid, bk, bn) { bk = (tid) % TILE_K; bn = (tid) / TILE_K + (i) * (NT / TILE_K); }
#else
#define B_POS(i, tid, bk, bn) { bn = (tid) % TILE_N; bk = (tid) / TILE_N + (i) * (NT / TILE_N); }
#endif

#if defined(ANYDEVICE_CUDA) && USE_TF32
/* ================= tensor-core branch: TF32 mma.sync.m16n8k8, FP32 accumulate ============= */
#if (TILE_K % 8) || (WPT_M % 2) || (WPT_N % 2) || (TM % 8) || (TN % 4)
#error "ad_conv_gemm TF32: needs TILE_K % 8 == 0, even WPT_M/WPT_N, TM % 8 == 0, TN % 4 == 0"
#endif
#define MI (WPT_M / 2)                /* m16 tiles per warp */
#define NI (WPT_N / 2)                /* n8 tiles per warp */
#define WGN (TN / 4)                  /* warps along n */

DEVICE_FN unsigned int ad_to_tf32(float x)
{
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

DEVICE_FN void ad_mma_tf32(float* d, const unsigned int* a, const unsigned int* b)
{
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

KERNEL void ad_conv_gemm(const int M, const int N, const int K,
                         const GLOBAL float* RESTRICT A, const int sam, const int sak, const OFF_T sa_batch,
                         const GLOBAL float* RESTRICT B, const int sbk, const int sbn, const OFF_T sb_batch,
                         GLOBAL float* RESTRICT C, const int ldc, const OFF_T sc_batch,
                         const GLOBAL float* RESTRICT bias, const int has_bias,
                         const int Cin, const int H, const int W, const int Cg,
                         const int KH, const int KW, const int sh, const int sw,
                         const int ph, const int pw, const int dh, const int dw,
                         const int OH, const int OW, const int Cout)
{
    LOCAL float As[TILE_K][TILE_M + SMEM_PAD];
    LOCAL float Bs[TILE_K][TILE_N + SMEM_PAD];
    const int tid = LID1 * TN + LID0;
    const int m0 = GRP1 * TILE_M;
    const int n0 = GRP0 * TILE_N;
    const int z = GRP2;
    A += (OFF_T)z * sa_batch;
#if IS_GEMM
    B += (OFF_T)z * sb_batch;
#else
    /* this thread's B column is fixed: decompose it once */
    const int OHW = OH * OW;
    const int KHW = KH * KW;
    int bcol_n, bcol_k;
    B_POS(0, tid, bcol_k, bcol_n);
    const int p = n0 + bcol_n;
    const int pvalid = p < N;
    const int pimg = pvalid ? p / OHW : 0;
    const int pq = pvalid ? p - pimg * OHW : 0;
    const int poh = pq / OW;
#if CONV_TRANSPOSED
    const int ih0 = poh + ph;
    const int iw0 = (pq - poh * OW) + pw;
#else
    const int ih0 = poh * sh - ph;
    const int iw0 = (pq - poh * OW) * sw - pw;
#endif
    const GLOBAL float* xb = B + ((OFF_T)pimg * Cin + (OFF_T)z * Cg) * H * W;
#endif

    float ra[A_LOADS], rb[B_LOADS];
#define LOAD_TILES(k0)                                                                        \
    for (int i = 0; i < A_LOADS; i++) {                                                         \
        int am, ak;                                                                             \
        A_POS(i, tid, am, ak);                                                                  \
        const int gm = m0 + am, gk = (k0) + ak;                                                 \
        ra[i] = (gm < M && gk < K) ? A[(OFF_T)gm * sam + (OFF_T)gk * sak] : 0.0f;             \
    }                                                                                           \
    for (int i = 0; i < B_LOADS; i++) {                                                         \
        int bk, bn;                                                                             \
        B_POS(i, tid, bk, bn);                                                                  \
        const int gk = (k0) + bk;                                                               \
        LOAD_B(i, gk, bn);                                                                      \
    }
#if IS_GEMM
#define LOAD_B(i, gk, bn)                                                                      \
    {                                                                                           \
        const int gn = n0 + (bn);                                                               \
        rb[i] = ((gk) < K && gn < N) ? B[(OFF_T)(gk) * sbk + (OFF_T)gn * sbn] : 0.0f;         \
    }
#else
#define LOAD_B(i, gk, bn)                                                                      \
    {                                                                                           \
        float v = 0.0f;                                                                         \
        if (pvalid && (gk) < K) {                                                               \
            const int c = (gk) / KHW;                                                           \
            const int rs = (gk) - c * KHW;                                                      \
            const int r = rs / KW;                                                              \
            GATHER_HW(r, rs - r * KW)                                                           \
        }                                                                                       \
        rb[i] = v;                                                                              \
    }
#if CONV_TRANSPOSED
/* transposed conv: input row ih contributes to output row ih*sh - ph + r*dh */
#define GATHER_HW(r, s)                                                                        \
    {                                                                                           \
        const int ihn = ih0 - (r) * dh, iwn = iw0 - (s) * dw;                                   \
        if (ihn >= 0 && iwn >= 0) {                                                             \
            const int ih = ihn / sh, iw = iwn / sw;                                             \
            if (ih * sh == ihn && iw * sw == iwn && ih < H && iw < W)                           \
                v = xb[((OFF_T)c * H + ih) * W + iw];                                           \
        }                                                                                       \
    }
#else
#define GATHER_HW(r, s)                                                                        \
    {                                                                                           \
        const int ih = ih0 + (r) * dh, iw = iw0 + (s) * dw;                                     \
        if (ih >= 0 && ih < H && iw >= 0 && iw < W)                                             \
            v = xb[((OFF_T)c * H + ih) * W + iw];                                               \
    }
#endif
#endif
#define STORE_TILES()                                                                         \
    for (int i = 0; i < A_LOADS; i++) {                                                         \
        int am, ak;                                                                             \
        A_POS(i, tid, am, ak);                                                                  \
        As[ak][am] = ra[i];                                                                     \
    }                                                                                           \
    for (int i = 0; i < B_LOADS; i++) {                                                         \
        int bk, bn;                                                                             \
        B_POS(i, tid, bk, bn);                                                                  \
        Bs[bk][bn] = rb[i];                                                                     \
    }

#if defined(ANYDEVICE_CUDA) && USE_TF32
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm0 = (warp / WGN) * (16 * MI);
    const int wn0 = (warp % WGN) * (8 * NI);
    const int gq = lane >> 2;        /* group of four lanes */
    const int tq = lane & 3;         /* lane in the group */
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
#else
    const int tx = LID0, ty = LID1;
    float acc[WPT_M][WPT_N];          /* partial sums of the current KP block of k */
    float tot[WPT_M][WPT_N];          /* sum of the folded blocks */
#pragma unroll
    for (int i = 0; i < WPT_M; i++)
#pragma unroll
        for (int j = 0; j < WPT_N; j++) { acc[i][j] = 0.0f; tot[i][j] = 0.0f; }
    int since = 0;
#endif

    LOAD_TILES(0)
    STORE_TILES()
    BARRIER();
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        const int more = k0 + TILE_K < K;
        if (more) {
            LOAD_TILES(k0 + TILE_K)
        }
#if defined(ANYDEVICE_CUDA) && USE_TF32
#pragma unroll
        for (int kk = 0; kk < TILE_K; kk += 8) {
            unsigned int af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                const int mr = wm0 + i * 16 + gq;
                af[i][0] = ad_to_tf32(As[kk + tq][mr]);
                af[i][1] = ad_to_tf32(As[kk + tq][mr + 8]);
                af[i][2] = ad_to_tf32(As[kk + tq + 4][mr]);
                af[i][3] = ad_to_tf32(As[kk + tq + 4][mr + 8]);
            }
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int nc = wn0 + j * 8 + gq;
                bf[j][0] = ad_to_tf32(Bs[kk + tq][nc]);
                bf[j][1] = ad_to_tf32(Bs[kk + tq + 4][nc]);
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) ad_mma_tf32(acc[i][j], af[i], bf[j]);
        }
#else
#pragma unroll
        for (int kk = 0; kk < TILE_K; kk++) {
            float a[WPT_M], b[WPT_N];
#pragma unroll
            for (int i = 0; i < WPT_M; i++) a[i] = As[kk][ty + i * TM];
#pragma unroll
            for (int j = 0; j < WPT_N; j++) b[j] = Bs[kk][tx + j * TN];
#pragma unroll
            for (int i = 0; i < WPT_M; i++)
#pragma unroll
                for (int j = 0; j < WPT_N; j++) acc[i][j] = FMA(a[i], b[j], acc[i][j]);
        }
        since += TILE_K;
        if (since >= KP) {
            since = 0;
#pragma unroll
            for (int i = 0; i < WPT_M; i++)
#pragma unroll
                for (int j = 0; j < WPT_N; j++) { tot[i][j] += acc[i][j]; acc[i][j] = 0.0f; }
        }
#endif
        BARRIER();
        if (more) {
            STORE_TILES()
        }
        BARRIER();
    }

    /* ---- epilogue: C(m, n) (+ bias) ---- */
#if defined(ANYDEVICE_CUDA) && USE_TF32
#define OUT_M(i, e) (m0 + wm0 + (i) * 16 + gq + ((e) >> 1) * 8)
#define OUT_N(j, e) (n0 + wn0 + (j) * 8 + tq * 2 + ((e) & 1))
#define ACC(i, j, e) acc[i][j][e]
#define EPI_I MI
#define EPI_J NI
#define EPI_E 4
#else
#define OUT_M(i, e) (m0 + ty + (i) * TM)
#define OUT_N(j, e) (n0 + tx + (j) * TN)
#define ACC(i, j, e) (tot[i][j] + acc[i][j])
#define EPI_I WPT_M
#define EPI_J WPT_N
#define EPI_E 1
#endif
#pragma unroll
    for (int i = 0; i < EPI_I; i++)
#pragma unroll
        for (int j = 0; j < EPI_J; j++)
#pragma unroll
            for (int e = 0; e < EPI_E; e++) {
                const int gm = OUT_M(i, e), gn = OUT_N(j, e);
                if (gm < M && gn < N) {
#if IS_GEMM
                    C[(OFF_T)z * sc_batch + (OFF_T)gm * ldc + gn] = ACC(i, j, e);
#else
                    const int img = gn / OHW;
                    const int q = gn - img * OHW;
                    const int co = z * M + gm;
                    const float v = ACC(i, j, e) + (has_bias ? bias[co] : 0.0f);
                    C[((OFF_T)img * Cout + co) * OHW + q] = v;
#endif
                }
            }
}
