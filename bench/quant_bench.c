/* Micro-benchmark of the CPU matmul kernels (build: make bench).
 *
 *   build/bench/quant_bench [--types Q4_0,Q6_K,...] [--threads 1,2] [--isa scalar|avx2|avx512]
 *                           [--reps N] [--no-gemm] [--no-cold]
 *   build/bench/quant_bench --ab [--types ...] [--reps N]
 *   build/bench/quant_bench --window [--types ...] [--threads 1,2] [--reps N]
 *
 * Reports, per weight type:
 *   - decode matvec (n_tok = 1) in GB/s of weight bytes, for 2048x2048 and
 *     8960x1536 (n_out x n_in). "hot": the same matrix every call (it sits in
 *     cache); "cold": calls rotate over copies totalling > 1 GiB, so every
 *     call streams from DRAM, as a decode step over a large model does;
 *   - a 512-token GEMM (2048x2048) in GFLOP/s (2*n_tok*n_in*n_out flops),
 *     through the decode rows' dot kernels (ag_matmul) and through the
 *     prompt rows' kernels (ag_matmul_prompt: AMX, panels, tiles or dot,
 *     named after the figure);
 * plus the machine's read bandwidth (STREAM-like sum over 1 GiB) for scale.
 * Every figure is the median of --reps timed calls.
 *
 * --ab: the dot kernels alone (one thread, no threadpool), every ISA level in
 * turn within each rep so that a shared machine's noise hits them alike;
 * weight GB/s for nx = 1 and 4, 2048x2048, hot (same matrix) and cold
 * (rotating over ~512 MiB of copies); median and best of the reps.
 *
 * --window: the cost of a speculative-decoding verify window, which runs its
 * n tokens as decode rows: ms per ag_matmul call of n = 1..12 decode rows,
 * 8960x1536 (Qwen2.5-1.5B's FFN up/gate), cold (rotating over ~512 MiB of
 * copies, as a decode step streams the model from DRAM), with the ratio to
 * n = 1, and the prompt rows' kernels (ag_matmul_prompt) on the same n for
 * reference. Within each rep every n runs once, so a shared machine's noise
 * hits all n alike. Default types Q4_K, Q6_K, Q4_1, Q8_0. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_impl.h"
#include "base/threadpool.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}

static const struct {
    const char *name;
    uint32_t    type;
    int         scale_off[2]; /* fp16 scale fields, -1: none */
} TYPES[] = {
    {"F32", AG_TYPE_F32, {-1, -1}},   {"F16", AG_TYPE_F16, {-1, -1}},   {"BF16", AG_TYPE_BF16, {-1, -1}},
    {"Q4_0", AG_TYPE_Q4_0, {0, -1}},  {"Q4_1", AG_TYPE_Q4_1, {0, 2}},   {"Q5_0", AG_TYPE_Q5_0, {0, -1}},
    {"Q5_1", AG_TYPE_Q5_1, {0, 2}},   {"Q8_0", AG_TYPE_Q8_0, {0, -1}},  {"Q2_K", AG_TYPE_Q2_K, {80, 82}},
    {"Q3_K", AG_TYPE_Q3_K, {108, -1}}, {"Q4_K", AG_TYPE_Q4_K, {0, 2}},  {"Q5_K", AG_TYPE_Q5_K, {0, 2}},
    {"Q6_K", AG_TYPE_Q6_K, {208, -1}},
};
#define N_TYPES (int)(sizeof TYPES / sizeof TYPES[0])

/* Random valid weights: random bits, small finite scales. */
static uint8_t *make_weights(int ti, int64_t n_out, int64_t n_in, size_t *bytes) {
    uint32_t t = TYPES[ti].type, be, bb;
    ag_quant_block(t, &be, &bb);
    size_t   nbytes = ag_quant_row_bytes(t, n_in) * (size_t)n_out;
    uint8_t *w = aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (!w) return NULL;
    if (t == AG_TYPE_F32 || t == AG_TYPE_F16 || t == AG_TYPE_BF16) {
        size_t es = t == AG_TYPE_F32 ? 4 : 2;
        for (size_t i = 0; i < nbytes / es; i++) {
            float    f = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-4f;
            uint16_t h = t == AG_TYPE_F16 ? ag_fp32_to_fp16(f) : ag_fp32_to_bf16(f);
            if (es == 4) memcpy(w + 4 * i, &f, 4);
            else memcpy(w + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < nbytes; i += 8) {
            uint64_t r = rnd();
            memcpy(w + i, &r, nbytes - i < 8 ? nbytes - i : 8);
        }
        for (size_t b = 0; b < nbytes / bb; b++)
            for (int k = 0; k < 2; k++)
                if (TYPES[ti].scale_off[k] >= 0) {
                    uint16_t h = ag_fp32_to_fp16(0.01f);
                    memcpy(w + b * bb + TYPES[ti].scale_off[k], &h, 2);
                }
    }
    *bytes = nbytes;
    return w;
}

/* ---- memory bandwidth ---- */

typedef struct {
    const uint64_t *buf;
    size_t          n, per_task;
    uint64_t        sums[64];
} bw_ctx;

static void bw_task(void *ctx_, int64_t task, int thread) {
    bw_ctx         *c = ctx_;
    size_t          a = (size_t)task * c->per_task, b = a + c->per_task;
    if (b > c->n) b = c->n;
    uint64_t        s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const uint64_t *p = c->buf;
    for (size_t i = a; i + 4 <= b; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
    c->sums[task & 63] += s0 ^ s1 ^ s2 ^ s3;
}

static double read_bandwidth(ag_threadpool *pool, int reps) {
    size_t    bytes = (size_t)1 << 30;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) return 0;
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 2654435761u;
    bw_ctx c = {buf, bytes / 8, 0, {0}};
    int    nt = ag_threadpool_size(pool);
    c.per_task = (c.n + nt - 1) / nt;
    double t[64];
    for (int r = 0; r < reps && r < 64; r++) {
        double a = now_s();
        ag_threadpool_run(pool, nt, bw_task, &c);
        t[r] = now_s() - a;
    }
    double m = median(t, reps < 64 ? reps : 64);
    uint64_t x = 0;
    for (int i = 0; i < 64; i++) x ^= c.sums[i];
    if (x == 42) printf("!"); /* keep the sums live */
    free(buf);
    return bytes / m / 1e9;
}

/* ---- matvec / gemm ---- */

/* prompt: through ag_matmul_prompt (the prompt rows' kernels) instead of ag_matmul. */
static double time_matmul(ag_threadpool *pool, uint32_t t, uint8_t **ws, int n_copies, int64_t n_out, int64_t n_in,
                          int64_t n_tok, const float *x, float *y, void *scratch, size_t scratch_size, int reps,
                          bool prompt) {
    double tm[256];
    if (reps > 256) reps = 256;
    for (int r = -1; r < reps; r++) { /* r = -1: one warm-up call */
        uint8_t  *w = ws[(r + 1) % n_copies];
        double    a = now_s();
        ag_status st = prompt ? ag_matmul_prompt(pool, t, w, NULL, n_out, n_in, x, n_in, n_tok, y, n_out, scratch, scratch_size)
                              : ag_matmul(pool, t, w, n_out, n_in, x, n_in, n_tok, y, n_out, scratch, scratch_size);
        const double dt = now_s() - a;
        if (st != AG_OK) {
            fprintf(stderr, "matmul failed: %s\n", ag_error_message());
            exit(1);
        }
        if (r >= 0) tm[r] = dt;
    }
    return median(tm, reps);
}

static int parse_list(const char *s, char out[][16], int max) {
    int n = 0;
    while (*s && n < max) {
        const char *e = strchr(s, ',');
        size_t      len = e ? (size_t)(e - s) : strlen(s);
        if (len >= 16) len = 15;
        memcpy(out[n], s, len);
        out[n][len] = 0;
        n++;
        if (!e) break;
        s = e + 1;
    }
    return n;
}

/* ---- --ab: dot kernels per ISA, interleaved ---- */

static int run_ab(char type_names[][16], int n_sel, int reps) {
    const int64_t n_out = 2048, n_in = 2048;
    float        *x = malloc(sizeof(float) * 4 * n_in);
    for (int64_t i = 0; i < 4 * n_in; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    int n_isa = (int)ag_cpu_isa_best() + 1;
    printf("%-5s %-3s %-6s %-5s %12s %12s\n", "type", "nx", "isa", "", "median GB/s", "best GB/s");
    for (int ti = 0; ti < N_TYPES; ti++) {
        int sel = n_sel == 0;
        for (int k = 0; k < n_sel; k++) sel |= !strcmp(type_names[k], TYPES[ti].name);
        if (!sel) continue;
        uint32_t      t = TYPES[ti].type;
        ag_act_format f;
        if (ag_quant_act_format(t, &f) != AG_OK) continue;
        size_t   bytes = 0;
        uint8_t *w0 = make_weights(ti, n_out, n_in, &bytes);
        int      n_copies = (int)(((size_t)512 << 20) / bytes + 1);
        uint8_t **ws = calloc(n_copies, sizeof *ws);
        ws[0] = w0;
        for (int c = 1; c < n_copies; c++) {
            ws[c] = aligned_alloc(64, (bytes + 63) / 64 * 64);
            memcpy(ws[c], w0, bytes);
        }
        size_t   xrb = ag_act_row_bytes(f, n_in), wrb = ag_quant_row_bytes(t, n_in);
        uint8_t *xq = malloc(4 * xrb);
        for (int r = 0; r < 4; r++) ag_quantize_act_row(f, x + r * n_in, xq + r * xrb, n_in);
        static const int nxs[2] = {1, 4};
        for (int cold = 0; cold < 2; cold++)
            for (int ni = 0; ni < 2; ni++) {
                int     nx = nxs[ni];
                double  tm[3][256];
                int     nr = reps > 256 ? 256 : reps;
                float   out[4];
                volatile float sink = 0;
                for (int r = 0; r < nr; r++)
                    for (int k = 0; k < n_isa; k++) {
                        ag_cpu_isa_set((ag_cpu_isa)k);
                        ag_dot_fn dot = ag_quant_kernels_active()->dot[t];
                        uint8_t  *w = cold ? ws[(r * n_isa + k) % n_copies] : w0;
                        double    a = now_s();
                        for (int64_t o = 0; o < n_out; o++) {
                            dot(n_in, w + o * wrb, xq, xrb, nx, out);
                            sink += out[0];
                        }
                        tm[k][r] = now_s() - a;
                    }
                (void)sink;
                for (int k = 0; k < n_isa; k++) {
                    double best = tm[k][0];
                    for (int r = 1; r < nr; r++) best = tm[k][r] < best ? tm[k][r] : best;
                    printf("%-5s %-3d %-6s %-5s %12.1f %12.1f\n", TYPES[ti].name, nx, ag_cpu_isa_name((ag_cpu_isa)k),
                           cold ? "cold" : "hot", bytes / median(tm[k], nr) / 1e9, bytes / best / 1e9);
                }
            }
        for (int c = 0; c < n_copies; c++) free(ws[c]);
        free(ws);
        free(xq);
        fflush(stdout);
    }
    free(x);
    ag_cpu_isa_set(ag_cpu_isa_best());
    return 0;
}

/* ---- --window: decode rows of a verify window ---- */

#define WINDOW_MAX 12

static int run_window(char type_names[][16], int n_sel, const int *threads, int n_threads, int reps) {
    static const char *defaults[] = {"Q4_K", "Q6_K", "Q4_1", "Q8_0"};
    const int64_t      n_out = 8960, n_in = 1536;
    float             *x = malloc(sizeof(float) * WINDOW_MAX * n_in), *y = malloc(sizeof(float) * WINDOW_MAX * n_out);
    size_t             scratch_size = 16u << 20;
    void              *scratch = malloc(scratch_size);
    if (!x || !y || !scratch) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < WINDOW_MAX * n_in; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    if (reps > 256) reps = 256;
    printf("verify window: ms per call, %lldx%lld, cold weights, median of %d (ratio: to n = 1 decode)\n",
           (long long)n_out, (long long)n_in, reps);
    for (int ti = 0; ti < N_TYPES; ti++) {
        int sel = 0;
        for (int k = 0; k < n_sel; k++) sel |= !strcmp(type_names[k], TYPES[ti].name);
        for (int k = 0; k < 4 && n_sel == 0; k++) sel |= !strcmp(defaults[k], TYPES[ti].name);
        if (!sel) continue;
        const uint32_t t = TYPES[ti].type;
        size_t         bytes = 0;
        uint8_t       *w0 = make_weights(ti, n_out, n_in, &bytes);
        int            n_copies = w0 ? (int)(((size_t)512 << 20) / bytes + 1) : 0;
        uint8_t      **ws = calloc(n_copies > 0 ? n_copies : 1, sizeof *ws);
        if (!w0 || !ws) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        ws[0] = w0;
        for (int c = 1; c < n_copies; c++) {
            if (!(ws[c] = aligned_alloc(64, (bytes + 63) / 64 * 64))) {
                n_copies = c;
                break;
            }
            memcpy(ws[c], w0, bytes);
        }
        for (int k = 0; k < n_threads; k++) {
            ag_threadpool_params prm = ag_threadpool_default_params();
            ag_threadpool       *pool;
            prm.n_threads = threads[k];
            if (ag_threadpool_create(&prm, &pool) != AG_OK) {
                fprintf(stderr, "%s\n", ag_error_message());
                return 1;
            }
            static double tm[2][WINDOW_MAX + 1][256];
            int           next = 0; /* the copy the next call reads */
            for (int r = -1; r < reps; r++) /* r = -1: warm-up */
                for (int n = 1; n <= WINDOW_MAX; n++)
                    for (int prompt = 0; prompt < 2; prompt++) {
                        uint8_t  *w = ws[next++ % n_copies];
                        double    a = now_s();
                        ag_status st = prompt ? ag_matmul_prompt(pool, t, w, NULL, n_out, n_in, x, n_in, n, y, n_out,
                                                                 scratch, scratch_size)
                                              : ag_matmul(pool, t, w, n_out, n_in, x, n_in, n, y, n_out, scratch,
                                                          scratch_size);
                        const double dt = now_s() - a;
                        if (st != AG_OK) {
                            fprintf(stderr, "matmul failed: %s\n", ag_error_message());
                            return 1;
                        }
                        if (r >= 0) tm[prompt][n][r] = dt;
                    }
            printf("\n%-5s %d thread(s)\n%3s %9s %7s %11s\n", TYPES[ti].name, threads[k], "n", "decode ms", "ratio",
                   "prompt ms");
            const double one = median(tm[0][1], reps);
            for (int n = 1; n <= WINDOW_MAX; n++) {
                const double d = median(tm[0][n], reps), p = median(tm[1][n], reps);
                printf("%3d %9.3f %7.2f %11.3f\n", n, d * 1e3, d / one, p * 1e3);
            }
            fflush(stdout);
            ag_threadpool_free(pool);
        }
        for (int c = 0; c < n_copies; c++) free(ws[c]);
        free(ws);
    }
    free(x);
    free(y);
    free(scratch);
    return 0;
}

int main(int argc, char **argv) {
    char type_names[N_TYPES][16];
    int  n_sel = 0, threads[8] = {1, 2}, n_threads = 2, reps = 15, do_gemm = 1, do_cold = 1, do_ab = 0, do_window = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--types") && i + 1 < argc) n_sel = parse_list(argv[++i], type_names, N_TYPES);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            char tl[8][16];
            n_threads = parse_list(argv[++i], tl, 8);
            for (int k = 0; k < n_threads; k++) threads[k] = atoi(tl[k]) > 0 ? atoi(tl[k]) : 1;
        } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            ag_cpu_isa  isa = !strcmp(v, "scalar") ? AG_CPU_ISA_SCALAR : !strcmp(v, "avx2") ? AG_CPU_ISA_AVX2 : AG_CPU_ISA_AVX512;
            if (ag_cpu_isa_set(isa) != AG_OK) {
                fprintf(stderr, "%s\n", ag_error_message());
                return 1;
            }
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (!strcmp(argv[i], "--no-gemm")) do_gemm = 0;
        else if (!strcmp(argv[i], "--no-cold")) do_cold = 0;
        else if (!strcmp(argv[i], "--ab")) do_ab = 1;
        else if (!strcmp(argv[i], "--window")) do_window = 1;
        else {
            fprintf(stderr, "usage: %s [--types A,B] [--threads 1,2] [--isa scalar|avx2|avx512] [--reps N] [--no-gemm] [--no-cold] [--ab | --window]\n", argv[0]);
            return 2;
        }
    }
    if (do_ab) return run_ab(type_names, n_sel, reps);
    if (do_window) return run_window(type_names, n_sel, threads, n_threads, reps);
    printf("ISA %s (best %s), median of %d calls\n", ag_cpu_isa_name(ag_cpu_isa_active()),
           ag_cpu_isa_name(ag_cpu_isa_best()), reps);

    ag_threadpool *pools[8] = {0};
    for (int k = 0; k < n_threads; k++) {
        ag_threadpool_params prm = ag_threadpool_default_params();
        prm.n_threads = threads[k];
        if (ag_threadpool_create(&prm, &pools[k]) != AG_OK) {
            fprintf(stderr, "%s\n", ag_error_message());
            return 1;
        }
    }
    for (int k = 0; k < n_threads; k++)
        printf("memory read bandwidth, %d thread(s): %.1f GB/s\n", threads[k], read_bandwidth(pools[k], 5));

    static const int64_t shapes[2][2] = {{2048, 2048}, {8960, 1536}}; /* n_out, n_in */
    const int64_t        gemm_tok = 512;
    float               *x = malloc(sizeof(float) * gemm_tok * 8960);
    float               *y = malloc(sizeof(float) * gemm_tok * 8960);
    for (int64_t i = 0; i < gemm_tok * 8960; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    size_t scratch_size = 64u << 20;
    void  *scratch = malloc(scratch_size);

    printf("\n%-5s %-10s %-4s %10s %10s %12s %14s\n", "type", "shape", "thr", "hot GB/s", "cold GB/s", "gemm GFLOP/s",
           "prompt GFLOP/s");
    for (int ti = 0; ti < N_TYPES; ti++) {
        int sel = n_sel == 0;
        for (int k = 0; k < n_sel; k++) sel |= !strcmp(type_names[k], TYPES[ti].name);
        if (!sel) continue;
        uint32_t t = TYPES[ti].type;
        for (int si = 0; si < 2; si++) {
            int64_t  n_out = shapes[si][0], n_in = shapes[si][1];
            size_t   bytes = 0;
            uint8_t *w0 = make_weights(ti, n_out, n_in, &bytes);
            if (!w0) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            int      n_copies = do_cold ? (int)(((size_t)1 << 30) / bytes + 1) : 1;
            if (n_copies > 4096) n_copies = 4096;
            uint8_t **ws = calloc(n_copies, sizeof *ws);
            ws[0] = w0;
            for (int c = 1; c < n_copies; c++) {
                ws[c] = aligned_alloc(64, (bytes + 63) / 64 * 64);
                if (!ws[c]) {
                    n_copies = c;
                    break;
                }
                memcpy(ws[c], w0, bytes);
            }
            for (int k = 0; k < n_threads; k++) {
                double hot = time_matmul(pools[k], t, ws, 1, n_out, n_in, 1, x, y, scratch, scratch_size, reps * 4, false);
                double cold = do_cold ? time_matmul(pools[k], t, ws, n_copies, n_out, n_in, 1, x, y, scratch,
                                                    scratch_size, reps * 4, false)
                                      : 0;
                double gflops = 0, pflops = 0;
                if (do_gemm && si == 0) {
                    const int gr = reps / 3 > 2 ? reps / 3 : 3;
                    double    g = time_matmul(pools[k], t, ws, 1, n_out, n_in, gemm_tok, x, y, scratch, scratch_size, gr, false);
                    double    p = time_matmul(pools[k], t, ws, 1, n_out, n_in, gemm_tok, x, y, scratch, scratch_size, gr, true);
                    gflops = 2.0 * gemm_tok * n_in * n_out / g / 1e9;
                    pflops = 2.0 * gemm_tok * n_in * n_out / p / 1e9;
                }
                char shape[32];
                snprintf(shape, sizeof shape, "%lldx%lld", (long long)n_out, (long long)n_in);
                printf("%-5s %-10s %-4d %10.1f %10.1f", TYPES[ti].name, shape, threads[k], bytes / hot / 1e9,
                       do_cold ? bytes / cold / 1e9 : 0.0);
                if (gflops > 0) printf(" %12.1f %14.1f (%s)", gflops, pflops, ag_matmul_prompt_kernel(t));
                printf("\n");
                fflush(stdout);
            }
            for (int c = 0; c < n_copies; c++) free(ws[c]);
            free(ws);
        }
    }
    for (int k = 0; k < n_threads; k++) ag_threadpool_free(pools[k]);
    free(x);
    free(y);
    free(scratch);
    return 0;
}
