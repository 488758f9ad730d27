/* The forward pass over the paged KV cache, on stories260K: batching,
 * chunking, trim (speculative rollback) and fork must not change logits.
 * The reference for each case is the same model run the plain way (one
 * sequence, one batch) -- llama.cpp parity itself is in tests/py/test_parity.py. */
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

#include "kv/kv.h"
#include "base/argmax.h"
#include "model/model.h"
#include "model_testutil.h"

static ag_model *g_model;
static int       g_vocab;

static const int32_t k_tokens[] = {1,   403, 407, 261, 378, 418, 268, 300, 263, 432, 270, 315,
                                   280, 260, 343, 443, 300, 362, 430, 272, 336, 279, 282, 316};
#define N_TOK ((int)(sizeof k_tokens / sizeof k_tokens[0]))

static int setup(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    if (load_model_2t(path, &g_model, NULL)) return -1;
    g_vocab = ag_model_config_of(g_model)->n_vocab;
    return 0;
}

static int teardown(void **state) {
    ag_model_free(g_model);
    return 0;
}

static ag_kv *new_kv(int max_seqs, int block_size) {
    ag_kv_params kp = ag_kv_default_params();
    ag_model_kv_shape(g_model, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
    kp.max_seqs = max_seqs;
    kp.block_size = block_size;
    kp.budget_bytes = (size_t)8 << 20;
    ag_kv *kv = NULL;
    assert_int_equal(ag_kv_init(&kp, &kv), AG_OK);
    return kv;
}

/* Forwards tokens[0..n) of one sequence starting at its current length, in
 * chunks of `chunk`, writing every position's logits to out[n][vocab]. */
static void run_seq(ag_kv *kv, int32_t seq, const int32_t *tokens, int n, int chunk, float *out) {
    int32_t pos[64], seqs[64];
    uint8_t want[64];
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int k = n - p0 < chunk ? n - p0 : chunk;
        int32_t len = ag_kv_seq_len(kv, seq);
        for (int i = 0; i < k; i++) {
            pos[i] = len + i;
            seqs[i] = seq;
            want[i] = 1;
        }
        ag_batch b = {.n = k, .token = tokens + p0, .pos = pos, .seq = seqs, .want_logits = want, .n_prompt = k};
        assert_int_equal(ag_kv_seq_reserve(kv, seq, k), AG_OK);
        assert_int_equal(ag_model_forward(g_model, kv, &b, out + (size_t)p0 * g_vocab), AG_OK);
        assert_int_equal(ag_kv_seq_commit(kv, seq, len + k), AG_OK);
    }
}

/* Max |a - b| relative to max |b| over n floats. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double md = 0, mb = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / mb;
}

static float *reference(void) {
    float *ref = malloc(sizeof(float) * (size_t)N_TOK * g_vocab);
    ag_kv *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    run_seq(kv, s, k_tokens, N_TOK, N_TOK, ref);
    ag_kv_free(kv);
    return ref;
}

static void chunking_and_block_size_do_not_change_logits(void **state) {
    float *ref = reference();
    float *out = malloc(sizeof(float) * (size_t)N_TOK * g_vocab);
    const int chunks[] = {1, 3, 7, 16};
    const int blocks[] = {8, 16, 32};
    for (size_t c = 0; c < 4; c++)
        for (size_t bsz = 0; bsz < 3; bsz++) {
            ag_kv *kv = new_kv(1, blocks[bsz]);
            int32_t s;
            assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
            run_seq(kv, s, k_tokens, N_TOK, chunks[c], out);
            /* 1e-5: only float summation order differs between batch shapes */
            assert_true(rel_diff(out, ref, (size_t)N_TOK * g_vocab) < 1e-5);
            ag_kv_free(kv);
        }
    free(out);
    free(ref);
}

static void trim_then_reforward_equals_never_going_further(void **state) {
    float *ref = reference();
    float *out = malloc(sizeof(float) * (size_t)N_TOK * g_vocab);
    ag_kv *kv = new_kv(1, 8);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    const int keep = 13;
    run_seq(kv, s, k_tokens, keep, keep, out);
    /* a rejected speculative window of 6 wrong tokens, crossing a block boundary */
    const int32_t wrong[6] = {5, 6, 7, 8, 9, 10};
    float *junk = malloc(sizeof(float) * 6 * (size_t)g_vocab);
    run_seq(kv, s, wrong, 6, 6, junk);
    assert_true(ag_kv_trimmable(kv, s, 6));
    assert_int_equal(ag_kv_trim(kv, s, 6), AG_OK);
    assert_int_equal(ag_kv_seq_len(kv, s), keep);
    run_seq(kv, s, k_tokens + keep, N_TOK - keep, N_TOK - keep, out + (size_t)keep * g_vocab);
    assert_true(rel_diff(out, ref, (size_t)N_TOK * g_vocab) < 1e-5);
    free(junk);
    free(out);
    free(ref);
    ag_kv_free(kv);
}

static void forked_sequences_do_not_disturb_each_other(void **state) {
    float *ref = reference();
    const int split = 11; /* inside a block of 8: the partial block is shared, then copied on write */
    ag_kv *kv = new_kv(2, 8);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    float *out = malloc(sizeof(float) * (size_t)N_TOK * g_vocab);
    run_seq(kv, a, k_tokens, split, split, out);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    assert_int_equal(ag_kv_fork(kv, b, a, split), AG_OK);
    /* b continues with other tokens first, then a continues with the real ones */
    const int32_t other[5] = {300, 301, 302, 303, 304};
    float *ob = malloc(sizeof(float) * 5 * (size_t)g_vocab);
    run_seq(kv, b, other, 5, 5, ob);
    run_seq(kv, a, k_tokens + split, N_TOK - split, 4, out + (size_t)split * g_vocab);
    assert_true(rel_diff(out, ref, (size_t)N_TOK * g_vocab) < 1e-5);
    /* b's logits equal a fresh sequence fed prefix + other */
    ag_kv *kv2 = new_kv(1, 16);
    int32_t c;
    assert_int_equal(ag_kv_seq_new(kv2, &c), AG_OK);
    int32_t toks[64];
    memcpy(toks, k_tokens, sizeof(int32_t) * split);
    memcpy(toks + split, other, sizeof other);
    float *oc = malloc(sizeof(float) * (size_t)(split + 5) * g_vocab);
    run_seq(kv2, c, toks, split + 5, split + 5, oc);
    assert_true(rel_diff(ob, oc + (size_t)split * g_vocab, 5 * (size_t)g_vocab) < 1e-5);
    free(oc);
    free(ob);
    free(out);
    free(ref);
    ag_kv_free(kv2);
    ag_kv_free(kv);
}

static void ragged_batch_of_two_sequences_equals_separate_runs(void **state) {
    float *ref = reference();
    ag_kv *kv = new_kv(2, 16);
    int32_t a, b;
    assert_int_equal(ag_kv_seq_new(kv, &a), AG_OK);
    assert_int_equal(ag_kv_seq_new(kv, &b), AG_OK);
    /* a gets the first 10 tokens; then one batch holds a's next 3 tokens and b's first 8 */
    float *out = malloc(sizeof(float) * (size_t)N_TOK * g_vocab);
    run_seq(kv, a, k_tokens, 10, 10, out);
    int32_t tok[11], pos[11], seq[11];
    for (int i = 0; i < 3; i++) tok[i] = k_tokens[10 + i], pos[i] = 10 + i, seq[i] = a;
    for (int i = 0; i < 8; i++) tok[3 + i] = k_tokens[i], pos[3 + i] = i, seq[3 + i] = b;
    uint8_t want[11];
    memset(want, 1, sizeof want);
    float *mixed = malloc(sizeof(float) * 11 * (size_t)g_vocab);
    ag_batch bt = {.n = 11, .token = tok, .pos = pos, .seq = seq, .want_logits = want, .n_prompt = 11};
    assert_int_equal(ag_kv_seq_reserve(kv, a, 3), AG_OK);
    assert_int_equal(ag_kv_seq_reserve(kv, b, 8), AG_OK);
    assert_int_equal(ag_model_forward(g_model, kv, &bt, mixed), AG_OK);
    assert_true(rel_diff(mixed, ref + (size_t)10 * g_vocab, 3 * (size_t)g_vocab) < 1e-5);
    assert_true(rel_diff(mixed + 3 * (size_t)g_vocab, ref, 8 * (size_t)g_vocab) < 1e-5);
    free(mixed);
    free(out);
    free(ref);
    ag_kv_free(kv);
}

/* Rows that want only their argmax (AG_WANT_ARGMAX) get it in b.argmax, in
 * output-row order: the sampler's greedy rule over the row's logits (on the
 * CPU the rows are written too); a batch without the array is refused. */
static void argmax_rows_match_their_logits(void **state) {
    ag_kv  *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    enum { N = 6 };
    int32_t pos[N], seq[N], am[N];
    uint8_t want[N] = {AG_WANT_ARGMAX, 0, AG_WANT_LOGITS, AG_WANT_ARGMAX, AG_WANT_ARGMAX, AG_WANT_LOGITS};
    for (int i = 0; i < N; i++) pos[i] = i, seq[i] = s;
    float  *out = malloc(sizeof(float) * N * (size_t)g_vocab);
    ag_batch b = {.n = N, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = want, .n_prompt = N};
    assert_int_equal(ag_kv_seq_reserve(kv, s, N), AG_OK);
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID); /* no b.argmax */
    b.argmax = am;
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_OK);
    for (int k = 0, i = 0; i < N; i++) {
        if (!want[i]) continue;
        const float *row = out + (size_t)k * g_vocab;
        int32_t      best = 0;
        for (int v = 1; v < g_vocab; v++)
            if (row[v] > row[best]) best = v;
        if (want[i] == AG_WANT_ARGMAX) assert_int_equal(am[k], best); /* the CPU computes it */
        else assert_true(am[k] == AG_ARGMAX_NONE || am[k] == best);
        k++;
    }
    free(out);
    ag_kv_free(kv);
}

/* ag_model_set_output_rows: a limited head gives each row the full head's
 * logits for ids below the limit, bit for bit, and -inf above it, for
 * prompt rows and decode rows and for several output rows at once (the
 * rows are spread from the prefix's width to the vocabulary's); argmax
 * rows pick inside the limit; 0 restores the whole head. */
static void output_rows_limit_the_head(void **state) {
    const int limit = g_vocab / 2 + 3;
    float    *ref = malloc(sizeof(float) * N_TOK * (size_t)g_vocab);
    float    *out = malloc(sizeof(float) * N_TOK * (size_t)g_vocab);
    for (int kind = 0; kind < 2; kind++) { /* prompt rows, then decode rows */
        ag_kv  *kv = new_kv(1, 16);
        int32_t s, pos[N_TOK], seq[N_TOK];
        assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
        for (int i = 0; i < N_TOK; i++) pos[i] = i, seq[i] = s;
        ag_batch b = {.n = N_TOK, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = NULL,
                      .n_prompt = kind == 0 ? N_TOK : 0};
        uint8_t want[N_TOK];
        for (int i = 0; i < N_TOK; i++) want[i] = 1;
        b.want_logits = want;
        assert_int_equal(ag_kv_seq_reserve(kv, s, N_TOK), AG_OK);
        assert_int_equal(ag_model_set_output_rows(g_model, 0), g_vocab);
        const uint64_t whole = ag_model_weight_bytes(g_model);
        assert_int_equal(ag_model_forward(g_model, kv, &b, ref), AG_OK);
        assert_int_equal(ag_model_set_output_rows(g_model, limit), limit);
        assert_true(ag_model_weight_bytes(g_model) < whole); /* a step reads less of the head */
        /* and the rows of two ids past the prefix, given as copies */
        const int32_t ids[2] = {g_vocab - 1, limit + 7};
        uint8_t      *rows = malloc(2 * ag_model_head_row_bytes(g_model));
        assert_int_equal(ag_model_head_rows_copy(g_model, ids, 2, rows), AG_OK);
        ag_head_extra hx = {.n = 2, .ids = ids, .rows = rows};
        b.head_extra = &hx;
        assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_OK); /* the same positions again */
        for (int k = 0; k < N_TOK; k++) {
            const float *r = ref + (size_t)k * g_vocab, *o = out + (size_t)k * g_vocab;
            assert_memory_equal(o, r, sizeof(float) * (size_t)limit);
            for (int v = limit; v < g_vocab; v++)
                if (v == ids[0] || v == ids[1]) assert_memory_equal(&o[v], &r[v], sizeof(float));
                else assert_true(isinf(o[v]) && o[v] < 0);
        }
        const int32_t inside = limit - 1; /* an id the prefix has is refused */
        hx.ids = &inside, hx.n = 1;
        assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID);
        b.head_extra = NULL;
        free(rows);
        /* one decode row wanting its argmax: found inside the prefix */
        int32_t am = -1;
        uint8_t w1 = AG_WANT_ARGMAX;
        ag_batch one = {.n = 1, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = &w1, .argmax = &am};
        assert_int_equal(ag_model_forward(g_model, kv, &one, out), AG_OK);
        int32_t best = 0;
        for (int v = 1; v < g_vocab; v++)
            if (out[v] > out[best]) best = v;
        assert_true(best < limit);
        assert_int_equal(am, best);
        if (kind == 1) assert_memory_equal(out, ref, sizeof(float) * (size_t)limit); /* ref's row 0, a decode row */
        assert_int_equal(ag_model_set_output_rows(g_model, 0), g_vocab);
        assert_int_equal(ag_model_set_output_rows(g_model, g_vocab + 5), g_vocab);
        ag_kv_free(kv);
    }
    free(ref);
    free(out);
}

/* Rows that want a token drawn with a sampler's uniform (AG_WANT_PICK) get
 * ag_pick_f32 of their logits and their draw, in output-row order, beside
 * argmax rows; a batch without draws is refused. */
static void pick_rows_draw_from_their_logits(void **state) {
    ag_kv  *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    enum { N = 6 };
    int32_t pos[N], seq[N], am[N];
    uint8_t want[N] = {AG_WANT_PICK, 0, AG_WANT_LOGITS, AG_WANT_ARGMAX, AG_WANT_PICK, AG_WANT_PICK};
    ag_pick draws[N] = {{0.1, 1.0f}, {0.5, 0.5f}, {0.9, 2.0f}, {0.999, 0.7f}, {0.3, 1.3f}};
    for (int i = 0; i < N; i++) pos[i] = i, seq[i] = s;
    float   *out = malloc(sizeof(float) * N * (size_t)g_vocab);
    ag_batch b = {.n = N, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = want, .argmax = am, .n_prompt = N};
    assert_true(ag_model_can_pick(g_model));
    assert_int_equal(ag_kv_seq_reserve(kv, s, N), AG_OK);
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID); /* no b.pick */
    b.pick = draws;
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_OK);
    int distinct = 0, prev = -1;
    for (int k = 0, i = 0; i < N; i++) {
        if (!want[i]) continue;
        const float *row = out + (size_t)k * g_vocab; /* the CPU writes every row */
        if (want[i] == AG_WANT_PICK) {
            assert_int_equal(am[k], ag_pick_f32(row, g_vocab, draws[k].inv_temp, draws[k].u));
            distinct += am[k] != prev;
            prev = am[k];
        } else if (want[i] == AG_WANT_ARGMAX) {
            assert_int_equal(am[k], ag_argmax_f32(row, g_vocab));
        } else {
            assert_int_equal(am[k], AG_ARGMAX_NONE);
        }
        k++;
    }
    assert_true(distinct >= 2); /* the draws moved the picks: not an argmax in disguise */
    free(out);
    ag_kv_free(kv);
}

/* AG_WANT_PICK_LP rows get their picked token and their candidates naming
 * it (at), beside plain pick and candidates rows; refused without draws or
 * candidate arrays. */
static void picked_rows_with_candidates(void **state) {
    ag_kv  *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    enum { N = 5 };
    int32_t      pos[N], seq[N], am[N];
    uint8_t      want[N] = {AG_WANT_PICK_LP, AG_WANT_PICK, AG_WANT_PICK_LP, AG_WANT_CANDS, AG_WANT_PICK_LP};
    ag_pick      draws[N] = {{0.2, 1.0f}, {0.5, 0.5f}, {0.77, 2.0f}, {0, 0}, {0.999, 1.3f}};
    ag_cands_req req[N] = {{3, 1, AG_CANDS_AT_TOKEN}, {0}, {1, 1, AG_CANDS_AT_TOKEN}, {5, 1, 2}, {20, 1, AG_CANDS_AT_TOKEN}};
    ag_cands    *cands = calloc(N, sizeof *cands), ref;
    for (int i = 0; i < N; i++) pos[i] = i, seq[i] = s;
    float   *out = malloc(sizeof(float) * N * (size_t)g_vocab);
    ag_batch b = {.n = N, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = want, .argmax = am,
                  .pick = draws, .n_prompt = N};
    assert_int_equal(ag_kv_seq_reserve(kv, s, N), AG_OK);
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID); /* no candidate arrays */
    b.cands_req = req;
    b.cands = cands;
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_OK);
    for (int k = 0; k < N; k++) {
        const float *row = out + (size_t)k * g_vocab; /* the CPU writes every row */
        if (want[k] == AG_WANT_CANDS) {
            assert_int_equal(am[k], AG_ARGMAX_NONE);
            assert_int_equal(cands[k].at, 2);
            continue;
        }
        assert_int_equal(am[k], ag_pick_f32(row, g_vocab, draws[k].inv_temp, draws[k].u));
        if (want[k] != AG_WANT_PICK_LP) continue;
        ag_cands_req h = req[k];
        h.at = am[k];
        ag_top_cands_f32(row, g_vocab, &h, &ref);
        assert_int_equal(cands[k].n, ref.n);
        assert_int_equal(cands[k].at, am[k]);
        assert_true(cands[k].at_l == ref.at_l && cands[k].max == ref.max);
        assert_memory_equal(&cands[k].sumexp, &ref.sumexp, sizeof ref.sumexp);
        assert_memory_equal(cands[k].c, ref.c, sizeof ref.c[0] * (size_t)ref.n);
    }
    b.pick = NULL;
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID); /* no draws */
    free(cands);
    free(out);
    ag_kv_free(kv);
}

/* AG_WANT_CANDS rows get their candidates (the CPU writes the rows too, so
 * each is checked against ag_top_cands_f32 of its own row, all fields bit
 * for bit), mixed with other kinds; a batch without the arrays is refused. */
static void cands_rows_are_their_rows_best(void **state) {
    ag_kv  *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    enum { N = 6 };
    int32_t      pos[N], seq[N], am[N];
    uint8_t      want[N] = {AG_WANT_CANDS, 0, AG_WANT_LOGITS, AG_WANT_ARGMAX, AG_WANT_CANDS, AG_WANT_CANDS};
    ag_cands_req req[N] = {{40, 1, -1}, {5, 0, 7}, {1, 1, g_vocab - 1}, {256, 0, -1}, {3, 0, 300}};
    ag_cands    *cands = calloc(N, sizeof *cands), ref;
    for (int i = 0; i < N; i++) pos[i] = i, seq[i] = s;
    float   *out = malloc(sizeof(float) * N * (size_t)g_vocab);
    ag_batch b = {.n = N, .token = k_tokens, .pos = pos, .seq = seq, .want_logits = want, .argmax = am, .n_prompt = N};
    assert_true(ag_model_can_cands(g_model));
    assert_int_equal(ag_kv_seq_reserve(kv, s, N), AG_OK);
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_ERR_INVALID); /* no b.cands */
    b.cands_req = req;
    b.cands = cands;
    assert_int_equal(ag_model_forward(g_model, kv, &b, out), AG_OK);
    int checked = 0;
    for (int k = 0, i = 0; i < N; i++) {
        if (!want[i]) continue;
        const float *row = out + (size_t)k * g_vocab;
        if (want[i] == AG_WANT_CANDS) {
            ag_top_cands_f32(row, g_vocab, &req[k], &ref);
            assert_int_equal(am[k], AG_ARGMAX_NONE);
            assert_int_equal(cands[k].n, ref.n);
            assert_true(cands[k].n >= 3);
            assert_int_equal(cands[k].n_finite, ref.n_finite);
            assert_true(cands[k].max == ref.max);
            assert_memory_equal(&cands[k].sumexp, &ref.sumexp, sizeof ref.sumexp); /* NaN when not asked */
            assert_memory_equal(cands[k].c, ref.c, sizeof ref.c[0] * (size_t)ref.n);
            assert_int_equal(cands[k].at, ref.at);
            assert_int_equal(cands[k].at, req[k].at);
            if (ref.at >= 0) assert_true(cands[k].at_l == ref.at_l && ref.at_l == ag_logit_sanitize(row[ref.at]));
            checked++;
        } else if (want[i] == AG_WANT_ARGMAX) {
            assert_int_equal(am[k], ag_argmax_f32(row, g_vocab));
        }
        k++;
    }
    assert_int_equal(checked, 3);
    /* every output row of the pass can be fetched again (a top-p cut past
     * a row's candidates), none past them */
    float *again = malloc(sizeof(float) * (size_t)g_vocab);
    for (int k = 0; k < N - 1; k++) {
        assert_int_equal(ag_model_output_row(g_model, k, again), AG_OK);
        assert_memory_equal(again, out + (size_t)k * g_vocab, sizeof(float) * (size_t)g_vocab);
    }
    assert_int_equal(ag_model_output_row(g_model, N - 1, again), AG_ERR_INVALID);
    assert_int_equal(ag_model_output_row(g_model, -1, again), AG_ERR_INVALID);
    free(again);
    free(out);
    free(cands);
    ag_kv_free(kv);
}

/* Bad batches are errors (a token out of range, no tokens, edits without
 * their rows' starts or naming a token outside the vocabulary); a valid
 * edit changes only its token, as ag_logit_edit_apply says, and a mask
 * after it leaves only its tokens finite. */
static void bad_batches_are_errors_and_edits_apply(void **state) {
    ag_kv *kv = new_kv(1, 16);
    int32_t s;
    assert_int_equal(ag_kv_seq_new(kv, &s), AG_OK);
    assert_int_equal(ag_kv_seq_reserve(kv, s, 1), AG_OK);
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    int32_t tok = g_vocab, pos = 0;
    ag_batch b = {.n = 1, .token = &tok, .pos = &pos, .seq = &s, .want_logits = NULL};
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "out of range"));
    b.n = 0;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_ERR_INVALID);
    /* edits: without their starts, starts not from 0 or decreasing, a token outside the vocab */
    tok = 1, b.n = 1;
    ag_logit_edit ed[2] = {{3, AG_EDIT_BIAS, 1.0f, 1.0f, 0.0f}, {g_vocab, AG_EDIT_BAN, 0.0f, 1.0f, 0.0f}};
    int32_t       start[2] = {0, 1};
    b.edits = ed;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_ERR_INVALID);
    b.edit_start = start, start[0] = 1;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_ERR_INVALID);
    start[0] = 0, start[1] = 2;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_ERR_INVALID);
    assert_non_null(strstr(ag_error_message(), "not in"));
    /* a valid edit changes only its token, as ag_logit_edit_apply says */
    float *plain = malloc(sizeof(float) * (size_t)g_vocab);
    b.edits = NULL, b.edit_start = NULL;
    assert_int_equal(ag_model_forward(g_model, kv, &b, plain), AG_OK);
    /* (nothing committed: the same position again) */
    start[1] = 1, b.edits = ed, b.edit_start = start;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_OK);
    for (int i = 0; i < g_vocab; i++) {
        const float w = i == 3 ? ag_logit_edit_apply(plain[i], &ed[0]) : plain[i];
        assert_memory_equal(&logits[i], &w, sizeof w);
    }
    assert_true(logits[3] == plain[3] + 1.0f);
    /* a mask after the edits: only tokens 3 and 5 stay */
    uint32_t       *bits = calloc((size_t)(g_vocab + 31) / 32, sizeof *bits);
    const uint32_t *allow[1] = {bits};
    bits[0] = 1u << 3 | 1u << 5;
    b.allow = allow;
    assert_int_equal(ag_model_forward(g_model, kv, &b, logits), AG_OK);
    for (int i = 0; i < g_vocab; i++) {
        const float w = i == 3 ? ag_logit_edit_apply(plain[i], &ed[0]) : i == 5 ? plain[i] : -INFINITY;
        assert_memory_equal(&logits[i], &w, sizeof w);
    }
    free(bits);
    free(plain);
    free(logits);
    ag_kv_free(kv);
}

/* The fingerprint that keys persisted KV: stable across loads, changed by
 * a change of the weights where it samples them (the start, middle and end
 * of each tensor), blind elsewhere (it does not hash every weight). */
static void fingerprint_is_stable_and_sees_sampled_weights(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    uint64_t  fp = ag_model_fingerprint(g_model);
    ag_model *m = NULL;
    assert_int_equal(ag_model_load(path, NULL, &m), AG_OK);
    assert_int_equal(ag_model_fingerprint(m), fp);
    const ag_gguf_tensor *t = ag_gguf_find_tensor(ag_model_gguf(m), "blk.0.ffn_up.weight");
    assert_non_null(t);
    assert_true(t->size > 1000);
    uint64_t base = ag_gguf_data_offset(ag_model_gguf(m)) + t->offset;
    ag_model_free(m);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n);
    assert_int_equal(fread(b, 1, n, f), n);
    fclose(f);
    char tmp[] = "/tmp/augur-fp-XXXXXX";
    int  fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    const uint64_t offs[2] = {base + 1, base + 100}; /* sampled; not sampled */
    for (int i = 0; i < 2; i++) {
        b[offs[i]] ^= 0x10;
        f = fopen(tmp, "wb");
        assert_int_equal(fwrite(b, 1, n, f), n);
        fclose(f);
        b[offs[i]] ^= 0x10;
        assert_int_equal(ag_model_load(tmp, NULL, &m), AG_OK);
        if (i == 0) assert_true(ag_model_fingerprint(m) != fp);
        else assert_int_equal(ag_model_fingerprint(m), fp);
        ag_model_free(m);
    }
    unlink(tmp);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chunking_and_block_size_do_not_change_logits),
        cmocka_unit_test(trim_then_reforward_equals_never_going_further),
        cmocka_unit_test(forked_sequences_do_not_disturb_each_other),
        cmocka_unit_test(ragged_batch_of_two_sequences_equals_separate_runs),
        cmocka_unit_test(argmax_rows_match_their_logits),
        cmocka_unit_test(output_rows_limit_the_head),
        cmocka_unit_test(pick_rows_draw_from_their_logits),
        cmocka_unit_test(picked_rows_with_candidates),
        cmocka_unit_test(cands_rows_are_their_rows_best),
        cmocka_unit_test(bad_batches_are_errors_and_edits_apply),
        cmocka_unit_test(fingerprint_is_stable_and_sees_sampled_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
