/* spec/draft.h: the draft-source interface of speculative decoding.
 *
 * A draft source guesses the next tokens of ONE sequence (one choice of one
 * request). The verify executor (spec/spec.h) is the same for every source:
 * it runs the target over [pending token, drafts...] as decode rows, accepts
 * a prefix with the sampler's verify rule, trims the target's KV and tells
 * the source how many drafts stood. Sources differ only in what fills the
 * draft: prompt lookup (ngram.c), a smaller model (draft_model.c), later
 * learned heads.
 *
 * THE HISTORY PROTOCOL. A source keeps a view of its sequence's tokens, the
 * "history": prompt + every token the output has so far, as far as the
 * source has been told.
 *   prefill(prompt, n)    history = prompt[0..n).
 *   draft(feed, n_feed, max, out, probs)
 *                         history += feed (tokens emitted since the source
 *                         last saw the output: normally the one correction or
 *                         bonus token of the previous round, more after rounds
 *                         that did not draft); then propose d in [0, max]
 *                         tokens that might follow history, into out[0..d).
 *                         Returns d (0 = no guess this round; that is not a
 *                         failure), or -1 on an error (ag_error_message()
 *                         says which): the executor then drops speculation
 *                         for this sequence and decodes plainly.
 *   commit(d, k)          of the d tokens just proposed, the first k (0..d)
 *                         were accepted: history += out[0..k). The rest never
 *                         happened; a source with state (a draft model's KV)
 *                         rewinds it. After k == d the last draft token is in
 *                         the history although a draft model never ran it
 *                         through itself: it must feed it before the next
 *                         bonus/correction token (the "re-feed rule").
 *   Each draft() is followed by exactly one commit() before the next draft().
 *
 * PROBABILITIES. At temperature > 0 the verify rule is exact for any q the
 * draft came from: accept x with min(1, p(x)/q(x)). A source that samples
 * its drafts from a distribution (a draft model at temperature > 0) sets
 * `stochastic` and, when `probs` is non-NULL, writes q_i (n_vocab floats,
 * the full distribution token i was drawn from, after the request's
 * sampling chain) at probs + i * n_vocab. A deterministic source (ngram, a
 * greedy draft model) leaves `stochastic` false and never writes probs: q
 * is one-hot on its guess.
 *
 * COST. `cost_per_token` is the source's drafting cost for one token as a
 * fraction of one target decode step (0 for ngram, about the weight ratio
 * for a draft model); the executor's adaptive length weighs it.
 *
 * Threading: a source is driven by the engine thread only. */
#ifndef AG_SPEC_DRAFT_H
#define AG_SPEC_DRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ag_draft_source ag_draft_source;

typedef struct {
    ag_status (*prefill)(ag_draft_source *s, const int32_t *prompt, int n);
    int (*draft)(ag_draft_source *s, const int32_t *feed, int n_feed, int max, int32_t *out, float *probs);
    void (*commit)(ag_draft_source *s, int d, int k);
    /* Memory this source holds beyond what its shared parts (a draft
     * model's weights, counted once by whoever loaded them) hold. */
    size_t (*resident_bytes)(const ag_draft_source *s);
    void (*free)(ag_draft_source *s); /* NULL-safe through ag_draft_free */
} ag_draft_ops;

/* The common head of every source; a source's own struct embeds it first. */
struct ag_draft_source {
    const ag_draft_ops *ops;
    const char         *name;           /* "ngram", "draft-model", ... (static) */
    bool                stochastic;     /* fills probs at temperature > 0 (see above) */
    float               cost_per_token; /* fraction of a target decode step */
};

static inline void ag_draft_free(ag_draft_source *s) {
    if (s) s->ops->free(s);
}

#endif
