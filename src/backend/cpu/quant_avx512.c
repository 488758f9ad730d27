/* AVX-512 (F/BW/VL/VNNI) kernels, only where they measured faster than the
 * AVX2 ones; every other entry keeps its AVX2 kernel (the table starts as
 * the AVX2 one).
 *
 * Every dot kernel runs the same per-token arithmetic for every nx, so that
 * a token's result is bit-identical whether it is alone in the call or one
 * lane of a 2..4-token call (test_quant: dot_batch_invariant); a request's
 * greedy output then does not depend on the batch it decodes in.
 *
 *  - legacy types: groups of 8 blocks, scales gathered and converted 8 at a
 *    time, one 256-bit VNNI vpdpbusd per block and token, weight stream
 *    prefetched (bench/quant_bench --ab on a 2-core AVX-512 VNNI VM, nx = 1:
 *    Q4_1 hot 6.2 -> ~10-11 GB/s, cold ~4.8 -> ~8, at the machine's read
 *    bandwidth). Two blocks per zmm measured slower (Q8_0 hot -25%);
 *  - Q4_K, Q6_K: 64 elements per zmm step, maddubs + VNNI vpdpwssd, prefetch;
 *  - F32/F16: 16 lanes.
 * The VNNI GEMM tiles (*_gemm) are separate, opt-in in matmul.c.
 * The integer block sums stay exact; results match the scalar reference to
 * float summation order. */
#include <stdlib.h>

#include "backend/cpu/quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include "backend/cpu/quant_x86.h"
#include "base/switches.h"

AI __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }
AI __m512i pair_si(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
/* [a x8 | b x8] */
AI __m512 pair_ps(float a, float b) {
    return _mm512_mask_blend_ps((__mmask16)0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

/* ---- legacy types: dot kernels, 8 blocks per group ----
 *
 * Every nx runs the same per-token arithmetic (a token's result must not
 * depend on the batch it shares a call with; test_quant checks it bit for
 * bit). Per group of 8 blocks the fp16 weight scales (and minimums) and the
 * activations' d (and s) are gathered and converted 8 at a time, so the
 * per-block work is the unpack, one vpdpbusd (exact int32), one cvt, one
 * vpermps of the block's scale and one FMA into one of two accumulators
 * (even/odd block). The offset types' m*s terms are one vector FMA per
 * group. The last group is partial: masked gathers (lanes past the row are
 * not read) and a shorter block loop.
 *
 * The float arithmetic is exactly the AVX2 kernels' (quant_avx2.c): the same
 * int32 lanes, scale products, even/odd accumulators and final sums, and the
 * offset types' m*s products (rounded, not fused) added one block at a time
 * in block order. So the two ISA levels give bit-identical results for these
 * types. It matters more than it looks: summing m*s in 8 lanes with FMAs
 * moved SmolLM2-135M's top-2 logit margin on a chat prompt by ~0.4 and
 * flipped its greedy answer. */

/* Byte offsets of 8 consecutive blocks of size BS. */
AI __m256i blk_offsets(int bs) { return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bs)); }
/* The fp16 at byte offset 0 (hi = 0) or 2 (hi = 1) of kn (1..8) blocks, as floats. */
AI __m256 gather_f16(const void *b, __m256i off, __mmask8 km, const int HI) {
    __m256i v = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), km, off, b, 1);
    if (HI) v = _mm256_srli_epi32(v, 16);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
}
AI __m256 gather_f32(const void *p, __m256i off, __mmask8 km) {
    return _mm256_mmask_i32gather_ps(_mm256_setzero_ps(), km, off, p, 1);
}

/* The weights of one block as 32 bytes: unsigned u (offset types) or signed
 * q (SIGNED types). */
AI __m256i nib16(const uint8_t *qs) {
    __m256i v = _mm256_broadcastsi128_si256(loadu128(qs));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0xF));
}
AI __m256i w8_q4_0(const ag_block_q4_0 *b) { return _mm256_sub_epi8(nib16(b->qs), _mm256_set1_epi8(8)); }
AI __m256i w8_q4_1(const ag_block_q4_1 *b) { return nib16(b->qs); }
AI __m256i w8_q5_0(const ag_block_q5_0 *b) {
    /* ql - 16 where the high bit is clear */
    uint32_t h;
    memcpy(&h, b->qh, 4);
    __m256i v = nib16(b->qs);
    return _mm256_mask_sub_epi8(v, _cvtu32_mask32(~h), v, _mm256_set1_epi8(16));
}
AI __m256i w8_q5_1(const ag_block_q5_1 *b) {
    uint32_t h;
    memcpy(&h, b->qh, 4);
    __m256i v = nib16(b->qs);
    return _mm256_mask_add_epi8(v, _cvtu32_mask32(h), v, _mm256_set1_epi8(16));
}
AI __m256i w8_q8_0(const ag_block_q8_0 *b) { return loadu256(b->qs); }

/* The E8M0 scales of kn (1..8) MXFP4 blocks, as gather_f16 gives fp16 ones. */
AI __m256 e8m0_lanes512(const void *b, __m256i off, __mmask8 km) {
    float v[8];
    UNROLL for (int k = 0; k < 8; k++)
        v[k] = (km >> k) & 1 ? ag_e8m0_half(((const uint8_t *)b)[k * sizeof(ag_block_mxfp4)]) : 0.0f;
    (void)off;
    return _mm256_loadu_ps(v);
}
AI __m256 f16_lanes512(const void *b, __m256i off, __mmask8 km) { return gather_f16(b, off, km, 0); }
AI __m256i w8_mxfp4(const ag_block_mxfp4 *b) {
    const __m256i lut = _mm256_broadcastsi128_si256(loadu128(ag_mxfp4_values));
    return _mm256_shuffle_epi8(lut, nib16(b->qs));
}

AI __m256 same8_512(__m256 v) { return v; }
AI __m256 f16_round8_512(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }

/* DWL: the weight scales' loader (fp16, or E8M0 for MXFP4); YD: what the
 * activations' scales go through (MXFP4: rounded through fp16, as quant.c's
 * dot_mxfp4) */
#define LEGACY512(name, BT, W8, SIGNED, HAS_M, DWL, YD)                                                 \
    AI void name##_grp(const BT *b, const ag_block_q8a *const *y, int64_t i0, const int KN, int kn,      \
                       const int NX, __m256 (*acc)[2], float *sm) {                                   \
        const __mmask8 km = (__mmask8)((1u << kn) - 1);                                                 \
        const __m256i  woff = blk_offsets(sizeof(BT)), yoff = blk_offsets(sizeof(ag_block_q8a));       \
        UNROLL for (int o = 0; o < (int)(8 * sizeof(BT)); o += 64)                                      \
            _mm_prefetch((const char *)&b[i0] + AG_PF_DIST + o, _MM_HINT_T0);                           \
        const __m256   dw = DWL(&b[i0], woff, km);                                                      \
        __m256         sc[AG_DOT_MAX_NX];                                                               \
        UNROLL for (int t = 0; t < NX; t++) sc[t] = _mm256_mul_ps(dw, YD(gather_f32(&y[t][i0].d, yoff, km))); \
        if (HAS_M) {                                                                                    \
            const __m256 mw = gather_f16(&b[i0], woff, km, 1);                                          \
            UNROLL for (int t = 0; t < NX; t++) {                                                       \
                float ms[8];                                                                            \
                _mm256_storeu_ps(ms, _mm256_mul_ps(mw, gather_f32(&y[t][i0].s, yoff, km)));             \
                for (int k = 0; k < kn; k++) sm[t] += ms[k];                                            \
            }                                                                                           \
        }                                                                                               \
        UNROLL for (int k = 0; k < KN; k++) {                                                           \
            if (k >= kn) break;                                                                         \
            const __m256i q = W8(&b[i0 + k]);                                                           \
            const __m256i u = SIGNED ? _mm256_sign_epi8(q, q) : q;                                      \
            const __m256i kk = _mm256_set1_epi32(k);                                                    \
            UNROLL for (int t = 0; t < NX; t++) {                                                       \
                __m256i yv = loadu256(y[t][i0 + k].qs);                                                 \
                if (SIGNED) yv = _mm256_sign_epi8(yv, q);                                               \
                __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, yv);                          \
                acc[t][k & 1] = _mm256_fmadd_ps(_mm256_permutexvar_ps(kk, sc[t]), _mm256_cvtepi32_ps(p), \
                                                acc[t][k & 1]);                                         \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    AG_LEGACY_DOT_ROWS(name, BT, HAS_M)

LEGACY512(dot_q4_0, ag_block_q4_0, w8_q4_0, 1, 0, f16_lanes512, same8_512)
LEGACY512(dot_q5_0, ag_block_q5_0, w8_q5_0, 1, 0, f16_lanes512, same8_512)
LEGACY512(dot_q8_0, ag_block_q8_0, w8_q8_0, 1, 0, f16_lanes512, same8_512)
LEGACY512(dot_q4_1, ag_block_q4_1, w8_q4_1, 0, 1, f16_lanes512, same8_512)
LEGACY512(dot_q5_1, ag_block_q5_1, w8_q5_1, 0, 1, f16_lanes512, same8_512)
LEGACY512(dot_mxfp4, ag_block_mxfp4, w8_mxfp4, 1, 0, e8m0_lanes512, f16_round8_512)


/* ---- legacy types: AG_GEMM_RM rows x NX tokens tiles ----
 *
 * The weights enter vpdpbusd as unsigned bytes u = q + OFF (OFF = 8 for
 * Q4_0, 16 for Q5_0, 128 for Q8_0: just the stored bits, or q ^ 0x80; 0 for
 * the offset types, whose q is unsigned already), so no per-token sign
 * moving is needed: Σ u*y = Σ q*y + OFF*Σy, and each token's int32
 * accumulator starts at -OFF*Σy (one vpdpbusd per token and block pair,
 * shared by the RM rows). All of it is exact int32 (|Σ| <= 4*255*128 per
 * lane step). Per block pair a row costs one unpack, a token one load, and a
 * (row, token) pair vpdpbusd + cvt + mul + fma. The offset types' m*s term
 * goes into the same accumulator as (m/8)*s on each of the block's 8 lanes
 * (scaling by 1/8 is exact), so it needs no scalar work. */
AI __m256i wu_q4_0(const ag_block_q4_0 *b) { return unpack_nib16(b->qs); }
AI __m256i wu_q5_0(const ag_block_q5_0 *b) {
    return _mm256_or_si256(unpack_nib16(b->qs), _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10)));
}
AI __m256i wu_q8_0(const ag_block_q8_0 *b) { return _mm256_xor_si256(loadu256(b->qs), _mm256_set1_epi8((char)0x80)); }
AI __m512i zext256(__m256i v) { return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0); }

/* Two blocks' 16 nibble bytes -> 64 bytes [b0 lo, b0 hi, b1 lo, b1 hi] (the
 * element order of pair_si of two unpack_nib16), with one shift for both. */
AI __m512i nib_pair(const uint8_t *qs0, const uint8_t *qs1) {
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(loadu128(qs0))),
                                   _mm256_broadcastsi128_si256(loadu128(qs1)), 1);
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(0xF));
}
/* Two blocks' 32-bit qh as a mask over the 64 bytes of a pair. */
AI __mmask64 qh_pair(const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t a, b;
    memcpy(&a, qh0, 4);
    memcpy(&b, qh1, 4);
    return _cvtu64_mask64((uint64_t)a | (uint64_t)b << 32);
}
AI __m512i wu2_q4_0(const ag_block_q4_0 *b0, const ag_block_q4_0 *b1) { return nib_pair(b0->qs, b1->qs); }
AI __m512i wu2_q4_1(const ag_block_q4_1 *b0, const ag_block_q4_1 *b1) { return nib_pair(b0->qs, b1->qs); }
AI __m512i wu2_q5_0(const ag_block_q5_0 *b0, const ag_block_q5_0 *b1) {
    __m512i v = nib_pair(b0->qs, b1->qs);
    return _mm512_mask_add_epi8(v, qh_pair(b0->qh, b1->qh), v, _mm512_set1_epi8(0x10));
}
AI __m512i wu2_q5_1(const ag_block_q5_1 *b0, const ag_block_q5_1 *b1) {
    __m512i v = nib_pair(b0->qs, b1->qs);
    return _mm512_mask_add_epi8(v, qh_pair(b0->qh, b1->qh), v, _mm512_set1_epi8(0x10));
}
AI __m512i wu2_q8_0(const ag_block_q8_0 *b0, const ag_block_q8_0 *b1) { return pair_si(wu_q8_0(b0), wu_q8_0(b1)); }

/* WD: a block's weight scale (fp16 d, or MXFP4's E8M0); YDS: what the
 * activations' scale goes through (itself, or MXFP4's fp16 rounding) */
#define GEMM_WD_F16(b) f16((b).d)
#define GEMM_WD_E8M0(b) ag_e8m0_half((b).e)
#define GEMM_YD_SAME(d) (d)
#define GEMM_YD_F16(d) _cvtsh_ss(_cvtss_sh((d), _MM_FROUND_TO_NEAREST_INT))
#define GEMM512(name, BT, WU, WU2, OFF, HAS_M) GEMM512X(name, BT, WU, WU2, OFF, HAS_M, GEMM_WD_F16, GEMM_YD_SAME)
#define GEMM512X(name, BT, WU, WU2, OFF, HAS_M, WD, YDS)                                                    \
    AI void name##_gstep(const BT *const *b, const ag_block_q8a *const *y, int64_t i, const int NX,     \
                         const int TWO, __m512 acc[AG_GEMM_RM][AG_DOT_MAX_NX]) {                       \
        __m512i wu[AG_GEMM_RM];                                                                        \
        __m512  wd[AG_GEMM_RM], wm[AG_GEMM_RM];                                                        \
        UNROLL for (int r = 0; r < AG_GEMM_RM; r++) {                                                  \
            wu[r] = TWO ? WU2(&b[r][i], &b[r][i + 1]) : zext256(WU(&b[r][i]));                       \
            wd[r] = pair_ps(WD(b[r][i]), TWO ? WD(b[r][i + 1]) : 0.0f);                                \
            wm[r] = HAS_M ? pair_ps(GEMM_M(b[r], i) * 0.125f, TWO ? GEMM_M(b[r], i + 1) * 0.125f : 0.0f) \
                          : _mm512_setzero_ps();                                                       \
        }                                                                                              \
        UNROLL for (int t = 0; t < NX; t++) {                                                          \
            const __m512i yv = TWO ? pair_si(loadu256(y[t][i].qs), loadu256(y[t][i + 1].qs))           \
                                   : zext256(loadu256(y[t][i].qs));                                    \
            const __m512  yd = pair_ps(YDS(y[t][i].d), TWO ? YDS(y[t][i + 1].d) : 0.0f);                \
            const __m512i c0 = OFF ? _mm512_sub_epi32(_mm512_setzero_si512(),                          \
                                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(),      \
                                                                          _mm512_set1_epi8((char)OFF), yv)) \
                                   : _mm512_setzero_si512();                                           \
            const __m512 ys = HAS_M ? pair_ps(y[t][i].s, TWO ? y[t][i + 1].s : 0.0f) : _mm512_setzero_ps(); \
            UNROLL for (int r = 0; r < AG_GEMM_RM; r++) {                                              \
                __m512i p = _mm512_dpbusd_epi32(c0, wu[r], yv);                                        \
                acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(wd[r], yd), _mm512_cvtepi32_ps(p), acc[r][t]); \
                if (HAS_M) acc[r][t] = _mm512_fmadd_ps(wm[r], ys, acc[r][t]);                          \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    AI void name##_gk(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,        \
                      const int NX, float *out, int64_t ldy) {                                         \
        const BT           *b[AG_GEMM_RM];                                                             \
        const ag_block_q8a *y[AG_DOT_MAX_NX];                                                          \
        __m512              acc[AG_GEMM_RM][AG_DOT_MAX_NX];                                            \
        UNROLL for (int r = 0; r < AG_GEMM_RM; r++) {                                                  \
            b[r] = (const BT *)((const uint8_t *)w + (size_t)r * w_stride);                            \
            UNROLL for (int t = 0; t < NX; t++) acc[r][t] = _mm512_setzero_ps();                       \
        }                                                                                              \
        UNROLL for (int t = 0; t < NX; t++) y[t] = (const ag_block_q8a *)YROW(t);                      \
        const int64_t nb = n / AG_QK;                                                                  \
        int64_t       i = 0;                                                                           \
        for (; i + 2 <= nb; i += 2) name##_gstep(b, y, i, NX, 1, acc);                                 \
        if (i < nb) name##_gstep(b, y, i, NX, 0, acc);                                                 \
        UNROLL for (int r = 0; r < AG_GEMM_RM; r++) {                                                  \
            __m128 s = hsum4x16(acc[r], NX);                                                           \
            float  o[4];                                                                               \
            _mm_storeu_ps(o, s);                                                                       \
            UNROLL for (int t = 0; t < NX; t++) out[t * ldy + r] = o[t];                               \
        }                                                                                              \
    }                                                                                                  \
    static void name##_gemm(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,  \
                            int nx, float *out, int64_t ldy) {                                         \
        switch (nx) {                                                                                  \
        case 1: name##_gk(n, w, w_stride, x, x_stride, 1, out, ldy); break;                            \
        case 2: name##_gk(n, w, w_stride, x, x_stride, 2, out, ldy); break;                            \
        case 3: name##_gk(n, w, w_stride, x, x_stride, 3, out, ldy); break;                            \
        default: name##_gk(n, w, w_stride, x, x_stride, 4, out, ldy); break;                           \
        }                                                                                              \
    }

/* The lane sums of up to four accumulators, as one vector (t-th lane: a[t]). */
AI __m128 hsum4x16(const __m512 *a, const int NX) {
    __m256 h[4];
    UNROLL for (int t = 0; t < 4; t++)
        h[t] = t < NX ? _mm256_add_ps(_mm512_castps512_ps256(a[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[t]), 1)))
                      : _mm256_setzero_ps();
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

#define GEMM_M(b, i) 0.0f
GEMM512(dot_q4_0, ag_block_q4_0, wu_q4_0, wu2_q4_0, 8, 0)
GEMM512(dot_q5_0, ag_block_q5_0, wu_q5_0, wu2_q5_0, 16, 0)
GEMM512(dot_q8_0, ag_block_q8_0, wu_q8_0, wu2_q8_0, 128, 0)
#undef GEMM_M
#define GEMM_M(b, i) f16((b)[i].m)
GEMM512(dot_q4_1, ag_block_q4_1, wq_q4_1, wu2_q4_1, 0, 1)
GEMM512(dot_q5_1, ag_block_q5_1, wq_q5_1, wu2_q5_1, 0, 1)
#undef GEMM_M
/* MXFP4: u = v + 12 (0..24, the doubled E2M1 value made unsigned: a pshufb
 * of the table plus 12) */
AI __m256i wu_mxfp4(const ag_block_mxfp4 *b) { return _mm256_add_epi8(w8_mxfp4(b), _mm256_set1_epi8(12)); }
AI __m512i wu2_mxfp4(const ag_block_mxfp4 *b0, const ag_block_mxfp4 *b1) { return pair_si(wu_mxfp4(b0), wu_mxfp4(b1)); }
#define GEMM_M(b, i) 0.0f
GEMM512X(dot_mxfp4, ag_block_mxfp4, wu_mxfp4, wu2_mxfp4, 12, 0, GEMM_WD_E8M0, GEMM_YD_F16)
#undef GEMM_M

/* ag_k4_scales_unpack in registers: bytes 0..7 the scales, 8..15 the mins.
 * With u0..u2 the three dwords: [u0 & M6, (u2 & M4) | top2(u0) << 4,
 * u1 & M6, (u2 >> 4 & M4) | top2(u1) << 4], where top2(u) << 4 per byte is
 * (u >> 2) & 0x30 (the bits shifted in from the next byte are masked off).
 * Reads 16 bytes from q (the 12 scale bytes and 4 of qs). */
AI __m128i k4_scales_unpack_x(const uint8_t *q) {
    const __m128i v = loadu128(q);
    const __m128i a = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* u0 u2 u1 u2 */
    const __m128i c = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* u0 u0 u1 u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* ---- K-quants: the canonical super-block arithmetic ----
 *
 * Q4_K and Q6_K results are defined by ag_kquant_* in quant_impl.h: per
 * super-block s the exact integers isum (and msum), folded into accumulator
 * s % 4 with fmas, the four summed as (a0 + a2) + (a1 + a3). The AMX tiles
 * (matmul_amx.c) compute the same bits, which is what lets a decode batch
 * of 16+ sequences move there without changing any output.
 *
 * Here a super-block's integer sums come out as vectors of partial sums;
 * four super-blocks' vectors are reduced together (a transpose-and-add,
 * cheaper than four horizontal sums), and the float fold runs on the four
 * lanes [s0 s1 s2 s3] at once: lane k is accumulator k. A last group of
 * fewer than four super-blocks has zero sums and zero scales in the
 * missing lanes, which leaves those accumulators unchanged. */

/* [A0+A2, A1+A3, B0+B2, B1+B3] (128-bit chunks of a and b). */
AI __m512i fold_pair(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
/* [P0+P1, P2+P3, Q0+Q1, Q2+Q3]. */
AI __m512i fold_quad(__m512i p, __m512i q) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(p, q, _MM_SHUFFLE(3, 1, 3, 1)));
}
/* Each 128-bit chunk's lane sum, in every lane of the chunk. */
AI __m512i chunk_sums(__m512i r) {
    r = _mm512_add_epi32(r, _mm512_shuffle_epi32(r, (_MM_PERM_ENUM)0x4E));
    return _mm512_add_epi32(r, _mm512_shuffle_epi32(r, (_MM_PERM_ENUM)0xB1));
}
/* Lane 0 of each chunk of a (lanes 0..3) and of b (lanes 4..7), as floats. */
AI __m256 chunk_heads(__m512i a, __m512i b) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm256_cvtepi32_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi32(a, idx, b)));
}
/* The activations' d of super-blocks i..i+3 (kn of them), zero past kn. */
AI __m128 q8k_d4(const ag_block_q8_K *y, int64_t i, int kn) {
    const __m128i off = _mm_setr_epi32(0, (int)sizeof(ag_block_q8_K), 2 * (int)sizeof(ag_block_q8_K),
                                       3 * (int)sizeof(ag_block_q8_K));
    return _mm_mmask_i32gather_ps(_mm_setzero_ps(), (__mmask8)((1u << kn) - 1), off, &y[i].d, 1);
}
/* The weights' fp16 pair at the start of blocks i..i+3 of size BS (d, and
 * dmin for Q4_K), zero past kn. */
AI __m128i w_head4(const void *b, int bs, int kn) {
    const __m128i off = _mm_setr_epi32(0, bs, 2 * bs, 3 * bs);
    return _mm_mmask_i32gather_epi32(_mm_setzero_si128(), (__mmask8)((1u << kn) - 1), off, b, 1);
}
AI __m128 f16_lo4(__m128i v) { return _mm_cvtph_ps(_mm_cvtepi32_epi16(v)); }
AI __m128 f16_hi4(__m128i v) { return _mm_cvtph_ps(_mm_cvtepi32_epi16(_mm_srli_epi32(v, 16))); }
/* (a0 + a2) + (a1 + a3) */
AI float acc4_total(__m128 a) {
    __m128 t = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* ---- Q4_K: 64 elements per step ----
 *
 * qs[32j .. 32j+31] holds sub-block 2j (low nibbles) and 2j+1 (high), whose
 * 64 activations are contiguous: one zmm [low | high] per j, from one
 * broadcast load and a per-half shift. maddubs (q <= 15: pairs <= 3840) then
 * VNNI vpdpwssd multiplies the int16 pairs by the sub-block's scale and adds
 * into int32 (<= 4*2*3840*63 per lane), exact; two chains (even/odd j).
 * The mins' term: madd of the 16 bsums with the mins (each twice), exact. */
AI void q4k_sums(const ag_block_q4_K *b, const ag_block_q8_K *const *y, int64_t i, const int NX, __m512i *isum,
                 __m256i *msum) {
    const __m512i m4 = _mm512_set1_epi8(0xF), shr = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    _mm_prefetch((const char *)&b[i] + AG_PF_DIST, _MM_HINT_T0);
    _mm_prefetch((const char *)&b[i] + AG_PF_DIST + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)&b[i] + AG_PF_DIST + 128, _MM_HINT_T0);
    const __m128i sm = k4_scales_unpack_x(b[i].scales);
    const __m512i sc16z = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
    const __m256i mins2 = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    __m512i sumi[AG_DOT_MAX_NX][2];
    UNROLL for (int t = 0; t < NX; t++) sumi[t][0] = sumi[t][1] = _mm512_setzero_si512();
    UNROLL for (int j = 0; j < 4; j++) {
        const __m512i qv = _mm512_broadcast_i64x4(loadu256(b[i].qs + 32 * j));
        const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(qv, shr), m4);
        /* int16 lanes 0..15: scale 2j, 16..31: scale 2j+1 */
        const __m512i s = _mm512_permutexvar_epi16(
            _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * j)), _mm512_set1_epi16((short)(2 * j + 1))),
            sc16z);
        UNROLL for (int t = 0; t < NX; t++)
            sumi[t][j & 1] = _mm512_dpwssd_epi32(sumi[t][j & 1], _mm512_maddubs_epi16(q, loadu512(y[t][i].qs + 64 * j)), s);
    }
    UNROLL for (int t = 0; t < NX; t++) {
        isum[t] = _mm512_add_epi32(sumi[t][0], sumi[t][1]);
        msum[t] = _mm256_madd_epi16(loadu256(y[t][i].bsums), mins2);
    }
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
        /* pi[t][h]: super-blocks 2h, 2h+1 folded; pm[t][h]: their mins' sums side by side */
        __m512i pi[AG_DOT_MAX_NX][2], pm[AG_DOT_MAX_NX][2];
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i is[2][AG_DOT_MAX_NX];
            __m256i ms[2][AG_DOT_MAX_NX];
            UNROLL for (int k = 0; k < 2; k++) {
                if (2 * h + k < kn) q4k_sums(b, y, i + 2 * h + k, NX, is[k], ms[k]);
                else
                    UNROLL for (int t = 0; t < NX; t++) is[k][t] = _mm512_setzero_si512(), ms[k][t] = _mm256_setzero_si256();
            }
            UNROLL for (int t = 0; t < NX; t++) {
                pi[t][h] = fold_pair(is[0][t], is[1][t]);
                pm[t][h] = _mm512_inserti64x4(_mm512_castsi256_si512(ms[0][t]), ms[1][t], 1);
            }
        }
        const __m128i hd = w_head4(&b[i], (int)sizeof(ag_block_q4_K), kn);
        const __m128  d = f16_lo4(hd), dmin = f16_hi4(hd);
        UNROLL for (int t = 0; t < NX; t++) {
            const __m256 sums = chunk_heads(chunk_sums(fold_quad(pi[t][0], pi[t][1])),
                                            chunk_sums(fold_quad(pm[t][0], pm[t][1])));
            const __m128 dy = q8k_d4(y[t], i, kn);
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(dy, d), _mm256_castps256_ps128(sums), acc[t]);
            acc[t] = _mm_fnmadd_ps(_mm_mul_ps(dy, dmin), _mm256_extractf128_ps(sums, 1), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = acc4_total(acc[t]);
}
AG_DOT_DISPATCH(dot_q4_K)

/* ---- Q6_K: 64 elements per step ---- */

/* int16 lane l of a scale vector for 64 elements starting at sub-block k
 * (16 elements each) holds scale k + l/8: permutation indices per k = 0, 4,
 * 8, 12. */
static const int16_t q6_scale_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

/* Super-block i's exact sum Σ sc_k (q - 32)·y over its 256 elements, as
 * int32 partial sums (the -32 offset: -32 Σ_k sc_k bsum_k in lanes 0..7). */
AI void q6k_sums(const ag_block_q6_K *b, const ag_block_q8_K *const *y, int64_t i, const int NX, __m512i *sumi) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3);
    UNROLL for (int o = 0; o < (int)sizeof(ag_block_q6_K); o += 64)
        _mm_prefetch((const char *)&b[i] + AG_PF_DIST + o, _MM_HINT_T0);
    const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(b[i].scales));
    const __m512i sc16z = _mm512_inserti64x4(_mm512_setzero_si512(), sc16, 0);
    UNROLL for (int t = 0; t < NX; t++) {
        __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(y[t][i].bsums)), 5);
        sumi[t] = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_sub_epi32(_mm256_setzero_si256(), corr), 0);
    }
    UNROLL for (int h = 0; h < 2; h++) {
        const __m512i ql = loadu512(b[i].ql + 64 * h);
        const __m256i qh = loadu256(b[i].qh + 32 * h);
        const __m512i qhz = pair_si(qh, _mm256_srli_epi16(qh, 2));
        /* g[0]: elements 128h + 0..63, g[1]: 128h + 64..127 */
        __m512i g[2];
        g[0] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qhz, m3), 4));
        g[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qhz, 4), m3), 4));
        UNROLL for (int k = 0; k < 2; k++) {
            const __m512i s = _mm512_permutexvar_epi16(loadu512(q6_scale_idx[2 * h + k]), sc16z);
            UNROLL for (int t = 0; t < NX; t++) sumi[t] = _mm512_dpwssd_epi32(
                sumi[t], _mm512_maddubs_epi16(g[k], loadu512(y[t][i].qs + 128 * h + 64 * k)), s);
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
        __m512i   pi[AG_DOT_MAX_NX][2];
        UNROLL for (int h = 0; h < 2; h++) {
            __m512i is[2][AG_DOT_MAX_NX];
            UNROLL for (int k = 0; k < 2; k++) {
                if (2 * h + k < kn) q6k_sums(b, y, i + 2 * h + k, NX, is[k]);
                else UNROLL for (int t = 0; t < NX; t++) is[k][t] = _mm512_setzero_si512();
            }
            UNROLL for (int t = 0; t < NX; t++) pi[t][h] = fold_pair(is[0][t], is[1][t]);
        }
        /* Q6_K's d is its last two bytes: read the dword ending there (the
         * last two scales, then d), never past the block */
        const __m128 d = f16_hi4(w_head4((const uint8_t *)&b[i].d - 2, (int)sizeof(ag_block_q6_K), kn));
        UNROLL for (int t = 0; t < NX; t++) {
            const __m512i r = chunk_sums(fold_quad(pi[t][0], pi[t][1]));
            const __m128  sums = _mm256_castps256_ps128(chunk_heads(r, r));
            acc[t] = _mm_fmadd_ps(_mm_mul_ps(q8k_d4(y[t], i, kn), d), sums, acc[t]);
        }
    }
    UNROLL for (int t = 0; t < NX; t++) out[t] = acc4_total(acc[t]);
}
AG_DOT_DISPATCH(dot_q6_K)

/* ---- window panels: verify windows of 2..8 decode rows (Q4_K, Q6_K) ----
 *
 * A speculative verify window runs a few decode rows, which must give the
 * dot kernels' bits (ag_kquant_fold) and should cost about one row: the
 * weights stream from DRAM once, so the rows' products must fit in the
 * time of that stream. The dot kernels spend two multiplies (maddubs,
 * vpdpwssd) per 64 products and token. Here the activations come as window
 * panels (ag_wpanel_q8k: one zmm holds 16 consecutive elements of four
 * tokens, one per 128-bit lane), so a weight group of 16 bytes broadcast
 * from memory to the four lanes makes 64 products of four tokens in one
 * vpdpbusd, four per int32 lane, and serves every panel. The lane sums fit
 * int16 (Q4_K: a sub-block's lane after its two vpdpbusd holds 8 products
 * <= 8 * 15 * 127; Q6_K: a 16-element group's lane 4 products <= 4 * 63 *
 * 127 < 32768), so the lanes of two scales are packed (vpackssdw, exact) and
 * one vpdpwssd applies both scales into the int32 sum. The sums are exact,
 * so the fold per (row, token, super-block) is ag_kquant_fold's, in four
 * token lanes.
 *
 * Rows one at a time (each streams its own weights, prefetched ahead as in
 * the dot kernels), panels two at a time (eight tokens per weight unpack). */

/* The 16 bytes at p in every 128-bit lane. */
AI __m512i bcast128x4(const void *p) { return _mm512_broadcast_i32x4(loadu128(p)); }
/* Group g (16 elements) of the four tokens of a window panel. */
AI __m512i wp_group(const ag_wpanel_q8k *x, int g) { return _mm512_load_si512(x->qs16[g]); }
/* Int16 scales a and b of the 8 in sc16b (every 128-bit lane) as the
 * multipliers of _mm512_packs_epi32(A, B): a on int16 lanes 0..3 of each
 * 128-bit lane, b on 4..7. */
AI __m512i wp_scale2(__m512i sc16b, const int a, const int b) {
    const char a0 = (char)(2 * a), a1 = (char)(2 * a + 1), b0 = (char)(2 * b), b1 = (char)(2 * b + 1);
    return _mm512_shuffle_epi8(sc16b, _mm512_broadcast_i32x4(_mm_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, b0, b1, b0, b1, b0, b1, b0, b1)));
}
/* Each 128-bit lane's (token's) int32 total, as [t0 t1 t2 t3]. */
AI __m128i wp_tokens(__m512i v) {
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0x4E));
    v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, (_MM_PERM_ENUM)0xB1));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}
/* Σ_i pairs[i][t] · (c_2i, c_2i+1) over the i of one zmm of pair sums
 * ([4 i][4 t][2] int16) against int16 pairs c (dword i0 + i of cz), per
 * token as [4 i][4 t] int32: |pair| <= 32 * 127, |c| <= 128, exact. */
AI __m512i wp_pairs(const void *pairs, __m512i cz, const int i0) {
    const __m512i idx = _mm512_setr_epi32(i0, i0, i0, i0, i0 + 1, i0 + 1, i0 + 1, i0 + 1, i0 + 2, i0 + 2, i0 + 2, i0 + 2,
                                          i0 + 3, i0 + 3, i0 + 3, i0 + 3);
    return _mm512_madd_epi16(_mm512_loadu_si512(pairs), _mm512_permutexvar_epi32(idx, cz));
}
/* The token totals of a [4 i][4 t] int32 vector (summed over i). */
AI __m128i wp_over_i(__m512i v) {
    const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

/* One Q4_K super-block of one row against NP (1..2) panels x: isum and msum
 * per token. */
AI void wp_q4k_sums(const ag_block_q4_K *b, const ag_wpanel_q8k *const *x, const int NP, __m128i *isum, __m128i *msum) {
    const __m512i m4 = _mm512_set1_epi8(0xF);
    UNROLL for (int o = 0; o < (int)sizeof(ag_block_q4_K); o += 64) _mm_prefetch((const char *)b + AG_PF_DIST + o, _MM_HINT_T0);
    const __m128i sm = k4_scales_unpack_x(b->scales); /* bytes 0..7 scales, 8..15 mins */
    const __m512i sc16b = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    const __m512i mz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
    __m512i       is[2];
    UNROLL for (int p = 0; p < NP; p++) is[p] = _mm512_setzero_si512();
    UNROLL for (int j = 0; j < 4; j++) { /* qs[32j ..]: sub-blocks 2j (low nibbles), 2j + 1 (high) */
        const __m512i r0 = bcast128x4(b->qs + 32 * j), r1 = bcast128x4(b->qs + 32 * j + 16);
        const __m512i w0 = _mm512_and_si512(r0, m4), w1 = _mm512_and_si512(r1, m4);
        const __m512i w2 = _mm512_and_si512(_mm512_srli_epi16(r0, 4), m4), w3 = _mm512_and_si512(_mm512_srli_epi16(r1, 4), m4);
        const __m512i sc = wp_scale2(sc16b, 2 * j, 2 * j + 1);
        UNROLL for (int p = 0; p < NP; p++) {
            const __m512i z = _mm512_setzero_si512();
            const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w0, wp_group(x[p], 4 * j)), w1, wp_group(x[p], 4 * j + 1));
            const __m512i c = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w2, wp_group(x[p], 4 * j + 2)), w3, wp_group(x[p], 4 * j + 3));
            is[p] = _mm512_dpwssd_epi32(is[p], _mm512_packs_epi32(a, c), sc);
        }
    }
    UNROLL for (int p = 0; p < NP; p++) {
        isum[p] = wp_tokens(is[p]);
        msum[p] = wp_over_i(wp_pairs(x[p]->bpair, mz, 0));
    }
}

/* One Q6_K super-block of one row against NP panels: the exact isum per
 * token (the -32 offset as -32 Σ sc · bsums). The six-bit values are
 * unpacked as the dot kernel does, 64 at a time; each 16-element group then
 * goes to the four lanes by one shuffle. */
AI void wp_q6k_sums(const ag_block_q6_K *b, const ag_wpanel_q8k *const *x, const int NP, __m128i *isum) {
    const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3);
    UNROLL for (int o = 0; o < (int)sizeof(ag_block_q6_K); o += 64) _mm_prefetch((const char *)b + AG_PF_DIST + o, _MM_HINT_T0);
    const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(b->scales));
    __m512i       is[2];
    UNROLL for (int p = 0; p < NP; p++) is[p] = _mm512_setzero_si512();
    UNROLL for (int h = 0; h < 2; h++) {
        const __m512i sc16b = _mm512_broadcast_i32x4(h ? _mm256_extracti128_si256(sc16, 1) : _mm256_castsi256_si128(sc16));
        const __m512i ql = loadu512(b->ql + 64 * h);
        const __m256i qh = loadu256(b->qh + 32 * h);
        const __m512i qhz = pair_si(qh, _mm256_srli_epi16(qh, 2));
        __m512i       g[2]; /* g[k]: elements 128h + 64k .. + 63 (as the dot kernel) */
        g[0] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(qhz, m3), 4));
        g[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qhz, 4), m3), 4));
        UNROLL for (int k = 0; k < 2; k++) {
            const int     G = 4 * k; /* groups 8h + G .. 8h + G + 3 */
            const __m512i w0 = _mm512_shuffle_i32x4(g[k], g[k], 0x00), w1 = _mm512_shuffle_i32x4(g[k], g[k], 0x55);
            const __m512i w2 = _mm512_shuffle_i32x4(g[k], g[k], 0xAA), w3 = _mm512_shuffle_i32x4(g[k], g[k], 0xFF);
            const __m512i s01 = wp_scale2(sc16b, G, G + 1), s23 = wp_scale2(sc16b, G + 2, G + 3);
            UNROLL for (int p = 0; p < NP; p++) {
                const __m512i z = _mm512_setzero_si512();
                const int     g0 = 8 * h + G;
                const __m512i a0 = _mm512_dpbusd_epi32(z, w0, wp_group(x[p], g0)), a1 = _mm512_dpbusd_epi32(z, w1, wp_group(x[p], g0 + 1));
                const __m512i a2 = _mm512_dpbusd_epi32(z, w2, wp_group(x[p], g0 + 2)), a3 = _mm512_dpbusd_epi32(z, w3, wp_group(x[p], g0 + 3));
                is[p] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(is[p], _mm512_packs_epi32(a0, a1), s01), _mm512_packs_epi32(a2, a3), s23);
            }
        }
    }
    const __m512i scz = _mm512_castsi256_si512(sc16);
    UNROLL for (int p = 0; p < NP; p++) {
        const __m128i corr = wp_over_i(_mm512_add_epi32(wp_pairs(x[p]->bsums[0], scz, 0), wp_pairs(x[p]->bsums[4], scz, 4)));
        isum[p] = _mm_sub_epi32(wp_tokens(is[p]), _mm_slli_epi32(corr, 5));
    }
}

/* One weight row against NP (1..2) window panels (xp, xp_stride apart):
 * per super-block s the exact sums, folded into accumulator s % 4 of the
 * token lanes (ag_kquant_fold); out[p]: the tokens' results. */
#define WP_ROW(name, BT, Q4K)                                                                                    \
    AI void name##_row(int64_t nsb, const BT *b, const uint8_t *xp, size_t xp_stride, const int NP, __m128 *out) { \
        __m128 acc[2][4];                                                                                        \
        UNROLL for (int p = 0; p < NP; p++) UNROLL for (int k = 0; k < 4; k++) acc[p][k] = _mm_setzero_ps();     \
        for (int64_t s0 = 0; s0 < nsb; s0 += 4)                                                                  \
            UNROLL for (int k = 0; k < 4; k++) {                                                                 \
                const int64_t s = s0 + k;                                                                        \
                if (s >= nsb) break;                                                                             \
                const ag_wpanel_q8k *x[2];                                                                       \
                x[0] = (const ag_wpanel_q8k *)xp + s;                                                            \
                x[1] = (const ag_wpanel_q8k *)(xp + (NP > 1 ? xp_stride : 0)) + s;                               \
                __m128i isum[2], msum[2];                                                                        \
                if (Q4K) wp_q4k_sums((const void *)&b[s], x, NP, isum, msum);                                    \
                else wp_q6k_sums((const void *)&b[s], x, NP, isum);                                              \
                const __m128 d = _mm_set1_ps(f16(b[s].d));                                                       \
                UNROLL for (int p = 0; p < NP; p++) {                                                            \
                    const __m128 dy = _mm_loadu_ps(x[p]->d);                                                     \
                    acc[p][k] = _mm_fmadd_ps(_mm_mul_ps(dy, d), _mm_cvtepi32_ps(isum[p]), acc[p][k]);            \
                    if (Q4K)                                                                                     \
                        acc[p][k] = _mm_fnmadd_ps(_mm_mul_ps(dy, _mm_set1_ps(f16(WP_DMIN(b[s])))),                \
                                                  _mm_cvtepi32_ps(msum[p]), acc[p][k]);                          \
                }                                                                                                \
            }                                                                                                    \
        UNROLL for (int p = 0; p < NP; p++)                                                                      \
            out[p] = _mm_add_ps(_mm_add_ps(acc[p][0], acc[p][2]), _mm_add_ps(acc[p][1], acc[p][3]));           \
    }                                                                                                            \
    AI void name##_k(int64_t n, const void *w, size_t w_stride, int nr, const void *xp, size_t xp_stride, int np,  \
                     int64_t nt, float *y, int64_t ldy) {                                                        \
        for (int r = 0; r < nr; r++) {                                                                           \
            const BT *b = (const BT *)((const uint8_t *)w + (size_t)r * w_stride);                               \
            for (int p0 = 0; p0 < np; p0 += 2) {                                                                 \
                const uint8_t *x0 = (const uint8_t *)xp + (size_t)p0 * xp_stride;                                \
                __m128         o[2];                                                                             \
                const int      two = p0 + 1 < np;                                                                \
                if (two) name##_row(n / AG_QK_K, b, x0, xp_stride, 2, o);                                        \
                else name##_row(n / AG_QK_K, b, x0, xp_stride, 1, o);                                            \
                for (int p = 0; p <= two; p++) {                                                                 \
                    float v[4];                                                                                  \
                    _mm_storeu_ps(v, o[p]);                                                                      \
                    for (int t = 0; t < AG_WPANEL_NT && (p0 + p) * AG_WPANEL_NT + t < nt; t++)                   \
                        y[((p0 + p) * AG_WPANEL_NT + t) * ldy + r] = v[t];                                       \
                }                                                                                                \
            }                                                                                                    \
        }                                                                                                        \
    }                                                                                                            \
    static void name(int64_t n, const void *w, size_t w_stride, int nr, const void *xp, size_t xp_stride, int np,  \
                     int64_t nt, float *y, int64_t ldy) {                                                        \
        name##_k(n, w, w_stride, nr, xp, xp_stride, np, nt, y, ldy);                                             \
    }

#define WP_DMIN(blk) (blk).dmin
WP_ROW(wpanel_q4_K, ag_block_q4_K, 1)
#undef WP_DMIN
#define WP_DMIN(blk) (uint16_t)0
WP_ROW(wpanel_q6_K, ag_block_q6_K, 0)
#undef WP_DMIN

/* ---- float weights ---- */

AI __m512 wload16_f32(const uint8_t *p) { return _mm512_loadu_ps(p); }
AI __m512 wload16_f16(const uint8_t *p) { return _mm512_cvtph_ps(loadu256(p)); }

#define FLOAT512(name, ESZ, WLOAD16, WLOAD8, WSCALAR)                                              \
    AI void name##_k(int64_t n, const void *w, const void *x, size_t x_stride, const int NX,      \
                     float *out) {                                                               \
        const uint8_t *wb = w;                                                                   \
        const float   *y[AG_DOT_MAX_NX];                                                         \
        __m512         acc0[AG_DOT_MAX_NX], acc1[AG_DOT_MAX_NX];                                 \
        UNROLL for (int t = 0; t < NX; t++) {                                                    \
            y[t] = (const float *)YROW(t);                                                       \
            acc0[t] = acc1[t] = _mm512_setzero_ps();                                             \
        }                                                                                        \
        int64_t i = 0;                                                                           \
        for (; i + 32 <= n; i += 32) {                                                           \
            __m512 w0 = WLOAD16(wb + ESZ * i), w1 = WLOAD16(wb + ESZ * (i + 16));                \
            UNROLL for (int t = 0; t < NX; t++) {                                                \
                acc0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(y[t] + i), acc0[t]);               \
                acc1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(y[t] + i + 16), acc1[t]);          \
            }                                                                                    \
        }                                                                                        \
        __m256 a8[AG_DOT_MAX_NX];                                                                \
        UNROLL for (int t = 0; t < NX; t++) a8[t] = _mm256_setzero_ps();                         \
        for (; i + 8 <= n; i += 8) {                                                             \
            __m256 w0 = WLOAD8(wb + ESZ * i);                                                    \
            UNROLL for (int t = 0; t < NX; t++) a8[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y[t] + i), a8[t]); \
        }                                                                                        \
        UNROLL for (int t = 0; t < NX; t++) {                                                    \
            float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + hsum8(a8[t]);      \
            for (int64_t j = i; j < n; j++) s += WSCALAR(wb + ESZ * j) * wscalar_f32((const uint8_t *)(y[t] + j)); \
            out[t] = s;                                                                          \
        }                                                                                        \
    }                                                                                            \
    AG_DOT_DISPATCH(name)

FLOAT512(dot_f32, 4, wload16_f32, wload_f32, wscalar_f32)
FLOAT512(dot_f16, 2, wload16_f16, wload_f16, wscalar_f16)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* Compiled for the baseline target: only stores function pointers. */
void ag_quant_kernels_avx512(ag_quant_kernels *k) {
    k->dot[AG_TYPE_F32] = dot_f32;
    k->dot[AG_TYPE_F16] = dot_f16;
    k->dot[AG_TYPE_Q4_0] = dot_q4_0;
    k->dot[AG_TYPE_Q4_1] = dot_q4_1;
    k->dot[AG_TYPE_Q5_0] = dot_q5_0;
    k->dot[AG_TYPE_Q5_1] = dot_q5_1;
    k->dot[AG_TYPE_Q8_0] = dot_q8_0;
    k->dot[AG_TYPE_MXFP4] = dot_mxfp4;
    k->dot[AG_TYPE_Q4_K] = dot_q4_K;
    k->dot[AG_TYPE_Q6_K] = dot_q6_K;
    k->gemm[AG_TYPE_Q4_0] = dot_q4_0_gemm;
    k->gemm[AG_TYPE_Q4_1] = dot_q4_1_gemm;
    k->gemm[AG_TYPE_Q5_0] = dot_q5_0_gemm;
    k->gemm[AG_TYPE_Q5_1] = dot_q5_1_gemm;
    k->gemm[AG_TYPE_Q8_0] = dot_q8_0_gemm;
    k->gemm[AG_TYPE_MXFP4] = dot_mxfp4_gemm;
    /* Prompt rows keep the AVX2 token panels the table inherits where a
     * type has one (Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q6_K; the VNNI tiles above
     * then serve Q8_0 alone): on a Xeon without AMX, 2 threads, prompt
     * tok/s tiles or dot kernels -> panels: SmolLM2 Q4_1 344-374 -> 520-547,
     * Gemma 3 270M 430-446 -> 535-558, Qwen2.5-0.5B (Q5_0) 179 -> 225-232
     * (pp512), Qwen2.5-1.5B Q4_K_M 57-63 -> 99-125 (pp256). Q4_K/Q6_K
     * panels give the dot kernels' bits; the legacy types' prompt rows
     * differ from their decode rows in rounding either way.
     * AUGUR_CPU_PANELS=0 drops the panels at this level (A/B). */
    if (ag_switch_off("AUGUR_CPU_PANELS")) memset(k->panel, 0, sizeof k->panel);
    /* Decode rows of Q4_K take the VNNI token panels (dpanel) from 5 rows
     * where the CPU has AMX (below the tiles' minimum; measured there, so
     * kept); AUGUR_CPU_DPANELS=0 keeps them on the dot kernels (A/B). */
    if (!ag_switch_off("AUGUR_CPU_DPANELS")) ag_quant_panels_vnni(k);
    /* Without AMX, verify windows of Q4_K / Q6_K decode rows take the VNNI
     * window panels above (matmul.c window_panel_min: the AVX2 window
     * panels this table inherits stayed off here, no cheaper than these dot
     * kernels on a Xeon without AMX). AUGUR_CPU_WPANELS=0 keeps such a
     * window on the dot kernels and Q4_K's VNNI token panels, as before
     * issue 48 (A/B). */
    if (ag_switch_off("AUGUR_CPU_WPANELS")) {
        memset(k->wpanel, 0, sizeof k->wpanel);
    } else {
        k->wpanel[AG_TYPE_Q4_K] = wpanel_q4_K;
        k->wpanel[AG_TYPE_Q6_K] = wpanel_q6_K;
        k->wpanel16 = true;
    }
}

#else

void ag_quant_kernels_avx512(ag_quant_kernels *k) { (void)k; }

#endif
