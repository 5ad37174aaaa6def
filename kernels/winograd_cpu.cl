/* CPU-family Winograd F(2x2, 3x3) convolution (Lavin & Gray 2015), OpenCL only.

   3x3, stride 1, dilation 1, ungrouped conv with many channels:
     U[e] = (G g Gt)[e]          per (cout, cin), e = 4*a + b over the 4x4 transformed tile
     V[e] = (Bt d B)[e]          per (cin, tile), d = the 4x4 input patch of a 2x2 output tile
     M[e] = U[e] (Cout x Cin) . V[e] (Cin x tiles)     16 GEMMs through gemm_cpu (batched)
     y    = At M A (+ bias)      per (cout, tile)
   2.25x fewer multiplies than direct; the transforms only add, subtract and halve.

   wino_filter : w (Cout, Cin, 3, 3) -> U in gemm_cpu's packed-A layout, batch e:
                 Up[e][ceil(Cout/MR)][Cin][MR] (rows past Cout zero).
                 Launch: global (ceil(Cin/PK), ceil(Cout/MR)), local (1, 1).
   wino_in     : x (N, C, H, W) -> V in gemm_cpu's packed-B layout, batch e:
                 Vp[e][ceil(ntl/32)][C][32] for tiles [t0, t0 + ntl) of the (n, ty, tx) tile space
                 (tiles past the end zero): the (C x 32) block of element e and 32-tile group nt at
                 Vp + e * estride + nt * gstride (gemm_cpu's panels: gstride 32 C, estride ceil(ntl/32)
                 gstride; the weight gradient's wino_wgemm, winograd_wgrad_cpu.cl, reads a channel's row
                 across groups, and a gstride of a multiple of 4 KiB would map every group to one L1 set:
                 it pads). Input rows/columns outside the image read as zero, so padding and odd output
                 sizes need no padded copy.
                 Launch: global (ceil(C/PK), ceil(ntl/32)), local (1, 1).
   wino_out    : M (16, Cout, ldm) (columns = tiles t0 ..) -> y (N, Cout, OH, OW) + bias (then a PReLU
                 with has_slope).
                 A work item does OB consecutive 32-tile groups of one output channel.
                 Launch: global (ceil(ceil(ntl/32)/OB), Cout), local (1, 1).
   wino_fused  : all of it for one 32-tile group a work item, V in local memory, up to 128 input channels
                 (below, at the kernel).
   wino_in and wino_fused read x, wino_out and wino_fused write y as stored (build options XDT / YDT,
   half_io.h): a float16 or bfloat16 activation needs no float32 copy, and y is rounded once, as a cast of
   the float32 result would.
*/
#ifndef MR
#define MR 12
#endif
#ifndef PK
#define PK 64
#endif
#define TN 32
#include "weight_load.h"
#ifndef OB
#define OB 4
#endif
#ifndef PFD
#define PFD 1  /* wino_in, wino_fused: a run's rows of the channel PFD ahead are prefetched (0: none) */
#endif
#include "panel_b.h"  /* BH: wino_in writes V as gemm_cpu's panels in two halves */
#ifndef NTS
#define NTS 0  /* wino_out16: y's full 16-float runs written with non-temporal stores where 64-byte aligned
                  (set by the backend for outputs larger than the caches: no read for ownership of lines
                  written whole, and the caches keep the input) */
#endif
#if defined(__clang__)  /* PoCL's compiler (and Intel's CPU runtime): clang's builtins */
#define WINO_PREFETCH(p) __builtin_prefetch(p)
#define WINO_NT_OK (NTS && YDT == 0)
#else
#define WINO_PREFETCH(p)
#define WINO_NT_OK 0
#endif
/* the flag word the transforms set on an Inf/NaN: a quiet NaN's bits, so that the flag read as a float is not
   finite (a recording's guard_finite checks it after a replay: backend/devices/opencl/replay.py) */
#define WINO_BAD 0x7fc00000

/* wino_filter's vectors: the panel's MR output channels in WF_VL lanes (the fewest of 4, 8, 16 that hold them: on AVX2
   MR 4 and 6 fill one register, not a 16-lane pair); WF_STORE writes the MR valid lanes: one vector store where MR is
   the width, two for MR 6 and 12, else through private memory one by one (a wider store would reach the next row's) */
#if MR > 16
#error "wino_filter: MR is at most 16 (one vector of the panel's rows)"
#endif
#if MR <= 4
#define WF_VL 4
#define wf_t float4
#define WF_V(p) vload4(0, p)
#define WF_VS(u, p) vstore4(u, 0, p)
#elif MR <= 8
#define WF_VL 8
#define wf_t float8
#define WF_V(p) vload8(0, p)
#define WF_VS(u, p) vstore8(u, 0, p)
#else
#define WF_VL 16
#define wf_t float16
#define WF_V(p) vload16(0, p)
#define WF_VS(u, p) vstore16(u, 0, p)
#endif
#if MR == WF_VL
#define WF_STORE(u, p) WF_VS(u, p)
#elif MR == 6
#define WF_STORE(u, p) { vstore4((u).lo, 0, p); vstore2((u).s45, 0, (p) + 4); }
#elif MR == 12
#define WF_STORE(u, p) { vstore8((u).lo, 0, p); vstore4((u).s89ab, 0, (p) + 8); }
#else
#define WF_STORE(u, p) { float us_[WF_VL]; WF_VS(u, us_); for (int i_ = 0; i_ < MR; i_++) (p)[i_] = us_[i_]; }
#endif

__kernel void wino_filter(__global const wstore_t *w, const long w_off, __global float *Up,
                          const int Cout, const int Cin, __global int *bad WQ_PARAMS)
{
    /* vectorised over the MR output channels of the panel (lanes past MR or Cout are zero) */
    const int c0 = get_global_id(0) * PK, mt = get_global_id(1);
    if (c0 >= Cin) return;
    const int c1 = min(Cin, c0 + PK);
    const int mtiles = (Cout + MR - 1) / MR;
    const long estride = (long)mtiles * Cin * MR;
    const int nvalid = min(MR, Cout - mt * MR);
    __global float *dst = Up + (long)mt * Cin * MR;
    const long wb = w_off + (long)mt * MR * Cin * 9;
    const long rs = (long)Cin * 9;
    wf_t acc = 0.0f;  /* sum of every transformed value: not finite iff an Inf/NaN was read (or overflow) */
    for (int ci = c0; ci < c1; ci++) {
        float gs[9][WF_VL];
#if WDT > 2  /* quantized: each row's 9 taps decoded in runs of one block (its scale read once) */
        for (int i = 0; i < WF_VL; i++) {
            float t9[9];
            if (i < nvalid) {
                const long e = wb + i * rs + ci * 9;
                for (int k = 0; k < 9;) {
                    const int n = min(32 - (int)((e + k) & 31), 9 - k);
                    qd_run(w, e + k, n, t9 + k, wscale, wq_k);
                    k += n;
                }
            }
            for (int k = 0; k < 9; k++) gs[k][i] = i < nvalid ? t9[k] : 0.0f;
        }
#else  /* row by row: each row's 9 taps are consecutive (read along the row, not across the rows per tap) */
        if (nvalid == MR) {
            _Pragma("unroll") for (int i = 0; i < MR; i++) {
                const long e = wb + i * rs + ci * 9;
                _Pragma("unroll") for (int k = 0; k < 9; k++) gs[k][i] = LOADW(w, e + k);
            }
        } else {
            for (int i = 0; i < MR; i++) {
                const long e = wb + i * rs + ci * 9;
                for (int k = 0; k < 9; k++) gs[k][i] = i < nvalid ? LOADW(w, e + k) : 0.0f;
            }
        }
        _Pragma("unroll") for (int i = MR; i < WF_VL; i++)
            _Pragma("unroll") for (int k = 0; k < 9; k++) gs[k][i] = 0.0f;
#endif
        wf_t t[4][3];
        _Pragma("unroll") for (int j = 0; j < 3; j++) {  /* rows: G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] */
            const wf_t g0 = WF_V(gs[j]), g1 = WF_V(gs[3 + j]), g2 = WF_V(gs[6 + j]);
            t[0][j] = g0;
            t[1][j] = 0.5f * ((g0 + g2) + g1);
            t[2][j] = 0.5f * ((g0 + g2) - g1);
            t[3][j] = g2;
        }
        __global float *o = dst + (long)ci * MR;
        _Pragma("unroll") for (int a = 0; a < 4; a++) {
            const wf_t h0 = t[a][0], h1 = t[a][1], h2 = t[a][2];
            wf_t u[4];
            u[0] = h0;
            u[1] = 0.5f * ((h0 + h2) + h1);
            u[2] = 0.5f * ((h0 + h2) - h1);
            u[3] = h2;
            acc += (u[0] + u[1]) + (u[2] + u[3]);
            _Pragma("unroll") for (int b = 0; b < 4; b++) WF_STORE(u[b], o + (4 * a + b) * estride);
        }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
}

/* Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] */
#define BT(d0, d1, d2, d3, o0, o1, o2, o3) { o0 = d0 - d2; o1 = d1 + d2; o2 = d2 - d1; o3 = d1 - d3; }

/* A 32-tile group of the input transform: per lane the offset of its patch's top-left (may be outside the
   image) and which of its 4 rows / 4 columns lie inside (bit masks; a dead lane has none). */
typedef struct {
    int base[TN], rok[TN], cok[TN];
    int inside;  /* every patch wholly inside the image */
    int run;     /* the 32 patches side by side in one tile row (base[j] = base[0] + 2j) */
    int ix0;     /* the first patch's first column (a run crossing the image's left or right edge) */
} wino_group_t;

inline __attribute__((always_inline)) void wino_group_setup(wino_group_t *g, const int C, const int H, const int W,
        const int pt, const int pl, const int th, const int tw, const int t0, const int ntl, const int nt)
{
    /* int offsets: the backend only takes this path for inputs below 2^31 elements */
    const int HW = H * W, tpi = th * tw;
    int t = t0 + nt * TN;
    int n = t / tpi, r = t - n * tpi, ty = r / tw, tx = r - ty * tw;
    g->inside = 1;
    g->run = 1;
    g->ix0 = 0;
    for (int j = 0; j < TN; j++) {
        const int live = nt * TN + j < ntl;
        const int iy = 2 * ty - pt, ix = 2 * tx - pl;
        if (j == 0) g->ix0 = ix;
        int rm = 0, cm = 0;
        for (int a = 0; a < 4; a++) {
            rm |= ((uint)(iy + a) < (uint)H) << a;
            cm |= ((uint)(ix + a) < (uint)W) << a;
        }
        g->rok[j] = live ? rm : 0;
        g->cok[j] = cm;
        g->inside &= (g->rok[j] == 15) & (cm == 15);
        g->base[j] = live ? n * C * HW + iy * W + ix : 0;
        g->run &= g->base[j] == g->base[0] + 2 * j;
        if (++tx == tw) { tx = 0; if (++ty == th) { ty = 0; n++; } }
    }
}

/* A run's 4 rows of one channel (xc: its plane) towards the cache, a line at a time: a group reads 4 x 66 values of
   each channel, 64 short runs across the input that the hardware prefetchers do not follow (measured on a
   2-core AVX2 EPYC, with NTS: 1x16x512^2 16 -> 16 18.6 -> 14.7 ms, 1x16x256^2 6.9 -> 4.7) */
inline __attribute__((always_inline)) void wino_prefetch_channel(const __global xstore_t *xc, const wino_group_t *g,
                                                                 const int W)
{
#if PFD > 0
    if (!g->run) return;
    const __global xstore_t *rp = xc + g->base[0];
    for (int a = 0; a < 4; a++)
        if ((g->rok[0] >> a) & 1)
            for (int k = 0; k < 2 * TN + 2; k += 64 / (int)sizeof(xstore_t)) WINO_PREFETCH(rp + a * W + k);
#endif
}

#if XDT == 0 && defined(WD)
/* WD: one 16-tile half (h) of a float32 run wholly inside the image, its 4 rows read straight from x (xr: the run's
   first value; a copy into private memory first made each 16-float read at offsets 1-3 wait on the 8-float stores it
   spans), as wino_in_channel's v[h]: lane j of column b is row value 32h + 2j + b, the second 8 lanes as the odd lanes
   of a read 15 further on (a read 16 further on would reach one value past the run); the loops unrolled, so the
   values stay in registers */
inline __attribute__((always_inline)) void wino_in_run_half(const __global float *xr, const int W, const int h,
                                                            float16 o[4][4])
{
    float16 q[4][4];
    _Pragma("unroll") for (int b = 0; b < 4; b++) {
        float16 w4[4];
        _Pragma("unroll") for (int a = 0; a < 4; a++) {
            const __global float *sp = xr + a * W + 32 * h + b;
            w4[a] = (float16)(vload16(0, sp).even, vload16(0, sp + 15).odd);
        }
        BT(w4[0], w4[1], w4[2], w4[3], q[0][b], q[1][b], q[2][b], q[3][b])
    }
    _Pragma("unroll") for (int a = 0; a < 4; a++) BT(q[a][0], q[a][1], q[a][2], q[a][3], o[a][0], o[a][1], o[a][2], o[a][3])
}
#endif

/* V = Bt d B of one channel (xc: its plane) for the group's 32 tiles: v[h][a][b] lanes = tiles 16h .. 16h + 15 */
inline __attribute__((always_inline)) void wino_in_channel(const __global xstore_t *xc, const wino_group_t *g,
                                                           const int W, float16 v[2][4][4])
{
    xraw_t d[4][4][TN];  /* as stored (a half input converted 16 lanes at once below) */
    xraw_t rr[4][2 * TN + 4];  /* a run's 4 rows (66 values each; 2 more: the last odd lane's vector read) */
#if XDT == 0 && defined(WD)
    if (g->run && g->inside) {  /* a float32 run inside the image, read straight from x */
        for (int h = 0; h < 2; h++) wino_in_run_half(xc + g->base[0], W, h, v[h]);
        return;
    }
#endif
    if (g->run) {  /* each of the 4 rows read once, contiguously; at the image's edge, columns outside as zeros */
        for (int a = 0; a < 4; a++) {
            const __global xstore_t *rp = xc + g->base[0] + a * W;
            if (g->inside) {
                for (int k = 0; k < 2 * TN + 2; k++) rr[a][k] = XRAW(rp, k);
            } else if ((g->rok[0] >> a) & 1) {  /* the columns inside as one plain copy (a select per value became a
                                                    masked gather, which microcode makes slow on some Intel cores) */
                const int klo = max(0, -g->ix0), khi = min(2 * TN + 2, W - g->ix0);
                for (int k = 0; k < 2 * TN + 2; k++) rr[a][k] = (xraw_t)0;
                for (int k = klo; k < khi; k++) rr[a][k] = XRAW(rp, k);
            } else {
                for (int k = 0; k < 2 * TN + 2; k++) rr[a][k] = (xraw_t)0;
            }
        }
    } else if (g->inside) {
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int j = 0; j < TN; j++) d[a][b][j] = XRAW(xc, g->base[j] + a * W + b);
    } else {
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int j = 0; j < TN; j++)
                    d[a][b][j] = ((g->rok[j] >> a) & (g->cok[j] >> b) & 1) ? XRAW(xc, g->base[j] + a * W + b) : (xraw_t)0;
    }
    for (int h = 0; h < 2; h++) {
        float16 q[4][4], *o[4] = {v[h][0], v[h][1], v[h][2], v[h][3]};
        float16 w[4][4];
        if (g->run) {  /* lane j of column b: row value 2j + b, the even lanes of two vector reads */
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) {
                    const xraw_t *sp = rr[a] + 32 * h + b;
                    w[a][b] = XCVT16((xraw16_t)(vload16(0, sp).even, vload16(1, sp).even));
                }
        } else {
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) w[a][b] = XCVT16(vload16(h, d[a][b]));
        }
        for (int b = 0; b < 4; b++) BT(w[0][b], w[1][b], w[2][b], w[3][b], q[0][b], q[1][b], q[2][b], q[3][b])
        for (int a = 0; a < 4; a++) BT(q[a][0], q[a][1], q[a][2], q[a][3], o[a][0], o[a][1], o[a][2], o[a][3])
    }
}

__kernel void wino_in(__global const xstore_t *x, const long x_off, __global float *Vp,
                      const int C, const int H, const int W, const int pt, const int pl,
                      const int th, const int tw, const int t0, const int ntl, __global int *bad,
                      const long gstride, const long estride)
{
    const int c0 = get_global_id(0) * PK, nt = get_global_id(1);
    if (c0 >= C) return;
    const int c1 = min(C, c0 + PK);
    wino_group_t g;
    wino_group_setup(&g, C, H, W, pt, pl, th, tw, t0, ntl, nt);
    x += x_off;
    __global float *dst = Vp + nt * gstride;
    float16 acc = 0.0f;  /* sum of every transformed value: not finite iff an Inf/NaN was read (or overflow) */
    for (int ci = c0; ci < c1; ci++) {
        float16 v[2][4][4];
        if (ci + PFD < c1) wino_prefetch_channel(x + (ci + PFD) * H * W, &g, W);
        wino_in_channel(x + ci * H * W, &g, W, v);
        for (int h = 0; h < 2; h++) {
            __global float *o = dst + PANEL_BOFF(ci, 16 * h, C);  /* the panel's C rows (panel_b.h) */
            for (int a = 0; a < 4; a++) {
                acc += (v[h][a][0] + v[h][a][1]) + (v[h][a][2] + v[h][a][3]);
                for (int b = 0; b < 4; b++) vstore16(v[h][a][b], 0, o + (4 * a + b) * estride);
            }
        }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
}

/* At = [1 1 1 0; 0 1 -1 -1]: y = At m A + bias (then v > 0 ? v : v * sl where has_slope, a PReLU) for 16
   tiles of one output channel, m[e] lanes = the tiles; the tiles from t (counted in the (n, ty, tx) tile
   space), nvalid of them live. 16 tiles side by side, all inside: their two output rows written as 32
   contiguous values each. */
inline __attribute__((always_inline)) void wino_out16(const float16 m[16], const float bv, const int has_slope,
        const float sl, __global ystore_t *y, const long y_co /* y_off + co * OH * OW */, const int Cout,
        const int OH, const int OW, const int th, const int tw, const int t, const int nvalid)
{
#define WPRELU(v) (has_slope ? select((v) * sl, (v), isgreater((v), (float16)0.0f)) : (v))
    float16 r0[4], r1[4];
    for (int b = 0; b < 4; b++) {
        r0[b] = m[b] + m[4 + b] + m[8 + b];
        r1[b] = m[4 + b] - m[8 + b] - m[12 + b];
    }
    float res[4][16];
    vstore16(WPRELU(r0[0] + r0[1] + r0[2] + bv), 0, res[0]);
    vstore16(WPRELU(r0[1] - r0[2] - r0[3] + bv), 0, res[1]);
    vstore16(WPRELU(r1[0] + r1[1] + r1[2] + bv), 0, res[2]);
    vstore16(WPRELU(r1[1] - r1[2] - r1[3] + bv), 0, res[3]);
#undef WPRELU
    const int tpi = th * tw;
    const long OHW = (long)OH * OW;
    int n = t / tpi, r = t - n * tpi, ty = r / tw, tx = r - ty * tw;
    if (nvalid == 16 && tx + 16 <= tw && 2 * (tx + 16) <= OW && 2 * ty + 2 <= OH) {
        __global ystore_t *yp = y + y_co + (long)n * Cout * OHW + (long)(2 * ty) * OW + 2 * tx;
        const uint16 zip = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        for (int q = 0; q < 2; q++)  /* tile j's two columns at 2j, 2j + 1: 8 tiles interleaved a vector */
            for (int hh = 0; hh < 2; hh++) {
                const float16 o = shuffle2(vload8(hh, res[2 * q]), vload8(hh, res[2 * q + 1]), zip);
#if WINO_NT_OK
                __global float *op = yp + q * OW + 16 * hh;
                if (((ulong)op & 63) == 0) { __builtin_nontemporal_store(o, (__global float16 *)op); continue; }
#endif
                STOREY16(yp + q * OW, 16 * hh, o);
            }
        return;
    }
    for (int j = 0; j < nvalid; j++) {
        const int oy = 2 * ty, ox = 2 * tx;
        __global ystore_t *yp = y + y_co + (long)n * Cout * OHW + (long)oy * OW + ox;
        const int two_x = ox + 1 < OW;
        STOREY(yp, 0, res[0][j]);
        if (two_x) STOREY(yp, 1, res[1][j]);
        if (oy + 1 < OH) {
            STOREY(yp, OW, res[2][j]);
            if (two_x) STOREY(yp, OW + 1, res[3][j]);
        }
        if (++tx == tw) { tx = 0; if (++ty == th) { ty = 0; n++; } }
    }
}

__kernel void wino_out(__global const float *Mb, const int ldm, const long m_es,
                       __global ystore_t *y, const long y_off, __global const float *bias, const int has_bias,
                       const int Cout, const int OH, const int OW, const int th, const int tw,
                       const int t0, const int ntl, __global const float *slope, const long s_off,
                       const int has_slope)
{
    const int co = get_global_id(1);
    const int g0 = get_global_id(0) * OB;
    const int ngroups = (ntl + TN - 1) / TN;
    const float bv = has_bias ? bias[co] : 0.0f;
    const float sl = has_slope ? slope[s_off + co] : 1.0f;
    for (int g = g0; g < min(ngroups, g0 + OB); g++) {
        const __global float *mp = Mb + (long)co * ldm + g * TN;
        for (int h = 0; h < 2; h++) {
            const int nvalid = min(16, ntl - g * TN - 16 * h);
            if (nvalid <= 0) break;
            float16 m[16];
            if (nvalid == 16) {
                for (int e = 0; e < 16; e++) m[e] = vload16(h, mp + e * m_es);
            } else {
                for (int e = 0; e < 16; e++) {
                    float tmp[16];
                    for (int j = 0; j < 16; j++) tmp[j] = j < nvalid ? mp[e * m_es + 16 * h + j] : 0.0f;
                    m[e] = vload16(0, tmp);
                }
            }
            wino_out16(m, bv, has_slope, sl, y, y_off + co * (long)OH * OW, Cout, OH, OW, th, tw, t0 + g * TN + 16 * h,
                       nvalid);
        }
    }
}

/* wino_fused: the whole conv of one 32-tile group in one work item, for convs whose transformed group
   (16 x C x 32 floats) fits the work group's local memory (C up to 128: 256 KiB): the input transform of
   every channel into local memory (wino_in's, never written to global memory), then for each block of MR
   output channels of the slice and each 16 tiles the 16 products M[e] = U[e] (MR x C, packed as
   wino_filter writes it) . V[e] (C x 16) in MR float16 accumulators (gemm_cpu's MR x 16 tile with NH 2,
   folded into the private block every KP channels), and At M A + bias (+ PReLU) straight to y.
   gemm_cpu + wino_out wrote and read back the products (16 x Cout x tiles floats), and wino_in its
   16 x C x tiles transformed values: 16x32x64x64 32 -> 32 on a 2-core AVX2 EPYC, medians of 15 in one
   process, 15.3 -> 10.6 ms (process CPU time 25.9 -> 20.2 ms), the same bits.
   Up[e][ceil(cc/MR)][C][MR] (e stride up_es); y, bias, slope as wino_out (channel co of the slice at
   y_off + co * OH * OW); Vl: 16 * C * 32 floats of local memory. Flags an Inf/NaN read (as wino_in).
   Launch: global (ceil(ntl/32)), local (1). */
__kernel void wino_fused(__global const xstore_t *x, const long x_off, __global const float *Up, const long up_es,
                         const int C, const int H, const int W, const int pt, const int pl, const int cc,
                         __global ystore_t *y, const long y_off, __global const float *bias, const int has_bias,
                         const int Cout, const int OH, const int OW, const int th, const int tw,
                         const int t0, const int ntl, __global const float *slope, const long s_off,
                         const int has_slope, __global int *bad, __local float *Vl)
{
#ifndef KP
#define KP 256
#endif
#ifndef H2
#define H2 0
#endif
#ifdef WC  /* the product loop over the input channels: unrolled whole where built for C (WC) */
#define WINO_C_LOOP(k) _Pragma("unroll") for (int k = 0; k < WC; k++)
#else
#define WINO_C_LOOP(k) for (int k = 0; k < C; k++)
#endif
    /* WC: the input channels C as a build constant (the host sets it to C, for few channels): the product loop is
       unrolled whole */
    const int nt = get_global_id(0);
    wino_group_t g;
    wino_group_setup(&g, C, H, W, pt, pl, th, tw, t0, ntl, nt);
    x += x_off;
    const int es = C * TN;  /* Vl[e][C][32] */
    float16 acc = 0.0f;
    for (int ci = 0; ci < C; ci++) {
        float16 v[2][4][4];
        if (ci + PFD < C) wino_prefetch_channel(x + (ci + PFD) * H * W, &g, W);
#if XDT == 0 && defined(WD)
        if (g.run && g.inside) {  /* each half straight into Vl (no v for both halves through private memory) */
            _Pragma("unroll") for (int h = 0; h < 2; h++) {
                float16 o[4][4];
                wino_in_run_half(x + ci * H * W + g.base[0], W, h, o);
                _Pragma("unroll") for (int a = 0; a < 4; a++) {
                    acc += (o[a][0] + o[a][1]) + (o[a][2] + o[a][3]);
                    _Pragma("unroll") for (int b = 0; b < 4; b++) vstore16(o[a][b], 0, Vl + (4 * a + b) * es + ci * TN + 16 * h);
                }
            }
            continue;
        }
#endif
        wino_in_channel(x + ci * H * W, &g, W, v);
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 4; a++) {
                acc += (v[h][a][0] + v[h][a][1]) + (v[h][a][2] + v[h][a][3]);
                for (int b = 0; b < 4; b++) vstore16(v[h][a][b], 0, Vl + (4 * a + b) * es + ci * TN + 16 * h);
            }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
    for (int mt = 0; mt * MR < cc; mt++) {
        const int cbase = mt * MR;
        const int nco = min(MR, cc - cbase);
        const __global float *ub = Up + (long)mt * C * MR;
#if H2
        /* both 16-tile halves at once (the host sets H2 where C is one block, C <= KP): per channel two loads of V and
           MR broadcasts of U feed 2 * MR sums (per half: one load and MR broadcasts for MR) */
        float16 m2[2][MR][16];
        for (int e = 0; e < 16; e++) {
            const __global float *up = ub + e * up_es;
            const __local float *vp = Vl + e * es;
            float16 s0[MR], s1[MR];
#pragma unroll
            for (int i = 0; i < MR; i++) { s0[i] = 0.0f; s1[i] = 0.0f; }
            WINO_C_LOOP(k) {
                const float16 b0 = vload16(0, vp + k * TN), b1 = vload16(0, vp + k * TN + 16);
                const __global float *ap = up + k * MR;
#pragma unroll
                for (int i = 0; i < MR; i++) {
                    const float16 a = (float16)ap[i];
                    s0[i] = fma(a, b0, s0[i]);
                    s1[i] = fma(a, b1, s1[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < MR; i++) { m2[0][i][e] = s0[i]; m2[1][i][e] = s1[i]; }
        }
        for (int h = 0; h < 2; h++) {
            const int j0 = nt * TN + 16 * h;
            if (j0 >= ntl) break;
            for (int i = 0; i < nco; i++) {
                const int co = cbase + i;
                wino_out16(m2[h][i], has_bias ? bias[co] : 0.0f, has_slope, has_slope ? slope[s_off + co] : 1.0f, y,
                           y_off + co * (long)OH * OW, Cout, OH, OW, th, tw, t0 + j0, min(16, ntl - j0));
            }
        }
        continue;
#endif
        for (int h = 0; h < 2; h++) {
            const int j0 = nt * TN + 16 * h;  /* the half's first tile, counted in the chunk */
            if (j0 >= ntl) break;
            float16 m[MR][16];
            for (int e = 0; e < 16; e++) {
                const __global float *up = ub + e * up_es;
                const __local float *vp = Vl + e * es + 16 * h;
                if (C <= KP) {  /* one block of channels (every fused conv on narrow vectors): the sums are the products,
                                   with no fold into m (the fold and its zeroing around a 16-channel loop cost 7% of a
                                   1x16x512^2 16 -> 16 conv) */
                    float16 s[MR];
#pragma unroll
                    for (int i = 0; i < MR; i++) s[i] = 0.0f;
                    WINO_C_LOOP(k) {
                        const float16 b = vload16(0, vp + k * TN);
                        const __global float *ap = up + k * MR;
#pragma unroll
                        for (int i = 0; i < MR; i++) s[i] = fma((float16)ap[i], b, s[i]);
                    }
#pragma unroll
                    for (int i = 0; i < MR; i++) m[i][e] = s[i];
                    continue;
                }
                for (int i = 0; i < MR; i++) m[i][e] = 0.0f;
                for (int k0 = 0; k0 < C; k0 += KP) {
                    const int k1 = min(C, k0 + KP);
                    float16 s[MR];
#pragma unroll
                    for (int i = 0; i < MR; i++) s[i] = 0.0f;
                    for (int k = k0; k < k1; k++) {
                        const float16 b = vload16(0, vp + k * TN);
                        const __global float *ap = up + k * MR;
#pragma unroll
                        for (int i = 0; i < MR; i++) s[i] = fma((float16)ap[i], b, s[i]);
                    }
#pragma unroll
                    for (int i = 0; i < MR; i++) m[i][e] += s[i];
                }
            }
            for (int i = 0; i < nco; i++) {
                const int co = cbase + i;
                wino_out16(m[i], has_bias ? bias[co] : 0.0f, has_slope, has_slope ? slope[s_off + co] : 1.0f, y,
                           y_off + co * (long)OH * OW, Cout, OH, OW, th, tw, t0 + j0, min(16, ntl - j0));
            }
        }
    }
}
