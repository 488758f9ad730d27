/* AVX2 + FMA + F16C kernels: dot products and activation quantization.
 *
 * The whole file is compiled for that target through a pragma, so the
 * shared Makefile needs no per-file flags; nothing here runs unless the
 * dispatcher (quant.c) saw the CPU support it.
 *
 * Every kernel takes one weight row and 1..4 activation rows: the weight
 * block is loaded and unpacked once, then multiplied with each token's block
 * (the reuse that makes the GEMM path faster than repeated matvecs). Block
 * products are exact int32 (maddubs pairs and madd sums cannot overflow for
 * these value ranges, noted per kernel); only the float scaling and the
 * final sums round. */
#include <stddef.h>

#include "backend/cpu/quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "backend/cpu/quant_x86.h"

/* ---- legacy 32-element types, Q8A activations ----
 *
 * Per group of 8 blocks the fp16 weight scales (and the offset types'
 * minimums) and the activations' d (and s) are loaded and converted 8 at a
 * time, so the per-block work is the unpack, maddubs + madd (exact int32),
 * one cvt, one permute of the block's scale product and one FMA into one of
 * two accumulators (even/odd block; two hide the FMA latency for one token).
 * Converting each block's scales on its own cost about as many instructions
 * as the block's products.
 *
 * The arithmetic is the AVX-512 kernels' (LEGACY512 in quant_avx512.c), so
 * the two levels give the same bits: each scale product dw*dy is one
 * rounding, made 8 at a time or one by one; the offset types' (Q4_1, Q5_1:
 * x = d*q + m, so Σ x*y = d*dy*Σq*y + m*(dy*Σy), the second term from the
 * block's s) m*s products are rounded, never fused, and added one block at
 * a time in block order. Signed types (Q4_0, Q5_0, Q8_0): maddubs wants an
 * unsigned operand, so |q| against y with q's sign. */

/* The fp16 at `first` and in the kn - 1 (0..7) blocks `stride` bytes after
 * it, as 8 floats (lanes past kn: 0). */
AI __m256 f16_lanes(const void *first, size_t stride, int kn) {
    uint16_t h[8];
    UNROLL for (int k = 0; k < 8; k++) {
        h[k] = 0;
        if (k < kn) memcpy(&h[k], (const uint8_t *)first + (size_t)k * stride, 2);
    }
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}
/* The same for a float. */
AI __m256 f32_lanes(const void *first, size_t stride, int kn) {
    float v[8];
    UNROLL for (int k = 0; k < 8; k++) {
        v[k] = 0.0f;
        if (k < kn) memcpy(&v[k], (const uint8_t *)first + (size_t)k * stride, 4);
    }
    return _mm256_setr_ps(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}
/* The float at byte offset off (d or s) of kn activation blocks from y. */
AI __m256 q8a_lanes(const ag_block_q8a *y, size_t off, int kn) {
    return f32_lanes((const uint8_t *)y + off, sizeof *y, kn);
}

/* The E8M0 scales of kn blocks from `first` (MXFP4), as f16_lanes. */
AI __m256 e8m0_lanes(const void *first, size_t stride, int kn) {
    float v[8];
    UNROLL for (int k = 0; k < 8; k++) v[k] = k < kn ? ag_e8m0_half(((const uint8_t *)first)[(size_t)k * stride]) : 0.0f;
    return _mm256_loadu_ps(v);
}

/* v itself, or (MXFP4) rounded through fp16 (see dot_mxfp4 in quant.c). */
AI __m256 same8(__m256 v) { return v; }
AI __m256 f16_round8(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }

/* DWL: the weight scales' loader (f16_lanes, or e8m0_lanes for MXFP4); YD:
 * what the activations' scales go through (same8, or f16_round8). */
#define LEGACY_KERNEL(name, BT, WQ, SIGNED, HAS_M, DWL, YD)                                             \
    AI void name##_grp(const BT *b, const ag_block_q8a *const *y, int64_t i0, const int KN, int kn,      \
                       const int NX, __m256 (*acc)[2], float *sm) {                                   \
        UNROLL for (int o = 0; o < (int)(8 * sizeof(BT)); o += 64)                                      \
            _mm_prefetch((const char *)&b[i0] + AG_PF_DIST + o, _MM_HINT_T0);                           \
        const __m256 dw = DWL(&b[i0], sizeof(BT), kn);                                                  \
        __m256       sc[AG_DOT_MAX_NX];                                                                 \
        UNROLL for (int t = 0; t < NX; t++) sc[t] = _mm256_mul_ps(dw, YD(q8a_lanes(&y[t][i0], offsetof(ag_block_q8a, d), kn))); \
        if (HAS_M) { /* m: the fp16 after d */                                                          \
            const __m256 mw = f16_lanes((const uint8_t *)&b[i0] + 2, sizeof(BT), kn);                   \
            UNROLL for (int t = 0; t < NX; t++) {                                                       \
                float ms[8];                                                                            \
                _mm256_storeu_ps(ms, _mm256_mul_ps(mw, q8a_lanes(&y[t][i0], offsetof(ag_block_q8a, s), kn))); \
                for (int k = 0; k < kn; k++) sm[t] += ms[k];                                            \
            }                                                                                           \
        }                                                                                               \
        UNROLL for (int k = 0; k < KN; k++) {                                                           \
            if (k >= kn) break;                                                                         \
            const __m256i q = WQ(&b[i0 + k]);                                                           \
            const __m256i u = SIGNED ? _mm256_sign_epi8(q, q) : q;                                      \
            const __m256i kk = _mm256_set1_epi32(k);                                                    \
            UNROLL for (int t = 0; t < NX; t++) {                                                       \
                __m256i yv = loadu256(y[t][i0 + k].qs);                                                 \
                if (SIGNED) yv = _mm256_sign_epi8(yv, q);                                               \
                acc[t][k & 1] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sc[t], kk),                    \
                                                _mm256_cvtepi32_ps(dot_u8s8(u, yv)), acc[t][k & 1]);    \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    AG_LEGACY_DOT_ROWS(name, BT, HAS_M)

LEGACY_KERNEL(dot_q4_0, ag_block_q4_0, wq_q4_0, 1, 0, f16_lanes, same8)
LEGACY_KERNEL(dot_q5_0, ag_block_q5_0, wq_q5_0, 1, 0, f16_lanes, same8)
LEGACY_KERNEL(dot_q8_0, ag_block_q8_0, wq_q8_0, 1, 0, f16_lanes, same8)
LEGACY_KERNEL(dot_q4_1, ag_block_q4_1, wq_q4_1, 0, 1, f16_lanes, same8)
LEGACY_KERNEL(dot_q5_1, ag_block_q5_1, wq_q5_1, 0, 1, f16_lanes, same8)
/* MXFP4: |v| <= 12, so maddubs pairs stay far below int16 saturation */
LEGACY_KERNEL(dot_mxfp4, ag_block_mxfp4, wq_mxfp4, 1, 0, e8m0_lanes, f16_round8)

/* ---- K-quants, Q8_K activations ---- */

/* Prefetches step k of nsteps of the weight tile that follows the `bytes`
 * bytes at tile (the next rows: a task walks consecutive rows). A kernel
 * that walks its tile in nsteps calls it once per step, so the next tile
 * arrives while this one computes. Without it the kernels wait for each
 * weight line: the work per super-block (hundreds of instructions) keeps
 * the next block's loads out of the out-of-order window. Prefetch does not
 * fault, so reading past the matrix is harmless. */
AI void prefetch_next_tile(const void *tile, size_t bytes, int64_t k, int64_t nsteps) {
    const char  *next = (const char *)tile + bytes;
    const size_t per = (bytes + (size_t)nsteps - 1) / (size_t)nsteps;
    for (size_t o = (size_t)k * per; o < (size_t)(k + 1) * per && o < bytes; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
}


/* Q4_K and Q6_K follow the canonical K-quant arithmetic (ag_kquant_fold in
 * quant_impl.h), bit for bit with the scalar and AVX-512 kernels and the AMX
 * tiles: per super-block s the exact integers isum (and Q4_K's msum), folded
 * into accumulator s % 4 with two fmas, the result (a0 + a2) + (a1 + a3).
 * So a token's result does not depend on the ISA level that ran it.
 *
 * A super-block's integer sums come out as int32 partial sums in one ymm;
 * four super-blocks' vectors are reduced together (two rounds of hadd: a
 * transpose-and-add, exact in int32), and the float fold runs on the four
 * lanes [s0 s1 s2 s3] of an xmm at once: lane k is accumulator k. A last
 * group of fewer than four super-blocks has zero sums and zero scales in the
 * missing lanes, which leaves those accumulators unchanged (an accumulator
 * is never -0: it starts at +0, and an exact-zero fma result is +0). */

/* An empty asm that claims to change v: ends the integer sum chain there.
 * Without it GCC reorders a super-block's sum (integer adds associate)
 * into "all products first, then add them up", and with 2..4 tokens the
 * products spill to the stack (Q6_K, nx = 4: ~15% slower). */
#define CHAIN(v) __asm__("" : "+x"(v))

/* The d of super-blocks i..i+3 of activation row y (zero past kn). Built
 * in registers: four scalar stores and a vector load would stall on store
 * forwarding. */
AI __m128 q8k_d4(const ag_block_q8_K *y, int64_t i, int kn) {
    if (kn == 4) return _mm_setr_ps(y[i].d, y[i + 1].d, y[i + 2].d, y[i + 3].d);
    return _mm_setr_ps(y[i].d, kn > 1 ? y[i + 1].d : 0.0f, kn > 2 ? y[i + 2].d : 0.0f, 0.0f);
}
/* The dword at byte offset `off` of blocks i..i+3 of size BS (zero past kn):
 * the fp16 pair (d, dmin) of Q4_K, or (last two scales, d) of Q6_K. */
AI __m128i w_head4(const void *b, size_t bs, size_t off, int kn) {
    const uint8_t *p = (const uint8_t *)b + off;
    uint32_t       v[4] = {0, 0, 0, 0};
    UNROLL for (int k = 0; k < 4; k++) if (k < kn) memcpy(&v[k], p + k * bs, 4);
    return _mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
}
/* The low / high fp16 of each dword, as floats. */
AI __m128 f16_lo4(__m128i v) {
    return _mm_cvtph_ps(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1)));
}
AI __m128 f16_hi4(__m128i v) {
    return _mm_cvtph_ps(_mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)));
}

/* (a0 + a2) + (a1 + a3), ag_kquant_total. */
AI float acc4_total(__m128 a) {
    __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* ag_k4_scales_unpack in registers: bytes 0..7 the scales, 8..15 the mins.
 * With u0..u2 the three dwords: [u0 & M6, (u2 & M4) | top2(u0) << 4,
 * u1 & M6, (u2 >> 4 & M4) | top2(u1) << 4], where top2(u) << 4 per byte is
 * (u >> 2) & 0x30. Reads 16 bytes from q (the 12 scale bytes and 4 of qs). */
AI __m128i k4_scales_x(const uint8_t *q) {
    const __m128i v = loadu128(q);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* Q4_K: q 0..15, 6-bit scales applied as int16 madd weights per 32
 * elements (maddubs pairs <= 2*15*127, a sub-block's lane sum <= 63 * 32 *
 * 15 * 127 and the block's <= 8 times that: exact int32). Super-block i's
 * sums as one ymm: lanes 0..3 partial sums of isum, lanes 4..7 of msum
 * (Σ_j mins[j] * (bsums[2j] + bsums[2j+1])). */
AI void q4k_sums(const ag_block_q4_K *b, const ag_block_q8_K *const *y, int64_t i, const int NX, __m256i *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i sm = k4_scales_x(b[i].scales); /* bytes 0..7 scales, 8..15 mins */
    /* the 8 scales as int16 in both 128-bit lanes: one vpshufb per scale vector below */
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    __m256i       sumi[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) sumi[t] = _mm256_setzero_si256();
    UNROLL for (int j = 0; j < 4; j++) {
        __m256i qv = loadu256(b[i].qs + 32 * j);
        __m256i lo = _mm256_and_si256(qv, m4), hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
        __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * j))));
        __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * j + 1))));
        UNROLL for (int t = 0; t < NX; t++) {
            __m256i p0 = dot_u8s8_scaled(lo, loadu256(y[t][i].qs + 64 * j), slo);
            __m256i p1 = dot_u8s8_scaled(hi, loadu256(y[t][i].qs + 64 * j + 32), shi);
            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            CHAIN(sumi[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++)
        out[t] = _mm256_set_m128i(k4_min_dot(&y[t][i], mins16),
                                  _mm_add_epi32(_mm256_castsi256_si128(sumi[t]), _mm256_extracti128_si256(sumi[t], 1)));
}

AI void dot_q4_K_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) {
    const ag_block_q4_K *b = w;
    const ag_block_q8_K *y[AG_DOT_MAX_NX];
    __m128               acc[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) {
        y[t] = (const ag_block_q8_K *)YROW(t);
        acc[t] = _mm_setzero_ps();
    }
    const int64_t nsb = n / AG_QK_K;
    for (int64_t i = 0; i < nsb; i += 4) {
        const int kn = nsb - i < 4 ? (int)(nsb - i) : 4;
        /* the group's per-block sums go through memory: held in registers
         * across the four blocks they would crowd out the accumulators */
        _Alignas(32) int32_t sb[4][AG_DOT_MAX_NX][8];
        for (int k = 0; k < kn; k++) {
            __m256i sk[AG_DOT_MAX_NX];
            prefetch_next_tile(b, (size_t)nsb * sizeof *b, i + k, nsb);
            q4k_sums(b, y, i + k, NX, sk);
            UNROLL for (int t = 0; t < NX; t++) _mm256_store_si256((__m256i *)sb[k][t], sk[t]);
        }
        for (int k = kn; k < 4; k++)
            UNROLL for (int t = 0; t < NX; t++) _mm256_store_si256((__m256i *)sb[k][t], _mm256_setzero_si256());
        __m256i p[2][AG_DOT_MAX_NX]; /* p[h]: super-blocks 2h, 2h+1 half-reduced */
        UNROLL for (int h = 0; h < 2; h++)
            UNROLL for (int t = 0; t < NX; t++)
                p[h][t] = _mm256_hadd_epi32(_mm256_load_si256((const __m256i *)sb[2 * h][t]),
                                            _mm256_load_si256((const __m256i *)sb[2 * h + 1][t]));
        const __m128i hd = w_head4(&b[i], sizeof(ag_block_q4_K), offsetof(ag_block_q4_K, d), kn);
        const __m128  d = f16_lo4(hd), dmin = f16_hi4(hd);
        UNROLL for (int t = 0; t < NX; t++) {
            /* lanes 0..3: isum of super-blocks i..i+3, lanes 4..7: their msum */
            const __m256 sums = _mm256_cvtepi32_ps(_mm256_hadd_epi32(p[0][t], p[1][t]));
            const __m128 dy = q8k_d4(y[t], i, kn);
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(dy, d), _mm256_castps256_ps128(sums), acc[t]);
            acc[t] = _mm_fnmadd_ps(_mm_mul_ps(dy, dmin), _mm256_extractf128_ps(sums, 1), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = acc4_total(acc[t]);
}
AG_DOT_DISPATCH(dot_q4_K)

/* Q5_K: as Q4_K with a fifth bit from qh (bit j of qh[l] for sub-block j);
 * q 0..31 keeps maddubs pairs below 2*31*127. */
AI void dot_q5_K_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) {
    const ag_block_q5_K  *b = w;
    const ag_block_q8_K  *y[AG_DOT_MAX_NX];
    __m256                acc[AG_DOT_MAX_NX];
    __m128                accm[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) {
        y[t] = (const ag_block_q8_K *)YROW(t);
        acc[t] = _mm256_setzero_ps();
        accm[t] = _mm_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(0xF), m1 = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / AG_QK_K; i++) {
        uint8_t sm[16]; /* 8 scales, 8 mins */
        ag_k4_scales_unpack(b[i].scales, sm);
        const uint8_t *sc = sm;
        const __m128i  mins16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
        const float   d = f16(b[i].d), dmin = f16(b[i].dmin);
        const __m256i hb = loadu256(b[i].qh);
        __m256i       sumi[AG_DOT_MAX_NX];
        UNROLL for (int t = 0; t < NX; t++) sumi[t] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 4; j++) {
            __m256i qv = loadu256(b[i].qs + 32 * j);
            __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), m1);
            __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), m1);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(qv, m4), _mm256_slli_epi16(h0, 4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qv, 4), m4), _mm256_slli_epi16(h1, 4));
            __m256i slo = _mm256_set1_epi16(sc[2 * j]), shi = _mm256_set1_epi16(sc[2 * j + 1]);
            UNROLL for (int t = 0; t < NX; t++) {
                __m256i p0 = dot_u8s8_scaled(lo, loadu256(y[t][i].qs + 64 * j), slo);
                __m256i p1 = dot_u8s8_scaled(hi, loadu256(y[t][i].qs + 64 * j + 32), shi);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        UNROLL for (int t = 0; t < NX; t++) {
            float dy = y[t][i].d;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            accm[t] = _mm_fmadd_ps(_mm_set1_ps(dy * dmin), _mm_cvtepi32_ps(k4_min_dot(&y[t][i], mins16)),
                                   accm[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = hsum8(acc[t]) - hsum4(accm[t]);
}
AG_DOT_DISPATCH(dot_q5_K)

/* Q6_K (canonical, see Q4_K): q 0..63 as unsigned, scale per 16 elements;
 * the -32 offset comes out as 32 * Σ_k scale_k * bsums_k. maddubs pairs <=
 * 2*63*127 < 32767. Super-block i's exact sum as 8 int32 partial sums. */
AI void q6k_sums(const ag_block_q6_K *b, const ag_block_q8_K *const *y, int64_t i, const int NX, __m256i *sumi) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(b[i].scales));
    UNROLL for (int t = 0; t < NX; t++)
        sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), /* the -32 offset: -32*Σ sc*bsum */
                                   _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(y[t][i].bsums)), 5));
    UNROLL for (int h = 0; h < 2; h++) {
        /* scales 8h..8h+7 as int16 in both 128-bit lanes; the pair for
         * elements 128h + 32k.. (scale 8h+2k on the first 16, 8h+2k+1 on the
         * next 16) is then one in-lane vpshufb */
        const __m256i sch =
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(b[i].scales + 8 * h))));
        __m256i g[4];
        q6k_unpack_half(b[i].ql + 64 * h, b[i].qh + 32 * h, g);
        UNROLL for (int k = 0; k < 4; k++) {
            const __m256i sv = _mm256_shuffle_epi8(
                sch, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k + 1))),
                                      _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k)))));
            UNROLL for (int t = 0; t < NX; t++) {
                sumi[t] = _mm256_add_epi32(sumi[t],
                                           dot_u8s8_scaled(g[k], loadu256(y[t][i].qs + 128 * h + 32 * k), sv));
                CHAIN(sumi[t]);
            }
        }
    }
}

AI void dot_q6_K_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) {
    const ag_block_q6_K *b = w;
    const ag_block_q8_K *y[AG_DOT_MAX_NX];
    __m128               acc[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) {
        y[t] = (const ag_block_q8_K *)YROW(t);
        acc[t] = _mm_setzero_ps();
    }
    const int64_t nsb = n / AG_QK_K;
    for (int64_t i = 0; i < nsb; i += 4) {
        const int kn = nsb - i < 4 ? (int)(nsb - i) : 4;
        _Alignas(32) int32_t sb[4][AG_DOT_MAX_NX][8]; /* as in Q4_K */
        for (int k = 0; k < kn; k++) {
            __m256i sk[AG_DOT_MAX_NX];
            prefetch_next_tile(b, (size_t)nsb * sizeof *b, i + k, nsb);
            q6k_sums(b, y, i + k, NX, sk);
            UNROLL for (int t = 0; t < NX; t++) _mm256_store_si256((__m256i *)sb[k][t], sk[t]);
        }
        for (int k = kn; k < 4; k++)
            UNROLL for (int t = 0; t < NX; t++) _mm256_store_si256((__m256i *)sb[k][t], _mm256_setzero_si256());
        __m256i p[2][AG_DOT_MAX_NX];
        UNROLL for (int h = 0; h < 2; h++)
            UNROLL for (int t = 0; t < NX; t++)
                p[h][t] = _mm256_hadd_epi32(_mm256_load_si256((const __m256i *)sb[2 * h][t]),
                                            _mm256_load_si256((const __m256i *)sb[2 * h + 1][t]));
        /* d is the block's last two bytes: the dword ending there, high half */
        const __m128 d = f16_hi4(w_head4(&b[i], sizeof(ag_block_q6_K), offsetof(ag_block_q6_K, d) - 2, kn));
        UNROLL for (int t = 0; t < NX; t++) {
            /* lane k: the low and the high half of super-block i+k's partial sums */
            const __m256i r = _mm256_hadd_epi32(p[0][t], p[1][t]);
            const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
            /* Q6_K folds with dmin = msum = 0, which leaves the accumulator as it is */
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(q8k_d4(y[t], i, kn), d), _mm_cvtepi32_ps(isum), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = acc4_total(acc[t]);
}
AG_DOT_DISPATCH(dot_q6_K)

/* Q2_K: q 0..3, 4-bit scale and min per 16 elements. */
AI void dot_q2_K_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) {
    const ag_block_q2_K *b = w;
    const ag_block_q8_K *y[AG_DOT_MAX_NX];
    __m256               acc[AG_DOT_MAX_NX], accm[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) {
        y[t] = (const ag_block_q8_K *)YROW(t);
        acc[t] = accm[t] = _mm256_setzero_ps();
    }
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / AG_QK_K; i++) {
        const uint8_t *sc = b[i].scales;
        const __m128i  s8 = loadu128(sc);
        const __m256i  mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0xF)));
        const float    d = f16(b[i].d), dmin = f16(b[i].dmin);
        __m256i        sumi[AG_DOT_MAX_NX];
        UNROLL for (int t = 0; t < NX; t++) sumi[t] = _mm256_setzero_si256();
        UNROLL for (int h = 0; h < 2; h++) {
            __m256i qv = loadu256(b[i].qs + 32 * h);
            UNROLL for (int k = 0; k < 4; k++) {
                __m256i       g = _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * k)), m3);
                const int     s = 8 * h + 2 * k;
                const __m256i sv = scale_pair(sc[s] & 0xF, sc[s + 1] & 0xF);
                UNROLL for (int t = 0; t < NX; t++)
                    sumi[t] = _mm256_add_epi32(
                        sumi[t], dot_u8s8_scaled(g, loadu256(y[t][i].qs + 128 * h + 32 * k), sv));
            }
        }
        UNROLL for (int t = 0; t < NX; t++) {
            float dy = y[t][i].d;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dy * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dy * dmin),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(mn16, loadu256(y[t][i].bsums))),
                                      accm[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = hsum8(acc[t]) - hsum8(accm[t]);
}
AG_DOT_DISPATCH(dot_q2_K)

/* Q3_K: q = ql + 4*hbit in 0..7 unsigned; the -4 offset comes out as
 * 4 * Σ_k scale_k * bsums_k. */
AI void dot_q3_K_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) {
    const ag_block_q3_K *b = w;
    const ag_block_q8_K *y[AG_DOT_MAX_NX];
    __m256               acc[AG_DOT_MAX_NX];
    UNROLL for (int t = 0; t < NX; t++) {
        y[t] = (const ag_block_q8_K *)YROW(t);
        acc[t] = _mm256_setzero_ps();
    }
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < n / AG_QK_K; i++) {
        int8_t sc[16];
        {
            uint8_t u[16];
            ag_q3k_scales_unpack(b[i].scales, u);
            _mm_storeu_si128((__m128i *)sc, _mm_sub_epi8(loadu128(u), _mm_set1_epi8(32)));
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(sc));
        const __m256i hm = loadu256(b[i].hmask);
        const float   d = f16(b[i].d);
        __m256i       sumi[AG_DOT_MAX_NX];
        UNROLL for (int t = 0; t < NX; t++)
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(y[t][i].bsums)), 2));
        UNROLL for (int h = 0; h < 2; h++) {
            __m256i qv = loadu256(b[i].qs + 32 * h);
            UNROLL for (int k = 0; k < 4; k++) {
                __m256i ql = _mm256_and_si256(_mm256_srl_epi16(qv, _mm_cvtsi32_si128(2 * k)), m3);
                __m256i hbit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + k)), m1);
                __m256i g = _mm256_or_si256(ql, _mm256_slli_epi16(hbit, 2));
                const int     s = 8 * h + 2 * k;
                const __m256i sv = scale_pair(sc[s], sc[s + 1]);
                UNROLL for (int t = 0; t < NX; t++)
                    sumi[t] = _mm256_add_epi32(
                        sumi[t], dot_u8s8_scaled(g, loadu256(y[t][i].qs + 128 * h + 32 * k), sv));
            }
        }
        UNROLL for (int t = 0; t < NX; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = hsum8(acc[t]);
}
AG_DOT_DISPATCH(dot_q3_K)

/* ---- token panels: nr weight rows x np panels of 8 tokens (prompt rows) ----
 *
 * The activations come as panels (ag_panel_q8k / ag_panel_q8a): one 32-byte
 * load holds elements 4c..4c+3 of eight tokens. A weight row's block is
 * unpacked once into bytes (in element order) for all np panels; four of
 * its bytes, broadcast, times the panel vector give with maddubs each
 * token's two pair sums in its own int32 lane, so a block's sum for eight
 * tokens needs no horizontal reduction and the int16 pair sums of several
 * chunks are added before one madd applies their common scale: per chunk
 * and row one maddubs and one add, against the dot kernels' maddubs, madd
 * and add per token. The int16 sums stay exact: chunks of one scale are
 * summed while n * 2 * umax * 127 < 32768 (u <= 15: 8 chunks, u <= 31: 4,
 * Q6_K's u <= 63: 2), |y| <= 127 from the quantizer.
 *
 * K-quants: per (row, token, super-block) the exact isum (and msum), folded
 * with ag_kquant_fold's two fmas into accumulator s % 4, in token lanes:
 * the dot kernels' bits. Legacy types: their own arithmetic for prompt rows
 * (as the AVX-512 tiles), per (row, token) in block order acc = fma(dw*dy,
 * isum, acc), then for the offset types acc = fma(m, s, acc). */

AI __m256i bcast32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
AI __m256i load256a(const void *p) { return _mm256_load_si256((const __m256i *)p); }
/* An int16 value in both halves of a dword (madd multiplies both pair sums by it). */
AI __m256i dup16(__m256i v32) { return _mm256_or_si256(_mm256_and_si256(v32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v32, 16)); }

/* Stores the token lanes of nr (1..4) row vectors v (tokens t0.. of the
 * batch, those below nt) at y[t*ldy + r]: transposed to one 4-float vector
 * per token, so a token's rows are one store (masked for nr < 4: the rows
 * past nr belong to another task). */
AI void panel_store(const __m256 *v, const int NR, int64_t t0, int64_t nt, float *y, int64_t ldy) {
    const __m256 z = _mm256_setzero_ps();
    const __m256 v0 = v[0], v1 = NR > 1 ? v[1] : z, v2 = NR > 2 ? v[2] : z, v3 = NR > 3 ? v[3] : z;
    const __m256 t0v = _mm256_unpacklo_ps(v0, v1), t1v = _mm256_unpackhi_ps(v0, v1);
    const __m256 t2v = _mm256_unpacklo_ps(v2, v3), t3v = _mm256_unpackhi_ps(v2, v3);
    __m256       u[4]; /* u[k]: tokens k (low half) and k + 4 (high half) */
    u[0] = _mm256_shuffle_ps(t0v, t2v, 0x44);
    u[1] = _mm256_shuffle_ps(t0v, t2v, 0xEE);
    u[2] = _mm256_shuffle_ps(t1v, t3v, 0x44);
    u[3] = _mm256_shuffle_ps(t1v, t3v, 0xEE);
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(NR), _mm_setr_epi32(0, 1, 2, 3));
    UNROLL for (int t = 0; t < AG_PANEL_NT; t++) {
        if (t0 + t >= nt) break;
        const __m128 o = t < 4 ? _mm256_castps256_ps128(u[t]) : _mm256_extractf128_ps(u[t - 4], 1);
        float       *dst = y + (t0 + t) * ldy;
        if (NR == 4) _mm_storeu_ps(dst, o);
        else _mm_maskstore_ps(dst, mask, o);
    }
}

#define PANEL_DISPATCH(name)                                                                                   \
    static void name(int64_t n, const void *w, size_t w_stride, int nr, const void *xp, size_t xp_stride, int np, \
                     int64_t nt, float *y, int64_t ldy) {                                                      \
        switch (nr) {                                                                                          \
        case 1: name##_k(n, w, w_stride, 1, xp, xp_stride, np, nt, y, ldy); break;                             \
        case 2: name##_k(n, w, w_stride, 2, xp, xp_stride, np, nt, y, ldy); break;                             \
        case 3: name##_k(n, w, w_stride, 3, xp, xp_stride, np, nt, y, ldy); break;                             \
        default: name##_k(n, w, w_stride, 4, xp, xp_stride, np, nt, y, ldy); break;                            \
        }                                                                                                      \
    }

/* One weight row's K-quant super-block, unpacked for the panel kernels:
 * u the 256 values (Q4_K 0..15, Q6_K 0..63) in element order; mul[g] the
 * scale of element group g (Q4_K: 32 elements, 8 groups; Q6_K: 16, 16) as
 * an int16 pair in a dword; corr[i] the int16 pair that multiplies pair i of
 * the panel's correction sums (Q4_K: mins 2i, 2i+1 against bpair, 4 pairs;
 * Q6_K: scales 2i, 2i+1 against bsums, 8 pairs). */
typedef struct {
    _Alignas(32) uint8_t u[AG_QK_K];
    int32_t mul[16], corr[8];
    float   d, dmin;
} kq_row;

AI void q4k_row(const ag_block_q4_K *b, kq_row *o) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    UNROLL for (int j = 0; j < 4; j++) { /* qs[32j + l]: element 64j + l (low nibble), 64j + 32 + l (high) */
        const __m256i qv = loadu256(b->qs + 32 * j);
        _mm256_store_si256((__m256i *)(o->u + 64 * j), _mm256_and_si256(qv, m4));
        _mm256_store_si256((__m256i *)(o->u + 64 * j + 32), _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4));
    }
    const __m128i sm = k4_scales_x(b->scales); /* bytes 0..7 scales, 8..15 mins */
    _mm256_storeu_si256((__m256i *)o->mul, dup16(_mm256_cvtepu8_epi32(sm)));
    _mm_storeu_si128((__m128i *)o->corr, _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
    o->d = f16(b->d);
    o->dmin = f16(b->dmin);
}

AI void q6k_row(const ag_block_q6_K *b, kq_row *o) {
    UNROLL for (int h = 0; h < 2; h++) {
        __m256i g[4];
        q6k_unpack_half(b->ql + 64 * h, b->qh + 32 * h, g);
        UNROLL for (int k = 0; k < 4; k++) _mm256_store_si256((__m256i *)(o->u + 128 * h + 32 * k), g[k]);
    }
    const __m128i sc = loadu128(b->scales);
    _mm256_storeu_si256((__m256i *)o->mul, dup16(_mm256_cvtepi8_epi32(sc)));
    _mm256_storeu_si256((__m256i *)(o->mul + 8), dup16(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    _mm256_storeu_si256((__m256i *)o->corr, _mm256_cvtepi8_epi16(sc));
    o->d = f16(b->d);
    o->dmin = 0.0f;
}

/* Q4_K's Σ_j sc_j Σ q·y per token: per 32-element sub-block j, 8 chunks'
 * maddubs summed in int16, one madd by scale j. */
AI void q4k_panel_isum(const kq_row *w, const ag_panel_q8k *x, const int NR, __m256i *isum) {
    UNROLL for (int r = 0; r < NR; r++) isum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i a[AG_GEMM_RM];
        UNROLL for (int c = 0; c < 8; c++) {
            const __m256i yv = load256a(x->qs[8 * j + c]);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256i p = _mm256_maddubs_epi16(bcast32(w[r].u + 32 * j + 4 * c), yv);
                a[r] = c ? _mm256_add_epi16(a[r], p) : p;
                CHAIN(a[r]);
            }
        }
        UNROLL for (int r = 0; r < NR; r++)
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(a[r], bcast32(&w[r].mul[j])));
    }
}

/* Q6_K's Σ_g sc_g Σ q·y per token (q unsigned 0..63): per 16-element group
 * g, two int16 sums of two chunks, each madd by scale g. */
AI void q6k_panel_isum(const kq_row *w, const ag_panel_q8k *x, const int NR, __m256i *isum) {
    UNROLL for (int r = 0; r < NR; r++) isum[r] = _mm256_setzero_si256();
    for (int g = 0; g < 16; g++) {
        __m256i yv[4];
        UNROLL for (int k = 0; k < 4; k++) yv[k] = load256a(x->qs[4 * g + k]);
        UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *u = w[r].u + 16 * g;
            const __m256i  a0 = _mm256_add_epi16(_mm256_maddubs_epi16(bcast32(u), yv[0]), _mm256_maddubs_epi16(bcast32(u + 4), yv[1]));
            const __m256i  a1 = _mm256_add_epi16(_mm256_maddubs_epi16(bcast32(u + 8), yv[2]), _mm256_maddubs_epi16(bcast32(u + 12), yv[3]));
            const __m256i  sc = bcast32(&w[r].mul[g]);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(a0, sc), _mm256_madd_epi16(a1, sc)));
            CHAIN(isum[r]);
        }
    }
}

/* Σ_i corr_i · pairs_i per token, exact: |pair| <= 32*127, |corr| <= 128. */
AI __m256i kq_corr(const __m256i *corr, const int16_t (*pairs)[AG_PANEL_NT][2], const int N) {
    __m256i s = _mm256_madd_epi16(load256a(pairs[0]), corr[0]);
    UNROLL for (int i = 1; i < N; i++) s = _mm256_add_epi32(s, _mm256_madd_epi16(load256a(pairs[i]), corr[i]));
    return s;
}

/* The K-quant panel kernel, super-block by super-block: the NR rows' block
 * unpacked once; each panel's chunk sums (ISUM) kept in ib; then per row,
 * per panel, the exact isum and msum completed from the panel's bsums
 * (Q4_K: msum = Σ mins · bpair; Q6_K: isum -= 32 Σ sc · bsums, its msum and
 * dmin are 0, which leaves the accumulator unchanged, so that fma is
 * skipped as in the dot kernel) and folded into the token lanes'
 * accumulator s % 4 (ag_kquant_fold). Per row the correction multipliers
 * stay in registers across the panels. */
#define KQ_PANEL(name, BT, ROW, ISUM, Q4K)                                                                        \
    AI void name##_k(int64_t n, const void *w, size_t w_stride, const int NR, const void *xp, size_t xp_stride,  \
                     int np, int64_t nt, float *y, int64_t ldy) {                                                \
        _Alignas(32) float   acc[AG_PANEL_MAX_NP][AG_GEMM_RM][4][AG_PANEL_NT];                                  \
        _Alignas(32) int32_t ib[AG_PANEL_MAX_NP][AG_GEMM_RM][AG_PANEL_NT];                                      \
        kq_row               wr[AG_GEMM_RM];                                                                     \
        memset(acc, 0, sizeof(acc[0]) * (size_t)np);                                                             \
        const int64_t nsb = n / AG_QK_K;                                                                         \
        for (int64_t s = 0; s < nsb; s++) {                                                                      \
            prefetch_next_tile(w, (size_t)NR * w_stride, s, nsb);                                                \
            UNROLL for (int r = 0; r < NR; r++) ROW((const BT *)((const uint8_t *)w + (size_t)r * w_stride) + s, &wr[r]); \
            for (int p = 0; p < np; p++) {                                                                       \
                __m256i isum[AG_GEMM_RM];                                                                        \
                ISUM(wr, (const ag_panel_q8k *)((const uint8_t *)xp + (size_t)p * xp_stride) + s, NR, isum);     \
                UNROLL for (int r = 0; r < NR; r++) _mm256_store_si256((__m256i *)ib[p][r], isum[r]);            \
            }                                                                                                    \
            UNROLL for (int r = 0; r < NR; r++) {                                                                \
                __m256i corr[8];                                                                                 \
                UNROLL for (int i = 0; i < (Q4K ? 4 : 8); i++) corr[i] = bcast32(&wr[r].corr[i]);                \
                const __m256 d = _mm256_set1_ps(wr[r].d), dmin = _mm256_set1_ps(wr[r].dmin);                     \
                for (int p = 0; p < np; p++) {                                                                   \
                    const ag_panel_q8k *x = (const ag_panel_q8k *)((const uint8_t *)xp + (size_t)p * xp_stride) + s; \
                    const __m256        dy = _mm256_load_ps(x->d);                                               \
                    float              *a = acc[p][r][s & 3];                                                    \
                    __m256i             isum = load256a(ib[p][r]);                                               \
                    if (!Q4K) isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(kq_corr(corr, x->bsums, 8), 5));   \
                    __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(isum), _mm256_load_ps(a)); \
                    if (Q4K) v = _mm256_fnmadd_ps(_mm256_mul_ps(dy, dmin), _mm256_cvtepi32_ps(kq_corr(corr, x->bpair, 4)), v); \
                    _mm256_store_ps(a, v);                                                                       \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int p = 0; p < np; p++) {                                                                           \
            __m256 v[AG_GEMM_RM];                                                                                \
            UNROLL for (int r = 0; r < NR; r++)                                                                  \
                v[r] = _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(acc[p][r][0]), _mm256_load_ps(acc[p][r][2])),  \
                                     _mm256_add_ps(_mm256_load_ps(acc[p][r][1]), _mm256_load_ps(acc[p][r][3])));  \
            panel_store(v, NR, (int64_t)p * AG_PANEL_NT, nt, y, ldy);                                            \
        }                                                                                                        \
    }                                                                                                            \
    PANEL_DISPATCH(name)

KQ_PANEL(panel_q4_K, ag_block_q4_K, q4k_row, q4k_panel_isum, 1)
KQ_PANEL(panel_q6_K, ag_block_q6_K, q6k_row, q6k_panel_isum, 0)

/* The Q4_K token panels with AVX-512 VNNI (CPUs of the AVX-512 level;
 * the panel machinery lives here, so the VNNI variants do too): vpdpbusd
 * adds a chunk's four byte products into each token's int32 lane at once,
 * where maddubs + add leave int16 sums that need a madd per scale; so a
 * 32-element sub-block costs its 8 vpdpbusd plus one int32 multiply by its
 * scale. Q4_K only (matmul.c dpanel_min). Same exact isum, same fold: the
 * dot kernels' bits. */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#endif

AI void q4k_panel_isum_vnni(const kq_row *w, const ag_panel_q8k *x, const int NR, __m256i *isum) {
    UNROLL for (int r = 0; r < NR; r++) isum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i a[AG_GEMM_RM], b[AG_GEMM_RM];
        UNROLL for (int r = 0; r < NR; r++) a[r] = b[r] = _mm256_setzero_si256();
        UNROLL for (int c = 0; c < 8; c += 2) { /* two chains per row */
            const __m256i y0 = load256a(x->qs[8 * j + c]), y1 = load256a(x->qs[8 * j + c + 1]);
            UNROLL for (int r = 0; r < NR; r++) {
                a[r] = _mm256_dpbusd_epi32(a[r], bcast32(w[r].u + 32 * j + 4 * c), y0);
                b[r] = _mm256_dpbusd_epi32(b[r], bcast32(w[r].u + 32 * j + 4 * c + 4), y1);
            }
        }
        UNROLL for (int r = 0; r < NR; r++)
            isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(_mm256_add_epi32(a[r], b[r]),
                                                                   _mm256_set1_epi32((int16_t)w[r].mul[j])));
    }
}

KQ_PANEL(panel_q4_K_vnni, ag_block_q4_K, q4k_row, q4k_panel_isum_vnni, 1)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* ---- window panels: nr weight rows x np panels of 4 tokens (verify windows) ----
 *
 * As the token panels, with eight bytes of each of four tokens per vector
 * (ag_wpanel_q8k): eight weight bytes, broadcast, times the vector leave
 * each token's four pair sums in its own int16 lanes, and after the madd by
 * the scale two int32 lanes per token, added in the fold. The int16 sums stay
 * exact as in the token panels: Q4_K sums the 4 chunks of a sub-block (4 * 2
 * * 15 * 127), Q6_K the 2 chunks of a 16-element group (2 * 2 * 63 * 127).
 * The fold and its bits are the token panels' (ag_kquant_fold), in four
 * token lanes. Per chunk and row: one broadcast for all np panels, then per
 * panel one maddubs and one add. */

/* Eight bytes at p in every quadword: one vpbroadcastq from memory (a
 * memcpy to int64 and set1 compile to three instructions through a GPR). */
AI __m256i bcast64(const void *p) { return _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p)); }

/* Q4_K's Σ_j sc_j Σ q·y per token (two lanes each), panels 0..NP-1 at once. */
AI void q4k_wpanel_isum(const kq_row *w, const ag_wpanel_q8k *const *x, const int NR, const int NP, __m256i (*isum)[AG_GEMM_RM]) {
    UNROLL for (int p = 0; p < NP; p++) UNROLL for (int r = 0; r < NR; r++) isum[p][r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        __m256i a[2][AG_GEMM_RM];
        UNROLL for (int c = 0; c < 4; c++) {
            __m256i yv[2];
            UNROLL for (int p = 0; p < NP; p++) yv[p] = load256a(x[p]->qs[4 * j + c]);
            UNROLL for (int r = 0; r < NR; r++) {
                const __m256i wv = bcast64(w[r].u + 32 * j + 8 * c);
                UNROLL for (int p = 0; p < NP; p++) {
                    const __m256i m = _mm256_maddubs_epi16(wv, yv[p]);
                    a[p][r] = c ? _mm256_add_epi16(a[p][r], m) : m;
                    CHAIN(a[p][r]);
                }
            }
        }
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256i sc = bcast32(&w[r].mul[j]);
            UNROLL for (int p = 0; p < NP; p++) isum[p][r] = _mm256_add_epi32(isum[p][r], _mm256_madd_epi16(a[p][r], sc));
        }
    }
}

/* Q6_K's Σ_g sc_g Σ q·y per token (q unsigned 0..63), panels 0..NP-1 at once. */
AI void q6k_wpanel_isum(const kq_row *w, const ag_wpanel_q8k *const *x, const int NR, const int NP, __m256i (*isum)[AG_GEMM_RM]) {
    UNROLL for (int p = 0; p < NP; p++) UNROLL for (int r = 0; r < NR; r++) isum[p][r] = _mm256_setzero_si256();
    for (int g = 0; g < 16; g++) {
        __m256i y0[2], y1[2];
        UNROLL for (int p = 0; p < NP; p++) y0[p] = load256a(x[p]->qs[2 * g]), y1[p] = load256a(x[p]->qs[2 * g + 1]);
        UNROLL for (int r = 0; r < NR; r++) {
            const __m256i w0 = bcast64(w[r].u + 16 * g), w1 = bcast64(w[r].u + 16 * g + 8), sc = bcast32(&w[r].mul[g]);
            UNROLL for (int p = 0; p < NP; p++) {
                const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w0, y0[p]), _mm256_maddubs_epi16(w1, y1[p]));
                isum[p][r] = _mm256_add_epi32(isum[p][r], _mm256_madd_epi16(a, sc));
                CHAIN(isum[p][r]);
            }
        }
    }
}

/* Σ_i corr_i · pairs_i per token of a window panel, exact as kq_corr. */
AI __m128i kq_corr4(const int32_t *corr, const int16_t (*pairs)[AG_WPANEL_NT][2], const int N) {
    __m128i s = _mm_madd_epi16(_mm_load_si128((const __m128i *)pairs[0]), _mm_set1_epi32(corr[0]));
    UNROLL for (int i = 1; i < N; i++)
        s = _mm_add_epi32(s, _mm_madd_epi16(_mm_load_si128((const __m128i *)pairs[i]), _mm_set1_epi32(corr[i])));
    return s;
}

/* Stores the four token lanes of nr (1..4) row vectors v (tokens t0.., those
 * below nt) at y[t*ldy + r], transposed as in panel_store. */
AI void wpanel_store(const __m128 *v, const int NR, int64_t t0, int64_t nt, float *y, int64_t ldy) {
    const __m128 z = _mm_setzero_ps();
    __m128       u0 = v[0], u1 = NR > 1 ? v[1] : z, u2 = NR > 2 ? v[2] : z, u3 = NR > 3 ? v[3] : z;
    _MM_TRANSPOSE4_PS(u0, u1, u2, u3); /* u_k: token k's rows */
    const __m128  u[4] = {u0, u1, u2, u3};
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(NR), _mm_setr_epi32(0, 1, 2, 3));
    UNROLL for (int t = 0; t < AG_WPANEL_NT; t++) {
        if (t0 + t >= nt) break;
        if (NR == 4) _mm_storeu_ps(y + (t0 + t) * ldy, u[t]);
        else _mm_maskstore_ps(y + (t0 + t) * ldy, mask, u[t]);
    }
}

/* The window-panel kernel: per super-block the NR rows unpacked once
 * (kq_row), then panels two at a time (so each weight broadcast serves
 * both): the exact isum per token (the two lanes added), Q4_K's msum from
 * bpair, Q6_K's -32 Σ sc · bsums, folded into accumulator s % 4. */
#define KQ_WPANEL(name, BT, ROW, ISUM, Q4K)                                                                       \
    AI void name##_k(int64_t n, const void *w, size_t w_stride, const int NR, const void *xp, size_t xp_stride,  \
                     int np, int64_t nt, float *y, int64_t ldy) {                                                \
        _Alignas(32) float acc[AG_PANEL_MAX_NP][AG_GEMM_RM][4][AG_WPANEL_NT];                                   \
        kq_row             wr[AG_GEMM_RM];                                                                       \
        memset(acc, 0, sizeof(acc[0]) * (size_t)np);                                                             \
        const int64_t nsb = n / AG_QK_K;                                                                         \
        for (int64_t s = 0; s < nsb; s++) {                                                                      \
            prefetch_next_tile(w, (size_t)NR * w_stride, s, nsb);                                                \
            UNROLL for (int r = 0; r < NR; r++) ROW((const BT *)((const uint8_t *)w + (size_t)r * w_stride) + s, &wr[r]); \
            for (int p0 = 0; p0 < np; p0 += 2) {                                                                 \
                const ag_wpanel_q8k *x[2];                                                                       \
                __m256i              isum[2][AG_GEMM_RM];                                                        \
                x[0] = (const ag_wpanel_q8k *)((const uint8_t *)xp + (size_t)p0 * xp_stride) + s;                \
                x[1] = (const ag_wpanel_q8k *)((const uint8_t *)x[0] + xp_stride);                               \
                if (p0 + 1 < np) ISUM(wr, x, NR, 2, isum);                                                       \
                else ISUM(wr, x, NR, 1, isum);                                                                   \
                for (int p = p0; p < np && p < p0 + 2; p++) {                                                    \
                    const ag_wpanel_q8k *xk = x[p - p0];                                                         \
                    const __m128         dy = _mm_load_ps(xk->d);                                                \
                    UNROLL for (int r = 0; r < NR; r++) {                                                        \
                        const __m256i v = isum[p - p0][r];                                                       \
                        __m128i       is = _mm_hadd_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)); \
                        if (!Q4K) is = _mm_sub_epi32(is, _mm_slli_epi32(kq_corr4(wr[r].corr, xk->bsums, 8), 5)); \
                        float *a = acc[p][r][s & 3];                                                             \
                        __m128 f = _mm_fmadd_ps(_mm_mul_ps(dy, _mm_set1_ps(wr[r].d)), _mm_cvtepi32_ps(is), _mm_load_ps(a)); \
                        if (Q4K)                                                                                 \
                            f = _mm_fnmadd_ps(_mm_mul_ps(dy, _mm_set1_ps(wr[r].dmin)),                           \
                                              _mm_cvtepi32_ps(kq_corr4(wr[r].corr, xk->bpair, 4)), f);           \
                        _mm_store_ps(a, f);                                                                      \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int p = 0; p < np; p++) {                                                                           \
            __m128 v[AG_GEMM_RM];                                                                                \
            UNROLL for (int r = 0; r < NR; r++)                                                                  \
                v[r] = _mm_add_ps(_mm_add_ps(_mm_load_ps(acc[p][r][0]), _mm_load_ps(acc[p][r][2])),              \
                                  _mm_add_ps(_mm_load_ps(acc[p][r][1]), _mm_load_ps(acc[p][r][3])));              \
            wpanel_store(v, NR, (int64_t)p * AG_WPANEL_NT, nt, y, ldy);                                          \
        }                                                                                                        \
    }                                                                                                            \
    PANEL_DISPATCH(name)

KQ_WPANEL(wpanel_q4_K, ag_block_q4_K, q4k_row, q4k_wpanel_isum, 1)
KQ_WPANEL(wpanel_q6_K, ag_block_q6_K, q6k_row, q6k_wpanel_isum, 0)

/* Legacy types: the unsigned form u of each weight (Q4_0: q + 8, Q5_0:
 * q + 16, Q4_1/Q5_1: q itself); the signed types take OFF·Σy back out. */
AI __m256i pu_nib(const uint8_t *qs) { return unpack_nib16(qs); }
AI __m256i pu_5bit(const uint8_t *qh, const uint8_t *qs) {
    return _mm256_or_si256(unpack_nib16(qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
}
AI __m256i pu_q4_0(const ag_block_q4_0 *b) { return pu_nib(b->qs); }
AI __m256i pu_q4_1(const ag_block_q4_1 *b) { return pu_nib(b->qs); }
AI __m256i pu_q5_0(const ag_block_q5_0 *b) { return pu_5bit(b->qh, b->qs); }
AI __m256i pu_q5_1(const ag_block_q5_1 *b) { return pu_5bit(b->qh, b->qs); }
AI float   pm_none(const void *b) { (void)b; return 0.0f; }
AI float   pm_q4_1(const ag_block_q4_1 *b) { return f16(b->m); }
AI float   pm_q5_1(const ag_block_q5_1 *b) { return f16(b->m); }

/* Eight blocks of one weight row, unpacked. */
#define LG_GROUP 8
typedef struct {
    _Alignas(32) uint8_t u[LG_GROUP][AG_QK];
    float d[LG_GROUP], m[LG_GROUP];
} lg_row;

/* BT: block type; PU: its unsigned form; PM: its m (offset types);
 * LOG2_OFF: log2 of the offset (0: none); CH: chunks summed in int16.
 * Per group of up to 8 blocks and per panel: first every block's exact
 * Σ u·y for the NR rows (kept in ib), then per row the float fold in block
 * order, so neither part crowds the other's registers. */
/* MXFP4: u = v + 16 (4..28), the doubled E2M1 table shifted by 16 */
AI __m256i pu_mxfp4(const ag_block_mxfp4 *b) {
    const __m256i lut = _mm256_add_epi8(_mm256_broadcastsi128_si256(loadu128(ag_mxfp4_values)), _mm256_set1_epi8(16));
    return _mm256_shuffle_epi8(lut, unpack_nib16(b->qs));
}
#define LG_WD_F16(b) f16((b).d)
#define LG_WD_E8M0(b) ag_e8m0_half((b).e)
#define LG_PANEL(name, BT, PU, PM, LOG2_OFF, HAS_M, CH) LG_PANELX(name, BT, PU, PM, LOG2_OFF, HAS_M, CH, LG_WD_F16, same8)
/* WD: a block's weight scale; YD: what the activations' scales go through */
#define LG_PANELX(name, BT, PU, PM, LOG2_OFF, HAS_M, CH, WD, YD)                                                  \
    AI void name##_k(int64_t n, const void *w, size_t w_stride, const int NR, const void *xp, size_t xp_stride,  \
                     int np, int64_t nt, float *y, int64_t ldy) {                                                \
        _Alignas(32) float   acc[AG_PANEL_MAX_NP][AG_GEMM_RM][AG_PANEL_NT];                                     \
        _Alignas(32) int32_t ib[LG_GROUP][AG_GEMM_RM][AG_PANEL_NT];                                             \
        lg_row               wr[AG_GEMM_RM];                                                                     \
        memset(acc, 0, sizeof(acc[0]) * (size_t)np);                                                             \
        const __m256i ones = _mm256_set1_epi16(1);                                                               \
        const int64_t nb = n / AG_QK;                                                                            \
        for (int64_t i0 = 0; i0 < nb; i0 += LG_GROUP) {                                                          \
            const int kn = nb - i0 < LG_GROUP ? (int)(nb - i0) : LG_GROUP;                                       \
            UNROLL for (int r = 0; r < NR; r++) {                                                                \
                const BT *b = (const BT *)((const uint8_t *)w + (size_t)r * w_stride) + i0;                      \
                for (int k = 0; k < kn; k++) {                                                                   \
                    _mm256_store_si256((__m256i *)wr[r].u[k], PU(&b[k]));                                        \
                    wr[r].d[k] = WD(b[k]);                                                                       \
                    wr[r].m[k] = PM(&b[k]);                                                                      \
                }                                                                                                \
            }                                                                                                    \
            for (int p = 0; p < np; p++) {                                                                       \
                const ag_panel_q8a *x = (const ag_panel_q8a *)((const uint8_t *)xp + (size_t)p * xp_stride) + i0; \
                for (int k = 0; k < kn; k++) {                                                                   \
                    __m256i s32[AG_GEMM_RM];                                                                     \
                    UNROLL for (int c0 = 0; c0 < 8; c0 += CH) {                                                  \
                        __m256i a[AG_GEMM_RM];                                                                   \
                        UNROLL for (int c = c0; c < c0 + CH; c++) {                                              \
                            const __m256i yv = load256a(x[k].qs[c]);                                             \
                            UNROLL for (int r = 0; r < NR; r++) {                                                \
                                const __m256i p16 = _mm256_maddubs_epi16(bcast32(wr[r].u[k] + 4 * c), yv);       \
                                a[r] = c > c0 ? _mm256_add_epi16(a[r], p16) : p16;                               \
                                CHAIN(a[r]);                                                                     \
                            }                                                                                    \
                        }                                                                                        \
                        UNROLL for (int r = 0; r < NR; r++) {                                                    \
                            const __m256i m32 = _mm256_madd_epi16(a[r], ones);                                   \
                            s32[r] = c0 ? _mm256_add_epi32(s32[r], m32) : m32;                                   \
                        }                                                                                        \
                    }                                                                                            \
                    UNROLL for (int r = 0; r < NR; r++) _mm256_store_si256((__m256i *)ib[k][r], s32[r]);         \
                }                                                                                                \
                UNROLL for (int r = 0; r < NR; r++) {                                                            \
                    __m256 av = _mm256_load_ps(acc[p][r]);                                                       \
                    for (int k = 0; k < kn; k++) {                                                               \
                        __m256i s32 = load256a(ib[k][r]);                                                        \
                        if (LOG2_OFF) s32 = _mm256_sub_epi32(s32, _mm256_slli_epi32(load256a(x[k].sum), LOG2_OFF)); \
                        av = _mm256_fmadd_ps(_mm256_mul_ps(YD(_mm256_load_ps(x[k].d)), _mm256_set1_ps(wr[r].d[k])), \
                                             _mm256_cvtepi32_ps(s32), av);                                       \
                        if (HAS_M) av = _mm256_fmadd_ps(_mm256_set1_ps(wr[r].m[k]), _mm256_load_ps(x[k].s), av); \
                    }                                                                                            \
                    _mm256_store_ps(acc[p][r], av);                                                              \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
        for (int p = 0; p < np; p++) {                                                                           \
            __m256 v[AG_GEMM_RM];                                                                                \
            UNROLL for (int r = 0; r < NR; r++) v[r] = _mm256_load_ps(acc[p][r]);                                \
            panel_store(v, NR, (int64_t)p * AG_PANEL_NT, nt, y, ldy);                                            \
        }                                                                                                        \
    }                                                                                                            \
    PANEL_DISPATCH(name)

LG_PANEL(panel_q4_0, ag_block_q4_0, pu_q4_0, pm_none, 3, 0, 8)
LG_PANEL(panel_q5_0, ag_block_q5_0, pu_q5_0, pm_none, 4, 0, 4)
LG_PANEL(panel_q4_1, ag_block_q4_1, pu_q4_1, pm_q4_1, 0, 1, 8)
LG_PANEL(panel_q5_1, ag_block_q5_1, pu_q5_1, pm_q5_1, 0, 1, 4)
/* (u <= 28: four chunks of maddubs pairs stay below int16 saturation, as Q5_0's) */
LG_PANELX(panel_mxfp4, ag_block_mxfp4, pu_mxfp4, pm_none, 4, 0, 4, LG_WD_E8M0, f16_round8)

/* ---- float weights, float activations ---- */

#define FLOAT_KERNEL(name, ESZ, WLOAD, WSCALAR)                                                    \
    AI void name##_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX,      \
                     float *out) {                                                               \
        const uint8_t *wb = w;                                                                   \
        const float   *y[AG_DOT_MAX_NX];                                                         \
        __m256         acc0[AG_DOT_MAX_NX], acc1[AG_DOT_MAX_NX];                                 \
        UNROLL for (int t = 0; t < NX; t++) {                                                    \
            y[t] = (const float *)YROW(t);                                                       \
            acc0[t] = acc1[t] = _mm256_setzero_ps();                                             \
        }                                                                                        \
        int64_t i = 0;                                                                           \
        for (; i + 16 <= n; i += 16) {                                                           \
            __m256 w0 = WLOAD(wb + ESZ * i), w1 = WLOAD(wb + ESZ * (i + 8));                     \
            UNROLL for (int t = 0; t < NX; t++) {                                                       \
                acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y[t] + i), acc0[t]);           \
                acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y[t] + i + 8), acc1[t]);       \
            }                                                                                    \
        }                                                                                        \
        for (; i + 8 <= n; i += 8) {                                                             \
            __m256 w0 = WLOAD(wb + ESZ * i);                                                     \
            UNROLL for (int t = 0; t < NX; t++)                                                         \
                acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y[t] + i), acc0[t]);           \
        }                                                                                        \
        UNROLL for (int t = 0; t < NX; t++) {                                                           \
            float s = hsum8(_mm256_add_ps(acc0[t], acc1[t]));                                \
            for (int64_t j = i; j < n; j++) s += WSCALAR(wb + ESZ * j) * wscalar_f32((const uint8_t *)(y[t] + j)); \
            out[t] = s;                                                                          \
        }                                                                                        \
    }                                                                                            \
    AG_DOT_DISPATCH(name)

FLOAT_KERNEL(dot_f32, 4, wload_f32, wscalar_f32)
FLOAT_KERNEL(dot_f16, 2, wload_f16, wscalar_f16)
FLOAT_KERNEL(dot_bf16, 2, wload_bf16, wscalar_bf16)

/* ---- activation quantization (bit-identical to the scalar code) ---- */

/* 32 floats -> 32 int8 (round to nearest even, as nearbyintf) times id;
 * returns Σq. */
AI int quant32(const float *x, __m256 id, int8_t *q) {
    __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i v2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i v3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    int     sum = hsum8_i32(_mm256_add_epi32(_mm256_add_epi32(v0, v1), _mm256_add_epi32(v2, v3)));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
    /* the packs interleave 128-bit lanes: restore element order */
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return sum;
}

AI __m256 absmax8(__m256 m, const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x)));
}

AI float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void quant_q8a(const float *x, void *dst, int64_t n) {
    ag_block_q8a *b = dst;
    for (int64_t i = 0; i < n / AG_QK; i++, x += AG_QK) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < AG_QK; j += 8) m = absmax8(m, x + j);
        float d = hmax8(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t q[AG_QK];
        int    sum = quant32(x, _mm256_set1_ps(id), q);
        memcpy(b[i].qs, q, AG_QK);
        b[i].d = d;
        b[i].s = d * (float)sum;
    }
}

static void quant_q8k(const float *x, void *dst, int64_t n) {
    ag_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / AG_QK_K; i++, x += AG_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < AG_QK_K; j += 8) m = absmax8(m, x + j);
        float  d = hmax8(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        int8_t q[AG_QK_K];
        for (int j = 0; j < AG_QK_K; j += 32) quant32(x + j, idv, q + j);
        memcpy(b[i].qs, q, AG_QK_K);
        for (int k = 0; k < 16; k++)
            b[i].bsums[k] = (int16_t)hsum8_i32(
                _mm256_madd_epi16(_mm256_cvtepi8_epi16(loadu128(q + 16 * k)), _mm256_set1_epi16(1)));
        b[i].d = d;
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Compiled for the baseline target: it runs before any ISA check matters. */
void ag_quant_kernels_avx2(ag_quant_kernels *k) {
    k->dot[AG_TYPE_F32] = dot_f32;
    k->dot[AG_TYPE_F16] = dot_f16;
    k->dot[AG_TYPE_BF16] = dot_bf16;
    k->dot[AG_TYPE_Q4_0] = dot_q4_0;
    k->dot[AG_TYPE_Q4_1] = dot_q4_1;
    k->dot[AG_TYPE_Q5_0] = dot_q5_0;
    k->dot[AG_TYPE_Q5_1] = dot_q5_1;
    k->dot[AG_TYPE_Q8_0] = dot_q8_0;
    k->dot[AG_TYPE_MXFP4] = dot_mxfp4;
    k->dot[AG_TYPE_Q2_K] = dot_q2_K;
    k->dot[AG_TYPE_Q3_K] = dot_q3_K;
    k->dot[AG_TYPE_Q4_K] = dot_q4_K;
    k->dot[AG_TYPE_Q5_K] = dot_q5_K;
    k->dot[AG_TYPE_Q6_K] = dot_q6_K;
    k->panel[AG_TYPE_Q4_0] = panel_q4_0;
    k->panel[AG_TYPE_Q4_1] = panel_q4_1;
    k->panel[AG_TYPE_Q5_0] = panel_q5_0;
    k->panel[AG_TYPE_Q5_1] = panel_q5_1;
    k->panel[AG_TYPE_MXFP4] = panel_mxfp4;
    k->panel[AG_TYPE_Q4_K] = panel_q4_K;
    k->panel[AG_TYPE_Q6_K] = panel_q6_K;
    k->wpanel[AG_TYPE_Q4_K] = wpanel_q4_K;
    k->wpanel[AG_TYPE_Q6_K] = wpanel_q6_K;
    k->quant_q8a = quant_q8a;
    k->quant_q8k = quant_q8k;
}

/* The Q4_K token panels on AVX-512 VNNI (see panel_q4_K_vnni; a Q6_K
 * variant did not beat the dot kernels: matmul.c dpanel_min). */
void ag_quant_panels_vnni(ag_quant_kernels *k) { k->dpanel[AG_TYPE_Q4_K] = panel_q4_K_vnni; }

#else /* not x86 */

void ag_quant_kernels_avx2(ag_quant_kernels *k) { (void)k; }
void ag_quant_panels_vnni(ag_quant_kernels *k) { (void)k; }

#endif
