#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/switches.h"

static int g_level = -1; /* -1: not yet read from the environment */

static int level_from_env(void) {
    const char *s = ag_switch_text("AUGUR_LOG");
    if (!s) return AG_LOG_WARN;
    if (!strcmp(s, "error")) return AG_LOG_ERROR;
    if (!strcmp(s, "info")) return AG_LOG_INFO;
    if (!strcmp(s, "debug")) return AG_LOG_DEBUG;
    return AG_LOG_WARN;
}

void ag_log_set_level(ag_log_level level) { g_level = (int)level; }

int ag_log_enabled(ag_log_level level) {
    if (g_level < 0) g_level = level_from_env();
    return (int)level <= g_level;
}

void ag_log(ag_log_level level, const char *fmt, ...) {
    if (!ag_log_enabled(level)) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld augur %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, names[level], msg);
}
