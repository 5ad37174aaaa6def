/* elementwise_half_cuda.cu: the CUDA backend's unary and binary ops on float16 / bfloat16 arrays as they are
 * stored ("half_elementwise", backend/devices/cuda/backend.py): each value loaded as float, computed as the
 * float32 kernels compute it (elementwise_math.h: ad_unary_op, ad_binary_op) and rounded once, to nearest
 * even, to the arrays' kind XT (1 float16, 2 bfloat16; half_portable.h: PTX conversions on CUDA, vload_half /
 * vstore_half_rte in the OpenCL C build that tests the backend's half ops on PoCL, test_halfops_pocl.py).
 * bfloat16 is rounded by its bits, as the backend's _cast always rounded it, on any GPU (PTX's cvt to bf16
 * needs sm_80).
 *
 * kernel ad_to_half(x, y, n) / ad_from_half(x, y, n)
 *   y[i] = x[i] converted: contiguous float32 -> XT, XT -> float32 (_cast in one launch).
 * kernel ad_unary_h(x, y, n, op, p0, p1, flags)
 *   y[i] = ad_unary_op(x[i], op, p0, p1, flags) for contiguous x, y of n values (ad_unary's arguments).
 * kernel ad_binary_h(a, b, y, n, op, ai, an, bi, bn, s)
 *   y[i] = a[(i / ai) % an] op b[(i / bi) % bn] over the contiguous y of n values: an operand is laid out as
 *   y (ai 1, an n), or is a contiguous block repeated along outer and inner dims (a per-channel bias of
 *   (C, 1, 1) against (N, C, H, W): ai = H * W, an = C), or, where an (bn) is 0, the number s (float32, as
 *   torch's opmath takes a Python number). op: BOP_* codes (elementwise_math.h).
 *   launch: 1-D, any geometry (grid-stride loop), group size BLOCK. */
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef XT
#define XT 1
#endif
#if XT != 1 && XT != 2
#error "elementwise_half_cuda.cu: XT 1 (float16) or 2 (bfloat16)"
#endif

#include "elementwise_math.h"

#include "half_portable.h"

#define H_T unsigned short
#define EW_LD(h) HP_LD(XT, h)
#define EW_ST(f) HP_ST(XT, f)

KERNEL void ad_to_half(const GLOBAL float* RESTRICT x, GLOBAL H_T* RESTRICT y, const OFF_T n)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = EW_ST(x[i]);
}

KERNEL void ad_from_half(const GLOBAL H_T* RESTRICT x, GLOBAL float* RESTRICT y, const OFF_T n)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = EW_LD(x[i]);
}

KERNEL void ad_unary_h(const GLOBAL H_T* RESTRICT x, GLOBAL H_T* RESTRICT y, const OFF_T n,
                       const int op, const float p0, const float p1, const int flags)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = EW_ST(ad_unary_op(EW_LD(x[i]), op, p0, p1, flags));
}

/* operand value of output i: laid out as y, a repeated block, or the number s */
DEVICE_FN_INLINE float ad_operand_h(const GLOBAL H_T* RESTRICT v, const OFF_T i, const OFF_T n, const OFF_T vi,
                                    const OFF_T vn, const float s)
{
    if (vn == 0) return s;
    if (vn == n) return EW_LD(v[i]);
    return EW_LD(v[(i / vi) % vn]);
}

KERNEL void ad_binary_h(const GLOBAL H_T* RESTRICT a, const GLOBAL H_T* RESTRICT b, GLOBAL H_T* RESTRICT y,
                        const OFF_T n, const int op, const OFF_T ai, const OFF_T an, const OFF_T bi,
                        const OFF_T bn, const float s)
{
    GRID_STRIDE_LOOP(i, n)
        y[i] = EW_ST(ad_binary_op(op, ad_operand_h(a, i, n, ai, an, s), ad_operand_h(b, i, n, bi, bn, s)));
}
