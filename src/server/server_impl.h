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
#include "sample/schema.h"
#include "server/server.h"

struct MHD_Daemon;
struct MHD_Connection;
typedef struct srv_gen srv_gen;
typedef struct srv_event srv_event;
struct srv_conn;

/* Status codes counted for /metrics. */
enum { SRV_CODE_SLOTS = 14 };
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

    /* Open connections, for the request deadline and the readers' share of
     * the slots (conns.c). */
    pthread_mutex_t  conns_mu;
    pthread_cond_t   conns_cv; /* the watchdog waits for the next deadline */
    struct srv_conn *conns;
    int              n_reading;   /* connections waiting for a request */
    int              max_reading; /* at most this many: the rest of the slots are for answered requests */
    pthread_t        conns_watchdog;
    bool             conns_init, watchdog_started, conns_stop;
    atomic_uint_least64_t conn_timeouts;  /* closed: a request not in by its deadline */
    atomic_uint_least64_t conn_evictions; /* closed: the readers' share was full */

    atomic_uint_least64_t http_count[SRV_CODE_SLOTS + 1]; /* last: other codes */
    atomic_uint_least64_t client_cancels;
    atomic_uint_least64_t completions_ok;
};

/* ---- connections (conns.c) ---- */

/* After the headers, a body must keep coming at this many bytes a second on
 * average (over header_timeout_s of grace). */
#define SRV_BODY_MIN_RATE 1024

/* Initializes the connection list and starts its watchdog thread (before
 * the daemon starts), and stops it (after the daemon stopped: no callback
 * runs any more). stop is safe after a failed or no start. */
ag_status srv_conns_start(ag_server *s);
void      srv_conns_stop(ag_server *s);
#ifdef MHD_VERSION
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the server):
 * lists a connection from its start to its close, and at its start closes
 * the READING connection that has waited longest when readers are over
 * their share. */
void srv_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);
#endif
/* A connection's request: its headers are in (the deadline becomes the
 * body's), body bytes arrived, a response is queued (no deadline while it
 * is answered, a stream included), the response is done (kept alive: the
 * wait for the next request begins). No-ops for untracked connections. */
void srv_conn_headers_in(ag_server *s, struct MHD_Connection *c);
void srv_conn_body(ag_server *s, struct MHD_Connection *c, size_t bytes);
void srv_conn_answering(ag_server *s, struct MHD_Connection *c);
void srv_conn_completed(ag_server *s, struct MHD_Connection *c);

/* ---- responses ---- */

/* What a route produces: a complete body, or a stream. */
typedef struct {
    int      status;
    ag_buf   body;
    const char *content_type;
    char     retry_after[8]; /* "" or seconds */
    void    *stream;         /* a srv_job for SSE, owned by the response once set */
    /* A body that outlives the response (an embedded file), sent without a
     * copy instead of `body` when static_body is set. */
    const void *static_body;
    size_t      static_len;
    const char *etag; /* NULL, or the ETag header's value (outlives the response) */
    /* NULL, or name/value pairs of extra headers ending at a NULL name;
     * the strings must outlive the response. */
    const char *const *headers;
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
void srv_route_embeddings(srv_req *rq, srv_resp *out); /* embeddings.c */

/* ---- the chat page (webui.c) ---- */

/* An embedded file of webui/, served at `url`. */
typedef struct srv_asset srv_asset;

/* The file served at `url` ("/" is the page; its CSS, JS and icon live
 * under /webui/), or NULL when `url` is none of them. */
const srv_asset *srv_webui_find(const char *url);

/* Fills `out` with the file: 200 with the bytes (static, not copied), or
 * 304 without a body when the request's If-None-Match names its ETag.
 * Either way with Content-Type, ETag and Cache-Control (revalidate every
 * time: the binary, and so the files, may change under the same URL). */
void srv_route_webui(srv_req *rq, srv_resp *out, const srv_asset *a);

/* Parses the request body as a JSON object; on failure fills `out` with the
 * 400 and returns NULL. */
json_t *srv_parse_body(srv_req *rq, srv_resp *out);

void srv_route_messages(srv_req *rq, srv_resp *out);              /* anthropic.c */
void srv_route_messages_count_tokens(srv_req *rq, srv_resp *out); /* anthropic.c */

/* Rewrites an error response (OpenAI's shape, as srv_error makes it) into
 * Anthropic's {"type": "error", "error": {"type", "message"}}, with the
 * error type and, for a full queue, the status (529) Anthropic's clients
 * expect. Routes under /v1/messages answer through it. */
void srv_anthropic_error(srv_resp *r);

/* ---- request parsing shared by the protocols (openai.c) ---- */

/* "a string", "an object", ... ("nothing" for NULL): for error messages. */
const char *srv_type_name(const json_t *v);
/* Field readers: an absent or null field keeps *v; a wrong type or a value
 * out of [lo, hi] fills `out` with a 400 naming `key` and returns false.
 * srv_get_int also takes integral reals and sets *present (may be NULL)
 * when it read a value. */
bool srv_get_bool(json_t *o, const char *key, bool *v, srv_resp *out);
bool srv_get_num(json_t *o, const char *key, double lo, double hi, double *v, srv_resp *out);
bool srv_get_int(json_t *o, const char *key, long long lo, long long hi, long long *v, bool *present,
                 srv_resp *out);

#define SRV_MAX_STOPS 16

/* What a request asks of a generation, whatever its protocol. Strings and
 * arrays are owned (srv_opts_free). */
typedef struct {
    ag_sample_params sp;
    ag_logit_bias   *bias;
    int              max_tokens; /* 0: until the context is full */
    int              n;
    char            *stops[SRV_MAX_STOPS];
    int              n_stops;
    bool             stream, include_usage, ignore_eos, echo;
    bool             logprobs;
    int              top_logprobs;
    bool             no_output;   /* completions: max_tokens 0 with echo */
    ag_schema       *schema;      /* structured output: response_format or a forced tool call; else NULL */
    int              spec_max;    /* "speculative": 0 the server's setting, -1 off, n > 0 at most n drafts */
    uint64_t         cache_ns;    /* prefix cache namespace: the API key and "cache_salt" */
    bool             one_tool_call; /* parallel_tool_calls false (Anthropic: disable_parallel_tool_use) */
} srv_opts;

/* Defaults: the sampler's, one choice, no limit, a fresh random seed. */
void srv_opts_init(srv_opts *o);
void srv_opts_free(srv_opts *o);
/* temperature (0..max_temperature), top_p, min_p, top_k, the penalties and
 * seed of body b into o->sp. False with `out` filled on a bad field. */
bool srv_parse_sampling(json_t *b, double max_temperature, srv_opts *o, srv_resp *out);
/* augur's extensions any protocol accepts: "speculative" and "cache_salt"
 * (with the server's API key, the prefix cache namespace). */
bool srv_parse_extensions(ag_server *s, json_t *b, srv_opts *o, srv_resp *out);
/* Stop strings from `stop` (a string or a list of at most SRV_MAX_STOPS
 * strings; NULL/null: none), named `param` in errors. */
bool srv_parse_stops(json_t *stop, const char *param, srv_opts *o, srv_resp *out);
/* Structured output: the output is made one JSON value of `schema` (an
 * object or a boolean), as response_format's json_schema does; false with a
 * 400 naming `param` when it does not compile. */
bool srv_output_schema(json_t *schema, const char *param, srv_opts *o, srv_resp *out);

/* ---- request fields (fields.c) ---- */

typedef enum { SRV_ROUTE_CHAT, SRV_ROUTE_COMPLETIONS, SRV_ROUTE_MESSAGES } srv_route_kind;

/* Checks the top-level fields of body b for a route before it is parsed:
 * a field the route's API does not define is a 400 naming it (code
 * "unknown_parameter"), one it defines but augur does not implement a 400
 * (code "unsupported_parameter") unless its value asks for nothing augur
 * does not do (null, modalities ["text"], ...), and with --lenient-fields
 * (params.lenient_fields) both are ignored instead. A string holding NUL
 * (\u0000) outside the text the model reads (prompts, message content) is
 * a 400 naming where it is, lenient or not. True when the body may be
 * parsed; false with `out` filled. SRV_ROUTE_MESSAGES is also
 * count_tokens' (the same body). */
bool srv_check_fields(ag_server *s, json_t *b, srv_route_kind route, srv_resp *out);

/* OpenAI tools + tool_choice of body b: the tools the prompt gets (a new
 * reference; NULL for none, or on error with *failed and `out` filled).
 * *forced: tool_choice "required" or a named function (then the result
 * holds just that one). */
json_t *srv_parse_tools(json_t *b, srv_resp *out, bool *failed, bool *forced);
/* Validates OpenAI chat messages and builds the list the template sees
 * (tool calls as objects; for a template that does not render tools, the
 * Hermes instructions in the system message and calls/results spelled out
 * as text). A new reference, or NULL with `out` filled. */
json_t *srv_build_messages(ag_server *s, json_t *msgs, json_t *tools, srv_resp *out);
/* Renders srv_build_messages' list with the chat template (tools when the
 * template renders them), appends `prefill` (prefill_len bytes: the start
 * of the assistant's reply, which the output continues; NULL for none) and
 * tokenizes it into *ids (the caller frees). False with a 400 in `out`
 * (errors name `param`). */
bool srv_chat_prompt(ag_server *s, json_t *msgs, json_t *tools, const char *prefill, size_t prefill_len,
                     const char *param, int32_t **ids, size_t *n_ids, srv_resp *out);

/* ---- generation jobs (openai.c): one request's output, JSON or SSE ---- */

typedef struct {
    ag_buf    text;   /* everything generated (stop strings removed) */
    size_t    sent;   /* bytes of text already streamed as content */
    ag_finish finish;
    int       stop_index; /* with AG_FINISH_STOP: the srv_job.stops entry that ended it, or -1 */
    bool      done;
    char     *error;
    json_t   *lp;     /* chat: content entries; completions: {tokens,...} (non-stream) */
    size_t    offset; /* completions text_offset of the next token */
    int       prompt; /* index of its prompt (completions) */
    int       lp_first; /* echo + logprobs: prompt position of lp's first entry (1 when BOS is not echoed) */
} srv_choice;

typedef struct srv_job srv_job;

/* What differs between the protocols that share the job machinery. */
typedef struct {
    const char *id_prefix; /* of the response id: "chatcmpl-", "msg_" */
    /* Streaming: the first bytes once every prompt is submitted (may be
     * NULL), one engine event, and the end once every choice finished
     * (j->ended is set afterwards). They append SSE bytes to j->out; an
     * error that ends the stream sets j->ended. */
    void (*stream_start)(srv_job *j);
    void (*stream_event)(srv_job *j, srv_event *e);
    void (*stream_end)(srv_job *j);
    /* Not streaming: the whole response, every choice being done. */
    void (*respond)(srv_job *j, srv_resp *out);
} srv_protocol;

struct srv_job {
    ag_server             *s;
    struct MHD_Connection *conn;
    const srv_protocol    *proto;
    bool                   chat, stream, include_usage, logprobs, tools;
    bool                   one_call; /* keep the first tool call only (srv_opts.one_tool_call) */
    int                    top_logprobs;
    ag_tool_format         tf;
    json_t                *tool_list; /* the request's tools (owned), when tools are active */
    int                    n_choices;
    srv_choice            *ch;
    char                 **echo; /* per prompt (completions with echo) */
    size_t                *echo_len;
    int                    n_prompts;
    char                  *stops[SRV_MAX_STOPS]; /* the request's stop strings (owned) */
    int                    n_stops;
    char                   id[48];
    time_t                 created;
    srv_gen               *gen;
    ag_buf                 out; /* SSE bytes not yet handed to MHD */
    size_t                 out_off;
    bool                   ended;
    void                  *proto_state; /* the protocol's streaming state (malloc'd, freed with the job) */
};

/* A job for n_prompts prompts of o->n choices each (copies what it needs
 * of o); NULL when out of memory. */
srv_job *srv_job_new(srv_req *rq, const srv_protocol *proto, const srv_opts *o, int n_prompts);
/* The request's tools (borrowed; the job keeps a reference) are active:
 * output is parsed for calls in the template's format, and with `forced`
 * o is set up so that the output is one call whose arguments are a value of
 * the tool's parameters schema. False (with a 400 in `out`) when a
 * parameters schema does not compile; the caller frees j. */
bool srv_job_use_tools(srv_job *j, srv_opts *o, json_t *tools, bool forced, srv_resp *out);
/* Submits every prompt and produces the response, or hands the stream to
 * `out`. Takes ownership of j. Errors name `prompt_param`. */
void srv_job_run(srv_job *j, const srv_opts *o, int32_t **ids, const size_t *n_ids, const char *prompt_param,
                 srv_resp *out);
/* Not streaming: false (with a 500 or 503 in `out`) when a choice failed
 * or was cancelled. */
bool srv_job_choices_ok(srv_job *j, srv_resp *out);
/* The tool calls in `text` (ag_server_parse_tool_calls with the job's format
 * and tools), only the first when the request allows one call; false when
 * there are none. */
bool srv_job_tool_calls(srv_job *j, const char *text, size_t len, json_t **calls, ag_buf *content);
/* Streaming: the bytes of c's text that may go out now (*fresh, the return
 * value), marked as sent. With tools, text that may still become a tool
 * call is held back unless release_all. */
size_t srv_stream_fresh(srv_job *j, srv_choice *c, bool release_all, const char **fresh);

/* The MHD content-reader and its free callback for an SSE stream
 * (srv_job_free also frees a job that never ran). */
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
