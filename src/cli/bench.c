/* `augur bench`: prefill and decode throughput of the forward pass, in the
 * spirit of llama-bench (pp = one prompt of P tokens, tg = G single-token
 * decode steps after D positions of context, -d), median and spread over repetitions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "base/switches.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sample/sample.h"

static const char usage[] =
    "usage: augur bench [-m MODEL] [-p 512] [-n 128] [-d 0] [-b 1] [-u N] [-r 5] [-t THREADS] [--argmax|--pick|--sample]\n"
    "                   [--penalties] [--kv-type f16|q8_0|q4_0] [--json]\n"
    "  -p N   prompt tokens to prefill (0 = skip); with -b B, N tokens on each of B sequences,\n"
    "         packed into forwards of -u rows as the server packs waiting prompts (pp is then\n"
    "         the aggregate prompt tok/s); with -n G too, `lockstep` is the output tok/s of B\n"
    "         requests of N prompt and G answer tokens run in lockstep: B*G over the time of the\n"
    "         prefill plus G decode steps (add -d N to decode after the prompt's context)\n"
    "  -u N   prompt rows per forward (default: the server's --batch default for the device)\n"
    "  -n N   tokens decoded one at a time (0 = skip)\n"
    "  -d N   decode after N positions of context (filled untimed first; default 0)\n"
    "  -b N   decode N sequences in lockstep (one token of each per step, as the\n"
    "         server's continuous batching does); tg is then the aggregate tok/s\n"
    "  -r N   repetitions (after one warm-up); the median and the range are reported\n"
    "  --kv-type T  the KV cache's element type (default f16), as serve's\n"
    "  --argmax decode steps bring back each row's argmax (what greedy sampling needs; a GPU\n"
    "         then copies no logits) instead of its logits\n"
    "  --pick decode steps bring back a token drawn from each row at temperature 1 (what a\n"
    "         sampler with only a temperature needs; drawn where the logits are when the\n"
    "         backend can, else from the copied rows)\n"
    "  --sample decode steps end with each row's token sampled as `augur run` samples by\n"
    "         default (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), the sampler's time\n"
    "         included: from each row's best candidates (found where the logits are when the\n"
    "         backend can), or with AUGUR_CANDS=0 from the copied rows\n"
    "  --penalties with --sample: also a repetition penalty of 1.1, a frequency penalty of 0.2\n"
    "         and a presence penalty of 0.1 over every token fed so far, applied to the rows\n"
    "         where the logits are (the samplers' edits), or with AUGUR_EDITS=0 by the\n"
    "         samplers to the copied rows\n"
    "  --json one JSON object on stdout instead of the table\n"
    "  --draft ngram|MODEL.gguf [--draft-max N] [--draft-min N] [-f PROMPT_FILE]\n"
    "         speculative decoding instead: the same greedy request (default: a built-in code\n"
    "         edit, through the chat template) with speculation off and on, -n tokens each;\n"
    "         reports both decode speeds, the speedup, acceptance, and checks the outputs match\n";

#define AG_BENCH_MAX_SEQ 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ag_cli_sorted_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* prompt rows per forward (-u, else the engine's default n_batch for the
 * model's device), as the engine cuts a prompt; set once the model is loaded */
static int bench_ubatch = 0;

/* Feeds n random tokens at positions p0.. of each of the n_seq sequences
 * seqs[] as prompt rows, the sequences one after another packed into forwards
 * of at most bench_ubatch rows (as the engine packs the prompts waiting for a
 * step); the last row of each sequence wants its logits. logits: room for
 * n_seq rows. */
static ag_status fill_seqs(ag_model *m, ag_kv *kv, const int32_t *seqs_in, int n_seq, int p0, int n, float *logits,
                           uint64_t *rng) {
    const ag_model_config *c = ag_model_config_of(m);
    const int CHUNK = bench_ubatch;
    int32_t  *tok = malloc(sizeof(int32_t) * 3 * (size_t)CHUNK), *pos = tok + CHUNK, *seqs = pos + CHUNK;
    uint8_t  *want = malloc((size_t)CHUNK);
    ag_status st = tok && want ? AG_OK : ag_errorf(AG_ERR_NOMEM, "out of memory");
    const long total = (long)n * n_seq;
    for (long done = 0; done < total && !st;) {
        const int k = total - done < CHUNK ? (int)(total - done) : CHUNK;
        for (int i = 0; i < k; i++) {
            const long r = done + i;
            *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
            tok[i] = (int32_t)(*rng % (uint64_t)c->n_vocab);
            pos[i] = p0 + (int)(r % n);
            seqs[i] = seqs_in[r / n];
            want[i] = r % n == n - 1 ? AG_WANT_LOGITS : 0;
        }
        /* each sequence's rows in this forward: reserve before, commit after */
        for (long s = done / n; s <= (done + k - 1) / n && !st; s++) {
            const long a = s * n > done ? s * n : done, b = (s + 1) * n < done + k ? (s + 1) * n : done + k;
            st = ag_kv_seq_reserve(kv, seqs_in[s], (int)(b - a));
        }
        ag_batch bt = {.n = k, .token = tok, .pos = pos, .seq = seqs, .want_logits = want, .n_prompt = k};
        if (!st) st = ag_model_forward(m, kv, &bt, logits);
        for (long s = done / n; s <= (done + k - 1) / n && !st; s++) {
            const long b = (s + 1) * n < done + k ? (s + 1) * n : done + k;
            st = ag_kv_seq_commit(kv, seqs_in[s], p0 + (int)(b - s * n));
        }
        done += k;
    }
    free(tok);
    free(want);
    return st;
}

/* Runs one prefill of n tokens on each of n_seq fresh sequences (packed into
 * forwards of bench_ubatch rows; fill_seqs), or n decode steps on each of n_seq fresh sequences (one batch of n_seq
 * decode rows per step) whose first `depth` positions were filled beforehand
 * (untimed); returns tokens per second over all sequences, or a negative
 * value on error. logits: room for n_seq rows. kind: the decode rows'
 * AG_WANT_* (LOGITS, ARGMAX, or PICK with draws at temperature 1); samplers:
 * NULL, or one per sequence that samples its row after each step (from its
 * candidates when kind is AG_WANT_CANDS, else from the row). */
static double run_once(ag_model *m, ag_kv *kv, int n, bool decode, int n_seq, int depth, uint8_t kind, float *logits,
                       ag_sampler **samplers, bool edit) {
    const ag_model_config *c = ag_model_config_of(m);
    if (n_seq < 1) n_seq = 1;
    if (!decode) depth = 0;
    int32_t seq_ids[AG_BENCH_MAX_SEQ];
    int     made = 0;
    ag_status st = AG_OK;
    while (made < n_seq && !(st = ag_kv_seq_new(kv, &seq_ids[made]))) made++;
    int32_t *tok = malloc(sizeof(int32_t) * n_seq), *pos = malloc(sizeof(int32_t) * n_seq),
            *seqs = malloc(sizeof(int32_t) * n_seq);
    /* decode: every sequence samples, so every row needs logits (or its argmax) */
    /* edit (--penalties, samplers that take edited rows): each row's edits,
     * the fed tokens their history */
    edit = edit && samplers;
    int32_t       *edit_start = edit ? malloc(sizeof(int32_t) * (size_t)(n_seq + 1)) : NULL;
    ag_logit_edit *edits = NULL;
    size_t         cap_edits = 0;
    for (int i = 0; samplers && i < n_seq; i++)
        if (ag_sampler_has_edits(samplers[i])) ag_sampler_reset(samplers[i]);
    uint8_t *want = malloc((size_t)n_seq);
    int32_t *am = malloc(sizeof(int32_t) * (size_t)n_seq);
    ag_pick *draws = malloc(sizeof(ag_pick) * (size_t)n_seq);
    ag_cands_req *reqs = calloc((size_t)n_seq, sizeof *reqs);
    ag_cands     *cands = kind == AG_WANT_CANDS ? malloc(sizeof(ag_cands) * (size_t)n_seq) : NULL;
    for (int i = 0; i < n_seq && samplers && kind == AG_WANT_CANDS; i++) ag_sampler_cands_req(samplers[i], &reqs[i]);
    memset(want, kind, (size_t)n_seq);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int s = 0; s < n_seq && !st && depth > 0; s++) st = fill_seqs(m, kv, &seq_ids[s], 1, 0, depth, logits, &rng);
    double t0 = now_s();
    if (!decode && !st) st = fill_seqs(m, kv, seq_ids, n_seq, 0, n, logits, &rng);
    for (int p = depth; decode && p < depth + n && !st; p++) {
        for (int i = 0; i < n_seq; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            tok[i] = (int32_t)(rng % (uint64_t)c->n_vocab);
            pos[i] = p;
            seqs[i] = seq_ids[i];
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            draws[i] = (ag_pick){(double)(rng >> 11) * 0x1.0p-53, 1.0f};
        }
        ag_batch b = {.n = n_seq, .token = tok, .pos = pos, .seq = seqs, .want_logits = want, .argmax = am,
                      .pick = draws, .cands_req = reqs, .cands = cands};
        size_t n_edits = 0;
        for (int s = 0; edit && s < n_seq && !st; s++) {
            edit_start[s] = (int32_t)n_edits;
            const size_t need = n_edits + ag_sampler_max_edits(samplers[s]);
            if (need > cap_edits) {
                ag_logit_edit *g = realloc(edits, sizeof *g * 2 * need);
                if (!g) st = ag_errorf(AG_ERR_NOMEM, "out of memory for the samplers' edits");
                else edits = g, cap_edits = 2 * need;
            }
            if (!st) n_edits += ag_sampler_row_edits(samplers[s], edits + n_edits);
        }
        if (edit && n_edits) edit_start[n_seq] = (int32_t)n_edits, b.edit_start = edit_start, b.edits = edits;
        for (int s = 0; s < n_seq && !st; s++) st = ag_kv_seq_reserve(kv, seq_ids[s], 1);
        if (!st) st = ag_model_forward(m, kv, &b, logits);
        for (int s = 0; s < n_seq && samplers && !st; s++) {
            ag_sample_result r;
            st = cands ? ag_sampler_sample_cands(samplers[s], &cands[s], &r)
                       : ag_sampler_sample(samplers[s], logits + (size_t)s * c->n_vocab, &r);
            /* (a top-p cut past the candidates would need the row fetched:
             * rare at these settings, and then an error here) */
            if (!st && ag_sampler_has_edits(samplers[s])) st = ag_sampler_accept(samplers[s], tok[s]);
        }
        for (int s = 0; s < n_seq && !st; s++) st = ag_kv_seq_commit(kv, seq_ids[s], p + 1);
    }
    double dt = now_s() - t0;
    free(tok);
    free(pos);
    free(seqs);
    free(want);
    free(am);
    free(draws);
    free(reqs);
    free(cands);
    free(edit_start);
    free(edits);
    for (int s = 0; s < made; s++) ag_kv_seq_free(kv, seq_ids[s]);
    if (st) {
        ag_cli_fail("%s", ag_error_message());
        return -1;
    }
    return (double)n * n_seq / dt;
}

/* The CPU kernels the model's matrices (its 2-D and larger tensors) run on. */
static void cpu_kernels(ag_model *m, char *buf, size_t n) {
    const ag_gguf *g = ag_model_gguf(m);
    uint32_t       types[64];
    int            n_types = 0;
    for (int64_t i = 0; i < ag_gguf_n_tensors(g); i++) {
        const ag_gguf_tensor *t = ag_gguf_tensor_at(g, i);
        if (t->n_dims < 2) continue;
        int k = 0;
        while (k < n_types && types[k] != t->type) k++;
        if (k == n_types && n_types < 64) types[n_types++] = t->type;
    }
    ag_cpu_kernel_report(types, n_types, buf, n);
}

int ag_cli_bench(int argc, char **argv) {
    const char *model_path = NULL, *prompt_file = NULL;
    long pp = 512, tg = 128, reps = 5, threads = 0, n_seq = 1, depth = 0, ubatch = 0;
    ag_cli_draft_opts dopt;
    ag_cli_draft_defaults(&dopt);
    bool json = false, argmax = false, pick = false, sample = false, penalties = false;
    ag_kv_dtype kv_type = AG_KV_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--argmax")) { argmax = true; continue; }
        if (!strcmp(a, "--pick")) { pick = true; continue; }
        if (!strcmp(a, "--sample")) { sample = true; continue; }
        if (!strcmp(a, "--penalties")) { penalties = true; continue; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        int  df = ag_cli_draft_flag(a, v, &dopt);
        if (df) ok = df > 0;
        else if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-f")) prompt_file = v;
        else if (!strcmp(a, "-p")) ok = ag_cli_parse_long(v, 0, 1 << 20, &pp);
        else if (!strcmp(a, "-n")) ok = ag_cli_parse_long(v, 0, 1 << 20, &tg);
        else if (!strcmp(a, "-d")) ok = ag_cli_parse_long(v, 0, 1 << 20, &depth);
        else if (!strcmp(a, "-b")) ok = ag_cli_parse_long(v, 1, AG_BENCH_MAX_SEQ, &n_seq);
        else if (!strcmp(a, "-u")) ok = ag_cli_parse_long(v, 1, 1 << 16, &ubatch);
        else if (!strcmp(a, "-r")) ok = ag_cli_parse_long(v, 1, 1000, &reps);
        else if (!strcmp(a, "-t")) ok = ag_cli_parse_long(v, 1, 1024, &threads);
        else if (!strcmp(a, "--kv-type")) ok = ag_kv_dtype_parse(v, &kv_type);
        else return ag_cli_usage_error(usage, "bench: unknown option '%s'", a);
        if (!v) return ag_cli_usage_error(usage, "bench: %s needs a value", a);
        if (!ok) return ag_cli_usage_error(usage, "bench: invalid value '%s' for %s", v, a);
        i++;
    }
    if (!model_path) model_path = ag_cli_default_model();
    if (dopt.draft) return ag_cli_bench_spec(model_path, prompt_file, &dopt, tg > 0 ? (int)tg : 128, (int)reps,
                                             (int)threads, json);
    if (prompt_file) return ag_cli_usage_error(usage, "bench: -f goes with --draft");
    if (argmax + pick + sample > 1)
        return ag_cli_usage_error(usage, "bench: --argmax, --pick and --sample are kinds of decode step: one of them");
    if (penalties && !sample) return ag_cli_usage_error(usage, "bench: --penalties goes with --sample");
    ag_model_params mp = ag_model_default_params();
    mp.cpu.n_threads = (int)threads;
    mp.device = ag_cli_device;
    mp.tp = ag_cli_tp;
    mp.decode_rows_hint = (int)n_seq; /* the batch measured: the kernels a process of that batch would pick */
    ag_model *m;
    if (ag_model_load(model_path, &mp, &m)) return ag_cli_fail("%s", ag_error_message());
    const ag_model_config *c = ag_model_config_of(m);
    bench_ubatch = ag_engine_resolve_batch(m, (int)ubatch);
    long need = pp > depth + tg ? pp : depth + tg;
    if (need > c->n_ctx_train)
        fprintf(stderr, "augur: note: %ld tokens exceed the model's training context %d\n", need, c->n_ctx_train);
    ag_kv *kv = NULL;
    float *logits = ag_model_host_floats(m, (size_t)c->n_vocab * (size_t)n_seq);
    int rc = 1;
    ag_kv_params kp;
    ag_kv_layout L;
    if (ag_model_kv_params(m, kv_type, (int)n_seq, 0, &kp, &L)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    /* room for `need` positions per sequence (and one spare block each) */
    kp.budget_bytes = ag_kv_budget_for(&L, (int32_t)n_seq, (int32_t)(need + L.block_size));
    kp.ring_step = (int32_t)(need * n_seq); /* (a prompt may be one reserve, of every sequence) */
    kp.state_snapshots = 0; /* (recurrent layers: nothing here trims, so no state copies a row, as in a plain server) */
    if (ag_kv_init(&kp, &kv)) {
        ag_cli_fail("%s", ag_error_message());
        goto done;
    }
    /* --penalties with AUGUR_EDITS=0 (or a model that cannot edit its rows
     * where it computes them): the samplers edit the copied rows */
    const bool    edits_off = ag_switch_off("AUGUR_EDITS") || !ag_model_can_edit(m);
    const bool    cands = sample && ag_model_can_cands(m) && !(penalties && edits_off);
    const uint8_t kind = argmax ? AG_WANT_ARGMAX : pick ? AG_WANT_PICK : cands ? AG_WANT_CANDS : AG_WANT_LOGITS;
    /* --sample: the CLI's default sampler, one per sequence */
    ag_sampler **samplers = sample ? calloc((size_t)n_seq, sizeof *samplers) : NULL;
    if (sample && !samplers) {
        ag_cli_fail("out of memory for %ld samplers", n_seq);
        goto done;
    }
    ag_sample_params sp = ag_sample_default_params();
    sp.temperature = 0.8f, sp.top_k = 40, sp.top_p = 0.95f, sp.min_p = 0.05f;
    if (penalties) sp.repetition_penalty = 1.1f, sp.frequency_penalty = 0.2f, sp.presence_penalty = 0.1f;
    for (long s = 0; samplers && s < n_seq; s++)
        if (ag_sampler_new(&sp, c->n_vocab, (uint64_t)s, &samplers[s])) {
            ag_cli_fail("%s", ag_error_message());
            goto done_samplers;
        }
    for (long s = 0; samplers && penalties && !edits_off && s < n_seq; s++) ag_sampler_take_edited_rows(samplers[s]);
    double *pps = calloc((size_t)reps, sizeof(double)), *tgs = calloc((size_t)reps, sizeof(double));
    for (long r = -1; r < reps; r++) { /* r = -1: warm-up */
        double a = pp ? run_once(m, kv, (int)pp, false, (int)n_seq, 0, AG_WANT_LOGITS, logits, NULL, false) : 0;
        double b = tg ? run_once(m, kv, (int)tg, true, (int)n_seq, (int)depth, kind, logits, samplers, penalties && !edits_off) : 0;
        if (a < 0 || b < 0) goto done_free;
        if (r >= 0) {
            pps[r] = a;
            tgs[r] = b;
        }
    }
    double pp_med = ag_cli_sorted_median(pps, (int)reps), tg_med = ag_cli_sorted_median(tgs, (int)reps);
    /* B requests of pp prompt and tg answer tokens in lockstep: B*tg tokens out over
     * B*pp/pp_med + B*tg/tg_med seconds (the medians' times) */
    const double lockstep = pp && tg && n_seq > 1 ? tg / (pp / pp_med + tg / tg_med) : 0;
    int nthreads = ag_cpu_backend_threads(ag_model_backend(m));
    char kernels[512] = "";
    if (nthreads > 0) cpu_kernels(m, kernels, sizeof kernels);
    double gb = ag_model_weight_bytes(m) / 1e9;
    if (json) {
        printf("{\"model\": \"%s\", \"threads\": %d, \"reps\": %ld, \"weight_gb\": %.4f", model_path, nthreads, reps, gb);
        if (*kernels) printf(", \"cpu_kernels\": \"%s\"", kernels);
        if (pp) printf(", \"pp\": %ld, \"ubatch\": %d, \"pp_tok_s\": %.2f, \"pp_min\": %.2f, \"pp_max\": %.2f", pp, bench_ubatch, pp_med, pps[0], pps[reps - 1]);
        if (tg) printf(", \"tg\": %ld, \"depth\": %ld, \"batch\": %ld, \"argmax\": %s, \"pick\": %s, \"sample\": %s, \"penalties\": %s, \"tg_tok_s\": %.2f, \"tg_min\": %.2f, \"tg_max\": %.2f", tg, depth, n_seq, argmax ? "true" : "false", pick ? (ag_model_can_pick(m) ? "true" : "\"rows copied\"") : "false", !sample ? "false" : cands ? "\"candidates\"" : "\"rows\"", !penalties ? "false" : edits_off ? "\"by the samplers\"" : "\"edited rows\"", tg_med, tgs[0], tgs[reps - 1]);
        if (lockstep) printf(", \"lockstep_tok_s\": %.2f", lockstep);
        printf("}\n");
    } else {
        printf("model: %s (%s, %.1f MB of weights read per token), %d threads, %ld reps\n", model_path,
               c->arch_name, gb * 1e3, nthreads, reps);
        if (*kernels) printf("cpu kernels: %s\n", kernels);
        printf("%-8s %12s %12s %12s\n", "test", "tok/s", "min", "max");
        if (tg && depth) printf("(tg after %ld positions of context)\n", depth);
        if (tg && argmax) printf("(tg brings back each row's argmax, not its logits)\n");
        if (tg && pick)
            printf(ag_model_can_pick(m) ? "(tg brings back a token drawn from each row, not its logits)\n"
                                        : "(tg draws a token from each row, from the copied rows)\n");
        if (tg && sample)
            printf(cands ? "(tg samples each row from its best candidates, the sampler's time included)\n"
                         : "(tg samples each row from the whole row, the sampler's time included)\n");
        if (tg && penalties)
            printf(edits_off ? "(with penalties, applied by the samplers to the copied rows)\n"
                             : "(with penalties, applied to the rows where the logits are)\n");
        if (pp && n_seq == 1) printf("pp%-6ld %12.2f %12.2f %12.2f\n", pp, pp_med, pps[0], pps[reps - 1]);
        if (pp && n_seq > 1) printf("pp%ldx%-3ld %12.2f %12.2f %12.2f  (aggregate over %ld prompts)\n", pp, n_seq, pp_med, pps[0], pps[reps - 1], n_seq);
        if (tg && n_seq == 1) printf("tg%-6ld %12.2f %12.2f %12.2f\n", tg, tg_med, tgs[0], tgs[reps - 1]);
        if (tg && n_seq > 1) printf("tg%ldx%-3ld %12.2f %12.2f %12.2f  (aggregate over %ld sequences)\n", tg, n_seq, tg_med, tgs[0], tgs[reps - 1], n_seq);
        if (lockstep) printf("lockstep %12.2f  (output tok/s of %ld requests of %ld + %ld tokens: prefill, then decode)\n", lockstep, n_seq, pp, tg);
        if (tg && n_seq == 1) printf("decode reads %.2f GB/s of weights\n", tg_med * gb);
    }
    rc = 0;
done_free:
    free(pps);
    free(tgs);
done_samplers:
    for (long s = 0; samplers && s < n_seq; s++) ag_sampler_free(samplers[s]);
    free(samplers);
done:
    ag_model_host_free(m, logits);
    ag_kv_free(kv);
    ag_model_free(m);
    return rc;
}
