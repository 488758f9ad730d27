/* Prompt-row attention on mma.sync: attention_fa1_k (one pass, the
 * default), attention_fa_k (two passes), attention_mma_k (a block per
 * query head); the shared pieces in attn_mma.cuh. */
#include "backend/cuda/ops.cuh"
#include "backend/cuda/attn_mma.cuh"

/* Prompt rows on the tensor cores, one block per (tile of up to 16 rows,
 * KV head): warp w takes query head kvh·G + w (G = n_head / n_kv <= 8), so
 * a staged K/V chunk of 64 positions serves the whole group (a block per
 * query head re-read every chunk G times: the 8B's 4096-token prefill
 * spent 72% of its time there). HD 64 or 128, fp16 KV, head_dim_k ==
 * head_dim_v. A warp keeps its 16 rows' Q (rounded to fp16) as mma A
 * fragments and computes a chunk's 16 x 64 scores in registers. The
 * numerics of attention_mma_k: two passes, each row's exact max and sum
 * over its positions (a chunk's max and sum folded into the running pair),
 * then the normalized weights rounded to fp16, which become the A
 * fragments of P·V straight from the score accumulators (the m16n8 C
 * layout of two adjacent position tiles is the m16k16 A layout). Rows
 * past the tile and positions outside a row's [lo, hi] weigh 0. */
template <bool SOFTCAP, int HD>
__global__ void __launch_bounds__(256) attention_fa_k(kv_geom g_, const int32_t *__restrict__ pos,
                                                      const int32_t *__restrict__ tok_table,
                                                      const int32_t *__restrict__ tables,
                                                      const int32_t *__restrict__ tiles, int n_head, int n_kv,
                                                      float scale, int window, float softcap,
                                                      const float *__restrict__ q, float *__restrict__ out,
                                                      const float *__restrict__ sinks) {
    pdl_entry();
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int KSTR = HD + ATM_PAD, VSTR = ATT_TK + ATM_PAD;
    __half       *ks = (__half *)smem;      /* [64][KSTR] */
    __half       *vt = ks + ATT_TK * KSTR;  /* [HD][VSTR] */
    int          *row_lo = (int *)(vt + HD * VSTR), *row_hi = row_lo + 16;
    const int     t0 = tiles[blockIdx.x], nt = tiles[blockIdx.x + 1] - t0;
    const int     kvh = blockIdx.y, G = n_head / n_kv;
    const int     lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int     h = kvh * G + warp;
    const int32_t *table = tables + tok_table[t0];
    uint32_t qa[HD / 16][4];
    int      ch0, ch1, c_hi, lo[2], hi[2];
    fa_tile_setup<HD>(pos, t0, nt, 0, window, n_head, h, q, g, t, row_lo, row_hi, qa, &ch0, &ch1, &c_hi, lo, hi);
    /* pass 1: each row's max and sum (the 4 lanes of a row's group hold the same pair) */
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads(); /* the previous chunk is consumed */
        stage_kv_chunk(g_, table, kvh, HD, c, c_hi, ks, KSTR, nullptr, VSTR);
        __syncthreads();
        float s[8][4];
        fa_chunk_scores<SOFTCAP, HD>(ks, qa, c, t, scale, softcap, 1.0f, true, lo, hi, s);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float m = -INFINITY;
#pragma unroll
            for (int i = 0; i < 8; i++) m = fmaxf(m, fmaxf(s[i][2 * hr], s[i][2 * hr + 1]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            float l = 0.0f;
            if (m != -INFINITY)
#pragma unroll
                for (int i = 0; i < 8; i++) l += expf(s[i][2 * hr] - m) + expf(s[i][2 * hr + 1] - m);
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (m == -INFINITY) continue;
            if (m > M[hr]) L[hr] = L[hr] * expf(M[hr] - m) + l, M[hr] = m; /* exp(-inf) = 0 while M is -inf */
            else L[hr] += l * expf(m - M[hr]);
        }
    }
    if (sinks) /* head h's sink joins each row's max and sum (M -inf, a row past the tile: L becomes 1) */
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float mf = fmaxf(M[hr], sinks[h]);
            L[hr] = fmaf(L[hr], expf(M[hr] - mf), expf(sinks[h] - mf));
            M[hr] = mf;
        }
    float inv[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) inv[hr] = L[hr] > 0.0f ? 1.0f / L[hr] : 0.0f;
    /* pass 2: weights rounded to fp16, times V */
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads();
        stage_kv_chunk(g_, table, kvh, HD, c, c_hi, ks, KSTR, vt, VSTR);
        __syncthreads();
        float s[8][4];
        fa_chunk_scores<SOFTCAP, HD>(ks, qa, c, t, scale, softcap, 1.0f, true, lo, hi, s);
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e >> 1;
                s[i][e] = s[i][e] == -INFINITY ? 0.0f : expf(s[i][e] - M[hr]) * inv[hr];
            }
#pragma unroll
        for (int j = 0; j < 4; j++) { /* positions 16j .. 16j + 15: tiles 2j and 2j + 1 */
            const uint32_t pa[4] = {pack_half2(s[2 * j][0], s[2 * j][1]), pack_half2(s[2 * j][2], s[2 * j][3]),
                                    pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                    pack_half2(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                const __half *vr = vt + (8 * i + g) * VSTR + 16 * j + 2 * t;
                mma_f16_16816(o[i], pa, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = g + 8 * (e >> 1), d = 8 * i + 2 * t + (e & 1);
            if (r < nt) out[((size_t)(t0 + r) * n_head + h) * HD + d] = o[i][e];
        }
}

static size_t attention_fa_smem(int hd) {
    return sizeof(__half) * ((size_t)ATT_TK * (hd + ATM_PAD) + (size_t)hd * (ATT_TK + ATM_PAD)) + sizeof(int) * 32;
}

/* ---- one-pass prompt attention (the default; AUGUR_CUDA_FA=2pass: attention_fa_k) ----
 *
 * attention_fa_k's block and warp layout (a block per tile of up to 16 rows
 * and KV head, warp w the group's query head w), but one pass over the
 * positions with an online softmax (FlashAttention-2): per chunk of 64
 * positions a row's running max M and sum L, the output rescaled by
 * exp(M_old - M_new) and the unnormalized weights exp(s - M), rounded to
 * fp16, multiplied with V; O / L at the end. As in FlashAttention the
 * scores are kept in log2 units (log2 e folded into the scale) so each
 * weight is one ex2.approx, and only the chunks at a tile's edges (the
 * causal diagonal, a sliding window's start) are masked: the rest are seen
 * whole by every row. (Rows past the tile read Q = 0: their scores are 0,
 * their output is never written.) attention_fa_k stages and
 * scores every chunk twice (the exact max and sum first) and transposes V
 * with 2-byte shared stores; at 4096 tokens attention was ~40% of an 8B
 * prefill. Here the chunks come in by cp.async, two buffers deep (chunk
 * c + 1 loads while c is computed), V stays row-major and P·V's B
 * fragments come from ldmatrix.trans. The numerics differ from the two-pass
 * kernels in the weights' rounding (unnormalized, then one division), as
 * in llama.cpp's flash attention; the harness holds both to the CPU with
 * the same tolerance. At most 168 registers a thread (__maxnreg__, up to
 * 256 threads a block): at 174 an SM held two blocks of 4 warps (HD 128,
 * 4 query heads a KV head), at 168 three fit. */

template <bool SOFTCAP, int HD, int R>
__global__ void __maxnreg__(168) attention_fa1_k(kv_geom g_, const int32_t *__restrict__ pos,
                                                       const int32_t *__restrict__ tok_table,
                                                       const int32_t *__restrict__ tables,
                                                       const int32_t *__restrict__ tiles, int n_head, int n_kv,
                                                       float scale, int window, float softcap,
                                                       const float *__restrict__ q, float *__restrict__ out,
                                                       __nv_bfloat16 *__restrict__ ob, int n_dec,
                                                       const float *__restrict__ sinks) {
    pdl_entry();
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int STR = HD + ATM_PAD, BUF = ATT_TK * STR; /* halves per K (or V) buffer */
    __half       *kbuf = (__half *)smem;                  /* [2][64][STR] */
    __half       *vbuf = kbuf + 2 * BUF;                  /* [2][64][STR] */
    int          *row_lo = (int *)(vbuf + 2 * BUF), *row_hi = row_lo + ATT_TQ * R;
    /* the last tiles first: a causal tile's work grows with its position, and
     * the longest blocks started last would run alone at the end */
    const int     tile = gridDim.x - 1 - blockIdx.x;
    const int     T0 = tiles[tile], NT = tiles[tile + 1] - T0;
    const int     kvh = blockIdx.y, G = n_head / n_kv;
    const int     lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int     rt = warp / G, h = kvh * G + warp % G; /* the warp's row tile and query head */
    const int     t0 = T0 + ATT_TQ * rt, nt = NT - ATT_TQ * rt;
    const int32_t *table = tables + tok_table[T0];
    uint32_t qa[HD / 16][4];
    int      ch0, ch1, c_hi, lo[2], hi[2], all_lo, all_hi;
    fa_tile_setup<HD, R>(pos, T0, NT, rt, window, n_head, h, q, g, t, row_lo, row_hi, qa, &ch0, &ch1, &c_hi, lo, hi,
                         &all_lo, &all_hi);
    const float LOG2E = 1.4426950408889634f; /* scores in log2 units: weights 2^(s - M) */
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}; /* L: this lane's part of the row's sum */
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    stage_kv_async<HD, STR>(g_, table, kvh, ch0, c_hi, kbuf, vbuf);
    cp_async_commit();
    for (int c = ch0; c <= ch1; c++) {
        const int b = (c - ch0) & 1;
        if (c < ch1) /* the next chunk into the other buffers (their last reader finished: the barrier below) */
            stage_kv_async<HD, STR>(g_, table, kvh, c + 1, c_hi, kbuf + (b ^ 1) * BUF, vbuf + (b ^ 1) * BUF);
        cp_async_commit(); /* possibly empty: one group per chunk keeps the count */
        cp_async_wait<1>();
        __syncthreads(); /* chunk c's bytes from every thread */
        const __half *ks = kbuf + b * BUF, *vs = vbuf + b * BUF;
        float         s[8][4];
        const bool    edge = c * ATT_TK < all_lo || c * ATT_TK + ATT_TK - 1 > all_hi; /* block-uniform */
        fa_chunk_scores<SOFTCAP, HD>(ks, qa, c, t, scale, softcap, LOG2E, edge, lo, hi, s);
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float m = -INFINITY;
#pragma unroll
            for (int i = 0; i < 8; i++) m = fmaxf(m, fmaxf(s[i][2 * hr], s[i][2 * hr + 1]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            const float m_new = fmaxf(M[hr], m);
            /* nothing visible yet (m_new -inf): weights 0, nothing to rescale */
            alpha[hr] = m_new == -INFINITY ? 1.0f : fast_exp2(M[hr] - m_new); /* 2^-inf = 0 while M is -inf */
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            float       l = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 2 * hr; e < 2 * hr + 2; e++) {
                    const float w = fast_exp2(s[i][e] - base); /* masked: 2^-inf = 0 */
                    s[i][e] = w;
                    l += w;
                }
            L[hr] = L[hr] * alpha[hr] + l;
            M[hr] = m_new;
        }
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            o[i][0] *= alpha[0], o[i][1] *= alpha[0];
            o[i][2] *= alpha[1], o[i][3] *= alpha[1];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) { /* positions 16j .. 16j + 15: tiles 2j and 2j + 1 */
            const uint32_t pa[4] = {pack_half2(s[2 * j][0], s[2 * j][1]), pack_half2(s[2 * j][2], s[2 * j][3]),
                                    pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]),
                                    pack_half2(s[2 * j + 1][2], s[2 * j + 1][3])};
            /* lane l's row address: position 16j + 8 (l/8 % 2) + l % 8, dims 8 (i + l/16) .. */
            const __half *vrow = vs + (16 * j + 8 * ((lane >> 3) & 1) + (lane & 7)) * STR + 8 * (lane >> 4);
#pragma unroll
            for (int i = 0; i < HD / 8; i += 2) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vrow + 8 * i, vb);
                mma_f16_16816(o[i], pa, vb[0], vb[1]);
                mma_f16_16816(o[i + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads(); /* every warp is done with buffer b before it is staged again */
    }
    fa_store_rows<HD>([&](int i, int e) { return o[i][e]; }, L, M, sinks ? sinks[h] * LOG2E : -INFINITY, g, t, t0,
                      nt, n_head, h, out, ob, n_dec);
}

static size_t attention_fa1_smem(int hd, int r) {
    return sizeof(__half) * 4 * (size_t)ATT_TK * (hd + ATM_PAD) + sizeof(int) * 2 * ATT_TQ * r;
}

/* Launches attention_fa_k, or attention_fa1_k (s->fa_one_pass), for head dim HD (softcap or not). */
template <int HD>
static ag_status launch_attention_fa(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q,
                                     float *out) {
    const bool softcap = sh->softcap > 0.0f;
    const int  G = sh->n_head / sh->n_head_kv;
    const int      n_dec = s->pass_n_decode;
    const size_t   n_pp = (size_t)(s->n - n_dec) * sh->n_head * HD;
    if (s->fa_wg) return launch_attention_wg(s, g, sh, q, out); /* 64-row tiles: attn_prompt_wgmma.cu */
    if (!s->fa_one_pass) {
        auto         k = softcap ? attention_fa_k<true, HD> : attention_fa_k<false, HD>;
        const size_t shm = attention_fa_smem(HD);
        CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        launch_k(s, k, dim3((unsigned)s->n_tiles, (unsigned)sh->n_head_kv), 32 * G, shm, g, s->d_pos,
                 s->d_tok_table, s->d_tables, s->d_tiles, sh->n_head, sh->n_head_kv, sh->scale, sh->window,
                 sh->softcap, q, out, sh->sinks);
        LAUNCHED();
        return AG_OK;
    }
    /* row tiles a block: its 32 G r threads at 168 registers within the
     * SM's 64K (G r <= 12) */
    int r = s->fa_rows;
    while (r > 1 && G * r > 12) r--;
    auto k = r == 1   ? (softcap ? attention_fa1_k<true, HD, 1> : attention_fa1_k<false, HD, 1>)
             : r == 2 ? (softcap ? attention_fa1_k<true, HD, 2> : attention_fa1_k<false, HD, 2>)
                      : (softcap ? attention_fa1_k<true, HD, 3> : attention_fa1_k<false, HD, 3>);
    const int      n_blk = r == 1 ? s->n_tiles : s->n_btiles[r - 2];
    const int32_t *tiles = r == 1 ? s->d_tiles : s->d_btiles[r - 2];
    const size_t   shm = attention_fa1_smem(HD, r);
    /* the prompt rows also as BF16 for the output projection (pp_x), as silu_mul leaves its */
    __nv_bfloat16 *ob = pp_reserve(s, n_pp);
    CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
    launch_k(s, k, dim3((unsigned)n_blk, (unsigned)sh->n_head_kv), 32 * G * r, shm, g, s->d_pos, s->d_tok_table,
             s->d_tables, tiles, sh->n_head, sh->n_head_kv, sh->scale, sh->window, sh->softcap, q, out, ob, n_dec,
             sh->sinks);
    LAUNCHED();
    if (ob) pp_made(s, out + (size_t)n_dec * sh->n_head * HD, n_pp);
    return AG_OK;
}

template <bool SOFTCAP>
__global__ void __launch_bounds__(128) attention_mma_k(kv_geom g_, const int32_t *__restrict__ pos,
                                                       const int32_t *__restrict__ tok_table,
                                                       const int32_t *__restrict__ tables,
                                                       const int32_t *__restrict__ tiles, int n_head, int n_kv, int hd,
                                                       float scale, int window, float softcap,
                                                       const float *__restrict__ q, float *__restrict__ out,
                                                       const float *__restrict__ sinks) {
    pdl_entry();
    extern __shared__ __align__(16) unsigned char smem[];
    const int qs_stride = hd + ATM_PAD, ks_stride = hd + ATM_PAD, vt_stride = ATT_TK + ATM_PAD;
    __half   *qs = (__half *)smem;                 /* [16][qs_stride] */
    __half   *ks = qs + 16 * qs_stride;            /* [64][ks_stride] */
    __half   *vt = ks + ATT_TK * ks_stride;        /* [hd][vt_stride]: V transposed */
    __half   *ps = vt + (size_t)hd * vt_stride;    /* [16][vt_stride]: pass 2's weights */
    float    *red = (float *)(ps + 16 * vt_stride); /* [4][16][2]: a chunk's (max, sum) per warp and row */
    float    *row_m = red + 4 * 16 * 2, *row_l = row_m + 16; /* running max and sum; then max and 1/sum */
    int      *row_lo = (int *)(row_l + 16), *row_hi = row_lo + 16;
    const int t0 = tiles[blockIdx.x], nt = tiles[blockIdx.x + 1] - t0;
    const int h = blockIdx.y, kvh = h / (n_head / n_kv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int32_t *table = tables + tok_table[t0];
    for (int e = threadIdx.x; e < 16 * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        qs[r * qs_stride + d] = __float2half_rn(r < nt ? q[((size_t)(t0 + r) * n_head + h) * hd + d] : 0.0f);
    }
    if (threadIdx.x < 16) {
        const int r = threadIdx.x, hi = r < nt ? pos[t0 + r] : -1;
        row_hi[r] = hi;
        row_lo[r] = r < nt && window > 0 ? max(0, hi - window + 1) : 0;
        row_m[r] = -INFINITY;
        row_l[r] = 0.0f;
    }
    __syncthreads();
    int c_lo = INT_MAX, c_hi = -1; /* the tile's span (the same in every thread) */
    for (int r = 0; r < nt; r++) c_lo = min(c_lo, row_lo[r]), c_hi = max(c_hi, row_hi[r]);
    const int ch0 = c_lo / ATT_TK, ch1 = c_hi / ATT_TK;
    auto stage = [&](int c, bool with_v) { stage_kv_chunk(g_, table, kvh, hd, c, c_hi, ks, ks_stride, with_v ? vt : nullptr, vt_stride); };
    /* the scores of this warp's 16 positions of chunk c: s[i][e] for n-tile
     * i (positions 16 warp + 8i ..), e as an mma accumulator (rows g, g + 8;
     * positions 2t, 2t + 1); masked ones -inf */
    auto scores = [&](int c, float (&sc)[2][4]) {
#pragma unroll
        for (int i = 0; i < 2; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
        for (int kk = 0; kk < hd; kk += 16) {
            uint32_t a[4];
            frag_a_smem(qs, qs_stride, kk, g, t, a);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const __half *kr = ks + (16 * warp + 8 * i + g) * ks_stride + kk + 2 * t;
                mma_f16_16816(sc[i], a, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = g + 8 * (e >> 1), p = c * ATT_TK + 16 * warp + 8 * i + 2 * t + (e & 1);
                float     v = sc[i][e] * scale;
                if (SOFTCAP) v = softcap * tanhf(v / softcap);
                sc[i][e] = p < row_lo[r] || p > row_hi[r] ? -INFINITY : v;
            }
    };
    /* pass 1: each row's max and sum */
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads(); /* the previous chunk's rows are consumed */
        stage(c, false);
        __syncthreads();
        float sc[2][4];
        scores(c, sc);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) { /* row g + 8 hr: its 4 values here, then the 4 lanes of the group */
            float m = fmaxf(fmaxf(sc[0][2 * hr], sc[0][2 * hr + 1]), fmaxf(sc[1][2 * hr], sc[1][2 * hr + 1]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            float l = 0.0f;
            if (m != -INFINITY)
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int e = 0; e < 2; e++) l += expf(sc[i][2 * hr + e] - m); /* exp(-inf) = 0 */
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (t == 0) red[(warp * 16 + g + 8 * hr) * 2] = m, red[(warp * 16 + g + 8 * hr) * 2 + 1] = l;
        }
        __syncthreads();
        if (threadIdx.x < 16) { /* row r folds the warps' pairs in warp order */
            const int r = threadIdx.x;
            float     M = row_m[r], L = row_l[r];
            for (int w = 0; w < 4; w++) {
                const float mw = red[(w * 16 + r) * 2], lw = red[(w * 16 + r) * 2 + 1];
                if (mw == -INFINITY) continue;
                if (mw > M) L = L * expf(M - mw) + lw, M = mw; /* exp(-inf) = 0 while M is -inf */
                else L += lw * expf(mw - M);
            }
            row_m[r] = M, row_l[r] = L;
        }
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        const int r = threadIdx.x;
        float     M = row_m[r], L = row_l[r];
        if (sinks) { /* head h's sink joins the row's max and sum (M -inf, a row past the tile: L becomes 1) */
            const float mf = fmaxf(M, sinks[h]);
            L = fmaf(L, expf(M - mf), expf(sinks[h] - mf));
            M = mf;
        }
        row_m[r] = M;
        row_l[r] = L > 0.0f ? 1.0f / L : 0.0f;
    }
    /* pass 2: weights rounded to fp16, times V; warp w owns dims [w hd/4, (w+1) hd/4) */
    const int dq = hd / 4, n_dt = dq / 8; /* 2, 4 or 8 n-tiles of dims */
    float     o[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads();
        stage(c, true);
        __syncthreads();
        float sc[2][4];
        scores(c, sc);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int   r = g + 8 * (e >> 1);
                const float w = sc[i][e] == -INFINITY ? 0.0f : expf(sc[i][e] - row_m[r]) * row_l[r];
                ps[r * vt_stride + 16 * warp + 8 * i + 2 * t + (e & 1)] = __float2half_rn(w);
            }
        __syncthreads();
#pragma unroll
        for (int ks16 = 0; ks16 < ATT_TK; ks16 += 16) {
            uint32_t a[4];
            frag_a_smem(ps, vt_stride, ks16, g, t, a);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (i >= n_dt) break;
                const __half *vr = vt + (warp * dq + 8 * i + g) * vt_stride + ks16 + 2 * t;
                mma_f16_16816(o[i], a, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (i >= n_dt) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = g + 8 * (e >> 1), d = warp * dq + 8 * i + 2 * t + (e & 1);
            if (r < nt) out[((size_t)(t0 + r) * n_head + h) * hd + d] = o[i][e];
        }
    }
}

static size_t attention_mma_smem(int hd) {
    return sizeof(__half) * ((size_t)16 * (hd + ATM_PAD) + (size_t)ATT_TK * (hd + ATM_PAD) +
                             (size_t)(hd + 16) * (ATT_TK + ATM_PAD)) +
           sizeof(float) * (4 * 16 * 2 + 16 + 16) + sizeof(int) * 32;
}

ag_status launch_attention_group(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out) {
    return sh->head_dim_k == 64 ? launch_attention_fa<64>(s, g, sh, q, out) : launch_attention_fa<128>(s, g, sh, q, out);
}

/* attention_mma_k: a block per (tile, query head), head dims of 32 up to
 * 256 (those the group kernels do not take). */
ag_status launch_attention_mma(cuda_state *s, const kv_geom &g, const ag_attn_shape *sh, const float *q, float *out) {
    const int hd = sh->head_dim_k;
    dim3         grid((unsigned)s->n_tiles, (unsigned)sh->n_head);
    const size_t shm = attention_mma_smem(hd);
    if (sh->softcap > 0.0f) {
        CUDA_TRY(cudaFuncSetAttribute(attention_mma_k<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        launch_k(s, attention_mma_k<true>, grid, 128, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                 s->d_tiles, sh->n_head, sh->n_head_kv, hd, sh->scale, sh->window, sh->softcap, q, out, sh->sinks);
    } else {
        CUDA_TRY(cudaFuncSetAttribute(attention_mma_k<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        launch_k(s, attention_mma_k<false>, grid, 128, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                 s->d_tiles, sh->n_head, sh->n_head_kv, hd, sh->scale, sh->window, sh->softcap, q, out, sh->sinks);
    }
    LAUNCHED();
    return AG_OK;
}
