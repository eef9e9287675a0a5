/* Windowed attention on the inner blocks of a banded layout, float32, one block at a time:
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

/* Blocks b0 .. b1-1. Row-major Q (row stride ldq), K (ldk), V (ldv), out (ldo); block b reads
   keys offset + b*bq .. offset + b*bq + kw - 1, all inside the sequence; row r of a block
   attends window keys lo[r] .. hi[r]. Returns 0, or 1 when out of memory. */
int banded_blocks_f32(const float *Q, long ldq, const float *K, long ldk, const float *V, long ldv,
                      float *out, long ldo, long b0, long b1, int bq, int kw, long offset, int d, int dv,
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
        const float *q = Q + b * bq * ldq;
        const float *k = K + (offset + b * bq) * ldk;
        const float *v = V + (offset + b * bq) * ldv;
        /* column-major view: s^T (kw x bq) = k (kw x d) q^T (d x bq) */
        sgemm_("T", "N", &kw, &bq, &d, &scale, k, &ldk_i, q, &ldq_i, &zero, s, &kw);
        for (int r = 0; r < bq; ++r) {
            float *x = s + (long)r * kw;
            const int a = lo[r], e = hi[r] + 1;
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
        /* o^T (dv x bq) = v^T (dv x kw) s^T (kw x bq) */
        sgemm_("N", "N", &dv, &bq, &kw, &one, v, &ldv_i, s, &kw, &zero, o, &dv);
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
