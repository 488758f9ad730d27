/* spec/ngram.h: prompt lookup, the draft source that copies from history.
 *
 * Text that is being generated often repeats text already in the sequence
 * (code being edited, quoted passages, lists, templates). This source guesses
 * that the repetition continues: it finds the end of the history earlier in
 * the history and proposes what followed there. It runs no model, so it is
 * deterministic (stochastic = false, never writes probs) and costs nothing
 * beside the target's verify rows (cost_per_token = 0).
 *
 * THE RULE. Let h[0..L) be the history (spec/draft.h's protocol: prompt plus
 * every output token the source has been told, prompt and output alike are
 * searched). For n = n_max down to n_min, take the suffix g = h[L-n..L); an
 * occurrence is a start p < L-n with h[p..p+n) == g (so it has a next token
 * h[p+n]). The first n with at least one occurrence is used; if none has
 * one, draft() proposes nothing (returns 0).
 *   Of that n-gram's occurrences, the max_candidates most recent (largest p)
 * vote: each votes for its next token h[p+n]. The winning next token is the
 * one with the most votes; a tie goes to the token whose latest voting
 * occurrence is the most recent. The proposal is the history copied forward
 * from the latest occurrence that voted for the winner:
 *   out = h[p+n .. min(p+n+max, L)).
 * It stops at the end of the history (it never extrapolates past it), so it
 * holds between 1 and max tokens.
 *
 * Cost. An incremental index (per n, a hash table from n-gram to its latest
 * occurrence plus a chain to the previous one) makes appending a token
 * O(n_max - n_min + 1) hash updates, and a draft
 * O(n_max - n_min + 1 + max_candidates log max_candidates + max), independent
 * of the history length. Memory is about 4 + 20..36 * (n_max - n_min + 1)
 * bytes per history token (a history slot, a chain link and 2..4 hash slots
 * per distinct n-gram): 1.8 to 3.3 MB per 8k tokens with the defaults, small
 * next to any model's KV for those tokens. resident_bytes reports it.
 *
 * Ownership. prefill() copies the prompt and draft() the feed; neither is
 * read after the call. draft() writes the proposal into the caller's out
 * and keeps its own copy for commit(), so out need not outlive the call.
 *
 * Errors. draft() and prefill() reserve everything the following commit()
 * may need, so commit() never allocates and cannot fail. draft() returns -1
 * (with a message) on bad arguments (n_feed < 0, max < 0, a NULL feed or out
 * where tokens are due), on an allocation failure and past 2^28 tokens, with the
 * history unchanged (the feed is NOT appended) and nothing to commit.
 * prefill() always drops the old history first; on AG_ERR_INVALID (bad
 * arguments), AG_ERR_NOMEM or AG_ERR_RANGE (more than 2^28 tokens) the
 * history is left empty. A commit() whose d does not match the last draft's
 * count is a caller bug: k is clamped to what was proposed, so only tokens
 * that were proposed can ever enter the history. */
#ifndef AG_SPEC_NGRAM_H
#define AG_SPEC_NGRAM_H

#include "spec/draft.h"

typedef struct {
    int n_min;          /* shortest suffix that may match, 1..AG_NGRAM_N_LIMIT */
    int n_max;          /* longest suffix tried first, n_min..AG_NGRAM_N_LIMIT */
    int max_candidates; /* most recent occurrences that vote, 1..AG_NGRAM_CANDIDATES_LIMIT */
} ag_ngram_params;

enum { AG_NGRAM_N_LIMIT = 64, AG_NGRAM_CANDIDATES_LIMIT = 4096 };

/* The draft_max prompt lookup runs with when the user names none
 * (ag_draft_factory.draft_max). Code edits copy runs of dozens of tokens;
 * whole answers to bench/prompts/code_edit ran 1.1-1.2x faster at 16 than
 * at 8 (bench/RESULTS.md, 2026-12-06), and the adaptive length keeps short
 * windows where matches fail early. */
enum { AG_NGRAM_DRAFT_MAX = 16 };

/* Defaults: n_min 2, n_max 12, max_candidates 8 (measurements behind them
 * are in ngram.c beside the function). Pure; no allocation. */
ag_ngram_params ag_ngram_default_params(void);

/* Creates a prompt-lookup source with an empty history. `p` is read during
 * the call only; NULL means the defaults. On success *out owns the source
 * (free it with ag_draft_free) and AG_OK is returned. Parameters outside
 * their ranges above give AG_ERR_RANGE, a NULL `out` AG_ERR_INVALID, and an
 * allocation failure AG_ERR_NOMEM, each with a message; *out is then NULL
 * (unless `out` itself is NULL). */
ag_status ag_draft_ngram_new(const ag_ngram_params *p, ag_draft_source **out);

/* The most a source made with p holds (its resident_bytes) once its history
 * reaches n_tokens tokens, drafting at most max_draft per round: for memory
 * planning. */
size_t ag_ngram_plan_bytes(const ag_ngram_params *p, int32_t n_tokens, int max_draft);

/* The suffix length n (n_min..n_max) whose earlier occurrence the last
 * draft() copied from, or 0 when it proposed nothing (or s is not a
 * prompt-lookup source): how specific the match was. */
int ag_ngram_last_match(const ag_draft_source *s);

#endif
