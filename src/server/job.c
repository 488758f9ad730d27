/* Jobs: one request's generation as any protocol sees it (server_impl.h).
 * A job submits its prompts (srv_job_run), then either collects every
 * choice's output and lets the protocol build the response, or hands the
 * connection a stream whose bytes the protocol writes, one engine event at
 * a time. It also holds what the protocols share about an output: the
 * split into reasoning and answer, tool calls held back while they may
 * still be forming, and the one status-to-HTTP map for a refused submit. */
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/switches.h"
#include "sample/schema.h"
#include "server/job.h"
#include "server/gen.h"
#include "server/reply.h"
#include "server/request.h"
#include "server/server_impl.h"

/* ---- a job's life ---- */

static void job_free(srv_job *j) {
    if (!j) return;
    /* a stream that never reached its end lost its client (a failed write
     * or a closed socket) */
    if (j->stream && !j->ended && j->gen) atomic_fetch_add(&j->s->client_cancels, 1);
    srv_gen_release(j->gen);
    json_decref(j->tool_list);
    for (int i = 0; i < j->n_choices; i++) {
        ag_buf_free(&j->ch[i].text);
        ag_harmony_free(&j->ch[i].hm);
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

bool srv_choice_tool_calls(srv_job *j, const srv_choice *c, json_t **calls, ag_buf *content) {
    *calls = NULL;
    if (!j->tools) return false;
    if (c->harmony_on) {
        /* the calls are messages of their own: the answer is all content */
        if (!json_array_size(c->hm.calls)) return false;
        *calls = json_deep_copy(c->hm.calls);
        while (j->one_call && json_array_size(*calls) > 1) json_array_remove(*calls, json_array_size(*calls) - 1);
        ag_buf_append(content, ag_buf_cstr(&c->hm.content), c->hm.content.len);
        return true;
    }
    const char *answer;
    size_t len = srv_choice_answer(c, &answer);
    return srv_job_tool_calls(j, answer, len, calls, content);
}

bool srv_job_tool_calls(srv_job *j, const char *text, size_t len, json_t **calls, ag_buf *content) {
    if (!ag_server_parse_tool_calls(j->tf, text, len, j->tool_list, calls, content)) return false;
    /* one call allowed: the rest are dropped (their text too), as a server
     * enforcing it while generating would never have written them */
    while (j->one_call && json_array_size(*calls) > 1) json_array_remove(*calls, json_array_size(*calls) - 1);
    return true;
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
    const bool    llama3 = tf == AG_TOOLS_LLAMA3, harmony = tf == AG_TOOLS_HARMONY;
    char         *pre[AG_SCHEMA_MAX_CALLS] = {0};
    ag_schema_alt alts[AG_SCHEMA_MAX_ALTS];
    bool          ok = true;
    json_t       *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        char   *quoted = json_dumps(json_object_get(fn, "name"), JSON_ENCODE_ANY);
        ag_buf  p = {0};
        if (harmony) {
            /* the call message's header (gpt-oss writes no reasoning first) */
            ag_buf_printf(&p, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>",
                          json_string_value(json_object_get(fn, "name")));
        } else if (quoted) {
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
                                  .suffix = harmony ? NULL : llama3 ? "}" : "}\n</tool_call>"};
    }
    int n_alts = (int)n;
    if (answer)
        alts[n_alts++] = (ag_schema_alt){.prefix = harmony ? SRV_HARMONY_FINAL : "", .schema = o->answer_schema};
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

bool srv_job_use_tools(srv_job *j, srv_opts *o, json_t *tools, bool forced, srv_resp *out) {
    j->tools = true;
    j->tool_list = json_incref(tools);
    j->tf = j->s->tmpl_has_tools ? j->s->tool_format : AG_TOOLS_HERMES;
    if (forced) return tool_grammar(o, tools, j->tf, false, out);
    if (!o->has_answer_schema) return true;
    /* A call or the answer: a Llama 3 call starts like a JSON object, so
     * there the calls take Hermes' tags, which are then what is parsed. */
    if (j->tf != AG_TOOLS_HERMES && j->tf != AG_TOOLS_HARMONY) j->tf = AG_TOOLS_HERMES;
    return tool_grammar(o, tools, j->tf, true, out);
}

/* ---- a choice's output ---- */

void srv_job_think(srv_job *j, bool opened) {
    if (j->s->harmony) {
        for (int i = 0; i < j->n_choices; i++) {
            j->ch[i].harmony_on = true;
            ag_harmony_init(&j->ch[i].hm);
            /* the prompt ended in a final message's body (a prefill) */
            if (opened) ag_harmony_start_in(&j->ch[i].hm, SRV_HARMONY_PREFILL, strlen(SRV_HARMONY_PREFILL));
        }
        return;
    }
    if (!j->s->thinks) return;
    for (int i = 0; i < j->n_choices; i++) {
        j->ch[i].think_on = true;
        ag_think_init(&j->ch[i].think, opened);
    }
}

void srv_choice_scan(srv_job *j, srv_choice *c, bool final) {
    (void)j;
    if (c->harmony_on) ag_harmony_scan(&c->hm, c->text.data ? c->text.data : "", c->text.len, final);
    if (c->think_on) ag_think_scan(&c->think, c->text.data ? c->text.data : "", c->text.len, final);
}

void srv_choice_add(srv_job *j, srv_choice *c, const srv_event *e) {
    size_t before = c->text.len;
    if (e->len) ag_buf_append(&c->text, e->text, e->len);
    if (c->harmony_on) {
        /* a token read while inside (or right before) an analysis body */
        bool was = ag_harmony_in_reasoning(&c->hm);
        size_t r = c->hm.reasoning.len;
        srv_choice_scan(j, c, e->finish != AG_FINISH_NONE);
        if (e->len && (was || c->hm.reasoning.len > r || ag_harmony_in_reasoning(&c->hm))) c->reasoning_tokens++;
        return;
    }
    if (!c->think_on) return;
    srv_choice_scan(j, c, e->finish != AG_FINISH_NONE);
    /* a token whose text lies before the answer's start was reasoning */
    if (e->len && (!ag_think_answer_known(&c->think) || c->think.answer_start >= before + e->len))
        c->reasoning_tokens++;
}

size_t srv_choice_answer(const srv_choice *c, const char **text) {
    if (c->harmony_on) {
        *text = ag_buf_cstr(&c->hm.content);
        return c->hm.content.len;
    }
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
    if (c->harmony_on) {
        *text = ag_buf_cstr(&c->hm.reasoning);
        return c->hm.reasoning.len;
    }
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

/* ---- streaming ---- */

void srv_job_sse(srv_job *j, const char *event, json_t *data) {
    char *t = json_dumps(data, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(data);
    if (!t) return;
    if (event) ag_buf_printf(&j->out, "event: %s\n", event);
    ag_buf_printf(&j->out, "data: %s\n\n", t);
    free(t);
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

/* ---- not streaming ---- */

static void collect_event(srv_job *j, srv_event *e) {
    if (e->choice < 0 || e->choice >= j->n_choices) return;
    if (e->prompt_pos > 0) {
        if (j->proto->collect) j->proto->collect(j, e);
        return;
    }
    srv_choice *c = &j->ch[e->choice];
    if (c->done) return;
    if (j->proto->collect) j->proto->collect(j, e);
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
    const char *path = ag_switch_text("AUGUR_TEST_SCRIPT");
    if (!path) return;
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
    /* harmony: an answer schema's value is the body of a final message,
     * written after its header as gpt-oss writes answers (tool_grammar does
     * the same beside tools) */
    ag_schema *final = NULL;
    if (!script && o->has_answer_schema && !j->tools && j->n_choices && j->ch[0].harmony_on) {
        ag_schema_alt alt = {.prefix = SRV_HARMONY_FINAL, .schema = o->answer_schema};
        if (ag_schema_compile_alts(&alt, 1, &final)) final = NULL; /* compiled once already: out of memory */
    }
    for (int p = 0; p < j->n_prompts; p++) {
        ag_gen_request r = {.prompt = ids[p], .n_prompt = (int)n_ids[p], .max_tokens = o->max_tokens,
                            .n_choices = o->n, .sample = o->sp, .stops = (const char *const *)o->stops,
                            .n_stops = o->n_stops, .ignore_eos = o->ignore_eos,
                            /* completions with echo + logprobs (not streamed): score the prompt */
                            .prompt_logprobs = !j->chat && !j->stream && j->echo && j->logprobs,
                            .schema = script ? script : final ? final : o->schema, .no_output = o->no_output,
                            .spec_max = o->spec_max, .cache_ns = o->cache_ns};
        ag_status st = srv_gen_submit(j->gen, p, &r, p * o->n);
        if (st) {
            ag_schema_unref(script);
            ag_schema_unref(final);
            srv_status_error(out, st, prompt_param);
            j->ended = true; /* nothing was streamed: not a client's loss */
            job_free(j);     /* cancels the prompts already submitted */
            return;
        }
    }
    ag_schema_unref(script); /* the engine holds its own reference */
    ag_schema_unref(final);
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
