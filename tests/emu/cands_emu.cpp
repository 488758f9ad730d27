/* cands_rows_k (src/backend/cuda/cuda_backend.cu) compiled unchanged on the
 * CPU: one block's 1024 threads as pthreads, __syncthreads as a barrier,
 * warp votes, shuffles and matches through per-warp barriers, shared
 * memory as statics, atomics as host atomics. Each row's output is compared
 * with ag_top_cands_f32 (every field; sumexp to 1e-9): rows of ties, -0.0
 * with +0.0, subnormals, NaN, +inf with FLT_MAX, nothing finite, k of 1 to
 * 257 against 256 or 257 finite values. For kernel edits on a machine
 * without a GPU (`make cuda-emu`, about 25 s at dims up to 2049, argument:
 * how many of the dims 7, 1000, 1025, 2049, 151936 to run); the GPU's own
 * check is scripts/gpu_test.sh. Exit status 1 on a mismatch. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <limits.h>
#include <vector>
extern "C" {
#include "base/argmax.h"
}
struct dim3_ { unsigned x; };
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ blockDim;
static pthread_barrier_t g_bar;
static pthread_barrier_t w_bar[32];
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(x)
#define __restrict__
#define __shared__ static
static inline void __syncthreads() { pthread_barrier_wait(&g_bar); }
static inline void pdl_entry() {}
static uint64_t w_slot[32][32];
static inline void wsync() { pthread_barrier_wait(&w_bar[threadIdx.x >> 5]); }
template <typename T> static T __shfl_xor_sync(unsigned, T v, int o) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    uint64_t b = 0; memcpy(&b, &v, sizeof v);
    wsync(); w_slot[w][l] = b; wsync();
    uint64_t r = w_slot[w][l ^ o]; T out; memcpy(&out, &r, sizeof out);
    return out;
}
static unsigned __ballot_sync(unsigned, bool p) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    wsync(); w_slot[w][l] = p; wsync();
    unsigned m = 0; for (int i = 0; i < 32; i++) m |= (w_slot[w][i] ? 1u : 0u) << i;
    return m;
}
static unsigned __match_any_sync(unsigned, uint32_t v) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    wsync(); w_slot[w][l] = v; wsync();
    unsigned m = 0; for (int i = 0; i < 32; i++) m |= (w_slot[w][i] == v ? 1u : 0u) << i;
    return m;
}
static inline int __ffs(unsigned x) { return __builtin_ffs(x); }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
#include "cands_kernel.inc" /* the kernel, cut from cuda_backend.cu by make cuda-emu */

struct targs { const float *x; int dim; const int32_t *reqs; ag_cands *out; unsigned tid; unsigned blk; };
static void *trun(void *p) {
    targs *a = (targs *)p;
    threadIdx.x = a->tid; blockIdx.x = a->blk;
    cands_rows_k(a->x, a->dim, a->reqs, a->out);
    return NULL;
}
static void launch(const float *x, int dim, const int32_t *reqs, ag_cands *out, int nrows) {
    blockDim.x = CANDS_THREADS;
    for (int b = 0; b < nrows; b++) {
        std::vector<pthread_t> th(CANDS_THREADS); std::vector<targs> ta(CANDS_THREADS);
        for (int t = 0; t < CANDS_THREADS; t++) { ta[t] = {x, dim, reqs, out, (unsigned)t, (unsigned)b}; pthread_create(&th[t], NULL, trun, &ta[t]); }
        for (int t = 0; t < CANDS_THREADS; t++) pthread_join(th[t], NULL);
    }
}
static uint64_t st = 99;
static uint64_t xr() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float gs() { double u = (xr() >> 11) * 0x1p-53 + 1e-12, v = (xr() >> 11) * 0x1p-53; return (float)(sqrt(-2 * log(u)) * cos(6.2831853 * v)); }
int main(int argc, char **argv) {
    pthread_barrier_init(&g_bar, NULL, CANDS_THREADS);
    for (int w = 0; w < 32; w++) pthread_barrier_init(&w_bar[w], NULL, 32);
    int dims[] = {7, 1000, 1025, 2049, 151936};
    int nd = argc > 1 ? atoi(argv[1]) : 7;
    long bad = 0, n = 0;
    for (int di = 0; di < nd; di++) {
        int dim = dims[di];
        const int R = 12;
        std::vector<float> x((size_t)R * dim);
        for (int r = 0; r < R; r++) {
            float *row = &x[(size_t)r * dim];
            for (int i = 0; i < dim; i++) {
                switch (r) {
                case 0: row[i] = gs() * 3; break;
                case 1: row[i] = 1.0f; break;
                case 2: row[i] = (float)(xr() % 4) * 0.25f; break;
                case 3: row[i] = (i % 3) ? -INFINITY : NAN; break;
                case 4: row[i] = (xr() % 600 == 0) ? (float)(xr() % 3) : -INFINITY; break;
                case 5: { int q = xr() % 7; float s[] = {0.0f, -0.0f, 1e-45f, -1e-45f, INFINITY, FLT_MAX, -FLT_MAX}; row[i] = s[q]; } break;
                case 6: row[i] = i < dim - 257 ? -INFINITY : 2.0f; break;
                case 7: row[i] = i < dim - 256 ? NAN : 2.0f; break;
                case 8: row[i] = gs() * 0.001f; break;
                case 9: row[i] = (i % 2) ? -0.0f : 0.0f; break;
                case 10: row[i] = -gs() * gs() * 50; break;
                default: row[i] = (xr() % 2) ? 7.0f : -INFINITY; break;
                }
            }
        }
        int ks[] = {1, 256, 40, 256, 255, 256, 256, 256, 2, 256, 257, 128};
        std::vector<int32_t> reqs(R);
        std::vector<ag_cands> got(R), want(R);
        for (int r = 0; r < R; r++) {
            ag_cands_req q = {ks[r], r % 2};
            reqs[r] = (q.k & 0xffff) | (q.want_z ? 1 << 16 : 0);
            ag_top_cands_f32(&x[(size_t)r * dim], dim, &q, &want[r]);
        }
        launch(x.data(), dim, reqs.data(), got.data(), R);
        for (int r = 0; r < R; r++) {
            n++;
            const ag_cands *g = &got[r], *w = &want[r];
            bool ok = g->n == w->n && g->n_finite == w->n_finite && memcmp(&g->max, &w->max, 4) == 0;
            for (int i = 0; ok && i < w->n; i++) ok = g->c[i].id == w->c[i].id && memcmp(&g->c[i].l, &w->c[i].l, 4) == 0;
            if (r % 2) ok = ok && (w->n_finite == 0 ? g->sumexp == w->sumexp : fabs(g->sumexp - w->sumexp) <= 1e-9 * w->sumexp);
            else ok = ok && isnan(g->sumexp) && isnan(w->sumexp);
            if (!ok) { bad++; printf("MISMATCH dim %d row %d: n %d/%d nf %d/%d max %g/%g z %.17g/%.17g c0 %d/%d\n", dim, r, g->n, w->n, g->n_finite, w->n_finite, g->max, w->max, g->sumexp, w->sumexp, g->c[0].id, w->c[0].id); }
        }
        printf("dim %d done\n", dim); fflush(stdout);
    }
    printf("rows %ld bad %ld\n", n, bad);
    return bad != 0;
}
