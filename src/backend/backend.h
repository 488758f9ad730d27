/* The backend op table: what a device must provide to run a model.
 *
 * A model (src/model) is a description of ops; it never touches device memory
 * directly. It asks its backend for buffers (alloc), hands it the weights
 * once at load (prepare_weight), calls the ops below on backend buffers, and
 * copies only what the host needs (the logits rows) back with download. The
 * CPU backend (src/backend/cpu) is the reference: every op of another backend
 * is tested against it with a stated tolerance (tests/unit/test_backend_ops.c).
 * Every backend implements every op (but moe: a backend without it refuses
 * MoE models at load): there is no per-op fallback to the CPU
 * (a device op that fell back would need its inputs copied back and forth
 * inside a step, which is never what a user of a GPU wants; a backend that
 * cannot run a model says so at load).
 *
 * Buffers are float32 arrays in the backend's memory (host memory for the
 * CPU, device memory for CUDA). Row-major: "x[n][d]" means n rows of d
 * floats. Host-side arguments (ids, positions, the batch layout, the KV
 * cache's bookkeeping) are plain host pointers; a device backend copies what
 * its kernels need.
 *
 * Ordering and errors: ops are issued in order on the backend's one stream
 * and may run asynchronously; a failure may surface at a later op or at
 * download/sync, as an ag_status (never an abort). */
#ifndef AG_BACKEND_H
#define AG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/argmax.h" /* ag_pick */
#include "base/status.h"

typedef struct ag_kv ag_kv;
struct ag_kv_mem;

/* A weight matrix or vector as stored in the model file: ne[0] elements per
 * row (contiguous), ne[1] rows (and ne[2] such matrices one after the other
 * for a stack of experts' matrices; else ne[2] = 1). `data` is borrowed (mmapped file); after the
 * backend's prepare_weight it is the backend's copy (device memory for a GPU),
 * and `host` keeps the file's bytes for whoever needs them on the host. */
typedef struct {
    const char *name;
    uint32_t    type; /* ag_tensor_type */
    int64_t     ne[4];
    size_t      row_bytes;
    const void *data;
    const void *host; /* the mapped file's bytes (== data on the CPU) */
} ag_tensor;

/* Where each token of a batch sits, for the attention and KV ops. */
typedef struct {
    int            n;
    const int32_t *pos; /* [n] */
    const int32_t *seq; /* [n] */
    /* rows [0, n_decode) are decode/verify rows, the rest prompt rows (as in
     * matmul): a backend may attend with a different kernel per kind, as
     * long as a decode row's result never depends on the rest of the batch */
    int n_decode;
    /* [output rows] the draws of the pass's rows that want a token picked
     * (the pick op), indexed by output row; NULL: none. Given to begin, so
     * a backend that replays recorded passes can upload them each pass. */
    const ag_pick *pick;
    /* [output rows] likewise, the requests of the rows that want their
     * candidates (the cands op); NULL: none */
    const ag_cands_req *cands_req;
    int                 n_out; /* output rows (pick's and cands_req's length) */
    /* [n_out + 1] and [edit_start[n_out]] (both NULL: none): output row k's
     * edits are edits[edit_start[k] .. edit_start[k + 1]) (the edit op,
     * ag_batch.edits); given to begin like the draws */
    const int32_t       *edit_start;
    const ag_logit_edit *edits;
    /* [n_out] (NULL: none): output row k's allowed tokens, a bitmap of
     * allow_words words or NULL (the mask op, ag_batch.allow); given to
     * begin like the draws */
    const uint32_t *const *allow;
    int                    allow_words;
} ag_batch_layout;

/* The shape of one attention layer. */
typedef struct {
    int   layer;
    int   n_head, n_head_kv, head_dim_k, head_dim_v;
    float scale;  /* multiplies q·k */
    int   window; /* 0: attend to all earlier positions; w > 0: only to pos - w < p <= pos (bidirectional: |p - pos| < w) */
    float softcap; /* 0: off */
    /* true (encoders): a token attends to every position of its sequence
     * up to the largest position of that sequence in this batch, later ones
     * included (no causal mask; the whole sequence must be in the batch).
     * Only backends with the layernorm op are given it (encoder models are
     * refused elsewhere at load). */
    bool  bidirectional;
    /* NULL, or n_head learned logits (gpt-oss's attention sinks) in the
     * backend's memory (the prepared F32 weight's data: device memory on
     * a GPU, as the biases are): head h's softmax runs over its scores and sinks[h] (a logit
     * in the scaled units of scale · q·k), whose weight goes nowhere (it
     * has no value row): out = Σ_j e^(s_j - m) V_j / (Σ_j e^(s_j - m) +
     * e^(sinks[h] - m)), m the largest of the scores and sinks[h]. Only
     * backends with attn_sinks set are given it (such models are refused
     * elsewhere at load). */
    const float *sinks;
} ag_attn_shape;

/* One Mamba-2 layer's mixer after its input projection (granitehybrid):
 * the weights (F32, in the backend's memory: the prepared tensors' data)
 * and sizes. conv channels C = d_inner +
 * 2 n_group d_state; a projected row is [z: d_inner][xBC: C][dt: n_head]. */
typedef struct {
    const float *conv_w; /* [C][d_conv], the causal depthwise conv (oldest tap first) */
    const float *conv_b; /* [C] */
    const float *dt_b;   /* [n_head], added before the softplus */
    const float *a;      /* [n_head], the (negative) decay per head: exp(softplus(dt) a) */
    const float *d;      /* [n_head], the skip x D */
    const float *norm_w; /* [d_inner], the gated RMSNorm's gain (groups of d_inner / n_group) */
    int          d_conv, d_inner, d_state, n_head, n_group;
    float        eps;
} ag_ssm_shape;

/* One sequence's rows of a batch for the Mamba-2 op: rows[0..n_rows) in
 * position order, its layer state (conv [d_conv-1][C] then SSM
 * [n_head][head_dim][d_state], updated in place) and, per row, NULL or
 * where the state reached after that row is copied (a snapshot); state
 * and snapshots in the backend's memory (the KV's state slots: kv/state.h),
 * rows and the snap array on the host. */
typedef struct {
    const int32_t *rows;
    int32_t        n_rows;
    float         *state;
    float *const  *snap;
} ag_ssm_run;

/* One layer's routed experts (a mixture-of-experts feed-forward, Qwen3-MoE
 * style): router logits h·gate_inpᵀ (+ gate_inp_b), softmax over the
 * n_expert of them, the n_used largest probabilities chosen (ties: the
 * lower expert id first), their weights those probabilities (divided by
 * their sum, at least 2^-14, when norm_w; then times w_scale), and the
 * output the weighted sum, in ascending expert id, of each chosen expert's
 * SiLU-gated feed-forward (act(h·gateᵀ) * (h·upᵀ)) · downᵀ.
 * gpt-oss (AG_MOE_GATE_TOPK_SOFTMAX, AG_MOE_ACT_SWIGLU_OAI): the n_used
 * largest router logits chosen, their weights the softmax over those
 * n_used logits alone; each expert's products take its biases (g = h·gateᵀ
 * + gate_b[e], u = h·upᵀ + up_b[e], y = act · downᵀ + down_b[e]) and the
 * clamped activation act = min(g, limit) · σ(alpha · min(g, limit)) ·
 * (clamp(u, -limit, limit) + 1).
 * Expert e's matrices are matrix e of the stacks (ne[2] = n_expert):
 * gate_exps and up_exps of ne {n_embd, n_ff_exp}, down_exps of ne
 * {n_ff_exp, n_embd}. */
#define AG_MOE_MAX_EXPERTS 512
enum { AG_MOE_GATE_SOFTMAX_TOPK = 0, AG_MOE_GATE_TOPK_SOFTMAX = 1 };
enum { AG_MOE_ACT_SILU = 0, AG_MOE_ACT_SWIGLU_OAI = 1 };
typedef struct {
    const ag_tensor *gate_inp; /* ne {n_embd, n_expert} */
    const ag_tensor *gate_exps, *up_exps, *down_exps;
    int              n_expert, n_used; /* 1 <= n_used <= n_expert <= AG_MOE_MAX_EXPERTS */
    bool             norm_w;
    float            w_scale;
    int              gating; /* AG_MOE_GATE_* */
    int              act;    /* AG_MOE_ACT_* */
    float            alpha, limit; /* AG_MOE_ACT_SWIGLU_OAI's */
    /* biases, each NULL or F32 in the backend's memory: the router's
     * [n_expert], the experts' gate and up [n_expert][n_ff_exp] and down
     * [n_expert][n_embd] */
    const float     *gate_inp_b, *gate_b, *up_b, *down_b;
} ag_moe_weights;

/* Expert e's matrix of a stack (ne[2] matrices): a 2-D view of the same
 * bytes (data and host moved to matrix e), named as the stack. */
ag_tensor ag_moe_expert_view(const ag_tensor *stack, int e);

/* The routing above for n rows, on the host (the CPU's op, and a device
 * backend's that routes on the host: the same choice from the same
 * logits): logits[n][n_expert] (overwritten), each row's n_used experts by
 * rank into sel[n][n_used] and their weights into wts[n][n_used]. */
void ag_moe_route_rows(const ag_moe_weights *w, float *logits, int n, int32_t *sel, float *wts);

/* How a device backend runs the routed rows (cuda/moe.cu), from the
 * routing (sel, wts: [n][k] by rank): the n·k (row, rank) entries grouped
 * by expert in ascending id, each expert's in batch order (so its decode
 * rows first); expert e's positions are start[e] .. start[e + 1]
 * (start: n_expert + 1), position p holds row src[p] for expert expert[p];
 * and per row i, ent[i][0..k) its positions ascending (its experts in
 * ascending id, the order of the output's sum) with their weights in
 * ent_w[i][..]. src, expert, ent, ent_w: n·k each; scratch: 2 n·k +
 * n_expert ints. Host memory. */
void ag_moe_plan(int n, int k, int n_expert, const int32_t *sel, const float *wts, int32_t *start, int32_t *src,
                 int32_t *expert, int32_t *ent, float *ent_w, int32_t *scratch);

typedef struct ag_backend ag_backend;

enum { AG_GRAPH_OFF = 0, AG_GRAPH_RECORDING = 1, AG_GRAPH_REPLAYED = 2 }; /* graph_begin's *state */

typedef struct {
    const char *name;
    /* true: buffers are plain host memory (the CPU); download/upload are
     * memcpy and the model may hand host arrays straight to ops. */
    bool host_memory;

    /* ---- memory ---- */
    /* A buffer of `bytes` in backend memory, 256-byte aligned, contents
     * unspecified; NULL when out of memory. */
    void *(*alloc)(ag_backend *, size_t bytes);
    void (*free)(ag_backend *, void *p); /* NULL-safe */
    ag_status (*upload)(ag_backend *, void *dst, const void *host_src, size_t bytes);
    /* Waits for every op issued before it, then copies. */
    ag_status (*download)(ag_backend *, void *host_dst, const void *src, size_t bytes);
    ag_status (*copy)(ag_backend *, void *dst, const void *src, size_t bytes); /* backend -> backend */
    /* Called once per weight tensor at load, before any op uses it: a device
     * backend copies t->data into its memory and points t->data there
     * (t->host keeps the file bytes). Tensors sharing host bytes (tied
     * embeddings) share one copy. NULL: nothing to do. */
    ag_status (*prepare_weight)(ag_backend *, ag_tensor *t);
    /* The memory the KV pool lives in (kv/kv.h ag_kv_mem), NULL for host
     * memory. Valid as long as the backend. */
    const struct ag_kv_mem *(*kv_mem)(ag_backend *);
    /* Waits for all issued ops; returns the first error any of them hit. */
    ag_status (*sync)(ag_backend *);
    void (*destroy)(ag_backend *);

    /* Optional: recording and replaying the ops of a forward pass. Between
     * graph_begin and graph_end the model issues the ops of one pass; a
     * backend that records them (CUDA graphs) replays the recording the next
     * time graph_begin sees the same `key` instead. *state says which:
     * AG_GRAPH_REPLAYED (the model issues nothing and does not call
     * graph_end), AG_GRAPH_RECORDING (the model issues the ops, then calls
     * graph_end), AG_GRAPH_OFF (issue the ops as usual; no graph_end: e.g.
     * a key whose recording failed before). `key` must identify every
     * argument of the pass's ops except the contents of the arrays begin()
     * uploaded (the model hashes the batch shape and its buffers). While
     * recording, the ops run only when graph_end launches the recording;
     * with `discard` (an op failed while recording) graph_end drops it.
     * When graph_end fails (or discards), nothing of the pass ran: the model
     * issues the ops again, unrecorded. A backend whose moe op waits for
     * the host mid-pass (CUDA's) answers OFF once it holds expert stacks.
     * NULL: no recording. */
    ag_status (*graph_begin)(ag_backend *, uint64_t key, int *state);
    ag_status (*graph_end)(ag_backend *, uint64_t key, bool discard);

    /* ---- ops ---- */
    /* Called once at the start of each forward pass, before any op, with
     * the arrays the pass's ops will receive (lay->pos is rope's pos, tokens
     * get_rows' ids) and the KV cache after the pass's slots are reserved;
     * they stay unchanged until the pass ends. A device backend copies them
     * (and the sequences' block tables) to the device once here. NULL:
     * nothing to do. */
    ag_status (*begin)(ag_backend *, ag_kv *kv, const ag_batch_layout *lay, const int32_t *tokens);
    /* y[n][w.ne[1]] = x[n][w.ne[0]] · Wᵀ, any supported weight type. Rows
     * [0, n_decode) are decode/verify rows, rows [n_decode, n) prompt rows:
     * each kind has its own kernels (see ag_batch.n_prompt); a row's result
     * depends only on its own x and its kind. */
    ag_status (*matmul)(ag_backend *, const ag_tensor *w, const float *x, int n, int n_decode, float *y);
    /* The same for n_w (1..4) weights with one x and ne[0] (Q/K/V, gate/up):
     * y[i] = x · w[i]ᵀ, bit-identical to n_w matmul calls, cheaper. */
    ag_status (*matmul_multi)(ag_backend *, const ag_tensor *const *w, int n_w, const float *x, int n, int n_decode,
                              float *const *y);
    /* out[i][:] = row ids[i] of w, dequantized. Ids are checked by the caller. */
    ag_status (*get_rows)(ag_backend *, const ag_tensor *w, const int32_t *ids, int n, float *out);
    /* out[i] = x[i] / rms(x[i]) * w, per row of `dim`; w may be NULL (no gain). out may alias x. */
    ag_status (*rmsnorm)(ag_backend *, const float *x, const float *w, int n, int dim, float eps, float *out);
    /* out[i] = (x[i] - mean(x[i])) / sqrt(var(x[i]) + eps) * w + b, per row
     * of `dim` (BERT's LayerNorm); w and b may be NULL (no gain, no bias).
     * out may alias x. NULL: the backend cannot run encoder models (the
     * model refuses them at load). */
    ag_status (*layernorm)(ag_backend *, const float *x, const float *w, const float *b, int n, int dim, float eps,
                           float *out);
    /* Rotary embedding in place on x[n][n_head][head_dim] over the first rope_dim
     * dims of each head, at positions pos[n]. neox: rotate pairs (i, i + rope_dim/2);
     * else adjacent pairs (2i, 2i + 1). */
    ag_status (*rope)(ag_backend *, float *x, int n, int n_head, int head_dim, int rope_dim,
                 const int32_t *pos, float base, float freq_scale, bool neox);
    /* The same with one frequency per pair, given: pair i turns by pos ·
     * freq[i] (freq: rope_dim / 2 floats, host memory), and the rotated
     * values are multiplied by mscale (YaRN's scaled frequencies and its
     * magnitude scaling). NULL: models whose rotary embedding needs it are
     * refused at load. */
    ag_status (*rope_freqs)(ag_backend *, float *x, int n, int n_head, int head_dim, int rope_dim,
                            const int32_t *pos, const float *freq, float mscale, bool neox);
    /* Whether attention honours ag_attn_shape.sinks. */
    bool attn_sinks;
    /* x[i][j] += b[j] for n rows of dim. */
    ag_status (*add_bias)(ag_backend *, float *x, const float *b, int n, int dim);
    /* y += x, n elements. */
    ag_status (*add)(ag_backend *, float *y, const float *x, size_t n);
    /* x += o, then out = rmsnorm(x) · w (n rows of dim): the bits of add
     * then rmsnorm, in one pass over x (a residual add and the next norm).
     * out must not alias x or o. NULL: the model calls add and rmsnorm. */
    ag_status (*add_rmsnorm)(ag_backend *, float *x, const float *o, const float *w, int n, int dim, float eps,
                             float *out);
    /* x *= s, n elements. */
    ag_status (*scale)(ag_backend *, float *x, float s, size_t n);
    /* gate[i] = act(gate[i]) * up[i], n elements; act is SiLU or GELU (tanh approx.). */
    ag_status (*silu_mul)(ag_backend *, float *gate, const float *up, size_t n);
    ag_status (*gelu_mul)(ag_backend *, float *gate, const float *up, size_t n);
    /* The feed-forward block: o[n][down.ne[1]] = (act(h·gateᵀ) * (h·upᵀ)) ·
     * downᵀ, act SiLU or (gelu) GELU. gate and up ([n][gate.ne[1]] each)
     * are the op's scratch: what they hold after is unspecified. Decode rows
     * [0, n_decode) give the bits of matmul_multi, silu_mul/gelu_mul and
     * matmul; prompt rows may keep the products in a narrower type (CUDA:
     * BF16, which its prompt GEMMs read anyway). NULL: the model calls
     * those three ops. */
    ag_status (*ffn)(ag_backend *, const ag_tensor *gate_w, const ag_tensor *up_w, const ag_tensor *down_w,
                     const float *h, int n, int n_decode, bool gelu, float *gate, float *up, float *o);
    /* The mixture-of-experts feed-forward (ag_moe_weights):
     * o[n][n_embd] from h[n][n_embd]. Rows [0, n_decode) are decode rows,
     * the rest prompt rows, as in matmul; a row's result depends only on
     * its own h and its kind (its experts' matmuls give it the bits they
     * give a row of its kind whatever else shares them, and the weighted
     * sum runs over its experts in a fixed order), so a token's bits never
     * depend on the rest of the batch. NULL: the backend cannot run MoE models (the model refuses
     * them at load). */
    ag_status (*moe)(ag_backend *, const ag_moe_weights *, const float *h, int n, int n_decode, float *o);
    /* The Mamba-2 mixer (ag_ssm_shape): from each projected row of zx
     * ([n][2 d_inner + 2 n_group d_state + n_head]) to y[n][d_inner] =
     * groupRMSNorm((scan(silu(conv(xBC))) + x D) * silu(z)), each run's
     * rows through its sequence's state in order (a row's result depends
     * only on its state and its own row). NULL: the backend cannot run
     * recurrent layers (the model refuses them at load). */
    ag_status (*mamba2)(ag_backend *, const ag_ssm_shape *, const float *zx, const ag_ssm_run *runs, int n_runs,
                        float *y);
    /* Stores k[n][n_head_kv*hd_k], v[n][n_head_kv*hd_v] at each token's (seq, pos)
     * in the layer's KV cache (the caller reserved the slots). */
    ag_status (*kv_store)(ag_backend *, ag_kv *, const ag_attn_shape *, const ag_batch_layout *,
                          const float *k, const float *v);
    /* rope(q) over sh->n_head heads and rope(k) over sh->n_head_kv heads (both
     * of sh->head_dim_k, as `rope` with these arguments), then kv_store(k, v):
     * the bits of those three calls, in one pass. NULL: the model calls them. */
    ag_status (*rope_kv_store)(ag_backend *, ag_kv *, const ag_attn_shape *, const ag_batch_layout *, float *q,
                               float *k, const float *v, int rope_dim, const int32_t *pos, float base,
                               float freq_scale, bool neox);
    /* out[i] = the argmax of row i of x[n][dim]: the lowest index among the
     * row's largest values (+inf and FLT_MAX alike, NaN skipped), or -2 when
     * no value of the row is finite. out is backend memory. NULL: the
     * caller scans the rows itself. */
    ag_status (*argmax)(ag_backend *, const float *x, int n, int dim, int32_t *out);
    /* out[i] = ag_pick_f32(row i of x[n][dim], dim, d.inv_temp, d.u) with
     * d = lay->pick[row0 + i] (the rows are the pass's output rows row0..;
     * lay is the one begin got), or -2 when no value of the row is finite.
     * A device backend may sum the weights in another (fixed) order: its
     * token can differ only where u times the sum lies within rounding of a
     * boundary. out is backend memory. NULL: the caller samples the rows. */
    ag_status (*pick)(ag_backend *, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                      int32_t *out);
    /* out[i] = ag_top_cands_f32(row i of x[n][dim], dim, &lay->cands_req[row0
     * + i]) (rows and lay as for pick): the row's best candidates, their
     * order and values exactly; a device backend may sum sumexp in another
     * (fixed) order. A request whose at is AG_CANDS_AT_TOKEN names tok[i]
     * (backend memory: the tokens pick wrote for these rows; NULL: none).
     * out is backend memory. NULL: the caller finds them in the rows. */
    ag_status (*cands)(ag_backend *, const float *x, int n, int dim, const ag_batch_layout *lay, int row0,
                       const int32_t *tok, ag_cands *out);
    /* x[k][e.id] = ag_logit_edit_apply(x[k][e.id], &e) for every edit e of
     * output rows k in [0, n) (lay's edits, which begin got; x[n][dim] the
     * pass's output rows), bit for bit. NULL: a device backend's rows are
     * copied back and edited on the host, nothing is computed from them on
     * the device, and callers keep bias and penalties in their samplers
     * (ag_model_can_edit). A host-memory backend needs none (the model edits
     * its rows in place). */
    ag_status (*edit)(ag_backend *, float *x, int n, int dim, const ag_batch_layout *lay);
    /* x[k][i] = -inf for every token i that output row k's bitmap (lay's
     * allow, which begin got) leaves out, rows k in [0, n) with a bitmap.
     * NULL: as for edit, callers mask copied rows (ag_model_can_mask). */
    ag_status (*mask)(ag_backend *, float *x, int n, int dim, const ag_batch_layout *lay);
    /* The device memory free now and in all (a GPU's). NULL: host memory only. */
    ag_status (*device_memory)(ag_backend *, uint64_t *free_bytes, uint64_t *total_bytes);
    /* out[n][n_head*hd_v] = softmax(scale · q·Kᵀ (causal, windowed)) · V, each
     * token attending to its own sequence's positions <= its pos. */
    ag_status (*attention)(ag_backend *, ag_kv *, const ag_attn_shape *, const ag_batch_layout *,
                           const float *q, float *out);
} ag_backend_ops;

struct ag_backend {
    const ag_backend_ops *ops;
    void                 *impl; /* backend-private state (thread pool, scratch, device) */
};

/* ---- choosing a backend ---- */
typedef enum {
    AG_DEVICE_AUTO = 0, /* CUDA when the build has it and a GPU is present, else the CPU */
    AG_DEVICE_CPU,
    AG_DEVICE_CUDA,
} ag_device;

/* Parses "auto", "cpu", "cuda"; false for anything else. */
bool        ag_device_parse(const char *s, ag_device *out);
const char *ag_device_name(ag_device d);
/* Whether this build has the CUDA backend and a usable GPU is present
 * (false in a build without it, never an error). */
bool ag_cuda_available(void);

/* ---- the CPU backend ---- */
typedef struct {
    int n_threads; /* 0: all online cores */
} ag_cpu_params;

ag_cpu_params ag_cpu_default_params(void);
/* Creates the CPU backend (thread pool and scratch). Free with ag_backend_free. */
ag_status ag_cpu_backend_new(const ag_cpu_params *p, ag_backend **out);
void      ag_backend_free(ag_backend *be); /* any backend; NULL-safe */
/* The CPU backend's thread count; 0 for another backend. */
int       ag_cpu_backend_threads(const ag_backend *be);
/* One line naming the CPU kernels that weights of the n_types given types
 * run on now, for benchmark reports, e.g. "isa avx2 (best avx2); decode:
 * avx2 dot; prompt: avx2 panel (Q5_0 Q4_K Q6_K), avx2 dot (Q8_0); amx: no".
 * Writes at most n bytes, NUL-terminated, to buf. */
void      ag_cpu_kernel_report(const uint32_t *types, int n_types, char *buf, size_t n);

/* Creates the backend for `dev` (AUTO resolved as above); the CPU params
 * apply to the CPU backend (and its host-side helpers). decode_rows_hint:
 * as ag_model_params' (no backend uses it now: the CUDA backend picks its
 * K-quant decode kernels per matmul, with the same bits either way). AG_ERR_UNSUPPORTED when CUDA is asked for in a build without it or
 * with no GPU present. */
ag_status ag_backend_new(ag_device dev, const ag_cpu_params *cpu, int decode_rows_hint, ag_backend **out);

/* Memory planning: what the backend keeps (it grows its buffers to the
 * largest call so far and keeps them) once it has run these calls. */
/* Activation scratch of one matmul call over w[0..n_w) (n_w > 1: the
 * matmul_multi group the model passes) with n_tokens rows, all decode or all
 * prompt, whichever needs more. The backend keeps one such buffer, grown to
 * the largest call. */
size_t ag_backend_matmul_scratch_bytes(ag_backend *be, const ag_tensor *const *w, int n_w, int n_tokens);
/* A copy of w the backend makes for its kernels on first use (e.g. AMX tile
 * layout), or 0. */
size_t ag_backend_weight_copy_bytes(ag_backend *be, const ag_tensor *w);
/* The moe op's own scratch (routing, one expert's group of rows and its
 * activations) for batches of up to n_tokens rows; its matmuls use the
 * matmul buffer above (over expert views, ag_moe_expert_view). 0 for a
 * backend without the op. */
size_t ag_backend_moe_scratch_bytes(ag_backend *be, const ag_moe_weights *w, int n_tokens);
/* x += o, then out = rmsnorm(x) · w (a residual add and the next norm):
 * the backend's add_rmsnorm where it has one, else add then rmsnorm (the
 * same bits either way). */
ag_status ag_backend_add_rmsnorm(ag_backend *be, float *x, const float *o, const float *w, int n, int dim, float eps,
                                 float *out);
/* Attention scratch for batches of up to n_tokens rows at positions below
 * n_ctx over a KV of block_size positions per block, for every thread. */
size_t ag_backend_attention_scratch_bytes(ag_backend *be, const ag_attn_shape *sh, int block_size, int n_tokens,
                                          int n_ctx);

#endif
