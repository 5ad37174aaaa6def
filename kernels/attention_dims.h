/* The fused attention kernels' head dims (attention.cl, attention.cu, attention_mma.cu): E for q and k, EV for v and
   the output; build options, one build per pair. */
#ifndef E
#define E 64
#endif
#ifndef EV
#define EV 64
#endif
/* entry b of the flat batch in an operand: (b / bi) * outer stride + (b % bi) * inner stride (bi: the
   kernel's argument; runtime/attention.py's batch_split) */
#ifdef OFF_T
#define ATT_OFF_T OFF_T
#else
#define ATT_OFF_T long  /* attention.cl: OpenCL C without the prelude */
#endif
#define ATT_BOFF(b, so, si) ((ATT_OFF_T)((b) / bi) * (so) + (ATT_OFF_T)((b) % bi) * (si))
/* float's largest finite value (no API's spelling of FLT_MAX: a C99 constant) */
#define ATT_FLT_MAX 3.402823466e+38f
