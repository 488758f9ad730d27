/* Decode rows of BF16 weights on the tensor cores (mmt_bf16 and its
 * grouped, staged and lean forms; the pieces: mmt.cuh), and a
 * feed-forward block's gate/up with their product in one launch
 * (mmt_bf16_glu). */
#include "backend/cuda/ops.cuh"
#include "backend/cuda/mmt.cuh"

/* y[t][r] = Σ_k W[r][k] x[t][k] for rows [16 MT blockIdx.y, +16 MT) and
 * tokens [8 NTL blockIdx.x, +8 NTL); x is BF16, K % 8 == 0. KS warps per
 * block, warp w taking slice w of the 32-wide k steps; the slices' sums are
 * added in warp order. Batches of more than 16 decode rows (mmt_for picks
 * MT and NTL); up to 16, mmt_bf16_group. The token tiles of a row tile are consecutive blocks,
 * so they run together and all but the first read the weight from L2 (with
 * row tiles first, a batch of 64 streamed every weight from DRAM twice). */
template <int KS, int MT, int NTL>
__global__ void __launch_bounds__(32 * KS) mmt_bf16(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                    const __nv_bfloat16 *__restrict__ x, int n_tok,
                                                    float *__restrict__ y) {
    constexpr int U = MT == 1 ? 8 : KS == 16 ? 2 : 4; /* 512 threads: at most 128 registers */
    const int     lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int     row0 = blockIdx.y * 16 * MT, tok0 = blockIdx.x * 8 * NTL; /* token tiles of a row tile adjacent */
    int           s0, s1;
    mmt_slice_range(K, KS, warp, &s0, &s1);
    float c[MT][NTL][4];
    mmt_slice<MT, NTL, U>(W, row_bytes, K, n_out, x, n_tok, row0, tok0, s0, s1, c);
    mmt_finish<KS, MT, NTL>(c, warp, g, t, row0, tok0, n_out, n_tok, y);
}

/* mmt_bf16 with the loads staged in shared memory (AUGUR_CUDA_MMT_TILE=4,
 * the default beyond 32 decode rows). mmt_bf16's warps
 * hold U steps of loads in registers, wait, then run their mmas: at 64
 * tokens (two row tiles by 32 tokens, two token blocks) gate/up ran at 1.4
 * TB/s and the 8B's output head at 1.8 (ncu, H100); more steps in flight
 * do not fit the registers. Here each lane copies the 16-byte fragments it
 * would load (its weight rows' and its token's) into its own slots of a
 * P-stage ring in shared memory by cp.async, P - 1 steps ahead of its
 * mmas, so bytes in flight cost no registers; a block takes up to 64
 * tokens (NTL = 8), so a weight is read from DRAM once. A lane reads back
 * only what it copied itself (cp.async.wait_group makes that visible to
 * it; no barrier). The fragments, each accumulator's mmas in step order,
 * the K slices and mmt_finish's sums are mmt_bf16's: the same bits. */
template <int KS, int MT, int NTL, int P>
static constexpr size_t mmt_staged_smem() {
    return (size_t)KS * P * (2 * MT + NTL) * 32 * sizeof(uint4);
}
template <int KS, int MT, int NTL, int P>
__global__ void __launch_bounds__(32 * KS) mmt_bf16_staged(const uint8_t *__restrict__ W, size_t row_bytes, int K,
                                                           int n_out, const __nv_bfloat16 *__restrict__ x, int n_tok,
                                                           float *__restrict__ y) {
    static_assert(P >= 2, "a stage read while the next is copied");
    constexpr int F = 2 * MT + NTL; /* a lane's 16-byte fragments a step: MT x 2 of weights, NTL of activations */
    extern __shared__ uint4 mmt_ring[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.y * 16 * MT, tok0 = blockIdx.x * 8 * NTL;
    int       s0, s1;
    mmt_slice_range(K, KS, warp, &s0, &s1);
    const int s_full = max(s0, min(s1, K / 32)); /* steps [s0, s_full) staged; the rest (past K) as mmt_slice's tail */
    uint4    *ring = mmt_ring + (size_t)warp * P * F * 32 + lane; /* fragment f of stage q: ring[32 (q F + f)] */
    const uint4 *wp[MT][2];
    mmt_lane_rows<MT>(W, row_bytes, n_out, row0, g, t, wp);
    const uint4 *xp[NTL];
    bool         xv[NTL]; /* the token exists (else cp.async copies 0 bytes and writes zeros) */
    mmt_lane_tokens<NTL>(x, K, n_tok, tok0, g, t, xp, xv);
    /* the first P - 1 steps: weights before the previous kernel's end (PDL),
     * activations after; one group a step (the first also holds the other
     * steps' weights), so step i is complete once P - 2 later groups are
     * left pending */
#pragma unroll
    for (int q = 0; q < P - 1; q++)
        if (s0 + q < s_full)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) cp_async16(ring + 32 * (q * F + 2 * m + h), wp[m][h] + 4 * (s0 + q), 16);
    pdl_entry();
#pragma unroll
    for (int q = 0; q < P - 1; q++) {
        if (s0 + q < s_full)
#pragma unroll
            for (int j = 0; j < NTL; j++) cp_async16(ring + 32 * (q * F + 2 * MT + j), xp[j] + 4 * (s0 + q), xv[j] ? 16 : 0);
        cp_async_commit();
    }
    float c[MT][NTL][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NTL; j++) c[m][j][0] = c[m][j][1] = c[m][j][2] = c[m][j][3] = 0.0f;
    int q = 0; /* the stage of step st */
    for (int st = s0; st < s_full; st++) {
        cp_async_wait<P - 2>();
        uint4        A[MT][2], X[NTL];
        const uint4 *slot = ring + 32 * q * F;
#pragma unroll
        for (int m = 0; m < MT; m++) A[m][0] = slot[32 * (2 * m)], A[m][1] = slot[32 * (2 * m + 1)];
#pragma unroll
        for (int j = 0; j < NTL; j++) X[j] = slot[32 * (2 * MT + j)];
        /* step st + P - 1 into the stage read one step ago (its values are
         * in the registers of the mmas already issued) */
        const int nx = st + P - 1, qn = q == 0 ? P - 1 : q - 1;
        if (nx < s_full) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) cp_async16(ring + 32 * (qn * F + 2 * m + h), wp[m][h] + 4 * nx, 16);
#pragma unroll
            for (int j = 0; j < NTL; j++) cp_async16(ring + 32 * (qn * F + 2 * MT + j), xp[j] + 4 * nx, xv[j] ? 16 : 0);
        }
        cp_async_commit(); /* possibly empty: one group a step keeps the count */
        mmt_step<MT, NTL>(A, X, c);
        q = q + 1 == P ? 0 : q + 1;
    }
    for (int st = s_full; st < s1; st++) mmt_step_direct<MT, NTL>(wp, xp, xv, K, t, st, c); /* a last step past K */
    mmt_finish<KS, MT, NTL>(c, warp, g, t, row0, tok0, n_out, n_tok, y);
}

/* Up to 16 decode rows of up to MMT_GROUP_MAX BF16 weights that share x
 * (Q/K/V, gate/up, or one weight alone) in one launch: a decode step of an
 * 8B model spent ~4 us of ramp and drain per matmul launch, and its k and v
 * projections (8 MB each) ran at 1.3 TB/s alone (ncu, H200). Weight i keeps
 * its own K split ks_i (mmt_slices of its own shape); a block has KSMAX
 * warps = max ks_i and holds KSMAX / ks_i row tiles of its weight, slice w
 * of tile j on warp j ks_i + w. Each output is its slices' sums added in
 * slice order, as mmt_finish adds them: a row gets the same bits as from
 * mmt_bf16 with ks_i warps, alone or grouped, at any batch (test_backend_ops
 * checks matmul_multi against matmul, and batches against single rows).
 * MMT_GROUP_MAX: ops.cuh. */
struct mmt_group {
    const uint8_t *W[MMT_GROUP_MAX];
    size_t         row_bytes[MMT_GROUP_MAX];
    float         *y[MMT_GROUP_MAX];
    int            n_out[MMT_GROUP_MAX], ks[MMT_GROUP_MAX];
    int            first_block[MMT_GROUP_MAX]; /* weight i's blocks: [first_block[i], first_block[i + 1]) */
    int            n;
};
template <int KSMAX, int NTL, int U>
static __device__ __forceinline__ void mmt_bf16_group_body(const mmt_group &grp, int K,
                                                           const __nv_bfloat16 *__restrict__ x, int n_tok) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the token tiles of a block of row tiles are consecutive blocks (read the weight from L2 but the first) */
    const int n_tt = (n_tok + 8 * NTL - 1) / (8 * NTL), bx = (int)blockIdx.x / n_tt, tt = (int)blockIdx.x % n_tt;
    int       i = 0;
#pragma unroll
    for (int j = 1; j < MMT_GROUP_MAX; j++)
        if (j < grp.n && bx >= grp.first_block[j]) i = j;
    const int ks = grp.ks[i], tiles = KSMAX / ks, n_out = grp.n_out[i];
    const int tile0 = (bx - grp.first_block[i]) * tiles, tok0 = tt * 8 * NTL;
    int       s0, s1;
    mmt_slice_range(K, ks, warp % ks, &s0, &s1);
    float c[1][NTL][4];
    mmt_slice<1, NTL, U>(grp.W[i], grp.row_bytes[i], K, n_out, x, n_tok, 16 * (tile0 + warp / ks), tok0, s0, s1, c);
    constexpr int C = NTL * 8 + 1;
    __shared__ float part[KSMAX][16][C];
#pragma unroll
    for (int j = 0; j < NTL; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[warp][g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = c[0][j][e];
    __syncthreads();
    float *__restrict__ y = grp.y[i];
    for (int e = threadIdx.x; e < tiles * 16 * NTL * 8; e += blockDim.x) {
        const int tl = e / (16 * NTL * 8), r = e % 16, tk = (e / 16) % (NTL * 8);
        const int row = 16 * (tile0 + tl) + r;
        if (row >= n_out || tok0 + tk >= n_tok) continue;
        float v = part[tl * ks][r][tk];
        for (int w = 1; w < ks; w++) v = __fadd_rn(v, part[tl * ks + w][r][tk]);
        y[(size_t)(tok0 + tk) * n_out + row] = v;
    }
}
template <int KSMAX, int NTL>
__global__ void __launch_bounds__(32 * KSMAX) mmt_bf16_group(const mmt_group grp, int K,
                                                             const __nv_bfloat16 *__restrict__ x, int n_tok) {
    mmt_bf16_group_body<KSMAX, NTL, 8>(grp, K, x, n_tok);
}
/* One token at 16 warps a block (an 8B's q/k/v launch): 4 steps of loads in
 * flight a warp instead of 8, registers held to 64 so that two blocks fit
 * an SM. At 126 registers one did, so the launch's 256 blocks ran in two
 * waves, and the second wave's first weights were not loaded before the
 * previous kernel ended (PDL). The same mmas in the same order: the same
 * bits. H100, 8B BF16 batch 1: 174.2 -> 174.7 tok/s (two rounds each);
 * the same at 8 warps (four blocks an SM) 172.0 and also at 4 (eight)
 * 165.5, at 8 sequences 1290 -> 1197: so 16 warps only. */
__global__ void __launch_bounds__(32 * 16, 2)
    mmt_bf16_group_lean(const mmt_group grp, int K, const __nv_bfloat16 *__restrict__ x, int n_tok) {
    mmt_bf16_group_body<16, 1, 4>(grp, K, x, n_tok);
}

typedef void (*mmt_kernel)(const uint8_t *, size_t, int, int, const __nv_bfloat16 *, int, float *);

/* A warp target from the environment variable `name` (tuning), else
 * MMT_TARGET_WARPS; read once into *cache (-1 until then). */
static int target_warps(const char *name, int *cache) {
    if (*cache < 0) {
        *cache = (int)ag_switch_int(name, 1, 1 << 20, MMT_TARGET_WARPS);
    }
    return *cache;
}
/* The targets of the BF16 kernels (AUGUR_CUDA_MMT_WARPS) and the K-quant ones (AUGUR_CUDA_MMQ_WARPS). */
int mmt_target_warps(void) {
    static int target = -1;
    return target_warps("AUGUR_CUDA_MMT_WARPS", &target);
}
int mmq_target_warps(void) {
    static int target = -1;
    return target_warps("AUGUR_CUDA_MMQ_WARPS", &target);
}

/* The kernel for n > 16 decode rows of a weight of n_out rows: *rows and
 * *toks a block, *warps = its K slices. The tile changes no bits (the mmas
 * on an accumulator are the same whatever the tile), only the speed.
 * AUGUR_CUDA_MMT_TILE (A/B): 0 two row tiles by 32 tokens, 1
 * mmt_bf16_group's tiles (one row tile by 16 tokens, grouped launches), 2
 * one row tile by 32 tokens, 3 two by 16, 4 mmt_bf16_staged (64 tokens);
 * unset (-1): 2 up to 32 rows, else 4. H100, 8B BF16, tok/s at 24 / 32 /
 * 64 sequences: tile 0 2685 / 3319 / 4906, 1 2588 / 3117 / 3405, 2 2932 /
 * 3571 / 4489, 3 2661 / 3318 / 3896 (mmt_bf16 with 64-token tiles, one or
 * two row tiles, measured 3347 / 3560 against 5155 at 64: dropped). Tile 4
 * against 0, same binary: 48 sequences 4443 / 4033, 64: 5488 / 4898, 128:
 * 7020 / 5768; ncu at 64 rows: gate/up 70 us / 85, output head 520 / 569. */
static mmt_kernel mmt_for(int n_out, int n, int tile, int *rows, int *toks, int *warps, size_t *smem) {
    *warps = mmt_slices(n_out, mmt_target_warps());
    const int ks = *warps == 4 ? 0 : *warps == 8 ? 1 : 2;
    *smem = 0;
    if (tile < 0) tile = n <= 32 ? 2 : 4;
    if (tile == 4) { /* staged, 64 tokens; stages by the warps: 98, 147 and 160 KB of shared memory */
        *toks = 64, *rows = ks == 2 ? 16 : 32;
        if (ks == 0) {
            *smem = mmt_staged_smem<4, 2, 8, 4>();
            return mmt_bf16_staged<4, 2, 8, 4>;
        }
        if (ks == 1) {
            *smem = mmt_staged_smem<8, 2, 8, 3>();
            return mmt_bf16_staged<8, 2, 8, 3>;
        }
        *smem = mmt_staged_smem<16, 1, 8, 2>();
        return mmt_bf16_staged<16, 1, 8, 2>;
    }
    if (tile == 2) {
        *rows = 16, *toks = 32;
        return ks == 0 ? mmt_bf16<4, 1, 4> : ks == 1 ? mmt_bf16<8, 1, 4> : mmt_bf16<16, 1, 4>;
    }
    if (tile == 3) {
        *rows = 32, *toks = 16;
        return ks == 0 ? mmt_bf16<4, 2, 2> : ks == 1 ? mmt_bf16<8, 2, 2> : mmt_bf16<16, 2, 2>;
    }
    *rows = 32, *toks = 32;
    return ks == 0 ? mmt_bf16<4, 2, 4> : ks == 1 ? mmt_bf16<8, 2, 4> : mmt_bf16<16, 2, 4>;
}

/* Decode rows of n_w BF16 weights of K columns that share x (BF16, in
 * s->d_xh): one mmt_bf16_group launch. Up to 16 rows by default; more with
 * AUGUR_CUDA_MMT_TILE=1 (tiles of 16 tokens; slower, A/B only: mmt_for). */
void launch_mmt_group(const cuda_state *s, const ag_tensor *const *w, int n_w, int K, const __nv_bfloat16 *x,
                      int n, float *const *y) {
    mmt_group grp;
    memset(&grp, 0, sizeof grp);
    int ksmax = 4, blocks = 0;
    for (int i = 0; i < n_w; i++) {
        grp.ks[i] = mmt_slices((int)w[i]->ne[1], mmt_target_warps());
        if (grp.ks[i] > ksmax) ksmax = grp.ks[i];
    }
    for (int i = 0; i < n_w; i++) {
        const int tiles = (int)((w[i]->ne[1] + 15) / 16), per_block = ksmax / grp.ks[i];
        grp.W[i] = (const uint8_t *)w[i]->data;
        grp.row_bytes[i] = w[i]->row_bytes;
        grp.y[i] = y[i];
        grp.n_out[i] = (int)w[i]->ne[1];
        grp.first_block[i] = blocks;
        blocks += (tiles + per_block - 1) / per_block;
    }
    grp.n = n_w;
    const bool two = n > 8; /* NTL = 2: 16 tokens per block */
    dim3       grid((unsigned)blocks * (two ? (n + 15) / 16 : 1), 1);
    const int  threads = 32 * ksmax;
#define MMT_GROUP_LAUNCH(KSM)                                                                                    \
    launch_k(s, (two ? mmt_bf16_group<KSM, 2> : mmt_bf16_group<KSM, 1>), grid, threads, 0, grp, K, x, n)
    if (ksmax == 4) MMT_GROUP_LAUNCH(4);
    else if (ksmax == 8) MMT_GROUP_LAUNCH(8);
    else if (!two && s->mmt_lean) launch_k(s, mmt_bf16_group_lean, grid, threads, 0, grp, K, x, n); /* two blocks an SM */
    else MMT_GROUP_LAUNCH(16);
#undef MMT_GROUP_LAUNCH
}

/* Up to 8 decode rows of a feed-forward block's gate and up (BF16, one K
 * split ks = KS for both) and their product, in one launch: block b takes
 * row tile b of both weights, warps [0, KS) gate's slices and [KS, 2 KS)
 * up's, each with mmt_bf16_group's arithmetic (mmt_slice, the slices' sums
 * added in order), then g[t][r] = silu_times(gate, up) (GELU:
 * gelu_f16(gate) * up), the bits of matmul_multi then silu_mul (gelu_mul);
 * with xh, also g's BF16 copy
 * (prep_store4's rounding) for the down matmul. Saves silu_mul's launch
 * and its wait between the two GEMVs: 8B BF16 on an H100, batch 1
 * 178.0 -> 179.0 tok/s, 8 sequences 1315.7 -> 1339.0 (2026-12-06; the
 * default, AUGUR_CUDA_GLU=0 runs the three ops). */
template <int KS, bool GELU>
__global__ void __launch_bounds__(64 * KS) mmt_bf16_glu(const uint8_t *__restrict__ Wg, const uint8_t *__restrict__ Wu,
                                                        size_t row_bytes_g, size_t row_bytes_u, int K, int n_ff,
                                                        const __nv_bfloat16 *__restrict__ x, int n_tok,
                                                        float *__restrict__ g_out, __nv_bfloat16 *__restrict__ xh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int row0 = 16 * (int)blockIdx.x;
    int       s0, s1;
    mmt_slice_range(K, KS, warp % KS, &s0, &s1);
    float c[1][1][4];
    mmt_slice<1, 1, 8>(warp < KS ? Wg : Wu, warp < KS ? row_bytes_g : row_bytes_u, K, n_ff, x, n_tok, row0, 0, s0, s1,
                       c);
    __shared__ float part[2 * KS][16][9];
#pragma unroll
    for (int e = 0; e < 4; e++) part[warp][g + 8 * (e >> 1)][2 * t + (e & 1)] = c[0][0][e];
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * 8; e += blockDim.x) {
        const int r = e % 16, tk = e / 16, row = row0 + r;
        if (row >= n_ff || tk >= n_tok) continue;
        float gv = part[0][r][tk], uv = part[KS][r][tk];
        for (int w = 1; w < KS; w++) gv = __fadd_rn(gv, part[w][r][tk]), uv = __fadd_rn(uv, part[KS + w][r][tk]);
        const float v = act_times<GELU>(gv, uv);
        g_out[(size_t)tk * n_ff + row] = v;
        if (xh) xh[(size_t)tk * n_ff + row] = __float2bfloat16_rn(v);
    }
}

/* The decode rows of a feed-forward block through mmt_bf16_glu, then the
 * down matmul: *done false (nothing launched) where it does not apply:
 * turned off, prompt rows or more than 8 rows, a weight not on
 * mmt_bf16, a K split beyond 8, or activations the down weight reads as
 * int8 (only BF16 copies are made here). */
ag_status ffn_decode_glu(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw,
                         const float *h, int n, int n_decode, bool gelu, float *gate, float *o, bool *done) {
    cuda_state *s = st_of(be);
    *done = false;
    const int K = (int)gw->ne[0], n_ff = (int)gw->ne[1];
    if (!s->glu_on || n_decode != n || n < 1 || n > 8 || !s->group_on || !uses_mmt(s, gw) ||
        !uses_mmt(s, uw) || uw->ne[0] != K || uw->ne[1] != n_ff || n != s->n || s->pass_n_decode != n)
        return AG_OK;
    const int ks = mmt_slices(n_ff, mmt_target_warps());
    const int fmt = prep_formats(s, n, n_ff);
    if (ks > 8 || (fmt & XR_Q8)) return AG_OK;
    /* the product's BF16 copy goes to the half of d_xh that x is not in
     * (x fits a half: K <= max_k_bf16, gate being a BF16 weight) */
    const size_t half = (size_t)n * (size_t)s->max_k_bf16;
    const bool   copy = fmt & XR_BF16;
    if (copy && (n_ff > s->max_k_bf16 || s->cap_xh < 2 * half)) return AG_OK;
    prep_forget(s, gate, (size_t)n * n_ff * sizeof(float));
    ag_status st;
    if (!(prep_ready(s, h, n, K) & XR_BF16) && (st = to_bf16(s, h, n, K))) return st;
    const __nv_bfloat16 *xin = xh_of(s, h, n, K);
    __nv_bfloat16       *xout = copy ? (xin == s->d_xh ? s->d_xh + half : s->d_xh) : NULL;
    const unsigned       blocks = (unsigned)((n_ff + 15) / 16);
    auto kern = ks == 4 ? (gelu ? mmt_bf16_glu<4, true> : mmt_bf16_glu<4, false>)
                        : (gelu ? mmt_bf16_glu<8, true> : mmt_bf16_glu<8, false>);
    launch_k(s, kern, blocks, 64 * (unsigned)ks, 0, (const uint8_t *)gw->data, (const uint8_t *)uw->data,
             gw->row_bytes, uw->row_bytes, K, n_ff, xin, n, gate, xout);
    LAUNCHED();
    if (copy) {
        prep_made(s, gate, n, n_ff, XR_BF16);
        s->prep_h = xout;
    }
    *done = true;
    return cu_matmul(be, dw, gate, n, n, o);
}

/* More than 16 decode rows of w over xh (BF16) in mmt_for's tiles (the
 * caller checks the launch). */
ag_status launch_mmt_tiles(cuda_state *s, const ag_tensor *w, const __nv_bfloat16 *xh, int n, float *y) {
    const int  K = (int)w->ne[0], n_out = (int)w->ne[1];
    int        rows, toks, warps;
    size_t     smem;
    mmt_kernel k = mmt_for(n_out, n, s->mmt_tile, &rows, &toks, &warps, &smem);
    dim3       grid((unsigned)((n + toks - 1) / toks), (unsigned)((n_out + rows - 1) / rows));
    if (smem > 48 * 1024 && !s->mmt_staged_ready[warps / 8]) { /* once a kernel (4, 8, 16 warps: 0, 1, 2) */
        CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        s->mmt_staged_ready[warps / 8] = true;
    }
    launch_k(s, k, grid, 32 * warps, smem, (const uint8_t *)w->data, w->row_bytes, K, n_out, xh, n, y);
    return AG_OK;
}
