/* bench/draft_accept.c: how many of a draft model's greedy proposals the
 * target accepts, and what the draft's confidence threshold (p_min) buys.
 *
 *   build/bench/draft_accept TARGET.gguf DRAFT.gguf [n_gen 64] [threads 2] [max_d 8] [p_min 0]
 *
 * For each prompt (code: raw completions and chat turns) it runs greedy
 * speculative decoding the way the executor will: the draft-model source
 * proposes up to max_d tokens, the target verifies [pending, drafts] as decode
 * rows, accepts the longest matching prefix, trims its KV and commits. The
 * output is exactly the target's greedy output. With p_min 0 the draft always
 * proposes max_d tokens, and every other threshold is evaluated on the same
 * rounds afterwards from the drafts' confidences (a round drafts the prefix
 * whose confidence reaches the threshold). The speed-up estimate weighs the
 * measured times of a draft step, a target decode step and a target verify
 * of max_d + 1 rows (linear in between). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "kv/kv.h"
#include "model/model.h"
#include "spec/draft_model.h"
#include "tok/tok.h"

static const char *k_prompts[] = {
    "def quicksort(arr):\n    \"\"\"Sort a list of numbers with quicksort.\"\"\"\n",
    "#include <stdio.h>\n#include <stdlib.h>\n\n/* Reads integers from stdin and prints their sum. */\nint main(void) {\n",
    "class LRUCache:\n    def __init__(self, capacity: int):\n",
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a Python function that checks whether a string is a palindrome, ignoring "
    "case and punctuation.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nIn JavaScript, write a debounce function and explain how it works.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a SQL query that returns the top 5 customers by total order amount, from "
    "tables customers(id, name) and orders(id, customer_id, amount).<|im_end|>\n<|im_start|>assistant\n",
};
#define N_PROMPTS ((int)(sizeof k_prompts / sizeof k_prompts[0]))

static const float k_ths[] = {0.0f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
#define N_TH ((int)(sizeof k_ths / sizeof k_ths[0]))
#define MAX_D 16
#define MAX_ROUNDS 4096

typedef struct {
    int   d, k;
    float conf[MAX_D];
} round_rec;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t argmax(const float *l, int n) {
    int32_t am = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[am]) am = i;
    return am;
}

static void die(const char *what) {
    fprintf(stderr, "%s: %s\n", what, ag_error_message());
    exit(1);
}

/* Runs n tokens of seq 0 from its length; logits for all rows (want_all) or
 * the last one; commits. */
static void target_run(ag_model *m, ag_kv *kv, const int32_t *toks, int n, int as_prompt, int want_all, float *logits) {
    int32_t pos[512], seq[512];
    uint8_t want[512];
    for (int p0 = 0; p0 < n; p0 += 256) {
        int     k = n - p0 < 256 ? n - p0 : 256;
        int32_t len = ag_kv_seq_len(kv, 0);
        for (int i = 0; i < k; i++) {
            pos[i] = len + i;
            seq[i] = 0;
            want[i] = want_all || p0 + i == n - 1;
        }
        ag_batch b = {.n = k, .token = toks + p0, .pos = pos, .seq = seq, .want_logits = want,
                      .n_prompt = as_prompt ? k : 0};
        if (ag_kv_seq_reserve(kv, 0, k) || ag_model_forward(m, kv, &b, logits) || ag_kv_seq_commit(kv, 0, len + k))
            die("target forward");
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TARGET.gguf DRAFT.gguf [n_gen] [threads] [max_d] [p_min]\n", argv[0]);
        return 2;
    }
    int   n_gen = argc > 3 ? atoi(argv[3]) : 64;
    if (n_gen < 1 || n_gen > 4096) n_gen = 64;
    int   threads = argc > 4 ? atoi(argv[4]) : 2;
    int   max_d = argc > 5 ? atoi(argv[5]) : 8;
    float p_min = argc > 6 ? (float)atof(argv[6]) : 0.0f;
    if (max_d < 1 || max_d > MAX_D) max_d = 8;

    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = threads;
    ag_model *tm = NULL;
    ag_tok   *tok = NULL;
    if (ag_model_load(argv[1], &mp, &tm)) die("target");
    if (ag_tok_from_gguf(ag_model_gguf(tm), &tok)) die("target tokenizer");
    const int nv = ag_model_config_of(tm)->n_vocab;
    ag_draft_model *dm = NULL;
    if (ag_draft_model_open(argv[2], &mp, tok, 1, 4096, &dm)) die("draft");
    if (ag_draft_model_n_vocab(dm) != nv) {
        fprintf(stderr, "q width %d != target logits %d\n", ag_draft_model_n_vocab(dm), nv);
        return 1;
    }
    ag_draft_model_set_p_min(dm, p_min);
    ag_sample_params sp = ag_sample_default_params();
    sp.temperature = 0;
    ag_draft_source *src = NULL;
    if (ag_draft_model_source_new(dm, &sp, 1, ag_draft_model_cost(dm, tm), &src)) die("source");
    printf("target %s\ndraft  %s\ncost (weight-bytes ratio) %.3f, draft resident %.1f MiB, max_d %d, p_min %.2f\n",
           argv[1], argv[2], src->cost_per_token, ag_draft_model_resident_bytes(dm) / 1048576.0, max_d, p_min);

    ag_kv_params kp = ag_kv_default_params();
    ag_model_kv_shape(tm, &kp.n_layers, &kp.n_kv_heads, &kp.head_dim_k, &kp.head_dim_v);
    kp.max_seqs = 1;
    ag_kv *kv = NULL;
    int32_t seq0;
    if (ag_kv_init(&kp, &kv) || ag_kv_seq_new(kv, &seq0)) die("kv");
    float     *logits = malloc(sizeof(float) * (size_t)nv * (MAX_D + 1));
    round_rec *rec = calloc(MAX_ROUNDS, sizeof *rec);
    int        n_rec = 0;
    double     t_draft = 0, t_verify = 0, t_plain = 0;
    int        n_draft_fwd = 0, n_verify = 0, n_plain = 0, gen_total = 0;
    double     wall_spec = 0;

    for (int pi = 0; pi < N_PROMPTS; pi++) {
        int32_t *ids = NULL;
        size_t   n = 0;
        if (ag_tok_encode(tok, k_prompts[pi], strlen(k_prompts[pi]), true, true, &ids, &n)) die("encode");
        ag_kv_seq_clear(kv, 0);
        target_run(tm, kv, ids, (int)n, 1, 0, logits);
        int32_t pend = argmax(logits, nv);
        if (src->ops->prefill(src, ids, (int)n)) die("draft prefill");
        int32_t gen[4096 + MAX_D + 1];
        int     g = 0, rounds = 0, acc = 0;
        gen[g++] = pend;
        double w0 = now_s();
        while (g < n_gen) {
            int32_t win[MAX_D + 1], out[MAX_D];
            double  t0 = now_s();
            int     d = src->ops->draft(src, &pend, 1, max_d, out, NULL);
            double  t1 = now_s();
            if (d < 0) die("draft");
            if (d == max_d) { /* 1 feed forward + (max_d - 1) fed drafts */
                t_draft += t1 - t0;
                n_draft_fwd += max_d;
            }
            win[0] = pend;
            memcpy(win + 1, out, sizeof(int32_t) * (size_t)d);
            int32_t len = ag_kv_seq_len(kv, 0);
            target_run(tm, kv, win, d + 1, 0, 1, logits);
            double t2 = now_s();
            if (d == max_d) {
                t_verify += t2 - t1;
                n_verify++;
            }
            int k = 0;
            while (k < d && argmax(logits + (size_t)k * nv, nv) == out[k]) k++;
            int32_t next = argmax(logits + (size_t)k * nv, nv);
            if (ag_kv_trim(kv, 0, (int32_t)(len + d + 1) - (len + 1 + k))) die("trim");
            src->ops->commit(src, d, k);
            if (n_rec < MAX_ROUNDS) {
                rec[n_rec].d = d;
                rec[n_rec].k = k;
                ag_draft_model_source_confidence(src, rec[n_rec].conf, MAX_D);
                n_rec++;
            }
            int eog = 0;
            for (int i = 0; i <= k && g < n_gen && !eog; i++) {
                gen[g] = i < k ? out[i] : next;
                eog = ag_tok_is_eog(tok, gen[g++]);
            }
            pend = next;
            rounds++;
            acc += k;
            if (eog) break;
        }
        wall_spec += now_s() - w0;
        gen_total += g;
        /* a few plain decode steps for the time of one */
        for (int i = 0; i < 4; i++) {
            double t0 = now_s();
            target_run(tm, kv, &pend, 1, 0, 0, logits);
            t_plain += now_s() - t0;
            n_plain++;
            pend = argmax(logits, nv);
        }
        ag_buf text = {0};
        ag_tok_decode(tok, gen, (size_t)(g < 40 ? g : 40), 0, &text);
        uint64_t hash = 1469598103934665603ull; /* FNV-1a: the output must not depend on drafting */
        for (int i = 0; i < g; i++) hash = (hash ^ (uint32_t)gen[i]) * 1099511628211ull;
        printf("prompt %d: %zu prompt tokens, %d generated (hash %016llx) in %d rounds, %.2f accepted/round | %.*s...\n",
               pi, n, g, (unsigned long long)hash, rounds, (double)acc / rounds, (int)text.len,
               text.data ? text.data : "");
        ag_buf_free(&text);
        free(ids);
        fflush(stdout);
    }

    const double td = n_draft_fwd ? t_draft / n_draft_fwd : 0, t1 = n_plain ? t_plain / n_plain : 0;
    const double tv = n_verify ? t_verify / n_verify : t1;
    printf("\ntimes: draft step %.1f ms, target decode step %.1f ms, target verify of %d rows %.1f ms; "
           "measured draft/target step ratio %.3f\n",
           td * 1e3, t1 * 1e3, max_d + 1, tv * 1e3, t1 > 0 ? td / t1 : 0);
    printf("speculative wall time %.1f s for %d tokens (%.2f tok/s) vs plain ~%.2f tok/s\n\n", wall_spec, gen_total,
           gen_total / wall_spec, t1 > 0 ? 1 / t1 : 0);
    /* est.speed: with the verify time measured here; flat-verify: if a verify
     * of up to max_d + 1 rows cost one decode step (a memory-bound backend
     * with a batched decode kernel) */
    printf("%6s %8s %8s %9s %11s %12s %10s %12s\n", "p_min", "drafted", "accepted", "accept%", "tok/verify",
           "draft/round", "est.speed", "flat-verify");
    for (int ti = 0; ti < N_TH; ti++) {
        long   drafted = 0, accepted = 0, emitted = 0;
        double cost = 0, cost_flat = 0;
        for (int r = 0; r < n_rec; r++) {
            int dt = 0;
            while (dt < rec[r].d && rec[r].conf[dt] >= k_ths[ti]) dt++;
            int kt = rec[r].k < dt ? rec[r].k : dt;
            drafted += dt;
            accepted += kt;
            emitted += kt + 1;
            int fwds = dt < max_d ? 1 + dt : max_d; /* a stop costs the forward that showed the low confidence */
            cost += fwds * td + t1 + (tv - t1) * dt / max_d;
            cost_flat += fwds * td + t1;
        }
        printf("%6.2f %8ld %8ld %8.1f%% %11.2f %12.2f %9.2fx %11.2fx\n", k_ths[ti], drafted, accepted,
               drafted ? 100.0 * accepted / drafted : 0, (double)emitted / n_rec, (double)drafted / n_rec,
               cost > 0 ? emitted * t1 / cost : 0, cost_flat > 0 ? emitted * t1 / cost_flat : 0);
    }
    free(rec);
    free(logits);
    ag_kv_free(kv);
    ag_draft_free(src);
    ag_draft_model_close(dm);
    ag_tok_free(tok);
    ag_model_free(tm);
    return 0;
}
