/* A quantized weight's float32 values (WDT 3..10, weight_load.h / quant_decode.h), for the ops whose
   kernels do not read the format themselves (a copy for that op only).
   Launch: global (any), local (any): a grid-stride loop. */
#include "weight_load.h"

__kernel void dequant_w(__global const wstore_t *w, __global float *out, const long n WQ_PARAMS)
{
    for (long i = get_global_id(0); i < n; i += get_global_size(0)) out[i] = LOADW(w, i);
}
