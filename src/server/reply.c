/* Replies (server_impl.h): what every route builds its answer
 * with: JSON bodies, OpenAI-shaped errors, the one map from a status code
 * to an HTTP error, the request body as JSON, random ids, and whether the
 * client is still there. Depends on nothing else in server/. */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "base/utf8.h"
#include "server/reply.h"
#include "server/server_impl.h"

json_t *srv_jstr(const char *s, size_t len) {
    if (!s) return json_string("");
    if (ag_utf8_valid(s, len)) return json_stringn(s, len);
    ag_buf b = {0};
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = ag_utf8_decode(s + i, len - i, &cp);
        if (k == 0) {
            ag_buf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        } else {
            ag_buf_append(&b, s + i, k);
            i += k;
        }
    }
    json_t *v = json_stringn(b.data ? b.data : "", b.len);
    ag_buf_free(&b);
    return v;
}

void srv_json(srv_resp *r, int status, json_t *v) {
    r->status = status;
    r->content_type = "application/json";
    ag_buf_clear(&r->body);
    char *text = v ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(v);
    if (!text) {
        r->status = 500;
        ag_buf_append_str(&r->body, "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                    "\"param\":null,\"code\":null}}");
        return;
    }
    ag_buf_append_str(&r->body, text);
    free(text);
}

void srv_error(srv_resp *r, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e = json_object();
    json_object_set_new(e, "message", srv_jstr(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? srv_jstr(param, strlen(param)) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    srv_json(r, status, root);
}

void srv_status_error(srv_resp *r, ag_status st, const char *param) {
    const char *msg = ag_error_message();
    switch (st) {
    case AG_ERR_STOPPED: srv_error(r, 503, "server_error", NULL, "shutting_down", "%s", msg); break;
    case AG_ERR_CONTEXT:
        srv_error(r, 400, "invalid_request_error", param, "context_length_exceeded", "%s", msg);
        break;
    case AG_ERR_BUSY:
        srv_error(r, 429, "rate_limit_error", NULL, "server_busy", "%s; retry later", msg);
        snprintf(r->retry_after, sizeof r->retry_after, "1");
        break;
    /* what the request asks is more than the server holds: its output
     * length (max_tokens) is the part a client can lower */
    case AG_ERR_CAPACITY: srv_error(r, 400, "invalid_request_error", "max_tokens", "invalid_value", "%s", msg); break;
    case AG_ERR_RANGE:
    case AG_ERR_INVALID: srv_error(r, 400, "invalid_request_error", NULL, "invalid_value", "%s", msg); break;
    default: srv_error(r, 500, "server_error", NULL, NULL, "%s", msg); break;
    }
}

json_t *srv_parse_body(srv_req *rq, srv_resp *out) {
    if (!ag_utf8_valid(rq->body, rq->body_len)) {
        size_t i = 0;
        while (i < rq->body_len) {
            uint32_t cp;
            size_t k = ag_utf8_decode(rq->body + i, rq->body_len - i, &cp);
            if (!k) break;
            i += k;
        }
        srv_error(out, 400, "invalid_request_error", NULL, "invalid_json",
                  "the request body is not valid UTF-8 (first bad byte at offset %zu)", i);
        return NULL;
    }
    if (rq->body_len == 0) {
        srv_error(out, 400, "invalid_request_error", NULL, "invalid_json",
                  "the request body is empty; expected a JSON object");
        return NULL;
    }
    json_error_t err;
    /* \u0000 is valid JSON: text keeps it (the tokenizer has a token for
     * byte 0); srv_check_fields rejects it where a string is read as a C
     * string */
    json_t *v = json_loadb(rq->body, rq->body_len, JSON_ALLOW_NUL, &err);
    if (!v && json_error_code(&err) == json_error_null_byte_in_key) {
        srv_error(out, 400, "invalid_request_error", NULL, "invalid_json",
                  "an object key at line %d, column %d (byte %d) contains a NUL character (\\u0000), which this "
                  "server does not accept in keys",
                  err.line, err.column, err.position);
        return NULL;
    }
    if (!v) {
        srv_error(out, 400, "invalid_request_error", NULL, "invalid_json",
                  "malformed JSON at line %d, column %d (byte %d): %s", err.line, err.column, err.position, err.text);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        srv_error(out, 400, "invalid_request_error", NULL, "invalid_json", "the request body must be a JSON object");
        return NULL;
    }
    return v;
}

bool srv_client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (pfd.revents & POLLIN) {
        char b;
        ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return true;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
    return false;
}

void srv_random_id(char *out, size_t n_chars) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char rnd[64];
    if (n_chars > sizeof rnd) n_chars = sizeof rnd;
    if (getrandom(rnd, n_chars, 0) != (ssize_t)n_chars)
        for (size_t i = 0; i < n_chars; i++) rnd[i] = (unsigned char)(i * 37 + 11);
    for (size_t i = 0; i < n_chars; i++) out[i] = alnum[rnd[i] % (sizeof alnum - 1)];
    out[n_chars] = '\0';
}
