/* half_portable.h: 16-bit storage words <-> float for the CUDA kernels that also build as OpenCL C (their PoCL
   tests): CUDA's PTX conversions (half_cuda.h) for float16, vload_half / vstore_half_rte in OpenCL C; bfloat16
   by its bits on both (nearest even; a NaN keeps its sign and payload, quieted: the CUDA backend's _cast).
   HP_LD(k, h) / HP_ST(k, f): a word of kind k (1 float16, 2 bfloat16; a compile-time constant) as float / a
   float rounded to kind k. Included by elementwise_half_cuda.cu and norm_split_cuda.cu. */
#ifndef ANYDEVICE_HALF_PORTABLE_H
#define ANYDEVICE_HALF_PORTABLE_H

#ifdef ANYDEVICE_CUDA
#include "half_cuda.h"
#define HP_F16_LD(h) ad_f16_f32(h)
#define HP_F16_ST(f) ad_f32_f16(f)
#define HP_BITS(f) __float_as_uint(f)
#define HP_FLOAT(u) __uint_as_float(u)
#else
DEVICE_FN_INLINE float hp_f16_ld(unsigned short h) { return vload_half(0, (const half*)&h); }
DEVICE_FN_INLINE unsigned short hp_f16_st(float f) { unsigned short h; vstore_half_rte(f, 0, (half*)&h); return h; }
#define HP_F16_LD(h) hp_f16_ld(h)
#define HP_F16_ST(f) hp_f16_st(f)
#define HP_BITS(f) as_uint(f)
#define HP_FLOAT(u) as_float(u)
#endif

DEVICE_FN_INLINE unsigned short ad_bf16_rne(const float f)
{
    const unsigned int u = HP_BITS(f);
    return AD_ISNAN(f) ? (unsigned short)((u >> 16) | 0x40u)
                       : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#define HP_LD(k, h) ((k) == 2 ? HP_FLOAT(((unsigned int)(h)) << 16) : HP_F16_LD(h))
#define HP_ST(k, f) ((k) == 2 ? ad_bf16_rne(f) : HP_F16_ST(f))

#endif
