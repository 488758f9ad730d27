/* Prompt-row matmul (ag_matmul_prompt): AMX tiles where the CPU has them,
 * else the VNNI tile kernels or the AVX2 token panels, else the dot kernels.
 *  - results match a float64 product of the dequantized weights within the
 *    activation-quantization bound;
 *  - a token's result is bit-identical whatever else is in the call (alone,
 *    among 37, shifted in the batch, one thread or three): the model relies
 *    on this so that a prompt's KV does not depend on its chunking.
 * Which path ran is printed; run with AUGUR_AMX=0 to test the fallback. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_amx.h"
#include "backend/cpu/quant.h"
#include "quant_testutil.h"

static const uint32_t k_types[] = {AG_TYPE_Q4_0, AG_TYPE_Q4_1, AG_TYPE_Q5_0, AG_TYPE_Q8_0,
                                   AG_TYPE_Q4_K, AG_TYPE_Q6_K, AG_TYPE_F16,  AG_TYPE_F32, AG_TYPE_Q5_1, AG_TYPE_MXFP4};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* n_out random rows of n_in elements, back to back. */
static uint8_t *random_matrix(uint32_t t, int64_t n_out, int64_t n_in) { return random_weights(t, n_out * n_in, NULL); }

static const char *path_name(uint32_t t) { return ag_matmul_prompt_kernel(t); }

static void prompt(ag_threadpool *pool, uint32_t t, const uint8_t *w, int64_t n_out, int64_t n_in, const float *x,
                   int64_t ldx, int64_t n_tok, float *y, int64_t ldy) {
    size_t need = ag_matmul_prompt_scratch_size(pool, t, n_in, n_tok);
    void  *scratch = malloc(need + 1);
    assert_int_equal(ag_matmul_prompt(pool, t, w, NULL, n_out, n_in, x, ldx, n_tok, y, ldy, scratch, need + 1), AG_OK);
    free(scratch);
}

static void case_float64(ag_threadpool *pool, uint32_t t, int64_t n_out, int64_t n_in, int64_t n_tok, int *checks) {
    int64_t  ldx = n_in + 5, ldy = n_out + 3;
    uint8_t *w = random_matrix(t, n_out, n_in);
    float   *x = malloc(sizeof(float) * (size_t)(n_tok * ldx)), *y = malloc(sizeof(float) * (size_t)(n_tok * ldy));
    float   *wf = malloc(sizeof(float) * (size_t)(n_out * n_in));
    for (int64_t i = 0; i < n_tok * ldx; i++) x[i] = nrand();
    /* an attention-sink-like token: a few huge channels */
    if (n_tok > 2) x[2 * ldx + 7] = 3.0e5f, x[2 * ldx + 40] = -9.0e4f;
    for (int64_t i = 0; i < n_tok * ldy; i++) y[i] = -12345.0f;
    assert_int_equal(ag_dequant_row(t, w, wf, n_out * n_in), AG_OK);
    prompt(pool, t, w, n_out, n_in, x, ldx, n_tok, y, ldy);
    ag_act_format f;
    ag_quant_act_format(t, &f);
    /* the bound for the coarser blocking covers the finer (AMX: 32) too */
    int64_t blk = f == AG_ACT_Q8A ? 32 : f == AG_ACT_Q8K ? 256 : 0;
    for (int64_t tok = 0; tok < n_tok; tok++) {
        const float *xr = x + tok * ldx;
        for (int64_t o = 0; o < n_out; o++) {
            const float *wr = wf + o * n_in;
            double       ref = 0, absd = 0, bound = 0;
            for (int64_t i = 0; i < n_in; i++) ref += (double)wr[i] * xr[i], absd += fabs((double)wr[i] * xr[i]);
            for (int64_t b = 0; blk && b < n_in / blk; b++) {
                double amax = 0, wabs = 0;
                for (int64_t i = b * blk; i < (b + 1) * blk; i++) amax = fmax(amax, fabs(xr[i])), wabs += fabs(wr[i]);
                bound += wabs * amax / 254.0;
            }
            double tol = 1.001 * bound + 2e-5 * absd + 1e-30, got = y[tok * ldy + o];
            if (!(fabs(got - ref) <= tol))
                fail_msg("prompt matmul (%s) type %u n_out=%lld n_in=%lld n_tok=%lld [%lld][%lld]: %.9g vs %.9g (tol %.3g)",
                         path_name(t), t, (long long)n_out, (long long)n_in, (long long)n_tok, (long long)tok,
                         (long long)o, got, ref, tol);
            (*checks)++;
        }
        for (int64_t o = n_out; o < ldy; o++) assert_true(y[tok * ldy + o] == -12345.0f);
    }
    free(w);
    free(x);
    free(y);
    free(wf);
}

static void prompt_matches_float64(void **state) {
    ag_threadpool       *pool;
    ag_threadpool_params prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    static const int64_t outs[] = {1, 17, 40}, toks[] = {1, 5, 16, 33};
    int                  checks = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = k_types[ti], be;
        ag_quant_block(t, &be, NULL);
        int64_t n_in = be == 256 ? 768 : 96;
        for (size_t oi = 0; oi < 3; oi++)
            for (size_t ki = 0; ki < 4; ki++) case_float64((oi + ki) & 1 ? pool : NULL, t, outs[oi], n_in, toks[ki], &checks);
        print_message("prompt matmul type %u: %s\n", t, path_name(t));
    }
    ag_threadpool_free(pool);
    print_message("prompt matmul: %d outputs checked against float64\n", checks);
}

/* The scratch ag_matmul_prompt_scratch_size asks for is enough, with many
 * threads and a misaligned start: the bytes just past it stay untouched.
 * (The AMX path's size once allowed 256 bytes for all its 64-byte
 * alignment, which 16 threads' slots overran at n_in = 896: a heap
 * overflow seen only on a 16-core AMX machine.) */
static void prompt_scratch_is_enough(void **state) {
    ag_threadpool       *pool;
    ag_threadpool_params prm = {.n_threads = 16, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    static const int64_t toks[] = {1, 37, 256}; /* 256: 16 tiles, so every thread quantizes one */
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = k_types[ti], be;
        ag_quant_block(t, &be, NULL);
        const int64_t n_in = be == 256 ? 2304 : 896, n_out = 19;
        uint8_t      *w = random_matrix(t, n_out, n_in);
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            const int64_t n_tok = toks[k];
            float        *x = malloc(sizeof(float) * (size_t)(n_tok * n_in)), *y = malloc(sizeof(float) * (size_t)(n_tok * n_out));
            for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = nrand();
            size_t   need = ag_matmul_prompt_scratch_size(pool, t, n_in, n_tok);
            uint8_t *buf = malloc(need + 1 + 256), *scratch = buf + 1; /* misaligned on purpose */
            memset(buf, 0xA5, need + 1 + 256);
            assert_int_equal(ag_matmul_prompt(pool, t, w, NULL, n_out, n_in, x, n_in, n_tok, y, n_out, scratch, need),
                             AG_OK);
            for (size_t i = 0; i < 256; i++)
                if (scratch[need + i] != 0xA5)
                    fail_msg("type %u (%s) n_in %lld n_tok %lld: byte %zu past the %zu-byte scratch was written", t,
                             path_name(t), (long long)n_in, (long long)n_tok, i, need);
            free(buf), free(x), free(y);
        }
        free(w);
    }
    ag_threadpool_free(pool);
}

static void prompt_token_invariance(void **state) {
    ag_threadpool       *pool;
    ag_threadpool_params prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    const int64_t n_out = 45, n_tok = 37;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t t = k_types[ti], be;
        ag_quant_block(t, &be, NULL);
        int64_t  n_in = be == 256 ? 512 : 160;
        uint8_t *w = random_matrix(t, n_out, n_in);
        float   *x = malloc(sizeof(float) * (size_t)(n_tok * n_in));
        float   *all = malloc(sizeof(float) * (size_t)(n_tok * n_out)), *part = malloc(sizeof(float) * (size_t)(n_tok * n_out));
        for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = nrand();
        prompt(pool, t, w, n_out, n_in, x, n_in, n_tok, all, n_out);
        for (int64_t tok = 0; tok < n_tok; tok++) { /* alone */
            prompt(tok & 1 ? pool : NULL, t, w, n_out, n_in, x + tok * n_in, n_in, 1, part, n_out);
            if (memcmp(part, all + tok * n_out, sizeof(float) * (size_t)n_out))
                fail_msg("type %u (%s): token %lld alone differs from the same token among %lld", t, path_name(t),
                         (long long)tok, (long long)n_tok);
        }
        for (int64_t s = 1; s < 20; s += 6) { /* shifted: token s+k lands at k */
            prompt(NULL, t, w, n_out, n_in, x + s * n_in, n_in, n_tok - s, part, n_out);
            if (memcmp(part, all + s * n_out, sizeof(float) * (size_t)((n_tok - s) * n_out)))
                fail_msg("type %u (%s): results change when the batch is shifted by %lld", t, path_name(t), (long long)s);
        }
        free(w);
        free(x);
        free(all);
        free(part);
    }
    ag_threadpool_free(pool);
}

/* ag_matmul_multi: each part bit-identical to its own ag_matmul (decode rows). */
static void multi_equals_separate(void **state) {
    ag_threadpool       *pool;
    ag_threadpool_params prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    const uint32_t types[4] = {AG_TYPE_Q4_K, AG_TYPE_Q5_0, AG_TYPE_Q6_K, AG_TYPE_F32};
    const int64_t  outs[4] = {40, 9, 23, 5}, n_in = 512;
    static const int64_t toks[] = {1, 3, 9};
    for (size_t ti = 0; ti < 3; ti++) {
        int64_t        n_tok = toks[ti];
        float         *x = malloc(sizeof(float) * (size_t)(n_tok * n_in));
        uint8_t       *w[4];
        float         *y[4], *ref[4];
        ag_matmul_part parts[4];
        for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = nrand();
        for (int p = 0; p < 4; p++) {
            w[p] = random_matrix(types[p], outs[p], n_in);
            y[p] = malloc(sizeof(float) * (size_t)(n_tok * outs[p]));
            ref[p] = malloc(sizeof(float) * (size_t)(n_tok * outs[p]));
            parts[p] = (ag_matmul_part){types[p], w[p], outs[p], y[p], outs[p]};
            assert_int_equal(ag_matmul(pool, types[p], w[p], outs[p], n_in, x, n_in, n_tok, ref[p], outs[p], NULL, 0),
                             AG_OK);
        }
        for (int k = 1; k <= 4; k++) {
            for (int p = 0; p < k; p++) memset(y[p], 0xFF, sizeof(float) * (size_t)(n_tok * outs[p]));
            assert_int_equal(ag_matmul_multi(k & 1 ? pool : NULL, parts, k, n_in, x, n_in, n_tok, NULL, 0), AG_OK);
            for (int p = 0; p < k; p++) assert_memory_equal(y[p], ref[p], sizeof(float) * (size_t)(n_tok * outs[p]));
        }
        assert_int_equal(ag_matmul_multi(pool, parts, 0, n_in, x, n_in, n_tok, NULL, 0), AG_ERR_INVALID);
        assert_int_equal(ag_matmul_multi(pool, parts, 5, n_in, x, n_in, n_tok, NULL, 0), AG_ERR_INVALID);
        for (int p = 0; p < 4; p++) free(w[p]), free(y[p]), free(ref[p]);
        free(x);
    }
    ag_threadpool_free(pool);
}

/* Decode rows as a speculative-decoding verify window sends them: every
 * window of 1..16 tokens gives each token the bits it gets alone (n_tok = 1,
 * the nx = 1 dot kernel), through ag_matmul and ag_matmul_multi, one thread
 * or three, with the caller's scratch sized by the *_scratch_size functions
 * and misaligned (the bytes past it stay untouched). Q4_K / Q6_K windows
 * take panel kernels from a few rows (decode_panel_kernel): the window
 * panels at the AVX2 level (1..4 panels of 4, ragged), the VNNI token
 * panels at the AVX-512 level (1..2 panels of 8); every SIMD level the CPU
 * has is run. The legacy types must stay on their dot kernels. Ragged
 * shapes: n_out not a multiple of 4, super-block counts off a multiple of 4
 * (1280 = 5). */
static void decode_window_invariance(void **state) {
    static const uint32_t types[] = {AG_TYPE_Q4_K, AG_TYPE_Q6_K, AG_TYPE_Q4_1, AG_TYPE_Q8_0, AG_TYPE_Q5_0};
    const int64_t         n_out = 37, n_win = 16;
    ag_threadpool        *pool;
    ag_threadpool_params  prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    int checks = 0;
    const int lowest = ag_cpu_isa_best() < AG_CPU_ISA_AVX2 ? (int)ag_cpu_isa_best() : AG_CPU_ISA_AVX2;
    for (int isa = lowest; isa <= (int)ag_cpu_isa_best(); isa++)
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        assert_int_equal(ag_cpu_isa_set((ag_cpu_isa)isa), AG_OK);
        const uint32_t t = types[ti];
        uint32_t       be;
        ag_quant_block(t, &be, NULL);
        const int64_t n_in = be == 256 ? 1280 : 160;
        uint8_t      *w = random_matrix(t, n_out, n_in), *w2 = random_matrix(t, 5, n_in);
        float        *x = malloc(sizeof(float) * (size_t)(n_win * n_in));
        float        *alone = malloc(sizeof(float) * (size_t)(n_win * n_out)), *y = malloc(sizeof(float) * (size_t)(n_win * n_out));
        float        *alone2 = malloc(sizeof(float) * (size_t)(n_win * 5)), *y2 = malloc(sizeof(float) * (size_t)(n_win * 5));
        for (int64_t i = 0; i < n_win * n_in; i++) x[i] = nrand();
        x[3 * n_in + 100] = 2.5e4f; /* an outlier channel */
        for (int64_t tok = 0; tok < n_win; tok++) {
            assert_int_equal(ag_matmul(NULL, t, w, n_out, n_in, x + tok * n_in, n_in, 1, alone + tok * n_out, n_out, NULL, 0), AG_OK);
            assert_int_equal(ag_matmul(NULL, t, w2, 5, n_in, x + tok * n_in, n_in, 1, alone2 + tok * 5, 5, NULL, 0), AG_OK);
        }
        for (int64_t n_tok = 1; n_tok <= n_win; n_tok++)
            for (int64_t first = 0; first + n_tok <= n_win; first += n_tok < 8 ? 5 : 16) {
                ag_threadpool *p = (n_tok + first) & 1 ? pool : NULL;
                const float   *xw = x + first * n_in;
                const size_t   ny = sizeof(float) * (size_t)(n_tok * n_out), ny2 = sizeof(float) * (size_t)(n_tok * 5);
                size_t         need = ag_matmul_scratch_size(t, n_in, n_tok);
                uint8_t       *buf = malloc(need + 1 + 256), *scratch = buf + 1; /* misaligned on purpose */
                memset(buf, 0xA5, need + 1 + 256);
                memset(y, 0xFF, ny);
                assert_int_equal(ag_matmul(p, t, w, n_out, n_in, xw, n_in, n_tok, y, n_out, scratch, need), AG_OK);
                if (memcmp(y, alone + first * n_out, ny))
                    fail_msg("type %u: a window of %lld decode rows (from token %lld) differs from its tokens alone", t,
                             (long long)n_tok, (long long)first);
                for (size_t i = 0; i < 256; i++)
                    if (scratch[need + i] != 0xA5) fail_msg("type %u, %lld rows: ag_matmul wrote past its scratch", t, (long long)n_tok);
                free(buf);
                /* two parts that read the same X */
                ag_matmul_part parts[2] = {{t, w, n_out, y, n_out}, {t, w2, 5, y2, 5}};
                need = ag_matmul_multi_scratch_size(parts, 2, n_in, n_tok);
                buf = malloc(need + 1 + 256), scratch = buf + 1;
                memset(buf, 0xA5, need + 1 + 256);
                memset(y, 0xFF, ny), memset(y2, 0xFF, ny2);
                assert_int_equal(ag_matmul_multi(p, parts, 2, n_in, xw, n_in, n_tok, scratch, need), AG_OK);
                if (memcmp(y, alone + first * n_out, ny) || memcmp(y2, alone2 + first * 5, ny2))
                    fail_msg("type %u: a window of %lld decode rows through ag_matmul_multi differs from its tokens alone",
                             t, (long long)n_tok);
                for (size_t i = 0; i < 256; i++)
                    if (scratch[need + i] != 0xA5)
                        fail_msg("type %u, %lld rows: ag_matmul_multi wrote past its scratch", t, (long long)n_tok);
                free(buf);
                checks += 2;
            }
        free(w), free(w2), free(x), free(alone), free(y), free(alone2), free(y2);
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("decode windows: %d bit-identity checks (SIMD levels %s..%s)\n", checks, ag_cpu_isa_name((ag_cpu_isa)lowest), ag_cpu_isa_name(ag_cpu_isa_best()));
    ag_threadpool_free(pool);
}

/* Q4_K and Q6_K parts in one ag_matmul_multi call share their activation
 * format (Q8_K) but may want different panel kinds (AVX-512: Q4_K on VNNI
 * token panels; Q6_K on the dot kernels, or on window panels under
 * AUGUR_CPU_WPANELS=1): every window of 1..16 rows gives each token the
 * bits it gets alone, at every SIMD level. */
static void multi_mixed_kquants(void **state) {
    const int64_t n_in = 768, n4 = 21, n6 = 13, n_win = 16;
    uint8_t      *w4 = random_matrix(AG_TYPE_Q4_K, n4, n_in), *w6 = random_matrix(AG_TYPE_Q6_K, n6, n_in);
    float        *x = malloc(sizeof(float) * (size_t)(n_win * n_in));
    float        *a4 = malloc(sizeof(float) * (size_t)(n_win * n4)), *a6 = malloc(sizeof(float) * (size_t)(n_win * n6));
    float        *y4 = malloc(sizeof(float) * (size_t)(n_win * n4)), *y6 = malloc(sizeof(float) * (size_t)(n_win * n6));
    for (int64_t i = 0; i < n_win * n_in; i++) x[i] = nrand();
    int       checks = 0;
    const int lowest = ag_cpu_isa_best() < AG_CPU_ISA_AVX2 ? (int)ag_cpu_isa_best() : AG_CPU_ISA_AVX2;
    for (int isa = lowest; isa <= (int)ag_cpu_isa_best(); isa++) {
        assert_int_equal(ag_cpu_isa_set((ag_cpu_isa)isa), AG_OK);
        for (int64_t t = 0; t < n_win; t++) {
            assert_int_equal(ag_matmul(NULL, AG_TYPE_Q4_K, w4, n4, n_in, x + t * n_in, n_in, 1, a4 + t * n4, n4, NULL, 0), AG_OK);
            assert_int_equal(ag_matmul(NULL, AG_TYPE_Q6_K, w6, n6, n_in, x + t * n_in, n_in, 1, a6 + t * n6, n6, NULL, 0), AG_OK);
        }
        for (int64_t n_tok = 1; n_tok <= n_win; n_tok++) {
            ag_matmul_part parts[2] = {{AG_TYPE_Q4_K, w4, n4, y4, n4}, {AG_TYPE_Q6_K, w6, n6, y6, n6}};
            assert_int_equal(ag_matmul_multi(NULL, parts, 2, n_in, x, n_in, n_tok, NULL, 0), AG_OK);
            if (memcmp(y4, a4, sizeof(float) * (size_t)(n_tok * n4)) || memcmp(y6, a6, sizeof(float) * (size_t)(n_tok * n6)))
                fail_msg("%s: a window of %lld rows of Q4_K + Q6_K parts differs from its tokens alone",
                         ag_cpu_isa_name((ag_cpu_isa)isa), (long long)n_tok);
            checks++;
        }
    }
    assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
    print_message("mixed K-quant parts: %d checks\n", checks);
    free(w4), free(w6), free(x), free(a4), free(a6), free(y4), free(y6);
}

/* Q4_K and Q6_K: the dot kernels (scalar, AVX2, AVX-512), the prompt path
 * without AMX (AVX2: the token-panel kernels, one thread or three), the AMX
 * tiles unpacking per call and the AMX tiles on a packed copy give the same bits
 * (ag_kquant_fold), which is what lets the server's decode batches of 16+
 * sequences move to AMX without changing any output. Partial panels (37
 * rows), super-block counts off a multiple of 4 (1280 = 5), outliers. */
static void kquant_paths_bit_identical(void **state) {
    const uint32_t       types[] = {AG_TYPE_Q4_K, AG_TYPE_Q6_K};
    static const int64_t ins[] = {768, 1280};
    static const int64_t toks[] = {1, 2, 3, 5, 12, 16, 37}; /* decode rows: window panels (AVX2) from 3 (Q4_K) / 7 (Q6_K) */
    ag_threadpool       *pool;
    ag_threadpool_params prm = {.n_threads = 3, .spin_us = 20};
    assert_int_equal(ag_threadpool_create(&prm, &pool), AG_OK);
    int checks = 0;
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t ii = 0; ii < 2; ii++)
            for (size_t ki = 0; ki < sizeof toks / sizeof toks[0]; ki++) {
                const uint32_t t = types[ti];
                const int64_t  n_out = 37, n_in = ins[ii], n_tok = toks[ki];
                uint8_t       *w = random_matrix(t, n_out, n_in);
                const size_t   ny = (size_t)(n_tok * n_out) * sizeof(float);
                float         *x = malloc(sizeof(float) * (size_t)(n_tok * n_in)), *ref = malloc(ny), *y = malloc(ny);
                for (int64_t i = 0; i < n_tok * n_in; i++) x[i] = nrand();
                if (n_tok > 3) x[3 * n_in + 100] = 2.5e4f; /* an outlier channel */
                assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_SCALAR), AG_OK);
                assert_int_equal(ag_matmul(pool, t, w, n_out, n_in, x, n_in, n_tok, ref, n_out, NULL, 0), AG_OK);
                /* every SIMD level, ending at the best (which the AMX checks below run with) */
                for (int isa = AG_CPU_ISA_AVX2; isa <= (int)ag_cpu_isa_best(); isa++) {
                    assert_int_equal(ag_cpu_isa_set((ag_cpu_isa)isa), AG_OK);
                    memset(y, 0, ny);
                    assert_int_equal(ag_matmul(pool, t, w, n_out, n_in, x, n_in, n_tok, y, n_out, NULL, 0), AG_OK);
                    if (memcmp(y, ref, ny)) fail_msg("type %u n_in %lld n_tok %lld: %s dot kernels differ from scalar", t,
                                                     (long long)n_in, (long long)n_tok, ag_cpu_isa_name((ag_cpu_isa)isa));
                    checks++;
                    if (ag_amx_available()) continue; /* the prompt path is AMX's, checked below */
                    /* the prompt path: the AVX2 token-panel kernels (AVX-512: its dot kernels) */
                    memset(y, 0, ny);
                    prompt(ki & 1 ? pool : NULL, t, w, n_out, n_in, x, n_in, n_tok, y, n_out);
                    if (memcmp(y, ref, ny)) fail_msg("type %u n_in %lld n_tok %lld: %s prompt path differs from the dot kernels",
                                                     t, (long long)n_in, (long long)n_tok, ag_cpu_isa_name((ag_cpu_isa)isa));
                    checks++;
                }
                assert_int_equal(ag_cpu_isa_set(ag_cpu_isa_best()), AG_OK);
                if (!ag_amx_available()) goto next;
                prompt(pool, t, w, n_out, n_in, x, n_in, n_tok, y, n_out);
                if (memcmp(y, ref, ny)) fail_msg("type %u n_in %lld n_tok %lld: AMX (unpacking) differs from the dot kernels",
                                                 t, (long long)n_in, (long long)n_tok);
                size_t pb = ag_amx_packed_size(t, n_out, n_in);
                assert_true(pb > 0);
                void *packed = malloc(pb), *scratch = NULL;
                assert_int_equal(ag_amx_pack(pool, t, w, n_out, n_in, packed), AG_OK);
                size_t need = ag_matmul_prompt_scratch_size(pool, t, n_in, n_tok);
                scratch = malloc(need);
                memset(y, 0, ny);
                /* past one token tile w is not read when a packed copy is
                 * given: pass garbage there (a window of up to 16 reads w) */
                uint8_t *junk = random_matrix(t, n_out, n_in);
                assert_int_equal(ag_matmul_prompt(pool, t, n_tok > 16 ? junk : w, packed, n_out, n_in, x, n_in, n_tok, y,
                                                  n_out, scratch, need),
                                 AG_OK);
                if (memcmp(y, ref, ny)) fail_msg("type %u n_in %lld n_tok %lld: AMX (packed) differs from the dot kernels",
                                                 t, (long long)n_in, (long long)n_tok);
                checks += 2;
                free(junk), free(packed), free(scratch);
            next:
                free(w), free(x), free(ref), free(y);
            }
    print_message("kquant: %d bit-identity checks (%s)\n", checks,
                  ag_amx_available() ? "dot, AMX, AMX packed" : "dot and prompt path per ISA, no AMX");
    ag_threadpool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prompt_matches_float64),
        cmocka_unit_test(prompt_token_invariance),
        cmocka_unit_test(prompt_scratch_is_enough),
        cmocka_unit_test(multi_equals_separate),
        cmocka_unit_test(decode_window_invariance),
        cmocka_unit_test(multi_mixed_kquants),
        cmocka_unit_test(kquant_paths_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
