/* The engine with speculative decoding on stories260K: whatever a draft
 * source proposes, greedy output must equal plain decoding token for token
 * (single sequence, n > 1, many concurrent sequences, stop strings,
 * end-of-text, max_tokens and the context limit inside a verify window), and
 * sampled output must keep plain sampling's distribution (chi-square), with
 * a deliberately wrong q showing that the test can fail.
 *
 * The reference is the same engine with speculation off; the drafts come
 * from test sources defined here: an "oracle" that knows plain decoding's
 * answer and corrupts a share of its tokens (so windows are partly
 * accepted), and fixed guessers for the sampled runs. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "spec/draft.h"
#include "spec/draft_model.h"
#include "model_testutil.h"

static ag_model *g_model;
static ag_tok   *g_tok;
static int       g_vocab;

static int setup(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    if (load_model_2t(path, &g_model, &g_tok)) return -1;
    g_vocab = ag_model_config_of(g_model)->n_vocab;
    return 0;
}

static int teardown(void **state) {
    ag_tok_free(g_tok);
    ag_model_free(g_model);
    return 0;
}

/* ---- collecting a request's output -------------------------------------- */

#define MAX_OUT 600
#define MAX_CH 4

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             done;
    int             n_choices;
    int32_t         tok[MAX_CH][MAX_OUT];
    int             n[MAX_CH];
    char            text[MAX_CH][4096];
    size_t          text_len[MAX_CH];
    ag_finish       finish[MAX_CH];
    float           lp[MAX_CH][MAX_OUT];   /* each token's logprob (NaN unless asked for) */
    int32_t         alt[MAX_CH][MAX_OUT];  /* its best alternative (-1 unless asked for) */
    int             drafted, accepted;
} collect;

static void on_event(void *user, const ag_gen_event *ev) {
    collect *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->prompt_pos == 0 && ev->token >= 0 && c->n[ev->choice] < MAX_OUT) {
        const int k = c->n[ev->choice]++;
        c->tok[ev->choice][k] = ev->token;
        c->lp[ev->choice][k] = ev->sample ? ev->sample->logprob : NAN;
        c->alt[ev->choice][k] = ev->sample && ev->sample->n_top > 0 ? ev->sample->top[0].token : -1;
    }
    if (ev->len && c->text_len[ev->choice] + ev->len < sizeof c->text[0]) {
        memcpy(c->text[ev->choice] + c->text_len[ev->choice], ev->text, ev->len);
        c->text_len[ev->choice] += ev->len;
    }
    if (ev->finish != AG_FINISH_NONE) {
        c->finish[ev->choice] = ev->finish;
        c->drafted = ev->n_drafted;
        c->accepted = ev->n_accepted;
        if (++c->done == c->n_choices) pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static void collect_init(collect *c, int n_choices) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->n_choices = n_choices;
}

static void collect_wait(collect *c) {
    pthread_mutex_lock(&c->mu);
    while (c->done < c->n_choices) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

typedef struct {
    const int32_t *prompt;
    int            n_prompt;
    int            max_tokens;
    int            n_choices;
    float          temperature;
    float          top_p;
    int            top_k;
    float          min_p;
    int            n_logprobs; /* > 0: logprobs and that many alternatives */
    uint64_t       seed;
    const char    *stop;
    int            spec_max;
    float          rep, freq, pres; /* penalties (rep 0: 1, off) */
    int            last_n;          /* penalty_last_n (0: -1, every accepted token) */
    int            n_bias;          /* > 0: that many tokens biased (some banned) */
} gen_args;

/* A logit bias on end-of-text for every request (0: none), so that greedy
 * stories end by themselves. */
static float g_eos_bias;

static void submit(ag_engine *e, const gen_args *a, collect *out) {
    collect_init(out, a->n_choices ? a->n_choices : 1);
    ag_gen_request r = {0};
    r.prompt = a->prompt;
    r.n_prompt = a->n_prompt;
    r.max_tokens = a->max_tokens;
    r.n_choices = a->n_choices ? a->n_choices : 1;
    r.sample = ag_sample_default_params();
    r.sample.temperature = a->temperature;
    r.sample.top_p = a->top_p > 0 ? a->top_p : 1.0f;
    r.sample.top_k = a->top_k;
    r.sample.min_p = a->min_p;
    r.sample.logprobs = a->n_logprobs > 0;
    r.sample.n_logprobs = a->n_logprobs;
    r.sample.seed = a->seed;
    const char *stops[1] = {a->stop};
    r.stops = stops;
    r.n_stops = a->stop ? 1 : 0;
    r.spec_max = a->spec_max;
    r.sample.repetition_penalty = a->rep > 0 ? a->rep : 1.0f;
    r.sample.frequency_penalty = a->freq;
    r.sample.presence_penalty = a->pres;
    r.sample.penalty_last_n = a->last_n ? a->last_n : -1;
    ag_logit_bias bias[9] = {{ag_tok_eos(g_tok), g_eos_bias}};
    int           nb = g_eos_bias != 0;
    for (int i = 0; i < a->n_bias && nb < 9; i++) /* (ids spread over the stories vocab; a repeated one adds up) */
        bias[nb++] = (ag_logit_bias){(int32_t)((37 * i + 11) % 400), i % 3 == 2 ? -100.0f : (float)(i % 5) - 1.5f};
    if (nb) {
        r.sample.logit_bias = bias;
        r.sample.n_logit_bias = nb;
    }
    r.cb = on_event;
    r.user = out;
    assert_int_equal(ag_engine_submit(e, &r, NULL), AG_OK);
}

static void generate(ag_engine *e, const gen_args *a, collect *out) {
    submit(e, a, out);
    collect_wait(out);
}

/* ---- test draft sources ------------------------------------------------- */

#define MAX_REFS 16
#define REF_LEN 700

/* What plain greedy decoding gives for some prompts: ref[i] = prompt then
 * its continuation. */
typedef struct {
    int32_t ref[MAX_REFS][REF_LEN];
    int     n_ref[MAX_REFS], n_prompt[MAX_REFS];
    int     n_refs;
    double  noise;        /* share of drafted tokens replaced by a wrong one */
    int     eos_every;    /* > 0: every n-th draft proposes end-of-text at its end */
    int     protocol_errors; /* feeds that disagree with the history the executor must have sent */
    int     rounds;
    /* fixed guessers (sampled runs) */
    int32_t guess[4];
    int     n_guess;
    bool    lie_q;        /* claim a uniform q although the guess is deterministic: a broken rule */
} oracle_ctx;

typedef struct {
    ag_draft_source base;
    oracle_ctx     *ctx;
    int             which; /* ref index, -1: none matches */
    int32_t         hist[REF_LEN];
    int             n_hist;
    int32_t         last[AG_SPEC_MAX_DRAFT];
    int             last_d;
    uint64_t        rng;
} oracle_src;

static double rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static ag_status o_prefill(ag_draft_source *s, const int32_t *prompt, int n) {
    oracle_src *o = (oracle_src *)s;
    o->which = -1;
    for (int i = 0; i < o->ctx->n_refs; i++)
        if (o->ctx->n_prompt[i] == n && !memcmp(o->ctx->ref[i], prompt, sizeof(int32_t) * (size_t)n)) o->which = i;
    memcpy(o->hist, prompt, sizeof(int32_t) * (size_t)n);
    o->n_hist = n;
    return AG_OK;
}

static int o_draft(ag_draft_source *s, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs) {
    oracle_src *o = (oracle_src *)s;
    oracle_ctx *c = o->ctx;
    for (int i = 0; i < n_feed && o->n_hist < REF_LEN; i++) {
        /* greedy runs: the output IS the reference, so every fed token must be */
        if (o->which >= 0 && !c->n_guess &&
            (o->n_hist >= c->n_ref[o->which] || c->ref[o->which][o->n_hist] != feed[i]))
            c->protocol_errors++;
        o->hist[o->n_hist++] = feed[i];
    }
    int d = 0;
    if (c->n_guess) { /* a fixed guess for the positions right after the prompt */
        int at = o->n_hist - c->n_prompt[0];
        for (; d < max && at + d >= 0 && at + d < c->n_guess; d++) out[d] = c->guess[at + d];
        if (c->lie_q && probs)
            for (int i = 0; i < d; i++)
                for (int t = 0; t < g_vocab; t++) probs[(size_t)i * (size_t)g_vocab + (size_t)t] = 1.0f / (float)g_vocab;
    } else if (o->which >= 0) {
        const int32_t *ref = c->ref[o->which];
        for (; d < max && o->n_hist + d < c->n_ref[o->which]; d++) {
            out[d] = ref[o->n_hist + d];
            if (rnd(&o->rng) < c->noise) out[d] = (out[d] + 1 + (int32_t)(rnd(&o->rng) * 50)) % g_vocab;
        }
        if (c->eos_every > 0 && d > 0 && ++c->rounds % c->eos_every == 0) out[d - 1] = ag_tok_eos(g_tok);
    }
    memcpy(o->last, out, sizeof(int32_t) * (size_t)d);
    o->last_d = d;
    return d;
}

static void o_commit(ag_draft_source *s, int d, int k) {
    oracle_src *o = (oracle_src *)s;
    if (d != o->last_d || k < 0 || k > d) o->ctx->protocol_errors++;
    for (int i = 0; i < k && o->n_hist < REF_LEN; i++) o->hist[o->n_hist++] = o->last[i];
    o->last_d = 0;
}

static size_t o_bytes(const ag_draft_source *s) { return sizeof(oracle_src); }
static void   o_free(ag_draft_source *s) { free(s); }

static const ag_draft_ops k_oracle_ops = {o_prefill, o_draft, o_commit, o_bytes, o_free};

static ag_status o_make(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out) {
    oracle_src *o = calloc(1, sizeof *o);
    if (!o) return ag_errorf(AG_ERR_NOMEM, "oom");
    oracle_ctx *c = ctx;
    o->base = (ag_draft_source){.ops = &k_oracle_ops, .name = "oracle", .stochastic = c->lie_q,
                                .cost_per_token = 0};
    o->ctx = c;
    o->rng = 0x9E3779B97F4A7C15ULL ^ (stream + 1) * 7919;
    *out = &o->base;
    return AG_OK;
}

/* ---- engines -------------------------------------------------------------- */

static ag_engine *new_engine_on(ag_model *m, const ag_draft_factory *f, int n_parallel, int n_ctx, bool adaptive) {
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = n_parallel;
    p.n_ctx = n_ctx;
    p.draft = f;
    p.spec.draft_max = 6;
    p.spec.adaptive = adaptive;
    p.spec_max_rows = 64;
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(m, g_tok, &p, &e), AG_OK);
    return e;
}

static ag_engine *new_engine(const ag_draft_factory *f, int n_parallel, int n_ctx, bool adaptive) {
    return new_engine_on(g_model, f, n_parallel, n_ctx, adaptive);
}

static int encode(const char *text, int32_t *out, int cap) {
    ag_tok_ids ids = {0};
    assert_int_equal(ag_tok_encode_append(g_tok, text, strlen(text), true, false, &ids), AG_OK);
    int n = (int)ids.n < cap ? (int)ids.n : cap;
    memcpy(out, ids.data, sizeof(int32_t) * (size_t)n);
    ag_tok_ids_free(&ids);
    return n;
}

static const char *k_prompts[MAX_REFS] = {
    "Once upon a time, there was a little girl",  "The dog ran to the park and",
    "Tom had a big red ball. One day",            "Lily and her mom went to the store",
    "The sun was shining. A bird",                "There was a boy named Tim. He liked",
    "One day, a cat saw a fish",                  "Sue wanted to play with her friend",
    "The little car was sad because",             "Ben found a shiny stone in the garden",
    "Mia liked to draw pictures of",              "The old tree in the forest",
    "A small frog lived in a pond",               "Max and Sam were best friends",
    "It was a cold winter day and",               "The princess looked at the moon",
};

/* Fills ctx with plain greedy references (speculation off) for the first n
 * prompts, max_tokens each. */
static void make_refs(oracle_ctx *ctx, int n, int max_tokens, int n_ctx) {
    ag_engine *plain = new_engine(NULL, 4, n_ctx, true);
    ctx->n_refs = n;
    for (int i = 0; i < n; i++) {
        int32_t *ref = ctx->ref[i];
        int      np = encode(k_prompts[i], ref, REF_LEN);
        collect  out;
        gen_args a = {.prompt = ref, .n_prompt = np, .max_tokens = max_tokens};
        generate(plain, &a, &out);
        assert_true(np + out.n[0] <= REF_LEN);
        memcpy(ref + np, out.tok[0], sizeof(int32_t) * (size_t)out.n[0]);
        ctx->n_prompt[i] = np;
        ctx->n_ref[i] = np + out.n[0];
    }
    ag_engine_free(plain);
}

static void expect_ref(const oracle_ctx *ctx, int i, const collect *out, int ch) {
    int np = ctx->n_prompt[i], n = ctx->n_ref[i] - np;
    assert_int_equal(out->n[ch], n);
    for (int j = 0; j < n; j++)
        if (out->tok[ch][j] != ctx->ref[i][np + j]) fail_msg("prompt %d choice %d: token %d is %d, plain gives %d", i, ch, j,
                                                             out->tok[ch][j], ctx->ref[i][np + j]);
}

/* ---- greedy exactness ------------------------------------------------------ */

static void test_greedy_equals_plain(void **state) {
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    make_refs(&ctx, 4, 120, 512);
    ag_draft_factory f = {.name = "oracle", .make = o_make, .ctx = &ctx};
    for (int noise_i = 0; noise_i < 3; noise_i++) {
        ctx.noise = noise_i * 0.3; /* 0: every draft stands; 0.3, 0.6: rejections mid-window */
        ag_engine *e = new_engine(&f, 4, 512, false);
        for (int i = 0; i < 4; i++) {
            collect  out;
            gen_args a = {.prompt = ctx.ref[i], .n_prompt = ctx.n_prompt[i], .max_tokens = 120};
            generate(e, &a, &out);
            expect_ref(&ctx, i, &out, 0);
            assert_true(out.drafted > 0);
            if (noise_i == 0) assert_int_equal(out.accepted, out.drafted);
            else assert_true(out.accepted < out.drafted && out.accepted > 0);
        }
        ag_engine_stats st;
        ag_engine_get_stats(e, &st);
        assert_true(st.spec.rounds > 0 && st.spec.drafted_at[0] >= st.spec.drafted_at[5]);
        ag_engine_free(e);
    }
    assert_int_equal(ctx.protocol_errors, 0);
}

/* 16 sequences at once (n = 1 and n = 4 requests), each carrying its own
 * verify window in the same forward. */
static void test_greedy_concurrent(void **state) {
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    make_refs(&ctx, 16, 60, 256);
    ctx.noise = 0.25;
    ag_draft_factory f = {.name = "oracle", .make = o_make, .ctx = &ctx};
    ag_engine *e = new_engine(&f, 16, 256, true);
    static collect out[16];
    for (int i = 0; i < 16; i++) {
        gen_args a = {.prompt = ctx.ref[i], .n_prompt = ctx.n_prompt[i], .max_tokens = 60};
        submit(e, &a, &out[i]);
    }
    for (int i = 0; i < 16; i++) collect_wait(&out[i]);
    for (int i = 0; i < 16; i++) expect_ref(&ctx, i, &out[i], 0);
    /* n = 4: every choice is greedy, so each equals the reference */
    for (int i = 0; i < 4; i++) {
        gen_args a = {.prompt = ctx.ref[i], .n_prompt = ctx.n_prompt[i], .max_tokens = 60, .n_choices = 4};
        submit(e, &a, &out[i]);
    }
    for (int i = 0; i < 4; i++) {
        collect_wait(&out[i]);
        for (int ch = 0; ch < 4; ch++) expect_ref(&ctx, i, &out[i], ch);
        assert_true(out[i].drafted > 0);
    }
    ag_engine_free(e);
    assert_int_equal(ctx.protocol_errors, 0);
}

/* max_tokens inside a window, max_tokens 1, the context filling up inside
 * a window, end-of-text drafted where plain decoding does not end, and a
 * request that turns speculation off. */
static void test_limits_inside_window(void **state) {
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    make_refs(&ctx, 2, 100, 512);
    ag_draft_factory f = {.name = "oracle", .make = o_make, .ctx = &ctx};
    ag_engine *e = new_engine(&f, 4, 512, false);
    int np = ctx.n_prompt[0];
    for (int mt = 1; mt <= 9; mt++) {
        collect  out;
        gen_args a = {.prompt = ctx.ref[0], .n_prompt = np, .max_tokens = mt};
        generate(e, &a, &out);
        assert_int_equal(out.n[0], mt);
        assert_int_equal(out.finish[0], AG_FINISH_LENGTH);
        assert_memory_equal(out.tok[0], ctx.ref[0] + np, sizeof(int32_t) * (size_t)mt);
    }
    ctx.eos_every = 2;
    collect  out;
    gen_args a = {.prompt = ctx.ref[1], .n_prompt = ctx.n_prompt[1], .max_tokens = 100};
    generate(e, &a, &out);
    expect_ref(&ctx, 1, &out, 0);
    assert_true(out.accepted < out.drafted); /* the drafted EOS tokens were rejected */
    ctx.eos_every = 0;
    a.spec_max = -1; /* "speculative": false */
    generate(e, &a, &out);
    expect_ref(&ctx, 1, &out, 0);
    assert_int_equal(out.drafted, 0);
    ag_engine_free(e);

    /* context of 48 tokens: generation runs until it is full */
    static oracle_ctx small;
    memset(&small, 0, sizeof small);
    make_refs(&small, 1, 0, 48);
    ag_draft_factory fs = {.name = "oracle", .make = o_make, .ctx = &small};
    e = new_engine(&fs, 2, 48, false);
    gen_args b = {.prompt = small.ref[0], .n_prompt = small.n_prompt[0], .max_tokens = 0};
    generate(e, &b, &out);
    expect_ref(&small, 0, &out, 0);
    assert_int_equal(small.n_ref[0], 48);
    assert_int_equal(out.finish[0], AG_FINISH_LENGTH);
    assert_true(out.drafted > 0);
    ag_engine_free(e);
    assert_int_equal(ctx.protocol_errors + small.protocol_errors, 0);
}

/* A greedy story that ends by itself (end-of-text accepted inside a
 * window: nothing after it may leak), and a stop string whose text spans
 * several accepted draft tokens. */
static void test_eos_and_stop_strings(void **state) {
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    /* stories260K's greedy stories loop forever; a bias on end-of-text makes
     * some of them end after a sentence or two */
    g_eos_bias = 18.0f;
    make_refs(&ctx, 16, 400, 512);
    ag_draft_factory f = {.name = "oracle", .make = o_make, .ctx = &ctx};
    ag_engine *e = new_engine(&f, 4, 512, false);
    ag_engine *plain = new_engine(NULL, 4, 512, false);
    int ended = 0;
    for (int i = 0; i < 16; i++) {
        collect  out;
        gen_args a = {.prompt = ctx.ref[i], .n_prompt = ctx.n_prompt[i], .max_tokens = 400};
        generate(e, &a, &out);
        expect_ref(&ctx, i, &out, 0);
        if (out.finish[0] == AG_FINISH_STOP) {
            ended++;
            assert_true(ag_tok_is_eog(g_tok, out.tok[0][out.n[0] - 1]));
        }
        /* a stop string made of the text of output tokens 5..7 */
        char   stop[256];
        ag_buf piece = {0};
        assert_int_equal(ag_tok_decode(g_tok, ctx.ref[i] + ctx.n_prompt[i] + 5, 3, 0, &piece), AG_OK);
        snprintf(stop, sizeof stop, "%s", ag_buf_cstr(&piece));
        ag_buf_free(&piece);
        if (strlen(stop) < 3) continue;
        collect outp, outs;
        gen_args b = {.prompt = ctx.ref[i], .n_prompt = ctx.n_prompt[i], .max_tokens = 400, .stop = stop};
        generate(plain, &b, &outp);
        generate(e, &b, &outs);
        assert_int_equal(outs.finish[0], outp.finish[0]);
        assert_int_equal(outs.text_len[0], outp.text_len[0]);
        assert_memory_equal(outs.text[0], outp.text[0], outp.text_len[0]);
        assert_null(strstr(outs.text[0], stop));
    }
    printf("   %d of 16 stories ended with end-of-text\n", ended);
    assert_true(ended > 0); /* some stories end with end-of-text */
    g_eos_bias = 0;
    ag_engine_free(plain);
    ag_engine_free(e);
    assert_int_equal(ctx.protocol_errors, 0);
}

/* ---- distribution ----------------------------------------------------------- */

/* Two-sample chi-square homogeneity statistic over token histograms a and b
 * (same number of draws), merging tokens seen fewer than 10 times in all
 * into one bin; returns the statistic and sets *df. */
static double chi2_two_sample(const int *a, const int *b, int n, int *df) {
    double stat = 0;
    int    bins = 0, ra = 0, rb = 0;
    for (int t = 0; t < n; t++) {
        if (a[t] + b[t] < 10) {
            ra += a[t];
            rb += b[t];
            continue;
        }
        double e = (a[t] + b[t]) / 2.0;
        stat += (a[t] - e) * (a[t] - e) / e + (b[t] - e) * (b[t] - e) / e;
        bins++;
    }
    if (ra + rb >= 10) {
        double e = (ra + rb) / 2.0;
        stat += (ra - e) * (ra - e) / e + (rb - e) * (rb - e) / e;
        bins++;
    }
    *df = bins - 1;
    return stat;
}

/* Critical value of chi-square(df) at p = 0.001 (Wilson-Hilferty). */
static double chi2_crit(int df) {
    double k = df, z = 3.09;
    double t = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
    return k * t * t * t;
}

/* Histograms of output tokens 2 and 3 (the first two verified positions)
 * over `runs` seeds. */
static void sample_hist(ag_engine *e, const int32_t *prompt, int np, int runs, uint64_t seed0, int *h2, int *h3) {
    for (int s = 0; s < runs; s++) {
        collect  out;
        gen_args a = {.prompt = prompt, .n_prompt = np, .max_tokens = 3, .temperature = 0.8f, .top_p = 0.95f,
                      .seed = seed0 + (uint64_t)s};
        generate(e, &a, &out);
        assert_int_equal(out.n[0], 3);
        h2[out.tok[0][1]]++;
        h3[out.tok[0][2]]++;
    }
}

static void test_sampling_distribution(void **state) {
    enum { RUNS = 1500 };
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    /* a prompt whose next tokens are far from certain */
    const char *saved = k_prompts[0];
    k_prompts[0] = "Once upon a time, there was a";
    make_refs(&ctx, 1, 4, 256);
    k_prompts[0] = saved;
    const int32_t *prompt = ctx.ref[0];
    int            np = ctx.n_prompt[0];
    /* the guess: the greedy continuation, likely but far from certain at 0.8 */
    ctx.n_guess = 3;
    memcpy(ctx.guess, prompt + np, sizeof(int32_t) * 3);
    ag_draft_factory f = {.name = "guess", .make = o_make, .ctx = &ctx};

    int *h[6];
    for (int i = 0; i < 6; i++) h[i] = calloc((size_t)g_vocab, sizeof(int));
    ag_engine *plain = new_engine(NULL, 4, 256, false);
    sample_hist(plain, prompt, np, RUNS, 1000, h[0], h[1]);
    ag_engine_free(plain);
    ag_engine *e = new_engine(&f, 4, 256, false);
    sample_hist(e, prompt, np, RUNS, 500000, h[2], h[3]);
    ag_engine_stats st;
    ag_engine_get_stats(e, &st);
    ag_engine_free(e);
    assert_true(st.spec.drafted > RUNS / 2);
    assert_true(st.spec.accepted > 0 && st.spec.accepted < st.spec.drafted);

    int    df;
    double x2 = chi2_two_sample(h[0], h[2], g_vocab, &df);
    assert_true(df >= 2);
    printf("   token 2: chi2 %.1f df %d (crit %.1f)\n", x2, df, chi2_crit(df));
    assert_true(x2 < chi2_crit(df));
    double x3 = chi2_two_sample(h[1], h[3], g_vocab, &df);
    printf("   token 3: chi2 %.1f df %d (crit %.1f)\n", x3, df, chi2_crit(df));
    assert_true(x3 < chi2_crit(df));

    /* A broken rule: the source claims its deterministic guess came from a
     * uniform q, so p/q > 1 accepts it almost always. The test must see it. */
    ctx.lie_q = true;
    e = new_engine(&f, 4, 256, false);
    sample_hist(e, prompt, np, RUNS, 900000, h[4], h[5]);
    ag_engine_free(e);
    double xb = chi2_two_sample(h[0], h[4], g_vocab, &df);
    printf("   broken rule, token 2: chi2 %.1f df %d (crit %.1f)\n", xb, df, chi2_crit(df));
    assert_true(xb > chi2_crit(df));
    for (int i = 0; i < 6; i++) free(h[i]);
}

static ag_status self_make(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out) {
    return ag_draft_model_source_new(ctx, sp, stream, 0.0f, out);
}

/* Sampled verify windows decided from each row's best candidates
 * (AG_WANT_CANDS: the backend finds them, ag_sampler_probs_cands and
 * ag_sampler_verify_cands decide) give what the rows give (a model loaded
 * with AUGUR_CANDS=0): the same tokens, logprobs and alternatives, seed by
 * seed, with drafts accepted and rejected (an oracle with noise: one-hot
 * q; the model drafting for itself: its q, mostly accepted) and with top-k,
 * top-p with top-k off (its cut among the candidates), a min-p so low that
 * its cut falls past them (the row is fetched: main poisons the rows a
 * device would not copy back, so a missed fetch reads NaN), min-p with
 * top-k, greedy with logprobs, and n = 2. */
static void test_sampled_windows_from_candidates(void **state) {
    static oracle_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    make_refs(&ctx, 4, 80, 512);
    ctx.noise = 0.2;
    char             path[4096];
    ag_model        *rows_model = NULL;
    ag_draft_model  *self = NULL;
    stories_path(path, sizeof path);
    assert_int_equal(ag_draft_model_open(path, NULL, g_tok, 8, 512, &self), AG_OK);
    ag_draft_model_set_p_min(self, 0.0f);
    const ag_draft_factory fs[2] = {{.name = "oracle", .make = o_make, .ctx = &ctx},
                                    {.name = "self", .make = self_make, .ctx = self}};
    setenv("AUGUR_CANDS", "0", 1);
    int bad = load_model_2t(path, &rows_model, NULL);
    unsetenv("AUGUR_CANDS");
    assert_int_equal(bad, 0);
    assert_true(ag_model_can_cands(g_model) && !ag_model_can_cands(rows_model));
    const gen_args cases[] = {
        {.temperature = 0.5f, .top_k = 20, .n_logprobs = 2},
        {.temperature = 0.8f, .top_p = 0.95f},
        {.temperature = 1.0f, .min_p = 1e-30f, .n_logprobs = 1}, /* the 256th above a min-p this low: rows fetched (1777 here) */
        {.temperature = 0.6f, .min_p = 0.05f, .top_k = 40},
        {.temperature = 0.0f, .n_logprobs = 3},
        {.temperature = 0.7f, .top_k = 8, .n_choices = 2},
        /* bias and penalties: the rows edited where the logits are (the
         * other engine: AUGUR_EDITS=0, the samplers apply them to raw rows) */
        {.temperature = 0.8f, .top_p = 0.95f, .rep = 1.3f, .freq = 0.4f, .pres = 0.2f, .n_bias = 6},
        {.temperature = 0.0f, .rep = 1.5f, .n_bias = 4}, /* the argmax */
        {.temperature = 0.9f, .freq = 0.7f, .pres = -0.4f, .last_n = 8, .n_logprobs = 2}, /* picked, logprobs */
        {.temperature = 1.0f, .rep = 0.8f, .n_bias = 3}, /* picked (a penalty below 1 raises repeats) */
        {.temperature = 0.7f, .top_k = 12, .freq = 1.0f, .n_choices = 2, .n_bias = 2},
    };
    int drafted[2] = {0}, accepted[2] = {0};
    for (size_t ci = 0; ci < 2 * sizeof cases / sizeof *cases; ci++) {
        const int  fi = ci % 2;
        const ag_draft_factory *f = &fs[fi];
        ag_engine *on = new_engine(f, 4, 512, false);
        setenv("AUGUR_EDITS", "0", 1);
        ag_engine *off = new_engine_on(rows_model, f, 4, 512, false);
        unsetenv("AUGUR_EDITS");
        for (int i = 0; i < 4; i++) {
            gen_args a = cases[ci / 2];
            a.prompt = ctx.ref[i];
            a.n_prompt = ctx.n_prompt[i];
            a.max_tokens = 60;
            a.seed = 40 + (uint64_t)(ci * 4 + (size_t)i);
            static collect x, y;
            generate(on, &a, &x);
            generate(off, &a, &y);
            for (int ch = 0; ch < (a.n_choices ? a.n_choices : 1); ch++) {
                assert_int_equal(x.n[ch], y.n[ch]);
                assert_memory_equal(x.tok[ch], y.tok[ch], sizeof(int32_t) * (size_t)x.n[ch]);
                assert_memory_equal(x.lp[ch], y.lp[ch], sizeof(float) * (size_t)x.n[ch]);
                assert_memory_equal(x.alt[ch], y.alt[ch], sizeof(int32_t) * (size_t)x.n[ch]);
                if (a.n_logprobs > 0)
                    for (int j = 0; j < x.n[ch]; j++) assert_true(x.lp[ch][j] <= 0.0f && x.alt[ch][j] >= 0);
            }
            assert_int_equal(x.drafted, y.drafted);
            drafted[fi] += x.drafted;
            accepted[fi] += x.accepted;
        }
        ag_engine_free(on);
        ag_engine_free(off);
    }
    printf("   oracle: %d drafted, %d accepted; self-draft: %d drafted, %d accepted\n", drafted[0], accepted[0],
           drafted[1], accepted[1]);
    assert_true(drafted[0] > 200 && accepted[0] > 50 && accepted[0] < drafted[0] - 50);
    assert_true(drafted[1] > 200 && accepted[1] > drafted[1] / 2); /* q = p: all stand */
    ag_model_free(rows_model);
    ag_draft_model_close(self);
}

/* The adaptive length follows the step-cost curve the engine measures,
 * not a slope: at the prior acceptance (0.6), a curve flat up to 7 rows
 * then steep drafts 7; NULL (1 + 0.1 d) drafts 3; a steep curve (1 + 2 d)
 * drafts nothing. A source that always proposes as much as it may. */
static ag_status f_prefill(ag_draft_source *s, const int32_t *prompt, int n) { return AG_OK; }
static int       f_draft(ag_draft_source *s, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs) {
    for (int i = 0; i < max; i++) out[i] = 1;
    return max;
}
static void   f_commit(ag_draft_source *s, int d, int k) {}
static size_t f_bytes(const ag_draft_source *s) { return sizeof *s; }
static void   f_free(ag_draft_source *s) { free(s); }
static const ag_draft_ops k_full_ops = {f_prefill, f_draft, f_commit, f_bytes, f_free};

static void test_length_follows_step_cost(void **state) {
    ag_spec_params p = ag_spec_default_params();
    p.draft_max = 16;
    p.verify_row_cost = 0.1f;
    float flat[17], steep[17];
    for (int d = 0; d <= 16; d++) flat[d] = d <= 7 ? 1.0f : 5.0f, steep[d] = 1.0f + 2.0f * (float)d;
    const float  *curves[] = {flat, NULL, steep};
    const int     want[] = {7, 3, 0};
    const int32_t out[1] = {5};
    for (int i = 0; i < 3; i++) {
        ag_draft_source *src = calloc(1, sizeof *src);
        assert_non_null(src);
        *src = (ag_draft_source){.ops = &k_full_ops, .name = "full"};
        ag_spec_seq *seq;
        assert_int_equal(ag_spec_seq_new(src, &p, 32, &seq), AG_OK);
        assert_int_equal(ag_spec_prefill(seq, out, 1), AG_OK);
        int d = ag_spec_propose(seq, out, 1, 16, curves[i]);
        if (d != want[i]) fail_msg("curve %d: drafted %d, want %d", i, d, want[i]);
        ag_spec_seq_free(seq);
    }
}

int main(void) {
    /* the models loaded here leave NaN in the output rows a device would not
     * copy back (their tokens or candidates computed), so a row read
     * without ag_model_output_row fails these tests on the CPU too */
    setenv("AUGUR_POISON_ROWS", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_plain),
        cmocka_unit_test(test_greedy_concurrent),
        cmocka_unit_test(test_limits_inside_window),
        cmocka_unit_test(test_eos_and_stop_strings),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_sampled_windows_from_candidates),
        cmocka_unit_test(test_length_follows_step_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
