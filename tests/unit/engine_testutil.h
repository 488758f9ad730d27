/* What the engine tests on stories260K share (test_engine_cache.c,
 * test_engine_sched.c): the model and tokenizer of the group, its
 * setup/teardown, and waiting for an engine to go idle. Header-only
 * (static), included after cmocka.h. */
#ifndef AG_TESTS_ENGINE_TESTUTIL_H
#define AG_TESTS_ENGINE_TESTUTIL_H

#include <unistd.h>

#include "engine/engine.h"
#include "model_testutil.h"

static ag_model *g_model;
static ag_tok   *g_tok;

static int setup(void **state) {
    char path[4096];
    stories_path(path, sizeof path);
    if (load_model_2t(path, &g_model, &g_tok)) return -1;
    return 0;
}

static int teardown(void **state) {
    ag_tok_free(g_tok);
    ag_model_free(g_model);
    return 0;
}

/* The engine's stats once it is idle after `finished` requests (counted,
 * and its KV counters refreshed, at the end of the step that ended the
 * last one, just after that request's final event): nothing running or
 * preempted, and every block in use held by the prefix cache alone. */
static ag_engine_stats idle_stats(ag_engine *e, uint64_t finished) {
    ag_engine_stats st;
    for (int guard = 0; guard < 5000; guard++) {
        ag_engine_get_stats(e, &st);
        if (st.requests_finished == finished && st.running == 0 && st.swapped == 0 &&
            st.kv_blocks_used == st.kv_blocks_cached)
            return st;
        usleep(1000);
    }
    fail_msg("the engine did not go idle with only cached blocks in use");
    return st;
}

#endif
