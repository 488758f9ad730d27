/* HTTP transport: the libmicrohttpd daemon, body collection with a size
 * limit, routing, authentication, CORS and response sending. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "server/anthropic.h"
#include "server/conns.h"
#include "server/embeddings.h"
#include "server/gen.h"
#include "server/job.h"
#include "server/openai.h"
#include "server/reply.h"
#include "server/responses.h"
#include "server/routes.h"
#include "server/server_impl.h"
#include "server/webui.h"

const int srv_codes[SRV_CODE_SLOTS] = {200, 204, 400, 401, 404, 405, 413, 429, 431, 500, 503, 408, 304, 529};

ag_server_params ag_server_default_params(void) {
    ag_server_params p = {.host = "127.0.0.1", .port = 8080, .api_key = NULL, .cors_origin = NULL,
                          .model_id = "model", .max_body = (size_t)8 << 20, .max_connections = 256,
                          .timeout_s = 60, .header_timeout_s = 20, .webui = true};
    return p;
}

/* ---- per-request state ---- */

typedef struct {
    ag_buf body;
    size_t received;
    bool   too_large;
} conn_req;

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    srv_conn_completed(cls, c);
    conn_req *cr = *con_cls;
    if (cr) {
        ag_buf_free(&cr->body);
        free(cr);
        *con_cls = NULL;
    }
}

static void count_status(ag_server *s, int status) {
    for (int i = 0; i < SRV_CODE_SLOTS; i++)
        if (srv_codes[i] == status) {
            atomic_fetch_add(&s->http_count[i], 1);
            return;
        }
    atomic_fetch_add(&s->http_count[SRV_CODE_SLOTS], 1);
}

/* Anthropic's API (anthropic.c): its routes answer errors in its shape. */
static bool is_anthropic_url(const char *url) {
    return !strncmp(url, "/v1/messages", 12) && (url[12] == '\0' || url[12] == '/');
}

static enum MHD_Result send_resp(ag_server *s, struct MHD_Connection *c, const char *method, const char *url,
                                 srv_resp *r, const char *allow) {
    struct MHD_Response *resp;
    srv_conn_answering(s, c);
    if (!r->stream && r->status >= 400 && is_anthropic_url(url)) srv_anthropic_error(r);
    if (r->stream) {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, srv_job_read, r->stream, srv_job_free);
        if (!resp) {
            srv_job_free(r->stream);
            ag_buf_free(&r->body);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    } else {
        if (r->static_body)
            resp = MHD_create_response_from_buffer(r->static_len, (void *)r->static_body, MHD_RESPMEM_PERSISTENT);
        else
            resp = MHD_create_response_from_buffer(r->body.len, r->body.data ? r->body.data : (void *)"",
                                                   MHD_RESPMEM_MUST_COPY);
        if (!resp) {
            ag_buf_free(&r->body);
            return MHD_NO;
        }
        if (r->content_type) MHD_add_response_header(resp, "Content-Type", r->content_type);
    }
    if (r->etag) MHD_add_response_header(resp, "ETag", r->etag);
    for (const char *const *h = r->headers; h && h[0]; h += 2) MHD_add_response_header(resp, h[0], h[1]);
    if (s->p.cors_origin && *s->p.cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->p.cors_origin);
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (allow) MHD_add_response_header(resp, "Allow", allow);
    if (r->retry_after[0]) MHD_add_response_header(resp, "Retry-After", r->retry_after);
    if (r->status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    count_status(s, r->status);
    if (ag_log_enabled(AG_LOG_INFO)) AG_LOGI("%s %s %d", method, url, r->status);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    ag_buf_free(&r->body);
    return ret;
}

/* ---- routing ---- */

typedef enum {
    R_CHAT, R_COMPLETIONS, R_MODELS, R_MODEL, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_MESSAGES, R_COUNT_TOKENS,
    R_RESPONSES, R_RESPONSE_ID, R_EMBEDDINGS
} route_id;

static const struct {
    const char *path;
    route_id    id;
    bool        post;
    bool        auth;
} routes[] = {
    {"/v1/chat/completions", R_CHAT, true, true},
    {"/v1/completions", R_COMPLETIONS, true, true},
    {"/v1/models", R_MODELS, false, true},
    {"/health", R_HEALTH, false, false},
    {"/metrics", R_METRICS, false, true},
    {"/tokenize", R_TOKENIZE, true, true},
    {"/detokenize", R_DETOKENIZE, true, true},
    {"/v1/messages", R_MESSAGES, true, true},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, true, true},
    {"/v1/responses", R_RESPONSES, true, true},
    {"/v1/responses/", R_RESPONSE_ID, false, true}, /* + id: GET and DELETE */
    {"/v1/embeddings", R_EMBEDDINGS, true, true},
};

/* Constant-time comparison of a presented key with ours. */
static bool key_matches(const ag_server *s, const char *got) {
    size_t glen = strlen(got), klen = strlen(s->p.api_key);
    unsigned char diff = (unsigned char)(glen != klen);
    for (size_t i = 0; i < klen; i++) diff |= (unsigned char)(s->p.api_key[i] ^ (i < glen ? got[i] : 0));
    return diff == 0;
}

/* The key comes as "Authorization: Bearer <key>" (OpenAI's clients) or
 * "x-api-key: <key>" (Anthropic's). */
static bool key_ok(const ag_server *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0) {
        const char *got = h + 7;
        while (*got == ' ') got++;
        if (key_matches(s, got)) return true;
    }
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return x && key_matches(s, x);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls) {
    ag_server *s = cls;
    conn_req *cr = *con_cls;
    if (!cr) {
        cr = calloc(1, sizeof *cr);
        if (!cr) return MHD_NO;
        *con_cls = cr;
        srv_conn_headers_in(s, c);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > s->p.max_body) cr->too_large = true;
            /* Far too large: answer now and let the connection close rather
             * than read it all. */
            if (cr->too_large && (errno || n / 8 > s->p.max_body)) {
                srv_resp r = {0};
                srv_error(&r, 413, "invalid_request_error", NULL, "request_too_large",
                          "the request body is larger than the limit of %zu bytes", s->p.max_body);
                return send_resp(s, c, method, url, &r, NULL);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        srv_conn_body(s, c, *upload_size);
        if (!cr->too_large && cr->body.len + *upload_size <= s->p.max_body) {
            if (ag_buf_append(&cr->body, upload_data, *upload_size)) return MHD_NO;
        } else {
            /* keep reading (and dropping) so that the client gets its 413
             * instead of a reset connection; bounded, then give up */
            cr->too_large = true;
            ag_buf_free(&cr->body);
            if (cr->received > 8 * s->p.max_body) return MHD_NO;
        }
        cr->received += *upload_size;
        *upload_size = 0;
        return MHD_YES;
    }

    /* The request is in: no deadline while the route runs (a non-streamed
     * generation answers only when it is done, which may take minutes). */
    srv_conn_answering(s, c);
    srv_resp r = {0};
    const char *allow = NULL;
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool is_post = !strcmp(method, "POST");
    int found = -1;
    const char *model_id = NULL;
    /* The chat page needs no key: it has to load before it can ask for one. */
    const srv_asset *asset = s->p.webui ? srv_webui_find(url) : NULL;
    if (asset) {
        if (!is_get) {
            srv_error(&r, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %s is not allowed; use GET",
                      method, url);
            return send_resp(s, c, method, url, &r, "GET, HEAD");
        }
        srv_req rq = {.s = s, .conn = c, .method = method, .url = url};
        srv_route_webui(&rq, &r, asset);
        return send_resp(s, c, method, url, &r, NULL);
    }
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) found = (int)i;
    if (found < 0 && !strncmp(url, "/v1/models/", 11) && url[11]) {
        found = 2;
        model_id = url + 11;
    }
    const char *response_id = NULL;
    bool response_route = found < 0 && !strncmp(url, "/v1/responses/", 14) && url[14] && !strchr(url + 14, '/');
    if (response_route) {
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
            if (routes[i].id == R_RESPONSE_ID) found = (int)i;
        response_id = url + 14;
    } else if (found >= 0 && routes[found].id == R_RESPONSE_ID) {
        found = -1; /* "/v1/responses/" without an id */
    }
    if (found < 0) {
        srv_error(&r, 404, "invalid_request_error", NULL, "not_found", "unknown route: %s %s", method, url);
        return send_resp(s, c, method, url, &r, NULL);
    }
    allow = response_route ? "GET, HEAD, DELETE, OPTIONS" : routes[found].post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
    if (!strcmp(method, "OPTIONS")) {
        /* CORS preflight (and plain OPTIONS): no body, no auth */
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Allow", allow);
        srv_conn_answering(s, c);
        if (s->p.cors_origin && *s->p.cors_origin) {
            MHD_add_response_header(resp, "Access-Control-Allow-Origin", s->p.cors_origin);
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
            const char *req_h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                    req_h && *req_h ? req_h : "Authorization, Content-Type");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
            MHD_add_response_header(resp, "Vary", "Origin");
        }
        count_status(s, 204);
        enum MHD_Result ret = MHD_queue_response(c, 204, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    if (response_route ? !is_get && strcmp(method, "DELETE") : routes[found].post ? !is_post : !is_get) {
        srv_error(&r, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %s is not allowed; use %s",
                  method, url, response_route ? "GET or DELETE" : routes[found].post ? "POST" : "GET");
        return send_resp(s, c, method, url, &r, allow);
    }
    if (cr->too_large) {
        srv_error(&r, 413, "invalid_request_error", NULL, "request_too_large",
                  "the request body is larger than the limit of %zu bytes", s->p.max_body);
        return send_resp(s, c, method, url, &r, NULL);
    }
    if (routes[found].auth && s->p.api_key && *s->p.api_key && !key_ok(s, c)) {
        srv_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key",
                  "missing or incorrect API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
        return send_resp(s, c, method, url, &r, NULL);
    }
    srv_req rq = {.s = s, .conn = c, .method = method, .url = url, .body = cr->body.data ? cr->body.data : "",
                  .body_len = cr->body.len};
    if (atomic_load(&s->stopping) && routes[found].id != R_HEALTH) {
        srv_error(&r, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
        return send_resp(s, c, method, url, &r, NULL);
    }
    const route_id rid = routes[found].id;
    if ((rid == R_CHAT || rid == R_COMPLETIONS || rid == R_MESSAGES || rid == R_RESPONSES) &&
        ag_model_is_encoder(s->model)) {
        srv_error(&r, 400, "invalid_request_error", "model", "model_not_supported",
                  "'%s' is an embedding model: it cannot generate text (use /v1/embeddings)", s->model_id);
        return send_resp(s, c, method, url, &r, NULL);
    }
    switch (rid) {
    case R_EMBEDDINGS: srv_route_embeddings(&rq, &r); break;
    case R_CHAT: srv_route_chat(&rq, &r); break;
    case R_COMPLETIONS: srv_route_completions(&rq, &r); break;
    case R_MESSAGES: srv_route_messages(&rq, &r); break;
    case R_COUNT_TOKENS: srv_route_messages_count_tokens(&rq, &r); break;
    case R_RESPONSES: srv_route_responses(&rq, &r); break;
    case R_RESPONSE_ID: srv_route_response_id(&rq, &r, response_id); break;
    case R_MODELS:
    case R_MODEL: srv_route_models(&rq, &r, model_id); break;
    case R_HEALTH: srv_route_health(&rq, &r); break;
    case R_METRICS: srv_route_metrics(&rq, &r); break;
    case R_TOKENIZE: srv_route_tokenize(&rq, &r); break;
    case R_DETOKENIZE: srv_route_detokenize(&rq, &r); break;
    }
    return send_resp(s, c, method, url, &r, NULL);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    if (!ag_log_enabled(AG_LOG_DEBUG)) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    AG_LOGD("http: %s", msg);
}

/* Creates the listening socket ourselves: clear bind errors and the real
 * port for port 0. */
static ag_status open_listener(const char *host, int port, int *fd_out, int *port_out) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) return ag_errorf(AG_ERR_IO, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return ag_errorf(AG_ERR_IO, "cannot listen on %s:%d: %s", host, port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int bound = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) bound = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6) bound = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    *fd_out = fd;
    *port_out = bound;
    return AG_OK;
}

ag_status ag_server_new(const ag_server_params *pp, ag_engine *eng, ag_model *model, const ag_tok *tok,
                        const ag_chat *chat, ag_server **out) {
    *out = NULL;
    ag_server_params p = pp ? *pp : ag_server_default_params();
    if (!p.host || !*p.host) p.host = "127.0.0.1";
    if (!p.max_body) p.max_body = (size_t)8 << 20;
    if (!p.max_connections) p.max_connections = 256;
    if (!p.timeout_s) p.timeout_s = 60;
    if (!p.header_timeout_s) p.header_timeout_s = 20;
    if (p.port < 0 || p.port > 65535) return ag_errorf(AG_ERR_RANGE, "port %d is out of range", p.port);
    ag_server *s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "out of memory");
    s->p = p;
    snprintf(s->model_id, sizeof s->model_id, "%s", p.model_id ? p.model_id : "model");
    s->started = time(NULL);
    s->eng = eng;
    s->model = model;
    s->tok = tok;
    s->chat = chat;
    pthread_rwlock_init(&s->eng_lock, NULL);
    pthread_mutex_init(&s->gens_mu, NULL);
    srv_responses_init(s);
    atomic_init(&s->stopping, false);
    for (int i = 0; i <= SRV_CODE_SLOTS; i++) atomic_init(&s->http_count[i], 0);
    atomic_init(&s->client_cancels, 0);
    atomic_init(&s->completions_ok, 0);
    atomic_init(&s->conn_timeouts, 0);
    atomic_init(&s->conn_evictions, 0);

    ag_engine_stats es;
    ag_engine_get_stats(eng, &es);
    s->n_ctx = es.n_ctx;
    s->n_parallel = es.n_parallel;
    s->n_vocab = ag_tok_n_vocab(tok);
    uint64_t tlen = 0;
    const char *src = ag_gguf_get_str(ag_model_gguf(model), "tokenizer.chat_template", &tlen);
    s->tool_format = ag_server_tool_format(src, (size_t)tlen);
    s->thinks = ag_think_template_thinks(src, (size_t)tlen);
    s->harmony = ag_harmony_template(src, (size_t)tlen);
    if (s->harmony) s->tool_format = AG_TOOLS_HARMONY;
    s->tmpl_has_tools = false;
    if (src)
        for (uint64_t i = 0; i + 5 <= tlen; i++)
            if (!memcmp(src + i, "tools", 5)) {
                s->tmpl_has_tools = true;
                break;
            }
    /* a fingerprint that changes with the model and the serving shape */
    uint64_t h = ag_tok_fingerprint(tok) ^ ((uint64_t)ag_model_weight_bytes(model) * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)s->n_ctx << 32);
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_%012llx", (unsigned long long)(h & 0xFFFFFFFFFFFFull));

    int fd = -1;
    ag_status st = AG_OK;
    if (ag_model_is_encoder(model)) { /* its inputs from every connection share passes */
        const ag_embedder_params ep = {.n_batch = SRV_EMB_PASS_TOKENS, .max_queue = p.max_connections};
        if ((st = ag_embedder_new(model, &ep, &s->emb))) {
            ag_server_free(s);
            return st;
        }
    }
    st = open_listener(p.host, p.port, &fd, &s->port);
    if (!st) st = srv_conns_start(s);
    if (st) {
        if (fd >= 0) close(fd);
        ag_server_free(s);
        return st;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                                 MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)p.max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p.timeout_s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, srv_conn_notify, s,
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)p.max_connections_per_ip,
                                 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_END);
    if (!s->daemon) {
        close(fd);
        ag_server_free(s);
        return ag_errorf(AG_ERR_IO, "cannot start the HTTP server on %s:%d", p.host, p.port);
    }
    *out = s;
    return AG_OK;
}

int ag_server_port(const ag_server *s) { return s->port; }

void ag_server_stop(ag_server *s) {
    if (!s) return;
    if (atomic_exchange(&s->stopping, true)) return;
    if (s->daemon) {
        MHD_socket lfd = MHD_quiesce_daemon(s->daemon);
        if (lfd != MHD_INVALID_SOCKET) close(lfd);
    }
    srv_gen_cancel_all(s);
    pthread_rwlock_wrlock(&s->eng_lock);
    s->eng = NULL;
    pthread_rwlock_unlock(&s->eng_lock);
}

void ag_server_free(ag_server *s) {
    if (!s) return;
    ag_server_stop(s);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    srv_conns_stop(s);
    ag_embedder_free(s->emb); /* after the connections: none waits on it now */
    pthread_rwlock_destroy(&s->eng_lock);
    pthread_mutex_destroy(&s->gens_mu);
    srv_responses_free(s);
    free(s);
}
