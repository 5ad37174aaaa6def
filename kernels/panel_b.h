/* gemm_cpu's packed-B panel (32 columns, K rows), shared by its packers (gemm_cpu.cl pack_b, conv_cpu.cl
   im2col_pack, winograd_cpu.cl wino_in) and gemm_cpu itself. Without BH a panel is K rows of 32 floats; with BH
   (build option, set where gemm_cpu makes two 16-column passes, NH 2: AVX2) it is two K x 16 halves, so that a pass
   reads its half's rows contiguously, as an AVX2 SGEMM's 16-column panels. PANEL_BOFF(k, j, K): the offset of
   (row k, column j) in a panel of K rows; PANEL_BSTEP: floats from row k to k + 1 within a half. */
#ifndef BH
#define BH 0
#endif
#if BH
#define PANEL_BSTEP 16
#define PANEL_BHALF(K) ((long)(K) * 16)  /* from the first half's row to the second's */
#else
#define PANEL_BSTEP 32
#define PANEL_BHALF(K) 16
#endif
#define PANEL_BOFF(k, j, K) ((long)(k) * PANEL_BSTEP + ((j) >> 4) * PANEL_BHALF(K) + ((j) & 15))
