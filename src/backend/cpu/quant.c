/* Quantized formats: the portable scalar reference (dequantization,
 * activation quantization, dot products) and the ISA dispatch.
 *
 * The scalar dots are the reference every SIMD variant is tested against:
 * each block's integer products are summed exactly in int32, then scaled in
 * float, the same association the SIMD code uses. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "backend/cpu/quant_impl.h"
#include "base/log.h"
#include "base/switches.h"

/* ------------------------------------------------------------------------ */
/* fp16 / bf16                                                              */

float ag_fp16_to_fp32(uint16_t h) { return ag_fp16_to_fp32_portable(h); }

uint16_t ag_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7FFFFFFF;
    if (x >= 0x7F800000) { /* inf, or NaN kept quiet with its top payload */
        if (x == 0x7F800000) return (uint16_t)(sign | 0x7C00);
        return (uint16_t)(sign | 0x7E00 | ((x >> 13) & 0x3FF));
    }
    if (x >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* >= 65520 rounds to inf */
    uint32_t e = x >> 23;
    if (e <= 112) { /* below 2^-14: fp16 subnormal (unit 2^-24) or zero */
        if (e < 102) return (uint16_t)sign; /* < 2^-25 (a tie at 2^-25 goes to 0, even) */
        uint32_t m = (x & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* value * 2^24 = m >> shift, shift in 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t mant = x & 0x7FFFFF;
    uint32_t h = ((e - 112) << 10) | (mant >> 13), rem = mant & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry bumps the exponent, fine */
    return (uint16_t)(sign | h);
}

float ag_bf16_to_fp32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float    f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t ag_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + (0x7FFF + ((x >> 16) & 1))) >> 16);
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define AG_X86 1
__attribute__((target("avx,f16c"))) static void fp16_to_fp32_row_f16c(const uint16_t *src,
                                                                       float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = ag_fp16_to_fp32_portable(src[i]);
}
__attribute__((target("avx,f16c"))) static void fp32_to_fp16_row_f16c(const float *src,
                                                                       uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = ag_fp32_to_fp16(src[i]);
}
static int has_f16c(void) {
    static int v = -1; /* benign race: every thread computes the same value */
    if (v < 0) {
        /* clang's __builtin_cpu_supports does not know "f16c": ask cpuid
         * (leaf 1, ECX bit 29); "avx" covers the OS saving ymm state. */
        unsigned a, b, c, d;
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) ? 1 : 0;
    }
    return v;
}
#endif

void ag_fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n) {
#ifdef AG_X86
    if (ag_cpu_isa_active() != AG_CPU_ISA_SCALAR && has_f16c()) {
        fp16_to_fp32_row_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = ag_fp16_to_fp32_portable(src[i]);
}

void ag_fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n) {
#ifdef AG_X86
    if (ag_cpu_isa_active() != AG_CPU_ISA_SCALAR && has_f16c()) {
        fp32_to_fp16_row_f16c(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = ag_fp32_to_fp16(src[i]);
}

void ag_bf16_to_fp32_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ag_bf16_to_fp32(src[i]);
}

void ag_fp32_to_bf16_row(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ag_fp32_to_bf16(src[i]);
}

#define F16(h) ag_fp16_to_fp32_portable(h)

/* Local so that this module does not depend on the GGUF reader. */
static const char *type_name(uint32_t t) {
    switch (t) {
    case AG_TYPE_F32: return "F32";
    case AG_TYPE_F16: return "F16";
    case AG_TYPE_BF16: return "BF16";
    case AG_TYPE_Q4_0: return "Q4_0";
    case AG_TYPE_Q4_1: return "Q4_1";
    case AG_TYPE_Q5_0: return "Q5_0";
    case AG_TYPE_Q5_1: return "Q5_1";
    case AG_TYPE_Q8_0: return "Q8_0";
    case AG_TYPE_Q2_K: return "Q2_K";
    case AG_TYPE_Q3_K: return "Q3_K";
    case AG_TYPE_Q4_K: return "Q4_K";
    case AG_TYPE_Q5_K: return "Q5_K";
    case AG_TYPE_Q6_K: return "Q6_K";
    case AG_TYPE_Q8_K: return "Q8_K";
    case AG_TYPE_MXFP4: return "MXFP4";
    default: return "?";
    }
}

/* ------------------------------------------------------------------------ */
/* types                                                                    */

ag_status ag_quant_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
    uint32_t e, b;
    switch (type) {
    case AG_TYPE_F32: e = 1, b = 4; break;
    case AG_TYPE_F16: e = 1, b = 2; break;
    case AG_TYPE_BF16: e = 1, b = 2; break;
    case AG_TYPE_Q4_0: e = AG_QK, b = sizeof(ag_block_q4_0); break;
    case AG_TYPE_Q4_1: e = AG_QK, b = sizeof(ag_block_q4_1); break;
    case AG_TYPE_Q5_0: e = AG_QK, b = sizeof(ag_block_q5_0); break;
    case AG_TYPE_Q5_1: e = AG_QK, b = sizeof(ag_block_q5_1); break;
    case AG_TYPE_Q8_0: e = AG_QK, b = sizeof(ag_block_q8_0); break;
    case AG_TYPE_Q2_K: e = AG_QK_K, b = sizeof(ag_block_q2_K); break;
    case AG_TYPE_Q3_K: e = AG_QK_K, b = sizeof(ag_block_q3_K); break;
    case AG_TYPE_Q4_K: e = AG_QK_K, b = sizeof(ag_block_q4_K); break;
    case AG_TYPE_Q5_K: e = AG_QK_K, b = sizeof(ag_block_q5_K); break;
    case AG_TYPE_Q6_K: e = AG_QK_K, b = sizeof(ag_block_q6_K); break;
    case AG_TYPE_Q8_K: e = AG_QK_K, b = sizeof(ag_block_q8_K); break;
    case AG_TYPE_MXFP4: e = AG_QK, b = sizeof(ag_block_mxfp4); break;
    default: return ag_errorf(AG_ERR_UNSUPPORTED, "tensor type %u is not supported by the CPU kernels", type);
    }
    if (block_elems) *block_elems = e;
    if (block_bytes) *block_bytes = b;
    return AG_OK;
}

bool ag_quant_supported(uint32_t type) {
    switch (type) {
    case AG_TYPE_F32: case AG_TYPE_F16: case AG_TYPE_BF16: case AG_TYPE_Q4_0: case AG_TYPE_Q4_1:
    case AG_TYPE_Q5_0: case AG_TYPE_Q5_1: case AG_TYPE_Q8_0: case AG_TYPE_Q2_K: case AG_TYPE_Q3_K:
    case AG_TYPE_Q4_K: case AG_TYPE_Q5_K: case AG_TYPE_Q6_K: case AG_TYPE_Q8_K: case AG_TYPE_MXFP4: return true;
    default: return false;
    }
}

bool ag_quant_dot_supported(uint32_t type) { return type != AG_TYPE_Q8_K && ag_quant_supported(type); }

size_t ag_quant_row_bytes(uint32_t type, int64_t n) {
    uint32_t e, b;
    if (!ag_quant_supported(type) || n <= 0) return 0;
    ag_quant_block(type, &e, &b);
    if (n % e) return 0;
    return (size_t)(n / e) * b;
}

/* ------------------------------------------------------------------------ */
/* dequantization (operation order mirrors gguf-py for bit-exact results)   */

static void dq_q4_0(const ag_block_q4_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        float d = F16(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}

static void dq_q4_1(const ag_block_q4_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        float d = F16(b[i].d), m = F16(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(b[i].qs[j] & 0xF) + m;
            y[j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}

static uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void dq_q5_0(const ag_block_q5_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        float    d = F16(b[i].d);
        uint32_t qh = ld_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)(q0 - 16);
            y[j + 16] = d * (float)(q1 - 16);
        }
    }
}

static void dq_q5_1(const ag_block_q5_1 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        float    d = F16(b[i].d), m = F16(b[i].m);
        uint32_t qh = ld_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (b[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)q0 + m;
            y[j + 16] = d * (float)q1 + m;
        }
    }
}

static void dq_mxfp4(const ag_block_mxfp4 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        const float d = ag_e8m0_half(b[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)ag_mxfp4_values[b[i].qs[j] & 0xF];
            y[j + 16] = d * (float)ag_mxfp4_values[b[i].qs[j] >> 4];
        }
    }
}

static void dq_q8_0(const ag_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK) {
        float d = F16(b[i].d);
        for (int j = 0; j < AG_QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void dq_q2_K(const ag_block_q2_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int e = 0; e < AG_QK_K; e++) {
            int   h = e >> 7, s = (e >> 5) & 3, l = e & 31, k = e >> 4;
            int   q = (b[i].qs[h * 32 + l] >> (2 * s)) & 3;
            float dl = d * (float)(b[i].scales[k] & 0xF), ml = dmin * (float)(b[i].scales[k] >> 4);
            y[e] = dl * (float)q - ml;
        }
    }
}

static void dq_q3_K(const ag_block_q3_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float  d = F16(b[i].d);
        int8_t sc[16];
        ag_q3k_scales(b[i].scales, sc);
        for (int e = 0; e < AG_QK_K; e++) {
            int h = e >> 7, s = (e >> 5) & 3, l = e & 31;
            int ql = (b[i].qs[h * 32 + l] >> (2 * s)) & 3;
            int hb = (b[i].hmask[l] >> (e >> 5)) & 1;
            float dl = d * (float)sc[e >> 4];
            y[e] = dl * (float)(ql - (hb ? 0 : 4));
        }
    }
}

static void dq_q4_K(const ag_block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            ag_k4_scale_min(j, b[i].scales, &sc, &m);
            float          d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j >> 1);
            int            shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) y[32 * j + l] = d1 * (float)((q[l] >> shift) & 0xF) - m1;
        }
    }
}

static void dq_q5_K(const ag_block_q5_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float d = F16(b[i].d), dmin = F16(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            ag_k4_scale_min(j, b[i].scales, &sc, &m);
            float          d1 = d * (float)sc, m1 = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j >> 1);
            int            shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((b[i].qh[l] >> j) & 1) << 4);
                y[32 * j + l] = d1 * (float)v - m1;
            }
        }
    }
}

/* The 6-bit value of element e (0..255) of a Q6_K block, 0..63. */
static inline int q6k_value(const ag_block_q6_K *b, int e) {
    int h = e >> 7, r = e & 127, g = r >> 5, l = r & 31; /* g: which 32-group in the half */
    int ql = b->ql[h * 64 + (g & 1) * 32 + l] >> ((g >> 1) * 4) & 0xF;
    int qh = (b->qh[h * 32 + l] >> (2 * g)) & 3;
    return ql | (qh << 4);
}

static void dq_q6_K(const ag_block_q6_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float d = F16(b[i].d);
        for (int e = 0; e < AG_QK_K; e++) {
            float dl = d * (float)b[i].scales[e >> 4];
            y[e] = dl * (float)(q6k_value(&b[i], e) - 32);
        }
    }
}

static void dq_q8_K(const ag_block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += AG_QK_K) {
        float d = b[i].d;
        for (int j = 0; j < AG_QK_K; j++) y[j] = d * (float)b[i].qs[j];
    }
}

ag_status ag_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    uint32_t be, bb;
    ag_status st = ag_quant_block(type, &be, &bb);
    if (st != AG_OK) return st;
    if (!src || !dst) return ag_errorf(AG_ERR_INVALID, "ag_dequant_row: NULL pointer");
    if (n <= 0 || n % be)
        return ag_errorf(AG_ERR_INVALID, "ag_dequant_row: %lld elements is not a positive multiple of %s's block of %u",
                         (long long)n, type_name(type), be);
    int64_t nb = n / be;
    switch (type) {
    case AG_TYPE_F32: memmove(dst, src, (size_t)n * 4); break;
    case AG_TYPE_F16: {
        const uint8_t *s = src; /* may be unaligned: copy element by element */
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = ag_fp16_to_fp32_portable(h);
        }
        break;
    }
    case AG_TYPE_BF16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = ag_bf16_to_fp32(h);
        }
        break;
    }
    case AG_TYPE_Q4_0: dq_q4_0(src, dst, nb); break;
    case AG_TYPE_Q4_1: dq_q4_1(src, dst, nb); break;
    case AG_TYPE_Q5_0: dq_q5_0(src, dst, nb); break;
    case AG_TYPE_Q5_1: dq_q5_1(src, dst, nb); break;
    case AG_TYPE_Q8_0: dq_q8_0(src, dst, nb); break;
    case AG_TYPE_Q2_K: dq_q2_K(src, dst, nb); break;
    case AG_TYPE_Q3_K: dq_q3_K(src, dst, nb); break;
    case AG_TYPE_Q4_K: dq_q4_K(src, dst, nb); break;
    case AG_TYPE_Q5_K: dq_q5_K(src, dst, nb); break;
    case AG_TYPE_Q6_K: dq_q6_K(src, dst, nb); break;
    case AG_TYPE_Q8_K: dq_q8_K(src, dst, nb); break;
    case AG_TYPE_MXFP4: dq_mxfp4(src, dst, nb); break;
    default: return ag_errorf(AG_ERR_INTERNAL, "ag_dequant_row: type %u fell through", type);
    }
    return AG_OK;
}

/* ------------------------------------------------------------------------ */
/* activation quantization                                                  */

/* round-to-nearest-even of v (|v| <= 127 + rounding) clamped to int8; NaN -> 0.
 * nearbyintf under the default rounding mode matches cvtps2dq in the SIMD
 * code, so scalar and SIMD quantize identically. */
static inline int8_t q8_round(float v) {
    v = nearbyintf(v);
    if (!(v >= -127.0f)) v = (v != v) ? 0.0f : -127.0f;
    if (v > 127.0f) v = 127.0f;
    return (int8_t)v;
}

static void quant_q8a_scalar(const float *x, void *dst, int64_t n) {
    ag_block_q8a *b = dst;
    for (int64_t i = 0; i < n / AG_QK; i++, x += AG_QK) {
        float amax = 0.0f;
        for (int j = 0; j < AG_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int   sum = 0;
        for (int j = 0; j < AG_QK; j++) {
            b[i].qs[j] = q8_round(x[j] * id);
            sum += b[i].qs[j];
        }
        b[i].d = d;
        b[i].s = d * (float)sum;
    }
}

static void quant_q8k_scalar(const float *x, void *dst, int64_t n) {
    ag_block_q8_K *b = dst;
    for (int64_t i = 0; i < n / AG_QK_K; i++, x += AG_QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < AG_QK_K; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < AG_QK_K; j++) b[i].qs[j] = q8_round(x[j] * id);
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[i].qs[16 * k + j];
            b[i].bsums[k] = (int16_t)s;
        }
        b[i].d = d;
    }
}

ag_status ag_quant_act_format(uint32_t w_type, ag_act_format *out) {
    switch (w_type) {
    case AG_TYPE_F32: case AG_TYPE_F16: case AG_TYPE_BF16: *out = AG_ACT_F32; return AG_OK;
    case AG_TYPE_Q4_0: case AG_TYPE_Q4_1: case AG_TYPE_Q5_0: case AG_TYPE_Q5_1: case AG_TYPE_Q8_0:
    case AG_TYPE_MXFP4:
        *out = AG_ACT_Q8A;
        return AG_OK;
    case AG_TYPE_Q2_K: case AG_TYPE_Q3_K: case AG_TYPE_Q4_K: case AG_TYPE_Q5_K: case AG_TYPE_Q6_K:
        *out = AG_ACT_Q8K;
        return AG_OK;
    default:
        return ag_errorf(AG_ERR_UNSUPPORTED, "no CPU dot product for weight type %s (%u)",
                         type_name(w_type), w_type);
    }
}

size_t ag_act_row_bytes(ag_act_format f, int64_t n) {
    if (n <= 0) return 0;
    switch (f) {
    case AG_ACT_F32: return (size_t)n * 4;
    case AG_ACT_Q8A: return n % AG_QK ? 0 : (size_t)(n / AG_QK) * sizeof(ag_block_q8a);
    case AG_ACT_Q8K: return n % AG_QK_K ? 0 : (size_t)(n / AG_QK_K) * sizeof(ag_block_q8_K);
    }
    return 0;
}

ag_status ag_quantize_act_row(ag_act_format f, const float *x, void *dst, int64_t n) {
    if (!x || !dst) return ag_errorf(AG_ERR_INVALID, "ag_quantize_act_row: NULL pointer");
    if (ag_act_row_bytes(f, n) == 0)
        return ag_errorf(AG_ERR_INVALID, "ag_quantize_act_row: bad format %d or length %lld", (int)f, (long long)n);
    const ag_quant_kernels *k = ag_quant_kernels_active();
    switch (f) {
    case AG_ACT_F32: memmove(dst, x, (size_t)n * 4); break;
    case AG_ACT_Q8A: k->quant_q8a(x, dst, n); break;
    case AG_ACT_Q8K: k->quant_q8k(x, dst, n); break;
    }
    return AG_OK;
}

size_t ag_panel_row_bytes(ag_act_format f, int64_t n) {
    if (n <= 0) return 0;
    switch (f) {
    case AG_ACT_F32: return 0;
    case AG_ACT_Q8A: return n % AG_QK ? 0 : (size_t)(n / AG_QK) * sizeof(ag_panel_q8a);
    case AG_ACT_Q8K: return n % AG_QK_K ? 0 : (size_t)(n / AG_QK_K) * sizeof(ag_panel_q8k);
    }
    return 0;
}

/* Token t's scale and block sums of Q8_K block y into panel block P (an
 * ag_panel_q8k or an ag_wpanel_q8k: the same fields, different lane counts):
 * d, the sub-block sums, and the sums of sub-block pairs (|sum| <= 32 * 127). */
#define PANEL_Q8K_SUMS(P, t, y)                                                                                  \
    do {                                                                                                         \
        (P).d[t] = (y)->d;                                                                                       \
        for (int i_ = 0; i_ < AG_QK_K / 32; i_++)                                                                \
            (P).bsums[i_][t][0] = (y)->bsums[2 * i_], (P).bsums[i_][t][1] = (y)->bsums[2 * i_ + 1];              \
        for (int i_ = 0; i_ < AG_QK_K / 64; i_++)                                                                \
            for (int k_ = 0; k_ < 2; k_++)                                                                       \
                (P).bpair[i_][t][k_] = (int16_t)((y)->bsums[4 * i_ + 2 * k_] + (y)->bsums[4 * i_ + 2 * k_ + 1]); \
    } while (0)

/* Pure data movement: a panel holds exactly the rows' values, so kernels
 * reading it compute with the same numbers as the dot kernels. Lanes of
 * missing tokens are zero (d = 0, q = 0): finite, and never stored. */
void ag_panel_pack(ag_act_format f, const void *x, size_t x_stride, int nt, int64_t n, void *dst) {
    const uint8_t *xb = x;
    if (f == AG_ACT_Q8K) {
        ag_panel_q8k *p = dst;
        for (int64_t b = 0; b < n / AG_QK_K; b++) {
            memset(&p[b], 0, sizeof p[b]);
            for (int t = 0; t < nt; t++) {
                const ag_block_q8_K *y = (const ag_block_q8_K *)(xb + (size_t)t * x_stride) + b;
                PANEL_Q8K_SUMS(p[b], t, y);
                for (int c = 0; c < AG_QK_K / 4; c++) memcpy(p[b].qs[c][t], y->qs + 4 * c, 4);
            }
        }
    } else if (f == AG_ACT_Q8A) {
        ag_panel_q8a *p = dst;
        for (int64_t b = 0; b < n / AG_QK; b++) {
            memset(&p[b], 0, sizeof p[b]);
            for (int t = 0; t < nt; t++) {
                const ag_block_q8a *y = (const ag_block_q8a *)(xb + (size_t)t * x_stride) + b;
                int32_t             sum = 0;
                p[b].d[t] = y->d;
                p[b].s[t] = y->s;
                for (int j = 0; j < AG_QK; j++) sum += y->qs[j];
                p[b].sum[t] = sum;
                for (int c = 0; c < AG_QK / 4; c++) memcpy(p[b].qs[c][t], y->qs + 4 * c, 4);
            }
        }
    }
}

size_t ag_wpanel_row_bytes(int64_t n) {
    return n > 0 && n % AG_QK_K == 0 ? (size_t)(n / AG_QK_K) * sizeof(ag_wpanel_q8k) : 0;
}

void ag_wpanel_pack(const void *x, size_t x_stride, int nt, int64_t n, void *dst, bool lanes16) {
    ag_wpanel_q8k *p = dst;
    for (int64_t b = 0; b < n / AG_QK_K; b++) {
        memset(&p[b], 0, sizeof p[b]);
        for (int t = 0; t < nt; t++) {
            const ag_block_q8_K *y = (const ag_block_q8_K *)((const uint8_t *)x + (size_t)t * x_stride) + b;
            PANEL_Q8K_SUMS(p[b], t, y);
            if (lanes16)
                for (int g = 0; g < AG_QK_K / 16; g++) memcpy(p[b].qs16[g][t], y->qs + 16 * g, 16);
            else
                for (int c = 0; c < AG_QK_K / 8; c++) memcpy(p[b].qs[c][t], y->qs + 8 * c, 8);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* scalar dot products                                                      */

#define XROW(t) ((const uint8_t *)x + (size_t)(t) * x_stride)

static void dot_f32(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const uint8_t *wb = w;
    for (int t = 0; t < nx; t++) {
        const uint8_t *xb = XROW(t);
        float          s = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float a, b;
            memcpy(&a, wb + 4 * i, 4);
            memcpy(&b, xb + 4 * i, 4);
            s += a * b;
        }
        out[t] = s;
    }
}

static void dot_f16(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const uint8_t *wb = w;
    for (int t = 0; t < nx; t++) {
        const uint8_t *xb = XROW(t);
        float          s = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            float    b;
            memcpy(&h, wb + 2 * i, 2);
            memcpy(&b, xb + 4 * i, 4);
            s += F16(h) * b;
        }
        out[t] = s;
    }
}

static void dot_bf16(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const uint8_t *wb = w;
    for (int t = 0; t < nx; t++) {
        const uint8_t *xb = XROW(t);
        float          s = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            float    b;
            memcpy(&h, wb + 2 * i, 2);
            memcpy(&b, xb + 4 * i, 4);
            s += ag_bf16_to_fp32(h) * b;
        }
        out[t] = s;
    }
}

static void dot_q4_0(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q4_0 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += ((b[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((b[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
            s += (F16(b[i].d) * y[i].d) * (float)isum;
        }
        out[t] = s;
    }
}

static void dot_q4_1(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q4_1 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f, sm = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += (b[i].qs[j] & 0xF) * y[i].qs[j] + (b[i].qs[j] >> 4) * y[i].qs[j + 16];
            s += (F16(b[i].d) * y[i].d) * (float)isum;
            sm += F16(b[i].m) * y[i].s;
        }
        out[t] = s + sm;
    }
}

static void dot_q5_0(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q5_0 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            uint32_t qh = ld_u32(b[i].qh);
            int      isum = 0;
            for (int j = 0; j < 16; j++) {
                int q0 = ((b[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4) - 16;
                int q1 = ((b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
                isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
            }
            s += (F16(b[i].d) * y[i].d) * (float)isum;
        }
        out[t] = s;
    }
}

static void dot_q5_1(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q5_1 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f, sm = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            uint32_t qh = ld_u32(b[i].qh);
            int      isum = 0;
            for (int j = 0; j < 16; j++) {
                int q0 = (b[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
                int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                isum += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
            }
            s += (F16(b[i].d) * y[i].d) * (float)isum;
            sm += F16(b[i].m) * y[i].s;
        }
        out[t] = s + sm;
    }
}

static void dot_q8_0(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q8_0 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            int isum = 0;
            for (int j = 0; j < AG_QK; j++) isum += b[i].qs[j] * y[i].qs[j];
            s += (F16(b[i].d) * y[i].d) * (float)isum;
        }
        out[t] = s;
    }
}

/* MXFP4 as Q4_0 with a value table and a power-of-two scale: the doubled
 * E2M1 integers times the int8 activations are exact, as ggml's
 * ggml_vec_dot_mxfp4_q8_0 sums them. The activations' scale is rounded
 * through fp16 first: llama.cpp (the reference) stores its Q8_0
 * activations' d as fp16 (the same int8 values, from the float d), and
 * gpt-oss's routed experts (top-k choices, clamps, sinks) turn that 2^-11
 * difference, compounded over the layers, into different tokens; with the
 * reference's scale the products are its own. */
static void dot_mxfp4(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_mxfp4 *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8a *y = (const ag_block_q8a *)XROW(t);
        float               s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK; i++) {
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += ag_mxfp4_values[b[i].qs[j] & 0xF] * y[i].qs[j] + ag_mxfp4_values[b[i].qs[j] >> 4] * y[i].qs[j + 16];
            s += (ag_e8m0_half(b[i].e) * F16(ag_fp32_to_fp16(y[i].d))) * (float)isum;
        }
        out[t] = s;
    }
}

/* K-quants: Σ over a super-block = (d*dy) * Σ_k scale_k * Σ_{sub-block k} q*y
 * - (dmin*dy) * Σ_k min_k * Σ_{sub-block k} y, the y sums coming from bsums. */

static void dot_q2_K(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q2_K *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8_K *y = (const ag_block_q8_K *)XROW(t);
        float                s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK_K; i++) {
            int sumi = 0, summ = 0;
            for (int k = 0; k < 16; k++) {
                int isum = 0;
                for (int l = 0; l < 16; l++) {
                    int e = 16 * k + l, h = e >> 7, sh = (e >> 5) & 3;
                    isum += ((b[i].qs[h * 32 + (e & 31)] >> (2 * sh)) & 3) * y[i].qs[e];
                }
                sumi += (b[i].scales[k] & 0xF) * isum;
                summ += (b[i].scales[k] >> 4) * y[i].bsums[k];
            }
            s += (y[i].d * F16(b[i].d)) * (float)sumi - (y[i].d * F16(b[i].dmin)) * (float)summ;
        }
        out[t] = s;
    }
}

static void dot_q3_K(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q3_K *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8_K *y = (const ag_block_q8_K *)XROW(t);
        float                s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK_K; i++) {
            int8_t sc[16];
            ag_q3k_scales(b[i].scales, sc);
            int sumi = 0;
            for (int k = 0; k < 16; k++) {
                int isum = 0;
                for (int l = 0; l < 16; l++) {
                    int e = 16 * k + l, h = e >> 7, sh = (e >> 5) & 3;
                    int ql = (b[i].qs[h * 32 + (e & 31)] >> (2 * sh)) & 3;
                    int hb = (b[i].hmask[e & 31] >> (e >> 5)) & 1;
                    isum += (ql - (hb ? 0 : 4)) * y[i].qs[e];
                }
                sumi += sc[k] * isum;
            }
            s += (y[i].d * F16(b[i].d)) * (float)sumi;
        }
        out[t] = s;
    }
}

static void dot_q4_K(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q4_K *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8_K *y = (const ag_block_q8_K *)XROW(t);
        float                acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* canonical: ag_kquant_fold */
        for (int64_t i = 0; i < n / AG_QK_K; i++) {
            int sumi = 0, summ = 0;
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                ag_k4_scale_min(j, b[i].scales, &sc, &m);
                const uint8_t *q = b[i].qs + 32 * (j >> 1);
                int            shift = (j & 1) * 4, isum = 0;
                for (int l = 0; l < 32; l++) isum += ((q[l] >> shift) & 0xF) * y[i].qs[32 * j + l];
                sumi += sc * isum;
                summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
            }
            ag_kquant_fold(acc, i, y[i].d, F16(b[i].d), F16(b[i].dmin), sumi, summ);
        }
        out[t] = ag_kquant_total(acc);
    }
}

static void dot_q5_K(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q5_K *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8_K *y = (const ag_block_q8_K *)XROW(t);
        float                s = 0.0f;
        for (int64_t i = 0; i < n / AG_QK_K; i++) {
            int sumi = 0, summ = 0;
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                ag_k4_scale_min(j, b[i].scales, &sc, &m);
                const uint8_t *q = b[i].qs + 32 * (j >> 1);
                int            shift = (j & 1) * 4, isum = 0;
                for (int l = 0; l < 32; l++) {
                    int v = ((q[l] >> shift) & 0xF) | (((b[i].qh[l] >> j) & 1) << 4);
                    isum += v * y[i].qs[32 * j + l];
                }
                sumi += sc * isum;
                summ += m * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
            }
            s += (y[i].d * F16(b[i].d)) * (float)sumi - (y[i].d * F16(b[i].dmin)) * (float)summ;
        }
        out[t] = s;
    }
}

static void dot_q6_K(int64_t n, const void *w, const void *x, size_t x_stride, int nx, float *out) {
    const ag_block_q6_K *b = w;
    for (int t = 0; t < nx; t++) {
        const ag_block_q8_K *y = (const ag_block_q8_K *)XROW(t);
        float                acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* canonical: ag_kquant_fold */
        for (int64_t i = 0; i < n / AG_QK_K; i++) {
            int sumi = 0;
            for (int k = 0; k < 16; k++) {
                int isum = 0;
                for (int l = 0; l < 16; l++) isum += (q6k_value(&b[i], 16 * k + l) - 32) * y[i].qs[16 * k + l];
                sumi += b[i].scales[k] * isum;
            }
            ag_kquant_fold(acc, i, y[i].d, F16(b[i].d), 0.0f, sumi, 0);
        }
        out[t] = ag_kquant_total(acc);
    }
}

void ag_quant_kernels_scalar(ag_quant_kernels *k) {
    memset(k, 0, sizeof *k);
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
    k->quant_q8a = quant_q8a_scalar;
    k->quant_q8k = quant_q8k_scalar;
}

ag_status ag_vec_dot(uint32_t w_type, int64_t n, const void *w, const void *x, float *out) {
    ag_act_format f;
    ag_status     st = ag_quant_act_format(w_type, &f);
    if (st != AG_OK) return st;
    if (!w || !x || !out) return ag_errorf(AG_ERR_INVALID, "ag_vec_dot: NULL pointer");
    if (ag_quant_row_bytes(w_type, n) == 0)
        return ag_errorf(AG_ERR_INVALID, "ag_vec_dot: %lld elements is not a positive multiple of %s's block",
                         (long long)n, type_name(w_type));
    ag_quant_kernels_active()->dot[w_type](n, w, x, 0, 1, out);
    return AG_OK;
}

/* ------------------------------------------------------------------------ */
/* ISA dispatch                                                             */

static ag_quant_kernels                 g_kernels[3];
static ag_cpu_isa                       g_best;
static _Atomic int                      g_active = -1;
static pthread_once_t                   g_once = PTHREAD_ONCE_INIT;

static void isa_init(void) {
    g_best = AG_CPU_ISA_SCALAR;
#ifdef AG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
        g_best = AG_CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            g_best = AG_CPU_ISA_AVX512;
    }
#endif
    /* A level the CPU lacks keeps the table below it, so nothing can ever
     * call an unsupported instruction. */
    ag_quant_kernels_scalar(&g_kernels[0]);
    g_kernels[1] = g_kernels[0];
    if (g_best >= AG_CPU_ISA_AVX2) ag_quant_kernels_avx2(&g_kernels[1]);
    g_kernels[2] = g_kernels[1];
    if (g_best >= AG_CPU_ISA_AVX512) ag_quant_kernels_avx512(&g_kernels[2]);

    ag_cpu_isa  want = g_best;
    const char *env = ag_switch_text("AUGUR_CPU_ISA");
    if (env) {
        if (!strcmp(env, "scalar")) want = AG_CPU_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = AG_CPU_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = AG_CPU_ISA_AVX512;
        else AG_LOGW("AUGUR_CPU_ISA=%s is not one of scalar|avx2|avx512; using %s", env, ag_cpu_isa_name(g_best));
        if (want > g_best) {
            AG_LOGW("AUGUR_CPU_ISA=%s: this CPU only supports %s", env, ag_cpu_isa_name(g_best));
            want = g_best;
        }
    }
    atomic_store(&g_active, (int)want);
}

ag_cpu_isa ag_cpu_isa_best(void) {
    pthread_once(&g_once, isa_init);
    return g_best;
}

ag_cpu_isa ag_cpu_isa_active(void) {
    pthread_once(&g_once, isa_init);
    return (ag_cpu_isa)atomic_load_explicit(&g_active, memory_order_relaxed);
}

ag_status ag_cpu_isa_set(ag_cpu_isa isa) {
    pthread_once(&g_once, isa_init);
    if ((int)isa < 0 || isa > g_best)
        return ag_errorf(AG_ERR_UNSUPPORTED, "instruction set %s is not supported by this CPU (best: %s)",
                         ag_cpu_isa_name(isa), ag_cpu_isa_name(g_best));
    atomic_store(&g_active, (int)isa);
    return AG_OK;
}

const char *ag_cpu_isa_name(ag_cpu_isa isa) {
    switch (isa) {
    case AG_CPU_ISA_SCALAR: return "scalar";
    case AG_CPU_ISA_AVX2: return "avx2";
    case AG_CPU_ISA_AVX512: return "avx512";
    }
    return "?";
}

const ag_quant_kernels *ag_quant_kernels_active(void) {
    return &g_kernels[ag_cpu_isa_active()];
}
