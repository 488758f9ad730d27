/* The built-in draft factories behind `--draft`. See sources.h. */
#include "spec/sources.h"

#include <stdlib.h>
#include <string.h>

#include "spec/ngram.h"

struct ag_draft_setup {
    ag_draft_factory factory;
    ag_ngram_params  ngram;
};

static ag_status make_ngram(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out) {
    (void)sp, (void)stream;
    const ag_draft_setup *s = ctx;
    return ag_draft_ngram_new(&s->ngram, out);
}

ag_status ag_draft_setup_open(const ag_draft_setup_params *p, ag_model *target, const ag_tok *target_tok,
                              ag_draft_setup **out) {
    (void)target, (void)target_tok;
    *out = NULL;
    if (!p->draft || !*p->draft) return ag_errorf(AG_ERR_INVALID, "--draft needs 'ngram' or a draft model's path");
    ag_draft_setup *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    if (!strcmp(p->draft, "ngram")) {
        s->ngram = ag_ngram_default_params();
        s->factory = (ag_draft_factory){.name = "ngram", .make = make_ngram, .ctx = s, .shared_bytes = 0};
        *out = s;
        return AG_OK;
    }
    free(s);
    return ag_errorf(AG_ERR_UNSUPPORTED, "draft models are not supported yet ('%s')", p->draft);
}

const ag_draft_factory *ag_draft_setup_factory(const ag_draft_setup *s) { return &s->factory; }

void ag_draft_setup_close(ag_draft_setup *s) { free(s); }
