/* Strict number parsing for the CLI's flags. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#include <stdio.h>

int ag_cli_load_model(const char *path, int threads, ag_model **m, ag_tok **tok) {
    *m = NULL;
    *tok = NULL;
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = threads;
    mp.device = ag_cli_device;
    mp.tp = ag_cli_tp;
    if (ag_model_load(path, &mp, m)) return ag_cli_fail("%s", ag_error_message());
    if (ag_tok_from_gguf(ag_model_gguf(*m), tok)) {
        ag_cli_fail("%s: %s", path, ag_error_message());
        ag_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

void ag_cli_draft_defaults(ag_cli_draft_opts *o) {
    ag_spec_params sp = ag_spec_default_params();
    *o = (ag_cli_draft_opts){.draft = NULL, .draft_max = 0, .draft_min = sp.draft_min};
}

int ag_cli_draft_flag(const char *flag, const char *value, ag_cli_draft_opts *o) {
    if (!strcmp(flag, "--draft")) {
        o->draft = value;
        return value && *value ? 1 : -1;
    }
    if (!strcmp(flag, "--draft-max")) return ag_cli_parse_long(value, 1, AG_SPEC_MAX_DRAFT, &o->draft_max) ? 1 : -1;
    if (!strcmp(flag, "--draft-min")) return ag_cli_parse_long(value, 0, AG_SPEC_MAX_DRAFT, &o->draft_min) ? 1 : -1;
    return 0;
}

int ag_cli_draft_open(const ag_cli_draft_opts *o, ag_model *m, const ag_tok *tok, int threads,
                      ag_engine_params *ep, ag_draft_setup **setup) {
    *setup = NULL;
    if (!o->draft) return 0;
    if (o->draft_max && o->draft_min > o->draft_max)
        return ag_cli_fail("--draft-min %ld is above --draft-max %ld", o->draft_min, o->draft_max);
    ag_draft_setup_params dp = {.draft = o->draft, .n_parallel = ep->n_parallel,
                              .n_ctx = ag_engine_resolve_ctx(m, ep->n_ctx), .n_threads = threads};
    if (ag_draft_setup_open(&dp, m, tok, setup)) return ag_cli_fail("draft: %s", ag_error_message());
    ep->draft = ag_draft_setup_factory(*setup);
    ep->spec.draft_max = o->draft_max ? (int)o->draft_max : ag_draft_default_max(ep->draft);
    ep->spec.draft_min = (int)o->draft_min;
    if (ep->spec.draft_min > ep->spec.draft_max) {
        ag_cli_fail("--draft-min %ld is above %s's default --draft-max %d", o->draft_min, ep->draft->name,
                    ep->spec.draft_max);
        ep->draft = NULL;
        ag_draft_setup_close(*setup);
        *setup = NULL;
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

bool ag_cli_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return false;
    double mul = 1;
    if (*end) {
        switch (tolower((unsigned char)*end)) {
        case 'k': mul = 1024.0; break;
        case 'm': mul = 1024.0 * 1024; break;
        case 'g': mul = 1024.0 * 1024 * 1024; break;
        case 't': mul = 1024.0 * 1024 * 1024 * 1024; break;
        case 'b': mul = 1; end--; break; /* "100B" */
        default: return false;
        }
        end++;
        if ((*end == 'i' || *end == 'I') && mul > 1) end++;
        if (*end == 'b' || *end == 'B') end++;
        if (*end) return false;
    }
    double b = v * mul;
    if (b >= 18446744073709551616.0) return false;
    *out = (uint64_t)b;
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
