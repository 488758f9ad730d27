/* The tensor-core decode kernels' shared pieces: mma.sync on BF16
 * (mmt_slice, mmt_finish: mmt.cu's kernels) and the K split by the
 * weight's shape (mmt_slices), which mmq.cu's kernels use too. */
#ifndef AG_CUDA_MMT_CUH
#define AG_CUDA_MMT_CUH

#include "backend/cuda/common.cuh"

/* ---- matmul: decode rows of BF16 weights on the tensor cores ---- */

/* A GEMV reads the weight once per MMV_TOK tokens and spends 8 FMAs and
 * the activation loads of 8 tokens per weight element: at 64 decoding
 * sequences an 8B BF16 model reached 428 tok/s in all (a step read the
 * weights 8 times). mmt_bf16 multiplies with mma.sync m16n8k16 (BF16
 * operands, FP32 accumulation): one pass over the weight for up to 32
 * tokens, and at batch 1 the same streaming of the weight as a GEMV.
 *
 * BATCH INVARIANCE. Every decode row of a BF16 weight goes through this
 * kernel, whatever the batch (1 token or 200). A token's result is the sum
 * of its own column of the mma accumulators, built from the same K slices
 * in the same order for every batch: the K split (KS warps per block,
 * each a fixed slice of the 32-wide k steps) and the order in which the
 * slices' partial sums are added depend on the weight's shape only; an mma
 * computes each output element from its own row of A and column of B, so
 * the other tokens of a tile, the tile a token falls in and the number of
 * tiles (NTL) change nothing. test_backend_ops checks it bit for bit.
 *
 * FRAGMENTS. Lane (g = lane / 4, t = lane % 4) loads 16 contiguous bytes
 * (8 BF16, k = kb + 8t .. +7) of weight rows g and g + 8 and of token g's
 * activations, and feeds them to two mmas, which see the k's of a 32-wide
 * step in a permuted order: the same permutation on both operands, so each
 * product pairs the right weight with the right activation, and the loads
 * are plain 16-byte loads with no shuffle. */

static __device__ __forceinline__ void mma_bf16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                      uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* A 16-byte weight load. The weights are read once: no L1 allocation (L1
 * keeps the activations, which every warp reads), and each load asks L2
 * for its whole 256-byte segment: a warp reads 64 bytes of a row per k
 * step, so the next steps' bytes are already on their way without holding
 * registers (ptxas keeps only a few steps' loads in registers in flight;
 * at 54 registers it cannot hold U = 8 steps of them). */
static __device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
static __device__ __forceinline__ uint4 ld_act(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

/* One 32-wide k step of MT row tiles (16 rows each) by NTL token tiles (8
 * tokens each): A[m][0] holds rows g, A[m][1] rows g + 8 of tile m, X[j]
 * token g of tile j. */
template <int MT, int NTL>
static __device__ __forceinline__ void mmt_step(const uint4 (&A)[MT][2], const uint4 (&X)[NTL], float (&c)[MT][NTL][4]) {
#pragma unroll
    for (int j = 0; j < NTL; j++)
#pragma unroll
        for (int m = 0; m < MT; m++) {
            mma_bf16_16816(c[m][j], A[m][0].x, A[m][1].x, A[m][0].y, A[m][1].y, X[j].x, X[j].y);
            mma_bf16_16816(c[m][j], A[m][0].z, A[m][1].z, A[m][0].w, A[m][1].w, X[j].z, X[j].w);
        }
}

/* The end of the tensor-core decode kernels: the slices' sums of each
 * output, added in slice order ((slice 0 + slice 1) + slice 2) + ..., and
 * stored. Where all slices' accumulators fit in shared memory they are
 * stored at once and each output summed by one thread (one barrier); else
 * added into one buffer one warp after the other (KS barriers): the same
 * operations in the same order. Accumulator e of a lane: row g + 8 (e / 2),
 * token 2t + e % 2. */
template <int KS, int MT, int NTL>
static __device__ __forceinline__ void mmt_finish(const float (&c)[MT][NTL][4], int warp, int g, int t, int row0,
                                                  int tok0, int n_out, int n_tok, float *__restrict__ y) {
    constexpr int  R = MT * 16, C = NTL * 8 + 1;
    constexpr bool ALL = (size_t)KS * R * C * sizeof(float) <= 20480;
    __shared__ float part[ALL ? KS : 1][R][C];
    if (ALL) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NTL; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) part[warp][16 * m + g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = c[m][j][e];
        __syncthreads();
    } else {
        for (int w = 0; w < KS; w++) {
            if (warp == w)
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < NTL; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float *p = &part[0][16 * m + g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)];
                            *p = w == 0 ? c[m][j][e] : __fadd_rn(*p, c[m][j][e]);
                        }
            __syncthreads();
        }
    }
    for (int e = threadIdx.x; e < R * NTL * 8; e += blockDim.x) {
        const int r = e % R, tk = e / R;
        if (row0 + r >= n_out || tok0 + tk >= n_tok) continue;
        float v = part[0][r][tk];
        if (ALL)
#pragma unroll
            for (int w = 1; w < KS; w++) v = __fadd_rn(v, part[w][r][tk]);
        y[(size_t)(tok0 + tk) * n_out + row0 + r] = v;
    }
}

/* Where lane (g, t) of a tensor-core decode warp reads: rows g and g + 8
 * of each of its MT row tiles from row0 (clamped to the matrix; their
 * results are dropped), 16 bytes at 16 t of each 64-byte step ... */
template <int MT>
static __device__ __forceinline__ void mmt_lane_rows(const uint8_t *W, size_t row_bytes, int n_out, int row0, int g,
                                                     int t, const uint4 *(&wp)[MT][2]) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wp[m][h] = (const uint4 *)(W + (size_t)min(row0 + 16 * m + 8 * h + g, n_out - 1) * row_bytes) + t;
}
/* ... and token g of each of its NTL token tiles from tok0 (clamped; xv:
 * whether it exists, else it reads zeros). */
template <int NTL>
static __device__ __forceinline__ void mmt_lane_tokens(const __nv_bfloat16 *x, int K, int n_tok, int tok0, int g, int t,
                                                       const uint4 *(&xp)[NTL], bool (&xv)[NTL]) {
#pragma unroll
    for (int j = 0; j < NTL; j++) {
        const int tok = tok0 + 8 * j + g;
        xv[j] = tok < n_tok;
        xp[j] = (const uint4 *)(x + (size_t)min(tok, n_tok - 1) * K) + t;
    }
}

/* Step st of a slice by plain loads, zeros past K (a slice's tail, and a
 * last step past K): rows' pointers wp, tokens' xp (xv: the token exists). */
template <int MT, int NTL>
static __device__ __forceinline__ void mmt_step_direct(const uint4 *const (&wp)[MT][2], const uint4 *const (&xp)[NTL],
                                                       const bool (&xv)[NTL], int K, int t, int st,
                                                       float (&c)[MT][NTL][4]) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const bool  valid = 32 * st + 8 * t + 8 <= K;
    uint4       A[MT][2], X[NTL];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) A[m][h] = valid ? __ldg(wp[m][h] + 4 * st) : zero;
#pragma unroll
    for (int j = 0; j < NTL; j++) X[j] = valid && xv[j] ? __ldg(xp[j] + 4 * st) : zero;
    mmt_step<MT, NTL>(A, X, c);
}

/* The accumulators of one warp: row tiles [row0, +16 MT) by token tiles
 * [tok0, +8 NTL), over the 32-wide k steps [s0, s1); rows past n_out read
 * the last row (their results are dropped), tokens past n_tok zeros. U
 * steps' loads are issued before their mmas (more bytes in flight where
 * the tiles are small). The order of the mmas on an accumulator is the
 * step order, whatever U: a row's bits depend on its slice only. */
template <int MT, int NTL, int U>
static __device__ __forceinline__ void mmt_slice(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                 const __nv_bfloat16 *__restrict__ x, int n_tok, int row0, int tok0,
                                                 int s0, int s1, float (&c)[MT][NTL][4]) {
    const int    lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint4 *wp[MT][2];
    mmt_lane_rows<MT>(W, row_bytes, n_out, row0, g, t, wp);
    const int  full = K / 32; /* steps whose 32 k's all exist */
    uint4      A0[U][MT][2];     /* the first U steps' weights, loaded before the wait */
    const bool first = s0 + U <= min(s1, full);
    if (first)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int m = 0; m < MT; m++)
                A0[u][m][0] = ld_stream(wp[m][0] + 4 * (s0 + u)), A0[u][m][1] = ld_stream(wp[m][1] + 4 * (s0 + u));
    pdl_entry();
    const uint4 *xp[NTL];
    bool         xv[NTL];
    mmt_lane_tokens<NTL>(x, K, n_tok, tok0, g, t, xp, xv);
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NTL; j++) c[m][j][0] = c[m][j][1] = c[m][j][2] = c[m][j][3] = 0.0f;
    int st = s0;
    if (first) {
        uint4 X[U][NTL];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NTL; j++) X[u][j] = xv[j] ? ld_act(xp[j] + 4 * (st + u)) : zero;
#pragma unroll
        for (int u = 0; u < U; u++) mmt_step<MT, NTL>(A0[u], X[u], c);
        st += U;
    }
    for (; st + U <= min(s1, full); st += U) {
        uint4 A[U][MT][2], X[U][NTL];
#pragma unroll
        for (int u = 0; u < U; u++) {
#pragma unroll
            for (int m = 0; m < MT; m++)
                A[u][m][0] = ld_stream(wp[m][0] + 4 * (st + u)), A[u][m][1] = ld_stream(wp[m][1] + 4 * (st + u));
#pragma unroll
            for (int j = 0; j < NTL; j++) X[u][j] = xv[j] ? ld_act(xp[j] + 4 * (st + u)) : zero;
        }
#pragma unroll
        for (int u = 0; u < U; u++) mmt_step<MT, NTL>(A[u], X[u], c);
    }
    for (; st < s1; st++) mmt_step_direct<MT, NTL>(wp, xp, xv, K, t, st, c); /* the tail, a last step past K */
}

/* The slice [*s0, *s1) of the 32-wide k steps that slice w of ks takes. */
static __device__ __forceinline__ void mmt_slice_range(int K, int ks, int w, int *s0, int *s1) {
    const int steps = (K + 31) / 32, per = (steps + ks - 1) / ks;
    *s0 = min(steps, w * per);
    *s1 = min(steps, *s0 + per);
}

/* The kernel for a weight of n_out rows and a batch of n decode rows, with
 * *rows and *toks per block and *warps per block. The K split (the warps)
 * is chosen by the weight's shape only: the fewest slices (4, 8 or 16) for
 * which the matrix's 16-row tiles times the slices reach MMT_TARGET_WARPS,
 * so a small matrix (an 8B model's k/v projection) still has loads in
 * flight on every SM. The tile: one row tile per warp and up to 16 tokens
 * at small batches; beyond, mmt_for's tiles by 32 tokens (larger batches
 * take several blocks along x, adjacent: all but the first read the weight
 * from L2). */
#define MMT_TARGET_WARPS 2048 /* H200, 8B BF16 (tok/s at batch 1 / 8 / 64): 1024: 161 / 1223 / 4027;
                                 2048: 174 / 1334 / 3724; 4096: 144 / - / 3422; 8192: 142 / - / 3148 */
/* The K slices (= warps per block) of a weight of n_out rows, for every
 * tensor-core decode kernel: by the shape only, never the batch. */
static inline int mmt_slices(int n_out, int target) {
    const int tiles = (n_out + 15) / 16;
    return tiles * 4 >= target ? 4 : tiles * 8 >= target ? 8 : 16;
}

#endif
