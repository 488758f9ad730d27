/* Strict number parsing for the CLI's flags. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"

#include <stdio.h>

int ag_cli_load_model(const char *path, int threads, ag_model **m, ag_tok **tok) {
    *m = NULL;
    *tok = NULL;
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = threads;
    if (ag_model_load(path, &mp, m)) return ag_cli_fail("%s", ag_error_message());
    if (ag_tok_from_gguf(ag_model_gguf(*m), tok)) {
        ag_cli_fail("%s: %s", path, ag_error_message());
        ag_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

bool ag_cli_parse_long(const char *s, long min, long max, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max) return false;
    *out = v;
    return true;
}

bool ag_cli_parse_float(const char *s, double min, double max, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < min || v > max) return false;
    *out = v;
    return true;
}

bool ag_cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}
