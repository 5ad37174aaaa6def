/* The fused attention kernels' head dims (attention.cl, attention.cu): E for q and k, EV for v and
   the output; build options, one build per pair. */
#ifndef E
#define E 64
#endif
#ifndef EV
#define EV 64
#endif
