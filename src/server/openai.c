/* The OpenAI routes: /v1/chat/completions and /v1/completions, and the
 * machinery other protocols reuse (server_impl.h): option and message
 * parsing, prompt rendering, and jobs, which submit prompts and collect or
 * stream their output through a protocol's srv_protocol callbacks.
 *
 * A request is validated completely before anything reaches the engine:
 * every known field with a wrong type or an out-of-range value is a 400
 * naming the field, and so is an unknown one (fields.c). The prompt is rendered
 * (chat template) and tokenized on the connection's thread. Output is then
 * collected from the generation's event queue, either into one JSON
 * response or as SSE chunks, one per engine event. */
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/log.h"
#include "sample/schema.h"
#include "server/server_impl.h"

#define MAX_PROMPTS 64
#define LOGPROB_FLOOR (-9999.0)

/* ---- field readers: absent or null keeps the default ---- */

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

/* ---- options common to the endpoints ---- */

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

/* response_format: "text", {"type": "json_object"} (the schema {"type":
 * "object"}) or {"type": "json_schema", "json_schema": {"name", "schema",
 * "strict", "description"}}. */
static bool parse_response_format(json_t *b, srv_opts *o, srv_resp *out) {
    json_t *rf = json_object_get(b, "response_format");
    if (!rf || json_is_null(rf)) return true;
    json_t *type = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(type)) {
        srv_error(out, 400, "invalid_request_error", "response_format", "invalid_type",
                  "'response_format' must be an object with a 'type'");
        return false;
    }
    const char *t = json_string_value(type);
    const char *bare = "";
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_object")) return compile_schema(&bare, (const json_t *const[]){NULL}, 1, NULL, "response_format", o, out);
    if (strcmp(t, "json_schema")) {
        srv_error(out, 400, "invalid_request_error", "response_format", "unsupported_value",
                  "response_format type '%s' is not supported (\"text\", \"json_object\" or \"json_schema\")", t);
        return false;
    }
    json_t *js = json_object_get(rf, "json_schema");
    json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema");
    json_t *strict = json_object_get(js, "strict"), *desc = json_object_get(js, "description");
    if (!json_is_object(js) || !json_is_string(name) || !json_string_length(name) ||
        (strict && !json_is_null(strict) && !json_is_boolean(strict)) ||
        (desc && !json_is_null(desc) && !json_is_string(desc))) {
        srv_error(out, 400, "invalid_request_error", "response_format.json_schema", "invalid_value",
                  "'response_format.json_schema' must be {\"name\": string, \"schema\": object, \"strict\": "
                  "boolean, \"description\": string}");
        return false;
    }
    if (!schema || json_is_null(schema)) schema = json_true(); /* no schema: any JSON value */
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        srv_error(out, 400, "invalid_request_error", "response_format.json_schema.schema", "invalid_type",
                  "'response_format.json_schema.schema' must be an object, got %s", srv_type_name(schema));
        return false;
    }
    return compile_schema(&bare, (const json_t *const *)&schema, 1, NULL, "response_format.json_schema.schema", o,
                          out);
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

/* o: as srv_opts_init left it. */
static bool parse_common(ag_server *s, json_t *b, bool chat, srv_opts *o, srv_resp *out) {
    o->max_tokens = chat ? 0 : 16; /* OpenAI's defaults */
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        srv_error(out, 400, "invalid_request_error", "model", "invalid_type", "'model' must be a string, got %s",
                  srv_type_name(model));
        return false;
    }
    if (!srv_parse_sampling(b, 2.0, o, out)) return false;
    long long n = 0;
    bool present = false;
    /* completions: 0 with echo scores the prompt and generates nothing */
    if (!srv_get_int(b, "max_tokens", chat ? 1 : 0, 1 << 24, &n, &present, out)) return false;
    if (present) o->max_tokens = (int)n;
    o->no_output = present && n == 0;
    if (chat) {
        present = false;
        if (!srv_get_int(b, "max_completion_tokens", 1, 1 << 24, &n, &present, out)) return false;
        if (present) o->max_tokens = (int)n;
    }
    if (!srv_parse_extensions(s, b, o, out)) return false;
    n = 1;
    json_t *nv = json_object_get(b, "n");
    if (nv && !json_is_null(nv) && json_is_integer(nv) && json_integer_value(nv) > s->n_parallel &&
        json_integer_value(nv) <= 128) {
        srv_error(out, 400, "invalid_request_error", "n", "invalid_value",
                  "'n' = %lld is more than this server runs at once (%d, its --parallel)",
                  (long long)json_integer_value(nv), s->n_parallel);
        return false;
    }
    if (!srv_get_int(b, "n", 1, s->n_parallel < 128 ? s->n_parallel : 128, &n, NULL, out)) return false;
    o->n = (int)n;

    /* stop: a string or a list of strings */
    if (!srv_parse_stops(json_object_get(b, "stop"), "stop", o, out)) return false;

    /* logit_bias: {"token id": bias in [-100, 100]} */
    json_t *lb = json_object_get(b, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb)) {
            srv_error(out, 400, "invalid_request_error", "logit_bias", "invalid_type",
                      "'logit_bias' must be an object mapping token ids to biases, got %s", srv_type_name(lb));
            return false;
        }
        size_t cnt = json_object_size(lb);
        o->bias = calloc(cnt ? cnt : 1, sizeof *o->bias);
        if (!o->bias) {
            srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
            return false;
        }
        const char *k;
        json_t *x;
        json_object_foreach(lb, k, x) {
            char *end;
            long id = strtol(k, &end, 10);
            if (!*k || *end || id < 0 || id >= s->n_vocab) {
                srv_error(out, 400, "invalid_request_error", "logit_bias", "invalid_value",
                          "'logit_bias' key '%s' is not a token id in [0, %d)", k, s->n_vocab);
                return false;
            }
            if (!json_is_number(x) || json_number_value(x) < -100 || json_number_value(x) > 100) {
                srv_error(out, 400, "invalid_request_error", "logit_bias", "invalid_value",
                          "'logit_bias' values must be numbers between -100 and 100 (token %ld)", id);
                return false;
            }
            o->bias[o->sp.n_logit_bias++] = (ag_logit_bias){(int32_t)id, (float)json_number_value(x)};
        }
        o->sp.logit_bias = o->bias;
    }

    if (!srv_get_bool(b, "stream", &o->stream, out)) return false;
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            srv_error(out, 400, "invalid_request_error", "stream_options", "invalid_type",
                      "'stream_options' must be an object, got %s", srv_type_name(so));
            return false;
        }
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu)) {
            srv_error(out, 400, "invalid_request_error", "stream_options.include_usage", "invalid_type",
                      "'stream_options.include_usage' must be a boolean, got %s", srv_type_name(iu));
            return false;
        }
        o->include_usage = json_is_true(iu);
    }
    if (!parse_response_format(b, o, out)) return false;

    if (chat) {
        bool parallel = true;
        if (!srv_get_bool(b, "parallel_tool_calls", &parallel, out)) return false;
        o->one_tool_call = !parallel;
        if (!srv_get_bool(b, "logprobs", &o->logprobs, out)) return false;
        n = 0;
        present = false;
        if (!srv_get_int(b, "top_logprobs", 0, AG_SAMPLE_MAX_LOGPROBS, &n, &present, out)) return false;
        if (present && !o->logprobs) {
            srv_error(out, 400, "invalid_request_error", "top_logprobs", "invalid_value",
                      "'top_logprobs' needs 'logprobs' set to true");
            return false;
        }
        o->top_logprobs = (int)n;
    } else {
        n = 0;
        present = false;
        if (!srv_get_int(b, "logprobs", 0, AG_SAMPLE_MAX_LOGPROBS, &n, &present, out)) return false;
        o->logprobs = present;
        o->top_logprobs = (int)n;
        if (!srv_get_bool(b, "echo", &o->echo, out)) return false;
        if (o->no_output && !o->echo) {
            srv_error(out, 400, "invalid_request_error", "max_tokens", "invalid_value",
                      "'max_tokens' must be at least 1 (0 only with 'echo', to score the prompt)");
            return false;
        }
        n = 1;
        present = false;
        if (!srv_get_int(b, "best_of", 1, 128, &n, &present, out)) return false;
        if (present && n != o->n) {
            srv_error(out, 400, "invalid_request_error", "best_of", "unsupported_value",
                      "'best_of' other than 'n' is not supported");
            return false;
        }
    }
    o->sp.logprobs = o->logprobs;
    o->sp.n_logprobs = o->logprobs ? o->top_logprobs : 0;
    return true;
}

/* ---- jobs ---- */

static void job_free(srv_job *j) {
    if (!j) return;
    /* a stream that never reached its end lost its client (a failed write
     * or a closed socket) */
    if (j->stream && !j->ended && j->gen) atomic_fetch_add(&j->s->client_cancels, 1);
    srv_gen_release(j->gen);
    json_decref(j->tool_list);
    for (int i = 0; i < j->n_choices; i++) {
        ag_buf_free(&j->ch[i].text);
        free(j->ch[i].error);
        json_decref(j->ch[i].lp);
    }
    free(j->ch);
    for (int i = 0; i < j->n_prompts; i++)
        if (j->echo) free(j->echo[i]);
    free(j->echo);
    free(j->echo_len);
    for (int i = 0; i < j->n_stops; i++) free(j->stops[i]);
    ag_buf_free(&j->out);
    if (j->proto && j->proto->state_free) j->proto->state_free(j->proto_state);
    else free(j->proto_state);
    free(j);
}

srv_job *srv_job_new(srv_req *rq, const srv_protocol *proto, const srv_opts *o, int n_prompts) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->s = rq->s;
    j->conn = rq->conn;
    j->proto = proto;
    j->stream = o->stream;
    j->include_usage = o->include_usage;
    j->logprobs = o->logprobs;
    j->top_logprobs = o->top_logprobs;
    j->one_call = o->one_tool_call;
    j->n_prompts = n_prompts;
    j->n_choices = o->n * n_prompts;
    j->created = time(NULL);
    char rnd[25];
    srv_random_id(rnd, 24);
    snprintf(j->id, sizeof j->id, "%s%s", proto->id_prefix, rnd);
    j->ch = calloc((size_t)j->n_choices, sizeof *j->ch);
    j->gen = srv_gen_new(rq->s, n_prompts);
    bool ok = j->ch && j->gen;
    for (int i = 0; ok && i < o->n_stops; i++, j->n_stops++) ok = (j->stops[i] = strdup(o->stops[i])) != NULL;
    if (!ok) {
        job_free(j);
        return NULL;
    }
    for (int i = 0; i < j->n_choices; i++) j->ch[i].prompt = i / o->n;
    return j;
}

bool srv_job_tool_calls(srv_job *j, const char *text, size_t len, json_t **calls, ag_buf *content) {
    if (!ag_server_parse_tool_calls(j->tf, text, len, j->tool_list, calls, content)) return false;
    /* one call allowed: the rest are dropped (their text too), as a server
     * enforcing it while generating would never have written them */
    while (j->one_call && json_array_size(*calls) > 1) json_array_remove(*calls, json_array_size(*calls) - 1);
    return true;
}

static const srv_protocol k_chat_proto, k_completions_proto;

static srv_job *job_new(srv_req *rq, bool chat, const srv_opts *o, int n_prompts) {
    srv_job *j = srv_job_new(rq, chat ? &k_chat_proto : &k_completions_proto, o, n_prompts);
    if (j) j->chat = chat;
    return j;
}

static double clamp_lp(float lp) { return isfinite(lp) && lp > LOGPROB_FLOOR ? (double)lp : LOGPROB_FLOOR; }

static json_t *bytes_of(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

static json_t *piece_str(ag_server *s, int32_t tok, const char **p, size_t *n) {
    *p = ag_tok_piece(s->tok, tok, n);
    if (!*p) {
        *p = "";
        *n = 0;
    }
    return srv_jstr(*p, *n);
}

/* One chat logprobs entry {token, logprob, bytes, top_logprobs}. */
static json_t *chat_lp_entry(srv_job *j, const srv_event *e) {
    const char *p;
    size_t n;
    json_t *ent = json_object();
    json_object_set_new(ent, "token", piece_str(j->s, e->token, &p, &n));
    json_object_set_new(ent, "logprob", json_real(clamp_lp(e->logprob)));
    json_object_set_new(ent, "bytes", bytes_of(p, n));
    json_t *tops = json_array();
    for (int k = 0; k < e->n_top && k < j->top_logprobs; k++) {
        json_t *t = json_object();
        json_object_set_new(t, "token", piece_str(j->s, e->top[k].token, &p, &n));
        json_object_set_new(t, "logprob", json_real(clamp_lp(e->top[k].logprob)));
        json_object_set_new(t, "bytes", bytes_of(p, n));
        json_array_append_new(tops, t);
    }
    json_object_set_new(ent, "top_logprobs", tops);
    return ent;
}

/* text_offset counts characters (as Python and OpenAI do), not bytes. */
static size_t n_chars(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

static json_t *completion_lp_new(void) {
    json_t *lp = json_object();
    json_object_set_new(lp, "tokens", json_array());
    json_object_set_new(lp, "token_logprobs", json_array());
    json_object_set_new(lp, "top_logprobs", json_array());
    json_object_set_new(lp, "text_offset", json_array());
    return lp;
}

/* A completions top_logprobs entry: {piece: logprob} for the event's
 * alternatives, or null when none were asked for. */
static json_t *completion_tops(srv_job *j, const srv_event *e) {
    if (j->top_logprobs <= 0) return json_null();
    json_t *tops = json_object();
    for (int k = 0; k < e->n_top && k < j->top_logprobs; k++) {
        const char *tp;
        size_t tn;
        tp = ag_tok_piece(j->s->tok, e->top[k].token, &tn);
        json_t *key = srv_jstr(tp ? tp : "", tp ? tn : 0);
        const char *ks = json_string_value(key);
        if (ks && !json_object_get(tops, ks)) json_object_set_new(tops, ks, json_real(clamp_lp(e->top[k].logprob)));
        json_decref(key);
    }
    return tops;
}

/* Appends one token to a completions logprobs object; token < 0 with
 * `prompt_piece` records an echoed prompt token (no logprob known). */
static void completion_lp_add(srv_job *j, json_t *lp, srv_choice *c, const srv_event *e) {
    const char *p;
    size_t n;
    json_array_append_new(json_object_get(lp, "tokens"), piece_str(j->s, e->token, &p, &n));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(clamp_lp(e->logprob)));
    json_array_append_new(json_object_get(lp, "top_logprobs"), completion_tops(j, e));
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)c->offset));
    c->offset += n_chars(p, n);
}

/* Echoed prompt tokens in completions logprobs, with null logprobs: the
 * engine's prompt scores (prompt_pos events) fill them in; the first
 * echoed token has none, as in OpenAI's API.
 * text_offset places each token in the echoed text by walking its pieces
 * along it: a piece that does not match there but does without its leading
 * space carries a space the text does not have (SentencePiece's
 * add_space_prefix puts one in front of the text, also when the text starts
 * with a space, and after every special token), so it covers one character
 * less. The generated tokens start right after the echoed text whatever the
 * walk found (an echo decoded from ids has the same pieces, so it walks
 * exactly). */
static void completion_lp_prompt(srv_job *j, json_t *lp, srv_choice *c, const int32_t *ids, size_t n_ids,
                                 bool skip_bos, const char *echo, size_t echo_len) {
    size_t pos = 0, chars = 0; /* bytes and characters of echo walked so far */
    c->lp_first = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (i == 0 && skip_bos && ids[0] == ag_tok_bos(j->s->tok)) {
            c->lp_first = 1;
            continue;
        }
        const char *p;
        size_t n;
        json_array_append_new(json_object_get(lp, "tokens"), piece_str(j->s, ids[i], &p, &n));
        json_array_append_new(json_object_get(lp, "token_logprobs"), json_null());
        json_array_append_new(json_object_get(lp, "top_logprobs"), json_null());
        json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)(c->offset + chars)));
        const char *at = echo + pos;
        size_t left = echo_len - pos, adv;
        if (n <= left && !memcmp(at, p, n)) adv = n;
        else if (n && p[0] == ' ' && n - 1 <= left && !memcmp(at, p + 1, n - 1)) adv = n - 1;
        else adv = n < left ? n : left; /* the text differs from the pieces: keep going */
        chars += n_chars(at, adv);
        pos += adv;
    }
    c->offset += n_chars(echo, echo_len);
}

static bool event_has_lp(srv_job *j, const srv_event *e) {
    if (!j->logprobs || !e->has_sample || e->token < 0) return false;
    /* the end-of-generation token is not part of the output */
    return !(e->finish == AG_FINISH_STOP && ag_tok_is_eog(j->s->tok, e->token));
}

static const char *finish_name(ag_finish f) {
    return f == AG_FINISH_LENGTH ? "length" : f == AG_FINISH_STOP ? "stop" : NULL;
}

static json_t *usage_json(srv_job *j) {
    int p, c, g;
    srv_gen_usage(j->gen, &p, &c, &g);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(p));
    json_object_set_new(u, "completion_tokens", json_integer(g));
    json_object_set_new(u, "total_tokens", json_integer(p + g));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(c));
    json_object_set_new(u, "prompt_tokens_details", d);
    int drafted, accepted;
    srv_gen_spec_usage(j->gen, &drafted, &accepted);
    /* Speculative decoding: draft tokens verified, accepted and rejected
     * (OpenAI's names for predicted-output tokens, plus augur's drafted). */
    json_t *cd = json_object();
    json_object_set_new(cd, "reasoning_tokens", json_integer(0));
    json_object_set_new(cd, "accepted_prediction_tokens", json_integer(accepted));
    json_object_set_new(cd, "rejected_prediction_tokens", json_integer(drafted - accepted));
    json_object_set_new(cd, "drafted_tokens", json_integer(drafted));
    json_object_set_new(u, "completion_tokens_details", cd);
    return u;
}

static json_t *envelope(srv_job *j, const char *object) {
    json_t *r = json_object();
    json_object_set_new(r, "id", json_string(j->id));
    json_object_set_new(r, "object", json_string(object));
    json_object_set_new(r, "created", json_integer((json_int_t)j->created));
    json_object_set_new(r, "model", json_string(j->s->model_id));
    json_object_set_new(r, "system_fingerprint", json_string(j->s->fingerprint));
    return r;
}

/* ---- streaming ---- */

static void sse_emit(srv_job *j, json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(v);
    if (!t) return;
    ag_buf_append_str(&j->out, "data: ");
    ag_buf_append_str(&j->out, t);
    ag_buf_append_str(&j->out, "\n\n");
    free(t);
}

static json_t *chunk_new(srv_job *j) {
    json_t *c = envelope(j, j->chat ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(c, "choices", json_array());
    if (j->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* A chat chunk for one choice: delta (stolen), logprobs entries (stolen,
 * may be NULL), finish reason (may be NULL). */
static void emit_chat_chunk(srv_job *j, int idx, json_t *delta, json_t *lp_entries, const char *finish) {
    json_t *c = chunk_new(j);
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(idx));
    json_object_set_new(ch, "delta", delta);
    if (lp_entries) {
        json_t *lp = json_object();
        json_object_set_new(lp, "content", lp_entries);
        json_object_set_new(ch, "logprobs", lp);
    } else {
        json_object_set_new(ch, "logprobs", json_null());
    }
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(c, "choices"), ch);
    sse_emit(j, c);
}

static void emit_text_chunk(srv_job *j, int idx, const char *text, size_t len, json_t *lp, const char *finish) {
    json_t *c = chunk_new(j);
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(idx));
    json_object_set_new(ch, "text", srv_jstr(text, len));
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(c, "choices"), ch);
    sse_emit(j, c);
}

static void emit_stream_error(srv_job *j, int status, const char *type, const char *code, const char *msg) {
    json_t *e = json_object();
    json_object_set_new(e, "message", srv_jstr(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_integer(status));
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    sse_emit(j, root);
    j->ended = true;
}

static json_t *content_delta(const char *text, size_t len) {
    json_t *d = json_object();
    json_object_set_new(d, "content", srv_jstr(text, len));
    return d;
}

void srv_job_think(srv_job *j, bool opened) {
    if (!j->s->thinks) return;
    for (int i = 0; i < j->n_choices; i++) {
        j->ch[i].think_on = true;
        ag_think_init(&j->ch[i].think, opened);
    }
}

void srv_choice_scan(srv_job *j, srv_choice *c, bool final) {
    (void)j;
    if (c->think_on) ag_think_scan(&c->think, c->text.data ? c->text.data : "", c->text.len, final);
}

void srv_choice_add(srv_job *j, srv_choice *c, const srv_event *e) {
    size_t before = c->text.len;
    if (e->len) ag_buf_append(&c->text, e->text, e->len);
    if (!c->think_on) return;
    srv_choice_scan(j, c, e->finish != AG_FINISH_NONE);
    /* a token whose text lies before the answer's start was reasoning */
    if (e->len && (!ag_think_answer_known(&c->think) || c->think.answer_start >= before + e->len))
        c->reasoning_tokens++;
}

size_t srv_choice_answer(const srv_choice *c, const char **text) {
    const char *t = c->text.data ? c->text.data : "";
    if (!c->think_on) {
        *text = t;
        return c->text.len;
    }
    if (!ag_think_answer_known(&c->think)) {
        *text = "";
        return 0;
    }
    *text = t + c->think.answer_start;
    return c->text.len - c->think.answer_start;
}

size_t srv_choice_reasoning(const srv_choice *c, const char **text) {
    *text = "";
    if (!c->think_on || c->think.phase == AG_THINK_LEAD || c->think.phase == AG_THINK_NONE) return 0;
    *text = c->text.data + c->think.reason_start;
    return c->think.reason_end - c->think.reason_start;
}

size_t srv_stream_fresh(srv_job *j, srv_choice *c, bool release_all, const char **fresh) {
    const char *a;
    size_t alen = srv_choice_answer(c, &a);
    size_t safe = alen;
    if (j->tools && !release_all) safe = ag_server_tool_safe_prefix(j->tf, a, alen);
    if (safe < c->sent) safe = c->sent;
    *fresh = a + c->sent;
    size_t n = safe - c->sent;
    c->sent = safe;
    return n;
}

size_t srv_stream_reasoning(srv_choice *c, const char **fresh) {
    const char *r;
    size_t len = srv_choice_reasoning(c, &r);
    *fresh = r + c->rsent;
    if (len <= c->rsent) return 0;
    size_t n = len - c->rsent;
    c->rsent = len;
    return n;
}

static void stream_event(srv_job *j, srv_event *e) {
    if (j->ended || e->choice < 0 || e->choice >= j->n_choices || e->prompt_pos > 0) return;
    srv_choice *c = &j->ch[e->choice];
    if (c->done) return;
    json_t *lp = NULL;
    if (event_has_lp(j, e)) {
        if (j->chat) {
            lp = json_array();
            json_array_append_new(lp, chat_lp_entry(j, e));
        } else {
            lp = completion_lp_new();
            completion_lp_add(j, lp, c, e);
        }
    }
    srv_choice_add(j, c, e);
    if (e->finish == AG_FINISH_ERROR || e->finish == AG_FINISH_CANCELLED) {
        json_decref(lp);
        c->done = true;
        if (e->finish == AG_FINISH_ERROR)
            emit_stream_error(j, 500, "server_error", NULL, e->error ? e->error : "generation failed");
        else emit_stream_error(j, 503, "server_error", "shutting_down", "the request was cancelled: the server is shutting down");
        return;
    }
    const char *fresh;
    size_t reasoning_len = j->chat ? srv_stream_reasoning(c, &fresh) : 0;
    if (reasoning_len) {
        json_t *d = json_object();
        json_object_set_new(d, "reasoning_content", srv_jstr(fresh, reasoning_len));
        emit_chat_chunk(j, e->choice, d, NULL, NULL);
    }
    if (e->finish == AG_FINISH_NONE) {
        size_t fresh_len = srv_stream_fresh(j, c, false, &fresh);
        if (!fresh_len && !lp) return;
        if (j->chat) emit_chat_chunk(j, e->choice, content_delta(fresh, fresh_len), lp, NULL);
        else emit_text_chunk(j, e->choice, fresh, fresh_len, lp, NULL);
        return;
    }
    /* the choice's last event */
    c->done = true;
    c->finish = e->finish;
    const char *reason = finish_name(e->finish);
    json_t *calls = NULL;
    if (j->tools) {
        ag_buf rest = {0};
        const char *answer;
        size_t answer_len = srv_choice_answer(c, &answer);
        if (srv_job_tool_calls(j, answer, answer_len, &calls, &rest) && e->finish == AG_FINISH_STOP)
            reason = "tool_calls";
        ag_buf_free(&rest);
    }
    /* not a call after all: release what was held back */
    size_t fresh_len = srv_stream_fresh(j, c, calls == NULL, &fresh);
    if (j->chat) {
        if (fresh_len || lp) emit_chat_chunk(j, e->choice, content_delta(fresh, fresh_len), lp, NULL);
        if (calls) {
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call) {
                json_t *tc = json_deep_copy(call);
                json_object_set_new(tc, "index", json_integer((json_int_t)k));
                json_t *arr = json_array();
                json_array_append_new(arr, tc);
                json_t *d = json_object();
                json_object_set_new(d, "tool_calls", arr);
                emit_chat_chunk(j, e->choice, d, NULL, NULL);
            }
            json_decref(calls);
        }
        emit_chat_chunk(j, e->choice, json_object(), NULL, reason);
    } else {
        emit_text_chunk(j, e->choice, fresh, fresh_len, lp, reason);
    }
}

static void stream_end(srv_job *j) {
    if (j->include_usage) {
        json_t *c = envelope(j, j->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "usage", usage_json(j));
        sse_emit(j, c);
    }
    ag_buf_append_str(&j->out, "data: [DONE]\n\n");
}

/* The first chunks: the assistant role (chat), the echoed prompts
 * (completions with echo). */
static void stream_start(srv_job *j) {
    if (j->chat) {
        for (int i = 0; i < j->n_choices; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            emit_chat_chunk(j, i, d, NULL, NULL);
        }
    } else if (j->echo) {
        for (int i = 0; i < j->n_choices; i++) {
            int p = j->ch[i].prompt;
            emit_text_chunk(j, i, j->echo[p], j->echo_len[p], NULL, NULL);
        }
    }
}

ssize_t srv_job_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_job *j = cls;
    for (;;) {
        if (j->out_off < j->out.len) {
            size_t n = j->out.len - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out.data + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out.len) {
                ag_buf_clear(&j->out);
                j->out_off = 0;
            }
            return (ssize_t)n;
        }
        if (j->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        /* wait for one event, then take whatever else is already queued so
         * that a burst goes out in one write; never wait while holding
         * output */
        srv_event *e = srv_gen_next(j->gen, 200);
        while (e) {
            j->proto->stream_event(j, e);
            free(e->error);
            free(e);
            if (j->out.len > 8192) break;
            e = srv_gen_next(j->gen, 0);
        }
        if (j->out.len) continue;
        if (srv_gen_finished(j->gen)) {
            j->proto->stream_end(j);
            j->ended = true;
            atomic_fetch_add(&j->s->completions_ok, 1);
            continue;
        }
        if (srv_client_gone(j->conn)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

void srv_job_free(void *cls) { job_free(cls); }

/* ---- non-streaming ---- */

/* A prompt token's score: into every choice of that prompt that echoes
 * with logprobs (all choices share the prompt). */
static void collect_prompt_score(srv_job *j, const srv_event *e) {
    const int prompt = j->ch[e->choice].prompt;
    for (int i = 0; i < j->n_choices; i++) {
        srv_choice *c = &j->ch[i];
        if (c->prompt != prompt || !c->lp || j->chat || !e->has_sample) continue;
        json_t *lps = json_object_get(c->lp, "token_logprobs"), *tops = json_object_get(c->lp, "top_logprobs");
        size_t  k = (size_t)(e->prompt_pos - c->lp_first);
        if (e->prompt_pos < c->lp_first || k >= json_array_size(lps)) continue;
        json_array_set_new(lps, k, json_real(clamp_lp(e->logprob)));
        json_array_set_new(tops, k, completion_tops(j, e));
    }
}

static void collect_event(srv_job *j, srv_event *e) {
    if (e->choice < 0 || e->choice >= j->n_choices) return;
    if (e->prompt_pos > 0) {
        collect_prompt_score(j, e);
        return;
    }
    srv_choice *c = &j->ch[e->choice];
    if (c->done) return;
    if (event_has_lp(j, e)) {
        if (j->chat) {
            if (!c->lp) c->lp = json_array();
            json_array_append_new(c->lp, chat_lp_entry(j, e));
        } else {
            if (!c->lp) c->lp = completion_lp_new();
            completion_lp_add(j, c->lp, c, e);
        }
    }
    srv_choice_add(j, c, e);
    if (e->finish != AG_FINISH_NONE) {
        c->done = true;
        c->finish = e->finish;
        c->stop_index = e->stop_index;
        if (e->error) c->error = strdup(e->error);
    }
}

/* Waits for every choice, watching for the client going away. Returns
 * false if it did (the request was cancelled). */
static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static bool collect_all(srv_job *j) {
    double next_check = mono_ms() + 200;
    for (;;) {
        srv_event *e = srv_gen_next(j->gen, 200);
        if (e) {
            collect_event(j, e);
            free(e->error);
            free(e);
        } else if (srv_gen_finished(j->gen)) {
            return true;
        }
        /* events may flow without pause: look at the socket on a clock */
        double now = mono_ms();
        if (now >= next_check) {
            next_check = now + 200;
            if (srv_client_gone(j->conn)) {
                atomic_fetch_add(&j->s->client_cancels, 1);
                srv_gen_cancel(j->gen);
                return false;
            }
        }
    }
}

bool srv_job_choices_ok(srv_job *j, srv_resp *out) {
    for (int i = 0; i < j->n_choices; i++) {
        srv_choice *c = &j->ch[i];
        if (c->finish == AG_FINISH_ERROR) {
            srv_error(out, 500, "server_error", NULL, NULL, "generation failed: %s",
                      c->error ? c->error : "unknown error");
            return false;
        }
        if (c->finish == AG_FINISH_CANCELLED || !c->done) {
            srv_error(out, 503, "server_error", NULL, "shutting_down",
                      "the request was cancelled: the server is shutting down");
            return false;
        }
    }
    return true;
}

static void respond_collected(srv_job *j, srv_resp *out) {
    if (!srv_job_choices_ok(j, out)) return;
    json_t *r = envelope(j, j->chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int i = 0; i < j->n_choices; i++) {
        srv_choice *c = &j->ch[i];
        const char *reason = finish_name(c->finish);
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(i));
        const char *text = c->text.data ? c->text.data : "";
        if (j->chat) {
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            json_t *calls = NULL;
            ag_buf content = {0};
            const char *answer, *reasoning;
            size_t answer_len = srv_choice_answer(c, &answer), reasoning_len = srv_choice_reasoning(c, &reasoning);
            if (j->tools && srv_job_tool_calls(j, answer, answer_len, &calls, &content)) {
                json_object_set_new(msg, "content", content.len ? srv_jstr(content.data, content.len) : json_null());
                json_object_set_new(msg, "tool_calls", calls);
                if (c->finish == AG_FINISH_STOP) reason = "tool_calls";
            } else {
                json_object_set_new(msg, "content", srv_jstr(answer, answer_len));
            }
            if (reasoning_len) json_object_set_new(msg, "reasoning_content", srv_jstr(reasoning, reasoning_len));
            ag_buf_free(&content);
            json_object_set_new(msg, "refusal", json_null());
            json_object_set_new(ch, "message", msg);
            if (c->lp) {
                json_t *lp = json_object();
                json_object_set_new(lp, "content", json_incref(c->lp));
                json_object_set_new(ch, "logprobs", lp);
            } else {
                json_object_set_new(ch, "logprobs", j->logprobs ? json_pack("{s:[]}", "content") : json_null());
            }
        } else {
            ag_buf full = {0};
            if (j->echo) ag_buf_append(&full, j->echo[c->prompt], j->echo_len[c->prompt]);
            ag_buf_append(&full, text, c->text.len);
            json_object_set_new(ch, "text", srv_jstr(full.data, full.len));
            ag_buf_free(&full);
            json_object_set_new(ch, "logprobs", c->lp ? json_incref(c->lp) : json_null());
        }
        json_object_set_new(ch, "finish_reason", json_string(reason ? reason : "stop"));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(r, "choices", choices);
    json_object_set_new(r, "usage", usage_json(j));
    srv_json(out, 200, r);
}

static const srv_protocol k_chat_proto = {.id_prefix = "chatcmpl-", .stream_start = stream_start,
                                          .stream_event = stream_event, .stream_end = stream_end,
                                          .respond = respond_collected};
static const srv_protocol k_completions_proto = {.id_prefix = "cmpl-", .stream_start = stream_start,
                                                 .stream_event = stream_event, .stream_end = stream_end,
                                                 .respond = respond_collected};

/* ---- submission ---- */

/* Test hook: $AUGUR_TEST_SCRIPT names a JSON file holding a list of
 * strings; the k-th request the server submits (counting from 0, cycling)
 * writes the k-th string as every choice's output, token by token through
 * the engine (a literal schema replaces the request's), whatever the model
 * would have written. So the end-to-end tests of what is made of an output
 * (reasoning in tags, tool calls) get outputs no small test model writes.
 * Read once; NULL when unset or unusable. */
static json_t *g_script;
static atomic_uint g_script_next;
static void script_load(void) {
    const char *path = getenv("AUGUR_TEST_SCRIPT");
    if (!path || !*path) return;
    json_error_t err;
    g_script = json_load_file(path, 0, &err);
    if (!json_is_array(g_script) || !json_array_size(g_script)) {
        AG_LOGW("AUGUR_TEST_SCRIPT=%s: not a non-empty JSON list of strings; ignored", path);
        json_decref(g_script);
        g_script = NULL;
    }
}
static ag_schema *scripted_output(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, script_load);
    if (!g_script) return NULL;
    unsigned k = atomic_fetch_add(&g_script_next, 1);
    const char *text = json_string_value(json_array_get(g_script, k % json_array_size(g_script)));
    ag_schema *s = NULL;
    if (text && ag_schema_compile_literal(text, &s)) s = NULL;
    return s;
}

void srv_job_run(srv_job *j, const srv_opts *o, int32_t **ids, const size_t *n_ids, const char *prompt_param,
                 srv_resp *out) {
    ag_schema *script = scripted_output();
    for (int p = 0; p < j->n_prompts; p++) {
        ag_gen_request r = {.prompt = ids[p], .n_prompt = (int)n_ids[p], .max_tokens = o->max_tokens,
                            .n_choices = o->n, .sample = o->sp, .stops = (const char *const *)o->stops,
                            .n_stops = o->n_stops, .ignore_eos = o->ignore_eos,
                            /* completions with echo + logprobs (not streamed): score the prompt */
                            .prompt_logprobs = !j->chat && !j->stream && j->echo && j->logprobs,
                            .schema = script ? script : o->schema, .no_output = o->no_output,
                            .spec_max = o->spec_max, .cache_ns = o->cache_ns};
        ag_status st = srv_gen_submit(j->gen, p, &r, p * o->n);
        if (st) {
            ag_schema_unref(script);
            srv_status_error(out, st, prompt_param);
            j->ended = true; /* nothing was streamed: not a client's loss */
            job_free(j);     /* cancels the prompts already submitted */
            return;
        }
    }
    ag_schema_unref(script); /* the engine holds its own reference */
    if (j->stream) {
        out->status = 200;
        out->stream = j;
        if (j->proto->stream_start) j->proto->stream_start(j);
        return;
    }
    if (!collect_all(j)) {
        srv_error(out, 400, "invalid_request_error", NULL, "client_closed", "the client closed the connection");
        job_free(j);
        return;
    }
    j->proto->respond(j, out);
    if (out->status == 200) atomic_fetch_add(&j->s->completions_ok, 1);
    job_free(j);
}

/* ---- /v1/chat/completions ---- */

static bool is_role(const char *r) {
    return !strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant") || !strcmp(r, "tool") ||
           !strcmp(r, "developer");
}

/* content: string, list of text parts, or null; into a string. */
static bool content_text(json_t *content, size_t i, bool may_be_null, ag_buf *out_text, srv_resp *out) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!content || json_is_null(content)) {
        if (may_be_null) return true;
        srv_error(out, 400, "invalid_request_error", param, "invalid_value", "'%s' is required", param);
        return false;
    }
    if (json_is_string(content)) {
        ag_buf_append(out_text, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content)) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_type",
                  "'%s' must be a string or a list of content parts, got %s", param, srv_type_name(content));
        return false;
    }
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part) {
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            srv_error(out, 400, "invalid_request_error", param, "invalid_type",
                      "'%s[%zu]' must be a content part object with a 'type'", param, k);
            return false;
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            srv_error(out, 400, "invalid_request_error", param, "unsupported_value",
                      "content part type '%s' is not supported (this model reads text only)", json_string_value(type));
            return false;
        }
        if (!json_is_string(text)) {
            srv_error(out, 400, "invalid_request_error", param, "invalid_type",
                      "'%s[%zu].text' must be a string", param, k);
            return false;
        }
        if (k) ag_buf_append_char(out_text, '\n');
        ag_buf_append(out_text, json_string_value(text), json_string_length(text));
    }
    return true;
}

/* Checks an assistant message's tool_calls and gives the template what it
 * expects: arguments as an object where they parse as one. */
static json_t *convert_tool_calls(json_t *calls, size_t i, srv_resp *out) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
    if (!json_is_array(calls)) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_type", "'%s' must be a list", param);
        return NULL;
    }
    json_t *res = json_array();
    size_t k;
    json_t *tc;
    json_array_foreach(calls, k, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_object(tc) || !json_is_object(fn) || !json_is_string(name) ||
            (args && !json_is_null(args) && !json_is_string(args) && !json_is_object(args))) {
            json_decref(res);
            srv_error(out, 400, "invalid_request_error", param, "invalid_value",
                      "'%s[%zu]' must be {\"type\": \"function\", \"function\": {\"name\": string, \"arguments\": "
                      "string}}",
                      param, k);
            return NULL;
        }
        json_t *nfn = json_object();
        json_object_set(nfn, "name", name);
        json_t *a = NULL;
        if (json_is_string(args)) {
            json_error_t err;
            a = json_loads(json_string_value(args), 0, &err);
            if (a && !json_is_object(a)) {
                json_decref(a);
                a = NULL;
            }
            if (!a) a = json_incref(args);
        } else {
            a = args ? json_incref(args) : json_object();
            if (json_is_null(a)) {
                json_decref(a);
                a = json_object();
            }
        }
        json_object_set_new(nfn, "arguments", a);
        json_t *ntc = json_object();
        json_t *id = json_object_get(tc, "id");
        if (json_is_string(id)) json_object_set(ntc, "id", id);
        json_object_set_new(ntc, "type", json_string("function"));
        json_object_set_new(ntc, "function", nfn);
        json_array_append_new(res, ntc);
    }
    return res;
}

/* The system text that teaches tool calling to a model whose template does
 * not render tools: Hermes' convention, the one we then parse. */
static void generic_tools_text(json_t *tools, ag_buf *b) {
    ag_buf_append_str(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char *s = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) {
            ag_buf_append_char(b, '\n');
            ag_buf_append_str(b, s);
            free(s);
        }
    }
    ag_buf_append_str(b, "\n</tools>\n\nFor each function call, return a json object with function name and "
                         "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                         "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
}

json_t *srv_build_messages(ag_server *s, json_t *msgs, json_t *tools, srv_resp *out) {
    if (!msgs) {
        srv_error(out, 400, "invalid_request_error", "messages", "missing_required_parameter", "'messages' is required");
        return NULL;
    }
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        srv_error(out, 400, "invalid_request_error", "messages", json_is_array(msgs) ? "invalid_value" : "invalid_type",
                  "'messages' must be a non-empty list of messages");
        return NULL;
    }
    bool generic = tools && !s->tmpl_has_tools;
    json_t *res = json_array();
    size_t i;
    json_t *m;
    ag_buf text = {0};
    json_array_foreach(msgs, i, m) {
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) {
            srv_error(out, 400, "invalid_request_error", param, "invalid_type", "'%s' must be an object, got %s", param,
                      srv_type_name(m));
            goto fail;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || !is_role(json_string_value(role))) {
            snprintf(param, sizeof param, "messages[%zu].role", i);
            srv_error(out, 400, "invalid_request_error", param, "invalid_value",
                      "'%s' must be one of system, developer, user, assistant, tool", param);
            goto fail;
        }
        const char *r = json_string_value(role);
        if (!strcmp(r, "developer")) r = "system";
        bool assistant = !strcmp(r, "assistant");
        json_t *calls_in = json_object_get(m, "tool_calls");
        bool has_calls = assistant && calls_in && !json_is_null(calls_in);
        ag_buf_clear(&text);
        if (!content_text(json_object_get(m, "content"), i, assistant, &text, out)) goto fail;
        json_t *nm = json_object();
        json_t *calls = NULL;
        if (has_calls && !(calls = convert_tool_calls(calls_in, i, out))) {
            json_decref(nm);
            goto fail;
        }
        if (generic && calls) {
            /* spell the calls out the way the tools text taught */
            size_t k;
            json_t *tc;
            json_array_foreach(calls, k, tc) {
                json_t *fn = json_object_get(tc, "function");
                json_t *o = json_pack("{s:O, s:O}", "name", json_object_get(fn, "name"), "arguments",
                                      json_object_get(fn, "arguments"));
                char *js = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                json_decref(o);
                if (text.len) ag_buf_append_char(&text, '\n');
                ag_buf_printf(&text, "<tool_call>\n%s\n</tool_call>", js ? js : "{}");
                free(js);
            }
            json_decref(calls);
            calls = NULL;
        }
        if (generic && !strcmp(r, "tool")) {
            ag_buf wrapped = {0};
            ag_buf_printf(&wrapped, "<tool_response>\n%s\n</tool_response>", ag_buf_cstr(&text));
            ag_buf_free(&text);
            text = wrapped;
            r = "user";
        }
        json_object_set_new(nm, "role", json_string(r));
        json_object_set_new(nm, "content", srv_jstr(text.data, text.len));
        if (calls) json_object_set_new(nm, "tool_calls", calls);
        json_t *name = json_object_get(m, "name");
        if (json_is_string(name)) json_object_set(nm, "name", name);
        json_t *tcid = json_object_get(m, "tool_call_id");
        if (json_is_string(tcid)) json_object_set(nm, "tool_call_id", tcid);
        json_array_append_new(res, nm);
    }
    if (generic) {
        ag_buf_clear(&text);
        generic_tools_text(tools, &text);
        json_t *first = json_array_get(res, 0);
        if (!strcmp(json_string_value(json_object_get(first, "role")), "system")) {
            ag_buf merged = {0};
            ag_buf_printf(&merged, "%s\n\n%s", json_string_value(json_object_get(first, "content")),
                          ag_buf_cstr(&text));
            json_object_set_new(first, "content", srv_jstr(merged.data, merged.len));
            ag_buf_free(&merged);
        } else {
            json_array_insert_new(res, 0, json_pack("{s:s, s:s%}", "role", "system", "content", ag_buf_cstr(&text),
                                                    text.len));
        }
    }
    ag_buf_free(&text);
    return res;
fail:
    ag_buf_free(&text);
    json_decref(res);
    return NULL;
}

json_t *srv_parse_tools(json_t *b, srv_resp *out, bool *failed, bool *forced) {
    *failed = false;
    *forced = false;
    json_t *tools = json_object_get(b, "tools");
    json_t *choice = json_object_get(b, "tool_choice");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            srv_error(out, 400, "invalid_request_error", "tools", "invalid_type", "'tools' must be a list, got %s",
                      srv_type_name(tools));
            goto fail;
        }
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            json_t *fn = json_object_get(t, "function");
            json_t *type = json_object_get(t, "type");
            json_t *name = json_object_get(fn, "name");
            json_t *params = json_object_get(fn, "parameters");
            json_t *desc = json_object_get(fn, "description");
            if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
                !json_is_object(fn) || !json_is_string(name) || !json_string_length(name) ||
                (params && !json_is_null(params) && !json_is_object(params)) ||
                (desc && !json_is_null(desc) && !json_is_string(desc))) {
                char param[32];
                snprintf(param, sizeof param, "tools[%zu]", i);
                srv_error(out, 400, "invalid_request_error", param, "invalid_value",
                          "'%s' must be {\"type\": \"function\", \"function\": {\"name\": string, \"description\": "
                          "string, \"parameters\": object}}",
                          param);
                goto fail;
            }
        }
        if (json_array_size(tools) == 0) tools = NULL;
    } else {
        tools = NULL;
    }
    if (choice && !json_is_null(choice)) {
        if (json_is_string(choice)) {
            const char *c = json_string_value(choice);
            if (!strcmp(c, "none")) return NULL;
            if (strcmp(c, "auto") && strcmp(c, "required")) {
                srv_error(out, 400, "invalid_request_error", "tool_choice", "invalid_value",
                          "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function");
                goto fail;
            }
            if (!strcmp(c, "required") && !tools) {
                srv_error(out, 400, "invalid_request_error", "tool_choice", "invalid_value",
                          "'tool_choice' is \"required\" but no tools were given");
                goto fail;
            }
            *forced = !strcmp(c, "required");
        } else if (json_is_object(choice)) {
            const char *want = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
            if (!want) {
                srv_error(out, 400, "invalid_request_error", "tool_choice", "invalid_value",
                          "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": string}}");
                goto fail;
            }
            size_t i;
            json_t *t;
            json_array_foreach(tools, i, t) {
                const char *nm = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
                if (nm && !strcmp(nm, want)) {
                    json_t *one = json_array();
                    json_array_append(one, t);
                    *forced = true;
                    return one;
                }
            }
            srv_error(out, 400, "invalid_request_error", "tool_choice", "invalid_value",
                      "'tool_choice' names function '%s', which is not in 'tools'", want);
            goto fail;
        } else {
            srv_error(out, 400, "invalid_request_error", "tool_choice", "invalid_type",
                      "'tool_choice' must be a string or an object, got %s", srv_type_name(choice));
            goto fail;
        }
    }
    return tools ? json_incref(tools) : NULL;
fail:
    *failed = true;
    return NULL;
}

/* The grammar of a tool call: the output is one call, in the template
 * family's syntax, of one of `tools`, its arguments a value of that
 * function's "parameters" schema (one alternative per function: the call's
 * start up to its arguments, the arguments, the call's end). With
 * `answer` (tool_choice auto beside an answer schema: response_format,
 * text.format, output_config.format) there is one more alternative: a bare
 * value of the answer's schema, so the model either calls a tool or
 * answers in the schema; OpenAI applies the schema to the final message
 * only. Replaces o->schema. More tools than a schema takes alternatives:
 * not enforced (with an answer, the answer's schema alone stays). False
 * (with a 400) when a parameters schema does not compile. */
static bool tool_grammar(srv_opts *o, json_t *tools, ag_tool_format tf, bool answer, srv_resp *out) {
    size_t n = json_array_size(tools), i;
    if (n == 0 || n > AG_SCHEMA_MAX_CALLS) return true;
    const bool    llama3 = tf == AG_TOOLS_LLAMA3;
    char         *pre[AG_SCHEMA_MAX_CALLS] = {0};
    ag_schema_alt alts[AG_SCHEMA_MAX_ALTS];
    bool          ok = true;
    json_t       *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        char   *quoted = json_dumps(json_object_get(fn, "name"), JSON_ENCODE_ANY);
        ag_buf  p = {0};
        if (quoted) {
            ag_buf_append_str(&p, llama3 ? "{\"name\": " : "<tool_call>\n{\"name\": ");
            ag_buf_append_str(&p, quoted);
            ag_buf_append_str(&p, llama3 ? ", \"parameters\": " : ", \"arguments\": ");
        }
        free(quoted);
        if (!p.data) { /* out of memory: not enforced */
            for (size_t k = 0; k < i; k++) free(pre[k]);
            return true;
        }
        pre[i] = ag_buf_take(&p);
        json_t *ps = json_object_get(fn, "parameters");
        alts[i] = (ag_schema_alt){.prefix = pre[i], .schema = json_is_null(ps) ? NULL : ps,
                                  .suffix = llama3 ? "}" : "}\n</tool_call>"};
    }
    int n_alts = (int)n;
    if (answer) alts[n_alts++] = (ag_schema_alt){.prefix = "", .schema = o->answer_schema};
    ag_schema *g = NULL;
    ag_status  st = ag_schema_compile_alts(alts, n_alts, &g);
    if (st) {
        /* "schema i: ..." names the tool */
        const char *msg = ag_error_message();
        int         idx = 0;
        if (sscanf(msg, "schema %d:", &idx) != 1) idx = 0;
        char param[48];
        snprintf(param, sizeof param, "tools[%d].function.parameters", n_alts > 1 ? idx : 0);
        if (st == AG_ERR_NOMEM) srv_status_error(out, st, NULL);
        else srv_error(out, 400, "invalid_request_error", param, "invalid_schema", "%s: %s", param, msg);
        ok = false;
    } else {
        ag_schema_unref(o->schema);
        o->schema = g;
    }
    for (size_t k = 0; k < n; k++) free(pre[k]);
    return ok;
}

bool srv_chat_prompt(ag_server *s, json_t *msgs, json_t *tools, const char *prefill, size_t prefill_len,
                     const char *param, int32_t **ids, size_t *n_ids, bool *opened, srv_resp *out) {
    if (!s->chat) {
        srv_error(out, 400, "invalid_request_error", NULL, "unsupported", "this model has no chat format");
        return false;
    }
    ag_buf prompt = {0};
    bool ok = false;
    ag_status st = ag_chat_render(s->chat, msgs, s->tmpl_has_tools ? tools : NULL, true, NULL, &prompt);
    if (st) {
        srv_error(out, 400, "invalid_request_error", param, "template_error",
                  "the model's chat template rejected the messages: %s", ag_error_message());
        goto done;
    }
    if (prefill_len) ag_buf_append(&prompt, prefill, prefill_len);
    if (opened) *opened = s->thinks && ag_think_prompt_opens(ag_buf_cstr(&prompt), prompt.len);
    bool add_special = !ag_chat_has_bos(s->chat, ag_buf_cstr(&prompt), prompt.len);
    if ((st = ag_tok_encode(s->tok, ag_buf_cstr(&prompt), prompt.len, add_special, true, ids, n_ids))) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_value", "cannot tokenize the prompt: %s",
                  ag_error_message());
        goto done;
    }
    if (*n_ids == 0) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_value", "the prompt is empty");
        goto done;
    }
    if (ag_log_enabled(AG_LOG_DEBUG)) AG_LOGD("chat prompt (%zu tokens): %s", *n_ids, ag_buf_cstr(&prompt));
    ok = true;
done:
    ag_buf_free(&prompt);
    return ok;
}

bool srv_job_use_tools(srv_job *j, srv_opts *o, json_t *tools, bool forced, srv_resp *out) {
    j->tools = true;
    j->tool_list = json_incref(tools);
    j->tf = j->s->tmpl_has_tools ? j->s->tool_format : AG_TOOLS_HERMES;
    if (forced) return tool_grammar(o, tools, j->tf, false, out);
    if (!o->has_answer_schema) return true;
    /* A call or the answer: a Llama 3 call starts like a JSON object, so
     * there the calls take Hermes' tags, which are then what is parsed. */
    if (j->tf != AG_TOOLS_HERMES) j->tf = AG_TOOLS_HERMES;
    return tool_grammar(o, tools, j->tf, true, out);
}

void srv_route_chat(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    srv_opts o;
    json_t *tools = NULL, *msgs = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    srv_opts_init(&o);
    if (!srv_check_fields(s, b, SRV_ROUTE_CHAT, out) || !parse_common(s, b, true, &o, out)) goto done;
    bool failed, forced;
    tools = srv_parse_tools(b, out, &failed, &forced);
    if (failed) goto done;
    if (!(msgs = srv_build_messages(s, json_object_get(b, "messages"), tools, out))) goto done;
    bool opened = false;
    if (!srv_chat_prompt(s, msgs, tools, NULL, 0, "messages", &ids, &n_ids, &opened, out)) goto done;
    srv_job *j = job_new(rq, true, &o, 1);
    if (!j) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    srv_job_think(j, opened);
    if (tools && !srv_job_use_tools(j, &o, tools, forced, out)) {
        srv_job_free(j);
        goto done;
    }
    srv_job_run(j, &o, &ids, &n_ids, "messages", out);
done:
    free(ids);
    json_decref(msgs);
    json_decref(tools);
    srv_opts_free(&o);
    json_decref(b);
}

/* ---- /v1/completions ---- */

static bool token_list(ag_server *s, json_t *arr, int32_t **ids, size_t *n, srv_resp *out) {
    size_t cnt = json_array_size(arr);
    *ids = malloc(sizeof **ids * (cnt ? cnt : 1));
    *n = 0;
    if (!*ids) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->n_vocab) {
            srv_error(out, 400, "invalid_request_error", "prompt", "invalid_value",
                      "prompt token ids must be integers in [0, %d)", s->n_vocab);
            return false;
        }
        (*ids)[(*n)++] = (int32_t)json_integer_value(x);
    }
    return true;
}

void srv_route_completions(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    srv_opts o;
    int32_t *ids[MAX_PROMPTS] = {0};
    size_t n_ids[MAX_PROMPTS] = {0};
    bool from_text[MAX_PROMPTS] = {0};
    json_t *texts[MAX_PROMPTS] = {0};
    int n_prompts = 0;
    srv_job *j = NULL;
    srv_opts_init(&o);
    if (!srv_check_fields(s, b, SRV_ROUTE_COMPLETIONS, out) || !parse_common(s, b, false, &o, out)) goto done;
    json_t *prompt = json_object_get(b, "prompt");
    if (!prompt || json_is_null(prompt)) {
        srv_error(out, 400, "invalid_request_error", "prompt", "missing_required_parameter", "'prompt' is required");
        goto done;
    }
    if (json_is_string(prompt)) {
        texts[n_prompts++] = prompt;
    } else if (json_is_array(prompt) && json_array_size(prompt) > 0) {
        json_t *first = json_array_get(prompt, 0);
        size_t i;
        json_t *x;
        if (json_is_integer(first)) {
            if (!token_list(s, prompt, &ids[0], &n_ids[0], out)) {
                n_prompts = 1;
                goto done;
            }
            n_prompts = 1;
        } else {
            if (json_array_size(prompt) > MAX_PROMPTS) {
                srv_error(out, 400, "invalid_request_error", "prompt", "invalid_value",
                          "at most %d prompts per request", MAX_PROMPTS);
                goto done;
            }
            json_array_foreach(prompt, i, x) {
                if (json_is_string(x)) {
                    texts[n_prompts++] = x;
                } else if (json_is_array(x) && json_array_size(x) > 0) {
                    int k = n_prompts++;
                    if (!token_list(s, x, &ids[k], &n_ids[k], out)) goto done;
                } else {
                    srv_error(out, 400, "invalid_request_error", "prompt", "invalid_type",
                              "'prompt' must be a string, a list of strings, a list of token ids or a list of such "
                              "lists (item %zu is %s)",
                              i, srv_type_name(x));
                    goto done;
                }
            }
        }
    } else {
        srv_error(out, 400, "invalid_request_error", "prompt", "invalid_type",
                  "'prompt' must be a non-empty string, list of strings, list of token ids or list of such lists");
        goto done;
    }
    if (n_prompts * o.n > 256) {
        srv_error(out, 400, "invalid_request_error", "n", "invalid_value", "too many choices (prompts x n > 256)");
        goto done;
    }
    for (int p = 0; p < n_prompts; p++) {
        if (!texts[p]) continue;
        from_text[p] = true;
        /* BOS as the model's metadata says; special-token text is parsed
         * (as llama.cpp's server does) so raw templated prompts work */
        if (ag_tok_encode(s->tok, json_string_value(texts[p]), json_string_length(texts[p]), true, true, &ids[p],
                          &n_ids[p])) {
            srv_error(out, 400, "invalid_request_error", "prompt", "invalid_value", "cannot tokenize the prompt: %s",
                      ag_error_message());
            goto done;
        }
    }
    for (int p = 0; p < n_prompts; p++)
        if (n_ids[p] == 0) {
            srv_error(out, 400, "invalid_request_error", "prompt", "invalid_value", "the prompt is empty");
            goto done;
        }
    j = job_new(rq, false, &o, n_prompts);
    if (!j) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    if (o.echo) {
        j->echo = calloc((size_t)n_prompts, sizeof *j->echo);
        j->echo_len = calloc((size_t)n_prompts, sizeof *j->echo_len);
        if (!j->echo || !j->echo_len) {
            srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
            goto done;
        }
        for (int p = 0; p < n_prompts; p++) {
            ag_buf t = {0};
            if (from_text[p]) ag_buf_append(&t, json_string_value(texts[p]), json_string_length(texts[p]));
            else ag_tok_decode(s->tok, ids[p], n_ids[p], AG_DECODE_SPECIAL, &t);
            j->echo_len[p] = t.len;
            j->echo[p] = t.data ? ag_buf_take(&t) : strdup("");
        }
    }
    for (int i = 0; i < j->n_choices; i++) {
        srv_choice *c = &j->ch[i];
        if (j->echo) c->offset = n_chars(j->echo[c->prompt], j->echo_len[c->prompt]);
        if (o.echo && o.logprobs && !o.stream) {
            c->offset = 0;
            c->lp = completion_lp_new();
            completion_lp_prompt(j, c->lp, c, ids[c->prompt], n_ids[c->prompt], from_text[c->prompt],
                                 j->echo[c->prompt], j->echo_len[c->prompt]);
        }
    }
    srv_job *jj = j;
    j = NULL;
    srv_job_run(jj, &o, ids, n_ids, "prompt", out);
done:
    if (j) j->ended = true;
    job_free(j);
    for (int p = 0; p < n_prompts; p++) free(ids[p]);
    srv_opts_free(&o);
    json_decref(b);
}
