/* Internals shared by the server's files (not a public header). */
#ifndef AG_SERVER_IMPL_H
#define AG_SERVER_IMPL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "base/buf.h"
#include "server/server.h"

struct MHD_Daemon;
struct MHD_Connection;
typedef struct srv_gen srv_gen;

/* Status codes counted for /metrics. */
enum { SRV_CODE_SLOTS = 12 };
extern const int srv_codes[SRV_CODE_SLOTS];

struct ag_server {
    ag_server_params p;
    char             model_id[256];
    char             fingerprint[40];
    time_t           started;
    struct MHD_Daemon *daemon;
    int              port;

    /* The engine pointer is read under the read lock by connection threads
     * and cleared under the write lock by ag_server_stop: after that no
     * thread can reach the engine. */
    pthread_rwlock_t eng_lock;
    ag_engine       *eng;
    int              n_ctx, n_parallel, n_vocab;

    ag_model        *model;
    const ag_tok    *tok;
    const ag_chat   *chat;
    ag_tool_format   tool_format;
    bool             tmpl_has_tools; /* the template renders `tools` itself */

    atomic_bool      stopping;
    pthread_mutex_t  gens_mu; /* guards the list of live generations */
    srv_gen         *gens;

    atomic_uint_least64_t http_count[SRV_CODE_SLOTS + 1]; /* last: other codes */
    atomic_uint_least64_t client_cancels;
    atomic_uint_least64_t completions_ok;
};

/* ---- responses ---- */

/* What a route produces: a complete body, or a stream. */
typedef struct {
    int      status;
    ag_buf   body;
    const char *content_type;
    char     retry_after[8]; /* "" or seconds */
    void    *stream;         /* a srv_job for SSE, owned by the response once set */
} srv_resp;

typedef struct {
    ag_server             *s;
    struct MHD_Connection *conn;
    const char            *method, *url;
    const char            *body;
    size_t                 body_len;
} srv_req;

/* Fills resp with an OpenAI error. param/code may be NULL (JSON null). */
void srv_error(srv_resp *r, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Serializes a JSON value into resp with status (steals the reference). */
void srv_json(srv_resp *r, int status, json_t *v);

/* A JSON string from bytes that may not be valid UTF-8 (invalid bytes
 * become U+FFFD); never NULL unless out of memory. */
json_t *srv_jstr(const char *s, size_t len);

/* True when the client of `conn` has closed its socket. */
bool srv_client_gone(struct MHD_Connection *conn);

void srv_random_id(char *out, size_t n_chars); /* out has n_chars + 1 bytes */

/* ---- routes ---- */
void srv_route_chat(srv_req *rq, srv_resp *out);
void srv_route_completions(srv_req *rq, srv_resp *out);
void srv_route_models(srv_req *rq, srv_resp *out, const char *id);
void srv_route_health(srv_req *rq, srv_resp *out);
void srv_route_metrics(srv_req *rq, srv_resp *out);
void srv_route_tokenize(srv_req *rq, srv_resp *out);
void srv_route_detokenize(srv_req *rq, srv_resp *out);

/* Parses the request body as a JSON object; on failure fills `out` with the
 * 400 and returns NULL. */
json_t *srv_parse_body(srv_req *rq, srv_resp *out);

/* ---- streaming jobs (openai.c) ---- */
/* The MHD content-reader and its free callback for an SSE stream. */
ssize_t srv_job_read(void *job, uint64_t pos, char *buf, size_t max);
void    srv_job_free(void *job);

/* ---- generations (gen.c) ---- */

/* One engine event, copied out of the engine thread. */
typedef struct srv_event {
    struct srv_event *next;
    int               choice; /* absolute choice index within the HTTP request */
    int               prompt_pos; /* > 0: the score of this prompt token (ag_gen_event.prompt_pos) */
    int32_t           token;
    bool              has_sample;
    float             logprob;
    int               n_top;
    ag_token_logprob  top[AG_SAMPLE_MAX_LOGPROBS];
    ag_finish         finish;
    int               stop_index; /* ag_gen_event.stop_index */
    char             *error;
    size_t            len;
    char              text[]; /* len bytes + NUL */
} srv_event;

/* A generation: one HTTP request's engine requests (one per prompt) and the
 * queue their events arrive on. Reference-counted between the connection
 * (one reference) and each submitted engine request (one until its last
 * final event). */
srv_gen *srv_gen_new(ag_server *s, int n_subs);
/* Submits sub-request `sub` (its choices are numbered from choice_base).
 * Sets r->cb and r->user. Errors are the engine's, or AG_ERR_UNSUPPORTED
 * "shutting down" once the server stops. */
ag_status srv_gen_submit(srv_gen *g, int sub, ag_gen_request *r, int choice_base);
/* Pops the next event (caller frees it with free()), waiting up to
 * timeout_ms; NULL on timeout or when every choice has finished and the
 * queue is empty (see srv_gen_finished). */
srv_event *srv_gen_next(srv_gen *g, int timeout_ms);
bool       srv_gen_finished(srv_gen *g); /* all finals seen and queue empty */
void       srv_gen_cancel(srv_gen *g);
/* Usage over all sub-requests (from their latest events). */
void srv_gen_usage(srv_gen *g, int *n_prompt, int *n_cached, int *n_generated);
/* Speculative decoding over all prompts and choices: draft tokens verified and accepted. */
void srv_gen_spec_usage(srv_gen *g, int *n_drafted, int *n_accepted);
/* Drops the connection's reference; cancels whatever still runs. */
void srv_gen_release(srv_gen *g);
/* Cancels every live generation (shutdown). */
void srv_gen_cancel_all(ag_server *s);

/* Engine calls under the read lock; false once the engine is detached. */
bool srv_engine_stats(ag_server *s, ag_engine_stats *st);

#endif
