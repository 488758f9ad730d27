/* The embedding engine: one thread that owns an embedding model (an
 * encoder: ag_model_is_encoder) and runs every caller's inputs through it in
 * shared forward passes, as the generation engine packs waiting prompts.
 *
 * Each pass takes inputs from all waiting requests in turn (one input of
 * each, round after round, in arrival order) until n_batch tokens are
 * taken (a longer input runs alone), so a small request that arrives
 * behind a large one is in the next pass, not after it. An input's vector
 * does not depend on what shares its pass (each sequence attends only to
 * itself, and a prompt row's matmul result depends only on that row: the
 * ag_batch contract), so packing changes only the time.
 *
 * Threading: ag_embedder_run may be called from any number of threads at
 * once; it blocks its caller until that call's vectors are written. */
#ifndef AG_ENGINE_EMBED_H
#define AG_ENGINE_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"

typedef struct ag_embedder ag_embedder;

typedef struct {
    int n_batch;   /* most tokens a pass (0: 4096; at least the model's context) */
    int max_queue; /* most requests waiting or running (0: 256); more are AG_ERR_BUSY */
} ag_embedder_params;

/* Starts the thread over `m` (borrowed: it must outlive the embedder, and
 * no other thread may run m's forward passes meanwhile).
 * AG_ERR_UNSUPPORTED for a model that is not an embedding model. */
ag_status ag_embedder_new(ag_model *m, const ag_embedder_params *p, ag_embedder **out);

/* Fails every waiting request with AG_ERR_STOPPED, stops and joins the
 * thread. NULL-safe. */
void ag_embedder_free(ag_embedder *e);

/* Embeds n inputs (seqs[i]: lens[i] token ids, the special tokens already
 * added) into out[n][n_embd], each pooled and L2-normalized as
 * ag_model_embed; blocks until done. The arrays are read (and out written)
 * by the engine thread until the call returns. Errors: AG_ERR_INVALID for a
 * bad input (an empty one, one longer than the model's context, an id
 * outside the vocabulary: the message names the input), AG_ERR_BUSY when
 * max_queue requests are already in, AG_ERR_STOPPED after
 * ag_embedder_free began, and a pass's own error (AG_ERR_NOMEM), which
 * fails every request that had inputs in that pass. */
ag_status ag_embedder_run(ag_embedder *e, const int32_t *const *seqs, const size_t *lens, int n, float *out);

typedef struct {
    uint64_t requests, inputs, tokens, passes;
    uint64_t shared_passes; /* passes that held inputs of more than one request */
} ag_embedder_stats;
void ag_embedder_get_stats(ag_embedder *e, ag_embedder_stats *out);

#endif
