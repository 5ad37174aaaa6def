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
                 Vp + e * estride + nt * gstride. gemm_cpu's panels: gstride 32 C, estride ceil(ntl/32) gstride;
                 wino_gemm_out's: a group's 16 blocks side by side (estride 32 C, gstride 16 estride: one
                 stream of memory a work item); the weight gradient's wino_wgemm reads a channel's row across
                 groups, and a gstride of a multiple of 4 KiB would map every group to one L1 set (a pad). Input rows/columns outside the image read as zero, so
                 padding and odd output sizes need no padded copy.
                 Launch: global (ceil(C/PK), ceil(ntl/32)), local (1, 1).
   wino_out    : M (16, Cout, ldm) (columns = tiles t0 ..) -> y (N, Cout, OH, OW) + bias (then a PReLU
                 with has_slope).
                 A work item does OB consecutive 32-tile groups of one output channel.
                 Launch: global (ceil(ceil(ntl/32)/OB), Cout), local (1, 1).
   wino_in reads x and wino_out writes y as stored (build options XDT / YDT, half_io.h): a float16 or
   bfloat16 activation needs no float32 copy, and y is rounded once, as a cast of the float32 result would.
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
/* the flag word the transforms set on an Inf/NaN: a quiet NaN's bits, so that the flag read as a float is not
   finite (a recording's guard_finite checks it after a replay: backend/devices/opencl/replay.py) */
#define WINO_BAD 0x7fc00000

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
    float16 acc = 0.0f;  /* sum of every transformed value: not finite iff an Inf/NaN was read (or overflow) */
    for (int ci = c0; ci < c1; ci++) {
        float gs[9][16];
#if WDT > 2  /* quantized: each row's 9 taps decoded in runs of one block (its scale read once) */
        for (int i = 0; i < 16; i++) {
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
#else  /* row by row: each row's 9 taps are consecutive (read along the row, not across 16 rows per tap) */
        for (int i = 0; i < 16; i++) {
            const long e = wb + i * rs + ci * 9;
            for (int k = 0; k < 9; k++) gs[k][i] = i < nvalid ? LOADW(w, e + k) : 0.0f;
        }
#endif
        float16 t[4][3];
        for (int j = 0; j < 3; j++) {  /* rows: G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1] */
            const float16 g0 = vload16(0, gs[j]), g1 = vload16(0, gs[3 + j]), g2 = vload16(0, gs[6 + j]);
            t[0][j] = g0;
            t[1][j] = 0.5f * ((g0 + g2) + g1);
            t[2][j] = 0.5f * ((g0 + g2) - g1);
            t[3][j] = g2;
        }
        __global float *o = dst + (long)ci * MR;
        for (int a = 0; a < 4; a++) {
            const float16 h0 = t[a][0], h1 = t[a][1], h2 = t[a][2];
            float16 u[4];
            u[0] = h0;
            u[1] = 0.5f * ((h0 + h2) + h1);
            u[2] = 0.5f * ((h0 + h2) - h1);
            u[3] = h2;
            acc += (u[0] + u[1]) + (u[2] + u[3]);
            for (int b = 0; b < 4; b++) {
                __global float *ob = o + (4 * a + b) * estride;
                float us[16];
                vstore16(u[b], 0, us);
#if MR >= 8
                vstore8(vload8(0, us), 0, ob);
                for (int i = 8; i < MR; i++) ob[i] = us[i];
#else  /* a narrow panel (MR 4 or 6): 8 values would reach the next row's */
                for (int i = 0; i < MR; i++) ob[i] = us[i];
#endif
            }
        }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
}

/* Bt = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] */
#define BT(d0, d1, d2, d3, o0, o1, o2, o3) { o0 = d0 - d2; o1 = d1 + d2; o2 = d2 - d1; o3 = d1 - d3; }

__kernel void wino_in(__global const xstore_t *x, const long x_off, __global float *Vp,
                      const int C, const int H, const int W, const int pt, const int pl,
                      const int th, const int tw, const int t0, const int ntl, __global int *bad,
                      const long gstride, const long estride)
{
    /* int offsets: the backend only takes this path for inputs below 2^31 elements */
    const int c0 = get_global_id(0) * PK, nt = get_global_id(1);
    if (c0 >= C) return;
    const int c1 = min(C, c0 + PK);
    const int HW = H * W;
    x += x_off;
    /* per lane: offset of the patch's top-left (may be outside the image), and which of its
       4 rows / 4 columns lie inside (bit masks; a dead lane has none) */
    int base[TN], rok[TN], cok[TN];
    const int tpi = th * tw;
    int t = t0 + nt * TN;
    int n = t / tpi, r = t - n * tpi, ty = r / tw, tx = r - ty * tw;
    int inside = 1, run = 1;  /* run: the 32 patches side by side in one tile row (base[j] = base[0] + 2j) */
    int ix0 = 0;  /* the first patch's first column (a run crossing the image's left or right edge) */
    for (int j = 0; j < TN; j++) {
        const int live = nt * TN + j < ntl;
        const int iy = 2 * ty - pt, ix = 2 * tx - pl;
        if (j == 0) ix0 = ix;
        int rm = 0, cm = 0;
        for (int a = 0; a < 4; a++) {
            rm |= ((uint)(iy + a) < (uint)H) << a;
            cm |= ((uint)(ix + a) < (uint)W) << a;
        }
        rok[j] = live ? rm : 0;
        cok[j] = cm;
        inside &= (rok[j] == 15) & (cm == 15);
        base[j] = live ? n * C * HW + iy * W + ix : 0;
        run &= base[j] == base[0] + 2 * j;
        if (++tx == tw) { tx = 0; if (++ty == th) { ty = 0; n++; } }
    }
    __global float *dst = Vp + nt * gstride;
    float16 acc = 0.0f;  /* sum of every transformed value: not finite iff an Inf/NaN was read (or overflow) */
    for (int ci = c0; ci < c1; ci++) {
        const __global xstore_t *xc = x + ci * HW;
        xraw_t d[4][4][TN];  /* as stored (a half input converted 16 lanes at once below) */
        xraw_t rr[4][2 * TN + 4];  /* a run's 4 rows (66 values each; 2 more: the last odd lane's vector read) */
        if (run) {  /* each of the 4 rows read once, contiguously; at the image's edge, columns outside as zeros */
            for (int a = 0; a < 4; a++) {
                const __global xstore_t *rp = xc + base[0] + a * W;
                if (inside) {
                    for (int k = 0; k < 2 * TN + 2; k++) rr[a][k] = XRAW(rp, k);
                } else if ((rok[0] >> a) & 1) {
                    for (int k = 0; k < 2 * TN + 2; k++)
                        rr[a][k] = (uint)(ix0 + k) < (uint)W ? XRAW(rp, k) : (xraw_t)0;
                } else {
                    for (int k = 0; k < 2 * TN + 2; k++) rr[a][k] = (xraw_t)0;
                }
            }
        } else if (inside) {
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++)
                    for (int j = 0; j < TN; j++) d[a][b][j] = XRAW(xc, base[j] + a * W + b);
        } else {
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++)
                    for (int j = 0; j < TN; j++)
                        d[a][b][j] = ((rok[j] >> a) & (cok[j] >> b) & 1) ? XRAW(xc, base[j] + a * W + b) : (xraw_t)0;
        }
        for (int h = 0; h < 2; h++) {
            float16 v[4][4], q[4][4];
            if (run) {  /* lane j of column b: row value 2j + b, the even lanes of two vector reads */
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++) {
                        const xraw_t *sp = rr[a] + 32 * h + b;
                        v[a][b] = XCVT16((xraw16_t)(vload16(0, sp).even, vload16(1, sp).even));
                    }
            } else {
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++) v[a][b] = XCVT16(vload16(h, d[a][b]));
            }
            for (int b = 0; b < 4; b++) BT(v[0][b], v[1][b], v[2][b], v[3][b], q[0][b], q[1][b], q[2][b], q[3][b])
            for (int a = 0; a < 4; a++) BT(q[a][0], q[a][1], q[a][2], q[a][3], v[a][0], v[a][1], v[a][2], v[a][3])
            __global float *o = dst + (long)ci * TN + 16 * h;
            for (int a = 0; a < 4; a++) {
                acc += (v[a][0] + v[a][1]) + (v[a][2] + v[a][3]);
                for (int b = 0; b < 4; b++) vstore16(v[a][b], 0, o + (4 * a + b) * estride);
            }
        }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
}

/* At = [1 1 1 0; 0 1 -1 -1] */
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
    /* a PReLU after the bias (compile: a conv whose one reader is a PReLU): v > 0 ? v : v * slope[co] */
    const float sl = has_slope ? slope[s_off + co] : 1.0f;
#define WPRELU(v) (has_slope ? select((v) * sl, (v), isgreater((v), (float16)0.0f)) : (v))
    const int tpi = th * tw;
    const long OHW = (long)OH * OW;
    for (int g = g0; g < min(ngroups, g0 + OB); g++) {
        const __global float *mp = Mb + (long)co * ldm + g * TN;
        const int nvalid = min(TN, ntl - g * TN);
        float res[4][TN];
        for (int h = 0; h < 2; h++) {
            float16 m[4][4];
            if (nvalid == TN) {
                for (int e = 0; e < 16; e++) m[e / 4][e % 4] = vload16(h, mp + e * m_es);
            } else {
                for (int e = 0; e < 16; e++) {
                    float tmp[16];
                    for (int j = 0; j < 16; j++) tmp[j] = 16 * h + j < nvalid ? mp[e * m_es + 16 * h + j] : 0.0f;
                    m[e / 4][e % 4] = vload16(0, tmp);
                }
            }
            float16 r0[4], r1[4];
            for (int b = 0; b < 4; b++) {
                r0[b] = m[0][b] + m[1][b] + m[2][b];
                r1[b] = m[1][b] - m[2][b] - m[3][b];
            }
            vstore16(WPRELU(r0[0] + r0[1] + r0[2] + bv), 0, res[0] + 16 * h);
            vstore16(WPRELU(r0[1] - r0[2] - r0[3] + bv), 0, res[1] + 16 * h);
            vstore16(WPRELU(r1[0] + r1[1] + r1[2] + bv), 0, res[2] + 16 * h);
            vstore16(WPRELU(r1[1] - r1[2] - r1[3] + bv), 0, res[3] + 16 * h);
        }
        int t = t0 + g * TN;
        int n = t / tpi, r = t - n * tpi, ty = r / tw, tx = r - ty * tw;
        if (nvalid == TN && tx + TN <= tw && 2 * (tx + TN) <= OW && 2 * ty + 2 <= OH) {
            /* 32 tiles side by side, all inside: their two output rows written contiguously (64 values each) */
            __global ystore_t *yp = y + y_off + ((long)n * Cout + co) * OHW + (long)(2 * ty) * OW + 2 * tx;
            const uint16 zip = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
            for (int q = 0; q < 2; q++)  /* tile j's two columns at 2j, 2j + 1: 8 tiles interleaved a vector */
                for (int h = 0; h < 4; h++)
                    STOREY16(yp + q * OW, 16 * h, shuffle2(vload8(h, res[2 * q]), vload8(h, res[2 * q + 1]), zip));
            continue;
        }
        for (int j = 0; j < nvalid; j++) {
            const int oy = 2 * ty, ox = 2 * tx;
            __global ystore_t *yp = y + y_off + ((long)n * Cout + co) * OHW + (long)oy * OW + ox;
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
}


/* wino_gemm_out: the 16 products and the output transform in one kernel, for convs whose transformed input
   of one 32-tile group (16 x C x 32 floats) stays in L2 (C up to 128): a work item takes MR output channels
   of the slice and one 32-tile group, 16 tiles at a time: for each e the MR x 16 block
   M[e] = U[e] (MR x C, packed as wino_filter writes it) . V[e] (C x 16 of the group, as wino_in writes it),
   MR float16 accumulators (gemm_cpu's MR x 16 tile with NH 2; folded into the private block every KP
   channels), then At M A + bias (+ PReLU) from the private block straight to y. The product M never
   goes through memory (gemm_cpu + wino_out write and read back 16 x Cout x tiles floats).
   Up[e][ceil(cc/MR)][C][MR] (e stride up_es), Vp[ceil(ntl/32)][e][C][32] (e stride v_es = 32 C, a group's 16
   blocks side by side: wino_in's gstride 16 v_es); y, bias, slope as
   wino_out (channel co of the slice at y_off + co * OH * OW).
   A work item takes WMT such blocks of MR channels one after another.
   Launch: global (ceil(ceil(cc/MR)/WMT), ceil(ntl/32)), local (1, 1). */
__kernel void wino_gemm_out(__global const float *Up, const long up_es, __global const float *Vp, const long v_es,
                            const int C, const int cc,
                            __global ystore_t *y, const long y_off, __global const float *bias, const int has_bias,
                            const int Cout, const int OH, const int OW, const int th, const int tw,
                            const int t0, const int ntl, __global const float *slope, const long s_off,
                            const int has_slope)
{
#ifndef KP
#define KP 256
#endif
#ifndef WMT
#define WMT 8  /* MR-row blocks one work item takes, one after another (PoCL's cost per work group is ~1 us) */
#endif
    const int nt = get_global_id(1);
    const int tpi = th * tw;
    const long OHW = (long)OH * OW;
    const __global float *vb = Vp + nt * 16 * v_es;
    for (int mt = get_global_id(0) * WMT; mt < min((cc + MR - 1) / MR, (int)(get_global_id(0) + 1) * WMT); mt++) {
    const int cbase = mt * MR;
    const int nco = min(MR, cc - cbase);
    const __global float *ub = Up + (long)mt * C * MR;
    for (int h = 0; h < 2; h++) {
        const int j0 = nt * TN + 16 * h;  /* the half's first tile, counted in the chunk */
        if (j0 >= ntl) break;
        const int nvalid = min(16, ntl - j0);
        float16 m[16][MR];
        for (int e = 0; e < 16; e++) {
            const __global float *up = ub + e * up_es, *vp = vb + e * v_es + 16 * h;
            for (int i = 0; i < MR; i++) m[e][i] = 0.0f;
            for (int k0 = 0; k0 < C; k0 += KP) {
                const int k1 = min(C, k0 + KP);
                float16 acc[MR];
#pragma unroll
                for (int i = 0; i < MR; i++) acc[i] = 0.0f;
                for (int k = k0; k < k1; k++) {
                    const float16 b = vload16(0, vp + k * TN);
                    const __global float *ap = up + k * MR;
#pragma unroll
                    for (int i = 0; i < MR; i++) acc[i] = fma((float16)ap[i], b, acc[i]);
                }
#pragma unroll
                for (int i = 0; i < MR; i++) m[e][i] += acc[i];
            }
        }
        int t = t0 + j0;
        const int n0 = t / tpi, r0 = t - n0 * tpi, ty0 = r0 / tw, tx0 = r0 - ty0 * tw;
        const int run = nvalid == 16 && tx0 + 16 <= tw && 2 * (tx0 + 16) <= OW && 2 * ty0 + 2 <= OH;
        for (int i = 0; i < nco; i++) {
            const int co = cbase + i;
            const float bv = has_bias ? bias[co] : 0.0f;
            const float sl = has_slope ? slope[s_off + co] : 1.0f;
            float16 r0v[4], r1v[4];
            for (int b = 0; b < 4; b++) {
                r0v[b] = m[b][i] + m[4 + b][i] + m[8 + b][i];
                r1v[b] = m[4 + b][i] - m[8 + b][i] - m[12 + b][i];
            }
            float res[4][16];
            vstore16(WPRELU(r0v[0] + r0v[1] + r0v[2] + bv), 0, res[0]);
            vstore16(WPRELU(r0v[1] - r0v[2] - r0v[3] + bv), 0, res[1]);
            vstore16(WPRELU(r1v[0] + r1v[1] + r1v[2] + bv), 0, res[2]);
            vstore16(WPRELU(r1v[1] - r1v[2] - r1v[3] + bv), 0, res[3]);
            if (run) {  /* 16 tiles side by side, all inside: two output rows of 32 values */
                __global ystore_t *yp = y + y_off + ((long)n0 * Cout + co) * OHW + (long)(2 * ty0) * OW + 2 * tx0;
                const uint16 zip = (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
                for (int q = 0; q < 2; q++)
                    for (int hh = 0; hh < 2; hh++)
                        STOREY16(yp + q * OW, 16 * hh, shuffle2(vload8(hh, res[2 * q]), vload8(hh, res[2 * q + 1]), zip));
                continue;
            }
            int n = n0, ty = ty0, tx = tx0;
            for (int j = 0; j < nvalid; j++) {
                const int oy = 2 * ty, ox = 2 * tx;
                __global ystore_t *yp = y + y_off + ((long)n * Cout + co) * OHW + (long)oy * OW + ox;
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
    }
    }  /* mt */
}
