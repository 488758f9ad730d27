/* Helpers shared by the tests that run the tiny model (stories260K, in the
 * shared data directory: $AUGUR_SHARED, else ../shared). Header-only
 * (static), included after cmocka.h by each test program. */
#ifndef AG_TESTS_MODEL_TESTUTIL_H
#define AG_TESTS_MODEL_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "tok/tok.h"

/* The path of stories260K.gguf into out[n]. */
static void stories_path(char *out, size_t n) {
    const char *shared = getenv("AUGUR_SHARED");
    snprintf(out, n, "%s/models/tiny/stories260K.gguf", shared ? shared : "../shared");
}

/* Loads the model at path with 2 CPU threads into *m and, when tok is not
 * NULL, its tokenizer into *tok. 0, or -1 after printing the error (a
 * cmocka group setup's failure). */
static int load_model_2t(const char *path, ag_model **m, ag_tok **tok) {
    ag_model_params p = ag_model_default_params();
    p.cpu.n_threads = 2;
    if (ag_model_load(path, &p, m) || (tok && ag_tok_from_gguf(ag_model_gguf(*m), tok))) {
        fprintf(stderr, "%s\n", ag_error_message());
        return -1;
    }
    return 0;
}

#endif
