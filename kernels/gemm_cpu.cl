/* CPU-family SGEMM (OpenCL only; float16 vectors, no local memory).

   C[b] = A[b] (M x K, row stride lda) . B[b] (K x N, row stride ldb, unit column stride) (+ bias[m])

   kernel gemm_cpu: one work item computes a (8*MSUB) x 32 block of C: MSUB sub-tiles of 8 rows,
   each held in 16 float16 accumulators. K is walked in cache blocks of KC (the B panel KC x 32
   stays in L1 across the MSUB sub-tiles); inside a block, partial sums are folded into a private
   total every KP steps (two-level summation keeps FP32 precision on long K).
   Columns are written through a "segment" map so a conv can write (N, Cout, P) directly:
   column j (counted from colbase) lands at C + (j / cseg) * cseg_stride + row * ldc + j % cseg.
   bias[b * bias_bs + m] is added when has_bias. Operands are packed first (pack_a, pack_b, or im2col_pack in conv_cpu.cl).
   Launch: global (ceil(N/32), ceil(M/(8*MSUB)), batches), local (1, 1, 1).
*/
#ifndef MSUB
#define MSUB 4
#endif
#ifndef KC
#define KC 256
#endif
#ifndef KP
#define KP 128
#endif

#ifndef A_BCAST_MEM
#define A_BCAST_MEM 0
#endif

#define TM 8
#define TN 32

/* pack_b: B[k, n] = B[b_off + b*b_bs + k*sbk + n*sbn] -> Bp[batch][ceil(N/32)][K][32], zero padded.
   Launch: global (K, ceil(N/32), batches). */
__kernel void pack_b(const int N, const int K, __global const float *B, const long b_off,
                     const int sbk, const int sbn, const long b_bs, __global float *Bp)
{
    const int k = get_global_id(0), nt = get_global_id(1), b = get_global_id(2);
    if (k >= K) return;
    const int ntiles = (N + TN - 1) / TN;
    const __global float *src = B + b_off + b * b_bs + (long)k * sbk + (long)(nt * TN) * sbn;
    __global float *dst = Bp + ((long)b * ntiles + nt) * (long)K * TN + (long)k * TN;
    const int valid = N - nt * TN;
    if (valid >= TN && sbn == 1) {
        vstore16(vload16(0, src), 0, dst); vstore16(vload16(1, src), 1, dst);
    } else {
        for (int j = 0; j < TN; j++) dst[j] = j < valid ? src[(long)j * sbn] : 0.0f;
    }
}

/* pack_a: A[m, k] = A[a_off + b*a_bs + m*sam + k*sak] -> Ap[batch][ceil(M/8)][K][8], zero padded.
   Launch: global (K, ceil(M/8), batches). */
__kernel void pack_a(const int M, const int K, __global const float *A, const long a_off,
                     const int sam, const int sak, const long a_bs, __global float *Ap)
{
    const int k = get_global_id(0), mt = get_global_id(1), b = get_global_id(2);
    if (k >= K) return;
    const int mtiles = (M + TM - 1) / TM;
    const __global float *src = A + a_off + b * a_bs + (long)(mt * TM) * sam + (long)k * sak;
    __global float *dst = Ap + ((long)b * mtiles + mt) * (long)K * TM + (long)k * TM;
    for (int i = 0; i < TM; i++) dst[i] = (mt * TM + i < M) ? src[(long)i * sam] : 0.0f;
}

/* gemm_cpu: packed operands. Ap from pack_a (batch stride ap_bs elements, 0 to broadcast),
   Bp from pack_b (batch stride bp_bs). Launch: global (ceil(N/32), ceil(M/(8*MSUB)), batches). */
__kernel void gemm_cpu(const int M, const int N, const int K,
                       __global const float *Ap, const long ap_bs,
                       __global const float *Bp, const long bp_bs,
                       __global float *C, const long c_off, const int ldc, const long c_bs,
                       __global const float *bias, const int has_bias, const int bias_bs,
                       const int cseg, const long cseg_stride, const int colbase)
{
    const int nt = get_global_id(0);
    const int n0 = nt * TN;
    const int m0 = get_global_id(1) * (TM * MSUB);
    const int b = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    const __global float *Bpanel = Bp + b * bp_bs + (long)nt * K * TN;
    const __global float *Apanel = Ap + b * ap_bs;
    C += c_off + b * c_bs;
    const int nvalid = min(TN, N - n0);

    float16 tot[MSUB][TM][2];
    for (int s = 0; s < MSUB; s++)
        for (int i = 0; i < TM; i++) { tot[s][i][0] = (float16)(0.0f); tot[s][i][1] = (float16)(0.0f); }

    for (int k0 = 0; k0 < K; k0 += KC) {
        const int k1 = min(K, k0 + KC);
        for (int s = 0; s < MSUB; s++) {
            const int ms = m0 + s * TM;
            if (ms >= M) break;
            const __global float *ap0 = Apanel + (long)(ms / TM) * K * TM;
            for (int kp = k0; kp < k1; kp += KP) {
                const int kend = min(k1, kp + KP);
                float16 c00 = 0, c01 = 0, c10 = 0, c11 = 0, c20 = 0, c21 = 0, c30 = 0, c31 = 0;
                float16 c40 = 0, c41 = 0, c50 = 0, c51 = 0, c60 = 0, c61 = 0, c70 = 0, c71 = 0;
                const __global float *bp = Bpanel + (long)kp * TN;
                const __global float *ap = ap0 + (long)kp * TM;
                for (int k = kp; k < kend; k++, bp += TN, ap += TM) {
                    const float16 b0 = vload16(0, bp), b1 = vload16(1, bp);
#if A_BCAST_MEM
                    const __global float *a_ = ap;
#define AV(i) a_[i]
#else
                    const float8 a = vload8(0, ap);
#define AV(i) a.s##i
#endif
                    c00 = fma((float16)AV(0), b0, c00); c01 = fma((float16)AV(0), b1, c01);
                    c10 = fma((float16)AV(1), b0, c10); c11 = fma((float16)AV(1), b1, c11);
                    c20 = fma((float16)AV(2), b0, c20); c21 = fma((float16)AV(2), b1, c21);
                    c30 = fma((float16)AV(3), b0, c30); c31 = fma((float16)AV(3), b1, c31);
                    c40 = fma((float16)AV(4), b0, c40); c41 = fma((float16)AV(4), b1, c41);
                    c50 = fma((float16)AV(5), b0, c50); c51 = fma((float16)AV(5), b1, c51);
                    c60 = fma((float16)AV(6), b0, c60); c61 = fma((float16)AV(6), b1, c61);
                    c70 = fma((float16)AV(7), b0, c70); c71 = fma((float16)AV(7), b1, c71);
                }
                tot[s][0][0] += c00; tot[s][0][1] += c01; tot[s][1][0] += c10; tot[s][1][1] += c11;
                tot[s][2][0] += c20; tot[s][2][1] += c21; tot[s][3][0] += c30; tot[s][3][1] += c31;
                tot[s][4][0] += c40; tot[s][4][1] += c41; tot[s][5][0] += c50; tot[s][5][1] += c51;
                tot[s][6][0] += c60; tot[s][6][1] += c61; tot[s][7][0] += c70; tot[s][7][1] += c71;
            }
        }
    }
    for (int s = 0; s < MSUB; s++) {
        for (int i = 0; i < TM; i++) {
            const int m = m0 + s * TM + i;
            if (m >= M) break;
            float16 v0 = tot[s][i][0], v1 = tot[s][i][1];
            if (has_bias) { const float bv = bias[(long)b * bias_bs + m]; v0 += bv; v1 += bv; }
            const int q0 = (colbase + n0) / cseg, r0 = colbase + n0 - q0 * cseg;
            if (nvalid == TN && r0 + TN <= cseg) {
                __global float *cp = C + (long)q0 * cseg_stride + (long)m * ldc + r0;
                vstore16(v0, 0, cp); vstore16(v1, 1, cp);
            } else {
                float t[TN];
                vstore16(v0, 0, t); vstore16(v1, 1, t);
                for (int j = 0; j < nvalid; j++) {
                    const int col = colbase + n0 + j, q = col / cseg;
                    C[(long)q * cseg_stride + (long)m * ldc + (col - q * cseg)] = t[j];
                }
            }
        }
    }
}
