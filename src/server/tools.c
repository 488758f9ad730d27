/* Tool calls in model output: the Hermes/Qwen <tool_call> convention and
 * Llama 3.1's bare JSON objects, parsed back into OpenAI tool_calls. */
#include <stdint.h>
#include <string.h>

#include "server/server.h"
#include "server/reply.h"

static const char k_open[] = "<tool_call>";
static const char k_close[] = "</tool_call>";
static const char k_python_tag[] = "<|python_tag|>";

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static const char *find(const char *h, size_t hlen, const char *n) {
    size_t nlen = strlen(n);
    if (nlen > hlen) return NULL;
    for (size_t i = 0; i + nlen <= hlen; i++)
        if (!memcmp(h + i, n, nlen)) return h + i;
    return NULL;
}

ag_tool_format ag_server_tool_format(const char *src, size_t len) {
    if (!src) return AG_TOOLS_HERMES;
    if (find(src, len, "<tool_call>")) return AG_TOOLS_HERMES;
    if (find(src, len, "<|python_tag|>") || find(src, len, "\"parameters\": ") ||
        find(src, len, "<|start_header_id|>"))
        return AG_TOOLS_LLAMA3;
    return AG_TOOLS_GENERIC;
}

/* One call object {"name": str, "arguments"|"parameters": object|string}
 * into an OpenAI tool call; NULL when it is not one. */
static json_t *make_call(json_t *obj) {
    if (!json_is_object(obj)) return NULL;
    json_t *name = json_object_get(obj, "name");
    json_t *args = json_object_get(obj, "arguments");
    if (!args) args = json_object_get(obj, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0) return NULL;
    char *args_text = NULL;
    if (!args || json_is_null(args)) args_text = strdup("{}");
    else if (json_is_string(args)) args_text = strdup(json_string_value(args));
    else if (json_is_object(args)) args_text = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
    else return NULL;
    if (!args_text) return NULL;
    char id[40] = "call_";
    srv_random_id(id + 5, 24);
    json_t *fn = json_object();
    json_object_set_new(fn, "name", json_string(json_string_value(name)));
    json_object_set_new(fn, "arguments", json_string(args_text));
    free(args_text);
    json_t *call = json_object();
    json_object_set_new(call, "id", json_string(id));
    json_object_set_new(call, "type", json_string("function"));
    json_object_set_new(call, "function", fn);
    return call;
}

/* Parses exactly one JSON value from s[0..len) (whitespace around allowed). */
static json_t *parse_exact(const char *s, size_t len) {
    while (len && is_space(*s)) s++, len--;
    while (len && is_space(s[len - 1])) len--;
    if (!len) return NULL;
    json_error_t err;
    return json_loadb(s, len, 0, &err);
}

static void append_trimmed(ag_buf *out, const char *s, size_t len) {
    while (len && is_space(*s)) s++, len--;
    while (len && is_space(s[len - 1])) len--;
    if (!len) return;
    if (out->len) ag_buf_append_char(out, '\n');
    ag_buf_append(out, s, len);
}

static bool parse_hermes(const char *text, size_t len, json_t **calls_out, ag_buf *content) {
    const char *p = text, *end = text + len;
    const char *first = find(p, len, k_open);
    if (!first) return false;
    json_t *calls = json_array();
    ag_buf outside = {0};
    while (p < end) {
        const char *o = find(p, (size_t)(end - p), k_open);
        if (!o) {
            append_trimmed(&outside, p, (size_t)(end - p));
            break;
        }
        append_trimmed(&outside, p, (size_t)(o - p));
        const char *body = o + strlen(k_open);
        const char *c = find(body, (size_t)(end - body), k_close);
        /* A call cut off by the end of output (no closing tag) still counts
         * when its JSON is complete. */
        const char *body_end = c ? c : end;
        json_t *obj = parse_exact(body, (size_t)(body_end - body));
        json_t *call = make_call(obj);
        json_decref(obj);
        if (!call) {
            json_decref(calls);
            ag_buf_free(&outside);
            return false;
        }
        json_array_append_new(calls, call);
        p = c ? c + strlen(k_close) : end;
    }
    *calls_out = calls;
    ag_buf_append(content, outside.data ? outside.data : "", outside.len);
    ag_buf_free(&outside);
    return true;
}

/* Llama 3.1: the whole output is one or more JSON call objects, optionally
 * after <|python_tag|>, separated by ';' or whitespace. */
static bool parse_llama3(const char *text, size_t len, json_t **calls_out) {
    const char *p = text, *end = text + len;
    while (p < end && is_space(*p)) p++;
    size_t tag = strlen(k_python_tag);
    if ((size_t)(end - p) >= tag && !memcmp(p, k_python_tag, tag)) p += tag;
    json_t *calls = json_array();
    for (;;) {
        while (p < end && (is_space(*p) || *p == ';')) p++;
        if (p >= end) break;
        if (*p != '{') goto fail;
        json_error_t err;
        json_t *obj = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK, &err);
        if (!obj) goto fail;
        json_t *call = make_call(obj);
        json_decref(obj);
        if (!call) goto fail;
        json_array_append_new(calls, call);
        if (err.position <= 0) goto fail;
        p += err.position;
    }
    if (json_array_size(calls) == 0) goto fail;
    *calls_out = calls;
    return true;
fail:
    json_decref(calls);
    return false;
}

static bool names_known(json_t *calls, const json_t *tools) {
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        const char *name = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
        bool found = false;
        size_t k;
        json_t *t;
        json_array_foreach(tools, k, t) {
            const char *tn = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
            if (tn && name && !strcmp(tn, name)) found = true;
        }
        if (!found) return false;
    }
    return true;
}

bool ag_server_parse_tool_calls(ag_tool_format f, const char *text, size_t len, const json_t *tools, json_t **calls,
                                ag_buf *content) {
    *calls = NULL;
    if (!text || f == AG_TOOLS_HARMONY) return false;
    /* Tagged calls are unambiguous: the tags decide. */
    if (f != AG_TOOLS_LLAMA3 && find(text, len, k_open)) return parse_hermes(text, len, calls, content);
    /* A bare JSON object is Llama 3.1's convention, and small Hermes-style
     * models (Qwen2.5 0.5B) often drop the tags too. Plain JSON answers must
     * stay content, so a bare call only counts when it names a given tool
     * and is the whole output. */
    const char *body = text;
    size_t      blen = len;
    /* ... and often wrap it in a Markdown fence: ```json\n{...}\n``` */
    size_t i = 0;
    while (i < len && is_space(text[i])) i++;
    if (len - i >= 3 && !memcmp(text + i, "```", 3)) {
        const char *nl = memchr(text + i, '\n', len - i);
        const char *close = nl ? find(nl, (size_t)(text + len - nl), "```") : NULL;
        if (!close) return false;
        for (const char *q = close + 3; q < text + len; q++)
            if (!is_space(*q)) return false; /* more after the fence: an answer, not a call */
        body = nl, blen = (size_t)(close - nl);
    }
    if (!parse_llama3(body, blen, calls)) return false;
    if (tools && json_is_array(tools) && names_known(*calls, tools)) return true;
    json_decref(*calls);
    *calls = NULL;
    return false;
}

/* Longest suffix of s[0..len) that is a proper prefix of `tag`. */
static size_t partial_tag_suffix(const char *s, size_t len, const char *tag) {
    size_t tlen = strlen(tag);
    size_t max = len < tlen - 1 ? len : tlen - 1;
    for (size_t k = max; k > 0; k--)
        if (!memcmp(s + len - k, tag, k)) return k;
    return 0;
}

size_t ag_server_tool_safe_prefix(ag_tool_format f, const char *text, size_t len) {
    if (f == AG_TOOLS_HARMONY) return len; /* calls are never in the answer text */
    /* a bare call starts the output: hold everything while it could still
     * be one */
    size_t i = 0;
    while (i < len && is_space(text[i])) i++;
    if (i == len) return 0;
    size_t rest = len - i, tlen = strlen(k_python_tag);
    if (text[i] == '{') return 0;
    if (!memcmp(text + i, "```", rest < 3 ? rest : 3)) {
        /* a fence: held while its body could still be a bare call */
        const char *nl = memchr(text + i, '\n', rest);
        if (!nl) return 0;
        const char *b = nl;
        while (b < text + len && is_space(*b)) b++;
        if (b == text + len || *b == '{') return 0;
    }
    if (!memcmp(text + i, k_python_tag, rest < tlen ? rest : tlen)) return 0;
    if (f == AG_TOOLS_LLAMA3) return len;
    const char *o = find(text, len, k_open);
    if (o) return (size_t)(o - text);
    return len - partial_tag_suffix(text, len, k_open);
}
