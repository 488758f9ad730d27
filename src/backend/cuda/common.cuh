/* The CUDA backend's common layer, included by every .cu of
 * src/backend/cuda (through state.cuh): the CUDA_TRY/BLAS_TRY/LAUNCHED
 * checks, programmatic dependent launch (pdl_entry) and the asynchronous
 * copies around it, the staged weight rows, the grid constants several
 * families share, warp and block reductions, the BF16 and int8 copies of
 * activations every producer leaves (prep_store*), the activation
 * products, and the launch-size helpers.
 *
 * Device helpers here are static (inline): each translation unit compiles
 * its own copy, so a kernel's code is what it was when every kernel lived
 * in one file (scripts/cuda_ptx_compare.py checks it). There are no
 * __constant__ or __device__ variables: the files build without
 * relocatable device code. */
#ifndef AG_CUDA_COMMON_CUH
#define AG_CUDA_COMMON_CUH

extern "C" {
#include "backend/backend.h"
#include "base/log.h"
#include "base/switches.h"
#include "kv/kv.h"
}
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cfloat>
#include <climits>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <type_traits>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_quant.cuh"

/* ---- errors ---- */

static inline ag_status cuda_fail(const char *file, int line, const char *what, cudaError_t e) {
    return ag_errorf(e == cudaErrorMemoryAllocation ? AG_ERR_NOMEM : AG_ERR_IO, "CUDA error at %s:%d (%s): %s", file,
                     line, what, cudaGetErrorString(e));
}
static inline ag_status blas_fail(const char *file, int line, const char *what, cublasStatus_t e) {
    return ag_errorf(e == CUBLAS_STATUS_ALLOC_FAILED ? AG_ERR_NOMEM : AG_ERR_IO, "cuBLAS error at %s:%d (%s): status %d",
                     file, line, what, (int)e);
}
#define CUDA_TRY(call)                                                            \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) return cuda_fail(__FILE__, __LINE__, #call, e_);   \
    } while (0)
#define BLAS_TRY(call)                                                                     \
    do {                                                                                   \
        cublasStatus_t e_ = (call);                                                        \
        if (e_ != CUBLAS_STATUS_SUCCESS) return blas_fail(__FILE__, __LINE__, #call, e_);  \
    } while (0)
/* after a kernel launch: a bad configuration shows here, a fault at the next sync */
#define LAUNCHED() CUDA_TRY(cudaGetLastError())

/* ---- programmatic dependent launch (PDL, Hopper) ----
 *
 * At batch 1 a decode step is ~300 dependent kernels, and each one's ramp
 * (launch, first loads) and drain left DRAM idle (ncu: small kernels ~40 us
 * a layer). With s->pdl_on (AUGUR_CUDA_PDL=0 turns it off), every kernel is
 * launched (launch_k) with programmatic stream serialization: the GPU may
 * start it while the kernel before it in the stream still runs. So every
 * kernel begins with pdl_entry(): griddepcontrol.wait blocks until the
 * previous grid has completed and its writes are visible; all reads of
 * activations and all writes come after it. Since every kernel waits for
 * its predecessor, completion is transitive along the stream, as without
 * PDL. launch_dependents then lets the next kernel start early in turn.
 * Weights never change during a pass, so a GEMV may read them before the
 * wait, overlapping that DRAM traffic with the previous kernel: the
 * K-quant GEMVs (mmqv, the fp32 ones) prefetch each warp's first loop
 * iteration into L2 (prefetch_l2), the tensor-core BF16 kernels
 * (mmt_slice) load their first steps' weights into registers. Which one
 * where was measured (8B, H200, batch 1, tok/s; Q4_K_M on the dp4a GEMVs
 * that mmqv replaced): Q4_K_M 306 with PDL alone, 314 with the prefetch, 309
 * with register loads instead (298 serial, AUGUR_CUDA_PDL=0, prefetching);
 * BF16 214 with PDL alone, 174 with the prefetch (many small bulk
 * prefetches per warp), 227 with register loads (211 serial). Without the attribute (or before sm_90) the two
 * griddepcontrol instructions are no-ops. */
#ifndef PDL_PF_MUL /* (-D for tuning) the prefetch: this many first loop iterations of a warp's row; 0: none */
#define PDL_PF_MUL 1
#endif

static __device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16 bytes global -> shared, asynchronously; src_bytes 0: zeros */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Bytes [p, p + bytes) of a weight into L2, one bulk prefetch (the 16-byte
 * aligned inside of the range; nothing if that is empty). */
static __device__ __forceinline__ void prefetch_l2(const void *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = ((uintptr_t)p + 15) & ~(uintptr_t)15, e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((uint32_t)(e - a)) : "memory");
#endif
}

/* ---- staged weight rows (s->stage_mode) ----
 *
 * An mmqv block's rows lie back to back in W, so one bulk copy (the TMA's
 * cp.async.bulk) brings all of them into shared memory, and it is issued
 * before the PDL wait. A warp then has its whole row in flight at once
 * instead of a few steps of blocks in registers, and the copy overlaps the
 * previous kernel's tail. The arithmetic is the same, lane for lane: the
 * bits do not change. Where it pays was measured on the dp4a GEMVs that
 * mmqv replaced, which staged the same way (H100, 8B Q4_K_M, batch 1,
 * tok/s, two rounds; ncu before: the GEMVs at 1.1-2.0 TB/s of 3.35, 76% of
 * the warps' time waiting on L1TEX loads): in the group launches (q/k/v,
 * gate/up) 320.9 / 319.5, against 301.7 / 302.6 unstaged and 299.2 / 299.4
 * with gate/up pairs alone (the earlier default); staged in every kernel
 * 301.5 / 300.2: the single weights (o, down, the output) lose as much,
 * long Q6_K rows most (46 KB a block: 4 blocks an SM, each waiting for all
 * its rows before any arithmetic). stage_rows: thread 0
 * sets up the block's barrier and issues the copy (bytes a multiple of 16,
 * both ends 16-byte aligned: mmv_stage_bytes checks); then every thread
 * must pass the block barrier before stage_wait. */
template <bool ST, class T>
static __device__ __forceinline__ T wld(const T *p) { /* a weight load: staged copy, or global through the read-only path */
    if constexpr (ST) return *p;
    else return __ldg(p);
}
static __device__ __forceinline__ void stage_rows(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar), d = (uint32_t)__cvta_generic_to_shared(dst);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
                     "l"(src), "r"(bytes), "r"(b)
                     : "memory");
    }
    __syncthreads();
#endif
}
static __device__ __forceinline__ void stage_wait(uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t       done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b)
                     : "memory");
#endif
}

/* argmax_split_k: blocks per row */
#define ARGMAX_SLICES 16

/* the pick and cands ops' split grids: slices in one launch at most,
 * slices of a row at most, the fewest values a slice takes, and
 * pick_max_k's and pick_split_k's threads a block */
#define SPLIT_BLOCKS       512
#define SPLIT_MAX_SLICES   32
#define SPLIT_MIN_SLICE    2048
#define PICK_SPLIT_THREADS 256

/* rope_kv_store: the widest rotary half it takes (head dims up to 256) */
#define ROPE_MAX_HALF 128

/* attention tiles of prompt rows: query rows per tile, positions per chunk */
#define ATT_TQ 16
#define FA_ROWS_MAX 3 /* row tiles a block of attention_fa1_k */
#define BTILE_MAX 4   /* row tiles in the longest tiles begin lists (attention_wg_k's 64 rows) */
#define ATT_TK 64

/* Activation formats of decode rows (bit flags): int8 per 32 with scales
 * (quantize_q8_32), BF16 (f32_to_bf16). */
enum { XR_Q8 = 1, XR_BF16 = 2, XR_PROMPT_BF16 = 4 }; /* XR_PROMPT_BF16: x's prompt rows as BF16 in d_xbf */

/* ---- warp and block reductions ---- */

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < n_warps; i++) t += red[i];
    return t;
}

static __device__ float block_max(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < n_warps; i++) t = fmaxf(t, red[i]);
    return t;
}

/* ---- activations left in the decode rows' formats (prep_*) ---- */

/* Four floats rounded to BF16 (round to nearest even) at d (8-byte aligned):
 * the one rounding every BF16 copy of activations uses. */
static __device__ __forceinline__ void store_bf16x4(__nv_bfloat16 *d, float4 v) {
    __nv_bfloat162 lo, hi;
    lo.x = __float2bfloat16_rn(v.x), lo.y = __float2bfloat16_rn(v.y);
    hi.x = __float2bfloat16_rn(v.z), hi.y = __float2bfloat16_rn(v.w);
    ((__nv_bfloat162 *)d)[0] = lo, ((__nv_bfloat162 *)d)[1] = hi;
}

/* A warp's 32 values of one 32-block (lane i: element e, e - i aligned to
 * 32) left in the formats fmt: quantize_q8_32's and f32_to_bf16's code. */
static __device__ __forceinline__ void prep_store1(float v, size_t e, int fmt, int8_t *__restrict__ xq,
                                                   float2 *__restrict__ xs, __nv_bfloat16 *__restrict__ xh) {
    if (fmt & XR_BF16) xh[e] = __float2bfloat16_rn(v);
    if (fmt & XR_Q8) {
        float amax = fabsf(v);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = amax / 127.0f;
        const int   q = amax == 0.0f ? 0 : __float2int_rn(v / d);
        xq[e] = (int8_t)q;
        int sum = q;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((threadIdx.x & 31) == 0) xs[e / 32] = make_float2(d, __fmul_rn(d, (float)sum));
    }
}

/* Lane group of 8 threads (4 consecutive floats each: one 32-block) leaves
 * v, elements [e, e + 4) of the rows, in the formats fmt: the bits of
 * f32_to_bf16 and quantize_q8_32 (the block's max and Σq are exact in any
 * order). Every lane of the group must call it. */
static __device__ __forceinline__ void prep_store4(float4 v, size_t e, int fmt, int8_t *__restrict__ xq,
                                                   float2 *__restrict__ xs, __nv_bfloat16 *__restrict__ xh) {
    if (fmt & XR_BF16) store_bf16x4(xh + e, v);
    if (fmt & XR_Q8) {
        const unsigned m = 0xffu << (threadIdx.x & 24);
        float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(m, amax, o));
        const float d = amax / 127.0f;
        const int q0 = amax == 0.0f ? 0 : __float2int_rn(v.x / d), q1 = amax == 0.0f ? 0 : __float2int_rn(v.y / d),
                  q2 = amax == 0.0f ? 0 : __float2int_rn(v.z / d), q3 = amax == 0.0f ? 0 : __float2int_rn(v.w / d);
        *(char4 *)(xq + e) = make_char4((signed char)q0, (signed char)q1, (signed char)q2, (signed char)q3);
        int sum = q0 + q1 + q2 + q3;
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(m, sum, o);
        if ((threadIdx.x & 7) == 0) xs[e / 32] = make_float2(d, __fmul_rn(d, (float)sum));
    }
}

/* ---- launch sizes ---- */

static inline unsigned grid_for(size_t n, unsigned threads) {
    size_t g = (n + threads - 1) / threads;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

/* Threads for a block that gives each thread about one of `work` items:
 * a multiple of 32, at most 1024. */
static inline unsigned threads_for(int work) {
    int t = (work + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 1024 ? 1024 : t);
}

/* ---- activation products ---- */

static __device__ __forceinline__ float silu_times(float v, float u) { return v / (1.0f + expf(-v)) * u; }
/* GELU (tanh form) the way the CPU backend (and llama.cpp's) computes it:
 * of x rounded to fp16, rounded to fp16, exact limits beyond |x| >= 10. */
static __device__ __forceinline__ float gelu_f16(float v) {
    const float k = 0.7978845608028654f;
    if (v <= -10.0f) return 0.0f;
    if (v >= 10.0f) return v;
    const float h = __half2float(__float2half_rn(v));
    return __half2float(__float2half_rn(0.5f * h * (1.0f + tanhf(k * h * (1.0f + 0.044715f * h * h)))));
}
/* act(g) * u, act SiLU or GELU (gelu_f16): the one expression of the
 * activation product for every kernel that has both forms */
template <bool GELU>
static __device__ __forceinline__ float act_times(float g, float u) {
    return GELU ? gelu_f16(g) * u : silu_times(g, u);
}

#endif
