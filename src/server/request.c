/* Request options any protocol shares (server_impl.h): the field readers
 * (an absent or null field keeps its default; a wrong type or an
 * out-of-range value is a 400 naming it), the sampling fields, stop
 * strings, augur's extensions and structured output. Each protocol reads
 * its own names for them and calls these. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "sample/schema.h"
#include "server/request.h"
#include "server/reply.h"
#include "server/server_impl.h"

/* ---- field readers ---- */

const char *srv_type_name(const json_t *v) {
    if (!v) return "nothing"; /* an absent field */
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

bool srv_get_bool(json_t *o, const char *key, bool *v, srv_resp *out) {
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return true;
    if (!json_is_boolean(x)) {
        srv_error(out, 400, "invalid_request_error", key, "invalid_type", "'%s' must be a boolean, got %s", key,
                  srv_type_name(x));
        return false;
    }
    *v = json_is_true(x);
    return true;
}

bool srv_get_num(json_t *o, const char *key, double lo, double hi, double *v, srv_resp *out) {
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return true;
    if (!json_is_number(x)) {
        srv_error(out, 400, "invalid_request_error", key, "invalid_type", "'%s' must be a number, got %s", key,
                  srv_type_name(x));
        return false;
    }
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        srv_error(out, 400, "invalid_request_error", key, "invalid_value", "'%s' must be between %g and %g, got %g",
                  key, lo, hi, d);
        return false;
    }
    *v = d;
    return true;
}

bool srv_get_int(json_t *o, const char *key, long long lo, long long hi, long long *v, bool *present,
                 srv_resp *out) {
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return true;
    long long n;
    if (json_is_integer(x)) {
        n = json_integer_value(x);
    } else if (json_is_real(x) && json_real_value(x) == floor(json_real_value(x)) &&
               fabs(json_real_value(x)) < 9e15) {
        n = (long long)json_real_value(x);
    } else {
        srv_error(out, 400, "invalid_request_error", key, "invalid_type", "'%s' must be an integer, got %s", key,
                  srv_type_name(x));
        return false;
    }
    if (n < lo || n > hi) {
        srv_error(out, 400, "invalid_request_error", key, "invalid_value", "'%s' must be between %lld and %lld, got %lld",
                  key, lo, hi, n);
        return false;
    }
    *v = n;
    if (present) *present = true;
    return true;
}

/* ---- options ---- */

void srv_opts_init(srv_opts *o) {
    memset(o, 0, sizeof *o);
    o->sp = ag_sample_default_params();
    o->sp.penalty_last_n = -1;
    o->n = 1;
    /* without a "seed" every request gets its own */
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)time(NULL) ^ (uint64_t)clock() << 20;
    o->sp.seed = r;
}

void srv_opts_free(srv_opts *o) {
    free(o->bias);
    for (int i = 0; i < o->n_stops; i++) free(o->stops[i]);
    ag_schema_unref(o->schema);
    json_decref(o->answer_schema);
}

/* Compiles a schema for a request, or answers 400 naming `param` (a keyword
 * outside the supported language, a malformed schema). */
static bool compile_schema(const char *const *prefixes, const json_t *const *schemas, int n, const char *suffix,
                           const char *param, srv_opts *o, srv_resp *out) {
    ag_schema_unref(o->schema);
    o->schema = NULL;
    ag_status st = ag_schema_compile_calls(prefixes, schemas, n, suffix, &o->schema);
    if (st == AG_ERR_NOMEM) {
        srv_status_error(out, st, NULL);
        return false;
    }
    if (st) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_schema", "%s: %s", param, ag_error_message());
        return false;
    }
    /* an answer schema (no prefix): kept to combine with tools */
    if (n == 1 && !prefixes[0][0] && !suffix) {
        json_decref(o->answer_schema);
        o->answer_schema = schemas[0] ? json_incref((json_t *)schemas[0]) : NULL;
        o->has_answer_schema = true;
    }
    return true;
}

bool srv_output_schema(json_t *schema, const char *param, srv_opts *o, srv_resp *out) {
    const char *bare = "";
    return compile_schema(&bare, (const json_t *const *)&schema, 1, NULL, param, o, out);
}

bool srv_parse_sampling(json_t *b, double max_temperature, srv_opts *o, srv_resp *out) {
    double d;
    long long n;
    d = 1.0;
    if (!srv_get_num(b, "temperature", 0, max_temperature, &d, out)) return false;
    o->sp.temperature = (float)d;
    d = 1.0;
    if (!srv_get_num(b, "top_p", 0, 1, &d, out)) return false;
    o->sp.top_p = (float)d;
    d = 0.0;
    if (!srv_get_num(b, "min_p", 0, 1, &d, out)) return false;
    o->sp.min_p = (float)d;
    n = 0;
    if (!srv_get_int(b, "top_k", -1, 1 << 24, &n, NULL, out)) return false;
    o->sp.top_k = n < 0 ? 0 : (int32_t)n; /* -1: off, as llama.cpp */
    d = 0.0;
    if (!srv_get_num(b, "presence_penalty", -2, 2, &d, out)) return false;
    o->sp.presence_penalty = (float)d;
    d = 0.0;
    if (!srv_get_num(b, "frequency_penalty", -2, 2, &d, out)) return false;
    o->sp.frequency_penalty = (float)d;
    d = 1.0;
    if (!srv_get_num(b, "repetition_penalty", 0.01, 10, &d, out)) return false;
    o->sp.repetition_penalty = (float)d;

    /* seed: any 64-bit integer (srv_opts_init drew one) */
    json_t *seed = json_object_get(b, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) {
            srv_error(out, 400, "invalid_request_error", "seed", "invalid_type", "'seed' must be an integer, got %s",
                      srv_type_name(seed));
            return false;
        }
        o->sp.seed = (uint64_t)json_integer_value(seed);
    }
    return true;
}

bool srv_parse_extensions(ag_server *s, json_t *b, srv_opts *o, srv_resp *out) {
    long long n;
    bool present;
    /* "ignore_eos": generate max_tokens tokens past end-of-text (vLLM's
     * field; benchmarks and tests that need a known length use it) */
    if (!srv_get_bool(b, "ignore_eos", &o->ignore_eos, out)) return false;
    /* "speculative": true (the server's setting), false (off), or
     * {"max": N} (at most N draft tokens per step; 0 = off). An augur
     * extension: the output is the same either way. */
    json_t *spec = json_object_get(b, "speculative");
    if (spec && !json_is_null(spec)) {
        if (json_is_boolean(spec)) {
            o->spec_max = json_is_true(spec) ? 0 : -1;
        } else if (json_is_object(spec)) {
            present = false;
            n = 0;
            if (!srv_get_int(spec, "max", 0, AG_SPEC_MAX_DRAFT, &n, &present, out)) return false;
            o->spec_max = present ? (n == 0 ? -1 : (int)n) : 0;
        } else {
            srv_error(out, 400, "invalid_request_error", "speculative", "invalid_type",
                      "'speculative' must be a boolean or an object like {\"max\": 4}, got %s", srv_type_name(spec));
            return false;
        }
    }
    /* "cache_salt": prompts with different salts never share cached KV
     * (vLLM's field). With an API key, the key is part of the namespace
     * too, so a directory shared by servers with different keys keeps
     * their tenants apart. Hashed: neither is ever written to disk. */
    json_t *salt = json_object_get(b, "cache_salt");
    if (salt && !json_is_null(salt) && !json_is_string(salt)) {
        srv_error(out, 400, "invalid_request_error", "cache_salt", "invalid_type",
                  "'cache_salt' must be a string, got %s", srv_type_name(salt));
        return false;
    }
    {
        const char *key = s->p.api_key && *s->p.api_key ? s->p.api_key : "";
        size_t klen = strlen(key), slen = salt && json_is_string(salt) ? json_string_length(salt) : 0;
        if (klen || slen) {
            ag_buf nsb = {0};
            ag_buf_append(&nsb, key, klen);
            ag_buf_append(&nsb, "", 1); /* key "ab" + salt "c" != key "a" + salt "bc" */
            if (slen) ag_buf_append(&nsb, json_string_value(salt), slen);
            o->cache_ns = ag_cache_namespace(nsb.data, nsb.len);
            ag_buf_free(&nsb);
        }
    }
    return true;
}

bool srv_parse_stops(json_t *stop, const char *param, srv_opts *o, srv_resp *out) {
    if (!stop || json_is_null(stop)) return true;
    if (json_is_string(stop)) {
        if (json_string_length(stop)) o->stops[o->n_stops++] = strdup(json_string_value(stop));
    } else if (json_is_array(stop)) {
        if (json_array_size(stop) > SRV_MAX_STOPS) {
            srv_error(out, 400, "invalid_request_error", param, "invalid_value", "'%s' may hold at most %d strings",
                      param, SRV_MAX_STOPS);
            return false;
        }
        size_t i;
        json_t *x;
        json_array_foreach(stop, i, x) {
            if (!json_is_string(x)) {
                srv_error(out, 400, "invalid_request_error", param, "invalid_type",
                          "'%s' must be a string or a list of strings; item %zu is %s", param, i, srv_type_name(x));
                return false;
            }
            if (json_string_length(x)) o->stops[o->n_stops++] = strdup(json_string_value(x));
        }
    } else {
        srv_error(out, 400, "invalid_request_error", param, "invalid_type",
                  "'%s' must be a string or a list of strings, got %s", param, srv_type_name(stop));
        return false;
    }
    for (int i = 0; i < o->n_stops; i++)
        if (!o->stops[i]) {
            srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
            return false;
        }
    return true;
}
