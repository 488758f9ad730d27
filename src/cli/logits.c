/* `augur logits`: teacher-forced logits for a list of token ids, written as
 * raw little-endian float32 [n_tokens][n_vocab]. A developer tool for the
 * parity tests against llama.cpp (tests/py/test_parity.py); it exercises the
 * same model, KV cache and batch path as generation. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kv/kv.h"
#include "model/model.h"

static const char usage[] =
    "usage: augur logits [-m MODEL] --tokens FILE -o OUT [--chunk N] [--decode] [-t THREADS] [--kv f16|f32]\n"
    "  FILE: whitespace-separated token ids. OUT: float32 logits, one row of n_vocab per token.\n"
    "  --chunk N: tokens per forward pass (default 64; 1 = token-by-token).\n"
    "  --decode: run each chunk as decode rows (the kernels of decoding and speculative verify)\n"
    "            instead of prompt rows.\n";

static int read_ids(const char *path, int32_t **ids, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) return ag_cli_fail("%s: %s", path, strerror(errno));
    int cap = 1024, k = 0;
    int32_t *a = malloc(sizeof *a * cap);
    long v;
    while (a && fscanf(f, "%ld", &v) == 1) {
        if (k == cap) {
            int32_t *b = realloc(a, sizeof *a * (cap *= 2));
            if (!b) {
                free(a);
                a = NULL;
                break;
            }
            a = b;
        }
        a[k++] = (int32_t)v;
    }
    int bad = !feof(f);
    fclose(f);
    if (!a) return ag_cli_fail("out of memory");
    if (bad || k == 0) {
        free(a);
        return ag_cli_fail("%s: expected whitespace-separated token ids", path);
    }
    *ids = a;
    *n = k;
    return 0;
}

int ag_cli_logits(int argc, char **argv) {
    const char *model_path = NULL, *tokens_path = NULL, *out_path = NULL;
    int chunk = 64;
    bool as_decode = false;
    ag_model_params mp = ag_model_default_params();
    mp.device = ag_cli_device;
    mp.tp = ag_cli_tp;
    ag_kv_dtype dtype = AG_KV_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--decode")) {
            as_decode = true;
            continue;
        }
        if (!val) return ag_cli_usage_error(usage, "option %s needs a value (or is unknown)", a);
        if (!strcmp(a, "-m")) model_path = val;
        else if (!strcmp(a, "--tokens")) tokens_path = val;
        else if (!strcmp(a, "-o")) out_path = val;
        else if (!strcmp(a, "--chunk")) chunk = atoi(val);
        else if (!strcmp(a, "-t")) mp.cpu.n_threads = atoi(val);
        else if (!strcmp(a, "--kv")) {
            if (!strcmp(val, "f16")) dtype = AG_KV_F16;
            else if (!strcmp(val, "f32")) dtype = AG_KV_F32;
            else return ag_cli_usage_error(usage, "--kv must be f16 or f32");
        } else return ag_cli_usage_error(usage, "unknown option %s", a);
        i++;
    }
    if (!tokens_path || !out_path) return ag_cli_usage_error(usage, "--tokens and -o are required");
    if (chunk < 1) return ag_cli_usage_error(usage, "--chunk must be >= 1");
    if (!model_path) model_path = ag_cli_default_model();

    int32_t *ids = NULL;
    int n = 0;
    if (read_ids(tokens_path, &ids, &n)) return 1;
    ag_model *m = NULL;
    ag_kv *kv = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    int rc = 1;
    ag_status st = ag_model_load(model_path, &mp, &m);
    if (st) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    const ag_model_config *c = ag_model_config_of(m);
    ag_kv_params kp;
    {
        /* Size the pool for exactly this sequence, and a spare block (its
         * layout needs no allocation: a probe pool of a fixed size was below
         * one block of an 8B model's) */
        ag_kv_layout L;
        if ((st = ag_model_kv_params(m, dtype, 1, 0, &kp, &L))) {
            ag_cli_fail("%s", ag_error_message());
            goto done;
        }
        kp.budget_bytes = ag_kv_budget_for(&L, 1, n + L.block_size);
        kp.ring_step = chunk; /* (a sliding-window ring holds a chunk beside the window) */
    }
    if ((st = ag_kv_init(&kp, &kv))) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    int32_t seq;
    if ((st = ag_kv_seq_new(kv, &seq))) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    logits = malloc(sizeof(float) * (size_t)chunk * c->n_vocab);
    int32_t *pos = malloc(sizeof(int32_t) * chunk), *seqs = malloc(sizeof(int32_t) * chunk);
    uint8_t *want = malloc(chunk);
    out = fopen(out_path, "wb");
    if (!logits || !pos || !seqs || !want || !out) {
        free(pos);
        free(seqs);
        free(want);
        ag_cli_fail("cannot allocate or open %s", out_path);
        goto done;
    }
    for (int i = 0; i < chunk; i++) {
        seqs[i] = seq;
        want[i] = 1;
    }
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int k = n - p0 < chunk ? n - p0 : chunk;
        for (int i = 0; i < k; i++) pos[i] = p0 + i;
        ag_batch b = {.n = k, .token = ids + p0, .pos = pos, .seq = seqs, .want_logits = want,
                     .n_prompt = as_decode ? 0 : k};
        if ((st = ag_kv_seq_reserve(kv, seq, k)) || (st = ag_model_forward(m, kv, &b, logits)) ||
            (st = ag_kv_seq_commit(kv, seq, p0 + k))) {
            ag_cli_fail("%s", ag_error_message());
            break;
        }
        if (fwrite(logits, sizeof(float) * c->n_vocab, (size_t)k, out) != (size_t)k) {
            st = AG_ERR_IO;
            ag_cli_fail("%s: write failed", out_path);
            break;
        }
    }
    free(pos);
    free(seqs);
    free(want);
    if (!st) rc = 0;
done:
    if (out && fclose(out) != 0 && rc == 0) rc = ag_cli_fail("%s: write failed", out_path);
    free(logits);
    free(ids);
    ag_kv_free(kv);
    ag_model_free(m);
    return rc;
}
