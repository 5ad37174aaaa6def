/* Fused scaled_dot_product_attention (OpenCL 1.2 C, no cl_khr_fp16): softmax(q kt * scale + mask) v
   with an online softmax over blocks of keys (FlashAttention): each work item (CPU family) or
   work group (GPU family) keeps its query rows' running max, running sum and output accumulator
   in registers / private memory and writes only the (L, EV) output; no (L, S) score matrix is
   ever stored. Called by backend/devices/opencl/attention.py (ops/attention.py's fused kernel
   "attention").

   Operands (float32, contiguous per batch entry): q (B, L, E), kt = k^T (B, E, S), v (B, S, EV),
   y (B, L, EV); batch entry b of an operand starts at off + (b / bi) * so + (b % bi) * si (so, si:
   the operand's strides over the output batch split into outer x inner, 0 where it broadcasts).
   The additive mask (has_mask) is read at m + m_off + batch offset + row * m_r + key * m_k
   (m_r 0: one row for all queries; m_k 0 or 1: one value for all keys or one per key). causal
   0: none; else query i sees keys j <= i + causal - 1 (top-left aligned; causal - 1: the first
   row's index in the whole query), -inf added to the others' scores (so a NaN score past the
   diagonal still gives NaN, as torch).

   Semantics as ops/attention.py's composite: q * scale rounded first; the row max taken at least
   -FLT_MAX (a row whose keys are all masked gives zeros, not NaN); the sum at least 1; NaN and
   Inf propagate through the exps and products as in the composite (no skipped zero products).
   Compile-time: E, EV (head dims); CPU family TQ (query rows a work item); GPU family WG (work
   group size = query rows a group) and BK (keys a local tile). */

#include "attention_dims.h"

/* the value dim in vectors of VW lanes (VW8: at most 8, so that a row's value vectors are more, narrower sums) */
#if EV % 16 == 0 && !defined(VW8)
#define VW 16
#define VT float16
#define VLOAD(p) vload16(0, p)
#define VSTORE(x, p) vstore16(x, 0, p)
#elif EV % 8 == 0
#define VW 8
#define VT float8
#define VLOAD(p) vload8(0, p)
#define VSTORE(x, p) vstore8(x, 0, p)
#elif EV % 4 == 0
#define VW 4
#define VT float4
#define VLOAD(p) vload4(0, p)
#define VSTORE(x, p) vstore4(x, 0, p)
#else
#define VW 1
#define VT float
#define VLOAD(p) (*(p))
#define VSTORE(x, p) (*(p) = (x))
#endif
#define NV (EV / VW)
#if defined(TQ) && defined(RT) && TQ % RT
#error "TQ must be a multiple of RT (a row group past TQ would index qs out of bounds)"
#endif
#if defined(RT) && RT > 16
#error "RT is at most 16 (the row group's alphas take one vector)"
#endif
#ifndef CV
#define CV NV  /* CPU family: value vectors of a row one pass over the block's keys accumulates (a divisor of
                  NV): RT x CV vectors of sums stay in registers (narrow registers: AVX2's 16 ymm) */
#endif

/* max of a float16's lanes by a tree of compare-selects (a NaN lane may or may not win: a row
   with a NaN score gives NaN either way, through its exp or through the max) */
#define ATT_VMAX(a, b) select(a, b, (b) > (a))
inline float att_max16(const float16 x)
{
    const float8 a = ATT_VMAX(x.lo, x.hi);
    const float4 b = ATT_VMAX(a.lo, a.hi);
    const float2 c = ATT_VMAX(b.lo, b.hi);
    return c.y > c.x ? c.y : c.x;
}
#define ATT_SUM16(x) (((((x).s0 + (x).s1) + ((x).s2 + (x).s3)) + (((x).s4 + (x).s5) + ((x).s6 + (x).s7))) + \
                      ((((x).s8 + (x).s9) + ((x).sa + (x).sb)) + (((x).sc + (x).sd) + ((x).se + (x).sf))))

#ifndef TQ
#define TQ 32
#endif
#ifndef RT
#define RT 4
#endif
#ifndef KB
#define KB 32
#endif
#define NB (KB / 16)
/* the softmax's exps as exp2 of x log2(e): PoCL's exp2 takes fewer instructions than its exp (no split of ln 2), and
   the product's rounding moves a result by at most |x| 2^-24 relative (x <= 0 here: an exp under 2^-24 relative
   moves less than its own rounding where |x| < 1, and the terms with a large |x| weigh e^x) */
#define ATT_EXP(x) exp2((x) * M_LOG2E_F)
#define ATT_NEUMAIER16(S, C, V) { const float16 t_ = S + V; \
                                  C += select((V - t_) + S, (S - t_) + V, fabs(S) >= fabs(V)); S = t_; }

/* both kernels' arguments: q (.., L, E), kt (.., E, S), v (.., S, EV) and the mask by outer/inner batch
   strides, then the output and the sizes */
#define ATT_ARGS __global const float *q, const long q_off, const long q_so, const long q_si, \
    __global const float *kt, const long k_off, const long k_so, const long k_si, \
    __global const float *v, const long v_off, const long v_so, const long v_si, \
    __global const float *m, const long m_off, const long m_so, const long m_si, \
    const long m_r, const int m_k, const int has_mask, __global float *y, const long y_off, \
    const int B, const int bi, const int L, const int S, const float scale, const int causal

/* both CPU kernels: the work item's batch entry b, first row r0, rows stored, and q, kt, v of the entry */
#define ATT_CPU_ITEM \
    const int nt = (L + TQ - 1) / TQ; \
    const int g = get_global_id(0); \
    if (g >= B * nt) return; \
    const int b = g / nt, r0 = (g - b * nt) * TQ; \
    const int rows = min(TQ, L - r0); \
    const __global float *qb = q + q_off + ATT_BOFF(b, q_so, q_si); \
    const __global float *kb = kt + k_off + ATT_BOFF(b, k_so, k_si); \
    const __global float *vb = v + v_off + ATT_BOFF(b, v_so, v_si);

/* the key block's kt columns [j0, j0 + nk) copied contiguous, kblk[e * KB + j] (kt's rows are S apart: at a
   power-of-two S they would fall in one L1 set), zeros past nk */
inline __attribute__((always_inline)) void att_key_block(float *kblk, const __global float *kb, const int S,
                                                         const int j0, const int nk)
{
    if (nk == KB) {
        for (int e = 0; e < E; e++) {
            const __global float *kr = kb + (long)e * S + j0;
            _Pragma("unroll") for (int u = 0; u < NB; u++) vstore16(vload16(u, kr), u, kblk + e * KB);
        }
    } else {
        for (int e = 0; e < E; e++)
            for (int jj = 0; jj < KB; jj++) kblk[e * KB + jj] = jj < nk ? kb[(long)e * S + j0 + jj] : 0.0f;
    }
}

/* the value pass of RT rows (acc rows R0 ..): per CV value vectors, blk = sum over the block's nk keys of
   P(r, jj) v[j0 + jj] in RT x CV registers, then acc = acc * AL(r) + blk (P and AL name the rows' exps and
   rescale factors) */
#define ATT_VALUE_PASS(R0, P, AL) \
    for (int c0 = 0; c0 < NV; c0 += CV) { \
        VT blk[RT][CV]; \
        _Pragma("unroll") for (int r = 0; r < RT; r++) \
            _Pragma("unroll") for (int c = 0; c < CV; c++) blk[r][c] = 0.0f; \
        for (int jj = 0; jj < nk; jj++) { \
            const __global float *vr = vb + (long)(j0 + jj) * EV + c0 * VW; \
            _Pragma("unroll") for (int c = 0; c < CV; c++) { \
                const VT vv = VLOAD(vr + c * VW); \
                _Pragma("unroll") for (int r = 0; r < RT; r++) blk[r][c] = fma((VT)(P(r, jj)), vv, blk[r][c]); \
            } \
        } \
        _Pragma("unroll") for (int r = 0; r < RT; r++) \
            _Pragma("unroll") for (int c = 0; c < CV; c++) \
                acc[(R0) + r][c0 + c] = fma(acc[(R0) + r][c0 + c], (VT)(AL(r)), blk[r][c]); \
    }

/* one output row: acc / the row's sum (its compensation added where the sum is finite; at least 1, so a row of
   no weight gives zeros; NaN kept) */
inline __attribute__((always_inline)) void att_store_row(__global float *yr, const VT *a, float tot0, const float comp)
{
    if (isfinite(tot0)) tot0 += comp;
    const float tot = (tot0 > 1.0f || isnan(tot0)) ? tot0 : 1.0f;
    for (int c = 0; c < NV; c++) VSTORE(a[c] / tot, yr + c * VW);
}

/* CPU family: one work item per TQ query rows of one batch entry (their q rows, maxes, sums and
   accumulators in private memory); the keys in blocks of KB (a multiple of 16), each block's kt
   columns copied contiguous, and per block the rows RT at a time: KB / 16 float16s of scores a
   row (vectorised over the keys), exps, then the block's RT x EV products in registers (vectors
   over the value dim), added to the rescaled accumulator once per block. The block's kt and v
   (KB * (E + EV) floats) stay in cache while the TQ / RT row groups use them, so K and V are read
   from memory once per TQ rows. The row sums are 16-lane compensated (Neumaier) sums, one step a block (the
   block's exps summed per lane first). Launch: global (B * ceil(L / TQ)), local 1. */
__kernel void att_cpu(ATT_ARGS)
{
    ATT_CPU_ITEM
    const __global float *mb = m + m_off + (has_mask ? ATT_BOFF(b, m_so, m_si) : 0);
    float qs[TQ][E];
    float mx[TQ];
    float16 l16[TQ], c16[TQ];
    VT acc[TQ][NV];
    float kblk[E * KB];
    for (int r = 0; r < TQ; r++) {
        const int i = min(r0 + r, L - 1);  /* rows past L repeat the last one (not stored) */
        for (int e = 0; e < E; e++) qs[r][e] = qb[(long)i * E + e] * scale;
        mx[r] = -FLT_MAX;
        l16[r] = 0.0f;
        c16[r] = 0.0f;
        for (int c = 0; c < NV; c++) acc[r][c] = 0.0f;
    }
    const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int j0 = 0; j0 < S; j0 += KB) {
        const int nk = min(KB, S - j0);
        const int16 jv = lane + (int16)(j0);
        att_key_block(kblk, kb, S, j0, nk);
        for (int rt = 0; rt < rows; rt += RT) {
            float16 sc[RT][NB];  /* the block's scores, NB float16s a row: RT * NB chains */
            float alpha[RT];
            float pa[RT][KB];
            float16 psum[RT];
            _Pragma("unroll") for (int r = 0; r < RT; r++)
                _Pragma("unroll") for (int u = 0; u < NB; u++) sc[r][u] = 0.0f;
            for (int e = 0; e < E; e++) {
                float16 kv[NB];
                _Pragma("unroll") for (int u = 0; u < NB; u++) kv[u] = vload16(u, kblk + e * KB);
                _Pragma("unroll") for (int r = 0; r < RT; r++) {
                    const float16 qe = (float16)(qs[rt + r][e]);
                    _Pragma("unroll") for (int u = 0; u < NB; u++) sc[r][u] = fma(qe, kv[u], sc[r][u]);
                }
            }
            _Pragma("unroll") for (int r = 0; r < RT; r++) {
                const int i = min(r0 + rt + r, L - 1);
                float16 t[NB];
                _Pragma("unroll") for (int u = 0; u < NB; u++) t[u] = sc[r][u];
                if (has_mask) {
                    const __global float *mp = mb + (long)i * m_r;
                    if (!m_k) {
                        _Pragma("unroll") for (int u = 0; u < NB; u++) t[u] += (float16)(mp[0]);
                    } else if (nk == KB) {
                        _Pragma("unroll") for (int u = 0; u < NB; u++) t[u] += vload16(u, mp + j0);
                    } else {
                        float mm[KB];
                        for (int jj = 0; jj < KB; jj++) mm[jj] = jj < nk ? mp[j0 + jj] : 0.0f;
                        _Pragma("unroll") for (int u = 0; u < NB; u++) t[u] += vload16(u, mm);
                    }
                }
                if (causal) {
                    _Pragma("unroll") for (int u = 0; u < NB; u++)
                        t[u] += select((float16)(0.0f), (float16)(-INFINITY), jv + (int16)(16 * u) > (int16)(i + causal - 1));
                }
                if (nk < KB) {  /* no key: exp gives 0 */
                    _Pragma("unroll") for (int u = 0; u < NB; u++)
                        t[u] = select(t[u], (float16)(-INFINITY), jv + (int16)(16 * u) >= (int16)(S));
                }
                float16 tm = t[0];
                _Pragma("unroll") for (int u = 1; u < NB; u++) tm = ATT_VMAX(tm, t[u]);
                const float mo = mx[rt + r], bm = att_max16(tm), mn = bm > mo ? bm : mo;
                alpha[r] = mo - mn;  /* exp below, the RT rows at once */
                mx[rt + r] = mn;
                float16 ps = 0.0f;  /* the block's exps summed per lane, then one compensated step a block */
                _Pragma("unroll") for (int u = 0; u < NB; u++) {
                    const float16 pu = ATT_EXP(t[u] - mn);
                    vstore16(pu, u, pa[r]);
                    ps += pu;
                }
                psum[r] = ps;
            }
            {  /* the RT alphas' exps in one vector */
#if RT <= 4
                float4 al = 0.0f;
#else
                float16 al = 0.0f;
#endif
                _Pragma("unroll") for (int r = 0; r < RT; r++) al[r] = alpha[r];
                al = ATT_EXP(al);
                _Pragma("unroll") for (int r = 0; r < RT; r++) alpha[r] = al[r];
            }
            _Pragma("unroll") for (int r = 0; r < RT; r++) {
                float16 ls = l16[rt + r] * alpha[r], lc = c16[rt + r] * alpha[r];
                ATT_NEUMAIER16(ls, lc, psum[r]);
                l16[rt + r] = ls;
                c16[rt + r] = lc;
            }
#define ATT_PA(r, jj) pa[r][jj]
#define ATT_AL(r) alpha[r]
            ATT_VALUE_PASS(rt, ATT_PA, ATT_AL)
        }
    }
    __global float *yb = y + y_off + (long)b * L * EV;
    for (int r = 0; r < rows; r++)
        att_store_row(yb + (long)(r0 + r) * EV, acc[r], ATT_SUM16(l16[r]), ATT_SUM16(c16[r]));
}

/* CPU family, no mask and not causal (attention.py takes it for those calls): att_cpu with the scores computed
   transposed, a float16 of 16 query rows per key, so that the online softmax's bookkeeping is vectors over rows: the
   block's max is KB lane-wise maxes (no tree across lanes), one alpha exp and one compensated sum step per 16 rows
   and block (att_cpu: per row). Each work item: TQ rows (a multiple of 16) of one batch entry, q * scale kept
   transposed (qt[e][row]); per key block of KB (the block's kt columns copied contiguous, as att_cpu) and group of 16
   rows: the scores KJ keys at a time (KJ float16 accumulators; per e one 16-row load of qt and KJ broadcasts of the
   keys), the exps stored key-major for the value pass, which is att_cpu's (RT rows x CV vectors a pass). Semantics
   as att_cpu (the row max at least -FLT_MAX, the sum at least 1, NaN and Inf through the exps); a row's sum is one
   lane of compensated block sums (each block's KB exps summed in four interleaved partial sums). */
#ifndef KJ
#define KJ 4
#endif
#ifndef VR
#define VR 0  /* 1: the value pass over rows too (wide vectors, attention.py): the accumulators are acct[group][e], a float16
                 of the group's 16 rows per value column, and per key one load of the 16 rows' exps and VC broadcasts of
                 the key's values feed VC sums (att_cpu's pass runs on vectors of the value dim, float8 for a head of 40) */
#endif
#ifndef VC
#define VC 20  /* VR: value columns a pass (a divisor of EV; VC float16 sums stay in registers) */
#endif
#ifndef G2
#define G2 1  /* row groups of 16 a score pass (2: per e two 16-row loads share the KJ key broadcasts) */
#endif
#if KB % KJ == 0 && KB % 4 == 0 && TQ % (16 * G2) == 0 && 16 % RT == 0 && (!VR || EV % VC == 0)  /* (att_cpu's own builds may have other tiles) */
__kernel void att_cpu_rows(ATT_ARGS)
{
    ATT_CPU_ITEM
    float qt[E][TQ];
    float16 mx[TQ / 16], l16[TQ / 16], c16[TQ / 16];
#if VR
    float16 acct[TQ / 16][EV];
#else
    VT acc[TQ][NV];
#endif
    float kblk[E * KB];
    float pp[KB][16];  /* a row group's exps of the block, key-major: the value pass broadcasts pp[key][row] */
    for (int r = 0; r < TQ; r++) {
        const int i = min(r0 + r, L - 1);  /* rows past L repeat the last one (not stored) */
        for (int e = 0; e < E; e++) qt[e][r] = qb[(long)i * E + e] * scale;
#if !VR
        for (int c = 0; c < NV; c++) acc[r][c] = 0.0f;
#endif
    }
    for (int gq = 0; gq < TQ / 16; gq++) {
#if VR
        for (int c = 0; c < EV; c++) acct[gq][c] = 0.0f;
#endif
        mx[gq] = -FLT_MAX;
        l16[gq] = 0.0f;
        c16[gq] = 0.0f;
    }
    for (int j0 = 0; j0 < S; j0 += KB) {
        const int nk = min(KB, S - j0);
        att_key_block(kblk, kb, S, j0, nk);
        for (int gp = 0; gp * 16 < rows; gp += G2) {
          float16 P2[G2][KB];
          for (int j = 0; j < KB; j += KJ) {
              float16 sc[G2][KJ];
              _Pragma("unroll") for (int h = 0; h < G2; h++)
                  _Pragma("unroll") for (int u = 0; u < KJ; u++) sc[h][u] = 0.0f;
              for (int e = 0; e < E; e++) {
                  float16 qv[G2];
                  _Pragma("unroll") for (int h = 0; h < G2; h++) qv[h] = vload16(0, qt[e] + 16 * (gp + h));
                  _Pragma("unroll") for (int u = 0; u < KJ; u++) {
                      const float16 kk = (float16)(kblk[e * KB + j + u]);
                      _Pragma("unroll") for (int h = 0; h < G2; h++) sc[h][u] = fma(kk, qv[h], sc[h][u]);
                  }
              }
              _Pragma("unroll") for (int h = 0; h < G2; h++)
                  _Pragma("unroll") for (int u = 0; u < KJ; u++) P2[h][j + u] = sc[h][u];
          }
          for (int h = 0; h < G2 && (gp + h) * 16 < rows; h++) {
            const int gq = gp + h;
            float16 *P = P2[h];
            for (int j = nk; j < KB; j++) P[j] = (float16)(-INFINITY);  /* no key: exp gives 0 */
            float16 b4[4] = {P[0], P[1], P[2], P[3]};  /* four chains of maxes (one chain waited on each max) */
            for (int j = 4; j < KB; j += 4)
                _Pragma("unroll") for (int u = 0; u < 4; u++) b4[u] = ATT_VMAX(b4[u], P[j + u]);
            const float16 bm = ATT_VMAX(ATT_VMAX(b4[0], b4[1]), ATT_VMAX(b4[2], b4[3]));
            const float16 mo = mx[gq], mn = ATT_VMAX(mo, bm);
            mx[gq] = mn;
            const float16 al = ATT_EXP(mo - mn);
            float16 ps[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int j = 0; j < KB; j += 4) {
                _Pragma("unroll") for (int u = 0; u < 4; u++) {
                    const float16 pu = ATT_EXP(P[j + u] - mn);
                    vstore16(pu, 0, pp[j + u]);
                    ps[u] += pu;
                }
            }
            {
                float16 ls = l16[gq] * al, lc = c16[gq] * al;
                const float16 pt = (ps[0] + ps[1]) + (ps[2] + ps[3]);
                ATT_NEUMAIER16(ls, lc, pt);
                l16[gq] = ls;
                c16[gq] = lc;
            }
#if VR
            for (int c0 = 0; c0 < EV; c0 += VC) {
                float16 blk[VC];
                _Pragma("unroll") for (int c = 0; c < VC; c++) blk[c] = 0.0f;
                for (int jj = 0; jj < nk; jj++) {
                    const float16 pv = vload16(0, pp[jj]);
                    const __global float *vr = vb + (long)(j0 + jj) * EV + c0;
                    _Pragma("unroll") for (int c = 0; c < VC; c++) blk[c] = fma(pv, (float16)(vr[c]), blk[c]);
                }
                _Pragma("unroll") for (int c = 0; c < VC; c++) acct[gq][c0 + c] = fma(acct[gq][c0 + c], al, blk[c]);
            }
#else
            float alpha[16];
            vstore16(al, 0, alpha);
            const int gr = min(16, rows - 16 * gq);
#define ATT_PP(r, jj) pp[jj][rt + (r)]
#define ATT_ALR(r) alpha[rt + (r)]
            for (int rt = 0; rt < gr; rt += RT)
                ATT_VALUE_PASS(16 * gq + rt, ATT_PP, ATT_ALR)
#endif
          }  /* h */
        }
    }
    __global float *yb = y + y_off + (long)b * L * EV;
    for (int gq = 0; gq * 16 < rows; gq++) {
        float ls[16], lc[16];
        vstore16(l16[gq], 0, ls);
        vstore16(c16[gq], 0, lc);
#if VR
        float at[EV][16];  /* the group's sums row by row (a transpose through private memory, once a work item) */
        for (int c = 0; c < EV; c++) vstore16(acct[gq][c], 0, at[c]);
        for (int r = 16 * gq; r < min(rows, 16 * gq + 16); r++) {
            float tot = ls[r - 16 * gq];
            if (isfinite(tot)) tot += lc[r - 16 * gq];
            tot = (tot > 1.0f || isnan(tot)) ? tot : 1.0f;
            __global float *yr = yb + (long)(r0 + r) * EV;
            for (int c = 0; c < EV; c++) yr[c] = at[c][r - 16 * gq] / tot;
        }
#else
        for (int r = 16 * gq; r < min(rows, 16 * gq + 16); r++)
            att_store_row(yb + (long)(r0 + r) * EV, acc[r], ls[r - 16 * gq], lc[r - 16 * gq]);
#endif
    }
}
#endif

/* The GPU family's kernel is kernels/attention.cu's ad_attention (the portable subset, also the CUDA
   backend's), built as OpenCL C. */
