#include "base/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ag_status ag_buf_reserve(ag_buf *b, size_t extra) {
    if (extra > (size_t)-1 - b->len - 1) return ag_errorf(AG_ERR_NOMEM, "buffer size overflow");
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return AG_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > ((size_t)-1) / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) return ag_errorf(AG_ERR_NOMEM, "out of memory growing a buffer to %zu bytes", cap);
    if (!b->data) p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return AG_OK;
}

ag_status ag_buf_append(ag_buf *b, const void *data, size_t len) {
    ag_status st = ag_buf_reserve(b, len);
    if (st) return st;
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return AG_OK;
}

ag_status ag_buf_append_str(ag_buf *b, const char *s) { return ag_buf_append(b, s, strlen(s)); }

ag_status ag_buf_append_char(ag_buf *b, char c) { return ag_buf_append(b, &c, 1); }

ag_status ag_buf_printf(ag_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return ag_errorf(AG_ERR_INVALID, "bad format string");
    ag_status st = ag_buf_reserve(b, (size_t)n);
    if (st) return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return AG_OK;
}

void ag_buf_clear(ag_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void ag_buf_free(ag_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

const char *ag_buf_cstr(const ag_buf *b) { return b->data ? b->data : ""; }

char *ag_buf_take(ag_buf *b) {
    char *p = b->data;
    if (!p) p = calloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
