/* Status codes and error messages.
 *
 * Every fallible function returns an ag_status. On failure it also leaves a
 * human-readable message (what went wrong and where) in a thread-local
 * buffer, read with ag_error_message(). The message stays valid until the
 * next failing call on the same thread. Nothing here aborts: runtime errors
 * are values, so a server can report them and go on. */
#ifndef AG_BASE_STATUS_H
#define AG_BASE_STATUS_H

typedef enum {
    AG_OK = 0,
    AG_ERR_IO,          /* open/read/write/mmap failed */
    AG_ERR_FORMAT,      /* malformed input file or data */
    AG_ERR_UNSUPPORTED, /* well-formed but not something we implement */
    AG_ERR_NOMEM,       /* allocation failed or a budget was exceeded */
    AG_ERR_INVALID,     /* bad argument from the caller */
    AG_ERR_RANGE,       /* value out of its allowed range */
    AG_ERR_NOT_FOUND,   /* a looked-up key, file or item does not exist */
    AG_ERR_TEMPLATE,    /* chat template failed to parse or render */
    AG_ERR_INTERNAL,    /* an invariant broke; a bug */
    /* Refusals a service makes of a well-formed request; the server maps
     * each to its HTTP status (server/reply.c). Appended: the public API
     * (include/augur.h) mirrors the codes above by number. */
    AG_ERR_BUSY,        /* a queue is full now: the same call may succeed later */
    AG_ERR_CONTEXT,     /* the input leaves no room in the model's context window */
    AG_ERR_CAPACITY,    /* the request needs more than the service has in all (KV blocks) */
    AG_ERR_STOPPED,     /* the service is shutting down */
} ag_status;

/* Records a printf-style message for the calling thread and returns `code`,
 * so error paths read `return ag_errorf(AG_ERR_FORMAT, "...", ...);`. */
ag_status ag_errorf(ag_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). Borrowed. */
const char *ag_error_message(void);

/* A short name for a code, e.g. "format error". Static storage. */
const char *ag_status_name(ag_status code);

#endif
