/* Stop-string matcher for streamed text; see stop.h. */
#include "sample/stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

typedef struct {
    char    *s;
    size_t   len;
    size_t  *fail;  /* KMP failure function: fail[i] = longest proper border of s[0..i] */
    size_t   state; /* length of the longest stream suffix that is a prefix of s */
    int32_t  index; /* position in the caller's array */
} stop_str;

struct ag_stop {
    stop_str *v;
    int32_t   n;
    char     *buf;   /* bytes fed but not yet emitted are buf[start..len) */
    size_t    start, len, cap;
    uint64_t  base;  /* stream offset of buf[0] */
    int       done;  /* stopped or finished */
    int32_t   stop_index;
    uint64_t  stop_offset;
};

ag_status ag_stop_new(const char *const *stops, const size_t *lens, int32_t n, ag_stop **out) {
    if (!out) return ag_errorf(AG_ERR_INVALID, "ag_stop_new: out is NULL");
    *out = NULL;
    if (n < 0 || (n > 0 && !stops)) return ag_errorf(AG_ERR_INVALID, "ag_stop_new: bad stop array");
    ag_stop *m = calloc(1, sizeof *m);
    if (!m) return ag_errorf(AG_ERR_NOMEM, "ag_stop_new: out of memory");
    m->stop_index = -1;
    if (n > 0 && !(m->v = calloc((size_t)n, sizeof *m->v))) goto nomem;
    for (int32_t i = 0; i < n; i++) {
        if (!stops[i]) {
            ag_stop_free(m);
            return ag_errorf(AG_ERR_INVALID, "ag_stop_new: stop string %d is NULL", (int)i);
        }
        size_t L = lens ? lens[i] : strlen(stops[i]);
        if (L == 0) continue; /* an empty stop would match before any output */
        stop_str *t = &m->v[m->n++];
        t->index = i;
        t->len = L;
        t->s = malloc(L);
        t->fail = malloc(L * sizeof *t->fail);
        if (!t->s || !t->fail) goto nomem;
        memcpy(t->s, stops[i], L);
        t->fail[0] = 0;
        for (size_t q = 1, k = 0; q < L; q++) {
            while (k > 0 && t->s[q] != t->s[k]) k = t->fail[k - 1];
            if (t->s[q] == t->s[k]) k++;
            t->fail[q] = k;
        }
    }
    *out = m;
    return AG_OK;
nomem:
    ag_stop_free(m);
    return ag_errorf(AG_ERR_NOMEM, "ag_stop_new: out of memory");
}

void ag_stop_free(ag_stop *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++) {
        free(m->v[i].s);
        free(m->v[i].fail);
    }
    free(m->v);
    free(m->buf);
    free(m);
}

static void final_result(const ag_stop *m, ag_stop_result *out) {
    out->text = "";
    out->len = 0;
    out->stopped = m->stop_index >= 0;
    out->stop_index = m->stop_index;
    out->stop_offset = m->stop_index >= 0 ? m->stop_offset : 0;
}

ag_status ag_stop_feed(ag_stop *m, const char *text, size_t len, ag_stop_result *out) {
    if (!m || !out || (len > 0 && !text)) return ag_errorf(AG_ERR_INVALID, "ag_stop_feed: NULL argument");
    if (m->done) {
        final_result(m, out);
        return AG_OK;
    }
    /* Drop what the previous call emitted, then append. */
    if (m->start > 0) {
        memmove(m->buf, m->buf + m->start, m->len - m->start);
        m->len -= m->start;
        m->base += m->start;
        m->start = 0;
    }
    if (len > m->cap - m->len) {
        if (len > SIZE_MAX / 2 - m->len) return ag_errorf(AG_ERR_NOMEM, "ag_stop_feed: chunk too large");
        size_t ncap = m->cap ? m->cap : 64;
        while (ncap - m->len < len) ncap *= 2;
        char *b = realloc(m->buf, ncap);
        if (!b) return ag_errorf(AG_ERR_NOMEM, "ag_stop_feed: out of memory");
        m->buf = b;
        m->cap = ncap;
    }
    if (len > 0) memcpy(m->buf + m->len, text, len);
    size_t from = m->len;
    m->len += len;

    /* Run every automaton byte by byte; the first byte at which one
     * completes is the earliest end. Among those completing on the same
     * byte, the longest starts first. */
    for (size_t pos = from; pos < m->len; pos++) {
        char c = m->buf[pos];
        int32_t hit = -1;
        for (int32_t i = 0; i < m->n; i++) {
            stop_str *t = &m->v[i];
            size_t k = t->state;
            while (k > 0 && t->s[k] != c) k = t->fail[k - 1];
            if (t->s[k] == c) k++;
            t->state = k;
            if (k == t->len && (hit < 0 || t->len > m->v[hit].len)) hit = i;
        }
        if (hit >= 0) {
            size_t st = pos + 1 - m->v[hit].len; /* >= start: the tail was held back */
            m->done = 1;
            m->stop_index = m->v[hit].index;
            m->stop_offset = m->base + st;
            out->text = m->buf + m->start;
            out->len = st - m->start;
            out->stopped = 1;
            out->stop_index = m->stop_index;
            out->stop_offset = m->stop_offset;
            m->start = st;
            return AG_OK;
        }
    }

    size_t hold = 0;
    for (int32_t i = 0; i < m->n; i++)
        if (m->v[i].state > hold) hold = m->v[i].state;
    size_t avail = m->len - m->start;
    if (hold > avail) hold = avail; /* cannot happen; keeps the arithmetic safe */
    size_t safe = m->start + ag_utf8_complete_prefix(m->buf + m->start, avail - hold);
    out->text = m->buf ? m->buf + m->start : "";
    out->len = safe - m->start;
    out->stopped = 0;
    out->stop_index = -1;
    out->stop_offset = 0;
    m->start = safe;
    return AG_OK;
}

ag_status ag_stop_finish(ag_stop *m, ag_stop_result *out) {
    if (!m || !out) return ag_errorf(AG_ERR_INVALID, "ag_stop_finish: NULL argument");
    if (m->done) {
        final_result(m, out);
        return AG_OK;
    }
    m->done = 1;
    out->text = m->len > m->start ? m->buf + m->start : "";
    out->len = m->len - m->start;
    out->stopped = 0;
    out->stop_index = -1;
    out->stop_offset = 0;
    m->start = m->len;
    return AG_OK;
}

size_t ag_stop_pending(const ag_stop *m) { return m ? m->len - m->start : 0; }
