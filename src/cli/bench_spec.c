/* `augur bench --draft ...`: speculative decoding against plain decoding on
 * one prompt, through the engine (greedy, the same request with speculation
 * off and on, alternating, median over repetitions): decode tok/s of both,
 * the speedup, the acceptance and the tokens per verify step, and whether
 * the two outputs are identical (they must be). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "cli/cli.h"
#include "tmpl/chat.h"

/* The default prompt: a code edit, where prompt lookup pays off. */
static const char k_default_prompt[] =
    "Rewrite this Python function so that it uses a list comprehension instead of the loop. Keep the rest "
    "of the file exactly the same.\n\n"
    "def collect_even_squares(numbers, limit):\n"
    "    \"\"\"Return the squares of the even numbers below limit.\"\"\"\n"
    "    result = []\n"
    "    for n in numbers:\n"
    "        if n % 2 == 0 and n < limit:\n"
    "            result.append(n * n)\n"
    "    return result\n\n\n"
    "def print_report(values):\n"
    "    total = sum(values)\n"
    "    print(\"count:\", len(values))\n"
    "    print(\"total:\", total)\n"
    "    print(\"mean:\", total / len(values))\n";

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done;
    ag_finish       finish;
    ag_gen_event    last;
    int32_t        *tokens;
    int             n, cap;
} bench_run;

static void on_event(void *user, const ag_gen_event *ev) {
    bench_run *b = user;
    pthread_mutex_lock(&b->mu);
    if (ev->token >= 0 && ev->prompt_pos == 0 && b->n < b->cap) b->tokens[b->n++] = ev->token;
    if (ev->finish != AG_FINISH_NONE) {
        b->done = true;
        b->finish = ev->finish;
        b->last = *ev;
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

/* One greedy generation; fills *tok_s (decode tok/s after the first token)
 * and the run's tokens. Returns false on error (printed). */
static bool generate(ag_engine *e, const int32_t *ids, int n_ids, int n_gen, int spec_max, bench_run *b,
                     double *tok_s) {
    b->done = false;
    b->n = 0;
    ag_gen_request r = {.prompt = ids, .n_prompt = n_ids, .max_tokens = n_gen, .n_choices = 1,
                        .sample = ag_sample_default_params(), .spec_max = spec_max, .cb = on_event, .user = b};
    r.sample.temperature = 0;
    if (ag_engine_submit(e, &r, NULL)) {
        ag_cli_fail("%s", ag_error_message());
        return false;
    }
    pthread_mutex_lock(&b->mu);
    while (!b->done) pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (b->finish == AG_FINISH_ERROR) {
        ag_cli_fail("generation failed");
        return false;
    }
    const ag_gen_event *u = &b->last;
    *tok_s = u->t_decode_ms > 0 && u->n_generated > 1 ? (u->n_generated - 1) / (u->t_decode_ms / 1e3) : 0;
    return true;
}

int ag_cli_bench_spec(const char *model_path, const char *prompt_file, const ag_cli_draft_opts *dopt, int n_gen,
                      int reps, int threads, bool json) {
    int             rc = 1;
    ag_model       *m = NULL;
    ag_tok         *tok = NULL;
    ag_engine      *eng = NULL;
    ag_draft_setup *draft = NULL;
    ag_chat        *chat = NULL;
    ag_buf          text = {0}, rendered = {0};
    int32_t        *ids = NULL, *plain_tokens = NULL;
    size_t          n_ids = 0;
    double         *t_plain = calloc((size_t)reps, sizeof(double)), *t_spec = calloc((size_t)reps, sizeof(double));
    bench_run       b = {.cap = n_gen};
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    b.tokens = malloc(sizeof(int32_t) * (size_t)n_gen);
    plain_tokens = malloc(sizeof(int32_t) * (size_t)n_gen);
    if (!t_plain || !t_spec || !b.tokens || !plain_tokens) {
        ag_cli_fail("out of memory");
        goto done;
    }
    if (prompt_file) {
        char  *data;
        size_t len;
        if (ag_file_read_all(prompt_file, &data, &len)) {
            ag_cli_fail("%s", ag_error_message());
            goto done;
        }
        ag_buf_append(&text, data, len);
        free(data);
    } else {
        ag_buf_append_str(&text, k_default_prompt);
    }
    if (ag_cli_load_model(model_path, threads, &m, &tok)) goto done;
    /* as a user message through the model's chat template when it has one */
    const char *input = ag_buf_cstr(&text);
    size_t      input_len = text.len;
    bool        add_special = true, parse_special = false;
    if (!ag_chat_from_gguf(ag_model_gguf(m), &chat)) {
        json_t *msgs = json_array();
        json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", input, input_len));
        if (!ag_chat_render(chat, msgs, NULL, true, NULL, &rendered)) {
            input = ag_buf_cstr(&rendered);
            input_len = rendered.len;
            add_special = !ag_chat_has_bos(chat, input, input_len);
            parse_special = true;
        }
        json_decref(msgs);
    }
    if (ag_tok_encode(tok, input, input_len, add_special, parse_special, &ids, &n_ids) || n_ids == 0) {
        ag_cli_fail("the prompt could not be tokenized: %s", ag_error_message());
        goto done;
    }
    ag_engine_params ep = ag_engine_default_params();
    ep.n_parallel = 1;
    ep.n_ctx = (int)n_ids + n_gen + 1;
    if (ag_cli_draft_open(dopt, m, tok, threads, &ep, &draft)) goto done;
    if (ag_engine_new(m, tok, &ep, &eng)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    int n_plain = 0, mismatches = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up of both */
        double a, s;
        if (!generate(eng, ids, (int)n_ids, n_gen, -1, &b, &a)) goto done;
        memcpy(plain_tokens, b.tokens, sizeof(int32_t) * (size_t)b.n);
        n_plain = b.n;
        if (!generate(eng, ids, (int)n_ids, n_gen, 0, &b, &s)) goto done;
        if (b.n != n_plain || memcmp(b.tokens, plain_tokens, sizeof(int32_t) * (size_t)b.n)) mismatches++;
        if (r >= 0) {
            t_plain[r] = a;
            t_spec[r] = s;
        }
    }
    ag_engine_stats st;
    ag_engine_get_stats(eng, &st);
    double mp = ag_cli_sorted_median(t_plain, reps), ms = ag_cli_sorted_median(t_spec, reps);
    double acc = st.spec.drafted ? (double)st.spec.accepted / (double)st.spec.drafted : 0;
    double per_step = st.spec.rounds ? (double)st.spec.emitted / (double)st.spec.rounds : 0;
    if (json) {
        printf("{\"model\": \"%s\", \"draft\": \"%s\", \"draft_max\": %d, \"prompt_tokens\": %zu, "
               "\"tokens\": %d, \"reps\": %d, \"plain_tok_s\": %.2f, \"spec_tok_s\": %.2f, \"speedup\": %.3f, \"acceptance\": %.4f, "
               "\"tokens_per_verify\": %.3f, \"drafted\": %llu, \"accepted\": %llu, \"mismatches\": %d}\n",
               model_path, dopt->draft, ep.spec.draft_max, n_ids, n_plain, reps, mp, ms, mp > 0 ? ms / mp : 0, acc,
               per_step,
               (unsigned long long)st.spec.drafted, (unsigned long long)st.spec.accepted, mismatches);
    } else {
        printf("model: %s, draft: %s (up to %d per step), prompt %zu tokens, %d generated, %d threads, %d reps\n",
               model_path, dopt->draft, ep.spec.draft_max, n_ids, n_plain, ag_cpu_backend_threads(ag_model_backend(m)),
               reps);
        printf("plain decode   %8.2f tok/s\n", mp);
        printf("speculative    %8.2f tok/s  (%.2fx)\n", ms, mp > 0 ? ms / mp : 0);
        printf("drafted %llu, accepted %llu (%.1f%%), %.2f tokens per verify step\n",
               (unsigned long long)st.spec.drafted, (unsigned long long)st.spec.accepted, 100 * acc, per_step);
        printf("outputs identical: %s\n", mismatches ? "NO" : "yes");
    }
    rc = mismatches ? 1 : 0;
    if (mismatches) ag_cli_fail("speculative output differed from plain decoding in %d of %d runs", mismatches, reps + 1);
done:
    ag_engine_free(eng);
    ag_draft_setup_close(draft);
    ag_chat_free(chat);
    ag_tok_free(tok);
    ag_model_free(m);
    ag_buf_free(&text);
    ag_buf_free(&rendered);
    free(ids);
    free(plain_tokens);
    free(b.tokens);
    free(t_plain);
    free(t_spec);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    return rc;
}
