/* float16 / bfloat16 storage read and written as float in registers (OpenCL only; no cl_khr_fp16 needed).

   ad_f16_to_f32 / f32_to_f16 / f32_to_bf16: exact conversions by integer steps and selects, without
   branches or calls, so the loops around them vectorise (PoCL's vload_half / vstore_half_rte are a
   call per value, scalar).

   Kernels whose activations may be stored in half take build options (backend/devices/opencl/params.py
   HALF_CODES; 0 float32, the default, 1 float16, 2 bfloat16):
     XDT  the input x:   xstore_t, LOADX(p, i) (or XRAW + XCVT16: gathered raw, converted 16 at once)
     YDT  the output y:  ystore_t, STOREY(p, i, v), STOREY16(p, i, v) (rounded to nearest even once) */
#ifndef ANYDEVICE_HALF_IO_H
#define ANYDEVICE_HALF_IO_H

/* float16 bits -> float, exactly (vload_half's value). Subnormal halves are renormalised by one float
   subtraction. */
inline __attribute__((always_inline)) float ad_f16_to_f32(const uint h)
{
    const uint em = (h & 0x7fffu) << 13;      /* exponent and mantissa, at float's places */
    const uint e = em & 0x0f800000u;          /* the exponent bits */
    const float sub = as_float(em + 0x38800000u) - 6.103515625e-05f;  /* (1.m) 2^-14 - 2^-14 */
    const uint r = e == 0x0f800000u ? em + 0x70000000u : (e == 0u ? as_uint(sub) : em + 0x38000000u);
    return as_float(r | ((h & 0x8000u) << 16));
}

/* 16 of them at once (vector integer steps: where a kernel converts gathered values, once per value) */
inline __attribute__((always_inline)) float16 ad_f16_to_f32_16(const uint16 h)
{
    const uint16 em = (h & 0x7fffu) << 13;
    const uint16 e = em & 0x0f800000u;
    const float16 sub = as_float16(em + 0x38800000u) - 6.103515625e-05f;
    uint16 r = select(em + 0x38000000u, as_uint16(sub), e == (uint16)0u);
    r = select(r, em + 0x70000000u, e == (uint16)0x0f800000u);
    return as_float16(r | ((h & 0x8000u) << 16));
}

/* float32 -> float16 bits, rounded to nearest even (vstore_half_rte's result; a NaN becomes a quiet NaN of
   its sign). F. Giesen's float_to_half_fast3_rtne: a float16 add with PoCL's vstore_half_rte cost 4x a
   float32 one. */
inline __attribute__((always_inline)) ushort f32_to_f16(const float v)
{
    const uint u = as_uint(v);
    const uint sign = (u >> 16) & 0x8000u;
    const uint a = u & 0x7fffffffu;
    /* subnormal or zero: add 0.5f, whose ulp is 2^-24 (half's smallest step): the FPU rounds to nearest even */
    const uint sub = as_uint(as_float(a) + 0.5f) - 0x3f000000u;
    /* normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even */
    const uint nrm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  /* 0xc8000000 = (15 - 127) << 23 */
    const uint big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;  /* NaN -> quiet NaN, else Inf (overflow) */
    const uint r = a >= 0x47800000u ? big : (a < 0x38800000u ? sub : nrm);  /* 2^16, 2^-14 */
    return (ushort)(r | sign);
}

/* float32 -> bfloat16 bits, rounded to nearest even (a NaN stays a quiet NaN, as torch does) */
inline __attribute__((always_inline)) ushort f32_to_bf16(const float v)
{
    const uint u = as_uint(v);
    return isnan(v) ? (ushort)((u >> 16) | 0x40u) : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x read as stored: LOADX(p, i) one value as float; or gathered raw, xraw_t XRAW(p, i) (zero is +0 in every
   dtype), and 16 raw values (a vload16 of xraw_t, type xraw16_t) converted at once by XCVT16 */
#ifndef XDT
#define XDT 0
#endif
#if XDT == 0
typedef float xstore_t;
typedef float xraw_t;
typedef float16 xraw16_t;
#define LOADX(p, i) ((p)[i])
#define XCVT16(v) (v)
#elif XDT == 1
typedef ushort xstore_t;
typedef uint xraw_t;
typedef uint16 xraw16_t;
#define LOADX(p, i) ad_f16_to_f32((p)[i])
#define XCVT16(v) ad_f16_to_f32_16(v)
#else
typedef ushort xstore_t;
typedef uint xraw_t;
typedef uint16 xraw16_t;
#define LOADX(p, i) as_float((uint)((p)[i]) << 16)
#define XCVT16(v) as_float16((v) << 16)
#endif
#define XRAW(p, i) ((xraw_t)(p)[i])

/* 16 at once, as the scalar conversions above (vector integer steps and selects) */
inline __attribute__((always_inline)) ushort16 f32_to_f16_16(const float16 v)
{
    const uint16 u = as_uint16(v);
    const uint16 sign = (u >> 16) & 0x8000u;
    const uint16 a = u & 0x7fffffffu;
    const uint16 sub = as_uint16(as_float16(a) + 0.5f) - 0x3f000000u;
    const uint16 nrm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    const uint16 big = select((uint16)0x7c00u, (uint16)0x7e00u, a > (uint16)0x7f800000u);
    uint16 r = select(nrm, sub, a < (uint16)0x38800000u);
    r = select(r, big, a >= (uint16)0x47800000u);
    return convert_ushort16(r | sign);
}

inline __attribute__((always_inline)) ushort16 f32_to_bf16_16(const float16 v)
{
    const uint16 u = as_uint16(v);
    return convert_ushort16(select((u + 0x7fffu + ((u >> 16) & 1u)) >> 16, (u >> 16) | 0x40u, isnan(v)));
}

/* y written as stored: STOREY(p, i, v) one value, STOREY16(p, i, v) a float16 at p + i */
#ifndef YDT
#define YDT 0
#endif
#if YDT == 0
typedef float ystore_t;
#define STOREY(p, i, v) ((p)[i] = (v))
#define STOREY16(p, i, v) vstore16((v), 0, (p) + (i))
#elif YDT == 1
typedef ushort ystore_t;
#define STOREY(p, i, v) ((p)[i] = f32_to_f16(v))
#define STOREY16(p, i, v) vstore16(f32_to_f16_16(v), 0, (p) + (i))
#else
typedef ushort ystore_t;
#define STOREY(p, i, v) ((p)[i] = f32_to_bf16(v))
#define STOREY16(p, i, v) vstore16(f32_to_bf16_16(v), 0, (p) + (i))
#endif
#endif
