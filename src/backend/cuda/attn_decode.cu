/* The attention op (cu_attention): decode rows (attention_k, split-K
 * attention_split_k) and the SIMT prompt tiles (attention_tiled_k) here,
 * prompt rows on the tensor cores in attn_prompt_mma.cu and
 * attn_prompt_wgmma.cu. */
#include "backend/cuda/ops.cuh"

/* out[t][head] = softmax(scale q·K)·V over the token's visible positions,
 * rounded as the CPU backend (and llama.cpp) rounds: q and the normalized
 * softmax weights pass through fp16. One block per (token, head). Pass 1
 * finds the max and the sum (each thread online over its positions, then
 * combined); pass 2 recomputes a chunk's scores into shared memory as
 * normalized fp16-rounded weights and accumulates V (threads own dims). */
template <bool F16>
__global__ void attention_k(kv_geom g, const int32_t *__restrict__ pos, const int32_t *__restrict__ tok_table,
                            const int32_t *__restrict__ tables, int n_head, int n_kv, int hd_k, int hd_v, float scale,
                            int window, float softcap, const float *__restrict__ q, float *__restrict__ out,
                            const float *__restrict__ sinks) {
    pdl_entry();
    extern __shared__ float sm[]; /* q[hd_k], w[ATT_CHUNK], red[32] */
    float *qs = sm, *wt = sm + hd_k, *red = wt + ATT_CHUNK;
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (n_head / n_kv);
    const int p_hi = pos[t], p_lo = window > 0 ? max(0, p_hi - window + 1) : 0;
    const int32_t *table = tables + tok_table[t];
    for (int d = threadIdx.x; d < hd_k; d += blockDim.x)
        qs[d] = __half2float(__float2half_rn(q[((size_t)t * n_head + h) * hd_k + d]));
    __syncthreads();
    auto score = [&](int p) {
        const uint8_t *kr = g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes + kvh * g.head_stride_k +
                            (size_t)(p & g.block_mask) * g.row_bytes_k;
        float dot = 0.0f;
        for (int d = 0; d < hd_k; d++) dot = fmaf(qs[d], kv_get<F16>(kr, d), dot);
        dot *= scale;
        if (softcap > 0.0f) dot = softcap * tanhf(dot / softcap);
        return dot;
    };
    float m = -INFINITY, l = 0.0f;
    for (int p = p_lo + threadIdx.x; p <= p_hi; p += blockDim.x) {
        const float s = score(p);
        if (s > m) {
            l = l * expf(m - s) + 1.0f;
            m = s;
        } else {
            l += expf(s - m);
        }
    }
    /* a sink joins the max and the sum (block-uniform: every thread reads it) */
    const float M = sinks ? fmaxf(block_max(m, red), sinks[h]) : block_max(m, red);
    float       L = block_sum(m == -INFINITY ? 0.0f : l * expf(m - M), red);
    if (sinks) L += expf(sinks[h] - M);
    const float inv = 1.0f / L;
    float       acc[ATT_MAX_DV / ATT_THREADS] = {0.0f, 0.0f};
    for (int c0 = p_lo; c0 <= p_hi; c0 += ATT_CHUNK) {
        const int cn = min(ATT_CHUNK, p_hi - c0 + 1);
        __syncthreads(); /* the previous chunk's weights are consumed */
        for (int j = threadIdx.x; j < cn; j += blockDim.x)
            wt[j] = __half2float(__float2half_rn(expf(score(c0 + j) - M) * inv));
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ATT_MAX_DV / ATT_THREADS; i++) {
            const int d = threadIdx.x + i * ATT_THREADS;
            if (d >= hd_v) break;
            float a = acc[i];
            for (int j = 0; j < cn; j++) {
                const int      p = c0 + j;
                const uint8_t *vr = g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes + g.v_off +
                                    kvh * g.head_stride_v + (size_t)(p & g.block_mask) * g.row_bytes_v;
                a = fmaf(wt[j], kv_get<F16>(vr, d), a);
            }
            acc[i] = a;
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DV / ATT_THREADS; i++) {
        const int d = threadIdx.x + i * ATT_THREADS;
        if (d < hd_v) out[((size_t)t * n_head + h) * hd_v + d] = acc[i];
    }
}

/* Decode rows, split-K (flash decoding). attention_k runs one block per
 * (row, head): 32 blocks for an 8B model at batch 1, each walking its row's
 * whole context with thread-serial dot products, so long contexts leave the
 * GPU idle (8B Q4_K_M, batch 1, after 4096 positions: 26 tok/s). Here block
 * (row, head, split) takes split `sp` of the row's visible positions: at
 * least min_per positions per split and at most `splits` splits, cut by
 * the row's own length (and the process's constants), so a row's result never depends on the batch, and
 * the grid does not depend on the context (recorded passes stay valid as
 * it grows; splits past a short row's last one return at once). Lane l
 * holds dims [NK l, NK l + NK) of q (rounded to fp16 as in attention_k),
 * K and V (head_dim = 32 NK, F16 cache). Warp w takes groups of ATT_SK_GROUP
 * consecutive positions (groups w, w + 4, ...): their K rows are loaded
 * together, their scores reduced, then an online softmax step for the
 * group: running max m, sum l and the unnormalized Σ e^(s-m) V, rescaled
 * when m grows. The warps, then the splits (by the last block of the row
 * and head to finish, found with a counter), are merged in index order:
 * out = Σ e^(m_i - M) acc_i / Σ e^(m_i - M) l_i. Unlike attention_k, the
 * softmax weights are not rounded to fp16 (test_backend_ops: within its
 * tolerance of the CPU). */
#define ATT_SK_WARPS 4
#define ATT_SK_GROUP 8

/* NK consecutive halves at p (4 NK-byte aligned) as floats. */
template <int NK>
static __device__ __forceinline__ void load_halves(const uint8_t *p, float (&v)[NK]) {
    static_assert(NK == 2 || NK == 4 || NK == 8, "NK");
    uint32_t w[NK / 2];
    if constexpr (NK == 2) {
        w[0] = __ldg((const uint32_t *)p);
    } else if constexpr (NK == 4) {
        const uint2 r = __ldg((const uint2 *)p);
        w[0] = r.x, w[1] = r.y;
    } else {
        const uint4 r = __ldg((const uint4 *)p);
        w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
    }
#pragma unroll
    for (int i = 0; i < NK / 2; i++) {
        const float2 f = __half22float2(*(const __half2 *)&w[i]);
        v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
}

/* The splits of a row whose visible positions are [p_lo, p_hi] (at most
 * `splits`, at least `min_per` positions each), and the positions per split. */
static __device__ __forceinline__ int att_splits_of(int p_lo, int p_hi, int splits, int min_per, int *per) {
    const int len = p_hi - p_lo + 1;
    *per = max(min_per, (len + splits - 1) / splits);
    return (len + *per - 1) / *per;
}

template <int NK>
__global__ void __launch_bounds__(32 * ATT_SK_WARPS)
    attention_split_k(kv_geom g, const int32_t *__restrict__ pos, const int32_t *__restrict__ tok_table,
                      const int32_t *__restrict__ tables, int n_head, int n_kv, int splits, int min_per, float scale, int window,
                      float softcap, const float *__restrict__ q, float *__restrict__ part,
                      float *__restrict__ part_ml, int *__restrict__ cnt, float *__restrict__ out, int fmt,
                      int8_t *__restrict__ xq, float2 *__restrict__ xs, __nv_bfloat16 *__restrict__ xh,
                      const float *__restrict__ sinks) {
    pdl_entry();
    constexpr int HD = 32 * NK, P = ATT_SK_GROUP;
    __shared__ float w_m[ATT_SK_WARPS], w_l[ATT_SK_WARPS], w_acc[ATT_SK_WARPS][HD];
    __shared__ bool  last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, kvh = h / (n_head / n_kv);
    const int p_hi = pos[t], p_lo = window > 0 ? max(0, p_hi - window + 1) : 0;
    int       per;
    const int n_sp = att_splits_of(p_lo, p_hi, splits, min_per, &per);
    if (sp >= n_sp) return;
    const int      r0 = p_lo + sp * per, r1 = min(p_hi + 1, r0 + per);
    const int32_t *table = tables + tok_table[t];
    float          qr[NK], acc[NK];
#pragma unroll
    for (int j = 0; j < NK; j++) {
        qr[j] = __half2float(__float2half_rn(q[((size_t)t * n_head + h) * HD + NK * lane + j]));
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p0 = r0 + P * warp; p0 < r1; p0 += P * ATT_SK_WARPS) {
        float s[P];
#pragma unroll
        for (int i = 0; i < P; i++) {
            s[i] = -INFINITY;
            const int p = p0 + i;
            if (p < r1) {
                const uint8_t *kr = g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes +
                                    kvh * g.head_stride_k + (size_t)(p & g.block_mask) * g.row_bytes_k;
                float k[NK];
                load_halves<NK>(kr + 2 * NK * lane, k);
                float dot = 0.0f;
#pragma unroll
                for (int j = 0; j < NK; j++) dot = fmaf(qr[j], k[j], dot);
                s[i] = dot;
            }
        }
        float mx = m;
#pragma unroll
        for (int i = 0; i < P; i++)
            if (p0 + i < r1) {
                float d = warp_sum(s[i]) * scale;
                if (softcap > 0.0f) d = softcap * tanhf(d / softcap);
                s[i] = d;
                mx = fmaxf(mx, d);
            }
        const float c = expf(m - mx); /* 0 on the first group (m = -inf) */
        l *= c;
#pragma unroll
        for (int j = 0; j < NK; j++) acc[j] *= c;
        float v[P][NK];
#pragma unroll
        for (int i = 0; i < P; i++) {
            const int p = p0 + i;
            if (p < r1)
                load_halves<NK>(g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes + g.v_off +
                                    kvh * g.head_stride_v + (size_t)(p & g.block_mask) * g.row_bytes_v + 2 * NK * lane,
                                v[i]);
        }
#pragma unroll
        for (int i = 0; i < P; i++)
            if (p0 + i < r1) {
                const float e = expf(s[i] - mx);
                l += e;
#pragma unroll
                for (int j = 0; j < NK; j++) acc[j] = fmaf(e, v[i][j], acc[j]);
            }
        m = mx;
    }
    /* the block's warps, in warp order */
    if (lane == 0) w_m[warp] = m, w_l[warp] = l;
#pragma unroll
    for (int j = 0; j < NK; j++) w_acc[warp][NK * lane + j] = acc[j];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_SK_WARPS; w++) M = fmaxf(M, w_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_SK_WARPS; w++)
        if (w_m[w] != -INFINITY) L = fmaf(w_l[w], expf(w_m[w] - M), L);
    float *o = out + ((size_t)t * n_head + h) * HD;
    if (n_sp == 1) { /* a short row: no partials; the sink joins here, as at the merge below */
        if (sinks) {
            const float Ms = fmaxf(M, sinks[h]), c = expf(M - Ms); /* (M finite: a row sees its own position) */
            L = fmaf(L, c, expf(sinks[h] - Ms));
            M = Ms;
        }
        const float inv = 1.0f / L;
        for (int d = threadIdx.x; d < HD; d += blockDim.x) {
            float a = 0.0f;
            for (int w = 0; w < ATT_SK_WARPS; w++)
                if (w_m[w] != -INFINITY) a = fmaf(w_acc[w][d], expf(w_m[w] - M), a);
            o[d] = a * inv;
            if (fmt) prep_store1(a * inv, ((size_t)t * n_head + h) * HD + d, fmt, xq, xs, xh); /* warp-uniform */
        }
        return;
    }
    const size_t s0 = ((size_t)t * n_head + h) * splits, slot = s0 + sp;
    if (threadIdx.x == 0) part_ml[2 * slot] = M, part_ml[2 * slot + 1] = L;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_SK_WARPS; w++)
            if (w_m[w] != -INFINITY) a = fmaf(w_acc[w][d], expf(w_m[w] - M), a);
        part[slot * HD + d] = a;
    }
    /* the last split of (row, head) to finish merges them all */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *ctr = cnt + (size_t)t * n_head + h;
        last = atomicAdd(ctr, 1) == n_sp - 1;
        if (last) *ctr = 0; /* ready for the next pass (or graph replay) */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float MM = -INFINITY, LL = 0.0f;
    for (int i = 0; i < n_sp; i++) MM = fmaxf(MM, __ldcg(&part_ml[2 * (s0 + i)]));
    if (sinks) MM = fmaxf(MM, sinks[h]); /* the sink: once, here (the splits' partials have none) */
    for (int i = 0; i < n_sp; i++) {
        const float mi = __ldcg(&part_ml[2 * (s0 + i)]);
        if (mi != -INFINITY) LL = fmaf(__ldcg(&part_ml[2 * (s0 + i) + 1]), expf(mi - MM), LL);
    }
    if (sinks) LL += expf(sinks[h] - MM);
    const float inv = 1.0f / LL;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < n_sp; i++) {
            const float mi = __ldcg(&part_ml[2 * (s0 + i)]);
            if (mi != -INFINITY) a = fmaf(__ldcg(&part[(s0 + i) * HD + d]), expf(mi - MM), a);
        }
        o[d] = a * inv;
        if (fmt) prep_store1(a * inv, ((size_t)t * n_head + h) * HD + d, fmt, xq, xs, xh); /* warp-uniform */
    }
}

/* Prompt rows: one block per (tile of up to ATT_TQ rows of one sequence,
 * head); 4 warps, each owning ATT_TQ/4 rows. The positions come in chunks of
 * ATT_TK aligned to absolute positions, their K (and V) rows staged in
 * shared memory once for all the tile's rows. The arithmetic of each row is
 * the single-row kernel's rounding (q and the normalized weights through
 * fp16), in an order fixed by the row's own positions (chunk, then lane), so
 * a row's result does not depend on which rows share its tile. */
template <bool F16>
__global__ void __launch_bounds__(128) attention_tiled_k(kv_geom g, const int32_t *__restrict__ pos,
                                                         const int32_t *__restrict__ tok_table,
                                                         const int32_t *__restrict__ tables,
                                                         const int32_t *__restrict__ tiles, int n_head, int n_kv,
                                                         int hd_k, int hd_v, float scale, int window, float softcap,
                                                         const float *__restrict__ q, float *__restrict__ out,
                                                         const float *__restrict__ sinks) {
    pdl_entry();
    typedef typename std::conditional<F16, __half, float>::type elem;
    constexpr int RPW = ATT_TQ / 4; /* rows per warp */
    extern __shared__ __align__(16) unsigned char smem[];
    const int     t0 = tiles[blockIdx.x], nt = tiles[blockIdx.x + 1] - t0;
    const int     h = blockIdx.y, kvh = h / (n_head / n_kv);
    const int     lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int     ks_stride = hd_k + (F16 ? 2 : 1), vs_stride = hd_v; /* K padded: lanes read different rows */
    float        *qs = (float *)smem;                                  /* [ATT_TQ][hd_k] */
    float        *wts = qs + ATT_TQ * hd_k;                            /* [ATT_TQ][ATT_TK] */
    elem         *ks = (elem *)(wts + ATT_TQ * ATT_TK);                /* [ATT_TK][ks_stride] */
    elem         *vs = ks + ATT_TK * ks_stride;                        /* [ATT_TK][hd_v] */
    const int32_t *table = tables + tok_table[t0];
    for (int e = threadIdx.x; e < ATT_TQ * hd_k; e += blockDim.x) {
        const int r = e / hd_k, d = e % hd_k;
        qs[e] = r < nt ? __half2float(__float2half_rn(q[((size_t)(t0 + r) * n_head + h) * hd_k + d])) : 0.0f;
    }
    int lo[RPW], hi[RPW];
    int c_lo = INT_MAX, c_hi = -1;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp * RPW + i;
        hi[i] = r < nt ? pos[t0 + r] : -1;
        lo[i] = r < nt ? (window > 0 ? max(0, hi[i] - window + 1) : 0) : 0;
    }
    for (int r = 0; r < nt; r++) { /* the tile's span (the same in every thread) */
        const int p = pos[t0 + r];
        c_lo = min(c_lo, window > 0 ? max(0, p - window + 1) : 0);
        c_hi = max(c_hi, p);
    }
    const int ch0 = c_lo / ATT_TK, ch1 = c_hi / ATT_TK;
    auto load = [&](int c, bool with_v) {
        for (int e = threadIdx.x; e < ATT_TK * hd_k; e += blockDim.x) {
            const int j = e / hd_k, d = e % hd_k, p = c * ATT_TK + j;
            if (p > c_hi) continue;
            const uint8_t *kr = g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes + kvh * g.head_stride_k +
                                (size_t)(p & g.block_mask) * g.row_bytes_k;
            ks[j * ks_stride + d] = ((const elem *)kr)[d];
        }
        if (with_v)
            for (int e = threadIdx.x; e < ATT_TK * hd_v; e += blockDim.x) {
                const int j = e / hd_v, d = e % hd_v, p = c * ATT_TK + j;
                if (p > c_hi) continue;
                const uint8_t *vr = g.k0 + (size_t)table[p >> g.block_shift] * g.block_bytes + g.v_off +
                                    kvh * g.head_stride_v + (size_t)(p & g.block_mask) * g.row_bytes_v;
                vs[j * vs_stride + d] = ((const elem *)vr)[d];
            }
    };
    auto score = [&](int r_local, int j) {
        const float *qv = qs + (warp * RPW + r_local) * hd_k;
        const elem  *kr = ks + j * ks_stride;
        float        dot = 0.0f;
        for (int d = 0; d < hd_k; d++) dot = fmaf(qv[d], (float)kr[d], dot);
        dot *= scale;
        if (softcap > 0.0f) dot = softcap * tanhf(dot / softcap);
        return dot;
    };
    /* pass 1: each lane's running max and sum over its positions, per row */
    float m[RPW], l[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) m[i] = -INFINITY, l[i] = 0.0f;
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads();
        load(c, false);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPW; i++)
            for (int j = lane; j < ATT_TK; j += 32) {
                const int p = c * ATT_TK + j;
                if (p < lo[i] || p > hi[i]) continue;
                const float sc = score(i, j);
                if (sc > m[i]) {
                    l[i] = l[i] * expf(m[i] - sc) + 1.0f;
                    m[i] = sc;
                } else {
                    l[i] += expf(sc - m[i]);
                }
            }
    }
    float M[RPW], inv[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        float mm = m[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
        if (sinks) mm = fmaxf(mm, sinks[h]); /* a sink joins the row's max and (once, after the lanes) its sum */
        float ll = m[i] == -INFINITY ? 0.0f : l[i] * expf(m[i] - mm);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ll += __shfl_xor_sync(0xffffffffu, ll, o);
        if (sinks) ll += expf(sinks[h] - mm);
        M[i] = mm;
        inv[i] = 1.0f / ll;
    }
    /* pass 2: normalized fp16-rounded weights, then V; lane owns dims lane + 32 k */
    constexpr int DV = ATT_MAX_DV / 32;
    float         acc[RPW][DV];
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
        for (int k = 0; k < DV; k++) acc[i][k] = 0.0f;
    for (int c = ch0; c <= ch1; c++) {
        __syncthreads();
        load(c, true);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            float *wr = wts + (warp * RPW + i) * ATT_TK;
            for (int j = lane; j < ATT_TK; j += 32) {
                const int p = c * ATT_TK + j;
                wr[j] = p < lo[i] || p > hi[i] ? 0.0f : __half2float(__float2half_rn(expf(score(i, j) - M[i]) * inv[i]));
            }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const float *wr = wts + (warp * RPW + i) * ATT_TK;
            const int    j0 = max(0, lo[i] - c * ATT_TK), j1 = min(ATT_TK - 1, hi[i] - c * ATT_TK);
#pragma unroll
            for (int k = 0; k < DV; k++) {
                const int d = lane + 32 * k;
                if (d >= hd_v) break;
                float a = acc[i][k];
                for (int j = j0; j <= j1; j++) a = fmaf(wr[j], (float)vs[j * vs_stride + d], a);
                acc[i][k] = a;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp * RPW + i;
        if (r >= nt) continue;
#pragma unroll
        for (int k = 0; k < DV; k++) {
            const int d = lane + 32 * k;
            if (d < hd_v) out[((size_t)(t0 + r) * n_head + h) * hd_v + d] = acc[i][k];
        }
    }
}
static size_t tiled_smem(int hd_k, int hd_v, bool f16) {
    const size_t e = f16 ? 2 : 4;
    return sizeof(float) * ((size_t)ATT_TQ * hd_k + (size_t)ATT_TQ * ATT_TK) +
           e * ((size_t)ATT_TK * (hd_k + (f16 ? 2 : 1)) + (size_t)ATT_TK * hd_v);
}

ag_status cu_attention(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b,
                       const float *q, float *out) {
    cuda_state *s = st_of(be);
    if (b->n != s->n) return ag_errorf(AG_ERR_INVALID, "CUDA attention: batch differs from the pass (see begin)");
    prep_forget(s, out, (size_t)b->n * sh->n_head * sh->head_dim_v * sizeof(float));
    if (sh->head_dim_v > ATT_MAX_DV || sh->n_head % sh->n_head_kv)
        return ag_errorf(AG_ERR_UNSUPPORTED, "CUDA attention: head_dim_v %d (max %d), %d heads over %d kv heads",
                         sh->head_dim_v, ATT_MAX_DV, sh->n_head, sh->n_head_kv);
    if (b->n <= 0) return AG_OK;
    kv_select(s, kv, sh->layer);
    kv_geom   g = geom_of(kv, sh->layer);
    const bool f16 = ag_kv_get_layout(kv)->dtype == AG_KV_F16;
    /* decode rows: one block per (row, head); prompt rows: tiles (see begin) */
    const int n_dec = b->n_decode > 0 ? (b->n_decode < b->n ? b->n_decode : b->n) : 0;
    /* split-K for every decode row when on and the shape allows: chosen by
     * the shape and the process, never by the batch */
    const int  hdk = sh->head_dim_k;
    const bool splitk = s->att.splitk_on && f16 && hdk == sh->head_dim_v && (hdk == 64 || hdk == 128 || hdk == 256);
    if (n_dec > 0 && splitk) {
        const size_t acc_floats = (size_t)n_dec * sh->n_head * s->att.att_splits * hdk;
        const size_t need = acc_floats + (size_t)n_dec * sh->n_head * s->att.att_splits * 2,
                     heads = (size_t)n_dec * sh->n_head;
        if (need > s->att.cap_att_part || heads > s->att.cap_att_cnt) {
            /* begin reserves for the model's shapes (max_att_out) before a
             * pass is recorded; other callers (the op harness) grow it here */
            cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
            CUDA_TRY(cudaStreamIsCapturing(s->stream, &cs));
            if (cs != cudaStreamCaptureStatusNone)
                return ag_errorf(AG_ERR_INVALID, "CUDA attention: split-K scratch for %d rows not reserved (see begin)",
                                 n_dec);
            ag_status st = reserve_att_for(s, need, heads);
            if (st) return st;
        }
        dim3   grid((unsigned)n_dec, (unsigned)sh->n_head, (unsigned)s->att.att_z);
        float *part = s->att.d_att_part, *part_ml = s->att.d_att_part + acc_floats;
        /* the decode rows' output also left converted for attn_output's matmul */
        const int fmt = prep_formats(s, b->n, sh->n_head * hdk);
#define ATT_SK_LAUNCH(NK)                                                                                         \
    launch_k(s, attention_split_k<NK>, grid, 32 * ATT_SK_WARPS, 0, g, s->d_pos, s->d_tok_table, s->d_tables,           \
             sh->n_head, sh->n_head_kv, s->att.att_splits, s->att.att_min, sh->scale, sh->window, sh->softcap, q,      \
             part, part_ml, s->att.d_att_cnt, out, fmt, s->d_xq, s->d_xs, s->d_xh, sh->sinks)
        if (hdk == 64) ATT_SK_LAUNCH(2);
        else if (hdk == 128) ATT_SK_LAUNCH(4);
        else ATT_SK_LAUNCH(8);
#undef ATT_SK_LAUNCH
        LAUNCHED();
        if (fmt) prep_made(s, out, b->n, sh->n_head * hdk, fmt); /* prompt rows below write rows past n_dec */
    } else if (n_dec > 0) {
        dim3   grid((unsigned)n_dec, (unsigned)sh->n_head);
        size_t shm = sizeof(float) * ((size_t)sh->head_dim_k + ATT_CHUNK + 32);
        if (f16)
            launch_k(s, attention_k<true>, grid, ATT_THREADS, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                     sh->n_head, sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, sh->scale, sh->window, sh->softcap, q,
                     out, sh->sinks);
        else
            launch_k(s, attention_k<false>, grid, ATT_THREADS, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                     sh->n_head, sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, sh->scale, sh->window, sh->softcap, q,
                     out, sh->sinks);
        LAUNCHED();
    }
    const int hd = sh->head_dim_k, group = sh->n_head / sh->n_head_kv;
    if (s->fa_on && s->n_tiles > 0 && f16 && hd == sh->head_dim_v && group <= 8 && (hd == 64 || hd == 128) &&
        !s->fa_per_head) /* tensor cores, a KV head's query heads per block */
        return launch_attention_group(s, g, sh, q, out);
    if (s->fa_on && s->n_tiles > 0 && f16 && hd == sh->head_dim_v && hd % 32 == 0 && hd <= 256) /* tensor cores */
        return launch_attention_mma(s, g, sh, q, out);
    if (s->n_tiles > 0) {
        dim3   grid((unsigned)s->n_tiles, (unsigned)sh->n_head);
        size_t shm = tiled_smem(sh->head_dim_k, sh->head_dim_v, f16);
        if (f16) {
            CUDA_TRY(cudaFuncSetAttribute(attention_tiled_k<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
            launch_k(s, attention_tiled_k<true>, grid, 128, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                     s->d_tiles, sh->n_head, sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, sh->scale, sh->window,
                     sh->softcap, q, out, sh->sinks);
        } else {
            CUDA_TRY(cudaFuncSetAttribute(attention_tiled_k<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
            launch_k(s, attention_tiled_k<false>, grid, 128, shm, g, s->d_pos, s->d_tok_table, s->d_tables,
                     s->d_tiles, sh->n_head, sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, sh->scale, sh->window,
                     sh->softcap, q, out, sh->sinks);
        }
        LAUNCHED();
    }
    return AG_OK;
}

