/* The engine with the prefix cache on stories260K: a prompt seen before is
 * adopted up to its last token (the last block in part, copied at the
 * first write), also when the request then fills the whole pool, and the
 * output at temperature 0 is the cold one.
 *
 * The rule under test (engine.c, admit and secure_step_blocks): blocks are
 * taken as a sequence grows, and blocks only the cache holds are free
 * space, so a request at the pool's edge still adopts its prefix in part:
 * the copy of the shared partial block is made from a free block, and the
 * original, then the cache's alone, gives way when the request needs it.
 * A pool of 4 blocks (1 sequence of 64 positions) puts a request right at
 * that edge. The reference output is the same engine's first, cold run of
 * the prompt (no cached KV); its equality with cold runs of other engines
 * is what tests/py checks. */
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

#include "engine_testutil.h"


enum { MAX_OUT = 64 };

/* One finished single-choice request. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done;
    int32_t         tok[MAX_OUT];
    int             n, n_cached;
    ag_finish       finish;
} result;

static void on_event(void *user, const ag_gen_event *ev) {
    result *r = user;
    pthread_mutex_lock(&r->mu);
    if (ev->prompt_pos == 0 && ev->token >= 0 && r->n < MAX_OUT) r->tok[r->n++] = ev->token;
    r->n_cached = ev->n_cached;
    if (ev->finish != AG_FINISH_NONE) {
        r->finish = ev->finish;
        r->done = true;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Greedy, ignoring end-of-text: exactly max_tokens tokens. */
static void generate(ag_engine *e, const int32_t *prompt, int n_prompt, int max_tokens, result *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_init(&out->mu, NULL);
    pthread_cond_init(&out->cv, NULL);
    ag_gen_request r = {0};
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.max_tokens = max_tokens;
    r.n_choices = 1;
    r.sample = ag_sample_default_params();
    r.sample.temperature = 0;
    r.ignore_eos = true;
    r.cb = on_event;
    r.user = out;
    assert_int_equal(ag_engine_submit(e, &r, NULL), AG_OK);
    pthread_mutex_lock(&out->mu);
    while (!out->done) pthread_cond_wait(&out->cv, &out->mu);
    pthread_mutex_unlock(&out->mu);
    pthread_mutex_destroy(&out->mu);
    pthread_cond_destroy(&out->cv);
    assert_int_equal(out->finish, AG_FINISH_LENGTH);
    assert_int_equal(out->n, max_tokens);
}

static void partial_prefix_at_the_pools_edge(void **state) {
    ag_engine_params p = ag_engine_default_params();
    p.n_parallel = 1;
    p.n_ctx = 64;
    ag_engine *e = NULL;
    assert_int_equal(ag_engine_new(g_model, g_tok, &p, &e), AG_OK);
    ag_engine_stats st;
    ag_engine_get_stats(e, &st);
    assert_int_equal(st.kv_blocks_free, 4); /* 64 positions, blocks of 16 */
    static const int32_t prompt[37] = {1,   403, 407, 261, 378, 418, 268, 300, 263, 432, 270, 315, 280,
                                       260, 343, 443, 300, 362, 430, 272, 336, 279, 282, 316, 300, 263,
                                       432, 270, 315, 280, 260, 343, 443, 300, 362, 430, 272};
    result cold, r;
    /* 37 + 27 = 64 positions: the request fills the whole pool */
    generate(e, prompt, 37, 27, &cold);
    assert_int_equal(cold.n_cached, 0);
    ag_engine_stats s0 = idle_stats(e, 1);

    /* at the edge: all but the last prompt token is adopted (36), the
     * partial block copied once at the first write; when the request
     * reaches its 4th block the cache's original gives way; no failed
     * reservation, no preemption */
    generate(e, prompt, 37, 27, &r);
    assert_int_equal(r.n_cached, 36);
    assert_memory_equal(r.tok, cold.tok, sizeof(int32_t) * 27);
    ag_engine_stats s1 = idle_stats(e, 2);
    assert_int_equal(s1.kv_cow_copies, s0.kv_cow_copies + 1);
    assert_int_equal(s1.kv_nomem_errors, 0);
    assert_int_equal(s1.preemptions, 0);

    /* and with room to spare, the same */
    generate(e, prompt, 37, 11, &r);
    assert_int_equal(r.n_cached, 36);
    assert_memory_equal(r.tok, cold.tok, sizeof(int32_t) * 11);
    ag_engine_stats s2 = idle_stats(e, 3);
    assert_int_equal(s2.kv_cow_copies, s1.kv_cow_copies + 1);
    assert_int_equal(s2.kv_nomem_errors, 0);
    assert_int_equal(s2.cached_tokens, 36 + 36);
    /* every block a request held is back: what is used, only the cache holds */
    assert_true(s2.kv_blocks_cached > 0);
    ag_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(partial_prefix_at_the_pools_edge),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
