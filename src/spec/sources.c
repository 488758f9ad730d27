/* The built-in draft factories behind `--draft`. See sources.h. */
#include "spec/sources.h"

#include <stdlib.h>
#include <string.h>

#include "base/switches.h"
#include "spec/combined.h"
#include "spec/draft_model.h"
#include "spec/ngram.h"

struct ag_draft_setup {
    ag_draft_factory factory;
    ag_ngram_params  ngram;
    ag_draft_model  *dm;   /* a draft model, else NULL */
    float            cost; /* its decode cost relative to the target's */
    int              min_match; /* with a draft model: prompt lookup drafts first from matches this long; 0 never */
};

static ag_status make_model_source(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out) {
    const ag_draft_setup *s = ctx;
    ag_draft_source      *model, *lookup;
    ag_status             st = ag_draft_model_source_new(s->dm, sp, stream, s->cost, &model);
    if (st || !s->min_match) {
        *out = st ? NULL : model;
        return st;
    }
    if ((st = ag_draft_ngram_new(&s->ngram, &lookup))) {
        ag_draft_free(model);
        return st;
    }
    return ag_draft_combined_new(lookup, model, s->min_match, ag_draft_model_n_vocab(s->dm), out);
}

static size_t plan_model(void *ctx, int n_parallel, int n_ctx) {
    const ag_draft_setup *s = ctx;
    size_t b = ag_draft_model_plan_bytes(s->dm, n_parallel, n_ctx);
    if (s->min_match) /* each sequence's lookup index, and the backlogs (at most its tokens, twice) */
        b += (size_t)n_parallel * (ag_ngram_plan_bytes(&s->ngram, n_ctx, AG_SPEC_MAX_DRAFT) +
                                   2 * sizeof(int32_t) * (size_t)n_ctx);
    return b;
}

/* AUGUR_DRAFT_LOOKUP=0 turns the draft model's lookup off; AUGUR_LOOKUP_MIN_MATCH=N
 * sets its shortest match (tuning; default AG_COMBINED_MIN_MATCH). */
static int lookup_min_match(void) {
    if (ag_switch_off("AUGUR_DRAFT_LOOKUP")) return 0;
    return (int)ag_switch_int("AUGUR_LOOKUP_MIN_MATCH", 1, 1 << 20, AG_COMBINED_MIN_MATCH);
}

static size_t plan_ngram(void *ctx, int n_parallel, int n_ctx) {
    const ag_draft_setup *s = ctx;
    return (size_t)n_parallel * ag_ngram_plan_bytes(&s->ngram, n_ctx, AG_SPEC_MAX_DRAFT);
}

static ag_status make_ngram(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out) {
    (void)sp, (void)stream;
    const ag_draft_setup *s = ctx;
    return ag_draft_ngram_new(&s->ngram, out);
}

ag_status ag_draft_setup_open(const ag_draft_setup_params *p, ag_model *target, const ag_tok *target_tok,
                              ag_draft_setup **out) {
    *out = NULL;
    if (!p->draft || !*p->draft) return ag_errorf(AG_ERR_INVALID, "--draft needs 'ngram' or a draft model's path");
    ag_draft_setup *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    if (!strcmp(p->draft, "ngram")) {
        s->ngram = ag_ngram_default_params();
        s->factory = (ag_draft_factory){.name = "ngram", .make = make_ngram, .ctx = s, .shared_bytes = 0,
                                        .plan_bytes = plan_ngram, .draft_max = AG_NGRAM_DRAFT_MAX};
        *out = s;
        return AG_OK;
    }
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = p->n_threads;
    mp.device = ag_model_device(target); /* the draft runs where the target does */
    ag_status st = ag_draft_model_open(p->draft, &mp, target_tok, p->n_parallel > 0 ? p->n_parallel : 1, p->n_ctx, &s->dm);
    if (!st && ag_draft_model_n_vocab(s->dm) != ag_model_config_of(target)->n_vocab)
        /* the verify rule reads q rows of the target's logits width */
        st = ag_errorf(AG_ERR_FORMAT,
                       "draft model %s: the target has %d logits per token but its tokenizer %d tokens; a draft "
                       "model needs them equal",
                       p->draft, ag_model_config_of(target)->n_vocab, ag_draft_model_n_vocab(s->dm));
    if (st) {
        ag_draft_setup_close(s);
        return st;
    }
    s->cost = ag_draft_model_cost(s->dm, target);
    s->ngram = ag_ngram_default_params();
    s->min_match = lookup_min_match();
    s->factory = (ag_draft_factory){.name = s->min_match ? "draft-model+ngram" : "draft-model", .make = make_model_source, .ctx = s,
                                    .shared_bytes = ag_draft_model_resident_bytes(s->dm), .plan_bytes = plan_model,
                                    /* lookup rounds copy long runs as prompt lookup alone does */
                                    .draft_max = s->min_match ? AG_NGRAM_DRAFT_MAX : 0};
    *out = s;
    return AG_OK;
}

const ag_draft_factory *ag_draft_setup_factory(const ag_draft_setup *s) { return &s->factory; }

void ag_draft_setup_close(ag_draft_setup *s) {
    if (!s) return;
    ag_draft_model_close(s->dm);
    free(s);
}
