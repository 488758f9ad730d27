/* The structured-output mask's cost per decode step on a real vocabulary:
 * replays a JSON text token by token under its schema and times
 * ag_schema_mask at every position (median and 90th percentile, in
 * microseconds), split by where the step is (inside a string, elsewhere).
 *
 *   build/bench/schema_bench MODEL.gguf [REPS]
 *
 * Compare the median with a decode step (augur bench's tg tok/s) for the
 * mask's share of decoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "sample/schema.h"
#include "tok/tok.h"

static const char k_schema[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 40},"
    "\"age\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 150},"
    "\"email\": {\"type\": \"string\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"admin\", \"user\", \"guest\"]}, \"maxItems\": 5},"
    "\"address\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"type\": "
    "[\"string\", \"null\"]}}, \"required\": [\"city\", \"zip\"]},"
    "\"score\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}},"
    "\"required\": [\"name\", \"age\", \"tags\", \"address\", \"score\"]}";

static const char k_text[] =
    "{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.com\",\n"
    "  \"tags\": [\"admin\", \"user\"],\n  \"address\": {\"city\": \"London\", \"zip\": null},\n"
    "  \"score\": 0.875\n}";

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *t, size_t n) {
    if (!n) return;
    qsort(t, n, sizeof *t, cmp_double);
    printf("%-10s %5zu steps  median %8.1f us  p90 %8.1f us  max %8.1f us\n", what, n, t[n / 2], t[n * 9 / 10],
           t[n - 1]);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [REPS]\n", argv[0]);
        return 2;
    }
    int      reps = argc > 2 ? atoi(argv[2]) : 5;
    ag_gguf *g;
    ag_tok  *tok;
    if (ag_gguf_open(argv[1], &g) || ag_tok_from_gguf(g, &tok)) {
        fprintf(stderr, "%s\n", ag_error_message());
        return 1;
    }
    double           t0 = now_us();
    ag_schema_vocab *v;
    if (ag_schema_vocab_new(tok, &v)) return 1;
    printf("vocab %d tokens: tables built in %.1f ms\n", ag_tok_n_vocab(tok), (now_us() - t0) / 1e3);
    json_t    *j = json_loads(k_schema, 0, NULL);
    ag_schema *s;
    if (!j || ag_schema_compile(j, &s)) {
        fprintf(stderr, "schema: %s\n", ag_error_message());
        return 1;
    }
    int32_t *ids;
    size_t   n_ids;
    if (ag_tok_encode(tok, k_text, strlen(k_text), false, false, &ids, &n_ids)) return 1;
    const int32_t n = ag_tok_n_vocab(tok);
    float        *logits = malloc((size_t)n * sizeof *logits);
    double       *in_str = malloc(n_ids * (size_t)reps * sizeof *in_str);
    double       *other = malloc(n_ids * (size_t)reps * sizeof *other);
    double       *all = malloc(n_ids * (size_t)reps * sizeof *all);
    size_t        n_str = 0, n_other = 0, n_all = 0;
    for (int r = 0; r < reps; r++) {
        ag_schema_matcher *m;
        if (ag_schema_matcher_new(s, v, &m)) return 1;
        size_t fed = 0; /* bytes of k_text fed so far */
        for (size_t i = 0; i < n_ids; i++) {
            for (int32_t k = 0; k < n; k++) logits[k] = 0.0f;
            /* inside a string: an odd number of unescaped quotes before (the text has no escapes) */
            int quotes = 0;
            for (size_t b = 0; b < fed; b++) quotes += k_text[b] == '"';
            double a = now_us();
            ag_schema_mask(m, logits);
            double dt = now_us() - a;
            if (logits[ids[i]] != 0.0f) {
                fprintf(stderr, "token %zu of the text is masked: the text does not fit the schema\n", i);
                return 1;
            }
            if (getenv("SCHEMA_BENCH_SLOW") && dt > atof(getenv("SCHEMA_BENCH_SLOW"))) printf("  %.0f us after [%.*s]\n", dt, (int)fed, k_text);
            all[n_all++] = dt;
            if (quotes & 1) in_str[n_str++] = dt;
            else other[n_other++] = dt;
            size_t      len;
            const char *p = ag_tok_piece(tok, ids[i], &len);
            if (!ag_schema_feed(m, p, len)) return 1;
            fed += len;
        }
        if (!ag_schema_done(m)) return 1;
        ag_schema_matcher_free(m);
    }
    report("all", all, n_all);
    report("in string", in_str, n_str);
    report("elsewhere", other, n_other);
    free(ids);
    free(logits);
    free(in_str);
    free(other);
    free(all);
    ag_schema_unref(s);
    json_decref(j);
    ag_schema_vocab_free(v);
    ag_tok_free(tok);
    ag_gguf_free(g);
    return 0;
}
