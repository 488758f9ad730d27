/* spec/: speculative decoding. One verify executor for every draft source
 * (draft.h), the adaptive draft length, and the factories the engine uses to
 * give each sequence its own source.
 *
 * One ROUND for one sequence (one choice of a request), driven by the engine:
 *   1. d = ag_spec_propose(seq, output so far, cap): the source drafts
 *      x_1..x_d (0 when it has nothing, when the adaptive length says
 *      drafting does not pay, or when speculation is off for this sequence).
 *   2. The engine forwards the target over [pending, x_1..x_d] as DECODE rows
 *      of the ragged batch (ag_batch: not prompt rows), at positions len ..
 *      len + d, with logits for all d + 1 rows. Decode rows give the same bits
 *      whatever else is in the batch, so row i's logits are exactly those
 *      plain decoding would compute after the same tokens.
 *   3. ag_spec_verify(...) walks the rows in order: row i (prepared by the
 *      sink, e.g. JSON mode's mask) decides the token that follows; for
 *      i < d it is the verify rule on x_{i+1} (greedy: argmax == x; sampled:
 *      accept with min(1, p/q) else draw from norm(max(0, p - q))), for i = d
 *      (every draft accepted) the bonus token is sampled as plain decode
 *      would. Each decided token is accepted into the sampler's penalty
 *      history and handed to the sink at once; the sink may end the choice
 *      (EOS, stop string, length), and then nothing after it is emitted and
 *      the executor touches nothing more of that sequence. After a
 *      rejection (the correction is the last token of the round) or the
 *      bonus, the target's KV is trimmed by the rejected tail and the source
 *      is told commit(d, k).
 * With d = 0 a round is exactly plain decoding: one row, one sampled token.
 *
 * Exactness. Temperature 0: the emitted tokens are those plain decoding gives,
 * token for token (the rows are plain decode's bits and the decision is the
 * same argmax). Temperature > 0: every emitted token is distributed as plain
 * sampling's (the verify rule; q is the source's real distribution when it
 * has one, one-hot otherwise); the RNG draws differ, so the same seed gives a
 * different sample than without speculation.
 *
 * Adaptive length. Each sequence keeps an exponential average of the
 * per-position acceptance rate a. Drafting d tokens yields on average
 * (1 - a^(d+1)) / (1 - a) tokens per target forward and costs
 * step_cost[d] + d * source cost_per_token decode steps; the
 * executor drafts the d in [0, cap] that maximises the ratio (0: plain
 * decoding), and while that is 0 it still probes with a short draft every
 * `probe_every` rounds (every 2 while the estimate is mostly its prior) so
 * a sequence that starts copying is noticed. */
#ifndef AG_SPEC_SPEC_H
#define AG_SPEC_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/kv.h"
#include "sample/sample.h"
#include "spec/draft.h"

#define AG_SPEC_MAX_DRAFT 32 /* longest draft in one round */

typedef struct {
    int   draft_max;       /* most tokens drafted per round (1..AG_SPEC_MAX_DRAFT); default 8
                              (the CLI's and C API's default: ag_draft_factory.draft_max) */
    int   draft_min;       /* a draft shorter than this is not verified (0/1: any); default 0 */
    float verify_row_cost; /* one extra verify row as a fraction of a decode step; default 0.1 (CPU) */
    int   probe_every;     /* rounds between probes while the adaptive length is 0; default 8 */
    bool  adaptive;        /* false: always draft_max (benchmarks, tests); default true */
} ag_spec_params;

ag_spec_params ag_spec_default_params(void);
/* AG_ERR_RANGE with the field named. */
ag_status ag_spec_params_check(const ag_spec_params *p);

/* Counters, per sequence and (summed by the engine) per request and server. */
typedef struct {
    uint64_t rounds;    /* target forwards with d > 0 */
    uint64_t drafted;   /* tokens proposed and verified */
    uint64_t accepted;  /* of those, accepted */
    uint64_t emitted;   /* tokens emitted by rounds with d > 0 (accepted + corrections/bonus) */
    uint64_t drafted_at[AG_SPEC_MAX_DRAFT];  /* rounds that verified position i */
    uint64_t accepted_at[AG_SPEC_MAX_DRAFT]; /* ... and accepted it */
} ag_spec_stats;

/* Adds b's counters to a. */
void ag_spec_stats_add(ag_spec_stats *a, const ag_spec_stats *b);

/* Gives each new sequence its draft source. `make` creates a source for a
 * sequence sampled with `sp` (the request's params; stream = the choice's
 * RNG stream) or fails (the engine then decodes that sequence plainly, with
 * a warning). `shared_bytes` is memory the factory holds for all sequences
 * (a draft model's weights and KV pool): admission counts it once. */
typedef struct {
    const char *name;
    ag_status (*make)(void *ctx, const ag_sample_params *sp, uint64_t stream, ag_draft_source **out);
    void      *ctx;
    size_t     shared_bytes;
    /* Memory planning: the most this factory and n_parallel sources with
     * histories of n_ctx tokens hold, for an engine of that size (its
     * shared_bytes are for the size it was made for). NULL: shared_bytes. */
    size_t (*plan_bytes)(void *ctx, int n_parallel, int n_ctx);
    /* The draft_max this source is tuned for, which the CLI and the C API
     * use when the user names none (0: ag_spec_default_params()'s). Prompt
     * lookup copies long runs verbatim and costs nothing to draft, so it
     * (and a draft model that lets it draft first) asks for longer windows
     * than a draft model alone, whose every token costs a forward. */
    int draft_max;
} ag_draft_factory;

/* f's draft_max, or ag_spec_default_params()'s when f names none. */
int ag_draft_default_max(const ag_draft_factory *f);

typedef struct ag_spec_seq ag_spec_seq;

/* A sequence's speculative state over `src`, which it takes over (freed by
 * ag_spec_seq_free, also on error). */
ag_status ag_spec_seq_new(ag_draft_source *src, const ag_spec_params *p, int32_t n_vocab, ag_spec_seq **out);
void      ag_spec_seq_free(ag_spec_seq *s); /* NULL-safe */

/* Tells the source the prompt (draft.h prefill). Errors come from the
 * source; the caller should then drop speculation for the sequence. */
ag_status ag_spec_prefill(ag_spec_seq *s, const int32_t *prompt, int n);

/* Step 1 of a round. `output`[0..n_output) is every token the sequence has
 * emitted so far (the last one is the pending token); the executor feeds
 * the source what it has not seen. cap: the most tokens this round may
 * draft (room in the batch, max_tokens, context), further limited by the
 * adaptive length and draft_max. Returns d; the drafts are then at
 * ag_spec_drafts(s). step_cost: NULL, or step_cost[d] for d = 0..cap:
 * what the step costs when this sequence verifies d drafts, as a multiple
 * of its plain step (step_cost[0] = 1), measured by the caller on this
 * machine; the cost is rarely linear in d (a SIMD or tile kernel takes
 * several rows for the price of one up to its width, then steps up). NULL:
 * 1 + d * the params' verify_row_cost. A source error drops speculation
 * for this sequence (logged once) and returns 0. */
int            ag_spec_propose(ag_spec_seq *s, const int32_t *output, int n_output, int cap, const float *step_cost);
const int32_t *ag_spec_drafts(const ag_spec_seq *s);
/* The sequence's counters so far (borrowed; valid until ag_spec_seq_free). */
const ag_spec_stats *ag_spec_get_stats(const ag_spec_seq *s);
/* Resident bytes of the sequence's source and its draft buffers. */
size_t ag_spec_resident_bytes(const ag_spec_seq *s);
/* Whether speculation still runs for this sequence (false after a source error). */
bool ag_spec_active(const ag_spec_seq *s);

/* Where the executor sends decided tokens. */
typedef struct {
    /* The row to decide from: `row` itself, or a processed copy (JSON
     * mode's mask). NULL on failure (the round then fails). */
    const float *(*prepare)(void *user, const float *row);
    /* One decided token, already accepted into the sampler. Returns false
     * when the choice has ended (its sequence may be gone): the executor
     * then stops at once and touches neither the KV nor the source. */
    bool (*emit)(void *user, int32_t token, const ag_sample_result *sr);
    void *user;
} ag_spec_sink;

typedef struct {
    int  drafted;  /* d */
    int  accepted; /* k */
    int  emitted;  /* tokens handed to the sink */
    bool ended;    /* the sink ended the choice */
} ag_spec_round;

/* Adds one verified round (drafted > 0) to the counters: the positions up to
 * the first rejection were observed. */
void ag_spec_stats_add_round(ag_spec_stats *a, const ag_spec_round *r);

/* Steps 3-4 of a round. logits: d + 1 consecutive rows of n_vocab floats
 * (row_stride floats apart), the target's rows for [pending, x_1..x_d].
 * `spec` may be NULL (no speculation: d must be 0). `sampler` is the
 * sequence's; want_logprobs: fill each token's logprob and alternatives
 * (as ag_sampler_sample reports them). kv/kv_seq: the target's sequence,
 * trimmed by d - k after a rejection. argmax: NULL, or d + 1 values, each
 * the argmax of its row found where the logits are (ag_batch.argmax: a
 * token id, a negative "no finite logit", or AG_ARGMAX_NONE = -1 "use the
 * row"); a sampler that needs nothing but the argmax (ag_sampler_argmax_only)
 * then takes it instead of the row, which may be unwritten (likewise a
 * token drawn there for a pick-only sampler, d = 0). cands: NULL, or d + 1
 * pointers: row i's candidates found where the logits are (ag_batch.cands),
 * or NULL for a row to read whole. A sampler with ag_sampler_cands_req
 * decides from them instead of the row, which may then be unwritten: the
 * sampled token, a verify position's p (ag_sampler_probs_cands) and the
 * logprobs, each the bits the row would give, so the emitted tokens are
 * the same either way. Errors (sampling, trim) leave the round partly
 * emitted; the caller ends the choice with the error. */
ag_status ag_spec_verify(ag_spec_seq *spec, ag_sampler *sampler, bool want_logprobs, const float *logits,
                         const int32_t *argmax, const ag_cands *const *cands, size_t row_stride, int d, ag_kv *kv,
                         int32_t kv_seq, const ag_spec_sink *sink, ag_spec_round *out);

#endif
