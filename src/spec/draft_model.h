/* spec/draft_model.h: the "draft-model" draft source. A second, smaller GGUF
 * model with the target's vocabulary proposes tokens (spec/draft.h).
 *
 * One ag_draft_model is shared by every sequence: the draft's weights (the
 * mmapped file), its tokenizer and ONE ag_kv pool sized for max_seqs draft
 * sequences of n_ctx positions. Each sequence gets its own source
 * (ag_draft_model_source_new), which owns one sequence id of that pool and
 * one ag_sampler with the request's sampling chain on its own RNG stream.
 *
 * Drafting. At temperature 0 a draft is the argmax of the draft's processed
 * logits (bias, penalties: the chain's greedy rule), one-hot, so the source is
 * deterministic (stochastic = false). Above 0 it is drawn from q =
 * ag_sampler_probs of the draft's logits (the full chain), and q is handed to
 * the verify rule (stochastic = true). Drafting stops early, before a token
 * whose distribution is not confident enough: the top probability of the
 * processed logits at temperature 1 (greedy), or the largest q (sampled),
 * below p_min (ag_draft_model_set_p_min; default AG_DRAFT_MODEL_P_MIN).
 * Where the chain allows (no bias or penalties; greedy, or a sampler with
 * ag_sampler_cands_req) each step asks the model for its row's best
 * candidates (AG_WANT_CANDS) instead of the row: the same drafts, q and
 * confidences, bit for bit, with ~2 KB instead of a row from a device.
 *
 * Vocabularies. Logits rows of the draft have the draft model's n_vocab
 * entries; q and the sampler live over the TARGET vocabulary
 * (ag_draft_model_n_vocab: the target tokenizer's size). Ids the two do not
 * share are never drafted: q = 0 for target ids the draft lacks, draft ids
 * beyond the target's are dropped (-inf) before the chain.
 *
 * Threading: like every draft source, the engine thread only; the draft model
 * and its pool are not shared with anything else. */
#ifndef AG_SPEC_DRAFT_MODEL_H
#define AG_SPEC_DRAFT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "sample/sample.h"
#include "spec/draft.h"
#include "tok/tok.h"

/* Default confidence threshold for stopping a draft (see above). Measured
 * with bench/draft_accept.c, Qwen2.5-Coder 0.5B drafting for Coder 1.5B on six
 * code prompts (greedy, at most 8 drafts, 133 rounds): at 0.7, 96% of the
 * drafts are accepted (75% at 0), 5.5 tokens per verify (7.0 at 0) from 4.7
 * drafts per round (8 at 0). The estimated speed-up is within 2% of the best
 * threshold (0.5) if a verify costs one decode step, and the best (with 0.8)
 * at this CPU backend's cost of a 9-row verify (4.4 decode steps).
 * llama.cpp's server uses 0.75. */
#define AG_DRAFT_MODEL_P_MIN 0.7f

/* The draft's output head: of a vocabulary over twice this size only the
 * first AG_DRAFT_MODEL_HEAD_ROWS ids (byte-level BPE puts the frequent
 * tokens first) plus, per sequence, the ids past them that its prompt and
 * output hold (up to AG_DRAFT_MODEL_EXTRA_MAX), whose head rows are copied
 * aside. The draft can then not propose other ids (q = 0 there, which the
 * verify rule handles exactly), and a step reads less: Qwen2.5-0.5B's Q8_0
 * head is 146 MB of the 485 MB a step reads. AUGUR_DRAFT_VOCAB=N sets the
 * prefix (0: the whole head). Only on the CPU (ag_model_set_output_rows). */
#define AG_DRAFT_MODEL_HEAD_ROWS 32768
#define AG_DRAFT_MODEL_EXTRA_MAX 2048

typedef struct ag_draft_model ag_draft_model;

/* Loads the draft model at `path` (with `mp`, NULL = defaults) and checks its
 * vocabulary against the target's tokenizer `target_tok` (borrowed for the
 * call only): same tokenizer model ("llama"/"gpt2"), same BOS and EOS ids,
 * the same raw text for every id both vocabularies have, and every id only
 * one of them has must be a special token (CONTROL, USER_DEFINED or UNUSED
 * type). A refused pair is AG_ERR_FORMAT with a message naming the file and
 * the facts that differ (e.g. "token 1234 is 'foo' in the draft and 'bar' in
 * the target"). A load failure is ag_model_load's code, its message prefixed
 * with "draft model: ".
 *
 * The KV pool (default block size and dtype, F16) holds max_seqs (>= 1)
 * sequences of n_ctx (>= 1) positions; n_ctx is clamped to the draft's
 * n_ctx_train (a draft never runs positions it was not trained for: past
 * them its sources simply stop proposing). The pool is one allocation, made
 * now and counted by ag_draft_model_resident_bytes.
 *
 * On success *out owns the model, tokenizer and pool; free with
 * ag_draft_model_close. On error *out is NULL. */
ag_status ag_draft_model_open(const char *path, const ag_model_params *mp, const ag_tok *target_tok,
                              int max_seqs, int n_ctx, ag_draft_model **out);

/* NULL-safe. Every source made from dm must have been freed before (they
 * borrow its model and pool); closing with live sources is a bug (assert). */
void ag_draft_model_close(ag_draft_model *dm);

/* What admission must count for the draft model, once: the mapped weights
 * (the GGUF file's size: every tensor incl. the token embeddings), the KV
 * pool (blocks and metadata) for all max_seqs sequences, and its forward
 * scratch. Sources add only their private buffers (their resident_bytes). */
size_t ag_draft_model_resident_bytes(const ag_draft_model *dm);

/* What dm's model opened with ag_draft_model_open(..., max_seqs, n_ctx)
 * would hold once its sources have run: what ag_draft_model_resident_bytes
 * reports (the file, the KV pool for n_ctx clamped to the draft's training
 * context, its forward scratch) plus max_seqs sources' own buffers with
 * full histories. For memory planning at sizes other than dm's; 0 if the
 * shape is invalid. */
size_t ag_draft_model_plan_bytes(ag_draft_model *dm, int max_seqs, int n_ctx);

/* Drafting cost of one token relative to one decode step of `target`: the
 * ratio of the weight bytes a decode step reads (ag_model_weight_bytes),
 * since CPU decode is bound by memory bandwidth. For the source's
 * cost_per_token. */
float ag_draft_model_cost(const ag_draft_model *dm, const ag_model *target);

/* The vocabulary size q rows and the sources' samplers use: the target
 * tokenizer's n_vocab. The executor's probs rows (and its own sampler) must
 * have this width: an engine whose target model has more logits than its
 * tokenizer has tokens must not pair with a draft source (or must check this
 * equals its n_vocab). */
int ag_draft_model_n_vocab(const ag_draft_model *dm);

/* The n_ctx the pool was sized for (after the clamp to n_ctx_train). */
int ag_draft_model_n_ctx(const ag_draft_model *dm);

/* Sets the confidence threshold (clamped to [0, 1]; 0 = always draft `max`)
 * for every source's following draft() calls. */
void ag_draft_model_set_p_min(ag_draft_model *dm, float p_min);

/* A draft source for one sequence (spec/draft.h): name "draft-model",
 * cost_per_token as given, stochastic = sp->temperature > 0. It takes one
 * sequence id of dm's pool (AG_ERR_NOMEM when max_seqs are in use) and
 * creates a sampler ag_sampler_new(sp, ag_draft_model_n_vocab(dm), stream)
 * (sp is copied; logprobs are switched off in the copy: drafts never report
 * them). Errors of ag_sampler_new (bad params) are returned as they are.
 * The source borrows dm, which must outlive it; free with ag_draft_free.
 *
 * draft(): when probs is non-NULL at temperature > 0, rows [d, max) of it
 * may be written too (scratch: the distribution that stopped the draft).
 * A feed or prompt token the draft model cannot run (an id only the target's
 * vocabulary has) is an error (-1 / AG_ERR_INVALID); after any error the
 * source proposes nothing until the next prefill.
 *
 * The source's own resident_bytes is its sampler scratch and row buffers
 * (about 16 * n_vocab bytes); its KV blocks live in dm's pool, which
 * ag_draft_model_resident_bytes already counts. */
ag_status ag_draft_model_source_new(ag_draft_model *dm, const ag_sample_params *sp, uint64_t stream,
                                    float cost_per_token, ag_draft_source **out);

/* The confidence (top probability, as p_min sees it) of each token the last
 * draft() of `s` proposed, into conf[0..min(n, d)); returns d (0 before any
 * draft, after an error, or when s is not a draft-model source). For stats
 * and for tuning p_min. */
int ag_draft_model_source_confidence(const ag_draft_source *s, float *conf, int n);

#endif
