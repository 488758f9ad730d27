/* `augur run`: generate a continuation of a prompt, streamed to stdout.
 * A client of the public C API (include/augur.h), like any embedding program. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "augur.h"
#include "base/buf.h"
#include "base/file.h"
#include "cli/cli.h"

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

static int print_piece(const char *piece, size_t len, void *user) {
    (void)user;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0;
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

    /* the flag's own message (the library's would name the field, not the flag) */
    if (dopt.draft && dopt.draft_max && dopt.draft_min > dopt.draft_max)
        return ag_cli_fail("--draft-min %ld is above --draft-max %ld", dopt.draft_min, dopt.draft_max);
    int rc = 1;
    augur_model *m = NULL;
    char *rendered = NULL;
    augur_model_params mp = augur_model_default_params();
    mp.n_threads = (int)threads;
    mp.n_ctx = (int)ctx;
    mp.draft = dopt.draft;
    mp.draft_max = (int)dopt.draft_max;
    mp.draft_min = (int)dopt.draft_min;
    augur_gen_params gp = augur_gen_default_params();
    gp.max_tokens = (int)n_predict;
    gp.temperature = (float)temp;
    gp.top_k = (int)top_k;
    gp.top_p = (float)top_p;
    gp.min_p = (float)min_p;
    gp.repeat_penalty = (float)rep;
    if (have_seed) gp.seed = seed == AUGUR_SEED_RANDOM ? seed - 1 : seed; /* the sentinel is not a seed */
    gp.ignore_eos = ignore_eos;
    const char *input = ag_buf_cstr(&text);
    size_t input_len = text.len;
    /* --device reaches the C library through its switch (augur_model_params
     * has no device field: adding one would change the library's ABI) */
    if (ag_cli_device != AG_DEVICE_AUTO) setenv("AUGUR_DEVICE", ag_device_name(ag_cli_device), 1);
    if (augur_model_load(model_path, &mp, &m)) {
        ag_cli_fail("%s", augur_last_error());
        goto done;
    }
    if (chat) {
        if (memchr(input, 0, input_len)) {
            ag_cli_fail("the prompt contains a NUL byte");
            goto done;
        }
        augur_message msgs[2] = {{"system", system}, {"user", input}};
        if (augur_chat_render(m, system ? msgs : msgs + 1, system ? 2 : 1, true, &rendered, &input_len)) {
            ag_cli_fail("%s", augur_last_error());
            goto done;
        }
        input = rendered;
        gp.prompt_kind = AUGUR_PROMPT_CHAT;
    }
    augur_usage u;
    augur_status st = augur_generate(m, input, input_len, &gp, print_piece, NULL, &u);
    if (st == AUGUR_OK || st == AUGUR_ERR_INTERNAL) { /* output may have started */
        fputc('\n', stdout);
        fflush(stdout);
    }
    if (st) {
        ag_cli_fail("%s", augur_last_error());
        goto done;
    }
    double pf = u.prefill_ms > 0 ? u.prompt_tokens / (u.prefill_ms / 1e3) : 0;
    double dc = u.decode_ms > 0 && u.generated_tokens > 1 ? (u.generated_tokens - 1) / (u.decode_ms / 1e3) : 0;
    fprintf(stderr, "augur: prompt %d tokens, prefill %.1f tok/s (%.1f ms); generated %d tokens, decode %.1f tok/s; %s\n",
            u.prompt_tokens, pf, u.prefill_ms, u.generated_tokens, dc,
            u.finish == AUGUR_FINISH_STOP ? "stopped" : u.finish == AUGUR_FINISH_LENGTH ? "length limit" : "cancelled");
    augur_model_info info;
    if (dopt.draft && !augur_model_get_info(m, &info))
        fprintf(stderr,
                "augur: draft %s (up to %d per step): drafted %d, accepted %d (%.1f%%), %.2f tokens per verify step\n",
                info.draft, info.draft_max, u.drafted_tokens, u.accepted_tokens,
                u.drafted_tokens ? 100.0 * u.accepted_tokens / u.drafted_tokens : 0.0,
                u.verify_steps ? (double)u.verify_tokens / u.verify_steps : 0.0);
    rc = 0;
done:
    augur_free(rendered);
    augur_model_free(m);
    ag_buf_free(&text);
    return rc;
}
