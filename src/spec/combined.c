/* spec/combined.c: prompt lookup first, else the draft model (combined.h).
 *
 * Why AG_COMBINED_MIN_MATCH is 4. Qwen2.5-0.5B drafting for
 * Qwen2.5-Coder-1.5B on the AMX Xeon, `augur bench --draft ... -t 2`,
 * speed-up over plain in the same process (2026-12-05; the adaptive length
 * follows measured step times, so one run moves by ~0.3):
 *   code edit 04 (full answer, 370 tokens): min match 2 / 4 / 6: 2.33x
 *     (another run 1.66x) / 2.02x / 2.13x; the draft model alone 1.53x;
 *   code edit 02 (630 tokens): 1.48x / 1.68x / 1.66x;
 *   open chat 01 (256 tokens): 0.90x (68% of drafts accepted) / 1.02x
 *     (80%); the draft model alone 0.98x (84%).
 * A 2- or 3-token match in ordinary prose is mostly chance, and there it
 * displaced drafts the model would have got right; from 4 tokens on a
 * match is specific enough to trust over the model. */
#include "spec/combined.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "spec/ngram.h"

enum { BY_NONE, BY_LOOKUP, BY_MODEL };

/* Tokens a sub-source has not been told yet (it gets them as feed). */
typedef struct {
    int32_t *tok;
    int      n, cap;
} backlog;

typedef struct {
    ag_draft_source  base; /* first: the executor sees only this */
    ag_draft_source *lookup, *model;
    int              min_match;
    int32_t          n_vocab;
    backlog          owed[2]; /* [0]: the lookup's, [1]: the model's */
    int32_t         *prop;    /* this round's proposal, [prop_cap] */
    int              prop_cap, d, by;
    bool             lost; /* a backlog could not grow: a sub-source's history would part from the truth */
    int64_t          rounds_lookup, rounds_model;
} combined;

static bool owe(backlog *b, const int32_t *t, int n) {
    if (n <= 0) return true;
    if (b->n + n > b->cap) {
        int      cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        int32_t *nt = realloc(b->tok, sizeof(int32_t) * (size_t)cap);
        if (!nt) return false;
        b->tok = nt;
        b->cap = cap;
    }
    memcpy(b->tok + b->n, t, sizeof(int32_t) * (size_t)n);
    b->n += n;
    return true;
}

static ag_status cb_prefill(ag_draft_source *src, const int32_t *prompt, int n) {
    combined *s = (combined *)src;
    s->owed[0].n = s->owed[1].n = 0;
    s->by = BY_NONE;
    s->d = 0;
    ag_status st = s->lookup->ops->prefill(s->lookup, prompt, n);
    return st ? st : s->model->ops->prefill(s->model, prompt, n);
}

static int cb_draft(ag_draft_source *src, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs) {
    combined *s = (combined *)src;
    s->by = BY_NONE;
    s->d = 0;
    if (s->lost) {
        ag_errorf(AG_ERR_NOMEM, "draft-model+ngram: out of memory for the sources' backlog");
        return -1;
    }
    if (n_feed < 0 || (n_feed > 0 && !feed) || max < 0 || (max > 0 && !out)) {
        ag_errorf(AG_ERR_INVALID, "draft-model+ngram: draft with n_feed %d, max %d", n_feed, max);
        return -1;
    }
    if (max > s->prop_cap) {
        int32_t *np = realloc(s->prop, sizeof(int32_t) * (size_t)max);
        if (!np) {
            ag_errorf(AG_ERR_NOMEM, "draft-model+ngram: out of memory for %d drafts", max);
            return -1;
        }
        s->prop = np;
        s->prop_cap = max;
    }
    if (!owe(&s->owed[0], feed, n_feed) || !owe(&s->owed[1], feed, n_feed)) {
        ag_errorf(AG_ERR_NOMEM, "draft-model+ngram: out of memory for the sources' backlog");
        return -1;
    }
    backlog *bl = &s->owed[0], *bm = &s->owed[1];
    int      d = s->lookup->ops->draft(s->lookup, bl->tok, bl->n, max, out, NULL);
    if (d < 0) return -1; /* (the lookup leaves its history as it was: the backlog stays owed) */
    bl->n = 0;
    if (d > 0 && ag_ngram_last_match(s->lookup) >= s->min_match) {
        s->by = BY_LOOKUP;
        s->rounds_lookup++;
        if (probs && s->base.stochastic) { /* q one-hot on each guess (combined.h) */
            memset(probs, 0, sizeof(float) * (size_t)d * (size_t)s->n_vocab);
            for (int i = 0; i < d; i++) probs[(size_t)i * s->n_vocab + out[i]] = 1.0f;
        }
    } else {
        s->lookup->ops->commit(s->lookup, d, 0); /* its guess is not drafted */
        d = s->model->ops->draft(s->model, bm->tok, bm->n, max, out, probs);
        if (d < 0) return -1;
        bm->n = 0;
        s->by = BY_MODEL;
        s->rounds_model += d > 0;
    }
    if (d > max) d = max;
    memcpy(s->prop, out, sizeof(int32_t) * (size_t)d);
    s->d = d;
    return d;
}

static void cb_commit(ag_draft_source *src, int d, int k) {
    combined *s = (combined *)src;
    (void)d;
    if (k < 0) k = 0;
    if (k > s->d) k = s->d;
    if (s->by == BY_NONE) return; /* no draft() since the last commit */
    ag_draft_source *drafter = s->by == BY_LOOKUP ? s->lookup : s->model;
    backlog         *other = s->by == BY_LOOKUP ? &s->owed[1] : &s->owed[0];
    drafter->ops->commit(drafter, s->d, k);
    /* the other source learns the accepted tokens with its next feed (if
     * that memory is not there, the next draft() fails and the executor
     * decodes this sequence plainly) */
    if (!owe(other, s->prop, k)) s->lost = true;
    s->by = BY_NONE;
    s->d = 0;
}

static size_t cb_resident_bytes(const ag_draft_source *src) {
    const combined *s = (const combined *)src;
    return sizeof *s + sizeof(int32_t) * (size_t)(s->owed[0].cap + s->owed[1].cap + s->prop_cap) +
           s->lookup->ops->resident_bytes(s->lookup) + s->model->ops->resident_bytes(s->model);
}

static void cb_free(ag_draft_source *src) {
    combined *s = (combined *)src;
    if (!s) return;
    ag_draft_free(s->lookup);
    ag_draft_free(s->model);
    free(s->owed[0].tok);
    free(s->owed[1].tok);
    free(s->prop);
    free(s);
}

static const ag_draft_ops combined_ops = {
    .prefill = cb_prefill, .draft = cb_draft, .commit = cb_commit, .resident_bytes = cb_resident_bytes, .free = cb_free};

ag_status ag_draft_combined_new(ag_draft_source *lookup, ag_draft_source *model, int min_match, int32_t n_vocab,
                                ag_draft_source **out) {
    if (out) *out = NULL;
    ag_status st = AG_OK;
    if (!out || !lookup || !model || min_match < 1 || n_vocab < 1)
        st = ag_errorf(AG_ERR_INVALID, "draft-model+ngram: bad arguments");
    else if (strcmp(lookup->name, "ngram") != 0)
        st = ag_errorf(AG_ERR_INVALID, "draft-model+ngram: the first source must be prompt lookup, not '%s'",
                       lookup->name);
    combined *s = st ? NULL : calloc(1, sizeof *s);
    if (!st && !s) st = ag_errorf(AG_ERR_NOMEM, "out of memory");
    if (st) {
        ag_draft_free(lookup);
        ag_draft_free(model);
        return st;
    }
    s->base = (ag_draft_source){.ops = &combined_ops, .name = "draft-model+ngram", .stochastic = model->stochastic,
                                .cost_per_token = model->cost_per_token};
    s->lookup = lookup;
    s->model = model;
    s->min_match = min_match;
    s->n_vocab = n_vocab;
    *out = &s->base;
    return AG_OK;
}

void ag_draft_combined_counts(const ag_draft_source *src, int64_t *by_lookup, int64_t *by_model) {
    const combined *s = src && src->ops == &combined_ops ? (const combined *)src : NULL;
    if (by_lookup) *by_lookup = s ? s->rounds_lookup : 0;
    if (by_model) *by_model = s ? s->rounds_model : 0;
}
