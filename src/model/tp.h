/* Tensor parallelism: one decoder split over N shards (ranks) of one
 * process, Megatron-style (docs/design-notes.md, "Tensor parallelism").
 *
 * Per layer each rank holds a slice of the attention heads (column-parallel
 * Q, K, V: whole KV-head groups, or part of one group with its KV head
 * replicated when N > n_head_kv) and of the feed-forward's intermediate
 * dimension (column-parallel gate and up), and the matching columns of the
 * row-parallel attention-output and down matrices; one all-reduce after
 * each of those two. The token embedding and the output head are split by
 * vocabulary: an all-reduce of the embeddings (each token's row comes from
 * the rank holding it, zeros from the others), a gather of the logits rows
 * or of each rank's chosen token. Every rank keeps the residual stream
 * whole (the same bits on each, as the all-reduce leaves them).
 *
 * The model (model.c) owns one ag_tp when loaded with --tp N > 1, and hands
 * the embedding, layers and head to it; everything above the model sees the
 * same ag_model. A rank's tensors are ordinary ag_tensors for its backend:
 * column-parallel cuts are row views of the file's bytes, row-parallel cuts
 * copies (cut along K at block boundaries). */
#ifndef AG_MODEL_TP_H
#define AG_MODEL_TP_H

#include <stdint.h>

#include "base/comm.h"
#include "model/model.h"

typedef struct ag_tp ag_tp;

/* One rank's attention heads: query heads [q0, q0 + nq), KV heads
 * [kv0, kv0 + nkv) (nkv = 1 and q heads of one group when the KV head is
 * replicated). */
typedef struct {
    int q0, nq, kv0, nkv;
} ag_tp_heads;

/* The head plan for n ranks over n_head query heads in n_head_kv groups
 * (n_head a multiple of n_head_kv): out[n]. n <= n_head_kv: each rank
 * takes a balanced run of whole groups; n > n_head_kv: each group goes to
 * a balanced run of ranks that share its KV head and split its query heads.
 * The even Megatron split whenever the counts divide. AG_ERR_UNSUPPORTED
 * for n < 1 or n > n_head. */
ag_status ag_tp_plan_heads(int n_head, int n_head_kv, int n, ag_tp_heads *out);

/* Cuts [0, len) into n balanced runs of whole units: run r is
 * [start[r], start[r + 1]). AG_ERR_UNSUPPORTED when len is not a multiple
 * of unit or has fewer than n units. */
ag_status ag_tp_plan_range(int64_t len, int64_t unit, int n, int64_t *start);

/* Plans and builds n (2..AG_COMM_MAX_RANKS) shards of a dense decoder
 * (llama, qwen2, qwen3, gemma3) over the model's bound weights, every rank
 * on backend `be` (a host-memory backend for now), joined by an in-process
 * communicator. The weights (layers[c->n_layer], tok_embd, output) are
 * borrowed and must outlive the result. Errors name the flag and what
 * refuses it: an architecture or backend not supported, a count that
 * cannot be split, a row-parallel cut inside a quantization block. */
ag_status ag_tp_new(int n, const ag_model_config *c, const ag_layer_weights *layers, const ag_tensor *tok_embd,
                    const ag_tensor *output, ag_backend *be, ag_tp **out);
void      ag_tp_free(ag_tp *tp); /* NULL-safe */
int       ag_tp_ranks(const ag_tp *tp);
/* Rank r's plan: heads, feed-forward run [*ff0, *ff0 + *nff), vocabulary
 * run [*v0, *v0 + *nv). */
void      ag_tp_rank_plan(const ag_tp *tp, int r, ag_tp_heads *heads, int64_t *ff0, int64_t *nff, int64_t *v0,
                          int64_t *nv);

/* The KV pool the shards share: layer l of rank r is pool layer l * n + r,
 * of *n_head_kv heads (the most any rank has; a rank with fewer uses the
 * first ones). */
void ag_tp_kv_shape(const ag_tp *tp, int *n_layer, int *n_head_kv);

/* Embeds b's tokens and runs every layer on the shards (the bits of the
 * ops of model.c's run_layers, rank by rank, with the all-reduces between):
 * x[b->n][n_embd] (the model's backend memory) receives the final residual
 * stream. kv, lay and n_dec as ag_model_forward has them. */
ag_status ag_tp_layers(ag_tp *tp, ag_kv *kv, const ag_batch *b, const ag_batch_layout *lay, int n_dec, float *x);

/* The output head over x[n_out][n_embd] (normed; n_out_dec decode rows
 * first): each rank's vocabulary run, gathered into logits[n_out][n_vocab]
 * (host memory). The ranks keep their runs until the next call, for
 * ag_tp_argmax. */
ag_status ag_tp_head(ag_tp *tp, const float *x, int n_out, int n_out_dec, float *logits);

/* The argmax of output rows [k0, k0 + n) of the last ag_tp_head (as the
 * backend's argmax op: the lowest id among the largest values, +inf and
 * FLT_MAX alike, NaN skipped; AG_ARGMAX_NOFINITE when no value is finite),
 * from each rank's own argmax of its run and a gather of those n (id,
 * value) pairs per rank, not of the rows. Only for rows nothing edited
 * after the head. */
ag_status ag_tp_argmax(ag_tp *tp, int k0, int n, int32_t *out);

/* Bytes of weights rank r holds (its slices of every matrix, the
 * replicated norms, its vocabulary rows of the embedding and head): what
 * its device would hold, or its host memory's share. */
uint64_t ag_tp_weight_bytes(const ag_tp *tp, int r);

/* Memory the shards hold beyond the model file's mapping for batches of up
 * to n_tokens rows at positions below n_ctx: the row-parallel weight copies
 * (*copies), and activations plus backend scratch (the return value). Per
 * rank when rank >= 0, else all ranks. */
uint64_t ag_tp_memory(const ag_tp *tp, int rank, int n_tokens, int n_ctx, uint64_t *copies);

#endif
