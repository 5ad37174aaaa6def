/* CPU-family convolution kernels (OpenCL only; float16 vectors, no local memory).

   im2col_pack      : x -> packed B operand of gemm_cpu (layout [g][ceil(P/32)][K][32]) for the
                      columns [colbase, colbase + ncols) of the (n, oh, ow) column space; a work
                      item fills PK rows of k of one 32-column tile.
                      Launch: global (ceil(K/PK), ceil(ncols/32), G), local (1,1,1).
   conv2d_direct    : direct conv for small CinG*KH*KW. A work item computes DCO output channels x TN
                      output columns of one output row (DCO 8 x TN 32; 4 x 16 on AVX2, tuning.py). Launch:
                      global (ceil(OW/TN)*ceil(CoutG/DCO), OH, N*G) (the channel tiles of one column tile
                      next to each other), local (1,1,1). Exact for Inf/NaN weights too (wflag).
   conv_t2d_direct  : transposed conv, phase-decomposed: outputs ow = r + sw*j of one phase r
                      read contiguous input runs. Launch: global (ceil(ceil(OW/sw)/TN), OH*sw,
                      N*G*ceil(CoutG/DCO)), local (1,1,1).
   Both direct kernels fold partial sums into totals every ~64 taps (FP32 precision on long K).
   im2col_pack reads x as stored (build option XDT, half_io.h: float32, float16 or bfloat16).
*/
#ifndef TN
#define TN 32
#endif
#define FLUSH_TAPS 64
/* Direct kernels built for one geometry (-DSPEC_KH=.. -DSPEC_KW=.. -DSPEC_SH=.. -DSPEC_SW=..
   -DSPEC_DH=.. -DSPEC_DW=..) see the kernel size, stride and dilation as constants (unrolled tap
   loops, constant index arithmetic); without them they read the arguments. */
#ifdef SPEC_KH
#define KH_ SPEC_KH
#define KW_ SPEC_KW
#define SH_ SPEC_SH
#define SW_ SPEC_SW
#define DH_ SPEC_DH
#define DW_ SPEC_DW
#else
#define KH_ KH
#define KW_ KW
#define SH_ sh
#define SW_ sw
#define DH_ dh
#define DW_ dw
#endif
#ifndef PK
#define PK 64
#endif
#include "half_io.h"
#include "panel_b.h"

__kernel void im2col_pack(__global const xstore_t *x, const long x_off, __global float *Bp,
                          const int C, const int H, const int W, const int CinG, const int KH, const int KW,
                          const int OH, const int OW, const int sh, const int sw, const int pt, const int pl,
                          const int dh, const int dw, const int colbase, const int ncols)
{
    const int kb = get_global_id(0) * PK, nt = get_global_id(1), g = get_global_id(2);
    const int KHW = KH * KW, K = CinG * KHW;
    if (kb >= K) return;
    const int ke = min(K, kb + PK);
    const int ntiles = (ncols + TN - 1) / TN;
    __global float *dst = Bp + ((long)g * ntiles + nt) * (long)K * TN;  /* the panel (panel_b.h) */
    /* per column: top-left input position and image base (columns past the end never load) */
    int ih0[TN], iw0[TN];
    long xb[TN];
    const int P = OH * OW, end = colbase + ncols;
    int col = colbase + nt * TN;
    int n = col / P, p = col - n * P, oh = p / OW, ow = p - oh * OW;
    for (int j = 0; j < TN; j++, col++) {
        const int live = col < end;
        ih0[j] = live ? oh * sh - pt : -(1 << 29);
        iw0[j] = ow * sw - pl;
        xb[j] = x_off + ((long)n * C + g * CinG) * H * W;
        if (++ow == OW) { ow = 0; if (++oh == OH) { oh = 0; n++; } }
    }
    int ci = kb / KHW, r = kb - ci * KHW, kh = r / KW, kw = r - kh * KW;
    for (int k = kb; k < ke; k++) {
        const long cofs = (long)ci * H * W;
        for (int j = 0; j < TN; j++) {
            const int ih = ih0[j] + kh * dh, iw = iw0[j] + kw * dw;
            dst[PANEL_BOFF(k, j, K)] = ((uint)ih < (uint)H && (uint)iw < (uint)W) ?
                LOADX(x, xb[j] + cofs + (long)ih * W + iw) : 0.0f;
        }
        if (++kw == KW) { kw = 0; if (++kh == KH) { kh = 0; ci++; } }
    }
}

/* The direct kernels' register tile: DCO output channels (1-8) x TN output columns (16 or 32), in DCO * TN / 16
   float16 accumulators (8 x 32: 16 of AVX-512's 32 zmm; on AVX2's 16 ymm they spilled, a load and a store
   around every FMA: narrow vectors take 4 x 16, tuning.py). RC(X) expands X(i) for i < DCO. */
#ifndef DCO
#define DCO 8
#endif
#define RC(X) X(0) RC1(X)
#if DCO > 1
#define RC1(X) X(1) RC2(X)
#else
#define RC1(X)
#endif
#if DCO > 2
#define RC2(X) X(2) RC3(X)
#else
#define RC2(X)
#endif
#if DCO > 3
#define RC3(X) X(3) RC4(X)
#else
#define RC3(X)
#endif
#if DCO > 4
#define RC4(X) X(4) RC5(X)
#else
#define RC4(X)
#endif
#if DCO > 5
#define RC5(X) X(5) RC6(X)
#else
#define RC5(X)
#endif
#if DCO > 6
#define RC6(X) X(6) RC7(X)
#else
#define RC6(X)
#endif
#if DCO > 7
#define RC7(X) X(7)
#else
#define RC7(X)
#endif

/* a tile's TN input columns from iw0 by step (v1: columns 16-31 where TN is 32); outside the row zeros */
inline void load_cols(const __global float *row, const int iw0, const int step, const int W,
                      float16 *v0, float16 *v1)
{
    if (step == 1 && iw0 >= 0 && iw0 + TN <= W) {
        *v0 = vload16(0, row + iw0);
#if TN > 16
        *v1 = vload16(0, row + iw0 + 16);
#endif
    } else {
        float t[32];
        for (int j = 0; j < TN; j++) {
            const int iw = iw0 + j * step;
            t[j] = (iw >= 0 && iw < W) ? row[iw] : 0.0f;
        }
        *v0 = vload16(0, t);
#if TN > 16
        *v1 = vload16(1, t);
#endif
    }
}

#if TN == 16  /* one float16 of columns: DCO accumulators (6 x 2 ymm of AVX2's 16) */
#define ACC_DECL(i) float16 a##i##0 = 0, t##i##0 = 0;
#define ACC_FLUSH(i) t##i##0 += a##i##0; a##i##0 = 0;
#define ACC_FMA(i) wv = LOADW(wq_, ws##i); a##i##0 = fma((float16)wv, u0_, a##i##0);
#define ACC_TV(i) tv[i][0] = t##i##0; tv[i][1] = 0;
#else
#define ACC_DECL(i) float16 a##i##0 = 0, a##i##1 = 0, t##i##0 = 0, t##i##1 = 0;
#define ACC_FLUSH(i) t##i##0 += a##i##0; t##i##1 += a##i##1; a##i##0 = 0; a##i##1 = 0;
#define ACC_FMA(i) wv = LOADW(wq_, ws##i); a##i##0 = fma((float16)wv, u0_, a##i##0); a##i##1 = fma((float16)wv, u1_, a##i##1);
#define ACC_TV(i) tv[i][0] = t##i##0; tv[i][1] = t##i##1;
#endif
#define DECL_ACC RC(ACC_DECL)
#define FLUSH RC(ACC_FLUSH)
#include "weight_load.h"
#if WDT > 2
#error "conv_cpu.cl reads float32 / half weights only: a quantized weight takes the packed GEMM path"
#endif
/* the tile's DCO weights of one tap (ws0..: their offsets, the last one repeated past nco) times V0, V1 */
#define FMA_TILE(WP, ws, V0, V1) { const __global wstore_t *wq_ = (WP); const float16 u0_ = (V0), u1_ = (V1); \
    float wv; RC(ACC_FMA) }
#define WS_ONE(i) const int ws##i = min(i, nco - 1) * wsu_;
#define WS_DECL(ws, unit) const int wsu_ = (unit); RC(WS_ONE)

inline void store_row(__global float *yr, const int j0, const int step, const int nvalid,
                      float16 v0, float16 v1, const float b)
{
    v0 += b; v1 += b;
    if (step == 1 && nvalid == TN) {
        vstore16(v0, 0, yr + j0);
#if TN > 16
        vstore16(v1, 0, yr + j0 + 16);
#endif
    } else {
        float t[32];
        vstore16(v0, 0, t);
        vstore16(v1, 1, t);
        for (int j = 0; j < nvalid; j++) yr[(long)(j0 + j) * step] = t[j];
    }
}

#define STORE_ALL(YBASE, ROWSTRIDE, J0, STEP, NVALID) { \
    FLUSH \
    float16 tv[DCO][2]; \
    RC(ACC_TV) \
    for (int i = 0; i < nco; i++) \
        store_row((YBASE) + (long)i * (ROWSTRIDE), J0, STEP, NVALID, tv[i][0], tv[i][1], \
                  has_bias ? bias[g * CoutG + co0 + i] : 0.0f); }

__kernel void conv2d_direct(__global const float *x, const long x_off, __global const wstore_t *w, const long w_off,
                            __global float *y, const long y_off, __global const float *bias, const int has_bias,
                            const int C, const int H, const int W, const int CoutG, const int CinG,
                            const int KH, const int KW, const int G, const int OH, const int OW,
                            const int sh, const int sw, const int pt, const int pl, const int dh, const int dw,
                            const int ncob, __global const float *wflag)
{
    /* dimension 0 runs the output channel tiles fastest: the tiles of one row of columns read the same
       input rows while they are in the cache */
    const int ow0 = (get_global_id(0) / ncob) * TN, oh = get_global_id(1);
    const int z = get_global_id(2) * ncob + get_global_id(0) % ncob;
    if (ow0 >= OW || oh >= OH) return;
    /* wflag[0]: sum(w * 0), NaN iff w holds an Inf or NaN (computed on the device: no read-back). Then the
       rows of zero padding are multiplied too, as torch's im2col does (Inf * 0 = NaN); else skipped */
    const int wbad = isnan(wflag[0]);
    const int cob = z % ncob, ng = z / ncob, g = ng % G, n = ng / G;
    const int co0 = cob * DCO, nco = min(DCO, CoutG - co0);
    const int KHW = KH_ * KW_;
    const int wco = CinG * KHW;  /* distance between output channels in w */
    WS_DECL(ws, wco)
    const __global wstore_t *wb = w + w_off + (long)(g * CoutG + co0) * wco;
    const __global float *xb = x + x_off + ((long)n * C + g * CinG) * H * W;
    DECL_ACC
    /* a tile whose columns all lie inside the row (stride 1) loads each tap with plain vector loads, in a loop
       the compiler unrolls; edge tiles go through load_cols */
    const int iw0 = ow0 * SW_ - pl;
    const int inner = SW_ == 1 && iw0 >= 0 && iw0 + TN + (KW_ - 1) * DW_ <= W;
    const int cch = max(1, FLUSH_TAPS / KHW);  /* input channels between folds into the totals */
    for (int c0 = 0; c0 < CinG; c0 += cch) {
        const int c1 = min(CinG, c0 + cch);
        for (int ci = c0; ci < c1; ci++) {
            for (int kh = 0; kh < KH_; kh++) {
                const int ih = oh * SH_ - pt + kh * DH_;
                const __global wstore_t *wp = wb + ci * KHW + kh * KW_;
                if (ih < 0 || ih >= H) {
                    if (wbad) {
                        const float16 z0 = 0.0f;
                        for (int kw = 0; kw < KW_; kw++) FMA_TILE(wp + kw, ws, z0, z0)
                    }
                    continue;
                }
                const __global float *row = xb + ((long)ci * H + ih) * W;
                if (inner) {
                    const __global float *rp = row + iw0;
#if TN > 16
                    for (int kw = 0; kw < KW_; kw++)
                        FMA_TILE(wp + kw, ws, vload16(0, rp + kw * DW_), vload16(0, rp + kw * DW_ + 16))
#else
                    for (int kw = 0; kw < KW_; kw++)
                        FMA_TILE(wp + kw, ws, vload16(0, rp + kw * DW_), 0.0f)
#endif
                } else {
                    for (int kw = 0; kw < KW_; kw++) {
                        float16 v0, v1;
                        load_cols(row, iw0 + kw * DW_, SW_, W, &v0, &v1);
                        FMA_TILE(wp + kw, ws, v0, v1)
                    }
                }
            }
        }
        FLUSH
    }
    __global float *yb = y + y_off + (((long)n * G * CoutG + g * CoutG + co0) * OH + oh) * OW;
    STORE_ALL(yb, (long)OH * OW, ow0, 1, min(TN, OW - ow0))
}

__kernel void conv_t2d_direct(__global const float *x, const long x_off, __global const wstore_t *w, const long w_off,
                              __global float *y, const long y_off, __global const float *bias, const int has_bias,
                              const int C, const int H, const int W, const int CoutG, const int CinG,
                              const int KH, const int KW, const int G, const int OH, const int OW,
                              const int sh, const int sw, const int ph, const int pw, const int dh, const int dw,
                              const int ncob)
{
    const int j0 = get_global_id(0) * TN, ohr = get_global_id(1), z = get_global_id(2);
    const int oh = ohr / SW_, r = ohr - oh * SW_;
    if (oh >= OH || r >= OW) return;
    const int J = (OW - r + SW_ - 1) / SW_;  /* outputs in this phase */
    if (j0 >= J) return;
    const int cob = z % ncob, ng = z / ncob, g = ng % G, n = ng / G;
    const int co0 = cob * DCO, nco = min(DCO, CoutG - co0);
    const int KHW = KH_ * KW_;
    WS_DECL(ws, KHW)
    const __global wstore_t *wb = w + w_off + ((long)g * CinG * CoutG + co0) * KHW;
    const __global float *xb = x + x_off + ((long)n * C + g * CinG) * H * W;
    DECL_ACC
    int taps = 0;
    for (int ci = 0; ci < CinG; ci++) {
        for (int kh = 0; kh < KH_; kh++) {
            const int th = oh + ph - kh * DH_;
            if (th < 0) continue;
            const int ih = th / SH_;
            if (ih * SH_ != th || ih >= H) continue;
            const __global float *row = xb + ((long)ci * H + ih) * W;
            const __global wstore_t *wp = wb + (long)ci * CoutG * KHW + kh * KW_;
            for (int kw = 0; kw < KW_; kw++) {
                const int tw = r + pw - kw * DW_;
                const int q = tw >= 0 ? tw / SW_ : -((-tw + SW_ - 1) / SW_);
                if (q * SW_ != tw) continue;
                float16 v0, v1;
                load_cols(row, j0 + q, 1, W, &v0, &v1);
                FMA_TILE(wp + kw, ws, v0, v1)
                taps++;
            }
        }
        if (taps >= FLUSH_TAPS) { taps = 0; FLUSH }
    }
    __global float *yb = y + y_off + (((long)n * G * CoutG + g * CoutG + co0) * OH + oh) * OW + r;
    STORE_ALL(yb, (long)OH * OW, j0, SW_, min(TN, J - j0))
}
