/* CPU attention over the paged KV cache, and the KV store op.
 *
 * One task is a few consecutive batch rows of one sequence (a prompt
 * chunk's tokens) and one kv head: the rows and the query heads that share
 * the kv head (grouped-query attention) are processed together, so each K/V
 * block is converted to float once per task and read from memory once. Two
 * passes: scores for every visible position, then the softmax-weighted sum
 * of V (the reference's order of rounding, see round_f16). Each row's
 * arithmetic is the same whatever rows share its task. */
#include "backend/cpu/attention.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "kv/kv.h"

ag_status ag_cpu_kv_store(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *k,
                          const float *v) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    const size_t kd = (size_t)s->n_head_kv * s->head_dim_k, vd = (size_t)s->n_head_kv * s->head_dim_v;
    for (int t = 0; t < b->n; t++) {
        int32_t block, off;
        ag_status st = ag_kv_slot(kv, b->seq[t], b->pos[t], &block, &off);
        if (st) return st;
        uint8_t *kb = ag_kv_block_k(kv, s->layer, block);
        uint8_t *vb = ag_kv_block_v(kv, s->layer, block);
        for (int h = 0; h < s->n_head_kv; h++) {
            const float *kr = k + t * kd + (size_t)h * s->head_dim_k;
            const float *vr = v + t * vd + (size_t)h * s->head_dim_v;
            void *kdst = kb + h * L->head_stride_k + (size_t)off * L->row_bytes_k;
            void *vdst = vb + h * L->head_stride_v + (size_t)off * L->row_bytes_v;
            if (L->dtype == AG_KV_F16) {
                ag_fp32_to_fp16_row(kr, kdst, s->head_dim_k);
                ag_fp32_to_fp16_row(vr, vdst, s->head_dim_v);
            } else {
                memcpy(kdst, kr, sizeof(float) * s->head_dim_k);
                memcpy(vdst, vr, sizeof(float) * s->head_dim_v);
            }
        }
    }
    return AG_OK;
}

/* Rows [o0, o1) of one (layer, block, head) region as floats: converted into
 * `tmp` for F16 storage, or pointed at directly for F32. */
static const float *rows_f32(const ag_kv_layout *L, const uint8_t *base, size_t row_bytes, int dim, int o0,
                             int o1, float *tmp) {
    const uint8_t *p = base + (size_t)o0 * row_bytes;
    if (L->dtype == AG_KV_F32) return (const float *)p;
    ag_fp16_to_fp32_row((const uint16_t *)p, tmp, (int64_t)(o1 - o0) * dim);
    return tmp;
}

/* Rounds n floats through fp16 (src may be dst): llama.cpp (the reference) multiplies Q with the F16 K
 * cache and the softmax weights with the F16 V cache as F16 values. Doing the
 * same keeps our rounding in step with it, which matters more than it seems:
 * in a quantized model a 1e-3 perturbation flips the int8 rounding of later
 * activations, and the two implementations then drift apart. */
static void round_f16(const float *src, float *dst, int n) {
    uint16_t h16[256];
    for (int e0 = 0; e0 < n; e0 += 256) { /* the row conversions: F16C where present, bit-identical to scalar */
        const int m = n - e0 < 256 ? n - e0 : 256;
        ag_fp32_to_fp16_row(src + e0, h16, m);
        ag_fp16_to_fp32_row(h16, dst + e0, m);
    }
}

/* The two inner loops, vectorised: dot(a, b) and y += w * x over n floats.
 * Plain C float reductions are not vectorised without -ffast-math, and
 * attention is most of a long prefill, so both have an AVX2+FMA version
 * picked once at run time. */
static float dot_c(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d += a[i] * b[i];
    return d;
}

static void axpy_c(float *y, float w, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static float dot_avx2(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float d = _mm_cvtss_f32(h);
    for (; i < n; i++) d += a[i] * b[i];
    return d;
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float w, const float *x, int n) {
    __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += w * x[i];
}

/* The same two loops reading the F16 cache directly (the conversion is exact
 * and the accumulation pattern is dot_avx2's / axpy_avx2's, so the results
 * are bit-identical to converting first): saves a pass over the cache per
 * task, most of decode attention at long contexts. n % 8 == 0 only. */
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const float *a, const uint16_t *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8))),
                             s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* dot_f16_avx2 of a with four rows b + r·stride at once: each row's
 * accumulators, fmas and horizontal-sum tree are dot_f16_avx2's (the tree's
 * last two rounds run on the four rows transposed: the same additions lane
 * by lane), so out[r] is bit-identical to dot_f16_avx2(a, b + r·stride, n);
 * a's loads and the sums' shuffles are shared. n % 8 == 0. */
__attribute__((target("avx2,fma,f16c"))) static void dot4_f16_avx2(const float *a, const uint16_t *b, size_t stride,
                                                                   int n, float out[4]) {
    __m256 s0[4], s1[4];
    for (int r = 0; r < 4; r++) s0[r] = s1[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 qa = _mm256_loadu_ps(a + i), qb = _mm256_loadu_ps(a + i + 8);
        for (int r = 0; r < 4; r++) {
            const uint16_t *br = b + r * stride + i;
            s0[r] = _mm256_fmadd_ps(qa, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)br)), s0[r]);
            s1[r] = _mm256_fmadd_ps(qb, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(br + 8))), s1[r]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 qa = _mm256_loadu_ps(a + i);
        for (int r = 0; r < 4; r++)
            s0[r] = _mm256_fmadd_ps(qa, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + r * stride + i))), s0[r]);
    }
    __m128 h[4];
    for (int r = 0; r < 4; r++) {
        const __m256 t = _mm256_add_ps(s0[r], s1[r]);
        h[r] = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    }
    _MM_TRANSPOSE4_PS(h[0], h[1], h[2], h[3]); /* h[k] lane r: row r's element k */
    _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(h[0], h[2]), _mm_add_ps(h[1], h[3])));
}

/* y[0..n) += Σ_j w[j] x[j·stride ..] over j in [0, m), as one fma per j and
 * element in j order, y[e] = fma(w[j], x_j[e], y[e]) (axpy_avx2's
 * operations), with the loops nested so that 32 elements of y stay in
 * registers across all j instead of a load and a store per j. n % 8 == 0. */
__attribute__((target("avx2,fma,f16c"))) static void axpy_many_f16_avx2(float *y, const float *w, const uint16_t *x,
                                                                        size_t stride, int m, int n) {
    int d = 0;
    for (; d + 32 <= n; d += 32) {
        __m256 a0 = _mm256_loadu_ps(y + d), a1 = _mm256_loadu_ps(y + d + 8), a2 = _mm256_loadu_ps(y + d + 16),
               a3 = _mm256_loadu_ps(y + d + 24);
        for (int j = 0; j < m; j++) {
            const __m256    wv = _mm256_set1_ps(w[j]);
            const uint16_t *xr = x + (size_t)j * stride + d;
            a0 = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xr)), a0);
            a1 = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 8))), a1);
            a2 = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 16))), a2);
            a3 = _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 24))), a3);
        }
        _mm256_storeu_ps(y + d, a0), _mm256_storeu_ps(y + d + 8, a1), _mm256_storeu_ps(y + d + 16, a2),
            _mm256_storeu_ps(y + d + 24, a3);
    }
    for (; d + 8 <= n; d += 8) {
        __m256 a0 = _mm256_loadu_ps(y + d);
        for (int j = 0; j < m; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[j]),
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (size_t)j * stride + d))), a0);
        _mm256_storeu_ps(y + d, a0);
    }
}
#endif

static int direct_f16; /* dot/axpy read the F16 cache in place (AVX2, head dims % 8 == 0) */
#if defined(__x86_64__)
#define dot_f16 dot_f16_avx2
#define dot4_f16 dot4_f16_avx2
#define axpy_many_f16 axpy_many_f16_avx2
#else
static float dot_f16(const float *a, const uint16_t *b, int n) { (void)a, (void)b, (void)n; return 0; }
static void  dot4_f16(const float *a, const uint16_t *b, size_t stride, int n, float out[4]) {
    (void)a, (void)b, (void)stride, (void)n, (void)out;
}
static void axpy_many_f16(float *y, const float *w, const uint16_t *x, size_t stride, int m, int n) {
    (void)y, (void)w, (void)x, (void)stride, (void)m, (void)n;
}
#endif

static float (*dot_f32)(const float *, const float *, int) = dot_c;
static void (*axpy_f32)(float *, float, const float *, int) = axpy_c;

void ag_cpu_attention_init(void) {
#if defined(__x86_64__)
    if (ag_cpu_isa_active() != AG_CPU_ISA_SCALAR) {
        dot_f32 = dot_avx2;
        axpy_f32 = axpy_avx2;
        direct_f16 = 1;
        return;
    }
#endif
    direct_f16 = 0;
    dot_f32 = dot_c;
    axpy_f32 = axpy_c;
}

/* The rows [*j0, *j1) of the block starting at position `base` (bs rows)
 * that fall in positions [lo, hi]; empty when *j0 >= *j1. */
static inline void block_span(int base, int bs, int lo, int hi, int *j0, int *j1) {
    *j0 = lo > base ? lo - base : 0;
    *j1 = hi - base + 1 < bs ? hi - base + 1 : bs;
}

void ag_cpu_attention_rows(ag_kv *kv, const ag_attn_shape *s, const ag_batch_layout *b, const float *q,
                           float *out, int t0, int t1, int g, float *scratch) {
    const ag_kv_layout *L = ag_kv_get_layout(kv);
    const int group = s->n_head / s->n_head_kv;
    const int dk = s->head_dim_k, dv = s->head_dim_v, bs = L->block_size;
    const int nt = t1 - t0;
    /* F16 rows are contiguous within a (block, head) region: read them in place */
    const int in_place = direct_f16 && L->dtype == AG_KV_F16 && dk % 8 == 0 && dv % 8 == 0 &&
                         L->row_bytes_k == (size_t)dk * 2 && L->row_bytes_v == (size_t)dv * 2;
    int32_t n_blocks;
    const int32_t *table = ag_kv_seq_blocks(kv, b->seq[t0], &n_blocks);

    /* the visible range [lo_t, pos_t] of each row, and their union [lo_min, pos_max] */
    int lo[AG_ATTN_MAX_ROWS], lo_min = INT32_MAX, pos_max = 0, stride = 0;
    for (int i = 0; i < nt; i++) {
        const int pos = b->pos[t0 + i];
        lo[i] = s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
        lo_min = lo[i] < lo_min ? lo[i] : lo_min;
        pos_max = pos > pos_max ? pos : pos_max;
        stride = pos - lo[i] + 1 > stride ? pos - lo[i] + 1 : stride;
    }

    /* scratch: kvbuf[bs * max(dk, dv)], qh[nt * group * dk], sc[nt * group * stride], acc[nt * group * dv] */
    float *kvbuf = scratch;
    float *qh = kvbuf + (size_t)bs * (dk > dv ? dk : dv);
    float *sc = qh + (size_t)nt * group * dk;
    float *acc = sc + (size_t)nt * group * stride;
    const size_t qd = (size_t)s->n_head * dk;
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < group; h++)
            round_f16(q + (t0 + i) * qd + (size_t)(g * group + h) * dk, qh + ((size_t)i * group + h) * dk, dk);

    /* pass 1: scores, block by block (each K block converted once for all rows and heads) */
    const int b0 = lo_min / bs, b1 = pos_max / bs < n_blocks ? pos_max / bs : n_blocks - 1;
    for (int bi = b0; bi <= b1; bi++) {
        int o0, o1;
        block_span(bi * bs, bs, lo_min, pos_max, &o0, &o1);
        const uint8_t *kb = (const uint8_t *)ag_kv_block_k(kv, s->layer, table[bi]) + g * L->head_stride_k;
        const float *K = in_place ? NULL : rows_f32(L, kb, L->row_bytes_k, dk, o0, o1, kvbuf) - (size_t)o0 * dk;
        const uint16_t *K16 = (const uint16_t *)kb;
        for (int i = 0; i < nt; i++) {
            int j0, j1;
            block_span(bi * bs, bs, lo[i], b->pos[t0 + i], &j0, &j1);
            for (int h = 0; h < group; h++) {
                const float *qv = qh + ((size_t)i * group + h) * dk;
                float *row = sc + ((size_t)i * group + h) * stride + (bi * bs - lo[i]);
                int j = j0;
                if (in_place) /* four positions a call (the same bits as one at a time) */
                    for (; j + 4 <= j1; j += 4) dot4_f16(qv, K16 + (size_t)j * dk, (size_t)dk, dk, row + j);
                for (; j < j1; j++)
                    row[j] = in_place ? dot_f16(qv, K16 + (size_t)j * dk, dk) : dot_f32(qv, K + (size_t)j * dk, dk);
                for (j = j0; j < j1; j++) {
                    float d = row[j] * s->scale;
                    if (s->softcap > 0) d = s->softcap * tanhf(d / s->softcap);
                    row[j] = d;
                }
            }
        }
    }
    /* softmax per (row, head); the weights rounded to fp16 as the reference does */
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < group; h++) {
            const int n_pos = b->pos[t0 + i] - lo[i] + 1;
            float *row = sc + ((size_t)i * group + h) * stride;
            float mx = -INFINITY;
            for (int j = 0; j < n_pos; j++) mx = row[j] > mx ? row[j] : mx;
            double sum = 0;
            for (int j = 0; j < n_pos; j++) {
                row[j] = expf(row[j] - mx);
                sum += row[j];
            }
            float inv = (float)(1.0 / sum);
            for (int j = 0; j < n_pos; j++) row[j] *= inv;
            round_f16(row, row, n_pos);
        }
    /* pass 2: weighted sum of V (each V block converted once for all rows and heads) */
    memset(acc, 0, sizeof(float) * (size_t)nt * group * dv);
    for (int bi = b0; bi <= b1; bi++) {
        int o0, o1;
        block_span(bi * bs, bs, lo_min, pos_max, &o0, &o1);
        const uint8_t *vb = (const uint8_t *)ag_kv_block_v(kv, s->layer, table[bi]) + g * L->head_stride_v;
        const float *V = in_place ? NULL : rows_f32(L, vb, L->row_bytes_v, dv, o0, o1, kvbuf) - (size_t)o0 * dv;
        const uint16_t *V16 = (const uint16_t *)vb;
        for (int i = 0; i < nt; i++) {
            int j0, j1;
            block_span(bi * bs, bs, lo[i], b->pos[t0 + i], &j0, &j1);
            for (int h = 0; h < group; h++) {
                const float *p = sc + ((size_t)i * group + h) * stride + (bi * bs - lo[i]);
                float *a = acc + ((size_t)i * group + h) * dv;
                if (in_place) /* all positions of the block per 32 elements of a (the same bits) */
                    axpy_many_f16(a, p + j0, V16 + (size_t)j0 * dv, (size_t)dv, j1 - j0, dv);
                else
                    for (int j = j0; j < j1; j++) axpy_f32(a, p[j], V + (size_t)j * dv, dv);
            }
        }
    }
    const size_t od = (size_t)s->n_head * dv;
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < group; h++)
            memcpy(out + (t0 + i) * od + (size_t)(g * group + h) * dv, acc + ((size_t)i * group + h) * dv,
                   sizeof(float) * dv);
}

size_t ag_cpu_attention_scratch_floats(int block_size, const ag_attn_shape *s, int max_pos) {
    const size_t group = (size_t)(s->n_head / s->n_head_kv);
    const size_t dmax = (size_t)(s->head_dim_k > s->head_dim_v ? s->head_dim_k : s->head_dim_v);
    size_t n_pos = (size_t)max_pos + 1;
    if (s->window > 0 && n_pos > (size_t)s->window) n_pos = (size_t)s->window;
    return (size_t)block_size * dmax +
           AG_ATTN_MAX_ROWS * group * ((size_t)s->head_dim_k + n_pos + (size_t)s->head_dim_v);
}
