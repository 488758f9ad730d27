#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char g_message[1024];

ag_status ag_errorf(ag_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message, sizeof g_message, fmt, ap);
    va_end(ap);
    return code;
}

const char *ag_error_message(void) { return g_message; }

const char *ag_status_name(ag_status code) {
    switch (code) {
    case AG_OK: return "ok";
    case AG_ERR_IO: return "I/O error";
    case AG_ERR_FORMAT: return "format error";
    case AG_ERR_UNSUPPORTED: return "unsupported";
    case AG_ERR_NOMEM: return "out of memory";
    case AG_ERR_INVALID: return "invalid argument";
    case AG_ERR_RANGE: return "out of range";
    case AG_ERR_NOT_FOUND: return "not found";
    case AG_ERR_TEMPLATE: return "template error";
    case AG_ERR_INTERNAL: return "internal error";
    case AG_ERR_BUSY: return "busy";
    case AG_ERR_CONTEXT: return "context exceeded";
    case AG_ERR_CAPACITY: return "over capacity";
    case AG_ERR_STOPPED: return "shutting down";
    }
    return "unknown error";
}
