/* Weights read as float in registers, whatever they are stored as (-DWDT, backend/devices/opencl/params.py):
     WDT 0  float32 (the default)          WDT 1  float16 (core vload_half, no cl_khr_fp16 needed)
     WDT 2  bfloat16 (by bits)             WDT 3..10  quantized formats (quant_decode.h: int8, fp8, GGUF blocks)
   No float32 copy of a weight exists. Reads are by element index from the buffer's start:
   LOADW(p, i) one element, LOADW16(p, i) elements i..i+15 as a float16, LOADW4(p, i) (WDT 0..2) i..i+3 as a float4.
   Kernels that read weights take WQ_PARAMS last (a per-row scale buffer and the row length, read by
   the scaled quantized formats int8 / fp8 only; any buffer and 0 otherwise), so their signature is one
   for every WDT. */
#ifndef ANYDEVICE_WEIGHT_LOAD_H
#define ANYDEVICE_WEIGHT_LOAD_H
#include "half_io.h"  /* ad_f16_to_f32 */
#ifndef WDT
#define WDT 0
#endif
#define WQ_PARAMS , __global const float *wscale, const long wq_k
#if WDT == 0
typedef float wstore_t;
#define LOADW(p, i) ((p)[i])
#define LOADW16(p, i) vload16(0, (p) + (i))
#define LOADW4(p, i) vload4(0, (p) + (i))
#elif WDT == 1
typedef ushort wstore_t;
#define LOADW(p, i) ad_f16_to_f32((p)[i])
#define LOADW16(p, i) vload_half16(0, (__global const half *)((p) + (i)))
#define LOADW4(p, i) vload_half4(0, (__global const half *)((p) + (i)))
#elif WDT == 2
typedef ushort wstore_t;
#define LOADW(p, i) as_float((uint)((p)[i]) << 16)
#define LOADW16(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#define LOADW4(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
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
