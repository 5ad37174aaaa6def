/* Fused scaled_dot_product_attention on the tensor cores (CUDA, sm_80+): the half-precision
   FlashAttention-2 scheme with mma.sync.m16n8k16 (f16 or bf16 operands, FP32 accumulators).

   The arguments, operand layout and semantics are ad_attention's (kernels/attention.cu, signatures.py):
   softmax(q kt * scale + mask) v, mask additive (or none), causal: key j > row + causal - 1 is out,
   a row whose every score is -inf gives zeros; only the (L, EV) output (float32) is written.

   Operands: q, kt and v are float32 or 16-bit buffers (QH / KH / VH = 1: 16-bit of the kind HK, 1 float16
   or 2 bfloat16); every value is rounded to HK where it is staged (a 16-bit operand is read as it is), the
   scores and the output are summed in FP32 and the probabilities rounded to HK before P v (as
   FlashAttention). The CUDA backend takes this kernel for a half model's attention (kt and v stored in HK).

   A block of 4 warps takes 64 query rows of one batch entry, 16 a warp: its q rows as mma A fragments in
   registers for the whole run; the keys stream through shared tiles of BKV keys (K as [key][e], V as
   [e][key]: a fragment's two consecutive k are one 32-bit word, rows padded by 8 halves so the
   fragment reads hit distinct banks). Per tile: S = q k^T (m16n8k16 over EP = E rounded up to 16), the
   online softmax on the accumulators (row max and sum over the four lanes of a quad), O = O * alpha +
   P V with P taken from S's accumulators as A fragments (FlashAttention-2's register reuse).
   Launch: groups (B * ceil(L / 64)), 128 threads. Compile-time: E, EV, HK, QH, KH, VH, BKV. */

#include "attention_dims.h"
#ifndef HK
#define HK 1
#endif
#ifndef QH
#define QH 0
#endif
#ifndef KH
#define KH 1
#endif
#ifndef VH
#define VH 1
#endif
#ifndef BKV
#define BKV 64
#endif
#define EP (((E) + 15) / 16 * 16)      /* q k^T's k dim, whole k16 steps */
#define EVP (((EV) + 7) / 8 * 8)       /* P v's n dim, whole n8 tiles */
#define NS (BKV / 8)                   /* score n8 tiles a tile of keys */
#define NO (EVP / 8)                   /* output n8 tiles */
#if BKV % 16
#error "ad_attention_mma: BKV must be a multiple of 16"
#endif

#define ATT_NEG_INF (-1.0f / 0.0f)

#include "half_cuda.h"
/* two values as one f16x2 / bf16x2 word, lo in the low half */
DEVICE_FN unsigned int att_pack(float lo, float hi)
{
    return (unsigned int)AD_F2H(HK, lo) | ((unsigned int)AD_F2H(HK, hi) << 16);
}
/* one operand element as HK bits: a 16-bit buffer's as they are, a float's rounded */
#if QH
#define Q_T unsigned short
#define Q_BITS(x) (x)
#else
#define Q_T float
#define Q_BITS(x) AD_F2H(HK, x)
#endif
#if KH
#define K_T unsigned short
#define K_BITS(x) (x)
#else
#define K_T float
#define K_BITS(x) AD_F2H(HK, x)
#endif
#if VH
#define V_T unsigned short
#define V_BITS(x) (x)
#else
#define V_T float
#define V_BITS(x) AD_F2H(HK, x)
#endif
#define H2(tile, r, c) (*(const unsigned int*)&(tile)[r][c])

KERNEL __launch_bounds__(128) void ad_attention_mma(
    const GLOBAL Q_T *RESTRICT q, const OFF_T q_off, const OFF_T q_so, const OFF_T q_si,
    const GLOBAL K_T *RESTRICT kt, const OFF_T k_off, const OFF_T k_so, const OFF_T k_si,
    const GLOBAL V_T *RESTRICT v, const OFF_T v_off, const OFF_T v_so, const OFF_T v_si,
    const GLOBAL float *RESTRICT m, const OFF_T m_off, const OFF_T m_so, const OFF_T m_si,
    const OFF_T m_r, const int m_k, const int has_mask, GLOBAL float *RESTRICT y,
    const OFF_T y_off, const int B, const int bi, const int L, const int S,
    const float scale, const int causal)
{
    LOCAL ALIGN16 unsigned short Ks[BKV][EP + 8];
    LOCAL ALIGN16 unsigned short Vs[EVP][BKV + 8];
    const int tid = LID0, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int nt = (L + 63) / 64;
    const int b = GRP0 / nt;
    const int rbase = (GRP0 - b * nt) * 64 + warp * 16;
    const GLOBAL Q_T *qb = q + q_off + ATT_BOFF(b, q_so, q_si);
    const GLOBAL K_T *kb = kt + k_off + ATT_BOFF(b, k_so, k_si);
    const GLOBAL V_T *vb = v + v_off + ATT_BOFF(b, v_so, v_si);
    const GLOBAL float *mb = m + m_off + (has_mask ? ATT_BOFF(b, m_so, m_si) : 0);
    int rows[2];                       /* this lane's two query rows (gq, gq + 8), clamped into L */
    rows[0] = rbase + gq < L ? rbase + gq : L - 1;
    rows[1] = rbase + gq + 8 < L ? rbase + gq + 8 : L - 1;

    /* the warp's q rows as A fragments (zeros past E) */
    unsigned int qa[EP / 16][4];
#pragma unroll
    for (int ks = 0; ks < EP / 16; ks++) {
#pragma unroll
        for (int r = 0; r < 4; r++) {  /* r: (row gq | gq + 8) x (k low 8 | high 8) */
            const int row = rows[r & 1];
            const int c = ks * 16 + tq * 2 + (r >> 1) * 8;
            const unsigned int lo = c < E ? (unsigned int)Q_BITS(qb[(OFF_T)row * E + c]) : 0u;
            const unsigned int hi = c + 1 < E ? (unsigned int)Q_BITS(qb[(OFF_T)row * E + c + 1]) : 0u;
            qa[ks][r] = lo | (hi << 16);
        }
    }
    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float mx[2] = {-ATT_FLT_MAX, -ATT_FLT_MAX}, l[2] = {0.0f, 0.0f};

    for (int j0 = 0; j0 < S; j0 += BKV) {
        BARRIER();  /* the previous tile's readers are done */
        for (int t = tid; t < BKV * EP; t += 128) {  /* K: read along the keys, kept [key][e] */
            const int e = t / BKV, key = t - e * BKV;
            Ks[key][e] = (e < E && j0 + key < S) ? (unsigned short)K_BITS(kb[(OFF_T)e * S + j0 + key]) : (unsigned short)0;
        }
        for (int t = tid; t < BKV * EVP; t += 128) {  /* V: read along e, kept [e][key] */
            const int key = t / EVP, c = t - key * EVP;
            Vs[c][key] = (c < EV && j0 + key < S) ? (unsigned short)V_BITS(vb[(OFF_T)(j0 + key) * EV + c]) : (unsigned short)0;
        }
        BARRIER();
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < EP / 16; ks++)
                AD_MMA_H(HK, s[j], qa[ks], H2(Ks, j * 8 + gq, ks * 16 + tq * 2), H2(Ks, j * 8 + gq, ks * 16 + tq * 2 + 8));
        }
        /* scale, mask, causal and the keys past S; the tile's row max */
        float bm[2] = {ATT_NEG_INF, ATT_NEG_INF};
#pragma unroll
        for (int j = 0; j < NS; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + j * 8 + tq * 2 + (e & 1);
                const int row = rows[e >> 1];
                float t = s[j][e] * scale;
                if (has_mask && key < S) t += mb[(OFF_T)row * m_r + (m_k ? key : 0)];
                if (key >= S || (causal && key > row + causal - 1)) t = ATT_NEG_INF;
                s[j][e] = t;
                bm[e >> 1] = t > bm[e >> 1] ? t : bm[e >> 1];  /* a NaN score stays out of the max */
            }
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            bm[h] = fmaxf(bm[h], __shfl_xor_sync(0xffffffffu, bm[h], 1));
            bm[h] = fmaxf(bm[h], __shfl_xor_sync(0xffffffffu, bm[h], 2));
            const float mn = mx[h] > bm[h] ? mx[h] : bm[h];
            alpha[h] = expf(mx[h] - mn);
            mx[h] = mn;
            l[h] *= alpha[h];
        }
#pragma unroll
        for (int j = 0; j < NS; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = expf(s[j][e] - mx[e >> 1]);
                s[j][e] = p;
                l[e >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < NO; j++) {
            o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
            o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
        }
        /* O += P V: P's k16 step ks is score tiles 2ks and 2ks + 1 */
#pragma unroll
        for (int ks = 0; ks < BKV / 16; ks++) {
            unsigned int pa[4];
            pa[0] = att_pack(s[2 * ks][0], s[2 * ks][1]);
            pa[1] = att_pack(s[2 * ks][2], s[2 * ks][3]);
            pa[2] = att_pack(s[2 * ks + 1][0], s[2 * ks + 1][1]);
            pa[3] = att_pack(s[2 * ks + 1][2], s[2 * ks + 1][3]);
#pragma unroll
            for (int j = 0; j < NO; j++)
                AD_MMA_H(HK, o[j], pa, H2(Vs, j * 8 + gq, ks * 16 + tq * 2), H2(Vs, j * 8 + gq, ks * 16 + tq * 2 + 8));
        }
    }
    /* the row sums over the quad; rows whose scores were all -inf have l = 0: zeros (ad_attention's rule) */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        const float tot = (l[h] > 1.0f || isnan(l[h])) ? l[h] : 1.0f;
        const int i = rbase + gq + h * 8;
        if (i < L) {
            GLOBAL float *yr = y + y_off + ((OFF_T)b * L + i) * EV;
#pragma unroll
            for (int j = 0; j < NO; j++) {
                const int c = j * 8 + tq * 2;
                if (c < EV) yr[c] = o[j][2 * h] / tot;
                if (c + 1 < EV) yr[c + 1] = o[j][2 * h + 1] / tot;
            }
        }
    }
}
