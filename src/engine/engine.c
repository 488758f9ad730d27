/* The engine thread: admission, continuous batching with chunked prefill,
 * sampling and streaming of every running request. See engine.h. */
#include "engine/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/switches.h"
#include "sample/schema.h"
#include "sample/stop.h"

/* Logits rows beyond the decode rows and prompt ends, for the rows of a
 * scored prompt (ag_gen_request.prompt_logprobs): such a prompt is prefilled
 * at most this many tokens per step. */
#define AG_ENGINE_SCORE_ROWS 64

/* Forgetting factor of the prompt-cost fit (prompt_cost_note): each
 * prompt-carrying step weighs this much less than the next one, so the fit
 * follows a backend whose speed changes (clocks, other processes). */
#define PROMPT_FIT_DECAY 0.9

typedef enum { CH_WAIT, CH_DECODE, CH_DONE } choice_state;

typedef struct {
    int          index;
    int32_t      seq; /* -1 until it has one */
    choice_state state;
    int32_t      pending; /* sampled, not yet fed back through the model */
    int          n_gen;
    int32_t     *sampled; /* every sampled token, in order (n_gen of them) */
    int          cap_sampled;
    ag_sampler  *sampler;
    ag_detok    *detok;
    ag_stop     *stop;
    ag_schema_matcher *constraint; /* structured output, else NULL */
    ag_spec_seq *spec;   /* speculative decoding, else NULL */
    int          d;      /* drafts in the current step's window */
    bool         edits_failed; /* this step's rows lack its sampler's edits (out of memory): it ends */
    bool         masked_in_pass; /* this step's row comes with its structured output's mask (note_row_mask) */
    int32_t      stop_index; /* the stop string that ended it, or -1 */
    /* Preempted (its request is on the swapped list): the KV history of its
     * sequence, ag_kv_seq_swap_out's copy in host memory, until swap_in. */
    bool         swapped; /* its sequence was swapped out (swap_len may be 0: nothing computed yet) */
    void        *swap;
    size_t       swap_bytes;
    int32_t      swap_len;
} choice;

typedef struct request {
    struct request  *next;
    uint64_t         id;
    int32_t         *prompt;
    int              n_prompt, max_tokens, n_choices, n_stops;
    ag_sample_params sp;
    ag_logit_bias   *bias;
    char           **stops;
    size_t          *stop_lens;
    bool             ignore_eos;
    ag_gen_callback  cb;
    void            *user;
    ag_sampler      *scorer; /* prompt_logprobs: raw distribution, n_logprobs alternatives; else NULL */
    bool             prompt_logprobs, no_output;
    ag_schema       *schema;      /* structured output (a reference), else NULL */
    int              spec_max;    /* ag_gen_request.spec_max */
    uint64_t         cache_ns;    /* ag_gen_request.cache_ns */
    int              n_published; /* prompt tokens given to the prefix cache so far */
    ag_cache_restore *restore;    /* its prefix is being read from the disk tier: out of the batch until done */
    ag_spec_stats    spec;        /* rounds of finished choices */
    /* engine-thread state */
    int              n_prefilled; /* prompt tokens already in choice 0's KV */
    int              in_batch;    /* prompt tokens in the current step's batch */
    int              n_done;
    int              n_cached;    /* prompt tokens whose KV came from the prefix cache */
    choice          *ch;
    double           t_admit, t_first, t_last;
    atomic_bool      cancel;
} request;

struct ag_engine {
    ag_model        *model;
    const ag_tok    *tok;
    ag_kv           *kv;
    ag_engine_params p;
    int              n_vocab, block_size, n_blocks;

    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            stopping, started;
    request        *queue_head, *queue_tail; /* guarded by mu */
    int             queue_len;
    uint64_t        next_id;
    request        *running; /* engine thread only (and mu for cancel lookups); newest first */
    /* Requests preempted for KV blocks (preempt): their sequences' KV is in
     * host memory until resume_swapped brings them back, oldest first, ahead
     * of anything queued. Written by the engine thread under mu. */
    request        *swapped;
    /* Choices of running and swapped requests that have not finished: the
     * slots of --parallel in use. */
    int             running_choices;
    ag_engine_stats stats; /* guarded by mu */

    /* The prefix cache (NULL: off). Called only from the engine thread,
     * never with mu held; its notify callback sets cache_wake under mu. */
    ag_cache *cache;
    bool      cache_wake; /* guarded by mu */
    int       n_restoring; /* running requests with a pending restore (engine thread) */
    bool      admit_blocked; /* the queue head did not fit at the last admission (guarded by mu) */
    bool     spec_warned; /* a draft source could not be made: said once */
    /* Measured time of decode-only steps by their row count, 1..max_rows
     * (exponential averages), from which the cost of one more verify row on
     * this machine and model follows (verify_row_cost), and what the decode
     * rows of a mixed step cost (decode_ms). */
    double  *step_ms;
    int     *step_seen;
    /* The cost of prompt rows beside the decode rows of a step: a weighted
     * least-squares fit of (step ms - decode_ms(decode rows)) = fixed + per
     * token x prompt tokens over the prompt-carrying steps (sums with
     * exponential forgetting), from which prompt_budget sizes a step for
     * the inter-token latency target. */
    double   pf_w, pf_x, pf_y, pf_xx, pf_xy;
    /* Requests admitted, ended, preempted or resumed so far, and as of the
     * last refresh of the stats' KV counters (update_kv_stats_if), and its
     * time. */
    uint64_t set_changes, stats_changes;
    double   stats_ms;
    /* AUGUR_SPEC_ROW_COST=x (>= 0): the cost of a verify row, fixed instead
     * of measured, so that sampled speculative runs draft the same lengths
     * every time (A/B comparisons, tests); -1: measured */
    float    fixed_row_cost;

    /* per-step buffers */
    int32_t *b_tok, *b_pos, *b_seq;
    uint8_t *b_want;
    ag_pick *b_pick; /* [logit_rows] the draws of AG_WANT_PICK rows, by output row */
    ag_cands_req *b_cands_req; /* [logit_rows] the requests of AG_WANT_CANDS rows, by output row */
    ag_cands     *cands;       /* [logit_rows] their candidates (ag_batch.cands) */
    int32_t *argmax; /* [logit_rows]: the rows' argmax or picked token where the backend found it (ag_batch.argmax) */
    /* the rows' edits (ag_batch.edits): a sampler with logit bias or
     * penalties has them applied where the logits are (note_row_edits) */
    int32_t       *b_edit_start; /* [logit_rows + 1] */
    ag_logit_edit *b_edits;      /* [cap_edits], n_edits used this step */
    size_t         n_edits, cap_edits;
    bool           edits_off; /* AUGUR_EDITS=0 (A/B, tests): samplers apply their bias and penalties to raw rows */
    /* structured outputs' masks applied where the logits are (ag_batch.allow,
     * note_row_mask): a bitmap a row, made on the first masked row */
    const uint32_t **b_allow;   /* [logit_rows] */
    uint32_t        *allow_bits; /* [logit_rows][allow_words] */
    int              allow_words;
    bool             any_allow;  /* this step has a masked row */
    bool             masks_off;  /* AUGUR_MASKS=0 (A/B, tests), or a model that cannot mask: rows copied and masked */
    float   *logits;
    float   *masked; /* [n_vocab]: a row with a structured output's mask applied */
    ag_schema_vocab *schema_vocab; /* the mask's tables, built on the first structured request */
    int      max_rows;
    int      logit_rows; /* rows e->logits holds */
    struct row_owner {
        request *r;
        choice  *c;     /* NULL: a prompt row; else the first of n_rows rows of its window */
        int      p_pos; /* prompt rows: the position; the last one starts the choices, the others score p_pos+1 */
        int      n_rows;
        uint8_t  want; /* the row's want_logits (AG_WANT_CANDS: its candidates are in e->cands) */
    } *rows;
    ag_buf text, scratch;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

ag_engine_params ag_engine_default_params(void) {
    ag_engine_params p = {.n_parallel = 4, .n_ctx = 0, .n_batch = 0, .n_prefill_decoding = 64, .itl_target_ms = 0,
                          .max_queue = 64,
                          .kv_bytes = 0, .kv_dtype = AG_KV_F16, .draft = NULL, .spec = ag_spec_default_params(),
                          .spec_max_rows = 16, .prefix_cache = true, .cache_dir = NULL, .cache_disk_max = 0};
    return p;
}

int ag_engine_resolve_ctx(const ag_model *m, int n_ctx) {
    if (n_ctx > 0) return n_ctx;
    int train = ag_model_config_of(m)->n_ctx_train;
    return train < 4096 ? train : 4096;
}

double ag_engine_resolve_itl_target(const ag_model *m, double itl_target_ms) {
    if (itl_target_ms != 0) return itl_target_ms;
    return ag_model_device(m) == AG_DEVICE_CPU ? -1.0 : AG_ENGINE_ITL_TARGET_GPU_MS;
}

int ag_engine_resolve_batch(const ag_model *m, int n_batch) {
    if (n_batch > 0) return n_batch;
    return ag_model_device(m) == AG_DEVICE_CPU ? AG_ENGINE_BATCH_CPU : AG_ENGINE_BATCH_GPU;
}

static int blocks_for(const ag_engine *e, int tokens) { return (tokens + e->block_size - 1) / e->block_size; }

/* Worst-case KV blocks of a request running alone: choice 0's whole
 * length, and for each other choice all but the prompt's full blocks,
 * which the choices share (fork; a request alone is never preempted, which
 * would copy them apart). A request over the whole pool can never run and
 * is refused at submit; every other one can. */
static int request_blocks(const ag_engine *e, const request *r) {
    const int whole = blocks_for(e, r->n_prompt + r->max_tokens);
    return whole + (r->n_choices - 1) * (whole - r->n_prompt / e->block_size);
}

/* Blocks new work may take now: the pool's free ones and those only the
 * prefix cache holds (ag_cache_evict frees them on demand). The cache's
 * count walks its memory tier, so it is only asked when the free blocks
 * alone fall short of `want` (a long-running GPU server holds tens of
 * thousands of cached blocks, and this is asked every step). */
static int blocks_available(const ag_engine *e, int want) {
    const int free_now = ag_kv_free_blocks(e->kv);
    if (free_now >= want || !e->cache) return free_now;
    return free_now + ag_cache_reclaimable(e->cache);
}

/* Frees reclaimable prefix-cache blocks until the pool has `need` free
 * (what the reservations about to be made take). */
static void make_room(ag_engine *e, int need) {
    const int free_now = ag_kv_free_blocks(e->kv);
    if (e->cache && need > free_now) ag_cache_evict(e->cache, need - free_now);
}

static void request_free(request *r) {
    if (!r) return;
    if (r->ch)
        for (int i = 0; i < r->n_choices; i++) {
            ag_sampler_free(r->ch[i].sampler);
            ag_detok_free(r->ch[i].detok);
            ag_stop_free(r->ch[i].stop);
            free(r->ch[i].sampled);
            ag_schema_matcher_free(r->ch[i].constraint);
            ag_spec_seq_free(r->ch[i].spec);
        }
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->stop_lens);
    free(r->ch);
    free(r->bias);
    free(r->prompt);
    ag_sampler_free(r->scorer);
    ag_schema_unref(r->schema);
    free(r);
}

static void fill_usage(const request *r, ag_gen_event *ev) {
    int gen = 0;
    ag_spec_stats sp = r->spec;
    for (int i = 0; i < r->n_choices; i++) {
        gen += r->ch ? r->ch[i].n_gen : 0;
        if (r->ch && r->ch[i].spec) ag_spec_stats_add(&sp, ag_spec_get_stats(r->ch[i].spec));
    }
    ev->n_drafted = (int)sp.drafted;
    ev->n_accepted = (int)sp.accepted;
    ev->n_spec_rounds = (int)sp.rounds;
    ev->n_spec_emitted = (int)sp.emitted;
    ev->n_prompt = r->n_prompt;
    ev->n_cached = r->n_cached;
    ev->n_generated = gen;
    double first = r->t_first > 0 ? r->t_first : r->t_last;
    ev->t_prefill_ms = r->t_admit > 0 && first > 0 ? first - r->t_admit : 0;
    ev->t_decode_ms = r->t_first > 0 && r->t_last > r->t_first ? r->t_last - r->t_first : 0;
}

/* Refreshes the KV counters of the stats: when forced, when requests
 * started, ended or moved since the last refresh, and otherwise every 100
 * ms at most (the pool's and the cache's counts scan every block, which at
 * a GPU pool's tens of thousands of blocks costs a fair share of a
 * batch-1 decode step). */
static void update_kv_stats_if(ag_engine *e, bool force) {
    const double t = now_ms();
    if (!force && e->set_changes == e->stats_changes && t - e->stats_ms < 100.0) return;
    e->stats_changes = e->set_changes;
    e->stats_ms = t;
    ag_kv_stats ks;
    ag_kv_get_stats(e->kv, &ks);
    int cached = e->cache ? ag_cache_reclaimable(e->cache) : 0;
    pthread_mutex_lock(&e->mu);
    e->stats.kv_blocks_used = ks.blocks_used;
    e->stats.kv_blocks_free = ks.blocks_free;
    e->stats.kv_blocks_cached = cached;
    e->stats.kv_cow_copies = ks.cow_copies;
    e->stats.kv_nomem_errors = ks.nomem_errors;
    pthread_mutex_unlock(&e->mu);
}

static void update_kv_stats(ag_engine *e) { update_kv_stats_if(e, true); }

/* Gives r's prompt KV to the prefix cache: positions computed as prompt
 * so far ([0, n_prefilled), all of the prompt once it is prefilled), in
 * whole blocks only unless with_tail, which adds the trailing partial block
 * (a prompt's last n_prompt % block_size tokens). Only choice 0 computed
 * the prompt; what was published is not published again.
 *
 * When the trailing partial block goes: at release_seq, not when the
 * prompt is prefilled. Published at prefill, it would be shared with the
 * cache while this very request decodes into it, so every request would
 * copy it at its first decode step (copy-on-write: one block more per
 * request). Published when choice 0 ends, it costs
 * nothing: its positions past the prompt, written by decode, are never
 * read by an adopter, which adopts at most the prompt's positions of it
 * and copies the block before it writes. The full blocks still go at
 * prefill, so that requests admitted meanwhile share them. */
static void publish_prompt(ag_engine *e, request *r, bool with_tail) {
    if (!e->cache || !r->ch || r->ch[0].seq < 0) return;
    int n = r->n_prefilled < r->n_prompt ? r->n_prefilled : r->n_prompt;
    if (!with_tail) n -= n % e->block_size;
    if (n <= r->n_published) return;
    ag_cache_publish(e->cache, r->ch[0].seq, r->prompt, n, r->cache_ns);
    r->n_published = n;
}

/* Gives up a finished choice's sequence. Choice 0 of a request that did not
 * fail first publishes what it prefilled (a request cancelled mid-prefill
 * still leaves its computed blocks for the next try); only prompt-written
 * KV is ever published: the generated tokens' KV came from the decode
 * kernels, whose rounding differs from the prompt kernels' (see
 * ag_batch.n_prompt), so reusing it would make a follow-up request's output
 * depend on whether its history was cached. */
static void release_seq(ag_engine *e, request *r, choice *c, ag_finish why) {
    if (c->seq < 0) return;
    if (c->index == 0 && r->restore) { /* ended while its prefix was being read */
        ag_cache_restore_cancel(e->cache, r->restore);
        r->restore = NULL;
        e->n_restoring--;
    }
    if (c->index == 0 && why != AG_FINISH_ERROR) publish_prompt(e, r, true);
    ag_kv_seq_free(e->kv, c->seq);
    c->seq = -1;
}

/* Drops a preempted choice's host copy of its KV (it ended while swapped,
 * or was brought back). */
static void drop_swap(ag_engine *e, choice *c) {
    if (!c->swap) return;
    ag_kv_host_free(e->kv, c->swap);
    c->swap = NULL;
    c->swap_bytes = 0;
}

/* r's first sequence starts with n cached prompt tokens. */
static void prefix_adopted(ag_engine *e, request *r, int32_t n) {
    if (n <= 0) return;
    pthread_mutex_lock(&e->mu);
    e->stats.cached_tokens += (uint64_t)n;
    pthread_mutex_unlock(&e->mu);
    r->n_prefilled = r->n_cached = n;
}

/* Starts r's first sequence from the longest cached prefix of its prompt
 * (at least one prompt token is left to compute, for the logits); it may
 * end inside a block, which the first write then copies (a block the
 * step's sizing counts: ag_kv_reserve_cost). When part of it is read from
 * disk, r waits out of the batch (r->restore) while the other requests go
 * on; poll_restores brings it in. */
static void reuse_prefix(ag_engine *e, request *r) {
    if (!e->cache || r->prompt_logprobs) return; /* every position's logits are wanted */
    int32_t max_len = r->n_prompt - 1;
    int32_t n = ag_cache_lookup_start(e->cache, r->ch[0].seq, r->prompt, r->n_prompt, max_len, r->cache_ns,
                                      &r->restore);
    if (r->restore) e->n_restoring++;
    else prefix_adopted(e, r, n);
}

/* Moves what the disk reader has finished into the waiting requests' KV;
 * a request whose restore is over prefills its tail from this step on. */
static void poll_restores(ag_engine *e) {
    if (!e->n_restoring) return;
    for (request *r = e->running; r; r = r->next) {
        int32_t n;
        if (!r->restore || !ag_cache_restore_poll(e->cache, r->restore, &n)) continue;
        r->restore = NULL;
        e->n_restoring--;
        prefix_adopted(e, r, n);
    }
}

/* Ends one choice: frees its sequence and reports the final event with
 * whatever text the detokenizer and stop matcher still held (unless the end
 * is a stop string or a cancellation, which release nothing). */
static void finish_choice(ag_engine *e, request *r, choice *c, ag_finish why, const char *error,
                          int32_t token, const ag_sample_result *sr, const char *text, size_t len) {
    ag_buf_clear(&e->text);
    if (len) ag_buf_append(&e->text, text, len);
    if (why == AG_FINISH_LENGTH || why == AG_FINISH_STOP) {
        if (c->detok && c->stop) {
            ag_buf_clear(&e->scratch);
            ag_detok_flush(c->detok, &e->scratch);
            ag_stop_result res;
            if (e->scratch.len && ag_stop_feed(c->stop, e->scratch.data, e->scratch.len, &res) == AG_OK && res.len)
                ag_buf_append(&e->text, res.text, res.len);
            if (ag_stop_finish(c->stop, &res) == AG_OK && res.len) ag_buf_append(&e->text, res.text, res.len);
        }
    }
    release_seq(e, r, c, why);
    drop_swap(e, c);
    if (c->spec) { /* its counters stay in the request's usage; its memory goes now */
        ag_spec_stats_add(&r->spec, ag_spec_get_stats(c->spec));
        ag_spec_seq_free(c->spec);
        c->spec = NULL;
    }
    c->state = CH_DONE;
    r->n_done++;
    e->running_choices--;
    r->t_last = now_ms();
    ag_gen_event ev = {.choice = c->index, .token = token, .text = ag_buf_cstr(&e->text), .len = e->text.len,
                       .sample = token >= 0 ? sr : NULL, .finish = why, .error = error,
                       .stop_index = why == AG_FINISH_STOP ? c->stop_index : -1};
    fill_usage(r, &ev);
    r->cb(r->user, &ev);
}

/* Takes r out of the list at *head (the running or the swapped list);
 * mu held. */
static void list_remove(request **head, request *r) {
    for (request **pp = head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

/* Puts r into the list at *head, which stays ordered newest (highest id)
 * first; mu held. */
static void list_insert(request **head, request *r) {
    request **pp = head;
    while (*pp && (*pp)->id > r->id) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
}

/* Ends a finished request's life: out of the running or swapped list,
 * counted, freed. The lists are written only by the engine thread and only
 * under mu (ag_engine_cancel reads them from other threads). */
static void unlink_running(ag_engine *e, request *r) {
    pthread_mutex_lock(&e->mu);
    list_remove(&e->running, r);
    list_remove(&e->swapped, r);
    e->set_changes++;
    e->stats.requests_finished++;
    e->stats.running = e->running_choices;
    pthread_mutex_unlock(&e->mu);
    request_free(r);
}

static void finish_request(ag_engine *e, request *r, ag_finish why, const char *error) {
    for (int i = 0; i < r->n_choices; i++)
        if (r->ch[i].state != CH_DONE) finish_choice(e, r, &r->ch[i], why, error, -1, NULL, NULL, 0);
}

/* Emits one decided token of a choice (already accepted into its sampler):
 * records it, then ends the choice on an end-of-generation token, a stop
 * string, the end of a JSON object or the length limit, or streams its
 * text. This is the only place output tokens leave the engine, whether they
 * come from plain decoding or from a verify window. Returns whether the
 * choice goes on. */
static bool emit_token(ag_engine *e, request *r, choice *c, int32_t token, const ag_sample_result *srp) {
    ag_sample_result sr = *srp;
    ag_status        st;
    if (c->n_gen == c->cap_sampled) {
        int cap = c->cap_sampled ? 2 * c->cap_sampled : 64;
        int32_t *p = realloc(c->sampled, sizeof *p * (size_t)cap);
        if (!p) {
            finish_choice(e, r, c, AG_FINISH_ERROR, "out of memory", -1, NULL, NULL, 0);
            return false;
        }
        c->sampled = p;
        c->cap_sampled = cap;
    }
    c->sampled[c->n_gen] = token;
    c->n_gen++;
    double t = now_ms();
    if (r->t_first == 0) r->t_first = t;
    r->t_last = t;
    pthread_mutex_lock(&e->mu);
    e->stats.generated_tokens++;
    pthread_mutex_unlock(&e->mu);

    /* under a schema the mask lets an end token through only where the output may end */
    if ((!r->ignore_eos || c->constraint) && ag_tok_is_eog(e->tok, token)) {
        finish_choice(e, r, c, AG_FINISH_STOP, NULL, token, &sr, NULL, 0);
        return false;
    }
    ag_buf_clear(&e->scratch);
    ag_detok_push(c->detok, token, &e->scratch);
    ag_stop_result res = {0};
    if ((st = ag_stop_feed(c->stop, ag_buf_cstr(&e->scratch), e->scratch.len, &res))) {
        finish_choice(e, r, c, AG_FINISH_ERROR, ag_error_message(), token, &sr, NULL, 0);
        return false;
    }
    if (res.stopped) {
        /* The text before the stop string is the last piece; after a stop the
         * matcher releases nothing more, so finishing adds nothing. */
        c->stop_index = res.stop_index;
        finish_choice(e, r, c, AG_FINISH_STOP, NULL, token, &sr, res.text, res.len);
        return false;
    }
    if (c->constraint) {
        size_t      plen;
        const char *piece = ag_tok_piece(e->tok, token, &plen);
        /* the mask let only continuing tokens through, so this cannot fail */
        if (!piece || !ag_schema_feed(c->constraint, piece, plen)) {
            finish_choice(e, r, c, AG_FINISH_ERROR, "structured output: the output left the schema", token, &sr,
                          res.text, res.len);
            return false;
        }
        if (ag_schema_done(c->constraint)) { /* the value is complete: nothing may follow */
            finish_choice(e, r, c, AG_FINISH_STOP, NULL, token, &sr, res.text, res.len);
            return false;
        }
    }
    int len_now = r->n_prompt + c->n_gen; /* tokens the sequence would hold after feeding this one */
    if (c->n_gen >= r->max_tokens || len_now >= e->p.n_ctx) {
        finish_choice(e, r, c, AG_FINISH_LENGTH, NULL, token, &sr, res.text, res.len);
        return false;
    }
    c->pending = token;
    c->state = CH_DECODE;
    ag_gen_event ev = {.choice = c->index, .token = token, .text = res.text, .len = res.len, .sample = &sr,
                       .finish = AG_FINISH_NONE, .stop_index = -1};
    fill_usage(r, &ev);
    r->cb(r->user, &ev);
    return true;
}

/* The verify executor's view of a choice (ag_spec_sink). */
typedef struct {
    ag_engine *e;
    request   *r;
    choice    *c;
} choice_sink;

static const float *sink_prepare(void *user, const float *row) {
    choice_sink *x = user;
    if (!x->c->constraint || x->c->masked_in_pass) return row; /* (masked where it was computed) */
    /* structured output: only tokens that continue an accepted text */
    memcpy(x->e->masked, row, sizeof(float) * (size_t)x->e->n_vocab);
    ag_schema_mask(x->c->constraint, x->e->masked);
    return x->e->masked;
}

static bool sink_emit(void *user, int32_t token, const ag_sample_result *sr) {
    choice_sink *x = user;
    return emit_token(x->e, x->r, x->c, token, sr);
}

/* Whether a choice's rows this step must be masked on the host (a
 * structured output whose row the pass does not mask: see note_row_mask). */
static bool masks_rows(const choice *c) { return c->constraint && !c->masked_in_pass; }

/* Whether a choice's decisions need nothing but each row's argmax (greedy,
 * no logprobs; bias and penalties come applied to the rows,
 * note_row_edits, and a structured output's mask, note_row_mask): its rows
 * may stay on a device. */
static bool wants_argmax_only(const choice *c) { return !masks_rows(c) && ag_sampler_argmax_only(c->sampler); }

/* Whether a choice's next decision (no drafts this step) needs nothing but
 * a token drawn with its sampler's uniform, which the backend can draw
 * where the logits are (ag_model_can_pick): temperature only, no logprobs,
 * truncation or schema (bias and penalties come applied to the rows). */
static bool wants_pick(const ag_engine *e, const choice *c) {
    return !masks_rows(c) && c->d == 0 && ag_sampler_pick_only(c->sampler) && ag_model_can_pick(e->model);
}

/* Whether a choice's decisions this step (a plain row, or each row of a
 * verify window) need no more of their rows than the best candidates
 * (ag_sampler_cands_req: top-k or top-p sampling, greedy with logprobs; no
 * schema; bias and penalties come applied to the rows), filling *req. */
static bool wants_cands(const ag_engine *e, const choice *c, ag_cands_req *req) {
    return !masks_rows(c) && ag_model_can_cands(e->model) && ag_sampler_cands_req(c->sampler, req);
}

/* Whether a choice's next decision (no drafts this step) is a pick-only
 * one but for logprobs (ag_sampler_pick_logprobs): the backend draws the
 * token and finds the row's candidates naming it. */
static bool wants_pick_lp(const ag_engine *e, const choice *c) {
    return !masks_rows(c) && c->d == 0 && ag_sampler_pick_logprobs(c->sampler, NULL) && ag_model_can_pick(e->model) &&
           ag_model_can_cands(e->model);
}

/* Output row k's mask for choice c (a structured output) into the batch
 * (ag_batch.allow): the tokens ag_schema_mask lets through at the
 * matcher's position, as a bitmap (a verify row's: past the drafts before
 * it, note_window_masks). false (rows masked on the host): masks off, or
 * out of memory. */
static bool note_row_mask(ag_engine *e, int k, choice *c) {
    if (e->masks_off || !c->constraint) return false;
    if (!e->allow_bits) {
        e->allow_words = (e->n_vocab + 31) / 32;
        e->allow_bits = malloc(sizeof(uint32_t) * (size_t)e->allow_words * (size_t)e->logit_rows);
        if (!e->allow_bits) return false;
    }
    uint32_t *bits = e->allow_bits + (size_t)k * (size_t)e->allow_words;
    ag_schema_allowed_bits(c->constraint, bits, e->n_vocab);
    e->b_allow[k] = bits;
    e->any_allow = true;
    return true;
}

/* The masks of a masked choice's verify rows k0 + 1 .. k0 + d (its drafts
 * x[0..d)): each after the drafts before it, fed to the matcher, which
 * then returns to its position. Once a draft is refused (or ends the
 * output) the rows after it get none: the masked row before refuses that
 * draft, so the verify rule never reads them. */
static void note_window_masks(ag_engine *e, int k0, choice *c, const int32_t *x, int d) {
    if (!c->masked_in_pass || d <= 0) return;
    ag_schema_matcher_save(c->constraint);
    for (int j = 0; j < d; j++) {
        size_t      plen = 0;
        const char *piece = ag_tok_is_eog(e->tok, x[j]) ? NULL : ag_tok_piece(e->tok, x[j], &plen);
        if (!piece || !ag_schema_feed(c->constraint, piece, plen) || !note_row_mask(e, k0 + 1 + j, c)) break;
    }
    ag_schema_matcher_restore(c->constraint);
}

/* The row's want for a choice's decode row, drawing its uniform now when
 * the backend is to pick the token (the draw ag_sampler_sample would make
 * after the step: the same RNG sequence). A structured output's row is
 * masked where it is computed when it can be (note_row_mask). */
static uint8_t decode_want(ag_engine *e, choice *c, int out_row) {
    c->masked_in_pass = note_row_mask(e, out_row, c);
    if (wants_argmax_only(c)) return AG_WANT_ARGMAX;
    if (wants_pick(e, c) && ag_sampler_draw_pick(c->sampler, &e->b_pick[out_row]) == AG_OK) return AG_WANT_PICK;
    if (wants_pick_lp(e, c) && ag_sampler_draw_pick(c->sampler, &e->b_pick[out_row]) == AG_OK) {
        ag_sampler_pick_logprobs(c->sampler, &e->b_cands_req[out_row]);
        return AG_WANT_PICK_LP;
    }
    if (wants_cands(e, c, &e->b_cands_req[out_row])) return AG_WANT_CANDS;
    return AG_WANT_LOGITS;
}

/* Output row k's candidates for choice c (its row wanted AG_WANT_CANDS), or
 * NULL with the row fetched into e->logits when they do not decide its
 * sampler's token (a top-p cut past them; ag_sampler_cands_enough). */
static const ag_cands *row_cands(ag_engine *e, choice *c, int k) {
    if (ag_sampler_cands_enough(c->sampler, &e->cands[k])) return &e->cands[k];
    if (ag_model_output_row(e->model, k, e->logits + (size_t)k * e->n_vocab) == AG_OK) return NULL;
    /* then the sampler refuses the candidates and the choice ends with the error */
    AG_LOGW("output row %d could not be fetched: %s", k, ag_error_message());
    return &e->cands[k];
}

/* Decides and emits a choice's next token(s) from its window of logits
 * rows: [pending, c->d drafts] (c->d = 0: plain decoding, one row), their
 * argmax as the backend found it (ag_batch.argmax), and (NULL unless the
 * rows wanted them) each row's candidates (ag_batch.cands; see row_cands). */
static void advance_choice(ag_engine *e, request *r, choice *c, const float *rows, const int32_t *argmax,
                           const ag_cands *const *cands) {
    choice_sink   x = {e, r, c};
    ag_spec_sink  sink = {sink_prepare, sink_emit, &x};
    ag_spec_round rd;
    int           d = c->d;
    c->d = 0;
    ag_status st = ag_spec_verify(c->spec, c->sampler, r->sp.logprobs || r->sp.n_logprobs > 0, rows, argmax, cands,
                                  (size_t)e->n_vocab, d, e->kv, c->seq, &sink, &rd);
    pthread_mutex_lock(&e->mu);
    ag_spec_stats_add_round(&e->stats.spec, &rd);
    e->stats.decode_forwards++;
    pthread_mutex_unlock(&e->mu);
    if (st && c->state != CH_DONE) finish_choice(e, r, c, AG_FINISH_ERROR, ag_error_message(), -1, NULL, NULL, 0);
}

/* Records a decode-only step of `rows` rows that took ms. */
static void note_step_time(ag_engine *e, int rows, double ms) {
    if (rows < 1 || rows > e->max_rows) return;
    double *t = &e->step_ms[rows];
    *t = e->step_seen[rows]++ ? *t + 0.2 * (ms - *t) : ms;
}

/* AUGUR_SPEC_ROW_COST as a number in [0, 10], else -1 (measure it). */
static float env_row_cost(void) {
    return (float)ag_switch_real("AUGUR_SPEC_ROW_COST", 0.0, 10.0, -1.0);
}

/* One more verify row as a fraction of a one-row decode step, from the
 * measured step times (< 0 while there is too little to say). Averaged over
 * the row counts seen, since the curve is not linear (SIMD kernels handle
 * several rows at the price of one up to their width). */
static float verify_row_cost(const ag_engine *e) {
    if (e->fixed_row_cost >= 0) return e->fixed_row_cost;
    if (e->step_seen[1] < 3 || e->step_ms[1] <= 0) return -1.0f;
    double sum = 0, w = 0;
    for (int r = 2; r <= e->max_rows; r++) {
        if (e->step_seen[r] < 2) continue;
        double c = (e->step_ms[r] / e->step_ms[1] - 1.0) / (r - 1), wr = e->step_seen[r] < 20 ? e->step_seen[r] : 20;
        sum += wr * (c > 0 ? c : 0);
        w += wr;
    }
    return w > 0 ? (float)(sum / w) : -1.0f;
}

/* The step time of r decode rows relative to one row's: measured where
 * that row count has been seen (AUGUR_SPEC_ROW_COST unset), else the
 * linear estimate 1 + (r - 1) * c. */
static double rel_step_time(const ag_engine *e, int r, double c) {
    if (e->fixed_row_cost < 0 && r >= 1 && r <= e->max_rows && e->step_seen[r] >= 2 && e->step_seen[1] >= 3 &&
        e->step_ms[1] > 0)
        return e->step_ms[r] / e->step_ms[1];
    return 1.0 + (r - 1) * c;
}

/* cost[d], d = 0..cap: what a step costs a sequence that decodes among m
 * when it adds d verify rows, in its plain steps: 1 + m (T(m + d) - T(m)) /
 * T(m), T the step time by row count (rel_step_time). A verify row slows
 * the whole step, so its time is weighed against m sequences' progress:
 * drafting thins out as the batch grows towards being compute-bound. The
 * measured curve is used as it is (a SIMD or tile kernel takes several rows
 * for the price of one up to its width, then steps up), made
 * non-decreasing against noise; row counts not seen yet take the linear
 * estimate from the average slope, so they get tried. */
static void draft_step_costs(const ag_engine *e, int m, int cap, float *cost) {
    double c = verify_row_cost(e);
    if (c < 0) c = e->p.spec.verify_row_cost;
    if (m < 1) m = 1;
    const double tm = rel_step_time(e, m, c);
    cost[0] = 1.0f;
    for (int d = 1; d <= cap; d++) {
        double v = 1.0 + m * (rel_step_time(e, m + d, c) - tm) / (tm > 0 ? tm : 1.0);
        if (v < cost[d - 1]) v = cost[d - 1];
        cost[d] = (float)v;
    }
}

/* What the decode rows of a step cost, in ms: the measured time of
 * decode-only steps of that many rows where it has been seen, else
 * interpolated between the nearest row counts seen, else (beyond them) a
 * least-squares line through every row count seen, never below the
 * nearest one's time: a GPU's steps cost nearly the same from 8 rows to
 * 64, a CPU's grow with the rows, and scaling the nearest time with the
 * rows (as this first did) made a GPU's 64 rows cost 8 times its 8 rows',
 * more than whole mixed steps, so the prompt-cost fit saw nothing left for
 * the prompt and prompts fell back to the floor of n_prefill_decoding a
 * step (an H100 at 64 clients: 58 prompt tokens a step). 0 when no decode
 * step has been timed yet. */
static double decode_ms(const ag_engine *e, int rows) {
    if (rows <= 0) return 0.0;
    if (rows > e->max_rows) rows = e->max_rows;
    if (e->step_seen[rows]) return e->step_ms[rows];
    int lo = rows - 1, hi = rows + 1;
    while (lo >= 1 && !e->step_seen[lo]) lo--;
    while (hi <= e->max_rows && !e->step_seen[hi]) hi++;
    if (lo >= 1 && hi <= e->max_rows)
        return e->step_ms[lo] + (e->step_ms[hi] - e->step_ms[lo]) * (rows - lo) / (double)(hi - lo);
    if (lo < 1 && hi > e->max_rows) return 0.0;
    const double nearest = lo >= 1 ? e->step_ms[lo] : e->step_ms[hi];
    double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int r = 1; r <= e->max_rows; r++) {
        if (!e->step_seen[r]) continue;
        w += 1, sx += r, sy += e->step_ms[r], sxx += (double)r * r, sxy += r * e->step_ms[r];
    }
    const double det = w * sxx - sx * sx;
    double       slope = det > 0 ? (w * sxy - sx * sy) / det : 0;
    if (slope < 0) slope = 0;
    const double line = (sy - slope * sx) / w + slope * rows;
    return lo >= 1 ? (line > nearest ? line : nearest) : (line < nearest ? line : nearest);
}

/* Records a step that carried `prompt` prompt tokens beside `decode`
 * decode rows and took ms: one point (prompt, ms - decode_ms(decode)) of
 * the prompt-cost fit. */
static void prompt_cost_note(ag_engine *e, int prompt, int decode, double ms) {
    const double x = prompt, y = ms - decode_ms(e, decode), k = PROMPT_FIT_DECAY;
    if (!(y > 0)) return; /* noise (or a decode estimate off): it says nothing of the prompt's cost */
    e->pf_w = k * e->pf_w + 1.0;
    e->pf_x = k * e->pf_x + x;
    e->pf_y = k * e->pf_y + y;
    e->pf_xx = k * e->pf_xx + x * x;
    e->pf_xy = k * e->pf_xy + x * y;
}

/* The fitted cost of prompt rows in a step: *fixed ms for having any
 * (a quantized model's GPU path dequantizes every weight once per such
 * step, for instance) plus *per_token ms each. A fit that does not make
 * sense (points too alike, a negative term) falls back to a cost
 * proportional to the tokens (fixed 0), which over-charges small chunks.
 * false while no prompt step has been timed. */
static bool prompt_cost(const ag_engine *e, double *fixed, double *per_token) {
    if (e->pf_w <= 0 || e->pf_x <= 0) return false;
    const double det = e->pf_w * e->pf_xx - e->pf_x * e->pf_x, mx = e->pf_x / e->pf_w;
    double c = -1, f = -1;
    if (det > 1e-6 * e->pf_w * e->pf_w * (mx * mx + 1.0)) {
        c = (e->pf_w * e->pf_xy - e->pf_x * e->pf_y) / det;
        f = (e->pf_y - c * e->pf_x) / e->pf_w;
    }
    if (!(c > 0) || f < 0) {
        c = e->pf_y / e->pf_x;
        f = 0;
    }
    *fixed = f;
    *per_token = c;
    return c > 0;
}

/* Prompt tokens a step may carry beside `decode` decode rows. None
 * decoding: a whole batch (nobody waits for the step). Otherwise the step
 * is every running stream's inter-token latency, so it takes as many
 * prompt tokens as the fitted costs let it take while staying within the
 * target (itl_target_ms; on a GPU that is thousands: all waiting prompts
 * enter in one or a few steps), never fewer than n_prefill_decoding (so
 * prompts always progress), and just those without a target (the CPU's
 * default, where a chunk of 64 already costs about a decode step). */
static int prompt_budget(const ag_engine *e, int decode) {
    const int room = e->p.n_batch - decode;
    if (decode == 0 || room <= e->p.n_prefill_decoding) return room > 0 ? room : 0;
    int    budget = e->p.n_prefill_decoding;
    double fixed, per_token;
    if (e->p.itl_target_ms > 0 && prompt_cost(e, &fixed, &per_token)) {
        const double fit = (e->p.itl_target_ms - decode_ms(e, decode) - fixed) / per_token;
        if (fit > budget) budget = fit < room ? (int)fit : room;
    }
    return budget;
}

/* Gives a choice its draft source, told the prompt. Failing that, the
 * choice decodes plainly (warned once per engine). */
static void start_speculation(ag_engine *e, request *r, choice *c) {
    if (!e->p.draft || r->spec_max < 0 || r->no_output) return;
    ag_spec_params sp = e->p.spec;
    if (r->spec_max > 0 && r->spec_max < sp.draft_max) {
        sp.draft_max = r->spec_max;
        if (sp.draft_min > sp.draft_max) sp.draft_min = sp.draft_max;
    }
    ag_draft_source *src = NULL;
    ag_status st = e->p.draft->make(e->p.draft->ctx, &r->sp, (uint64_t)c->index, &src);
    if (!st) st = ag_spec_seq_new(src, &sp, e->n_vocab, &c->spec);
    if (!st) st = ag_spec_prefill(c->spec, r->prompt, r->n_prompt);
    if (st) {
        if (!e->spec_warned) AG_LOGW("speculative decoding off for a request: %s", ag_error_message());
        e->spec_warned = true;
        ag_spec_seq_free(c->spec);
        c->spec = NULL;
    }
}

/* The choices of running requests that have not finished: each may need
 * a fresh block at its next step, which admission keeps free for them. */
static int running_growth(const ag_engine *e) {
    int n = 0;
    for (const request *r = e->running; r; r = r->next) n += r->n_choices - r->n_done;
    return n;
}

/* Blocks a request takes to start: its prompt's (a cached prefix, not
 * known before the lookup, only makes it fewer), the first output block
 * of each choice and the copy of a shared partial block. */
static int start_blocks(const ag_engine *e, const request *r) {
    return blocks_for(e, r->n_prompt) + r->n_choices + (e->cache ? 1 : 0);
}

/* Moves requests from the queue into the running set while they fit: a
 * slot of --parallel for each choice, and the blocks to start beside a
 * block for every running choice's next step. Nothing is booked for the
 * rest of a request's life: sequences take blocks as they grow, and when
 * the pool runs out the newest request is preempted (preempt), as vLLM
 * does; so a pool smaller than --parallel full contexts (a GPU's memory,
 * --kv-mem) runs as many sequences as their actual lengths allow, and the
 * rest wait here. Preempted requests go first: none is admitted while one
 * waits to come back. */
static void admit(ag_engine *e) {
    int avail = -1, growth = 0;
    pthread_mutex_lock(&e->mu);
    while (e->queue_head && !e->swapped) {
        request *r = e->queue_head;
        if (e->running_choices + r->n_choices > e->p.n_parallel) break;
        if (e->running) {
            pthread_mutex_unlock(&e->mu);
            if (avail < 0) growth = running_growth(e), avail = blocks_available(e, start_blocks(e, r) + growth);
            bool fits = start_blocks(e, r) + growth <= avail;
            pthread_mutex_lock(&e->mu);
            if (!fits) break;
        }
        e->queue_head = r->next;
        if (!e->queue_head) e->queue_tail = NULL;
        e->queue_len--;
        r->next = NULL;
        e->running_choices += r->n_choices;
        e->stats.queue_depth = e->queue_len;
        e->stats.running = e->running_choices;
        pthread_mutex_unlock(&e->mu);

        r->t_admit = now_ms();
        ag_status st = AG_OK;
        r->ch = calloc((size_t)r->n_choices, sizeof *r->ch);
        if (!r->ch) st = ag_errorf(AG_ERR_NOMEM, "out of memory");
        for (int i = 0; !st && i < r->n_choices; i++) {
            choice *c = &r->ch[i];
            c->index = i;
            c->seq = -1;
            c->stop_index = -1;
            c->state = CH_WAIT;
            if ((st = ag_sampler_new(&r->sp, e->n_vocab, (uint64_t)i, &c->sampler))) break;
            /* its bias and penalties are applied to its rows by the model
             * (note_row_edits), so its rows may stay on a device */
            if (!e->edits_off && ag_sampler_has_edits(c->sampler)) ag_sampler_take_edited_rows(c->sampler);
            /* the reply continues the prompt's text (SentencePiece keeps its first space) */
            if ((st = ag_detok_new_after(e->tok, 0, r->prompt, (size_t)r->n_prompt, &c->detok))) break;
            st = ag_stop_new((const char *const *)r->stops, r->stop_lens, r->n_stops, &c->stop);
            if (!st && r->schema && !e->schema_vocab) st = ag_schema_vocab_new(e->tok, &e->schema_vocab);
            if (!st && r->schema) st = ag_schema_matcher_new(r->schema, e->schema_vocab, &c->constraint);
        }
        if (!st) st = ag_kv_seq_new(e->kv, &r->ch[0].seq);
        if (!st) reuse_prefix(e, r);
        /* link first so that finishing unlinks it cleanly */
        pthread_mutex_lock(&e->mu);
        list_insert(&e->running, r);
        e->set_changes++;
        pthread_mutex_unlock(&e->mu);
        if (st) {
            if (!r->ch) {
                /* cannot report per choice without choices: fabricate one */
                pthread_mutex_lock(&e->mu);
                list_remove(&e->running, r);
                e->running_choices -= r->n_choices;
                pthread_mutex_unlock(&e->mu);
                ag_gen_event ev = {.choice = 0, .token = -1, .text = "", .finish = AG_FINISH_ERROR, .stop_index = -1,
                                   .error = "out of memory"};
                r->cb(r->user, &ev);
                request_free(r);
            } else {
                finish_request(e, r, AG_FINISH_ERROR, ag_error_message());
                unlink_running(e, r);
            }
        }
        avail = -1; /* the adopted prefix and the new sequence changed what is free */
        pthread_mutex_lock(&e->mu);
    }
    e->admit_blocked = e->queue_head != NULL;
    pthread_mutex_unlock(&e->mu);
}

/* Preempts running request r for its KV blocks: every live sequence's
 * history is copied to host memory (ag_kv_seq_swap_out) and freed, and r
 * moves to the swapped list, from which resume_swapped brings it back bit
 * for bit (no recomputation, so its output is what it would have been).
 * Its slots stay taken. A request that cannot be swapped (host memory)
 * ends with an error instead. */
static void preempt(ag_engine *e, request *r) {
    ag_status st = AG_OK;
    for (int i = 0; i < r->n_choices && !st; i++) {
        choice *c = &r->ch[i];
        if (c->seq < 0 || c->state == CH_DONE) continue;
        const int32_t len = ag_kv_seq_len(e->kv, c->seq);
        c->swap_bytes = ag_kv_swap_bytes(e->kv, len);
        c->swap = c->swap_bytes ? ag_kv_host_alloc(e->kv, c->swap_bytes) : NULL;
        if (c->swap_bytes && !c->swap) {
            st = ag_errorf(AG_ERR_NOMEM, "out of host memory to preempt a request (%zu bytes of KV)", c->swap_bytes);
            break;
        }
        if ((st = ag_kv_seq_swap_out(e->kv, c->seq, c->swap, c->swap_bytes, &c->swap_len))) break;
        ag_kv_seq_free(e->kv, c->seq);
        c->seq = -1;
        c->swapped = true;
    }
    if (st) {
        AG_LOGW("preemption failed: %s", ag_error_message());
        finish_request(e, r, AG_FINISH_ERROR, ag_error_message());
        unlink_running(e, r);
        return;
    }
    pthread_mutex_lock(&e->mu);
    list_remove(&e->running, r);
    list_insert(&e->swapped, r);
    e->set_changes++;
    e->stats.preemptions++;
    e->stats.swapped++;
    pthread_mutex_unlock(&e->mu);
}

/* Brings preempted requests back, oldest first, while their histories and
 * a block of growth for each running choice fit the pool (all of them when
 * nothing runs: each fits an empty pool). */
static void resume_swapped(ag_engine *e) {
    while (e->swapped) {
        request *r = e->swapped;
        while (r->next) r = r->next; /* the oldest */
        int need = 0;
        for (int i = 0; i < r->n_choices; i++)
            if (r->ch[i].swapped) need += blocks_for(e, r->ch[i].swap_len) + 1;
        const int growth = e->running ? running_growth(e) : 0;
        if (e->running && need + growth > blocks_available(e, need + growth)) return;
        make_room(e, need);
        ag_status st = AG_OK;
        for (int i = 0; i < r->n_choices && !st; i++) {
            choice *c = &r->ch[i];
            if (!c->swapped) continue;
            c->swapped = false;
            if (!(st = ag_kv_seq_new(e->kv, &c->seq))) st = ag_kv_seq_swap_in(e->kv, c->seq, c->swap_len, c->swap, c->swap_bytes);
            drop_swap(e, c);
        }
        pthread_mutex_lock(&e->mu);
        list_remove(&e->swapped, r);
        list_insert(&e->running, r);
        e->set_changes++;
        e->stats.swapped--;
        pthread_mutex_unlock(&e->mu);
        if (st) {
            AG_LOGW("a preempted request could not be brought back: %s", ag_error_message());
            finish_request(e, r, AG_FINISH_ERROR, ag_error_message());
            unlink_running(e, r);
        }
    }
}

/* Makes sure this step can run: every decoding choice's next row and, when
 * nothing decodes, a token of the oldest prompt must find a block, else
 * the newest running requests are preempted until they do. Returns the
 * blocks left beyond the decode rows' own, for drafts and prompt chunks
 * (the batch builder stays within them, so no reservation of the step
 * fails). */
static int secure_step_blocks(ag_engine *e) {
    for (;;) {
        int need = 0, first = 0, n_active = 0;
        request *oldest_prefill = NULL, *newest = NULL;
        for (request *r = e->running; r; r = r->next) {
            if (r->restore) continue;
            if (!newest) newest = r;
            n_active++;
            for (int i = 0; i < r->n_choices; i++)
                if (r->ch[i].state == CH_DECODE) need += ag_kv_reserve_cost(e->kv, r->ch[i].seq, 1);
            if (r->n_prefilled < r->n_prompt && r->ch[0].state == CH_WAIT) oldest_prefill = r;
        }
        if (!need && oldest_prefill) first = ag_kv_reserve_cost(e->kv, oldest_prefill->ch[0].seq, 1);
        /* (enough to know whether the largest step fits: the cache's blocks are counted only below that) */
        const int avail = blocks_available(e, need + first + blocks_for(e, e->p.n_batch) + e->max_rows);
        /* (one request alone always fits: it was checked against the whole pool at submit) */
        if (need + first <= avail || n_active <= 1) return avail - need > 0 ? avail - need : 0;
        preempt(e, newest);
    }
}

/* After the prompt: give choices 1..n-1 the prompt's KV (shared blocks) and
 * sample every choice's first token from the same logits row (argmax: as
 * advance_choice's). */
static void start_choices(ag_engine *e, request *r, const float *row, const int32_t *argmax,
                          const ag_cands *const *cands) {
    if (r->no_output) {
        for (int i = 0; i < r->n_choices; i++)
            if (r->ch[i].state == CH_WAIT) finish_choice(e, r, &r->ch[i], AG_FINISH_LENGTH, NULL, -1, NULL, NULL, 0);
        return;
    }
    for (int i = 1; i < r->n_choices; i++) {
        choice *c = &r->ch[i];
        ag_status st = ag_kv_seq_new(e->kv, &c->seq);
        if (!st) st = ag_kv_fork(e->kv, c->seq, r->ch[0].seq, r->n_prompt);
        if (st) {
            finish_choice(e, r, c, AG_FINISH_ERROR, ag_error_message(), -1, NULL, NULL, 0);
            continue;
        }
    }
    for (int i = 0; i < r->n_choices; i++)
        if (r->ch[i].state == CH_WAIT) {
            start_speculation(e, r, &r->ch[i]);
            advance_choice(e, r, &r->ch[i], row, argmax, cands);
        }
}

/* The want of the prompt row before prompt token pos of a scored prompt:
 * its candidates with that token's value (all the scorer reads) where the
 * model gives them, filling output row out_row's request, else its logits. */
static uint8_t score_want(ag_engine *e, request *r, int pos, int out_row) {
    if (ag_model_can_cands(e->model) && ag_sampler_logprobs_req(r->scorer, r->prompt[pos], &e->b_cands_req[out_row]))
        return AG_WANT_CANDS;
    return AG_WANT_LOGITS;
}

/* Reports the logprob of prompt token pos given output row k, the row of
 * logits before it (ag_gen_request.prompt_logprobs), or its candidates
 * (NULL: none); the row is fetched if they do not serve. */
static void score_prompt_token(ag_engine *e, request *r, int pos, int k, const ag_cands *cands) {
    if (r->n_done == r->n_choices) return; /* finished (cancelled, failed) */
    ag_sample_result sr;
    float           *row = e->logits + (size_t)k * e->n_vocab;
    ag_status        st = cands ? ag_sampler_logprobs_cands(r->scorer, cands, r->prompt[pos], &sr) : AG_ERR_INVALID;
    if (st && (!cands || ag_model_output_row(e->model, k, row) == AG_OK))
        st = ag_sampler_logprobs(r->scorer, row, r->prompt[pos], &sr);
    if (st != AG_OK) {
        AG_LOGW("prompt token %d could not be scored: %s", pos, ag_error_message());
        return;
    }
    ag_gen_event ev = {.choice = 0, .token = r->prompt[pos], .sample = &sr, .prompt_pos = pos, .stop_index = -1};
    fill_usage(r, &ev);
    r->cb(r->user, &ev);
}

/* Output row k's edits (ag_batch.edits; rows are noted in order): choice
 * c's sampler's steps 1-2 for its history followed by the first `drafts`
 * tokens of x (a verify row's distribution comes after them, as the verify
 * rule accepts them), or none (c NULL: a scored prompt row; or a sampler
 * without edits). Out of memory: the row gets none and the choice is
 * marked to end after the step. The first token of n > 1 choices comes
 * from one row with choice 0's edits: the same as every choice's, whose
 * histories are empty then. */
static void note_row_edits(ag_engine *e, int k, choice *c, const int32_t *x, int drafts) {
    e->b_edit_start[k] = (int32_t)e->n_edits;
    e->b_edit_start[k + 1] = (int32_t)e->n_edits;
    if (!c || e->edits_off || !ag_sampler_has_edits(c->sampler)) return;
    int  accepted = 0;
    bool ok = true;
    while (ok && accepted < drafts) ok = ag_sampler_accept(c->sampler, x[accepted]) == AG_OK && ++accepted;
    const size_t need = e->n_edits + ag_sampler_max_edits(c->sampler);
    if (ok && need > e->cap_edits) {
        size_t         cap = need > 2 * e->cap_edits ? need : 2 * e->cap_edits;
        ag_logit_edit *p = realloc(e->b_edits, sizeof *p * cap);
        if (p) e->b_edits = p, e->cap_edits = cap;
        ok = p != NULL;
    }
    if (ok) e->n_edits += ag_sampler_row_edits(c->sampler, e->b_edits + e->n_edits);
    ag_sampler_rewind(c->sampler, (size_t)accepted);
    if (!ok) c->edits_failed = true;
    e->b_edit_start[k + 1] = (int32_t)e->n_edits;
}

/* One engine step. Returns false when there was nothing to do. */
static bool step(ag_engine *e) {
    /* cancellations, of running and of preempted requests */
    bool cancelled = false;
    for (int l = 0; l < 2; l++)
        for (request *r = l ? e->swapped : e->running, *next; r; r = next) {
            next = r->next;
            if (atomic_load(&r->cancel)) {
                if (l) {
                    pthread_mutex_lock(&e->mu);
                    e->stats.swapped--;
                    pthread_mutex_unlock(&e->mu);
                }
                finish_request(e, r, AG_FINISH_CANCELLED, NULL);
                unlink_running(e, r);
                cancelled = true;
            }
        }
    /* the freed blocks must show in the stats even if no step follows */
    if (cancelled) update_kv_stats(e);
    /* a sliding-window ring (kv.h) lets go of what no query reads any more,
     * also of sequences that take no row this step: its pool holds the
     * running windows and one step's tokens */
    if (ag_kv_get_layout(e->kv)->n_ring_layers)
        for (request *r = e->running; r; r = r->next)
            for (int i = 0; i < r->n_choices && r->ch; i++)
                if (r->ch[i].seq >= 0 && !r->restore) ag_kv_seq_recycle(e->kv, r->ch[i].seq);
    resume_swapped(e);
    admit(e);
    poll_restores(e);
    if (!e->running) return false;
    /* blocks for drafts and prompt chunks once every decode row has its own */
    int left = secure_step_blocks(e);

    int n = 0, rows = 0, n_prefill = 0;
    e->n_edits = 0;
    if (e->any_allow) memset(e->b_allow, 0, sizeof *e->b_allow * (size_t)e->logit_rows);
    e->any_allow = false;
    /* Decode windows first: each decoding choice's pending token, followed by
     * the tokens its draft source proposes (speculative decoding), all as
     * decode rows. Drafts get the rows left under spec_max_rows once every
     * decoding choice has its one row: past that the step is compute-bound
     * and verify rows would cost what they save. */
    int spare = e->p.spec_max_rows, m = 0;
    for (request *r = e->running; r; r = r->next)
        for (int i = 0; i < r->n_choices; i++) m += r->ch[i].state == CH_DECODE;
    spare -= m;
    float     step_cost[AG_SPEC_MAX_DRAFT + 1];
    const int max_d = spare < AG_SPEC_MAX_DRAFT ? spare : AG_SPEC_MAX_DRAFT; /* no choice drafts more */
    if (e->p.draft && max_d > 0) draft_step_costs(e, m, max_d, step_cost);
    for (request *r = e->running; r; r = r->next)
        for (int i = 0; i < r->n_choices; i++) {
            choice *c = &r->ch[i];
            if (c->state != CH_DECODE || n >= e->p.n_batch) continue;
            int32_t pos = ag_kv_seq_len(e->kv, c->seq);
            c->d = 0;
            if (c->spec && spare > 0) {
                /* at most the tokens still allowed after the bonus, and what the batch holds */
                int cap = r->max_tokens - c->n_gen - 1;
                if (cap > spare) cap = spare;
                if (cap > e->p.n_batch - n - 1) cap = e->p.n_batch - n - 1;
                if (cap > AG_SPEC_MAX_DRAFT) cap = AG_SPEC_MAX_DRAFT;
                /* and what the free blocks hold */
                const int32_t base = ag_kv_reserve_cost(e->kv, c->seq, 1);
                while (cap > 0 && ag_kv_reserve_cost(e->kv, c->seq, 1 + cap) - base > left) cap--;
                if (cap > 0) c->d = ag_spec_propose(c->spec, c->sampled, c->n_gen, cap, step_cost);
                spare -= c->d;
                left -= ag_kv_reserve_cost(e->kv, c->seq, 1 + c->d) - base;
            }
            /* a choice that only takes argmaxes (or tokens drawn with its
             * uniform, without drafts) leaves its rows where they are */
            const uint8_t want = decode_want(e, c, rows);
            note_row_edits(e, rows, c, NULL, 0);
            e->b_tok[n] = c->pending;
            e->b_pos[n] = pos;
            e->b_seq[n] = c->seq;
            e->b_want[n] = want;
            e->rows[rows++] = (struct row_owner){r, c, -1, c->d + 1, want};
            n++;
            const int32_t *x = c->d ? ag_spec_drafts(c->spec) : NULL;
            note_window_masks(e, rows - 1, c, x, c->d);
            for (int j = 0; j < c->d; j++) { /* (want is not AG_WANT_PICK: c->d > 0) */
                if (want == AG_WANT_CANDS) e->b_cands_req[rows] = e->b_cands_req[rows - 1];
                e->b_tok[n] = x[j];
                e->b_pos[n] = pos + 1 + j;
                e->b_seq[n] = c->seq;
                e->b_want[n] = want;
                note_row_edits(e, rows, c, x, j + 1);
                e->rows[rows++] = (struct row_owner){r, c, -1, 0, want};
                n++;
            }
        }
    /* then prompt chunks, oldest request first (the list is newest first, so
     * walk to the end). While streams are decoding, a step's time is every
     * running stream's inter-token latency: prompt_budget sizes the chunks
     * from the measured costs and the latency target. */
    const int budget = prompt_budget(e, n);
    const int limit = n + budget < e->p.n_batch ? n + budget : e->p.n_batch;
    request *order[AG_ENGINE_MAX_PARALLEL];
    int n_order = 0;
    for (request *r = e->running; r && n_order < AG_ENGINE_MAX_PARALLEL; r = r->next)
        if (r->n_prefilled < r->n_prompt && !r->restore) order[n_order++] = r;
    for (int oi = n_order - 1; oi >= 0 && n < limit; oi--) {
        request *r = order[oi];
        int k = r->n_prompt - r->n_prefilled;
        if (k > limit - n) k = limit - n;
        /* a scored prompt wants logits for every row: as many as fit */
        if (r->prompt_logprobs && k > e->logit_rows - rows) k = e->logit_rows - rows;
        /* and what the free blocks hold */
        if (k > 0 && ag_kv_reserve_cost(e->kv, r->ch[0].seq, k) > left) {
            int lo = 0, hi = k; /* the cost only grows with k */
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (ag_kv_reserve_cost(e->kv, r->ch[0].seq, mid) <= left) lo = mid;
                else hi = mid - 1;
            }
            k = lo;
        }
        if (k <= 0) continue;
        left -= ag_kv_reserve_cost(e->kv, r->ch[0].seq, k);
        r->in_batch = k;
        for (int j = 0; j < k; j++) {
            int p = r->n_prefilled + j;
            e->b_tok[n] = r->prompt[p];
            e->b_pos[n] = p;
            e->b_seq[n] = r->ch[0].seq;
            e->b_want[n] = p < r->n_prompt - 1 ? (r->prompt_logprobs ? score_want(e, r, p + 1, rows) : 0)
                           : r->n_choices == 1 ? decode_want(e, &r->ch[0], rows)
                                               : AG_WANT_LOGITS;
            if (e->b_want[n]) {
                note_row_edits(e, rows, p == r->n_prompt - 1 ? &r->ch[0] : NULL, NULL, 0);
                e->rows[rows++] = (struct row_owner){r, NULL, p, 1, e->b_want[n]};
            }
            n++;
        }
        n_prefill += k;
    }
    if (n == 0) {
        /* Nothing could take a row although requests run (secure_step_blocks
         * should prevent it): rather than idle forever, make room by
         * preempting the newest, or end a lone request that cannot fit. */
        request *newest = NULL;
        int      active = 0;
        for (request *r = e->running; r; r = r->next)
            if (!r->restore) active++, newest = newest ? newest : r;
        if (!newest) return false;
        AG_LOGW("no row of %d running requests found a KV block: %s", active,
                active > 1 ? "preempting the newest" : "ending the request");
        if (active > 1) preempt(e, newest);
        else {
            finish_request(e, newest, AG_FINISH_ERROR, "the KV cache has no room for this request");
            unlink_running(e, newest);
        }
        return true;
    }

    /* reserve KV per sequence (tokens of one sequence are contiguous in the
     * batch), first freeing what of the prefix cache that takes */
    ag_status st = AG_OK;
    int step_need = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && e->b_seq[j] == e->b_seq[i]) j++;
        step_need += ag_kv_reserve_cost(e->kv, e->b_seq[i], j - i);
        i = j;
    }
    make_room(e, step_need);
    for (int i = 0; i < n && !st;) {
        int j = i;
        while (j < n && e->b_seq[j] == e->b_seq[i]) j++;
        st = ag_kv_seq_reserve(e->kv, e->b_seq[i], j - i);
        if (st == AG_ERR_NOMEM && e->cache) {
            /* the step was sized to the free blocks, so this should not happen; blocks only the cache holds can go */
            if (ag_cache_evict(e->cache, blocks_for(e, j - i) + 1) > 0)
                st = ag_kv_seq_reserve(e->kv, e->b_seq[i], j - i);
        }
        i = j;
    }
    double t0 = now_ms();
    if (!st) {
        /* decode rows first, then prompt chunks: the layout ag_batch.n_prompt names */
        ag_batch b = {.n = n, .token = e->b_tok, .pos = e->b_pos, .seq = e->b_seq, .want_logits = e->b_want,
                      .argmax = e->argmax, .pick = e->b_pick, .cands_req = e->b_cands_req, .cands = e->cands,
                      .edit_start = e->n_edits ? e->b_edit_start : NULL, .edits = e->n_edits ? e->b_edits : NULL,
                      .allow = e->any_allow ? e->b_allow : NULL,
                      .n_prompt = n_prefill};
        st = ag_model_forward(e->model, e->kv, &b, e->logits);
    }
    double dt = now_ms() - t0;
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "forward pass failed: %s", ag_error_message());
        AG_LOGE("%s", msg);
        for (request *r = e->running, *next; r; r = next) {
            next = r->next;
            finish_request(e, r, AG_FINISH_ERROR, msg);
            unlink_running(e, r);
        }
        return true;
    }
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && e->b_seq[j] == e->b_seq[i]) j++;
        ag_kv_seq_commit(e->kv, e->b_seq[i], e->b_pos[j - 1] + 1);
        i = j;
    }
    double fixed = 0, per_token = 0;
    if (!n_prefill) note_step_time(e, n, dt);
    else prompt_cost_note(e, n_prefill, n - n_prefill, dt);
    const bool fitted = n_prefill && prompt_cost(e, &fixed, &per_token);
    pthread_mutex_lock(&e->mu);
    e->stats.prompt_tokens += (uint64_t)n_prefill;
    if (n_prefill) e->stats.prefill_seconds += dt / 1e3;
    else e->stats.decode_seconds += dt / 1e3;
    e->stats.steps++;
    if (n_prefill && n > n_prefill) e->stats.mixed_steps++;
    if (n > n_prefill && n_prefill > e->stats.max_mixed_prompt_tokens) e->stats.max_mixed_prompt_tokens = n_prefill;
    if (fitted) {
        e->stats.prompt_step_fixed_ms = fixed;
        e->stats.prompt_token_ms = per_token;
    }
    if (n > n_prefill) e->stats.prompt_budget = budget;
    pthread_mutex_unlock(&e->mu);

    const bool ring = ag_kv_get_layout(e->kv)->n_ring_layers > 0;
    for (request *r = e->running; r; r = r->next) {
        const bool chunk = r->in_batch > 0;
        r->n_prefilled += r->in_batch;
        r->in_batch = 0;
        /* a fully prefilled prompt is shared at once with requests admitted
         * while this one still decodes; with a sliding-window ring (kv.h),
         * every chunk's blocks go at once, before the next reserve recycles
         * their ring blocks: the cache then holds the windowed layers' KV
         * of every point of the prompt, so a later prompt that shares only
         * part of it can resume there */
        if ((r->n_prefilled == r->n_prompt || (ring && chunk)) && r->n_done < r->n_choices) publish_prompt(e, r, false);
    }
    for (int k = 0; k < rows; k += e->rows[k].n_rows > 0 ? e->rows[k].n_rows : 1) {
        const float *row = e->logits + (size_t)k * e->n_vocab;
        struct row_owner o = e->rows[k];
        /* (a picked token's candidates are all its sampler reads: no cut to check) */
        const bool       picked = o.want == AG_WANT_PICK_LP, cands = o.want == AG_WANT_CANDS || picked;
        const ag_cands  *cp[AG_SPEC_MAX_DRAFT + 1];
        choice *ec = o.c ? o.c : o.p_pos == o.r->n_prompt - 1 ? &o.r->ch[0] : NULL;
        if (ec && ec->edits_failed) { /* its rows lack its sampler's edits */
            ec->edits_failed = false;
            if (o.c && o.c->state != CH_DECODE) continue;
            if (o.c) finish_choice(e, o.r, o.c, AG_FINISH_ERROR, "out of memory for the sampler's edits", -1, NULL, NULL, 0);
            else finish_request(e, o.r, AG_FINISH_ERROR, "out of memory for the sampler's edits");
            continue;
        }
        if (o.c) {
            if (o.c->state != CH_DECODE) continue;
            for (int i = 0; cands && i < o.n_rows; i++) cp[i] = picked ? &e->cands[k] : row_cands(e, o.c, k + i);
            advance_choice(e, o.r, o.c, row, e->argmax + k, cands ? cp : NULL);
        } else if (o.p_pos < o.r->n_prompt - 1) {
            score_prompt_token(e, o.r, o.p_pos + 1, k, cands ? &e->cands[k] : NULL);
        } else {
            if (cands) cp[0] = picked ? &e->cands[k] : row_cands(e, &o.r->ch[0], k);
            start_choices(e, o.r, row, e->argmax + k, cands ? cp : NULL);
        }
    }
    for (request *r = e->running, *next; r; r = next) {
        next = r->next;
        if (r->n_done == r->n_choices) unlink_running(e, r);
    }
    update_kv_stats_if(e, false);
    return true;
}

/* Whether a running request was cancelled (engine thread, mu held). */
static bool any_cancelled(const ag_engine *e) {
    for (const request *r = e->running; r; r = r->next)
        if (atomic_load(&r->cancel)) return true;
    return false;
}

static void *engine_main(void *arg) {
    ag_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) break;
        if (step(e)) continue;
        /* idle: write-behind for the disk tier, a bounded slice at a time so
         * that a new request waits at most for one slice; not while a
         * request waits for its records (the writes would compete with the
         * reads) */
        if (e->cache && !e->n_restoring && ag_cache_idle(e->cache, 8u << 20)) continue;
        /* Nothing to compute: every running request (if any) waits for the
         * disk reader, whose notify sets cache_wake. Wake up too for a
         * request that can be admitted (a queue head that did not fit waits
         * for a running request to end) and for a cancellation. */
        bool waiting_only = true;
        for (request *r = e->running; r && waiting_only; r = r->next) waiting_only = r->restore != NULL;
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !(e->queue_head && !e->admit_blocked) && waiting_only && !e->cache_wake &&
               !any_cancelled(e))
            pthread_cond_wait(&e->cv, &e->mu);
        e->cache_wake = false;
        pthread_mutex_unlock(&e->mu);
    }
    /* shutdown: cancel everything still running, preempted or queued */
    for (int l = 0; l < 2; l++)
        for (request *r = l ? e->swapped : e->running, *next; r; r = next) {
            next = r->next;
            finish_request(e, r, AG_FINISH_CANCELLED, NULL);
            unlink_running(e, r);
        }
    pthread_mutex_lock(&e->mu);
    e->stats.swapped = 0;
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_lock(&e->mu);
    request *q = e->queue_head;
    e->queue_head = e->queue_tail = NULL;
    e->queue_len = 0;
    pthread_mutex_unlock(&e->mu);
    while (q) {
        request *next = q->next;
        for (int i = 0; i < q->n_choices; i++) {
            ag_gen_event ev = {.choice = i, .token = -1, .text = "", .finish = AG_FINISH_CANCELLED, .stop_index = -1};
            fill_usage(q, &ev);
            q->cb(q->user, &ev);
        }
        request_free(q);
        q = next;
    }
    /* pending blocks go to disk now, so that a restarted server finds them */
    if (e->cache) ag_cache_flush(e->cache);
    update_kv_stats(e);
    return NULL;
}

/* The cache's background thread: an ag_cache_idle call would now progress. */
static void cache_notify(void *user) {
    ag_engine *e = user;
    pthread_mutex_lock(&e->mu);
    e->cache_wake = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Checks p and fills in what its zeros mean (n_ctx): the one resolution
 * ag_engine_new and ag_engine_plan_memory share. */
static ag_status resolve_params(ag_model *m, const ag_tok *tok, ag_engine_params *p) {
    const ag_model_config *cfg = ag_model_config_of(m);
    if (p->n_parallel < 1 || p->n_parallel > AG_ENGINE_MAX_PARALLEL)
        return ag_errorf(AG_ERR_RANGE, "n_parallel must be in [1, %d]", AG_ENGINE_MAX_PARALLEL);
    if (p->n_batch < 0) return ag_errorf(AG_ERR_RANGE, "n_batch must be >= 1 (or 0: the device's default)");
    p->n_batch = ag_engine_resolve_batch(m, p->n_batch);
    if (p->n_prefill_decoding < 1) return ag_errorf(AG_ERR_RANGE, "n_prefill_decoding must be >= 1");
    if (!(p->itl_target_ms <= 60000.0)) return ag_errorf(AG_ERR_RANGE, "itl_target_ms must be at most 60000");
    if (p->itl_target_ms == 0) p->itl_target_ms = ag_engine_resolve_itl_target(m, 0);
    if (p->max_queue < 0) return ag_errorf(AG_ERR_RANGE, "max_queue must be >= 0");
    if (p->spec_max_rows < 0 || p->spec_max_rows > 1024)
        return ag_errorf(AG_ERR_RANGE, "spec_max_rows must be in [0, 1024]");
    if (p->draft) {
        ag_status sst = ag_spec_params_check(&p->spec);
        if (sst) return sst;
    }
    p->n_ctx = ag_engine_resolve_ctx(m, p->n_ctx);
    if (p->n_ctx < 2) return ag_errorf(AG_ERR_RANGE, "context must be at least 2 tokens");
    if (ag_tok_n_vocab(tok) > cfg->n_vocab)
        return ag_errorf(AG_ERR_FORMAT, "tokenizer has %d tokens but the model only %d", ag_tok_n_vocab(tok),
                         cfg->n_vocab);
    return AG_OK;
}

/* GPU memory the KV pool leaves to the device's own needs (the context,
 * cuBLAS's workspace, recorded graphs): 1/32 of it, at least 512 MiB. */
static uint64_t device_headroom(uint64_t total) { return total / 32 > (512u << 20) ? total / 32 : (512u << 20); }

/* The KV bytes (whole blocks) the device of m holds beside its scratch and
 * headroom, in *room; false on the CPU (no such limit). *free_b, *reserve:
 * the figures, for an error message. */
static bool device_kv_room(ag_model *m, const ag_engine_params *p, const ag_kv_layout *lay, uint64_t *room,
                           uint64_t *free_b, uint64_t *reserve) {
    uint64_t total_b;
    if (ag_model_device(m) == AG_DEVICE_CPU || ag_model_device_memory(m, free_b, &total_b) != AG_OK) return false;
    *reserve = ag_model_scratch_bytes(m, p->n_batch, p->n_ctx) + device_headroom(total_b);
    *room = *free_b > *reserve ? (*free_b - *reserve) / lay->block_bytes * lay->block_bytes : 0;
    return true;
}

/* The KV pool of an engine with resolved params p; p->kv_bytes 0 becomes
 * n_parallel full contexts on the CPU, and on a device all that its free
 * memory holds beside the scratch and headroom (as vLLM and SGLang size
 * theirs): sequences take blocks as they grow (admit, preempt), so the
 * pool, not --parallel x --ctx, bounds what runs at once, and blocks no
 * sequence uses hold the prefix cache. *capped says the pool holds fewer
 * than n_parallel full contexts. A pool that cannot hold one full context
 * is an error. The engine and its plan (augur fit) both size it here. */
static ag_status pool_params(ag_model *m, ag_engine_params *p, ag_kv_params *kp, ag_kv_layout *lay, bool *capped) {
    /* the choices' sequences; the prefix cache holds blocks, not sequences */
    ag_status st = ag_model_kv_params(m, p->kv_dtype, p->n_parallel + 1, 0, kp, lay);
    if (st) return st;
    kp->ring_step = p->n_batch; /* a sliding-window ring holds a step's tokens beside the window */
    if (kp->state_layers > 0) {
        /* Recurrent (Mamba-2) layers: a verify window's rejected tail is
         * trimmed by restoring the state its decode rows recorded, so each
         * sequence keeps snapshots of a whole window's lengths (none without
         * speculation: nothing else trims). The prefix cache is off: a
         * cached block holds attention KV but not the recurrent state at
         * its end, so neither a hit nor a follow-up turn could resume from
         * it. */
        const int dmax = p->spec.draft_max > 0 ? p->spec.draft_max : 8;
        kp->state_snapshots = p->draft ? (dmax < AG_SPEC_MAX_DRAFT ? dmax : AG_SPEC_MAX_DRAFT) : 0;
        kp->state_snap_last = false; /* a verify trim never returns to the state a window ended at */
        if (p->prefix_cache)
            AG_LOGI("prefix cache off: '%s' has recurrent layers, whose state the cache does not keep",
                    ag_model_config_of(m)->arch_name);
        p->prefix_cache = false;
    }
    const size_t one = ag_kv_budget_for(lay, 1, p->n_ctx);
    if (capped) *capped = false;
    if (p->kv_bytes && p->kv_bytes < one)
        return ag_errorf(AG_ERR_RANGE, "a KV pool of %.1f MiB holds less than one %d-token context (%.1f MiB)",
                         p->kv_bytes / 1048576.0, p->n_ctx, one / 1048576.0);
    uint64_t room, free_b, reserve;
    if (!p->kv_bytes) {
        p->kv_bytes = ag_kv_budget_for(lay, p->n_parallel, p->n_ctx);
        if (device_kv_room(m, p, lay, &room, &free_b, &reserve)) {
            /* a sliding-window ring's pool (sized by the sequences, not the budget) first */
            ag_kv_params z = *kp;
            size_t       ring = 0;
            z.budget_bytes = 0;
            if (lay->n_ring_layers && !ag_kv_memory_bytes(&z, 0, &ring))
                room = room > ring ? (room - ring) / lay->block_bytes * lay->block_bytes : 0;
            if (room < one)
                return ag_errorf(AG_ERR_NOMEM,
                                 "the GPU has %.2f GiB free with the weights loaded; one %d-token context needs %.2f "
                                 "GiB of KV beside %.2f GiB of scratch and headroom: lower --ctx (augur fit shows the "
                                 "plan), or give a server already on this GPU a smaller --kv-mem (by default a "
                                 "server's KV pool takes all the memory free when it starts)",
                                 free_b / 1073741824.0, p->n_ctx, one / 1073741824.0, reserve / 1073741824.0);
            if (capped) *capped = room < p->kv_bytes;
            p->kv_bytes = room;
        }
    }
    kp->budget_bytes = p->kv_bytes;
    return AG_OK;
}

/* Rows of the per-step buffers: decode rows and prompt ends (one each per
 * choice), plus verify rows; logits for those plus room for scored prompt
 * rows, at most one per batch token. */
static void step_rows(const ag_engine_params *p, int *max_rows, int *logit_rows) {
    *max_rows = 2 * p->n_parallel + 1 + (p->draft ? p->spec_max_rows : 0);
    *logit_rows = *max_rows + AG_ENGINE_SCORE_ROWS < p->n_batch ? *max_rows + AG_ENGINE_SCORE_ROWS : p->n_batch;
}

ag_status ag_engine_plan_memory(ag_model *m, const ag_tok *tok, const ag_engine_params *pp, ag_engine_memory *out) {
    memset(out, 0, sizeof *out);
    ag_engine_params p = pp ? *pp : ag_engine_default_params();
    ag_kv_params     kp;
    ag_kv_layout     lay;
    ag_status        st;
    bool             capped;
    if ((st = resolve_params(m, tok, &p)) || (st = pool_params(m, &p, &kp, &lay, &capped))) return st;
    int32_t n_blocks;
    size_t  kv;
    if ((st = ag_kv_layout_for(&kp, &lay, &n_blocks)) || (st = ag_kv_memory_bytes(&kp, p.n_ctx, &kv))) return st;
    const size_t n_vocab = (size_t)ag_model_config_of(m)->n_vocab, ctx = (size_t)p.n_ctx;
    int max_rows, logit_rows;
    step_rows(&p, &max_rows, &logit_rows);
    out->n_ctx = p.n_ctx;
    out->n_parallel = p.n_parallel;
    out->n_blocks = n_blocks;
    out->block_size = lay.block_size;
    out->weights_max = ag_gguf_file_size(ag_model_gguf(m));
    uint64_t table;
    size_t   row;
    ag_model_gathered_weights(m, &table, &row);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), pages_per_row = (row + page - 1) / page;
    uint64_t       seen = (uint64_t)p.n_parallel * ctx * pages_per_row * page;
    out->weights = out->weights_max - table + (seen < table ? seen : table);
    out->kv = kv;
    out->kv_without_ring = kv;
    out->n_layers = lay.n_layers;
    if (lay.n_ring_layers) {
        ag_kv_params full = kp;
        ag_kv_layout fl;
        size_t       b;
        full.ring = false;
        /* the same number of sequences' contexts in blocks of every layer */
        if (!ag_kv_layout_for(&full, &fl, NULL)) {
            full.budget_bytes = kp.budget_bytes / lay.block_bytes * fl.block_bytes;
            if (!ag_kv_memory_bytes(&full, p.n_ctx, &b)) out->kv_without_ring = b;
        }
        out->kv_ring = ag_kv_ring_pool_bytes(&kp);
        out->ring_window = lay.ring_window;
        out->n_ring_layers = lay.n_ring_layers;
    }
    out->scratch = ag_model_scratch_bytes(m, p.n_batch, p.n_ctx);
    /* ag_engine_new's buffers, then per running choice its sampler, the
     * tokens it sampled and its request's copy of the prompt (both doubling
     * from 64 / exact: ctx tokens at most) */
    out->buffers = (size_t)p.n_batch * (3 * sizeof(int32_t) + 1) +
                   sizeof(struct row_owner) * (size_t)(p.n_batch + max_rows) +
                   (sizeof(float) * n_vocab + sizeof(ag_pick) + sizeof(ag_cands_req) + sizeof(ag_cands) +
                    2 * sizeof(int32_t)) * ((size_t)logit_rows + 1) +
                   (size_t)p.n_parallel * (ag_sampler_bytes((int32_t)n_vocab, ctx) + 2 * sizeof(int32_t) * ctx);
    if (p.prefix_cache) {
        /* the host tier: whole blocks of every layer (ag_cache's slots), which the index knows too */
        const uint64_t payload = (uint64_t)lay.n_layers * lay.copy_bytes;
        const uint64_t slots = payload ? p.cache_host_max / payload : 0;
        out->cache_host = slots * payload;
        out->cache_host_tokens = (int64_t)slots * lay.block_size;
        out->cache_index = ag_cache_index_bytes(n_blocks + (int32_t)(slots < (1u << 30) ? slots : (1u << 30)),
                                                lay.block_size);
        if (p.cache_dir && *p.cache_dir) {
            ag_cache_params cp = ag_cache_default_params();
            out->cache_write_queue = cp.write_queue_bytes;
            /* at least one record (n_layers blocks' copies and a header) */
            size_t record = (size_t)lay.n_layers * lay.copy_bytes + AG_CACHE_RECORD_MAX_HEADER;
            out->cache_read_staging = cp.read_staging_bytes > record ? cp.read_staging_bytes : record;
        }
    }
    if (p.draft)
        out->draft = p.draft->plan_bytes ? p.draft->plan_bytes(p.draft->ctx, p.n_parallel, p.n_ctx) : p.draft->shared_bytes;
    out->total = out->weights + out->kv + out->scratch + out->buffers + out->cache_index + out->cache_write_queue +
                 out->cache_read_staging + out->cache_host + out->draft;
    if (ag_model_device(m) != AG_DEVICE_CPU) out->device = out->kv + out->scratch;
    return AG_OK;
}

/* A GPU's first pass of a kind pays once for what later passes reuse
 * (kernels loaded, buffers sized, a decode pass recorded as a graph): on an
 * H100 with an 8B model a server's first request waited 37 ms for its
 * first token against 22 ms for the next ones. Before the engine serves,
 * one prompt pass and one decode step of a scratch sequence pay it. On the
 * CPU there is nothing of the kind worth a start-up forward. */
static ag_status warm_up(ag_engine *e) {
    if (ag_model_device(e->model) == AG_DEVICE_CPU) return AG_OK;
    const int n = e->p.n_ctx > 257 ? 256 : e->p.n_ctx - 1; /* prompt rows; one position left for the decode row */
    if (n < 1 || n > e->p.n_batch) return AG_OK;
    int32_t   seq;
    ag_status st = ag_kv_seq_new(e->kv, &seq);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        e->b_tok[i] = (int32_t)(1 + (uint32_t)i * 7919u % (uint32_t)(e->n_vocab - 1));
        e->b_pos[i] = i;
        e->b_seq[i] = seq;
        e->b_want[i] = i == n - 1 ? AG_WANT_LOGITS : 0;
    }
    ag_batch b = {.n = n, .token = e->b_tok, .pos = e->b_pos, .seq = e->b_seq, .want_logits = e->b_want,
                  .n_prompt = n};
    if (!(st = ag_kv_seq_reserve(e->kv, seq, n)) && !(st = ag_model_forward(e->model, e->kv, &b, e->logits)))
        st = ag_kv_seq_commit(e->kv, seq, n);
    if (!st) {
        e->b_pos[0] = n, e->b_want[0] = AG_WANT_ARGMAX;
        ag_batch d = {.n = 1, .token = e->b_tok, .pos = e->b_pos, .seq = e->b_seq, .want_logits = e->b_want,
                      .argmax = e->argmax};
        if (!(st = ag_kv_seq_reserve(e->kv, seq, 1))) st = ag_model_forward(e->model, e->kv, &d, e->logits);
    }
    ag_kv_seq_free(e->kv, seq);
    return st;
}

ag_status ag_engine_new(ag_model *m, const ag_tok *tok, const ag_engine_params *pp, ag_engine **out) {
    *out = NULL;
    ag_engine_params p = pp ? *pp : ag_engine_default_params();
    const ag_model_config *cfg = ag_model_config_of(m);
    ag_status st = resolve_params(m, tok, &p);
    if (st) return st;

    ag_engine *e = calloc(1, sizeof *e);
    if (!e) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    e->model = m;
    e->tok = tok;
    e->n_vocab = cfg->n_vocab;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);

    ag_kv_params kp;
    ag_kv_layout L;
    bool         capped;
    if ((st = pool_params(m, &p, &kp, &L, &capped))) goto fail;
    e->p = p;
    e->block_size = L.block_size;
    if ((st = ag_kv_init(&kp, &e->kv))) goto fail;
    {
        ag_kv_stats ks;
        ag_kv_get_stats(e->kv, &ks);
        e->n_blocks = ks.n_blocks;
    }
    if (L.n_ring_layers) {
        ag_kv_stats ks;
        ag_kv_get_stats(e->kv, &ks);
        ag_kv_params full = kp;
        ag_kv_layout fl;
        full.ring = false;
        const double all = ag_kv_layout_for(&full, &fl, NULL) ? 0 : (double)ks.n_blocks * fl.block_bytes;
        AG_LOGI("KV: %d of %d layers have a sliding window of %d: they keep a ring of about %d positions a "
                "sequence (and a step's tokens), not the context: %.1f MiB (ring %.1f MiB + the %d other layers' "
                "%.1f MiB), where every position of every layer would take %.1f MiB",
                L.n_ring_layers, L.n_layers, L.ring_window, L.ring_window + kp.ring_slack,
                (ks.pool_bytes + ks.ring_pool_bytes) / 1048576.0, ks.ring_pool_bytes / 1048576.0,
                L.n_layers - L.n_ring_layers, ks.pool_bytes / 1048576.0, all / 1048576.0);
    }
    if (ag_model_device(m) != AG_DEVICE_CPU && !pp->kv_bytes)
        AG_LOGI("KV pool: %.2f GiB, what the GPU's memory holds: %d blocks of %d tokens, %.1f full %d-token contexts "
                "(--parallel %d%s); sequences take blocks as they grow, requests wait for blocks, and the newest "
                "is preempted (its KV moved to host memory) if the running ones outgrow the pool",
                p.kv_bytes / 1073741824.0, e->n_blocks, L.block_size, (double)e->n_blocks * L.block_size / p.n_ctx,
                p.n_ctx, p.n_parallel, capped ? ": fewer than it" : "");
    if (p.prefix_cache) {
        ag_cache_params cp = ag_cache_default_params();
        cp.model_fingerprint = ag_model_fingerprint(m);
        cp.tok_fingerprint = ag_tok_fingerprint(tok);
        /* a quantized cache's rows are stored rotated or not (kv.h rot_k): records of the other kind
         * hold other bits (0 where nothing is rotated, as before) */
        cp.compute_fingerprint = (uint64_t)L.rot_k << 32 | (uint64_t)L.rot_v;
        cp.disk_dir = p.cache_dir && *p.cache_dir ? p.cache_dir : NULL;
        cp.disk_max_bytes = p.cache_disk_max;
        cp.host_max_bytes = p.cache_host_max;
        cp.notify = cache_notify;
        cp.notify_user = e;
        /* test hook: slow every record read down, to watch a restore run */
        const long delay = ag_switch_int("AUGUR_TEST_KV_READ_DELAY_MS", 1, 60000, 0);
        if (delay) cp.read_delay_us = (uint32_t)delay * 1000u;
        /* test hook: retry writing soon after a full disk, to watch it resume */
        const long retry = ag_switch_int("AUGUR_TEST_KV_SPACE_RETRY_MS", 1, 86400000, 0);
        if (retry) cp.space_retry_ms = (uint32_t)retry;
        if ((st = ag_cache_new(e->kv, &cp, &e->cache))) goto fail;
        if (cp.host_max_bytes) {
            ag_cache_stats cs;
            ag_cache_get_stats(e->cache, &cs);
            const uint64_t payload = (uint64_t)L.n_layers * L.copy_bytes;
            AG_LOGI("prefix cache host tier: up to %.1f MiB of host memory, %llu tokens of evicted KV",
                    cs.host_max_bytes / 1048576.0,
                    (unsigned long long)(payload ? cs.host_max_bytes / payload * (uint64_t)L.block_size : 0));
        }
    }
    e->p.cache_dir = NULL; /* borrowed for the call only */
    e->fixed_row_cost = env_row_cost();
    /* a model that cannot edit its rows where it computes them (a device
     * without the edit op): the samplers keep their bias and penalties */
    e->edits_off = ag_switch_off("AUGUR_EDITS") || !ag_model_can_edit(m);
    e->masks_off = ag_switch_off("AUGUR_MASKS") || !ag_model_can_mask(m);
    step_rows(&p, &e->max_rows, &e->logit_rows);
    e->step_ms = calloc((size_t)e->max_rows + 1, sizeof *e->step_ms);
    e->step_seen = calloc((size_t)e->max_rows + 1, sizeof *e->step_seen);
    /* activations for a full batch in one piece, as ag_engine_plan_memory counts them */
    if ((st = ag_model_reserve_scratch(m, p.n_batch))) goto fail;
    e->b_tok = malloc(sizeof(int32_t) * p.n_batch);
    e->b_pos = malloc(sizeof(int32_t) * p.n_batch);
    e->b_seq = malloc(sizeof(int32_t) * p.n_batch);
    e->b_want = malloc((size_t)p.n_batch);
    /* (zeroed: a backend may upload the slots of rows that want neither) */
    e->b_pick = calloc((size_t)e->logit_rows, sizeof(ag_pick));
    e->b_cands_req = calloc((size_t)e->logit_rows, sizeof(ag_cands_req));
    e->cands = malloc(sizeof(ag_cands) * (size_t)e->logit_rows);
    e->argmax = malloc(sizeof(int32_t) * (size_t)e->logit_rows);
    e->b_edit_start = malloc(sizeof(int32_t) * ((size_t)e->logit_rows + 1));
    e->b_allow = calloc((size_t)e->logit_rows, sizeof *e->b_allow);
    e->rows = malloc(sizeof *e->rows * (size_t)(p.n_batch + e->max_rows));
    e->logits = ag_model_host_floats(e->model, (size_t)e->n_vocab * (size_t)e->logit_rows);
    e->masked = malloc(sizeof(float) * (size_t)e->n_vocab);
    if (!e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->b_pick || !e->b_cands_req || !e->cands ||
        !e->argmax || !e->b_edit_start || !e->b_allow || !e->rows || !e->logits || !e->masked || !e->step_ms ||
        !e->step_seen) {
        st = ag_errorf(AG_ERR_NOMEM, "out of memory for engine buffers");
        goto fail;
    }
    e->stats.n_ctx = p.n_ctx;
    e->stats.n_parallel = p.n_parallel;
    e->stats.draft_bytes = p.draft ? p.draft->shared_bytes : 0;
    e->stats.kv_blocks_free = e->n_blocks;
    e->stats.prefix_cache = e->cache != NULL;
    if ((st = warm_up(e))) goto fail;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        st = ag_errorf(AG_ERR_INTERNAL, "cannot start the engine thread");
        goto fail;
    }
    e->started = true;
    *out = e;
    return AG_OK;
fail:
    ag_engine_free(e);
    return st;
}

void ag_engine_free(ag_engine *e) {
    if (!e) return;
    if (e->started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    /* the engine thread flushed the disk tier on its way out */
    ag_cache_free(e->cache);
    ag_kv_free(e->kv);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
    free(e->b_pick);
    free(e->b_cands_req);
    free(e->cands);
    free(e->argmax);
    free(e->b_edit_start);
    free(e->b_edits);
    free(e->b_allow);
    free(e->allow_bits);
    free(e->rows);
    free(e->step_ms);
    free(e->step_seen);
    ag_model_host_free(e->model, e->logits);
    free(e->masked);
    ag_schema_vocab_free(e->schema_vocab);
    ag_buf_free(&e->text);
    ag_buf_free(&e->scratch);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

ag_status ag_engine_submit(ag_engine *e, const ag_gen_request *in, uint64_t *id) {
    if (!in->cb) return ag_errorf(AG_ERR_INVALID, "a request needs a callback");
    if (in->n_prompt < 1) return ag_errorf(AG_ERR_INVALID, "the prompt is empty");
    if (in->n_choices < 1 || in->n_choices > e->p.n_parallel)
        return ag_errorf(AG_ERR_RANGE, "n must be between 1 and %d (the server's --parallel)", e->p.n_parallel);
    if (in->n_stops < 0 || in->n_stops > 16) return ag_errorf(AG_ERR_RANGE, "at most 16 stop strings");
    for (int i = 0; i < in->n_prompt; i++)
        if (in->prompt[i] < 0 || in->prompt[i] >= e->n_vocab)
            return ag_errorf(AG_ERR_INVALID, "prompt token %d is out of the vocabulary [0, %d)", in->prompt[i],
                             e->n_vocab);
    if (in->n_prompt >= e->p.n_ctx)
        return ag_errorf(AG_ERR_CONTEXT,
                         "context_length_exceeded: the prompt has %d tokens; the context holds %d (prompt and "
                         "output together)",
                         in->n_prompt, e->p.n_ctx);
    ag_status st = ag_sample_params_check(&in->sample, e->n_vocab);
    if (st) return st;

    request *r = calloc(1, sizeof *r);
    if (!r) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    r->n_prompt = in->n_prompt;
    r->n_choices = in->n_choices;
    int room = e->p.n_ctx - in->n_prompt;
    r->max_tokens = in->max_tokens > 0 && in->max_tokens < room ? in->max_tokens : room;
    r->sp = in->sample;
    r->ignore_eos = in->ignore_eos;
    r->prompt_logprobs = in->prompt_logprobs && in->n_prompt > 1;
    r->schema = ag_schema_ref(in->schema);
    r->no_output = in->no_output;
    r->spec_max = in->spec_max;
    r->cache_ns = in->cache_ns;
    r->cb = in->cb;
    r->user = in->user;
    atomic_init(&r->cancel, false);
    r->prompt = malloc(sizeof(int32_t) * (size_t)in->n_prompt);
    if (!r->prompt) goto oom;
    memcpy(r->prompt, in->prompt, sizeof(int32_t) * (size_t)in->n_prompt);
    if (r->prompt_logprobs) {
        ag_sample_params sp = ag_sample_default_params(); /* the raw distribution */
        sp.logprobs = 1;
        sp.n_logprobs = in->sample.n_logprobs;
        if (ag_sampler_new(&sp, e->n_vocab, 0, &r->scorer)) goto oom;
    }
    if (in->sample.n_logit_bias > 0) {
        r->bias = malloc(sizeof *r->bias * (size_t)in->sample.n_logit_bias);
        if (!r->bias) goto oom;
        memcpy(r->bias, in->sample.logit_bias, sizeof *r->bias * (size_t)in->sample.n_logit_bias);
        r->sp.logit_bias = r->bias;
    }
    if (in->n_stops > 0) {
        r->stops = calloc((size_t)in->n_stops, sizeof *r->stops);
        r->stop_lens = calloc((size_t)in->n_stops, sizeof *r->stop_lens);
        if (!r->stops || !r->stop_lens) goto oom;
        r->n_stops = in->n_stops;
        for (int i = 0; i < in->n_stops; i++) {
            if (!(r->stops[i] = strdup(in->stops[i]))) goto oom;
            r->stop_lens[i] = strlen(r->stops[i]);
        }
    }
    if (request_blocks(e, r) > e->n_blocks) {
        request_free(r);
        return ag_errorf(AG_ERR_CAPACITY,
                         "the request needs more KV cache than the server has (%d blocks of %d tokens; "
                         "lower max_tokens or n)",
                         e->n_blocks, e->block_size);
    }
    pthread_mutex_lock(&e->mu);
    if (e->queue_len >= e->p.max_queue && (e->queue_len > 0 || e->running)) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return ag_errorf(AG_ERR_BUSY, "the server is busy: %d requests are queued", e->p.max_queue);
    }
    r->id = ++e->next_id;
    /* Read the id now: once the lock is released the engine thread may run
     * the request to completion and free it. */
    if (id) *id = r->id;
    if (e->queue_tail) e->queue_tail->next = r;
    else e->queue_head = r;
    e->queue_tail = r;
    e->queue_len++;
    e->stats.requests_total++;
    e->stats.queue_depth = e->queue_len;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return AG_OK;
oom:
    request_free(r);
    return ag_errorf(AG_ERR_NOMEM, "out of memory");
}

void ag_engine_cancel(ag_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    for (request *r = e->queue_head; r; r = r->next)
        if (r->id == id) atomic_store(&r->cancel, true);
    for (request *r = e->running; r; r = r->next)
        if (r->id == id) atomic_store(&r->cancel, true);
    for (request *r = e->swapped; r; r = r->next)
        if (r->id == id) atomic_store(&r->cancel, true);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void ag_engine_get_stats(ag_engine *e, ag_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
    if (e->cache) ag_cache_get_stats(e->cache, &out->cache);
}
