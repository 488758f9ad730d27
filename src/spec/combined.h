/* spec/combined.h: a draft model that lets prompt lookup draft first.
 *
 * On a code edit the output copies long runs of its prompt, where prompt
 * lookup (ngram.h) guesses the next tokens for nothing, and writes new
 * lines, where only a draft model guesses well; a draft model alone pays a
 * forward per drafted token in both. This source owns one of each and asks
 * the lookup first every round: a proposal whose match is at least
 * `min_match` tokens long (ag_ngram_last_match) is drafted as it is (cost
 * 0, one-hot q); otherwise the lookup's proposal is dropped and the draft
 * model drafts.
 *
 * Histories. Both sub-sources follow spec/draft.h's protocol on their own:
 * each draft() of theirs is followed by exactly one commit(). The one that
 * did not draft in a round learns the round's accepted tokens later, as
 * feed before its next draft() (the draft model runs them as one batch, a
 * prompt-rows forward, rather than a step per token).
 *
 * Probabilities. stochastic follows the draft model. In a round the lookup
 * drafted, probs (when non-NULL) get q rows one-hot on each guess (n_vocab
 * floats each), which is the distribution such a token came from, so the
 * verify rule stays exact at any temperature.
 *
 * cost_per_token is the draft model's: the adaptive length plans for the
 * dearer of the two (a lookup round then drafts no more than a model round
 * would; it never drafts past `max` either way). */
#ifndef AG_SPEC_COMBINED_H
#define AG_SPEC_COMBINED_H

#include <stdint.h>

#include "spec/draft.h"

/* The shortest lookup match drafted instead of the model when
 * AUGUR_LOOKUP_MIN_MATCH does not say (see combined.c for why). */
#define AG_COMBINED_MIN_MATCH 4

/* Wraps `lookup` (a prompt-lookup source, ag_draft_ngram_new) and `model`
 * (a draft-model source); takes ownership of both, also on failure (then
 * both are freed). n_vocab: the width of a q row (the target's logits).
 * min_match >= 1. AG_ERR_INVALID for a NULL or wrong-kind source or a bad
 * argument, AG_ERR_NOMEM, each with a message. */
ag_status ag_draft_combined_new(ag_draft_source *lookup, ag_draft_source *model, int min_match, int32_t n_vocab,
                                ag_draft_source **out);

/* Rounds in which the lookup (*by_lookup) and the model (*by_model) drafted
 * since the source was made; for tests and logs. */
void ag_draft_combined_counts(const ag_draft_source *s, int64_t *by_lookup, int64_t *by_model);

#endif
