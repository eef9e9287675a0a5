/* Windowed attention on the blocks of a banded layout, float32, one block at a time:
   scores of the block's Bq queries against its K_w window keys by BLAS (sgemm_), the softmax
   over each row's interval of allowed keys (row max, exp in place, row sum), A V by BLAS, the
   output rows divided by their sums. Weights below FLT_MIN are 0, as flush_subnormal leaves
   them. Built at install time by rankcollapse.dynamics.native; sgemm_ is the BLAS torch
   links. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

__attribute__((__simd__("notinbranch"))) extern float expf(float);
extern void sgemm_(const char *, const char *, const int *, const int *, const int *, const float *,
                   const float *, const int *, const float *, const int *, const float *, float *, const int *);

/* Blocks b0 .. b1-1 of n tokens. Row-major Q (row stride ldq, padded to whole blocks), K (ldk),
   V (ldv), out (ldo); block b's window is keys offset + b*bq .. offset + b*bq + kw - 1, of which
   the part inside 0 .. n-1 is read; row i attends window keys lo[i] .. hi[i] (i = b*bq + r, all
   inside the sequence). Returns 0, or 1 when out of memory. */
int banded_blocks_f32(const float *Q, long ldq, const float *K, long ldk, const float *V, long ldv,
                      float *out, long ldo, long b0, long b1, int bq, int kw, long offset, long n, int d, int dv,
                      const int *lo, const int *hi, float scale) {
    float *s = malloc(sizeof(float) * (size_t)bq * kw);
    float *o = malloc(sizeof(float) * (size_t)bq * dv);
    float *inv = malloc(sizeof(float) * (size_t)bq);
    if (!s || !o || !inv) {
        free(s); free(o); free(inv);
        return 1;
    }
    const float zero = 0.f, one = 1.f;
    const int ldq_i = (int)ldq, ldk_i = (int)ldk, ldv_i = (int)ldv;
    for (long b = b0; b < b1; ++b) {
        const long start = offset + b * bq;
        const int k0 = start < 0 ? (int)-start : 0;                 /* window keys inside the sequence */
        const int k1 = start + kw > n ? (int)(n - start) : kw;
        const int width = k1 - k0;
        if (width <= 0) {  /* a window wholly outside (only placeholder rows can have one) */
            for (int r = 0; r < bq; ++r)
                for (int j = 0; j < dv; ++j) out[(b * bq + r) * ldo + j] = 0.f;
            continue;
        }
        const float *q = Q + b * bq * ldq;
        const float *k = K + (start + k0) * ldk;
        const float *v = V + (start + k0) * ldv;
        /* column-major view: s^T (width x bq) = k (width x d) q^T (d x bq), rows k0.. of s */
        sgemm_("T", "N", &width, &bq, &d, &scale, k, &ldk_i, q, &ldq_i, &zero, s + k0, &kw);
        for (int r = 0; r < bq; ++r) {
            float *x = s + (long)r * kw;
            int a = lo[b * bq + r], e = hi[b * bq + r] + 1;
            a = a < k0 ? k0 : a;  /* placeholder rows (padding, global queries) may name a key outside */
            e = e > k1 ? k1 : e;
            if (e <= a) {
                for (int j = 0; j < kw; ++j) x[j] = 0.f;
                inv[r] = 0.f;
                continue;
            }
            float m = -INFINITY;
#pragma omp simd reduction(max : m)
            for (int j = a; j < e; ++j) m = x[j] > m ? x[j] : m;
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int j = a; j < e; ++j) {
                float t = expf(x[j] - m);
                t = t < FLT_MIN ? 0.f : t;
                x[j] = t;
                sum += t;
            }
            for (int j = 0; j < a; ++j) x[j] = 0.f;
            for (int j = e; j < kw; ++j) x[j] = 0.f;
            inv[r] = 1.f / sum;
        }
        /* o^T (dv x bq) = v^T (dv x width) s^T (width x bq) */
        sgemm_("N", "N", &dv, &bq, &width, &one, v, &ldv_i, s + k0, &kw, &zero, o, &dv);
        for (int r = 0; r < bq; ++r) {
            float *y = out + (b * bq + r) * ldo;
            const float *z = o + (long)r * dv;
            const float f = inv[r];
#pragma omp simd
            for (int j = 0; j < dv; ++j) y[j] = z[j] * f;
        }
    }
    free(s); free(o); free(inv);
    return 0;
}
