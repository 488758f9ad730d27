/* ag_buf: a growable byte string, always NUL-terminated.
 *
 * Zero-initialise (`ag_buf b = {0};`) to get an empty buffer; ag_buf_free()
 * releases it and leaves it empty and reusable. Appends return AG_ERR_NOMEM
 * on allocation failure and leave the contents unchanged. */
#ifndef AG_BASE_BUF_H
#define AG_BASE_BUF_H

#include <stddef.h>

#include "base/status.h"

typedef struct {
    char  *data; /* NULL while empty and never grown; else NUL-terminated */
    size_t len;
    size_t cap;
} ag_buf;

ag_status ag_buf_reserve(ag_buf *b, size_t extra);
ag_status ag_buf_append(ag_buf *b, const void *data, size_t len);
ag_status ag_buf_append_str(ag_buf *b, const char *s);
ag_status ag_buf_append_char(ag_buf *b, char c);
ag_status ag_buf_printf(ag_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void      ag_buf_clear(ag_buf *b); /* length 0, keeps capacity */
void      ag_buf_free(ag_buf *b);
/* The contents as a C string ("" when empty). Borrowed until the next append. */
const char *ag_buf_cstr(const ag_buf *b);
/* Hands the heap string to the caller (who frees it) and empties the buffer. */
char *ag_buf_take(ag_buf *b);

#endif
