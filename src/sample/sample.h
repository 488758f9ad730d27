/* sample/: logits processors, the sampler, and the speculative verify rule.
 *
 * One ag_sampler per generated sequence (per choice when a request asks for
 * n > 1). It owns its RNG, the penalty history and vocab-sized scratch, so
 * the same params + seed + stream + logits give the same tokens on any run.
 * Not thread-safe: one thread drives one sampler at a time.
 *
 * THE CHAIN (fixed order, like llama.cpp's default chain):
 *
 *   1. logit bias       l[t] += bias; a bias <= -100 is a hard ban (-inf),
 *                       so "-100 bans" holds at any temperature (OpenAI).
 *   2. penalties        over the window of accepted tokens (penalty_last_n),
 *                       with c = count of t in the window:
 *                         repetition (c > 0): l > 0 ? l / r : l * r
 *                             (llama.cpp / HF: always pushes towards "less
 *                             likely", whatever the sign of the logit)
 *                         then l -= c * frequency_penalty
 *                                 + (c > 0) * presence_penalty   (OpenAI)
 *      -> the result is the "processed logits" (ag_sampler_logits).
 *   3. temperature == 0: greedy, argmax of the processed logits, ties to
 *                       the lowest token id; no RNG draw.
 *   4. top-k            keep the k largest (0 = off).
 *   5. top-p            softmax over what is left (at temperature 1), keep
 *                       the shortest prefix (by descending probability) whose
 *                       mass reaches top_p (1 = off; always >= 1 token).
 *   6. min-p            keep tokens with p >= min_p * p_max (0 = off).
 *   7. temperature      l / T over the kept tokens,
 *   8. softmax + draw   one uniform double from the sampler's RNG; the kept
 *                       tokens' weights are summed and walked in id order,
 *                       so the token depends on the kept set alone, not on
 *                       how it was found (ag_sampler_sample_cands).
 *
 * Truncation (4-6) therefore sees the temperature-1 distribution and the
 * temperature only reshapes the kept set (llama.cpp's order; HF applies the
 * temperature first). Ties everywhere are ordered by (logit desc, id asc),
 * so every filter keeps a well-defined prefix of that order. NaN logits are
 * treated as -inf (never sampled), +inf as FLT_MAX.
 *
 * LOGPROBS: reported logprobs are log-softmax over the whole vocab of the
 * processed logits (after bias and penalties, before truncation and
 * temperature), computed in double. That is the model's distribution as the
 * request shaped it, the same for every temperature/top-p, as OpenAI reports
 * (its logprobs do reflect logit_bias). A banned token has logprob -inf; the
 * server must map that to something JSON can carry.
 *
 * PENALTY WINDOW: the tokens passed to ag_sampler_accept(). Whether prompt
 * tokens are accepted too is the caller's choice (llama.cpp's server feeds
 * the prompt; OpenAI semantics are "generated so far": accept only output).
 * penalty_last_n: -1 = everything accepted (default, OpenAI), 0 = penalties
 * off, n > 0 = the last n accepted tokens (llama.cpp's default is 64).
 *
 * Cost: a pass over the vocab for bias/penalties/max; one exp pass for
 * log Z only when logprobs are asked for; O(vocab) quickselect for top-k;
 * top-p sorts at most 256 tokens, or (top-k off) histograms the mass in
 * one exp pass and sorts only the bucket where the cut falls. Never a full
 * vocab sort. Memory: 8 bytes * n_vocab of scratch per sampler (+16 KiB),
 * plus 4 bytes per accepted token of history. */
#ifndef AG_SAMPLE_SAMPLE_H
#define AG_SAMPLE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/argmax.h" /* ag_pick */

#include "base/status.h"

#define AG_SAMPLE_MAX_LOGPROBS 20

typedef struct {
    int32_t token;
    float   bias; /* added to the logit; <= -100 bans the token */
} ag_logit_bias;

typedef struct {
    float    temperature;        /* >= 0; 0 = greedy */
    int32_t  top_k;              /* >= 0; 0 = off */
    float    top_p;              /* [0, 1]; 1 = off */
    float    min_p;              /* [0, 1]; 0 = off */
    float    repetition_penalty; /* > 0; 1 = off */
    float    presence_penalty;   /* finite; 0 = off (OpenAI allows [-2, 2]) */
    float    frequency_penalty;  /* finite; 0 = off (OpenAI allows [-2, 2]) */
    int32_t  penalty_last_n;     /* -1 = all accepted tokens, 0 = off, n > 0 */
    const ag_logit_bias *logit_bias; /* [n_logit_bias]; borrowed only during
                                        ag_sampler_new (it copies); duplicate
                                        ids add up (summed in order, then
                                        added; any <= -100 bans) */
    int32_t  n_logit_bias;
    uint64_t seed;               /* the caller picks a random one when the
                                    request has none */
    int32_t  logprobs;           /* 1: report the chosen token's logprob
                                    (OpenAI "logprobs"); costs one exp pass */
    int32_t  n_logprobs;         /* 0..AG_SAMPLE_MAX_LOGPROBS top alternatives
                                    (OpenAI "top_logprobs"); > 0 implies
                                    logprobs */
} ag_sample_params;

typedef struct {
    int32_t token;
    float   logprob;
} ag_token_logprob;

typedef struct {
    int32_t          token;   /* the chosen token */
    float            logprob; /* its logprob (see LOGPROBS above); NaN unless
                                 logprobs or n_logprobs was asked for */
    int32_t          n_top;   /* min(n_logprobs, tokens with finite logit) */
    ag_token_logprob top[AG_SAMPLE_MAX_LOGPROBS]; /* by logprob desc, id asc */
} ag_sample_result;

typedef struct ag_sampler ag_sampler;

/* Neutral params: temperature 1, every filter and penalty off, window -1,
 * seed 0, no logprobs. */
ag_sample_params ag_sample_default_params(void);

/* Checks params against the ranges above (and bias ids against n_vocab).
 * AG_ERR_RANGE / AG_ERR_INVALID with a message naming the field. */
ag_status ag_sample_params_check(const ag_sample_params *p, int32_t n_vocab);

/* Creates a sampler for a vocab of n_vocab (>= 1) tokens. `stream` selects
 * an independent RNG stream for the same seed (choice index for n > 1; the
 * draft source of a speculative pair should use its own stream). Copies
 * everything it needs from `params`. *out is owned by the caller and freed
 * with ag_sampler_free. */
ag_status ag_sampler_new(const ag_sample_params *params, int32_t n_vocab, uint64_t stream,
                         ag_sampler **out);

/* NULL-safe. */
void ag_sampler_free(ag_sampler *s);

/* Forgets the penalty history and restarts the RNG from (seed, stream), so
 * the sampler behaves as if freshly created. */
void ag_sampler_reset(ag_sampler *s);

/* Records an emitted token in the penalty history. The sampler never does
 * this by itself: call it once per token that becomes part of the output
 * (and for draft tokens before computing the next verify position's
 * distribution, see ag_sampler_rewind). AG_ERR_RANGE for a bad id. */
ag_status ag_sampler_accept(ag_sampler *s, int32_t token);

/* Drops the last n accepted tokens from the history (speculative rollback
 * of rejected drafts). The RNG is not rewound. AG_ERR_RANGE if n exceeds
 * the history. */
ag_status ag_sampler_rewind(ag_sampler *s, size_t n);

/* Tokens accepted so far (after rewinds). */
size_t ag_sampler_n_accepted(const ag_sampler *s);

/* The most memory a sampler over n_vocab tokens holds after accepting
 * n_accepted tokens (its scratch, the penalty history and its counts table,
 * each grown by doubling), without logit bias. For memory planning. */
size_t ag_sampler_bytes(int32_t n_vocab, size_t n_accepted);

/* 1 if temperature == 0 (greedy: sampling and verify use no RNG). */
int ag_sampler_greedy(const ag_sampler *s);

/* Whether the sampler's steps 1-2 (logit bias, penalties) change any
 * logit: then a backend can apply them where the logits are
 * (ag_sampler_row_edits) and hand the sampler edited rows. Fixed for the
 * sampler's life. */
int ag_sampler_has_edits(const ag_sampler *s);

/* The most edits ag_sampler_row_edits can write now: the biased tokens
 * plus the tokens counted in the penalty window. Grows with the history. */
size_t ag_sampler_max_edits(const ag_sampler *s);

/* Steps 1-2 for the current history as edits (ag_logit_edit, base/argmax.h),
 * one per token they change, into out[ag_sampler_max_edits(s)]; returns
 * their count. ag_logit_edit_apply of each to its token's raw logit gives
 * the processed logit ag_sampler_logits gives, bit for bit; every other
 * token's processed logit is its raw one sanitized. For a speculative
 * verify row, accept the drafts before it first (and rewind after). */
size_t ag_sampler_row_edits(const ag_sampler *s, ag_logit_edit *out);

/* From now on every row and every candidates given to this sampler come
 * with its edits applied (ag_sampler_row_edits for the history at that
 * row, by a backend, ag_batch.edits): the sampler skips steps 1-2, and the
 * predicates below (argmax-only, pick-only, candidates requests) answer as
 * for a sampler without bias and penalties, so its rows too may stay where
 * they were computed. Not undone by ag_sampler_reset. */
void ag_sampler_take_edited_rows(ag_sampler *s);

/* 1 if ag_sampler_sample returns the row's argmax and nothing else: greedy,
 * no logprobs, no logit bias or penalties (or rows that come edited:
 * ag_sampler_take_edited_rows; so for the predicates below). Such a sampler can take a token
 * computed where the logits are (ag_sampler_sample_argmax), so a GPU need
 * not copy the row back. Fixed for the sampler's life (but for
 * ag_sampler_take_edited_rows). */
int ag_sampler_argmax_only(const ag_sampler *s);

/* What ag_sampler_sample gives a row whose argmax is `argmax`: the lowest id
 * among the largest logits (+inf and FLT_MAX counted alike, NaN skipped), or
 * any negative value when no logit is finite (then AG_ERR_INVALID, as
 * sample). Only for a sampler with ag_sampler_argmax_only (else
 * AG_ERR_INVALID). Does not accept the token. */
ag_status ag_sampler_sample_argmax(ag_sampler *s, int32_t argmax, ag_sample_result *out);

/* 1 if ag_sampler_sample reduces to ag_pick_f32 (base/argmax.h): a
 * temperature > 0 and nothing else in the chain (no top-k below the vocab,
 * top-p 1, min-p 0, no logit bias, no penalties) and no logprobs. Such a
 * sampler can take a token drawn where the logits are: the caller draws its
 * uniform (ag_sampler_draw_pick) before the logits exist and hands the backend's
 * token to ag_sampler_sample_picked, so a GPU need not copy the row back.
 * Fixed for the sampler's life (but for
 * ag_sampler_take_edited_rows). */
int ag_sampler_pick_only(const ag_sampler *s);

/* Whether the sampler is pick-only but for logprobs (a temperature and
 * nothing else in the chain, and logprobs asked for), with the candidates
 * request its row needs besides the token (*req, may be NULL): the best
 * max(1, n_logprobs), z, and at = AG_CANDS_AT_TOKEN, the token picked where
 * the logits are (AG_WANT_PICK_LP). Its uniform is drawn as a pick-only
 * sampler's (ag_sampler_draw_pick), and ag_sampler_sample_picked_cands then
 * gives what ag_sampler_sample gives the row. Fixed for the sampler's life (but for
 * ag_sampler_take_edited_rows). */
int ag_sampler_pick_logprobs(const ag_sampler *s, ag_cands_req *req);

/* The token a backend drew with this sampler's last ag_sampler_draw_pick
 * and its row's candidates (their at naming that token): the token, its
 * logprob and alternatives (ag_sampler_logprobs_cands). Only for a sampler
 * with ag_sampler_pick_logprobs (else AG_ERR_INVALID); a negative token is
 * AG_ERR_INVALID (no finite logit). Does not accept the token. */
ag_status ag_sampler_sample_picked_cands(ag_sampler *s, int32_t token, const ag_cands *c, ag_sample_result *out);

/* Takes the next uniform from the sampler's RNG into *out (for a sampler
 * with ag_sampler_pick_only or ag_sampler_pick_logprobs, else
 * AG_ERR_INVALID and no draw). The token
 * that follows is then ag_pick_f32(row, n_vocab, out->inv_temp, out->u),
 * reported with ag_sampler_sample_picked, or ag_sampler_sample_drawn on the
 * host: either gives the token ag_sampler_sample would have. */
ag_status ag_sampler_draw_pick(ag_sampler *s, ag_pick *out);

/* Reports the token a backend drew with this sampler's last ag_sampler_draw_pick
 * (a negative token: no logit was finite, AG_ERR_INVALID as sample). Only
 * for a sampler with ag_sampler_pick_only. Does not accept the token. */
ag_status ag_sampler_sample_picked(ag_sampler *s, int32_t token, ag_sample_result *out);

/* The same token drawn on the host from logits[n_vocab] with *d (a draw of
 * this sampler), for rows the backend did not pick. */
ag_status ag_sampler_sample_drawn(ag_sampler *s, const float *logits, const ag_pick *d, ag_sample_result *out);

/* Whether ag_sampler_sample may need no more of a row than ag_top_cands_f32
 * (base/argmax.h) gives, and for which request (*req, may be NULL): no logit
 * bias or penalties, and either greedy with logprobs (the argmax and the
 * alternatives; k = max(1, n_logprobs)), or a temperature with top-k in
 * [1, AG_CANDS_MAX] below the vocab (k = max(top_k, n_logprobs)), or a
 * temperature with top-k off and top-p < 1 or min-p > 0 (k = AG_CANDS_MAX:
 * enough when the cut falls among them, see ag_sampler_cands_enough);
 * want_z when logprobs are asked for or top-p is cut from the whole row's
 * mass. 0 for every other sampler (the argmax-only and pick-only ones have
 * cheaper ways). Fixed for the sampler's life (but for
 * ag_sampler_take_edited_rows). */
int ag_sampler_cands_req(const ag_sampler *s, ag_cands_req *req);

/* Whether the candidates *c hold every token this sampler would keep of
 * their row: always for top-k and greedy samplers (candidates that answer
 * the request) and when they are all the row's finite values; with top-k
 * off, when the top-p cut (partial sums in order against top_p times the
 * row's sumexp) or, without top-p, the min-p cut falls among them. Else
 * the caller samples the whole row with ag_sampler_sample (the same token
 * either way). No RNG draw. */
int ag_sampler_cands_enough(ag_sampler *s, const ag_cands *c);

/* The token (and logprobs) ag_sampler_sample would give the row whose
 * candidates *c are (ag_top_cands_f32 with ag_sampler_cands_req's request,
 * or a backend's equal), with the same RNG draw: a device copies back a few
 * candidates, not the row. A device's sumexp may differ from the host's in
 * the last bits (another summation order), and the logprobs with it, and
 * (top-k off) a top-p cut that falls within rounding of a boundary.
 * AG_ERR_INVALID for a sampler without ag_sampler_cands_req, candidates that
 * do not answer its request or are not enough (ag_sampler_cands_enough), or
 * no finite value. Does not accept the token. */
ag_status ag_sampler_sample_cands(ag_sampler *s, const ag_cands *c, ag_sample_result *out);

/* A distribution over a row's candidates (ag_sampler_probs_cands): the
 * tokens the sampler keeps, ids ascending, with their probabilities; every
 * other token has probability 0. */
typedef struct {
    int32_t n;
    int32_t id[AG_CANDS_MAX];
    float   p[AG_CANDS_MAX];
} ag_cand_probs;

/* ag_sampler_probs of the row whose candidates *c are, bit for bit, as a
 * list of the kept tokens (a verify row's p where the logits are on a
 * device). Same preconditions and errors as ag_sampler_sample_cands. Uses
 * no RNG. */
ag_status ag_sampler_probs_cands(ag_sampler *s, const ag_cands *c, ag_cand_probs *out);

/* Whether ag_sampler_logprobs(s, row, token) needs no more of the row than
 * candidates for *req (may be NULL): the best max(1, n_logprobs), the sum
 * of exponentials, and the token's own value (at = token). For a sampler
 * that asks for logprobs, without logit bias or penalties (or whose rows
 * come edited). */
int ag_sampler_logprobs_req(const ag_sampler *s, int32_t token, ag_cands_req *req);

/* ag_sampler_logprobs of the row whose candidates *c are: the same logprob
 * and alternatives, for a token among them (the verify rule emits only kept
 * tokens, and they are; then any request with want_z and k >= n_logprobs
 * serves) or the one their request named (at). AG_ERR_INVALID for a sampler
 * without ag_sampler_logprobs_req, candidates that do not answer it, or a
 * token neither among them nor named; AG_ERR_RANGE for a bad id. */
ag_status ag_sampler_logprobs_cands(ag_sampler *s, const ag_cands *c, int32_t token, ag_sample_result *out);

/* Samples one token from logits[n_vocab] (borrowed for the call) through
 * the chain, and fills *out (logprob and n_logprobs alternatives). Does not
 * accept the token. Deterministic given the seed, stream, the sequence of
 * calls and the inputs. AG_ERR_INVALID if no logit is finite after bias. */
ag_status ag_sampler_sample(ag_sampler *s, const float *logits, ag_sample_result *out);

/* The processed logits (steps 1-2 of the chain) of logits[n_vocab] into
 * out[n_vocab] (caller-owned). For inspection and tests. */
ag_status ag_sampler_logits(ag_sampler *s, const float *logits, float *out);

/* The distribution step 8 draws from: probs[n_vocab] (caller-owned) gets
 * the probability of every token (0 outside the kept set; sums to 1). At
 * temperature 0 it is one-hot on the greedy token. Uses no RNG. This is the
 * target distribution p (and, with the draft's own sampler, the draft q)
 * of the verify rule. */
ag_status ag_sampler_probs(ag_sampler *s, const float *logits, float *probs);

/* Logprob and alternatives of a given token under logits[n_vocab], as
 * ag_sampler_sample reports them, without sampling (for tokens emitted by
 * the verify rule). */
ag_status ag_sampler_logprobs(ag_sampler *s, const float *logits, int32_t token,
                              ag_sample_result *out);

/* Draws a token from a probability vector probs[n_vocab] (non-negative,
 * need not be normalised) with the sampler's RNG: for draft sources
 * drawing from q, or a bonus token from an already computed p. */
ag_status ag_sampler_draw(ag_sampler *s, const float *probs, int32_t *token);

typedef struct {
    int     accepted; /* 1: the draft token stands; 0: rejected */
    int32_t token;    /* the token to emit: the draft when accepted, else the
                         correction drawn from the residual */
} ag_verify_result;

/* The speculative verify rule for one draft position (Leviathan et al.
 * 2023; Chen et al. 2023). p[n_vocab]: the target's processed distribution
 * at this position (ag_sampler_probs with the history up to the previous
 * draft token accepted). q[n_vocab]: the distribution the draft token was
 * drawn from, or NULL for a deterministic (one-hot) draft.
 *   temperature > 0: accept with probability min(1, p(x) / q(x)); on
 *     rejection draw from normalize(max(0, p - q)). The emitted token is
 *     then distributed exactly as p, whatever q is. q(x) == 0 accepts iff
 *     p(x) > 0; a residual with no mass (p == q up to rounding) draws
 *     from p.
 *   temperature == 0: accept iff x == argmax p (lowest id on ties), the
 *     correction is argmax p; no RNG.
 * p and q are borrowed for the call.
 *
 * Executor recipe, drafts x_1..x_d with target logits L_0..L_d:
 *   for i in 1..d:  ag_sampler_probs(s, L_{i-1}, p)
 *                   ag_sampler_verify(s, p, q_i or NULL, x_i, &v)
 *                   ag_sampler_accept(s, v.token); emit v.token
 *                   if (!v.accepted) stop (trim the target KV after it)
 *   all accepted:   bonus = ag_sampler_sample(s, L_d); accept and emit it.
 * Penalties then see exactly the history plain decoding would have seen.
 * A caller that accepts drafts tentatively before verifying undoes the
 * rejected ones with ag_sampler_rewind. */
ag_status ag_sampler_verify(ag_sampler *s, const float *p, const float *q, int32_t draft,
                            ag_verify_result *out);

/* ag_sampler_verify with the target's p given as ag_sampler_probs_cands
 * gave it (ids ascending): the same result and the same RNG draws as
 * ag_sampler_verify on the dense vector holding those probabilities. q as
 * there. AG_ERR_INVALID for an empty list or ids out of order or range. */
ag_status ag_sampler_verify_cands(ag_sampler *s, const ag_cand_probs *p, const float *q, int32_t draft,
                                  ag_verify_result *out);

#endif
