/* Internal to src/backend/cpu: AVX2-level helpers shared by the SIMD kernel
 * files. Include it only after the file's `#pragma GCC target` /
 * `#pragma clang attribute push`, so that these inline functions get the
 * file's target (and never run on a CPU without it). */
#ifndef AG_BACKEND_CPU_QUANT_X86_H
#define AG_BACKEND_CPU_QUANT_X86_H

#include <immintrin.h>

#include "backend/cpu/quant_impl.h"

#define AI static inline __attribute__((always_inline))

/* Loops over tokens (NX is a compile-time constant after inlining) and over
 * the few sub-blocks of a K-quant block must unroll completely, or the
 * accumulator arrays live on the stack instead of in registers; -O2 alone
 * does not do it. */
#define UNROLL _Pragma("GCC unroll 8")

AI float f16(uint16_t h) { return _cvtsh_ss(h); }

AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI int hsum8_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

AI __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
AI __m128i loadu128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Σ of 4 adjacent u8*s8 products per int32 lane. Pairs stay below the int16
 * saturation of maddubs as long as u <= 63 and |s| <= 127 (63*127*2 < 32767). */
AI __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* u8*s8 products summed in pairs, then multiplied by per-16-element int16
 * scales: lanes 0..7 (elements 0..15) by lo, 8..15 (elements 16..31) by hi. */
AI __m256i dot_u8s8_scaled(__m256i u, __m256i s, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}
AI __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

/* 16 packed nibbles -> 32 bytes: low nibbles are elements 0..15, high 16..31. */
AI __m256i unpack_nib16(const uint8_t *qs) {
    __m128i v = loadu128(qs), m = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* The 32 bits of qh as 32 bytes: 0xFF where bit j is set. */
AI __m256i bits_to_bytes(const uint8_t *qh) {
    uint32_t x;
    memcpy(&x, qh, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                          2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i       v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

#define YROW(t) ((const uint8_t *)x + (size_t)(t) * x_stride)

/* Instantiates kernel body K for nx = 1..4 so that the token loops unroll and
 * the accumulators live in registers. */
#define AG_DOT_DISPATCH(name)                                                                     \
    static void name(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) { \
        switch (nx) {                                                                            \
        case 1: name##_k(n, w, x, x_stride, 1, out); break;                                      \
        case 2: name##_k(n, w, x, x_stride, 2, out); break;                                      \
        case 3: name##_k(n, w, x, x_stride, 3, out); break;                                      \
        default: name##_k(n, w, x, x_stride, 4, out); break;                                     \
        }                                                                                        \
    }

/* How far ahead (bytes) the dot kernels prefetch the weight stream:
 * a decode matvec streams its weights from DRAM, and a group's first touch
 * (its scale loads) otherwise waits for each line; prefetch does not fault,
 * so reading past the row (into the next one, usually) is harmless. */
#ifndef AG_PF_DIST
#define AG_PF_DIST 2048
#endif

/* The row loop of the legacy types' dot kernels, shared by the AVX2 and
 * AVX-512 files (each defines name##_grp, one group of up to 8 blocks, for
 * its ISA): whole groups, then a partial last one (KN 7, kn blocks); the
 * even/odd accumulators summed, then the offset types' m*s sum added. The
 * two files' kernels give the same bits through this one loop. */
#define AG_LEGACY_DOT_ROWS(name, BT, HAS_M)                                                            \
    AI void name##_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX, float *out) { \
        const BT           *b = w;                                                                      \
        const ag_block_q8a *y[AG_DOT_MAX_NX];                                                           \
        __m256              acc[AG_DOT_MAX_NX][2];                                                      \
        float               sm[AG_DOT_MAX_NX];                                                          \
        UNROLL for (int t = 0; t < NX; t++) {                                                           \
            y[t] = (const ag_block_q8a *)YROW(t);                                                       \
            acc[t][0] = acc[t][1] = _mm256_setzero_ps();                                                \
            sm[t] = 0.0f;                                                                               \
        }                                                                                               \
        const int64_t nb = n / AG_QK;                                                                   \
        int64_t       i = 0;                                                                            \
        for (; i + 8 <= nb; i += 8) name##_grp(b, y, i, 8, 8, NX, acc, sm);                           \
        if (i < nb) name##_grp(b, y, i, 7, (int)(nb - i), NX, acc, sm);                              \
        UNROLL for (int t = 0; t < NX; t++) {                                                           \
            __m256 s = _mm256_add_ps(acc[t][0], acc[t][1]);                                             \
            out[t] = HAS_M ? hsum8(s) + sm[t] : hsum8(s);                                               \
        }                                                                                               \
    }                                                                                                   \
    AG_DOT_DISPATCH(name)

/* ---- weight blocks as 32 int8 / uint8 ---- */

/* Q6_K: the six-bit values (0..63, before the -32 offset) of one half (128
 * elements) of a block, from ql[64h..64h+63] and qh[32h..32h+31]: g[k] holds
 * elements 128h + 32k .. 128h + 32k + 31 (llama.cpp's q1..q4 order). */
AI void q6k_unpack_half(const uint8_t *ql, const uint8_t *qh, __m256i g[4]) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    const __m256i ql0 = loadu256(ql), ql1 = loadu256(ql + 32), h = loadu256(qh);
    g[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
    g[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
    g[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
    g[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
}

AI __m256i wq_q4_0(const ag_block_q4_0 *b) { return _mm256_sub_epi8(unpack_nib16(b->qs), _mm256_set1_epi8(8)); }
AI __m256i wq_q5_0(const ag_block_q5_0 *b) {
    /* ql - 16 where the high bit is clear is ql | 0xF0 in two's complement */
    __m256i hb = bits_to_bytes(b->qh);
    return _mm256_or_si256(unpack_nib16(b->qs), _mm256_andnot_si256(hb, _mm256_set1_epi8((char)0xF0)));
}
AI __m256i wq_q8_0(const ag_block_q8_0 *b) { return loadu256(b->qs); }
/* MXFP4: each nibble looked up in the doubled E2M1 table (one pshufb) */
AI __m256i wq_mxfp4(const ag_block_mxfp4 *b) {
    const __m256i lut = _mm256_broadcastsi128_si256(loadu128(ag_mxfp4_values));
    return _mm256_shuffle_epi8(lut, unpack_nib16(b->qs));
}

AI __m256i wq_q4_1(const ag_block_q4_1 *b) { return unpack_nib16(b->qs); }
AI __m256i wq_q5_1(const ag_block_q5_1 *b) {
    __m256i hb = bits_to_bytes(b->qh);
    return _mm256_or_si256(unpack_nib16(b->qs), _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
}


/* Σ_j mins[j] * (bsums[2j] + bsums[2j+1]) for the 8 32-element sub-blocks,
 * as 4 int32 lanes (bsum pairs <= 32*127 fit int16). */
AI __m128i k4_min_dot(const ag_block_q8_K *y, __m128i mins16) {
    __m128i bs = _mm_hadd_epi16(loadu128(y->bsums), loadu128(y->bsums + 8));
    return _mm_madd_epi16(bs, mins16);
}

AI __m256 wload_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
AI __m256 wload_f16(const uint8_t *p) { return _mm256_cvtph_ps(loadu128(p)); }
AI __m256 wload_bf16(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128(p)), 16));
}
AI float wscalar_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
AI float wscalar_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16(h);
}
AI float wscalar_bf16(const uint8_t *p) {
    uint32_t v = 0;
    memcpy((uint8_t *)&v + 2, p, 2);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

#endif
