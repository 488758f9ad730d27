/* The "draft-model" draft source (spec/draft_model.h) on stories260K.
 *
 * The reference is the target model itself run greedily through
 * ag_model_forward, the way the engine runs it (prompt rows for the prompt
 * but its last token, decode rows after): a draft model identical to the
 * target must propose exactly that continuation, after any history of
 * partial acceptances. Vocabulary checks use the real GGUF pairs in models/
 * (skipped when absent) and tokenizers derived from stories260K's. */
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

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "model/model.h"
#include "spec/combined.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"
#include "tok/tok.h"
#include "model_testutil.h"

static char      g_path[4096];
static ag_model *g_model; /* the target */
static ag_tok   *g_tok;   /* the target's tokenizer */
static ag_kv    *g_kv;    /* the target's KV, for the references */
static int       g_vocab;

static const int32_t k_prompt[] = {1,   403, 407, 261, 378, 418, 268, 300, 263, 432, 270, 315,
                                   280, 260, 343, 443, 300, 362, 430, 272, 336, 279, 282, 316};
#define N_PROMPT ((int)(sizeof k_prompt / sizeof k_prompt[0]))
#define MAX_HIST 1024

static int setup(void **state) {
    stories_path(g_path, sizeof g_path);
    if (load_model_2t(g_path, &g_model, &g_tok)) return -1;
    g_vocab = ag_model_config_of(g_model)->n_vocab;
    ag_kv_params kp = ag_kv_default_params();
    ag_model_kv_shape(g_model, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
    kp.max_seqs = 2;
    kp.budget_bytes = (size_t)16 << 20;
    return ag_kv_init(&kp, &g_kv) ? -1 : 0;
}

static int teardown(void **state) {
    ag_kv_free(g_kv);
    ag_tok_free(g_tok);
    ag_model_free(g_model);
    return 0;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

/* Runs toks[0..n) on seq of the target KV, as prompt or decode rows, with
 * the last row's logits into out (if not NULL). */
static void target_run(int32_t seq, const int32_t *toks, int n, int as_prompt, float *out) {
    int32_t pos[256], seqs[256];
    uint8_t want[256];
    for (int p0 = 0; p0 < n; p0 += 256) {
        int     k = n - p0 < 256 ? n - p0 : 256;
        int32_t len = ag_kv_seq_len(g_kv, seq);
        for (int i = 0; i < k; i++) {
            pos[i] = len + i;
            seqs[i] = seq;
            want[i] = out && p0 + i == n - 1;
        }
        ag_batch b = {.n = k, .token = toks + p0, .pos = pos, .seq = seqs, .want_logits = want,
                      .n_prompt = as_prompt ? k : 0};
        assert_int_equal(ag_kv_seq_reserve(g_kv, seq, k), AG_OK);
        assert_int_equal(ag_model_forward(g_model, g_kv, &b, out), AG_OK);
        assert_int_equal(ag_kv_seq_commit(g_kv, seq, len + k), AG_OK);
    }
}

/* The target's greedy continuation of hist[0..h) (whose first n_prompt
 * tokens are the prompt): m tokens into out, and each one's softmax
 * probability into conf (if not NULL). */
static void ref_greedy(const int32_t *hist, int h, int n_prompt, int m, int32_t *out, float *conf) {
    int32_t seq;
    assert_int_equal(ag_kv_seq_new(g_kv, &seq), AG_OK);
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    assert_non_null(logits);
    if (n_prompt > 1) target_run(seq, hist, n_prompt - 1, 1, NULL);
    /* one token per forward, as plain decoding runs them: on stories260K a
     * decode row's logits move (~1e-6, ~1e-4 in batches of 100+ rows) with
     * the batch it runs in, so a single batch would not be the reference */
    for (int j = n_prompt - 1; j < h; j++) target_run(seq, hist + j, 1, 0, j == h - 1 ? logits : NULL);
    for (int i = 0; i < m; i++) {
        int32_t am = 0;
        for (int v = 1; v < g_vocab; v++)
            if (logits[v] > logits[am]) am = v;
        double z = 0;
        for (int v = 0; v < g_vocab; v++) z += exp((double)logits[v] - logits[am]);
        out[i] = am;
        if (conf) conf[i] = (float)(1.0 / z);
        if (i + 1 < m) target_run(seq, &am, 1, 0, logits);
    }
    free(logits);
    assert_int_equal(ag_kv_seq_free(g_kv, seq), AG_OK);
}

static ag_draft_model *open_self(int max_seqs, int n_ctx) {
    ag_model_params p = ag_model_default_params();
    p.cpu.n_threads = 2;
    ag_draft_model *dm = NULL;
    ag_status       st = ag_draft_model_open(g_path, &p, g_tok, max_seqs, n_ctx, &dm);
    if (st) fprintf(stderr, "%s\n", ag_error_message());
    assert_int_equal(st, AG_OK);
    return dm;
}

static ag_draft_source *greedy_source(ag_draft_model *dm) {
    ag_sample_params sp = ag_sample_default_params();
    sp.temperature = 0;
    ag_draft_source *s = NULL;
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 1, 0.25f, &s), AG_OK);
    assert_string_equal(s->name, "draft-model");
    assert_false(s->stochastic);
    assert_true(s->cost_per_token == 0.25f);
    return s;
}

/* ---- self-drafting at temperature 0 ---- */

/* A draft model identical to the target proposes the target's own greedy
 * continuation; an executor that verifies against the target accepts all. */
static void self_draft_is_target_greedy(void **state) {
    ag_draft_model *dm = open_self(2, 512);
    ag_draft_model_set_p_min(dm, 0);
    assert_true(fabsf(ag_draft_model_cost(dm, g_model) - 1.0f) < 1e-6f);
    ag_draft_source *s = greedy_source(dm);
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);

    int32_t hist[MAX_HIST], feed[8], out[8], ref[9];
    int     h = N_PROMPT, n_feed = 0, drafted = 0, accepted = 0;
    memcpy(hist, k_prompt, sizeof k_prompt);
    /* the first output token comes from the prompt's logits, as in the engine */
    ref_greedy(hist, h, N_PROMPT, 1, feed, NULL);
    n_feed = 1;
    for (int round = 0; round < 12; round++) {
        memcpy(hist + h, feed, sizeof(int32_t) * (size_t)n_feed);
        h += n_feed;
        int d = s->ops->draft(s, feed, n_feed, 8, out, NULL);
        assert_int_equal(d, 8);
        ref_greedy(hist, h, N_PROMPT, d + 1, ref, NULL);
        int k = 0;
        while (k < d && out[k] == ref[k]) k++; /* the verify rule at temperature 0 */
        drafted += d;
        accepted += k;
        s->ops->commit(s, d, k);
        memcpy(hist + h, out, sizeof(int32_t) * (size_t)k);
        h += k;
        feed[0] = ref[k]; /* bonus (k == d) or correction */
        n_feed = 1;
    }
    assert_int_equal(accepted, drafted);
    assert_int_equal(drafted, 12 * 8);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* With a head prefix (AUGUR_DRAFT_VOCAB), a self-draft proposes the
 * target's greedy continuation among the ids it may draft: those below the
 * prefix and those its prompt and feeds hold (their rows computed beside
 * the prefix); and drafts some of the latter. */
static void head_prefix_drafts_seen_ids(void **state) {
    enum { PREFIX = 256, D = 8 };
    setenv("AUGUR_DRAFT_VOCAB", "256", 1);
    ag_draft_model *dm = open_self(2, 512);
    unsetenv("AUGUR_DRAFT_VOCAB");
    ag_draft_model_set_p_min(dm, 0);
    assert_true(ag_draft_model_cost(dm, g_model) < 1.0f); /* a step reads half the head */
    ag_draft_source *s = greedy_source(dm);
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);
    bool allowed[4096] = {false};
    assert_true(g_vocab <= 4096);
    for (int v = 0; v < PREFIX; v++) allowed[v] = true;
    for (int i = 0; i < N_PROMPT; i++) allowed[k_prompt[i]] = true;
    /* the first output token: the target's own (unrestricted) greedy pick */
    int32_t first;
    ref_greedy(k_prompt, N_PROMPT, N_PROMPT, 1, &first, NULL);
    allowed[first] = true;
    int32_t out[D];
    assert_int_equal(s->ops->draft(s, &first, 1, D, out, NULL), D);
    /* the reference: the target run greedily over [prompt, first], picking among the allowed ids */
    int32_t seq;
    assert_int_equal(ag_kv_seq_new(g_kv, &seq), AG_OK);
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    target_run(seq, k_prompt, N_PROMPT - 1, 1, NULL);
    target_run(seq, k_prompt + N_PROMPT - 1, 1, 0, NULL);
    target_run(seq, &first, 1, 0, logits);
    int past_prefix = 0;
    for (int i = 0; i < D; i++) {
        int32_t best = -1;
        for (int v = 0; v < g_vocab; v++)
            if (allowed[v] && (best < 0 || logits[v] > logits[best])) best = v;
        assert_int_equal(out[i], best);
        past_prefix += best >= PREFIX;
        if (i + 1 < D) target_run(seq, &best, 1, 0, logits);
    }
    assert_true(past_prefix > 0); /* the copied rows were used */
    free(logits);
    assert_int_equal(ag_kv_seq_free(g_kv, seq), AG_OK);
    s->ops->commit(s, D, 0);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* After partial acceptances (random k < d), corrections that differ from
 * the draft, rounds that did not draft (feeds of several tokens) and empty
 * feeds, the proposals are still the greedy continuation of the history the
 * source has been told: its KV and sampler were rewound exactly. */
static void rewind_keeps_proposals_exact(void **state) {
    ag_draft_model *dm = open_self(2, 512);
    ag_draft_model_set_p_min(dm, 0);
    ag_draft_source *s = greedy_source(dm);
    /* a second source in the same pool must not disturb the first */
    ag_draft_source *other = greedy_source(dm);
    assert_int_equal(other->ops->prefill(other, k_prompt + 3, N_PROMPT - 3), AG_OK);
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);

    int32_t hist[MAX_HIST], feed[8], out[8], ref[9], oo[8];
    int     h = N_PROMPT, n_feed = 0, n_partial = 0, n_multi = 0, n_empty = 0;
    memcpy(hist, k_prompt, sizeof k_prompt);
    feed[0] = 300;
    n_feed = 1;
    for (int round = 0; round < 40; round++) {
        memcpy(hist + h, feed, sizeof(int32_t) * (size_t)n_feed);
        h += n_feed;
        int max = round % 9 == 4 ? 0 : 1 + (int)rnd(8);
        int d = s->ops->draft(s, n_feed ? feed : NULL, n_feed, max, out, NULL);
        assert_int_equal(d, max);
        if (d > 0) {
            float rc[8], got[8];
            ref_greedy(hist, h, N_PROMPT, d, ref, rc);
            assert_memory_equal(out, ref, sizeof(int32_t) * (size_t)d);
            assert_int_equal(ag_draft_model_source_confidence(s, got, 8), d);
            for (int i = 0; i < d; i++) assert_true(fabsf(got[i] - rc[i]) < 1e-5f);
        }
        /* the other source runs a round in between */
        int od = other->ops->draft(other, &hist[h - 1], 1, 3, oo, NULL);
        assert_int_equal(od, 3);
        other->ops->commit(other, od, 0);

        int k = d > 0 ? (int)rnd((uint32_t)d + 1) : 0;
        if (k < d) n_partial++;
        s->ops->commit(s, d, k);
        memcpy(hist + h, out, sizeof(int32_t) * (size_t)k);
        h += k;
        /* next feed: a correction that is not the draft's token, several
         * tokens (as after rounds without drafting), or nothing */
        uint32_t r = rnd(6);
        if (r == 0) {
            n_feed = 0;
            n_empty++;
        } else if (r == 1) {
            n_feed = 2 + (int)rnd(3);
            for (int i = 0; i < n_feed; i++) feed[i] = 3 + (int32_t)rnd((uint32_t)g_vocab - 3);
            n_multi++;
        } else {
            n_feed = 1;
            feed[0] = k < d ? (out[k] + 1 + (int32_t)rnd(50)) % g_vocab : 3 + (int32_t)rnd(400);
        }
        if (h + n_feed + 8 >= 500) break;
    }
    assert_true(n_partial > 5);
    assert_true(n_multi > 0);
    assert_true(n_empty > 0);
    ag_draft_free(other);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* The combined source (spec/combined.h) over a self-draft: each round it
 * proposes what prompt lookup proposes on the history when that match is at
 * least min_match long, else the target's greedy continuation (the draft
 * model's), after random partial acceptances and corrections; both kinds of
 * round happen. The lookup's reference is a second prompt-lookup source told
 * the whole history as feed (its rule depends on the history only). At a
 * temperature above 0 a lookup round's q rows are one-hot on its guesses. */
static void combined_lookup_first_else_model(void **state) {
    enum { MM = 3, MAXD = 6 };
    for (int sampled = 0; sampled < 2; sampled++) {
        ag_draft_model *dm = open_self(1, 512);
        ag_draft_model_set_p_min(dm, 0);
        ag_sample_params sp = ag_sample_default_params();
        sp.temperature = sampled ? 0.8f : 0.0f;
        sp.seed = 99;
        ag_draft_source *model = NULL, *lookup = NULL, *s = NULL, *ref_ng = NULL;
        assert_int_equal(ag_draft_model_source_new(dm, &sp, 1, 0.3f, &model), AG_OK);
        assert_int_equal(ag_draft_ngram_new(NULL, &lookup), AG_OK);
        assert_int_equal(ag_draft_combined_new(lookup, model, MM, g_vocab, &s), AG_OK);
        assert_string_equal(s->name, "draft-model+ngram");
        assert_true(s->stochastic == (sampled != 0));
        assert_true(s->cost_per_token == 0.3f);
        assert_int_equal(ag_draft_ngram_new(NULL, &ref_ng), AG_OK);
        /* a prompt that repeats itself, so the lookup has matches from the start */
        int32_t hist[MAX_HIST], feed[8], out[MAXD], ref[MAXD + 1], ng_out[MAXD];
        int     h = 0;
        for (int r = 0; r < 3; r++) memcpy(hist + h, k_prompt, sizeof k_prompt), h += N_PROMPT;
        const int n_prompt = h;
        assert_int_equal(s->ops->prefill(s, hist, n_prompt), AG_OK);
        assert_int_equal(ref_ng->ops->prefill(ref_ng, hist, n_prompt), AG_OK);
        float *q = sampled ? malloc(sizeof(float) * (size_t)g_vocab * MAXD) : NULL;
        int    told = n_prompt; /* history the reference lookup has */
        int    n_feed = 1, lookup_rounds = 0, model_rounds = 0;
        feed[0] = k_prompt[0];
        for (int round = 0; round < 40 && h + n_feed + MAXD + 2 < 500; round++) {
            memcpy(hist + h, feed, sizeof(int32_t) * (size_t)n_feed);
            h += n_feed;
            int dr = ref_ng->ops->draft(ref_ng, hist + told, h - told, MAXD, ng_out, NULL);
            const bool by_lookup = dr > 0 && ag_ngram_last_match(ref_ng) >= MM;
            ref_ng->ops->commit(ref_ng, dr, 0);
            told = h;
            int d = s->ops->draft(s, feed, n_feed, MAXD, out, q);
            if (by_lookup) {
                lookup_rounds++;
                assert_int_equal(d, dr);
                assert_memory_equal(out, ng_out, sizeof(int32_t) * (size_t)d);
                for (int i = 0; q && i < d; i++)
                    for (int v = 0; v < g_vocab; v++) assert_true(q[(size_t)i * g_vocab + v] == (v == out[i] ? 1.0f : 0.0f));
            } else {
                model_rounds++;
                assert_int_equal(d, MAXD);
                if (!sampled) { /* the self-draft's greedy pick is the target's */
                    ref_greedy(hist, h, n_prompt, d, ref, NULL);
                    assert_memory_equal(out, ref, sizeof(int32_t) * (size_t)d);
                }
            }
            int k = (int)rnd((uint32_t)d + 1);
            s->ops->commit(s, d, k);
            memcpy(hist + h, out, sizeof(int32_t) * (size_t)k);
            h += k;
            /* a correction (or bonus) from the prompt; every other round a run of
             * 4 of its tokens (as after rounds without drafts), whose suffix
             * the lookup then finds */
            if (rnd(2)) {
                feed[0] = k_prompt[rnd(N_PROMPT)];
                n_feed = 1;
            } else {
                const int j = (int)rnd(N_PROMPT - 4);
                memcpy(feed, k_prompt + j, sizeof(int32_t) * 4);
                n_feed = 4;
            }
        }
        int64_t by_l = 0, by_m = 0;
        ag_draft_combined_counts(s, &by_l, &by_m);
        fprintf(stderr, "%s: %d lookup rounds, %d model rounds\n", sampled ? "sampled" : "greedy", lookup_rounds, model_rounds);
        assert_true(lookup_rounds > 3 && model_rounds > 3);
        assert_int_equal(by_l, lookup_rounds);
        assert_int_equal(by_m, model_rounds);
        free(q);
        ag_draft_free(ref_ng);
        ag_draft_free(s);
        ag_draft_model_close(dm);
    }
}

/* Penalties are part of the chain: the draft applies them over the output
 * so far (feeds and accepted drafts, not the prompt), and rewinds rejected
 * drafts out of them. With a strong repetition penalty the proposals must
 * still equal greedy decoding through a sampler with the same history. */
static void penalties_follow_the_history(void **state) {
    ag_draft_model *dm = open_self(1, 512);
    ag_draft_model_set_p_min(dm, 0);
    ag_sample_params sp = ag_sample_default_params();
    sp.temperature = 0;
    sp.repetition_penalty = 3.0f;
    sp.presence_penalty = 1.0f;
    ag_draft_source *s = NULL;
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 1, 0.1f, &s), AG_OK);
    ag_sampler *ref_s = NULL;
    assert_int_equal(ag_sampler_new(&sp, g_vocab, 0, &ref_s), AG_OK);
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);

    int32_t hist[MAX_HIST], feed[1] = {300}, out[6];
    int     h = N_PROMPT;
    memcpy(hist, k_prompt, sizeof k_prompt);
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    for (int round = 0; round < 10; round++) {
        hist[h++] = feed[0];
        ag_sampler_accept(ref_s, feed[0]);
        int d = s->ops->draft(s, feed, 1, 6, out, NULL);
        assert_int_equal(d, 6);
        /* reference: the target decoding greedily through its own sampler */
        int32_t seq;
        assert_int_equal(ag_kv_seq_new(g_kv, &seq), AG_OK);
        target_run(seq, hist, N_PROMPT - 1, 1, NULL);
        target_run(seq, hist + N_PROMPT - 1, h - (N_PROMPT - 1), 0, logits);
        for (int i = 0; i < d; i++) {
            ag_sample_result r;
            assert_int_equal(ag_sampler_sample(ref_s, logits, &r), AG_OK);
            assert_int_equal(out[i], r.token);
            ag_sampler_accept(ref_s, r.token);
            if (i + 1 < d) target_run(seq, &r.token, 1, 0, logits);
        }
        ag_kv_seq_free(g_kv, seq);
        int k = (int)rnd((uint32_t)d + 1);
        s->ops->commit(s, d, k);
        ag_sampler_rewind(ref_s, (size_t)(d - k));
        memcpy(hist + h, out, sizeof(int32_t) * (size_t)k);
        h += k;
        feed[0] = out[k < d ? k : d - 1]; /* a token the model likes: penalties bite */
    }
    free(logits);
    ag_sampler_free(ref_s);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* p_min stops a greedy draft before the first token whose probability under
 * the draft (= the target here) is below it. */
static void p_min_stops_at_low_confidence(void **state) {
    ag_draft_model *dm = open_self(1, 512);
    ag_draft_source *s = greedy_source(dm);
    int32_t          out[16], ref[16], feed = 300, hist[64];
    float            conf[16];
    memcpy(hist, k_prompt, sizeof k_prompt);
    hist[N_PROMPT] = feed;
    ref_greedy(hist, N_PROMPT + 1, N_PROMPT, 16, ref, conf);
    const float ths[] = {0.3f, 0.5f, 0.8f, 1.0f};
    int         seen_short = 0;
    for (int t = 0; t < 4; t++) {
        ag_draft_model_set_p_min(dm, ths[t]);
        assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);
        int d = s->ops->draft(s, &feed, 1, 16, out, NULL);
        int want = 0;
        while (want < 16 && conf[want] >= ths[t]) want++;
        assert_int_equal(d, want);
        assert_memory_equal(out, ref, sizeof(int32_t) * (size_t)d);
        float got[16];
        assert_int_equal(ag_draft_model_source_confidence(s, got, 16), d);
        for (int i = 0; i < d; i++) assert_true(fabsf(got[i] - conf[i]) < 1e-6f);
        seen_short += d < 16;
        s->ops->commit(s, d, d);
    }
    assert_true(seen_short > 0);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* A prompt longer than one 256-token chunk. */
static void long_prompt_prefills_in_chunks(void **state) {
    ag_draft_model *dm = open_self(1, 512);
    ag_draft_model_set_p_min(dm, 0);
    ag_draft_source *s = greedy_source(dm);
    enum { N = 300 };
    int32_t prompt[N + 1], out[8], ref[8];
    prompt[0] = 1;
    for (int i = 1; i < N; i++) prompt[i] = k_prompt[1 + i % (N_PROMPT - 1)] + (i / 97);
    assert_int_equal(s->ops->prefill(s, prompt, N), AG_OK);
    prompt[N] = 300;
    int d = s->ops->draft(s, &prompt[N], 1, 8, out, NULL);
    assert_int_equal(d, 8);
    ref_greedy(prompt, N + 1, N, 8, ref, NULL);
    assert_memory_equal(out, ref, sizeof out);
    s->ops->commit(s, d, 3);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* A long feed (after many rounds without drafting) runs as prompt rows:
 * the proposals are the greedy continuation of the history computed that
 * way (all of it prompt rows, then decode rows). */
static void long_feed_then_drafts(void **state) {
    ag_draft_model *dm = open_self(1, 512);
    ag_draft_model_set_p_min(dm, 0);
    ag_draft_source *s = greedy_source(dm);
    enum { NF = 40 };
    int32_t hist[N_PROMPT + NF], out[8], ref[8];
    float   conf[8], got[8];
    memcpy(hist, k_prompt, sizeof k_prompt);
    for (int i = 0; i < NF; i++) hist[N_PROMPT + i] = k_prompt[1 + (i * 7) % (N_PROMPT - 1)];
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);
    int d = s->ops->draft(s, hist + N_PROMPT, NF, 8, out, NULL);
    assert_int_equal(d, 8);
    int32_t seq;
    float  *logits = malloc(sizeof(float) * (size_t)g_vocab);
    assert_int_equal(ag_kv_seq_new(g_kv, &seq), AG_OK);
    target_run(seq, hist, N_PROMPT + NF, 1, logits);
    for (int i = 0; i < 8; i++) {
        int32_t am = 0;
        for (int v = 1; v < g_vocab; v++)
            if (logits[v] > logits[am]) am = v;
        double z = 0;
        for (int v = 0; v < g_vocab; v++) z += exp((double)logits[v] - logits[am]);
        ref[i] = am;
        conf[i] = (float)(1.0 / z);
        if (i + 1 < 8) target_run(seq, &am, 1, 0, logits);
    }
    ag_kv_seq_free(g_kv, seq);
    free(logits);
    assert_memory_equal(out, ref, sizeof ref);
    /* the same logits, not just the same argmax: the confidences agree */
    assert_int_equal(ag_draft_model_source_confidence(s, got, 8), 8);
    for (int i = 0; i < 8; i++) assert_true(fabsf(got[i] - conf[i]) < 1e-5f);
    s->ops->commit(s, d, 2);
    ag_draft_free(s);
    ag_draft_model_close(dm);
}

/* Drafts never reach past the draft's n_ctx: a drafted token's position is
 * at most n_ctx - 1, and a full source proposes nothing. */
static void n_ctx_bounds_drafts(void **state) {
    const int       n_ctx = 40;
    ag_draft_model *dm = open_self(1, n_ctx);
    assert_int_equal(ag_draft_model_n_ctx(dm), n_ctx);
    ag_draft_model_set_p_min(dm, 0);
    ag_draft_source *s = greedy_source(dm);
    assert_int_equal(s->ops->prefill(s, k_prompt, N_PROMPT), AG_OK);
    int     h = N_PROMPT;
    int32_t feed = 300, out[8];
    int     rounds = 0, total = 0;
    for (; rounds < 10; rounds++) {
        h += 1;
        int d = s->ops->draft(s, &feed, 1, 8, out, NULL);
        assert_true(d >= 0);
        if (d > 0) assert_true(h + d <= n_ctx); /* the last draft sits at position h + d - 1 */
        if (h < n_ctx) assert_int_equal(d, h + 8 <= n_ctx ? 8 : n_ctx - h);
        else assert_int_equal(d, 0);
        total += d;
        s->ops->commit(s, d, d);
        h += d;
        if (d == 0) break;
    }
    assert_true(h >= n_ctx);
    assert_true(total > 0);
    ag_draft_free(s);
    /* n_ctx beyond n_ctx_train is clamped */
    ag_draft_model_close(dm);
    dm = open_self(1, 1 << 20);
    assert_int_equal(ag_draft_model_n_ctx(dm), ag_model_config_of(g_model)->n_ctx_train);
    ag_draft_model_close(dm);
}

/* ---- temperature > 0 ---- */

/* Builds a tokenizer from stories260K's vocabulary with `n` tokens: the
 * first min(n, 512) as in the file (token `changed`, if >= 0, renamed), and
 * the rest extra control tokens "<|extra_i|>". */
static ag_tok *derived_tok(int n, int changed) {
    ag_gguf *g = NULL;
    assert_int_equal(ag_gguf_open(g_path, &g), AG_OK);
    const ag_gguf_value *scores = ag_gguf_get(g, "tokenizer.ggml.scores");
    const char         **text = calloc((size_t)n, sizeof *text);
    uint32_t            *len = calloc((size_t)n, sizeof *len);
    float               *sc = calloc((size_t)n, sizeof *sc);
    int32_t             *ty = calloc((size_t)n, sizeof *ty);
    char(*extra)[32] = calloc((size_t)n, sizeof *extra);
    const int base = ag_tok_n_vocab(g_tok);
    for (int i = 0; i < n; i++) {
        if (i < base) {
            size_t l;
            text[i] = ag_tok_text(g_tok, i, &l);
            len[i] = (uint32_t)l;
            double v = 0;
            if (scores) ag_gguf_arr_f64(scores, (uint64_t)i, &v);
            sc[i] = (float)v;
            uint32_t a = ag_tok_attr(g_tok, i);
            ty[i] = a & AG_TOK_ATTR_CONTROL   ? AG_TOK_TYPE_CONTROL
                    : a & AG_TOK_ATTR_BYTE    ? AG_TOK_TYPE_BYTE
                    : a & AG_TOK_ATTR_UNKNOWN ? AG_TOK_TYPE_UNKNOWN
                                              : AG_TOK_TYPE_NORMAL;
        } else {
            snprintf(extra[i], sizeof extra[i], "<|extra_%d|>", i);
            text[i] = extra[i];
            len[i] = (uint32_t)strlen(extra[i]);
            ty[i] = AG_TOK_TYPE_CONTROL;
        }
        if (i == changed) {
            snprintf(extra[i], sizeof extra[i], "changed%d", i);
            text[i] = extra[i];
            len[i] = (uint32_t)strlen(extra[i]);
        }
    }
    ag_tok_spec spec;
    ag_tok_spec_init(&spec);
    spec.model = ag_tok_model(g_tok);
    spec.n_tokens = (uint32_t)n;
    spec.token_text = text;
    spec.token_len = len;
    spec.scores = sc;
    spec.types = ty;
    spec.bos = ag_tok_bos(g_tok);
    spec.eos = ag_tok_eos(g_tok);
    spec.unk = ag_tok_unk(g_tok);
    ag_tok *t = NULL;
    ag_status st = ag_tok_new(&spec, &t);
    if (st) fprintf(stderr, "%s\n", ag_error_message());
    assert_int_equal(st, AG_OK);
    free(text);
    free(len);
    free(sc);
    free(ty);
    free(extra);
    ag_gguf_free(g);
    return t;
}

/* At temperature 0.8 the source is stochastic and every drafted token comes
 * with its q: a distribution over the TARGET vocabulary (here 8 control ids
 * larger than the draft's), with mass on the token and none on ids the
 * draft does not have. The same seed and stream give the same drafts. */
static void sampled_drafts_carry_q(void **state) {
    enum { EXTRA = 8, MAXD = 6 };
    ag_tok *big = derived_tok(512 + EXTRA, -1);
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = 2;
    ag_draft_model *dm = NULL;
    assert_int_equal(ag_draft_model_open(g_path, &mp, big, 2, 512, &dm), AG_OK);
    const int nv = ag_draft_model_n_vocab(dm);
    assert_int_equal(nv, 512 + EXTRA);
    ag_draft_model_set_p_min(dm, 0);

    ag_sample_params sp = ag_sample_default_params();
    sp.temperature = 0.8f;
    sp.seed = 1234;
    sp.logprobs = 1;
    ag_draft_source *a = NULL, *b = NULL;
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 7, 0.5f, &a), AG_OK);
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 7, 0.5f, &b), AG_OK);
    assert_true(a->stochastic);
    assert_true(a->ops->resident_bytes(a) >= 8 * (size_t)nv);

    float  *q = malloc(sizeof(float) * (size_t)nv * (MAXD + 1));
    int32_t out[MAXD], out2[MAXD], feed = 300;
    assert_int_equal(a->ops->prefill(a, k_prompt, N_PROMPT), AG_OK);
    assert_int_equal(b->ops->prefill(b, k_prompt, N_PROMPT), AG_OK);
    int n_checked = 0;
    for (int round = 0; round < 5; round++) {
        for (size_t i = 0; i < (size_t)nv * (MAXD + 1); i++) q[i] = -1.0f; /* sentinel */
        int d = a->ops->draft(a, &feed, 1, MAXD, out, q);
        int d2 = b->ops->draft(b, &feed, 1, MAXD, out2, NULL);
        assert_int_equal(d, MAXD);
        assert_int_equal(d2, d);
        assert_memory_equal(out, out2, sizeof(int32_t) * (size_t)d);
        for (int i = 0; i < d; i++) {
            const float *qi = q + (size_t)i * nv;
            double       sum = 0;
            int          nz = 0;
            for (int v = 0; v < nv; v++) {
                assert_true(qi[v] >= 0.0f);
                sum += qi[v];
                nz += qi[v] > 0;
            }
            assert_true(fabs(sum - 1.0) < 1e-4);
            assert_true(nz > 1);
            assert_true(qi[out[i]] > 0.0f);
            for (int v = 512; v < nv; v++) assert_true(qi[v] == 0.0f);
            n_checked++;
        }
        for (size_t i = (size_t)d * nv; i < (size_t)nv * (MAXD + 1); i++) assert_true(q[i] == -1.0f);
        int k = round % 3 == 0 ? d : 1;
        a->ops->commit(a, d, k);
        b->ops->commit(b, d, k);
        feed = 260 + round;
    }
    assert_int_equal(n_checked, 5 * MAXD);
    free(q);
    ag_draft_free(a);
    ag_draft_free(b);
    ag_draft_model_close(dm);
    ag_tok_free(big);
}

/* Drafts read from each row's best candidates (AG_WANT_CANDS: greedy, the
 * argmax and the sum of exponentials; sampled, q from ag_sampler_probs_cands,
 * or the row fetched when a top-k-off cut falls past them) equal drafts read
 * from the rows (the same draft model opened with AUGUR_CANDS=0): the same
 * tokens, confidences and q, bit for bit, round after round with partial
 * acceptances. */
static void cands_drafts_equal_row_drafts(void **state) {
    enum { MAXD = 6, ROUNDS = 8 };
    ag_draft_model *on = open_self(2, 512), *off = NULL;
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = 2;
    setenv("AUGUR_CANDS", "0", 1);
    ag_status st = ag_draft_model_open(g_path, &mp, g_tok, 2, 512, &off);
    unsetenv("AUGUR_CANDS");
    assert_int_equal(st, AG_OK);
    ag_draft_model_set_p_min(on, 0.05f);
    ag_draft_model_set_p_min(off, 0.05f);
    const struct { float temp, top_p, min_p; int top_k; } cfg[] = {
        {0.0f, 1.0f, 0.0f, 0},   {0.8f, 1.0f, 0.0f, 20}, {1.0f, 0.9f, 0.0f, 0}, {0.7f, 0.999f, 0.0f, 0},
        {0.9f, 1.0f, 0.1f, 0},   {1.0f, 1.0f, 0.0f, 0}, /* temperature only: the row on both */
        {0.9f, 1.0f, 1e-9f, 0},  /* a min-p cut past the best 256 of 512: the row fetched */
    };
    const int nv = ag_draft_model_n_vocab(on);
    float    *qa = malloc(sizeof(float) * (size_t)nv * MAXD), *qb = malloc(sizeof(float) * (size_t)nv * MAXD);
    int       drafted = 0;
    for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
        ag_sample_params sp = ag_sample_default_params();
        sp.temperature = cfg[ci].temp;
        sp.top_p = cfg[ci].top_p;
        sp.min_p = cfg[ci].min_p;
        sp.top_k = cfg[ci].top_k;
        sp.seed = 77 + ci;
        ag_draft_source *a = NULL, *b = NULL;
        assert_int_equal(ag_draft_model_source_new(on, &sp, 3, 0.5f, &a), AG_OK);
        assert_int_equal(ag_draft_model_source_new(off, &sp, 3, 0.5f, &b), AG_OK);
        assert_int_equal(a->ops->prefill(a, k_prompt, N_PROMPT), AG_OK);
        assert_int_equal(b->ops->prefill(b, k_prompt, N_PROMPT), AG_OK);
        int32_t feed = 300, out_a[MAXD], out_b[MAXD];
        for (int round = 0; round < ROUNDS; round++) {
            int da = a->ops->draft(a, &feed, 1, MAXD, out_a, qa), db = b->ops->draft(b, &feed, 1, MAXD, out_b, qb);
            assert_int_equal(da, db);
            assert_memory_equal(out_a, out_b, sizeof(int32_t) * (size_t)da);
            float ca[MAXD], cb[MAXD];
            assert_int_equal(ag_draft_model_source_confidence(a, ca, MAXD), da);
            assert_int_equal(ag_draft_model_source_confidence(b, cb, MAXD), da);
            assert_memory_equal(ca, cb, sizeof(float) * (size_t)da);
            if (a->stochastic) assert_memory_equal(qa, qb, sizeof(float) * (size_t)nv * (size_t)da);
            drafted += da;
            int k = da ? (round % 3 == 0 ? da : round % da) : 0;
            a->ops->commit(a, da, k);
            b->ops->commit(b, da, k);
            feed = k < da ? (out_a[k] + 1 + round) % nv : 250 + round; /* a correction, or a bonus */
        }
        ag_draft_free(a);
        ag_draft_free(b);
    }
    print_message("%d drafts compared\n", drafted);
    assert_true(drafted > 100);
    free(qa);
    free(qb);
    ag_draft_model_close(on);
    ag_draft_model_close(off);
}

/* ---- vocabulary check, pool, bytes ---- */

static void expect_refused(const char *path, const ag_tok *target, const char *const *needles) {
    ag_draft_model *dm = (ag_draft_model *)1;
    ag_status       st = ag_draft_model_open(path, NULL, target, 1, 64, &dm);
    assert_int_equal(st, AG_ERR_FORMAT);
    assert_null(dm);
    const char *msg = ag_error_message();
    for (int i = 0; needles[i]; i++) {
        if (!strstr(msg, needles[i])) fail_msg("'%s' not in: %s", needles[i], msg);
    }
}

static void vocab_check_derived(void **state) {
    /* a renamed token in the shared range */
    ag_tok *t = derived_tok(512, 300);
    expect_refused(g_path, t,
                   (const char *const[]){"incompatible with the target", "stories260K.gguf", "token 300 is '",
                                         "in the draft and 'changed300' in the target", NULL});
    ag_tok_free(t);
    /* the draft has 12 more ids than the target, and they are normal text */
    t = derived_tok(500, -1);
    expect_refused(g_path, t, (const char *const[]){"the draft has 512 tokens and the target 500", "token 500",
                                                    "is not a special token", NULL});
    ag_tok_free(t);
}

static void vocab_check_real_pairs(void **state) {
    /* identical files */
    ag_draft_model *dm = open_self(1, 64);
    ag_draft_model_close(dm);
    /* a missing file: the loader's error, named as the draft's */
    dm = (ag_draft_model *)1;
    assert_int_not_equal(ag_draft_model_open("models/no-such-draft.gguf", NULL, g_tok, 1, 64, &dm), AG_OK);
    assert_null(dm);
    assert_true(strncmp(ag_error_message(), "draft model: ", 13) == 0);

    const char *smol = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *qwen = "models/qwen2.5-0.5b-Q4.gguf";
    const char *coder = "models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf";
    int         ran = 0;
    if (access(smol, R_OK) == 0) {
        /* stories260K (SentencePiece, 512) and SmolLM2 (byte-level BPE, 49152) */
        expect_refused(smol, g_tok,
                       (const char *const[]){"SmolLM2-135M-Instruct.Q4_1.gguf", "tokenizer is 'gpt2' in the draft",
                                             "token 0 is '<|endoftext|>' in the draft and '<unk>' in the target",
                                             NULL});
        ran++;
    }
    if (access(qwen, R_OK) == 0) {
        ag_gguf *g = NULL;
        ag_tok  *qt = NULL;
        assert_int_equal(ag_gguf_open(qwen, &g), AG_OK);
        assert_int_equal(ag_tok_from_gguf(g, &qt), AG_OK);
        ag_gguf_free(g);
        ag_model_params mp = ag_model_default_params();
        mp.cpu.n_threads = 2;
        ag_status st = ag_draft_model_open(qwen, &mp, qt, 1, 64, &dm);
        if (st) fail_msg("%s", ag_error_message());
        assert_int_equal(ag_draft_model_n_vocab(dm), ag_tok_n_vocab(qt));
        ag_draft_model_close(dm);
        if (access(coder, R_OK) == 0) {
            /* the Coder 1.5B target with the 0.5B draft */
            ag_tok *ct = NULL;
            assert_int_equal(ag_gguf_open(coder, &g), AG_OK);
            assert_int_equal(ag_tok_from_gguf(g, &ct), AG_OK);
            ag_gguf_free(g);
            st = ag_draft_model_open(qwen, &mp, ct, 1, 64, &dm);
            if (st) fail_msg("%s", ag_error_message());
            ag_draft_model_close(dm);
            ag_tok_free(ct);
        }
        /* and the stories target refuses it */
        expect_refused(qwen, g_tok, (const char *const[]){"qwen2.5-0.5b-Q4.gguf", "in the draft and", NULL});
        ag_tok_free(qt);
        ran++;
    }
    if (ran < 2) skip();
}

/* The pool holds max_seqs sequences; a freed source gives its id back. */
static void pool_has_max_seqs(void **state) {
    ag_draft_model *dm = open_self(2, 128);
    size_t          file = 0;
    {
        ag_gguf *g = NULL;
        assert_int_equal(ag_gguf_open(g_path, &g), AG_OK);
        file = ag_gguf_file_size(g);
        ag_gguf_free(g);
    }
    /* two sequences of 128 positions of KV on top of the mapped file */
    int nl, nh, dk, dv;
    ag_model_kv_shape(g_model, &nl, &nh, &dk, &dv);
    size_t kv_min = 2 * 128 * (size_t)nl * nh * (dk + dv) * 2; /* F16 */
    assert_true(ag_draft_model_resident_bytes(dm) >= file + kv_min);
    assert_true(ag_draft_model_resident_bytes(dm) < file + 4 * kv_min + (1 << 20));

    ag_draft_source *a = greedy_source(dm), *b = greedy_source(dm), *c = NULL;
    ag_sample_params sp = ag_sample_default_params();
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 0, 0.1f, &c), AG_ERR_NOMEM);
    assert_null(c);
    ag_draft_free(a);
    assert_int_equal(ag_draft_model_source_new(dm, &sp, 0, 0.1f, &c), AG_OK);
    /* bad sampling params are the sampler's error */
    ag_draft_source *d = NULL;
    sp.top_p = 2.0f;
    ag_draft_free(b);
    assert_int_not_equal(ag_draft_model_source_new(dm, &sp, 0, 0.1f, &d), AG_OK);
    assert_null(d);
    ag_draft_free(c);
    ag_draft_free(NULL);
    ag_draft_model_close(dm);
    ag_draft_model_close(NULL);
}

int main(void) {
    /* the models loaded here leave NaN in the output rows a device would not
     * copy back (their tokens or candidates computed), so a row read
     * without ag_model_output_row fails these tests on the CPU too */
    setenv("AUGUR_POISON_ROWS", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(self_draft_is_target_greedy),
        cmocka_unit_test(rewind_keeps_proposals_exact),
        cmocka_unit_test(head_prefix_drafts_seen_ids),
        cmocka_unit_test(combined_lookup_first_else_model),
        cmocka_unit_test(penalties_follow_the_history),
        cmocka_unit_test(p_min_stops_at_low_confidence),
        cmocka_unit_test(long_prompt_prefills_in_chunks),
        cmocka_unit_test(long_feed_then_drafts),
        cmocka_unit_test(n_ctx_bounds_drafts),
        cmocka_unit_test(sampled_drafts_carry_q),
        cmocka_unit_test(cands_drafts_equal_row_drafts),
        cmocka_unit_test(vocab_check_derived),
        cmocka_unit_test(vocab_check_real_pairs),
        cmocka_unit_test(pool_has_max_seqs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
