/* The backend op harness (like llama.cpp's test-backend-ops): every op of a
 * backend against a double-precision reference computed here, and, for a
 * backend other than the CPU, against the CPU backend's op, each with a
 * stated tolerance; plus the batch-invariance speculative decoding relies
 * on (a decode row's result does not depend on the rest of the batch).
 *
 * The backend under test is AUGUR_TEST_DEVICE (cpu or cuda; default: cuda
 * when this build has it and a GPU is visible, else cpu). In a CPU-only
 * build this checks the CPU backend against the references; on a GPU
 * machine scripts/gpu_test.sh runs it with AUGUR_TEST_DEVICE=cuda.
 *
 * Tolerances are relative L2 errors ||out - ref|| / ||ref||:
 *   matmul, decode rows:  CPU 2e-2 for quantized weights (activations go
 *                         through int8 as in llama.cpp), 1e-5 for float
 *                         weights; CUDA 1e-5 (fp32 activations), 2e-2
 *                         for Q4_K/Q6_K (int8 activations: mmqv's dp4a
 *                         at 1-2 rows, the tensor cores beyond), 1e-2
 *                         for BF16 (BF16 activations, tensor cores)
 *   matmul, prompt rows:  CPU as above; CUDA 1e-2 (BF16 tensor cores)
 *   get_rows:             exact (== ag_dequant_row)
 *   norms, RoPE, adds,
 *   SiLU:                 1e-5
 *   attention:            1e-3 (q and the softmax weights pass through fp16,
 *                         as in llama.cpp; the fp16 KV is read back exactly);
 *                         a device backend within 5e-4 of the CPU's
 *   GELU:                 2e-3 (fp16-rounded like llama.cpp's table) */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "base/argmax.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/quant.h"
#include "kv/kv.h"
#include "quant_testutil.h"

static ag_backend *g_be;  /* under test */
static ag_backend *g_cpu; /* the reference backend (== g_be when testing the CPU) */
static bool        g_is_cpu;
/* Host copies of test weights live until teardown: a device backend keys
 * its weight copies by host address (a model's mapping never moves), so a
 * freed and reused address must not come back as another weight. */
static void  *g_weights[256];
static size_t g_n_weights;

static int setup(void **state) {
    ag_device   dev = ag_cuda_available() ? AG_DEVICE_CUDA : AG_DEVICE_CPU;
    const char *env = getenv("AUGUR_TEST_DEVICE");
    if (env && *env && !ag_device_parse(env, &dev)) return -1;
    ag_cpu_params cp = ag_cpu_default_params();
    if (ag_backend_new(AG_DEVICE_CPU, &cp, 0, &g_cpu)) return -1;
    if (dev == AG_DEVICE_CPU) {
        g_be = g_cpu;
    } else if (ag_backend_new(dev, &cp, 0, &g_be)) { /* kernels: AUGUR_CUDA_* switches (gpu_test.sh runs several) */
        fprintf(stderr, "cannot open %s: %s\n", ag_device_name(dev), ag_error_message());
        return -1;
    }
    g_is_cpu = g_be == g_cpu;
    fprintf(stderr, "backend under test: %s\n", g_be->ops->name);
    return 0;
}

static int teardown(void **state) {
    for (size_t i = 0; i < g_n_weights; i++) free(g_weights[i]);
    if (g_be != g_cpu) ag_backend_free(g_be);
    ag_backend_free(g_cpu);
    return 0;
}

/* ---- buffers on a backend ---- */

static void *dev_put(ag_backend *be, const void *host, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    assert_non_null(d);
    assert_int_equal(be->ops->upload(be, d, host, bytes), AG_OK);
    return d;
}
static void *dev_floats(ag_backend *be, size_t n) {
    void *d = be->ops->alloc(be, n * sizeof(float) + 1);
    assert_non_null(d);
    return d;
}
static float *host_get(ag_backend *be, const void *dev, size_t n) {
    float *h = malloc(n * sizeof(float) + 1);
    assert_non_null(h);
    assert_int_equal(be->ops->download(be, h, dev, n * sizeof(float)), AG_OK);
    return h;
}

static double rel_err(const float *out, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) return INFINITY;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static double rel_err_f(const float *out, const float *ref, size_t n) {
    double *r = malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = ref[i];
    double e = rel_err(out, r, n);
    free(r);
    return e;
}

static float *randn(size_t n, float scale) {
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) x[i] = nrand() * scale;
    return x;
}

/* A weight tensor of `type`, ne = [K, n_out], random valid blocks; the host
 * copy stays in t->host and its dequantized floats in *deq. */
static ag_tensor make_weight(ag_backend *be, uint32_t type, int K, int n_out, float **deq) {
    size_t   rb = ag_quant_row_bytes(type, K);
    uint8_t *all = malloc(rb * n_out);
    *deq = malloc(sizeof(float) * (size_t)K * n_out);
    for (int r = 0; r < n_out; r++) {
        size_t   b;
        uint8_t *row = random_weights(type, K, &b);
        memcpy(all + rb * r, row, rb);
        free(row);
        assert_int_equal(ag_dequant_row(type, all + rb * r, *deq + (size_t)K * r, K), AG_OK);
    }
    ag_tensor t = {.name = "w", .type = type, .ne = {K, n_out, 1, 1}, .row_bytes = rb, .data = all, .host = all};
    assert_true(g_n_weights < sizeof g_weights / sizeof g_weights[0]);
    g_weights[g_n_weights++] = all;
    if (be->ops->prepare_weight) assert_int_equal(be->ops->prepare_weight(be, &t), AG_OK);
    return t;
}

/* ---- matmul ---- */

typedef struct {
    uint32_t type;
    int      K;
} mm_case;

static const mm_case k_mm_cases[] = {
    {AG_TYPE_F32, 172}, {AG_TYPE_F16, 200}, {AG_TYPE_BF16, 96}, {AG_TYPE_Q4_0, 512}, {AG_TYPE_Q4_1, 576},
    {AG_TYPE_Q5_0, 512}, {AG_TYPE_Q5_1, 256}, {AG_TYPE_Q8_0, 896}, {AG_TYPE_Q4_K, 512}, {AG_TYPE_Q6_K, 768},
    /* rows long enough for the GEMVs' blocks-loaded-ahead loops and their tails */
    {AG_TYPE_Q4_K, 2816}, {AG_TYPE_Q6_K, 2304}, {AG_TYPE_BF16, 1288},
    /* gpt-oss's experts: on CUDA decode_unit's MXFP4 decoder (get_rows: bit for bit) */
    {AG_TYPE_MXFP4, 512},
};

static bool is_float_type(uint32_t t) { return t == AG_TYPE_F32 || t == AG_TYPE_F16 || t == AG_TYPE_BF16; }

static double tol_matmul(bool cpu, uint32_t type, bool prompt) {
    if (cpu) return is_float_type(type) ? 1e-5 : 2e-2;
    if (prompt) return 1e-2;
    /* CUDA decode rows of K-quants read int8 activations, those of
     * BF16 BF16 activations (tensor cores), unless AUGUR_CUDA_MMV=fp32 */
    const char *mmv = getenv("AUGUR_CUDA_MMV");
    bool        fp32 = mmv && !strcmp(mmv, "fp32");
    if (fp32) return 1e-5;
    return type == AG_TYPE_Q4_K || type == AG_TYPE_Q6_K ? 2e-2 : type == AG_TYPE_BF16 ? 1e-2 : 1e-5;
}

/* Rows [0, n_dec) decode, the rest prompt: each against the exact product
 * of the dequantized weight; decode rows bit-identical alone and in the
 * batch; for a device backend, within tolerance of the CPU backend. */
static void matmul_all_types(void **state) {
    enum { N = 13, N_DEC = 5, N_OUT = 67 };
    for (size_t c = 0; c < sizeof k_mm_cases / sizeof k_mm_cases[0]; c++) {
        const uint32_t type = k_mm_cases[c].type;
        const int      K = k_mm_cases[c].K;
        float         *deq;
        ag_tensor      w = make_weight(g_be, type, K, N_OUT, &deq);
        float         *x = randn((size_t)N * K, 1.0f);
        double        *ref = malloc(sizeof(double) * N * N_OUT);
        for (int t = 0; t < N; t++)
            for (int o = 0; o < N_OUT; o++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)deq[(size_t)o * K + k] * x[(size_t)t * K + k];
                ref[t * N_OUT + o] = s;
            }
        float *dx = dev_put(g_be, x, sizeof(float) * N * K), *dy = dev_floats(g_be, (size_t)N * N_OUT);
        assert_int_equal(g_be->ops->matmul(g_be, &w, dx, N, N_DEC, dy), AG_OK);
        float *y = host_get(g_be, dy, (size_t)N * N_OUT);
        double e_dec = rel_err(y, ref, (size_t)N_DEC * N_OUT);
        double e_pr = rel_err(y + N_DEC * N_OUT, ref + N_DEC * N_OUT, (size_t)(N - N_DEC) * N_OUT);
        if (e_dec > tol_matmul(g_is_cpu, type, false) || e_pr > tol_matmul(g_is_cpu, type, true))
            fail_msg("%s matmul %s K=%d: decode rows err %.3g, prompt rows err %.3g", g_be->ops->name,
                     ag_tensor_type_name(type), K, e_dec, e_pr);
        /* batch invariance of decode rows: each alone == in the batch */
        for (int t = 0; t < N_DEC; t++) {
            float *d1 = dev_floats(g_be, N_OUT);
            assert_int_equal(g_be->ops->matmul(g_be, &w, dx + (size_t)t * K, 1, 1, d1), AG_OK);
            float *y1 = host_get(g_be, d1, N_OUT);
            if (memcmp(y1, y + t * N_OUT, sizeof(float) * N_OUT))
                fail_msg("%s matmul %s: decode row %d alone differs from the same row in a batch of %d",
                         g_be->ops->name, ag_tensor_type_name(type), t, N_DEC);
            free(y1);
            g_be->ops->free(g_be, d1);
        }
        /* matmul_multi == separate matmuls */
        const ag_tensor *ws[2] = {&w, &w};
        float           *dm0 = dev_floats(g_be, (size_t)N * N_OUT), *dm1 = dev_floats(g_be, (size_t)N * N_OUT);
        float *const     ys[2] = {dm0, dm1};
        assert_int_equal(g_be->ops->matmul_multi(g_be, ws, 2, dx, N, N_DEC, ys), AG_OK);
        float *m0 = host_get(g_be, dm0, (size_t)N * N_OUT), *m1 = host_get(g_be, dm1, (size_t)N * N_OUT);
        assert_memory_equal(m0, y, sizeof(float) * N * N_OUT);
        assert_memory_equal(m1, y, sizeof(float) * N * N_OUT);
        if (!g_is_cpu) { /* against the CPU backend's own result */
            ag_tensor wc = w;
            wc.data = wc.host;
            float *yc = malloc(sizeof(float) * N * N_OUT);
            assert_int_equal(g_cpu->ops->matmul(g_cpu, &wc, x, N, N_DEC, yc), AG_OK);
            double e = rel_err_f(y, yc, (size_t)N * N_OUT);
            if (e > 3e-2) fail_msg("cuda vs cpu matmul %s: err %.3g", ag_tensor_type_name(type), e);
            free(yc);
        }
        free(m0), free(m1), free(y), free(ref), free(x), free(deq);
        g_be->ops->free(g_be, dm0), g_be->ops->free(g_be, dm1);
        g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dy);
    }
}

/* Batch invariance over wide decode batches (the CUDA kernels change their
 * tiling with the batch: 1, 2, 4 or 8 tokens per GEMV block, up to 64 per
 * tensor-core block): every row of a batch of 70 decode rows equals the
 * same row computed alone, bit for bit. */
static void matmul_decode_wide_batch(void **state) {
    enum { N = 70 };
    /* the BF16, Q4_K and Q6_K row counts take the CUDA tensor-core kernels' three
     * K splits (16, 8 and 4 slices: the split depends on the row count) */
    static const struct {
        uint32_t type;
        int      K, n_out;
    } cases[] = {{AG_TYPE_BF16, 1288, 67}, {AG_TYPE_BF16, 4096, 67}, {AG_TYPE_BF16, 264, 4100},
                 {AG_TYPE_BF16, 200, 8208}, {AG_TYPE_Q4_K, 512, 67},  {AG_TYPE_Q4_K, 256, 4100},
                 {AG_TYPE_Q4_K, 512, 8208}, {AG_TYPE_Q6_K, 768, 67},  {AG_TYPE_Q6_K, 256, 4100},
                 {AG_TYPE_Q6_K, 512, 8208},
                 /* K's of 8, 4, 9 and 4 blocks (written for the retired dp4a GEMVs' K splits; now more slice
                  * lengths for mmq and, in the rows computed alone, for mmqv over several warps a row) */
                 {AG_TYPE_Q4_K, 2048, 67},  {AG_TYPE_Q4_K, 1024, 4100}, {AG_TYPE_Q6_K, 2304, 67},
                 {AG_TYPE_Q6_K, 1024, 4100},
                 {AG_TYPE_Q8_0, 896, 67},   {AG_TYPE_F16, 200, 67}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t type = cases[c].type;
        const int      K = cases[c].K, N_OUT = cases[c].n_out;
        float         *deq;
        ag_tensor      w = make_weight(g_be, type, K, N_OUT, &deq);
        float         *x = randn((size_t)N * K, 1.0f);
        float *dx = dev_put(g_be, x, sizeof(float) * N * K), *dy = dev_floats(g_be, (size_t)N * N_OUT);
        float *d1 = dev_floats(g_be, N_OUT);
        assert_int_equal(g_be->ops->matmul(g_be, &w, dx, N, N, dy), AG_OK);
        float *y = host_get(g_be, dy, (size_t)N * N_OUT);
        double ref_err = 0, ref_norm = 0; /* and the batch is right, not only consistent */
        for (int t = 0; t < N; t++) {
            assert_int_equal(g_be->ops->matmul(g_be, &w, dx + (size_t)t * K, 1, 1, d1), AG_OK);
            float *y1 = host_get(g_be, d1, N_OUT);
            if (memcmp(y1, y + (size_t)t * N_OUT, sizeof(float) * N_OUT))
                fail_msg("%s matmul %s K=%d: decode row %d alone differs from the same row in a batch of %d",
                         g_be->ops->name, ag_tensor_type_name(type), K, t, N);
            free(y1);
            for (int o = 0; o < N_OUT; o++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)deq[(size_t)o * K + k] * x[(size_t)t * K + k];
                ref_err += (y[(size_t)t * N_OUT + o] - s) * (y[(size_t)t * N_OUT + o] - s);
                ref_norm += s * s;
            }
        }
        if (!(sqrt(ref_err / ref_norm) <= tol_matmul(g_is_cpu, type, false)))
            fail_msg("%s matmul %s K=%d, %d decode rows: rel err %.3g", g_be->ops->name, ag_tensor_type_name(type), K,
                     N, sqrt(ref_err / ref_norm));
        free(y), free(x), free(deq);
        g_be->ops->free(g_be, d1), g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dy);
    }
}

/* matmul_multi over weights of different row counts (so, on CUDA, different
 * K splits in one grouped launch: 16, 8 and 4 slices for BF16) gives each
 * weight the bits of its own matmul, at batches of 1 to 70 rows (the
 * grouped path takes up to 16 decode rows; the prompt rows follow). */
static void matmul_multi_mixed_shapes(void **state) {
    (void)state;
    static const struct {
        uint32_t type;
        int      K;
    } cases[] = {{AG_TYPE_BF16, 264}, {AG_TYPE_Q4_K, 256}, {AG_TYPE_Q8_0, 96}};
    static const int n_outs[3] = {67, 4100, 8208};
    static const struct {
        int n, n_dec;
    } batches[] = {{1, 1}, {5, 5}, {9, 9}, {16, 16}, {13, 5}, {70, 70}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int K = cases[c].K, N = 70;
        ag_tensor w[3];
        float    *deq[3];
        for (int i = 0; i < 3; i++) w[i] = make_weight(g_be, cases[c].type, K, n_outs[i], &deq[i]);
        float *x = randn((size_t)N * K, 1.0f), *dx = dev_put(g_be, x, sizeof(float) * N * K);
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            const int        n = batches[b].n, n_dec = batches[b].n_dec;
            float           *dm[3], *ds[3];
            const ag_tensor *ws[3] = {&w[0], &w[1], &w[2]};
            for (int i = 0; i < 3; i++) {
                dm[i] = dev_floats(g_be, (size_t)n * n_outs[i]);
                ds[i] = dev_floats(g_be, (size_t)n * n_outs[i]);
                assert_int_equal(g_be->ops->matmul(g_be, &w[i], dx, n, n_dec, ds[i]), AG_OK);
            }
            assert_int_equal(g_be->ops->matmul_multi(g_be, ws, 3, dx, n, n_dec, dm), AG_OK);
            for (int i = 0; i < 3; i++) {
                float *a = host_get(g_be, dm[i], (size_t)n * n_outs[i]), *e = host_get(g_be, ds[i], (size_t)n * n_outs[i]);
                if (memcmp(a, e, sizeof(float) * (size_t)n * n_outs[i]))
                    fail_msg("%s matmul_multi %s: weight %d (%d rows), %d rows (%d decode) differ from its matmul",
                             g_be->ops->name, ag_tensor_type_name(cases[c].type), i, n_outs[i], n, n_dec);
                free(a), free(e);
                g_be->ops->free(g_be, dm[i]), g_be->ops->free(g_be, ds[i]);
            }
        }
        free(x);
        g_be->ops->free(g_be, dx);
        for (int i = 0; i < 3; i++) free(deq[i]);
    }
}

/* The rows [off, off + n) of a batch's output against the same rows of a
 * reference batch's output (ref: [*][n_out] host floats), bit for bit. */
static void expect_rows(const float *dev_y, int n, int n_out, const float *ref, int off, const char *what) {
    float *got = host_get(g_be, dev_y, (size_t)n * n_out);
    for (int t = 0; t < n; t++)
        if (memcmp(got + (size_t)t * n_out, ref + (size_t)(off + t) * n_out, sizeof(float) * n_out))
            fail_msg("%s: row %d of a batch of %d (row %d of the reference batch) differs", what, t, n, off + t);
    free(got);
}

/* A few decode rows of Q4_K/Q6_K weights give the bits the same rows get
 * in a wide batch (CUDA: up to a few rows a matmul take the few-row kernels
 * mmqv, more the tensor-core mmq; a row must have one bit pattern
 * whichever runs): rows of a batch of 33 against the same rows in batches
 * of 1, 2, 3, 4, 8 and 9 at several offsets, through matmul (decode rows
 * alone, and before prompt rows), matmul_multi of three weights of one K
 * (types, row counts and so K splits mixed in one launch) and the
 * feed-forward op; the batch of 33 within tol_matmul of the exact product.
 * The row counts take each K split of the CUDA kernels (16 slices over 4
 * warps a row or 1, 8, 4) and the K's leave slices short or empty (nb =
 * K / 256 of 5, 8, 11, 18 blocks); Q6_K rows of 8 blocks are 16-byte
 * multiples, which the grouped launch stages in shared memory. */
static void matmul_few_rows_mmq_bits(void **state) {
    (void)state;
    enum { N = 33 };
    static const struct {
        uint32_t type;
        int      K, n_out;
    } cases[] = {{AG_TYPE_Q4_K, 4608, 67},  {AG_TYPE_Q6_K, 4608, 67},  {AG_TYPE_Q4_K, 2816, 2100},
                 {AG_TYPE_Q6_K, 2816, 2100}, {AG_TYPE_Q4_K, 2816, 4100}, {AG_TYPE_Q6_K, 2048, 4100},
                 {AG_TYPE_Q4_K, 1280, 8208}, {AG_TYPE_Q6_K, 1280, 8208}};
    static const int ns[] = {1, 2, 3, 4, 8, 9};
    char             what[160];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t type = cases[c].type;
        const int      K = cases[c].K, n_out = cases[c].n_out;
        float         *deq;
        ag_tensor      w = make_weight(g_be, type, K, n_out, &deq);
        float         *x = randn((size_t)N * K, 1.0f), *dx = dev_put(g_be, x, sizeof(float) * N * K);
        float         *dy = dev_floats(g_be, (size_t)N * n_out), *dn = dev_floats(g_be, (size_t)N * n_out);
        assert_int_equal(g_be->ops->matmul(g_be, &w, dx, N, N, dy), AG_OK);
        float *y = host_get(g_be, dy, (size_t)N * n_out);
        double num = 0, den = 0; /* the wide batch is right too: tokens 0 and N - 1 against the exact product */
        for (int t = 0; t < N; t += N - 1)
            for (int o = 0; o < n_out; o++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)deq[(size_t)o * K + k] * x[(size_t)t * K + k];
                num += (y[(size_t)t * n_out + o] - s) * (y[(size_t)t * n_out + o] - s), den += s * s;
            }
        if (!(sqrt(num / den) <= tol_matmul(g_is_cpu, type, false)))
            fail_msg("%s matmul %s K=%d, %d rows: %d decode rows err %.3g", g_be->ops->name, ag_tensor_type_name(type),
                     K, n_out, N, sqrt(num / den));
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            const int n = ns[b], offs[3] = {0, N - n, (N - n) / 2};
            for (int i = 0; i < 3; i++) {
                assert_int_equal(g_be->ops->matmul(g_be, &w, dx + (size_t)offs[i] * K, n, n, dn), AG_OK);
                snprintf(what, sizeof what, "%s matmul %s K=%d, %d rows", g_be->ops->name, ag_tensor_type_name(type),
                         K, n_out);
                expect_rows(dn, n, n_out, y, offs[i], what);
            }
        }
        /* 2 decode rows, then 3 prompt rows */
        assert_int_equal(g_be->ops->matmul(g_be, &w, dx + (size_t)7 * K, 5, 2, dn), AG_OK);
        snprintf(what, sizeof what, "%s matmul %s K=%d, %d rows, 2 decode rows before 3 prompt rows", g_be->ops->name,
                 ag_tensor_type_name(type), K, n_out);
        expect_rows(dn, 2, n_out, y, 7, what);
        free(y), free(x), free(deq);
        g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dy), g_be->ops->free(g_be, dn);
    }

    /* matmul_multi: three weights of one K in one launch (q/k/v-like: a split Q6_K "v"), against each weight's
     * own rows of a batch of 33 */
    static const struct {
        int      K;
        uint32_t type[3];
        int      n_out[3];
    } groups[] = {{2816, {AG_TYPE_Q4_K, AG_TYPE_Q4_K, AG_TYPE_Q6_K}, {4100, 67, 1030}},
                  {2048, {AG_TYPE_Q4_K, AG_TYPE_Q6_K, AG_TYPE_Q4_K}, {2100, 67, 8208}},
                  {1280, {AG_TYPE_Q6_K, AG_TYPE_Q4_K, AG_TYPE_Q4_K}, {8208, 4100, 67}}};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        const int K = groups[gi].K;
        ag_tensor w[3];
        float    *deq[3], *dm[3], *y[3];
        for (int i = 0; i < 3; i++) {
            w[i] = make_weight(g_be, groups[gi].type[i], K, groups[gi].n_out[i], &deq[i]);
            free(deq[i]);
            dm[i] = dev_floats(g_be, (size_t)N * groups[gi].n_out[i]);
        }
        float *x = randn((size_t)N * K, 1.0f), *dx = dev_put(g_be, x, sizeof(float) * N * K);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(g_be->ops->matmul(g_be, &w[i], dx, N, N, dm[i]), AG_OK);
            y[i] = host_get(g_be, dm[i], (size_t)N * groups[gi].n_out[i]);
        }
        const ag_tensor *ws[3] = {&w[0], &w[1], &w[2]};
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            const int n = ns[b], off = (int)b % 2 ? N - n : 0;
            assert_int_equal(g_be->ops->matmul_multi(g_be, ws, 3, dx + (size_t)off * K, n, n, dm), AG_OK);
            for (int i = 0; i < 3; i++) {
                snprintf(what, sizeof what, "%s matmul_multi K=%d: weight %d (%s, %d rows)", g_be->ops->name, K, i,
                         ag_tensor_type_name(groups[gi].type[i]), groups[gi].n_out[i]);
                expect_rows(dm[i], n, groups[gi].n_out[i], y[i], off, what);
            }
        }
        free(x);
        g_be->ops->free(g_be, dx);
        for (int i = 0; i < 3; i++) free(y[i]), g_be->ops->free(g_be, dm[i]);
    }

    /* the feed-forward op (Q4_K gate and up, a Q6_K down): its decode rows' kernels follow the batch too */
    if (!g_be->ops->ffn) return;
    enum { KF = 1280, N_FF = 4352 };
    float    *dg, *du, *dd;
    ag_tensor gw = make_weight(g_be, AG_TYPE_Q4_K, KF, N_FF, &dg), uw = make_weight(g_be, AG_TYPE_Q4_K, KF, N_FF, &du),
              dw = make_weight(g_be, AG_TYPE_Q6_K, N_FF, KF, &dd);
    free(dg), free(du), free(dd);
    float *x = randn((size_t)N * KF, 0.5f), *dx = dev_put(g_be, x, sizeof(float) * N * KF);
    float *gate = dev_floats(g_be, (size_t)N * N_FF), *up = dev_floats(g_be, (size_t)N * N_FF),
          *o = dev_floats(g_be, (size_t)N * KF);
    for (int gelu = 0; gelu < 2; gelu++) {
        assert_int_equal(g_be->ops->ffn(g_be, &gw, &uw, &dw, dx, N, N, gelu, gate, up, o), AG_OK);
        float *ref = host_get(g_be, o, (size_t)N * KF);
        for (int n = 1; n <= 3; n++) {
            assert_int_equal(g_be->ops->ffn(g_be, &gw, &uw, &dw, dx, n, n, gelu, gate, up, o), AG_OK);
            snprintf(what, sizeof what, "%s ffn (Q4_K gate/up, Q6_K down, %s)", g_be->ops->name, gelu ? "GELU" : "SiLU");
            expect_rows(o, n, KF, ref, 0, what);
        }
        free(ref);
    }
    free(x);
    g_be->ops->free(g_be, dx), g_be->ops->free(g_be, gate), g_be->ops->free(g_be, up), g_be->ops->free(g_be, o);
}

/* ---- a KV cache and a pass for the ops that need `begin` ---- */

typedef struct {
    ag_kv  *kv;
    int32_t seq[2];
} kv_fixture;

static kv_fixture make_kv(ag_backend *be, int n_kv, int hd, const int32_t *window) {
    kv_fixture   f;
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = 2;
    p.n_kv_heads = n_kv;
    p.head_dim_k = p.head_dim_v = hd;
    p.budget_bytes = (size_t)8 << 20;
    p.max_seqs = 4;
    p.layer_window = window;
    p.mem = be->ops->kv_mem ? be->ops->kv_mem(be) : NULL;
    assert_int_equal(ag_kv_init(&p, &f.kv), AG_OK);
    assert_int_equal(ag_kv_seq_new(f.kv, &f.seq[0]), AG_OK);
    assert_int_equal(ag_kv_seq_new(f.kv, &f.seq[1]), AG_OK);
    return f;
}

/* Reserves the batch's positions (each sequence's tokens continue its
 * committed length) and calls begin. */
static void begin_pass(ag_backend *be, ag_kv *kv, const ag_batch_layout *lay, const int32_t *tokens) {
    for (int i = 0; i < lay->n; i++)
        if (i == 0 || lay->seq[i] != lay->seq[i - 1]) {
            int k = 0;
            while (i + k < lay->n && lay->seq[i + k] == lay->seq[i]) k++;
            assert_int_equal(ag_kv_seq_len(kv, lay->seq[i]), lay->pos[i]);
            assert_int_equal(ag_kv_seq_reserve(kv, lay->seq[i], k), AG_OK);
        }
    if (be->ops->begin) assert_int_equal(be->ops->begin(be, kv, lay, tokens), AG_OK);
}

static void commit_pass(ag_kv *kv, const ag_batch_layout *lay) {
    for (int i = 0; i < lay->n; i++)
        if (i + 1 == lay->n || lay->seq[i + 1] != lay->seq[i])
            assert_int_equal(ag_kv_seq_commit(kv, lay->seq[i], lay->pos[i] + 1), AG_OK);
}

/* ---- get_rows ---- */

static void get_rows_exact(void **state) {
    enum { N = 6, ROWS = 40 };
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    for (size_t c = 0; c < sizeof k_mm_cases / sizeof k_mm_cases[0]; c++) {
        const uint32_t type = k_mm_cases[c].type;
        const int      K = k_mm_cases[c].K;
        float         *deq;
        ag_tensor      w = make_weight(g_be, type, K, ROWS, &deq);
        int32_t        ids[N] = {3, 0, 39, 3, 17, 8}, pos[N], seq[N];
        for (int i = 0; i < N; i++) pos[i] = ag_kv_seq_len(f.kv, f.seq[0]) + i, seq[i] = f.seq[0];
        ag_batch_layout lay = {N, pos, seq, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
        begin_pass(g_be, f.kv, &lay, ids);
        float *d = dev_floats(g_be, (size_t)N * K);
        assert_int_equal(g_be->ops->get_rows(g_be, &w, ids, N, d), AG_OK);
        float *out = host_get(g_be, d, (size_t)N * K);
        commit_pass(f.kv, &lay);
        for (int i = 0; i < N; i++)
            if (memcmp(out + (size_t)i * K, deq + (size_t)ids[i] * K, sizeof(float) * K))
                fail_msg("%s get_rows %s: row %d differs from ag_dequant_row", g_be->ops->name,
                         ag_tensor_type_name(type), ids[i]);
        free(out), free(deq);
        g_be->ops->free(g_be, d);
    }
    ag_kv_free(f.kv);
}

/* ---- elementwise ops, RoPE, norms ---- */

static void check(const char *what, const float *out, const double *ref, size_t n, double tol) {
    double e = rel_err(out, ref, n);
    if (!(e <= tol)) fail_msg("%s %s: rel err %.3g > %.3g", g_be->ops->name, what, e, tol);
}

static void small_ops(void **state) {
    enum { N = 7, DIM = 160, N_HEAD = 5, HD = 32 };
    const size_t n = (size_t)N * DIM;
    float *x = randn(n, 2.0f), *u = randn(n, 1.0f), *w = randn(DIM, 1.0f);
    double *ref = malloc(sizeof(double) * n);
    float  *dx = dev_put(g_be, x, n * 4), *du = dev_put(g_be, u, n * 4), *dw = dev_put(g_be, w, DIM * 4);
    float  *dout = dev_floats(g_be, n), *out;

    /* rmsnorm, with and without gain, and in place */
    for (int gain = 0; gain < 2; gain++) {
        assert_int_equal(g_be->ops->rmsnorm(g_be, dx, gain ? dw : NULL, N, DIM, 1e-6f, dout), AG_OK);
        out = host_get(g_be, dout, n);
        for (int r = 0; r < N; r++) {
            double ss = 0;
            for (int i = 0; i < DIM; i++) ss += (double)x[r * DIM + i] * x[r * DIM + i];
            double s = 1.0 / sqrt(ss / DIM + 1e-6);
            for (int i = 0; i < DIM; i++) ref[r * DIM + i] = x[r * DIM + i] * s * (gain ? w[i] : 1.0);
        }
        check("rmsnorm", out, ref, n, 1e-5);
        free(out);
    }
    /* add_bias, add, scale */
    assert_int_equal(g_be->ops->copy(g_be, dout, dx, n * 4), AG_OK);
    assert_int_equal(g_be->ops->add_bias(g_be, dout, dw, N, DIM), AG_OK);
    out = host_get(g_be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)x[i] + w[i % DIM];
    check("add_bias", out, ref, n, 1e-6);
    free(out);
    assert_int_equal(g_be->ops->copy(g_be, dout, dx, n * 4), AG_OK);
    assert_int_equal(g_be->ops->add(g_be, dout, du, n), AG_OK);
    assert_int_equal(g_be->ops->scale(g_be, dout, 0.37f, n), AG_OK);
    out = host_get(g_be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = ((double)x[i] + u[i]) * 0.37;
    check("add+scale", out, ref, n, 1e-6);
    free(out);
    /* add_rmsnorm (where the backend fuses them): the bits of add then
     * rmsnorm on the same backend, and the reference within tolerance; dim
     * 160 takes the 4-wide path, 7 rows of 37 the scalar one */
    if (g_be->ops->add_rmsnorm)
        for (int shape = 0; shape < 2; shape++) {
            const int rows = shape ? 37 : N, dim = shape ? 7 : DIM;
            float    *dsum = dev_floats(g_be, n), *dnorm = dev_floats(g_be, n), *dsum2 = dev_floats(g_be, n),
                  *dnorm2 = dev_floats(g_be, n);
            assert_int_equal(g_be->ops->copy(g_be, dsum, dx, n * 4), AG_OK);
            assert_int_equal(g_be->ops->add_rmsnorm(g_be, dsum, du, dw, rows, dim, 1e-6f, dnorm), AG_OK);
            assert_int_equal(g_be->ops->copy(g_be, dsum2, dx, n * 4), AG_OK);
            assert_int_equal(g_be->ops->add(g_be, dsum2, du, (size_t)rows * dim), AG_OK);
            assert_int_equal(g_be->ops->rmsnorm(g_be, dsum2, dw, rows, dim, 1e-6f, dnorm2), AG_OK);
            float *a = host_get(g_be, dsum, n), *b = host_get(g_be, dsum2, n), *na = host_get(g_be, dnorm, n),
                  *nb = host_get(g_be, dnorm2, n);
            assert_memory_equal(a, b, n * 4); /* past rows x dim: x untouched by both */
            assert_memory_equal(na, nb, (size_t)rows * dim * 4);
            for (int r = 0; r < rows; r++) {
                double ss = 0;
                for (int i = 0; i < dim; i++) ss += ((double)x[r * dim + i] + u[r * dim + i]) * ((double)x[r * dim + i] + u[r * dim + i]);
                const double sc = 1.0 / sqrt(ss / dim + 1e-6);
                for (int i = 0; i < dim; i++) ref[r * dim + i] = ((double)x[r * dim + i] + u[r * dim + i]) * sc * w[i];
            }
            check("add_rmsnorm", na, ref, (size_t)rows * dim, 1e-5);
            free(a), free(b), free(na), free(nb);
            g_be->ops->free(g_be, dsum), g_be->ops->free(g_be, dnorm), g_be->ops->free(g_be, dsum2),
                g_be->ops->free(g_be, dnorm2);
        }
    /* silu_mul, gelu_mul */
    assert_int_equal(g_be->ops->copy(g_be, dout, dx, n * 4), AG_OK);
    assert_int_equal(g_be->ops->silu_mul(g_be, dout, du, n), AG_OK);
    out = host_get(g_be, dout, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)x[i] / (1.0 + exp(-(double)x[i])) * u[i];
    check("silu_mul", out, ref, n, 1e-5);
    free(out);
    assert_int_equal(g_be->ops->copy(g_be, dout, dx, n * 4), AG_OK);
    assert_int_equal(g_be->ops->gelu_mul(g_be, dout, du, n), AG_OK);
    out = host_get(g_be, dout, n);
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        ref[i] = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) * u[i];
    }
    check("gelu_mul", out, ref, n, 2e-3);
    free(out);

    /* RoPE: both pair layouts, partial rotary dims, positions up to 40k */
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    int32_t    pos[N], seq[N], toks[N] = {0};
    for (int i = 0; i < N; i++) seq[i] = f.seq[0];
    for (int neox = 0; neox < 2; neox++) {
        const int rope_dim = neox ? 24 : HD;
        int       base_pos = ag_kv_seq_len(f.kv, f.seq[0]);
        for (int i = 0; i < N; i++) pos[i] = base_pos + i;
        ag_batch_layout lay = {N, pos, seq, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
        begin_pass(g_be, f.kv, &lay, toks);
        assert_int_equal(g_be->ops->copy(g_be, dout, dx, (size_t)N * N_HEAD * HD * 4), AG_OK);
        assert_int_equal(g_be->ops->rope(g_be, dout, N, N_HEAD, HD, rope_dim, pos, 10000.0f, 0.5f, neox), AG_OK);
        out = host_get(g_be, dout, (size_t)N * N_HEAD * HD);
        commit_pass(f.kv, &lay);
        const int half = rope_dim / 2;
        for (int t = 0; t < N; t++)
            for (int h = 0; h < N_HEAD; h++) {
                const float *v = x + ((size_t)t * N_HEAD + h) * HD;
                double      *r = ref + ((size_t)t * N_HEAD + h) * HD;
                for (int i = 0; i < HD; i++) r[i] = v[i];
                for (int i = 0; i < half; i++) {
                    double th = pos[t] * 0.5 * pow(10000.0, -2.0 * i / rope_dim);
                    int    i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                    r[i0] = v[i0] * cos(th) - v[i1] * sin(th);
                    r[i1] = v[i0] * sin(th) + v[i1] * cos(th);
                }
            }
        check(neox ? "rope (neox)" : "rope", out, ref, (size_t)N * N_HEAD * HD, 1e-5);
        free(out);
    }
    /* rope_freqs (YaRN): a given frequency per pair (host memory), the rotated values times mscale */
    for (int neox = 0; neox < 2 && g_be->ops->rope_freqs; neox++) {
        const int rope_dim = neox ? 24 : HD, half = rope_dim / 2;
        float     freq[64];
        for (int i = 0; i < half; i++) freq[i] = (float)(pow(150000.0, -2.0 * i / rope_dim) / (i % 3 == 0 ? 32.0 : 1.0));
        const int base_pos = ag_kv_seq_len(f.kv, f.seq[0]);
        for (int i = 0; i < N; i++) pos[i] = base_pos + i;
        ag_batch_layout lay = {N, pos, seq, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
        begin_pass(g_be, f.kv, &lay, toks);
        assert_int_equal(g_be->ops->copy(g_be, dout, dx, (size_t)N * N_HEAD * HD * 4), AG_OK);
        assert_int_equal(g_be->ops->rope_freqs(g_be, dout, N, N_HEAD, HD, rope_dim, pos, freq, 1.3466f, neox), AG_OK);
        out = host_get(g_be, dout, (size_t)N * N_HEAD * HD);
        commit_pass(f.kv, &lay);
        for (int t = 0; t < N; t++)
            for (int h = 0; h < N_HEAD; h++) {
                const float *v = x + ((size_t)t * N_HEAD + h) * HD;
                double      *r = ref + ((size_t)t * N_HEAD + h) * HD;
                for (int i = 0; i < HD; i++) r[i] = v[i];
                for (int i = 0; i < half; i++) {
                    const double th = (double)pos[t] * freq[i], m = 1.3466f;
                    const int    i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                    r[i0] = m * (v[i0] * cos(th) - v[i1] * sin(th));
                    r[i1] = m * (v[i0] * sin(th) + v[i1] * cos(th));
                }
            }
        check(neox ? "rope_freqs (neox)" : "rope_freqs", out, ref, (size_t)N * N_HEAD * HD, 1e-5);
        if (!g_is_cpu) { /* the CPU's: the same float operations, cos and sin in double on both */
            float *hx = malloc(sizeof(float) * N * N_HEAD * HD);
            memcpy(hx, x, sizeof(float) * N * N_HEAD * HD);
            assert_int_equal(g_cpu->ops->rope_freqs(g_cpu, hx, N, N_HEAD, HD, rope_dim, pos, freq, 1.3466f, neox), AG_OK);
            const double e = rel_err_f(out, hx, (size_t)N * N_HEAD * HD);
            if (e > 1e-6) fail_msg("%s rope_freqs vs cpu: rel err %.3g", g_be->ops->name, e);
            free(hx);
        }
        free(out);
    }
    ag_kv_free(f.kv);
    g_be->ops->free(g_be, dx), g_be->ops->free(g_be, du), g_be->ops->free(g_be, dw), g_be->ops->free(g_be, dout);
    free(x), free(u), free(w), free(ref);
}

/* A backend's fused rope_kv_store gives the bits of rope(q), rope(k) and
 * kv_store(k, v): q, k and the stored rows, over prompt and decode rows,
 * both pair layouts and partial rotary dims (k's other dims stored too). */
static void rope_kv_store_fused(void **state) {
    (void)state;
    if (!g_be->ops->rope_kv_store) skip();
    enum { N = 9, N_HEAD = 6, N_KV = 2, HD = 64 };
    kv_fixture f = make_kv(g_be, N_KV, HD, NULL);
    const size_t nq = (size_t)N * N_HEAD * HD, nk = (size_t)N * N_KV * HD;
    float *q = randn(nq, 1.0f), *k = randn(nk, 1.0f), *v = randn(nk, 1.0f);
    float *dq0 = dev_put(g_be, q, nq * 4), *dk0 = dev_put(g_be, k, nk * 4), *dq1 = dev_put(g_be, q, nq * 4),
          *dk1 = dev_put(g_be, k, nk * 4), *dv = dev_put(g_be, v, nk * 4);
    float *kr0 = malloc(sizeof(float) * N_KV * HD), *vr0 = malloc(sizeof(float) * N_KV * HD),
          *kr1 = malloc(sizeof(float) * N_KV * HD), *vr1 = malloc(sizeof(float) * N_KV * HD);
    for (int neox = 0; neox < 2; neox++) {
        const int rope_dim = neox ? 48 : HD;
        int32_t   pos[N], seq[N], toks[N] = {0};
        for (int i = 0; i < N; i++) pos[i] = ag_kv_seq_len(f.kv, f.seq[0]) + i + 0, seq[i] = f.seq[0];
        ag_batch_layout lay = {N, pos, seq, neox ? N : 3, NULL, NULL, 0, NULL, NULL, NULL, 0}; /* decode rows too */
        begin_pass(g_be, f.kv, &lay, toks);
        ag_attn_shape sh0 = {.layer = 0, .n_head = N_HEAD, .n_head_kv = N_KV, .head_dim_k = HD, .head_dim_v = HD,
                             .scale = 0.125f},
                      sh1 = sh0;
        sh1.layer = 1;
        assert_int_equal(g_be->ops->copy(g_be, dq0, dq1, nq * 4), AG_OK);
        assert_int_equal(g_be->ops->copy(g_be, dk0, dk1, nk * 4), AG_OK);
        /* layer 0 the separate ops, layer 1 the fused one */
        assert_int_equal(g_be->ops->rope(g_be, dq0, N, N_HEAD, HD, rope_dim, pos, 10000.0f, 0.5f, neox), AG_OK);
        assert_int_equal(g_be->ops->rope(g_be, dk0, N, N_KV, HD, rope_dim, pos, 10000.0f, 0.5f, neox), AG_OK);
        assert_int_equal(g_be->ops->kv_store(g_be, f.kv, &sh0, &lay, dk0, dv), AG_OK);
        assert_int_equal(
            g_be->ops->rope_kv_store(g_be, f.kv, &sh1, &lay, dq1, dk1, dv, rope_dim, pos, 10000.0f, 0.5f, neox), AG_OK);
        float *a = host_get(g_be, dq0, nq), *b = host_get(g_be, dq1, nq);
        assert_memory_equal(a, b, nq * 4);
        free(a), free(b);
        a = host_get(g_be, dk0, nk), b = host_get(g_be, dk1, nk);
        assert_memory_equal(a, b, nk * 4);
        free(a), free(b);
        for (int i = 0; i < N; i++) {
            assert_int_equal(ag_kv_read(f.kv, 0, f.seq[0], pos[i], kr0, vr0), AG_OK);
            assert_int_equal(ag_kv_read(f.kv, 1, f.seq[0], pos[i], kr1, vr1), AG_OK);
            assert_memory_equal(kr0, kr1, sizeof(float) * N_KV * HD);
            assert_memory_equal(vr0, vr1, sizeof(float) * N_KV * HD);
        }
        commit_pass(f.kv, &lay);
        /* the next round starts from this one's rotated rows: fresh inputs */
        assert_int_equal(g_be->ops->upload(g_be, dq1, q, nq * 4), AG_OK);
        assert_int_equal(g_be->ops->upload(g_be, dk1, k, nk * 4), AG_OK);
    }
    free(kr0), free(vr0), free(kr1), free(vr1), free(q), free(k), free(v);
    g_be->ops->free(g_be, dq0), g_be->ops->free(g_be, dk0), g_be->ops->free(g_be, dq1), g_be->ops->free(g_be, dk1),
        g_be->ops->free(g_be, dv);
    ag_kv_free(f.kv);
}

/* A backend may leave a norm's or an activation's decode rows already
 * converted for the matmul that reads them next (CUDA: prep_x). Whatever it
 * does, a matmul must give the bits of the same matmul over a copy of its
 * input (which nothing prepared): after rmsnorm, add_rmsnorm and silu_mul,
 * for fewer rows than prepared, and after an op changed the prepared rows. */
static void matmul_after_producers(void **state) {
    (void)state;
    enum { N = 5, N_OUT = 67 };
    static const struct {
        uint32_t type;
        int      K;
    } cases[] = {{AG_TYPE_BF16, 1024}, {AG_TYPE_Q4_K, 1024}, {AG_TYPE_Q6_K, 768}, {AG_TYPE_Q4_1, 512}};
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int K = cases[c].K;
        float    *deq;
        ag_tensor w = make_weight(g_be, cases[c].type, K, N_OUT, &deq);
        int32_t   pos[N], seq[N], toks[N] = {0};
        for (int i = 0; i < N; i++) pos[i] = ag_kv_seq_len(f.kv, f.seq[0]) + i, seq[i] = f.seq[0];
        ag_batch_layout lay = {N, pos, seq, N, NULL, NULL, 0, NULL, NULL, NULL, 0};
        begin_pass(g_be, f.kv, &lay, toks);
        const size_t n = (size_t)N * K;
        float *x = randn(n, 1.0f), *u = randn(n, 1.0f), *gain = randn(K, 1.0f);
        float *dx = dev_put(g_be, x, n * 4), *du = dev_put(g_be, u, n * 4), *dg = dev_put(g_be, gain, (size_t)K * 4);
        float *dh = dev_floats(g_be, n), *dcopy = dev_floats(g_be, n), *dy = dev_floats(g_be, (size_t)N * N_OUT),
              *dy2 = dev_floats(g_be, (size_t)N * N_OUT);
        for (int step = 0; step < 5; step++) {
            int rows = N;
            switch (step) {
            case 0: assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dg, N, K, 1e-6f, dh), AG_OK); break;
            case 1:
                assert_int_equal(g_be->ops->copy(g_be, dcopy, dx, n * 4), AG_OK);
                if (g_be->ops->add_rmsnorm)
                    assert_int_equal(g_be->ops->add_rmsnorm(g_be, dcopy, du, dg, N, K, 1e-6f, dh), AG_OK);
                else assert_int_equal(g_be->ops->rmsnorm(g_be, dcopy, dg, N, K, 1e-6f, dh), AG_OK);
                rows = 3; /* fewer decode rows than the pass's */
                break;
            case 2:
                assert_int_equal(g_be->ops->copy(g_be, dh, dx, n * 4), AG_OK);
                assert_int_equal(g_be->ops->silu_mul(g_be, dh, du, n), AG_OK);
                break;
            case 3: /* prepared, then changed */
                assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dg, N, K, 1e-6f, dh), AG_OK);
                assert_int_equal(g_be->ops->add(g_be, dh, du, n), AG_OK);
                break;
            case 4: /* prepared, then another input converted, then the prepared one again */
                assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dg, N, K, 1e-6f, dh), AG_OK);
                assert_int_equal(g_be->ops->matmul(g_be, &w, du, N, N, dy2), AG_OK);
                break;
            }
            assert_int_equal(g_be->ops->matmul(g_be, &w, dh, rows, rows, dy), AG_OK);
            assert_int_equal(g_be->ops->copy(g_be, dcopy, dh, n * 4), AG_OK);
            assert_int_equal(g_be->ops->matmul(g_be, &w, dcopy, rows, rows, dy2), AG_OK);
            float *a = host_get(g_be, dy, (size_t)rows * N_OUT), *b = host_get(g_be, dy2, (size_t)rows * N_OUT);
            if (memcmp(a, b, sizeof(float) * rows * N_OUT))
                fail_msg("%s matmul %s after producer step %d differs from the matmul of a copy", g_be->ops->name,
                         ag_tensor_type_name(cases[c].type), step);
            free(a), free(b);
        }
        commit_pass(f.kv, &lay);
        free(x), free(u), free(gain), free(deq);
        g_be->ops->free(g_be, dx), g_be->ops->free(g_be, du), g_be->ops->free(g_be, dg), g_be->ops->free(g_be, dh),
            g_be->ops->free(g_be, dcopy), g_be->ops->free(g_be, dy), g_be->ops->free(g_be, dy2);
    }
    ag_kv_free(f.kv);
}

/* o = (act(h·gateᵀ) * (h·upᵀ)) · downᵀ by the three ops the ffn op stands
 * for (matmul_multi, silu_mul or gelu_mul, matmul) on backend be; gate and
 * up ([N][n_ff] each) are scratch. */
static void ffn_three_ops(ag_backend *be, const ag_tensor *gw, const ag_tensor *uw, const ag_tensor *dw, const float *h,
                          int N, int n_dec, int n_ff, bool gelu, float *gate, float *up, float *o) {
    const ag_tensor *ws[2] = {gw, uw};
    float *const     ys[2] = {gate, up};
    assert_int_equal(be->ops->matmul_multi(be, ws, 2, h, N, n_dec, ys), AG_OK);
    assert_int_equal((gelu ? be->ops->gelu_mul : be->ops->silu_mul)(be, gate, up, (size_t)N * n_ff), AG_OK);
    assert_int_equal(be->ops->matmul(be, dw, gate, N, n_dec, o), AG_OK);
}

/* The feed-forward op, where a backend has one, against the three ops it
 * stands for (matmul_multi of gate and up, silu_mul or gelu_mul, matmul of
 * down): decode rows bit for bit against the same backend's three ops
 * (also after an rmsnorm left its rows prepared), prompt rows within 3e-2
 * of the CPU backend's three ops (CUDA keeps the prompt rows' products in
 * BF16), 6e-2 for Q4_K weights (two matmuls, each within 2e-2 of exact
 * on the CPU: its activations go through int8); passes of decode rows
 * only, prompt rows only, and both. */
static void ffn_against_three_ops(void **state) {
    (void)state;
    if (!g_be->ops->ffn) skip();
    enum { N = 21, K = 256, N_FF = 512 };
    static const uint32_t types[] = {AG_TYPE_BF16, AG_TYPE_Q4_K};
    static const int      n_decs[] = {5, 0, N};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int gelu = 0; gelu < 2; gelu++) {
            float    *dg, *du, *dd;
            ag_tensor gw = make_weight(g_be, types[t], K, N_FF, &dg), uw = make_weight(g_be, types[t], K, N_FF, &du),
                      dw = make_weight(g_be, types[t], N_FF, K, &dd);
            float *x = randn((size_t)N * K, 1.0f), *gain = randn(K, 1.0f);
            float *dx = dev_put(g_be, x, sizeof(float) * N * K), *dgain = dev_put(g_be, gain, sizeof(float) * K);
            float *dh = dev_floats(g_be, (size_t)N * K), *gate = dev_floats(g_be, (size_t)N * N_FF),
                  *up = dev_floats(g_be, (size_t)N * N_FF), *o1 = dev_floats(g_be, (size_t)N * K),
                  *o3 = dev_floats(g_be, (size_t)N * K);
            /* the CPU backend's three ops over rmsnorm(x): the reference for prompt rows */
            ag_tensor gc = gw, uc = uw, dc = dw;
            gc.data = gc.host, uc.data = uc.host, dc.data = dc.host;
            float *h = malloc(sizeof(float) * N * K), *cg = malloc(sizeof(float) * N * N_FF),
                  *cu = malloc(sizeof(float) * N * N_FF), *co = malloc(sizeof(float) * N * K);
            assert_int_equal(g_cpu->ops->rmsnorm(g_cpu, x, gain, N, K, 1e-6f, h), AG_OK);
            const double tol = types[t] == AG_TYPE_BF16 ? 3e-2 : 6e-2;
            for (size_t c = 0; c < sizeof n_decs / sizeof n_decs[0]; c++) {
                const int n_dec = n_decs[c];
                ffn_three_ops(g_cpu, &gc, &uc, &dc, h, N, n_dec, N_FF, gelu, cg, cu, co);
                /* the op, its input left by an rmsnorm (which may prepare it) */
                assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dgain, N, K, 1e-6f, dh), AG_OK);
                assert_int_equal(g_be->ops->ffn(g_be, &gw, &uw, &dw, dh, N, n_dec, gelu, gate, up, o1), AG_OK);
                /* the same backend's three ops */
                assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dgain, N, K, 1e-6f, dh), AG_OK);
                ffn_three_ops(g_be, &gw, &uw, &dw, dh, N, n_dec, N_FF, gelu, gate, up, o3);
                float *a = host_get(g_be, o1, (size_t)N * K), *b = host_get(g_be, o3, (size_t)N * K);
                if (memcmp(a, b, sizeof(float) * n_dec * K))
                    fail_msg("%s ffn %s %s: decode rows (%d of %d) differ from the three ops'", g_be->ops->name,
                             ag_tensor_type_name(types[t]), gelu ? "GELU" : "SiLU", n_dec, N);
                const double e = rel_err_f(a + (size_t)n_dec * K, co + (size_t)n_dec * K, (size_t)(N - n_dec) * K);
                if (n_dec < N && !(e <= tol))
                    fail_msg("%s ffn %s %s: prompt rows (%d of %d) err %.3g against the CPU's three ops",
                             g_be->ops->name, ag_tensor_type_name(types[t]), gelu ? "GELU" : "SiLU", N - n_dec, N, e);
                const double e3 = rel_err_f(b, co, (size_t)N * K);
                if (!(e3 <= tol))
                    fail_msg("%s three ops %s %s (%d decode rows of %d) against the CPU's: err %.3g", g_be->ops->name,
                             ag_tensor_type_name(types[t]), gelu ? "GELU" : "SiLU", n_dec, N, e3);
                fprintf(stderr, "ffn %s %s, %2d decode rows of %d: prompt rows err %.3g, three ops %.3g (vs CPU)\n",
                        ag_tensor_type_name(types[t]), gelu ? "GELU" : "SiLU", n_dec, N, e, e3);
                free(a), free(b);
            }
            free(x), free(gain), free(h), free(cg), free(cu), free(co), free(dg), free(du), free(dd);
            g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dgain), g_be->ops->free(g_be, dh),
                g_be->ops->free(g_be, gate), g_be->ops->free(g_be, up), g_be->ops->free(g_be, o1),
                g_be->ops->free(g_be, o3);
        }
}

/* The feed-forward op's decode-only passes of 1 to 8 rows with BF16 weights
 * wide enough for a K split of 4 or 8 (CUDA: gate, up and the SiLU or GELU
 * product in one launch, mmt_bf16_glu), SiLU and GELU: bit for bit against
 * the same backend's three ops, its input left by an rmsnorm (prepared) or
 * not, and within 3e-2 of the CPU's three ops. */
static void ffn_decode_rows_wide(void **state) {
    (void)state;
    if (!g_be->ops->ffn) skip();
    enum { K = 256, N_MAX = 8 };
    static const int n_ffs[] = {4096, 8192}, ns[] = {1, 3, 8};
    kv_fixture       f = make_kv(g_be, 1, 32, NULL);
    for (size_t a = 0; a < sizeof n_ffs / sizeof n_ffs[0]; a++) {
        const int N_FF = n_ffs[a];
        float    *dg, *du, *dd;
        ag_tensor gw = make_weight(g_be, AG_TYPE_BF16, K, N_FF, &dg), uw = make_weight(g_be, AG_TYPE_BF16, K, N_FF, &du),
                  dw = make_weight(g_be, AG_TYPE_BF16, N_FF, K, &dd);
        ag_tensor gc = gw, uc = uw, dc = dw;
        gc.data = gc.host, uc.data = uc.host, dc.data = dc.host;
        float *x = randn((size_t)N_MAX * K, 1.0f), *gain = randn(K, 1.0f);
        float *dx = dev_put(g_be, x, sizeof(float) * N_MAX * K), *dgain = dev_put(g_be, gain, sizeof(float) * K);
        float *dh = dev_floats(g_be, (size_t)N_MAX * K), *gate = dev_floats(g_be, (size_t)N_MAX * N_FF),
              *up = dev_floats(g_be, (size_t)N_MAX * N_FF), *o1 = dev_floats(g_be, (size_t)N_MAX * K),
              *o3 = dev_floats(g_be, (size_t)N_MAX * K);
        float *h = malloc(sizeof(float) * N_MAX * K), *cg = malloc(sizeof(float) * N_MAX * N_FF),
              *cu = malloc(sizeof(float) * N_MAX * N_FF), *co = malloc(sizeof(float) * N_MAX * K);
        for (int combo = 0; combo < 4 * (int)(sizeof ns / sizeof ns[0]); combo++) {
            const int  N = ns[combo / 4], prepared = combo & 1;
            const bool gelu = combo & 2;
            const char *act = gelu ? "GELU" : "SiLU";
            int32_t   ids[N_MAX], pos[N_MAX], seq[N_MAX];
            for (int i = 0; i < N; i++) ids[i] = i, pos[i] = ag_kv_seq_len(f.kv, f.seq[0]) + i, seq[i] = f.seq[0];
            ag_batch_layout lay = {N, pos, seq, N, NULL, NULL, 0, NULL, NULL, NULL, 0};
            begin_pass(g_be, f.kv, &lay, ids);
            assert_int_equal(g_cpu->ops->rmsnorm(g_cpu, x, gain, N, K, 1e-6f, h), AG_OK);
            ffn_three_ops(g_cpu, &gc, &uc, &dc, h, N, N, N_FF, gelu, cg, cu, co);
            /* the op; unprepared: a scale by 1 after the norm (a write) forgets any prepared copy */
            assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dgain, N, K, 1e-6f, dh), AG_OK);
            if (!prepared) assert_int_equal(g_be->ops->scale(g_be, dh, 1.0f, (size_t)N * K), AG_OK);
            assert_int_equal(g_be->ops->ffn(g_be, &gw, &uw, &dw, dh, N, N, gelu, gate, up, o1), AG_OK);
            assert_int_equal(g_be->ops->rmsnorm(g_be, dx, dgain, N, K, 1e-6f, dh), AG_OK);
            ffn_three_ops(g_be, &gw, &uw, &dw, dh, N, N, N_FF, gelu, gate, up, o3);
            commit_pass(f.kv, &lay);
            float *r1 = host_get(g_be, o1, (size_t)N * K), *r3 = host_get(g_be, o3, (size_t)N * K);
            if (memcmp(r1, r3, sizeof(float) * N * K))
                fail_msg("%s ffn BF16 %s, n_ff %d, %d decode rows (%s): differs from the three ops'",
                         g_be->ops->name, act, N_FF, N, prepared ? "prepared" : "unprepared");
            const double e = rel_err_f(r1, co, (size_t)N * K);
            if (!(e <= 3e-2))
                fail_msg("%s ffn BF16 %s, n_ff %d, %d decode rows: err %.3g against the CPU's three ops",
                         g_be->ops->name, act, N_FF, N, e);
            free(r1), free(r3);
        }
        free(x), free(gain), free(h), free(cg), free(cu), free(co), free(dg), free(du), free(dd);
        g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dgain), g_be->ops->free(g_be, dh);
        g_be->ops->free(g_be, gate), g_be->ops->free(g_be, up), g_be->ops->free(g_be, o1), g_be->ops->free(g_be, o3);
    }
    ag_kv_free(f.kv);
}

/* ---- moe ---- */

/* A stack of n_mat random matrices of `type` (ne {K, n_out, n_mat}, the
 * experts' layout), prepared on be; the dequantized floats in *deq. */
static ag_tensor make_stack(ag_backend *be, uint32_t type, int K, int n_out, int n_mat, float **deq) {
    const size_t rb = ag_quant_row_bytes(type, K), rows = (size_t)n_out * n_mat;
    uint8_t     *all = malloc(rb * rows);
    *deq = malloc(sizeof(float) * (size_t)K * rows);
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = random_weights(type, K, NULL);
        memcpy(all + rb * r, row, rb);
        free(row);
        assert_int_equal(ag_dequant_row(type, all + rb * r, *deq + (size_t)K * r, K), AG_OK);
    }
    ag_tensor t = {.name = "exps", .type = type, .ne = {K, n_out, n_mat, 1}, .row_bytes = rb, .data = all, .host = all};
    assert_true(g_n_weights < sizeof g_weights / sizeof g_weights[0]);
    g_weights[g_n_weights++] = all;
    if (be->ops->prepare_weight) assert_int_equal(be->ops->prepare_weight(be, &t), AG_OK);
    return t;
}

/* x · W[m]ᵀ row o (W: [n_mat][n_out][K] floats), in double */
static double dot_row(const float *W, int K, int n_out, int m, int o, const double *x) {
    const float *w = W + ((size_t)m * n_out + o) * K;
    double       s = 0;
    for (int k = 0; k < K; k++) s += (double)w[k] * x[k];
    return s;
}

/* The moe op (backend.h ag_moe_weights) where the backend has it:
 *  - against a double-precision reference (routing from double logits;
 *    the routers are F32, so a near tie that float rounding could flip is
 *    vanishingly unlikely with these random weights): 5e-2 (each expert's
 *    two matmuls within 2e-2 on the CPU, its activations through int8;
 *    CUDA's prompt rows through BF16);
 *  - a device backend against the CPU's op: 5e-2;
 *  - batch invariance: every decode row computed alone (n 1, 1 decode
 *    row) gives its bits in the mixed batch; also the decode rows as a
 *    batch of their own. Prompt rows alone give their bits on the CPU;
 *    on CUDA (cuBLAS may reduce differently for another row count, as the
 *    matmul contract allows for prompt rows there) within 1e-2;
 *  - a backend that records passes answers AG_GRAPH_OFF once it holds
 *    expert stacks (CUDA: the routing waits for the host mid-pass).
 * Cases: qwen3moe-style (softmax then top-k, weights renormalised, SiLU,
 * no biases; Q4_K gate/up with a Q8_0 down, and all-Q8_0 unnormalised and
 * scaled) and gpt-oss-style (top-k then softmax, the router's and the
 * experts' biases, the clamped SwiGLU; MXFP4 experts). */
static const struct {
    const char *name;
    uint32_t    gate_t, down_t;
    int         F, K, gating, act;
    bool        norm_w, bias;
    float       w_scale;
} k_moe_cases[] = {
    {"qwen3moe Q4_K/Q8_0", AG_TYPE_Q4_K, AG_TYPE_Q8_0, 256, 3, AG_MOE_GATE_SOFTMAX_TOPK, AG_MOE_ACT_SILU, true, false,
     1.0f},
    {"qwen3moe Q8_0 unnormalised", AG_TYPE_Q8_0, AG_TYPE_Q8_0, 320, 2, AG_MOE_GATE_SOFTMAX_TOPK, AG_MOE_ACT_SILU, false,
     false, 2.5f},
    {"gpt-oss MXFP4", AG_TYPE_MXFP4, AG_TYPE_MXFP4, 384, 3, AG_MOE_GATE_TOPK_SOFTMAX, AG_MOE_ACT_SWIGLU_OAI, false, true,
     1.0f},
};

static void moe_rows(void **state) {
    (void)state;
    if (!g_be->ops->moe) skip();
    enum { N = 24, N_DEC = 17, D = 512, E = 8 };
#define cases k_moe_cases
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int K = cases[c].K, F = cases[c].F;
        float    *dr, *dgx, *dux, *ddx;
        ag_tensor router = make_weight(g_be, AG_TYPE_F32, D, E, &dr);
        ag_tensor gx = make_stack(g_be, cases[c].gate_t, D, F, E, &dgx),
                  ux = make_stack(g_be, cases[c].gate_t, D, F, E, &dux), dx = make_stack(g_be, cases[c].down_t, F, D, E, &ddx);
        /* biases of the size of real ones: the router's ~1, the experts' ~0.1 */
        float *rb = randn(E, 1.0f), *gb = randn((size_t)E * F, 0.1f), *ub = randn((size_t)E * F, 0.1f),
              *db = randn((size_t)E * D, 0.1f);
        const bool bias = cases[c].bias;
        /* h of unit rms (as an rmsnorm's output); the router's rows (0.1 rms) spread the logits ~2 */
        float *h = randn((size_t)N * D, 1.0f);
        ag_moe_weights mw = {.gate_inp = &router, .gate_exps = &gx, .up_exps = &ux, .down_exps = &dx, .n_expert = E,
                             .n_used = K, .norm_w = cases[c].norm_w, .w_scale = cases[c].w_scale,
                             .gating = cases[c].gating, .act = cases[c].act, .alpha = 1.702f, .limit = 7.0f};
        float *d_rb = NULL, *d_gb = NULL, *d_ub = NULL, *d_db = NULL;
        if (bias) {
            d_rb = dev_put(g_be, rb, sizeof(float) * E), d_gb = dev_put(g_be, gb, sizeof(float) * E * F);
            d_ub = dev_put(g_be, ub, sizeof(float) * E * F), d_db = dev_put(g_be, db, sizeof(float) * E * D);
            mw.gate_inp_b = d_rb, mw.gate_b = d_gb, mw.up_b = d_ub, mw.down_b = d_db;
        }
        float *dh = dev_put(g_be, h, sizeof(float) * N * D), *dout = dev_floats(g_be, (size_t)N * D);
        assert_int_equal(g_be->ops->moe(g_be, &mw, dh, N, N_DEC, dout), AG_OK);
        float *out = host_get(g_be, dout, (size_t)N * D);

        /* the reference */
        double *ref = calloc((size_t)N * D, sizeof(double)), *x = malloc(sizeof(double) * D),
               *g = malloc(sizeof(double) * F);
        for (int i = 0; i < N; i++) {
            for (int d = 0; d < D; d++) x[d] = h[(size_t)i * D + d];
            double lg[E];
            for (int e = 0; e < E; e++) lg[e] = dot_row(dr, D, E, 0, e, x) + (bias ? rb[e] : 0.0);
            int    sel[E] = {0};
            double wt[E];
            bool   taken[E] = {false};
            for (int r = 0; r < K; r++) { /* top-k of the logits = top-k of the probabilities */
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!taken[e] && (best < 0 || lg[e] > lg[best])) best = e;
                taken[best] = true, sel[r] = best;
            }
            double mx = lg[sel[0]], sum = 0;
            if (cases[c].gating == AG_MOE_GATE_TOPK_SOFTMAX) {
                for (int r = 0; r < K; r++) sum += wt[r] = exp(lg[sel[r]] - mx);
                for (int r = 0; r < K; r++) wt[r] /= sum;
            } else {
                for (int e = 0; e < E; e++) sum += exp(lg[e] - mx);
                double s = 0;
                for (int r = 0; r < K; r++) s += wt[r] = exp(lg[sel[r]] - mx) / sum;
                for (int r = 0; r < K && cases[c].norm_w; r++) wt[r] /= s;
            }
            for (int r = 0; r < K; r++) {
                const int e = sel[r];
                for (int f = 0; f < F; f++) {
                    double a = dot_row(dgx, D, F, e, f, x) + (bias ? gb[(size_t)e * F + f] : 0.0);
                    double b = dot_row(dux, D, F, e, f, x) + (bias ? ub[(size_t)e * F + f] : 0.0);
                    if (cases[c].act == AG_MOE_ACT_SWIGLU_OAI) {
                        a = fmin(a, 7.0), b = fmax(fmin(b, 7.0), -7.0);
                        g[f] = a / (1.0 + exp(-1.702 * a)) * (b + 1.0);
                    } else {
                        g[f] = a / (1.0 + exp(-a)) * b;
                    }
                }
                for (int d = 0; d < D; d++)
                    ref[(size_t)i * D + d] += wt[r] * cases[c].w_scale *
                                              (dot_row(ddx, F, D, e, d, g) + (bias ? db[(size_t)e * D + d] : 0.0));
            }
        }
        const double e_ref = rel_err(out, ref, (size_t)N * D);
        fprintf(stderr, "moe %s: err %.3g against the reference\n", cases[c].name, e_ref);
        if (!(e_ref <= 5e-2))
            fail_msg("%s moe %s: err %.3g against the reference", g_be->ops->name, cases[c].name, e_ref);
        if (!g_is_cpu) { /* against the CPU's op */
            ag_tensor rc = router, gc = gx, uc = ux, dc = dx;
            rc.data = rc.host, gc.data = gc.host, uc.data = uc.host, dc.data = dc.host;
            ag_moe_weights cw = mw;
            cw.gate_inp = &rc, cw.gate_exps = &gc, cw.up_exps = &uc, cw.down_exps = &dc;
            if (bias) cw.gate_inp_b = rb, cw.gate_b = gb, cw.up_b = ub, cw.down_b = db;
            float *co = malloc(sizeof(float) * N * D);
            assert_int_equal(g_cpu->ops->moe(g_cpu, &cw, h, N, N_DEC, co), AG_OK);
            const double e = rel_err_f(out, co, (size_t)N * D);
            fprintf(stderr, "moe %s: err %.3g against the CPU's op\n", cases[c].name, e);
            if (!(e <= 5e-2)) fail_msg("%s moe %s: err %.3g against the CPU's op", g_be->ops->name, cases[c].name, e);
            free(co);
        }
        /* batch invariance: each row alone, as its kind */
        float *d1 = dev_floats(g_be, D);
        for (int i = 0; i < N; i++) {
            const bool dec = i < N_DEC;
            assert_int_equal(g_be->ops->moe(g_be, &mw, dh + (size_t)i * D, 1, dec ? 1 : 0, d1), AG_OK);
            float *y1 = host_get(g_be, d1, D);
            if (dec || g_is_cpu) {
                if (memcmp(y1, out + (size_t)i * D, sizeof(float) * D))
                    fail_msg("%s moe %s: %s row %d alone differs from the same row in a batch of %d (%d decode)",
                             g_be->ops->name, cases[c].name, dec ? "decode" : "prompt", i, N, N_DEC);
            } else {
                const double e = rel_err_f(y1, out + (size_t)i * D, D);
                if (!(e <= 1e-2))
                    fail_msg("%s moe %s: prompt row %d alone err %.3g against the batch's", g_be->ops->name,
                             cases[c].name, i, e);
            }
            free(y1);
        }
        /* the decode rows as a batch of their own */
        assert_int_equal(g_be->ops->moe(g_be, &mw, dh, N_DEC, N_DEC, dout), AG_OK);
        float *yd = host_get(g_be, dout, (size_t)N_DEC * D);
        if (memcmp(yd, out, sizeof(float) * N_DEC * D))
            fail_msg("%s moe %s: the %d decode rows alone differ from the mixed batch", g_be->ops->name, cases[c].name,
                     N_DEC);
        free(yd), free(out), free(ref), free(x), free(g), free(h), free(rb), free(gb), free(ub), free(db);
        free(dr), free(dgx), free(dux), free(ddx);
        g_be->ops->free(g_be, d1), g_be->ops->free(g_be, dh), g_be->ops->free(g_be, dout);
        if (bias) g_be->ops->free(g_be, d_rb), g_be->ops->free(g_be, d_gb), g_be->ops->free(g_be, d_ub),
            g_be->ops->free(g_be, d_db);
    }
#undef cases
    if (g_be->ops->graph_begin) { /* holding expert stacks, CUDA records no passes (its routing syncs) */
        int gs = -1;
        assert_int_equal(g_be->ops->graph_begin(g_be, 0x6d6f65ull, &gs), AG_OK);
        if (gs != AG_GRAPH_OFF) fail_msg("%s: graph_begin answers %d with expert stacks loaded", g_be->ops->name, gs);
    }
}

/* The plan a device backend runs the routed rows by (ag_moe_plan; the
 * steps of cuda/moe.cu: every entry's row gathered, grouped by expert with
 * its decode rows first, gate/up per expert with the group's own count of
 * decode rows, biases and the activation over all entries, down per
 * expert, each row's sum over its positions in ent order), carried out
 * here with the CPU backend's ops, gives the CPU op's bits: so the plan
 * groups, orders and weighs exactly as the reference does. Also checks
 * the plan's shape directly (groups by ascending expert, batch order
 * within one, each row's positions ascending and pointing back at it). */
static void moe_plan_gives_cpu_bits(void **state) {
    (void)state;
    enum { N = 24, N_DEC = 17, D = 512, E = 8 };
    ag_backend *be = g_cpu;
    for (size_t c = 0; c < sizeof k_moe_cases / sizeof k_moe_cases[0]; c++) {
        const int K = k_moe_cases[c].K, F = k_moe_cases[c].F, NK = N * K;
        float    *dr, *dgx, *dux, *ddx;
        ag_tensor router = make_weight(be, AG_TYPE_F32, D, E, &dr);
        ag_tensor gx = make_stack(be, k_moe_cases[c].gate_t, D, F, E, &dgx),
                  ux = make_stack(be, k_moe_cases[c].gate_t, D, F, E, &dux),
                  dx = make_stack(be, k_moe_cases[c].down_t, F, D, E, &ddx);
        const bool bias = k_moe_cases[c].bias;
        float *rb = randn(E, 1.0f), *gb = randn((size_t)E * F, 0.1f), *ub = randn((size_t)E * F, 0.1f),
              *db = randn((size_t)E * D, 0.1f), *h = randn((size_t)N * D, 1.0f);
        ag_moe_weights mw = {.gate_inp = &router, .gate_exps = &gx, .up_exps = &ux, .down_exps = &dx, .n_expert = E,
                             .n_used = K, .norm_w = k_moe_cases[c].norm_w, .w_scale = k_moe_cases[c].w_scale,
                             .gating = k_moe_cases[c].gating, .act = k_moe_cases[c].act, .alpha = 1.702f,
                             .limit = 7.0f};
        if (bias) mw.gate_inp_b = rb, mw.gate_b = gb, mw.up_b = ub, mw.down_b = db;
        float *ref = malloc(sizeof(float) * N * D);
        assert_int_equal(be->ops->moe(be, &mw, h, N, N_DEC, ref), AG_OK);

        /* routing and the plan */
        float   *lg = malloc(sizeof(float) * N * E), *rw = malloc(sizeof(float) * NK),
                *ent_w = malloc(sizeof(float) * NK);
        int32_t *sel = malloc(sizeof(int32_t) * NK), *start = malloc(sizeof(int32_t) * (E + 1)),
                *src = malloc(sizeof(int32_t) * NK), *exp_of = malloc(sizeof(int32_t) * NK),
                *ent = malloc(sizeof(int32_t) * NK), *scratch = malloc(sizeof(int32_t) * (2 * NK + E));
        assert_int_equal(be->ops->matmul(be, &router, h, N, N_DEC, lg), AG_OK);
        for (int i = 0; bias && i < N * E; i++) lg[i] += rb[i % E];
        ag_moe_route_rows(&mw, lg, N, sel, rw);
        ag_moe_plan(N, K, E, sel, rw, start, src, exp_of, ent, ent_w, scratch);
        assert_int_equal(start[0], 0);
        assert_int_equal(start[E], NK);
        for (int e = 0; e < E; e++) {
            assert_true(start[e] <= start[e + 1]);
            for (int p = start[e]; p < start[e + 1]; p++) {
                assert_int_equal(exp_of[p], e);
                if (p > start[e]) assert_true(src[p - 1] < src[p]); /* batch order, a row once */
            }
        }
        for (int i = 0; i < N; i++)
            for (int k = 0; k < K; k++) {
                const int p = ent[i * K + k];
                assert_true(p >= 0 && p < NK);
                assert_int_equal(src[p], i);
                if (k) assert_true(ent[i * K + k - 1] < p);
                int r = 0; /* its weight is the one routing gave that expert */
                while (r < K && sel[i * K + r] != exp_of[p]) r++;
                assert_true(r < K);
                assert_memory_equal(&ent_w[i * K + k], &rw[i * K + r], sizeof(float));
            }

        /* the device op's steps, on the CPU's ops */
        float *xg = malloc(sizeof(float) * NK * D), *g = malloc(sizeof(float) * NK * F),
              *u = malloc(sizeof(float) * NK * F), *y = malloc(sizeof(float) * NK * D),
              *o = malloc(sizeof(float) * N * D);
        for (int p = 0; p < NK; p++) memcpy(xg + (size_t)p * D, h + (size_t)src[p] * D, sizeof(float) * D);
        for (int e = 0; e < E; e++) {
            const int n_e = start[e + 1] - start[e];
            int       n_dec = 0;
            while (n_dec < n_e && src[start[e] + n_dec] < N_DEC) n_dec++;
            if (!n_e) continue;
            const ag_tensor  gv = ag_moe_expert_view(&gx, e), uv = ag_moe_expert_view(&ux, e);
            const ag_tensor *gu_w[2] = {&gv, &uv};
            float *const     gu[2] = {g + (size_t)start[e] * F, u + (size_t)start[e] * F};
            assert_int_equal(be->ops->matmul_multi(be, gu_w, 2, xg + (size_t)start[e] * D, n_e, n_dec, gu), AG_OK);
        }
        for (int p = 0; bias && p < NK; p++)
            for (int f = 0; f < F; f++) {
                g[(size_t)p * F + f] += gb[(size_t)exp_of[p] * F + f];
                u[(size_t)p * F + f] += ub[(size_t)exp_of[p] * F + f];
            }
        if (k_moe_cases[c].act == AG_MOE_ACT_SWIGLU_OAI) { /* (cpu/moe.c swiglu_oai's expression) */
            for (size_t i = 0; i < (size_t)NK * F; i++) {
                const float x = fminf(g[i], mw.limit), v = fmaxf(fminf(u[i], mw.limit), -mw.limit);
                g[i] = x / (1.f + expf(mw.alpha * (-x))) * (v + 1.f);
            }
        } else {
            assert_int_equal(be->ops->silu_mul(be, g, u, (size_t)NK * F), AG_OK);
        }
        for (int e = 0; e < E; e++) {
            const int n_e = start[e + 1] - start[e];
            int       n_dec = 0;
            while (n_dec < n_e && src[start[e] + n_dec] < N_DEC) n_dec++;
            if (!n_e) continue;
            const ag_tensor dv = ag_moe_expert_view(&dx, e);
            assert_int_equal(be->ops->matmul(be, &dv, g + (size_t)start[e] * F, n_e, n_dec, y + (size_t)start[e] * D),
                             AG_OK);
        }
        for (int p = 0; bias && p < NK; p++)
            for (int d = 0; d < D; d++) y[(size_t)p * D + d] += db[(size_t)exp_of[p] * D + d];
        for (int i = 0; i < N; i++)
            for (int d = 0; d < D; d++) {
                float acc = 0.0f;
                for (int k = 0; k < K; k++) acc += ent_w[i * K + k] * y[(size_t)ent[i * K + k] * D + d];
                o[(size_t)i * D + d] = acc;
            }
        if (memcmp(o, ref, sizeof(float) * N * D))
            fail_msg("moe %s: the device plan carried out on the CPU's ops differs from the CPU op (err %.3g)",
                     k_moe_cases[c].name, rel_err_f(o, ref, (size_t)N * D));
        free(xg), free(g), free(u), free(y), free(o), free(lg), free(rw), free(ent_w), free(sel), free(start);
        free(src), free(exp_of), free(ent), free(scratch), free(ref), free(rb), free(gb), free(ub), free(db), free(h);
        free(dr), free(dgx), free(dux), free(ddx);
    }
}

/* The argmax op against the sampler's greedy rule: the lowest index among
 * the largest values, +inf and FLT_MAX alike, NaN skipped, -2 for a row
 * with no finite value; rows of 4k + 1 values too (a kernel's scalar path). */
static void argmax_rows(void **state) {
    (void)state;
    if (!g_be->ops->argmax) skip();
    for (int odd = 0; odd < 2; odd++) {
        enum { N = 9 };
        const int dim = odd ? 50001 : 50000;
        float    *x = randn((size_t)N * dim, 3.0f);
        float    *r = x;
        r[17] = r[40000] = 100.0f; /* row 0: a tie, the lower index wins */
        r = x + (size_t)dim; /* row 1: FLT_MAX before +inf: the FLT_MAX */
        r[123] = FLT_MAX, r[4567] = INFINITY;
        r = x + 2 * (size_t)dim; /* row 2: NaN everywhere but two values */
        for (int i = 0; i < dim; i++) r[i] = NAN;
        r[dim - 1] = -5.0f, r[9] = -6.0f;
        r = x + 3 * (size_t)dim; /* row 3: nothing finite */
        for (int i = 0; i < dim; i++) r[i] = i % 3 ? -INFINITY : NAN;
        r = x + 4 * (size_t)dim; /* row 4: the maximum last */
        r[dim - 1] = 50.0f;
        r = x + 5 * (size_t)dim; /* row 5: +inf after a NaN */
        r[0] = NAN, r[1] = INFINITY;
        int32_t want[N];
        for (int k = 0; k < N; k++) {
            const float *row = x + (size_t)k * dim;
            float        best = -INFINITY;
            want[k] = -2;
            for (int i = 0; i < dim; i++) {
                float v = row[i] > FLT_MAX ? FLT_MAX : row[i];
                if (v > best) best = v, want[k] = i;
            }
        }
        assert_int_equal(want[0], 17);
        assert_int_equal(want[1], 123);
        assert_int_equal(want[2], dim - 1);
        assert_int_equal(want[3], -2);
        assert_int_equal(want[5], 1);
        float   *dx = dev_put(g_be, x, sizeof(float) * N * (size_t)dim);
        int32_t *dout = dev_floats(g_be, N), got[N];
        assert_int_equal(g_be->ops->argmax(g_be, dx, N, dim, dout), AG_OK);
        assert_int_equal(g_be->ops->download(g_be, got, dout, sizeof got), AG_OK);
        for (int k = 0; k < N; k++)
            if (got[k] != want[k]) fail_msg("%s argmax dim %d row %d: %d, want %d", g_be->ops->name, dim, k, got[k], want[k]);
        g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dout);
        free(x);
    }
}

/* The pick op: each row's token drawn with its draw (ag_pick_f32), the
 * draws handed to begin with the layout. A device may sum the weights in
 * another order, so a token may differ from ag_pick_f32's only where u times
 * the sum lies within 1e-9 of the sum from a boundary; the draws below are
 * checked to be further than that, so every token must match. */
static void pick_rows(void **state) {
    (void)state;
    if (!g_be->ops->pick) skip();
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    enum { N = 12 };
    const int dim = 50001;
    float    *x = randn((size_t)N * dim, 3.0f);
    float    *r = x + 2 * (size_t)dim; /* row 2: NaN everywhere but two values */
    for (int i = 0; i < dim; i++) r[i] = NAN;
    r[dim - 1] = -5.0f, r[9] = -6.0f;
    r = x + 3 * (size_t)dim; /* row 3: nothing finite */
    for (int i = 0; i < dim; i++) r[i] = i % 3 ? -INFINITY : NAN;
    r = x + 5 * (size_t)dim; /* row 5: +inf (as FLT_MAX) among others */
    r[1] = INFINITY, r[77] = FLT_MAX;
    ag_pick  draws[N];
    int32_t  want[N], pos[N], seq[N], ids[N];
    uint64_t st = 99;
    for (int k = 0; k < N; k++) {
        pos[k] = ag_kv_seq_len(f.kv, f.seq[0]) + k, seq[k] = f.seq[0], ids[k] = k;
        for (;;) { /* a draw not within 1e-9 (relative) of a boundary of the row's cumulative weights */
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            draws[k].u = (double)(st >> 11) * 0x1.0p-53;
            draws[k].inv_temp = k % 4 == 0 ? 1.0f : k % 4 == 1 ? 0.5f : k % 4 == 2 ? 2.0f : 1.3f;
            const float *row = x + (size_t)k * dim;
            want[k] = ag_pick_f32(row, dim, draws[k].inv_temp, draws[k].u);
            if (want[k] < 0) {
                want[k] = -2;
                break;
            }
            float m = -INFINITY;
            for (int i = 0; i < dim; i++) {
                float l = ag_logit_sanitize(row[i]);
                m = l > m ? l : m;
            }
            double sum = 0.0, cum = 0.0, near = INFINITY;
            for (int i = 0; i < dim; i++) {
                float l = ag_logit_sanitize(row[i]);
                sum += (double)expf((l - m) * draws[k].inv_temp);
            }
            for (int i = 0; i < dim; i++) {
                float l = ag_logit_sanitize(row[i]);
                cum += (double)expf((l - m) * draws[k].inv_temp);
                const double dist = fabs(cum - draws[k].u * sum);
                near = dist < near ? dist : near;
            }
            if (near > 1e-9 * sum) break;
        }
    }
    assert_int_equal(want[3], -2);
    ag_batch_layout lay = {N, pos, seq, 0, draws, NULL, N, NULL, NULL, NULL, 0};
    begin_pass(g_be, f.kv, &lay, ids);
    float   *dx = dev_put(g_be, x, sizeof(float) * N * (size_t)dim);
    int32_t *dout = dev_floats(g_be, N), got[N];
    /* two runs of rows, as the model issues them: rows 0..4, then 5..11 */
    assert_int_equal(g_be->ops->pick(g_be, dx, 5, dim, &lay, 0, dout), AG_OK);
    assert_int_equal(g_be->ops->pick(g_be, dx + 5 * (size_t)dim, N - 5, dim, &lay, 5, dout + 5), AG_OK);
    assert_int_equal(g_be->ops->download(g_be, got, dout, sizeof got), AG_OK);
    commit_pass(f.kv, &lay);
    int distinct = 0;
    for (int k = 0; k < N; k++) {
        if (got[k] != want[k]) fail_msg("%s pick row %d: %d, want %d", g_be->ops->name, k, got[k], want[k]);
        distinct += k > 0 && got[k] != got[k - 1];
    }
    assert_true(distinct >= N / 2); /* the draws spread the picks */
    /* a run without draws is refused */
    lay.pick = NULL;
    assert_int_equal(g_be->ops->pick(g_be, dx, 1, dim, &lay, 0, dout), AG_ERR_INVALID);
    g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dout);
    free(x);
    ag_kv_free(f.kv);
}

/* The cands op: each row's best candidates for its request, handed to
 * begin with the layout, against ag_top_cands_f32 on the host: the count,
 * the finite count, the max and every candidate (value and id) exactly; the
 * sum of exponentials to 1e-6 relative (NaN when not asked for, 0 without a
 * finite value): a device sums in another order, and
 * CUDA's expf is within 2 ulp (2.4e-7 relative) of the host's per term.
 * Rows with ties (-0.0 with +0.0 too, compared bit for bit), NaN, +inf
 * beside FLT_MAX, nothing finite, fewer finite values than k, a vocab of
 * 151936 and of 7. */
static void cands_case(int dim) {
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    enum { N = 10 };
    float *x = randn((size_t)N * dim, 3.0f);
    for (int i = 0; i < dim; i++) x[1 * (size_t)dim + i] = (float)(i % 13) * 0.5f; /* row 1: ties everywhere */
    float *r = x + 2 * (size_t)dim; /* row 2: NaN everywhere but two values */
    for (int i = 0; i < dim; i++) r[i] = NAN;
    r[dim - 1] = -5.0f, r[dim / 2] = -6.0f;
    r = x + 3 * (size_t)dim; /* row 3: nothing finite */
    for (int i = 0; i < dim; i++) r[i] = i % 3 ? -INFINITY : NAN;
    r = x + 5 * (size_t)dim; /* row 5: +inf (as FLT_MAX) tied with FLT_MAX */
    r[1] = INFINITY, r[dim - 2] = FLT_MAX;
    r = x + 6 * (size_t)dim; /* row 6: -inf beside large negatives */
    for (int i = 0; i < dim; i += 2) r[i] = -INFINITY;
    r = x + 8 * (size_t)dim; /* row 8: -0.0 and +0.0 tie (as equal values, by id) above negatives */
    for (int i = 0; i < dim; i++) r[i] = i % 5 == 0 ? (i % 2 ? -0.0f : 0.0f) : -fabsf(r[i]) - 1.0f;
    static const int ks[N] = {40, 256, 5, 1, 300, 20, 256, 1, 64, 2};
    ag_cands_req     req[N];
    int32_t          pos[N], seq[N], ids[N];
    for (int k = 0; k < N; k++) {
        /* at: none, the best, a middle id, the last, one past the row */
        const int32_t ats[5] = {-1, 0, dim / 2, dim - 1, dim};
        req[k] = (ag_cands_req){ks[k], k % 3 != 1, ats[k % 5]};
        pos[k] = ag_kv_seq_len(f.kv, f.seq[0]) + k, seq[k] = f.seq[0], ids[k] = k;
    }
    /* at = the pass's token for a row: rows 6..9 with the second run's tokens
     * (one of them "nothing finite"), row 2 in the first run, which has none */
    const int32_t tok[N - 4] = {0, 0, dim / 3, -2 /* nothing finite */, dim - 2, 5};
    req[2].at = req[6].at = req[7].at = req[8].at = req[9].at = AG_CANDS_AT_TOKEN;
    ag_cands *want = malloc(sizeof(ag_cands) * N), *got = malloc(sizeof(ag_cands) * N);
    for (int k = 0; k < N; k++) {
        ag_cands_req h = req[k]; /* the host names the token itself */
        if (h.at == AG_CANDS_AT_TOKEN) h.at = k >= 4 ? tok[k - 4] : -1;
        ag_top_cands_f32(x + (size_t)k * dim, dim, &h, &want[k]);
    }
    ag_batch_layout lay = {N, pos, seq, 0, NULL, req, N, NULL, NULL, NULL, 0};
    begin_pass(g_be, f.kv, &lay, ids);
    float    *dx = dev_put(g_be, x, sizeof(float) * N * (size_t)dim);
    ag_cands *dout = g_be->ops->alloc(g_be, sizeof(ag_cands) * N);
    assert_non_null(dout);
    /* two runs of rows, as the model issues them: rows 0..3, then 4..9 */
    int32_t *dtok = dev_put(g_be, tok, sizeof tok);
    assert_int_equal(g_be->ops->cands(g_be, dx, 4, dim, &lay, 0, NULL, dout), AG_OK);
    assert_int_equal(g_be->ops->cands(g_be, dx + 4 * (size_t)dim, N - 4, dim, &lay, 4, dtok, dout + 4), AG_OK);
    assert_int_equal(g_be->ops->download(g_be, got, dout, sizeof(ag_cands) * N), AG_OK);
    commit_pass(f.kv, &lay);
    for (int k = 0; k < N; k++) {
        const ag_cands *w = &want[k], *g = &got[k];
        if (g->n != w->n || g->n_finite != w->n_finite || memcmp(&g->max, &w->max, sizeof g->max))
            fail_msg("%s cands row %d (dim %d): n %d/%d finite %d/%d max %g/%g", g_be->ops->name, k, dim, g->n, w->n,
                     g->n_finite, w->n_finite, (double)g->max, (double)w->max);
        if (g->at != w->at || (w->at >= 0 ? memcmp(&g->at_l, &w->at_l, sizeof g->at_l) != 0 : !isnan(g->at_l)))
            fail_msg("%s cands row %d (dim %d): at %d = %g, want %d = %g", g_be->ops->name, k, dim, g->at,
                     (double)g->at_l, w->at, (double)w->at_l);
        for (int i = 0; i < w->n; i++)
            if (g->c[i].id != w->c[i].id || memcmp(&g->c[i].l, &w->c[i].l, sizeof g->c[i].l))
                fail_msg("%s cands row %d (dim %d) #%d: (%g, %d), want (%g, %d)", g_be->ops->name, k, dim, i,
                         (double)g->c[i].l, g->c[i].id, (double)w->c[i].l, w->c[i].id);
        if (!req[k].want_z) {
            if (!isnan(g->sumexp)) fail_msg("%s cands row %d (dim %d): sumexp %g unasked", g_be->ops->name, k, dim, g->sumexp);
            continue;
        }
        if (w->n_finite == 0) {
            if (g->sumexp != 0.0) fail_msg("%s cands row %d (dim %d): sumexp %g of nothing", g_be->ops->name, k, dim, g->sumexp);
            continue;
        }
        if (!(fabs(g->sumexp - w->sumexp) <= 1e-6 * w->sumexp))
            fail_msg("%s cands row %d (dim %d): sumexp %.17g, want %.17g", g_be->ops->name, k, dim, g->sumexp,
                     w->sumexp);
    }
    assert_int_equal(want[3].n, 0);
    assert_int_equal(want[2].n, 2);
    assert_true(want[2].at == -1 && want[6].at == dim / 3 && want[7].at == -1 && want[8].at == dim - 2);
    /* a run without requests is refused */
    lay.cands_req = NULL;
    assert_int_equal(g_be->ops->cands(g_be, dx, 1, dim, &lay, 0, NULL, dout), AG_ERR_INVALID);
    g_be->ops->free(g_be, dx), g_be->ops->free(g_be, dout), g_be->ops->free(g_be, dtok);
    free(x), free(want), free(got);
    ag_kv_free(f.kv);
}

static void cands_rows(void **state) {
    (void)state;
    if (!g_be->ops->cands) skip();
    cands_case(151936);
    cands_case(7);
    cands_case(1000);
}

/* The edit op: the rows' edits, handed to begin with the layout, against
 * ag_logit_edit_apply on the host, bit for bit (a device must round each
 * operation as the host does): rows with NaN, +-inf, +-FLT_MAX, +-0 among
 * random values; edits with every flag combination, a repetition penalty
 * of 1 and others, sums that overflow; a row without edits; twice, the
 * second pass with other edits (the upload is per pass). Then the mask
 * op: rows with bitmaps (few tokens allowed, most) get -inf elsewhere,
 * rows without keep their values. */
static void edit_rows(void **state) {
    (void)state;
    if (!g_be->ops->edit || !g_be->ops->mask) skip();
    enum { N = 6, DIM = 4099 };
    kv_fixture f = make_kv(g_be, 1, 32, NULL);
    for (int pass = 0; pass < 2; pass++) {
        float *x = randn((size_t)N * DIM, 6.0f);
        static const float special[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f, 3e38f, -3e38f};
        for (int i = 0; i < 40; i++) x[(size_t)(i % N) * DIM + (size_t)(i * 97 + pass) % DIM] = special[i % 9];
        static ag_logit_edit ed[N * 300];
        int32_t              start[N + 1], pos[N], seq[N], ids[N], n = 0;
        static const float   reps[] = {1.0f, 1.3f, 0.7f, 1e-30f, 3e30f}, vals[] = {0.5f, -2.25f, 3e38f, -3e38f, 1e-3f, 0.0f};
        for (int k = 0; k < N; k++) {
            start[k] = n;
            for (int i = k; k != 3 && i < DIM; i += 14 + pass) /* row 3: none */
                ed[n] = (ag_logit_edit){i, (uint32_t)((i + pass) % 8), vals[i % 6] * 1.1f, reps[(i / 3) % 5],
                                        vals[(i / 7) % 6] * 0.9f},
                n++;
            pos[k] = ag_kv_seq_len(f.kv, f.seq[0]) + k, seq[k] = f.seq[0], ids[k] = k;
        }
        start[N] = n;
        float *want = malloc(sizeof(float) * N * DIM), *got = malloc(sizeof(float) * N * DIM);
        memcpy(want, x, sizeof(float) * N * DIM);
        for (int k = 0; k < N; k++)
            for (int i = start[k]; i < start[k + 1]; i++)
                want[(size_t)k * DIM + ed[i].id] = ag_logit_edit_apply(x[(size_t)k * DIM + ed[i].id], &ed[i]);
        /* masks (the mask op, after the edits): rows 1 and 4 (a few tokens allowed; most), the others none */
        enum { W = (DIM + 31) / 32 };
        static uint32_t        bits[2][W];
        const uint32_t        *allow[N] = {NULL};
        for (int w = 0; w < W; w++) bits[0][w] = w % 7 == pass ? 0x00010001u << pass : 0, bits[1][w] = ~(1u << (w % 32));
        allow[1] = bits[0], allow[4] = bits[1];
        for (int k = 0; k < N; k++)
            for (int i = 0; allow[k] && i < DIM; i++)
                if (!(allow[k][i / 32] >> (i % 32) & 1u)) want[(size_t)k * DIM + i] = -INFINITY;
        ag_batch_layout lay = {N, pos, seq, 0, NULL, NULL, N, start, ed, allow, W};
        begin_pass(g_be, f.kv, &lay, ids);
        float *dx = dev_put(g_be, x, sizeof(float) * N * DIM);
        assert_int_equal(g_be->ops->edit(g_be, dx, N, DIM, &lay), AG_OK);
        assert_int_equal(g_be->ops->mask(g_be, dx, N, DIM, &lay), AG_OK);
        assert_int_equal(g_be->ops->download(g_be, got, dx, sizeof(float) * N * DIM), AG_OK);
        commit_pass(f.kv, &lay);
        for (size_t i = 0; i < (size_t)N * DIM; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)))
                fail_msg("%s edit pass %d row %zu id %zu: %a, want %a", g_be->ops->name, pass, i / DIM, i % DIM,
                         (double)got[i], (double)want[i]);
        g_be->ops->free(g_be, dx);
        free(x), free(want), free(got);
    }
    ag_kv_free(f.kv);
}

/* ---- KV store + attention ---- */

/* dst (a host cache with the same sequences) gets src's rows of every
 * position up to the current pass's end, read back through ag_kv_read. */
static void copy_kv(ag_kv *src, ag_kv *dst, const ag_batch_layout *lay, int pass) {
    const ag_kv_layout *L = ag_kv_get_layout(src);
    float *k = malloc(sizeof(float) * L->n_kv_heads * L->head_dim_k), *v = malloc(sizeof(float) * L->n_kv_heads * L->head_dim_v);
    for (int32_t s = 0; s < 2; s++) {
        int32_t end = ag_kv_seq_len(src, s);
        for (int i = 0; i < lay->n; i++)
            if (lay->seq[i] == s && lay->pos[i] + 1 > end) end = lay->pos[i] + 1;
        assert_int_equal(ag_kv_seq_reserve(dst, s, end), AG_OK);
        for (int32_t p = 0; p < end; p++)
            for (int32_t l = 0; l < L->n_layers; l++) {
                assert_int_equal(ag_kv_read(src, l, s, p, k, v), AG_OK);
                assert_int_equal(ag_kv_write(dst, l, s, p, k, v), AG_OK);
            }
    }
    free(k), free(v);
}

/* Two sequences, GQA (6 heads over 2 kv heads), a global layer and a
 * sliding-window layer; a first pass stores a prompt, a second mixes decode
 * rows of one sequence with prompt rows of the other. Reference: softmax
 * attention in double over the KV rows read back (as stored, fp16). */
/* Attention over a paged cache of head dimension HD (softcap > 0: scores
 * capped as Gemma 2 does): prompt and decode rows against a double
 * reference and, for a device backend, against the CPU. */
/* P1: the first sequence's length after the first pass (600 reaches every
 * split of a split-K decode attention; shorter cases keep the test quick). */
/* sinks: one learned logit per head beside each softmax (gpt-oss), where
 * the backend has them (attn_sinks); in the backend's memory, as a model
 * passes its prepared weight. */
static void attention_case_sinks(int HD, float softcap, int N_HEAD, int N_KV, int P1, bool sinks) {
    const int32_t windows[2] = {0, 9};
    float         sink[64];
    for (int h = 0; h < N_HEAD; h++) sink[h] = (float)(h % 5) - 2.0f; /* -2..2: from none to most of the weight */
    sink[N_HEAD - 1] = 9.0f; /* far above every score: nearly all of the weight, the max the sink's */
    float        *dsink = sinks ? dev_put(g_be, sink, sizeof(float) * N_HEAD) : NULL;
    kv_fixture    f = make_kv(g_be, N_KV, HD, windows);
    int32_t       toks[1024] = {0};
    for (int pass = 0; pass < 2; pass++) {
        int32_t pos[1024], seq[1024];
        int     n = 0;
        if (pass == 0) {
            for (int i = 0; i < P1; i++) pos[n] = i, seq[n++] = f.seq[0];
            for (int i = 0; i < 5; i++) pos[n] = i, seq[n++] = f.seq[1];
        } else {
            for (int i = 0; i < 3; i++) pos[n] = P1 + i, seq[n++] = f.seq[0];
            for (int i = 0; i < 20; i++) pos[n] = 5 + i, seq[n++] = f.seq[1];
        }
        ag_batch_layout lay = {n, pos, seq, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
        begin_pass(g_be, f.kv, &lay, toks);
        float *q = randn((size_t)n * N_HEAD * HD, 1.0f), *k = randn((size_t)n * N_KV * HD, 1.0f),
              *v = randn((size_t)n * N_KV * HD, 1.0f);
        float *dq = dev_put(g_be, q, (size_t)n * N_HEAD * HD * 4), *dk = dev_put(g_be, k, (size_t)n * N_KV * HD * 4),
              *dv = dev_put(g_be, v, (size_t)n * N_KV * HD * 4), *dout = dev_floats(g_be, (size_t)n * N_HEAD * HD);
        /* each layer twice: the rows as prompt rows, then as decode rows (a
         * backend may use another kernel per kind; both must be right) */
        for (int run = 0; run < 4; run++) {
            const int     layer = run / 2;
            ag_attn_shape sh = {.layer = layer, .n_head = N_HEAD, .n_head_kv = N_KV, .head_dim_k = HD,
                                .head_dim_v = HD, .scale = 0.125f, .window = windows[layer], .softcap = softcap,
                                .sinks = dsink};
            lay.n_decode = run % 2 ? n : 0;
            if (g_be->ops->begin) assert_int_equal(g_be->ops->begin(g_be, f.kv, &lay, toks), AG_OK);
            assert_int_equal(g_be->ops->kv_store(g_be, f.kv, &sh, &lay, dk, dv), AG_OK);
            assert_int_equal(g_be->ops->attention(g_be, f.kv, &sh, &lay, dq, dout), AG_OK);
            float  *out = host_get(g_be, dout, (size_t)n * N_HEAD * HD);
            double *ref = calloc((size_t)n * N_HEAD * HD, sizeof(double));
            /* the cache as stored, read back once per position (a device
             * read per score was quadratic in copies) */
            const size_t row = (size_t)N_KV * HD;
            int          len[2] = {0, 0};
            for (int t = 0; t < n; t++) {
                const int si = seq[t] == f.seq[1];
                if (pos[t] + 1 > len[si]) len[si] = pos[t] + 1;
            }
            float *kc[2], *vc[2];
            for (int si = 0; si < 2; si++) {
                kc[si] = malloc(sizeof(float) * row * (len[si] + 1));
                vc[si] = malloc(sizeof(float) * row * (len[si] + 1));
                for (int p = 0; p < len[si]; p++)
                    assert_int_equal(ag_kv_read(f.kv, layer, f.seq[si], p, kc[si] + p * row, vc[si] + p * row), AG_OK);
            }
            for (int t = 0; t < n; t++) {
                const int si = seq[t] == f.seq[1];
                int lo = windows[layer] ? pos[t] - windows[layer] + 1 : 0;
                if (lo < 0) lo = 0;
                int     cnt = pos[t] - lo + 1;
                double *sc = malloc(sizeof(double) * cnt);
                for (int h = 0; h < N_HEAD; h++) {
                    const int g = h / (N_HEAD / N_KV);
                    double    mx = -INFINITY, sum = 0;
                    for (int p = lo; p <= pos[t]; p++) {
                        const float *kr = kc[si] + p * row;
                        double       d = 0;
                        for (int i = 0; i < HD; i++) d += (double)q[((size_t)t * N_HEAD + h) * HD + i] * kr[g * HD + i];
                        sc[p - lo] = softcap > 0 ? softcap * tanh(d * 0.125 / softcap) : d * 0.125;
                        if (sc[p - lo] > mx) mx = sc[p - lo];
                    }
                    if (sinks && sink[h] > mx) mx = sink[h];
                    for (int j = 0; j < cnt; j++) sum += sc[j] = exp(sc[j] - mx);
                    if (sinks) sum += exp(sink[h] - mx); /* weight that goes to no value */
                    double *r = ref + ((size_t)t * N_HEAD + h) * HD;
                    for (int p = lo; p <= pos[t]; p++) {
                        const float *vr = vc[si] + p * row;
                        for (int i = 0; i < HD; i++) r[i] += sc[p - lo] / sum * vr[g * HD + i];
                    }
                }
                free(sc);
            }
            char what[96];
            snprintf(what, sizeof what, "attention hd %d%s%s, %d/%d heads, pass %d layer %d, %s rows", HD,
                     softcap > 0 ? " softcap" : "", sinks ? " sinks" : "", N_HEAD, N_KV, pass, layer,
                     run % 2 ? "decode" : "prompt");
            check(what, out, ref, (size_t)n * N_HEAD * HD, 1e-3);
            if (g_is_cpu && ag_cpu_isa_active() == AG_CPU_ISA_AVX512) {
                /* the AVX-512 loops (4 x 4 dots over float rows) give the AVX2 loops' bits */
                float *o2 = malloc(sizeof(float) * n * N_HEAD * HD);
                assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_AVX2), AG_OK);
                ag_cpu_attention_init();
                ag_status st2 = g_be->ops->attention(g_be, f.kv, &sh, &lay, dq, o2);
                assert_int_equal(ag_cpu_isa_set(AG_CPU_ISA_AVX512), AG_OK);
                ag_cpu_attention_init();
                assert_int_equal(st2, AG_OK);
                if (memcmp(o2, out, sizeof(float) * n * N_HEAD * HD)) fail_msg("%s: AVX-512 bits != AVX2 bits", what);
                free(o2);
            }
            if (!g_is_cpu) { /* the CPU backend over the same cache contents (read back to a host cache) */
                float *hq = q, *hout = malloc(sizeof(float) * n * N_HEAD * HD);
                kv_fixture hc = make_kv(g_cpu, N_KV, HD, windows);
                copy_kv(f.kv, hc.kv, &lay, pass);
                ag_attn_shape hsh = sh;
                hsh.sinks = sinks ? sink : NULL; /* (the CPU's memory) */
                assert_int_equal(g_cpu->ops->attention(g_cpu, hc.kv, &hsh, &lay, hq, hout), AG_OK);
                double e = rel_err_f(out, hout, (size_t)n * N_HEAD * HD);
                if (e > 5e-4) fail_msg("cuda vs cpu %s: err %.3g", what, e);
                free(hout);
                ag_kv_free(hc.kv);
            }
            free(out), free(ref);
            for (int si = 0; si < 2; si++) free(kc[si]), free(vc[si]);
        }
        commit_pass(f.kv, &lay);
        g_be->ops->free(g_be, dq), g_be->ops->free(g_be, dk), g_be->ops->free(g_be, dv), g_be->ops->free(g_be, dout);
        free(q), free(k), free(v);
    }
    if (dsink) g_be->ops->free(g_be, dsink);
    ag_kv_free(f.kv);
}

static void attention_case(int HD, float softcap, int N_HEAD, int N_KV, int P1) {
    attention_case_sinks(HD, softcap, N_HEAD, N_KV, P1, false);
}

/* Bidirectional attention (encoders), whole and two-sided windowed (|p -
 * pos| < w, EmbeddingGemma's sliding layers): two sequences in one prompt
 * pass, against a double reference over the KV rows read back. The CPU's
 * only (a backend without the layernorm op is never given bidirectional
 * shapes). */
static void attention_bidirectional(void **state) {
    if (!g_be->ops->layernorm || !g_is_cpu) skip();
    const int     HD = 64, NH = 4, NKV = 2, L0 = 70, L1 = 23;
    const int32_t nowin[2] = {0, 0};
    kv_fixture    f = make_kv(g_be, NKV, HD, nowin);
    int32_t       pos[L0 + L1], seq[L0 + L1], toks[L0 + L1];
    int           n = 0;
    for (int i = 0; i < L0; i++) pos[n] = i, seq[n] = f.seq[0], toks[n++] = 0;
    for (int i = 0; i < L1; i++) pos[n] = i, seq[n] = f.seq[1], toks[n++] = 0;
    ag_batch_layout lay = {n, pos, seq, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
    begin_pass(g_be, f.kv, &lay, toks);
    float *q = randn((size_t)n * NH * HD, 1.0f), *k = randn((size_t)n * NKV * HD, 1.0f),
          *v = randn((size_t)n * NKV * HD, 1.0f), *out = malloc(sizeof(float) * n * NH * HD);
    const size_t row = (size_t)NKV * HD;
    for (int wi = 0; wi < 2; wi++) {
        const int     W = wi ? 16 : 0;
        ag_attn_shape sh = {.layer = 0, .n_head = NH, .n_head_kv = NKV, .head_dim_k = HD, .head_dim_v = HD,
                            .scale = 0.125f, .window = W, .bidirectional = true};
        assert_int_equal(g_be->ops->kv_store(g_be, f.kv, &sh, &lay, k, v), AG_OK);
        assert_int_equal(g_be->ops->attention(g_be, f.kv, &sh, &lay, q, out), AG_OK);
        double *ref = calloc((size_t)n * NH * HD, sizeof(double));
        float  *kr = malloc(sizeof(float) * row), *vr = malloc(sizeof(float) * row);
        for (int t = 0; t < n; t++) {
            const int end = (seq[t] == f.seq[0] ? L0 : L1) - 1;
            const int lo = W && pos[t] - W + 1 > 0 ? pos[t] - W + 1 : 0, hi = W && pos[t] + W - 1 < end ? pos[t] + W - 1 : end;
            for (int h = 0; h < NH; h++) {
                const int g = h / (NH / NKV);
                double    sc[128], mx = -INFINITY, sum = 0;
                for (int p = lo; p <= hi; p++) {
                    assert_int_equal(ag_kv_read(f.kv, 0, seq[t], p, kr, vr), AG_OK);
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += (double)q[((size_t)t * NH + h) * HD + i] * kr[g * HD + i];
                    sc[p - lo] = d * 0.125;
                    if (sc[p - lo] > mx) mx = sc[p - lo];
                }
                for (int p = lo; p <= hi; p++) sum += sc[p - lo] = exp(sc[p - lo] - mx);
                for (int p = lo; p <= hi; p++) {
                    assert_int_equal(ag_kv_read(f.kv, 0, seq[t], p, kr, vr), AG_OK);
                    for (int i = 0; i < HD; i++) ref[((size_t)t * NH + h) * HD + i] += sc[p - lo] / sum * vr[g * HD + i];
                }
            }
        }
        check(wi ? "bidirectional attention, window 16" : "bidirectional attention", out, ref, (size_t)n * NH * HD, 1e-3);
        free(ref), free(kr), free(vr);
    }
    free(q), free(k), free(v), free(out);
    ag_kv_free(f.kv);
}

/* The softmax's own exp against libm's double exp: within one float ulp
 * everywhere in [-110, 0], expf's float almost always, 0 below expf's
 * underflow, NaN kept. */
static void softmax_exp_accuracy(void **state) {
    int n = 0, same = 0;
    for (float x = -110.0f; x <= 0.0f; x += 0.00123f, n++) {
        const float  e = ag_cpu_softmax_exp(x);
        const double r = exp((double)x);
        same += e == expf(x);
        if (r < 7e-46) { /* below half the least subnormal: expf's 0 */
            if (e != 0.0f) fail_msg("exp(%g) = %g, not 0", x, e);
            continue;
        }
        const float lo = nextafterf((float)r, -INFINITY), hi = nextafterf((float)r, INFINITY);
        if (e < lo || e > hi) fail_msg("exp(%.9g) = %.9g, reference %.17g", x, e, r);
    }
    assert_true(same >= n - n / 1000);
    assert_true(ag_cpu_softmax_exp(0.0f) == 1.0f);
    assert_true(ag_cpu_softmax_exp(-INFINITY) == 0.0f);
    assert_true(isnan(ag_cpu_softmax_exp(NAN)));
}

/* Head dims and query groups of the real models (a CUDA kernel takes a KV
 * head's query heads together, up to 8, at head dims 64 and 128). */
static void attention_paged(void **state) {
    attention_case(64, 0.0f, 6, 2, 600);
    attention_case(64, 0.0f, 7, 1, 150);
    attention_case(128, 0.0f, 6, 2, 150);
    attention_case(128, 30.0f, 8, 1, 600);
    attention_case(128, 0.0f, 9, 1, 150);
    attention_case(256, 30.0f, 6, 2, 300);
    attention_case(64, 0.0f, 9, 3, 150); /* SmolLM2: 3 query heads a KV head */
    attention_case(256, 0.0f, 4, 1, 150); /* Gemma 3 270M */
    /* gpt-oss: 64 heads of 64 over 8 (8 a KV head), a sink per head (a
     * backend without them refuses such models at load) */
    if (g_be->ops->attn_sinks) {
        attention_case_sinks(64, 0.0f, 16, 2, 300, true);
        /* every split of a split-K decode row (each split's partial without
         * the sink, the sink once at the merge); short rows (one split) and
         * the window-9 layer are in every case */
        attention_case_sinks(64, 0.0f, 16, 2, 600, true);
        attention_case_sinks(64, 0.0f, 8, 8, 150, true);    /* one query head a KV head */
        attention_case_sinks(128, 30.0f, 8, 1, 150, true);  /* head dim 128, a softcap before the sink */
        attention_case_sinks(256, 0.0f, 4, 1, 150, true);   /* the per-head tensor-core prompt kernel */
    }
}

/* ---- the Mamba-2 mixer ---- */

/* One shape's mamba2 against the CPU's: three sequences (runs) whose rows
 * interleave in the batch, of 5, 1 and 12 rows, then 2, 1 and 3 rows
 * through the states the first call left (random states at the start, so
 * the conv and the scan read what a state holds), snapshots after some
 * rows (a whole layer state each). Checked: every output row, every state
 * and snapshot float within 1e-5 of the CPU's (norm-wise; a device's expf
 * and log1pf differ from glibc's by an ulp or two, the rest is the CPU's
 * float order: see mamba.cu); and on the backend under test, the rows of
 * the first call one call each (through copies of the states) give the
 * batched call's output, states and snapshots bit for bit. */
static void mamba2_case(int K, int DI, int DS, int NH, int NG) {
    const int    C = DI + 2 * NG * DS, P = 2 * DI + 2 * NG * DS + NH, hd = DI / NH;
    const size_t SF = (size_t)(K - 1) * C + (size_t)DI * DS; /* a layer state's floats */
    enum { N_RUNS = 3, MAX_N = 24 };
    float *cw = randn((size_t)C * K, 0.5f), *cb = randn(C, 0.1f), *dtb = randn(NH, 0.5f), *a = malloc(sizeof(float) * NH),
          *d = malloc(sizeof(float) * NH), *nw = randn(DI, 0.1f);
    for (int h = 0; h < NH; h++) a[h] = -0.5f - (float)(h % 4) * 0.5f, d[h] = 1.0f + 0.25f * (float)(h % 3);
    for (int i = 0; i < DI; i++) nw[i] += 1.0f;
    ag_ssm_shape hsh = {.conv_w = cw, .conv_b = cb, .dt_b = dtb, .a = a, .d = d, .norm_w = nw, .d_conv = K,
                        .d_inner = DI, .d_state = DS, .n_head = NH, .n_group = NG, .eps = 1e-5f};
    ag_ssm_shape dsh = hsh; /* the weights in the backend's memory, as a model's prepared ones */
    dsh.conv_w = dev_put(g_be, cw, sizeof(float) * C * K), dsh.conv_b = dev_put(g_be, cb, sizeof(float) * C);
    dsh.dt_b = dev_put(g_be, dtb, sizeof(float) * NH), dsh.a = dev_put(g_be, a, sizeof(float) * NH);
    dsh.d = dev_put(g_be, d, sizeof(float) * NH), dsh.norm_w = dev_put(g_be, nw, sizeof(float) * DI);
    /* states: host (the CPU's) and the backend's, the same random start */
    float *hst[N_RUNS], *dst[N_RUNS];
    for (int r = 0; r < N_RUNS; r++) {
        hst[r] = randn(SF, 0.3f);
        dst[r] = dev_put(g_be, hst[r], sizeof(float) * SF);
    }
    char what[128];
    for (int call = 0; call < 2; call++) {
        const int n_rows[N_RUNS] = {call ? 2 : 5, 1, call ? 3 : 12};
        int       n = 0;
        int32_t   rows[N_RUNS][MAX_N];
        int       cnt[N_RUNS] = {0, 0, 0};
        for (int k = 0; n < n_rows[0] + n_rows[1] + n_rows[2]; k++) /* interleaved: run k % 3 takes the next row */
            if (cnt[k % 3] < n_rows[k % 3]) rows[k % 3][cnt[k % 3]++] = n++;
        /* snapshots: run 0 after each row but its last, run 1 after its row,
         * run 2 after its second and last */
        float *hsnap[N_RUNS][MAX_N], *dsnap[N_RUNS][MAX_N];
        for (int r = 0; r < N_RUNS; r++)
            for (int t = 0; t < n_rows[r]; t++) {
                const bool want = r == 0 ? t + 1 < n_rows[r] : r == 1 ? true : t == 1 || t + 1 == n_rows[r];
                hsnap[r][t] = want ? calloc(SF, sizeof(float)) : NULL;
                dsnap[r][t] = want ? dev_floats(g_be, SF) : NULL;
            }
        ag_ssm_run hruns[N_RUNS], druns[N_RUNS];
        for (int r = 0; r < N_RUNS; r++) {
            hruns[r] = (ag_ssm_run){rows[r], n_rows[r], hst[r], hsnap[r]};
            druns[r] = (ag_ssm_run){rows[r], n_rows[r], dst[r], dsnap[r]};
        }
        float *zx = randn((size_t)n * P, 0.5f), *dzx = dev_put(g_be, zx, sizeof(float) * n * P);
        float *hy = malloc(sizeof(float) * n * DI), *dy = dev_floats(g_be, (size_t)n * DI);
        /* the states before the call, for the one-row-a-call replay */
        float *before[N_RUNS];
        for (int r = 0; r < N_RUNS; r++) before[r] = host_get(g_be, dst[r], SF);
        assert_int_equal(g_cpu->ops->mamba2(g_cpu, &hsh, zx, hruns, N_RUNS, hy), AG_OK);
        assert_int_equal(g_be->ops->mamba2(g_be, &dsh, dzx, druns, N_RUNS, dy), AG_OK);
        float *y = host_get(g_be, dy, (size_t)n * DI);
        snprintf(what, sizeof what, "mamba2 (d_conv %d, d_inner %d, d_state %d, %d heads, %d groups) call %d", K, DI,
                 DS, NH, NG, call);
        double e = rel_err_f(y, hy, (size_t)n * DI);
        if (!(e <= 1e-5)) fail_msg("%s %s: y rel err %.3g", g_be->ops->name, what, e);
        for (int r = 0; r < N_RUNS; r++) {
            float *st = host_get(g_be, dst[r], SF);
            if (!((e = rel_err_f(st, hst[r], SF)) <= 1e-5)) fail_msg("%s %s: run %d state rel err %.3g", g_be->ops->name, what, r, e);
            for (int t = 0; t < n_rows[r]; t++) {
                if (!dsnap[r][t]) continue;
                float *sn = host_get(g_be, dsnap[r][t], SF);
                if (!((e = rel_err_f(sn, hsnap[r][t], SF)) <= 1e-5))
                    fail_msg("%s %s: run %d snapshot %d rel err %.3g", g_be->ops->name, what, r, t, e);
                if (t + 1 == n_rows[r] && memcmp(sn, st, sizeof(float) * SF))
                    fail_msg("%s %s: run %d: the last row's snapshot is not the state", g_be->ops->name, what, r);
                free(sn);
            }
            free(st);
        }
        if (call == 0) { /* one row a call through copies of the states: the batched call's bits */
            float *dy1 = dev_floats(g_be, (size_t)n * DI), *snap1 = dev_floats(g_be, SF);
            for (int r = 0; r < N_RUNS; r++) {
                float *s1 = dev_put(g_be, before[r], sizeof(float) * SF);
                for (int t = 0; t < n_rows[r]; t++) {
                    float *const one_snap[1] = {snap1};
                    ag_ssm_run   one = {&rows[r][t], 1, s1, one_snap};
                    assert_int_equal(g_be->ops->mamba2(g_be, &dsh, dzx, &one, 1, dy1), AG_OK);
                    float *a1 = host_get(g_be, dy1, (size_t)n * DI), *sn = host_get(g_be, snap1, SF);
                    if (memcmp(a1 + (size_t)rows[r][t] * DI, y + (size_t)rows[r][t] * DI, sizeof(float) * DI))
                        fail_msg("%s %s: run %d row %d alone differs from the batch", g_be->ops->name, what, r, t);
                    if (dsnap[r][t]) {
                        float *bs = host_get(g_be, dsnap[r][t], SF);
                        if (memcmp(sn, bs, sizeof(float) * SF))
                            fail_msg("%s %s: run %d snapshot %d differs from the state after that row alone",
                                     g_be->ops->name, what, r, t);
                        free(bs);
                    }
                    free(a1), free(sn);
                }
                float *s1h = host_get(g_be, s1, SF), *st = host_get(g_be, dst[r], SF);
                if (memcmp(s1h, st, sizeof(float) * SF))
                    fail_msg("%s %s: run %d: its rows one a call leave another state", g_be->ops->name, what, r);
                free(s1h), free(st);
                g_be->ops->free(g_be, s1);
            }
            g_be->ops->free(g_be, dy1), g_be->ops->free(g_be, snap1);
        }
        for (int r = 0; r < N_RUNS; r++) {
            free(before[r]);
            for (int t = 0; t < n_rows[r]; t++) {
                free(hsnap[r][t]);
                if (dsnap[r][t]) g_be->ops->free(g_be, dsnap[r][t]);
            }
        }
        free(zx), free(hy), free(y);
        g_be->ops->free(g_be, dzx), g_be->ops->free(g_be, dy);
    }
    for (int r = 0; r < N_RUNS; r++) free(hst[r]), g_be->ops->free(g_be, dst[r]);
    g_be->ops->free(g_be, (void *)dsh.conv_w), g_be->ops->free(g_be, (void *)dsh.conv_b);
    g_be->ops->free(g_be, (void *)dsh.dt_b), g_be->ops->free(g_be, (void *)dsh.a);
    g_be->ops->free(g_be, (void *)dsh.d), g_be->ops->free(g_be, (void *)dsh.norm_w);
    free(cw), free(cb), free(dtb), free(a), free(d), free(nw);
    (void)hd;
}

static void mamba2_runs(void **state) {
    if (!g_be->ops->mamba2) skip();
    mamba2_case(4, 128, 20, 8, 2);  /* head dim 16 (a block's lanes partly idle), d_state 20 (a tail of 4) */
    mamba2_case(4, 512, 128, 8, 1); /* Granite 4.0-H's head dim 64 and d_state 128, one group */
    mamba2_case(2, 96, 8, 3, 3);    /* one group a head, a two-tap conv */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matmul_all_types),
        cmocka_unit_test(softmax_exp_accuracy),
        cmocka_unit_test(matmul_decode_wide_batch),
        cmocka_unit_test(matmul_multi_mixed_shapes),
        cmocka_unit_test(matmul_few_rows_mmq_bits),
        cmocka_unit_test(get_rows_exact),
        cmocka_unit_test(small_ops),
        cmocka_unit_test(rope_kv_store_fused),
        cmocka_unit_test(matmul_after_producers),
        cmocka_unit_test(ffn_against_three_ops),
        cmocka_unit_test(ffn_decode_rows_wide),
        cmocka_unit_test(moe_rows),
        cmocka_unit_test(moe_plan_gives_cpu_bits),
        cmocka_unit_test(argmax_rows),
        cmocka_unit_test(pick_rows),
        cmocka_unit_test(cands_rows),
        cmocka_unit_test(edit_rows),
        cmocka_unit_test(attention_paged),
        cmocka_unit_test(attention_bidirectional),
        cmocka_unit_test(mamba2_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
