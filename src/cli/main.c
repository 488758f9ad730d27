/* augur: the command-line entry point. Thin: picks a subcommand. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    {"serve", ag_cli_serve, "serve the OpenAI-compatible HTTP API"},
    {"fit", ag_cli_fit, "predict serve's memory use and the largest context / parallelism that fit"},
    {"cache", ag_cli_cache, "list, summarize or clear the KV prefix cache's disk tier (no model needed)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: augur <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'augur <command> --help' shows a command's options.\n");
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
    const char *env = getenv("AUGUR_MODEL");
    if (env && *env) return env;
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

int main(int argc, char **argv) {
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
