/* Quantized weights decoded in registers (portable subset: OpenCL and CUDA/HIP).

   A quantized weight is a byte buffer read by flat element index i over the weight's C-order data
   (backend/ops/quant.py has the same formats on the host, and the references):
     WQ 3  int8             (signed char)p[i] * wscale[i / wq_k]          (one scale per row)
     WQ 4  float8_e4m3fn    e4m3(p[i]) * wscale[i / wq_k]
     WQ 5  float8_e5m2      e5m2(p[i]) * wscale[i / wq_k]
     WQ 6  q8_0   34-byte blocks of 32: fp16 d, 32 int8 q            d * q
     WQ 7  q4_0   18-byte blocks: fp16 d, 16 bytes of nibbles        d * (q - 8)
     WQ 8  q4_1   20-byte blocks: fp16 d, fp16 m, nibbles            d * q + m
     WQ 9  q5_0   22-byte blocks: fp16 d, 32 high bits, nibbles      d * (q - 16)
     WQ 10 q5_1   24-byte blocks: fp16 d, fp16 m, high bits, nibbles d * q + m
   (ggml's layouts: element j < 16 of a block is the low nibble of byte j, j >= 16 the high nibble of
   byte j - 16; the fifth bit of element j is bit j of the little-endian 32-bit qh.)
   qd_load(p, i, wscale, wq_k) is the element as float: exact for the block formats (d * q is exact in
   float32; d * q + m rounds once, as ggml's dequantizer). No float32 copy of a weight is ever made. */
#ifndef ANYDEVICE_QUANT_DECODE_H
#define ANYDEVICE_QUANT_DECODE_H
#include "prelude_opencl.h" /* OpenCL-only files include no prelude; a CUDA source has its own first (same guard) */

typedef GLOBAL const unsigned char *qd_ptr;

/* IEEE half bits -> float (every value: zeros, subnormals, Inf, NaN) */
DEVICE_FN float qd_half_bits(unsigned int h)
{
    const unsigned int s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 0u) {
        const float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
        return s ? -v : v;
    }
    return AD_BITS_TO_FLOAT(s | (e == 31u ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
#ifdef ANYDEVICE_OPENCL
#define QD_HALF(b) vload_half(0, (GLOBAL const half *)(b)) /* b is 2-byte aligned: blocks have even sizes */
#else
#define QD_HALF(b) qd_half_bits((unsigned int)(b)[0] | ((unsigned int)(b)[1] << 8))
#endif

DEVICE_FN float qd_e4m3(unsigned int b)
{
    const unsigned int e = (b >> 3) & 15u, m = b & 7u;
    float v = e ? AD_BITS_TO_FLOAT(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if (e == 15u && m == 7u) v = AD_BITS_TO_FLOAT(0x7fc00000u);
    return (b & 128u) ? -v : v;
}
DEVICE_FN float qd_e5m2(unsigned int b) { return qd_half_bits(b << 8); }

/* nibble j (0..31) of the 16 bytes at q */
DEVICE_FN unsigned int qd_nib(qd_ptr q, int j) { const unsigned int v = q[j & 15]; return j < 16 ? (v & 15u) : (v >> 4); }
DEVICE_FN unsigned int qd_u32(qd_ptr b) {
    return (unsigned int)b[0] | ((unsigned int)b[1] << 8) | ((unsigned int)b[2] << 16) | ((unsigned int)b[3] << 24);
}

/* qd_run: n consecutive elements e .. e+n-1 of ONE block (n <= 32 - e % 32) into out[0 .. n), the block's
   scale read once; for int8 / fp8 (no blocks) any n, the row's scale read once per row. The one decoder:
   qd_load is a run of one. */
DEVICE_FN void qd_run(qd_ptr p, OFF_T e, int n, float *out, GLOBAL const float *wscale, OFF_T wq_k)
{
#if WQ >= 6
    const int j0 = (int)(e & 31);
#endif
#if WQ == 6
    qd_ptr b = p + (e >> 5) * 34;
    const float d = QD_HALF(b);
    for (int u = 0; u < n; u++) out[u] = d * (float)(signed char)b[2 + j0 + u];
#elif WQ == 7
    qd_ptr b = p + (e >> 5) * 18;
    const float d = QD_HALF(b);
    for (int u = 0; u < n; u++) out[u] = d * ((float)qd_nib(b + 2, j0 + u) - 8.0f);
#elif WQ == 8
    qd_ptr b = p + (e >> 5) * 20;
    const float d = QD_HALF(b), m = QD_HALF(b + 2);
    for (int u = 0; u < n; u++) { const float dq = d * (float)qd_nib(b + 4, j0 + u); out[u] = dq + m; }
#elif WQ == 9
    qd_ptr b = p + (e >> 5) * 22;
    const float d = QD_HALF(b);
    const unsigned int qh = qd_u32(b + 2);
    for (int u = 0; u < n; u++) {
        const int j = j0 + u;
        out[u] = d * ((float)(qd_nib(b + 6, j) | (((qh >> j) & 1u) << 4)) - 16.0f);
    }
#elif WQ == 10
    qd_ptr b = p + (e >> 5) * 24;
    const float d = QD_HALF(b), m = QD_HALF(b + 2);
    const unsigned int qh = qd_u32(b + 4);
    for (int u = 0; u < n; u++) {
        const int j = j0 + u;
        const float dq = d * (float)(qd_nib(b + 8, j) | (((qh >> j) & 1u) << 4));
        out[u] = dq + m;
    }
#elif WQ >= 3 && WQ <= 5  /* int8 / fp8: one scale per row of wq_k elements, looked up once per row the run touches */
    OFF_T r = e / wq_k, next = (r + 1) * wq_k;
    float sc = wscale[r];
    for (int u = 0; u < n; u++) {
        if (e + u == next) { r++; next += wq_k; sc = wscale[r]; }
#if WQ == 3
        out[u] = (float)(signed char)p[e + u] * sc;
#elif WQ == 4
        out[u] = qd_e4m3(p[e + u]) * sc;
#else
        out[u] = qd_e5m2(p[e + u]) * sc;
#endif
    }
#else
#error "quant_decode.h: WQ must be a quantized format code (3..10)"
#endif
}

/* qd_load: element i as float (a run of one). */
DEVICE_FN float qd_load(qd_ptr p, OFF_T i, GLOBAL const float *wscale, OFF_T wq_k)
{
    float v;
    qd_run(p, i, 1, &v, wscale, wq_k);
    return v;
}
#endif
