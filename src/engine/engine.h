/* The engine: one thread that owns a model and its KV cache and runs every
 * request through continuous batching.
 *
 * Each step the engine thread builds one ragged batch from all running
 * sequences: one token for every sequence that is decoding, then prompt
 * chunks of sequences still in prefill, up to n_batch tokens in all, so a
 * long prompt never freezes the other streams. It runs the forward pass,
 * samples, and reports each choice's new text through the request's
 * callback.
 *
 * While streams decode, a step's prompt tokens are chosen from the measured
 * cost of prompt and decode rows and a target inter-token latency
 * (itl_target_ms): on a GPU, where thousands of prompt tokens cost one
 * step, waiting prompts enter together; on a CPU, 64 a step keep the
 * streams smooth.
 *
 * KV blocks are taken as sequences grow, not booked for a request's worst
 * case: admission needs a slot (n_parallel) per choice and the blocks to
 * start, beside a block for every running choice's next step; when the
 * running sequences outgrow the pool, the newest request is preempted (its
 * KV copied to host memory and brought back bit for bit when blocks free
 * up), as vLLM does. A request that does not fit waits in the queue (behind
 * preempted ones), and a full queue is refused (AG_ERR_BUSY with a
 * message). n > 1 choices share the prompt's KV blocks by fork
 * (copy-on-write).
 *
 * Prefix cache (cache/cache.h): at admission a request adopts the longest
 * cached run of full prompt blocks (memory, else disk) and prefills only
 * the rest; when its prompt is fully prefilled its full blocks are
 * published for later requests. Blocks only the cache holds are free space
 * to admission (evicted least recently used when needed). Disk writes
 * happen behind, only while the engine has nothing to step.
 *
 * Threading: ag_engine_submit/cancel/stats are thread-safe and never block
 * on the engine's work. Callbacks run on the engine thread and must return
 * quickly (copy the event, signal a waiter). */
#ifndef AG_ENGINE_H
#define AG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cache/cache.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"
#include "sample/schema.h"
#include "spec/spec.h"
#include "tok/tok.h"

typedef struct ag_engine ag_engine;

/* Sequences an engine runs at most (n_parallel). */
#define AG_ENGINE_MAX_PARALLEL 256
/* The default latency target on a GPU (ag_engine_params.itl_target_ms):
 * an 8B Q4_K_M step of 64 decode rows takes about 16 ms on an H100 and its
 * prompt rows about 0.03-0.05 ms each, so 200 ms lets some 4,000 prompt
 * tokens in with them (vLLM and SGLang admit up to 8,192 a step there). */
#define AG_ENGINE_ITL_TARGET_GPU_MS 200.0

typedef struct {
    int         n_parallel; /* sequences running at once (choices count); default 4 */
    int         n_ctx;      /* tokens per sequence (prompt + output); default min(train ctx, 4096) */
    int         n_batch;    /* tokens per forward step; 0 (default): the device's, ag_engine_resolve_batch */
    /* Prompt tokens per step while other streams decode, at least; default
     * 64. More when the latency target allows (itl_target_ms). */
    int         n_prefill_decoding;
    /* Target time of a step that carries prompt tokens beside decoding
     * streams (their inter-token latency while prompts arrive), in ms: a
     * step takes as many prompt tokens as the measured costs fit in it.
     * 0 (default): the device's (ag_engine_resolve_itl_target); < 0: none,
     * n_prefill_decoding tokens a step. */
    double      itl_target_ms;
    int         max_queue;  /* requests waiting for admission; more are refused; default 64 */
    size_t      kv_bytes;   /* KV pool; 0: n_parallel full contexts on the CPU, all that a GPU's free
                               memory holds beside the scratch (admission queues what does not fit) */
    ag_kv_dtype kv_dtype;   /* default F16 */
    /* Speculative decoding (spec/spec.h): NULL = off. The factory is
     * borrowed and must outlive the engine; each choice gets its own source
     * from it. */
    const ag_draft_factory *draft;
    ag_spec_params          spec;
    /* Decode + verify rows per step beyond which no sequence drafts: a step
     * of that many rows is already compute-bound on this machine, so more
     * verify rows would cost about what they save. Default 16. */
    int spec_max_rows;
    /* Prefix cache (cache/cache.h): prompt KV is kept after its request, in
     * blocks (a prompt's last block in part), and adopted by any later
     * prompt that starts with the same tokens (same namespace), up to the
     * token. Default true. */
    bool        prefix_cache;
    /* Its disk tier: a directory (created if missing, one level) where those
     * blocks are written behind while the engine is idle and restored from
     * after a restart; NULL/"" = memory only. Borrowed for the call. A
     * directory that cannot be used turns the tier off with one warning. */
    const char *cache_dir;
    uint64_t    cache_disk_max; /* byte cap; 0 = min(32 GiB, 10% of the free space) */
    /* Its host tier (cache.h, HOST TIER): blocks evicted from the KV pool
     * kept in host memory, at most this many bytes; 0 = off. */
    uint64_t    cache_host_max;
} ag_engine_params;

ag_engine_params ag_engine_default_params(void);

/* The context per sequence an engine over m runs for a requested n_ctx:
 * n_ctx itself when > 0, else the default (the model's training context, at
 * most 4096). Everything sized for an engine (a draft model's KV, `augur
 * fit`) asks this, so they agree with the engine. */
int ag_engine_resolve_ctx(const ag_model *m, int n_ctx);

/* Tokens per forward step: n_batch when > 0, else the default for m's
 * device: AG_ENGINE_BATCH_CPU on the CPU, AG_ENGINE_BATCH_GPU on a GPU,
 * whose GEMMs want more rows per weight read (and whose quantized weights
 * are dequantized once per forward): `augur bench --device cuda -p 4096 -u
 * N`, 8B BF16 / Q4_K_M on an H100 (2026-12-06), N = 512 / 1024 / 2048 /
 * 4096: 24876 / 26551 / 27539 / 28836 and 15464 / 20245 / 23771 / 26100
 * tok/s. While streams decode, n_prefill_decoding caps a step's prompt rows
 * anyway, so the larger chunk does not stall them. */
#define AG_ENGINE_BATCH_CPU 512
#define AG_ENGINE_BATCH_GPU 4096
int ag_engine_resolve_batch(const ag_model *m, int n_batch);

/* The latency target for m's device: itl_target_ms itself when != 0, else
 * AG_ENGINE_ITL_TARGET_GPU_MS on a GPU and none (-1) on the CPU, whose
 * steps keep n_prefill_decoding prompt tokens (inter-token latency as it
 * always was there). */
double ag_engine_resolve_itl_target(const ag_model *m, double itl_target_ms);

/* The memory an engine holds at most, in bytes, by part. */
typedef struct {
    int      n_ctx, n_parallel;     /* as the engine resolves them */
    int32_t  n_blocks, block_size;  /* its KV pool */
    /* The model file, memory-mapped: every page a forward pass reads, and
     * of an untied token embedding table the pages of n_parallel * n_ctx
     * tokens' rows (a row is read only for a token seen); weights_max
     * counts the whole file, what a long-running server tends to. */
    uint64_t weights, weights_max;
    uint64_t kv;          /* the KV pool (n_parallel full contexts unless kv_bytes says) and its tables */
    /* Of kv, the sliding-window ring's pool (kv.h; 0 without one), its
     * window and layers, and what kv would be with every position of every
     * layer kept (AUGUR_KV_RING=0; = kv without a ring). */
    uint64_t kv_ring, kv_without_ring;
    int32_t  ring_window, n_ring_layers, n_layers;
    uint64_t scratch;     /* activations of an n_batch step and the backend's buffers (ag_model_scratch_bytes) */
    uint64_t buffers;     /* the engine's step buffers (tokens, logits rows) and per choice a sampler and
                             its tokens */
    uint64_t cache_index; /* the prefix cache's index with every pool block in the memory tier (the blocks
                             themselves are the KV pool's) */
    uint64_t cache_write_queue; /* its disk tier's write-behind buffer, at most (0 without cache_dir) */
    uint64_t cache_read_staging; /* its disk tier's restore staging, at most (0 without cache_dir) */
    uint64_t cache_host;         /* its host tier, at most (whole blocks of cache_host_max; 0: off) */
    int64_t  cache_host_tokens;  /* the tokens the host tier holds when full */
    uint64_t draft;       /* the draft factory at this n_ctx and n_parallel (ag_draft_factory.plan_bytes) */
    uint64_t total;       /* the sum */
    /* Of the total, what a device backend (a GPU) holds in its own memory:
     * the KV pool and the scratch (0 on the CPU). The weights' device copies
     * are not in it: they are there once the model is loaded (see
     * ag_model_device_memory). */
    uint64_t device;
} ag_engine_memory;

/* What ag_engine_new(m, tok, p) would hold once every sequence has filled
 * its context, computed by the same functions that size it (nothing is
 * allocated). Not counted: the tokenizer, the chat template, threads and
 * the program itself (`augur fit` measures those). Errors: ag_engine_new's
 * parameter errors. m is not changed (non-const: its backend answers). */
ag_status ag_engine_plan_memory(ag_model *m, const ag_tok *tok, const ag_engine_params *p, ag_engine_memory *out);

/* Starts the engine thread over a loaded model and its tokenizer (both
 * borrowed: they must outlive the engine). */
ag_status ag_engine_new(ag_model *m, const ag_tok *tok, const ag_engine_params *p, ag_engine **out);
/* Cancels every request (each gets its final event), stops and joins the
 * thread. NULL-safe. */
void ag_engine_free(ag_engine *e);

typedef enum {
    AG_FINISH_NONE = 0,  /* more events follow for this choice */
    AG_FINISH_STOP,      /* end-of-generation token or a stop string */
    AG_FINISH_LENGTH,    /* max_tokens or the context limit */
    AG_FINISH_CANCELLED, /* ag_engine_cancel or engine shutdown */
    AG_FINISH_ERROR,     /* see `error` */
} ag_finish;

typedef struct {
    int                     choice;   /* 0 .. n_choices-1 */
    int32_t                 token;    /* the token this event emits, or -1 */
    const char             *text;     /* newly releasable text (stop strings held back / removed) */
    size_t                  len;
    const ag_sample_result *sample;   /* token, logprob and alternatives; NULL when token < 0 */
    ag_finish               finish;   /* != NONE: the last event of this choice */
    const char             *error;    /* with AG_FINISH_ERROR */
    /* With AG_FINISH_STOP: the index in ag_gen_request.stops of the stop
     * string that ended the choice (what Anthropic's API reports as
     * stop_sequence); -1 otherwise (end-of-generation token, JSON object
     * closed, other finishes, non-final events). */
    int                     stop_index;
    /* > 0: a prompt token's score, not an output: `sample` holds the
     * logprob (and alternatives) of prompt token prompt_pos given the ones
     * before it (ag_gen_request.prompt_logprobs); choice 0, no text. */
    int prompt_pos;
    /* Usage so far (the request's, over all choices). */
    int    n_prompt, n_cached, n_generated;
    int    n_drafted, n_accepted; /* speculative decoding: draft tokens verified / accepted */
    int    n_spec_rounds, n_spec_emitted; /* forwards that verified drafts / tokens they emitted */
    double t_prefill_ms, t_decode_ms; /* wall time in prefill / decode steps so far */
} ag_gen_event;

/* Called on the engine thread. Event pointers are valid only for the call. */
typedef void (*ag_gen_callback)(void *user, const ag_gen_event *ev);

typedef struct {
    const int32_t     *prompt;    /* copied at submit */
    int                n_prompt;
    int                max_tokens; /* <= 0: until the context is full */
    int                n_choices;  /* >= 1 */
    ag_sample_params   sample;     /* copied (logit_bias too) */
    const char *const *stops;      /* copied */
    int                n_stops;
    bool               ignore_eos;
    /* Also score the prompt: one event per prompt token after the first
     * (prompt_pos = 1 .. n_prompt-1, in order, before any output) with its
     * logprob under the model's raw distribution and sample.n_logprobs
     * alternatives; what OpenAI's completions return for echo + logprobs.
     * Such a request does not reuse a cached prefix (every position's
     * logits are needed). */
    bool               prompt_logprobs;
    /* Only read (and score) the prompt: every choice then finishes with
     * AG_FINISH_LENGTH and no token (OpenAI's max_tokens 0 with echo). */
    bool               no_output;
    /* Structured output (JSON mode, a JSON schema, a forced tool call):
     * every choice's output is a text of this compiled schema
     * (sample/schema.h masks the logits each step; the choice stops when
     * the text is complete). The engine takes its own reference. NULL:
     * free text. */
    ag_schema         *schema;
    /* Speculative decoding for this request: 0 the engine's setting,
     * < 0 off, n > 0 at most n draft tokens per round. */
    int                spec_max;
    /* Prefix cache namespace (ag_cache_namespace of a cache_salt and/or an
     * API key): prompts of different namespaces never share cached KV.
     * 0 = the default namespace. */
    uint64_t           cache_ns;
    ag_gen_callback    cb;
    void              *user;
} ag_gen_request;

/* Queues a request. Errors (nothing was queued, no callback will come):
 * AG_ERR_CONTEXT for a prompt that leaves no room in the context (message
 * says "context_length_exceeded"), AG_ERR_INVALID or AG_ERR_RANGE for bad
 * parameters, AG_ERR_BUSY when the queue is full, AG_ERR_CAPACITY when the
 * request can never fit the KV pool, AG_ERR_NOMEM when out of memory.
 * On success *id names it for ag_engine_cancel; the callback receives a
 * final event (finish != NONE) for every choice, after which the engine
 * never touches `user` again. Callbacks may start (and even finish) before
 * ag_engine_submit returns. */
ag_status ag_engine_submit(ag_engine *e, const ag_gen_request *r, uint64_t *id);
/* Asks the engine to stop a request; its choices finish with
 * AG_FINISH_CANCELLED within one step and their KV blocks are freed. Unknown
 * or finished ids are ignored. */
void ag_engine_cancel(ag_engine *e, uint64_t id);

typedef struct {
    uint64_t requests_total, requests_finished;
    uint64_t prompt_tokens, generated_tokens, cached_tokens;
    double   prefill_seconds, decode_seconds; /* engine thread time in steps that prefilled / only decoded */
    int      queue_depth, running; /* running: choices started and not finished (preempted ones too) */
    int      swapped;               /* requests preempted, their KV in host memory */
    uint64_t preemptions;           /* requests preempted for KV blocks, in all */
    uint64_t steps, mixed_steps;    /* forward steps; those with prompt and decode rows together */
    int      max_mixed_prompt_tokens; /* the most prompt tokens a step carried beside decode rows */
    int      prompt_budget;         /* prompt tokens the last step with decode rows could take */
    double   prompt_step_fixed_ms, prompt_token_ms; /* the fitted cost of a step's prompt rows */
    int      kv_blocks_used, kv_blocks_free;
    int      kv_blocks_cached;  /* of the used ones, those only the prefix cache holds (reclaimable) */
    uint64_t kv_cow_copies;     /* shared blocks copied before a write (ag_kv_stats.cow_copies) */
    uint64_t kv_nomem_errors;   /* KV reservations the full pool refused (should stay 0: steps are sized to the free blocks) */
    int      n_ctx, n_parallel;
    ag_spec_stats spec;        /* speculative decoding, over finished and running choices' past rounds */
    uint64_t decode_forwards;  /* target forwards that decoded (each choice's row window counts once) */
    size_t   draft_bytes;      /* memory of the draft factory (a draft model's weights and KV pool) */
    bool           prefix_cache; /* the prefix cache is on (ag_engine_params.prefix_cache) */
    ag_cache_stats cache;        /* its counters (zero when off); taken at ag_engine_get_stats */
} ag_engine_stats;

void ag_engine_get_stats(ag_engine *e, ag_engine_stats *out);

#endif
