/* GPU-family SGEMM, portable subset (compiled as prelude + body by OpenCL and by NVRTC).

   C[b] = A[b] . B[b] (+ bias[m]), float32, two-level accumulation (gemm_tile.h: tiles, register
   microkernel, the fold every KP values of k).

   kernel gemm_gpu(int M, int N, int K,
                   const float *A, OFF_T a_off, int sam, int sak, OFF_T a_bs,   A[m,k] = A[a_off + b*a_bs + m*sam + k*sak]
                   const float *B, OFF_T b_off, int sbk, int sbn, OFF_T b_bs,   B[k,n] = B[b_off + b*b_bs + k*sbk + n*sbn]
                   float *C, OFF_T c_off, int ldc, OFF_T c_bs,                  see "segment map" below
                   const float *bias, int has_bias,                             bias[m] added when has_bias
                   int cseg, OFF_T cseg_stride)
     Segment map: column n of row m is stored at C[c_off + b*c_bs + (n/cseg)*cseg_stride + m*ldc + n%cseg]
     (plain GEMM: cseg >= N, e.g. 1<<30; a conv writing (N, Cout, P) uses cseg = P).
   Launch geometry: groups (ceil(N/BN), ceil(M/BM), batches), group size (BN/TN, BM/TM, 1)
                    = (16, 16, 1) with the defaults. Local memory: BK*(BM+BN) floats (static).
   Tunables (-D): BM, BN, BK, TM, TN, KP (gemm_tile.h, with their requirements).
*/
#include "gemm_tile.h"

KERNEL void gemm_gpu(const int M, const int N, const int K,
                     const GLOBAL float *RESTRICT A, const OFF_T a_off, const int sam, const int sak, const OFF_T a_bs,
                     const GLOBAL float *RESTRICT B, const OFF_T b_off, const int sbk, const int sbn, const OFF_T b_bs,
                     GLOBAL float *RESTRICT C, const OFF_T c_off, const int ldc, const OFF_T c_bs,
                     const GLOBAL float *RESTRICT bias, const int has_bias,
                     const int cseg, const OFF_T cseg_stride)
{
    GEMM_TILE_BEGIN();
    const OFF_T bidx = (OFF_T)GRP2;
    const GLOBAL float *Ab = A + a_off + bidx * a_bs;
    const GLOBAL float *Bb = B + b_off + bidx * b_bs;

    for (int k0 = 0; k0 < K; k0 += BK) {
        /* load tiles (zero outside the matrices) */
        FOR_TILE_ELEMS(BM, kk, mm) {
            const int m = m_blk + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? Ab[(OFF_T)m * sam + (OFF_T)k * sak] : 0.0f;
        }
        FOR_TILE_ELEMS(BN, kk, nn) {
            const int n = n_blk + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? Bb[(OFF_T)k * sbk + (OFF_T)n * sbn] : 0.0f;
        }
        GEMM_TILE_STEP();
    }
    GLOBAL float *Cb = C + c_off + bidx * c_bs;
    for (int i = 0; i < TM; i++) {
        const int m = GEMM_ROW(i);
        if (m >= M) continue;
        const float bv = has_bias ? bias[m] : 0.0f;
        for (int j = 0; j < TN; j++) {
            const int n = GEMM_COL(j);
            if (n >= N) continue;
            const int q = n / cseg;
            Cb[(OFF_T)q * cseg_stride + (OFF_T)m * ldc + (n - q * cseg)] = GEMM_RESULT(i, j) + bv;
        }
    }
}
