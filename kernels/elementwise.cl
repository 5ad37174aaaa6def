/* Elementwise, copy, pad and reduction kernels (plain OpenCL C, both families).

   Work split for the flat kernels: work item g handles elements [g*chunk, min(n, g*chunk+chunk)).
   CPU devices use big chunks (few work items, contiguous runs); GPUs use chunk = 1.
   NaN propagates as in PyTorch: comparisons are written so a NaN operand wins.
*/

#define OP_ABS 0
#define OP_NEG 1
#define OP_EXP 2
#define OP_LOG 3
#define OP_SQRT 4
#define OP_RELU 5
#define OP_SIGMOID 6
#define OP_TANH 7
#define OP_GELU 8
#define OP_GELU_TANH 9
#define OP_SILU 10
#define OP_ELU 11
#define OP_LEAKY 12
#define OP_SOFTPLUS 13
#define OP_CLAMP 14

/* tanh saturated exactly to +-1 past |x| >= 10 (some libm tanh stop at 1 - ulp) */
inline float tanh_sat(float x)
{
    return fabs(x) >= 10.0f ? copysign(1.0f, x) : tanh(x);
}

inline float gelu_exact(float x)
{
    return 0.5f * x * erfc(-x * 0.70710678118654752440f);
}

inline float gelu_tanh(float x)
{
    const float inner = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh_sat(inner));
}

inline float softplus_f(float x, float beta, float thr)
{
    const float bx = x * beta;
    return bx > thr ? x : log1p(exp(bx)) / beta;
}

inline float clamp_nan(float x, float lo, float hi, int has_lo, int has_hi)
{
    float y = x;
    if (has_lo) y = (y < lo || isnan(lo)) ? lo : y;
    if (has_hi) y = (y > hi || isnan(hi)) ? hi : y;
    return y;
}

#define UNARY_LOOP(EXPR) for (long i = i0; i < i1; i++) { const float v = x[i]; y[i] = (EXPR); } break;

__kernel void unary(__global const float *x, const long x_off, __global float *y, const long y_off,
                    const long n, const long chunk, const int op, const float p0, const float p1,
                    const int f0, const int f1)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    x += x_off;
    y += y_off;
    switch (op) {
    case OP_ABS: UNARY_LOOP(fabs(v))
    case OP_NEG: UNARY_LOOP(-v)
    case OP_EXP: UNARY_LOOP(exp(v))
    case OP_LOG: UNARY_LOOP(log(v))
    case OP_SQRT: UNARY_LOOP(sqrt(v))
    case OP_RELU: UNARY_LOOP(v < 0.0f ? 0.0f : v)
    case OP_SIGMOID: UNARY_LOOP(1.0f / (1.0f + exp(-v)))
    case OP_TANH: UNARY_LOOP(tanh_sat(v))
    case OP_GELU: UNARY_LOOP(gelu_exact(v))
    case OP_GELU_TANH: UNARY_LOOP(gelu_tanh(v))
    case OP_SILU: UNARY_LOOP(v * (1.0f / (1.0f + exp(-v))))
    case OP_ELU: UNARY_LOOP(v > 0.0f ? v : p0 * expm1(v))
    case OP_LEAKY: UNARY_LOOP(v > 0.0f ? v : v * p0)
    case OP_SOFTPLUS: UNARY_LOOP(softplus_f(v, p0, p1))
    case OP_CLAMP: UNARY_LOOP(clamp_nan(v, p0, p1, f0, f1))
    default: break;
    }
}

#define BOP_ADD 0
#define BOP_SUB 1
#define BOP_MUL 2
#define BOP_DIV 3
#define BOP_POW 4
#define BOP_MIN 5
#define BOP_MAX 6

inline float bop(const int op, const float a, const float b)
{
    switch (op) {
    case BOP_ADD: return a + b;
    case BOP_SUB: return a - b;
    case BOP_MUL: return a * b;
    case BOP_DIV: return a / b;
    case BOP_POW: return pow(a, b);
    case BOP_MIN: return (a < b || isnan(a)) ? a : b;
    default: return (a > b || isnan(a)) ? a : b;
    }
}

#define BIN_LOOP(EXPR) for (long i = i0; i < i1; i++) { y[i] = (EXPR); } break;
#define BIN_OPS(A, B) \
    switch (op) { \
    case BOP_ADD: BIN_LOOP((A) + (B)) \
    case BOP_SUB: BIN_LOOP((A) - (B)) \
    case BOP_MUL: BIN_LOOP((A) * (B)) \
    case BOP_DIV: BIN_LOOP((A) / (B)) \
    case BOP_POW: BIN_LOOP(pow((A), (B))) \
    case BOP_MIN: BIN_LOOP(((A) < (B) || isnan(A)) ? (A) : (B)) \
    default: BIN_LOOP(((A) > (B) || isnan(A)) ? (A) : (B)) \
    }

/* same-shape contiguous operands; mode 0: a, b arrays; 1: a is the scalar sa; 2: b is the scalar sb */
__kernel void binary_flat(__global const float *a, const long a_off, __global const float *b, const long b_off,
                          __global float *y, const long y_off, const long n, const long chunk,
                          const int op, const int mode, const float sa, const float sb)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    a += a_off; b += b_off; y += y_off;
    if (mode == 0) { BIN_OPS(a[i], b[i]) }
    else if (mode == 1) { BIN_OPS(sa, b[i]) }
    else { BIN_OPS(a[i], sb) }
}

/* broadcasting: meta = [nd, shape[nd], astride[nd], bstride[nd]] (strides in elements, 0 = broadcast) */
__kernel void binary_nd(__global const float *a, const long a_off, __global const float *b, const long b_off,
                        __global float *y, const long y_off, const long n, const long chunk,
                        const int op, __global const long *meta)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    const int nd = (int)meta[0];
    a += a_off; b += b_off; y += y_off;
    for (long i = i0; i < i1; i++) {
        long r = i, ao = 0, bo = 0;
        for (int d = nd - 1; d >= 0; d--) {
            const long s = meta[1 + d];
            const long q = r / s, c = r - q * s;
            ao += c * meta[1 + nd + d];
            bo += c * meta[1 + 2 * nd + d];
            r = q;
        }
        y[i] = bop(op, a[ao], b[bo]);
    }
}

/* strided copy: meta = [nd, shape[nd], sstride[nd], dstride[nd]] */
__kernel void copy_nd(__global const float *src, const long s_off, __global float *dst, const long d_off,
                      const long n, const long chunk, __global const long *meta)
{
    const long i0 = (long)get_global_id(0) * chunk;
    const long i1 = min(n, i0 + chunk);
    const int nd = (int)meta[0];
    src += s_off; dst += d_off;
    for (long i = i0; i < i1; i++) {
        long r = i, so = 0, dof = 0;
        for (int d = nd - 1; d >= 0; d--) {
            const long s = meta[1 + d];
            const long q = r / s, c = r - q * s;
            so += c * meta[1 + nd + d];
            dof += c * meta[1 + 2 * nd + d];
            r = q;
        }
        dst[dof] = src[so];
    }
}

/* 2-D padding of (P, H, W) planes to (P, OH, OW); mode 0 zeros, 1 reflect, 2 replicate, 3 circular.
   One work item per output row: global (OH, P). */
inline int pad_index(int i, int n, int mode)
{
    if (mode == 1) { if (i < 0) i = -i; if (i >= n) i = 2 * (n - 1) - i; return i; }
    if (mode == 2) return clamp(i, 0, n - 1);
    if (mode == 3) { i %= n; return i < 0 ? i + n : i; }
    return (i < 0 || i >= n) ? -1 : i;
}

__kernel void pad2d(__global const float *x, const long x_off, __global float *y, const long y_off,
                    const int H, const int W, const int OH, const int OW, const int top, const int left,
                    const int mode)
{
    const int oh = get_global_id(0);
    const long p = get_global_id(1);
    if (oh >= OH) return;
    const int ih = pad_index(oh - top, H, mode);
    __global float *yr = y + y_off + (p * OH + oh) * (long)OW;
    if (ih < 0) { for (int ow = 0; ow < OW; ow++) yr[ow] = 0.0f; return; }
    const __global float *xr = x + x_off + (p * H + ih) * (long)W;
    for (int ow = 0; ow < OW; ow++) {
        const int iw = pad_index(ow - left, W, mode);
        yr[ow] = iw < 0 ? 0.0f : xr[iw];
    }
}

/* reduction of x viewed as (O, R, I) over R, in P parts: y[o, p, i] = reduce over
   r in [p*L, min(R, p*L+L)) of x[o, r, i]. op 0 sum (Neumaier compensated), 1 max, 2 min.
   Launch: global (I, O*P). */
__kernel void reduce_ori(__global const float *x, const long x_off, __global float *y, const long y_off,
                         const long O, const long R, const long I, const long P, const long L,
                         const int op, const float scale)
{
    const long i = get_global_id(0);
    const long op_ = get_global_id(1);
    if (i >= I || op_ >= O * P) return;
    const long o = op_ / P, p = op_ - o * P;
    const long r0 = p * L, r1 = min(R, r0 + L);
    const __global float *xp = x + x_off + (o * R) * I + i;
    float res;
    if (op == 0) {
        float s = 0.0f, c = 0.0f;
        for (long r = r0; r < r1; r++) {
            const float v = xp[r * I];
            const float t = s + v;
            c += fabs(s) >= fabs(v) ? (s - t) + v : (v - t) + s;
            s = t;
        }
        res = isfinite(s) ? (s + c) * scale : s * scale;
    } else if (op == 1) {
        float m = -INFINITY;
        for (long r = r0; r < r1; r++) { const float v = xp[r * I]; m = (v > m || isnan(v)) ? v : m; if (isnan(m)) break; }
        res = m;
    } else {
        float m = INFINITY;
        for (long r = r0; r < r1; r++) { const float v = xp[r * I]; m = (v < m || isnan(v)) ? v : m; if (isnan(m)) break; }
        res = m;
    }
    y[y_off + (o * P + p) * I + i] = res;
}

/* small matmul: one work item per C element, two-level summation. C[b] = A[b] . B[b] (+bias)
   A[m,k] = A[a_off + b*a_bs + m*sam + k*sak], B[k,n] = B[b_off + b*b_bs + k*sbk + n*sbn], C contiguous.
   Launch: global (N, M, batches). */
__kernel void gemm_small(const int M, const int N, const int K,
                         __global const float *A, const long a_off, const int sam, const int sak, const long a_bs,
                         __global const float *B, const long b_off, const int sbk, const int sbn, const long b_bs,
                         __global float *C, const long c_off, __global const float *bias, const int has_bias,
                         const int rows)
{
    /* one work item: rows [m0, m0 + rows) x all N columns of batch b (one launch, few work
       groups: PoCL's per-group cost dominates tiny products). Launch (1, ceil(M/rows), batches). */
    const int m0 = get_global_id(1) * rows, b = get_global_id(2);
    const int m1 = min(M, m0 + rows);
    for (int m = m0; m < m1; m++) {
        const __global float *ap = A + a_off + b * a_bs + (long)m * sam;
        for (int n = 0; n < N; n++) {
            const __global float *bp = B + b_off + b * b_bs + (long)n * sbn;
            float tot = 0.0f;
            for (int k0 = 0; k0 < K; k0 += 64) {
                const int k1 = min(K, k0 + 64);
                float acc = 0.0f;
                for (int k = k0; k < k1; k++) acc = fma(ap[(long)k * sak], bp[(long)k * sbk], acc);
                tot += acc;
            }
            if (has_bias) tot += bias[m];
            C[c_off + ((long)b * M + m) * N + n] = tot;
        }
    }
}
