/* CPU-family conv2d weight gradient (OpenCL only): the B operand of gemm_cpu for
   gW[b] (CoutG x CinG*KH*KW) = gy[b] (CoutG x positions) . cols[b] (positions x CinG*KH*KW),
   one batch b = image n * G + group g (backend/ops/convgrad.py; opencl/backend.py
   _conv2d_weight_grad). The A operand is gy itself through pack_a; the per-image products are
   summed afterwards.

   wgrad_pack_b: B[b][k][j] = x[b-th plane block][ci][oh*sh + kh*dh - pt][ow*sw + kw*dw - pl] (zero
   outside x) for positions k = p0 .. p0 + np - 1 ((oh, ow) of the output, row-major) and columns
   j = (ci, kh, kw), packed as gemm_cpu's Bp: [b][ceil(Kw/32)][np][32], zero padded.
   x is contiguous (N, G*CinG, H, W): batch b starts at x_off + b * CinG * H * W.
   Launch: global (ceil(np/PK), ceil(Kw/32), batches), local (1, 1, 1).
*/
#define TN 32
#ifndef PK
#define PK 64
#endif

__kernel void wgrad_pack_b(__global const float *x, const long x_off, __global float *Bp,
                           const int H, const int W, const int CinG, const int KH, const int KW, const int OW,
                           const int sh, const int sw, const int pt, const int pl, const int dh, const int dw,
                           const int p0, const int np)
{
    const int kb = get_global_id(0) * PK, nt = get_global_id(1), b = get_global_id(2);
    if (kb >= np) return;
    const int ke = min(np, kb + PK);
    const int KHW = KH * KW, Kw = CinG * KHW;
    const int ntiles = (Kw + TN - 1) / TN;
    __global float *dst = Bp + ((long)b * ntiles + nt) * (long)np * TN + (long)kb * TN;
    const __global float *xb = x + x_off + (long)b * CinG * H * W;
    const int p = p0 + kb;
    const int oh0 = p / OW, ow0 = p - oh0 * OW;
    /* one column at a time: its reads walk along rows of x (contiguous for stride 1) */
    for (int j = 0; j < TN; j++) {
        const int col = nt * TN + j;
        __global float *d = dst + j;
        if (col >= Kw) {
            for (int k = kb; k < ke; k++, d += TN) *d = 0.0f;
            continue;
        }
        const int ci = col / KHW, r = col - ci * KHW, kh = r / KW, kw = r - kh * KW;
        const __global float *xc = xb + (long)ci * H * W;
        const int offh = kh * dh - pt, offw = kw * dw - pl;
        int oh = oh0, ow = ow0;
        for (int k = kb; k < ke; k++, d += TN) {
            const int ih = oh * sh + offh, iw = ow * sw + offw;
            *d = ((uint)ih < (uint)H && (uint)iw < (uint)W) ? xc[(long)ih * W + iw] : 0.0f;
            if (++ow == OW) { ow = 0; oh++; }
        }
    }
}

/* wgrad_pack_x (stride-1 convs): the zero-padded input of batch b, its positions q = row * Wq + col
   of the padded image (Wq columns, Hq rows) as gemm_cpu's B panels with one channel per column:
   Bp[b][nt][q][j] = x[b][nt*32 + j][q / Wq - pt][q % Wq - pl] (zero outside x, past CinG, and for
   q >= Hq * Wq: the slack rows the last taps' shifted panels read). A tap (kh, kw) of the weight
   gradient is then a gemm_cpu product against these panels shifted by kh*dh*Wq + kw*dw positions:
   every tap reads the same packed x (no KH*KW-fold im2col).
   Launch: global (ceil(Q/PK), ceil(CinG/32), batches), local (1, 1, 1). */
__kernel void wgrad_pack_x(__global const float *x, const long x_off, __global float *Bp,
                           const int H, const int W, const int CinG, const int Hq, const int Wq,
                           const int pt, const int pl, const int Q)
{
    const int qb = get_global_id(0) * PK, nt = get_global_id(1), b = get_global_id(2);
    if (qb >= Q) return;
    const int qe = min(Q, qb + PK);
    const int ntiles = (CinG + TN - 1) / TN;
    __global float *dst = Bp + ((long)b * ntiles + nt) * (long)Q * TN + (long)qb * TN;
    const __global float *xb = x + x_off + ((long)b * CinG + nt * TN) * H * W;
    const int nc = min(TN, CinG - nt * TN);
    const long HW = (long)H * W;
    int r = qb / Wq, c = qb - r * Wq;
    for (int q = qb; q < qe; q++, dst += TN) {
        const int ih = r - pt, iw = c - pl;
        if (r < Hq && (uint)ih < (uint)H && (uint)iw < (uint)W) {
            const __global float *s = xb + (long)ih * W + iw;
            for (int j = 0; j < TN; j++) dst[j] = j < nc ? s[j * HW] : 0.0f;
        } else {
            for (int j = 0; j < TN; j++) dst[j] = 0.0f;
        }
        if (++c == Wq) { c = 0; r++; }
    }
}
