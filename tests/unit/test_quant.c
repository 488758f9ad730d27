/* Unit tests for src/backend/cpu/quant: dequantization against gguf-py's
 * (tests/data/quant, written by scripts/quant_reference.py), fp16/bf16
 * conversion against the compiler's and hardware conversions, activation
 * quantization bounds, and every dot product: each SIMD variant against the
 * scalar reference, and the scalar reference against a float64 dot.
 *
 * Tolerances (stated once, used below):
 *   dequantization            bit-exact (same float32 operations as gguf-py)
 *   SIMD dot vs scalar dot    |Δ| <= 1e-5 * Σ|w_i * xq_i| (integer block sums
 *                             are exact in both; only float summation order
 *                             differs)
 *   scalar dot vs float64 dot of the dequantized weights with the quantized
 *                             activations: the same 1e-5 relative bound (this
 *                             checks the integer/scale algebra)
 *   scalar dot vs float64 dot with the float activations: the activation
 *                             rounding bound Σ_i |w_i| * d_block(i)/2 (each
 *                             |x - d*q| <= d/2), plus the 1e-5 term.
 *   matmul vs float64 X·W^T   per output: 1.001 * Σ_i |w_i| * (max|x| of i's
 *                             block)/254 (activation rounding) + 2e-5 *
 *                             Σ_i |w_i * x_i| (float sums); float weight
 *                             types only the second term. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_impl.h"
#include "base/threadpool.h"
#include "quant_testutil.h"

/* ---- helpers ---- */

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static const uint32_t k_dot_types[] = {AG_TYPE_F32,  AG_TYPE_F16,  AG_TYPE_BF16, AG_TYPE_Q4_0, AG_TYPE_Q4_1,
                                       AG_TYPE_Q5_0, AG_TYPE_Q5_1, AG_TYPE_Q8_0, AG_TYPE_Q2_K, AG_TYPE_Q3_K,
                                       AG_TYPE_Q4_K, AG_TYPE_Q5_K, AG_TYPE_Q6_K, AG_TYPE_MXFP4};
#define N_DOT_TYPES (sizeof k_dot_types / sizeof k_dot_types[0])

static const char *tname(uint32_t t) {
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
    case AG_TYPE_MXFP4: return "MXFP4";
    }
    return "?";
}

/* Offsets of a block's fp16 scale fields (d, and m/dmin). */
static ag_cpu_isa isas[3];
static int        n_isas;
static void       collect_isas(void) {
    n_isas = 0;
    for (int i = 0; i <= (int)ag_cpu_isa_best(); i++) isas[n_isas++] = (ag_cpu_isa)i;
}

/* ---- dequantization vs gguf-py ---- */

static const char *data_dir(void) {
    const char *d = getenv("AUGUR_QUANT_DATA");
    return d && *d ? d : "tests/data/quant";
}

static void dequant_matches_gguf_py(void **state) {
    static const uint32_t types[] = {AG_TYPE_F32,  AG_TYPE_F16,  AG_TYPE_BF16, AG_TYPE_Q4_0, AG_TYPE_Q4_1,
                                     AG_TYPE_Q5_0, AG_TYPE_Q5_1, AG_TYPE_Q8_0, AG_TYPE_Q2_K, AG_TYPE_Q3_K,
                                     AG_TYPE_Q4_K, AG_TYPE_Q5_K, AG_TYPE_Q6_K, AG_TYPE_MXFP4};
    int total_blocks = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.bin", data_dir(), tname(types[ti]));
        FILE *f = fopen(path, "rb");
        if (!f) fail_msg("missing reference data %s (run scripts/quant_reference.py)", path);
        char     magic[8];
        uint32_t hdr[6];
        assert_int_equal(fread(magic, 1, 8, f), 8);
        assert_memory_equal(magic, "AGQREF01", 8);
        assert_int_equal(fread(hdr, 4, 6, f), 6);
        uint32_t type = hdr[0], elems = hdr[1], bytes = hdr[2], nb = hdr[3];
        assert_int_equal(type, types[ti]);
        uint32_t be, bb;
        assert_int_equal(ag_quant_block(type, &be, &bb), AG_OK);
        assert_int_equal(be, elems);
        assert_int_equal(bb, bytes);
        uint8_t *blocks = malloc((size_t)nb * bytes + 1);
        float   *want = malloc((size_t)nb * elems * 4);
        float   *got = malloc((size_t)nb * elems * 4);
        assert_int_equal(fread(blocks, bytes, nb, f), nb);
        assert_int_equal(fread(want, (size_t)elems * 4, nb, f), nb);
        fclose(f);

        /* block by block, bit for bit */
        for (uint32_t b = 0; b < nb; b++) {
            assert_int_equal(ag_dequant_row(type, blocks + (size_t)b * bytes, got, elems), AG_OK);
            for (uint32_t j = 0; j < elems; j++) {
                float w = want[(size_t)b * elems + j];
                if (f2u(got[j]) != f2u(w))
                    fail_msg("%s block %u element %u: got %.9g (0x%08x), gguf-py %.9g (0x%08x)", tname(type), b,
                             j, got[j], f2u(got[j]), w, f2u(w));
            }
        }
        /* the whole run as one row, from an odd address (alignment must not matter) */
        memmove(blocks + 1, blocks, (size_t)nb * bytes);
        assert_int_equal(ag_dequant_row(type, blocks + 1, got, (int64_t)nb * elems), AG_OK);
        assert_memory_equal(got, want, (size_t)nb * elems * 4);
        memmove(blocks, blocks + 1, (size_t)nb * bytes);

        /* the row converters (F16C under the SIMD ISAs) agree too */
        if (type == AG_TYPE_F16 || type == AG_TYPE_BF16) {
            for (int k = 0; k < n_isas; k++) {
                assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
                memset(got, 0, (size_t)nb * 4);
                if (type == AG_TYPE_F16) ag_fp16_to_fp32_row((const uint16_t *)blocks, got, nb);
                else ag_bf16_to_fp32_row((const uint16_t *)blocks, got, nb);
                assert_memory_equal(got, want, (size_t)nb * 4);
            }
            assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
        }
        total_blocks += (int)nb;
        free(blocks);
        free(want);
        free(got);
    }
    print_message("dequant: %d reference blocks over 13 types bit-exact\n", total_blocks);
}

/* ---- fp16 / bf16 ---- */

static void fp16_exhaustive(void **state) {
    float *row = malloc(65536 * 4);
    uint16_t *all = malloc(65536 * 2);
    for (uint32_t h = 0; h < 65536; h++) all[h] = (uint16_t)h;
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
        ag_fp16_to_fp32_row(all, row, 65536);
        for (uint32_t h = 0; h < 65536; h++) {
            float a = ag_fp16_to_fp32((uint16_t)h);
#ifdef __FLT16_MAX__
            _Float16 c;
            uint16_t hh = (uint16_t)h;
            memcpy(&c, &hh, 2);
            float ref = (float)c; /* the compiler's own conversion */
#else
            float ref = a;
#endif
            if (isnan(ref)) {
                assert_true(isnan(a));
                assert_true(isnan(row[h]));
                assert_int_equal(f2u(a) & 0x80000000u, f2u(ref) & 0x80000000u);
            } else {
                if (f2u(a) != f2u(ref)) fail_msg("fp16 0x%04x: %g vs %g", h, a, ref);
                assert_int_equal(f2u(row[h]), f2u(ref));
            }
            /* round trip of every non-NaN half is the identity */
            if (!isnan(a)) assert_int_equal(ag_fp32_to_fp16(a), h);
        }
    }
    /* fp32 -> fp16 rounding: against the compiler's _Float16, and the row
     * (F16C) path against the scalar one */
    enum { N = 200000 };
    float    *src = malloc(N * 4);
    uint16_t *dst = malloc(N * 2);
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i % 4 == 0) u = (u & 0x807FFFFF) | ((uint32_t)(100 + rnd() % 45) << 23); /* near fp16 range */
        if (i % 4 == 1) u = (u & 0x80001FFF) | 0x38000000 | (((uint32_t)rnd() & 0x3FF) << 13) | 0x1000; /* ties */
        memcpy(&src[i], &u, 4);
    }
    src[0] = 65504.0f, src[1] = 65519.99f, src[2] = 65520.0f, src[3] = 0x1p-25f, src[4] = 0x1.8p-25f;
    src[5] = 0x1p-24f * 1.5f, src[6] = INFINITY, src[7] = -0.0f;
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
        ag_fp32_to_fp16_row(src, dst, N);
        for (int i = 0; i < N; i++) {
            uint16_t a = ag_fp32_to_fp16(src[i]);
            if (isnan(src[i])) {
                assert_true((a & 0x7C00) == 0x7C00 && (a & 0x3FF));
                assert_true((dst[i] & 0x7C00) == 0x7C00 && (dst[i] & 0x3FF));
                continue;
            }
#ifdef __FLT16_MAX__
            _Float16 c = (_Float16)src[i];
            uint16_t ref;
            memcpy(&ref, &c, 2);
            if (a != ref) fail_msg("fp32 %a -> fp16: 0x%04x, compiler 0x%04x", src[i], a, ref);
#endif
            if (dst[i] != a) fail_msg("fp32 %a -> fp16: row 0x%04x, scalar 0x%04x", src[i], dst[i], a);
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    free(src);
    free(dst);
    free(row);
    free(all);
}

static void bf16_rounding(void **state) {
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i % 3 == 0) u = (u & 0xFFFF0000u) | 0x8000; /* exact ties */
        float f;
        memcpy(&f, &u, 4);
        uint16_t h = ag_fp32_to_bf16(f);
        if (isnan(f)) {
            assert_true(isnan(ag_bf16_to_fp32(h)));
            continue;
        }
        /* independent check: the nearest of the two bf16 neighbours, ties to even */
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double   dl = fabs((double)ag_bf16_to_fp32(lo) - f);
        double   dh = isinf(ag_bf16_to_fp32(hi)) && !isinf(f)
                          ? (double)ldexp(1.0, 128) - fabs((double)f) /* next "value" past FLT_MAX */
                          : fabs((double)ag_bf16_to_fp32(hi) - f);
        uint16_t ref = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
        if ((u & 0xFFFF) == 0) ref = lo;
        if (h != ref) fail_msg("bf16 of %a (0x%08x): 0x%04x want 0x%04x", f, u, h, ref);
    }
}

/* ---- activation quantization ---- */

static void act_quant_bounds_and_isa_agreement(void **state) {
    const int64_t n = 4096;
    float        *x = malloc(n * 4), *back = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = nrand() * (i % 97 == 0 ? 20.0f : 1.0f);
    for (int64_t i = 0; i < 32; i++) x[i] = 0.0f; /* an all-zero block */
    for (int f = AG_ACT_Q8A; f <= AG_ACT_Q8K; f++) {
        size_t   rb = ag_act_row_bytes((ag_act_format)f, n);
        uint8_t *ref = malloc(rb), *got = malloc(rb);
        assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_SCALAR), AG_OK);
        assert_int_equal(ag_quantize_act_row((ag_act_format)f, x, ref, n), AG_OK);
        /* every element within d/2 of its value; d = max|x|/127 per block */
        int64_t blk = f == AG_ACT_Q8A ? 32 : 256;
        for (int64_t b = 0; b < n / blk; b++) {
            float amax = 0, d;
            for (int64_t j = 0; j < blk; j++) amax = fmaxf(amax, fabsf(x[b * blk + j]));
            if (f == AG_ACT_Q8A) {
                const ag_block_q8a *q = (const ag_block_q8a *)ref + b;
                d = q->d;
                int s = 0;
                for (int j = 0; j < 32; j++) {
                    assert_true(fabsf(x[b * 32 + j] - d * q->qs[j]) <= d * 0.5f * 1.0001f + 1e-30f);
                    s += q->qs[j];
                }
                assert_true(fabsf(q->s - d * (float)s) <= 1e-6f * fabsf(d * (float)s));
            } else {
                const ag_block_q8_K *q = (const ag_block_q8_K *)ref + b;
                d = q->d;
                for (int j = 0; j < 256; j++)
                    assert_true(fabsf(x[b * 256 + j] - d * q->qs[j]) <= d * 0.5f * 1.0001f + 1e-30f);
                for (int k = 0; k < 16; k++) {
                    int s = 0;
                    for (int j = 0; j < 16; j++) s += q->qs[16 * k + j];
                    assert_int_equal(q->bsums[k], s);
                }
            }
            assert_true(fabsf(d - amax / 127.0f) <= 1e-7f * amax);
        }
        /* dequantizing Q8K through ag_dequant_row gives d*q */
        if (f == AG_ACT_Q8K) {
            assert_int_equal(ag_dequant_row(AG_TYPE_Q8_K, ref, back, n), AG_OK);
            for (int64_t i = 0; i < n; i++) {
                const ag_block_q8_K *q = (const ag_block_q8_K *)ref + i / 256;
                assert_true(back[i] == q->d * (float)q->qs[i % 256]);
            }
        }
        /* the SIMD quantizers are bit-identical to the scalar one */
        for (int k = 1; k < n_isas; k++) {
            assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
            memset(got, 0x55, rb);
            assert_int_equal(ag_quantize_act_row((ag_act_format)f, x, got, n), AG_OK);
            assert_memory_equal(got, ref, rb);
        }
        free(ref);
        free(got);
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    free(x);
    free(back);
}

/* The word-parallel scale unpackers of the SIMD kernels against the
 * per-element definitions (which dequantization checks against gguf-py). */
static void scale_unpackers_match(void **state) {
    for (int it = 0; it < 100000; it++) {
        uint8_t q[12], out[16];
        for (int i = 0; i < 12; i++) q[i] = (uint8_t)rnd();
        ag_k4_scales_unpack(q, out);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            ag_k4_scale_min(j, q, &sc, &m);
            assert_int_equal(out[j], sc);
            assert_int_equal(out[8 + j], m);
        }
        int8_t ref[16];
        ag_q3k_scales(q, ref);
        ag_q3k_scales_unpack(q, out);
        for (int k = 0; k < 16; k++) assert_int_equal((int)out[k] - 32, ref[k]);
    }
}

/* ---- dot products ---- */

typedef struct {
    double dot;    /* Σ w_i * xq_i in float64 (xq: the dequantized activation) */
    double abs;    /* Σ |w_i * xq_i| */
    double dot_x;  /* Σ w_i * x_i with the float activations */
    double bound;  /* Σ |w_i| * d_block(i) / 2: the activation rounding bound */
} dot_ref;

static dot_ref reference_dot(uint32_t t, int64_t n, const uint8_t *w, const float *x, const void *xq) {
    float *wf = malloc(n * 4), *xf = malloc(n * 4);
    assert_int_equal(ag_dequant_row(t, w, wf, n), AG_OK);
    ag_act_format f;
    assert_int_equal(ag_quant_act_format(t, &f), AG_OK);
    dot_ref r = {0};
    for (int64_t i = 0; i < n; i++) {
        double d = 0;
        if (f == AG_ACT_F32) xf[i] = x[i];
        else if (f == AG_ACT_Q8A) {
            const ag_block_q8a *b = (const ag_block_q8a *)xq + i / 32;
            /* MXFP4 takes the scale rounded through fp16, as llama.cpp's Q8_0 activations */
            const float bd = t == AG_TYPE_MXFP4 ? ag_fp16_to_fp32(ag_fp32_to_fp16(b->d)) : b->d;
            xf[i] = bd * (float)b->qs[i % 32];
            d = bd;
        } else {
            const ag_block_q8_K *b = (const ag_block_q8_K *)xq + i / 256;
            xf[i] = b->d * (float)b->qs[i % 256];
            d = b->d;
        }
        r.dot += (double)wf[i] * xf[i];
        r.abs += fabs((double)wf[i] * xf[i]);
        r.dot_x += (double)wf[i] * x[i];
        r.bound += fabs((double)wf[i]) * d * 0.5;
    }
    free(wf);
    free(xf);
    return r;
}

static void dot_variants_agree(void **state) {
    static const int64_t lens_k[] = {256, 512, 1024, 2304, 4096};
    static const int64_t lens_32[] = {32, 96, 160, 256, 1056, 4096}; /* odd block counts too */
    static const int64_t lens_f[] = {1, 7, 8, 15, 16, 33, 47, 256, 1000, 4096};
    int                  checks = 0;
    for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
        uint32_t      t = k_dot_types[ti];
        ag_act_format f;
        assert_int_equal(ag_quant_act_format(t, &f), AG_OK);
        int            is_float = f == AG_ACT_F32;
        const int64_t *lens = is_float ? lens_f : f == AG_ACT_Q8A ? lens_32 : lens_k;
        size_t         nl = is_float ? sizeof lens_f / 8 : f == AG_ACT_Q8A ? sizeof lens_32 / 8 : sizeof lens_k / 8;
        for (size_t li = 0; li < nl; li++) {
            int64_t n = lens[li];
            for (int rep = 0; rep < 3; rep++) {
                uint8_t *w = random_weights(t, n, NULL);
                /* 4 activation rows, stored x_stride bytes apart */
                size_t   rb = ag_act_row_bytes(f, n), stride = rb + 8;
                float   *x = malloc(4 * n * 4);
                uint8_t *xq = malloc(4 * stride);
                for (int64_t i = 0; i < 4 * n; i++) x[i] = nrand() * (rep == 2 ? 100.0f : 1.0f);
                assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_SCALAR), AG_OK);
                for (int r = 0; r < 4; r++)
                    assert_int_equal(ag_quantize_act_row(f, x + r * n, xq + r * stride, n), AG_OK);
                dot_ref ref[4];
                float   sc[4];
                for (int r = 0; r < 4; r++) {
                    ref[r] = reference_dot(t, n, w, x + r * n, xq + r * stride);
                    assert_int_equal(ag_vec_dot(t, n, w, xq + r * stride, &sc[r]), AG_OK);
                    double tol = 1e-5 * ref[r].abs + 1e-30;
                    if (fabs(sc[r] - ref[r].dot) > tol)
                        fail_msg("%s n=%lld scalar %.9g vs float64 %.9g (tol %.3g)", tname(t), (long long)n, sc[r],
                                 ref[r].dot, tol);
                    double tolx = ref[r].bound * 1.001 + 1e-5 * ref[r].abs + 1e-30;
                    if (fabs(sc[r] - ref[r].dot_x) > tolx)
                        fail_msg("%s n=%lld scalar %.9g vs float64 with float x %.9g (tol %.3g)", tname(t),
                                 (long long)n, sc[r], ref[r].dot_x, tolx);
                }
                const ag_quant_kernels *kscalar = ag_quant_kernels_active();
                for (int k = 0; k < n_isas; k++) {
                    assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
                    const ag_quant_kernels *kk = ag_quant_kernels_active();
                    for (int nx = 1; nx <= 4; nx++) {
                        float out[4] = {NAN, NAN, NAN, NAN};
                        kk->dot[t](n, w, xq, stride, nx, out);
                        for (int r = 0; r < nx; r++) {
                            double tol = 1e-5 * ref[r].abs + 1e-30;
                            if (!(fabs(out[r] - sc[r]) <= tol))
                                fail_msg("%s %s n=%lld nx=%d row %d: %.9g vs scalar %.9g (tol %.3g)",
                                         ag_cpu_isa_name(isas[k]), tname(t), (long long)n, nx, r, out[r], sc[r],
                                         tol);
                            checks++;
                        }
                    }
                    /* and from odd addresses */
                    uint8_t *w1 = malloc(ag_quant_row_bytes(t, n) + 1);
                    memcpy(w1 + 1, w, ag_quant_row_bytes(t, n));
                    uint8_t *x1 = malloc(4 * stride + 3);
                    memcpy(x1 + 3, xq, 4 * stride);
                    float out[4];
                    kk->dot[t](n, w1 + 1, x1 + 3, stride, 4, out);
                    for (int r = 0; r < 4; r++) assert_true(fabs(out[r] - sc[r]) <= 1e-5 * ref[r].abs + 1e-30);
                    free(w1);
                    free(x1);
                }
                (void)kscalar;
                free(w);
                free(x);
                free(xq);
            }
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("dot: %d SIMD/scalar comparisons over %d ISAs\n", checks, n_isas);
}


/* Per-token bit-invariance: a token's result must not depend on how many
 * other tokens share the dot call (nx) nor on which lane it occupies, or a
 * request's greedy output would depend on the batch it decodes in. Rows
 * 0..3 are laid out cyclically (0,1,2,3,0,1,2) so that a call of nx rows
 * starting at row s puts every row in every lane; each result must be
 * memcmp-equal to that row's nx == 1 result, for every type and ISA. */
static void dot_batch_invariant(void **state) {
    static const int64_t lens_k[] = {256, 512, 768, 2304};
    static const int64_t lens_32[] = {32, 64, 96, 160, 1056, 2048};
    static const int64_t lens_f[] = {1, 7, 8, 15, 16, 33, 47, 256, 1000};
    int                  checks = 0;
    for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
        uint32_t      t = k_dot_types[ti];
        ag_act_format f;
        assert_int_equal(ag_quant_act_format(t, &f), AG_OK);
        int            is_float = f == AG_ACT_F32;
        const int64_t *lens = is_float ? lens_f : f == AG_ACT_Q8A ? lens_32 : lens_k;
        size_t         nl = is_float ? sizeof lens_f / 8 : f == AG_ACT_Q8A ? sizeof lens_32 / 8 : sizeof lens_k / 8;
        for (size_t li = 0; li < nl; li++) {
            int64_t n = lens[li];
            for (int rep = 0; rep < 2; rep++) {
                uint8_t *w = random_weights(t, n, NULL);
                size_t   rb = ag_act_row_bytes(f, n), stride = rb + 4;
                float   *x = malloc(4 * n * 4);
                uint8_t *xq = malloc(7 * stride);
                /* rows of very different magnitudes, so that lanes differ */
                for (int r = 0; r < 4; r++)
                    for (int64_t i = 0; i < n; i++) x[r * n + i] = nrand() * (rep ? (r == 2 ? 1000.0f : 0.01f) : 1.0f);
                for (int r = 0; r < 7; r++)
                    assert_int_equal(ag_quantize_act_row(f, x + (r % 4) * n, xq + r * stride, n), AG_OK);
                float prev_one[4], scalar_one[4];
                for (int k = 0; k < n_isas; k++) {
                    assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
                    const ag_quant_kernels *kk = ag_quant_kernels_active();
                    float                   one[4];
                    for (int r = 0; r < 4; r++) kk->dot[t](n, w, xq + r * stride, stride, 1, &one[r]);
                    /* the 32-element types' AVX-512 kernels do the AVX2 kernels' exact float
                     * arithmetic (quant_avx512.c), so outputs do not change with the ISA level */
                    if (isas[k] == AG_CPU_ISA_AVX512 && f == AG_ACT_Q8A)
                        for (int r = 0; r < 4; r++)
                            if (memcmp(&one[r], &prev_one[r], sizeof(float)) != 0)
                                fail_msg("%s n=%lld row %d: avx512 %.9g vs avx2 %.9g", tname(t), (long long)n, r,
                                         one[r], prev_one[r]);
                    /* Q4_K / Q6_K: the AVX2 and AVX-512 kernels compute the scalar kernels'
                     * canonical arithmetic (ag_kquant_fold), bit for bit, as the AMX tiles do */
                    if (isas[k] == AG_CPU_ISA_SCALAR) memcpy(scalar_one, one, sizeof one);
                    if (isas[k] != AG_CPU_ISA_SCALAR && (t == AG_TYPE_Q4_K || t == AG_TYPE_Q6_K))
                        for (int r = 0; r < 4; r++)
                            if (memcmp(&one[r], &scalar_one[r], sizeof(float)) != 0)
                                fail_msg("%s n=%lld row %d: %s %.9g vs scalar %.9g", tname(t), (long long)n, r,
                                         ag_cpu_isa_name(isas[k]), one[r], scalar_one[r]);
                    memcpy(prev_one, one, sizeof one);
                    for (int nx = 2; nx <= 4; nx++)
                        for (int s = 0; s < 4; s++) {
                            float out[4] = {NAN, NAN, NAN, NAN};
                            kk->dot[t](n, w, xq + s * stride, stride, nx, out);
                            for (int l = 0; l < nx; l++) {
                                int r = (s + l) % 4;
                                if (memcmp(&out[l], &one[r], sizeof(float)) != 0)
                                    fail_msg("%s %s n=%lld nx=%d lane %d (row %d): %.9g (0x%08x) vs nx=1 %.9g (0x%08x)",
                                             ag_cpu_isa_name(isas[k]), tname(t), (long long)n, nx, l, r, out[l],
                                             f2u(out[l]), one[r], f2u(one[r]));
                                checks++;
                            }
                        }
                }
                free(w);
                free(x);
                free(xq);
            }
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("dot batch invariance: %d lane results checked over %d ISAs\n", checks, n_isas);
}

/* The GEMM tile kernels (where an ISA has them): every (row, token) output
 * of a tile equals the scalar dot of that pair, for weight rows and
 * activation rows at odd addresses and padded strides, odd block counts,
 * and every token count; outputs outside the tile stay untouched. */
static void gemm_tiles_agree(void **state) {
    static const int64_t lens_32[] = {32, 96, 640, 1056};
    static const int64_t lens_k[] = {256, 768};
    int                  checks = 0;
    for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
        uint32_t      t = k_dot_types[ti];
        ag_act_format f;
        assert_int_equal(ag_quant_act_format(t, &f), AG_OK);
        if (f == AG_ACT_F32) continue;
        const int64_t *lens = f == AG_ACT_Q8A ? lens_32 : lens_k;
        size_t         nl = f == AG_ACT_Q8A ? 4 : 2;
        for (size_t li = 0; li < nl; li++) {
            int64_t  n = lens[li];
            size_t   wrb = ag_quant_row_bytes(t, n), wstride = wrb + 5;
            uint8_t *w = random_weights(t, n * AG_GEMM_RM, NULL);
            uint8_t *wp = malloc(wstride * AG_GEMM_RM + 1); /* rows at odd addresses, padded */
            for (int r = 0; r < AG_GEMM_RM; r++) memcpy(wp + 1 + r * wstride, w + r * wrb, wrb);
            size_t   xrb = ag_act_row_bytes(f, n), xstride = xrb + 7;
            float   *x = malloc((size_t)(4 * n) * 4);
            uint8_t *xq = malloc(4 * xstride + 3);
            for (int64_t i = 0; i < 4 * n; i++) x[i] = nrand() * (li & 1 ? 50.0f : 1.0f);
            for (int k = 0; k < 4; k++)
                assert_int_equal(ag_quantize_act_row(f, x + k * n, xq + 3 + k * xstride, n), AG_OK);
            float  ref[AG_GEMM_RM][4];
            double absw[AG_GEMM_RM][4];
            assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_SCALAR), AG_OK);
            for (int r = 0; r < AG_GEMM_RM; r++)
                for (int k = 0; k < 4; k++) {
                    assert_int_equal(ag_vec_dot(t, n, w + r * wrb, xq + 3 + k * xstride, &ref[r][k]), AG_OK);
                    absw[r][k] = reference_dot(t, n, w + r * wrb, x + k * n, xq + 3 + k * xstride).abs;
                }
            for (int ik = 0; ik < n_isas; ik++) {
                assert_int_equal(ag_cpu_isa_set(isas[ik]), AG_OK);
                ag_gemm_fn g = ag_quant_kernels_active()->gemm[t];
                if (!g) continue;
                for (int nx = 1; nx <= 4; nx++) {
                    const int64_t ldy = AG_GEMM_RM + 2;
                    float         y[4 * (AG_GEMM_RM + 2)];
                    for (int i = 0; i < 4 * ldy; i++) y[i] = -12345.0f;
                    g(n, wp + 1, wstride, xq + 3, xstride, nx, y, ldy);
                    for (int k = 0; k < 4; k++)
                        for (int r = 0; r < ldy; r++) {
                            float v = y[k * ldy + r];
                            if (k >= nx || r >= AG_GEMM_RM) {
                                assert_true(v == -12345.0f);
                                continue;
                            }
                            double tol = 1e-5 * absw[r][k] + 1e-30;
                            if (!(fabs(v - ref[r][k]) <= tol))
                                fail_msg("%s %s gemm n=%lld nx=%d row %d tok %d: %.9g vs scalar %.9g",
                                         ag_cpu_isa_name(isas[ik]), tname(t), (long long)n, nx, r, k, v, ref[r][k]);
                            checks++;
                        }
                }
            }
            free(w);
            free(wp);
            free(x);
            free(xq);
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("gemm: %d tile outputs checked against scalar dots\n", checks);
}

/* Sets every byte of the wb bytes of blocks at w to `fill`, except the
 * fp16 scale fields (kept finite). */
static void fill_blocks(uint32_t t, uint8_t *w, size_t wb, uint8_t fill) {
    uint32_t be, bb;
    ag_quant_block(t, &be, &bb);
    int off[2], k = scale_offsets(t, off);
    for (size_t b = 0; b < wb / bb; b++) {
        uint8_t save[2][2];
        for (int j = 0; j < k; j++) memcpy(save[j], w + b * bb + off[j], 2);
        const uint8_t e = w[b * bb]; /* MXFP4's exponent byte */
        memset(w + b * bb, fill, bb);
        for (int j = 0; j < k; j++) memcpy(w + b * bb + off[j], save[j], 2);
        if (t == AG_TYPE_MXFP4) w[b * bb] = e;
    }
}

/* Extreme but valid blocks: all weight bits set, activations at ±127, to
 * exercise the int16 saturation limits of the SIMD paths. */
static void dot_extremes(void **state) {
    for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
        uint32_t      t = k_dot_types[ti];
        ag_act_format f;
        ag_quant_act_format(t, &f);
        if (f == AG_ACT_F32) continue;
        int64_t  n = 512;
        uint8_t *w = random_weights(t, n, NULL);
        size_t   wb = ag_quant_row_bytes(t, n);
        for (int pattern = 0; pattern < 3; pattern++) {
            fill_blocks(t, w, wb, pattern == 0 ? 0xFF : pattern == 1 ? 0x00 : 0x80);
            float *x = malloc(n * 4);
            for (int64_t i = 0; i < n; i++) x[i] = (i & 1) ? -1.0f : 1.0f;
            if (pattern == 2)
                for (int64_t i = 0; i < n; i++) x[i] = -1.0f;
            uint8_t *xq = malloc(ag_act_row_bytes(f, n));
            ag_quantize_act_row(f, x, xq, n);
            dot_ref ref = reference_dot(t, n, w, x, xq);
            for (int kk = 0; kk < n_isas; kk++) {
                assert_int_equal(ag_cpu_isa_set(isas[kk]), AG_OK);
                float out;
                assert_int_equal(ag_vec_dot(t, n, w, xq, &out), AG_OK);
                if (!(fabs(out - ref.dot) <= 1e-5 * ref.abs + 1e-30))
                    fail_msg("%s %s pattern %d: %.9g vs %.9g", ag_cpu_isa_name(isas[kk]), tname(t), pattern, out,
                             ref.dot);
            }
            free(x);
            free(xq);
        }
        free(w);
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
}

/* A panel layout: tokens per panel, bytes per panel row, packing, and the
 * active ISA's kernel of type t. */
typedef struct {
    const char *name;
    int         nt;
    size_t (*row_bytes)(ag_act_format f, int64_t n);
    void (*pack)(ag_act_format f, const void *x, size_t x_stride, int nt, int64_t n, void *dst);
    ag_panel_fn (*kernel)(uint32_t t);
} panel_kind;
static size_t      wpanel_row_bytes(ag_act_format f, int64_t n) { return f == AG_ACT_Q8K ? ag_wpanel_row_bytes(n) : 0; }
static void        wpanel_pack(ag_act_format f, const void *x, size_t x_stride, int nt, int64_t n, void *dst) {
    (void)f;
    ag_wpanel_pack(x, x_stride, nt, n, dst, ag_quant_kernels_active()->wpanel16);
}
static ag_panel_fn token_panel_kernel(uint32_t t) { return ag_quant_kernels_active()->panel[t]; }
static ag_panel_fn window_panel_kernel(uint32_t t) { return ag_quant_kernels_active()->wpanel[t]; }
static const panel_kind k_panel_kinds[] = {
    {"panel", AG_PANEL_NT, ag_panel_row_bytes, ag_panel_pack, token_panel_kernel},
    {"wpanel", AG_WPANEL_NT, wpanel_row_bytes, wpanel_pack, window_panel_kernel},
};

/* The token-panel and window-panel kernels (where an ISA has them), against
 * the scalar dot of each (row, token): Q4_K and Q6_K bit for bit
 * (ag_kquant_fold), the legacy types within the SIMD tolerance. And a (row,
 * token) result does not depend on the call: it is bit-identical to that
 * pair computed alone (one row, one token in lane 0) for every row count
 * 1..4, panel count 1..NP and token count, with outputs outside nr x nt
 * untouched. Weight rows at odd addresses; block counts off the kernels'
 * groups (9, 33, 5 super-blocks); pattern 1 has every weight bit set and
 * activations at ±127 (all of one sign in most tokens), the int16 limits
 * of the chunk sums. */
static void panel_kernels_agree(void **state) {
    enum { NR = 4, NT = 19, NP = 5 };
    int checks = 0;
    for (size_t kind = 0; kind < sizeof k_panel_kinds / sizeof k_panel_kinds[0]; kind++)
    for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
        const panel_kind *K = &k_panel_kinds[kind];
        const int         PT = K->nt;
        const uint32_t t = k_dot_types[ti];
        ag_act_format  f;
        assert_int_equal(ag_quant_act_format(t, &f), AG_OK);
        if (f == AG_ACT_F32 || K->row_bytes(f, AG_QK_K * 5) == 0) continue;
        const bool     canonical = t == AG_TYPE_Q4_K || t == AG_TYPE_Q6_K;
        const int64_t  lens_32[] = {96, 288, 1056}, lens_k[] = {256, 1280};
        const int64_t *lens = f == AG_ACT_Q8A ? lens_32 : lens_k;
        const size_t   nl = f == AG_ACT_Q8A ? 3 : 2;
        for (size_t li = 0; li < nl; li++)
            for (int pattern = 0; pattern < 2; pattern++) {
                const int64_t n = lens[li];
                const size_t  wrb = ag_quant_row_bytes(t, n), ws = wrb + 5, xrb = ag_act_row_bytes(f, n);
                const size_t  prb = K->row_bytes(f, n);
                uint8_t      *w = random_weights(t, n * NR, NULL), *wp = malloc(ws * NR + 1);
                if (pattern) fill_blocks(t, w, wrb * NR, 0xFF);
                for (int r = 0; r < NR; r++) memcpy(wp + 1 + r * ws, w + r * wrb, wrb);
                float   *x = malloc(sizeof(float) * (size_t)(NT * n));
                uint8_t *xq = malloc(xrb * NT);
                uint8_t *panels = aligned_alloc(64, (prb * NP + 63) / 64 * 64), *single = aligned_alloc(64, (prb + 63) / 64 * 64);
                for (int k = 0; k < NT; k++)
                    for (int64_t i = 0; i < n; i++)
                        x[k * n + i] = pattern ? (k % 3 == 2 ? ((i + k) % 3 ? 1.0f : -1.0f) : k & 1 ? -1.0f : 1.0f)
                                               : nrand() * (k % 3 == 1 ? 300.0f : 1.0f);
                for (int k = 0; k < NT; k++) assert_int_equal(ag_quantize_act_row(f, x + k * n, xq + k * xrb, n), AG_OK);
                float  ref[NR][NT];
                double absw[NR][NT];
                assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_SCALAR), AG_OK);
                for (int r = 0; r < NR; r++)
                    for (int k = 0; k < NT; k++) {
                        assert_int_equal(ag_vec_dot(t, n, w + r * wrb, xq + k * xrb, &ref[r][k]), AG_OK);
                        absw[r][k] = reference_dot(t, n, w + r * wrb, x + k * n, xq + k * xrb).abs;
                    }
                for (int ik = 0; ik < n_isas; ik++) {
                    assert_int_equal(ag_cpu_isa_set(isas[ik]), AG_OK);
                    ag_panel_fn pk = K->kernel(t);
                    if (!pk) continue;
                    /* packed per level: the window panels' lane width is the kernels' */
                    for (int p = 0; p < NP && PT * p < NT; p++)
                        K->pack(f, xq + (size_t)p * PT * xrb, xrb, NT - PT * p < PT ? NT - PT * p : PT, n, panels + p * prb);
                    float alone[NR][NT];
                    for (int k = 0; k < NT; k++) {
                        K->pack(f, xq + k * xrb, xrb, 1, n, single);
                        for (int r = 0; r < NR; r++) {
                            pk(n, wp + 1 + r * ws, ws, 1, single, prb, 1, 1, &alone[r][k], 1);
                            const float v = alone[r][k];
                            if (canonical ? memcmp(&v, &ref[r][k], sizeof v) != 0 : !(fabs(v - ref[r][k]) <= 1e-5 * absw[r][k] + 1e-30))
                                fail_msg("%s %s %s n=%lld pattern %d row %d tok %d: %.9g vs scalar dot %.9g",
                                         ag_cpu_isa_name(isas[ik]), tname(t), K->name, (long long)n, pattern, r, k, v, ref[r][k]);
                            checks++;
                        }
                    }
                    for (int nr = 1; nr <= NR; nr++)
                        for (int np = 1; np <= NP && PT * (np - 1) < NT; np++) {
                            const int nt = PT * np < NT ? PT * np - 2 * (nr & 1) : NT, ldy = nr + 2;
                            float     y[AG_PANEL_NT * NP * (NR + 2)];
                            for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = -12345.0f;
                            pk(n, wp + 1, ws, nr, panels, prb, np, nt, y, ldy);
                            for (int k = 0; k < PT * np; k++)
                                for (int r = 0; r < ldy; r++) {
                                    const float v = y[k * ldy + r];
                                    if (k >= nt || r >= nr) {
                                        assert_true(v == -12345.0f);
                                        continue;
                                    }
                                    if (memcmp(&v, &alone[r][k], sizeof v) != 0)
                                        fail_msg("%s %s %s n=%lld nr=%d np=%d nt=%d row %d tok %d: %.9g vs alone %.9g",
                                                 ag_cpu_isa_name(isas[ik]), tname(t), K->name, (long long)n, nr, np, nt, r, k, v,
                                                 alone[r][k]);
                                    checks++;
                                }
                        }
                }
                free(w), free(wp), free(x), free(xq), free(panels), free(single);
            }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("panels: %d outputs checked against scalar dots and against themselves alone\n", checks);
}

/* ---- errors ---- */

static void bad_input_is_an_error(void **state) {
    float   out[64];
    uint8_t buf[512] = {0};
    /* unsupported types: IQ formats, Q8_1, out-of-range ids */
    static const uint32_t bad[] = {AG_TYPE_Q8_1, AG_TYPE_IQ2_XXS, AG_TYPE_IQ4_NL, AG_TYPE_I8, AG_TYPE_F64, 4, 5,
                                   AG_TYPE_NVFP4, AG_TYPE_COUNT, 12345, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ag_dequant_row(bad[i], buf, out, 32), AG_ERR_UNSUPPORTED);
        assert_int_equal(ag_vec_dot(bad[i], 32, buf, buf, out), AG_ERR_UNSUPPORTED);
        assert_false(ag_quant_supported(bad[i]));
        assert_int_equal(ag_quant_row_bytes(bad[i], 32), 0);
        ag_act_format f;
        assert_int_equal(ag_quant_act_format(bad[i], &f), AG_ERR_UNSUPPORTED);
        assert_int_equal(ag_quant_block(bad[i], NULL, NULL), AG_ERR_UNSUPPORTED);
    }
    assert_int_equal(ag_vec_dot(AG_TYPE_Q8_K, 256, buf, buf, out), AG_ERR_UNSUPPORTED);
    /* lengths that are not a positive multiple of the block */
    assert_int_equal(ag_dequant_row(AG_TYPE_Q4_0, buf, out, 31), AG_ERR_INVALID);
    assert_int_equal(ag_dequant_row(AG_TYPE_Q4_K, buf, out, 32), AG_ERR_INVALID);
    assert_int_equal(ag_dequant_row(AG_TYPE_F32, buf, out, 0), AG_ERR_INVALID);
    assert_int_equal(ag_dequant_row(AG_TYPE_F32, buf, out, -4), AG_ERR_INVALID);
    assert_int_equal(ag_dequant_row(AG_TYPE_F32, NULL, out, 4), AG_ERR_INVALID);
    assert_int_equal(ag_vec_dot(AG_TYPE_Q6_K, 128, buf, buf, out), AG_ERR_INVALID);
    assert_int_equal(ag_vec_dot(AG_TYPE_Q4_0, 32, NULL, buf, out), AG_ERR_INVALID);
    assert_int_equal(ag_quantize_act_row(AG_ACT_Q8A, (const float *)buf, buf, 33), AG_ERR_INVALID);
    assert_int_equal(ag_quantize_act_row((ag_act_format)7, (const float *)buf, buf, 32), AG_ERR_INVALID);
    assert_int_equal(ag_quant_row_bytes(AG_TYPE_Q4_K, 255), 0);
    assert_int_equal(ag_quant_row_bytes(AG_TYPE_Q4_K, 512), 288);
    assert_int_equal(ag_act_row_bytes(AG_ACT_Q8K, 512), 584);
    assert_int_equal(ag_cpu_isa_set((ag_cpu_isa)9), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_cpu_isa_set((ag_cpu_isa)-1), AG_ERR_UNSUPPORTED);
    assert_true(strlen(ag_error_message()) > 0);
    /* non-finite activations: memory-safe, whatever the values */
    float xs[256];
    for (int i = 0; i < 256; i++) xs[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -1e30f;
    uint8_t q[512];
    assert_int_equal(ag_quantize_act_row(AG_ACT_Q8K, xs, q, 256), AG_OK);
    assert_int_equal(ag_quantize_act_row(AG_ACT_Q8A, xs, q, 256), AG_OK);
}

/* ---- matmul ---- */

static void matmul_case(ag_threadpool *pool, uint32_t t, int64_t n_out, int64_t n_in, int64_t n_tok, int *checks) {
    int64_t  ldx = n_in + 3, ldy = n_out + 2;
    uint8_t *w = random_weights(t, n_in * n_out, NULL); /* n_out rows back to back */
    float   *x = malloc((size_t)(n_tok * ldx) * 4), *y = malloc((size_t)(n_tok * ldy) * 4);
    float   *wf = malloc((size_t)(n_in * n_out) * 4);
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = nrand();
    for (int64_t i = 0; i < n_tok * ldy; i++) y[i] = -12345.0f; /* sentinel in the padding */
    assert_int_equal(ag_dequant_row(t, w, wf, n_in * n_out), AG_OK);
    ag_act_format f;
    ag_quant_act_format(t, &f);
    int64_t blk = f == AG_ACT_Q8A ? 32 : f == AG_ACT_Q8K ? 256 : 1;
    assert_int_equal(ag_matmul(pool, t, w, n_out, n_in, x, ldx, n_tok, y, ldy, NULL, 0), AG_OK);
    for (int64_t tok = 0; tok < n_tok; tok++) {
        const float *xr = x + tok * ldx;
        for (int64_t o = 0; o < n_out; o++) {
            const float *wr = wf + o * n_in;
            double       ref = 0, absd = 0, bound = 0;
            for (int64_t b = 0; b < n_in / blk; b++) {
                double amax = 0, wabs = 0;
                for (int64_t i = b * blk; i < (b + 1) * blk; i++) {
                    ref += (double)wr[i] * xr[i];
                    absd += fabs((double)wr[i] * xr[i]);
                    amax = fmax(amax, fabs(xr[i]));
                    wabs += fabs(wr[i]);
                }
                if (f != AG_ACT_F32) bound += wabs * amax / 254.0;
            }
            double tol = 1.001 * bound + 2e-5 * absd + 1e-30, got = y[tok * ldy + o];
            if (!(fabs(got - ref) <= tol))
                fail_msg("matmul %s %s n_out=%lld n_in=%lld n_tok=%lld [%lld][%lld]: %.9g vs %.9g (tol %.3g)",
                         ag_cpu_isa_name(ag_cpu_isa_active()), tname(t), (long long)n_out, (long long)n_in,
                         (long long)n_tok, (long long)tok, (long long)o, got, ref, tol);
            (*checks)++;
        }
        for (int64_t o = n_out; o < ldy; o++) assert_true(y[tok * ldy + o] == -12345.0f);
    }
    /* two-step form with a caller's buffer gives the same bits */
    if (f != AG_ACT_F32) {
        size_t   need = ag_matmul_scratch_size(t, n_in, n_tok);
        uint8_t *xq = malloc(need);
        float   *y2 = malloc((size_t)(n_tok * ldy) * 4);
        memcpy(y2, y, (size_t)(n_tok * ldy) * 4);
        assert_int_equal(ag_matmul_quantize_x(pool, f, x, ldx, n_tok, n_in, xq, need), AG_OK);
        assert_int_equal(ag_matmul_xq(pool, t, w, n_out, n_in, xq, n_tok, y2, ldy), AG_OK);
        assert_memory_equal(y, y2, (size_t)(n_tok * ldy) * 4);
        assert_int_equal(ag_matmul(pool, t, w, n_out, n_in, x, ldx, n_tok, y2, ldy, xq, need), AG_OK);
        assert_memory_equal(y, y2, (size_t)(n_tok * ldy) * 4);
        free(xq);
        free(y2);
    }
    free(w);
    free(x);
    free(y);
    free(wf);
}

static void matmul_matches_float64(void **state) {
    static const int64_t outs[] = {1, 5, 13, 37};
    static const int64_t toks[] = {1, 2, 3, 5, 7, 13};
    int                  checks = 0;
    ag_threadpool       *pools[2] = {NULL, NULL};
    ag_threadpool_params prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pools[1]), AG_OK);
    for (int k = 0; k < n_isas; k++) {
        assert_int_equal(ag_cpu_isa_set(isas[k]), AG_OK);
        for (size_t ti = 0; ti < N_DOT_TYPES; ti++) {
            uint32_t t = k_dot_types[ti], be;
            ag_quant_block(t, &be, NULL);
            int64_t base = be == 1 ? 40 : be == 32 ? 96 : 512;
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++)
                for (size_t ki = 0; ki < sizeof toks / sizeof toks[0]; ki++) {
                    int64_t n_in = base + (be == 1 ? (int64_t)(rnd() % 9) : 0);
                    matmul_case(pools[(oi + ki) & 1], t, outs[oi], n_in, toks[ki], &checks);
                }
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    ag_threadpool_free(pools[1]);
    print_message("matmul: %d outputs checked against float64\n", checks);
}

/* Many tokens (more than one token chunk) and many rows: the tiled result
 * equals per-token single dots. */
static void matmul_large_tiles(void **state) {
    const uint32_t types[] = {AG_TYPE_Q4_0, AG_TYPE_Q6_K, AG_TYPE_F16};
    ag_threadpool *pool;
    ag_threadpool_params prm = {.n_threads = 2, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    for (size_t ti = 0; ti < 3; ti++) {
        uint32_t t = types[ti];
        int64_t  n_in = 2048, n_out = 67, n_tok = 300;
        uint8_t *w = random_weights(t, n_in * n_out, NULL);
        float   *x = malloc((size_t)(n_tok * n_in) * 4), *y = malloc((size_t)(n_tok * n_out) * 4);
        for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = nrand();
        assert_int_equal(ag_matmul(pool, t, w, n_out, n_in, x, n_in, n_tok, y, n_out, NULL, 0), AG_OK);
        ag_act_format f;
        ag_quant_act_format(t, &f);
        size_t   rb = ag_act_row_bytes(f, n_in), wrb = ag_quant_row_bytes(t, n_in);
        uint8_t *xq = malloc(rb);
        for (int64_t tok = 0; tok < n_tok; tok += 7) {
            ag_quantize_act_row(f, x + tok * n_in, xq, n_in);
            for (int64_t o = 0; o < n_out; o++) {
                float d;
                assert_int_equal(ag_vec_dot(t, n_in, w + o * wrb, xq, &d), AG_OK);
                float got = y[tok * n_out + o];
                assert_true(fabsf(got - d) <= 1e-5f * (fabsf(d) + 1.0f));
            }
        }
        free(xq);
        free(w);
        free(x);
        free(y);
    }
    ag_threadpool_free(pool);
}

static void matmul_bad_input(void **state) {
    float   x[64] = {0}, y[64];
    uint8_t w[64] = {0}, q[64];
    assert_int_equal(ag_matmul(NULL, AG_TYPE_IQ2_XS, w, 1, 32, x, 32, 1, y, 1, NULL, 0), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q8_K, w, 1, 256, x, 256, 1, y, 1, NULL, 0), AG_ERR_UNSUPPORTED);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 1, 33, x, 33, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 1, 32, x, 31, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 2, 32, x, 32, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, -1, 32, x, 32, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, NULL, 1, 32, x, 32, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 1, 32, NULL, 32, 1, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 1, 32, x, 32, INT64_MAX / 2, y, 1, NULL, 0), AG_ERR_INVALID);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 0, 32, x, 32, 1, y, 1, NULL, 0), AG_OK);
    assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_0, w, 1, 32, x, 32, 0, y, 1, NULL, 0), AG_OK);
    assert_int_equal(ag_matmul_quantize_x(NULL, AG_ACT_Q8A, x, 32, 2, 32, q, 40), AG_ERR_INVALID); /* too small */
    assert_int_equal(ag_matmul_quantize_x(NULL, AG_ACT_Q8K, x, 32, 1, 32, q, 64), AG_ERR_INVALID);
    assert_int_equal(ag_matmul_xq(NULL, AG_TYPE_Q4_0, w, 1, 32, NULL, 1, y, 1), AG_ERR_INVALID);
    assert_int_equal(ag_matmul_scratch_size(AG_TYPE_Q4_K, 512, 2), 2 * 584);
    /* a window of 3+ may take the window panels (AVX2): its rows and its panels */
    assert_true(ag_matmul_scratch_size(AG_TYPE_Q4_K, 512, 3) >= 3 * 584);
    assert_int_equal(ag_matmul_scratch_size(AG_TYPE_F16, 512, 3), 0);
    assert_int_equal(ag_matmul_scratch_size(AG_TYPE_Q4_K, 500, 3), 0);
}

static int setup(void **state) {
    collect_isas();
    print_message("ISA: best %s, active %s\n", ag_cpu_isa_name(ag_cpu_isa_best()),
                  ag_cpu_isa_name(ag_cpu_isa_active()));
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dequant_matches_gguf_py),
        cmocka_unit_test(fp16_exhaustive),
        cmocka_unit_test(bf16_rounding),
        cmocka_unit_test(act_quant_bounds_and_isa_agreement),
        cmocka_unit_test(scale_unpackers_match),
        cmocka_unit_test(dot_variants_agree),
        cmocka_unit_test(dot_batch_invariant),
        cmocka_unit_test(gemm_tiles_agree),
        cmocka_unit_test(panel_kernels_agree),
        cmocka_unit_test(dot_extremes),
        cmocka_unit_test(bad_input_is_an_error),
        cmocka_unit_test(matmul_matches_float64),
        cmocka_unit_test(matmul_large_tiles),
        cmocka_unit_test(matmul_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
