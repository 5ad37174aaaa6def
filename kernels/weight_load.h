/* Weights stored as float32 (WDT 0, the default), float16 (WDT 1) or bfloat16 (WDT 2), read as float.
   A kernel built with -DWDT=1 or 2 reads a weight buffer of 16-bit words (the contract's half storage,
   backend/ops/dtypes.py) and converts each value in registers: no float32 copy of the weights exists.
   float16 through core vload_half (no cl_khr_fp16 needed), bfloat16 by bits. Offsets count elements. */
#ifndef WDT
#define WDT 0
#endif
#if WDT == 0
typedef float wstore_t;
#define LOADW(p, i) ((p)[i])
#define LOADW16(p) vload16(0, (p))
#elif WDT == 1
typedef ushort wstore_t;
#define LOADW(p, i) vload_half(0, (__global const half *)((p) + (i)))
#define LOADW16(p) vload_half16(0, (__global const half *)(p))
#else
typedef ushort wstore_t;
#define LOADW(p, i) as_float((uint)((p)[i]) << 16)
#define LOADW16(p) as_float16(convert_uint16(vload16(0, (p))) << 16)
#endif
