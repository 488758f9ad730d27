/* CPU attention microbenchmark: ag_cpu_attention_rows over a paged F16
 * cache, the AVX2 loops against the AVX-512 ones (where the CPU has them).
 *
 *   build/bench/attn_bench [--pos P] [--rows N] [--heads H/KV] [--dim D] [--reps R]
 *
 * One call per KV head for N rows at positions P..P+N-1 of one sequence
 * (a verify window of N rows, or a decode row when N = 1), one thread, the
 * best of R repetitions; "per step" is that times the layer count given by
 * --layers (default 28, Qwen2.5-Coder-1.5B). Defaults: Qwen2.5-Coder-1.5B's
 * 12 query heads over 2 KV heads of dimension 128. Speed only: the bits of
 * the two ISAs are compared by tests/unit/test_backend_ops.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/quant.h"
#include "base/status.h"
#include "kv/kv.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float rnd_unit(void) { return (float)(rand() % 2001 - 1000) * 1e-3f; }

int main(int argc, char **argv) {
    int pos = 600, rows = 8, n_head = 12, n_kv = 2, dim = 128, reps = 30, layers = 28;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--pos") && v) pos = atoi(v), i++;
        else if (!strcmp(argv[i], "--rows") && v) rows = atoi(v), i++;
        else if (!strcmp(argv[i], "--heads") && v && sscanf(v, "%d/%d", &n_head, &n_kv) == 2) i++;
        else if (!strcmp(argv[i], "--dim") && v) dim = atoi(v), i++;
        else if (!strcmp(argv[i], "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--layers") && v) layers = atoi(v), i++;
        else {
            fprintf(stderr, "usage: %s [--pos P] [--rows N] [--heads H/KV] [--dim D] [--reps R] [--layers L]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || rows > AG_ATTN_MAX_ROWS || pos < 0 || n_kv < 1 || n_head % n_kv || dim < 8 || reps < 1) {
        fprintf(stderr, "attn_bench: rows 1..%d, heads a multiple of the KV heads\n", AG_ATTN_MAX_ROWS);
        return 2;
    }
    ag_kv_params p = ag_kv_default_params();
    p.n_layers = 1, p.n_kv_heads = n_kv, p.head_dim_k = p.head_dim_v = dim, p.max_seqs = 1;
    p.budget_bytes = (size_t)(pos + rows + 64) * n_kv * dim * 2 * 2 + ((size_t)1 << 20);
    ag_kv  *kv;
    int32_t seq;
    if (ag_kv_init(&p, &kv) || ag_kv_seq_new(kv, &seq) || ag_kv_seq_reserve(kv, seq, pos + rows)) {
        fprintf(stderr, "attn_bench: %s\n", ag_error_message());
        return 1;
    }
    float *k = malloc(sizeof(float) * n_kv * dim), *v = malloc(sizeof(float) * n_kv * dim);
    float *q = malloc(sizeof(float) * rows * n_head * dim), *out = malloc(sizeof(float) * rows * n_head * dim);
    for (int t = 0; t < pos + rows; t++) {
        for (int i = 0; i < n_kv * dim; i++) k[i] = rnd_unit(), v[i] = rnd_unit();
        ag_kv_write(kv, 0, seq, t, k, v);
    }
    for (int i = 0; i < rows * n_head * dim; i++) q[i] = rnd_unit();
    int32_t ps[AG_ATTN_MAX_ROWS], ss[AG_ATTN_MAX_ROWS];
    for (int i = 0; i < rows; i++) ps[i] = pos + i, ss[i] = seq;
    ag_batch_layout lay = {rows, ps, ss, 0, NULL, NULL, 0, NULL, NULL, NULL, 0};
    ag_attn_shape   sh = {.layer = 0, .n_head = n_head, .n_head_kv = n_kv, .head_dim_k = dim, .head_dim_v = dim,
                          .scale = 0.088f};
    float *scratch = malloc(sizeof(float) * ag_cpu_attention_scratch_floats(ag_kv_get_layout(kv)->block_size, &sh,
                                                                               pos + rows));
    printf("attention: %d rows at position %d, %d/%d heads of %d, one thread, best of %d\n", rows, pos, n_head, n_kv,
           dim, reps);
    const ag_cpu_isa isas[2] = {AG_CPU_ISA_AVX2, AG_CPU_ISA_AVX512};
    for (int a = 0; a < 2; a++) {
        if (isas[a] > ag_cpu_isa_best() || ag_cpu_isa_set(isas[a])) continue;
        ag_cpu_attention_init();
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const double t0 = now_s();
            for (int g = 0; g < n_kv; g++) ag_cpu_attention_rows(kv, &sh, &lay, q, out, 0, rows, g, scratch);
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        printf("%-7s %8.3f ms a layer, %7.2f ms per step of %d layers\n", ag_cpu_isa_name(isas[a]), best * 1e3,
               best * 1e3 * layers, layers);
    }
    ag_kv_free(kv);
    free(k), free(v), free(q), free(out), free(scratch);
    return 0;
}
