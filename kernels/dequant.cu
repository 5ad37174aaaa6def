/* dequant.cu: a quantized weight's float32 values (portable subset: the CUDA backend's
 * Device._dequant, for the ops whose kernels do not read the format themselves: a copy for that op
 * only). Built with -DWQ=code (backend/ops/quant.py FORMATS, kernels/quant_decode.h).
 *
 * kernel ad_dequant(w, out, n, wscale, wq_k)
 *   out[i] = qd_load(w, i, wscale, wq_k) for i < n (the weight's C-order elements); wscale / wq_k:
 *   the int8 / fp8 per-row scales and the row length (any buffer and 0 for the block formats).
 * launch: 1-D, any geometry (grid-stride loop). */
#include "quant_decode.h"

KERNEL void ad_dequant(const GLOBAL unsigned char* RESTRICT w, GLOBAL float* RESTRICT out, const OFF_T n,
                       const GLOBAL float* RESTRICT wscale, const OFF_T wq_k)
{
    for (OFF_T i = (OFF_T)GID0; i < n; i += (OFF_T)NGRP0 * LSZ0) out[i] = qd_load(w, i, wscale, wq_k);
}
