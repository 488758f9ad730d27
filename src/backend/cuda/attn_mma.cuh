/* The tensor-core prompt attention kernels' shared pieces (mma.sync
 * m16n8k16 on fp16, K/V chunks staged in shared memory, the score tiles,
 * the rows' output): attn_prompt_mma.cu's kernels and, for the output and
 * the softmax's exp2, attn_prompt_wgmma.cu's. */
#ifndef AG_CUDA_ATTN_MMA_CUH
#define AG_CUDA_ATTN_MMA_CUH

#include "backend/cuda/attn.cuh"

/* Prompt rows on the tensor cores (fp16 KV, head_dim_k == head_dim_v, a
 * multiple of 32): the tile of up to 16 rows is the M of mma.sync
 * m16n8k16 (f16 inputs, f32 accumulation). The numerics of the SIMT tile
 * kernel: q rounded to fp16, two passes (each row's exact max and sum over
 * its positions, then its normalized softmax weights rounded to fp16 and
 * multiplied with V), only the sums' order differs. Per chunk of 64
 * positions, staged in shared memory (V transposed, so its mma operand is
 * a plain 4-byte read): warp w computes the scores of positions 16w..16w+15
 * for the 16 rows (Q·Kᵀ); pass 1 folds their max and sum into each row's
 * running pair, in warp order; pass 2 writes the rounded weights to shared
 * memory, then warp w multiplies them with V for its quarter of the dims.
 * Rows past the tile and positions outside a row's [lo, hi] weigh 0. */
#define ATM_PAD 8 /* halves of padding per shared row: lanes (g, t) hit distinct banks */

/* Stages chunk c (positions 64c .. 64c + 63, zeros past c_hi) of KV head
 * kvh (fp16, head dim hd) in shared memory for the tensor-core attention
 * kernels: K row-major in ks ([64][ks_stride]); V, when vt is not NULL,
 * transposed in vt ([hd][vt_stride]), so P·V's mma operand is a plain
 * 4-byte read. All threads of the block take part. */
static __device__ __forceinline__ void stage_kv_chunk(const kv_geom &g_, const int32_t *__restrict__ table, int kvh,
                                                      int hd, int c, int c_hi, __half *ks, int ks_stride, __half *vt,
                                                      int vt_stride) {
    const int n8 = hd / 8;
    for (int e = threadIdx.x; e < ATT_TK * n8; e += blockDim.x) {
        const int j = e / n8, d8 = e % n8, p = c * ATT_TK + j;
        uint4     kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (p <= c_hi) {
            const uint8_t *blk = g_.k0 + (size_t)table[p >> g_.block_shift] * g_.block_bytes;
            const size_t   off = (size_t)(p & g_.block_mask);
            kv = *(const uint4 *)(blk + kvh * g_.head_stride_k + off * g_.row_bytes_k + 16 * d8);
            if (vt) vv = *(const uint4 *)(blk + g_.v_off + kvh * g_.head_stride_v + off * g_.row_bytes_v + 16 * d8);
        }
        *(uint4 *)(ks + j * ks_stride + 8 * d8) = kv;
        if (vt) {
            const __half *vh = (const __half *)&vv;
#pragma unroll
            for (int i = 0; i < 8; i++) vt[(8 * d8 + i) * vt_stride + j] = vh[i];
        }
    }
}

static __device__ __forceinline__ uint32_t pack_half2(float a, float b) { /* a in the low half */
    const __half2 v = __floats2half2_rn(a, b);
    return *(const uint32_t *)&v;
}

static __device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The m16k16 A fragment of lane (g, t) from a row-major fp16 matrix in
 * shared memory (stride halves a row), columns col .. col + 15: rows g and
 * g + 8, columns 2t, 2t + 1 and 8 on. */
static __device__ __forceinline__ void frag_a_smem(const __half *m, int stride, int col, int g, int t,
                                                   uint32_t (&a)[4]) {
    a[0] = *(const uint32_t *)(m + g * stride + col + 2 * t);
    a[1] = *(const uint32_t *)(m + (g + 8) * stride + col + 2 * t);
    a[2] = *(const uint32_t *)(m + g * stride + col + 8 + 2 * t);
    a[3] = *(const uint32_t *)(m + (g + 8) * stride + col + 8 + 2 * t);
}

/* The prologue of the tensor-core prompt attention kernels (attention_fa_k,
 * attention_fa1_k), for the block's tile of NT rows from T0 (R row tiles
 * of 16) and the warp's query head h and row tile rt (rows T0 + 16rt ..):
 * each row's visible positions [row_lo, row_hi] (shared, 16R each); the
 * warp's rows g and g + 8 of Q as mma A fragments, rounded to fp16
 * ([kk][0] row g, dims 16kk + 2t, +1; [1] row g + 8; [2], [3] the same 8
 * dims on; rows past the tile zeros); the chunks [*ch0, *ch1] the block's
 * rows see and their last position *c_hi; the warp's rows g and g + 8's
 * ranges in lo, hi. Has a barrier: every thread of the block calls it. */
template <int HD, int R = 1>
static __device__ __forceinline__ void fa_tile_setup(const int32_t *__restrict__ pos, int T0, int NT, int rt,
                                                     int window, int n_head, int h, const float *__restrict__ q, int g,
                                                     int t, int *row_lo, int *row_hi, uint32_t (&qa)[HD / 16][4],
                                                     int *ch0, int *ch1, int *c_hi_out, int (&lo)[2], int (&hi)[2],
                                                     int *all_lo = nullptr, int *all_hi = nullptr) {
    if (threadIdx.x < ATT_TQ * R) {
        const int r = threadIdx.x, rh = r < NT ? pos[T0 + r] : -1;
        row_hi[r] = rh;
        row_lo[r] = r < NT && window > 0 ? max(0, rh - window + 1) : 0;
    }
    {
        const int    t0 = T0 + ATT_TQ * rt, nt = NT - ATT_TQ * rt; /* the warp's rows (none when nt <= 0) */
        const float *q0 = q + ((size_t)(t0 + g) * n_head + h) * HD, *q1 = q + ((size_t)(t0 + g + 8) * n_head + h) * HD;
        const bool   v0 = g < nt, v1 = g + 8 < nt;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int d = 16 * kk + 8 * half + 2 * t;
                qa[kk][2 * half] = v0 ? pack_half2(q0[d], q0[d + 1]) : 0u;
                qa[kk][2 * half + 1] = v1 ? pack_half2(q1[d], q1[d + 1]) : 0u;
            }
    }
    __syncthreads();
    int c_lo = INT_MAX, c_hi = -1, a_lo = 0, a_hi = INT_MAX;
    for (int r = 0; r < NT; r++) {
        c_lo = min(c_lo, row_lo[r]), c_hi = max(c_hi, row_hi[r]);
        a_lo = max(a_lo, row_lo[r]), a_hi = min(a_hi, row_hi[r]);
    }
    *ch0 = c_lo / ATT_TK, *ch1 = c_hi / ATT_TK, *c_hi_out = c_hi;
    if (all_lo) *all_lo = a_lo, *all_hi = a_hi; /* positions every row of the block sees */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) lo[hr] = row_lo[ATT_TQ * rt + g + 8 * hr], hi[hr] = row_hi[ATT_TQ * rt + g + 8 * hr];
}

/* Four 8x8 fp16 tiles of a row-major shared matrix: lane l gives the
 * address of row l % 8 of tile l / 8; tile i lands in r[i] (lane l: row
 * l / 4, columns 2 (l % 4), +1: an mma B fragment when the rows are n). */
static __device__ __forceinline__ void ldmatrix_x4(const __half *row_addr, uint32_t (&r)[4]) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Chunk c's scores for the warp's 16 rows (Q as A fragments qa) against the
 * 64 staged K rows ks ([64][HD + ATM_PAD]): s[i][e], position tile i
 * (64c + 8i ..), e as an mma accumulator (rows g, g + 8; positions 2t,
 * 2t + 1); scaled, softcapped, times `post` (1, or log2 e for exp2
 * weights), and, when `mask`, -inf outside each row's [lo, hi] (a chunk
 * every row sees whole needs none). K's B fragments come by ldmatrix, two
 * position tiles a load. The tensor-core prompt attention kernels' score
 * step. */
template <bool SOFTCAP, int HD>
static __device__ __forceinline__ void fa_chunk_scores(const __half *ks, const uint32_t (&qa)[HD / 16][4], int c, int t,
                                                       float scale, float softcap, float post, bool mask,
                                                       const int (&lo)[2], const int (&hi)[2], float (&s)[8][4]) {
    constexpr int KSTR = HD + ATM_PAD;
    const int     lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    /* lane l's row: position 8 (i + l / 16) + l % 8, dims 16kk + 8 ((l / 8) % 2) */
    const __half *krow = ks + (8 * (lane >> 4) + (lane & 7)) * KSTR + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            uint32_t kb[4];
            ldmatrix_x4(krow + 8 * i * KSTR + 16 * kk, kb);
            mma_f16_16816(s[i], qa[kk], kb[0], kb[1]);
            mma_f16_16816(s[i + 1], qa[kk], kb[2], kb[3]);
        }
    const float sp = SOFTCAP ? scale / softcap : scale * post, cp = softcap * post;
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int hr = e >> 1, p = c * ATT_TK + 8 * i + 2 * t + (e & 1);
            float     v = s[i][e] * sp;
            if (SOFTCAP) v = cp * tanhf(v);
            s[i][e] = mask && (p < lo[hr] || p > hi[hr]) ? -INFINITY : v;
        }
}

/* 2^x by the SFU (ex2.approx: about 2 ulp; 2^-inf = 0): the one-pass
 * kernel's weights (FlashAttention's exp2, log2 e folded into the scale). */
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Four 8x8 fp16 tiles of a row-major shared matrix, transposed: lane l
 * gives the address of row l % 8 of tile l / 8; tile i lands in r[i]. */
static __device__ __forceinline__ void ldmatrix_x4_trans(const __half *row_addr, uint32_t (&r)[4]) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Chunk c of KV head kvh (positions 64c .., zeros past c_hi) into K and V
 * buffers ([64][STR] halves each, row-major) by cp.async; the caller
 * commits the group. */
template <int HD, int STR>
static __device__ __forceinline__ void stage_kv_async(const kv_geom &g_, const int32_t *__restrict__ table, int kvh,
                                                      int c, int c_hi, __half *ks, __half *vs) {
    constexpr int N8 = HD / 8;
    for (int e = threadIdx.x; e < ATT_TK * N8; e += blockDim.x) {
        const int      j = e / N8, d8 = e % N8, p = c * ATT_TK + j, pc = min(p, c_hi);
        const uint8_t *blk = g_.k0 + (size_t)table[pc >> g_.block_shift] * g_.block_bytes;
        const size_t   off = (size_t)(pc & g_.block_mask);
        const int      n = p <= c_hi ? 16 : 0;
        cp_async16(ks + j * STR + 8 * d8, blk + kvh * g_.head_stride_k + off * g_.row_bytes_k + 16 * d8, n);
        cp_async16(vs + j * STR + 8 * d8, blk + g_.v_off + kvh * g_.head_stride_v + off * g_.row_bytes_v + 16 * d8, n);
    }
}

/* The tensor-core prompt attention kernels' last step, for a warp's 16
 * rows (rows g and g + 8 of the rows from t0; nt of them are real) of
 * query head h: each row's output O / L (L summed over the row's 4 lanes)
 * into out (F32) and, when ob, BF16 into ob from row n_dec on, for the
 * output projection's GEMM (pp_x). oat(i, e): the O accumulator of dims
 * 8i .. in mma's m16n8 C layout (e: rows g, g + 8 as e / 2; dims 2t, +1).
 * M: the rows' running max (log2 units, the same in a row's 4 lanes, as O
 * and L are scaled by 2^-M); sk2: head h's attention sink in log2 units,
 * or -inf for none. The sink joins the max and the sum here, once:
 * O 2^(M - M') / (L 2^(M - M') + 2^(sk2 - M')), M' = max(M, sk2). */
template <int HD, class OAT>
static __device__ __forceinline__ void fa_store_rows(OAT oat, const float (&L)[2], const float (&M)[2], float sk2,
                                                     int g, int t, int t0, int nt, int n_head, int h,
                                                     float *__restrict__ out, __nv_bfloat16 *__restrict__ ob,
                                                     int n_dec) {
    float inv[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float l = L[hr], mul = 1.0f;
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (sk2 != -INFINITY) { /* (M -inf, no position seen: mul 0, l 1, the row 0) */
            const float mf = fmaxf(M[hr], sk2);
            mul = exp2f(M[hr] - mf);
            l = fmaf(l, mul, exp2f(sk2 - mf));
        }
        inv[hr] = l > 0.0f ? mul / l : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int    r = g + 8 * hr, d = 8 * i + 2 * t;
            const float2 v = make_float2(oat(i, 2 * hr) * inv[hr], oat(i, 2 * hr + 1) * inv[hr]);
            if (r >= nt) continue;
            *(float2 *)(out + ((size_t)(t0 + r) * n_head + h) * HD + d) = v;
            if (ob)
                *(__nv_bfloat162 *)(ob + ((size_t)(t0 + r - n_dec) * n_head + h) * HD + d) =
                    __floats2bfloat162_rn(v.x, v.y);
        }
}

#endif
