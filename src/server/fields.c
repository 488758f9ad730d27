/* The top-level fields each generation route accepts, and the checks made
 * on a request body before it is parsed (server_impl.h, srv_check_fields).
 *
 * Why a list per route: a field the server does not know used to be
 * ignored, so a misspelling changed the meaning of a request without a
 * word ({"max_tok{ns": 8} ran to the end of the context). OpenAI and
 * Anthropic answer an unknown argument with a 400 naming it; so does
 * augur, unless it runs with --lenient-fields. Every field of the
 * documented request schemas is known here, in one of three ways:
 *  - READ: the route implements it (its parser reads and checks it), and
 *    so are augur's extensions (and the ones it shares with vLLM and
 *    llama.cpp's server);
 *  - IGNORED: it cannot change the output (storage, attribution, routing
 *    and caching hints, service tiers); accepted and not used (README,
 *    "Ignored fields");
 *  - UNSUPPORTED: it would change the output in a way augur does not do
 *    (audio, web search, reasoning effort, ...): a 400 naming it, unless
 *    its value asks for what augur does anyway (null, or e.g. modalities
 *    ["text"]).
 * The lists follow the OpenAI API reference (chat completions, legacy
 * completions) and Anthropic's (messages, count_tokens) as of the `openai`
 * 3.63 and `anthropic` 2.17 Python clients, plus fields those clients'
 * older versions still send (temperature, top_p, top_k on messages).
 *
 * NUL characters: bodies are parsed with \u0000 allowed (the JSON is
 * valid), and text that reaches the tokenizer keeps it (byte 0 is a token
 * like any other). Strings read as C strings (roles, types, names, stop
 * strings, schemas) cannot hold one: a NUL anywhere but in the text paths
 * of a route is a 400 naming where it is, not a silent truncation. */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "server/fields.h"
#include "server/server_impl.h"

typedef enum { F_READ, F_IGNORED, F_UNSUPPORTED } field_kind;

typedef struct {
    const char *name;
    field_kind  kind;
    /* F_UNSUPPORTED: true for a value that asks for what augur does anyway
     * (NULL: only null is accepted). */
    bool (*is_default)(const json_t *v);
    const char *why; /* F_UNSUPPORTED: what augur does not do (for the error) */
} field;

static bool empty_list(const json_t *v) { return json_is_array(v) && json_array_size(v) == 0; }
static bool empty_string(const json_t *v) { return json_is_string(v) && json_string_length(v) == 0; }
static bool text_only(const json_t *v) {
    return json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
           !strcmp(json_string_value(json_array_get(v, 0)), "text");
}

/* augur's extensions, on every generation route (srv_parse_sampling and
 * srv_parse_extensions read them) */
#define EXTENSIONS                                                                                              \
    {"top_k", F_READ, NULL, NULL}, {"min_p", F_READ, NULL, NULL}, {"repetition_penalty", F_READ, NULL, NULL}, \
        {"ignore_eos", F_READ, NULL, NULL}, {"speculative", F_READ, NULL, NULL},                              \
        {"cache_salt", F_READ, NULL, NULL}

static const field k_chat[] = {
    {"messages", F_READ, NULL, NULL},
    {"model", F_READ, NULL, NULL},
    {"frequency_penalty", F_READ, NULL, NULL},
    {"presence_penalty", F_READ, NULL, NULL},
    {"logit_bias", F_READ, NULL, NULL},
    {"logprobs", F_READ, NULL, NULL},
    {"top_logprobs", F_READ, NULL, NULL},
    {"max_tokens", F_READ, NULL, NULL},
    {"max_completion_tokens", F_READ, NULL, NULL},
    {"n", F_READ, NULL, NULL},
    {"response_format", F_READ, NULL, NULL},
    {"seed", F_READ, NULL, NULL},
    {"stop", F_READ, NULL, NULL},
    {"stream", F_READ, NULL, NULL},
    {"stream_options", F_READ, NULL, NULL},
    {"temperature", F_READ, NULL, NULL},
    {"top_p", F_READ, NULL, NULL},
    {"tools", F_READ, NULL, NULL},
    {"tool_choice", F_READ, NULL, NULL},
    {"parallel_tool_calls", F_READ, NULL, NULL},
    EXTENSIONS,
    {"metadata", F_IGNORED, NULL, NULL},
    {"store", F_IGNORED, NULL, NULL},
    {"user", F_IGNORED, NULL, NULL},
    {"safety_identifier", F_IGNORED, NULL, NULL},
    {"prompt_cache_key", F_IGNORED, NULL, NULL},
    {"prompt_cache_retention", F_IGNORED, NULL, NULL},
    {"prompt_cache_options", F_IGNORED, NULL, NULL},
    {"service_tier", F_IGNORED, NULL, NULL},
    /* a predicted output only makes the answer faster, never different */
    {"prediction", F_IGNORED, NULL, NULL},
    {"modalities", F_UNSUPPORTED, text_only, "this model only writes text: modalities must be [\"text\"]"},
    {"audio", F_UNSUPPORTED, NULL, "this model does not produce audio"},
    {"reasoning_effort", F_READ, NULL, NULL}, /* (messages.c: where the template takes it) */
    {"verbosity", F_UNSUPPORTED, NULL, "answers cannot be made shorter or longer here; use max_tokens"},
    {"web_search_options", F_UNSUPPORTED, NULL, "this server does not search the web"},
    {"moderation", F_UNSUPPORTED, NULL, "this server does not moderate"},
    {"functions", F_UNSUPPORTED, empty_list, "use 'tools'"},
    {"function_call", F_UNSUPPORTED, NULL, "use 'tool_choice'"},
    {NULL, 0, NULL, NULL},
};

static const field k_completions[] = {
    {"prompt", F_READ, NULL, NULL},
    {"model", F_READ, NULL, NULL},
    {"best_of", F_READ, NULL, NULL},
    {"echo", F_READ, NULL, NULL},
    {"frequency_penalty", F_READ, NULL, NULL},
    {"presence_penalty", F_READ, NULL, NULL},
    {"logit_bias", F_READ, NULL, NULL},
    {"logprobs", F_READ, NULL, NULL},
    {"max_tokens", F_READ, NULL, NULL},
    {"n", F_READ, NULL, NULL},
    {"seed", F_READ, NULL, NULL},
    {"stop", F_READ, NULL, NULL},
    {"stream", F_READ, NULL, NULL},
    {"stream_options", F_READ, NULL, NULL},
    {"temperature", F_READ, NULL, NULL},
    {"top_p", F_READ, NULL, NULL},
    {"response_format", F_READ, NULL, NULL}, /* (structured outputs on both endpoints) */
    EXTENSIONS,
    {"user", F_IGNORED, NULL, NULL},
    {"suffix", F_UNSUPPORTED, empty_string, "text after the insertion point (fill-in-the-middle) is not supported"},
    {NULL, 0, NULL, NULL},
};

/* /v1/messages and /v1/messages/count_tokens ("the same body") */
static const field k_messages[] = {
    {"model", F_READ, NULL, NULL},
    {"messages", F_READ, NULL, NULL},
    {"max_tokens", F_READ, NULL, NULL},
    {"system", F_READ, NULL, NULL},
    {"stop_sequences", F_READ, NULL, NULL},
    {"stream", F_READ, NULL, NULL},
    {"temperature", F_READ, NULL, NULL},
    {"top_p", F_READ, NULL, NULL},
    {"metadata", F_READ, NULL, NULL},
    {"tools", F_READ, NULL, NULL},
    {"tool_choice", F_READ, NULL, NULL},
    {"output_config", F_READ, NULL, NULL},
    {"seed", F_READ, NULL, NULL},
    {"presence_penalty", F_READ, NULL, NULL},
    {"frequency_penalty", F_READ, NULL, NULL},
    EXTENSIONS,
    {"service_tier", F_IGNORED, NULL, NULL},
    {"inference_geo", F_IGNORED, NULL, NULL},
    {"speed", F_IGNORED, NULL, NULL},
    {"cache_control", F_IGNORED, NULL, NULL},
    {"diagnostics", F_IGNORED, NULL, NULL},
    {"user_profile_id", F_IGNORED, NULL, NULL},
    {"workspace_id", F_IGNORED, NULL, NULL},
    {"thinking", F_READ, NULL, NULL}, /* (anthropic.c: only where the model thinks) */
    {"container", F_UNSUPPORTED, NULL, "this server runs no code containers"},
    {"mcp_servers", F_UNSUPPORTED, empty_list, "this server does not call MCP servers"},
    {"context_management", F_UNSUPPORTED, NULL, "this server does not edit the context"},
    {NULL, 0, NULL, NULL},
};

/* /v1/responses. Fields whose value may ask for what augur does not do
 * (background, conversation, prompt, include, reasoning, truncation, ...)
 * are read and checked by responses.c, which says why. */
static const field k_responses[] = {
    {"input", F_READ, NULL, NULL},
    {"model", F_READ, NULL, NULL},
    {"instructions", F_READ, NULL, NULL},
    {"previous_response_id", F_READ, NULL, NULL},
    {"store", F_READ, NULL, NULL},
    {"metadata", F_READ, NULL, NULL},
    {"max_output_tokens", F_READ, NULL, NULL},
    {"temperature", F_READ, NULL, NULL},
    {"top_p", F_READ, NULL, NULL},
    {"tools", F_READ, NULL, NULL},
    {"tool_choice", F_READ, NULL, NULL},
    {"parallel_tool_calls", F_READ, NULL, NULL},
    {"text", F_READ, NULL, NULL},
    {"stream", F_READ, NULL, NULL},
    {"background", F_READ, NULL, NULL},
    {"conversation", F_READ, NULL, NULL},
    {"prompt", F_READ, NULL, NULL},
    {"max_tool_calls", F_READ, NULL, NULL},
    {"truncation", F_READ, NULL, NULL},
    {"top_logprobs", F_READ, NULL, NULL},
    {"include", F_READ, NULL, NULL},
    {"reasoning", F_READ, NULL, NULL},
    {"seed", F_READ, NULL, NULL},
    EXTENSIONS,
    /* (stream_options holds only include_obfuscation, padding for network
     * observers) */
    {"stream_options", F_IGNORED, NULL, NULL},
    {"user", F_IGNORED, NULL, NULL},
    {"safety_identifier", F_IGNORED, NULL, NULL},
    {"prompt_cache_key", F_IGNORED, NULL, NULL},
    {"prompt_cache_retention", F_IGNORED, NULL, NULL},
    {"prompt_cache_options", F_IGNORED, NULL, NULL},
    {"service_tier", F_IGNORED, NULL, NULL},
    {"access_programs", F_IGNORED, NULL, NULL},
    {"background_options", F_UNSUPPORTED, NULL, "responses are answered in the foreground"},
    {"context_management", F_UNSUPPORTED, NULL, "this server does not compact the context"},
    {"moderation", F_UNSUPPORTED, NULL, "this server does not moderate"},
    {"image", F_UNSUPPORTED, NULL, "this model reads text only"},
    {NULL, 0, NULL, NULL},
};

/* Where a string may hold NUL: the text the model reads. Path segments are
 * object keys; "*" is an array index, "**" any rest. */
static const char *const k_chat_text[] = {
    "messages.*.content", "messages.*.content.*.text", "messages.*.tool_calls.*.function.arguments",
    "messages.*.tool_calls.*.function.arguments.**", "tools.*.function.description", "cache_salt", NULL,
};
static const char *const k_completions_text[] = {"prompt", "prompt.*", "cache_salt", NULL};
static const char *const k_responses_text[] = {
    "input", "input.*.content", "input.*.content.*.text", "input.*.output", "input.*.output.*.text",
    "input.*.arguments", "instructions", "tools.*.description", "metadata.**", "cache_salt", NULL,
};
static const char *const k_messages_text[] = {
    "system", "system.*.text", "messages.*.content", "messages.*.content.*.text", "messages.*.content.*.content",
    "messages.*.content.*.content.*.text", "messages.*.content.*.input.**", "tools.*.description", "metadata.**",
    "cache_salt", NULL,
};

/* A path from the body's root: object keys, and array indices (key NULL). */
typedef struct {
    const char *key[32];
    size_t      index[32];
    int         n;
} path;

/* Whether the pattern ("a.*.b", "a.**") matches the path. */
static bool path_matches(const char *pat, const path *p) {
    int i = 0;
    while (*pat) {
        const char *dot = strchr(pat, '.');
        size_t      len = dot ? (size_t)(dot - pat) : strlen(pat);
        if (len == 2 && !strncmp(pat, "**", 2)) return true;
        if (i >= p->n) return false;
        if (len == 1 && *pat == '*') {
            if (p->key[i]) return false;
        } else if (!p->key[i] || strlen(p->key[i]) != len || strncmp(p->key[i], pat, len)) {
            return false;
        }
        i++;
        pat += dot ? len + 1 : len;
    }
    return i == p->n;
}

/* The path as errors name it: "messages[0].content" (OpenAI) or
 * "messages.0.content" (Anthropic). */
static void path_name(const path *p, bool anthropic, char *out, size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < p->n && o < cap; i++) {
        int w;
        if (p->key[i]) w = snprintf(out + o, cap - o, "%s%s", i ? "." : "", p->key[i]);
        else w = snprintf(out + o, cap - o, anthropic ? ".%zu" : "[%zu]", p->index[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* Finds a string holding NUL outside the text paths, under v at path p;
 * false (with the 400) when there is one. */
static bool nul_walk(json_t *v, path *p, const char *const *text, bool anthropic, srv_resp *out) {
    if (json_is_string(v)) {
        if (!memchr(json_string_value(v), '\0', json_string_length(v))) return true;
        for (const char *const *t = text; *t; t++)
            if (path_matches(*t, p)) return true;
        char name[256];
        path_name(p, anthropic, name, sizeof name);
        srv_error(out, 400, "invalid_request_error", name, "invalid_value",
                  "'%s' contains a NUL character (\\u0000): that is accepted in text the model reads (prompts, "
                  "message content), not here",
                  name);
        return false;
    }
    if (p->n >= 32) return true; /* (deeper than any text path) */
    if (json_is_object(v)) {
        const char *k;
        json_t     *x;
        json_object_foreach(v, k, x) {
            p->key[p->n++] = k;
            bool ok = nul_walk(x, p, text, anthropic, out);
            p->n--;
            if (!ok) return false;
        }
    } else if (json_is_array(v)) {
        size_t  i;
        json_t *x;
        json_array_foreach(v, i, x) {
            p->key[p->n] = NULL;
            p->index[p->n++] = i;
            bool ok = nul_walk(x, p, text, anthropic, out);
            p->n--;
            if (!ok) return false;
        }
    }
    return true;
}

bool srv_check_fields(ag_server *s, json_t *b, srv_route_kind route, srv_resp *out) {
    const field       *fields = route == SRV_ROUTE_CHAT          ? k_chat
                                : route == SRV_ROUTE_COMPLETIONS ? k_completions
                                : route == SRV_ROUTE_RESPONSES   ? k_responses
                                                                 : k_messages;
    const char *const *text = route == SRV_ROUTE_CHAT          ? k_chat_text
                              : route == SRV_ROUTE_COMPLETIONS ? k_completions_text
                              : route == SRV_ROUTE_RESPONSES   ? k_responses_text
                                                               : k_messages_text;
    const bool         anthropic = route == SRV_ROUTE_MESSAGES;
    const char        *k;
    json_t            *v;
    json_object_foreach(b, k, v) {
        const field *f = fields;
        while (f->name && strcmp(f->name, k)) f++;
        if (!f->name) {
            if (s->p.lenient_fields) {
                AG_LOGD("request field '%s' is unknown; ignored (--lenient-fields)", k);
                continue;
            }
            if (anthropic)
                srv_error(out, 400, "invalid_request_error", k, "unknown_parameter",
                          "%s: Extra inputs are not permitted", k);
            else
                srv_error(out, 400, "invalid_request_error", k, "unknown_parameter",
                          "Unrecognized request argument supplied: %s", k);
            return false;
        }
        if (f->kind == F_IGNORED) continue;
        if (f->kind == F_UNSUPPORTED) {
            if (json_is_null(v) || (f->is_default && f->is_default(v))) continue;
            if (s->p.lenient_fields) {
                AG_LOGD("request field '%s' is not supported; ignored (--lenient-fields)", k);
                continue;
            }
            srv_error(out, 400, "invalid_request_error", k, "unsupported_parameter",
                      "Unsupported parameter: '%s' is not supported by this server (%s)", k, f->why);
            return false;
        }
        path p = {.key = {k}, .n = 1};
        if (!nul_walk(v, &p, text, anthropic, out)) return false;
    }
    return true;
}
