/* The engine's scheduling on stories260K (engine.c: prompt_budget, admit,
 * secure_step_blocks, preempt, resume_swapped):
 *   - with a latency target, prompts that arrive while a stream decodes
 *     enter whole, many in one step; without one, n_prefill_decoding
 *     tokens a step, as on a CPU by default;
 *   - a pool too small for every request at once queues the rest (none is
 *     refused), and each output is the one it gets alone;
 *   - running sequences that outgrow the pool get the newest preempted:
 *     its KV goes to host memory and comes back bit for bit, so its greedy
 *     output (and every other's) equals the one it gets alone, also for a
 *     request of two choices sharing their prompt's blocks.
 * The reference outputs are the same engine's solo runs; their equality
 * with other engines' and with llama.cpp's logits is what test_forward
 * and tests/py check. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/kv.h"
#include "engine_testutil.h"


enum { MAX_OUT = 256, MAX_CHOICES = 2 };

/* One request's events, collected on the engine thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             n_choices, finals;
    int32_t         tok[MAX_CHOICES][MAX_OUT];
    int             n[MAX_CHOICES];
    ag_finish       finish[MAX_CHOICES];
    int             first_at, final_at; /* event numbers (g_events) of the first token and the last final */
} result;

/* Events of every request, in the order the engine sent them. */
static int g_events;

static void on_event(void *user, const ag_gen_event *ev) {
    result *r = user;
    pthread_mutex_lock(&r->mu);
    int c = ev->choice;
    const int at = ++g_events; /* (callbacks all run on the engine thread) */
    if (ev->prompt_pos == 0 && ev->token >= 0 && r->n[c] < MAX_OUT) r->tok[c][r->n[c]++] = ev->token;
    if (ev->token >= 0 && !r->first_at) r->first_at = at;
    if (ev->finish != AG_FINISH_NONE) r->final_at = at;
    if (ev->finish != AG_FINISH_NONE) {
        if (ev->finish == AG_FINISH_ERROR) fprintf(stderr, "choice %d failed: %s\n", c, ev->error);
        r->finish[c] = ev->finish;
        r->finals++;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* A prompt of n tokens from seed (BOS, then tokens of the vocabulary). */
static void make_prompt(int32_t *out, int n, int seed) {
    out[0] = 1;
    for (int i = 1; i < n; i++) out[i] = 260 + (seed * 37 + i * 11) % 200;
}

/* Submits a greedy request that ignores end-of-text (exactly max_tokens
 * tokens per choice) without waiting; its id into *id when id is given. */
static void submit_id(ag_engine *e, const int32_t *prompt, int n_prompt, int max_tokens, int n_choices, result *out,
                      uint64_t *id) {
    memset(out, 0, sizeof *out);
    pthread_mutex_init(&out->mu, NULL);
    pthread_cond_init(&out->cv, NULL);
    out->n_choices = n_choices;
    ag_gen_request r = {0};
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.max_tokens = max_tokens;
    r.n_choices = n_choices;
    r.sample = ag_sample_default_params();
    r.sample.temperature = 0;
    r.ignore_eos = true;
    r.cb = on_event;
    r.user = out;
    assert_int_equal(ag_engine_submit(e, &r, id), AG_OK);
}

static void submit(ag_engine *e, const int32_t *prompt, int n_prompt, int max_tokens, int n_choices, result *out) {
    submit_id(e, prompt, n_prompt, max_tokens, n_choices, out, NULL);
}

static void wait_done(result *out, int max_tokens) {
    pthread_mutex_lock(&out->mu);
    while (out->finals < out->n_choices) pthread_cond_wait(&out->cv, &out->mu);
    pthread_mutex_unlock(&out->mu);
    pthread_mutex_destroy(&out->mu);
    pthread_cond_destroy(&out->cv);
    for (int c = 0; c < out->n_choices; c++) {
        assert_int_equal(out->finish[c], AG_FINISH_LENGTH);
        assert_int_equal(out->n[c], max_tokens);
    }
}

/* Waits until the request has its first token (it is decoding). */
static void wait_first(result *out) {
    for (int guard = 0; guard < 20000; guard++) {
        pthread_mutex_lock(&out->mu);
        int n = out->n[0];
        pthread_mutex_unlock(&out->mu);
        if (n > 0) return;
        usleep(500);
    }
    fail_msg("the request never started decoding");
}

/* The KV bytes of a pool of n blocks for this model. */
static size_t pool_of(int n_blocks) {
    ag_kv_params kp = ag_kv_default_params();
    ag_model_kv_shape(g_model, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
    ag_kv_layout lay;
    assert_int_equal(ag_kv_layout_for(&kp, &lay, NULL), AG_OK);
    return (size_t)n_blocks * lay.block_bytes;
}

/* An engine of n_parallel sequences of 128 positions over a pool of
 * n_blocks blocks (the prefix cache as asked). */
static ag_engine *pool_engine(int n_parallel, int n_blocks, bool prefix_cache) {
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = n_parallel;
    p.n_ctx = 128;
    p.kv_bytes = pool_of(n_blocks);
    p.prefix_cache = prefix_cache;
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(g_model, g_tok, &p, &e), AG_OK);
    return e;
}

/* Greedy output of one request alone (a fresh engine of its own, no prefix
 * cache): the reference. */
static void solo(const int32_t *prompt, int n_prompt, int max_tokens, int32_t *out) {
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = 1;
    p.n_ctx = 256;
    p.prefix_cache = false;
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(g_model, g_tok, &p, &e), AG_OK);
    result r;
    submit(e, prompt, n_prompt, max_tokens, 1, &r);
    wait_done(&r, max_tokens);
    memcpy(out, r.tok[0], sizeof(int32_t) * (size_t)max_tokens);
    ag_engine_free(e);
}

/* Six 30-token prompts submitted while one stream decodes. */
static int mixed_prompt_tokens(double itl_target_ms) {
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = 8;
    p.n_ctx = 256;
    p.n_prefill_decoding = 4;
    p.itl_target_ms = itl_target_ms;
    p.prefix_cache = false;
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(g_model, g_tok, &p, &e), AG_OK);
    int32_t first[2] = {1, 403};
    result  a, b[6];
    int32_t prompts[6][30];
    submit(e, first, 2, 150, 1, &a);
    wait_first(&a);
    for (int i = 0; i < 6; i++) {
        make_prompt(prompts[i], 30, i);
        submit(e, prompts[i], 30, 4, 1, &b[i]);
    }
    for (int i = 0; i < 6; i++) wait_done(&b[i], 4);
    wait_done(&a, 150);
    ag_engine_stats st;
    ag_engine_get_stats(e, &st);
    ag_engine_free(e);
    return st.max_mixed_prompt_tokens;
}

static void latency_target_lets_prompts_in_together(void **state) {
    /* no target (the CPU's default): the floor, 4 prompt tokens beside the decode row */
    int off = mixed_prompt_tokens(-1);
    assert_true(off >= 1 && off <= 4);
    /* a target far above this model's step times: whole prompts, several in one step */
    int on = mixed_prompt_tokens(10000);
    assert_true(on >= 60);
}

static void a_small_pool_queues_requests(void **state) {
    enum { N = 4, PROMPT = 20, OUT = 40 };
    int32_t prompts[N][PROMPT], ref[N][OUT];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], PROMPT, 10 + i);
        solo(prompts[i], PROMPT, OUT, ref[i]);
    }
    /* 8 blocks of 16 positions: two of these 60-position requests at a time */
    ag_engine *e = pool_engine(N, 8, false);
    result r[N];
    for (int i = 0; i < N; i++) submit(e, prompts[i], PROMPT, OUT, 1, &r[i]);
    ag_engine_stats st;
    ag_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_free + st.kv_blocks_used, 8);
    for (int i = 0; i < N; i++) {
        wait_done(&r[i], OUT);
        assert_memory_equal(r[i].tok[0], ref[i], sizeof(int32_t) * OUT);
    }
    st = idle_stats(e, N);
    assert_int_equal(st.kv_nomem_errors, 0);
    ag_engine_free(e);
}

static void outgrown_pool_preempts_and_resumes_exactly(void **state) {
    enum { PROMPT = 10, OUT = 100 };
    int32_t pa[PROMPT], pb[PROMPT], ra[OUT], rb[OUT];
    make_prompt(pa, PROMPT, 21);
    make_prompt(pb, PROMPT, 22);
    solo(pa, PROMPT, OUT, ra);
    solo(pb, PROMPT, OUT, rb);
    /* 8 blocks: each 110-position request (7 blocks) fits alone, both start
     * (3 blocks each), and they outgrow the pool together */
    ag_engine *e = pool_engine(2, 8, true);
    result a, b;
    submit(e, pa, PROMPT, OUT, 1, &a);
    submit(e, pb, PROMPT, OUT, 1, &b);
    wait_done(&a, OUT);
    wait_done(&b, OUT);
    assert_memory_equal(a.tok[0], ra, sizeof ra);
    assert_memory_equal(b.tok[0], rb, sizeof rb);
    ag_engine_stats st = idle_stats(e, 2);
    assert_true(st.preemptions >= 1);
    assert_int_equal(st.swapped, 0);
    assert_int_equal(st.kv_nomem_errors, 0);

    ag_engine_free(e);

    /* two choices that share their prompt's blocks (2 full ones), beside
     * another request: 12 blocks, which the pair alone fills (7 + 5) */
    enum { PROMPT2 = 40, OUT2 = 60 };
    int32_t pc[PROMPT2], rc[OUT2];
    make_prompt(pc, PROMPT2, 23);
    solo(pc, PROMPT2, OUT2, rc);
    e = pool_engine(3, 12, true);
    result c, d;
    submit(e, pc, PROMPT2, OUT2, 2, &c);
    submit(e, pb, PROMPT, OUT, 1, &d);
    wait_done(&c, OUT2);
    wait_done(&d, OUT);
    assert_memory_equal(c.tok[0], rc, sizeof rc);
    assert_memory_equal(c.tok[1], rc, sizeof rc);
    assert_memory_equal(d.tok[0], rb, sizeof rb);
    st = idle_stats(e, 2);
    assert_true(st.preemptions >= 1);
    assert_int_equal(st.kv_nomem_errors, 0);
    ag_engine_free(e);
}

/* Issue 51, item 3: --parallel 8 requests sharing a cached partial block
 * all run at once. The old worst-case booking gave each one block more
 * for its copy of that block, so that 8 x (16 + 1) exceeded the 128-block
 * pool of 8 full contexts and the last one waited for a whole generation;
 * blocks taken as sequences grow (the copy, then one more block each) fit. */
static void every_slot_runs_with_a_shared_partial_block(void **state) {
    enum { N = 8, PROMPT = 37, OUT = 219 };
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = N;
    p.n_ctx = PROMPT + OUT; /* 256 positions, 16 blocks */
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(g_model, g_tok, &p, &e), AG_OK);
    ag_engine_stats st;
    ag_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_free, N * 16);
    int32_t prompt[PROMPT], ref[OUT];
    make_prompt(prompt, PROMPT, 41);
    result warm, r[N];
    submit(e, prompt, PROMPT, OUT, 1, &warm); /* leaves 2 full blocks and a partial one cached */
    wait_done(&warm, OUT);
    memcpy(ref, warm.tok[0], sizeof ref);
    idle_stats(e, 1);
    for (int i = 0; i < N; i++) submit(e, prompt, PROMPT, OUT, 1, &r[i]);
    int last_first = 0, first_final = 1 << 30;
    for (int i = 0; i < N; i++) {
        wait_done(&r[i], OUT);
        assert_memory_equal(r[i].tok[0], ref, sizeof ref);
        if (r[i].first_at > last_first) last_first = r[i].first_at;
        if (r[i].final_at < first_final) first_final = r[i].final_at;
    }
    /* every request had its first token before any of them ended: none waited for a slot's blocks */
    assert_true(last_first < first_final);
    st = idle_stats(e, N + 1);
    assert_int_equal(st.kv_nomem_errors, 0);
    assert_int_equal(st.preemptions, 0);
    assert_int_equal(st.cached_tokens, N * (PROMPT - 1));
    ag_engine_free(e);
}

static void cancel_a_preempted_request(void **state) {
    enum { PROMPT = 10, OUT = 100 };
    int32_t pa[PROMPT], pb[PROMPT], ra[OUT];
    make_prompt(pa, PROMPT, 31);
    make_prompt(pb, PROMPT, 32);
    solo(pa, PROMPT, OUT, ra);
    ag_engine *e = pool_engine(2, 8, true);
    result a, b;
    uint64_t id_b = 0;
    submit(e, pa, PROMPT, OUT, 1, &a);
    submit_id(e, pb, PROMPT, OUT, 1, &b, &id_b);
    /* cancel b once it is swapped out (or, if the race goes the other way, whenever) */
    ag_engine_stats st;
    for (int guard = 0; guard < 20000; guard++) {
        ag_engine_get_stats(e, &st);
        if (st.swapped > 0 || st.requests_finished > 0) break;
        usleep(200);
    }
    ag_engine_cancel(e, id_b);
    pthread_mutex_lock(&b.mu);
    while (b.finals < 1) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    assert_true(b.finish[0] == AG_FINISH_CANCELLED || b.finish[0] == AG_FINISH_LENGTH);
    wait_done(&a, OUT);
    assert_memory_equal(a.tok[0], ra, sizeof ra);
    idle_stats(e, 2);
    ag_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(latency_target_lets_prompts_in_together),
        cmocka_unit_test(a_small_pool_queues_requests),
        cmocka_unit_test(outgrown_pool_preempts_and_resumes_exactly),
        cmocka_unit_test(cancel_a_preempted_request),
        cmocka_unit_test(every_slot_runs_with_a_shared_partial_block),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
