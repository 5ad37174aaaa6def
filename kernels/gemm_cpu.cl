/* CPU-family SGEMM (OpenCL only; float16 vectors, no local memory).

   C[b] = A[b] (M x K, row stride lda) . B[b] (K x N, row stride ldb, unit column stride) (+ bias[m])

   kernel gemm_cpu: one work item computes a (MR*MSUB) x 32 block of C: MSUB sub-tiles of MR rows
   (MR = 4..14), each held in 2*MR float16 accumulators, or MR twice where NH = 2 (below)
   (24 of the 32 zmm registers for MR=12;
   PoCL/LLVM keeps them in registers, the inner loop is 2 vector loads, MR broadcasts from
   memory and 2*MR FMAs). K is walked in cache blocks of KC (the B panel KC x 32 stays in L1
   across the MSUB sub-tiles); inside a block, partial sums are folded into a private total every
   KP steps (two-level summation keeps FP32 precision on long K).
   Columns are written through a "segment" map so a conv can write (N, Cout, P) directly:
   column j (counted from colbase) lands at C + (j / cseg) * cseg_stride + row * ldc + j % cseg.
   bias[b * bias_bs + m] is added when has_bias is 1, bias[b * bias_bs + column] (counted from colbase's 0) when 2. C is stored as float32, or float16 / bfloat16 (build
   option YDT, half_io.h: each value rounded once). Operands are packed first (pack_a, pack_b, or
   im2col_pack in conv_cpu.cl); each packing work item copies PK values of k (PoCL's per-work-group
   cost is ~1 us, so one work item per k row made packing cost as much as a third of the GEMM).
   Launch: global (ceil(M/(MR*MSUB)), ceil(ceil(N/32)/NL), batches), local (1, 1, 1): consecutive
   work groups share one B panel (K x 32), which stays in L2.
*/
#ifndef MR
#define MR 12
#endif
#ifndef MSUB
#define MSUB 4
#endif
#ifndef KC
#define KC 256
#endif
#ifndef KP
#define KP 128
#endif
#define TN 32
#ifndef GM
#define GM 0  /* row blocks per group of the work order (0: row blocks fastest, all of them) */
#endif
#ifndef NL
#define NL 1  /* column tiles of 32 one work item computes, one after another (fewer work groups
                 where K is short and each tile is little work: PoCL's cost per group is ~1 us) */
#endif

/* Ap layout: [batch][ceil(M/MR)][K][MR]; Bp layout: [batch][ceil(N/32)][K][32], zero padded; with BH
   [batch][ceil(N/32)][2][K][16] (each panel as two K x 16 halves: an NH = 2 pass reads its half's rows
   contiguously, as an AVX2 SGEMM's 16-column panels; 2-core AVX2 EPYC, one process, pack_b and gemm_cpu:
   2048^2 137.8 -> 120.4 ms, 1024^2 16.3 -> 16.0). BOFF(k, j): the offset of (k, column j) in a panel.
   pack_a's A and pack_b's B are wstore_t: a weight stored in half is read as such (-DWDT, weight_load.h). */
#include "panel_b.h"
#define BSTEP PANEL_BSTEP
#define BHALF PANEL_BHALF(K)
#define BOFF(k, j) PANEL_BOFF(k, j, K)

#include "weight_load.h"

#ifndef PK
#define PK 64
#endif
/* a 4 x 4 block transposed in registers: a_c = (values 0..3 of run c) -> d[u * step + c] = a_c[u] (the packers'
   float32 / half paths: a step's 4 values stored at once, where a copy value by value stored each alone) */
#define STORE_T4(a0, a1, a2, a3, d, step) do { \
        vstore4((float4)((a0).s0, (a1).s0, (a2).s0, (a3).s0), 0, (d)); \
        vstore4((float4)((a0).s1, (a1).s1, (a2).s1, (a3).s1), 0, (d) + (step)); \
        vstore4((float4)((a0).s2, (a1).s2, (a2).s2, (a3).s2), 0, (d) + 2 * (step)); \
        vstore4((float4)((a0).s3, (a1).s3, (a2).s3, (a3).s3), 0, (d) + 3 * (step)); } while (0)

#if WDT > 2 && WQ == 7
/* one whole q4_0 block (element e a multiple of 32) into out[0 .. 32), 16 nibbles at a time: qd_run's values (its
   nibble a value made q4_0's pack the slowest: linear 4096 x 4096 at batch 77 25.1 -> 17.0 ms; q8_0's run, 16 lanes
   at a time the same way, was 8% slower than qd_run's loop) */
inline void qd_block32(__global const uchar *p, const long e, float *out)
{
    __global const uchar *b = p + (e >> 5) * 18;
    const float d = QD_HALF(b);
    const uchar16 q = vload16(0, b + 2);
    vstore16(d * (convert_float16(q & (uchar16)15) - 8.0f), 0, out);
    vstore16(d * (convert_float16(q >> (uchar16)4) - 8.0f), 0, out + 16);
}
#endif

/* pack_b: Launch global (ceil(K/PK), ceil(N/32), batches). Reads are by element index (a quantized
   weight has no element pointers); B^T given row by row (sbk == 1, a linear weight) is read along its
   rows, where consecutive k share a quantized block. */
__kernel void pack_b(const int N, const int K, __global const wstore_t *B, const long b_off,
                     const int sbk, const int sbn, const long b_bs, __global float *Bp WQ_PARAMS)
{
    const int k0 = get_global_id(0) * PK, nt = get_global_id(1), b = get_global_id(2);
    if (k0 >= K) return;
    const int k1 = min(K, k0 + PK);
    const int ntiles = (N + TN - 1) / TN;
    const long src = b_off + b * b_bs + (long)k0 * sbk + (long)(nt * TN) * sbn;
    __global float *dst = Bp + ((long)b * ntiles + nt) * (long)K * TN + (long)k0 * BSTEP;
    const int valid = N - nt * TN;
    if (valid >= TN && sbn == 1) {
        long s = src;
        for (int k = k0; k < k1; k++, s += sbk, dst += BSTEP) {
            vstore16(LOADW16(B, s), 0, dst); vstore16(LOADW16(B, s + 16), 0, dst + BHALF);
        }
#if WDT <= 2
    } else if (sbk == 1 && valid >= TN) {
        /* B^T row by row (a linear weight), float32 or half: 4 x 4 blocks (columns j.., steps k..k+3) transposed
           in registers, a step's 4 columns stored at once (the copy below: one store a value, 32 panel rows apart) */
        const int kn = k1 - k0;
        int k = 0;
        for (; k + 4 <= kn; k += 4)
            for (int j = 0; j < TN; j += 4) {
                const long r = src + (long)j * sbn + k;
                const float4 a0 = LOADW4(B, r), a1 = LOADW4(B, r + sbn), a2 = LOADW4(B, r + 2 * sbn),
                             a3 = LOADW4(B, r + 3 * sbn);
                STORE_T4(a0, a1, a2, a3, dst + BOFF(k, j), BSTEP);  /* BOFF(k + u, j) = BOFF(k, j) + u * BSTEP */
            }
        for (; k < kn; k++)
            for (int j = 0; j < TN; j++) dst[BOFF(k, j)] = LOADW(B, src + (long)j * sbn + k);
#else
    } else if (sbk == 1 && valid >= TN && (sbn & 31) == 0) {
        /* quantized rows of B^T whose blocks line up (rows a multiple of 32 long): 4 columns' runs of one block each
           decoded, then a step's 4 columns stored at once (the copy below: one store a value, 32 panel rows apart) */
        const int kn = k1 - k0;
        for (int j = 0; j < TN; j += 4)
            for (int k = 0; k < kn;) {
                float t[4][32];
                const long s0 = src + (long)j * sbn + k;
                const int n = min(32 - (int)(s0 & 31), kn - k);
                for (int c = 0; c < 4; c++) {
#if WQ == 7
                    if (n == 32) { qd_block32(B, s0 + c * sbn, t[c]); continue; }
#endif
                    qd_run(B, s0 + c * sbn, n, t[c], wscale, wq_k);
                }
                for (int u = 0; u < n; u++)
                    vstore4((float4)(t[0][u], t[1][u], t[2][u], t[3][u]), 0, dst + BOFF(k + u, j));
                k += n;
            }
#endif
    } else if (sbk == 1) {
        for (int j = 0; j < TN; j++) {
            const long s = src + (long)j * sbn;
            if (j >= valid)
                for (int k = 0; k < k1 - k0; k++) dst[BOFF(k, j)] = 0.0f;
#if WDT > 2
            else  /* a quantized row: one block (its scale read once) at a time */
                for (int k = 0; k < k1 - k0;) {
                    float t[32];
                    const int n = min(32 - (int)((s + k) & 31), k1 - k0 - k);
                    qd_run(B, s + k, n, t, wscale, wq_k);
                    for (int u = 0; u < n; u++) dst[BOFF(k + u, j)] = t[u];
                    k += n;
                }
#elif WDT > 0
            else  /* a half row: 16 values converted at once */
                for (int k = 0; k < k1 - k0; k += 16) {
                    float t[16];
                    const int n = min(16, k1 - k0 - k);
                    if (n == 16) vstore16(LOADW16(B, s + k), 0, t);
                    else for (int u = 0; u < n; u++) t[u] = LOADW(B, s + k + u);
                    for (int u = 0; u < n; u++) dst[BOFF(k + u, j)] = t[u];
                }
#else
            else
                for (int k = 0; k < k1 - k0; k++) dst[BOFF(k, j)] = LOADW(B, s + k);
#endif
        }
    } else {
        long s = src;
        for (int k = k0; k < k1; k++, s += sbk, dst += BSTEP)
            for (int j = 0; j < TN; j++) dst[BOFF(0, j)] = j < valid ? LOADW(B, s + (long)j * sbn) : 0.0f;
    }
}
/* pack_a: Launch global (ceil(K/PK), ceil(M/MR), batches) */
__kernel void pack_a(const int M, const int K, __global const wstore_t *A, const long a_off,
                     const int sam, const int sak, const long a_bs, __global float *Ap WQ_PARAMS)
{
    const int k0 = get_global_id(0) * PK, mt = get_global_id(1), b = get_global_id(2);
    if (k0 >= K) return;
    const int k1 = min(K, k0 + PK);
    const int mtiles = (M + MR - 1) / MR;
    const long src = a_off + b * a_bs + (long)(mt * MR) * sam;
    __global float *dst = Ap + ((long)b * mtiles + mt) * (long)K * MR;
    const int valid = min(MR, M - mt * MR);
#if WDT <= 2
    if (sak == 1 && valid == MR && (MR & 3) == 0) {
        /* float32 / half rows: 4 x 4 blocks transposed in registers (rows 4g.., steps k..k+3), stored a step's 4 rows
           at a time (the copies below: one store a value; 4 MiB float32 0.58 -> 0.42 ms) */
        int k = k0;
        for (; k + 4 <= k1; k += 4)
            for (int g = 0; g < MR / 4; g++) {
                const long r = src + (long)(4 * g) * sam + k;
                const float4 a0 = LOADW4(A, r), a1 = LOADW4(A, r + sam), a2 = LOADW4(A, r + 2 * sam),
                             a3 = LOADW4(A, r + 3 * sam);
                STORE_T4(a0, a1, a2, a3, dst + (long)k * MR + 4 * g, MR);
            }
        for (; k < k1; k++)
            for (int i = 0; i < MR; i++) dst[(long)k * MR + i] = LOADW(A, src + (long)i * sam + k);
        return;
    }
#endif
    for (int i = 0; i < MR; i++) {
        const long s = src + (long)i * sam;
        if (i >= valid)
            for (int k = k0; k < k1; k++) dst[(long)k * MR + i] = 0.0f;
#if WDT > 2
        else if (sak == 1)  /* a quantized row: one block (its scale read once) at a time */
            for (int k = k0; k < k1;) {
                float t[32];
                const int n = min(32 - (int)((s + k) & 31), k1 - k);
                qd_run(A, s + k, n, t, wscale, wq_k);
                for (int u = 0; u < n; u++) dst[(long)(k + u) * MR + i] = t[u];
                k += n;
            }
#elif WDT > 0
        else if (sak == 1)  /* a half row: 16 values converted at once (vload_half16: ~10% faster than LOADW one by one) */
            for (int k = k0; k < k1; k += 16) {
                float t[16];
                const int n = min(16, k1 - k);
                if (n == 16) vstore16(LOADW16(A, s + k), 0, t);
                else for (int u = 0; u < n; u++) t[u] = LOADW(A, s + k + u);
                for (int u = 0; u < n; u++) dst[(long)(k + u) * MR + i] = t[u];
            }
#endif
        else
            for (int k = k0; k < k1; k++) dst[(long)k * MR + i] = LOADW(A, s + (long)k * sak);
    }
}

#include "unroll_mr.h"
#ifndef PFA
#define PFA 0  /* steps of k ahead that a packed A panel's rows are prefetched (0: none; not with AU: its MR row
                  streams would take MR prefetches a line) */
#endif
#ifndef PFB
#define PFB 0  /* steps of k ahead that the first sub-tile's pass prefetches B's panel rows (its later passes find
                  them in L1). 2-core Intel Xeon with AVX-512, matmul 2048^2, gemm_cpu alone: 291 -> 309 GFLOPS;
                  with PFA 64 and A packed 330 (params.py GEMM_A_PACK_MIN_TILES) */
#endif
#if PFB
#define PFB_STEP if (s == 0) { __builtin_prefetch(bp + PFB * BSTEP); __builtin_prefetch(bp + PFB * BSTEP + 16); }
#else
#define PFB_STEP
#endif

#ifndef NH
#define NH 1  /* passes over a 32-column tile: 1 (MR x 32 accumulators, 2*MR float16s) where the vector
                 registers hold them (AVX-512: 32 zmm), 2 (MR x 16 twice) where they hold half (AVX2:
                 16 ymm, MR 6 -> 12 of them; MR 12 x 32 spilled: 58 GFLOPS at 1024^2 against 140) */
#endif
#ifndef AU
#define AU 0  /* 1: A read as it is stored (row-major, row stride K, from Ap + ap_bs: one A for every batch), not
                 pack_a's panels: MR row streams broadcast from (rows past M read row M - 1, never stored); the same
                 products in the same order, so the same bits. A small-N product (an 8x8 conv) paid as much to pack
                 its weight as to multiply it */
#endif
#if AU
#define AROW(i) const __global float *ar##i = Apanel + (long)min(m0 + s * MR + (i), M - 1) * K + kp;
#define AV(i) ar##i[k - kp]
#else
#define AROW(i)
#define AV(i) ap[i]
#endif
#if NH == 1
#define DECL(i) float16 c##i##0 = 0, c##i##1 = 0;
#define LOADB const float16 b0 = vload16(0, bp), b1 = vload16(0, bp + BHALF);
#define STEP(i) { const float av = AV(i); c##i##0 = fma((float16)av, b0, c##i##0); c##i##1 = fma((float16)av, b1, c##i##1); }
#define FOLD(i) tp[2*(i)] += c##i##0; tp[2*(i)+1] += c##i##1;
#else
#define DECL(i) float16 c##i##0 = 0;
#define LOADB const float16 b0 = vload16(0, bp);
#define STEP(i) { const float av = AV(i); c##i##0 = fma((float16)av, b0, c##i##0); }
#define FOLD(i) tp[2*(i)] += c##i##0;
#endif

__kernel void gemm_cpu(const int M, const int N, const int K,
                       __global const float *Ap, const long ap_bs,
                       __global const float *Bp, const long bp_bs,
                       __global ystore_t *C, const long c_off, const int ldc, const long c_bs,
                       __global const float *bias, const int has_bias, const int bias_bs,
                       const int cseg, const long cseg_stride, const int colbase)
{
    int gx = get_global_id(0), gy = get_global_id(1);
#if GM
    {   /* row blocks in groups of GM (host: params.py gemm_grouped): consecutive work groups walk a group's row blocks
           down one column tile (its B panel stays in L2), then the next column tile (the group's A stays in L3) */
        const int sx = get_global_size(0), sy = get_global_size(1), lin = gx + gy * sx;
        const int grp = lin / (GM * sy), first = grp * GM, gm = min(sx - first, GM), r = lin - grp * GM * sy;
        gx = first + r % gm; gy = r / gm;
    }
#endif
    const int m0 = gx * (MR * MSUB);
    const int b = get_global_id(2);
    const int nt_end = min((N + TN - 1) / TN, (gy + 1) * NL);
    if (m0 >= M) return;
#if AU
    const __global float *Apanel = Ap + ap_bs;  /* (ap_bs: A's offset) */
#else
    const __global float *Apanel = Ap + b * ap_bs;
#endif
    C += c_off + b * c_bs;
    for (int nt = gy * NL; nt < nt_end; nt++) {
    const int n0 = nt * TN;
    const __global float *Bpanel = Bp + b * bp_bs + (long)nt * K * TN;
    const int nvalid = min(TN, N - n0);
    const int nsub = min(MSUB, (M - m0 + MR - 1) / MR);
    const int nh = nvalid > 16 ? NH : 1;  /* a last tile of at most 16 columns: one 16-column pass where NH = 2 */

    float16 tot[MSUB][MR][2];
    for (int s = 0; s < MSUB; s++)
        for (int i = 0; i < MR; i++) { tot[s][i][0] = (float16)(0.0f); tot[s][i][1] = (float16)(0.0f); }

    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = min(K, k0 + KC);
        for (int s = 0; s < nsub; s++) {
            const __global float *ap0 = Apanel + (long)(m0 / MR + s) * K * MR;
            for (int kp = k0; kp < k1; kp += KP)
            for (int h = 0; h < nh; h++) {
                const int kend = min(k1, kp + KP);
                R(DECL)
                R(AROW)
                const __global float *bp = Bpanel + BOFF(kp, 16 * h);
                const __global float *ap = ap0 + (long)kp * MR;
                for (int k = kp; k < kend; k++, bp += BSTEP, ap += MR) {
                    PFB_STEP
#if PFA && !AU
                    __builtin_prefetch(ap + PFA * MR);
#endif
                    LOADB
                    R(STEP)
                }
                float16 *tp = &tot[s][0][h];
                R(FOLD)
            }
        }
    }
    for (int s = 0; s < nsub; s++) {
        for (int i = 0; i < MR; i++) {
            const int m = m0 + s * MR + i;
            if (m >= M) break;
            float16 v0 = tot[s][i][0], v1 = tot[s][i][1];
            if (has_bias == 1) { const float bv = bias[(long)b * bias_bs + m]; v0 += bv; v1 += bv; }
            else if (has_bias == 2) {  /* a bias per column (a linear layer's: y = x w^T + b), from column colbase */
                const __global float *bc = bias + (long)b * bias_bs + colbase + n0;
                if (nvalid == TN) { v0 += vload16(0, bc); v1 += vload16(0, bc + 16); }
                else {
                    float t[TN];
                    for (int j = 0; j < TN; j++) t[j] = j < nvalid ? bc[j] : 0.0f;
                    v0 += vload16(0, t); v1 += vload16(1, t);
                }
            }
            const int q0 = (colbase + n0) / cseg, r0 = colbase + n0 - q0 * cseg;
            if (nvalid == TN && r0 + TN <= cseg) {
                __global ystore_t *cp = C + (long)q0 * cseg_stride + (long)m * ldc + r0;
                STOREY16(cp, 0, v0); STOREY16(cp, 16, v1);
            } else {
                float t[TN];
                vstore16(v0, 0, t); vstore16(v1, 1, t);
                for (int j = 0; j < nvalid; j++) {
                    const int col = colbase + n0 + j, q = col / cseg;
                    STOREY(C, (long)q * cseg_stride + (long)m * ldc + (col - q * cseg), t[j]);
                }
            }
        }
    }
    }  /* nt */
}
