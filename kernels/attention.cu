/* Fused scaled_dot_product_attention, the GPU family, in the portable subset (kernels/README.md):
   softmax(q kt * scale + mask) v with an online softmax over tiles of keys (FlashAttention); only
   the (L, EV) output is written, no (L, S) score matrix is ever stored. Built for CUDA/HIP by the
   CUDA backend (backend/devices/cuda/attention.py, the fused kernel "attention") and as OpenCL C
   by tests/conformance/test_portable_attention.py (PoCL).

   The GPU family's kernel on OpenCL and CUDA (attention.cl's att_cpu is the CPU family), with the
   same arguments (signatures.py), operand layout, mask and causal conventions and semantics, which
   the header of kernels/attention.cl describes; the row sum here is compensated (Neumaier) too.

   A work group of WG threads takes WG query rows of one batch entry, one row a thread (its q row,
   accumulator, max and sum private); the keys stream through group-shared tiles of BK keys (kt's
   E x BK and v's BK x EV, loaded by the whole group, coalesced along S and EV; every thread then
   reads the same shared word: a broadcast). Shared memory 4 * BK * (E + EV) bytes.
   Launch: groups (B * ceil(L / WG)), group size (WG). Compile-time: E, EV, WG, BK. */

#include "attention_dims.h"
#ifndef WG
#define WG 64
#endif
#ifndef BK
#define BK 32
#endif

/* no API's spelling of inf / FLT_MAX / fmax / isfinite: C99 constant expressions and compares */
#define ATT_INF (1.0f / 0.0f)
#define ATT_MAX(a, b) ((b) > (a) ? (b) : (a))  /* a NaN b loses (as fmax); a is never NaN here */
#define ATT_FINITE(x) (AD_FABS(x) <= ATT_FLT_MAX)

KERNEL void ad_attention(const GLOBAL float *RESTRICT q, const OFF_T q_off, const OFF_T q_so, const OFF_T q_si,
                         const GLOBAL float *RESTRICT kt, const OFF_T k_off, const OFF_T k_so, const OFF_T k_si,
                         const GLOBAL float *RESTRICT v, const OFF_T v_off, const OFF_T v_so, const OFF_T v_si,
                         const GLOBAL float *RESTRICT m, const OFF_T m_off, const OFF_T m_so, const OFF_T m_si,
                         const OFF_T m_r, const int m_k, const int has_mask, GLOBAL float *RESTRICT y,
                         const OFF_T y_off, const int B, const int bi, const int L, const int S,
                         const float scale, const int causal)
{
    LOCAL float kl[E * BK];
    LOCAL float vl[BK * EV];
    const int lid = LID0;
    const int nt = (L + WG - 1) / WG;
    const int grp = GRP0;
    const int b = grp / nt, i = (grp - b * nt) * WG + lid;
    const int row = i < L - 1 ? i : L - 1;  /* rows past L repeat the last one (not stored) */
    const GLOBAL float *qb = q + q_off + ATT_BOFF(b, q_so, q_si);
    const GLOBAL float *kb = kt + k_off + ATT_BOFF(b, k_so, k_si);
    const GLOBAL float *vb = v + v_off + ATT_BOFF(b, v_so, v_si);
    const GLOBAL float *mp = m + m_off + (has_mask ? ATT_BOFF(b, m_so, m_si) + (OFF_T)row * m_r : 0);
    float qv[E], acc[EV], blk[EV], s[BK];
    for (int e = 0; e < E; e++) qv[e] = qb[(OFF_T)row * E + e] * scale;
    for (int c = 0; c < EV; c++) acc[c] = 0.0f;
    float mx = -ATT_FLT_MAX, l = 0.0f, lc = 0.0f;
    for (int j0 = 0; j0 < S; j0 += BK) {
        const int nk = S - j0 < BK ? S - j0 : BK;
        BARRIER();  /* the previous tile's readers are done */
        for (int t = lid; t < E * BK; t += WG) {
            const int e = t / BK, jj = t - e * BK;
            kl[t] = jj < nk ? kb[(OFF_T)e * S + j0 + jj] : 0.0f;
        }
        for (int t = lid; t < nk * EV; t += WG) vl[t] = vb[(OFF_T)j0 * EV + t];
        BARRIER();
        float bm = -ATT_INF;
        for (int jj = 0; jj < nk; jj++) {
            float t = 0.0f;
            for (int e = 0; e < E; e++) t = FMA(qv[e], kl[e * BK + jj], t);
            if (has_mask) t += mp[m_k ? j0 + jj : 0];
            if (causal && j0 + jj > row + causal - 1) t += -ATT_INF;
            s[jj] = t;
            bm = ATT_MAX(bm, t);
        }
        const float mn = ATT_MAX(mx, bm);
        const float alpha = AD_EXP(mx - mn);
        mx = mn;
        l *= alpha;
        lc *= alpha;
        for (int c = 0; c < EV; c++) blk[c] = 0.0f;
        for (int jj = 0; jj < nk; jj++) {
            const float p = AD_EXP(s[jj] - mn);
            const float t = l + p;
            lc += AD_FABS(l) >= AD_FABS(p) ? (l - t) + p : (p - t) + l;
            l = t;
            for (int c = 0; c < EV; c++) blk[c] = FMA(p, vl[jj * EV + c], blk[c]);
        }
        for (int c = 0; c < EV; c++) acc[c] = FMA(acc[c], alpha, blk[c]);  /* the tile's products added once */
    }
    if (i < L) {
        const float tot0 = ATT_FINITE(l) ? l + lc : l;
        const float tot = (tot0 > 1.0f || AD_ISNAN(tot0)) ? tot0 : 1.0f;
        GLOBAL float *yr = y + y_off + ((OFF_T)b * L + i) * EV;
        for (int c = 0; c < EV; c++) yr[c] = acc[c] / tot;
    }
}
