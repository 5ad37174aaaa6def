/* CPU-family conv2d weight gradient (OpenCL only): the B operand of gemm_cpu for
   gW[b] (CoutG x CinG*KH*KW) = gy[b] (CoutG x positions) . cols[b] (positions x CinG*KH*KW),
   one batch b = image n * G + group g (backend/ops/convgrad.py; opencl/backend.py
   _conv2d_weight_grad). The A operand is gy itself through pack_a; the per-image products are
   summed afterwards.

   wgrad_pack_b: B[b][k][j] = x[b-th plane block][ci][oh*sh + kh*dh - pt][ow*sw + kw*dw - pl] (zero
   outside x) for positions k = p0 .. p0 + np - 1 ((oh, ow) of the output, row-major) and columns
   j = (ci, kh, kw), packed as gemm_cpu's Bp: [b][ceil(Kw/32)][np][32], zero padded.
   x is contiguous (N, G*CinG, H, W): batch b starts at x_off + b * CinG * H * W. P > 0 (one group,
   small images): the positions k run over every image, P = OH * OW of them per image (image
   k / P), so one product sums over the whole batch; P = 0: the positions of one image per batch.
   Launch: global (ceil(np/PK), ceil(Kw/32), batches), local (1, 1, 1).
*/
#define TN 32
#ifndef PK
#define PK 64
#endif

__kernel void wgrad_pack_b(__global const float *x, const long x_off, __global float *Bp,
                           const int H, const int W, const int CinG, const int KH, const int KW, const int OW,
                           const int sh, const int sw, const int pt, const int pl, const int dh, const int dw,
                           const int p0, const int np, const int OH, const int P)
{
    const int kb = get_global_id(0) * PK, nt = get_global_id(1), b = get_global_id(2);
    if (kb >= np) return;
    const int ke = min(np, kb + PK);
    const int KHW = KH * KW, Kw = CinG * KHW;
    const int ntiles = (Kw + TN - 1) / TN;
    const long img = (long)CinG * H * W;
    __global float *dst = Bp + ((long)b * ntiles + nt) * (long)np * TN + (long)kb * TN;
    int p = p0 + kb, n = 0;
    if (P > 0) { n = p / P; p -= n * P; }  /* positions of every image in one row (one batch) */
    const __global float *xb = x + x_off + ((long)b + n) * img;
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
            if (++ow == OW) {
                ow = 0;
                if (++oh == OH && P > 0) { oh = 0; xc += img; }  /* the next image */
            }
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

/* col2im_gather (strided conv2d input gradients, one group): gx[nn][c][h][w] = the sum over the taps
   (kh, kw) that reach (h, w), i.e. th = h + pt - kh*dh and tw = w + pl - kw*dw divisible by the stride
   with oh = th / sh < OH and ow = tw / sw < OW, of cols[(c*KH + kh)*KW + kw][(nn*OH + oh)*OW + ow], where
   cols = w^T . gy (C*KH*KW x N*OH*OW, one GEMM): only the products torch's transposed conv scatters are
   summed (an Inf weight reaches the inputs its taps reach, nothing else), in tap order. A work item
   takes ``chunk`` planes (nn, c): zeroes the plane, then adds each tap's OH x OW columns at the inputs
   they reach (the plane is the work item's own: no races). n = N*C planes.
   Launch: global (ceil(n / chunk)), local (1). */
__kernel void col2im_gather(__global const float *cols, const long c_off, __global float *gx, const long gx_off,
                            const int C, const int H, const int W, const int KH, const int KW,
                            const int OH, const int OW, const int sh, const int sw, const int pt, const int pl,
                            const int dh, const int dw, const long n, const int chunk)
{
    const long p0 = (long)get_global_id(0) * chunk;
    const long p1 = min(n, p0 + chunk);
    const long P = n / C * OH * OW;
    const int HW = H * W;
    for (long pl_ = p0; pl_ < p1; pl_++) {
        const int c = (int)(pl_ % C);
        const long nn = pl_ / C;
        __global float *out = gx + gx_off + pl_ * HW;
        const __global float *cb = cols + c_off + (long)c * KH * KW * P + nn * OH * OW;
        for (int i = 0; i < HW; i++) out[i] = 0.0f;
        for (int kh = 0; kh < KH; kh++) {
            for (int kw = 0; kw < KW; kw++) {
                const __global float *src = cb + (long)(kh * KW + kw) * P;
                for (int oh = 0; oh < OH; oh++) {
                    const int h = oh * sh + kh * dh - pt;
                    if ((uint)h >= (uint)H) continue;
                    __global float *orow = out + h * W;
                    const __global float *srow = src + oh * OW;
                    for (int ow = 0; ow < OW; ow++) {
                        const int w = ow * sw + kw * dw - pl;
                        if ((uint)w < (uint)W) orow[w] += srow[ow];
                    }
                }
            }
        }
    }
}
