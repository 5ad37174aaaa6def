/* Batch normalisation in training mode, fused (backend/devices/opencl/norms.py: capability "batch_norm";
   ops/layers.py batch_norm and learn/autograd/rules_layers.py's rule take it). x is a contiguous float32
   array viewed (N, C, L); one work group a channel, BN_LS work items a group (1 on the CPU family: one work
   item walks the channel's N rows of L values; a power of two on the GPU family, the group's items taking
   every BN_LS-th value of a row and summing through local memory).

   The statistics are the composite's (layers.py): the mean a (compensated sum times the host's float32 1/n),
   then about it b = mean(x - a) and q = mean((x - a)^2), var = q - b^2 (the corrected two-pass variance,
   biased), rs = rsqrt(var + eps), xhat = ((x - a) - b) * rs. Both kernels compute them (the backward
   recomputes from x: three reads of a channel that sits in cache, no saved state between the passes). */
#ifndef BN_LS
#define BN_LS 1
#endif

/* compensated (Kahan) accumulation of v into s, with c the running compensation (scalars or float16 lanes) */
#define BN_KADD(s, c, v) { const float y_ = (v) - (c); const float t_ = (s) + y_; (c) = (t_ - (s)) - y_; (s) = t_; }
#define BN_KADD16(s, c, v) { const float16 y_ = (v) - (c); const float16 t_ = (s) + y_; (c) = (t_ - (s)) - y_; (s) = t_; }
/* each row of channel c (its L values contiguous): VB on 16 values from index i (vload16 / vstore16), for
   this work item's runs of 16, then SB on each of the row's last L % 16 values it owns (index i) */
#define BN_LOOP(VB, SB) for (long n_ = 0; n_ < N; n_++) { const long r_ = (n_ * C + c) * L; \
        for (long q_ = lid; q_ < L / 16; q_ += BN_LS) { const long i = r_ + 16 * q_; VB } \
        for (long l_ = (L / 16) * 16 + lid; l_ < L; l_ += BN_LS) { const long i = r_ + l_; SB } }

/* the compensated lanes (s - c) and scalar (ss - sc) sums added up, lane by lane in order */
inline float bn_total(const float16 s, const float16 c, const float ss, const float sc)
{
    float t[16];
    vstore16(s - c, 0, t);
    float r = ss - sc;
    for (int j = 0; j < 16; j++) r += t[j];
    return r;
}

/* the sum of every work item's v, returned to each item of the group */
inline float bn_gsum(float v, __local float *sh)
{
#if BN_LS == 1
    return v;
#else
    const int l = (int)get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);  /* sh may still be read from the last call */
    sh[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BN_LS / 2; s > 0; s >>= 1) {
        if (l < s) sh[l] += sh[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return sh[0];
#endif
}

/* a, b, the biased variance and rs of channel c (see the top) */
inline void bn_stats(const __global float *x, const long N, const long C, const long L, const long c,
                     const float inv_n, const float eps, __local float *sh, float *pa, float *pb, float *pv,
                     float *prs)
{
    const long lid = (long)get_local_id(0);
    float16 s = 0.0f, k = 0.0f;
    float ss = 0.0f, ks = 0.0f;
    BN_LOOP(BN_KADD16(s, k, vload16(0, x + i)), BN_KADD(ss, ks, x[i]))
    const float a = bn_gsum(bn_total(s, k, ss, ks), sh) * inv_n;
    float16 s1 = 0.0f, k1 = 0.0f, q = 0.0f, kq = 0.0f;
    float ss1 = 0.0f, ks1 = 0.0f, sq = 0.0f, kqs = 0.0f;
    BN_LOOP({ const float16 d = vload16(0, x + i) - a; BN_KADD16(s1, k1, d) BN_KADD16(q, kq, d * d) },
            { const float d = x[i] - a; BN_KADD(ss1, ks1, d) BN_KADD(sq, kqs, d * d) })
    const float b = bn_gsum(bn_total(s1, k1, ss1, ks1), sh) * inv_n;
    float v = bn_gsum(bn_total(q, kq, sq, kqs), sh) * inv_n - b * b;
    v = v < 0.0f ? 0.0f : v;  /* >= 0 but for rounding; NaN stays NaN */
    *pa = a;
    *pb = b;
    *pv = v;
    *prs = rsqrt(v + eps);
}

/* y = xhat * w[c] + bias[c] (flags: 1 w, 2 bias, in the composite's order: a product, then a sum); with
   flag 4 also torch's running statistics update, st[c] = rm[c] * om + mean * mom and
   st[C + c] = rv[c] * om + (var * unbias) * mom (om = 1 - momentum and unbias = n / (n - 1), as float32
   from the host; mean = a + b). Launch: global (C * BN_LS), local (BN_LS). */
__kernel void bn_train(__global const float *x, const long x_off, __global float *y, const long y_off,
                       __global const float *w, const long w_off, __global const float *bias, const long b_off,
                       __global const float *rm, const long rm_off, __global const float *rv, const long rv_off,
                       __global float *st, const long st_off, const long N, const long C, const long L,
                       const float inv_n, const float eps, const float om, const float mom, const float unbias,
                       const int flags)
{
    __local float sh[BN_LS];
    const long c = (long)get_group_id(0), lid = (long)get_local_id(0);
    x += x_off;
    y += y_off;
    float a, b, v, rs;
    bn_stats(x, N, C, L, c, inv_n, eps, sh, &a, &b, &v, &rs);
    /* without w (bias): a product by 1 (a sum with 0) changes no value, Inf and NaN included (but -0 + 0 = +0) */
    const float wc = (flags & 1) ? w[w_off + c] : 1.0f, bc = (flags & 2) ? bias[b_off + c] : 0.0f;
    BN_LOOP(vstore16((((vload16(0, x + i) - a) - b) * rs) * wc + bc, 0, y + i);,
            y[i] = (((x[i] - a) - b) * rs) * wc + bc;)
    if ((flags & 4) && lid == 0) {
        st[st_off + c] = rm[rm_off + c] * om + (a + b) * mom;
        st[st_off + C + c] = rv[rv_off + c] * om + (v * unbias) * mom;
    }
}

/* The backward of bn_train for dL/dy = gy (contiguous, x's shape): gwb[c] = sum(gy * xhat) (the weight's
   gradient), gwb[C + c] = sum(gy) (the bias's); with flag 2 gx = (w[c] * rs) * ((gy - mean(gy)) - xhat *
   mean(gy * xhat)) (flag 1: w given, else 1), the composite's rstd * (g - mean(g) - xhat * mean(g * xhat))
   for g = gy * w. Launch: global (C * BN_LS), local (BN_LS). */
__kernel void bn_grad(__global const float *gy, const long gy_off, __global const float *x, const long x_off,
                      __global const float *w, const long w_off, __global float *gx, const long gx_off,
                      __global float *gwb, const long gwb_off, const long N, const long C, const long L,
                      const float inv_n, const float eps, const int flags)
{
    __local float sh[BN_LS];
    const long c = (long)get_group_id(0), lid = (long)get_local_id(0);
    x += x_off;
    gy += gy_off;
    float a, b, v, rs;
    bn_stats(x, N, C, L, c, inv_n, eps, sh, &a, &b, &v, &rs);
    float16 g16 = 0.0f, kg16 = 0.0f, x16 = 0.0f, kx16 = 0.0f;
    float sg = 0.0f, kg = 0.0f, sx = 0.0f, kx = 0.0f;
    BN_LOOP({ const float16 g = vload16(0, gy + i); BN_KADD16(g16, kg16, g)
              BN_KADD16(x16, kx16, g * (((vload16(0, x + i) - a) - b) * rs)) },
            { const float g = gy[i]; BN_KADD(sg, kg, g) BN_KADD(sx, kx, g * (((x[i] - a) - b) * rs)) })
    sg = bn_gsum(bn_total(g16, kg16, sg, kg), sh);
    sx = bn_gsum(bn_total(x16, kx16, sx, kx), sh);
    if (lid == 0) {
        gwb[gwb_off + c] = sx;
        gwb[gwb_off + C + c] = sg;
    }
    if (flags & 2) {
        gx += gx_off;
        const float sc = ((flags & 1) ? w[w_off + c] : 1.0f) * rs, mg = sg * inv_n, mx = sx * inv_n;
        BN_LOOP(vstore16(sc * ((vload16(0, gy + i) - mg) - (((vload16(0, x + i) - a) - b) * rs) * mx), 0, gx + i);,
                gx[i] = sc * ((gy[i] - mg) - (((x[i] - a) - b) * rs) * mx);)
    }
}
