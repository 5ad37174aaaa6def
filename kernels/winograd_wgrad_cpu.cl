/* CPU-family Winograd F(2x2, 3x3) weight gradient (OpenCL only), the adjoint of winograd_cpu.cl's forward.

   The forward is y_tile = At [(G g Gt) . (Bt d B)] A per 4x4 input patch d of a 2x2 output tile; it is
   linear in g, so for the gradient dy of y:
     dW[co][ci] = Gt [ sum over tiles of (A dy[co] At) . (Bt d[ci] B) ] G
   with dy the tile's 2x2 gradient (zero past OH / OW). Per transformed element e = 4*a + b the sum over
   tiles is a product of two (channels x tiles) matrices: 16 products of K = tiles, 16 multiplies a tile
   and channel pair where the direct weight gradient takes 36 (9 taps x 2x2 outputs).

   winograd_cpu.cl's wino_in writes V = Bt d B as Vp[e][ceil(ntl/32)][C][32] (32 tiles side by side in one
   row of a channel); wino_gy writes U = A dy At the same way, Ug[e][ceil(ntl/32)][Cout][32]. Both zero the
   tiles past ntl, and both leave gpad floats after each 32-tile group: a channel's row is read across the
   groups, and a group stride of a multiple of 4 KiB (32 channels) put every group's line in one L1 set
   (16x32x64x64 32 -> 32, the whole gradient, medians of 11 in one process: 15.2 -> 14.5 ms). wino_wgemm then sums U[e][co][t] * V[e][ci][t] over the chunk's tiles with the tiles in
   the vector lanes (no transpose of either operand), and wino_wgrad_out sums the chunks' (16, Cout, Cin)
   partial products in order and applies Gt . G.

   wino_gy     : dy (N, Cout, OH, OW) -> Ug, tiles [t0, t0 + ntl) of the (n, ty, tx) tile space.
                 Launch: global (ceil(Cout/PK), ceil(ntl/32)), local (1, 1). Flags an Inf/NaN (as wino_in).
   wino_wgemm  : part[p_off + (e*Cout + co)*Cin + ci] = sum over the chunk's tiles; a work item takes RM
                 output channels of one e, every input channel RN at a time, VW tiles a vector step
                 (VW 8: 8 accumulators and 6 operands in AVX2's 16 registers). Sums are folded into a
                 second-level total every KG 32-tile groups (FP32 precision on long chunks).
                 Launch: global (ceil(Cout/RM), 16), local (1, 1).
   wino_wgrad_out : part (nchunks, 16, Cout, Cin) -> dW (Cout, Cin, 3, 3).
                 Launch: global (Cout * Cin), local (1).
*/
#ifndef PK
#define PK 64
#endif
#ifndef RM
#define RM 4
#endif
#ifndef RN
#define RN 2
#endif
#ifndef VW
#define VW 8
#endif
#ifndef KG
#define KG 8
#endif
#define TN 32
#define WINO_BAD 0x7fc00000

#if VW == 16
typedef float16 vw_t;
#define VLOADW vload16
#elif VW == 8
typedef float8 vw_t;
#define VLOADW vload8
#else
#error "VW is 8 or 16"
#endif

/* A = [1 0; 1 1; 1 -1; 0 -1]: (A r)[0..3] = r0, r0 + r1, r0 - r1, -r1 */
#define AT2(r0, r1, o0, o1, o2, o3) { o0 = r0; o1 = r0 + r1; o2 = r0 - r1; o3 = -(r1); }

__kernel void wino_gy(__global const float *gy, const long g_off, __global float *Ug,
                      const int Cout, const int OH, const int OW, const int th, const int tw,
                      const int t0, const int ntl, __global int *bad, const int gpad)
{
    const int c0 = get_global_id(0) * PK, nt = get_global_id(1);
    if (c0 >= Cout) return;
    const int c1 = min(Cout, c0 + PK);
    const int ntiles = (ntl + TN - 1) / TN;
    const long gstride = (long)Cout * TN + gpad;
    const long estride = ntiles * gstride;
    const long OHW = (long)OH * OW;
    gy += g_off;
    /* per lane: the tile's first output (row, column) offset, and which of its 2 rows / 2 columns exist */
    long base[TN];
    int rok[TN], cok[TN];
    const int tpi = th * tw;
    int t = t0 + nt * TN;
    int n = t / tpi, r = t - n * tpi, ty = r / tw, tx = r - ty * tw;
    int run = 1;  /* the 32 tiles side by side in one tile row, all inside: two rows of 64 values */
    for (int j = 0; j < TN; j++) {
        const int live = nt * TN + j < ntl;
        const int oy = 2 * ty, ox = 2 * tx;
        rok[j] = live ? (1 | ((oy + 1 < OH) << 1)) : 0;
        cok[j] = 1 | ((ox + 1 < OW) << 1);
        base[j] = live ? (long)n * Cout * OHW + (long)oy * OW + ox : 0;
        run &= live && rok[j] == 3 && cok[j] == 3 && base[j] == base[0] + 2 * j;
        if (++tx == tw) { tx = 0; if (++ty == th) { ty = 0; n++; } }
    }
    __global float *dst = Ug + nt * gstride;
    float16 acc = 0.0f;  /* sum of every transformed value: not finite iff an Inf/NaN was read (or overflow) */
    for (int co = c0; co < c1; co++) {
        const __global float *gc = gy + (long)co * OHW;
        float d[2][2][TN];
        if (run) {
            for (int i = 0; i < 2; i++) {
                const __global float *rp = gc + base[0] + (long)i * OW;
                for (int h = 0; h < 4; h++) {  /* 16 columns: tiles 8h .. 8h + 7, column 0 even, 1 odd */
                    const float16 v = vload16(h, rp);
                    vstore8(v.even, h, d[i][0]);
                    vstore8(v.odd, h, d[i][1]);
                }
            }
        } else {
            for (int i = 0; i < 2; i++)
                for (int k = 0; k < 2; k++)
                    for (int j = 0; j < TN; j++)
                        d[i][k][j] = ((rok[j] >> i) & (cok[j] >> k) & 1) ? gc[base[j] + (long)i * OW + k] : 0.0f;
        }
        for (int h = 0; h < 2; h++) {
            const float16 y00 = vload16(h, d[0][0]), y01 = vload16(h, d[0][1]);
            const float16 y10 = vload16(h, d[1][0]), y11 = vload16(h, d[1][1]);
            float16 q[4][2], u[4][4];
            AT2(y00, y10, q[0][0], q[1][0], q[2][0], q[3][0])  /* rows */
            AT2(y01, y11, q[0][1], q[1][1], q[2][1], q[3][1])
            for (int a = 0; a < 4; a++) AT2(q[a][0], q[a][1], u[a][0], u[a][1], u[a][2], u[a][3])  /* columns */
            __global float *o = dst + (long)co * TN + 16 * h;
            for (int a = 0; a < 4; a++) {
                acc += (u[a][0] + u[a][1]) + (u[a][2] + u[a][3]);
                for (int b = 0; b < 4; b++) vstore16(u[a][b], 0, o + (4 * a + b) * estride);
            }
        }
    }
    if (!all(isfinite(acc))) bad[0] = WINO_BAD;
}

__kernel void wino_wgemm(__global const float *Ug, __global const float *Vp, const int Cout, const int Cin,
                         const int ntl, __global float *part, const long p_off, const int gpad)
{
    const int co0 = get_global_id(0) * RM, e = get_global_id(1);
    if (co0 >= Cout) return;
    const int ngroups = (ntl + TN - 1) / TN;
    const long ugs = (long)Cout * TN + gpad, vgs = (long)Cin * TN + gpad;  /* one 32-tile group to the next */
    const __global float *U = Ug + e * ngroups * ugs;
    const __global float *V = Vp + e * ngroups * vgs;
    int urow[RM];
#pragma unroll
    for (int i = 0; i < RM; i++) urow[i] = min(co0 + i, Cout - 1) * TN;  /* rows past Cout: read, not written */
    for (int cb = 0; cb < Cin; cb += RN) {
        int vrow[RN];
#pragma unroll
        for (int j = 0; j < RN; j++) vrow[j] = min(cb + j, Cin - 1) * TN;
        vw_t tot[RM][RN], acc[RM][RN];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < RN; j++) { tot[i][j] = 0.0f; acc[i][j] = 0.0f; }
        for (int g0 = 0; g0 < ngroups; g0 += KG) {
            const int g1 = min(ngroups, g0 + KG);
            for (int g = g0; g < g1; g++) {
                const __global float *up = U + g * ugs, *vp = V + g * vgs;
#pragma unroll
                for (int q = 0; q < TN / VW; q++) {
                    vw_t uv[RM], vv[RN];
#pragma unroll
                    for (int i = 0; i < RM; i++) uv[i] = VLOADW(q, up + urow[i]);
#pragma unroll
                    for (int j = 0; j < RN; j++) vv[j] = VLOADW(q, vp + vrow[j]);
#pragma unroll
                    for (int i = 0; i < RM; i++)
#pragma unroll
                        for (int j = 0; j < RN; j++) acc[i][j] = fma(uv[i], vv[j], acc[i][j]);
                }
            }
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RN; j++) { tot[i][j] += acc[i][j]; acc[i][j] = 0.0f; }
        }
#pragma unroll
        for (int i = 0; i < RM; i++) {
            if (co0 + i >= Cout) break;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                if (cb + j >= Cin) break;
#if VW == 16
                const float8 s8 = tot[i][j].lo + tot[i][j].hi;
#else
                const float8 s8 = tot[i][j];
#endif
                const float4 s4 = s8.lo + s8.hi;
                const float2 s2 = s4.lo + s4.hi;
                part[p_off + ((long)e * Cout + co0 + i) * Cin + cb + j] = s2.x + s2.y;
            }
        }
    }
}

/* Gt = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1]: (Gt m)[0..2] = m0 + .5(m1 + m2), .5(m1 - m2), .5(m1 + m2) + m3 */
#define GT3(m0, m1, m2, m3, o0, o1, o2) { const float s_ = 0.5f * ((m1) + (m2)); \
    o0 = (m0) + s_; o1 = 0.5f * ((m1) - (m2)); o2 = s_ + (m3); }

__kernel void wino_wgrad_out(__global const float *part, const int nchunks, const int Cout, const int Cin,
                             __global float *dw, const long dw_off)
{
    const int id = get_global_id(0);
    if (id >= Cout * Cin) return;
    const long cs = 16L * Cout * Cin;  /* one chunk's partial products to the next */
    float m[16];
    for (int e = 0; e < 16; e++) {
        float s = 0.0f;
        for (int p = 0; p < nchunks; p++) s += part[p * cs + (long)e * Cout * Cin + id];
        m[e] = s;
    }
    float r[3][4];
    for (int b = 0; b < 4; b++) GT3(m[b], m[4 + b], m[8 + b], m[12 + b], r[0][b], r[1][b], r[2][b])
    __global float *o = dw + dw_off + (long)id * 9;
    for (int k = 0; k < 3; k++) GT3(r[k][0], r[k][1], r[k][2], r[k][3], o[3 * k], o[3 * k + 1], o[3 * k + 2])
}
