/* conv_gemm_cuda.cu: the CUDA backend's own tiled SGEMM / implicit-GEMM convolution.
 *
 * Compiled as prelude_cuda.cuh + this file (NVRTC through cupy.RawModule, or nvcc in the CI
 * compile check). The FP32 branch uses only the portable subset (kernels/README.md); the
 * tensor-core branch (TF32 mma.sync, sm_80+) sits behind `#if defined(ANYDEVICE_CUDA) && USE_TF32`
 * with the portable code as the #else branch. Both branches have the same kernel name, arguments
 * and launch geometry, so the host side only changes the -DUSE_TF32 build option.
 *
 * This is the one GPU GEMM / conv kernel of the pack: the CUDA backend's (FP32 branch, and its
 * TF32 path) and, built as OpenCL C, the OpenCL GPU family's. It replaced the portable
 * gemm_gpu.cl / conv2d_gpu.cl / conv_transpose2d_gpu.cl, which ran at half its speed on an H100.
 *
 * kernel ad_conv_gemm(M, N, K,
 *                     A, sam, sak, sa_batch,          A(m, k) = A[z*sa_batch + m*sam + k*sak]
 *                     B, sbk, sbn, sb_batch,          B(k, n) (GEMM mode only)
 *                     C, ldc, sc_batch,               C(m, n) = C[z*sc_batch + m*ldc + n] (GEMM mode)
 *                     bias, has_bias,                 conv mode: bias[z*M + m]
 *                     Cin, H, W, Cg, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW, Cout,
 *                     ksplit, kchunk,
 *                     wscaleA, wq_kA, wscaleB, wq_kB)     quantized operands' scales (below)
 *   C = A @ B for each z. GEMM mode (IS_GEMM=1): z is the batch index.
 *   Conv mode (IS_GEMM=0): z is the group g, A the group's weights (M = Cout/groups rows,
 *   K = Cg*KH*KW), B the virtual im2col matrix of the input x (N = batch*OH*OW columns, gathered
 *   on the fly, zero padding included), C the output (batch, Cout, OH, OW).
 *   CONV_TRANSPOSED=1: conv_transpose2d as the same implicit GEMM: A the group's weights
 *   re-laid out as (Cout/groups, Cg*KH*KW), B(k, p) the input pixel that tap k maps onto output
 *   pixel p (zero where the stride skips it); sh/sw/ph/pw/dh/dw are the transposed conv's.
 *   Split K (ksplit > 1): group z' = z*ksplit + s sums k in [s*kchunk, (s+1)*kchunk) (kchunk a
 *   multiple of TILE_K) and writes its partial C(m, n) plainly to C[(z'*M + m)*N + n] (C is then a
 *   workspace of batch*ksplit*M*N floats); ad_splitk_reduce adds the slices in a fixed order (no
 *   atomics: results are the same on every run), the bias, and writes the real layout. It fills
 *   the GPU when M*N is small against K (the seed convs: 512 x 1568 outputs, K = 4608).
 * launch: groups (ceil(N/TILE_N), ceil(M/TILE_M), (batch or groups) * ksplit),
 *         group size (TILE_N/WPT_N, TILE_M/WPT_M).
 * macros: TILE_M, TILE_N, TILE_K, WPT_M, WPT_N, SMEM_PAD, TRANS_A (A stored k-major: sam > sak),
 *         TRANS_B (B stored n-major, GEMM mode), IS_GEMM, CONV_TRANSPOSED, USE_TF32,
 *         VEC_A (A loaded as 16-byte vectors along k: not TRANS_A, sak == 1, sam, sa_batch and K
 *         multiples of 4, A 16-byte aligned; the host checks), VEC_B (likewise B along n in GEMM
 *         mode: not TRANS_B, sbn == 1, sbk, sb_batch and N multiples of 4),
 *         KP (FP32 branch: two-level accumulation, the register partial sums are folded into
 *         register totals every KP values of k, so long K keeps FP32 precision; a multiple of
 *         TILE_K; 0: one accumulator, half the registers, for tiles whose K slices the host keeps
 *         at most SINGLE_CHAIN long), WARP_N (FP32 branch: a warp's lanes laid out WARP_N along n
 *         by 32/WARP_N along m; 0: the group's rows, 16 or 32 along n), MIN_BLOCKS (CUDA: __launch_bounds__ minimum groups per SM),
 *         WQA / WQB (a quantized operand, below), HALF_IO / C_HALF (half operands, below).
 * Half operands (CUDA, sm_80+: -DHALF_IO=1 float16, 2 bfloat16): A and B are 16-bit buffers of that kind,
 * staged and kept in group-shared memory as they are (row-major [m][k] and [n][k] tiles, k contiguous) and
 * multiplied by mma.sync.m16n8k16 in FP32 accumulators (the tensor-core branch below); C_HALF=1 writes C
 * (and ad_splitk_reduce's C) rounded to the same 16-bit kind, else float32. The bias stays float32.
 * No VEC_A / VEC_B, no quantized operand, no TF32 with it; TILE_K a multiple of 16.
 * Quantized operands (-DWQA=code / -DWQB=code, the formats' codes of backend/ops/quant.py FORMATS and
 * kernels/quant_decode.h): that operand's buffer is the weight's packed bytes, and each element is
 * decoded where the tile loader reads it, qd_load(bytes, flat index, wscale, wq_k), the flat index into
 * the weight's C-order data being z*s_batch + row*s_row + col*s_col (the strides the float build uses);
 * the decoded floats go into the group-shared tiles like any others: no float32 copy of the weight
 * exists. wscaleA / wq_kA (B likewise): the int8 / fp8 per-row scales and the row length; any buffer
 * and 0 for a float operand or a block format (every build takes them: one signature). A quantized
 * operand is loaded element by element (no VEC_A / VEC_B); WQB is GEMM mode only (conv mode's B is
 * the input); with both, one format (one decoder per build). A conv's weight is A (WQA), a linear
 * weight W (N, K) is B = W^T (WQB, sbk = 1, sbn = K: TRANS_B).
 * Tiles are double-buffered in group-shared memory (one barrier per k step, the next tile's global
 * loads in flight during the current tile's FMAs). In the FP32 branch a thread whose WPT_M and
 * WPT_N are multiples of 4 owns 4x4 sub-blocks spread TM*4 rows / TN*4 columns apart, so it reads
 * its operands from shared memory as 16-byte vectors.
 * The FP32 branch and the loaders are portable: prelude_opencl.h + this file builds as OpenCL C,
 * which is how tests/conformance/test_portable_kernels.py exercises them on PoCL.
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
#ifndef VEC_A
#define VEC_A 0
#endif
#ifndef WARP_N
#define WARP_N 0
#endif
#ifndef VEC_B
#define VEC_B 0
#endif
#ifndef WQA
#define WQA 0
#endif
#ifndef HALF_IO
#define HALF_IO 0
#endif
#ifndef C_HALF
#define C_HALF 0
#endif
#if HALF_IO && (!defined(ANYDEVICE_CUDA) || VEC_A || VEC_B || WQA || WQB || USE_TF32)
#error "ad_conv_gemm: HALF_IO is CUDA's tensor-core branch: no VEC_A / VEC_B, quantized operand or TF32"
#endif
#if C_HALF && !HALF_IO
#error "ad_conv_gemm: C_HALF needs HALF_IO (C takes the operands' 16-bit kind)"
#endif
#ifndef WQB
#define WQB 0
#endif
#if WQA && WQB && WQA != WQB
#error "ad_conv_gemm: a quantized A and B share one format (one decoder per build)"
#endif
#if (WQA && VEC_A) || (WQB && VEC_B)
#error "ad_conv_gemm: a quantized operand is loaded element by element (no VEC_A / VEC_B)"
#endif
#if WQB && !IS_GEMM
#error "ad_conv_gemm: WQB is a GEMM-mode operand (conv mode's B is the input)"
#endif
#if WQA || WQB
#define WQ (WQA ? WQA : WQB)
#include "quant_decode.h"
#endif
/* element types of the A and B buffers: floats, a quantized operand's bytes, or 16-bit halves (HALF_IO);
 * R_T: a staged value in registers (the halves' bits, kept as they are, under HALF_IO) */
#if WQA
#define A_T unsigned char
#elif HALF_IO
#define A_T unsigned short
#else
#define A_T float
#endif
#if WQB
#define B_T unsigned char
#elif HALF_IO
#define B_T unsigned short
#else
#define B_T float
#endif
#if HALF_IO
#define R_T unsigned short
#define R_ZERO ((unsigned short)0)
#else
#define R_T float
#define R_ZERO 0.0f
#endif
#if (WPT_M % 4 == 0) && (WPT_N % 4 == 0)
#define VEC_SMEM 1
#else
#define VEC_SMEM 0
#endif

#define TM (TILE_M / WPT_M)           /* threads along m */
#define TN (TILE_N / WPT_N)           /* threads along n */
#define NT (TM * TN)                  /* threads per group */
#define A_LOADS ((TILE_M * TILE_K) / NT)
#define B_LOADS ((TILE_N * TILE_K) / NT)

#if (TILE_M % WPT_M) || (TILE_N % WPT_N) || ((TILE_M * TILE_K) % NT) || ((TILE_N * TILE_K) % NT)
#error "ad_conv_gemm: tile sizes must divide evenly among the threads"
#endif
#if WARP_N && ((32 % WARP_N) || (TN % WARP_N) || (TM % (32 / WARP_N)))
#error "ad_conv_gemm: WARP_N must divide 32 and TN, and 32/WARP_N divide TM"
#endif
#if KP && ((KP % TILE_K) || (KP < TILE_K))
#error "ad_conv_gemm: KP must be 0 (one accumulator) or a multiple of TILE_K"
#endif
/* CUDA: MIN_BLOCKS caps the registers so that many groups fit on an SM (__launch_bounds__) */
#if defined(ANYDEVICE_CUDA) && defined(MIN_BLOCKS)
#define AD_BOUNDS __launch_bounds__(NT, MIN_BLOCKS)
#else
#define AD_BOUNDS
#endif
#if VEC_A && (TRANS_A || ((TILE_M * TILE_K) % (4 * NT)) || (TILE_K % 4))
#error "ad_conv_gemm: VEC_A needs k-contiguous A and TILE_M*TILE_K a multiple of 4 threads' vectors"
#endif
#if VEC_B && (!IS_GEMM || TRANS_B || ((TILE_N * TILE_K) % (4 * NT)) || (TILE_N % 4))
#error "ad_conv_gemm: VEC_B needs GEMM mode, n-contiguous B and TILE_N*TILE_K a multiple of 4 threads' vectors"
#endif
#if ((TILE_M + SMEM_PAD) % 4) || ((TILE_N + SMEM_PAD) % 4)
#error "ad_conv_gemm: TILE_M + SMEM_PAD and TILE_N + SMEM_PAD must be multiples of 4"
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

#if defined(ANYDEVICE_CUDA) && (USE_TF32 || HALF_IO)
#define AD_MMA 1
#else
#define AD_MMA 0
#endif
#if AD_MMA
/* ======= tensor-core branch: TF32 mma.sync.m16n8k8 or f16/bf16 m16n8k16, FP32 accumulate ======= */
#if (TILE_K % (HALF_IO ? 16 : 8)) || (WPT_M % 2) || (WPT_N % 2) || (TM % 8) || (TN % 4)
#error "ad_conv_gemm mma: needs TILE_K % 8 (TF32) or % 16 (HALF_IO) == 0, even WPT_M/WPT_N, TM % 8 == 0, TN % 4 == 0"
#endif
#define MI (WPT_M / 2)                /* m16 tiles per warp */
#define NI (WPT_N / 2)                /* n8 tiles per warp */
#define WGN (TN / 4)                  /* warps along n */
#endif
#if HALF_IO
#include "half_cuda.h"
/* the 32 bits of two consecutive k of a [row][k] half tile */
#define H2_AT(tile, row, k) (*(const unsigned int*)&(tile)[row][k])
#endif
#if C_HALF  /* C written as the operands' 16-bit kind (a split's workspace stays float32) */
#define C_STORE(C, idx, v) (((GLOBAL unsigned short*)(C))[idx] = AD_F2H(HALF_IO, v))
#else
#define C_STORE(C, idx, v) ((C)[idx] = (v))
#endif
#if defined(ANYDEVICE_CUDA) && USE_TF32

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

KERNEL AD_BOUNDS void ad_conv_gemm(const int M, const int N, const int K,
                         const GLOBAL A_T* RESTRICT A, const int sam, const int sak, const OFF_T sa_batch,
                         const GLOBAL B_T* RESTRICT B, const int sbk, const int sbn, const OFF_T sb_batch,
                         GLOBAL float* RESTRICT C, const int ldc, const OFF_T sc_batch,
                         const GLOBAL float* RESTRICT bias, const int has_bias,
                         const int Cin, const int H, const int W, const int Cg,
                         const int KH, const int KW, const int sh, const int sw,
                         const int ph, const int pw, const int dh, const int dw,
                         const int OH, const int OW, const int Cout,
                         const int ksplit, const int kchunk,
                         const GLOBAL float* RESTRICT wscaleA, const OFF_T wq_kA,
                         const GLOBAL float* RESTRICT wscaleB, const OFF_T wq_kB)
{
#if HALF_IO  /* [row][k]: a fragment's two consecutive k are one 32-bit word */
    LOCAL ALIGN16 unsigned short As[2][TILE_M][TILE_K + SMEM_PAD];
    LOCAL ALIGN16 unsigned short Bs[2][TILE_N][TILE_K + SMEM_PAD];
#define A_SH(buf, k, m) As[buf][m][k]
#define B_SH(buf, k, n) Bs[buf][n][k]
#else
    LOCAL ALIGN16 float As[2][TILE_K][TILE_M + SMEM_PAD];
    LOCAL ALIGN16 float Bs[2][TILE_K][TILE_N + SMEM_PAD];
#define A_SH(buf, k, m) As[buf][k][m]
#define B_SH(buf, k, n) Bs[buf][k][n]
#endif
    const int tid = LID1 * TN + LID0;
    const int m0 = GRP1 * TILE_M;
    const int n0 = GRP0 * TILE_N;
    const int z = GRP2 / ksplit;                 /* batch index (GEMM) or group (conv) */
    const int kbeg = (GRP2 - z * ksplit) * kchunk;
    const int kend = min(K, kbeg + kchunk);
#if WQA  /* a quantized operand is read by flat element index from the buffer's start */
    const OFF_T a_base = (OFF_T)z * sa_batch;
#define A_ELEM(off) qd_load(A, a_base + (off), wscaleA, wq_kA)
#else
    A += (OFF_T)z * sa_batch;
#define A_ELEM(off) A[off]
#endif
#if IS_GEMM
#if WQB
    const OFF_T b_base = (OFF_T)z * sb_batch;
#define B_ELEM(off) qd_load(B, b_base + (off), wscaleB, wq_kB)
#else
    B += (OFF_T)z * sb_batch;
#define B_ELEM(off) B[off]
#endif
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
    const GLOBAL B_T* xb = B + ((OFF_T)pimg * Cin + (OFF_T)z * Cg) * H * W;
    /* the k of each of this thread's B loads, as (channel, kernel row, kernel column): divided
     * out once here, then advanced by TILE_K per step with two carries (no divisions) */
    int gc[B_LOADS], gr[B_LOADS], gs[B_LOADS];
    for (int i = 0; i < B_LOADS; i++) {
        int bk, bn;
        B_POS(i, tid, bk, bn);
        const int k = kbeg + bk;
        gc[i] = k / KHW;
        gr[i] = (k - gc[i] * KHW) / KW;
        gs[i] = k - gc[i] * KHW - gr[i] * KW;
    }
    const int step_c = TILE_K / KHW;
    const int step_r = (TILE_K - step_c * KHW) / KW;
    const int step_s = TILE_K - step_c * KHW - step_r * KW;
#define ADVANCE_B()                                                                           \
    for (int i = 0; i < B_LOADS; i++) {                                                         \
        gs[i] += step_s;                                                                        \
        if (gs[i] >= KW) { gs[i] -= KW; gr[i]++; }                                              \
        gr[i] += step_r;                                                                        \
        if (gr[i] >= KH) { gr[i] -= KH; gc[i]++; }                                              \
        gc[i] += step_c;                                                                        \
    }
#endif

    R_T ra[A_LOADS], rb[B_LOADS];
/* vector i of a thread's staged loads: r[4i..4i+3] = the 16 bytes at ptr, or zeros when !ok */
#define LOAD4_INTO(r, i, ok, ptr)                                                              \
    {                                                                                           \
        float4 v_ = MAKE4(0.0f, 0.0f, 0.0f, 0.0f);                                              \
        if (ok) v_ = LD4(ptr);                                                                  \
        r[4 * (i)] = v_.x; r[4 * (i) + 1] = v_.y; r[4 * (i) + 2] = v_.z; r[4 * (i) + 3] = v_.w; \
    }
/* for each of a thread's n staged items: POS declares its tile position, then the body runs */
#define EACH_STAGED(n, POS, ...) for (int i = 0; i < (n); i++) { POS __VA_ARGS__ }
#if VEC_A
    /* vector i of this thread: row am, k ak..ak+3 (kend is a multiple of 4: all in or all out) */
#define A_AT(i) const int v_ = tid + (i) * NT; const int ak = (v_ % (TILE_K / 4)) * 4; const int am = v_ / (TILE_K / 4);
#define LOAD_A(k0) EACH_STAGED(A_LOADS / 4, A_AT(i), \
    LOAD4_INTO(ra, i, m0 + am < M && (k0) + ak < kend, A + (OFF_T)(m0 + am) * sam + (k0) + ak))
#define STORE_A(buf) EACH_STAGED(A_LOADS / 4, A_AT(i), \
    for (int e = 0; e < 4; e++) As[buf][ak + e][am] = ra[4 * i + e];)
#else
#define A_AT(i) int am, ak; A_POS(i, tid, am, ak);
#define LOAD_A(k0) EACH_STAGED(A_LOADS, A_AT(i), \
    ra[i] = (m0 + am < M && (k0) + ak < kend) ? (R_T)A_ELEM((OFF_T)(m0 + am) * sam + (OFF_T)((k0) + ak) * sak) : R_ZERO;)
#define STORE_A(buf) EACH_STAGED(A_LOADS, A_AT(i), A_SH(buf, ak, am) = ra[i];)
#endif
#if VEC_B
#define B_AT(i) const int v_ = tid + (i) * NT; const int bn = (v_ % (TILE_N / 4)) * 4; const int bk = v_ / (TILE_N / 4);
#define LOAD_BT(k0) EACH_STAGED(B_LOADS / 4, B_AT(i), \
    LOAD4_INTO(rb, i, (k0) + bk < kend && n0 + bn < N, B + (OFF_T)((k0) + bk) * sbk + n0 + bn))
#define STORE_B(buf) EACH_STAGED(B_LOADS / 4, B_AT(i), \
    ST4(&Bs[buf][bk][bn], MAKE4(rb[4 * i], rb[4 * i + 1], rb[4 * i + 2], rb[4 * i + 3]));)
#else
#define B_AT(i) int bk, bn; B_POS(i, tid, bk, bn);
#define LOAD_BT(k0) EACH_STAGED(B_LOADS, B_AT(i), LOAD_B(i, (k0) + bk, bn))
#define STORE_B(buf) EACH_STAGED(B_LOADS, B_AT(i), B_SH(buf, bk, bn) = rb[i];)
#endif
#define LOAD_TILES(k0) LOAD_A(k0) LOAD_BT(k0)
#define STORE_TILES(buf) STORE_A(buf) STORE_B(buf)
#if IS_GEMM
#define LOAD_B(i, gk, bn)                                                                      \
    {                                                                                           \
        const int gn = n0 + (bn);                                                               \
        rb[i] = ((gk) < kend && gn < N) ? (R_T)B_ELEM((OFF_T)(gk) * sbk + (OFF_T)gn * sbn) : R_ZERO; \
    }
#else
#define LOAD_B(i, gk, bn)                                                                      \
    {                                                                                           \
        R_T v = R_ZERO;                                                                         \
        if (pvalid && (gk) < kend) {                                                            \
            const int c = gc[i];                                                                \
            GATHER_HW(gr[i], gs[i])                                                             \
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

#if AD_MMA
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
#if WARP_N
    /* warp-tiled thread layout: a warp's 32 lanes cover WARP_N threads along n by 32/WARP_N along
     * m, so its 16-byte shared reads of A and B touch fewer distinct addresses (fewer shared
     * wavefronts per FMA than 16 x 2) */
    const int lane_ = tid & 31, warp_ = tid >> 5;
    const int tx = (warp_ % (TN / WARP_N)) * WARP_N + lane_ % WARP_N;
    const int ty = (warp_ / (TN / WARP_N)) * (32 / WARP_N) + lane_ / WARP_N;
#else
    const int tx = LID0, ty = LID1;
#endif
    float acc[WPT_M][WPT_N];          /* partial sums of the current KP block of k */
#if KP
    float tot[WPT_M][WPT_N];          /* sum of the folded blocks */
    int since = 0;
#endif
#pragma unroll
    for (int i = 0; i < WPT_M; i++)
#pragma unroll
        for (int j = 0; j < WPT_N; j++) {
            acc[i][j] = 0.0f;
#if KP
            tot[i][j] = 0.0f;
#endif
        }
#endif

    int cur = 0;
    LOAD_TILES(kbeg)
    STORE_TILES(0)
    BARRIER();
    for (int k0 = kbeg; k0 < kend; k0 += TILE_K) {
        const int more = k0 + TILE_K < kend;
        if (more) {
#if !IS_GEMM
            ADVANCE_B()
#endif
            LOAD_TILES(k0 + TILE_K)
        }
#if HALF_IO
#pragma unroll
        for (int kk = 0; kk < TILE_K; kk += 16) {
            unsigned int af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                const int mr = wm0 + i * 16 + gq;
                af[i][0] = H2_AT(As[cur], mr, kk + tq * 2);
                af[i][1] = H2_AT(As[cur], mr + 8, kk + tq * 2);
                af[i][2] = H2_AT(As[cur], mr, kk + tq * 2 + 8);
                af[i][3] = H2_AT(As[cur], mr + 8, kk + tq * 2 + 8);
            }
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int nc = wn0 + j * 8 + gq;
                bf[j][0] = H2_AT(Bs[cur], nc, kk + tq * 2);
                bf[j][1] = H2_AT(Bs[cur], nc, kk + tq * 2 + 8);
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) AD_MMA_H(HALF_IO, acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
#elif AD_MMA
#pragma unroll
        for (int kk = 0; kk < TILE_K; kk += 8) {
            unsigned int af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                const int mr = wm0 + i * 16 + gq;
                af[i][0] = ad_to_tf32(As[cur][kk + tq][mr]);
                af[i][1] = ad_to_tf32(As[cur][kk + tq][mr + 8]);
                af[i][2] = ad_to_tf32(As[cur][kk + tq + 4][mr]);
                af[i][3] = ad_to_tf32(As[cur][kk + tq + 4][mr + 8]);
            }
#pragma unroll
            for (int j = 0; j < NI; j++) {
                const int nc = wn0 + j * 8 + gq;
                bf[j][0] = ad_to_tf32(Bs[cur][kk + tq][nc]);
                bf[j][1] = ad_to_tf32(Bs[cur][kk + tq + 4][nc]);
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
#if VEC_SMEM
#pragma unroll
            for (int i = 0; i < WPT_M / 4; i++) {
                const float4 v = LD4(&As[cur][kk][i * (4 * TM) + ty * 4]);
                a[4 * i] = v.x; a[4 * i + 1] = v.y; a[4 * i + 2] = v.z; a[4 * i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < WPT_N / 4; j++) {
                const float4 v = LD4(&Bs[cur][kk][j * (4 * TN) + tx * 4]);
                b[4 * j] = v.x; b[4 * j + 1] = v.y; b[4 * j + 2] = v.z; b[4 * j + 3] = v.w;
            }
#else
#pragma unroll
            for (int i = 0; i < WPT_M; i++) a[i] = As[cur][kk][ty + i * TM];
#pragma unroll
            for (int j = 0; j < WPT_N; j++) b[j] = Bs[cur][kk][tx + j * TN];
#endif
#pragma unroll
            for (int i = 0; i < WPT_M; i++)
#pragma unroll
                for (int j = 0; j < WPT_N; j++) acc[i][j] = FMA(a[i], b[j], acc[i][j]);
        }
#if KP
        since += TILE_K;
        if (since >= KP) {
            since = 0;
#pragma unroll
            for (int i = 0; i < WPT_M; i++)
#pragma unroll
                for (int j = 0; j < WPT_N; j++) { tot[i][j] += acc[i][j]; acc[i][j] = 0.0f; }
        }
#endif
#endif
        if (more) {
            STORE_TILES(cur ^ 1)
        }
        BARRIER();
        cur ^= 1;
    }

    /* ---- epilogue: C(m, n) (+ bias), or this k slice's partial sums ---- */
#if AD_MMA
#define OUT_M(i, e) (m0 + wm0 + (i) * 16 + gq + ((e) >> 1) * 8)
#define OUT_N(j, e) (n0 + wn0 + (j) * 8 + tq * 2 + ((e) & 1))
#define ACC(i, j, e) acc[i][j][e]
#define EPI_I MI
#define EPI_J NI
#define EPI_E 4
#else
#if VEC_SMEM
#define OUT_M(i, e) (m0 + ((i) >> 2) * (4 * TM) + ty * 4 + ((i) & 3))
#define OUT_N(j, e) (n0 + ((j) >> 2) * (4 * TN) + tx * 4 + ((j) & 3))
#else
#define OUT_M(i, e) (m0 + ty + (i) * TM)
#define OUT_N(j, e) (n0 + tx + (j) * TN)
#endif
#if KP
#define ACC(i, j, e) (tot[i][j] + acc[i][j])
#else
#define ACC(i, j, e) acc[i][j]
#endif
#define EPI_I WPT_M
#define EPI_J WPT_N
#define EPI_E 1
#endif
    GLOBAL float* ws = C + (OFF_T)GRP2 * M * N;  /* split K: this slice's partial sums, plainly */
#pragma unroll
    for (int i = 0; i < EPI_I; i++)
#pragma unroll
        for (int j = 0; j < EPI_J; j++)
#pragma unroll
            for (int e = 0; e < EPI_E; e++) {
                const int gm = OUT_M(i, e), gn = OUT_N(j, e);
                if (gm >= M || gn >= N) continue;
                if (ksplit > 1) {
                    ws[(OFF_T)gm * N + gn] = ACC(i, j, e);
                    continue;
                }
#if IS_GEMM
                C_STORE(C, (OFF_T)z * sc_batch + (OFF_T)gm * ldc + gn, ACC(i, j, e));
#else
                const int img = gn / OHW;
                const int q = gn - img * OHW;
                const int co = z * M + gm;
                C_STORE(C, ((OFF_T)img * Cout + co) * OHW + q, ACC(i, j, e) + (has_bias ? bias[co] : 0.0f));
#endif
            }
}

/* kernel ad_splitk_reduce(ws, C, bias, has_bias, ksplit, Z, M, N, ldc, sc_batch, is_gemm, OHW, Cout)
 *   C(z, m, n) = sum over s < ksplit, in order, of ws[((z*ksplit + s)*M + m)*N + n], written as
 *   ad_conv_gemm's epilogue writes it: GEMM C[z*sc_batch + m*ldc + n]; conv (z = group)
 *   C[(img*Cout + z*M + m)*OHW + q] + bias[z*M + m] with n = img*OHW + q.
 *   launch: 1-D, any geometry (grid-stride loop). */
KERNEL void ad_splitk_reduce(const GLOBAL float* RESTRICT ws, GLOBAL float* RESTRICT C,
                             const GLOBAL float* RESTRICT bias, const int has_bias, const int ksplit,
                             const int Z, const int M, const int N, const int ldc, const OFF_T sc_batch,
                             const int is_gemm, const int OHW, const int Cout)
{
    const OFF_T MN = (OFF_T)M * N;
    const OFF_T total = (OFF_T)Z * MN;
    for (OFF_T idx = (OFF_T)GID0; idx < total; idx += (OFF_T)NGRP0 * LSZ0) {
        const OFF_T zz = idx / MN;
        const OFF_T r = idx - zz * MN;
        const int m = (int)(r / N);
        const int n = (int)(r - (OFF_T)m * N);
        const GLOBAL float* src = ws + zz * ksplit * MN + r;
        float s = 0.0f;
        for (int k = 0; k < ksplit; k++) s += src[(OFF_T)k * MN];
        if (is_gemm) {
            C_STORE(C, zz * sc_batch + (OFF_T)m * ldc + n, s);
        } else {
            const int img = n / OHW;
            const int q = n - img * OHW;
            const OFF_T co = zz * M + m;
            C_STORE(C, ((OFF_T)img * Cout + co) * OHW + q, s + (has_bias ? bias[co] : 0.0f));
        }
    }
}
