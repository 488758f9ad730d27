/* Anthropic's Messages API: POST /v1/messages and
 * POST /v1/messages/count_tokens.
 *
 * A request is translated into what the OpenAI chat route validates and
 * renders (OpenAI messages, tools and tool_choice, then server_impl.h's
 * shared parsing and srv_chat_prompt), so that both APIs give the model the
 * same prompt for the same conversation. Only what is Anthropic's own is
 * checked here: content blocks, the system prompt, tool_use/tool_result
 * blocks, tool definitions, max_tokens being required. A final assistant
 * message is a prefill: the reply continues its text.
 *
 * The output goes through a srv_job with this file's srv_protocol: one
 * Message object, or the SSE events message_start, ping,
 * content_block_start/content_block_delta/content_block_stop (text_delta,
 * input_json_delta), message_delta (stop_reason, usage) and message_stop.
 * Errors are made in OpenAI's shape like everywhere in the server and
 * rewritten into Anthropic's by srv_anthropic_error (http.c calls it for
 * every route under /v1/messages). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/fields.h"
#include "server/gen.h"
#include "server/job.h"
#include "server/messages.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/server_impl.h"

/* ---- errors ---- */

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

void srv_anthropic_error(srv_resp *r) {
    json_error_t err;
    json_t *v = r->body.len ? json_loadb(r->body.data, r->body.len, 0, &err) : NULL;
    const char *msg = json_string_value(json_object_get(json_object_get(v, "error"), "message"));
    /* a full queue: the server is overloaded, which Anthropic's clients
     * know as 529 (and retry after Retry-After) */
    if (r->status == 429) r->status = 529;
    json_t *e = json_object();
    json_object_set_new(e, "type", json_string(error_type(r->status)));
    json_object_set_new(e, "message", json_string(msg ? msg : "request failed"));
    json_decref(v);
    json_t *root = json_object();
    json_object_set_new(root, "type", json_string("error"));
    json_object_set_new(root, "error", e);
    srv_json(r, r->status, root);
}

/* A 400 naming the offending field by its path ("messages.1.content.0"). */
#define BAD(out, path, ...) srv_error(out, 400, "invalid_request_error", path, "invalid_value", __VA_ARGS__)

/* ---- request: content blocks into OpenAI messages ---- */

/* The block's "type" (the block being an object), or NULL with a 400. */
static const char *block_type(json_t *block, const char *path, srv_resp *out) {
    const char *type = json_string_value(json_object_get(block, "type"));
    if (!json_is_object(block)) {
        BAD(out, path, "%s: a content block must be an object, got %s", path, srv_type_name(block));
        return NULL;
    }
    if (!type) {
        BAD(out, path, "%s.type: a content block needs a 'type' string", path);
        return NULL;
    }
    return type;
}

/* The 400 for a block type this server does not take. */
static void unsupported_block(const char *type, const char *path, srv_resp *out) {
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        BAD(out, path, "%s: %s content blocks are not supported: this model reads text only", path, type);
    else BAD(out, path, "%s: content block type '%s' is not supported here", path, type);
}

/* A text block {"type": "text", "text": string} (other keys such as
 * cache_control are ignored) appended to `parts` as an OpenAI text part. */
static bool add_text_part(json_t *block, const char *path, json_t *parts, srv_resp *out) {
    json_t *text = json_object_get(block, "text");
    if (!json_is_string(text)) {
        BAD(out, path, "%s.text: must be a string, got %s", path, srv_type_name(text));
        return false;
    }
    json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
    return true;
}

/* Text content: a string, or a list of text blocks; into a string or a list
 * of OpenAI text parts (a new reference), or NULL with a 400 naming `path`. */
static json_t *text_content(json_t *content, const char *path, srv_resp *out) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        BAD(out, path, "%s: must be a string or a list of text blocks, got %s", path, srv_type_name(content));
        return NULL;
    }
    json_t *parts = json_array();
    size_t i;
    json_t *block;
    json_array_foreach(content, i, block) {
        char bpath[96];
        snprintf(bpath, sizeof bpath, "%s.%zu", path, i);
        const char *type = block_type(block, bpath, out);
        if (!type) goto fail;
        if (strcmp(type, "text") != 0) {
            unsupported_block(type, bpath, out);
            goto fail;
        }
        if (!add_text_part(block, bpath, parts, out)) goto fail;
    }
    return parts;
fail:
    json_decref(parts);
    return NULL;
}

/* Appends the pending text parts of a user turn as one user message. */
static void flush_user_parts(json_t *res, json_t **parts) {
    if (json_array_size(*parts))
        json_array_append_new(res, json_pack("{s:s, s:o}", "role", "user", "content", *parts));
    else json_decref(*parts);
    *parts = json_array();
}

/* A user turn: text blocks become a user message, each tool_result a tool
 * message (in order). */
static bool convert_user(json_t *content, const char *path, json_t *res, srv_resp *out) {
    if (json_is_string(content)) {
        json_array_append_new(res, json_pack("{s:s, s:O}", "role", "user", "content", content));
        return true;
    }
    json_t *parts = json_array();
    size_t i;
    json_t *block;
    json_array_foreach(content, i, block) {
        char bpath[96];
        snprintf(bpath, sizeof bpath, "%s.%zu", path, i);
        const char *type = block_type(block, bpath, out);
        if (!type) goto fail;
        if (!strcmp(type, "text")) {
            if (!add_text_part(block, bpath, parts, out)) goto fail;
        } else if (!strcmp(type, "tool_result")) {
            json_t *id = json_object_get(block, "tool_use_id");
            json_t *result = json_object_get(block, "content");
            json_t *is_error = json_object_get(block, "is_error");
            if (!json_is_string(id)) {
                BAD(out, bpath, "%s.tool_use_id: must be a string, got %s", bpath, srv_type_name(id));
                goto fail;
            }
            if (is_error && !json_is_null(is_error) && !json_is_boolean(is_error)) {
                BAD(out, bpath, "%s.is_error: must be a boolean, got %s", bpath, srv_type_name(is_error));
                goto fail;
            }
            char rpath[112];
            snprintf(rpath, sizeof rpath, "%s.content", bpath);
            json_t *text = result && !json_is_null(result) ? text_content(result, rpath, out) : json_string("");
            if (!text) goto fail;
            flush_user_parts(res, &parts);
            json_array_append_new(res, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
                                                 text));
        } else {
            unsupported_block(type, bpath, out);
            goto fail;
        }
    }
    flush_user_parts(res, &parts);
    json_decref(parts);
    return true;
fail:
    json_decref(parts);
    return false;
}

/* An assistant turn: text blocks are its content, tool_use blocks its
 * OpenAI tool_calls. *has_calls says whether there were any. */
static bool convert_assistant(json_t *content, const char *path, json_t *res, bool *has_calls, srv_resp *out) {
    *has_calls = false;
    if (json_is_string(content)) {
        json_array_append_new(res, json_pack("{s:s, s:O}", "role", "assistant", "content", content));
        return true;
    }
    json_t *parts = json_array(), *calls = json_array();
    ag_buf thinking = {0};
    size_t i;
    json_t *block;
    json_array_foreach(content, i, block) {
        char bpath[96];
        snprintf(bpath, sizeof bpath, "%s.%zu", path, i);
        const char *type = block_type(block, bpath, out);
        if (!type) goto fail;
        if (!strcmp(type, "text")) {
            if (!add_text_part(block, bpath, parts, out)) goto fail;
        } else if (!strcmp(type, "tool_use")) {
            json_t *id = json_object_get(block, "id");
            json_t *name = json_object_get(block, "name");
            json_t *input = json_object_get(block, "input");
            if (!json_is_string(id) || !json_is_string(name) || !json_string_length(name) || !json_is_object(input)) {
                BAD(out, bpath, "%s: a tool_use block needs 'id' (string), 'name' (string) and 'input' (object)",
                    bpath);
                goto fail;
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
                                                   "function", "name", name, "arguments", input));
        } else if (!strcmp(type, "thinking")) {
            /* earlier reasoning, which clients send back with tool results:
             * the chat messages' reasoning_content (the template decides
             * whether the model sees it again; most drop past turns') */
            json_t *t = json_object_get(block, "thinking");
            if (json_is_string(t)) {
                if (thinking.len) ag_buf_append_char(&thinking, '\n');
                ag_buf_append(&thinking, json_string_value(t), json_string_length(t));
            }
        } else if (!strcmp(type, "redacted_thinking")) {
            /* nothing a template could show */
        } else {
            unsupported_block(type, bpath, out);
            goto fail;
        }
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", parts);
    if (thinking.len) json_object_set_new(m, "reasoning_content", srv_jstr(thinking.data, thinking.len));
    ag_buf_free(&thinking);
    if (json_array_size(calls)) {
        json_object_set_new(m, "tool_calls", calls);
        *has_calls = true;
    } else {
        json_decref(calls);
    }
    json_array_append_new(res, m);
    return true;
fail:
    ag_buf_free(&thinking);
    json_decref(parts);
    json_decref(calls);
    return false;
}

/* The text a converted message holds (a string or text parts, joined the
 * way the chat route joins parts). */
static void message_text(json_t *m, ag_buf *b) {
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content)) {
        ag_buf_append(b, json_string_value(content), json_string_length(content));
        return;
    }
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        if (i) ag_buf_append_char(b, '\n');
        ag_buf_append(b, json_string_value(t), json_string_length(t));
    }
}

/* system + messages into OpenAI messages (a new reference), or NULL with a
 * 400. A final assistant message without tool_use is left out and its text
 * goes to `prefill`. */
static json_t *convert_messages(json_t *system, json_t *msgs, ag_buf *prefill, srv_resp *out) {
    if (!msgs) {
        BAD(out, "messages", "messages: field required");
        return NULL;
    }
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        BAD(out, "messages", "messages: must be a non-empty list of messages, got %s",
            json_is_array(msgs) ? "an empty list" : srv_type_name(msgs));
        return NULL;
    }
    json_t *res = json_array();
    if (system && !json_is_null(system)) {
        json_t *text = text_content(system, "system", out);
        if (!text) goto fail;
        json_array_append_new(res, json_pack("{s:s, s:o}", "role", "system", "content", text));
    }
    size_t i, last = json_array_size(msgs) - 1;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char path[64];
        snprintf(path, sizeof path, "messages.%zu", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!json_is_object(m)) {
            BAD(out, path, "%s: must be an object, got %s", path, srv_type_name(m));
            goto fail;
        }
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
            BAD(out, path, "%s.role: must be \"user\" or \"assistant\"%s", path,
                role && !strcmp(role, "system") ? " (the system prompt goes in the top-level 'system' field)" : "");
            goto fail;
        }
        strncat(path, ".content", sizeof path - strlen(path) - 1);
        if (!json_is_string(content) && !(json_is_array(content) && json_array_size(content))) {
            BAD(out, path, "%s: must be a string or a non-empty list of content blocks, got %s", path,
                json_is_array(content) ? "an empty list" : srv_type_name(content));
            goto fail;
        }
        if (!strcmp(role, "user")) {
            if (!convert_user(content, path, res, out)) goto fail;
            continue;
        }
        bool has_calls;
        if (!convert_assistant(content, path, res, &has_calls, out)) goto fail;
        if (i == last && !has_calls) {
            size_t n = json_array_size(res) - 1;
            message_text(json_array_get(res, n), prefill);
            json_array_remove(res, n);
        }
    }
    return res;
fail:
    json_decref(res);
    return NULL;
}

/* Anthropic tools and tool_choice into the OpenAI body srv_parse_tools
 * reads ({"tools", "tool_choice"}; a new reference), or NULL with a 400. */
static json_t *convert_tools(json_t *tools, json_t *choice, srv_resp *out) {
    json_t *res = json_object();
    bool have_tools = false;
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            BAD(out, "tools", "tools: must be a list, got %s", srv_type_name(tools));
            goto fail;
        }
        json_t *conv = json_array();
        json_object_set_new(res, "tools", conv);
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            char path[32];
            snprintf(path, sizeof path, "tools.%zu", i);
            const char *type = json_string_value(json_object_get(t, "type"));
            json_t *name = json_object_get(t, "name");
            json_t *desc = json_object_get(t, "description");
            json_t *schema = json_object_get(t, "input_schema");
            if (json_is_object(t) && type && strcmp(type, "custom") != 0) {
                BAD(out, path, "%s: tool type '%s' is not supported (only client tools with an input_schema)", path,
                    type);
                goto fail;
            }
            if (!json_is_object(t) || !json_is_string(name) || !json_string_length(name) || !json_is_object(schema) ||
                (desc && !json_is_null(desc) && !json_is_string(desc))) {
                BAD(out, path, "%s: a tool must be {\"name\": string, \"description\": string, \"input_schema\": "
                    "object}", path);
                goto fail;
            }
            json_t *fn = json_pack("{s:O}", "name", name);
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            json_object_set(fn, "parameters", schema);
            json_array_append_new(conv, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        have_tools = json_array_size(conv) > 0;
    }
    if (choice && !json_is_null(choice)) {
        const char *type = json_string_value(json_object_get(choice, "type"));
        json_t *name = json_object_get(choice, "name");
        json_t *conv = NULL;
        if (!json_is_object(choice) || !type) {
            BAD(out, "tool_choice", "tool_choice: must be an object with a 'type', got %s", srv_type_name(choice));
            goto fail;
        }
        if (!strcmp(type, "auto")) {
            conv = json_string("auto");
        } else if (!strcmp(type, "none")) {
            conv = json_string("none");
        } else if (!strcmp(type, "any")) {
            conv = json_string("required");
        } else if (!strcmp(type, "tool")) {
            if (!json_is_string(name)) {
                BAD(out, "tool_choice", "tool_choice.name: must be a string with type \"tool\"");
                goto fail;
            }
            conv = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
        } else {
            BAD(out, "tool_choice", "tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\", got '%s'",
                type);
            goto fail;
        }
        if (!have_tools && strcmp(type, "auto") && strcmp(type, "none")) {
            json_decref(conv);
            BAD(out, "tool_choice", "tool_choice: type \"%s\" needs 'tools'", type);
            goto fail;
        }
        json_object_set_new(res, "tool_choice", conv);
    }
    return res;
fail:
    json_decref(res);
    return NULL;
}

/* What both routes make of a request: the prompt's tokens and the tools. */
typedef struct {
    json_t  *tools;  /* OpenAI tools the prompt got, or NULL */
    bool     forced; /* tool_choice any or tool */
    int32_t *ids;
    size_t   n_ids;
    bool     opened; /* the prompt ends inside a <think> block */
} msg_prompt;

static void prompt_free(msg_prompt *p) {
    json_decref(p->tools);
    free(p->ids);
}

static bool parse_prompt(ag_server *s, json_t *b, msg_prompt *p, srv_resp *out) {
    memset(p, 0, sizeof *p);
    json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        BAD(out, "model", "model: must be a string, got %s", srv_type_name(model));
        return false;
    }
    json_t *msgs = NULL, *tool_body = convert_tools(json_object_get(b, "tools"), json_object_get(b, "tool_choice"),
                                                    out);
    ag_buf prefill = {0};
    bool ok = false, failed;
    if (!tool_body) goto done;
    p->tools = srv_parse_tools(tool_body, out, &failed, &p->forced);
    if (failed) goto done;
    json_t *conv = convert_messages(json_object_get(b, "system"), json_object_get(b, "messages"), &prefill, out);
    if (!conv) goto done;
    msgs = srv_build_messages(s, conv, p->tools, out);
    json_decref(conv);
    if (!msgs) goto done;
    ok = srv_chat_prompt(s, msgs, p->tools, NULL, prefill.data, prefill.len, "messages", &p->ids, &p->n_ids, &p->opened, out);
done:
    ag_buf_free(&prefill);
    json_decref(msgs);
    json_decref(tool_body);
    return ok;
}

/* output_config: {"format": {"type": "json_schema", "schema": object}}
 * makes the output one JSON value of the schema (as OpenAI's
 * response_format); "effort" (how hard a reasoning model thinks) is not
 * something this model does. */
static bool parse_output_config(json_t *oc, srv_opts *o, srv_resp *out) {
    if (!oc || json_is_null(oc)) return true;
    if (!json_is_object(oc)) {
        BAD(out, "output_config", "output_config: must be an object, got %s", srv_type_name(oc));
        return false;
    }
    const char *k;
    json_t *v;
    json_object_foreach(oc, k, v) {
        if (!strcmp(k, "format")) continue;
        if (!strcmp(k, "effort")) {
            if (json_is_null(v)) continue;
            srv_error(out, 400, "invalid_request_error", "output_config.effort", "unsupported_parameter",
                      "output_config.effort: not supported by this server (this model does not reason before "
                      "answering)");
            return false;
        }
        BAD(out, "output_config", "output_config.%s: Extra inputs are not permitted", k);
        return false;
    }
    json_t *f = json_object_get(oc, "format");
    if (!f || json_is_null(f)) return true;
    const char *type = json_string_value(json_object_get(f, "type"));
    json_t *schema = json_object_get(f, "schema");
    if (!json_is_object(f) || !type || strcmp(type, "json_schema") || !json_is_object(schema)) {
        BAD(out, "output_config.format",
            "output_config.format: must be {\"type\": \"json_schema\", \"schema\": object}");
        return false;
    }
    return srv_output_schema(schema, "output_config.format.schema", o, out);
}

/* thinking: {"type": "disabled"}, or "enabled" (with budget_tokens) /
 * "adaptive" where the model thinks in tags anyway. Its reasoning comes
 * back as thinking blocks either way; budget_tokens is not enforced
 * (Anthropic calls it a target as well). A model that does not think
 * cannot be asked to. */
static bool parse_thinking(ag_server *s, json_t *th, srv_resp *out) {
    if (!th || json_is_null(th)) return true;
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!json_is_object(th) || !type) {
        BAD(out, "thinking", "thinking: must be an object with a 'type', got %s", srv_type_name(th));
        return false;
    }
    if (!strcmp(type, "disabled")) return true;
    if (strcmp(type, "enabled") && strcmp(type, "adaptive")) {
        BAD(out, "thinking", "thinking.type: must be \"enabled\", \"adaptive\" or \"disabled\", got '%s'", type);
        return false;
    }
    json_t *budget = json_object_get(th, "budget_tokens");
    if (budget && !json_is_null(budget) && !json_is_integer(budget)) {
        BAD(out, "thinking", "thinking.budget_tokens: must be an integer, got %s", srv_type_name(budget));
        return false;
    }
    if (s->thinks || s->harmony || s->p.lenient_fields) return true;
    srv_error(out, 400, "invalid_request_error", "thinking", "unsupported_parameter",
              "Unsupported parameter: 'thinking' is not supported by this server (this model does not think before "
              "answering: thinking must be {\"type\": \"disabled\"})");
    return false;
}

/* ---- response ---- */

/* usage: Anthropic counts cached prompt tokens apart from input_tokens. */
static json_t *usage_json(srv_job *j) {
    int prompt, cached, generated;
    srv_gen_usage(j->gen, &prompt, &cached, &generated);
    json_t *u = json_object();
    json_object_set_new(u, "input_tokens", json_integer(prompt - cached));
    json_object_set_new(u, "output_tokens", json_integer(generated));
    json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
    json_object_set_new(u, "cache_read_input_tokens", json_integer(cached));
    return u;
}

/* The Message object; content is stolen, stop_reason may be NULL (null). */
static json_t *message_json(srv_job *j, json_t *content, const char *stop_reason, const char *stop_sequence) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(j->id));
    json_object_set_new(m, "type", json_string("message"));
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "model", json_string(j->s->model_id));
    json_object_set_new(m, "content", content);
    json_object_set_new(m, "stop_reason", stop_reason ? json_string(stop_reason) : json_null());
    json_object_set_new(m, "stop_sequence", stop_sequence ? srv_jstr(stop_sequence, strlen(stop_sequence))
                                                          : json_null());
    json_object_set_new(m, "usage", usage_json(j));
    return m;
}

/* The tool calls in c's text as tool_use blocks (a new array), or NULL when
 * there are none or one's arguments are not a JSON object (the output then
 * stays text). `rest` (may be NULL) receives the text outside the calls. */
static json_t *tool_use_blocks(srv_job *j, srv_choice *c, ag_buf *rest) {
    json_t *calls = NULL;
    ag_buf text = {0};
    if (!srv_choice_tool_calls(j, c, &calls, &text)) return NULL;
    json_t *blocks = json_array();
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        json_error_t err;
        json_t *input = args ? json_loads(args, 0, &err) : NULL;
        if (!json_is_object(input)) {
            json_decref(input);
            json_decref(blocks);
            blocks = NULL;
            break;
        }
        char id[32] = "toolu_";
        srv_random_id(id + 6, 24);
        json_array_append_new(blocks, json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", id, "name",
                                                json_object_get(fn, "name"), "input", input));
    }
    json_decref(calls);
    if (blocks && rest) ag_buf_append(rest, text.data, text.len);
    ag_buf_free(&text);
    return blocks;
}

/* stop_reason and stop_sequence of a finished choice. */
static const char *stop_reason(srv_job *j, const srv_choice *c, bool tool_use, const char **stop_sequence) {
    *stop_sequence = NULL;
    if (c->finish == AG_FINISH_LENGTH) return "max_tokens";
    if (tool_use) return "tool_use";
    if (c->stop_index >= 0 && c->stop_index < j->n_stops) {
        *stop_sequence = j->stops[c->stop_index];
        return "stop_sequence";
    }
    return "end_turn";
}

static json_t *text_block(const char *text, size_t len) {
    json_t *b = json_object();
    json_object_set_new(b, "type", json_string("text"));
    json_object_set_new(b, "text", srv_jstr(text, len));
    return b;
}

static json_t *thinking_block(const char *text, size_t len) {
    return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", srv_jstr(text, len), "signature", "");
}

static void respond_message(srv_job *j, srv_resp *out) {
    if (!srv_job_choices_ok(j, out)) return;
    srv_choice *c = &j->ch[0];
    ag_buf rest = {0};
    json_t *blocks = tool_use_blocks(j, c, &rest);
    json_t *content = json_array();
    const char *answer, *reasoning;
    size_t answer_len = srv_choice_answer(c, &answer), reasoning_len = srv_choice_reasoning(c, &reasoning);
    if (reasoning_len) json_array_append_new(content, thinking_block(reasoning, reasoning_len));
    /* a message always has content: its text, unless it is only tool calls */
    if (!blocks) json_array_append_new(content, text_block(answer, answer_len));
    else if (rest.len) json_array_append_new(content, text_block(rest.data, rest.len));
    if (blocks) json_array_extend(content, blocks);
    const char *seq;
    const char *reason = stop_reason(j, c, blocks != NULL, &seq);
    json_decref(blocks);
    ag_buf_free(&rest);
    srv_json(out, 200, message_json(j, content, reason, seq));
}

/* ---- streaming ---- */

typedef struct {
    bool started;   /* message_start went out */
    bool thinking_open; /* the last started block is a thinking block still open */
    bool text_open; /* the last started block is a text block still open */
    bool had_text;  /* a text block was started */
    int  n_blocks;  /* content blocks started */
    bool tool_use;  /* tool_use blocks went out */
} msg_stream;

/* message_start goes out with the first engine event: usage then knows
 * how much of the prompt came from the prefix cache. */
static void stream_begin(srv_job *j, msg_stream *st) {
    if (st->started) return;
    st->started = true;
    srv_job_sse(j, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message",
                                            message_json(j, json_array(), NULL, NULL)));
    srv_job_sse(j, "ping", json_pack("{s:s}", "type", "ping"));
}

static void block_start(srv_job *j, msg_stream *st, json_t *block) {
    srv_job_sse(j, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                                                  st->n_blocks, "content_block", block));
    st->n_blocks++;
}

static void block_delta(srv_job *j, msg_stream *st, json_t *delta) {
    srv_job_sse(j, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
                                                  st->n_blocks - 1, "delta", delta));
}

static void block_stop(srv_job *j, msg_stream *st) {
    srv_job_sse(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
                                                 st->n_blocks - 1));
}

/* Reasoning into the open thinking block (opened on first use). */
static void stream_thinking(srv_job *j, msg_stream *st, const char *text, size_t len) {
    /* harmony: reasoning may follow a preamble */
    if (st->text_open) {
        block_stop(j, st);
        st->text_open = false;
    }
    if (!st->thinking_open) {
        block_start(j, st, thinking_block("", 0));
        st->thinking_open = true;
    }
    block_delta(j, st, json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", srv_jstr(text, len)));
}

static void close_thinking(srv_job *j, msg_stream *st) {
    if (!st->thinking_open) return;
    block_stop(j, st);
    st->thinking_open = false;
}

/* Text into the open text block (opened on first use; len 0 only opens). */
static void stream_text(srv_job *j, msg_stream *st, const char *text, size_t len) {
    close_thinking(j, st);
    if (!st->text_open) {
        block_start(j, st, text_block("", 0));
        st->text_open = st->had_text = true;
    }
    if (len) block_delta(j, st, json_pack("{s:s, s:o}", "type", "text_delta", "text", srv_jstr(text, len)));
}

static void stream_error(srv_job *j, int status, const char *msg) {
    srv_job_sse(j, "error", json_pack("{s:s, s:{s:s, s:o}}", "type", "error", "error", "type", error_type(status),
                                    "message", srv_jstr(msg, strlen(msg))));
    j->ended = true;
}

static void stream_event(srv_job *j, srv_event *e) {
    msg_stream *st = j->proto_state;
    if (j->ended || e->choice != 0 || e->prompt_pos > 0) return;
    srv_choice *c = &j->ch[0];
    if (c->done) return;
    stream_begin(j, st);
    srv_choice_add(j, c, e);
    if (e->finish == AG_FINISH_ERROR || e->finish == AG_FINISH_CANCELLED) {
        c->done = true;
        if (e->finish == AG_FINISH_ERROR) stream_error(j, 500, e->error ? e->error : "generation failed");
        else stream_error(j, 503, "the request was cancelled: the server is shutting down");
        return;
    }
    const char *fresh;
    size_t reasoning_len = srv_stream_reasoning(c, &fresh);
    if (reasoning_len) stream_thinking(j, st, fresh, reasoning_len);
    if (e->finish == AG_FINISH_NONE) {
        size_t n = srv_stream_fresh(j, c, false, &fresh);
        if (n) stream_text(j, st, fresh, n);
        return;
    }
    c->done = true;
    c->finish = e->finish;
    c->stop_index = e->stop_index;
    json_t *blocks = tool_use_blocks(j, c, NULL);
    size_t n = srv_stream_fresh(j, c, blocks == NULL, &fresh);
    /* a message always has an answer: at least an (empty) text block */
    if (n || (!blocks && !st->had_text)) stream_text(j, st, fresh, n);
    close_thinking(j, st);
    if (st->text_open) {
        block_stop(j, st);
        st->text_open = false;
    }
    size_t i;
    json_t *b;
    json_array_foreach(blocks, i, b) {
        char *args = json_dumps(json_object_get(b, "input"), JSON_COMPACT | JSON_PRESERVE_ORDER);
        block_start(j, st, json_pack("{s:s, s:O, s:O, s:{}}", "type", "tool_use", "id", json_object_get(b, "id"),
                                     "name", json_object_get(b, "name"), "input"));
        block_delta(j, st, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json", args ? args : "{}"));
        block_stop(j, st);
        free(args);
    }
    st->tool_use = blocks != NULL;
    json_decref(blocks);
}

static void stream_end(srv_job *j) {
    msg_stream *st = j->proto_state;
    stream_begin(j, st);
    const char *seq;
    const char *reason = stop_reason(j, &j->ch[0], st->tool_use, &seq);
    json_t *delta = json_object();
    json_object_set_new(delta, "stop_reason", json_string(reason));
    json_object_set_new(delta, "stop_sequence", seq ? srv_jstr(seq, strlen(seq)) : json_null());
    srv_job_sse(j, "message_delta", json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", delta, "usage",
                                            usage_json(j)));
    srv_job_sse(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

static const srv_protocol k_messages_proto = {.id_prefix = "msg_", .stream_event = stream_event,
                                              .stream_end = stream_end, .respond = respond_message};

/* ---- routes ---- */

void srv_route_messages(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    srv_opts o;
    srv_opts_init(&o);
    msg_prompt p = {0};
    if (!srv_check_fields(s, b, SRV_ROUTE_MESSAGES, out)) goto done;
    json_t *max_tokens = json_object_get(b, "max_tokens");
    json_t *stops = json_object_get(b, "stop_sequences");
    json_t *metadata = json_object_get(b, "metadata");
    long long n = 0;
    if (!max_tokens || json_is_null(max_tokens)) {
        BAD(out, "max_tokens", "max_tokens: field required");
        goto done;
    }
    if (!srv_get_int(b, "max_tokens", 1, 1 << 24, &n, NULL, out)) goto done;
    o.max_tokens = (int)n;
    /* Anthropic's temperature range is 0..1 */
    if (!srv_parse_sampling(b, 1.0, &o, out) || !srv_parse_extensions(s, b, &o, out)) goto done;
    if (stops && !json_is_null(stops) && !json_is_array(stops)) {
        BAD(out, "stop_sequences", "stop_sequences: must be a list of strings, got %s", srv_type_name(stops));
        goto done;
    }
    if (!srv_parse_stops(stops, "stop_sequences", &o, out) || !srv_get_bool(b, "stream", &o.stream, out)) goto done;
    if (metadata && !json_is_null(metadata) &&
        (!json_is_object(metadata) || (json_object_get(metadata, "user_id") &&
                                       !json_is_null(json_object_get(metadata, "user_id")) &&
                                       !json_is_string(json_object_get(metadata, "user_id"))))) {
        BAD(out, "metadata", "metadata: must be an object like {\"user_id\": string}");
        goto done;
    }
    if (!parse_output_config(json_object_get(b, "output_config"), &o, out) ||
        !parse_thinking(s, json_object_get(b, "thinking"), out))
        goto done;
    /* tool_choice.disable_parallel_tool_use: at most one tool_use block */
    json_t *dp = json_object_get(json_object_get(b, "tool_choice"), "disable_parallel_tool_use");
    if (dp && !json_is_null(dp) && !json_is_boolean(dp)) {
        BAD(out, "tool_choice", "tool_choice.disable_parallel_tool_use: must be a boolean, got %s", srv_type_name(dp));
        goto done;
    }
    o.one_tool_call = json_is_true(dp);
    if (!parse_prompt(s, b, &p, out)) goto done;
    srv_job *j = srv_job_new(rq, &k_messages_proto, &o, 1);
    if (j && o.stream && !(j->proto_state = calloc(1, sizeof(msg_stream)))) {
        srv_job_free(j);
        j = NULL;
    }
    if (!j) {
        srv_error(out, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    srv_job_think(j, p.opened);
    if (p.tools && !srv_job_use_tools(j, &o, p.tools, p.forced, out)) {
        srv_job_free(j);
        goto done;
    }
    srv_job_run(j, &o, &p.ids, &p.n_ids, "messages", out);
done:
    prompt_free(&p);
    srv_opts_free(&o);
    json_decref(b);
}

void srv_route_messages_count_tokens(srv_req *rq, srv_resp *out) {
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    msg_prompt p = {0};
    if (srv_check_fields(rq->s, b, SRV_ROUTE_MESSAGES, out) && parse_prompt(rq->s, b, &p, out))
        srv_json(out, 200, json_pack("{s:I}", "input_tokens", (json_int_t)p.n_ids));
    prompt_free(&p);
    json_decref(b);
}
