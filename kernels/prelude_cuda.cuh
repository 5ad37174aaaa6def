/* Portable-subset prelude for CUDA / HIP through NVRTC / hipRTC (see kernels/README.md). */
#ifndef ANYDEVICE_PRELUDE_H
#define ANYDEVICE_PRELUDE_H
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define ANYDEVICE_HIP 1
#else
#define ANYDEVICE_CUDA 1
#endif
#define KERNEL extern "C" __global__
#define DEVICE_FN __device__ __forceinline__
#define DEVICE_FN_INLINE DEVICE_FN
#define GLOBAL
#define LOCAL __shared__
#define RESTRICT __restrict__
#define BARRIER() __syncthreads()
#define LID0 ((int)threadIdx.x)
#define LID1 ((int)threadIdx.y)
#define GRP0 ((int)blockIdx.x)
#define GRP1 ((int)blockIdx.y)
#define GRP2 ((int)blockIdx.z)
#define LSZ0 ((int)blockDim.x)
#define LSZ1 ((int)blockDim.y)
#define NGRP0 ((int)gridDim.x)
#define NGRP1 ((int)gridDim.y)
#define NGRP2 ((int)gridDim.z)
#define GID0 ((int)(blockIdx.x * blockDim.x + threadIdx.x))
#define GID1 ((int)(blockIdx.y * blockDim.y + threadIdx.y))
#define GID2 ((int)(blockIdx.z * blockDim.z + threadIdx.z))
#define FMA(a, b, c) fmaf((a), (b), (c))
#define OFF_T long long
/* 16-byte vectors: LD4/ST4 load/store four floats at a 16-byte-aligned address */
#define LD4(p) (*(const float4*)(p))
#define ST4(p, v) (*(float4*)(p) = (v))
#define MAKE4(a, b, c, d) make_float4((a), (b), (c), (d))
#define ALIGN16 __align__(16)
/* float math: the float spellings (OpenCL's are overloads) */
#define AD_FABS(x) fabsf(x)
#define AD_EXP(x) expf(x)
#define AD_EXPM1(x) expm1f(x)
#define AD_LOG(x) logf(x)
#define AD_LOG1P(x) log1pf(x)
#define AD_SQRT(x) sqrtf(x)
#define AD_TANH(x) tanhf(x)
#define AD_ERFC(x) erfcf(x)
#define AD_ERF(x) erff(x)
#define AD_RSQRT(x) rsqrtf(x)
#define AD_SIN(x) sinf(x)
#define AD_COS(x) cosf(x)
#define AD_POW(x, y) powf((x), (y))
#define AD_COPYSIGN(x, y) copysignf((x), (y))
#define AD_ISNAN(x) isnan(x)
/* a float from its IEEE bits */
#define AD_BITS_TO_FLOAT(u) __uint_as_float((unsigned int)(u))
#endif
