/* `augur embed`: embedding vectors of texts with an embedding model
 * (nomic-bert), one JSON array per input on stdout, in input order. Inputs
 * are packed into forward passes of up to --batch tokens. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"

static const char usage[] =
    "usage: augur embed [-m MODEL] [-t THREADS] [--dimensions N] [--batch N] (-f FILE | TEXT...)\n"
    "  prints one JSON array (the L2-normalized embedding) per input, one per line, in order\n"
    "  TEXT...          each argument is one input\n"
    "  -f FILE          one input per line ('-' for stdin); empty lines are skipped\n"
    "  --dimensions N   Matryoshka truncation to the first N dimensions, re-normalized\n"
    "  --batch N        most tokens per forward pass (default 4096; a longer input runs alone)\n"
    "  -m MODEL         a GGUF (nomic-embed) or a model folder (EmbeddingGemma: models/embeddinggemma-300m)\n"
    "  The model's tokenizer adds its special tokens ([CLS] ... [SEP], <bos> ... <eos>); special-token\n"
    "  text in the input stays text (as llama.cpp's embed); nomic-embed expects a task prefix in the\n"
    "  text itself (\"search_query: \", \"search_document: \", ...), EmbeddingGemma its prompt\n"
    "  (\"task: search result | query: \", \"title: none | text: \", ...).\n";

static int read_lines(const char *path, char ***out, int *n) {
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return ag_cli_fail("%s: %s", path, strerror(errno));
    char  *line = NULL;
    size_t cap = 0;
    int    k = 0, lcap = 0;
    char **v = NULL;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (k == lcap) {
            char **w = realloc(v, sizeof *v * (size_t)(lcap = lcap ? lcap * 2 : 64));
            if (!w) break;
            v = w;
        }
        if (!(v[k] = strdup(line))) break;
        k++;
    }
    free(line);
    if (f != stdin) fclose(f);
    *out = v;
    *n = k;
    return 0;
}

int ag_cli_embed(int argc, char **argv) {
    const char *model_path = NULL, *file = NULL;
    long        threads = 0, dims = 0, batch = 4096;
    char      **texts = NULL;
    int         n_text = 0, n_arg = 0;
    char      **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) return ag_cli_fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            free(args);
            return 0;
        }
        if (a[0] != '-' || !strcmp(a, "--")) {
            if (!strcmp(a, "--")) {
                while (++i < argc) args[n_arg++] = argv[i];
                break;
            }
            args[n_arg++] = argv[i];
            continue;
        }
        if (!val) return free(args), ag_cli_usage_error(usage, "option %s needs a value (or is unknown)", a);
        bool ok = true;
        if (!strcmp(a, "-m")) model_path = val;
        else if (!strcmp(a, "-f")) file = val;
        else if (!strcmp(a, "-t")) ok = ag_cli_parse_long(val, 0, 4096, &threads);
        else if (!strcmp(a, "--dimensions")) ok = ag_cli_parse_long(val, 1, 1 << 20, &dims);
        else if (!strcmp(a, "--batch")) ok = ag_cli_parse_long(val, 1, 1 << 24, &batch);
        else return free(args), ag_cli_usage_error(usage, "unknown option %s", a);
        if (!ok) return free(args), ag_cli_usage_error(usage, "bad value for %s: '%s'", a, val);
        i++;
    }
    if (!!file == !!n_arg) return free(args), ag_cli_usage_error(usage, "give either -f FILE or TEXT arguments");
    int rc = 0;
    if (file) {
        if ((rc = read_lines(file, &texts, &n_text))) return free(args), rc;
    } else {
        texts = args, n_text = n_arg;
    }
    if (n_text == 0) {
        rc = ag_cli_fail("no input");
        goto out_texts;
    }
    ag_model *m = NULL;
    ag_tok   *tok = NULL;
    if ((rc = ag_cli_load_model(model_path ? model_path : ag_cli_default_model(), (int)threads, &m, &tok)))
        goto out_texts;
    const ag_model_config *c = ag_model_config_of(m);
    if (!ag_model_is_encoder(m)) {
        rc = ag_cli_fail("'%s' is a generative model, not an embedding model", c->arch_name);
        goto out_model;
    }
    if (dims > c->n_embd) {
        rc = ag_cli_fail("--dimensions %ld: the model has %d", dims, c->n_embd);
        goto out_model;
    }
    const int out_dims = dims ? (int)dims : c->n_embd;
    int32_t **ids = calloc((size_t)n_text, sizeof *ids);
    size_t   *lens = calloc((size_t)n_text, sizeof *lens);
    int32_t  *flat = NULL, *start = NULL;
    float    *vec = NULL;
    if (!ids || !lens) {
        rc = ag_cli_fail("out of memory");
        goto out_ids;
    }
    for (int i = 0; i < n_text; i++) {
        if (ag_tok_encode(tok, texts[i], strlen(texts[i]), true, false, &ids[i], &lens[i])) {
            rc = ag_cli_fail("input %d: %s", i, ag_error_message());
            goto out_ids;
        }
        if ((long)lens[i] > c->n_ctx_train) {
            rc = ag_cli_fail("input %d has %zu tokens, more than the model's context (%d)", i, lens[i], c->n_ctx_train);
            goto out_ids;
        }
    }
    /* pack consecutive inputs into passes of at most `batch` tokens */
    flat = malloc(sizeof *flat * (size_t)(batch > c->n_ctx_train ? batch : c->n_ctx_train));
    start = malloc(sizeof *start * ((size_t)n_text + 1));
    vec = malloc(sizeof *vec * (size_t)n_text * c->n_embd);
    if (!flat || !start || !vec) {
        rc = ag_cli_fail("out of memory");
        goto out_ids;
    }
    for (int i0 = 0; i0 < n_text;) {
        int i1 = i0, n = 0;
        start[0] = 0;
        while (i1 < n_text && (i1 == i0 || n + (long)lens[i1] <= batch)) {
            memcpy(flat + n, ids[i1], sizeof *flat * lens[i1]);
            n += (int)lens[i1];
            start[i1 - i0 + 1] = n;
            i1++;
        }
        if (ag_model_embed(m, flat, start, i1 - i0, vec)) {
            rc = ag_cli_fail("%s", ag_error_message());
            goto out_ids;
        }
        for (int i = 0; i < i1 - i0; i++) {
            float *e = vec + (size_t)i * c->n_embd;
            ag_model_embed_truncate(m, e, out_dims, e);
            putchar('[');
            for (int j = 0; j < out_dims; j++) printf(j ? ",%.9g" : "%.9g", e[j]);
            puts("]");
        }
        i0 = i1;
    }
out_ids:
    for (int i = 0; ids && i < n_text; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(flat);
    free(start);
    free(vec);
out_model:
    ag_tok_free(tok);
    ag_model_free(m);
out_texts:
    if (file) {
        for (int i = 0; i < n_text; i++) free(texts[i]);
        free(texts);
    }
    free(args);
    return rc;
}
