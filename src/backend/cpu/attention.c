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
        ag_status st = ag_kv_layer_slot(kv, b->seq[t], s->layer, b->pos[t], &block, &off);
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

/* ---- the softmax's exponentials and their sum: one definition, every ISA ----
 *
 * libm's expf cannot be vectorised to its own bits, and at 2000 positions
 * it was a third of a verify window's attention. So the softmax uses its
 * own exp, the same double-precision operations in the scalar code and in
 * the AVX-512 lanes: z = x log2(e), n = nearest integer, f = z - n (exact),
 * 2^f by a degree-10 Taylor polynomial in Horner's fmas (relative error
 * < 3e-13, so the float it rounds to is expf's but for rare last-bit
 * ties), times 2^n. The row's sum likewise: 16 double lanes, lane l adding
 * the e_j with j % 16 == l in j order, then lanes k + 8, k + 4, k + 2 and 1
 * into k. Every path (decode, verify window, prompt, AVX2 or AVX-512 or
 * scalar) takes the same bits. */
#define SM_LOG2E 1.4426950408889634
#define SM_C10   7.054911620801121e-09
#define SM_C9    1.0178086009239696e-07
#define SM_C8    1.3215486790144305e-06
#define SM_C7    1.5252733804059838e-05
#define SM_C6    0.00015403530393381606
#define SM_C5    0.0013333558146428441
#define SM_C4    0.009618129107628477
#define SM_C3    0.055504108664821576
#define SM_C2    0.2402265069591007
#define SM_C1    0.6931471805599453

/* e^x for x <= 0 (the softmax's x - max); NaN stays NaN, below -104 is 0
 * (expf's float result there rounds to 0 too). */
__attribute__((always_inline)) static inline float sm_exp(float x) {
    if (!(x >= -104.0f)) return x != x ? x : 0.0f;
    const double z = (double)x * SM_LOG2E, n = nearbyint(z), f = z - n;
    double       p = SM_C10;
    p = fma(p, f, SM_C9), p = fma(p, f, SM_C8), p = fma(p, f, SM_C7), p = fma(p, f, SM_C6), p = fma(p, f, SM_C5);
    p = fma(p, f, SM_C4), p = fma(p, f, SM_C3), p = fma(p, f, SM_C2), p = fma(p, f, SM_C1), p = fma(p, f, 1.0);
    union {
        uint64_t u;
        double   d;
    } two_n = {.u = (uint64_t)((int64_t)n + 1023) << 52};
    return (float)(p * two_n.d);
}

/* row[j] = sm_exp(row[j] - mx) for j < n; returns their sum (the lanes above). */
__attribute__((always_inline)) static inline double sm_exp_sum_body(float *row, int n, float mx) {
    double lane[16] = {0};
    for (int j = 0; j < n; j++) {
        row[j] = sm_exp(row[j] - mx);
        lane[j & 15] += row[j];
    }
    for (int k = 0; k < 8; k++) lane[k] += lane[k + 8];
    for (int k = 0; k < 4; k++) lane[k] += lane[k + 4];
    for (int k = 0; k < 2; k++) lane[k] += lane[k + 2];
    return lane[0] + lane[1];
}

static double sm_exp_sum_c(float *row, int n, float mx) { return sm_exp_sum_body(row, n, mx); }

float ag_cpu_softmax_exp(float x) { return sm_exp(x); }
#if defined(__x86_64__)
/* the same, with fma and nearbyint as instructions */
__attribute__((target("avx2,fma"))) static double sm_exp_sum_fma(float *row, int n, float mx) {
    return sm_exp_sum_body(row, n, mx);
}
#endif

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

#if defined(__x86_64__)
/* ---- AVX-512: several queries against several keys from float rows ----
 *
 * A verify window (or a KV head's query group at decode) asks for many
 * dots against the same K rows and many axpys of the same V rows. The AVX2
 * loops above convert each fp16 element once per query, so an 8-row window
 * of Qwen2.5 (6 query heads a KV head) converted every cached element 48
 * times; here a block's rows are converted to float once (rows_f32), and
 * 4 queries x 4 keys share their loads in registers.
 *
 * The bits are the AVX2 loops': a zmm lane l of a dot's accumulator holds
 * what lane l % 8 of s0 (l < 8) or s1 (l >= 8) held, the same fmas in the
 * same order, and reduce16 below adds the lanes in dot_f16_avx2's tree; an
 * axpy is one fma per element in position order, as axpy_many_f16_avx2. */
#define AVX512_ATTN __attribute__((target("avx512f,avx2,fma,f16c")))

/* z[a] for a in 0..15, each 16 lanes of one dot's partial sums: returns the
 * 16 dots, lane a = dot_f16_avx2's tree over z[a] (t_k = z_k + z_{k+8},
 * h_k = t_k + t_{k+4}, (h_0 + h_2) + (h_1 + h_3)). Each stage adds the
 * same pairs for 16 / 8 / 4 / 2 accumulators at once. */
AVX512_ATTN __attribute__((always_inline)) static inline __m512 reduce16(const __m512 z[16]) {
    __m512 t[8], h[4], g[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* [t of z[2i] (8 lanes), t of z[2i+1]] */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) /* [h of z[4j], z[4j+1], z[4j+2], z[4j+3]], 4 lanes each */
        h[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int m = 0; m < 2; m++) { /* 128-bit lane l: (h0+h2, h1+h3) of z[8m+l], then of z[8m+4+l] */
        const __m512d p = _mm512_castps_pd(h[2 * m]), q = _mm512_castps_pd(h[2 * m + 1]);
        g[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
    }
    /* 128-bit lane l: the dots of z[l], z[4+l], z[8+l], z[12+l] */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), f);
}

/* out[4 i + k] = dot(q_i, k_k) over dk floats (dk % 16 == 0), i, k < 4;
 * callers pass repeated rows where they have fewer. */
AVX512_ATTN static void dots_4x4(const float *q0, const float *q1, const float *q2, const float *q3, const float *k0,
                                 const float *k1, const float *k2, const float *k3, int dk, float out[16]) {
    __m512 z[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) z[a] = _mm512_setzero_ps();
    for (int i = 0; i < dk; i += 16) {
        const __m512 a0 = _mm512_loadu_ps(q0 + i), a1 = _mm512_loadu_ps(q1 + i), a2 = _mm512_loadu_ps(q2 + i),
                     a3 = _mm512_loadu_ps(q3 + i);
        const __m512 b[4] = {_mm512_loadu_ps(k0 + i), _mm512_loadu_ps(k1 + i), _mm512_loadu_ps(k2 + i),
                             _mm512_loadu_ps(k3 + i)};
#pragma GCC unroll 4
        for (int kk = 0; kk < 4; kk++) {
            z[kk] = _mm512_fmadd_ps(a0, b[kk], z[kk]);
            z[4 + kk] = _mm512_fmadd_ps(a1, b[kk], z[4 + kk]);
            z[8 + kk] = _mm512_fmadd_ps(a2, b[kk], z[8 + kk]);
            z[12 + kk] = _mm512_fmadd_ps(a3, b[kk], z[12 + kk]);
        }
    }
    _mm512_storeu_ps(out, reduce16(z));
}

/* acc[qi] (acc + qi * as, dv floats) += Σ_j p[qi][j] · v[j] for j in [0, m),
 * p[qi] = p + qi * ps, v[j] = v + j * dv: one fma per element in j order.
 * nq 1..4 queries; dv % 64 == 0. */
AVX512_ATTN __attribute__((always_inline)) static inline void axpys_nq(float *acc, size_t as, const float *p,
                                                                       size_t ps, int nq, const float *v, int m,
                                                                       int dv) {
    for (int d = 0; d < dv; d += 64) {
        __m512 y[4][4];
#pragma GCC unroll 4
        for (int qi = 0; qi < nq; qi++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) y[qi][u] = _mm512_loadu_ps(acc + qi * as + d + 16 * u);
        for (int j = 0; j < m; j++) {
            const float *vr = v + (size_t)j * dv + d;
            const __m512 x0 = _mm512_loadu_ps(vr), x1 = _mm512_loadu_ps(vr + 16), x2 = _mm512_loadu_ps(vr + 32),
                         x3 = _mm512_loadu_ps(vr + 48);
#pragma GCC unroll 4
            for (int qi = 0; qi < nq; qi++) {
                const __m512 w = _mm512_set1_ps(p[qi * ps + j]);
                y[qi][0] = _mm512_fmadd_ps(w, x0, y[qi][0]);
                y[qi][1] = _mm512_fmadd_ps(w, x1, y[qi][1]);
                y[qi][2] = _mm512_fmadd_ps(w, x2, y[qi][2]);
                y[qi][3] = _mm512_fmadd_ps(w, x3, y[qi][3]);
            }
        }
#pragma GCC unroll 4
        for (int qi = 0; qi < nq; qi++)
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) _mm512_storeu_ps(acc + qi * as + d + 16 * u, y[qi][u]);
    }
}

/* max(-inf, row[0..n)) as the scalar loop `mx = row[j] > mx ? row[j] : mx`
 * finds it (vmaxps keeps its second operand on NaN and on equality, the
 * same choice; max is order-free, so the lanes may split the row). */
AVX512_ATTN static float row_max16(const float *row, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int    j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(row + j), m);
    if (j < n) {
        const __mmask16 live = (__mmask16)((1u << (n - j)) - 1);
        m = _mm512_mask_max_ps(m, live, _mm512_maskz_loadu_ps(live, row + j), m);
    }
    float l[16], mx = -INFINITY;
    _mm512_storeu_ps(l, m);
    for (int k = 0; k < 16; k++) mx = l[k] > mx ? l[k] : mx;
    return mx;
}

/* row[0..n) *= f, elementwise (the scalar loop's products). */
AVX512_ATTN static void row_mul16(float *row, int n, float f) {
    const __m512 fv = _mm512_set1_ps(f);
    int          j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), fv));
    for (; j < n; j++) row[j] *= f;
}

/* sm_exp of 8 floats in double lanes (sm_exp's operations). */
AVX512_ATTN __attribute__((always_inline)) static inline __m512d sm_exp8(__m256 x) {
    const __m512d  xd = _mm512_cvtps_pd(x);
    const __mmask8 ok = _mm512_cmp_pd_mask(xd, _mm512_set1_pd(-104.0), _CMP_GE_OQ);
    const __m512d  z = _mm512_mul_pd(xd, _mm512_set1_pd(SM_LOG2E));
    const __m512d  n = _mm512_roundscale_pd(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_pd(z, n);
    __m512d        p = _mm512_set1_pd(SM_C10);
    p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C9)), p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C8));
    p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C7)), p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C6));
    p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C5)), p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C4));
    p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C3)), p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C2));
    p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(SM_C1)), p = _mm512_fmadd_pd(p, f, _mm512_set1_pd(1.0));
    const __m512i e =
        _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n)), _mm512_set1_epi64(1023)), 52);
    /* lanes not >= -104: NaN keeps itself, the rest 0 */
    const __m512d nan_or_0 = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(xd, xd, _CMP_UNORD_Q), xd);
    return _mm512_mask_blend_pd(ok, nan_or_0, _mm512_mul_pd(p, _mm512_castsi512_pd(e)));
}

/* sm_exp_sum_c's results with 16 floats a step: lanes 0-7 of the sum in a,
 * 8-15 in b. */
AVX512_ATTN static double sm_exp_sum16(float *row, int n, float mx) {
    const __m512 m = _mm512_set1_ps(mx);
    __m512d      a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
    for (int j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        const __m512    x = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, row + j), m);
        const __m512d   lo = sm_exp8(_mm512_castps512_ps256(x));
        const __m512d   hi = sm_exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        const __m256    flo = _mm512_cvtpd_ps(lo), fhi = _mm512_cvtpd_ps(hi);
        _mm512_mask_storeu_ps(row + j, live,
                              _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(flo)),
                                                                  _mm256_castps_pd(fhi), 1)));
        /* the floats stored, back in double (exact), added lane by lane */
        a = _mm512_mask_add_pd(a, (__mmask8)live, a, _mm512_cvtps_pd(flo));
        b = _mm512_mask_add_pd(b, (__mmask8)(live >> 8), b, _mm512_cvtps_pd(fhi));
    }
    const __m512d s8 = _mm512_add_pd(a, b);
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

AVX512_ATTN static void axpys_4(float *acc, size_t as, const float *p, size_t ps, int nq, const float *v, int m, int dv) {
    switch (nq) { /* the count a constant in each, so y stays in registers */
    case 1: axpys_nq(acc, as, p, ps, 1, v, m, dv); break;
    case 2: axpys_nq(acc, as, p, ps, 2, v, m, dv); break;
    case 3: axpys_nq(acc, as, p, ps, 3, v, m, dv); break;
    default: axpys_nq(acc, as, p, ps, 4, v, m, dv); break;
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

static int wide_f32; /* AVX-512: 4 x 4 dots and 4-query axpys over float rows (head dims % 64 == 0) */

void ag_cpu_attention_init(void) {
    wide_f32 = 0;
#if defined(__x86_64__)
    if (ag_cpu_isa_active() != AG_CPU_ISA_SCALAR) {
        wide_f32 = ag_cpu_isa_active() == AG_CPU_ISA_AVX512;
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
    const int wide = wide_f32 && dk % 16 == 0 && dv % 64 == 0; /* the AVX-512 loops over float rows */
    const int in_place = !wide && direct_f16 && L->dtype == AG_KV_F16 && dk % 8 == 0 && dv % 8 == 0 &&
                         L->row_bytes_k == (size_t)dk * 2 && L->row_bytes_v == (size_t)dv * 2;
    int32_t n_blocks;
    const int32_t *table = ag_kv_seq_layer_blocks(kv, b->seq[t0], s->layer, &n_blocks);

    /* the visible range [lo_t, pos_t] of each row, and their union [lo_min, pos_max] */
    int lo[AG_ATTN_MAX_ROWS], hi[AG_ATTN_MAX_ROWS], lo_min = INT32_MAX, pos_max = 0, stride = 0;
    int seq_end = 0; /* bidirectional: the sequence's last position in the batch */
    for (int t = 0; s->bidirectional && t < b->n; t++)
        if (b->seq[t] == b->seq[t0] && b->pos[t] > seq_end) seq_end = b->pos[t];
    for (int i = 0; i < nt; i++) {
        /* a window is two-sided when bidirectional: |pos - p| < window */
        const int pos = b->pos[t0 + i];
        hi[i] = !s->bidirectional ? pos : s->window > 0 && pos + s->window - 1 < seq_end ? pos + s->window - 1 : seq_end;
        lo[i] = s->window > 0 && pos - s->window + 1 > 0 ? pos - s->window + 1 : 0;
        lo_min = lo[i] < lo_min ? lo[i] : lo_min;
        pos_max = hi[i] > pos_max ? hi[i] : pos_max;
        stride = hi[i] - lo[i] + 1 > stride ? hi[i] - lo[i] + 1 : stride;
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
            block_span(bi * bs, bs, lo[i], hi[i], &j0, &j1);
#if defined(__x86_64__)
            if (wide) /* the row's query heads 4 at a time against 4 positions at a time */
                for (int h0 = 0; h0 < group; h0 += 4) {
                    const int    nq = group - h0 < 4 ? group - h0 : 4;
                    const float *qv[4];
                    float       *row[4];
                    for (int c = 0; c < 4; c++) {
                        const int h = h0 + (c < nq ? c : 0);
                        qv[c] = qh + ((size_t)i * group + h) * dk;
                        row[c] = sc + ((size_t)i * group + h) * stride + (bi * bs - lo[i]);
                    }
                    for (int j = j0; j < j1; j += 4) {
                        const int    nk = j1 - j < 4 ? j1 - j : 4;
                        const float *kr[4];
                        float        d[16];
                        for (int c = 0; c < 4; c++) kr[c] = K + (size_t)(j + (c < nk ? c : 0)) * dk;
                        dots_4x4(qv[0], qv[1], qv[2], qv[3], kr[0], kr[1], kr[2], kr[3], dk, d);
                        for (int c = 0; c < nq; c++)
                            for (int e = 0; e < nk; e++) row[c][j + e] = d[4 * c + e];
                    }
                }
#endif
            for (int h = 0; h < group && !wide; h++) {
                const float *qv = qh + ((size_t)i * group + h) * dk;
                float *row = sc + ((size_t)i * group + h) * stride + (bi * bs - lo[i]);
                int j = j0;
                if (in_place) /* four positions a call (the same bits as one at a time) */
                    for (; j + 4 <= j1; j += 4) dot4_f16(qv, K16 + (size_t)j * dk, (size_t)dk, dk, row + j);
                for (; j < j1; j++)
                    row[j] = in_place ? dot_f16(qv, K16 + (size_t)j * dk, dk) : dot_f32(qv, K + (size_t)j * dk, dk);
            }
            for (int h = 0; h < group; h++) {
                float *row = sc + ((size_t)i * group + h) * stride + (bi * bs - lo[i]);
#if defined(__x86_64__)
                if (wide && s->softcap <= 0) {
                    row_mul16(row + j0, j1 - j0, s->scale);
                    continue;
                }
#endif
                for (int j = j0; j < j1; j++) {
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
            const int n_pos = hi[i] - lo[i] + 1;
            float *row = sc + ((size_t)i * group + h) * stride;
            float mx = -INFINITY;
#if defined(__x86_64__)
            if (wide) mx = row_max16(row, n_pos);
            else
#endif
                for (int j = 0; j < n_pos; j++) mx = row[j] > mx ? row[j] : mx;
            /* an attention sink: one more logit in the max and the sum, with no value */
            const float sink = s->sinks ? s->sinks[g * group + h] : 0.0f;
            if (s->sinks && sink > mx) mx = sink;
#if defined(__x86_64__)
            double sum = wide ? sm_exp_sum16(row, n_pos, mx)
                       : direct_f16 ? sm_exp_sum_fma(row, n_pos, mx)
                                    : sm_exp_sum_c(row, n_pos, mx);
#else
            double sum = sm_exp_sum_c(row, n_pos, mx);
#endif
            if (s->sinks) sum += sm_exp(sink - mx);
            float inv = (float)(1.0 / sum);
#if defined(__x86_64__)
            if (wide) row_mul16(row, n_pos, inv);
            else
#endif
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
            block_span(bi * bs, bs, lo[i], hi[i], &j0, &j1);
#if defined(__x86_64__)
            if (wide && j1 > j0) /* 4 query heads a pass over the block's V rows */
                for (int h0 = 0; h0 < group; h0 += 4)
                    axpys_4(acc + ((size_t)i * group + h0) * dv, (size_t)dv,
                            sc + ((size_t)i * group + h0) * stride + (bi * bs - lo[i]) + j0, (size_t)stride,
                            group - h0 < 4 ? group - h0 : 4, V + (size_t)j0 * dv, j1 - j0, dv);
#endif
            for (int h = 0; h < group && !wide; h++) {
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
    const size_t w = s->bidirectional ? 2 * (size_t)s->window - 1 : (size_t)s->window;
    if (s->window > 0 && n_pos > w) n_pos = w;
    return (size_t)block_size * dmax +
           AG_ATTN_MAX_ROWS * group * ((size_t)s->head_dim_k + n_pos + (size_t)s->head_dim_v);
}
