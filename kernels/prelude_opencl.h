/* Portable-subset prelude for OpenCL C (see kernels/README.md). */
#ifndef ANYDEVICE_PRELUDE_H
#define ANYDEVICE_PRELUDE_H
#define ANYDEVICE_OPENCL 1
#define KERNEL __kernel
#define DEVICE_FN inline
#define GLOBAL __global
#define LOCAL __local
#define RESTRICT restrict
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define LID0 ((int)get_local_id(0))
#define LID1 ((int)get_local_id(1))
#define GRP0 ((int)get_group_id(0))
#define GRP1 ((int)get_group_id(1))
#define GRP2 ((int)get_group_id(2))
#define LSZ0 ((int)get_local_size(0))
#define LSZ1 ((int)get_local_size(1))
#define NGRP0 ((int)get_num_groups(0))
#define NGRP1 ((int)get_num_groups(1))
#define NGRP2 ((int)get_num_groups(2))
#define GID0 ((int)get_global_id(0))
#define GID1 ((int)get_global_id(1))
#define GID2 ((int)get_global_id(2))
#define FMA(a, b, c) fma((a), (b), (c))
#define OFF_T long
/* 16-byte vectors: LD4/ST4 load/store four floats at a 16-byte-aligned address */
#define LD4(p) vload4(0, (p))
#define ST4(p, v) vstore4((v), 0, (p))
#define MAKE4(a, b, c, d) ((float4)((a), (b), (c), (d)))
#define ALIGN16 __attribute__((aligned(16)))
/* float math: OpenCL's overloads (CUDA spells the float versions expf, ...) */
#define AD_FABS(x) fabs(x)
#define AD_EXP(x) exp(x)
#define AD_EXPM1(x) expm1(x)
#define AD_LOG(x) log(x)
#define AD_LOG1P(x) log1p(x)
#define AD_SQRT(x) sqrt(x)
#define AD_TANH(x) tanh(x)
#define AD_ERFC(x) erfc(x)
#define AD_ERF(x) erf(x)
#define AD_RSQRT(x) rsqrt(x)
#define AD_SIN(x) sin(x)
#define AD_COS(x) cos(x)
#define AD_POW(x, y) pow((x), (y))
#define AD_COPYSIGN(x, y) copysign((x), (y))
#define AD_ISNAN(x) isnan(x)
/* a float from its IEEE bits */
#define AD_BITS_TO_FLOAT(u) as_float((uint)(u))
#endif
