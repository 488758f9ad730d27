/* `augur run`: generate a continuation of a prompt, streamed to stdout. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/file.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "tmpl/chat.h"

static const char usage[] =
    "usage: augur run [-m MODEL] (-p PROMPT | -f FILE) [options]\n"
    "  streams the continuation (only the new text) to stdout; timings to stderr\n"
    "  -m MODEL        GGUF model (default: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  -p PROMPT       the prompt text;  -f FILE: read it from FILE ('-' = stdin)\n"
    "  -n N            tokens to generate (default 256; 0 = until end of text or context)\n"
    "  --chat          render the prompt as a user message through the model's chat template\n"
    "  --system TEXT   with --chat: a system message first\n"
    "  --temp T        temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K       (default 40; 0 = off)    --top-p P  (default 0.95; 1 = off)\n"
    "  --min-p P       (default 0.05; 0 = off)  --repeat-penalty R (default 1 = off)\n"
    "  --seed S        sampling seed (default: random)\n"
    "  --ctx N         context size (default: the model's, at most 4096)\n"
    "  -t THREADS      CPU threads (default: all cores)\n"
    "  --ignore-eos    keep generating past end-of-text tokens\n" AG_CLI_DRAFT_USAGE;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done;
    ag_finish       finish;
    char            error[512];
    ag_gen_event    last;
} run_state;

static void on_event(void *user, const ag_gen_event *ev) {
    run_state *rs = user;
    if (ev->len) {
        fwrite(ev->text, 1, ev->len, stdout);
        fflush(stdout);
    }
    if (ev->finish != AG_FINISH_NONE) {
        pthread_mutex_lock(&rs->mu);
        rs->done = true;
        rs->finish = ev->finish;
        rs->last = *ev;
        rs->last.text = NULL;
        rs->last.sample = NULL;
        rs->last.error = NULL;
        if (ev->error) snprintf(rs->error, sizeof rs->error, "%s", ev->error);
        pthread_cond_signal(&rs->cv);
        pthread_mutex_unlock(&rs->mu);
    }
}

int ag_cli_run(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *file = NULL, *system = NULL;
    long n_predict = 256, top_k = 40, ctx = 0, threads = 0;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0;
    uint64_t seed = 0;
    bool have_seed = false, chat = false, ignore_eos = false;
    ag_cli_draft_opts dopt;
    ag_cli_draft_defaults(&dopt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--chat")) { chat = true; continue; }
        if (!strcmp(a, "--ignore-eos")) { ignore_eos = true; continue; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        int  df = ag_cli_draft_flag(a, v, &dopt);
        if (df) ok = df > 0;
        else if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-p")) prompt = v;
        else if (!strcmp(a, "-f")) file = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "-n")) ok = ag_cli_parse_long(v, 0, 1 << 24, &n_predict);
        else if (!strcmp(a, "--temp")) ok = ag_cli_parse_float(v, 0, 100, &temp);
        else if (!strcmp(a, "--top-k")) ok = ag_cli_parse_long(v, 0, 1 << 24, &top_k);
        else if (!strcmp(a, "--top-p")) ok = ag_cli_parse_float(v, 0, 1, &top_p);
        else if (!strcmp(a, "--min-p")) ok = ag_cli_parse_float(v, 0, 1, &min_p);
        else if (!strcmp(a, "--repeat-penalty")) ok = ag_cli_parse_float(v, 1e-3, 100, &rep);
        else if (!strcmp(a, "--seed")) ok = have_seed = ag_cli_parse_u64(v, &seed);
        else if (!strcmp(a, "--ctx")) ok = ag_cli_parse_long(v, 2, 1 << 24, &ctx);
        else if (!strcmp(a, "-t")) ok = ag_cli_parse_long(v, 1, 1024, &threads);
        else return ag_cli_usage_error(usage, "run: unknown option '%s'", a);
        if (!v) return ag_cli_usage_error(usage, "run: %s needs a value", a);
        if (!ok) return ag_cli_usage_error(usage, "run: invalid value '%s' for %s", v, a);
        i++;
    }
    if (!!prompt == !!file) return ag_cli_usage_error(usage, "run: give exactly one of -p PROMPT or -f FILE");
    if (!model_path) model_path = ag_cli_default_model();

    ag_buf text = {0};
    if (file) {
        char *data;
        size_t len;
        if (!strcmp(file, "-")) {
            char tmp[65536];
            size_t got;
            while ((got = fread(tmp, 1, sizeof tmp, stdin)) > 0) ag_buf_append(&text, tmp, got);
        } else {
            if (ag_file_read_all(file, &data, &len)) return ag_cli_fail("%s", ag_error_message());
            ag_buf_append(&text, data, len);
            free(data);
        }
    } else {
        ag_buf_append_str(&text, prompt);
    }

    int rc = 1;
    ag_model *m = NULL;
    ag_tok *tok = NULL;
    ag_engine *eng = NULL;
    ag_draft_setup *draft = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    ag_buf rendered = {0};
    if (ag_cli_load_model(model_path, (int)threads, &m, &tok)) goto done;
    const char *input = ag_buf_cstr(&text);
    size_t input_len = text.len;
    bool add_special = true;
    if (chat) {
        ag_chat *fmt = NULL;
        if (ag_chat_from_gguf(ag_model_gguf(m), &fmt)) {
            ag_cli_fail("%s: chat template: %s", model_path, ag_error_message());
            goto done;
        }
        json_t *msgs = json_array();
        if (system) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
        json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", input, input_len));
        ag_status st = ag_chat_render(fmt, msgs, NULL, true, NULL, &rendered);
        json_decref(msgs);
        /* A template that writes BOS itself must not get a second one. */
        add_special = !ag_chat_has_bos(fmt, ag_buf_cstr(&rendered), rendered.len);
        ag_chat_free(fmt);
        if (st) {
            ag_cli_fail("%s: chat template: %s", model_path, ag_error_message());
            goto done;
        }
        input = ag_buf_cstr(&rendered);
        input_len = rendered.len;
    }
    /* BOS exactly as the model's metadata says; special-token text is only
     * parsed in a chat-rendered prompt (where the template put it). */
    if (ag_tok_encode(tok, input, input_len, add_special, chat, &ids, &n_ids)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    if (n_ids == 0) {
        ag_cli_fail("the prompt is empty");
        goto done;
    }
    ag_engine_params ep = ag_engine_default_params();
    ep.n_parallel = 1;
    ep.n_ctx = (int)ctx;
    ep.max_queue = 1;
    if (ag_cli_draft_open(&dopt, m, tok, (int)threads, &ep, &draft)) goto done;
    if (ag_engine_new(m, tok, &ep, &eng)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    if (!have_seed) seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    run_state rs = {.done = false};
    pthread_mutex_init(&rs.mu, NULL);
    pthread_cond_init(&rs.cv, NULL);
    ag_gen_request req = {.prompt = ids, .n_prompt = (int)n_ids, .max_tokens = (int)n_predict, .n_choices = 1,
                          .sample = ag_sample_default_params(), .ignore_eos = ignore_eos, .cb = on_event,
                          .user = &rs};
    req.sample.temperature = (float)temp;
    req.sample.top_k = (int32_t)top_k;
    req.sample.top_p = (float)top_p;
    req.sample.min_p = (float)min_p;
    req.sample.repetition_penalty = (float)rep;
    req.sample.penalty_last_n = 64;
    req.sample.seed = seed;
    if (ag_engine_submit(eng, &req, NULL)) {
        ag_cli_fail("%s", ag_error_message());
        goto done_state;
    }
    pthread_mutex_lock(&rs.mu);
    while (!rs.done) pthread_cond_wait(&rs.cv, &rs.mu);
    pthread_mutex_unlock(&rs.mu);
    fputc('\n', stdout);
    fflush(stdout);
    if (rs.finish == AG_FINISH_ERROR) {
        ag_cli_fail("%s", rs.error);
        goto done_state;
    }
    {
        const ag_gen_event *u = &rs.last;
        double pf = u->t_prefill_ms > 0 ? u->n_prompt / (u->t_prefill_ms / 1e3) : 0;
        double dc = u->t_decode_ms > 0 && u->n_generated > 1 ? (u->n_generated - 1) / (u->t_decode_ms / 1e3) : 0;
        fprintf(stderr, "augur: prompt %d tokens, prefill %.1f tok/s (%.1f ms); generated %d tokens, decode %.1f tok/s; %s\n",
                u->n_prompt, pf, u->t_prefill_ms, u->n_generated, dc,
                rs.finish == AG_FINISH_STOP ? "stopped" : rs.finish == AG_FINISH_LENGTH ? "length limit" : "cancelled");
        if (draft) {
            ag_engine_stats es;
            ag_engine_get_stats(eng, &es);
            fprintf(stderr, "augur: draft %s: drafted %d, accepted %d (%.1f%%), %.2f tokens per verify step\n",
                    ag_draft_setup_factory(draft)->name, u->n_drafted, u->n_accepted,
                    u->n_drafted ? 100.0 * u->n_accepted / u->n_drafted : 0.0,
                    es.spec.rounds ? (double)es.spec.emitted / (double)es.spec.rounds : 0.0);
        }
    }
    rc = 0;
done_state:
    pthread_mutex_destroy(&rs.mu);
    pthread_cond_destroy(&rs.cv);
done:
    ag_engine_free(eng);
    ag_draft_setup_close(draft);
    free(ids);
    ag_tok_free(tok);
    ag_model_free(m);
    ag_buf_free(&text);
    ag_buf_free(&rendered);
    return rc;
}
