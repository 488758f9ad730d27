/* Request options any protocol shares (request.c). */
#ifndef AG_SERVER_REQUEST_H
#define AG_SERVER_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "sample/schema.h"
#include "server/reply.h"

/* "a string", "an object", ... ("nothing" for NULL): for error messages. */
const char *srv_type_name(const json_t *v);
/* Field readers: an absent or null field keeps *v; a wrong type or a value
 * out of [lo, hi] fills `out` with a 400 naming `key` and returns false.
 * srv_get_int also takes integral reals and sets *present (may be NULL)
 * when it read a value. */
bool srv_get_bool(json_t *o, const char *key, bool *v, srv_resp *out);
bool srv_get_num(json_t *o, const char *key, double lo, double hi, double *v, srv_resp *out);
bool srv_get_int(json_t *o, const char *key, long long lo, long long hi, long long *v, bool *present,
                 srv_resp *out);

#define SRV_MAX_STOPS 16

/* What a request asks of a generation, whatever its protocol. Strings and
 * arrays are owned (srv_opts_free). */
typedef struct {
    ag_sample_params sp;
    ag_logit_bias   *bias;
    int              max_tokens; /* 0: until the context is full */
    int              n;
    char            *stops[SRV_MAX_STOPS];
    int              n_stops;
    bool             stream, include_usage, ignore_eos, echo;
    bool             logprobs;
    int              top_logprobs;
    bool             no_output;   /* completions: max_tokens 0 with echo */
    ag_schema       *schema;      /* structured output: response_format or a forced tool call; else NULL */
    /* The answer's schema (response_format, text.format, output_config.format;
     * NULL: {"type": "object"}), kept to let tools be called beside it. */
    json_t          *answer_schema;
    bool             has_answer_schema;
    int              spec_max;    /* "speculative": 0 the server's setting, -1 off, n > 0 at most n drafts */
    uint64_t         cache_ns;    /* prefix cache namespace: the API key and "cache_salt" */
    bool             one_tool_call; /* parallel_tool_calls false (Anthropic: disable_parallel_tool_use) */
} srv_opts;

/* Defaults: the sampler's, one choice, no limit, a fresh random seed. */
void srv_opts_init(srv_opts *o);
void srv_opts_free(srv_opts *o);
/* temperature (0..max_temperature), top_p, min_p, top_k, the penalties and
 * seed of body b into o->sp. False with `out` filled on a bad field. */
bool srv_parse_sampling(json_t *b, double max_temperature, srv_opts *o, srv_resp *out);
/* augur's extensions any protocol accepts: "speculative" and "cache_salt"
 * (with the server's API key, the prefix cache namespace). */
bool srv_parse_extensions(ag_server *s, json_t *b, srv_opts *o, srv_resp *out);
/* Stop strings from `stop` (a string or a list of at most SRV_MAX_STOPS
 * strings; NULL/null: none), named `param` in errors. */
bool srv_parse_stops(json_t *stop, const char *param, srv_opts *o, srv_resp *out);
/* Structured output: the output is made one JSON value of `schema` (an
 * object or a boolean), as response_format's json_schema does; false with a
 * 400 naming `param` when it does not compile. */
bool srv_output_schema(json_t *schema, const char *param, srv_opts *o, srv_resp *out);

#endif
