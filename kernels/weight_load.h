/* Weights read as float in registers, whatever they are stored as (-DWDT, backend/devices/opencl/params.py):
     WDT 0  float32 (the default)          WDT 1  float16 (core vload_half, no cl_khr_fp16 needed)
     WDT 2  bfloat16 (by bits)             WDT 3..10  quantized formats (quant_decode.h: int8, fp8, GGUF blocks)
   No float32 copy of a weight exists. Reads are by element index from the buffer's start:
   LOADW(p, i) one element, LOADW16(p, i) elements i..i+15 as a float16.
   Kernels that read weights take WQ_PARAMS last (a per-row scale buffer and the row length, read by
   the scaled quantized formats int8 / fp8 only; any buffer and 0 otherwise), so their signature is one
   for every WDT. */
#ifndef ANYDEVICE_WEIGHT_LOAD_H
#define ANYDEVICE_WEIGHT_LOAD_H
#ifndef WDT
#define WDT 0
#endif
#define WQ_PARAMS , __global const float *wscale, const long wq_k
#if WDT == 0
typedef float wstore_t;
#define LOADW(p, i) ((p)[i])
#define LOADW16(p, i) vload16(0, (p) + (i))
#elif WDT == 1
typedef ushort wstore_t;
/* float16 bits -> float, exactly (vload_half's value): integer steps and selects, no branch and no call, so
   the packing kernels' strided loops stay cheap (PoCL's vload_half is a call per value there, scalar).
   Subnormal halves are renormalised by one float subtraction. */
inline __attribute__((always_inline)) float ad_f16_to_f32(const uint h)
{
    const uint em = (h & 0x7fffu) << 13;      /* exponent and mantissa, at float's places */
    const uint e = em & 0x0f800000u;          /* the exponent bits */
    const float sub = as_float(em + 0x38800000u) - 6.103515625e-05f;  /* (1.m) 2^-14 - 2^-14 */
    const uint r = e == 0x0f800000u ? em + 0x70000000u : (e == 0u ? as_uint(sub) : em + 0x38000000u);
    return as_float(r | ((h & 0x8000u) << 16));
}
#define LOADW(p, i) ad_f16_to_f32((p)[i])
#define LOADW16(p, i) vload_half16(0, (__global const half *)((p) + (i)))
#elif WDT == 2
typedef ushort wstore_t;
#define LOADW(p, i) as_float((uint)((p)[i]) << 16)
#define LOADW16(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#else
#define WQ WDT
#include "quant_decode.h"
typedef uchar wstore_t;
#define LOADW(p, i) qd_load((p), (i), wscale, wq_k)
inline float16 loadw16_q(__global const uchar *p, long i, __global const float *wscale, long wq_k)
{
    float t[16];
    for (int j = 0; j < 16; j++) t[j] = qd_load(p, i + j, wscale, wq_k);
    return vload16(0, t);
}
#define LOADW16(p, i) loadw16_q((p), (i), wscale, wq_k)
#endif
#endif
