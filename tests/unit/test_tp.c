/* Tensor parallelism on the CPU (model/tp.h, base/comm.h): the shard plans,
 * the in-process communicator's fixed reduction order, and --tp 2/4 logits
 * against --tp 1 on stories260K for prompt rows, decode rows and verify
 * windows (with the rejected tail dropped); --tp 1 is the unsplit model bit
 * for bit. SmolLM2 (Q4_1) is checked through `augur logits --tp` in
 * tests/py/test_tp.py.
 *
 * Tolerance: the shards change only the order of float sums (the row-
 * parallel matmuls' K split, then the all-reduce in rank order), so logits
 * move by rounding, amplified through 5 layers and an F16 KV cache. Measured
 * max |dlogit| on logits up to 19: 1.2e-3 (--tp 2), 4.2e-3 (--tp 3, 4: the
 * rejected rows of the verify windows), 1.9e-3 (--tp 8); --tp 1 itself is
 * 6.9e-3 from a float64 evaluation, and 2.3e-2 from itself with an F32 KV
 * cache. The bound: 1e-2 absolute (5e-4 of the largest logit). */
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

#include "base/comm.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/tp.h"
#include "model_testutil.h"

#define TOL 1e-2

static const int32_t k_tokens[] = {1,   403, 407, 261, 378, 418, 268, 300, 263, 432, 270, 315,
                                   280, 260, 343, 443, 300, 362, 430, 272, 336, 279, 282, 316};
#define N_TOK ((int)(sizeof k_tokens / sizeof k_tokens[0]))

static ag_model *load_tp(int tp) {
    char path[4096];
    stories_path(path, sizeof path);
    ag_model_params p = ag_model_default_params();
    p.cpu.n_threads = 2;
    p.device = AG_DEVICE_CPU;
    p.tp = tp;
    ag_model *m = NULL;
    if (ag_model_load(path, &p, &m)) fprintf(stderr, "%s\n", ag_error_message());
    assert_non_null(m);
    return m;
}

static ag_kv *new_kv(ag_model *m) {
    ag_kv_params kp;
    assert_int_equal(ag_model_kv_params(m, AG_KV_F16, 2, 0, &kp, NULL), AG_OK);
    kp.budget_bytes = (size_t)8 << 20;
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&kp, &kv), AG_OK);
    return kv;
}

/* ---- plans ---- */

static void head_plans_split_groups_then_replicate(void **state) {
    ag_tp_heads h[16];
    /* even (Megatron): 8 heads over 4 KV heads, 2 ranks */
    assert_int_equal(ag_tp_plan_heads(8, 4, 2, h), AG_OK);
    assert_true(h[0].q0 == 0 && h[0].nq == 4 && h[0].kv0 == 0 && h[0].nkv == 2);
    assert_true(h[1].q0 == 4 && h[1].nq == 4 && h[1].kv0 == 2 && h[1].nkv == 2);
    /* more ranks than KV heads: each KV head replicated on the ranks that split its group */
    assert_int_equal(ag_tp_plan_heads(32, 8, 16, h), AG_OK);
    for (int r = 0; r < 16; r++) assert_true(h[r].q0 == 2 * r && h[r].nq == 2 && h[r].kv0 == r / 2 && h[r].nkv == 1);
    /* SmolLM2-135M: 9 heads in 3 groups; uneven but whole groups (2), parts of one group (4) */
    assert_int_equal(ag_tp_plan_heads(9, 3, 2, h), AG_OK);
    assert_true(h[0].q0 == 0 && h[0].nq == 3 && h[0].kv0 == 0 && h[0].nkv == 1);
    assert_true(h[1].q0 == 3 && h[1].nq == 6 && h[1].kv0 == 1 && h[1].nkv == 2);
    assert_int_equal(ag_tp_plan_heads(9, 3, 4, h), AG_OK);
    const int q0[4] = {0, 3, 6, 7}, nq[4] = {3, 3, 1, 2}, kv0[4] = {0, 1, 2, 2};
    for (int r = 0; r < 4; r++) assert_true(h[r].q0 == q0[r] && h[r].nq == nq[r] && h[r].kv0 == kv0[r] && h[r].nkv == 1);
    /* every query head exactly once, and its KV head with it */
    for (int n = 1; n <= 9; n++) {
        assert_int_equal(ag_tp_plan_heads(9, 3, n, h), AG_OK);
        for (int r = 0, next = 0; r < n; r++) {
            assert_int_equal(h[r].q0, next);
            assert_true(h[r].nq >= 1);
            next += h[r].nq;
            for (int q = h[r].q0; q < h[r].q0 + h[r].nq; q++) assert_true(q / 3 >= h[r].kv0 && q / 3 < h[r].kv0 + h[r].nkv);
            assert_int_equal(h[r].nq % h[r].nkv, 0); /* the attention op's grouping holds per rank */
            if (r == n - 1) assert_int_equal(next, 9);
        }
    }
    assert_int_equal(ag_tp_plan_heads(9, 3, 10, h), AG_ERR_UNSUPPORTED);
}

static void range_plans_cut_whole_blocks(void **state) {
    int64_t s[17];
    assert_int_equal(ag_tp_plan_range(1536, 32, 4, s), AG_OK); /* SmolLM2's feed-forward, Q4_1 */
    for (int r = 0; r <= 4; r++) assert_int_equal(s[r], 384 * r);
    assert_int_equal(ag_tp_plan_range(14336, 256, 8, s), AG_OK); /* an 8B's, Q4_K */
    for (int r = 0; r <= 8; r++) assert_int_equal(s[r], 1792 * r);
    assert_int_equal(ag_tp_plan_range(172, 1, 4, s), AG_OK); /* stories260K's, F32 */
    assert_int_equal(s[4], 172);
    assert_int_equal(ag_tp_plan_range(768, 256, 2, s), AG_OK); /* 3 blocks: uneven, whole */
    assert_true(s[1] == 256 && s[2] == 768);
    assert_int_equal(ag_tp_plan_range(512, 256, 4, s), AG_ERR_UNSUPPORTED); /* 2 blocks for 4 ranks */
    assert_int_equal(ag_tp_plan_range(100, 32, 2, s), AG_ERR_UNSUPPORTED);  /* not whole blocks */
}

/* ---- the communicator ---- */

static void cpu_all_reduce_sums_in_rank_order(void **state) {
    enum { R = 3, N = 1000 };
    ag_comm *c = NULL;
    assert_int_equal(ag_comm_cpu_new(R, &c), AG_OK);
    float  a[R][N], want[N];
    float *buf[R] = {a[0], a[1], a[2]};
    srand(7);
    for (int i = 0; i < N; i++) {
        for (int r = 0; r < R; r++) a[r][i] = (float)(rand() - RAND_MAX / 2) / (float)(rand() % 1000 + 1);
        volatile float s = a[0][i] + a[1][i];
        want[i] = s + a[2][i];
    }
    assert_int_equal(c->ops->all_reduce_sum(c, buf, N), AG_OK);
    for (int r = 0; r < R; r++) assert_memory_equal(a[r], want, sizeof want);
    /* gather: rank order, a rank sending nothing */
    const char *send[R] = {"ab", NULL, "cde"};
    size_t      bytes[R] = {2, 0, 3};
    char        recv[6] = {0};
    assert_int_equal(c->ops->gather(c, (const void *const *)send, bytes, recv), AG_OK);
    assert_string_equal(recv, "abcde");
    ag_comm_free(c);
    assert_int_equal(ag_comm_cpu_new(0, &c), AG_ERR_INVALID);
    ag_comm_free(NULL);
}

/* ---- the model ---- */

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* One sequence through m: the first n_pre tokens as prompt rows in chunks
 * of 7, then the rest as verify windows of 4 decode rows whose last 2
 * tokens are wrong guesses, dropped (not committed) and fed again; every
 * row's logits to out: [N_TOK prompt-or-accepted rows][vocab] in order,
 * then the rejected rows' logits after them. Returns the rows written. */
static int run_windows(ag_model *m, int n_pre, float *out) {
    const int vocab = ag_model_config_of(m)->n_vocab;
    ag_kv    *kv = new_kv(m);
    int32_t   s, pos[8], seq[8], tok[8];
    uint8_t   want[8];
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    int rows = 0, rej = N_TOK;
    float tmp[8 * 512];
    assert_true(vocab <= 512);
    for (int p0 = 0; p0 < N_TOK;) {
        const bool prompt = p0 < n_pre;
        int        k = prompt ? (n_pre - p0 < 7 ? n_pre - p0 : 7) : (N_TOK - p0 < 4 ? N_TOK - p0 : 4);
        int        keep = prompt || k < 4 ? k : 2; /* a window: 2 accepted, 2 rejected */
        for (int i = 0; i < k; i++) {
            pos[i] = p0 + i, seq[i] = s, want[i] = AG_WANT_LOGITS;
            tok[i] = i < keep ? k_tokens[p0 + i] : (k_tokens[p0 + i] + 17) % vocab;
        }
        ag_batch b = {.n = k, .token = tok, .pos = pos, .seq = seq, .want_logits = want, .n_prompt = prompt ? k : 0};
        assert_int_equal(ag_kv_seq_reserve(kv, s, k), AG_OK);
        assert_int_equal(ag_model_forward(m, kv, &b, tmp), AG_OK);
        memcpy(out + (size_t)p0 * vocab, tmp, sizeof(float) * (size_t)keep * vocab);
        if (keep < k) { /* the rejected rows (their logits depend on the guesses) */
            memcpy(out + (size_t)rej * vocab, tmp + (size_t)keep * vocab, sizeof(float) * (size_t)(k - keep) * vocab);
            rej += k - keep;
        }
        assert_int_equal(ag_kv_seq_commit(kv, s, p0 + keep), AG_OK);
        p0 += keep;
        rows = rej;
    }
    ag_kv_free(kv);
    return rows;
}

static void tp1_is_the_unsplit_model(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    ag_model *a = NULL, *b = load_tp(1); /* a: the default parameters, as every test loads */
    assert_int_equal(load_model_2t(path, &a, NULL), 0);
    float    *oa = malloc(sizeof(float) * 64 * 512), *ob = malloc(sizeof(float) * 64 * 512);
    const int ra = run_windows(a, 10, oa), rb = run_windows(b, 10, ob);
    assert_int_equal(ra, rb);
    assert_memory_equal(oa, ob, sizeof(float) * (size_t)ra * 512);
    assert_int_equal(ag_model_fingerprint(a), ag_model_fingerprint(b));
    free(oa);
    free(ob);
    ag_model_free(a);
    ag_model_free(b);
}

static void tp_logits_match_tp1(void **state) {
    ag_model *ref = load_tp(1);
    const int vocab = ag_model_config_of(ref)->n_vocab;
    float    *o1 = malloc(sizeof(float) * 64 * 512), *on = malloc(sizeof(float) * 64 * 512);
    const int tps[] = {2, 3, 4, 8};
    for (int n_pre = 0; n_pre <= N_TOK; n_pre += 12) { /* decode rows only; half prompt; all prompt */
        const int r1 = run_windows(ref, n_pre, o1);
        for (size_t t = 0; t < sizeof tps / sizeof tps[0]; t++) {
            ag_model *m = load_tp(tps[t]);
            const int rn = run_windows(m, n_pre, on);
            assert_int_equal(rn, r1);
            const double d = max_abs_diff(o1, on, (size_t)rn * vocab);
            print_message("--tp %d, %2d prompt rows + windows: max |dlogit| %.3g (bound %g)\n", tps[t], n_pre, d, TOL);
            assert_true(d <= TOL);
            assert_true(d > 0 || n_pre == N_TOK); /* (the split is real: sums did move) */
            ag_model_free(m);
        }
    }
    free(o1);
    free(on);
    ag_model_free(ref);
}

/* The shards' KV shape, fingerprint, and the argmax rows, chosen from each
 * rank's choice: those of the gathered rows. */
static void tp_kv_fingerprint_and_argmax(void **state) {
    ag_model *m1 = load_tp(1), *m2 = load_tp(2), *m8 = load_tp(8);
    int       nl, nh, dk, dv;
    ag_model_kv_shape(m2, &nl, &nh, &dk, &dv);
    assert_true(nl == 10 && nh == 2 && dk == 8 && dv == 8); /* 5 layers x 2 ranks, 2 of the 4 KV heads each */
    ag_model_kv_shape(m8, &nl, &nh, &dk, &dv);
    assert_true(nl == 40 && nh == 1); /* 8 ranks > 4 KV heads: one (replicated) each */
    assert_true(ag_model_fingerprint(m1) != ag_model_fingerprint(m2));
    assert_true(ag_model_fingerprint(m2) != ag_model_fingerprint(m8));
    assert_int_equal(ag_model_set_output_rows(m2, 100), 512); /* the head is the shards' */
    ag_model *ms[2] = {m2, m8};
    for (int j = 0; j < 2; j++) {
        ag_kv  *kv = new_kv(ms[j]);
        int32_t s, pos[N_TOK], seq[N_TOK], am[N_TOK];
        uint8_t want[N_TOK];
        assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
        for (int i = 0; i < N_TOK; i++) pos[i] = i, seq[i] = s, want[i] = i % 3 ? AG_WANT_ARGMAX : AG_WANT_LOGITS;
        float   *out = malloc(sizeof(float) * N_TOK * 512);
        ag_batch b = {.n = N_TOK, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = want, .argmax = am,
                      .n_prompt = N_TOK};
        assert_int_equal(ag_kv_seq_reserve(kv, s, N_TOK), AG_OK);
        assert_int_equal(ag_model_forward(ms[j], kv, &b, out), AG_OK);
        for (int k = 0; k < N_TOK; k++) {
            const float *row = out + (size_t)k * 512;
            int32_t      best = 0;
            for (int v = 1; v < 512; v++)
                if (row[v] > row[best]) best = v;
            if (want[k] == AG_WANT_ARGMAX) assert_int_equal(am[k], best);
        }
        free(out);
        ag_kv_free(kv);
    }
    ag_model_free(m1);
    ag_model_free(m2);
    ag_model_free(m8);
}

static void tp_refusals_say_why(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    ag_model_params p = ag_model_default_params();
    p.device = AG_DEVICE_CPU;
    p.cpu.n_threads = 1;
    ag_model *m = NULL;
    p.tp = 9; /* stories260K has 8 heads */
    assert_int_equal(ag_model_load(path, &p, &m), AG_ERR_UNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(ag_error_message(), "--tp 9"));
    p.tp = AG_COMM_MAX_RANKS + 1;
    assert_int_equal(ag_model_load(path, &p, &m), AG_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(head_plans_split_groups_then_replicate),
        cmocka_unit_test(range_plans_cut_whole_blocks),
        cmocka_unit_test(cpu_all_reduce_sums_in_rank_order),
        cmocka_unit_test(tp1_is_the_unsplit_model),
        cmocka_unit_test(tp_logits_match_tp1),
        cmocka_unit_test(tp_kv_fingerprint_and_argmax),
        cmocka_unit_test(tp_refusals_say_why),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
