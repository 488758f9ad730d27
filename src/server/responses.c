/* OpenAI's Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/{id}.
 *
 * As anthropic.c does for Anthropic's Messages, a request is translated
 * into what the chat route validates and renders: `instructions` becomes a
 * system message, `input` (a string or a list of items) becomes user,
 * assistant and tool messages (function_call items are an assistant turn's
 * tool_calls, function_call_output items tool messages), function tools and
 * tool_choice become the chat route's, `text.format` its response_format.
 * So a conversation gets the same prompt, and the same greedy text, through
 * either API.
 *
 * previous_response_id: every response made with `store` (the default) is
 * kept in memory with the conversation that led to it, its output included,
 * as chat messages; a request naming it continues that conversation
 * (instructions are not carried over, as OpenAI does). The store is bounded
 * by count, age and bytes (RESP_STORE_*): the oldest go first.
 *
 * Output items: `reasoning` (when the model thinks in tags, see
 * reasoning.c), then a `message` with one `output_text` part (omitted when
 * the answer is only tool calls), then one `function_call` per call.
 * Streaming sends OpenAI's event sequence with sequence numbers:
 * response.created, response.in_progress, per item output_item.added, its
 * content (content_part.added, output_text.delta / reasoning_text.delta,
 * output_text.done / reasoning_text.done, content_part.done, or
 * function_call_arguments.delta and .done), output_item.done, then
 * response.completed (response.incomplete when max_output_tokens cut it).
 * A failure mid-stream is an `error` event followed by response.failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/responses.h"
#include "server/fields.h"
#include "server/gen.h"
#include "server/job.h"
#include "server/messages.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/server_impl.h"

/* The in-memory store's bounds. */
#define RESP_STORE_MAX   1024               /* responses */
#define RESP_STORE_TTL_S (6 * 3600)         /* seconds */
#define RESP_STORE_BYTES ((size_t)64 << 20) /* of serialized responses and conversations */

#define BAD(out, param, ...) srv_error(out, 400, "invalid_request_error", param, "invalid_value", __VA_ARGS__)

/* ---- the store ---- */

struct srv_stored {
    struct srv_stored *next; /* newer */
    char               id[48];
    time_t             created;
    json_t            *response;     /* the Response object as returned */
    json_t            *conversation; /* chat messages up to and including the output (no instructions) */
    size_t             bytes;
};

static size_t json_bytes(const json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t n = t ? strlen(t) : 0;
    free(t);
    return n;
}

static void stored_free(srv_stored *e) {
    if (!e) return;
    json_decref(e->response);
    json_decref(e->conversation);
    free(e);
}

/* Drops expired entries and the oldest beyond the bounds. Under resp_mu. */
static void store_trim(ag_server *s, size_t room_bytes) {
    time_t now = time(NULL);
    while (s->resp_oldest && (s->resp_count >= RESP_STORE_MAX || s->resp_bytes + room_bytes > RESP_STORE_BYTES ||
                              now - s->resp_oldest->created > RESP_STORE_TTL_S)) {
        srv_stored *e = s->resp_oldest;
        s->resp_oldest = e->next;
        if (!s->resp_oldest) s->resp_newest = NULL;
        s->resp_count--;
        s->resp_bytes -= e->bytes;
        stored_free(e);
    }
}

/* Takes both references. An entry larger than the whole budget is not kept. */
static void store_put(ag_server *s, const char *id, json_t *response, json_t *conversation) {
    srv_stored *e = calloc(1, sizeof *e);
    if (!e) {
        json_decref(response);
        json_decref(conversation);
        return;
    }
    snprintf(e->id, sizeof e->id, "%s", id);
    e->created = time(NULL);
    e->response = response;
    e->conversation = conversation;
    e->bytes = json_bytes(response) + json_bytes(conversation) + sizeof *e;
    if (e->bytes > RESP_STORE_BYTES) {
        stored_free(e);
        return;
    }
    pthread_mutex_lock(&s->resp_mu);
    store_trim(s, e->bytes);
    if (s->resp_newest) s->resp_newest->next = e;
    else s->resp_oldest = e;
    s->resp_newest = e;
    s->resp_count++;
    s->resp_bytes += e->bytes;
    pthread_mutex_unlock(&s->resp_mu);
}

/* A stored response's object and conversation (new references; either may
 * be NULL), or false when none is stored under `id`. */
static bool store_get(ag_server *s, const char *id, json_t **response, json_t **conversation) {
    bool found = false;
    pthread_mutex_lock(&s->resp_mu);
    store_trim(s, 0);
    for (srv_stored *e = s->resp_oldest; e; e = e->next)
        if (!strcmp(e->id, id)) {
            if (response) *response = json_deep_copy(e->response);
            if (conversation) *conversation = json_deep_copy(e->conversation);
            found = true;
            break;
        }
    pthread_mutex_unlock(&s->resp_mu);
    return found;
}

static bool store_delete(ag_server *s, const char *id) {
    bool found = false;
    pthread_mutex_lock(&s->resp_mu);
    srv_stored *prev = NULL;
    for (srv_stored *e = s->resp_oldest; e; prev = e, e = e->next)
        if (!strcmp(e->id, id)) {
            if (prev) prev->next = e->next;
            else s->resp_oldest = e->next;
            if (s->resp_newest == e) s->resp_newest = prev;
            s->resp_count--;
            s->resp_bytes -= e->bytes;
            stored_free(e);
            found = true;
            break;
        }
    pthread_mutex_unlock(&s->resp_mu);
    return found;
}

void srv_responses_init(ag_server *s) { pthread_mutex_init(&s->resp_mu, NULL); }

void srv_responses_free(ag_server *s) {
    for (srv_stored *e = s->resp_oldest, *n; e; e = n) {
        n = e->next;
        stored_free(e);
    }
    s->resp_oldest = s->resp_newest = NULL;
    pthread_mutex_destroy(&s->resp_mu);
}

/* ---- request: items into chat messages ---- */

/* Text of a message's content: a string, or a list of input_text /
 * output_text (/ refusal) parts, into chat text parts (a new reference), or
 * NULL with a 400 naming `param`. */
static json_t *content_parts(json_t *content, const char *param, srv_resp *out) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        BAD(out, param, "'%s' must be a string or a list of content parts, got %s", param, srv_type_name(content));
        return NULL;
    }
    json_t *parts = json_array();
    size_t i;
    json_t *p;
    json_array_foreach(content, i, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !type) {
            BAD(out, param, "'%s[%zu]' must be a content part object with a 'type'", param, i);
            goto fail;
        }
        const char *key = !strcmp(type, "refusal") ? "refusal" : "text";
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "refusal")) {
            if (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio"))
                srv_error(out, 400, "invalid_request_error", param, "unsupported_value",
                          "'%s[%zu]': %s parts are not supported: this model reads text only", param, i, type);
            else BAD(out, param, "'%s[%zu]': content part type '%s' is not supported", param, i, type);
            goto fail;
        }
        json_t *text = json_object_get(p, key);
        if (!json_is_string(text)) {
            BAD(out, param, "'%s[%zu].%s' must be a string, got %s", param, i, key, srv_type_name(text));
            goto fail;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* A function_call_output's output: a string, or a list of input_text parts. */
static json_t *call_output(json_t *output, const char *param, srv_resp *out) {
    if (json_is_string(output)) return json_incref(output);
    if (json_is_array(output)) return content_parts(output, param, out);
    BAD(out, param, "'%s' must be a string or a list of input_text parts, got %s", param, srv_type_name(output));
    return NULL;
}

/* The text of a reasoning item (its reasoning_text parts, else its
 * summary), appended to `b` after a line break when b has text. */
static void reasoning_text(json_t *item, ag_buf *b) {
    json_t *parts = json_object_get(item, "content");
    if (!json_array_size(parts)) parts = json_object_get(item, "summary");
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) {
        json_t *t = json_object_get(p, "text");
        if (!json_is_string(t)) continue;
        if (b->len) ag_buf_append_char(b, '\n');
        ag_buf_append(b, json_string_value(t), json_string_length(t));
    }
}

/* Appends the items of `input` (a string or a list of items) to `msgs` as
 * chat messages. False with a 400 naming input[i]. */
static bool convert_input(json_t *input, json_t *msgs, srv_resp *out) {
    if (!input || json_is_null(input)) {
        srv_error(out, 400, "invalid_request_error", "input", "missing_required_parameter", "'input' is required");
        return false;
    }
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", input));
        return true;
    }
    if (!json_is_array(input) || !json_array_size(input)) {
        BAD(out, "input", "'input' must be a string or a non-empty list of items, got %s",
            json_is_array(input) ? "an empty list" : srv_type_name(input));
        return false;
    }
    json_t *calls_to = NULL; /* the assistant message that function_call items join (borrowed) */
    ag_buf reasoning = {0};  /* reasoning items' text, for the assistant message that follows */
    bool ok = false;
    size_t i;
    json_t *it;
    json_array_foreach(input, i, it) {
        char param[48];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!json_is_object(it)) {
            BAD(out, param, "'%s' must be an object, got %s", param, srv_type_name(it));
            goto done;
        }
        const char *type = json_string_value(json_object_get(it, "type"));
        json_t *role = json_object_get(it, "role");
        if (!type && role) type = "message"; /* an easy input message */
        if (!type) {
            BAD(out, param, "'%s' needs a 'type' (or a 'role' for a message)", param);
            goto done;
        }
        if (!strcmp(type, "message")) {
            const char *r = json_string_value(role);
            if (!r || (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))) {
                char rp[64];
                snprintf(rp, sizeof rp, "%s.role", param);
                BAD(out, rp, "'%s' must be one of user, assistant, system, developer", rp);
                goto done;
            }
            char cp[64];
            snprintf(cp, sizeof cp, "%s.content", param);
            json_t *parts = content_parts(json_object_get(it, "content"), cp, out);
            if (!parts) goto done;
            json_t *m = json_pack("{s:s, s:o}", "role", r, "content", parts);
            if (!strcmp(r, "assistant") && reasoning.len) {
                json_object_set_new(m, "reasoning_content", srv_jstr(reasoning.data, reasoning.len));
                ag_buf_clear(&reasoning);
            }
            json_array_append_new(msgs, m);
            calls_to = !strcmp(r, "assistant") ? m : NULL;
        } else if (!strcmp(type, "function_call")) {
            json_t *call_id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
            json_t *args = json_object_get(it, "arguments");
            if (!json_is_string(call_id) || !json_is_string(name) || !json_string_length(name) ||
                !json_is_string(args)) {
                BAD(out, param, "'%s': a function_call item needs 'call_id', 'name' and 'arguments' (strings)", param);
                goto done;
            }
            if (!calls_to) {
                calls_to = json_pack("{s:s, s:n}", "role", "assistant", "content");
                if (reasoning.len) {
                    json_object_set_new(calls_to, "reasoning_content", srv_jstr(reasoning.data, reasoning.len));
                    ag_buf_clear(&reasoning);
                }
                json_array_append_new(msgs, calls_to);
            }
            json_t *tc = json_object_get(calls_to, "tool_calls");
            if (!tc) json_object_set_new(calls_to, "tool_calls", tc = json_array());
            json_array_append_new(tc, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                                                "function", "name", name, "arguments", args));
        } else if (!strcmp(type, "function_call_output")) {
            json_t *call_id = json_object_get(it, "call_id");
            if (!json_is_string(call_id)) {
                BAD(out, param, "'%s.call_id' must be a string, got %s", param, srv_type_name(call_id));
                goto done;
            }
            char op[64];
            snprintf(op, sizeof op, "%s.output", param);
            json_t *text = call_output(json_object_get(it, "output"), op, out);
            if (!text) goto done;
            json_array_append_new(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", call_id,
                                                  "content", text));
            calls_to = NULL;
        } else if (!strcmp(type, "reasoning")) {
            /* earlier reasoning: the next assistant message's
             * reasoning_content (the template decides whether the model
             * sees it again; most drop past turns') */
            reasoning_text(it, &reasoning);
        } else {
            srv_error(out, 400, "invalid_request_error", param, "unsupported_value",
                      "'%s': input item type '%s' is not supported (message, function_call, function_call_output, "
                      "reasoning)",
                      param, type);
            goto done;
        }
    }
    ok = true;
done:
    ag_buf_free(&reasoning);
    return ok;
}

/* Responses tools and tool_choice into the chat body srv_parse_tools reads
 * ({"tools", "tool_choice"}; a new reference), or NULL with a 400. */
static json_t *convert_tools(json_t *tools, json_t *choice, srv_resp *out) {
    json_t *res = json_object();
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            BAD(out, "tools", "'tools' must be a list, got %s", srv_type_name(tools));
            goto fail;
        }
        json_t *conv = json_array();
        json_object_set_new(res, "tools", conv);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char param[32];
            snprintf(param, sizeof param, "tools[%zu]", i);
            const char *type = json_string_value(json_object_get(t, "type"));
            json_t *name = json_object_get(t, "name"), *desc = json_object_get(t, "description");
            json_t *params = json_object_get(t, "parameters");
            if (type && strcmp(type, "function")) {
                srv_error(out, 400, "invalid_request_error", param, "unsupported_value",
                          "'%s': tool type '%s' is not supported (only function tools)", param, type);
                goto fail;
            }
            if (!json_is_object(t) || !type || !json_is_string(name) || !json_string_length(name) ||
                (desc && !json_is_null(desc) && !json_is_string(desc)) ||
                (params && !json_is_null(params) && !json_is_object(params))) {
                BAD(out, param,
                    "'%s' must be {\"type\": \"function\", \"name\": string, \"description\": string, "
                    "\"parameters\": object, \"strict\": boolean}",
                    param);
                goto fail;
            }
            json_t *fn = json_pack("{s:O}", "name", name);
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            if (json_is_object(params)) json_object_set(fn, "parameters", params);
            json_array_append_new(conv, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }
    if (choice && !json_is_null(choice)) {
        if (json_is_string(choice)) {
            json_object_set(res, "tool_choice", choice);
        } else {
            const char *type = json_string_value(json_object_get(choice, "type"));
            json_t *name = json_object_get(choice, "name");
            if (!json_is_object(choice) || !type || strcmp(type, "function") || !json_is_string(name)) {
                srv_error(out, 400, "invalid_request_error", "tool_choice", "unsupported_value",
                          "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"name\": string}%s",
                          type && strcmp(type, "function") ? " (hosted tools and allowed_tools are not supported)"
                                                           : "");
                goto fail;
            }
            json_object_set_new(res, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function",
                                                              "name", name));
        }
    }
    return res;
fail:
    json_decref(res);
    return NULL;
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", "name",
 * "schema", "strict", "description"}, "verbosity"}. */
static bool parse_text(json_t *text, srv_opts *o, srv_resp *out) {
    if (!text || json_is_null(text)) return true;
    if (!json_is_object(text)) {
        BAD(out, "text", "'text' must be an object, got %s", srv_type_name(text));
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(text, k, v) {
        if (!strcmp(k, "format")) continue;
        if (!strcmp(k, "verbosity")) {
            if (json_is_null(v)) continue;
            srv_error(out, 400, "invalid_request_error", "text.verbosity", "unsupported_parameter",
                      "'text.verbosity' is not supported by this server (answers cannot be made shorter or longer "
                      "here; use max_output_tokens)");
            return false;
        }
        srv_error(out, 400, "invalid_request_error", "text", "unknown_parameter",
                  "Unrecognized request argument supplied: text.%s", k);
        return false;
    }
    json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f)) return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!json_is_object(f) || !type) {
        BAD(out, "text.format", "'text.format' must be an object with a 'type'");
        return false;
    }
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) {
        json_t *obj = json_pack("{s:s}", "type", "object");
        bool ok = srv_output_schema(obj, "text.format", o, out);
        json_decref(obj);
        return ok;
    }
    if (strcmp(type, "json_schema")) {
        srv_error(out, 400, "invalid_request_error", "text.format.type", "unsupported_value",
                  "text.format type '%s' is not supported (\"text\", \"json_object\" or \"json_schema\")", type);
        return false;
    }
    json_t *name = json_object_get(f, "name"), *schema = json_object_get(f, "schema");
    json_t *strict = json_object_get(f, "strict"), *desc = json_object_get(f, "description");
    if (!json_is_string(name) || !json_string_length(name) || (strict && !json_is_null(strict) && !json_is_boolean(strict)) ||
        (desc && !json_is_null(desc) && !json_is_string(desc))) {
        BAD(out, "text.format", "'text.format' must be {\"type\": \"json_schema\", \"name\": string, \"schema\": "
                                "object, \"strict\": boolean, \"description\": string}");
        return false;
    }
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        srv_error(out, 400, "invalid_request_error", "text.format.schema", "invalid_type",
                  "'text.format.schema' must be an object, got %s", srv_type_name(schema));
        return false;
    }
    return srv_output_schema(schema, "text.format.schema", o, out);
}

/* A field that must be null (or absent) or one of the values augur does
 * anyway; otherwise a 400 saying why. */
static bool only_default(json_t *b, const char *key, bool (*ok)(const json_t *), const char *why, srv_resp *out) {
    json_t *v = json_object_get(b, key);
    if (!v || json_is_null(v) || (ok && ok(v))) return true;
    srv_error(out, 400, "invalid_request_error", key, "unsupported_parameter",
              "Unsupported parameter: '%s' is not supported by this server (%s)", key, why);
    return false;
}
static bool is_false(const json_t *v) { return json_is_false(v); }
static bool is_disabled(const json_t *v) { return json_is_string(v) && !strcmp(json_string_value(v), "disabled"); }
static bool is_zero(const json_t *v) { return json_is_integer(v) && json_integer_value(v) == 0; }
/* include: nothing, or reasoning.encrypted_content (there is none to send:
 * reasoning comes back as plain reasoning_text) */
static bool include_ok(const json_t *v) {
    if (!json_is_array(v)) return false;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) if (!json_is_string(x) || strcmp(json_string_value(x), "reasoning.encrypted_content"))
        return false;
    return true;
}
/* reasoning: nothing asked of it ({} or nulls) but its effort (read apart) */
static bool reasoning_default(const json_t *v) {
    if (!json_is_object(v)) return false;
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) if (!json_is_null(x) && strcmp(k, "effort")) return false;
    return true;
}

/* ---- the request's echo and the protocol state ---- */

typedef struct {
    json_t *echo;         /* the Response object's request fields (instructions, tools, text, ...) */
    json_t *conversation; /* chat messages so far, without instructions (for the store) */
    bool    store;
    bool    thinks;       /* reasoning items are possible */
    /* streaming */
    int     seq;
    int     n_items;      /* output items started */
    int     open;         /* 0 none, 1 a reasoning item, 2 a message item */
    bool    had_message;  /* a message item was opened */
    char    item_id[48];
    ag_buf  item_text;    /* the open item's text so far */
    json_t *output;       /* finished output items */
} resp_state;

static void state_free(void *p) {
    resp_state *rs = p;
    if (!rs) return;
    json_decref(rs->echo);
    json_decref(rs->conversation);
    json_decref(rs->output);
    ag_buf_free(&rs->item_text);
    free(rs);
}

static void item_id(char *out, size_t cap, const char *prefix) {
    char rnd[25];
    srv_random_id(rnd, 24);
    snprintf(out, cap, "%s%s", prefix, rnd);
}

static json_t *usage_json(srv_job *j) {
    int prompt, cached, generated;
    srv_gen_usage(j->gen, &prompt, &cached, &generated);
    return json_pack("{s:i, s:{s:i, s:i}, s:i, s:{s:i}, s:i}", "input_tokens", prompt, "input_tokens_details",
                     "cached_tokens", cached, "cache_write_tokens", 0, "output_tokens", generated, "output_tokens_details",
                     "reasoning_tokens", j->ch[0].reasoning_tokens, "total_tokens", prompt + generated);
}

/* The Response object: status "in_progress", "completed", "incomplete" or
 * "failed"; output stolen (NULL: []); usage only once done. */
static json_t *response_json(srv_job *j, const char *status, json_t *output, bool with_usage) {
    resp_state *rs = j->proto_state;
    json_t *r = json_object();
    json_object_set_new(r, "id", json_string(j->id));
    json_object_set_new(r, "object", json_string("response"));
    json_object_set_new(r, "created_at", json_integer((json_int_t)j->created));
    json_object_set_new(r, "status", json_string(status));
    json_object_set_new(r, "background", json_false());
    json_object_set_new(r, "error", json_null());
    json_object_set_new(r, "incomplete_details",
                        !strcmp(status, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                      : json_null());
    json_object_set_new(r, "model", json_string(j->s->model_id));
    json_object_set_new(r, "output", output ? output : json_array());
    json_object_update(r, rs->echo);
    if (strcmp(status, "in_progress")) json_object_set_new(r, "completed_at", json_integer((json_int_t)time(NULL)));
    json_object_set_new(r, "usage", with_usage ? usage_json(j) : json_null());
    return r;
}

static json_t *message_item(const char *id, const char *status, const char *text, size_t len) {
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s, s:[], s:[], s:o}", "type", "output_text", "annotations",
                                                 "logprobs", "text", srv_jstr(text, len)));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role",
                     "assistant", "content", content);
}

static json_t *reasoning_item(const char *id, const char *status, const char *text, size_t len) {
    json_t *content = json_array();
    if (text) json_array_append_new(content, json_pack("{s:s, s:o}", "type", "reasoning_text", "text", srv_jstr(text, len)));
    return json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", id, "type", "reasoning", "summary", "content", content,
                     "status", status);
}

/* A chat tool call ({"id", "function": {"name", "arguments"}}) as a
 * function_call item. */
static json_t *call_item(json_t *call, const char *status) {
    char id[48];
    item_id(id, sizeof id, "fc_");
    json_t *fn = json_object_get(call, "function");
    return json_pack("{s:s, s:s, s:s, s:O, s:O, s:O}", "id", id, "type", "function_call", "status", status,
                     "call_id", json_object_get(call, "id"), "name", json_object_get(fn, "name"), "arguments",
                     json_object_get(fn, "arguments"));
}

/* What the finished output adds to the conversation: one assistant
 * message with its text and tool calls. */
static json_t *output_message(json_t *output) {
    ag_buf text = {0}, reasoning = {0};
    json_t *calls = json_array();
    size_t i;
    json_t *it;
    json_array_foreach(output, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        if (!strcmp(type, "reasoning")) {
            reasoning_text(it, &reasoning);
        } else if (!strcmp(type, "message")) {
            json_t *part = json_array_get(json_object_get(it, "content"), 0);
            json_t *t = json_object_get(part, "text");
            ag_buf_append(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "function_call")) {
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", json_object_get(it, "call_id"),
                                                   "type", "function", "function", "name",
                                                   json_object_get(it, "name"), "arguments",
                                                   json_object_get(it, "arguments")));
        }
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          json_array_size(calls) && !text.len ? json_null() : srv_jstr(text.data, text.len));
    if (json_array_size(calls)) json_object_set_new(m, "tool_calls", calls);
    else json_decref(calls);
    if (reasoning.len) json_object_set_new(m, "reasoning_content", srv_jstr(reasoning.data, reasoning.len));
    ag_buf_free(&text);
    ag_buf_free(&reasoning);
    return m;
}

/* Stores a finished response (with `store`) with the conversation it ends. */
static void remember(srv_job *j, json_t *response) {
    resp_state *rs = j->proto_state;
    if (!rs->store) return;
    json_t *conv = json_deep_copy(rs->conversation);
    json_array_append_new(conv, output_message(json_object_get(response, "output")));
    store_put(j->s, j->id, json_incref(response), conv);
}

static const char *final_status(const srv_choice *c) {
    return c->finish == AG_FINISH_LENGTH ? "incomplete" : "completed";
}

/* ---- non-streaming ---- */

static void respond(srv_job *j, srv_resp *out) {
    if (!srv_job_choices_ok(j, out)) return;
    srv_choice *c = &j->ch[0];
    srv_choice_scan(j, c, true);
    json_t *output = json_array();
    const char *status = final_status(c);
    const char *item_status = c->finish == AG_FINISH_LENGTH ? "incomplete" : "completed";
    const char *rtext, *atext;
    size_t rlen = srv_choice_reasoning(c, &rtext), alen = srv_choice_answer(c, &atext);
    char id[48];
    if ((c->think_on && (rlen || c->think.phase != AG_THINK_NONE)) || (c->harmony_on && rlen)) {
        item_id(id, sizeof id, "rs_");
        if (rlen) json_array_append_new(output, reasoning_item(id, item_status, rtext, rlen));
    }
    json_t *calls = NULL;
    ag_buf rest = {0};
    bool has_calls = srv_choice_tool_calls(j, c, &calls, &rest);
    if (has_calls) {
        atext = rest.data ? rest.data : "";
        alen = rest.len;
    }
    if (alen || !has_calls) {
        item_id(id, sizeof id, "msg_");
        json_array_append_new(output, message_item(id, item_status, atext, alen));
    }
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) json_array_append_new(output, call_item(call, "completed"));
    json_decref(calls);
    ag_buf_free(&rest);
    json_t *r = response_json(j, status, output, true);
    remember(j, r);
    srv_json(out, 200, r);
}

/* ---- streaming ---- */

/* One event: its type and data (stolen), with the next sequence number. */
static void emit(srv_job *j, const char *type, json_t *data) {
    resp_state *rs = j->proto_state;
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer(rs->seq++));
    srv_job_sse(j, type, data);
}

static void emit_item(srv_job *j, const char *type, json_t *item) {
    resp_state *rs = j->proto_state;
    emit(j, type, json_pack("{s:i, s:o}", "output_index", rs->n_items - 1, "item", item));
}

/* Parts of the open item: `kind` "output_text" or "reasoning_text". */
static json_t *part(const char *kind, const char *text, size_t len) {
    json_t *p = json_pack("{s:s, s:o}", "type", kind, "text", srv_jstr(text, len));
    if (!strcmp(kind, "output_text")) {
        json_object_set_new(p, "annotations", json_array());
        json_object_set_new(p, "logprobs", json_array());
    }
    return p;
}

/* Opens a reasoning (1) or message (2) item with its one content part. */
static void open_item(srv_job *j, int kind) {
    resp_state *rs = j->proto_state;
    rs->open = kind;
    rs->had_message |= kind == 2;
    rs->n_items++;
    ag_buf_clear(&rs->item_text);
    item_id(rs->item_id, sizeof rs->item_id, kind == 1 ? "rs_" : "msg_");
    emit_item(j, "response.output_item.added", kind == 1 ? reasoning_item(rs->item_id, "in_progress", NULL, 0)
                                                         : message_item(rs->item_id, "in_progress", NULL, 0));
    emit(j, "response.content_part.added",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs->item_id, "output_index", rs->n_items - 1, "content_index",
                   0, "part", part(kind == 1 ? "reasoning_text" : "output_text", "", 0)));
}

static void item_delta(srv_job *j, const char *text, size_t len) {
    resp_state *rs = j->proto_state;
    ag_buf_append(&rs->item_text, text, len);
    json_t *d = json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs->item_id, "output_index", rs->n_items - 1,
                          "content_index", 0, "delta", srv_jstr(text, len));
    if (rs->open == 2) json_object_set_new(d, "logprobs", json_array());
    emit(j, rs->open == 1 ? "response.reasoning_text.delta" : "response.output_text.delta", d);
}

static void close_item(srv_job *j, const char *status) {
    resp_state *rs = j->proto_state;
    if (!rs->open) return;
    const char *kind = rs->open == 1 ? "reasoning_text" : "output_text";
    const char *text = rs->item_text.data ? rs->item_text.data : "";
    size_t len = rs->item_text.len;
    json_t *d = json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs->item_id, "output_index", rs->n_items - 1,
                          "content_index", 0, "text", srv_jstr(text, len));
    if (rs->open == 2) json_object_set_new(d, "logprobs", json_array());
    emit(j, rs->open == 1 ? "response.reasoning_text.done" : "response.output_text.done", d);
    emit(j, "response.content_part.done",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", rs->item_id, "output_index", rs->n_items - 1, "content_index",
                   0, "part", part(kind, text, len)));
    json_t *item = rs->open == 1 ? reasoning_item(rs->item_id, status, text, len)
                                 : message_item(rs->item_id, status, text, len);
    json_array_append(rs->output, item);
    emit_item(j, "response.output_item.done", item);
    rs->open = 0;
}

static void stream_start(srv_job *j) {
    emit(j, "response.created", json_pack("{s:o}", "response", response_json(j, "in_progress", NULL, false)));
    emit(j, "response.in_progress", json_pack("{s:o}", "response", response_json(j, "in_progress", NULL, false)));
}

static void stream_failed(srv_job *j, const char *code, const char *msg) {
    resp_state *rs = j->proto_state;
    emit(j, "error", json_pack("{s:s, s:o, s:n}", "code", code, "message", srv_jstr(msg, strlen(msg)), "param"));
    json_t *r = response_json(j, "failed", json_incref(rs->output), false);
    json_object_set_new(r, "error", json_pack("{s:s, s:o}", "code", code, "message", srv_jstr(msg, strlen(msg))));
    emit(j, "response.failed", json_pack("{s:o}", "response", r));
    j->ended = true;
}

static void stream_event(srv_job *j, srv_event *e) {
    resp_state *rs = j->proto_state;
    if (j->ended || e->choice != 0 || e->prompt_pos > 0) return;
    srv_choice *c = &j->ch[0];
    if (c->done) return;
    srv_choice_add(j, c, e);
    if (e->finish == AG_FINISH_ERROR || e->finish == AG_FINISH_CANCELLED) {
        c->done = true;
        if (e->finish == AG_FINISH_ERROR) stream_failed(j, "server_error", e->error ? e->error : "generation failed");
        else stream_failed(j, "shutting_down", "the request was cancelled: the server is shutting down");
        return;
    }
    bool final = e->finish != AG_FINISH_NONE;
    const char *fresh;
    size_t n = srv_stream_reasoning(c, &fresh);
    if (n) {
        if (rs->open != 1) {
            close_item(j, "completed");
            open_item(j, 1);
        }
        item_delta(j, fresh, n);
    }
    json_t *calls = NULL;
    if (final) {
        c->done = true;
        c->finish = e->finish;
        ag_buf rest = {0};
        srv_choice_tool_calls(j, c, &calls, &rest);
        ag_buf_free(&rest);
    }
    n = srv_stream_fresh(j, c, final && !calls, &fresh);
    if (n) {
        if (rs->open != 2) {
            close_item(j, "completed");
            open_item(j, 2);
        }
        item_delta(j, fresh, n);
    }
    if (!final) return;
    const char *status = c->finish == AG_FINISH_LENGTH ? "incomplete" : "completed";
    /* a response without a tool call always has a message, if empty */
    if (!calls && !rs->had_message && rs->open != 2) {
        close_item(j, "completed");
        open_item(j, 2);
    }
    close_item(j, status);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *item = call_item(call, "in_progress");
        json_t *args = json_object_get(item, "arguments");
        const char *iid = json_string_value(json_object_get(item, "id"));
        json_t *empty = json_deep_copy(item);
        json_object_set_new(empty, "arguments", json_string(""));
        rs->n_items++;
        emit_item(j, "response.output_item.added", empty);
        emit(j, "response.function_call_arguments.delta",
             json_pack("{s:s, s:i, s:O}", "item_id", iid, "output_index", rs->n_items - 1, "delta", args));
        emit(j, "response.function_call_arguments.done",
             json_pack("{s:s, s:i, s:O, s:O}", "item_id", iid, "output_index", rs->n_items - 1, "name",
                       json_object_get(item, "name"), "arguments", args));
        json_object_set_new(item, "status", json_string("completed"));
        json_array_append(rs->output, item);
        emit_item(j, "response.output_item.done", item);
    }
    json_decref(calls);
}

static void stream_end(srv_job *j) {
    resp_state *rs = j->proto_state;
    const char *status = final_status(&j->ch[0]);
    json_t *r = response_json(j, status, json_incref(rs->output), true);
    remember(j, r);
    emit(j, !strcmp(status, "completed") ? "response.completed" : "response.incomplete", json_pack("{s:o}", "response", r));
}

static const srv_protocol k_responses_proto = {.id_prefix = "resp_", .stream_start = stream_start,
                                               .stream_event = stream_event, .stream_end = stream_end,
                                               .respond = respond, .state_free = state_free};

/* ---- routes ---- */

void srv_route_responses(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    srv_opts o;
    srv_opts_init(&o);
    json_t *tool_body = NULL, *tools = NULL, *msgs = NULL, *chat = NULL, *conv = NULL, *echo = NULL, *vars = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    resp_state *rs = NULL;
    srv_job *j = NULL;
    if (!srv_check_fields(s, b, SRV_ROUTE_RESPONSES, out)) goto done;
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        BAD(out, "model", "'model' must be a string, got %s", srv_type_name(model));
        goto done;
    }
    if (!only_default(b, "background", is_false, "responses are answered in the foreground", out) ||
        !only_default(b, "conversation", NULL, "conversations are not stored; use previous_response_id", out) ||
        !only_default(b, "prompt", NULL, "there are no stored prompts here", out) ||
        !only_default(b, "max_tool_calls", NULL, "tool calls cannot be capped here", out) ||
        !only_default(b, "truncation", is_disabled, "input is never truncated: a long one is a 400", out) ||
        !only_default(b, "top_logprobs", is_zero, "logprobs are not produced on this route", out) ||
        !only_default(b, "include", include_ok, "only \"reasoning.encrypted_content\" (a no-op) may be included", out) ||
        !only_default(b, "reasoning", reasoning_default, "the model's reasoning cannot be steered or summarised", out))
        goto done;
    long long n = 0;
    bool present = false;
    if (!srv_get_int(b, "max_output_tokens", 1, 1 << 24, &n, &present, out)) goto done;
    if (present) o.max_tokens = (int)n;
    if (!srv_parse_sampling(b, 2.0, &o, out) || !srv_parse_extensions(s, b, &o, out)) goto done;
    if (!srv_get_bool(b, "stream", &o.stream, out)) goto done;
    bool store = true, parallel = true;
    if (!srv_get_bool(b, "store", &store, out) || !srv_get_bool(b, "parallel_tool_calls", &parallel, out)) goto done;
    o.one_tool_call = !parallel;
    json_t *instructions = json_object_get(b, "instructions");
    if (instructions && !json_is_null(instructions) && !json_is_string(instructions)) {
        BAD(out, "instructions", "'instructions' must be a string, got %s", srv_type_name(instructions));
        goto done;
    }
    json_t *metadata = json_object_get(b, "metadata");
    if (metadata && !json_is_null(metadata) && !json_is_object(metadata)) {
        BAD(out, "metadata", "'metadata' must be an object of strings, got %s", srv_type_name(metadata));
        goto done;
    }
    if (!parse_text(json_object_get(b, "text"), &o, out)) goto done;

    /* the conversation: a stored one continued, then this input */
    json_t *prev = json_object_get(b, "previous_response_id");
    if (prev && !json_is_null(prev)) {
        if (!json_is_string(prev)) {
            BAD(out, "previous_response_id", "'previous_response_id' must be a string, got %s", srv_type_name(prev));
            goto done;
        }
        if (!store_get(s, json_string_value(prev), NULL, &conv)) {
            srv_error(out, 404, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                      "Previous response with id '%s' not found (responses are kept in memory for %d hours, at most "
                      "%d of them, and only with 'store')",
                      json_string_value(prev), RESP_STORE_TTL_S / 3600, RESP_STORE_MAX);
            goto done;
        }
    } else {
        conv = json_array();
    }
    if (!convert_input(json_object_get(b, "input"), conv, out)) goto done;
    chat = json_array();
    if (json_is_string(instructions))
        json_array_append_new(chat, json_pack("{s:s, s:O}", "role", "system", "content", instructions));
    json_array_extend(chat, conv);

    if (!(tool_body = convert_tools(json_object_get(b, "tools"), json_object_get(b, "tool_choice"), out))) goto done;
    bool failed, forced;
    tools = srv_parse_tools(tool_body, out, &failed, &forced);
    if (failed) goto done;
    if (!(msgs = srv_build_messages(s, chat, tools, out))) goto done;
    bool opened = false;
    json_t *effort = json_object_get(json_object_get(b, "reasoning"), "effort");
    vars = srv_reasoning_effort(s, effort, s->harmony ? "reasoning.effort" : "reasoning", &failed, out);
    if (failed) goto done;
    if (!srv_chat_prompt(s, msgs, tools, vars, NULL, 0, "input", &ids, &n_ids, &opened, out)) goto done;

    /* what the Response object repeats of the request */
    echo = json_object();
    json_object_set(echo, "instructions", instructions ? instructions : json_null());
    json_object_set_new(echo, "max_output_tokens", present ? json_integer(n) : json_null());
    json_object_set_new(echo, "metadata", json_is_object(metadata) ? json_incref(metadata) : json_object());
    json_object_set_new(echo, "parallel_tool_calls", json_boolean(parallel));
    json_object_set(echo, "previous_response_id", prev ? prev : json_null());
    json_object_set_new(echo, "reasoning", json_pack("{s:O?, s:n}", "effort", vars ? effort : NULL, "summary"));
    json_object_set_new(echo, "store", json_boolean(store));
    json_object_set_new(echo, "temperature", json_real(o.sp.temperature));
    json_t *fmt = json_object_get(json_object_get(b, "text"), "format");
    json_t *format = json_is_object(fmt) ? json_incref(fmt) : json_pack("{s:s}", "type", "text");
    json_object_set_new(echo, "text", json_pack("{s:o}", "format", format));
    json_t *tc = json_object_get(b, "tool_choice");
    json_object_set_new(echo, "tool_choice", tc && !json_is_null(tc) ? json_incref(tc) : json_string("auto"));
    json_t *tl = json_object_get(b, "tools");
    json_object_set_new(echo, "tools", json_is_array(tl) ? json_incref(tl) : json_array());
    json_object_set_new(echo, "top_p", json_real(o.sp.top_p));
    json_object_set_new(echo, "truncation", json_string("disabled"));
    json_object_set_new(echo, "user", json_null());

    j = srv_job_new(rq, &k_responses_proto, &o, 1);
    rs = calloc(1, sizeof *rs);
    if (!j || !rs) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    rs->echo = echo;
    rs->conversation = conv;
    rs->output = json_array();
    rs->store = store;
    echo = conv = NULL;
    j->proto_state = rs;
    rs = NULL;
    srv_job_think(j, opened);
    if (tools && !srv_job_use_tools(j, &o, tools, forced, out)) goto done;
    srv_job *jj = j;
    j = NULL;
    srv_job_run(jj, &o, &ids, &n_ids, "input", out);
done:
    if (j) j->ended = true;
    srv_job_free(j);
    state_free(rs);
    free(ids);
    json_decref(echo);
    json_decref(vars);
    json_decref(msgs);
    json_decref(chat);
    json_decref(conv);
    json_decref(tools);
    json_decref(tool_body);
    srv_opts_free(&o);
    json_decref(b);
}

void srv_route_response_id(srv_req *rq, srv_resp *out, const char *id) {
    ag_server *s = rq->s;
    if (!strcmp(rq->method, "DELETE")) {
        if (store_delete(s, id))
            srv_json(out, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1));
        else srv_error(out, 404, "invalid_request_error", NULL, "not_found", "Response with id '%s' not found.", id);
        return;
    }
    json_t *r = NULL;
    if (store_get(s, id, &r, NULL)) srv_json(out, 200, r);
    else srv_error(out, 404, "invalid_request_error", NULL, "not_found", "Response with id '%s' not found.", id);
}
