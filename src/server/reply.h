/* Replies (reply.c): what a route fills in and answers with. The bottom
 * of server/: it uses no other file of it. */
#ifndef AG_SERVER_REPLY_H
#define AG_SERVER_REPLY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"
#include "server/server.h"

struct MHD_Connection;

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
/* The one map from a status code to an HTTP error (the message is
 * ag_error_message()): AG_ERR_STOPPED 503 "shutting_down", AG_ERR_BUSY 429
 * "server_busy" with Retry-After, AG_ERR_CONTEXT 400
 * "context_length_exceeded" naming `param` (the prompt's field; may be
 * NULL), AG_ERR_CAPACITY 400 naming max_tokens, AG_ERR_RANGE and
 * AG_ERR_INVALID 400 "invalid_value", anything else 500. */
void srv_status_error(srv_resp *r, ag_status st, const char *param);
/* Serializes a JSON value into resp with status (steals the reference). */
void srv_json(srv_resp *r, int status, json_t *v);

/* A JSON string from bytes that may not be valid UTF-8 (invalid bytes
 * become U+FFFD); never NULL unless out of memory. */
json_t *srv_jstr(const char *s, size_t len);

/* True when the client of `conn` has closed its socket. */
bool srv_client_gone(struct MHD_Connection *conn);

void srv_random_id(char *out, size_t n_chars); /* out has n_chars + 1 bytes */

/* Parses the request body as a JSON object; on failure fills `out` with the
 * 400 and returns NULL. */
json_t *srv_parse_body(srv_req *rq, srv_resp *out);

#endif
