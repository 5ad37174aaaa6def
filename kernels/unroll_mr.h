/* R(X): X(0) X(1) ... X(MR-1), for MR in 4..14 (even): the CPU-family GEMMs' rows of one packed panel,
   unrolled (gemm_cpu.cl, w8a8_cpu.cl). MR must be defined first. */
#ifndef ANYDEVICE_UNROLL_MR_H
#define ANYDEVICE_UNROLL_MR_H
#define R(X) X(0) X(1) X(2) X(3) RX4(X)
#if MR > 4
#define RX4(X) X(4) X(5) RX6(X)
#else
#define RX4(X)
#endif
#if MR > 6
#define RX6(X) X(6) X(7) RX8(X)
#else
#define RX6(X)
#endif
#if MR > 8
#define RX8(X) X(8) X(9) RX10(X)
#else
#define RX8(X)
#endif
#if MR > 10
#define RX10(X) X(10) X(11) RX12(X)
#else
#define RX10(X)
#endif
#if MR > 12
#define RX12(X) X(12) X(13)
#else
#define RX12(X)
#endif
#endif
