/* Routed experts (qwen3moe) on the CPU: the moe op against a plain
 * reference computation, and batch invariance of whole forward passes: a
 * token's logits are the same bits alone and in a batch with other tokens
 * (decode rows, verify windows, prompt rows, and mixed batches), though
 * its experts' GEMMs then run over other tokens' rows too. llama.cpp
 * parity is in tests/py/test_parity.py. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/cpu/quant.h"
#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"

/* The test model: 2 layers, 1024 wide, 4/2 heads of 128, 8 experts of 512
 * (3 used: a sum of three whose order would show), Q4_K experts and attention (the K-quant kernels whose decode
 * and prompt paths differ; every row several 256-blocks long, so that
 * kernels could sum them in different orders), an F32 router, 300 tokens. */
enum { L = 2, D = 1024, NH = 4, NKV = 2, HD = 128, NE = 8, NU = 3, FE = 512, V = 300 };

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float urand(void) { return (float)(rnd() >> 40) * 0x1p-24f; }

/* n_mat matrices of n_out random rows of n_in: F32 uniform with spread
 * ~1/sqrt(n_in), or Q4_K with random quants and small scales. */
static void add_mats(ag_gguf_writer *w, const char *name, uint32_t type, int n_in, int n_out, int n_mat) {
    const size_t row = ag_quant_row_bytes(type, n_in), bytes = row * (size_t)n_out * n_mat;
    uint8_t     *d = malloc(bytes);
    assert_non_null(d);
    const float sd = 1.0f / sqrtf((float)n_in);
    if (type == AG_TYPE_F32) {
        for (size_t i = 0; i < bytes / 4; i++) {
            float f = (urand() * 2 - 1) * 1.7f * sd;
            memcpy(d + 4 * i, &f, 4);
        }
    } else { /* Q4_K: 144-byte blocks, d at 0, dmin at 2 (as bench/gen_model) */
        for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)rnd();
        for (size_t b = 0; b < bytes / 144; b++) {
            uint16_t h = ag_fp32_to_fp16(sd / (4.6f * 31.0f) * (0.5f + urand()));
            memcpy(d + b * 144, &h, 2);
            h = ag_fp32_to_fp16(sd * 7.5f / 31.0f / 4.6f * (0.5f + urand()));
            memcpy(d + b * 144 + 2, &h, 2);
        }
    }
    uint64_t ne[3] = {(uint64_t)n_in, (uint64_t)n_out, (uint64_t)n_mat};
    assert_int_equal(ag_gguf_writer_add_tensor(w, name, type, n_mat > 1 ? 3 : 2, ne, d, bytes), AG_OK);
    free(d);
}

static void add_gain(ag_gguf_writer *w, const char *name, int n) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = 1.0f + (urand() * 2 - 1) * 0.1f;
    uint64_t ne[1] = {(uint64_t)n};
    assert_int_equal(ag_gguf_writer_add_tensor(w, name, AG_TYPE_F32, 1, ne, v, sizeof(float) * (size_t)n), AG_OK);
    free(v);
}

/* Writes the test model to path; norm: qwen3moe.expert_weights_norm (-1: no key). */
static void write_model(const char *path, int norm) {
    g_rng = 0x9E3779B97F4A7C15ull; /* the same weights every time */
    ag_gguf_writer *w = ag_gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(ag_gguf_writer_add_str(w, "general.architecture", "qwen3moe"), AG_OK);
    const struct { const char *k; uint32_t v; } u[] = {
        {"qwen3moe.block_count", L}, {"qwen3moe.context_length", 1024}, {"qwen3moe.embedding_length", D},
        {"qwen3moe.feed_forward_length", 768}, {"qwen3moe.attention.head_count", NH},
        {"qwen3moe.attention.head_count_kv", NKV}, {"qwen3moe.attention.key_length", HD},
        {"qwen3moe.attention.value_length", HD}, {"qwen3moe.expert_count", NE},
        {"qwen3moe.expert_used_count", NU}, {"qwen3moe.expert_feed_forward_length", FE}};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) assert_int_equal(ag_gguf_writer_add_u32(w, u[i].k, u[i].v), AG_OK);
    assert_int_equal(ag_gguf_writer_add_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f), AG_OK);
    assert_int_equal(ag_gguf_writer_add_f32(w, "qwen3moe.rope.freq_base", 1e6f), AG_OK);
    if (norm >= 0) assert_int_equal(ag_gguf_writer_add_bool(w, "qwen3moe.expert_weights_norm", norm), AG_OK);
    add_mats(w, "token_embd.weight", AG_TYPE_Q4_K, D, V, 1);
    add_gain(w, "output_norm.weight", D);
    add_mats(w, "output.weight", AG_TYPE_Q4_K, D, V, 1);
    for (int l = 0; l < L; l++) {
        char n[64];
#define T(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        add_gain(w, T("attn_norm.weight"), D);
        add_mats(w, T("attn_q.weight"), AG_TYPE_Q4_K, D, NH * HD, 1);
        add_mats(w, T("attn_k.weight"), AG_TYPE_Q4_K, D, NKV * HD, 1);
        add_mats(w, T("attn_v.weight"), AG_TYPE_Q4_K, D, NKV * HD, 1);
        add_mats(w, T("attn_output.weight"), AG_TYPE_Q4_K, NH * HD, D, 1);
        add_gain(w, T("attn_q_norm.weight"), HD);
        add_gain(w, T("attn_k_norm.weight"), HD);
        add_gain(w, T("ffn_norm.weight"), D);
        add_mats(w, T("ffn_gate_inp.weight"), AG_TYPE_F32, D, NE, 1);
        add_mats(w, T("ffn_gate_exps.weight"), AG_TYPE_Q4_K, D, FE, NE);
        add_mats(w, T("ffn_up_exps.weight"), AG_TYPE_Q4_K, D, FE, NE);
        add_mats(w, T("ffn_down_exps.weight"), AG_TYPE_Q4_K, FE, D, NE);
#undef T
    }
    assert_int_equal(ag_gguf_writer_write(w, path), AG_OK);
    ag_gguf_writer_free(w);
}

static char      g_path[64];
static ag_model *g_model;

static ag_model *load(const char *path) {
    ag_model_params p = ag_model_default_params();
    p.cpu.n_threads = 2;
    p.device = AG_DEVICE_CPU;
    ag_model *m = NULL;
    if (ag_model_load(path, &p, &m)) fprintf(stderr, "%s\n", ag_error_message());
    return m;
}

static int setup(void **state) {
    snprintf(g_path, sizeof g_path, "/tmp/augur-moe-test-XXXXXX");
    int fd = mkstemp(g_path);
    if (fd < 0) return -1;
    close(fd);
    write_model(g_path, -1);
    return (g_model = load(g_path)) ? 0 : -1;
}

static int teardown(void **state) {
    ag_model_free(g_model);
    unlink(g_path);
    return 0;
}

static ag_kv *new_kv(ag_model *m, int max_seqs) {
    ag_kv_params kp = ag_kv_default_params();
    ag_model_kv_shape(m, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
    kp.max_seqs = max_seqs;
    kp.block_size = 16;
    kp.budget_bytes = (size_t)16 << 20;
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&kp, &kv), AG_OK);
    return kv;
}

/* One forward pass of n rows: (token, seq) each at its sequence's next
 * position, the last n_prompt of them prompt rows; every row's logits into
 * out[n][V]. */
static void step(ag_model *m, ag_kv *kv, int n, const int32_t *tok, const int32_t *seq, int n_prompt, float *out) {
    int32_t pos[64];
    uint8_t want[64];
    int32_t used[16] = {0};
    for (int i = 0; i < n; i++) {
        pos[i] = ag_kv_seq_len(kv, seq[i]) + used[seq[i]]++;
        want[i] = AG_WANT_LOGITS;
    }
    for (int s = 0; s < 16; s++)
        if (used[s]) assert_int_equal(ag_kv_seq_reserve(kv, s, used[s]), AG_OK);
    ag_batch b = {.n = n, .token = tok, .pos = pos, .seq = seq, .want_logits = want, .n_prompt = n_prompt};
    assert_int_equal(ag_model_forward(m, kv, &b, out), AG_OK);
    for (int s = 0; s < 16; s++)
        if (used[s]) assert_int_equal(ag_kv_seq_commit(kv, s, ag_kv_seq_len(kv, s) + used[s]), AG_OK);
}

/* A KV with n_seq sequences, sequence s prefilled (as prompt) with 5 + 3s tokens. */
static ag_kv *prefilled(int n_seq) {
    ag_kv *kv = new_kv(g_model, n_seq);
    float *junk = malloc(sizeof(float) * 32 * V);
    for (int s = 0; s < n_seq; s++) {
        int32_t id, tok[32], seq[32];
        assert_int_equal(ag_kv_seq_new(kv, &id), AG_OK);
        assert_int_equal(id, s);
        const int n = 5 + 3 * s;
        for (int i = 0; i < n; i++) tok[i] = (int32_t)((7 + 31 * s + 13 * i) % V), seq[i] = s;
        step(g_model, kv, n, tok, seq, n, junk);
    }
    free(junk);
    return kv;
}

static void assert_same_bits(const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    if (bad) fprintf(stderr, "%zu of %zu logits differ\n", bad, n);
    assert_int_equal(bad, 0);
}

/* A decode row of sequence 0 alone, and in one batch with 7 other
 * sequences' decode rows (which share its experts' matmuls): the same bits. */
static void decode_row_alone_equals_in_batch(void **state) {
    enum { S = 8 };
    float  *alone = malloc(sizeof(float) * V), *batch = malloc(sizeof(float) * S * V);
    ag_kv  *kv = prefilled(S);
    int32_t tok[S], seq[S];
    for (int s = 0; s < S; s++) tok[s] = (int32_t)(100 + 17 * s), seq[s] = s;
    step(g_model, kv, 1, tok, seq, 0, alone);
    ag_kv_free(kv);
    kv = prefilled(S);
    step(g_model, kv, S, tok, seq, 0, batch);
    assert_same_bits(alone, batch, V);
    /* and sequence 5's row, in the middle of the batch */
    ag_kv_free(kv);
    kv = prefilled(S);
    step(g_model, kv, 1, tok + 5, seq + 5, 0, alone);
    assert_same_bits(alone, batch + 5 * V, V);
    ag_kv_free(kv);
    free(alone);
    free(batch);
}

/* A verify window (5 decode rows of sequence 0) alone, and beside single
 * decode rows and another sequence's window: the same bits. */
static void verify_window_alone_equals_in_batch(void **state) {
    enum { S = 4, W = 5 };
    float  *alone = malloc(sizeof(float) * W * V), *batch = malloc(sizeof(float) * (W + 2 + W) * V);
    int32_t tok[W + 2 + W], seq[W + 2 + W];
    for (int i = 0; i < W; i++) tok[i] = (int32_t)(40 + 9 * i), seq[i] = 0;
    tok[W] = 5, seq[W] = 1, tok[W + 1] = 77, seq[W + 1] = 2;
    for (int i = 0; i < W; i++) tok[W + 2 + i] = (int32_t)(40 + 9 * i), seq[W + 2 + i] = 3; /* the same tokens elsewhere */
    ag_kv *kv = prefilled(S);
    step(g_model, kv, W, tok, seq, 0, alone);
    ag_kv_free(kv);
    kv = prefilled(S);
    step(g_model, kv, W + 2 + W, tok, seq, 0, batch);
    assert_same_bits(alone, batch, (size_t)W * V);
    ag_kv_free(kv);
    free(alone);
    free(batch);
}

/* Prompt rows: sequence 0's 12-token chunk alone, and after sequence 1's
 * 20-token chunk in one batch; and decode rows in a mixed batch keep their
 * decode-only bits while prompt rows keep their prompt-only bits. */
static void prompt_rows_alone_equal_in_batch_and_mixed(void **state) {
    enum { A = 12, B = 20 };
    int32_t tok[2 + B + A], seq[2 + B + A];
    float  *alone = malloc(sizeof(float) * A * V), *batch = malloc(sizeof(float) * (2 + B + A) * V),
          *dec = malloc(sizeof(float) * 2 * V);
    for (int i = 0; i < B; i++) tok[2 + i] = (int32_t)((11 + 23 * i) % V), seq[2 + i] = 1;
    for (int i = 0; i < A; i++) tok[2 + B + i] = (int32_t)((3 + 29 * i) % V), seq[2 + B + i] = 0;
    tok[0] = 123, seq[0] = 2, tok[1] = 45, seq[1] = 3; /* two decode rows, for the mixed batch */
    ag_kv *kv = prefilled(4);
    step(g_model, kv, A, tok + 2 + B, seq + 2 + B, A, alone);
    ag_kv_free(kv);
    kv = prefilled(4);
    step(g_model, kv, B + A, tok + 2, seq + 2, B + A, batch);
    assert_same_bits(alone, batch + (size_t)B * V, (size_t)A * V);
    ag_kv_free(kv);
    kv = prefilled(4);
    step(g_model, kv, 2, tok, seq, 0, dec);
    ag_kv_free(kv);
    kv = prefilled(4);
    step(g_model, kv, 2 + B + A, tok, seq, B + A, batch);
    assert_same_bits(dec, batch, 2 * (size_t)V);
    assert_same_bits(alone, batch + (size_t)(2 + B) * V, (size_t)A * V);
    ag_kv_free(kv);
    free(alone);
    free(batch);
    free(dec);
}

/* The moe op on its own, against the plain computation in double from
 * dequantized weights: softmax routing, top-k, renormalised weights (or
 * not, with expert_weights_norm false), SiLU-gated experts. */
static void moe_op_matches_plain_computation(void **state) {
    for (int norm = 0; norm < 2; norm++) {
        ag_model *m = g_model;
        char      path[64] = "";
        if (!norm) { /* a file that says not to renormalise */
            snprintf(path, sizeof path, "/tmp/augur-moe-test-XXXXXX");
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            close(fd);
            write_model(path, 0);
            m = load(path);
            assert_non_null(m);
            assert_false(ag_model_config_of(m)->expert_weights_norm);
        } else {
            assert_true(ag_model_config_of(m)->expert_weights_norm); /* qwen3moe's default */
        }
        const ag_gguf *g = ag_model_gguf(m);
        ag_backend    *be = ag_model_backend(m);
        ag_tensor      t[4];
        const char    *names[4] = {"blk.1.ffn_gate_inp.weight", "blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight",
                                   "blk.1.ffn_down_exps.weight"};
        for (int i = 0; i < 4; i++) {
            const ag_gguf_tensor *gt = ag_gguf_find_tensor(g, names[i]);
            assert_non_null(gt);
            t[i] = (ag_tensor){.name = gt->name, .type = gt->type, .ne = {(int64_t)gt->ne[0], (int64_t)gt->ne[1],
                                                                           (int64_t)gt->ne[2], 1},
                               .row_bytes = ag_quant_row_bytes(gt->type, (int64_t)gt->ne[0]), .data = gt->data,
                               .host = gt->data};
        }
        enum { N = 6 };
        float *h = malloc(sizeof(float) * N * D), *o = malloc(sizeof(float) * N * D);
        for (int i = 0; i < N * D; i++) h[i] = (urand() * 2 - 1) * 1.7f;
        /* the experts dequantized, so that the op's kernels read float
         * weights and float activations: only rounding separates it from
         * the plain computation (Q4_K kernels quantize activations to 8 bits,
         * ~2% here, which would hide a wrong weight) */
        float *wf = malloc(sizeof(float) * (size_t)NE * FE * D * 3);
        float *router = malloc(sizeof(float) * NE * D);
        assert_int_equal(ag_dequant_row(t[0].type, t[0].data, router, (int64_t)NE * D), AG_OK);
        for (int i = 0; i < 3; i++)
            for (int64_t r = 0; r < (int64_t)NE * (i < 2 ? FE : D); r++)
                assert_int_equal(ag_dequant_row(t[1 + i].type, (const uint8_t *)t[1 + i].data + r * t[1 + i].row_bytes,
                                                wf + (size_t)i * NE * FE * D + (size_t)r * t[1 + i].ne[0], t[1 + i].ne[0]),
                                 AG_OK);
        ag_tensor t32[4] = {t[0], t[1], t[2], t[3]};
        for (int i = 1; i < 4; i++) {
            t32[i].type = AG_TYPE_F32;
            t32[i].row_bytes = sizeof(float) * (size_t)t[i].ne[0];
            t32[i].data = t32[i].host = wf + (size_t)(i - 1) * NE * FE * D;
        }
        ag_moe_weights mw = {.gate_inp = &t32[0], .gate_exps = &t32[1], .up_exps = &t32[2], .down_exps = &t32[3],
                             .n_expert = NE, .n_used = NU, .norm_w = norm, .w_scale = 1.0f};
        assert_int_equal(be->ops->moe(be, &mw, h, N, 2, o), AG_OK); /* 2 decode rows, 4 prompt rows */
        double max_err = 0, max_o = 0;
        for (int i = 0; i < N; i++) {
            const float *x = h + (size_t)i * D;
            double       p[NE], mx = -1e300, sum = 0;
            for (int e = 0; e < NE; e++) {
                p[e] = 0;
                for (int d = 0; d < D; d++) p[e] += (double)router[e * D + d] * x[d];
                mx = fmax(mx, p[e]);
            }
            for (int e = 0; e < NE; e++) sum += p[e] = exp(p[e] - mx);
            int    sel[NU];
            double wt[NU], wsum = 0;
            for (int r = 0; r < NU; r++) {
                int best = -1;
                for (int e = 0; e < NE; e++) {
                    bool taken = false;
                    for (int q = 0; q < r; q++) taken |= sel[q] == e;
                    if (!taken && (best < 0 || p[e] > p[best])) best = e;
                }
                sel[r] = best, wt[r] = p[best] / sum, wsum += wt[r];
            }
            double act[NU][FE]; /* each chosen expert's SiLU-gated products */
            for (int r = 0; r < NU; r++) {
                const float *G = wf + (size_t)sel[r] * FE * D, *U = wf + (size_t)NE * FE * D + (size_t)sel[r] * FE * D;
                for (int f = 0; f < FE; f++) {
                    double gg = 0, uu = 0;
                    for (int k = 0; k < D; k++) gg += (double)G[f * D + k] * x[k], uu += (double)U[f * D + k] * x[k];
                    act[r][f] = gg / (1 + exp(-gg)) * uu;
                }
            }
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int r = 0; r < NU; r++) {
                    const float *Dn = wf + 2 * (size_t)NE * FE * D + (size_t)sel[r] * D * FE;
                    double       y = 0;
                    for (int f = 0; f < FE; f++) y += Dn[(size_t)d * FE + f] * act[r][f];
                    acc += (norm ? wt[r] / wsum : wt[r]) * y;
                }
                max_err = fmax(max_err, fabs(acc - o[(size_t)i * D + d]));
                max_o = fmax(max_o, fabs(acc));
            }
        }
        assert_true(max_err < 1e-5 * max_o);
        free(h), free(o), free(wf), free(router);
        if (!norm) {
            ag_model_free(m);
            unlink(path);
        }
    }
}

/* gpt-oss's experts (AG_MOE_GATE_TOPK_SOFTMAX, AG_MOE_ACT_SWIGLU_OAI, the
 * router's and the experts' biases) against a plain computation in double:
 * the n_used largest router logits, the softmax of those alone, each
 * expert's clamped SwiGLU over its biased products, its biased output. The
 * weights are F32 and spread so that gate and up products often pass the
 * clamp (7), which a missing clamp would show. */
static void gptoss_experts_match_plain_computation(void **state) {
    (void)state;
    enum { D = 64, F = 32, E = 6, K = 2, N = 5 };
    ag_backend   *be = NULL;
    ag_cpu_params cp = ag_cpu_default_params();
    cp.n_threads = 2;
    assert_int_equal(ag_cpu_backend_new(&cp, &be), AG_OK);
    float *router = malloc(sizeof(float) * E * D), *wg = malloc(sizeof(float) * E * F * D),
          *wu = malloc(sizeof(float) * E * F * D), *wd = malloc(sizeof(float) * E * D * F);
    float  rb[E], bg[E][F], bu[E][F], bd[E][D];
    for (int i = 0; i < E * D; i++) router[i] = (urand() * 2 - 1) * 0.3f;
    for (int i = 0; i < E * F * D; i++) wg[i] = (urand() * 2 - 1) * 1.2f, wu[i] = (urand() * 2 - 1) * 1.2f;
    for (int i = 0; i < E * D * F; i++) wd[i] = (urand() * 2 - 1) * 0.2f;
    for (int e = 0; e < E; e++) {
        rb[e] = (urand() * 2 - 1) * 0.5f;
        for (int f = 0; f < F; f++) bg[e][f] = (urand() * 2 - 1), bu[e][f] = (urand() * 2 - 1);
        for (int d = 0; d < D; d++) bd[e][d] = (urand() * 2 - 1) * 0.1f;
    }
    const ag_tensor t_r = {.name = "router", .type = AG_TYPE_F32, .ne = {D, E, 1, 1}, .row_bytes = 4 * D,
                           .data = router, .host = router};
    const ag_tensor t_g = {.name = "gate", .type = AG_TYPE_F32, .ne = {D, F, E, 1}, .row_bytes = 4 * D, .data = wg,
                           .host = wg};
    const ag_tensor t_u = {.name = "up", .type = AG_TYPE_F32, .ne = {D, F, E, 1}, .row_bytes = 4 * D, .data = wu,
                           .host = wu};
    const ag_tensor t_d = {.name = "down", .type = AG_TYPE_F32, .ne = {F, D, E, 1}, .row_bytes = 4 * F, .data = wd,
                           .host = wd};
    const ag_moe_weights mw = {.gate_inp = &t_r, .gate_exps = &t_g, .up_exps = &t_u, .down_exps = &t_d, .n_expert = E,
                               .n_used = K, .norm_w = false, .w_scale = 1.0f, .gating = AG_MOE_GATE_TOPK_SOFTMAX,
                               .act = AG_MOE_ACT_SWIGLU_OAI, .alpha = 1.702f, .limit = 7.0f, .gate_inp_b = rb,
                               .gate_b = &bg[0][0], .up_b = &bu[0][0], .down_b = &bd[0][0]};
    float h[N * D], o[N * D];
    for (int i = 0; i < N * D; i++) h[i] = (urand() * 2 - 1) * 1.7f;
    assert_int_equal(be->ops->moe(be, &mw, h, N, 2, o), AG_OK);
    double max_err = 0, max_o = 0;
    int    clamped = 0;
    for (int i = 0; i < N; i++) {
        const float *x = h + i * D;
        double       lg[E];
        for (int e = 0; e < E; e++) {
            lg[e] = rb[e];
            for (int d = 0; d < D; d++) lg[e] += (double)router[e * D + d] * x[d];
        }
        int    sel[K];
        double wt[K], sum = 0;
        for (int r = 0; r < K; r++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < r; q++) taken |= sel[q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            sel[r] = best;
        }
        for (int r = 0; r < K; r++) sum += wt[r] = exp(lg[sel[r]] - lg[sel[0]]);
        double out[D] = {0};
        for (int r = 0; r < K; r++) {
            const int e = sel[r];
            double    act[F];
            for (int f = 0; f < F; f++) {
                double g = bg[e][f], u = bu[e][f];
                for (int d = 0; d < D; d++)
                    g += (double)wg[((size_t)e * F + f) * D + d] * x[d], u += (double)wu[((size_t)e * F + f) * D + d] * x[d];
                clamped += g > 7 || fabs(u) > 7;
                g = fmin(g, 7), u = fmax(fmin(u, 7), -7);
                act[f] = g / (1 + exp(-1.702 * g)) * (u + 1);
            }
            for (int d = 0; d < D; d++) {
                double y = bd[e][d];
                for (int f = 0; f < F; f++) y += (double)wd[((size_t)e * D + d) * F + f] * act[f];
                out[d] += wt[r] / sum * y;
            }
        }
        for (int d = 0; d < D; d++) {
            max_err = fmax(max_err, fabs(out[d] - o[i * D + d]));
            max_o = fmax(max_o, fabs(out[d]));
        }
    }
    assert_true(clamped > 0);
    if (!(max_err < 1e-5 * max_o)) fail_msg("moe (gpt-oss): max error %g of %g", max_err, max_o);
    free(router), free(wg), free(wu), free(wd);
    ag_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(moe_op_matches_plain_computation),
        cmocka_unit_test(gptoss_experts_match_plain_computation),
        cmocka_unit_test(decode_row_alone_equals_in_batch),
        cmocka_unit_test(verify_window_alone_equals_in_batch),
        cmocka_unit_test(prompt_rows_alone_equal_in_batch_and_mixed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
