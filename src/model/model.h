/* Models: configuration and weights read from a GGUF file, and the forward
 * pass over a ragged batch.
 *
 * Supported architectures: llama (Llama 2/3, SmolLM2, stories), qwen2 (QKV
 * bias), qwen3 (per-head q/k RMSNorm, no QKV bias), qwen3moe (qwen3's
 * attention, routed experts instead of the dense feed-forward), gemma3
 * (sliding-window + global layers with their own RoPE bases, QK-norm, pre-
 * and post-norms, GELU, scaled embeddings), gpt-oss (q/k/v/o biases,
 * attention sinks, a sliding window on every other layer, YaRN rotary
 * scaling, routed experts with biases, top-k-then-softmax gating and a
 * clamped SwiGLU, MXFP4 experts), granitehybrid (IBM Granite 4.0-H: Mamba-2
 * layers beside attention layers without RoPE, Granite's multipliers; the
 * CPU only), and one encoder: nomic-bert
 * (nomic-embed-text: BERT post-LayerNorm layers with bias, fused QKV, RoPE,
 * SwiGLU, bidirectional attention), an embedding model that runs through
 * ag_model_embed only, and gemma-embedding (EmbeddingGemma: gemma3's layers
 * attending both ways, then pooling and Dense projections), another. The file
 * is a GGUF or a Hugging Face model folder (model/safetensors.h). Each is one entry of model.c's
 * architecture table. Anything else is a clear AG_ERR_UNSUPPORTED at load.
 *
 * Threading: an ag_model is immutable after load except for its per-step
 * scratch, so ag_model_forward() must be called from one thread at a time
 * (the engine thread). */
#ifndef AG_MODEL_H
#define AG_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/argmax.h" /* ag_pick */
#include "base/status.h"
#include "gguf/gguf.h"
#include "kv/kv.h" /* ag_model_kv_params */

typedef enum {
    AG_ARCH_LLAMA,
    AG_ARCH_QWEN2,
    AG_ARCH_GEMMA3,
    AG_ARCH_QWEN3,
    AG_ARCH_QWEN3MOE,
    AG_ARCH_NOMIC_BERT,
    AG_ARCH_GPT_OSS,
    AG_ARCH_GEMMA_EMBD,
    AG_ARCH_GRANITE_HYBRID
} ag_arch;

#define AG_MAX_LAYERS 256
#define AG_MAX_EXPERTS AG_MOE_MAX_EXPERTS

typedef struct {
    ag_arch arch;
    char    arch_name[32];
    int     n_vocab, n_ctx_train, n_embd, n_layer, n_ff;
    int     n_head, n_head_kv, head_dim_k, head_dim_v;
    int     rope_dim;
    bool    rope_neox;         /* pairs (i, i+d/2) instead of (2i, 2i+1) */
    float   rope_base;         /* global layers */
    float   rope_base_swa;     /* sliding-window layers */
    float   rope_freq_scale;   /* 1 / linear (or YaRN) scaling factor */
    float   rope_freq_scale_swa; /* the same for sliding-window layers */
    /* YaRN (rope.scaling.type "yarn", as llama.cpp's rope_yarn): pair i's
     * frequency blends the scaled and the original one by a ramp over the
     * pairs between the correction dims of beta_fast and beta_slow
     * rotations in yarn_orig_ctx positions; the rotated values are scaled
     * by 1 + 0.1 ln(1 / freq_scale) */
    bool    rope_yarn;
    int     yarn_orig_ctx;
    float   yarn_beta_fast, yarn_beta_slow, yarn_ext_factor;
    float   rms_eps;
    int     sliding_window;    /* 0: none */
    uint8_t layer_swa[AG_MAX_LAYERS]; /* 1: layer uses the sliding window */
    bool    gelu;              /* GELU(tanh) MLP instead of SiLU */
    float   embd_scale;        /* 1, or sqrt(n_embd) for gemma */
    float   attn_scale;        /* multiplies q·k */
    float   final_softcap;     /* 0: off */
    /* Routed experts (qwen3moe); n_expert 0: a dense feed-forward */
    int     n_expert, n_expert_used, n_ff_exp;
    bool    expert_weights_norm; /* the chosen experts' weights divided by their sum */
    float   expert_weights_scale; /* then multiplied by this (1: none) */
    int     expert_gating;     /* AG_MOE_GATE_*: softmax then top-k, or (gpt-oss) top-k then softmax */
    int     expert_act;        /* AG_MOE_ACT_*: SiLU, or (gpt-oss) the clamped SwiGLU */
    float   expert_alpha, expert_limit; /* the clamped SwiGLU's */
    bool    attn_sinks;        /* attn_sinks: one learned softmax logit per head (gpt-oss) */
    /* Encoders (embedding models): no logits; ag_model_embed instead of
     * ag_model_forward */
    bool    encoder;
    bool    bidirectional;     /* attention.causal = false */
    int     pooling;           /* AG_POOL_*: how token states become one vector */
    float   norm_eps;          /* LayerNorm epsilon (attention.layer_norm_epsilon) */
    /* Hybrid recurrent models (granitehybrid): Mamba-2 layers where
     * layer_recurrent[l] (head_count_kv 0 in the file), attention layers
     * elsewhere; the KV holds only the attention layers (kv_layer[l] is
     * layer l's index there), the recurrent state its own slots (kv/state.h) */
    int     n_recurrent;
    uint8_t layer_recurrent[AG_MAX_LAYERS];
    int16_t kv_layer[AG_MAX_LAYERS];
    int     ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_n_head, ssm_n_group;
    bool    no_rope;           /* attention without positions (rope.scaling.finetuned = false) */
    float   residual_scale;    /* Granite: each branch's output times this before its add (1: none) */
    float   logit_scale;       /* Granite: logits divided by this (1: none) */
} ag_model_config;

/* Pooling of an encoder's last hidden states (llama.cpp's pooling_type
 * values: the GGUF key <arch>.pooling_type). */
enum { AG_POOL_NONE = 0, AG_POOL_MEAN = 1, AG_POOL_CLS = 2, AG_POOL_LAST = 3 };

typedef struct {
    ag_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, post_attn_norm;
    ag_tensor ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffn_norm;
    /* routed experts: the router [n_expert][n_embd] and the experts'
     * matrices, ne[2] = n_expert (see ag_moe_weights) */
    ag_tensor ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    /* gpt-oss: the attention output's bias, the heads' sinks, the router's
     * and the experts' biases (F32) */
    ag_tensor bo, attn_sinks, ffn_gate_inp_b, ffn_gate_exps_b, ffn_up_exps_b, ffn_down_exps_b;
    /* encoders (nomic-bert): the fused QKV matrix (wq, wk, wv are views of
     * its row ranges), and the post-LayerNorms with their biases */
    ag_tensor wqkv, attn_out_norm, attn_out_norm_b, layer_out_norm, layer_out_norm_b;
    /* Mamba-2 layers (granitehybrid): the input projection [n_embd][2
     * d_inner + 2 n_group d_state + n_head], the conv [C][d_conv] and its
     * bias, dt's bias, A and D per head, the gated norm's gain, the output
     * projection (all but the two projections F32) */
    ag_tensor ssm_in, ssm_conv1d, ssm_conv1d_b, ssm_dt_b, ssm_a, ssm_d, ssm_norm, ssm_out;
} ag_layer_weights;

typedef struct ag_model ag_model;

typedef struct {
    ag_cpu_params cpu;
    ag_device     device; /* AG_DEVICE_AUTO: CUDA when built in and a GPU is present */
    /* The most decode rows one forward pass of this process will carry, when
     * known: 1 for a single sequence without speculation; 0: unknown or
     * many (a server, a verify window). A backend may pick its decode
     * kernels by it, once, at load; every decode row of the process then
     * takes the same kernels, so results stay batch-invariant within it. */
    int           decode_rows_hint;
    /* Tensor parallelism (--tp): the layers, embedding and head split over
     * this many in-process shards (model/tp.h); 0 or 1: none, today's path
     * exactly. */
    int           tp;
} ag_model_params;

ag_model_params ag_model_default_params(void);

/* Loads a model: opens and validates the GGUF (mmapped; weights stay in the
 * mapping), reads the configuration, binds every tensor with its expected
 * shape, and creates the backend. On error *out is NULL and the message names
 * the file and the problem. */
ag_status ag_model_load(const char *path, const ag_model_params *p, ag_model **out);
void      ag_model_free(ag_model *m); /* NULL-safe */

const ag_model_config *ag_model_config_of(const ag_model *m);
/* The open GGUF (for the tokenizer and chat template). Borrowed, lives as long as m. */
const ag_gguf *ag_model_gguf(const ag_model *m);
ag_backend    *ag_model_backend(ag_model *m);
/* Host memory for an array the forward pass downloads into every step (its
 * logits rows): the backend's fastest for downloads (pinned on a GPU), else
 * malloc's. NULL when out of memory. Free it with ag_model_host_free. */
float *ag_model_host_floats(ag_model *m, size_t n);
void   ag_model_host_free(ag_model *m, float *p); /* NULL-safe */
/* Where a KV cache for this model must keep its blocks: pass it as
 * ag_kv_params.mem (NULL for the CPU backend's host memory). */
const struct ag_kv_mem *ag_model_kv_mem(const ag_model *m);
/* The device the model runs on (AUTO resolved at load). */
ag_device ag_model_device(const ag_model *m);
/* The token embedding table when a step reads only the rows of its tokens
 * (an untied model: the output matrix is another tensor), so that only the
 * pages of the tokens seen so far become resident: its bytes and the bytes
 * of one row. Both 0 when the table is also the output matrix (every step
 * reads it whole). */
void ag_model_gathered_weights(const ag_model *m, uint64_t *table_bytes, size_t *row_bytes);

/* The model's shards (model/tp.h) when loaded with tp > 1, else NULL.
 * Borrowed, lives as long as m. */
const struct ag_tp *ag_model_tp(const ag_model *m);

/* Bytes of weights a decode step reads (every weight used per token; the
 * output matrix as far as ag_model_set_output_rows limits it). */
uint64_t ag_model_weight_bytes(const ag_model *m);
/* The model's device memory (a GPU backend's) free now, with its weights
 * loaded, and in all; AG_ERR_UNSUPPORTED for a host-memory backend. */
ag_status ag_model_device_memory(const ag_model *m, uint64_t *free_bytes, uint64_t *total_bytes);

/* A 64-bit fingerprint of what decides this model's KV for given tokens,
 * for keying persisted KV (the prefix cache's disk tier): the architecture
 * and every hyper-parameter of the configuration; every tensor's metadata
 * (name, type, shape, offset, size); and a SAMPLE of the weight bytes (64
 * bytes at the start, middle and end of each tensor). Not a hash of all
 * the weights: that would read gigabytes at every start. The sample is
 * there because fine-tunes of one base model share all the metadata; any
 * real fine-tune changes the sampled bytes too. A few hundred page reads of
 * the mapping (pages the first forward pass reads anyway); computed on
 * each call, well under a millisecond once they are resident. */
uint64_t ag_model_fingerprint(const ag_model *m);

/* Allocates the activation memory for batches of up to n_tokens tokens
 * now, in one piece, so that steps never grow it (a grown arena keeps a
 * larger, less predictable footprint). Later larger batches still work (the
 * arena grows). AG_ERR_NOMEM. */
ag_status ag_model_reserve_scratch(ag_model *m, int n_tokens);

/* The scratch memory a model that has run batches of up to n_tokens tokens
 * at positions below n_ctx holds (after ag_model_reserve_scratch(n_tokens)):
 * its activations and what its backend keeps (matmul activation buffer,
 * copies of weights made for the kernels, attention rows per thread). For
 * memory planning (ag_engine_plan_memory). */
uint64_t ag_model_scratch_bytes(ag_model *m, int n_tokens, int n_ctx);

/* Per-sequence KV geometry for this model, to create a matching ag_kv. */
void ag_model_kv_shape(const ag_model *m, int *n_layer, int *n_head_kv, int *head_dim_k, int *head_dim_v);

/* The parameters of a KV pool for m, the one place they are built (engine,
 * draft model, bench, logits): m's geometry (ag_model_kv_shape) and the
 * memory its backend gives the pool (ag_model_kv_mem), elements of dtype,
 * room for max_seqs sequences, and a budget of max_seqs sequences of n_pos
 * positions each in whole blocks (n_pos 0: budget_bytes left 0 for the
 * caller to set). *lay (may be NULL): the pool's layout. Errors: those of
 * ag_kv_layout_for (a geometry or dtype the pool cannot hold). */
ag_status ag_model_kv_params(const ag_model *m, ag_kv_dtype dtype, int max_seqs, int n_pos, ag_kv_params *kp,
                             ag_kv_layout *lay);

/* Whether the model is an encoder (an embedding model): it has no logits,
 * ag_model_forward refuses it, and ag_model_embed runs it. */
bool ag_model_is_encoder(const ag_model *m);

/* Embeds n_seq token sequences in one forward pass: sequence s is
 * tok[start[s] .. start[s + 1]) (start[0] = 0; each 1 .. n_ctx_train
 * tokens, the special tokens already added). Each sequence attends only to
 * itself. out[n_seq][n_embd] (caller-allocated) receives each sequence's
 * pooled vector (the model's pooling: mean, CLS or last token), L2-
 * normalized. Uses the model's own scratch and KV (grown to the largest call),
 * so calls must come from one thread at a time, as ag_model_forward's.
 * Errors: AG_ERR_UNSUPPORTED for a decoder, AG_ERR_INVALID for bad ids or
 * lengths, AG_ERR_NOMEM. */
ag_status ag_model_embed(ag_model *m, const int32_t *tok, const int32_t *start, int n_seq, float *out);

/* A Matryoshka truncation of one of ag_model_embed's vectors to its first
 * `dims` of n_embd dimensions (1 <= dims <= n_embd), as nomic-embed's model
 * card does it: LayerNorm without gain over all n_embd (centering; the
 * scale goes with the normalization), then the first dims values,
 * L2-normalized. dims == n_embd copies the vector unchanged. out may alias in. */
void ag_embed_truncate(const float *in, int n_embd, int dims, float *out);
/* The truncation m's model card prescribes: nomic-bert's above; others
 * (EmbeddingGemma) the first dims values, L2-normalized. */
void ag_model_embed_truncate(const ag_model *m, const float *in, int dims, float *out);

/* Output-matrix rows beyond ag_model_set_output_rows' prefix that a pass
 * computes too (ag_batch.head_extra): ids[n] (each past the prefix) and
 * their rows, copied from the head by ag_model_head_rows_copy,
 * n * ag_model_head_row_bytes bytes in ids' order. */
typedef struct {
    int            n;
    const int32_t *ids;
    const void    *rows;
} ag_head_extra;

/* want_logits values: the row's logits, or only its argmax (the lowest id
 * among its largest logits, +inf and FLT_MAX alike, NaN skipped), or only a
 * token drawn from softmax(row / T) with a sampler's uniform
 * (ag_pick_f32 with ag_batch.pick's draw), or only the row's best
 * candidates (ag_top_cands_f32 with ag_batch.cands_req's request): what a
 * device backend finds where the logits are and copies back alone; or
 * AG_WANT_PICK_LP, both a picked token and the row's candidates for its
 * request, whose at (AG_CANDS_AT_TOKEN) names that token (what a sampler
 * with only a temperature needs when it reports logprobs).
 * AG_WANT_PICK only where ag_model_can_pick, AG_WANT_CANDS only where
 * ag_model_can_cands, AG_WANT_PICK_LP where both. */
enum { AG_WANT_LOGITS = 1, AG_WANT_ARGMAX = 2, AG_WANT_PICK = 3, AG_WANT_CANDS = 4, AG_WANT_PICK_LP = 5 };
/* ag_batch.argmax values other than a token id */
enum {
    AG_ARGMAX_NONE = -1,     /* not computed: the logits row is filled, use it */
    AG_ARGMAX_NOFINITE = -2, /* no logit of the row is finite */
};

/* One ragged batch: any mix of sequences and positions (prefill chunks,
 * single decode tokens, speculative verify windows). */
typedef struct {
    int            n;           /* tokens in this batch */
    const int32_t *token;       /* [n] */
    const int32_t *pos;         /* [n] position within its sequence */
    const int32_t *seq;         /* [n] sequence id (KV block table) */
    const uint8_t *want_logits; /* [n] 0 or AG_WANT_*; NULL: logits of the last token */
    /* [output rows] (may be NULL when no row wants AG_WANT_ARGMAX or
     * AG_WANT_PICK): per row wanting anything, in batch order, its argmax or
     * picked token where the backend computed it (a token id or
     * AG_ARGMAX_NOFINITE), else AG_ARGMAX_NONE. An AG_WANT_ARGMAX or
     * AG_WANT_PICK row whose token was computed, and an AG_WANT_CANDS row,
     * may have its logits row left unwritten (ag_model_output_row fetches
     * it); every other wanted row's logits are written. */
    int32_t *argmax;
    /* [output rows] (may be NULL when no row wants AG_WANT_PICK or
     * AG_WANT_PICK_LP): the draw of each such row, indexed as argmax */
    const ag_pick *pick;
    /* [output rows] (both may be NULL when no row wants AG_WANT_CANDS or
     * AG_WANT_PICK_LP), indexed as argmax: each such row's request, and
     * where its candidates go (always filled for such a row; its logits row
     * may be left unwritten; an AG_WANT_CANDS row's argmax entry is
     * AG_ARGMAX_NONE, an AG_WANT_PICK_LP row's its token). */
    const ag_cands_req *cands_req;
    ag_cands           *cands;
    /* [output rows + 1] and [edit_start[output rows]] (both NULL: no row is
     * edited): output row k's edits are edits[edit_start[k] ..
     * edit_start[k + 1]), a sampler's steps 1-2 (ag_sampler_row_edits; no
     * token twice in a row). The pass applies them to the row before
     * anything reads it (ag_logit_edit_apply, after a final softcap): its
     * argmax, pick and candidates are the edited row's, and so is the row
     * written or fetched (ag_model_output_row). */
    const int32_t       *edit_start;
    const ag_logit_edit *edits;
    /* [output rows] (NULL: no row is masked): NULL, or the row's allowed
     * tokens as a bitmap of ceil(n_vocab / 32) words (token i: bit i % 32
     * of word i / 32), a structured output's mask (ag_schema_mask). The
     * pass sets every other token's logit to -inf after the row's edits,
     * before anything reads the row. */
    const uint32_t *const *allow;
    /* The last n_prompt tokens are prompt tokens, the others decode or
     * verify tokens (0: all decode). The two kinds go through different
     * matmul kernels (prompt: batched tiles; decode: row kernels), whose
     * float summation orders differ; within a kind a token's results never
     * depend on the rest of the batch. So a prompt's KV and logits are the
     * same however it is chunked, and a decoded token's the same whatever
     * else decodes with it; but KV written by decode is not bit-identical to
     * the same tokens' KV written as prompt: a cached prefix must be reused
     * only as far as it was computed as prompt (see the engine). */
    int n_prompt;
    /* NULL: none. Under ag_model_set_output_rows, these ids' logits are
     * computed too (the others past the prefix stay -inf); ignored when the
     * whole head is computed. */
    const ag_head_extra *head_extra;
} ag_batch;

/* Runs the model over the batch. Contract:
 * - every token's KV slot must already be reserved in `kv` (ag_kv_seq_reserve
 *   for its sequence up to pos + 1), and a token at position p of sequence s
 *   sees s's positions 0..p: earlier ones from the cache, later ones in this
 *   batch only if they precede it;
 * - logits receives one row of n_vocab floats per token with want_logits set,
 *   in batch order (caller-allocated: count × n_vocab), except AG_WANT_ARGMAX
 *   rows whose argmax went to b->argmax (see there);
 * Errors: bad token ids or positions (AG_ERR_INVALID), memory. */
ag_status ag_model_forward(ag_model *m, ag_kv *kv, const ag_batch *b, float *logits);

/* Whether forward computes AG_WANT_PICK rows' tokens where the logits are
 * (the backend has the pick op, the model no final logit softcap, and
 * AUGUR_PICK=0 is not set); otherwise a caller asks for the logits. */
bool ag_model_can_pick(const ag_model *m);

/* Whether forward takes AG_WANT_CANDS rows (unless AUGUR_CANDS=0). Their
 * candidates come from the backend's cands op where it has one and the
 * model has no final logit softcap, else from the rows on the host. */
bool ag_model_can_cands(const ag_model *m);

/* Whether forward applies a batch's edits (ag_batch.edits) where it
 * computes the rows, before their argmax, pick or candidates are found: on
 * the host, or through the backend's edit op. Then a sampler may take
 * edited rows (ag_sampler_take_edited_rows) and keep those paths. false (a
 * device without the op, or a final softcap on a device): edits would be
 * applied to the copied rows, no row may want a picked token, and a
 * fetched row would lack them, so callers keep bias and penalties in their
 * samplers. */
bool ag_model_can_edit(const ag_model *m);

/* The same for masks (ag_batch.allow): applied where the rows are computed
 * (on the host, or by the backend's mask op, without a final softcap on a
 * device); false: callers mask the copied rows themselves. */
bool ag_model_can_mask(const ag_model *m);

/* Limits the output head to the first n rows: forward computes the logits
 * of ids [0, n) only and sets the others to -inf, reading n / n_vocab of
 * the output matrix (a draft model's vocabulary prefix: byte-level BPE
 * vocabularies put their frequent tokens first). n <= 0 or >= n_vocab
 * computes every row again. Returns the limit in force: n_vocab where the
 * model cannot limit its rows (a device backend, or a final logit
 * softcap, which would turn -inf into a finite logit). */
int ag_model_set_output_rows(ag_model *m, int n);

/* Bytes of one row of the output matrix (in its file type). */
size_t ag_model_head_row_bytes(const ag_model *m);

/* Copies the output-matrix rows of ids[0..n) into dst (n *
 * ag_model_head_row_bytes bytes), for ag_head_extra. AG_ERR_INVALID for an
 * id outside the vocabulary. */
ag_status ag_model_head_rows_copy(const ag_model *m, const int32_t *ids, int n, void *dst);

/* Copies output row k (in batch order, as the logits array counts them) of
 * the last forward pass into out[n_vocab]: for an AG_WANT_CANDS row whose
 * candidates did not decide its token (ag_sampler_cands_enough), which a
 * device backend left where it computed it. Valid until the next forward
 * (or reserve); AG_ERR_INVALID for a row the pass did not output. */
ag_status ag_model_output_row(ag_model *m, int k, float *out);

#endif
