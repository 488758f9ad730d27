/* augur's subcommands. Each takes the arguments after its name (argv[0] is
 * the subcommand name) and returns the process exit code: 0 on success, 1 on
 * a runtime error (one line on stderr), 2 on a usage error. */
#ifndef AG_CLI_H
#define AG_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "spec/sources.h"
#include "tok/tok.h"

int ag_cli_info(int argc, char **argv);
int ag_cli_tokenize(int argc, char **argv);
int ag_cli_detokenize(int argc, char **argv);
int ag_cli_template(int argc, char **argv);
int ag_cli_run(int argc, char **argv);
int ag_cli_bench(int argc, char **argv);
int ag_cli_logits(int argc, char **argv);
int ag_cli_serve(int argc, char **argv);
int ag_cli_cache(int argc, char **argv);
int ag_cli_fit(int argc, char **argv);
int ag_cli_embed(int argc, char **argv);

/* The most sequences `augur serve --parallel` (and `augur fit`) accept: the engine's. */
#define AG_CLI_MAX_PARALLEL AG_ENGINE_MAX_PARALLEL

/* Loads a model (threads: 0 = all cores) and its tokenizer; on failure
 * prints the error, leaves both NULL and returns 1. */
/* The --device every command's model loads use (main.c takes the flag out of argv). */
extern ag_device ag_cli_device;
/* The --tp every command's model loads use (main.c takes it out of argv;
 * 1: no tensor parallelism). */
extern int ag_cli_tp;
int ag_cli_load_model(const char *path, int threads, ag_model **m, ag_tok **tok);

/* Strict parsers for flag values: the whole string must be a number within
 * [min, max]. */
bool ag_cli_parse_long(const char *s, long min, long max, long *out);
bool ag_cli_parse_float(const char *s, double min, double max, double *out);
bool ag_cli_parse_u64(const char *s, uint64_t *out);
/* A byte size: plain bytes, or a number (decimals allowed) with a binary
 * suffix K, M, G or T (optionally followed by "B" or "iB"; any case):
 * "512M", "32G", "1.5GiB", "1048576". */
bool ag_cli_parse_size(const char *s, uint64_t *out);

/* Speculative decoding flags, shared by run, serve and bench:
 * --draft ngram|MODEL.gguf, --draft-max N, --draft-min N. */
typedef struct {
    const char *draft; /* NULL: off */
    long        draft_max, draft_min;
} ag_cli_draft_opts;

#define AG_CLI_DRAFT_USAGE                                                                              \
    "  --draft ngram|MODEL.gguf  speculative decoding: prompt lookup, or a smaller draft model with the\n" \
    "                  target's vocabulary (same output, faster when drafts are accepted)\n"             \
    "  --draft-max N   most tokens drafted per step, 1..32 (default 16; 8 for a draft model without\n" \
    "                  its prompt lookup; the length adapts to acceptance)\n"                           \
    "  --draft-min N   do not verify drafts shorter than N (default 0)\n"

void ag_cli_draft_defaults(ag_cli_draft_opts *o);
/* If `flag` is one of the draft flags: parses `value` into *o and returns
 * 1 (ok) or -1 (bad value); returns 0 for any other flag. */
int ag_cli_draft_flag(const char *flag, const char *value, ag_cli_draft_opts *o);
/* Opens the draft source named in *o (if any) and fills ep->draft and
 * ep->spec; *setup owns it and is freed after the engine. On failure prints
 * the error and returns 1. */
int ag_cli_draft_open(const ag_cli_draft_opts *o, ag_model *m, const ag_tok *tok, int threads,
                      ag_engine_params *ep, ag_draft_setup **setup);

/* Sorts v[0..n) ascending (so v[0] and v[n-1] are the range) and returns
 * its median (the mean of the middle two for even n). n >= 1. */
double ag_cli_sorted_median(double *v, int n);

/* `augur bench --draft`: speculative vs plain greedy decoding on one prompt
 * (prompt_file, or a built-in code edit when NULL). Exit code. */
int ag_cli_bench_spec(const char *model_path, const char *prompt_file, const ag_cli_draft_opts *dopt, int n_gen,
                      int reps, int threads, bool json);

/* Prints "augur: <message>" on stderr and returns 1. */
int ag_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "augur <cmd>: <message>\n<usage>" on stderr and returns 2. */
int ag_cli_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The default model's path: $AUGUR_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf
 * next to the binary's repository (build/..), else that path relative to the
 * current directory. Static storage. */
const char *ag_cli_default_model(void);

#endif
