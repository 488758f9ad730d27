/* RoPE, the KV store into the paged pool, and both in one kernel
 * (rope_kv_store). */
#include "backend/cuda/ops.cuh"

/* theta_i = pos * freq_scale * base^(-2i/rope_dim), in double as on the CPU */
static __device__ __forceinline__ double rope_theta(int pos, float freq_scale, float base, int i, int rope_dim) {
    return (double)pos * freq_scale * pow((double)base, -2.0 * i / rope_dim);
}
/* One pair rotated by (c, s), each product rounded (no FMA contraction,
 * which the compiler may choose differently per call site): rope_k and
 * rope_kv_store_k give the same bits, and the CPU's arithmetic. */
static __device__ __forceinline__ void rope_pair(float a, float b, float c, float s, float *o0, float *o1) {
    *o0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *o1 = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

/* Every (token, head, pair) of x[n][n_head][head_dim] turned by the
 * cos/sin that angle(pos, i) gives (the float pair (c, s)), as rope_pair:
 * rope_k and rope_freqs_k differ only in the angle. */
template <typename Angle>
static __device__ __forceinline__ void rope_rows(float *x, int n, int n_head, int head_dim, int rope_dim,
                                                 const int32_t *pos, int neox, Angle angle) {
    const int    half = rope_dim / 2;
    const size_t total = (size_t)n * n_head * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int    i = (int)(e % half);
        const size_t th = e / half; /* token * n_head + head */
        const int    t = (int)(th / n_head);
        float        c, s;
        angle(pos[t], i, &c, &s);
        float    *v = x + th * head_dim;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        rope_pair(v[i0], v[i1], c, s, &v[i0], &v[i1]);
    }
}

__global__ void rope_k(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos, float base,
                       float freq_scale, int neox) {
    pdl_entry();
    rope_rows(x, n, n_head, head_dim, rope_dim, pos, neox, [=](int32_t p, int i, float *c, float *s) {
        const double theta = rope_theta(p, freq_scale, base, i, rope_dim);
        *c = (float)cos(theta), *s = (float)sin(theta);
    });
}

ag_status cu_rope(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                  float base, float freq_scale, bool neox) {
    cuda_state    *s = st_of(be);
    const int32_t *d_pos = pass_ints(s, pos, n);
    if (!d_pos) return ag_errorf(AG_ERR_INVALID, "CUDA rope: pos must be the pass's positions (see begin)");
    if (n <= 0) return AG_OK;
    prep_forget(s, x, (size_t)n * n_head * head_dim * sizeof(float));
    launch_k(s, rope_k, grid_for((size_t)n * n_head * (rope_dim / 2), 256), 256, 0, x, n, n_head, head_dim,
             rope_dim, d_pos, base, freq_scale, neox);
    LAUNCHED();
    return AG_OK;
}

/* rope_freqs (YaRN: gpt-oss): pair i turns by pos freq[i], the rotated
 * values times mscale, as the CPU's ag_cpu_rope_freqs: the angle and its
 * cos and sin in double, (float)(cos mscale), the pair as rope_pair. The
 * host's table travels as a kernel parameter (__grid_constant__: read in
 * place, no copy to device memory to keep alive or order). */
#define ROPE_FREQ_MAX 256
typedef struct {
    float f[ROPE_FREQ_MAX];
} rope_freq_tab;

__global__ void rope_freqs_k(float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                             const __grid_constant__ rope_freq_tab ft, float mscale, int neox) {
    pdl_entry();
    const float *f = ft.f; /* (the table read in place: a lambda capturing ft would copy it) */
    rope_rows(x, n, n_head, head_dim, rope_dim, pos, neox, [=](int32_t p, int i, float *c, float *s) {
        const double theta = (double)p * (double)f[i];
        *c = (float)(cos(theta) * (double)mscale), *s = (float)(sin(theta) * (double)mscale);
    });
}

ag_status cu_rope_freqs(ag_backend *be, float *x, int n, int n_head, int head_dim, int rope_dim, const int32_t *pos,
                        const float *freq, float mscale, bool neox) {
    cuda_state    *s = st_of(be);
    const int32_t *d_pos = pass_ints(s, pos, n);
    if (!d_pos) return ag_errorf(AG_ERR_INVALID, "CUDA rope_freqs: pos must be the pass's positions (see begin)");
    if (rope_dim / 2 > ROPE_FREQ_MAX || rope_dim > head_dim)
        return ag_errorf(AG_ERR_UNSUPPORTED, "CUDA rope_freqs: rope_dim %d (head_dim %d; at most %d)", rope_dim,
                         head_dim, 2 * ROPE_FREQ_MAX);
    if (n <= 0) return AG_OK;
    prep_forget(s, x, (size_t)n * n_head * head_dim * sizeof(float));
    rope_freq_tab ft;
    memset(&ft, 0, sizeof ft);
    memcpy(ft.f, freq, sizeof(float) * (size_t)(rope_dim / 2));
    launch_k(s, rope_freqs_k, grid_for((size_t)n * n_head * (rope_dim / 2), 256), 256, 0, x, n, n_head, head_dim,
             rope_dim, d_pos, ft, mscale, neox);
    LAUNCHED();
    return AG_OK;
}

/* ---- KV store and attention over the paged pool ---- */

template <bool F16>
__global__ void kv_store_k(kv_geom g, const int32_t *__restrict__ slot, int n_kv, int hd_k, int hd_v,
                           const float *__restrict__ k, const float *__restrict__ v) {
    pdl_entry();
    const int      t = blockIdx.x;
    const int      sl = slot[t];
    uint8_t *const base = g.k0 + (size_t)(sl >> g.block_shift) * g.block_bytes;
    const int      off = sl & g.block_mask;
    for (int e = threadIdx.x; e < n_kv * hd_k; e += blockDim.x) {
        const int h = e / hd_k, d = e % hd_k;
        kv_put<F16>(base + h * g.head_stride_k + off * g.row_bytes_k, d, k[(size_t)t * n_kv * hd_k + e]);
    }
    for (int e = threadIdx.x; e < n_kv * hd_v; e += blockDim.x) {
        const int h = e / hd_v, d = e % hd_v;
        kv_put<F16>(base + g.v_off + h * g.head_stride_v + off * g.row_bytes_v, d, v[(size_t)t * n_kv * hd_v + e]);
    }
}

ag_status cu_kv_store(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b,
                      const float *k, const float *v) {
    cuda_state *s = st_of(be);
    if (b->n != s->n) return ag_errorf(AG_ERR_INVALID, "CUDA kv_store: batch differs from the pass (see begin)");
    if (b->n <= 0) return AG_OK;
    kv_select(s, kv, sh->layer);
    kv_geom g = geom_of(kv, sh->layer);
    /* a thread per element of a head row set (up to 1024): the first
     * version's 128 threads walked 8-16 dependent loads each (9 us a call) */
    const unsigned th = threads_for(sh->n_head_kv * (sh->head_dim_k > sh->head_dim_v ? sh->head_dim_k : sh->head_dim_v));
    if (ag_kv_get_layout(kv)->dtype == AG_KV_F16)
        launch_k(s, kv_store_k<true>, (unsigned)b->n, th, 0, g, s->d_slot, sh->n_head_kv, sh->head_dim_k,
                 sh->head_dim_v, k, v);
    else
        launch_k(s, kv_store_k<false>, (unsigned)b->n, th, 0, g, s->d_slot, sh->n_head_kv, sh->head_dim_k,
                 sh->head_dim_v, k, v);
    LAUNCHED();
    return AG_OK;
}

/* The pass's angles: tab[t * half + i] = (cos, sin) of rope_theta for row
 * blockIdx.x (rope_k's expression, so rope_k's values). */
__global__ void rope_table_k(const int32_t *__restrict__ pos, float base, float freq_scale, int rope_dim,
                             float2 *__restrict__ tab) {
    pdl_entry();
    const int t = blockIdx.x, half = rope_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double theta = rope_theta(pos[t], freq_scale, base, i, rope_dim);
        tab[(size_t)t * half + i] = make_float2((float)cos(theta), (float)sin(theta));
    }
}

/* Token t's rotation angles into cs/sn (shared, rope_dim / 2 each): from
 * tab (rope_table_k's), or, tab NULL, computed here; then the block's
 * barrier. */
static __device__ __forceinline__ void rope_angles(const float2 *__restrict__ tab, const int32_t *__restrict__ pos, int t,
                                                   int rope_dim, float base, float freq_scale, float *cs, float *sn) {
    const int half = rope_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        if (tab) {
            const float2 c = tab[(size_t)t * half + i];
            cs[i] = c.x, sn[i] = c.y;
        } else {
            const double theta = rope_theta(pos[t], freq_scale, base, i, rope_dim);
            cs[i] = (float)cos(theta), sn[i] = (float)sin(theta);
        }
    }
    __syncthreads();
}

/* rope_k on q's and k's heads of token blockIdx.x, then kv_store_k of its
 * k and v rows: one launch instead of three. The angles come from tab
 * (rope_table_k), or, tab NULL, are computed once per token here.
 * half <= ROPE_MAX_HALF. */
template <bool F16>
__global__ void rope_kv_store_k(kv_geom g, const int32_t *__restrict__ slot, const int32_t *__restrict__ pos,
                                const float2 *__restrict__ tab, float *__restrict__ q, float *__restrict__ k,
                                const float *__restrict__ v, int n_head, int n_kv, int hd_k, int hd_v, int rope_dim,
                                float base, float freq_scale, int neox) {
    pdl_entry();
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    const int        t = blockIdx.x, half = rope_dim / 2;
    rope_angles(tab, pos, t, rope_dim, base, freq_scale, cs, sn);
    const int      sl = slot[t];
    uint8_t *const blk = g.k0 + (size_t)(sl >> g.block_shift) * g.block_bytes;
    const int      off = sl & g.block_mask;
    for (int e = threadIdx.x; e < (n_head + n_kv) * half; e += blockDim.x) {
        const int hh = e / half, i = e % half, i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const bool is_k = hh >= n_head;
        float *row = is_k ? k + ((size_t)t * n_kv + (hh - n_head)) * hd_k : q + ((size_t)t * n_head + hh) * hd_k;
        float  o0, o1;
        rope_pair(row[i0], row[i1], cs[i], sn[i], &o0, &o1);
        row[i0] = o0, row[i1] = o1;
        if (is_k) {
            uint8_t *kr = blk + (hh - n_head) * g.head_stride_k + off * g.row_bytes_k;
            kv_put<F16>(kr, i0, o0);
            kv_put<F16>(kr, i1, o1);
        }
    }
    const int rest = hd_k - rope_dim; /* k's dims past the rotary ones */
    for (int e = threadIdx.x; e < n_kv * rest; e += blockDim.x) {
        const int h = e / rest, d = rope_dim + e % rest;
        kv_put<F16>(blk + h * g.head_stride_k + off * g.row_bytes_k, d, k[((size_t)t * n_kv + h) * hd_k + d]);
    }
    for (int e = threadIdx.x; e < n_kv * hd_v; e += blockDim.x) {
        const int h = e / hd_v, d = e % hd_v;
        kv_put<F16>(blk + g.v_off + h * g.head_stride_v + off * g.row_bytes_v, d, v[(size_t)t * n_kv * hd_v + e]);
    }
}

/* rope_kv_store_k four values a thread (rope_kv_vec_ok): two rotary pairs
 * by float4 (adjacent pairs) or two pairs by two float2 (neox: i, i + 1
 * with i + half, i + half + 1), v and k's dims past rope_dim by float4,
 * the KV rows by 8- or 16-byte stores; the same pairs and products, so
 * the same bits (the scalar kernel ran at ~1.3 TB/s on 4096-row passes). */
template <bool F16, bool NEOX>
__global__ void rope_kv_store_vec_k(kv_geom g, const int32_t *__restrict__ slot, const int32_t *__restrict__ pos,
                                    const float2 *__restrict__ tab, float *__restrict__ q, float *__restrict__ k,
                                    const float *__restrict__ v, int n_head, int n_kv, int hd_k, int hd_v, int rope_dim,
                                    float base, float freq_scale) {
    pdl_entry();
    __shared__ float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    const int        t = blockIdx.x, half = rope_dim / 2, quads = half / 2; /* a thread's share: pairs 2j, 2j + 1 */
    rope_angles(tab, pos, t, rope_dim, base, freq_scale, cs, sn);
    const int      sl = slot[t];
    uint8_t *const blk = g.k0 + (size_t)(sl >> g.block_shift) * g.block_bytes;
    const int      off = sl & g.block_mask;
    for (int e = threadIdx.x; e < (n_head + n_kv) * quads; e += blockDim.x) {
        const int  hh = e / quads, j = e % quads, i = 2 * j;
        const bool is_k = hh >= n_head;
        float *row = is_k ? k + ((size_t)t * n_kv + (hh - n_head)) * hd_k : q + ((size_t)t * n_head + hh) * hd_k;
        uint8_t *kr = is_k ? blk + (hh - n_head) * g.head_stride_k + off * g.row_bytes_k : nullptr;
        if (NEOX) { /* pairs (i, i + half), (i + 1, i + half + 1) */
            const float2 a = *(const float2 *)(row + i), b = *(const float2 *)(row + i + half);
            float2       ra, rb;
            rope_pair(a.x, b.x, cs[i], sn[i], &ra.x, &rb.x);
            rope_pair(a.y, b.y, cs[i + 1], sn[i + 1], &ra.y, &rb.y);
            *(float2 *)(row + i) = ra, *(float2 *)(row + i + half) = rb;
            if (is_k) {
                kv_put<F16>(kr, i, ra.x), kv_put<F16>(kr, i + 1, ra.y);
                kv_put<F16>(kr, i + half, rb.x), kv_put<F16>(kr, i + half + 1, rb.y);
            }
        } else { /* pairs (2i, 2i + 1), (2i + 2, 2i + 3) */
            const float4 a = *(const float4 *)(row + 2 * i);
            float4       r;
            rope_pair(a.x, a.y, cs[i], sn[i], &r.x, &r.y);
            rope_pair(a.z, a.w, cs[i + 1], sn[i + 1], &r.z, &r.w);
            *(float4 *)(row + 2 * i) = r;
            if (is_k) kv_put4<F16>(kr, 2 * i, r);
        }
    }
    const int rest4 = (hd_k - rope_dim) / 4; /* k's dims past the rotary ones, in fours */
    for (int e = threadIdx.x; e < n_kv * rest4; e += blockDim.x) {
        const int h = e / rest4, d = rope_dim + 4 * (e % rest4);
        kv_put4<F16>(blk + h * g.head_stride_k + off * g.row_bytes_k, d,
                     *(const float4 *)(k + ((size_t)t * n_kv + h) * hd_k + d));
    }
    const int v4 = hd_v / 4;
    for (int e = threadIdx.x; e < n_kv * v4; e += blockDim.x) {
        const int h = e / v4, d = 4 * (e % v4);
        kv_put4<F16>(blk + g.v_off + h * g.head_stride_v + off * g.row_bytes_v, d,
                     *(const float4 *)(v + (size_t)t * n_kv * hd_v + h * hd_v + d));
    }
}

/* Whether rope_kv_store_vec_k can take these shapes: whole float4s of
 * rows and rotary pairs, and 16-byte aligned KV rows. */
static bool rope_kv_vec_ok(const kv_geom &g, int hd_k, int hd_v, int rope_dim) {
    const size_t strides = g.v_off | g.block_bytes | g.head_stride_k | g.head_stride_v | g.row_bytes_k | g.row_bytes_v;
    return rope_dim % 4 == 0 && hd_k % 4 == 0 && hd_v % 4 == 0 && (hd_k - rope_dim) % 4 == 0 && strides % 16 == 0 &&
           (uintptr_t)g.k0 % 16 == 0;
}

ag_status cu_rope_kv_store(ag_backend *be, ag_kv *kv, const ag_attn_shape *sh, const ag_batch_layout *b,
                           float *q, float *k, const float *v, int rope_dim, const int32_t *pos, float base,
                           float freq_scale, bool neox) {
    cuda_state *s = st_of(be);
    if (!s->fuse_on || rope_dim / 2 > ROPE_MAX_HALF) { /* AUGUR_CUDA_FUSE=0 (A/B), or too wide: the three ops */
        ag_status st = cu_rope(be, q, b->n, sh->n_head, sh->head_dim_k, rope_dim, pos, base, freq_scale, neox);
        if (!st) st = cu_rope(be, k, b->n, sh->n_head_kv, sh->head_dim_k, rope_dim, pos, base, freq_scale, neox);
        return st ? st : cu_kv_store(be, kv, sh, b, k, v);
    }
    const int32_t *d_pos = pass_ints(s, pos, b->n);
    if (!d_pos) return ag_errorf(AG_ERR_INVALID, "CUDA rope_kv_store: pos must be the pass's positions (see begin)");
    if (b->n != s->n) return ag_errorf(AG_ERR_INVALID, "CUDA rope_kv_store: batch differs from the pass (see begin)");
    if (b->n <= 0) return AG_OK;
    prep_forget(s, q, (size_t)b->n * sh->n_head * sh->head_dim_k * sizeof(float));
    prep_forget(s, k, (size_t)b->n * sh->n_head_kv * sh->head_dim_k * sizeof(float));
    /* the angles: this pass's table for these parameters, made on first use */
    const float2 *tab = NULL;
    int           set = 0;
    while (set < s->rope.n_rope_sets &&
           !(s->rope.rope_set[set].base == base && s->rope.rope_set[set].freq_scale == freq_scale &&
             s->rope.rope_set[set].dim == rope_dim))
        set++;
    if (set < 2 && 2 * (size_t)b->n * ROPE_MAX_HALF <= s->rope.cap_rope) {
        float2 *t = s->rope.d_rope + (size_t)set * b->n * ROPE_MAX_HALF;
        if (set == s->rope.n_rope_sets) {
            launch_k(s, rope_table_k, (unsigned)b->n, threads_for(rope_dim / 2), 0, d_pos, base, freq_scale,
                     rope_dim, t);
            LAUNCHED();
            s->rope.rope_set[set].base = base, s->rope.rope_set[set].freq_scale = freq_scale;
            s->rope.rope_set[set].dim = rope_dim;
            s->rope.n_rope_sets++;
        }
        tab = t;
    }
    kv_select(s, kv, sh->layer);
    kv_geom        g = geom_of(kv, sh->layer);
    const int      pairs = (sh->n_head + sh->n_head_kv) * (rope_dim / 2), vals = sh->n_head_kv * sh->head_dim_v;
    const bool     f16 = ag_kv_get_layout(kv)->dtype == AG_KV_F16;
    if (s->rope_vec_on && rope_kv_vec_ok(g, sh->head_dim_k, sh->head_dim_v, rope_dim)) {
        const unsigned th4 = threads_for(pairs / 2 > vals / 4 ? pairs / 2 : vals / 4); /* a thread per four values */
        auto           kern = f16 ? (neox ? rope_kv_store_vec_k<true, true> : rope_kv_store_vec_k<true, false>)
                                  : (neox ? rope_kv_store_vec_k<false, true> : rope_kv_store_vec_k<false, false>);
        launch_k(s, kern, (unsigned)b->n, th4, 0, g, s->d_slot, d_pos, tab, q, k, v, sh->n_head, sh->n_head_kv,
                 sh->head_dim_k, sh->head_dim_v, rope_dim, base, freq_scale);
        LAUNCHED();
        return AG_OK;
    }
    const unsigned th = threads_for(pairs > vals ? pairs : vals);
    if (f16)
        launch_k(s, rope_kv_store_k<true>, (unsigned)b->n, th, 0, g, s->d_slot, d_pos, tab, q, k, v, sh->n_head,
                 sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, rope_dim, base, freq_scale, neox);
    else
        launch_k(s, rope_kv_store_k<false>, (unsigned)b->n, th, 0, g, s->d_slot, d_pos, tab, q, k, v,
                 sh->n_head, sh->n_head_kv, sh->head_dim_k, sh->head_dim_v, rope_dim, base, freq_scale, neox);
    LAUNCHED();
    return AG_OK;
}

