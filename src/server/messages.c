/* Chat messages and tools in OpenAI's shape, into a prompt (server_impl.h):
 * validation of "messages", "tools" and "tool_choice", and the rendering
 * of the messages with the model's chat template. The other protocols
 * convert their own messages into this shape and reuse it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "server/messages.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/server_impl.h"

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

static bool has_role(json_t *m, const char *role) {
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, role);
}

/* gpt-oss's template renders one call per assistant message (its
 * tool_calls[0]) and names each tool result after the latest call, as a
 * harmony transcript has it: a generation ends at its call. So a turn with
 * several calls becomes one assistant message per call, each followed by
 * its result (matched by tool_call_id, else by position); the first keeps
 * the turn's reasoning and content. Steals res; returns the new list. */
static json_t *harmony_one_call_each(json_t *res) {
    json_t *out = json_array();
    size_t n = json_array_size(res);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(res, i);
        json_t *calls = json_object_get(m, "tool_calls");
        size_t nc = json_array_size(calls);
        if (!has_role(m, "assistant") || nc < 2) {
            json_array_append(out, m);
            continue;
        }
        size_t end = i + 1;
        while (end < n && has_role(json_array_get(res, end), "tool")) end++;
        size_t nr = end - (i + 1);
        bool *used = calloc(nr ? nr : 1, sizeof *used);
        if (!used) {
            json_array_append(out, m);
            continue;
        }
        for (size_t c = 0; c < nc; c++) {
            json_t *call = json_array_get(calls, c);
            json_t *one = json_copy(m);
            if (c) {
                json_object_del(one, "thinking");
                json_object_del(one, "reasoning_content");
                json_object_set_new(one, "content", json_string(""));
            }
            json_object_set_new(one, "tool_calls", json_pack("[O]", call));
            json_array_append_new(out, one);
            const char *id = json_string_value(json_object_get(call, "id"));
            size_t hit = nr;
            for (size_t r = 0; id && r < nr && hit == nr; r++) {
                const char *rid = json_string_value(json_object_get(json_array_get(res, i + 1 + r), "tool_call_id"));
                if (!used[r] && rid && !strcmp(rid, id)) hit = r;
            }
            if (hit == nr && nr == nc && !used[c]) hit = c;
            if (hit < nr) {
                used[hit] = true;
                json_array_append(out, json_array_get(res, i + 1 + hit));
            }
        }
        for (size_t r = 0; r < nr; r++)
            if (!used[r]) json_array_append(out, json_array_get(res, i + 1 + r));
        free(used);
        i = end - 1;
    }
    json_decref(res);
    return out;
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
        /* earlier reasoning a client sends back: templates that show it
         * read reasoning_content (Qwen3), gpt-oss's reads `thinking` and
         * refuses it beside content in a tool-call turn (llama.cpp passes
         * it the same way) */
        json_t *reasoning = json_object_get(m, "reasoning_content");
        if (assistant && json_is_string(reasoning)) {
            json_object_set(nm, "reasoning_content", reasoning);
            if (s->harmony) {
                json_object_set(nm, "thinking", reasoning);
                if (json_array_size(calls)) json_object_del(nm, "content");
            }
        }
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
    if (s->harmony) res = harmony_one_call_each(res);
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

json_t *srv_reasoning_effort(ag_server *s, const json_t *effort, const char *param, bool *failed, srv_resp *out) {
    *failed = false;
    if (!effort || json_is_null(effort)) return NULL;
    const char *e = json_string_value(effort);
    if (!s->harmony && s->p.lenient_fields) return NULL;
    if (!s->harmony) {
        srv_error(out, 400, "invalid_request_error", param, "unsupported_parameter",
                  "Unsupported parameter: '%s' is not supported by this server (this model's reasoning cannot be "
                  "steered)",
                  param);
    } else if (!e || (strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high"))) {
        srv_error(out, 400, "invalid_request_error", param, "invalid_value",
                  "'%s' must be \"low\", \"medium\" or \"high\"", param);
    } else {
        return json_pack("{s:s}", "reasoning_effort", e);
    }
    *failed = true;
    return NULL;
}

bool srv_chat_prompt(ag_server *s, json_t *msgs, json_t *tools, const json_t *vars, const char *prefill,
                     size_t prefill_len, const char *param, int32_t **ids, size_t *n_ids, bool *opened,
                     srv_resp *out) {
    if (!s->chat) {
        srv_error(out, 400, "invalid_request_error", NULL, "unsupported", "this model has no chat format");
        return false;
    }
    ag_buf prompt = {0};
    bool ok = false;
    ag_status st = ag_chat_render(s->chat, msgs, s->tmpl_has_tools ? tools : NULL, true, vars, &prompt);
    if (st) {
        srv_error(out, 400, "invalid_request_error", param, "template_error",
                  "the model's chat template rejected the messages: %s", ag_error_message());
        goto done;
    }
    /* harmony: a prefill is the start of the final answer's body */
    if (prefill_len && s->harmony) ag_buf_append_str(&prompt, "<|channel|>final<|message|>");
    if (prefill_len) ag_buf_append(&prompt, prefill, prefill_len);
    if (opened)
        *opened = s->harmony ? prefill_len > 0 : s->thinks && ag_think_prompt_opens(ag_buf_cstr(&prompt), prompt.len);
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
