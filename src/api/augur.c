/* The embeddable C API (include/augur.h) over the library's modules: a model
 * handle owns the model, its tokenizer and chat template, an optional draft
 * source and one engine running one sequence at a time. */
#include "augur.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/comm.h"
#include "base/status.h"
#include "base/switches.h"
#include "base/utf8.h"
#include "engine/engine.h"
#include "model/model.h"
#include "spec/sources.h"
#include "tmpl/chat.h"
#include "tok/tok.h"

/* The public codes are the internal ones up to AG_ERR_INTERNAL, so those
 * pass through; the refusals appended after them (status.h) reach a
 * program as the public code it has always seen (public_status). */
_Static_assert((int)AUGUR_OK == (int)AG_OK, "status codes");
_Static_assert((int)AUGUR_ERR_IO == (int)AG_ERR_IO, "status codes");
_Static_assert((int)AUGUR_ERR_FORMAT == (int)AG_ERR_FORMAT, "status codes");
_Static_assert((int)AUGUR_ERR_UNSUPPORTED == (int)AG_ERR_UNSUPPORTED, "status codes");
_Static_assert((int)AUGUR_ERR_NOMEM == (int)AG_ERR_NOMEM, "status codes");
_Static_assert((int)AUGUR_ERR_INVALID == (int)AG_ERR_INVALID, "status codes");
_Static_assert((int)AUGUR_ERR_RANGE == (int)AG_ERR_RANGE, "status codes");
_Static_assert((int)AUGUR_ERR_NOT_FOUND == (int)AG_ERR_NOT_FOUND, "status codes");
_Static_assert((int)AUGUR_ERR_TEMPLATE == (int)AG_ERR_TEMPLATE, "status codes");
_Static_assert((int)AUGUR_ERR_INTERNAL == (int)AG_ERR_INTERNAL, "status codes");

static augur_status public_status(ag_status st) {
    switch (st) {
    case AG_ERR_BUSY:
    case AG_ERR_CAPACITY: return AUGUR_ERR_NOMEM;
    case AG_ERR_CONTEXT: return AUGUR_ERR_RANGE;
    case AG_ERR_STOPPED: return AUGUR_ERR_INTERNAL;
    default: return (augur_status)st;
    }
}

/* Generations waiting behind the running one (augur_generate blocks the
 * caller, so this is the number of threads that may wait at once). */
#define API_MAX_QUEUE 64

struct augur_model {
    ag_model       *model;
    ag_tok         *tok;
    ag_chat        *chat;        /* NULL when the template did not compile */
    ag_status       chat_status; /* then: why */
    char            chat_error[512];
    ag_draft_setup *draft;
    int             draft_max; /* as resolved (0 without a draft) */
    ag_engine      *engine;
    int             n_ctx;
    char            name[256];
};

const char *augur_version(void) { return AUGUR_VERSION; }
const char *augur_last_error(void) { return ag_error_message(); }
const char *augur_status_name(augur_status status) { return ag_status_name((ag_status)status); }
void        augur_free(void *p) { free(p); }

/* AG_ERR_INVALID naming the first byte of s[0..len) that is not UTF-8. */
static ag_status check_utf8(const char *what, const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t   k = ag_utf8_decode(s + i, len - i, &cp);
        if (!k) return ag_errorf(AG_ERR_INVALID, "%s is not valid UTF-8 (byte %zu)", what, i);
        i += k;
    }
    return AG_OK;
}

augur_model_params augur_model_default_params(void) {
    ag_spec_params sp = ag_spec_default_params();
    return (augur_model_params){.n_threads = 0, .n_ctx = 0, .draft = NULL, .draft_max = 0,
                                .draft_min = sp.draft_min};
}

augur_status augur_model_load(const char *path, const augur_model_params *params, augur_model **out) {
    if (!out) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_model_load: out is NULL");
    *out = NULL;
    if (!path) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_model_load: path is NULL");
    augur_model_params p = params ? *params : augur_model_default_params();
    if (p.n_threads < 0 || p.n_threads > 1024)
        return (augur_status)ag_errorf(AG_ERR_RANGE, "n_threads %d is outside [0, 1024]", p.n_threads);
    if (p.n_ctx < 0) return (augur_status)ag_errorf(AG_ERR_RANGE, "n_ctx %d is negative", p.n_ctx);
    augur_model *m = calloc(1, sizeof *m);
    if (!m) return (augur_status)ag_errorf(AG_ERR_NOMEM, "out of memory");
    ag_status st;
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = p.n_threads;
    mp.decode_rows_hint = p.draft ? 0 : 1; /* one sequence; a verify window carries several rows */
    /* the device: AUGUR_DEVICE (the CLI's --device sets it for `augur run`) */
    const char *dev = ag_switch_text("AUGUR_DEVICE");
    if (dev && !ag_device_parse(dev, &mp.device)) {
        st = ag_errorf(AG_ERR_INVALID, "AUGUR_DEVICE=%s: expected cpu, cuda or auto", dev);
        goto fail;
    }
    mp.tp = (int)ag_switch_int("AUGUR_TP", 1, AG_COMM_MAX_RANKS, 1); /* (the CLI's --tp sets it for `augur run`) */
    if ((st = ag_model_load(path, &mp, &m->model))) goto fail; /* the message names the file */
    if ((st = ag_tok_from_gguf(ag_model_gguf(m->model), &m->tok))) {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", ag_error_message());
        st = ag_errorf(st, "%s: tokenizer: %s", path, inner);
        goto fail;
    }
    if ((m->chat_status = ag_chat_from_gguf(ag_model_gguf(m->model), &m->chat)))
        snprintf(m->chat_error, sizeof m->chat_error, "%s: chat template: %s", path, ag_error_message());
    uint64_t nlen = 0;
    const char *name = ag_gguf_get_str(ag_model_gguf(m->model), "general.name", &nlen);
    if (name) snprintf(m->name, sizeof m->name, "%.*s", (int)(nlen < sizeof m->name ? nlen : sizeof m->name - 1), name);

    ag_engine_params ep = ag_engine_default_params();
    ep.n_parallel = 1;
    ep.n_ctx = p.n_ctx;
    ep.max_queue = API_MAX_QUEUE;
    m->n_ctx = ag_engine_resolve_ctx(m->model, p.n_ctx);
    if (p.draft) {
        /* draft_max 0: the source's own, known once it is open; the ranges
         * are checked before the (maybe slow) open, the pair after it */
        if (p.draft_max < 0 || p.draft_max > AG_SPEC_MAX_DRAFT) {
            st = ag_errorf(AG_ERR_RANGE, "draft_max must be in [0, %d] (0: the source's own)", AG_SPEC_MAX_DRAFT);
            goto fail;
        }
        ep.spec.draft_max = p.draft_max ? p.draft_max : AG_SPEC_MAX_DRAFT;
        ep.spec.draft_min = p.draft_min;
        if ((st = ag_spec_params_check(&ep.spec))) goto fail;
        ag_draft_setup_params dp = {.draft = p.draft, .n_parallel = 1, .n_ctx = m->n_ctx, .n_threads = p.n_threads};
        if ((st = ag_draft_setup_open(&dp, m->model, m->tok, &m->draft))) {
            char inner[1024];
            snprintf(inner, sizeof inner, "%s", ag_error_message());
            st = ag_errorf(st, "draft: %s", inner);
            goto fail;
        }
        ep.draft = ag_draft_setup_factory(m->draft);
        if (!p.draft_max) {
            ep.spec.draft_max = ag_draft_default_max(ep.draft);
            if (ep.spec.draft_min > ep.spec.draft_max) {
                st = ag_errorf(AG_ERR_RANGE, "draft_min %d is above %s's default draft_max %d", ep.spec.draft_min,
                               ep.draft->name, ep.spec.draft_max);
                goto fail;
            }
        }
        m->draft_max = ep.spec.draft_max;
    }
    if ((st = ag_engine_new(m->model, m->tok, &ep, &m->engine))) goto fail;
    *out = m;
    return AUGUR_OK;
fail:
    augur_model_free(m);
    return (augur_status)st;
}

void augur_model_free(augur_model *m) {
    if (!m) return;
    ag_engine_free(m->engine); /* before what it borrows */
    ag_draft_setup_close(m->draft);
    ag_chat_free(m->chat);
    ag_tok_free(m->tok);
    ag_model_free(m->model);
    free(m);
}

augur_status augur_model_get_info(const augur_model *m, augur_model_info *out) {
    if (!m || !out) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_model_get_info: NULL argument");
    const ag_model_config *c = ag_model_config_of(m->model);
    *out = (augur_model_info){
        .architecture = c->arch_name,
        .name = m->name,
        .n_vocab = ag_tok_n_vocab(m->tok),
        .n_ctx_train = c->n_ctx_train,
        .n_ctx = m->n_ctx,
        .n_embd = c->n_embd,
        .n_layer = c->n_layer,
        .n_head = c->n_head,
        .n_head_kv = c->n_head_kv,
        .file_bytes = ag_gguf_file_size(ag_model_gguf(m->model)),
        .bos = ag_tok_bos(m->tok),
        .eos = ag_tok_eos(m->tok),
        .chat_template = m->chat && !ag_chat_is_default(m->chat),
        .draft = m->draft ? ag_draft_setup_factory(m->draft)->name : NULL,
        .draft_max = m->draft_max,
    };
    return AUGUR_OK;
}

augur_status augur_tokenize(const augur_model *m, const char *text, size_t len, unsigned flags, int32_t **tokens,
                            size_t *n_tokens) {
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    if (!m || (!text && len) || !tokens || !n_tokens)
        return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_tokenize: NULL argument");
    ag_status st = check_utf8("the text", text, len);
    if (!st)
        st = ag_tok_encode(m->tok, text ? text : "", len, flags & AUGUR_TOKENIZE_ADD_SPECIAL,
                           flags & AUGUR_TOKENIZE_PARSE_SPECIAL, tokens, n_tokens);
    return (augur_status)st;
}


/* Ends a call that built a text in `out`: on success the caller gets it
 * (malloc'd, NUL-terminated) and its length; on failure `out` is freed and
 * st returned. */
static augur_status hand_out_text(ag_status st, ag_buf *out, char **text, size_t *len) {
    if (st) {
        ag_buf_free(out);
        return (augur_status)st;
    }
    if (len) *len = out->len;
    if (!(*text = ag_buf_take(out))) return (augur_status)ag_errorf(AG_ERR_NOMEM, "out of memory");
    return AUGUR_OK;
}

augur_status augur_detokenize(const augur_model *m, const int32_t *tokens, size_t n, unsigned flags, char **text,
                              size_t *len) {
    if (text) *text = NULL;
    if (len) *len = 0;
    if (!m || (!tokens && n) || !text) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_detokenize: NULL argument");
    /* the incremental detokenizer gives ag_tok_decode's text with invalid
     * bytes replaced, which the API promises */
    ag_detok *d = NULL;
    ag_buf    out = {0};
    ag_status st = ag_detok_new(m->tok, flags & AUGUR_DETOKENIZE_SPECIAL ? AG_DECODE_SPECIAL : 0, &d);
    for (size_t i = 0; !st && i < n; i++) st = ag_detok_push(d, tokens[i], &out);
    if (!st) st = ag_detok_flush(d, &out);
    ag_detok_free(d);
    return hand_out_text(st, &out, text, len);
}

augur_status augur_chat_render(const augur_model *m, const augur_message *messages, size_t n_messages,
                               bool add_generation_prompt, char **text, size_t *len) {
    if (text) *text = NULL;
    if (len) *len = 0;
    if (!m || (!messages && n_messages) || !text)
        return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_chat_render: NULL argument");
    if (!m->chat) return (augur_status)ag_errorf(m->chat_status, "%s", m->chat_error);
    json_t *msgs = json_array();
    if (!msgs) return (augur_status)ag_errorf(AG_ERR_NOMEM, "out of memory");
    ag_status st = AG_OK;
    for (size_t i = 0; i < n_messages && !st; i++) {
        const char *role = messages[i].role, *content = messages[i].content;
        if (!role || !content) {
            st = ag_errorf(AG_ERR_INVALID, "message %zu: %s is NULL", i, role ? "content" : "role");
            break;
        }
        char what[64];
        snprintf(what, sizeof what, "message %zu's role", i);
        if ((st = check_utf8(what, role, strlen(role)))) break;
        snprintf(what, sizeof what, "message %zu's content", i);
        if ((st = check_utf8(what, content, strlen(content)))) break;
        if (json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content", content)))
            st = ag_errorf(AG_ERR_NOMEM, "out of memory");
    }
    ag_buf out = {0};
    if (!st) st = ag_chat_render(m->chat, msgs, NULL, add_generation_prompt, NULL, &out);
    json_decref(msgs);
    return hand_out_text(st, &out, text, len);
}

augur_gen_params augur_gen_default_params(void) {
    return (augur_gen_params){.temperature = 0.8f, .top_p = 0.95f, .top_k = 40, .min_p = 0.05f,
                              .repeat_penalty = 1.0f, .seed = AUGUR_SEED_RANDOM, .max_tokens = 256,
                              .stop = NULL, .n_stop = 0, .ignore_eos = false, .prompt_kind = AUGUR_PROMPT_TEXT};
}

/* One generation as seen from the calling thread: the engine thread queues
 * the pieces here, the caller hands them to its callback. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    ag_buf          text;   /* pieces not yet delivered, back to back */
    size_t         *ends;   /* end offset of each piece in text */
    size_t          n_ends, cap_ends;
    bool            done, lost; /* lost: a piece could not be queued (out of memory) */
    ag_finish       finish;
    char            error[512];
    ag_gen_event    last;   /* the final event's usage figures */
} gen_wait;

static void on_engine_event(void *user, const ag_gen_event *ev) {
    gen_wait *w = user;
    pthread_mutex_lock(&w->mu);
    if (ev->len) {
        if (w->n_ends == w->cap_ends) {
            size_t  cap = w->cap_ends ? 2 * w->cap_ends : 64;
            size_t *e = realloc(w->ends, cap * sizeof *e);
            if (e) w->ends = e, w->cap_ends = cap;
        }
        if (w->n_ends < w->cap_ends && !ag_buf_append(&w->text, ev->text, ev->len)) w->ends[w->n_ends++] = w->text.len;
        else w->lost = true;
    }
    if (ev->finish != AG_FINISH_NONE) {
        w->done = true;
        w->finish = ev->finish;
        w->last = *ev;
        if (ev->error) snprintf(w->error, sizeof w->error, "%s", ev->error);
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static uint64_t fresh_seed(void) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (counter++ * 0x9E3779B97F4A7C15ull);
    return x == AUGUR_SEED_RANDOM ? 0 : x;
}

/* Delivers queued pieces to on_piece until the engine's final event; asks
 * the engine to cancel once the callback says stop (later pieces are
 * dropped). Returns whether the callback stopped it. */
static bool deliver(augur_model *m, uint64_t id, gen_wait *w, augur_piece_fn on_piece, void *user) {
    ag_buf  text = {0};
    size_t *ends = NULL, n_ends = 0, cap = 0;
    bool    stopped = false, done = false;
    while (!done) {
        pthread_mutex_lock(&w->mu);
        while (!w->done && w->n_ends == 0) pthread_cond_wait(&w->cv, &w->mu);
        ag_buf t = text;
        text = w->text; /* take the queue, leave an empty one (swap keeps both buffers' memory) */
        w->text = t;
        ag_buf_clear(&w->text);
        size_t *e = ends;
        ends = w->ends, n_ends = w->n_ends;
        size_t c = cap;
        cap = w->cap_ends;
        w->ends = e, w->cap_ends = c, w->n_ends = 0;
        done = w->done;
        pthread_mutex_unlock(&w->mu);
        for (size_t i = 0, start = 0; i < n_ends && !stopped; start = ends[i++])
            if (on_piece && on_piece(text.data + start, ends[i] - start, user) != 0) {
                stopped = true;
                ag_engine_cancel(m->engine, id);
            }
    }
    ag_buf_free(&text);
    free(ends);
    return stopped;
}

augur_status augur_generate_tokens(augur_model *m, const int32_t *tokens, size_t n_tokens,
                                   const augur_gen_params *params, augur_piece_fn on_piece, void *user,
                                   augur_usage *usage) {
    if (usage) memset(usage, 0, sizeof *usage);
    if (!m || (!tokens && n_tokens)) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_generate: NULL argument");
    augur_gen_params p = params ? *params : augur_gen_default_params();
    if (n_tokens == 0) return (augur_status)ag_errorf(AG_ERR_INVALID, "the prompt is empty");
    if (n_tokens > INT32_MAX) return (augur_status)ag_errorf(AG_ERR_RANGE, "the prompt is too long");
    if (p.max_tokens < 0) return (augur_status)ag_errorf(AG_ERR_RANGE, "max_tokens %d is negative", p.max_tokens);
    if (p.n_stop > 16) return (augur_status)ag_errorf(AG_ERR_RANGE, "at most 16 stop strings (%zu given)", p.n_stop);
    if (p.n_stop && !p.stop) return (augur_status)ag_errorf(AG_ERR_INVALID, "stop is NULL with n_stop %zu", p.n_stop);
    for (size_t i = 0; i < p.n_stop; i++) {
        if (!p.stop[i] || !*p.stop[i]) return (augur_status)ag_errorf(AG_ERR_INVALID, "stop string %zu is NULL or empty", i);
        ag_status st = check_utf8("a stop string", p.stop[i], strlen(p.stop[i]));
        if (st) return (augur_status)st;
    }
    ag_gen_request req = {.prompt = tokens, .n_prompt = (int)n_tokens, .max_tokens = p.max_tokens, .n_choices = 1,
                          .sample = ag_sample_default_params(), .stops = p.stop, .n_stops = (int)p.n_stop,
                          .ignore_eos = p.ignore_eos, .cb = on_engine_event};
    req.sample.temperature = p.temperature;
    req.sample.top_k = p.top_k;
    req.sample.top_p = p.top_p;
    req.sample.min_p = p.min_p;
    req.sample.repetition_penalty = p.repeat_penalty;
    req.sample.penalty_last_n = 64;
    req.sample.seed = p.seed == AUGUR_SEED_RANDOM ? fresh_seed() : p.seed;

    gen_wait w = {.done = false};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    req.user = &w;
    uint64_t  id = 0;
    ag_status st = ag_engine_submit(m->engine, &req, &id);
    if (!st) {
        bool stopped = deliver(m, id, &w, on_piece, user);
        /* the final event has come: the engine no longer touches w */
        if (w.finish == AG_FINISH_ERROR) st = ag_errorf(AG_ERR_INTERNAL, "generation failed: %s", w.error);
        else if (w.lost) st = ag_errorf(AG_ERR_NOMEM, "out of memory while streaming the output");
        else if (!stopped && w.finish == AG_FINISH_CANCELLED)
            st = ag_errorf(AG_ERR_INTERNAL, "the generation was cancelled (the model is being freed)");
        if (usage) {
            const ag_gen_event *u = &w.last;
            *usage = (augur_usage){
                .finish = stopped ? AUGUR_FINISH_CALLBACK
                          : w.finish == AG_FINISH_LENGTH ? AUGUR_FINISH_LENGTH : AUGUR_FINISH_STOP,
                .prompt_tokens = u->n_prompt,
                .cached_tokens = u->n_cached,
                .generated_tokens = u->n_generated,
                .prefill_ms = u->t_prefill_ms,
                .decode_ms = u->t_decode_ms,
                .drafted_tokens = u->n_drafted,
                .accepted_tokens = u->n_accepted,
                .verify_steps = u->n_spec_rounds,
                .verify_tokens = u->n_spec_emitted,
            };
        }
    }
    ag_buf_free(&w.text);
    free(w.ends);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return public_status(st);
}

augur_status augur_generate(augur_model *m, const char *prompt, size_t len, const augur_gen_params *params,
                            augur_piece_fn on_piece, void *user, augur_usage *usage) {
    if (usage) memset(usage, 0, sizeof *usage);
    if (!m || (!prompt && len)) return (augur_status)ag_errorf(AG_ERR_INVALID, "augur_generate: NULL argument");
    augur_gen_params p = params ? *params : augur_gen_default_params();
    ag_status st = check_utf8("the prompt", prompt, len);
    if (st) return (augur_status)st;
    if (p.prompt_kind != AUGUR_PROMPT_TEXT && p.prompt_kind != AUGUR_PROMPT_CHAT)
        return (augur_status)ag_errorf(AG_ERR_INVALID, "unknown prompt_kind %d", (int)p.prompt_kind);
    bool chat = p.prompt_kind == AUGUR_PROMPT_CHAT;
    /* a template that writes BOS itself must not get a second one */
    bool add_special = !(chat && m->chat && ag_chat_has_bos(m->chat, prompt ? prompt : "", len));
    int32_t *ids = NULL;
    size_t   n_ids = 0;
    if ((st = ag_tok_encode(m->tok, prompt ? prompt : "", len, add_special, chat, &ids, &n_ids)))
        return (augur_status)st;
    augur_status rc = augur_generate_tokens(m, ids, n_ids, &p, on_piece, user, usage);
    free(ids);
    return rc;
}
