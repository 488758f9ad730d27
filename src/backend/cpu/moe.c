/* The mixture-of-experts feed-forward on the CPU (backend.h's moe op).
 *
 * 1. Routing, per row on the host: router logits (one matmul, plus the
 *    router's bias), softmax then the n_used most probable experts (Qwen3-
 *    MoE), or the n_used largest logits then their softmax (gpt-oss), and
 *    their weights.
 * 2. Each expert with rows, in ascending id: its rows gathered (decode rows
 *    first, then prompt rows, each in batch order), one matmul_multi for
 *    gate and up (plus the expert's biases), SiLU-gate (or gpt-oss's
 *    clamped SwiGLU), one matmul for down (plus its bias): one GEMM per active
 *    expert over its tokens (prompt rows and verify windows), the row
 *    kernels for decode rows. The matmul contract makes a row's bits depend
 *    only on its x and its kind, never on the other rows of the group.
 * 3. Each row's output accumulates its experts' rows times their weights in
 *    ascending expert id (step 2's order): a fixed order per row, so the
 *    sum's bits do not depend on the batch either.
 */
#include "backend/cpu/moe.h"

#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ag_cpu_moe {
    int      cap_n, cap_e, cap_k, cap_d, cap_f; /* sizes the buffers hold */
    float   *logits;  /* [n][n_expert] router logits, then probabilities */
    int32_t *sel;     /* [n][n_used] chosen experts by rank */
    float   *wts;     /* [n][n_used] their weights */
    int32_t *start;   /* [n_expert + 1] each expert's first entry in rows */
    int32_t *rows;    /* [n * n_used] (row, rank) as row * n_used + rank, grouped by expert */
    float   *xg;      /* [n][n_embd] one expert's rows of h */
    float   *g, *u;   /* [n][n_ff_exp] its gate and up products */
    float   *yg;      /* [n][n_embd] its outputs */
};

void ag_cpu_moe_free(ag_cpu_moe *s) {
    if (!s) return;
    free(s->logits);
    free(s->sel);
    free(s->wts);
    free(s->start);
    free(s->rows);
    free(s->xg);
    free(s->g);
    free(s->u);
    free(s->yg);
    free(s);
}

static ag_status grow(ag_cpu_moe **sp, int n, int e, int k, int d, int f) {
    ag_cpu_moe *s = *sp;
    if (s && n <= s->cap_n && e <= s->cap_e && k <= s->cap_k && d <= s->cap_d && f <= s->cap_f) return AG_OK;
    if (s) { /* grow to the largest of old and new in each size */
        n = n > s->cap_n ? n : s->cap_n, e = e > s->cap_e ? e : s->cap_e, k = k > s->cap_k ? k : s->cap_k;
        d = d > s->cap_d ? d : s->cap_d, f = f > s->cap_f ? f : s->cap_f;
    }
    ag_cpu_moe_free(s);
    *sp = s = calloc(1, sizeof *s);
    if (!s) return ag_errorf(AG_ERR_NOMEM, "out of memory for the MoE scratch");
    const size_t N = (size_t)n;
    s->logits = malloc(sizeof(float) * N * (size_t)e);
    s->sel = malloc(sizeof(int32_t) * N * (size_t)k);
    s->wts = malloc(sizeof(float) * N * (size_t)k);
    s->start = malloc(sizeof(int32_t) * ((size_t)e + 1));
    s->rows = malloc(sizeof(int32_t) * N * (size_t)k);
    s->xg = malloc(sizeof(float) * N * (size_t)d);
    s->g = malloc(sizeof(float) * N * (size_t)f);
    s->u = malloc(sizeof(float) * N * (size_t)f);
    s->yg = malloc(sizeof(float) * N * (size_t)d);
    if (!s->logits || !s->sel || !s->wts || !s->start || !s->rows || !s->xg || !s->g || !s->u || !s->yg) {
        ag_cpu_moe_free(s);
        *sp = NULL;
        return ag_errorf(AG_ERR_NOMEM, "out of memory for the MoE scratch of %d rows", n);
    }
    s->cap_n = n, s->cap_e = e, s->cap_k = k, s->cap_d = d, s->cap_f = f;
    return AG_OK;
}

/* The k largest of one row's values p (ties: the lower id) into sel, and
 * the values into wts. */
static void top_k(const float *p, int n_expert, int k, int32_t *sel, float *wts) {
    /* k passes of a selection: k * n_expert compares (8 x 128), no sort */
    uint64_t taken[(AG_MOE_MAX_EXPERTS + 63) / 64] = {0};
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int e = 0; e < n_expert; e++)
            if (!(taken[e >> 6] >> (e & 63) & 1) && (best < 0 || p[e] > p[best])) best = e;
        taken[best >> 6] |= 1ull << (best & 63);
        sel[r] = best;
        wts[r] = p[best];
    }
}

/* Routing of one row: its router logits p (modified), its k experts into
 * sel by rank and their weights into wts. AG_MOE_GATE_SOFTMAX_TOPK: softmax
 * over all experts, the k most probable, their probabilities (renormalised
 * when norm_w); AG_MOE_GATE_TOPK_SOFTMAX (gpt-oss): the k largest logits,
 * the softmax over those k alone (ggml's soft_max: exps summed in double,
 * then times the float of 1/sum). Then times w_scale. */
static void route_row(float *p, int n_expert, int k, int gating, bool norm_w, float w_scale, int32_t *sel,
                      float *wts) {
    if (gating == AG_MOE_GATE_TOPK_SOFTMAX) {
        top_k(p, n_expert, k, sel, wts);
        float mx = wts[0]; /* (the largest: rank 0) */
        double sum = 0.0;
        for (int r = 0; r < k; r++) sum += wts[r] = expf(wts[r] - mx);
        const float inv = (float)(1.0 / sum);
        for (int r = 0; r < k; r++) wts[r] *= inv * w_scale;
        return;
    }
    float mx = p[0];
    for (int e = 1; e < n_expert; e++) mx = p[e] > mx ? p[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < n_expert; e++) sum += p[e] = expf(p[e] - mx);
    const float inv = 1.0f / sum;
    for (int e = 0; e < n_expert; e++) p[e] *= inv;
    top_k(p, n_expert, k, sel, wts);
    if (norm_w) {
        float s = 0.0f;
        for (int r = 0; r < k; r++) s += wts[r];
        s = s < 6.103515625e-5f ? 6.103515625e-5f : s; /* (llama.cpp's clamp: F16's smallest normal) */
        for (int r = 0; r < k; r++) wts[r] /= s;
    }
    for (int r = 0; r < k; r++) wts[r] *= w_scale;
}

/* gpt-oss's clamped SwiGLU in place on gate (ggml's swiglu_oai, the same
 * float operations): x = min(g, limit), y = clamp(u, ±limit),
 * g = x / (1 + e^(-alpha x)) * (y + 1). */
static void swiglu_oai(float *gate, const float *up, size_t n, float alpha, float limit) {
    for (size_t i = 0; i < n; i++) {
        const float x = fminf(gate[i], limit), y = fmaxf(fminf(up[i], limit), -limit);
        gate[i] = x / (1.f + expf(alpha * (-x))) * (y + 1.f);
    }
}

void ag_moe_route_rows(const ag_moe_weights *w, float *logits, int n, int32_t *sel, float *wts) {
    const int E = w->n_expert, K = w->n_used;
    for (int i = 0; i < n; i++)
        route_row(logits + (size_t)i * E, E, K, w->gating, w->norm_w, w->w_scale, sel + (size_t)i * K,
                  wts + (size_t)i * K);
}

void ag_moe_plan(int n, int k, int n_expert, const int32_t *sel, const float *wts, int32_t *start, int32_t *src,
                 int32_t *expert, int32_t *ent, float *ent_w, int32_t *scratch) {
    const size_t nk = (size_t)n * (size_t)k;
    int32_t     *rows = scratch, *pos = scratch + nk, *cur = scratch + 2 * nk;
    /* a counting sort of the entries j = row * k + rank by expert, stable: batch order within an expert */
    memset(start, 0, sizeof(int32_t) * ((size_t)n_expert + 1));
    for (size_t j = 0; j < nk; j++) start[sel[j] + 1]++;
    for (int e = 0; e < n_expert; e++) start[e + 1] += start[e];
    memcpy(cur, start, sizeof(int32_t) * (size_t)n_expert);
    for (size_t j = 0; j < nk; j++) {
        const int32_t p = cur[sel[j]]++;
        rows[p] = (int32_t)j;
        pos[j] = p;
    }
    for (size_t p = 0; p < nk; p++) {
        src[p] = rows[p] / k;
        expert[p] = sel[rows[p]];
    }
    /* each row's positions ascending (an insertion sort of k), with their weights */
    for (int i = 0; i < n; i++) {
        int32_t *e = ent + (size_t)i * k;
        float   *we = ent_w + (size_t)i * k;
        for (int r = 0; r < k; r++) {
            const int32_t p = pos[(size_t)i * k + r];
            const float   v = wts[(size_t)i * k + r];
            int           q = r;
            for (; q > 0 && e[q - 1] > p; q--) e[q] = e[q - 1], we[q] = we[q - 1];
            e[q] = p, we[q] = v;
        }
    }
}

ag_status ag_cpu_moe_run(ag_backend *be, ag_cpu_moe **scratch, const ag_moe_weights *w, const float *h, int n,
                         int n_decode, float *o) {
    const ag_backend_ops *op = be->ops;
    const int E = w->n_expert, K = w->n_used, D = (int)w->gate_exps->ne[0], F = (int)w->gate_exps->ne[1];
    if (E < 1 || E > AG_MOE_MAX_EXPERTS || K < 1 || K > E || w->gate_inp->ne[1] != E || w->gate_exps->ne[2] != E ||
        w->up_exps->ne[2] != E || w->down_exps->ne[2] != E || w->down_exps->ne[0] != F || w->down_exps->ne[1] != D)
        return ag_errorf(AG_ERR_INVALID, "moe: %d of %d experts do not fit the weights' shapes", K, E);
    if (n_decode < 0 || n_decode > n) n_decode = n;
    ag_status st = grow(scratch, n, E, K, D, F);
    if (st) return st;
    ag_cpu_moe *s = *scratch;

    /* 1. routing */
    if ((st = op->matmul(be, w->gate_inp, h, n, n_decode, s->logits))) return st;
    if (w->gate_inp_b) ag_cpu_add_bias(s->logits, w->gate_inp_b, n, E);
    ag_moe_route_rows(w, s->logits, n, s->sel, s->wts);

    /* the rows of each expert, in batch order (a counting sort) */
    memset(s->start, 0, sizeof(int32_t) * ((size_t)E + 1));
    for (int j = 0; j < n * K; j++) s->start[s->sel[j] + 1]++;
    for (int e = 0; e < E; e++) s->start[e + 1] += s->start[e];
    /* the placing cursors: the logits' room (n * E >= E, routing is done with it) */
    int32_t *cur = (int32_t *)s->logits;
    memcpy(cur, s->start, sizeof(int32_t) * (size_t)E);
    for (int j = 0; j < n * K; j++) s->rows[cur[s->sel[j]]++] = j;

    memset(o, 0, sizeof(float) * (size_t)n * D);
    /* 2-3. each expert over its rows, ascending id */
    for (int e = 0; e < E && !st; e++) {
        const int32_t *ent = s->rows + s->start[e];
        const int      c = s->start[e + 1] - s->start[e];
        if (c == 0) continue;
        int c_dec = 0;
        for (int r = 0; r < c; r++) {
            const int i = ent[r] / K;
            c_dec += i < n_decode;
            memcpy(s->xg + (size_t)r * D, h + (size_t)i * D, sizeof(float) * (size_t)D);
        }
        const ag_tensor  gate = ag_moe_expert_view(w->gate_exps, e), up = ag_moe_expert_view(w->up_exps, e),
                         down = ag_moe_expert_view(w->down_exps, e);
        const ag_tensor *gu_w[2] = {&gate, &up};
        float *const     gu[2] = {s->g, s->u};
        if ((st = op->matmul_multi(be, gu_w, 2, s->xg, c, c_dec, gu))) break;
        if (w->gate_b) ag_cpu_add_bias(s->g, w->gate_b + (size_t)e * F, c, F);
        if (w->up_b) ag_cpu_add_bias(s->u, w->up_b + (size_t)e * F, c, F);
        if (w->act == AG_MOE_ACT_SWIGLU_OAI) swiglu_oai(s->g, s->u, (size_t)c * F, w->alpha, w->limit);
        else if ((st = op->silu_mul(be, s->g, s->u, (size_t)c * F))) break;
        if ((st = op->matmul(be, &down, s->g, c, c_dec, s->yg))) break;
        if (w->down_b) ag_cpu_add_bias(s->yg, w->down_b + (size_t)e * D, c, D);
        for (int r = 0; r < c; r++) {
            const float  wt = s->wts[ent[r]];
            const float *y = s->yg + (size_t)r * D;
            float       *out = o + (size_t)(ent[r] / K) * D;
            for (int d = 0; d < D; d++) out[d] += wt * y[d];
        }
    }
    return st;
}

size_t ag_backend_moe_scratch_bytes(ag_backend *be, const ag_moe_weights *w, int n_tokens) {
    if (!be->ops->moe || n_tokens < 1) return 0;
    const size_t n = (size_t)n_tokens, E = (size_t)w->n_expert, K = (size_t)w->n_used,
                 D = (size_t)w->gate_exps->ne[0], F = (size_t)w->gate_exps->ne[1];
    /* a device backend (CUDA, cuda/moe.cu) keeps every (row, expert) entry
     * at once: the gathered rows and outputs (n K D each), gate and up (n K
     * F each), the logits, three ints and a weight an entry (and as much
     * again in pinned host memory, not counted here) */
    if (!be->ops->host_memory) return sizeof(float) * (n * E + 2 * n * K * D + 2 * n * K * F + 4 * n * K);
    return sizeof(float) * (n * E + 2 * n * K + E + 1 + 2 * n * D + 2 * n * F) + sizeof(struct ag_cpu_moe);
}
