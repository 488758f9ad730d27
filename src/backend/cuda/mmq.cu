/* Decode rows of Q4_K and Q6_K weights: mmq_q4k/mmq_q6k on the tensor
 * cores (int8 mma), and mmqv (mmqv.cuh) for a matmul's few rows, with
 * mmq's bits. */
#include "backend/cuda/ops.cuh"
#include "backend/cuda/mmt.cuh"

/* ---- matmul: decode rows of Q4_K weights on the tensor cores ---- */

/* mmq_q4k: the int8 counterpart of mmt_bf16 for Q4_K weights, with the
 * activations quantized per 32 (quantize_q8_32), as mmqv reads them.
 * One mma.sync m16n8k32 (s8 x s8 -> s32) per 32-element sub-block:
 * its integer sums Σ q·xq are exact, and the sub-block's scales are
 * applied after, per output: acc += (d·sc)·d_x·isum − (dmin·m)·(d_x·Σxq).
 * The same batch invariance as mmt_bf16 (K split by the weight's shape in
 * whole 256-element blocks, slices added in order, tiles chosen by the
 * batch), so every Q4_K decode row, at any batch, goes through it.
 *
 * FRAGMENTS. Lane (g, t) takes elements 8t..8t+7 of every sub-block: for
 * the sub-block pair (2p, 2p+1) those are the low and high nibbles of quant
 * bytes 32p + 8t .. +7 (one 8-byte load per row serves two mmas), and the
 * activations xq[32s + 8t .. +7] of token g (one 8-byte load). The mma's
 * k order within a sub-block is permuted the same way on both sides. */
static __device__ __forceinline__ void mma_s8_16832(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

static __device__ __forceinline__ uint2 ld_stream2(const uint2 *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

/* One Q4_K block of one row as a lane holds it: the 16-byte header (d,
 * dmin, 12 scale bytes) and its 8 quant bytes of each sub-block pair. */
struct q4k_frag {
    uint4 head;
    uint2 q[4];
};

static __device__ __forceinline__ q4k_frag q4k_frag_load(const uint8_t *row, int b, int t) {
    const uint8_t *blk = row + (size_t)b * 144;
    q4k_frag       f;
    f.head = __ldg((const uint4 *)blk);
#pragma unroll
    for (int p = 0; p < 4; p++) f.q[p] = ld_stream2((const uint2 *)(blk + 16 + 32 * p + 8 * t));
    return f;
}

/* Block b (MT row tiles: F[m][0] rows g, F[m][1] rows g + 8) times the
 * NTL token tiles: 8 sub-blocks, an mma each, then the scales. */
template <int MT, int NTL>
static __device__ __forceinline__ void mmq_q4k_block(const q4k_frag (&F)[MT][2], int b, int g, int t,
                                                     const int8_t *const (&xr)[NTL], const bool (&xv)[NTL],
                                                     const float2 *__restrict__ xs, int K, int tok0, int n_tok,
                                                     float (&c)[MT][NTL][4]) {
#pragma unroll
    for (int sb = 0; sb < 8; sb++) {
        const int p = sb >> 1, sh = 4 * (sb & 1);
        float     a[MT][2], mn[MT][2];
        uint32_t  lo[MT][2], hi[MT][2];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 hd = F[m][h].head;
                float       sc, mi;
                cq_k4_scale_min_w(sb, hd.y, hd.z, hd.w, &sc, &mi);
                a[m][h] = __fmul_rn(__half2float(__ushort_as_half((uint16_t)(hd.x & 0xFFFF))), sc);
                mn[m][h] = __fmul_rn(__half2float(__ushort_as_half((uint16_t)(hd.x >> 16))), mi);
                lo[m][h] = (F[m][h].q[p].x >> sh) & 0x0F0F0F0Fu;
                hi[m][h] = (F[m][h].q[p].y >> sh) & 0x0F0F0F0Fu;
            }
#pragma unroll
        for (int j = 0; j < NTL; j++) {
            const uint2 X = xv[j] ? __ldg((const uint2 *)(xr[j] + (size_t)b * 256 + 32 * sb)) : make_uint2(0, 0);
            /* the activation scales of this tile's columns 2t, 2t + 1 */
            float2 s2[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = min(tok0 + 8 * j + 2 * t + e, n_tok - 1);
                s2[e] = __ldg(xs + (size_t)tok * (K / 32) + 8 * b + sb);
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                int isum[4];
                mma_s8_16832(isum, lo[m][0], lo[m][1], hi[m][0], hi[m][1], X.x, X.y);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int    h = e >> 1;
                    const float2 xe = s2[e & 1];
                    const float  v = __fsub_rn(__fmul_rn(__fmul_rn(a[m][h], xe.x), (float)isum[e]),
                                               __fmul_rn(mn[m][h], xe.y));
                    c[m][j][e] = __fadd_rn(c[m][j][e], v);
                }
            }
        }
    }
}

/* Where a lane of an mmq kernel reads: its MT x 2 weight rows (rows g and
 * g + 8 of each row tile, clamped to the matrix), its NTL tokens'
 * activations from element x_off on (token g of each token tile, clamped;
 * xv: whether it exists), and its warp's slice [b0, b1) of the rows'
 * 256-element blocks (the K split). */
template <int KS, int MT, int NTL>
struct mmq_lane {
    int            lane, warp, g, t, row0, tok0, b0, b1;
    const uint8_t *wr[MT][2];
    const int8_t  *xr[NTL];
    bool           xv[NTL];

    __device__ __forceinline__ mmq_lane(const uint8_t *W, size_t row_bytes, int K, int n_out, const int8_t *xq, int n_tok,
                                        int x_off_per_t) {
        lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        row0 = blockIdx.y * 16 * MT, tok0 = blockIdx.x * 8 * NTL; /* as mmt_bf16 */
        const int nb = K / 256, per = (nb + KS - 1) / KS;
        b0 = min(nb, warp * per), b1 = min(nb, b0 + per);
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) wr[m][h] = W + (size_t)min(row0 + 16 * m + 8 * h + g, n_out - 1) * row_bytes;
#pragma unroll
        for (int j = 0; j < NTL; j++) {
            const int tok = tok0 + 8 * j + g;
            xv[j] = tok < n_tok;
            xr[j] = xq + (size_t)min(tok, n_tok - 1) * K + x_off_per_t * t;
        }
    }
};

/* Zeroes the accumulators of an MT x NTL tile. */
template <int MT, int NTL>
static __device__ __forceinline__ void acc_zero(float (&c)[MT][NTL][4]) {
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NTL; j++) c[m][j][0] = c[m][j][1] = c[m][j][2] = c[m][j][3] = 0.0f;
}

/* y[t][r] = Σ_k W[r][k] x[t][k] for Q4_K rows [16 MT blockIdx.y, +16 MT)
 * and tokens [8 NTL blockIdx.x, +8 NTL) (token tiles adjacent, as mmt_bf16); x as quantize_q8_32 left it. KS
 * warps, warp w taking slice w of the row's blocks; U blocks' bytes loaded
 * before their mmas. */
template <int KS, int MT, int NTL>
__global__ void __launch_bounds__(32 * KS) mmq_q4k(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                   const int8_t *__restrict__ xq, const float2 *__restrict__ xs,
                                                   int n_tok, float *__restrict__ y) {
    pdl_entry();
    constexpr int U = MT == 1 ? 2 : 1;
    const mmq_lane<KS, MT, NTL> L(W, row_bytes, K, n_out, xq, n_tok, 8);
    float                       c[MT][NTL][4];
    acc_zero<MT, NTL>(c);
    int b = L.b0;
    for (; b + U <= L.b1; b += U) {
        q4k_frag F[U][MT][2];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) F[u][m][h] = q4k_frag_load(L.wr[m][h], b + u, L.t);
#pragma unroll
        for (int u = 0; u < U; u++) mmq_q4k_block<MT, NTL>(F[u], b + u, L.g, L.t, L.xr, L.xv, xs, K, L.tok0, n_tok, c);
    }
    for (; b < L.b1; b++) {
        q4k_frag F[MT][2];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) F[m][h] = q4k_frag_load(L.wr[m][h], b, L.t);
        mmq_q4k_block<MT, NTL>(F, b, L.g, L.t, L.xr, L.xv, xs, K, L.tok0, n_tok, c);
    }
    mmt_finish<KS, MT, NTL>(c, L.warp, L.g, L.t, L.row0, L.tok0, n_out, n_tok, y);
}

/* ---- matmul: decode rows of Q6_K weights on the tensor cores ---- */

/* mmq_q6k: as mmq_q4k for Q6_K, whose scales are per 16 elements: one
 * mma.sync m16n8k16 (s8) per 16-element group, on the weights made signed
 * bytes (q − 32), then acc += (d·sc)·d_x·isum. Lane (g, t) takes elements
 * 4t..4t+3 of every group, in the mma's own k order (no permutation): of
 * each 32-element unit of quadrant gq in half h, the low or high nibbles
 * of 4 ql bytes and 2 bits of 4 qh bytes. Blocks are 210 bytes, so only
 * 2-byte aligned: words are read as two halves. */
static __device__ __forceinline__ void mma_s8_16816(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

static __device__ __forceinline__ uint32_t ld_u32_at2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
}

/* One Q6_K block of one row as a lane holds it: ql[h][c][q] = ql bytes
 * 64h + 32c + 16q + 4t .. +3, qh[h][q] = qh bytes 32h + 16q + 4t .. +3,
 * the 16 scale bytes and d. */
struct q6k_frag {
    uint32_t ql[2][2][2], qh[2][2], sc[4], d;
};

static __device__ __forceinline__ q6k_frag q6k_frag_load(const uint8_t *row, int b, int t) {
    const uint8_t *blk = row + (size_t)b * 210;
    q6k_frag       f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
#pragma unroll
            for (int c = 0; c < 2; c++) f.ql[h][c][q] = ld_u32_at2(blk + 64 * h + 32 * c + 16 * q + 4 * t);
            f.qh[h][q] = ld_u32_at2(blk + 128 + 32 * h + 16 * q + 4 * t);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) f.sc[i] = ld_u32_at2(blk + 192 + 4 * i);
    f.d = __ldg((const uint16_t *)(blk + 208));
    return f;
}

template <int MT, int NTL>
static __device__ __forceinline__ void mmq_q6k_block(const q6k_frag (&F)[MT][2], int b, int t,
                                                     const int8_t *const (&xr)[NTL], const bool (&xv)[NTL],
                                                     const float2 *__restrict__ xs, int K, int tok0, int n_tok,
                                                     float (&c)[MT][NTL][4]) {
#pragma unroll
    for (int u = 0; u < 8; u++) { /* 32-element unit: half h, quadrant gq */
        const int h = u >> 2, gq = u & 3;
#pragma unroll
        for (int q = 0; q < 2; q++) { /* its 16-element group */
            const int si = 8 * h + 2 * gq + q;
            float     sw[MT][2];
            uint32_t  a[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const q6k_frag &f = F[m][r];
                    const uint32_t  lo = (f.ql[h][gq & 1][q] >> (4 * (gq >> 1))) & 0x0F0F0F0Fu;
                    const uint32_t  hi = ((f.qh[h][q] >> (2 * gq)) & 0x03030303u) << 4;
                    a[m][r] = __vsubss4(lo | hi, 0x20202020u);
                    const float d = __half2float(__ushort_as_half((uint16_t)f.d));
                    sw[m][r] = __fmul_rn(d, (float)(int8_t)(f.sc[si >> 2] >> (8 * (si & 3))));
                }
#pragma unroll
            for (int j = 0; j < NTL; j++) {
                const uint32_t X = xv[j] ? __ldg((const uint32_t *)(xr[j] + (size_t)b * 256 + 32 * u + 16 * q)) : 0u;
                float          xd[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int tok = min(tok0 + 8 * j + 2 * t + e, n_tok - 1);
                    xd[e] = __ldg(&xs[(size_t)tok * (K / 32) + 8 * b + u].x);
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    int isum[4];
                    mma_s8_16816(isum, a[m][0], a[m][1], X);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        c[m][j][e] = __fadd_rn(c[m][j][e], __fmul_rn(__fmul_rn(sw[m][e >> 1], xd[e & 1]), (float)isum[e]));
                }
            }
        }
    }
}

/* As mmq_q4k, for Q6_K rows (x as quantize_q8_32 left it; lane t reads
 * the activations of elements 4t..4t+3 of each 16-element group). */
template <int KS, int MT, int NTL>
__global__ void __launch_bounds__(32 * KS) mmq_q6k(const uint8_t *__restrict__ W, size_t row_bytes, int K, int n_out,
                                                   const int8_t *__restrict__ xq, const float2 *__restrict__ xs,
                                                   int n_tok, float *__restrict__ y) {
    pdl_entry();
    const mmq_lane<KS, MT, NTL> L(W, row_bytes, K, n_out, xq, n_tok, 4);
    float                       c[MT][NTL][4];
    acc_zero<MT, NTL>(c);
    for (int b = L.b0; b < L.b1; b++) {
        q6k_frag F[MT][2];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) F[m][h] = q6k_frag_load(L.wr[m][h], b, L.t);
        mmq_q6k_block<MT, NTL>(F, b, L.t, L.xr, L.xv, xs, K, L.tok0, n_tok, c);
    }
    mmt_finish<KS, MT, NTL>(c, L.warp, L.g, L.t, L.row0, L.tok0, n_out, n_tok, y);
}

typedef void (*mmq_kernel)(const uint8_t *, size_t, int, int, const int8_t *, const float2 *, int, float *);

template <int KS, bool Q6>
static mmq_kernel mmq_for_ks(int n, int tile, int *rows, int *toks) {
    mmq_kernel k;
    if (n <= 8) k = Q6 ? mmq_q6k<KS, 1, 1> : mmq_q4k<KS, 1, 1>, *rows = 16, *toks = 8;
    else k = Q6 ? mmq_q6k<KS, 1, 2> : mmq_q4k<KS, 1, 2>, *rows = 16, *toks = 16;
    /* 16 warps (512 threads) leave 128 registers: wider tiles spill there;
     * a Q6_K block held for two row tiles spills too */
    if constexpr (KS < 16)
        if (n > 16) {
            /* AUGUR_CUDA_MMQ_TILE (A/B, no bits change): 1 one row tile by 32 tokens, 2 two by 16,
             * 3 one by 64, 4 two by 64 (Q6_K: one row tile); else two by 32 (Q6_K one) */
            if (tile == 1 || (Q6 && tile != 3 && tile != 4)) k = Q6 ? mmq_q6k<KS, 1, 4> : mmq_q4k<KS, 1, 4>, *rows = 16, *toks = 32;
            else if (tile == 2) k = mmq_q4k<KS, 2, 2>, *rows = 32, *toks = 16;
            else if (tile == 3 || (Q6 && tile == 4)) k = Q6 ? mmq_q6k<KS, 1, 8> : mmq_q4k<KS, 1, 8>, *rows = 16, *toks = 64;
            else if (tile == 4) k = mmq_q4k<KS, 2, 8>, *rows = 32, *toks = 64;
            else k = mmq_q4k<KS, 2, 4>, *rows = 32, *toks = 32;
        }
    return k;
}

/* As mmt_for, for Q4_K and Q6_K: the K split is in whole blocks, by the
 * weight's row count only. */
static mmq_kernel mmq_for(uint32_t type, int n_out, int n, int tile, int *rows, int *toks, int *warps) {
    const bool q6 = type == CQ_Q6_K;
    *warps = mmt_slices(n_out, mmq_target_warps());
    if (*warps == 4) return q6 ? mmq_for_ks<4, true>(n, tile, rows, toks) : mmq_for_ks<4, false>(n, tile, rows, toks);
    if (*warps == 8) return q6 ? mmq_for_ks<8, true>(n, tile, rows, toks) : mmq_for_ks<8, false>(n, tile, rows, toks);
    return q6 ? mmq_for_ks<16, true>(n, tile, rows, toks) : mmq_for_ks<16, false>(n, tile, rows, toks);
}

/* mmqv's staged rows (stage_rows): the block's rows [bx rpb, +rpb) of W
 * (fewer at the end) into the dynamic shared memory; returns where row
 * r_in of them lies there. Every thread of the block must call it. */
static __device__ __forceinline__ const uint8_t *mmqv_stage(const uint8_t *W, size_t row_bytes, int n_out, int bx,
                                                            int rpb, int r_in, uint64_t *bar) {
    extern __shared__ __align__(128) uint8_t mmv_stage[];
    const int row0 = bx * rpb, rows = min(rpb, n_out - row0);
    stage_rows(mmv_stage, W + (size_t)row0 * row_bytes, (uint32_t)(rows * row_bytes), bar);
    return mmv_stage + (size_t)min(r_in, rows - 1) * row_bytes;
}

#include "backend/cuda/mmqv.cuh"

/* The shared memory a staged mmqv block of `rows` rows of w needs, or
 * 0 where it takes the unstaged kernel: staging off, a bulk copy's 16-byte
 * alignment not met, or more than the 48 KB a block gets without opting in
 * (4 rows of K = 14336 Q6_K are 46 KB). */
static size_t mmv_stage_bytes(const cuda_state *s, const ag_tensor *w, int rows) {
    const size_t bytes = (size_t)rows * w->row_bytes;
    if (!s->stage_mode || ((uintptr_t)w->data | w->row_bytes) % 16 != 0 || bytes > 48 * 1024) return 0;
    return bytes;
}

/* mmqv's warps a row for a weight of n_out rows in ks slices: below 2048
 * rows a row's quads go to ks / 4 warps (an 8B's k/v projections have 1024
 * rows, 256 blocks of one row a warp would leave SMs idle), else one warp
 * walks them all. The threshold is the dp4a GEMVs' (retired), where one
 * warp a row left most SMs empty on the k/v projections (12% of the warp
 * slots active, 7-8% of the DRAM peak; ncu, H200) and, at 4096 rows (q, o,
 * down), 2 warps were slower: Q4_K 7.55 -> 7.90 us, Q6_K down 32.4 -> 41.6
 * us; at 1024 rows 4 warps took Q4_K 6.1 -> 4.2 us, Q6_K 9.9 -> 6.4. Only
 * who computes a slice moves, never what it computes: the same bits. */
static int mmqv_ws(const cuda_state *s, int n_out, int ks) { return s->mmv_split_on && n_out < 2048 ? ks / 4 : 1; }

/* The decode rows of w[0..n_w) (Q4_K/Q6_K weights of K columns) over x's
 * n rows, quantized in d_xq/d_xs (1 <= n <= MMQV_NT_MAX), in one mmqv
 * launch, y[i] weight i's output: each row the bits mmq gives it. The rows
 * are staged in shared memory (stage_rows; s->stage_mode: 1, the default,
 * in launches of several weights; 2 in every one) where every weight's
 * rows can be (mmv_stage_bytes). */
ag_status launch_mmqv(cuda_state *s, const ag_tensor *const *w, int n_w, int K, int n, float *const *y) {
    mmqv_group g;
    memset(&g, 0, sizeof g);
    g.n = n_w;
    bool   staged = s->stage_mode == 2 || (s->stage_mode == 1 && n_w > 1);
    size_t smem = 0;
    for (int i = 0; i < n_w; i++) {
        const int n_out = (int)w[i]->ne[1], ks = mmt_slices(n_out, mmq_target_warps()), ws = mmqv_ws(s, n_out, ks);
        const int rows = MMQV_WARPS / ws; /* a block's */
        g.W[i] = (const uint8_t *)w[i]->data, g.y[i] = y[i], g.row_bytes[i] = w[i]->row_bytes;
        g.n_out[i] = n_out, g.q6[i] = w[i]->type == CQ_Q6_K, g.ks[i] = ks, g.ws[i] = ws;
        g.blk0[i + 1] = g.blk0[i] + (n_out + rows - 1) / rows;
        const size_t b = mmv_stage_bytes(s, w[i], rows);
        staged = staged && b, smem = b > smem ? b : smem;
    }
    if (!staged) smem = 0;
    const int nt = n <= 1 ? 1 : 2, nti = nt - 1;
    void (*k)(const mmqv_group, int, const int8_t *, const float2 *, int) =
        nt == 1 ? (smem ? mmqv<1, true> : mmqv<1, false>) : (smem ? mmqv<2, true> : mmqv<2, false>);
    if (smem && !s->mmqv_smem_ready[nti]) { /* up to 48 KB of rows beside the kernel's own shared memory */
        CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024));
        s->mmqv_smem_ready[nti] = true;
    }
    dim3 grid((unsigned)g.blk0[n_w], (unsigned)((n + nt - 1) / nt));
    launch_k(s, k, grid, 32 * MMQV_WARPS, smem, g, K, s->d_xq, s->d_xs, n);
    LAUNCHED();
    return AG_OK;
}

/* How many weights from w[0] share one mmqv launch (launch_mmqv): 2 to
 * MMQV_PARTS Q4_K/Q6_K weights of one K at up to MMQV_FEW decode rows
 * (s->pair_mode 2: 2, 0: none), or 0 (beyond MMQV_FEW mmq, a launch each). */
int mmqv_group_len(const cuda_state *s, const ag_tensor *const *w, int n_w, int n_decode) {
    if (!s->pair_mode || n_decode < 1 || n_decode > MMQV_FEW) return 0;
    int n = 0;
    while (n < n_w && n < (s->pair_mode == 2 ? 2 : MMQV_PARTS) && uses_dp4a(s, w[n]) && w[n]->ne[0] == w[0]->ne[0])
        n++;
    return n >= 2 ? n : 0;
}

/* Decode rows [0, n) of a Q4_K/Q6_K weight over the activations in
 * d_xq/d_xs (ensure_q8): up to MMQV_FEW rows mmqv, more mmq (mmq_for's
 * tile), both with mmq's bits. */
ag_status launch_mmq(cuda_state *s, const ag_tensor *w, int n, float *y) {
    const int K = (int)w->ne[0], n_out = (int)w->ne[1];
    if (n <= MMQV_FEW) return launch_mmqv(s, &w, 1, K, n, &y);
    int        rows, toks, warps;
    mmq_kernel k = mmq_for(w->type, n_out, n, s->mmq_tile, &rows, &toks, &warps);
    dim3       grid((unsigned)((n + toks - 1) / toks), (unsigned)((n_out + rows - 1) / rows));
    launch_k(s, k, grid, 32 * warps, 0, (const uint8_t *)w->data, w->row_bytes, K, n_out, s->d_xq, s->d_xs, n, y);
    LAUNCHED();
    return AG_OK;
}
