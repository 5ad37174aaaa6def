/* half_cuda.h: float16 / bfloat16 words <-> float on CUDA (PTX cvt; bfloat16 rounding needs sm_80), and
   the half tensor-core product mma.sync.m16n8k16 with FP32 accumulators. CUDA only (the OpenCL kernels
   use half_io.h). A kind is 1 for float16, 2 for bfloat16 (the build options HALF_IO, HK, XT). Included by
   conv_gemm_cuda.cu (its HALF_IO branch), attention_mma.cu and norm_cuda.cu. */
#ifndef ANYDEVICE_HALF_CUDA_H
#define ANYDEVICE_HALF_CUDA_H

DEVICE_FN float ad_f16_f32(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
DEVICE_FN unsigned short ad_f32_f16(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
DEVICE_FN float ad_bf16_f32(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
DEVICE_FN unsigned short ad_f32_bf16(float f)
{
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
/* a word of kind k as float / a float rounded (to nearest even) to kind k (k a compile-time constant) */
#define AD_H2F(k, h) ((k) == 2 ? ad_bf16_f32(h) : ad_f16_f32(h))
#define AD_F2H(k, f) ((k) == 2 ? ad_f32_bf16(f) : ad_f32_f16(f))

/* d (4 floats) += a (16x16, 4 words) x b (16x8, b0 b1) in the 16-bit type T ("f16" / "bf16"): the PTX ISA's
   fragment layouts */
#define AD_MMA_DEF(name, T)                                                                          \
    DEVICE_FN void name(float* d, const unsigned int* a, unsigned int b0, unsigned int b1)           \
    {                                                                                                \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 "                        \
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                       \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                 \
    }
AD_MMA_DEF(ad_mma_f16, "f16")
AD_MMA_DEF(ad_mma_bf16, "bf16")
#define AD_MMA_H(k, d, a, b0, b1) \
    do { if ((k) == 2) ad_mma_bf16((d), (a), (b0), (b1)); else ad_mma_f16((d), (a), (b0), (b1)); } while (0)

#endif
