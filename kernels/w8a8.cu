/* W8A8 linear in the portable subset (kernels/README.md): the CUDA backend's kernels and the OpenCL GPU
   family's. Dynamic int8 activations x int8 weight, int32 accumulation, scales in the epilogue; the
   math is backend/ops/w8a8.py's. Geometry and arguments: backend/devices/runtime/w8a8.py.

   ad_w8a8_rows: one group of BLOCK items per row of x (M, K) float32 (at x + x_off): the row's absmax
     (a LOCAL tree), sx[m] = absmax/127 (1 for a zero row, NaN for a row with Inf/NaN), the row
     quantized (round half away from zero) into xq (M, ldq) int8, zero from K to ldq (ldq a multiple of
     TK: the GEMM's A tiles need no K guard).
   ad_w8a8_gemm: y (M, N) = epilogue(xq (M, ldq) . wq (N, K)^T), wq the int8 weight's bytes as stored
     (ops/quant.py, rows of K, any K). A group computes a TM x TN tile, each item WM x WN outputs; K in
     steps of TK bytes through LOCAL tiles of 32-bit words (4 int8 each, k-major: As[TK/4][TM],
     Bs[TK/4][TN]). The four-way int8 dot of two words is CUDA's __dp4a (sm_61+) under
     ANYDEVICE_CUDA, else the portable sign-extended products (what PoCL runs). The weight's words
     are 32-bit loads where K % 4 == 0 (rows then start 4-byte aligned), else assembled from bytes.
     Epilogue y = (sx[m] * sw[n]) * (float)acc + bias[n]. */
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef TK
#define TK 32
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#define TKW (TK / 4)
#define NT ((TM / WM) * (TN / WN))

typedef signed char ad_i8;

DEVICE_FN int ad_sx8(int v) { return ((v & 0xff) ^ 0x80) - 0x80; }

DEVICE_FN int ad_dot4(int a, int b, int c)
{
#if defined(ANYDEVICE_CUDA)
    return __dp4a(a, b, c);
#else
    return c + ad_sx8(a) * ad_sx8(b) + ad_sx8(a >> 8) * ad_sx8(b >> 8) + ad_sx8(a >> 16) * ad_sx8(b >> 16)
             + ad_sx8(a >> 24) * ad_sx8(b >> 24);
#endif
}

KERNEL void ad_w8a8_rows(const GLOBAL float *RESTRICT x, const OFF_T x_off, GLOBAL ad_i8 *RESTRICT xq,
                         GLOBAL float *RESTRICT sx, const int M, const int K, const int ldq)
{
    LOCAL float red[BLOCK];
    LOCAL int badv[BLOCK];
    const int m = GRP0, t = LID0;
    const GLOBAL float *row = x + x_off + (OFF_T)m * K;
    float amax = 0.0f;
    int bad = 0;
    for (int k = t; k < K; k += BLOCK) {
        const float a = AD_FABS(row[k]);
        bad |= !(a <= 3.402823466e38f);  /* Inf or NaN */
        amax = a > amax ? a : amax;
    }
    red[t] = amax;
    badv[t] = bad;
    BARRIER();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) {
            red[t] = red[t + s] > red[t] ? red[t + s] : red[t];
            badv[t] |= badv[t + s];
        }
        BARRIER();
    }
    amax = red[0];
    bad = badv[0];
    const float s = bad ? AD_BITS_TO_FLOAT(0x7fc00000u) : (amax > 0.0f ? amax / 127.0f : 1.0f);
    if (t == 0) sx[m] = s;
    const float d = bad ? 1.0f : s;
    GLOBAL ad_i8 *dst = xq + (OFF_T)m * ldq;
    for (int k = t; k < ldq; k += BLOCK) {
        const float v = (bad || k >= K) ? 0.0f : row[k] / d;
        float r = (float)(int)(v + AD_COPYSIGN(0.5f, v));  /* trunc: |v| <= 127.5 */
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        dst[k] = (ad_i8)(int)r;
    }
}

KERNEL void ad_w8a8_gemm(const GLOBAL ad_i8 *RESTRICT xq, const int ldq, const GLOBAL ad_i8 *RESTRICT wq,
                         const GLOBAL float *RESTRICT sx, const GLOBAL float *RESTRICT sw,
                         const GLOBAL float *RESTRICT bias, const int has_bias, GLOBAL float *RESTRICT y,
                         const int M, const int N, const int K)
{
    LOCAL int As[TKW][TM];
    LOCAL int Bs[TKW][TN];
    const int tx = LID0, ty = LID1, tid = ty * (TN / WN) + tx;
    const int m0 = GRP1 * TM, n0 = GRP0 * TN;
    const int kal = (K & 3) == 0;
    int acc[WM][WN];
    for (int i = 0; i < WM; i++)
        for (int j = 0; j < WN; j++) acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int w = tid; w < TM * TKW; w += NT) {  /* A: rows of xq, zero padded to ldq */
            const int r = w / TKW, kw = w - r * TKW, m = m0 + r;
            As[kw][r] = m < M ? *(const GLOBAL int *)(xq + (OFF_T)m * ldq + k0 + 4 * kw) : 0;
        }
        for (int w = tid; w < TN * TKW; w += NT) {  /* B: rows of the weight, any K */
            const int r = w / TKW, kw = w - r * TKW, n = n0 + r, k = k0 + 4 * kw;
            int v = 0;
            if (n < N && k < K) {
                const GLOBAL ad_i8 *p = wq + (OFF_T)n * K + k;
                if (kal) {
                    v = *(const GLOBAL int *)p;
                } else {
                    const int c = K - k;
                    v = (p[0] & 0xff) | (c > 1 ? (p[1] & 0xff) << 8 : 0) | (c > 2 ? (p[2] & 0xff) << 16 : 0)
                        | (c > 3 ? (int)((unsigned)(p[3] & 0xff) << 24) : 0);
                }
            }
            Bs[kw][r] = v;
        }
        BARRIER();
        for (int kw = 0; kw < TKW; kw++) {
            int a[WM], b[WN];
            for (int i = 0; i < WM; i++) a[i] = As[kw][ty + i * (TM / WM)];
            for (int j = 0; j < WN; j++) b[j] = Bs[kw][tx + j * (TN / WN)];
            for (int i = 0; i < WM; i++)
                for (int j = 0; j < WN; j++) acc[i][j] = ad_dot4(a[i], b[j], acc[i][j]);
        }
        BARRIER();
    }
    for (int i = 0; i < WM; i++) {
        const int m = m0 + ty + i * (TM / WM);
        if (m >= M) continue;
        const float sm = sx[m];
        for (int j = 0; j < WN; j++) {
            const int n = n0 + tx + j * (TN / WN);
            if (n < N) y[(OFF_T)m * N + n] = (sm * sw[n]) * (float)acc[i][j] + (has_bias ? bias[n] : 0.0f);
        }
    }
}
