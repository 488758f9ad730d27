/* The OpenAI routes: /v1/chat/completions and /v1/completions. What the
 * protocols share lives beside it: request options (request.c), chat
 * messages and tools (messages.c) and jobs, which submit prompts and
 * collect or stream their output through a protocol's srv_protocol
 * callbacks (job.c). Here: OpenAI's fields, logprobs, chunks and replies.
 *
 * A request is validated completely before anything reaches the engine:
 * every known field with a wrong type or an out-of-range value is a 400
 * naming the field, and so is an unknown one (fields.c). The prompt is rendered
 * (chat template) and tokenized on the connection's thread. Output is then
 * collected from the generation's event queue, either into one JSON
 * response or as SSE chunks, one per engine event. */
#include <math.h>
#include <microhttpd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "sample/schema.h"
#include "server/openai.h"
#include "server/fields.h"
#include "server/gen.h"
#include "server/job.h"
#include "server/messages.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/server_impl.h"

#define MAX_PROMPTS 64
#define LOGPROB_FLOOR (-9999.0)

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
    if (!strcmp(t, "text")) return true;
    if (!strcmp(t, "json_object")) return srv_output_schema(NULL, "response_format", o, out);
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
    return srv_output_schema(schema, "response_format.json_schema.schema", o, out);
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
    srv_job_sse(j, NULL, c);
}

static void emit_text_chunk(srv_job *j, int idx, const char *text, size_t len, json_t *lp, const char *finish) {
    json_t *c = chunk_new(j);
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(idx));
    json_object_set_new(ch, "text", srv_jstr(text, len));
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(json_object_get(c, "choices"), ch);
    srv_job_sse(j, NULL, c);
}

static void emit_stream_error(srv_job *j, int status, const char *type, const char *code, const char *msg) {
    json_t *e = json_object();
    json_object_set_new(e, "message", srv_jstr(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_integer(status));
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    srv_job_sse(j, NULL, root);
    j->ended = true;
}

static json_t *content_delta(const char *text, size_t len) {
    json_t *d = json_object();
    json_object_set_new(d, "content", srv_jstr(text, len));
    return d;
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
        if (srv_choice_tool_calls(j, c, &calls, &rest) && e->finish == AG_FINISH_STOP)
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
        srv_job_sse(j, NULL, c);
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

/* Not streaming: a prompt token's score, or a token's logprobs, into its
 * choice (srv_protocol.collect). */
static void collect_lp(srv_job *j, const srv_event *e) {
    if (e->prompt_pos > 0) {
        collect_prompt_score(j, e);
        return;
    }
    if (!event_has_lp(j, e)) return;
    srv_choice *c = &j->ch[e->choice];
    if (j->chat) {
        if (!c->lp) c->lp = json_array();
        json_array_append_new(c->lp, chat_lp_entry(j, e));
    } else {
        if (!c->lp) c->lp = completion_lp_new();
        completion_lp_add(j, c->lp, c, e);
    }
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
            if (srv_choice_tool_calls(j, c, &calls, &content)) {
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
                                          .collect = collect_lp, .respond = respond_collected};
static const srv_protocol k_completions_proto = {.id_prefix = "cmpl-", .stream_start = stream_start,
                                                 .stream_event = stream_event, .stream_end = stream_end,
                                                 .collect = collect_lp, .respond = respond_collected};

/* ---- submission ---- */

/* ---- /v1/chat/completions ---- */

void srv_route_chat(srv_req *rq, srv_resp *out) {
    ag_server *s = rq->s;
    json_t *b = srv_parse_body(rq, out);
    if (!b) return;
    srv_opts o;
    json_t *tools = NULL, *msgs = NULL, *vars = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    srv_opts_init(&o);
    if (!srv_check_fields(s, b, SRV_ROUTE_CHAT, out) || !parse_common(s, b, true, &o, out)) goto done;
    bool failed, forced;
    tools = srv_parse_tools(b, out, &failed, &forced);
    if (failed) goto done;
    if (!(msgs = srv_build_messages(s, json_object_get(b, "messages"), tools, out))) goto done;
    bool opened = false;
    vars = srv_reasoning_effort(s, json_object_get(b, "reasoning_effort"), "reasoning_effort", &failed, out);
    if (failed) goto done;
    if (!srv_chat_prompt(s, msgs, tools, vars, NULL, 0, "messages", &ids, &n_ids, &opened, out)) goto done;
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
    json_decref(vars);
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
    srv_job_free(j);
    for (int p = 0; p < n_prompts; p++) free(ids[p]);
    srv_opts_free(&o);
    json_decref(b);
}
