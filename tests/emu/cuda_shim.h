/* A CPU stand-in for the CUDA runtime a kernel's code uses, so that the
 * code compiles unchanged as C++ and one thread block runs as pthreads
 * (emu_launch): threadIdx/blockIdx per thread, __syncthreads as a barrier
 * of the block, warp ballots, shuffles and matches through a barrier of the
 * warp, __shared__ as statics (one block at a time), atomics as host
 * atomics, the float/bit intrinsics as their definitions. Only what the
 * emulated kernels use (tests/emu/). Every lane of a warp must reach each
 * warp intrinsic, as on the GPU with a full mask (a partial last warp
 * would hang). Limits: shared memory starts zeroed and keeps the last
 * block's contents (a kernel that reads shared memory before writing it
 * can pass here), and the host compiler's floating-point contraction is
 * not the GPU's. */
#ifndef AG_TESTS_EMU_CUDA_SHIM_H
#define AG_TESTS_EMU_CUDA_SHIM_H
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <limits.h>
#include <tuple>
#include <vector>
extern "C" {
#include "base/argmax.h"
}
struct dim3_ { unsigned x, y; };
static thread_local dim3_ threadIdx, blockIdx;
static dim3_ blockDim, gridDim;
static pthread_barrier_t g_bar;
static pthread_barrier_t w_bar[32];
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(...)
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
struct float4 { float x, y, z, w; };
static inline double __hiloint2double(int hi, int lo) {
    uint64_t b = ((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo;
    double d; memcpy(&d, &b, 8); return d;
}
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fsqrt_rn(float a) { volatile float r = sqrtf(a); return r; }
static inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
static inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
/* blocks run one at a time here: every write is seen by the next block */
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
static inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* Runs kern(args...) as n_blocks (x) by grid_y blocks of `threads`
 * threads, one block at a time (the statics that stand for shared memory
 * are one block's): the threads are made once and take the blocks in turn,
 * x fastest, meeting at a barrier between blocks. */
template <typename... A>
static void emu_launch_xy(void (*kern)(A...), int n_blocks, int grid_y, int threads, A... args) {
    /* the block's barrier for this launch's thread count (whole warps) */
    pthread_barrier_init(&g_bar, NULL, (unsigned)threads);
    for (int w = 0; w < 32; w++) pthread_barrier_init(&w_bar[w], NULL, 32);
    blockDim.x = (unsigned)threads;
    gridDim.x = (unsigned)n_blocks, gridDim.y = (unsigned)grid_y;
    struct targ { void (*k)(A...); unsigned t; int nb, ny; std::tuple<A...> a; };
    std::vector<pthread_t> th((size_t)threads);
    std::vector<targ>      ta((size_t)threads);
    for (int t = 0; t < threads; t++) {
        ta[(size_t)t] = targ{kern, (unsigned)t, n_blocks, grid_y, std::tuple<A...>(args...)};
        pthread_create(&th[(size_t)t], NULL, [](void *p) -> void * {
            targ *x = (targ *)p;
            threadIdx.x = x->t;
            for (int b = 0; b < x->nb * x->ny; b++) {
                blockIdx.x = (unsigned)(b % x->nb), blockIdx.y = (unsigned)(b / x->nb);
                std::apply(x->k, x->a);
                pthread_barrier_wait(&g_bar); /* the block is done before the next one starts */
            }
            return NULL;
        }, &ta[(size_t)t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[(size_t)t], NULL);
    pthread_barrier_destroy(&g_bar);
    for (int w = 0; w < 32; w++) pthread_barrier_destroy(&w_bar[w]);
}
template <typename... A> static void emu_launch(void (*kern)(A...), int n_blocks, int threads, A... args) {
    emu_launch_xy(kern, n_blocks, 1, threads, args...);
}

#endif
