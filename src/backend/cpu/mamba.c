/* The Mamba-2 mixer (granitehybrid's recurrent layers), as llama.cpp's
 * build_mamba2_layer computes it with ggml's ssm_conv and ssm_scan: per
 * row, the causal depthwise conv over the conv state and the new xBC row
 * (+ bias, SiLU), the selective scan per head (dt + bias through softplus,
 * a scalar decay exp(dt a) per head, B and C of the head's group), the D
 * skip, the gate by SiLU(z) and the grouped RMSNorm. A sequence's rows run
 * in order; sequences, and the heads of one row, are independent: tasks
 * are (run, head group of heads) pairs, each walking its run's rows, with
 * the conv done once per row before the heads (by the run's first task,
 * then shared through `xc`). */
#include "backend/cpu/mamba.h"

#include "backend/cpu/quant.h" /* ag_cpu_isa_active */

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* Row t of a run: the conv (updating the conv state) into xc [C]. */
static void conv_row(const ag_ssm_shape *sh, const float *xbc, float *conv, float *xc) {
    const int C = sh->d_inner + 2 * sh->n_group * sh->d_state, K = sh->d_conv;
    for (int c = 0; c < C; c++) {
        const float *w = sh->conv_w + (size_t)c * K;
        float        s = 0.0f;
        for (int k = 0; k < K - 1; k++) s += conv[(size_t)k * C + c] * w[k];
        s += xbc[c] * w[K - 1];
        xc[c] = silu(s + sh->conv_b[c]);
    }
    if (K > 1) { /* shift: the oldest row leaves, xBC becomes the newest */
        memmove(conv, conv + C, sizeof(float) * (size_t)(K - 2) * C);
        memcpy(conv + (size_t)(K - 2) * C, xbc, sizeof(float) * (size_t)C);
    }
}

/* One state row: s = s dA + B x_dt, returns Σ s C. Eight partial sums
 * (the lanes a compiler's SLP vectoriser fills; ggml's SIMD loop sums in
 * lanes too), added pairwise at the end. Compiled twice, for the baseline
 * (SSE: two 4-wide halves) and, where the active ISA has it, AVX2 (one
 * 8-wide vector); the same sums in the same order (-std=c11 contracts no
 * FMA), so both give the same bits. */
#define SCAN_ROW_BODY                                                                                             \
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                                        \
    int   k = 0;                                                                                                    \
    for (; k + 8 <= ds; k += 8)                                                                                     \
        for (int j = 0; j < 8; j++) {                                                                               \
            const float v = s[k + j] * dA + B[k + j] * x_dt;                                                        \
            s[k + j] = v;                                                                                           \
            acc[j] += v * C[k + j];                                                                                 \
        }                                                                                                           \
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));                  \
    for (; k < ds; k++) {                                                                                           \
        const float v = s[k] * dA + B[k] * x_dt;                                                                    \
        s[k] = v;                                                                                                   \
        sum += v * C[k];                                                                                            \
    }                                                                                                               \
    return sum;

__attribute__((target("avx2,fma"))) static float scan_row_avx2(float *restrict s, const float *restrict B,
                                                               const float *restrict C, int ds, float dA,
                                                               float x_dt) {
    SCAN_ROW_BODY
}

static float scan_row_base(float *restrict s, const float *restrict B, const float *restrict C, int ds, float dA,
                           float x_dt) {
    SCAN_ROW_BODY
}

static float scan_row(float *restrict s, const float *restrict B, const float *restrict C, int ds, float dA,
                      float x_dt) {
    return ag_cpu_isa_active() >= AG_CPU_ISA_AVX2 ? scan_row_avx2(s, B, C, ds, dA, x_dt)
                                                   : scan_row_base(s, B, C, ds, dA, x_dt);
}


typedef struct {
    const ag_ssm_shape *sh;
    const float        *zx;
    const ag_ssm_run   *run;
    float              *xc; /* [n_rows][C]: the run's conv outputs */
    float              *y;
} run_job;

/* Heads [h0, h1) of one run over its rows: scan, D skip (the gate and the
 * norm need the whole row: done after). */
static void scan_heads(const run_job *j, int h0, int h1) {
    const ag_ssm_shape *sh = j->sh;
    const int           C = sh->d_inner + 2 * sh->n_group * sh->d_state, hd = sh->d_inner / sh->n_head;
    const int           ds = sh->d_state, per_group = sh->n_head / sh->n_group;
    const size_t        conv_floats = (size_t)(sh->d_conv - 1) * C;
    const size_t        proj = (size_t)2 * sh->d_inner + 2 * (size_t)sh->n_group * ds + sh->n_head;
    float              *ssm = j->run->state + conv_floats;
    for (int t = 0; t < j->run->n_rows; t++) {
        const int32_t r = j->run->rows[t];
        const float  *xc = j->xc + (size_t)t * C, *x = xc, *B = xc + sh->d_inner, *Cm = B + (size_t)sh->n_group * ds;
        const float  *dtp = j->zx + (size_t)r * proj + 2 * (size_t)sh->d_inner + 2 * (size_t)sh->n_group * ds;
        float        *y = j->y + (size_t)r * sh->d_inner;
        for (int h = h0; h < h1; h++) {
            const float dt = dtp[h] + sh->dt_b[h];
            const float sp = dt <= 20.0f ? log1pf(expf(dt)) : dt;
            const float dA = expf(sp * sh->a[h]);
            const int   g = h / per_group;
            const float *Bg = B + (size_t)g * ds, *Cg = Cm + (size_t)g * ds;
            for (int i = 0; i < hd; i++) {
                const int   ii = h * hd + i;
                const float x_dt = x[ii] * sp;
                float      *s = ssm + (size_t)ii * ds;
                y[ii] = scan_row(s, Bg, Cg, ds, dA, x_dt) + x[ii] * sh->d[h];
            }
        }
        float *snap = j->run->snap ? j->run->snap[t] : NULL;
        if (snap) /* this task's heads of the SSM state (the conv state: by run_conv) */
            memcpy(snap + conv_floats + (size_t)h0 * hd * ds, ssm + (size_t)h0 * hd * ds,
                   sizeof(float) * (size_t)(h1 - h0) * hd * ds);
    }
}

typedef struct {
    const ag_ssm_shape *sh;
    const float        *zx;
    const ag_ssm_run   *runs;
    float             **xc;
    float              *y;
    int                 n_runs, n_split; /* tasks per run */
} job_t;

static void conv_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const job_t        *j = arg;
    const ag_ssm_shape *sh = j->sh;
    const ag_ssm_run   *run = &j->runs[i];
    const int           C = sh->d_inner + 2 * sh->n_group * sh->d_state;
    const size_t        proj = (size_t)2 * sh->d_inner + 2 * (size_t)sh->n_group * sh->d_state + sh->n_head;
    const size_t        conv_floats = (size_t)(sh->d_conv - 1) * C;
    for (int t = 0; t < run->n_rows; t++) {
        conv_row(sh, j->zx + (size_t)run->rows[t] * proj + sh->d_inner, run->state, j->xc[i] + (size_t)t * C);
        if (run->snap && run->snap[t]) memcpy(run->snap[t], run->state, sizeof(float) * conv_floats);
    }
}

static void scan_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const job_t *j = arg;
    const int    r = (int)(i / j->n_split), part = (int)(i % j->n_split);
    const int    nh = j->sh->n_head, h0 = (int)((int64_t)nh * part / j->n_split),
              h1 = (int)((int64_t)nh * (part + 1) / j->n_split);
    run_job rj = {.sh = j->sh, .zx = j->zx, .run = &j->runs[r], .xc = j->xc[r], .y = j->y};
    if (h1 > h0) scan_heads(&rj, h0, h1);
}

/* The gate and the grouped RMSNorm of each row (sum of squares in double, as ggml's rms_norm). */
static void gate_norm_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const job_t        *j = arg;
    const ag_ssm_shape *sh = j->sh;
    const ag_ssm_run   *run = &j->runs[i];
    const size_t proj = (size_t)2 * sh->d_inner + 2 * (size_t)sh->n_group * sh->d_state + sh->n_head;
    const int    gs = sh->d_inner / sh->n_group;
    for (int t = 0; t < run->n_rows; t++) {
        const int32_t r = run->rows[t];
        const float  *z = j->zx + (size_t)r * proj;
        float        *y = j->y + (size_t)r * sh->d_inner;
        for (int c = 0; c < sh->d_inner; c++) y[c] *= silu(z[c]);
        for (int g = 0; g < sh->n_group; g++) {
            float *yg = y + (size_t)g * gs;
            double ss = 0;
            for (int c = 0; c < gs; c++) ss += (double)yg[c] * yg[c];
            const float scale = 1.0f / sqrtf((float)(ss / gs) + sh->eps);
            for (int c = 0; c < gs; c++) yg[c] = yg[c] * scale * sh->norm_w[(size_t)g * gs + c];
        }
    }
}

ag_status ag_cpu_mamba2(ag_threadpool *pool, const ag_ssm_shape *sh, const float *zx, const ag_ssm_run *runs,
                        int n_runs, float *y) {
    if (n_runs < 1) return AG_OK;
    const int C = sh->d_inner + 2 * sh->n_group * sh->d_state;
    int       rows = 0;
    for (int i = 0; i < n_runs; i++) rows += runs[i].n_rows;
    float **xc = malloc(sizeof *xc * (size_t)n_runs);
    float  *buf = malloc(sizeof(float) * (size_t)rows * C);
    if (!xc || !buf) {
        free(xc);
        free(buf);
        return ag_errorf(AG_ERR_NOMEM, "mamba2: out of memory for %d rows", rows);
    }
    for (int i = 0, at = 0; i < n_runs; i++) {
        xc[i] = buf + (size_t)at * C;
        at += runs[i].n_rows;
    }
    const int threads = pool ? ag_threadpool_size(pool) : 1;
    int       split = (threads + n_runs - 1) / n_runs;
    if (split > sh->n_head) split = sh->n_head;
    if (split < 1) split = 1;
    job_t j = {.sh = sh, .zx = zx, .runs = runs, .xc = xc, .y = y, .n_runs = n_runs, .n_split = split};
    ag_threadpool_run(pool, n_runs, conv_task, &j);
    ag_threadpool_run(pool, (int64_t)n_runs * split, scan_task, &j);
    ag_threadpool_run(pool, n_runs, gate_norm_task, &j);
    free(xc);
    free(buf);
    return AG_OK;
}
