/* augur: the command-line entry point. Thin: picks a subcommand. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/comm.h"
#include "base/switches.h"
#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"info", ag_cli_info, "show a model file's architecture, hyper-parameters, tensors, tokenizer"},
    {"tokenize", ag_cli_tokenize, "print the token ids of a text"},
    {"detokenize", ag_cli_detokenize, "print the text of token ids"},
    {"template", ag_cli_template, "render a conversation through a chat template"},
    {"run", ag_cli_run, "generate text from a prompt"},
    {"bench", ag_cli_bench, "measure prefill and decode speed"},
    {"logits", ag_cli_logits, "dump teacher-forced logits of token ids (parity tests)"},
    {"embed", ag_cli_embed, "print embedding vectors of texts (an embedding model)"},
    {"serve", ag_cli_serve, "serve the OpenAI-compatible HTTP API"},
    {"fit", ag_cli_fit, "predict serve's memory use and the largest context / parallelism that fit"},
    {"cache", ag_cli_cache, "list, summarize or clear the KV prefix cache's disk tier (no model needed)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: augur <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'augur <command> --help' shows a command's options. Every command that loads a model\n"
               "takes --device cpu|cuda|auto (default auto: cuda when built in and a GPU is present)\n"
               "and --tp N (tensor parallelism: the model split over N shards; CPU only for now).\n");
}

int ag_cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("augur: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int ag_cli_usage_error(const char *usage_text, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("augur: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fputs(usage_text, stderr);
    return 2;
}

const char *ag_cli_default_model(void) {
    static char path[4096];
    static const char rel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *env = ag_switch_text("AUGUR_MODEL");
    if (env) return env;
    char exe[3072];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/'); /* .../build/augur -> .../build */
        if (slash) {
            *slash = '\0';
            slash = strrchr(exe, '/'); /* .../build -> ... */
            if (slash) {
                *slash = '\0';
                snprintf(path, sizeof path, "%s/%s", exe, rel);
                if (access(path, R_OK) == 0) return path;
            }
        }
    }
    return rel;
}

ag_device ag_cli_device = AG_DEVICE_AUTO;
int       ag_cli_tp = 1;

/* Takes `--tp N` (or --tp=N) out of argv as take_device_flag does --device
 * (AUGUR_TP the default), and passes it on to the C library's loads
 * (`augur run`) through AUGUR_TP. */
static bool take_tp_flag(int *argc, char **argv) {
    ag_cli_tp = (int)ag_switch_int("AUGUR_TP", 1, AG_COMM_MAX_RANKS, 1);
    int w = 0;
    for (int r = 0; r < *argc; r++) {
        const char *v = NULL;
        if (!strcmp(argv[r], "--tp")) {
            if (r + 1 >= *argc) return ag_cli_fail("--tp needs a value: the number of shards") == 0;
            v = argv[++r];
        } else if (!strncmp(argv[r], "--tp=", 5)) {
            v = argv[r] + 5;
        } else {
            argv[w++] = argv[r];
            continue;
        }
        long n;
        if (!ag_cli_parse_long(v, 1, AG_COMM_MAX_RANKS, &n))
            return ag_cli_fail("--tp %s: expected a number of shards from 1 to %d", v, AG_COMM_MAX_RANKS) == 0;
        ag_cli_tp = (int)n;
        char buf[16];
        snprintf(buf, sizeof buf, "%d", ag_cli_tp);
        setenv("AUGUR_TP", buf, 1);
    }
    *argc = w;
    argv[w] = NULL;
    return true;
}

/* Takes `--device cpu|cuda|auto` (or --device=X) out of argv wherever it
 * appears, so every command that loads a model honours it without parsing
 * it itself. Returns false (after a message) for a bad value. */
static bool take_device_flag(int *argc, char **argv) {
    const char *env = ag_switch_text("AUGUR_DEVICE");
    if (env && !ag_device_parse(env, &ag_cli_device)) {
        ag_cli_fail("AUGUR_DEVICE=%s: expected cpu, cuda or auto", env);
        return false;
    }
    int w = 0;
    for (int r = 0; r < *argc; r++) {
        const char *v = NULL;
        if (!strcmp(argv[r], "--device")) {
            if (r + 1 >= *argc) return ag_cli_fail("--device needs a value: cpu, cuda or auto") == 0;
            v = argv[++r];
        } else if (!strncmp(argv[r], "--device=", 9)) {
            v = argv[r] + 9;
        } else {
            argv[w++] = argv[r];
            continue;
        }
        if (!ag_device_parse(v, &ag_cli_device)) return ag_cli_fail("--device %s: expected cpu, cuda or auto", v) == 0;
    }
    *argc = w;
    argv[w] = NULL;
    return true;
}

int main(int argc, char **argv) {
    if (!take_device_flag(&argc, argv)) return 2;
    if (!take_tp_flag(&argc, argv)) return 2;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "augur: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
